//! The cluster id file that ties a replica's data directory to one cluster forever (the
//! directory's lock is `stoa_datadir::DirLock`).

use crate::MetadError;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use stoa_types::ClusterId;

/// The cluster this data directory belongs to: unknown until the cluster is created (or
/// this replica first hears of it), then fixed and persisted in `<data_dir>/cluster_id`.
#[derive(Debug)]
pub(crate) struct ClusterIdentity {
    path: PathBuf,
    id: OnceLock<ClusterId>,
}

impl ClusterIdentity {
    /// Reads `<dir>/cluster_id` if it exists.
    pub fn load(dir: &Path) -> Result<ClusterIdentity, MetadError> {
        let path = dir.join("cluster_id");
        let id = OnceLock::new();
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let parsed = text.parse::<ClusterId>().map_err(|e| MetadError::ClusterId {
                    path: path.clone(),
                    detail: format!("not a cluster id ({e}): {:?}", text.trim()),
                })?;
                let _ = id.set(parsed);
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(MetadError::ClusterId { path, detail: e.to_string() }),
        }
        Ok(ClusterIdentity { path, id })
    }

    /// The cluster id, once known.
    pub fn get(&self) -> Option<ClusterId> {
        self.id.get().copied()
    }

    /// Records the cluster id the state machine holds. The first time it is persisted
    /// (written to a temporary file, synced, renamed); afterwards a different id is
    /// refused, because it means this data directory belongs to another cluster.
    /// Blocking: call it off the reactor.
    pub fn learn(&self, id: ClusterId) -> Result<(), String> {
        if let Some(known) = self.get() {
            if known != id {
                return Err(format!(
                    "data directory belongs to cluster {known} ({}), but the replicated state \
                     says cluster {id}",
                    self.path.display()
                ));
            }
            return Ok(());
        }
        let tmp = self.path.with_extension("tmp");
        let write = || -> std::io::Result<()> {
            let mut f = File::create(&tmp)?;
            writeln!(f, "{id}")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &self.path)?;
            if let Some(dir) = self.path.parent() {
                File::open(dir)?.sync_all()?;
            }
            Ok(())
        };
        write().map_err(|e| format!("write {}: {e}", self.path.display()))?;
        let _ = self.id.set(id);
        tracing::info!("this replica belongs to cluster {id}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_id_persists_and_never_changes() {
        let dir = tempfile::tempdir().unwrap();
        let ident = ClusterIdentity::load(dir.path()).unwrap();
        assert_eq!(ident.get(), None);
        ident.learn(ClusterId(7)).unwrap();
        ident.learn(ClusterId(7)).unwrap();
        assert!(ident.learn(ClusterId(8)).is_err());
        let again = ClusterIdentity::load(dir.path()).unwrap();
        assert_eq!(again.get(), Some(ClusterId(7)));
    }

    #[test]
    fn a_garbled_cluster_id_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cluster_id"), "not hex\n").unwrap();
        let err = ClusterIdentity::load(dir.path()).unwrap_err().to_string();
        assert!(err.contains("cluster_id") && err.contains("not a cluster id"), "{err}");
    }
}
