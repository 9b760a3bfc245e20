use std::net::SocketAddr;
use std::path::PathBuf;

/// Why the meta server could not start or had to stop. Request-level failures are
/// [`stoa_types::FsError`] answers to the caller, never this.
#[derive(Debug, thiserror::Error)]
pub enum MetadError {
    #[error("invalid meta config: {0}")]
    Config(String),
    #[error("create data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("data directory {path} is in use by another process")]
    Locked { path: PathBuf },
    #[error("lock data directory {path}: {source}")]
    Lock { path: PathBuf, source: std::io::Error },
    #[error("open meta store {path}: {detail}")]
    Store { path: PathBuf, detail: String },
    #[error("cluster id file {path}: {detail}")]
    ClusterId { path: PathBuf, detail: String },
    #[error("meta server cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: stoa_net::NetError },
    #[error("raft: {0}")]
    Raft(String),
}

impl From<stoa_datadir::DirLockError> for MetadError {
    fn from(e: stoa_datadir::DirLockError) -> Self {
        match e {
            stoa_datadir::DirLockError::Busy { path } => MetadError::Locked { path },
            stoa_datadir::DirLockError::Io { path, source } => MetadError::Lock { path, source },
        }
    }
}
