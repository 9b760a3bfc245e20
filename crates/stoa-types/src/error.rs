//! [`FsError`]: the one error language of Stoa, from the state machine through the wire
//! up to FUSE, where [`FsError::errno`] turns it into the number the kernel wants.
//!
//! Variants fall in two groups. POSIX errors are final answers and go to the application.
//! Retry hints (`NotLeader`, `StaleChain`, `Unavailable`, `Busy`) tell the caller to try
//! again, elsewhere or later; a client retries them and only gives up with `EIO` after its
//! deadline.

use crate::NodeId;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory")]
    NotFound,
    #[error("file exists")]
    Exists,
    #[error("not a directory")]
    NotDir,
    #[error("is a directory")]
    IsDir,
    #[error("directory not empty")]
    NotEmpty,
    #[error("name too long")]
    NameTooLong,
    #[error("invalid argument: {0}")]
    Invalid(String),
    #[error("operation not permitted")]
    NotPermitted,
    #[error("permission denied")]
    AccessDenied,
    #[error("no space left on device")]
    NoSpace,
    #[error("no such attribute")]
    NoAttr,
    #[error("attribute value too large for the buffer")]
    Range,
    #[error("file too large")]
    TooBig,
    #[error("too many links")]
    TooManyLinks,
    #[error("operation not supported")]
    NotSupported,
    #[error("resource deadlock avoided")]
    Deadlock,
    #[error("resource temporarily unavailable")]
    WouldBlock,
    #[error("stale file handle")]
    Stale,
    #[error("checksum mismatch: {0}")]
    Checksum(String),
    #[error("session expired; cached state was released")]
    SessionExpired,
    #[error("I/O error: {0}")]
    Io(String),
    #[error("not the leader; leader is {leader:?} at {addr:?}")]
    NotLeader { leader: Option<NodeId>, addr: Option<SocketAddr> },
    #[error("stale chain version {got}, current is {current}")]
    StaleChain { got: u64, current: u64 },
    #[error("temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("busy, try again")]
    Busy,
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("wrong cluster: expected {expected}, got {got}")]
    WrongCluster { expected: String, got: String },
    #[error("interrupted")]
    Interrupted,
}

impl FsError {
    /// The errno an application sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound => libc::ENOENT,
            FsError::Exists => libc::EEXIST,
            FsError::NotDir => libc::ENOTDIR,
            FsError::IsDir => libc::EISDIR,
            FsError::NotEmpty => libc::ENOTEMPTY,
            FsError::NameTooLong => libc::ENAMETOOLONG,
            FsError::Invalid(_) => libc::EINVAL,
            FsError::NotPermitted => libc::EPERM,
            FsError::AccessDenied => libc::EACCES,
            FsError::NoSpace => libc::ENOSPC,
            FsError::NoAttr => libc::ENODATA,
            FsError::Range => libc::ERANGE,
            FsError::TooBig => libc::EFBIG,
            FsError::TooManyLinks => libc::EMLINK,
            FsError::NotSupported => libc::EOPNOTSUPP,
            FsError::Deadlock => libc::EDEADLK,
            FsError::WouldBlock => libc::EAGAIN,
            FsError::Stale => libc::ESTALE,
            FsError::Interrupted => libc::EINTR,
            FsError::Checksum(_)
            | FsError::SessionExpired
            | FsError::Io(_)
            | FsError::Protocol(_)
            | FsError::WrongCluster { .. } => libc::EIO,
            FsError::NotLeader { .. }
            | FsError::StaleChain { .. }
            | FsError::Unavailable(_)
            | FsError::Busy => libc::EIO,
        }
    }

    /// Whether the caller should try again (elsewhere or later) rather than report it.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            FsError::NotLeader { .. }
                | FsError::StaleChain { .. }
                | FsError::Unavailable(_)
                | FsError::Busy
        )
    }
}

impl From<std::io::Error> for FsError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => FsError::NoSpace,
            _ => FsError::Io(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_hints_are_not_final() {
        assert!(FsError::Busy.is_retryable());
        assert!(FsError::NotLeader { leader: None, addr: None }.is_retryable());
        assert!(!FsError::NotFound.is_retryable());
        assert_eq!(FsError::NotFound.errno(), libc::ENOENT);
        let enospc = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert_eq!(FsError::from(enospc), FsError::NoSpace);
    }
}
