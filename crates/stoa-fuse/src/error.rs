use std::path::PathBuf;
use stoa_types::FsError;

/// Why a mount could not start or ended badly.
#[derive(Debug, thiserror::Error)]
pub enum FuseError {
    #[error("mount point {0} does not exist")]
    MountPointMissing(PathBuf),
    #[error("mount point {0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("mount point {0} is busy: already mounted")]
    Busy(PathBuf),
    #[error("check mount point {path}: {source}")]
    MountPoint { path: PathBuf, source: std::io::Error },
    #[error("connect to the cluster: {0}")]
    Connect(FsError),
    #[error("mount FUSE at {path}: {source}")]
    Mount { path: PathBuf, source: std::io::Error },
    #[error("unmount {path}: {source}")]
    Unmount { path: PathBuf, source: std::io::Error },
    #[error("FUSE session at {path} failed: {source}")]
    Session { path: PathBuf, source: std::io::Error },
}
