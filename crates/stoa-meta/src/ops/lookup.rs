//! Lookup, GetAttr, ReadLink and StatFs: reads of single rows.

use super::valid_name;
use crate::kv::{KvRead, Table};
use crate::store::{self, find_dentry, ino_key, load_dir, load_inode, Counter};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, StatFs};

pub(crate) fn lookup(
    kv: &impl KvRead,
    parent: InodeId,
    name: &[u8],
) -> Result<MetaResponse, FsError> {
    load_dir(kv, parent)?;
    let dentry = find_dentry(kv, parent, valid_name(name)?)?.ok_or(FsError::NotFound)?;
    Ok(MetaResponse::Attr(load_inode(kv, dentry.ino)?.attr))
}

pub(crate) fn getattr(kv: &impl KvRead, ino: InodeId) -> Result<MetaResponse, FsError> {
    Ok(MetaResponse::Attr(load_inode(kv, ino)?.attr))
}

pub(crate) fn readlink(kv: &impl KvRead, ino: InodeId) -> Result<MetaResponse, FsError> {
    if load_inode(kv, ino)?.attr.kind != FileKind::Symlink {
        return Err(FsError::Invalid(format!("inode {ino} is not a symlink")));
    }
    let target: Vec<u8> = store::get(kv, Table::Symlinks, &ino_key(ino))?
        .ok_or_else(|| FsError::Io(format!("symlink {ino} has no target")))?;
    Ok(MetaResponse::Data(target))
}

/// Counts only: capacity is what live chunk servers report, which the server knows and
/// the state machine does not.
pub(crate) fn statfs(kv: &impl KvRead) -> Result<MetaResponse, FsError> {
    let files = store::counter(kv, Counter::Files)?;
    Ok(MetaResponse::StatFs(StatFs { total_bytes: 0, free_bytes: 0, files }))
}
