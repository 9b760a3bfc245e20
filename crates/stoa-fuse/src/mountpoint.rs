//! Checking a mount point before mounting, and unmounting it.

use crate::FuseError;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Checks that `path` can take a new mount: it exists, is a directory, and is not a
/// live FUSE mount already. A dead FUSE mount left by a crashed client (stat fails with
/// ENOTCONN) is detached, with a warning, so that the new mount can take its place.
pub fn prepare(path: &Path) -> Result<PathBuf, FuseError> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            detach_dead(path)?;
            std::fs::metadata(path)
                .map_err(|source| FuseError::MountPoint { path: path.into(), source })?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(FuseError::MountPointMissing(path.into()));
        }
        Err(source) => return Err(FuseError::MountPoint { path: path.into(), source }),
    };
    if !meta.is_dir() {
        return Err(FuseError::NotADirectory(path.into()));
    }
    let path = path
        .canonicalize()
        .map_err(|source| FuseError::MountPoint { path: path.into(), source })?;
    if is_fuse_mount(&path) {
        // Just after its client died, a dead mount may still answer `stat` from the
        // kernel's attribute cache; `statfs` always asks the client.
        if !is_dead(&path) {
            return Err(FuseError::Busy(path));
        }
        detach_dead(&path)?;
    }
    Ok(path)
}

/// Detaches the dead FUSE mount at `path`, saying so.
fn detach_dead(path: &Path) -> Result<(), FuseError> {
    tracing::warn!("{} is a dead FUSE mount; detaching it", path.display());
    detach(path)
}

/// Whether the FUSE mount at `path` has lost its client (`statfs` fails with ENOTCONN).
fn is_dead(path: &Path) -> bool {
    let Ok(c_path) = CString::new(path.as_os_str().as_bytes()) else { return false };
    let mut buf = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and `buf` is large enough for the result.
    let rc = unsafe { libc::statfs(c_path.as_ptr(), buf.as_mut_ptr()) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOTCONN)
}

/// Lazily unmounts `path`: it leaves the namespace now and goes away when unused.
pub fn detach(path: &Path) -> Result<(), FuseError> {
    let c_path = CString::new(path.as_os_str().as_bytes()).map_err(|e| FuseError::Unmount {
        path: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
    })?;
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    // Unprivileged: only the setuid helper may unmount.
    let status = std::process::Command::new("fusermount3").arg("-uz").arg(path).status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => Err(FuseError::Unmount { path: path.into(), source: err }),
    }
}

/// Whether a FUSE filesystem is mounted exactly at `path` (canonical).
pub fn is_fuse_mount(path: &Path) -> bool {
    let Ok(table) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    table.lines().any(|line| {
        let mut halves = line.splitn(2, " - ");
        let (Some(left), Some(right)) = (halves.next(), halves.next()) else { return false };
        let Some(point) = left.split(' ').nth(4) else { return false };
        let fstype = right.split(' ').next().unwrap_or("");
        fstype.starts_with("fuse") && Path::new(&unescape(point)) == path
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/mnt/with\040space"), "/mnt/with space");
        assert_eq!(unescape(r"/plain"), "/plain");
        assert_eq!(unescape(r"/odd\09"), r"/odd\09");
    }

    #[test]
    fn a_missing_mount_point_is_named() {
        let dir = std::env::temp_dir().join("stoa-fuse-no-such-dir-for-test");
        let err = prepare(&dir).unwrap_err();
        assert!(matches!(err, FuseError::MountPointMissing(_)));
        assert!(err.to_string().contains("stoa-fuse-no-such-dir-for-test"), "{err}");
    }

    #[test]
    fn a_file_is_not_a_mount_point() {
        let file = std::env::current_exe().unwrap();
        assert!(matches!(prepare(&file), Err(FuseError::NotADirectory(_))));
        assert!(prepare(&std::env::temp_dir()).is_ok());
    }
}
