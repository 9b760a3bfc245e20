//! One module per subcommand: arguments, config merge and validation, then run.

pub mod admin;
pub mod bench;
pub mod chunk;
pub mod dev;
pub mod meta;
pub mod mount;
pub mod status;

use crate::cluster_file::ClusterFile;
use crate::config;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use stoa_datadir::DirLock;

/// Where `stoa dev` keeps its cluster unless told otherwise. The client commands look
/// there when given neither `--meta` nor `--dir`.
pub const DEV_DIR: &str = "/var/lib/stoa-dev";
/// The lock a running `stoa dev` holds in its directory.
pub const DEV_LOCK: &str = "dev.lock";

/// The meta addresses a client command uses: `--meta` if given, else those of the
/// `stoa dev` cluster in `--dir`, else those of one in [`DEV_DIR`].
pub fn meta_addrs(meta: Option<&str>, dir: Option<&Path>) -> anyhow::Result<Vec<SocketAddr>> {
    meta_addrs_or(meta, dir, Path::new(DEV_DIR))
}

fn meta_addrs_or(
    meta: Option<&str>,
    dir: Option<&Path>,
    dev_dir: &Path,
) -> anyhow::Result<Vec<SocketAddr>> {
    match (meta, dir) {
        (Some(meta), _) => config::addr_list("meta", meta),
        (None, Some(dir)) => Ok(ClusterFile::load(dir)?.meta_addrs()),
        (None, None) if ClusterFile::path(dev_dir).exists() => {
            Ok(ClusterFile::load(dev_dir)?.meta_addrs())
        }
        (None, None) => anyhow::bail!(
            "say where the cluster is: --meta ADDR[,ADDR...] or --dir DIR (there is no `stoa \
             dev` cluster in {})",
            dev_dir.display()
        ),
    }
}

/// Adds to a failed call to the cluster that `meta` and `dir` name (as for
/// [`meta_addrs`]) the likely reason when they named a `stoa dev` directory and no
/// `stoa dev` runs there: its cluster file then lists addresses nobody listens on.
pub fn hint_dev_stopped<T>(
    result: anyhow::Result<T>,
    meta: Option<&str>,
    dir: Option<&Path>,
) -> anyhow::Result<T> {
    result.map_err(|e| match dev_stopped(meta, dir, Path::new(DEV_DIR)) {
        Some(dir) => e.context(format!(
            "no `stoa dev` is running on {0} (start it with `stoa dev --dir {0}`)",
            dir.display()
        )),
        None => e,
    })
}

/// The `stoa dev` directory `meta` and `dir` name, if nothing holds its lock. Asked
/// only after a call failed, so taking the lock for a moment cannot get in the way of
/// a `stoa dev` that is running.
fn dev_stopped(meta: Option<&str>, dir: Option<&Path>, dev_dir: &Path) -> Option<PathBuf> {
    if meta.is_some() {
        return None;
    }
    let dir = dir.unwrap_or(dev_dir);
    let stopped = dir.join(DEV_LOCK).exists() && DirLock::acquire(dir, DEV_LOCK).is_ok();
    stopped.then(|| dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster_file::NodeEntry;

    #[test]
    fn without_meta_or_dir_the_dev_cluster_is_used_if_there_is_one() {
        let dev = tempfile::tempdir().unwrap();
        let e = meta_addrs_or(None, None, dev.path()).unwrap_err().to_string();
        assert!(e.contains("--meta") && e.contains(&dev.path().display().to_string()), "{e}");
        let addr: SocketAddr = "127.0.0.1:7100".parse().unwrap();
        let node = NodeEntry {
            id: 1,
            role: "meta".into(),
            pid: 1,
            addr,
            data_dir: dev.path().join("meta-1"),
            log: dev.path().join("meta-1.log"),
            cmd: vec!["stoa".into(), "meta".into()],
        };
        ClusterFile::new(1, None, vec![node]).save(dev.path()).unwrap();
        assert_eq!(meta_addrs_or(None, None, dev.path()).unwrap(), vec![addr]);
        // What is given still wins.
        let given = meta_addrs_or(Some("127.0.0.1:7200"), None, dev.path()).unwrap();
        assert_eq!(given, vec!["127.0.0.1:7200".parse().unwrap()]);
    }

    #[test]
    fn a_failed_call_to_a_dev_cluster_nobody_runs_says_so() {
        let dev = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        // No lock file: not a `stoa dev` directory, or one that never ran.
        assert_eq!(dev_stopped(None, None, dev.path()), None);
        let running = DirLock::acquire(dev.path(), DEV_LOCK).unwrap();
        assert_eq!(dev_stopped(None, None, dev.path()), None);
        assert_eq!(dev_stopped(None, Some(dev.path()), other.path()), None);
        drop(running);
        assert_eq!(dev_stopped(None, None, dev.path()), Some(dev.path().to_path_buf()));
        assert_eq!(dev_stopped(None, Some(dev.path()), other.path()), Some(dev.path().into()));
        // Addresses given outright are not the dev cluster's.
        assert_eq!(dev_stopped(Some("127.0.0.1:7200"), None, dev.path()), None);
        // The lock was only taken to look: a `stoa dev` can take it after.
        DirLock::acquire(dev.path(), DEV_LOCK).unwrap();
    }
}
