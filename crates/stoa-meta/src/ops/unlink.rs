//! Unlink, Rmdir and Purge, and what happens to an inode whose last name goes: it stays
//! as an orphan while a client has it open, then its chunks become garbage for the
//! leader to delete.
//!
//! ```text
//!  unlink, rename over -> nlink 0 --open--> orphan --last release--\
//!                            \                                      v
//!                             \-------------------------------> stray --PurgeStrays--> garbage --> gone
//! ```
//!
//! A stray is a file with no names that nobody has open: its last name went while
//! nobody had it open, or its last opener closed it later. It is kept a short while
//! (`stoa-metad` `leader.rs`, `STRAY_GRACE`) because another client's kernel may have
//! resolved the name to this inode just before and be about to open it: an open by
//! inode of a file gone for good can only fail with ESTALE, which reached processes that
//! re-created a name two mounts removed in turn (caps.md invariant 26). Kept, it opens
//! like any orphan, the open ordered before the unlink as on a local disk; the leader
//! purges it once the grace is over unless someone has it open by then. A session that
//! ends (closed or expired) purges its orphans at once.

use super::{touch_dir, valid_name};
use crate::kv::{KvWrite, Table};
use crate::store::{
    self, count_files, delete_dentry, delete_prefix, dir_is_empty, find_dentry, ino_key, load_dir,
    load_inode, save_inode, Dentry, InodeRec,
};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, Timestamp};

pub(crate) fn unlink(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    load_dir(kv, parent)?;
    let name = valid_name(name)?;
    let dentry = find_dentry(kv, parent, name)?.ok_or(FsError::NotFound)?;
    if dentry.kind == FileKind::Dir {
        return Err(FsError::IsDir);
    }
    delete_dentry(kv, parent, name)?;
    drop_link(kv, dentry.ino, now)?;
    touch_dir(kv, parent, 0, now)?;
    Ok(MetaResponse::Done)
}

pub(crate) fn rmdir(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    load_dir(kv, parent)?;
    let name = valid_name(name)?;
    let dentry = find_dentry(kv, parent, name)?.ok_or(FsError::NotFound)?;
    remove_empty_dir(kv, dentry)?;
    delete_dentry(kv, parent, name)?;
    touch_dir(kv, parent, -1, now)?;
    Ok(MetaResponse::Done)
}

/// Deletes the directory `dentry` points at, which must be empty. The caller removes the
/// entry and updates the parent.
pub(crate) fn remove_empty_dir(kv: &mut impl KvWrite, dentry: Dentry) -> Result<(), FsError> {
    if dentry.kind != FileKind::Dir {
        return Err(FsError::NotDir);
    }
    if !dir_is_empty(kv, dentry.ino)? {
        return Err(FsError::NotEmpty);
    }
    let rec = load_inode(kv, dentry.ino)?;
    release(kv, &rec)
}

/// Takes one link from `ino`. When none is left, the inode becomes an orphan, and a
/// stray too unless a session has it open (see the module comment).
pub(crate) fn drop_link(
    kv: &mut impl KvWrite,
    ino: InodeId,
    now: Timestamp,
) -> Result<(), FsError> {
    let mut rec = load_inode(kv, ino)?;
    rec.attr.nlink = rec.attr.nlink.saturating_sub(1);
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    if rec.attr.nlink == 0 {
        store::put(kv, Table::Orphans, &ino_key(ino), &())?;
        if !super::session::is_open_anywhere(kv, ino)? {
            stray(kv, ino, now)?;
        }
    }
    Ok(())
}

/// Makes `ino`, an orphan nobody has open since `now`, a stray.
pub(crate) fn stray(kv: &mut impl KvWrite, ino: InodeId, now: Timestamp) -> Result<(), FsError> {
    store::put(kv, Table::Strays, &ino_key(ino), &now)
}

/// Deletes an inode that has no names and no openers. A regular file's size moves to the
/// garbage table, so that the leader deletes its chunks; nothing else has chunks.
fn release(kv: &mut impl KvWrite, rec: &InodeRec) -> Result<(), FsError> {
    let key = ino_key(rec.attr.ino);
    kv.delete(Table::Inodes, &key)?;
    kv.delete(Table::Orphans, &key)?;
    kv.delete(Table::Strays, &key)?;
    kv.delete(Table::Symlinks, &key)?;
    delete_prefix(kv, Table::Xattrs, &key)?;
    super::locks::release_inode(kv, rec.attr.ino)?;
    if rec.attr.kind == FileKind::File {
        store::put(kv, Table::Garbage, &key, &rec.attr.size)?;
    }
    count_files(kv, -1)
}

