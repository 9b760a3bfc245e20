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

/// The meta addresses a client command uses: `--meta` if given, else those of the
/// `stoa dev` cluster in `--dir`.
pub fn meta_addrs(meta: Option<&str>, dir: Option<&Path>) -> anyhow::Result<Vec<SocketAddr>> {
    match (meta, dir) {
        (Some(meta), _) => config::addr_list("meta", meta),
        (None, Some(dir)) => Ok(ClusterFile::load(dir)?.meta_addrs()),
        (None, None) => {
            anyhow::bail!("say where the cluster is: --meta ADDR[,ADDR...] or --dir DIR")
        }
    }
}
