//! The snapshot file: every state-machine table plus the last applied log id and the
//! membership, in one versioned, CRC-checked blob.
//!
//! ```text
//!  "STOASNAP" | format u32 | body len u64 | body (bincode SnapshotBody) | crc32c u32
//! ```
//!
//! The same bytes travel to a lagging follower and are written to
//! `<data_dir>/snapshots/current.snap` (through a temporary file and a rename, so a crash
//! leaves either the old or the new snapshot, never half of one).

use super::codec::{decode, encode};
use openraft::{LogId, SnapshotMeta, StoredMembership};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

const MAGIC: &[u8; 8] = b"STOASNAP";
/// Bumped whenever `SnapshotBody` changes shape; an unknown format is refused.
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8;
const CRC_LEN: usize = 4;

/// One table's rows, in key order.
pub(crate) type TableDump = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct SnapshotBody {
    pub snapshot_id: String,
    pub last_applied: Option<LogId<u64>>,
    pub membership: StoredMembership<u64, openraft::BasicNode>,
    pub tables: Vec<TableDump>,
}

impl SnapshotBody {
    pub fn meta(&self) -> SnapshotMeta<u64, openraft::BasicNode> {
        SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id: self.snapshot_id.clone(),
        }
    }
}

/// Encodes `body` into a self-checking blob.
pub(crate) fn to_blob(body: &SnapshotBody) -> Result<Vec<u8>, String> {
    let encoded = encode(body)?;
    let mut blob = Vec::with_capacity(HEADER_LEN + encoded.len() + CRC_LEN);
    blob.extend_from_slice(MAGIC);
    blob.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    blob.extend_from_slice(&(encoded.len() as u64).to_le_bytes());
    blob.extend_from_slice(&encoded);
    let crc = crc32c::crc32c(&blob);
    blob.extend_from_slice(&crc.to_le_bytes());
    Ok(blob)
}

/// Checks and decodes a blob made by [`to_blob`].
pub(crate) fn from_blob(blob: &[u8]) -> Result<SnapshotBody, String> {
    if blob.len() < HEADER_LEN + CRC_LEN {
        return Err(format!("snapshot is {} bytes, too short to be one", blob.len()));
    }
    if &blob[..8] != MAGIC {
        return Err("not a Stoa snapshot (bad magic)".into());
    }
    let (covered, crc) = blob.split_at(blob.len() - CRC_LEN);
    let want = u32::from_le_bytes(crc.try_into().expect("4 bytes"));
    let got = crc32c::crc32c(covered);
    if want != got {
        return Err(format!("snapshot checksum mismatch: stored {want:08x}, computed {got:08x}"));
    }
    let version = u32::from_le_bytes(blob[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "snapshot format {version} is not supported (this build reads {FORMAT_VERSION})"
        ));
    }
    let len = u64::from_le_bytes(blob[12..20].try_into().expect("8 bytes"));
    if len != (covered.len() - HEADER_LEN) as u64 {
        return Err(format!(
            "snapshot body length {len} does not match the {} bytes present",
            covered.len() - HEADER_LEN
        ));
    }
    decode(&covered[HEADER_LEN..]).map_err(|e| format!("snapshot body: {e}"))
}

/// The directory that holds the current snapshot file. Writers are serialized, and a
/// snapshot never replaces a newer one: two builds can finish out of order, and the log
/// has already been purged up to the newer one.
#[derive(Debug)]
pub(crate) struct SnapshotDir {
    dir: PathBuf,
    /// The log id the current file covers; guarded so that check and rename are atomic.
    current: Mutex<Option<LogId<u64>>>,
}

impl SnapshotDir {
    /// Opens `<data_dir>/snapshots`. Blocking.
    pub fn new(data_dir: &Path) -> std::io::Result<SnapshotDir> {
        let dir = data_dir.join("snapshots");
        std::fs::create_dir_all(&dir)?;
        let snapshots = SnapshotDir { dir, current: Mutex::new(None) };
        let current = snapshots.load().ok().flatten().and_then(|(_, body)| body.last_applied);
        *snapshots.current.lock().expect("snapshot lock poisoned") = current;
        Ok(snapshots)
    }