/// The last opener of an orphan closed it, or a stray's grace is over: release it. An
/// orphan that some session still has open stays (no longer a stray: its last release
/// purges it), whoever asks; anything else is left alone, so a repeated or late purge
/// is harmless.
pub(crate) fn purge(kv: &mut impl KvWrite, ino: InodeId) -> Result<MetaResponse, FsError> {
    kv.delete(Table::Strays, &ino_key(ino))?;
    if kv.get(Table::Orphans, &ino_key(ino))?.is_none()
        || super::session::is_open_anywhere(kv, ino)?
    {
        return Ok(MetaResponse::Done);
    }
    match store::find_inode(kv, ino)? {
        Some(rec) if rec.attr.nlink == 0 => release(kv, &rec)?,
        // Still linked (or already gone): it is no orphan any more.
        _ => kv.delete(Table::Orphans, &ino_key(ino))?,
    }
    Ok(MetaResponse::Done)
}

/// The leader deleted the chunks of `ino`: forget it.
pub(crate) fn collected(kv: &mut impl KvWrite, ino: InodeId) -> Result<MetaResponse, FsError> {
    kv.delete(Table::Garbage, &ino_key(ino))?;
    Ok(MetaResponse::Done)
}

#[cfg(test)]
mod tests {
    use crate::kv::{KvRead, Table};
    use crate::testing::{at, Fs, ROOT};
    use crate::{apply, file_count, garbage, Command};
    use stoa_proto::MetaOp;
    use stoa_types::{FsError, InodeId};

    fn set_size(fs: &mut Fs, ino: InodeId, size: u64) {
        fs.attr(MetaOp::CommitWrite { ino, size }).unwrap();
    }

