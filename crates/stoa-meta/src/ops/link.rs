//! Link: another name for an existing inode.

use super::{touch_dir, valid_name};
use crate::kv::KvWrite;
use crate::store::{find_dentry, load_dir, load_inode, put_dentry, save_inode, Dentry};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, Timestamp};

pub(crate) fn link(
    kv: &mut impl KvWrite,
    ino: InodeId,
    parent: InodeId,
    name: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let mut rec = load_inode(kv, ino)?;
    if rec.attr.kind == FileKind::Dir {
        return Err(FsError::NotPermitted);
    }
    if rec.attr.nlink == 0 {
        // An orphan (unlinked but open) cannot be given a name again, as on Linux.
        return Err(FsError::NotFound);
    }
    load_dir(kv, parent)?;
    let name = valid_name(name)?;
    if find_dentry(kv, parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    rec.attr.nlink = rec.attr.nlink.checked_add(1).ok_or(FsError::TooManyLinks)?;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    put_dentry(kv, parent, name, Dentry { ino, kind: rec.attr.kind })?;
    touch_dir(kv, parent, 0, now)?;
    Ok(MetaResponse::Attr(rec.attr))
}
