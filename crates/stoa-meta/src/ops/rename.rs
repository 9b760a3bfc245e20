//! Rename, with the `renameat2` flags `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
//!
//! Checks come in the order Linux makes them, so that a case with several faults gives
//! the errno a local filesystem would: flags, both parents, the source, `NOREPLACE`, a
//! directory moving into its own subtree, the same inode under both names (nothing to
//! do), then the target's kind and emptiness.

use super::unlink::{drop_link, remove_empty_dir};
use super::Place;
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
            (false, false) => drop_link(kv, dst.ino, now)?,
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

#[cfg(test)]
mod tests {
    use super::{RENAME_EXCHANGE, RENAME_NOREPLACE};
    use crate::garbage;
    use crate::testing::{Fs, ROOT};
    use stoa_proto::MetaOp;
    use stoa_types::{FsError, InodeId};

    fn link(fs: &mut Fs, ino: InodeId, parent: InodeId, name: &str) {
        let new_name = name.as_bytes().to_vec();
        fs.call(MetaOp::Link { ino, new_parent: parent, new_name }).unwrap();
    }

    #[test]
    fn a_file_moves_between_directories() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        let a = fs.create(ROOT, "a").unwrap();
        fs.rename((ROOT, "a"), (d.ino, "b"), 0).unwrap();
        assert_eq!(fs.lookup(ROOT, "a"), Err(FsError::NotFound));
        let b = fs.lookup(d.ino, "b").unwrap();
        assert_eq!((b.ino, b.ctime), (a.ino, fs.now()));
        assert_eq!(fs.getattr(ROOT).unwrap().mtime, fs.now());
        assert_eq!(fs.getattr(d.ino).unwrap().mtime, fs.now());
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
        assert_eq!(fs.rename((ROOT, "a"), (ROOT, "c"), 0), Err(FsError::NotFound));
    }

    #[test]
    fn a_directory_move_updates_both_link_counts_and_its_parent() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        let e = fs.mkdir(ROOT, "e").unwrap();
        fs.rename((ROOT, "e"), (d.ino, "e"), 0).unwrap();
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
        assert_eq!(fs.getattr(d.ino).unwrap().nlink, 3);
        // e's parent is now d, so d cannot move under e.
        assert!(matches!(fs.rename((ROOT, "d"), (e.ino, "d"), 0), Err(FsError::Invalid(_))));
        assert!(matches!(fs.rename((ROOT, "d"), (d.ino, "d2"), 0), Err(FsError::Invalid(_))));
        fs.rename((d.ino, "e"), (ROOT, "e2"), 0).unwrap();
        assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
        fs.rename((ROOT, "d"), (e.ino, "d"), 0).unwrap();
        assert_eq!(fs.names(ROOT), vec!["e2"]);
        assert_eq!(fs.names(e.ino), vec!["d"]);
    }

    #[test]
    fn replacing_a_target_follows_posix() {
        let mut fs = Fs::new();
        let f1 = fs.create(ROOT, "f1").unwrap();
        fs.create(ROOT, "f2").unwrap();
        let full = fs.mkdir(ROOT, "full").unwrap();
        fs.create(full.ino, "x").unwrap();
        fs.mkdir(ROOT, "empty").unwrap();
        fs.mkdir(ROOT, "d").unwrap();
        assert_eq!(fs.rename((ROOT, "f1"), (ROOT, "d"), 0), Err(FsError::IsDir));
        assert_eq!(fs.rename((ROOT, "d"), (ROOT, "f1"), 0), Err(FsError::NotDir));
        assert_eq!(fs.rename((ROOT, "d"), (ROOT, "full"), 0), Err(FsError::NotEmpty));
        // A directory over an empty one: the replaced one is gone, the root lost a link.
        fs.rename((ROOT, "d"), (ROOT, "empty"), 0).unwrap();
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 4);
        // A file over a file: the replaced one is garbage.
        let f2 = fs.lookup(ROOT, "f2").unwrap();
        fs.rename((ROOT, "f1"), (ROOT, "f2"), 0).unwrap();
        assert_eq!(fs.lookup(ROOT, "f2").unwrap().ino, f1.ino);
        fs.purge_strays();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(f2.ino, 0)]);
        assert_eq!(fs.names(ROOT), vec!["empty", "f2", "full"]);
    }

    #[test]
    fn replacing_one_of_several_links_keeps_the_inode() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        link(&mut fs, a.ino, ROOT, "a2");
        let b = fs.create(ROOT, "b").unwrap();
        fs.rename((ROOT, "b"), (ROOT, "a2"), 0).unwrap();
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 1);
        assert_eq!(fs.lookup(ROOT, "a2").unwrap().ino, b.ino);
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
    }

    #[test]
    fn two_names_of_one_inode_are_left_alone() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        link(&mut fs, a.ino, ROOT, "b");
        fs.rename((ROOT, "a"), (ROOT, "b"), 0).unwrap();
        assert_eq!(fs.names(ROOT), vec!["a", "b"]);
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
        fs.rename((ROOT, "a"), (ROOT, "a"), 0).unwrap();
        assert_eq!(fs.names(ROOT), vec!["a", "b"]);
    }

    #[test]
    fn noreplace_refuses_an_existing_target() {
        let mut fs = Fs::new();
        fs.create(ROOT, "a").unwrap();
        fs.create(ROOT, "b").unwrap();
        assert_eq!(fs.rename((ROOT, "a"), (ROOT, "b"), RENAME_NOREPLACE), Err(FsError::Exists));
        fs.rename((ROOT, "a"), (ROOT, "c"), RENAME_NOREPLACE).unwrap();
        assert_eq!(fs.names(ROOT), vec!["b", "c"]);
    }

    #[test]
    fn exchange_swaps_two_names_of_any_kind() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        let sub = fs.mkdir(d.ino, "sub").unwrap();
        let f = fs.create(ROOT, "f").unwrap();
        fs.rename((ROOT, "f"), (d.ino, "sub"), RENAME_EXCHANGE).unwrap();
        assert_eq!(fs.lookup(ROOT, "f").unwrap().ino, sub.ino);
        assert_eq!(fs.lookup(d.ino, "sub").unwrap().ino, f.ino);
        // The directory moved from d to the root.
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 4);
        assert_eq!(fs.getattr(d.ino).unwrap().nlink, 2);
        assert_eq!(fs.rename((ROOT, "f"), (ROOT, "none"), RENAME_EXCHANGE), Err(FsError::NotFound));
        // A directory cannot be swapped into its own subtree.
        let inner = fs.mkdir(sub.ino, "inner").unwrap();
        let swap_in = fs.rename((ROOT, "f"), (inner.ino, "x"), RENAME_EXCHANGE);
        assert_eq!(swap_in, Err(FsError::NotFound));
        fs.create(inner.ino, "x").unwrap();
        let swap_in = fs.rename((ROOT, "f"), (inner.ino, "x"), RENAME_EXCHANGE);
        assert!(matches!(swap_in, Err(FsError::Invalid(_))));
    }

    #[test]
    fn unknown_flags_are_refused() {
        let mut fs = Fs::new();
        fs.create(ROOT, "a").unwrap();
        for flags in [4, RENAME_EXCHANGE | RENAME_NOREPLACE] {
            assert!(matches!(fs.rename((ROOT, "a"), (ROOT, "b"), flags), Err(FsError::Invalid(_))));
        }
    }
}
