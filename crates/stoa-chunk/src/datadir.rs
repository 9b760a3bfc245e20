//! The identity meta gave this chunk server (node id and cluster id), which ties its data
//! directory to one cluster forever. The directory's lock is `stoa_datadir::DirLock`.

use crate::{sealed, ChunkError};
use std::path::{Path, PathBuf};
use stoa_types::{ClusterId, NodeId};

const IDENTITY_MAGIC: &[u8; 4] = b"STID";
const IDENTITY_FORMAT: u32 = 1;
/// node u64, cluster u128 (sealed: magic, format and crc32c around it).
const IDENTITY_BODY_LEN: usize = 8 + 16;
const IDENTITY_FILE: &str = "identity";

/// Who this server is, as meta told it when it first registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub node: NodeId,
    pub cluster: ClusterId,
}

impl Identity {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(IDENTITY_FILE)
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
        let (format, body) =
            sealed::unseal(bytes, IDENTITY_MAGIC, IDENTITY_BODY_LEN, "an identity")?;
        if format != IDENTITY_FORMAT {
            return Err(format!("format {format}, this server reads {IDENTITY_FORMAT}"));
        }
        let node = u64::from_le_bytes(body[..8].try_into().map_err(|_| "short node")?);
        let cluster = u128::from_le_bytes(body[8..24].try_into().map_err(|_| "short cluster")?);
        Ok(Identity { node: NodeId(node), cluster: ClusterId(cluster) })
    }

    fn encode(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(IDENTITY_BODY_LEN);
        body.extend_from_slice(&self.node.0.to_le_bytes());
        body.extend_from_slice(&self.cluster.0.to_le_bytes());
        sealed::seal(IDENTITY_MAGIC, IDENTITY_FORMAT, &body)
    }

    /// Persists the identity durably. Blocking: call it off the reactor.
    pub fn store(&self, dir: &Path) -> Result<(), ChunkError> {
        sealed::store(dir, IDENTITY_FILE, &self.encode())
            .map_err(|e| ChunkError::Identity { path: Identity::path(dir), detail: e.to_string() })
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
