//! Plain data shared by every Stoa crate: identifiers, limits, file attributes, layouts
//! and [`FsError`], the one error language from the metadata engine up to FUSE.
//!
//! Nothing here does I/O or reads a clock; time arrives as a [`Timestamp`] value.

mod attr;
mod chain;
mod error;
mod ids;

pub use attr::{Attr, DirEntry, FileKind, SetAttr, SetTime, StatFs, Timestamp};
pub use chain::{Chain, ChainTable, ChunkNode};
pub use error::FsError;
pub use ids::{
    ChainId, ChunkId, ClusterId, InodeId, NodeId, RequestId, SessionId, WriteId, WriteRecord,
};

/// Longest name of one directory entry, in bytes (as on Linux).
pub const NAME_LEN_MAX: usize = 255;
/// Longest symlink target and longest path we accept, in bytes.
pub const PATH_LEN_MAX: usize = 4096;
/// Largest xattr value, in bytes (as on Linux).
pub const XATTR_VALUE_LEN_MAX: usize = 64 * 1024;
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
}
