//! Create (files, devices, FIFOs, sockets), Mkdir and Symlink: a new inode under a new
//! name.

use super::{touch_dir, valid_name};
use crate::kv::{KvWrite, Table};
use crate::store::{
    self, count_files, find_dentry, ino_key, load_dir, put_dentry, take_next, Counter, Dentry,
    InodeRec,
};
use stoa_proto::MetaResponse;
use stoa_types::{Attr, FileKind, FsError, InodeId, Timestamp, PATH_LEN_MAX};

/// Who creates what, with which permissions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewNode {
    pub kind: FileKind,
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    /// The device number of a device; zero for everything else.
    pub rdev: u32,
}

pub(crate) fn create(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if matches!(new.kind, FileKind::Dir | FileKind::Symlink) {
        return Err(FsError::Invalid(format!("create cannot make a {:?}", new.kind)));
    }
    let rec = add_inode(kv, parent, name, new, 0, now)?;
    Ok(MetaResponse::Attr(rec.attr))
}

pub(crate) fn mkdir(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let new = NewNode { kind: FileKind::Dir, rdev: 0, ..new };
    let rec = add_inode(kv, parent, name, new, 0, now)?;
    Ok(MetaResponse::Attr(rec.attr))
}

pub(crate) fn symlink(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    target: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if target.is_empty() {
        // As on Linux: an empty target names nothing.
        return Err(FsError::NotFound);
    }
    if target.len() > PATH_LEN_MAX {
        return Err(FsError::NameTooLong);
    }
    let new = NewNode { kind: FileKind::Symlink, perm: 0o777, rdev: 0, ..new };
    let rec = add_inode(kv, parent, name, new, target.len() as u64, now)?;
    store::put(kv, Table::Symlinks, &ino_key(rec.attr.ino), &target.to_vec())?;
    Ok(MetaResponse::Attr(rec.attr))
}

/// Allocates an inode of `new.kind` and `size` bytes and links it as `parent/name`.
fn add_inode(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    new: NewNode,
    size: u64,
    now: Timestamp,
) -> Result<InodeRec, FsError> {
    load_dir(kv, parent)?;
    let name = valid_name(name)?;
    if find_dentry(kv, parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    let is_dir = new.kind == FileKind::Dir;
    let ino = InodeId(take_next(kv, Counter::NextInode)?);
    let attr = Attr {
        ino,
        kind: new.kind,
        perm: new.perm & 0o7777,
        uid: new.uid,
        gid: new.gid,
        size,
        nlink: if is_dir { 2 } else { 1 },
        rdev: new.rdev,
        atime: now,
        mtime: now,
        ctime: now,
        version: 0,
    };
    let mut rec = InodeRec { attr, parent };
    store::save_inode(kv, &mut rec)?;
    put_dentry(kv, parent, name, Dentry { ino, kind: new.kind })?;
    touch_dir(kv, parent, i32::from(is_dir), now)?;
    count_files(kv, 1)?;
    Ok(rec)
}