    fn current_path(&self) -> PathBuf {
        self.dir.join("current.snap")
    }

    /// Makes `blob` (covering up to `covers`) the current snapshot, durably, unless the
    /// current one is newer. Blocking.
    pub fn save(&self, blob: &[u8], covers: Option<LogId<u64>>) -> std::io::Result<bool> {
        let mut current = self.current.lock().expect("snapshot lock poisoned");
        if current.is_some() && *current > covers {
            return Ok(false);
        }
        let tmp = self.dir.join("current.snap.tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(blob)?;
        f.sync_all()?;
        std::fs::rename(&tmp, self.current_path())?;
        std::fs::File::open(&self.dir)?.sync_all()?;
        *current = covers;
        Ok(true)
    }

    /// The current snapshot's blob and its decoded body, if there is a sound one. A
    /// damaged file is only a warning: the state lives in the store, and openraft builds
    /// a new snapshot when it needs one. Blocking.
    pub fn load(&self) -> Result<Option<(Vec<u8>, SnapshotBody)>, String> {
        let path = self.current_path();
        let blob = match std::fs::read(&path) {
            Ok(blob) => blob,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("read {}: {e}", path.display())),
        };
        match from_blob(&blob) {
            Ok(body) => Ok(Some((blob, body))),
            Err(e) => {
                tracing::warn!("ignoring damaged snapshot {}: {e}", path.display());
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;

    fn body() -> SnapshotBody {
        SnapshotBody {
            snapshot_id: "1-10-1".into(),
            last_applied: Some(LogId::new(CommittedLeaderId::new(1, 1), 10)),
            membership: StoredMembership::default(),
            tables: vec![("inodes".into(), vec![(b"k".to_vec(), b"v".to_vec())])],
        }
    }

    #[test]
    fn a_blob_round_trips_and_every_flipped_byte_is_caught() {
        let blob = to_blob(&body()).unwrap();
        assert_eq!(from_blob(&blob).unwrap(), body());
        for i in 0..blob.len() {
            let mut bad = blob.clone();
            bad[i] ^= 0x40;
            assert!(from_blob(&bad).is_err(), "flip at byte {i} went unnoticed");
        }
        assert!(from_blob(&blob[..10]).is_err());
    }

    #[test]
    fn an_unknown_format_version_is_refused() {
        let mut blob = to_blob(&body()).unwrap();
        blob[8] = 9;
        let n = blob.len() - CRC_LEN;
        let crc = crc32c::crc32c(&blob[..n]);
        blob[n..].copy_from_slice(&crc.to_le_bytes());
        let err = from_blob(&blob).unwrap_err();
        assert!(err.contains("format 9"), "{err}");
    }

    #[test]
    fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = SnapshotDir::new(dir.path()).unwrap();
        assert!(snaps.load().unwrap().is_none());
        let newer = SnapshotBody {
            snapshot_id: "1-20-2".into(),
            last_applied: Some(LogId::new(CommittedLeaderId::new(1, 1), 20)),
            ..body()
        };
        assert!(snaps.save(&to_blob(&newer).unwrap(), newer.last_applied).unwrap());
        let older = body();
        assert!(!snaps.save(&to_blob(&older).unwrap(), older.last_applied).unwrap());
        assert_eq!(snaps.load().unwrap().unwrap().1.snapshot_id, "1-20-2");
        // After a restart the directory still knows which one is current.
        let reopened = SnapshotDir::new(dir.path()).unwrap();
        assert!(!reopened.save(&to_blob(&older).unwrap(), older.last_applied).unwrap());
    }

    #[test]
    fn a_damaged_snapshot_file_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = SnapshotDir::new(dir.path()).unwrap();
        snaps.save(&to_blob(&body()).unwrap(), body().last_applied).unwrap();
        std::fs::write(dir.path().join("snapshots/current.snap"), b"junk").unwrap();
        assert!(snaps.load().unwrap().is_none());
    }
}