    #[test]
    fn unlinking_the_last_name_makes_a_file_garbage() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        set_size(&mut fs, a.ino, 9000);
        fs.call(MetaOp::SetXattr {
            ino: a.ino,
            name: b"user.k".to_vec(),
            value: vec![1],
            flags: 0,
        })
        .unwrap();
        let files = file_count(&fs.kv).unwrap();
        fs.unlink(ROOT, "a", false).unwrap();
        assert_eq!(fs.lookup(ROOT, "a"), Err(FsError::NotFound));
        // A stray until the leader purges it.
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
        fs.purge_strays();
        assert_eq!(fs.getattr(a.ino), Err(FsError::NotFound));
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(a.ino, 9000)]);
        assert_eq!(file_count(&fs.kv).unwrap(), files - 1);
        assert!(fs.kv.is_empty(Table::Xattrs));
        assert_eq!(fs.unlink(ROOT, "a", false), Err(FsError::NotFound));
        apply(&mut fs.kv, &Command::GarbageCollected { ino: a.ino }).unwrap();
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
    }

    #[test]
    fn one_entry_collects_the_garbage_of_many_files() {
        let mut fs = Fs::new();
        let mut inos = Vec::new();
        for name in ["a", "b", "c"] {
            let ino = fs.create(ROOT, name).unwrap().ino;
            set_size(&mut fs, ino, 10);
            fs.unlink(ROOT, name, false).unwrap();
            inos.push(ino);
        }
        fs.purge_strays();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap().len(), 3);
        // A round can start past the inodes the one before took.
        let rest = garbage(&fs.kv, InodeId(inos[0].0 + 1), 10).unwrap();
        assert_eq!(rest, vec![(inos[1], 10), (inos[2], 10)]);
        let collect = Command::GarbageCollectedMany { inos: inos[..2].to_vec() };
        apply(&mut fs.kv, &collect).unwrap();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(inos[2], 10)]);
        // A repeated entry (a retried proposal) changes nothing.
        apply(&mut fs.kv, &collect).unwrap();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(inos[2], 10)]);
    }

    #[test]
    fn an_open_file_stays_as_an_orphan_until_purged() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        set_size(&mut fs, a.ino, 10);
        fs.unlink(ROOT, "a", true).unwrap();
        let orphan = fs.getattr(a.ino).unwrap();
        assert_eq!((orphan.nlink, orphan.size), (0, 10));
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
        // The opener keeps writing, and cannot give it a name again.
        set_size(&mut fs, a.ino, 20);
        let link = MetaOp::Link { ino: a.ino, new_parent: ROOT, new_name: b"b".to_vec() };
        assert_eq!(fs.call(link), Err(FsError::NotFound));
        fs.call(MetaOp::Purge { ino: a.ino }).unwrap();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(a.ino, 20)]);
        assert_eq!(fs.getattr(a.ino), Err(FsError::NotFound));
        assert!(fs.kv.is_empty(Table::Orphans));
        // A repeated purge, or one of a linked file, does nothing.
        fs.call(MetaOp::Purge { ino: a.ino }).unwrap();
        let b = fs.create(ROOT, "b").unwrap();
        fs.call(MetaOp::Purge { ino: b.ino }).unwrap();
        assert!(fs.getattr(b.ino).is_ok());
    }

    /// Another mount's kernel may open a file by inode right after it resolved a name
    /// this unlink (or rename over it) removes, which must not fail with ESTALE.
    #[test]
    fn a_stray_can_be_opened_until_its_grace_is_over() {
        let mut fs = Fs::new();
        let (a, b) = (fs.create(ROOT, "a").unwrap(), fs.create(ROOT, "b").unwrap());
        fs.unlink(ROOT, "a", false).unwrap();
        let a_went = fs.now();
        fs.create(ROOT, "c").unwrap();
        fs.rename((ROOT, "c"), (ROOT, "b"), 0).unwrap();
        // Each mutation of `Fs` is a second later than the one before.
        assert_eq!(crate::strays(&fs.kv, at(a_went.secs - 1), 10).unwrap(), vec![]);
        assert_eq!(crate::strays(&fs.kv, a_went, 10).unwrap(), vec![a.ino]);
        assert_eq!(crate::strays(&fs.kv, fs.now(), 10).unwrap(), vec![a.ino, b.ino]);
        // Opened in its grace, it stays past the purge until its last release.
        fs.call(MetaOp::Open { ino: a.ino }).unwrap();
        fs.purge_strays();
        assert!(fs.kv.is_empty(Table::Strays));
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
        assert_eq!(fs.getattr(b.ino), Err(FsError::NotFound));
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(b.ino, 0)]);
        fs.call(MetaOp::Release { ino: a.ino }).unwrap();
        fs.purge_strays();
        assert_eq!(fs.getattr(a.ino), Err(FsError::NotFound));
        assert!(fs.kv.is_empty(Table::Orphans));
    }

    #[test]
    fn a_file_with_more_links_survives_an_unlink() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        fs.call(MetaOp::Link { ino: a.ino, new_parent: ROOT, new_name: b"b".to_vec() }).unwrap();
        fs.unlink(ROOT, "a", false).unwrap();
        let b = fs.lookup(ROOT, "b").unwrap();
        assert_eq!((b.ino, b.nlink), (a.ino, 1));
        assert_eq!(b.ctime, fs.now());
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
    }

    #[test]
    fn rmdir_and_unlink_refuse_the_wrong_kind_and_full_directories() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        fs.create(d.ino, "f").unwrap();
        fs.create(ROOT, "file").unwrap();
        assert_eq!(fs.unlink(ROOT, "d", false), Err(FsError::IsDir));
        assert_eq!(fs.rmdir(ROOT, "d"), Err(FsError::NotEmpty));
        assert_eq!(fs.rmdir(ROOT, "file"), Err(FsError::NotDir));
        assert_eq!(fs.rmdir(ROOT, "nothing"), Err(FsError::NotFound));
        fs.unlink(d.ino, "f", false).unwrap();
        fs.purge_strays();
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
        fs.rmdir(ROOT, "d").unwrap();
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 2);
        assert_eq!(fs.getattr(d.ino), Err(FsError::NotFound));
        // Only regular files have chunks to collect.
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap().len(), 1);
        assert_eq!(fs.kv.get(Table::Inodes, &d.ino.0.to_be_bytes()).unwrap(), None);
    }
}
