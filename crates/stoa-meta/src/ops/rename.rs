//! Rename, with the `renameat2` flags `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
//!
//! Checks come in the order Linux makes them, so that a case with several faults gives
//! the errno a local filesystem would: flags, both parents, the source, `NOREPLACE`, a
//! directory moving into its own subtree, the same inode under both names (nothing to
//! do), then the target's kind and emptiness.

use super::unlink::{drop_link, remove_empty_dir};
use super::{touch_dir, valid_name};
use crate::kv::{KvRead, KvWrite};
use crate::store::{
    delete_dentry, find_dentry, load_dir, load_inode, put_dentry, save_inode, Dentry,
};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, Timestamp};

/// Fail with `Exists` instead of replacing the target.
pub const RENAME_NOREPLACE: u32 = 1;
/// Swap the two names, which must both exist.
pub const RENAME_EXCHANGE: u32 = 2;

/// Deeper than any directory tree we expect; a parent chain longer than this loops,
/// which only corrupt data can make.
const DEPTH_MAX: usize = 1 << 20;

/// One name: a directory and an entry in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub parent: InodeId,
    pub name: &'a [u8],
}

pub(crate) fn rename(
    kv: &mut impl KvWrite,
    from: Place,
    to: Place,
    flags: u32,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
        || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
    {
        return Err(FsError::Invalid(format!("unsupported rename flags {flags:#x}")));
    }
    load_dir(kv, from.parent)?;
    load_dir(kv, to.parent)?;
    valid_name(from.name)?;
    valid_name(to.name)?;
    let src = find_dentry(kv, from.parent, from.name)?.ok_or(FsError::NotFound)?;
    let dst = find_dentry(kv, to.parent, to.name)?;
    if flags & RENAME_EXCHANGE != 0 {
        let dst = dst.ok_or(FsError::NotFound)?;
        return exchange(kv, (from, src), (to, dst), now);
    }
    if dst.is_some() && flags & RENAME_NOREPLACE != 0 {
        return Err(FsError::Exists);
    }
    if src.kind == FileKind::Dir {
        check_not_within(kv, src.ino, to.parent)?;
    }
    let mut to_subdirs = 0;
    if let Some(dst) = dst {
        if dst.ino == src.ino {
            return Ok(MetaResponse::Done);
        }
        match (src.kind == FileKind::Dir, dst.kind == FileKind::Dir) {
            (true, false) => return Err(FsError::NotDir),
            (false, true) => return Err(FsError::IsDir),
            (true, true) => {
                remove_empty_dir(kv, dst)?;
                to_subdirs -= 1;
            }
            (false, false) => drop_link(kv, dst.ino, false, now)?,
        }
    }
    delete_dentry(kv, from.parent, from.name)?;
    put_dentry(kv, to.parent, to.name, src)?;
    moved(kv, src, to.parent, now)?;
    let src_subdirs = i32::from(src.kind == FileKind::Dir);
    touch_parents(kv, (from.parent, -src_subdirs), (to.parent, to_subdirs + src_subdirs), now)?;
    Ok(MetaResponse::Done)
}

/// Swaps two existing names of any kinds.
fn exchange(
    kv: &mut impl KvWrite,
    (from, src): (Place, Dentry),
    (to, dst): (Place, Dentry),
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if src.kind == FileKind::Dir {
        check_not_within(kv, src.ino, to.parent)?;
    }
    if dst.kind == FileKind::Dir {
        check_not_within(kv, dst.ino, from.parent)?;
    }
    if src.ino == dst.ino {
        return Ok(MetaResponse::Done);
    }
    put_dentry(kv, from.parent, from.name, dst)?;
    put_dentry(kv, to.parent, to.name, src)?;
    moved(kv, src, to.parent, now)?;
    moved(kv, dst, from.parent, now)?;
    let delta = i32::from(src.kind == FileKind::Dir) - i32::from(dst.kind == FileKind::Dir);
    touch_parents(kv, (from.parent, -delta), (to.parent, delta), now)?;
    Ok(MetaResponse::Done)
}

/// Fails with `Invalid` if `place` is `dir` or lies inside it: a directory cannot move
/// into its own subtree. Walks up the parent chain from `place` to the root.
fn check_not_within(kv: &impl KvRead, dir: InodeId, place: InodeId) -> Result<(), FsError> {
    let mut cur = place;
    for _ in 0..DEPTH_MAX {
        if cur == dir {
            return Err(FsError::Invalid(format!("cannot move directory {dir} into itself")));
        }
        if cur == InodeId::ROOT {
            return Ok(());
        }
        cur = load_inode(kv, cur)?.parent;
    }
    Err(FsError::Io(format!("the parent chain of directory {place} loops")))
}

/// Records that the inode of `dentry` now lives in `parent`: its ctime changes, and a
/// directory remembers its new parent.
fn moved(
    kv: &mut impl KvWrite,
    dentry: Dentry,
    parent: InodeId,
    now: Timestamp,
) -> Result<(), FsError> {
    let mut rec = load_inode(kv, dentry.ino)?;
    if rec.attr.kind == FileKind::Dir {
        rec.parent = parent;
    }
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)
}

/// Updates both parents once each, with their change in subdirectory count.
fn touch_parents(
    kv: &mut impl KvWrite,
    (from, from_subdirs): (InodeId, i32),
    (to, to_subdirs): (InodeId, i32),
    now: Timestamp,
) -> Result<(), FsError> {
    if from == to {
        return touch_dir(kv, from, from_subdirs + to_subdirs, now);
    }
    touch_dir(kv, from, from_subdirs, now)?;
    touch_dir(kv, to, to_subdirs, now)
}
