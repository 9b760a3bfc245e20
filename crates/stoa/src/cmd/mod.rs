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
use std::path::Path;

/// Where `stoa dev` keeps its cluster unless told otherwise. The client commands look
/// there when given neither `--meta` nor `--dir`.
pub const DEV_DIR: &str = "/var/lib/stoa-dev";

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
}
