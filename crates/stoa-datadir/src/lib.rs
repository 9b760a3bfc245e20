//! The exclusive lock on a data directory, so that two processes never share one store.
//! Every server takes it first thing (`stoa meta`, `stoa chunk`, and `stoa dev` on its
//! cluster directory); each maps [`DirLockError`] into its own error.

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The lock file a server (`stoa meta`, `stoa chunk`) takes in its data directory.
pub const SERVER_LOCK: &str = "LOCK";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum DirLockError {
    /// Another live process holds it.
    #[error("data directory {path} is in use by another process")]
    Busy { path: PathBuf },
    #[error("lock data directory {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// Holds `flock(LOCK_EX)` on `<dir>/<name>` for as long as it lives. The kernel drops the
/// lock when the process dies, so a crash never leaves a stale lock behind.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

impl DirLock {
    /// Takes the lock file `name` in `dir`, without waiting.
    pub fn acquire(dir: &Path, name: &str) -> Result<DirLock, DirLockError> {
        let path = dir.join(name);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|source| DirLockError::Io { path: path.clone(), source })?;
        // SAFETY: flock only reads the descriptor, which `file` keeps open.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
                return Err(DirLockError::Busy { path: dir.to_path_buf() });
            }
            return Err(DirLockError::Io { path, source: err });
        }
        Ok(DirLock { _file: file })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_directory_is_refused_until_the_first_goes() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::acquire(dir.path(), "LOCK").unwrap();
        let err = DirLock::acquire(dir.path(), "LOCK").unwrap_err();
        assert!(matches!(err, DirLockError::Busy { .. }), "{err}");
        assert!(err.to_string().contains("in use by another process"), "{err}");
        drop(first);
        DirLock::acquire(dir.path(), "LOCK").unwrap();
    }
}
