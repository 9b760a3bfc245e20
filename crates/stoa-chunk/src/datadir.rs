//! The identity meta gave this chunk server (node id and cluster id), which ties its data
//! directory to one cluster forever. The directory's lock is `stoa_datadir::DirLock`.

use crate::ChunkError;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use stoa_types::{ClusterId, NodeId};

const IDENTITY_MAGIC: &[u8; 4] = b"STID";
const IDENTITY_FORMAT: u32 = 1;
/// magic, format u32, node u64, cluster u128, crc32c u32.
const IDENTITY_LEN: usize = 4 + 4 + 8 + 16 + 4;

/// Who this server is, as meta told it when it first registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub node: NodeId,
    pub cluster: ClusterId,
}

impl Identity {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join("identity")
    }

    /// Reads `<dir>/identity`; `None` for a server that never registered.
    pub fn load(dir: &Path) -> Result<Option<Identity>, ChunkError> {
        let path = Identity::path(dir);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ChunkError::Identity { path, detail: e.to_string() }),
        };
        Identity::decode(&bytes).map(Some).map_err(|detail| ChunkError::Identity { path, detail })
    }

    fn decode(bytes: &[u8]) -> Result<Identity, String> {
        if bytes.len() != IDENTITY_LEN || &bytes[..4] != IDENTITY_MAGIC {
            return Err(format!("not an identity file ({} bytes)", bytes.len()));
        }
        let (body, tail) = bytes.split_at(IDENTITY_LEN - 4);
        let stored = u32::from_le_bytes(tail.try_into().map_err(|_| "short crc")?);
        if stored != crc32c::crc32c(body) {
            return Err("checksum mismatch: the file is damaged".into());
        }
        let format = u32::from_le_bytes(body[4..8].try_into().map_err(|_| "short format")?);
        if format != IDENTITY_FORMAT {
            return Err(format!("format {format}, this server reads {IDENTITY_FORMAT}"));
        }
        let node = u64::from_le_bytes(body[8..16].try_into().map_err(|_| "short node")?);
        let cluster = u128::from_le_bytes(body[16..32].try_into().map_err(|_| "short cluster")?);
        Ok(Identity { node: NodeId(node), cluster: ClusterId(cluster) })
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(IDENTITY_LEN);
        out.extend_from_slice(IDENTITY_MAGIC);
        out.extend_from_slice(&IDENTITY_FORMAT.to_le_bytes());
        out.extend_from_slice(&self.node.0.to_le_bytes());
        out.extend_from_slice(&self.cluster.0.to_le_bytes());
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Persists the identity durably: temporary file, fsync, rename, fsync of the
    /// directory. Blocking: call it off the reactor.
    pub fn store(&self, dir: &Path) -> Result<(), ChunkError> {
        let path = Identity::path(dir);
        let tmp = path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            f.write_all(&self.encode())?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            File::open(dir)?.sync_all()
        };
        write().map_err(|e| ChunkError::Identity { path: path.clone(), detail: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_identity_persists_and_damage_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Identity::load(dir.path()).unwrap(), None);
        let id = Identity { node: NodeId(12), cluster: ClusterId(0xabc) };
        id.store(dir.path()).unwrap();
        assert_eq!(Identity::load(dir.path()).unwrap(), Some(id));
        let path = Identity::path(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[9] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let err = Identity::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("identity") && err.contains("damaged"), "{err}");
    }
}
