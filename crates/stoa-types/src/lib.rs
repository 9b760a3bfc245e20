//! Plain data shared by every Stoa crate: identifiers, limits, file attributes, layouts
//! and [`FsError`], the one error language from the metadata engine up to FUSE.
//!
//! Nothing here does I/O or reads a clock; time arrives as a [`Timestamp`] value.

mod attr;
mod chain;
mod error;
mod ids;
mod scan;

pub use attr::{Attr, DirEntry, FileKind, SetAttr, SetTime, StatFs, Timestamp};
pub use chain::{Chain, ChainTable, ChunkNode};
pub use error::FsError;
pub use ids::{
    ChainId, ChunkId, ClusterId, InodeId, NodeId, RequestId, SessionId, WriteId, WriteRecord,
};
pub use scan::{InodeScan, SCAN_GAP_MAX};

/// Longest name of one directory entry, in bytes (as on Linux).
pub const NAME_LEN_MAX: usize = 255;
/// Longest symlink target and longest path we accept, in bytes.
pub const PATH_LEN_MAX: usize = 4096;
/// Largest xattr value, in bytes (as on Linux).
pub const XATTR_VALUE_LEN_MAX: usize = 64 * 1024;
/// Most bytes of xattrs (names and values) one inode may hold; a set past it is
/// `ENOSPC`, as on ext4 when an inode's xattr space is full.
pub const XATTR_BYTES_MAX: usize = 1024 * 1024;
/// Longest xattr name, in bytes (as on Linux).
pub const XATTR_NAME_LEN_MAX: usize = 255;
/// The namespaces an xattr name may be in. `system.` holds what a filesystem interprets
/// (POSIX ACLs), which Stoa does not, so it is refused as a local disk refuses a
/// namespace it has no handler for.
const XATTR_NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
/// Bytes of file data covered by one CRC32C on a chunk server.
pub const BLOCK_SIZE_BYTES: u32 = 4096;
/// Default size of one chunk of file data.
pub const CHUNK_SIZE_BYTES_DEFAULT: u32 = 4 * 1024 * 1024;

/// Checks that `name` can be a directory entry: not empty, not `.` or `..`, no `/` or NUL,
/// and at most [`NAME_LEN_MAX`] bytes.
pub fn validate_name(name: &[u8]) -> Result<(), FsError> {
    if name.len() > NAME_LEN_MAX {
        return Err(FsError::NameTooLong);
    }
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&b| b == b'/' || b == 0)
    {
        return Err(FsError::Invalid(format!(
            "bad entry name {:?}",
            String::from_utf8_lossy(name)
        )));
    }
    Ok(())
}

/// Checks that `name` can name an xattr: `ERANGE` for an empty or over-long one, as
/// Linux answers, `EOPNOTSUPP` outside [`XATTR_NAMESPACES`], and a namespace alone is
/// invalid. Meta checks every call with it, and a mount answering from its cache the
/// same way.
pub fn validate_xattr_name(name: &[u8]) -> Result<(), FsError> {
    if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX {
        return Err(FsError::Range);
    }
    match XATTR_NAMESPACES.iter().find(|ns| name.starts_with(ns)) {
        None => Err(FsError::NotSupported),
        Some(ns) if name.len() == ns.len() => {
            Err(FsError::Invalid("an xattr name needs more than its namespace".into()))
        }
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_name(b"a.txt").is_ok());
        assert!(validate_name(&[b'x'; 255]).is_ok());
        assert_eq!(validate_name(&[b'x'; 256]), Err(FsError::NameTooLong));
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b"] {
            assert!(matches!(validate_name(bad), Err(FsError::Invalid(_))));
        }
    }

    #[test]
    fn xattr_names_are_checked() {
        for good in [&b"user.a"[..], b"trusted.x", b"security.selinux"] {
            assert_eq!(validate_xattr_name(good), Ok(()));
        }
        assert_eq!(validate_xattr_name(b""), Err(FsError::Range));
        assert_eq!(validate_xattr_name(&[b'u'; 256]), Err(FsError::Range));
        assert_eq!(validate_xattr_name(b"system.posix_acl_access"), Err(FsError::NotSupported));
        assert!(matches!(validate_xattr_name(b"user."), Err(FsError::Invalid(_))));
    }
}
