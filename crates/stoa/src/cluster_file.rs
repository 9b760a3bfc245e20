//! `DIR/cluster.json`: what `stoa dev` is running, for people and scripts. It lists every
//! node (id, role, pid, address, data directory, log file and the command line that
//! starts it again) and the mount point. `stoa mount --dir` and `stoa status --dir` read
//! the meta addresses from it.

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Bumped when the file changes shape.
const FORMAT_VERSION: u32 = 1;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClusterFile {
    pub version: u32,
    /// The `stoa dev` process that owns the cluster.
    pub pid: u32,
    pub mount: Option<PathBuf>,
    pub nodes: Vec<NodeEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The meta replica id, or the chunk server's number in this dev cluster.
    pub id: u64,
    /// `meta` or `chunk`.
    pub role: String,
    pub pid: u32,
    pub addr: SocketAddr,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// The command line that starts this node again (for scripts and fault tests).
    pub cmd: Vec<String>,
}

impl ClusterFile {
    pub fn new(pid: u32, mount: Option<PathBuf>, nodes: Vec<NodeEntry>) -> ClusterFile {
        ClusterFile { version: FORMAT_VERSION, pid, mount, nodes }
    }

    pub fn path(dir: &Path) -> PathBuf {
        dir.join("cluster.json")
    }

    /// Reads `DIR/cluster.json`, with an error that says what to do when it is missing.
    pub fn load(dir: &Path) -> anyhow::Result<ClusterFile> {
        let path = ClusterFile::path(dir);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "cannot read {} (is `stoa dev --dir {}` running?)",
                path.display(),
                dir.display()
            )
        })?;
        let file: ClusterFile = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a Stoa cluster file", path.display()))?;
        if file.version != FORMAT_VERSION {
            bail!(
                "{} has format {}, this build reads {FORMAT_VERSION}",
                path.display(),
                file.version
            );
        }
        Ok(file)
    }

    /// Writes the file atomically (temporary file and rename), so readers never see half
    /// of it.
    pub fn save(&self, dir: &Path) -> anyhow::Result<()> {
        let path = ClusterFile::path(dir);
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&tmp, text).with_context(|| format!("write {}", tmp.display()))?;
        std::fs::rename(&tmp, &path).with_context(|| format!("write {}", path.display()))?;
        Ok(())
    }

    /// The addresses of the meta replicas.
    pub fn meta_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().filter(|n| n.role == "meta").map(|n| n.addr).collect()
    }
}
