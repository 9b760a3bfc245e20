//! SetAttr and CommitWrite: changes to one inode's attributes.
//!
//! A size change here is metadata only: the client truncates or extends the chunk data
//! itself before it calls SetAttr, and records written data with CommitWrite.

use crate::kv::KvWrite;
use crate::store::{load_inode, save_inode};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, SetAttr, SetTime, Timestamp};

pub(crate) fn setattr(
    kv: &mut impl KvWrite,
    ino: InodeId,
    set: &SetAttr,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let mut rec = load_inode(kv, ino)?;
    let attr = &mut rec.attr;
    if let Some(size) = set.size {
        check_is_file(attr.kind, ino)?;
        if size != attr.size && set.mtime.is_none() {
            attr.mtime = now;
        }
        attr.size = size;
    }
    if let Some(perm) = set.perm {
        attr.perm = perm & 0o7777;
    }
    if let Some(uid) = set.uid {
        attr.uid = uid;
    }
    if let Some(gid) = set.gid {
        attr.gid = gid;
    }
    let at = |t: SetTime| match t {
        SetTime::Now => now,
        SetTime::At(t) => t,
    };
    if let Some(t) = set.atime {
        attr.atime = at(t);
    }
    if let Some(t) = set.mtime {
        attr.mtime = at(t);
    }
    attr.ctime = now;
    save_inode(kv, &mut rec)?;
    Ok(MetaResponse::Attr(rec.attr))
}

pub(crate) fn commit_write(
    kv: &mut impl KvWrite,
    ino: InodeId,
    size: u64,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let mut rec = load_inode(kv, ino)?;
    check_is_file(rec.attr.kind, ino)?;
    rec.attr.size = rec.attr.size.max(size);
    rec.attr.mtime = now;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    Ok(MetaResponse::Attr(rec.attr))
}

/// Only regular files have data whose size can change.
fn check_is_file(kind: FileKind, ino: InodeId) -> Result<(), FsError> {
    match kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(FsError::IsDir),
        other => Err(FsError::Invalid(format!("inode {ino} is a {other:?}, not a regular file"))),
    }
}
