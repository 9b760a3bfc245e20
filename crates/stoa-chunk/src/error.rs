//! Why a chunk server could not start or keep running. Errors of single requests are
//! [`stoa_types::FsError`]s and go back to the caller on the wire.

use std::path::PathBuf;
use stoa_types::FsError;

#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    #[error("invalid chunk server config: {0}")]
    Config(String),
    #[error("data directory {path} is in use by another process (another chunk server?)")]
    Locked { path: PathBuf },
    #[error("lock {path}: {source}")]
    Lock { path: PathBuf, source: std::io::Error },
    #[error("chunk server identity {path}: {detail}")]
    Identity { path: PathBuf, detail: String },
    #[error("data directory {path} belongs to another cluster: {detail}")]
    WrongCluster { path: PathBuf, detail: String },
    #[error("open the chunk store in {path}: {source}")]
    Store { path: PathBuf, source: FsError },
    #[error(transparent)]
    Listen(#[from] stoa_net::NetError),
    #[error("register with meta: {0}")]
    Register(FsError),
}

impl From<stoa_datadir::DirLockError> for ChunkError {
    fn from(e: stoa_datadir::DirLockError) -> Self {
        match e {
            stoa_datadir::DirLockError::Busy { path } => ChunkError::Locked { path },
            stoa_datadir::DirLockError::Io { path, source } => ChunkError::Lock { path, source },
        }
    }
}
