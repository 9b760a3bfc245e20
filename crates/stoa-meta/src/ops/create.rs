//! Create (files, devices, FIFOs, sockets), Mkdir and Symlink: a new inode under a new
//! name.

use super::{touch_dir, valid_name, Place};
use crate::kv::{KvWrite, Table};
use crate::store::{
    self, count_files, find_dentry, ino_key, load_dir, put_dentry, take_next, Counter, Dentry,
    InodeRec,
};
use stoa_proto::MetaResponse;
use stoa_types::{Attr, FileKind, FsError, InodeId, SessionId, Timestamp, PATH_LEN_MAX};

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
    let ino = next_ino(kv)?;
    make(kv, ino, Place { parent, name }, new, &[], now)
}

/// Creates a regular file and records that `session` has it open: `open(O_CREAT)` of a
/// new file in one log entry instead of two.
pub(crate) fn create_open(
    kv: &mut impl KvWrite,
    session: SessionId,
    parent: InodeId,
    name: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let ino = next_ino(kv)?;
    let answer = make(kv, ino, Place { parent, name }, new, &[], now)?;
    super::session::open_file(kv, session, ino)?;
    Ok(answer)
}

pub(crate) fn mkdir(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let new = NewNode { kind: FileKind::Dir, rdev: 0, ..new };
    let ino = next_ino(kv)?;
    make(kv, ino, Place { parent, name }, new, &[], now)
}

pub(crate) fn symlink(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    target: &[u8],
    new: NewNode,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let new = NewNode { kind: FileKind::Symlink, perm: 0o777, rdev: 0, ..new };
    let ino = next_ino(kv)?;
    make(kv, ino, Place { parent, name }, new, target, now)
}

/// The next inode number nobody was given.
fn next_ino(kv: &mut impl KvWrite) -> Result<InodeId, FsError> {
    Ok(InodeId(take_next(kv, Counter::NextInode)?))
}

/// Makes inode `ino` of `new.kind` (a symlink to `target`) and links it at `at`.
pub(crate) fn make(
    kv: &mut impl KvWrite,
    ino: InodeId,
    at: Place<'_>,
    new: NewNode,
    target: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let size = if new.kind == FileKind::Symlink {
        if target.is_empty() {
            // As on Linux: an empty target names nothing.
            return Err(FsError::NotFound);
        }
        if target.len() > PATH_LEN_MAX {
            return Err(FsError::NameTooLong);
        }
        target.len() as u64
    } else {
        0
    };
    let rec = add_inode(kv, ino, at, new, size, now)?;
    if new.kind == FileKind::Symlink {
        store::put(kv, Table::Symlinks, &ino_key(ino), &target.to_vec())?;
    }
    Ok(MetaResponse::Attr(rec.attr))
}

/// Makes inode `ino` of `new.kind` and `size` bytes and links it at `at`.
fn add_inode(
    kv: &mut impl KvWrite,
    ino: InodeId,
    Place { parent, name }: Place<'_>,
    new: NewNode,
    size: u64,
    now: Timestamp,
) -> Result<InodeRec, FsError> {
    let dir = load_dir(kv, parent)?;
    let name = valid_name(name)?;
    if find_dentry(kv, parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    let is_dir = new.kind == FileKind::Dir;
    let (perm, gid) = dir.attr.inherited(new.kind, new.perm & 0o7777, new.gid);
    let attr = Attr {
        ino,
        kind: new.kind,
        perm,
        uid: new.uid,
        gid,
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

#[cfg(test)]
mod tests {
    use crate::testing::{create_op, Fs, ROOT};
    use stoa_proto::{MetaOp, MetaResponse};
    use stoa_types::{FileKind, FsError, SetAttr, NAME_LEN_MAX};

    #[test]
    fn create_makes_a_file_and_updates_the_parent() {
        let mut fs = Fs::new();
        let root = fs.getattr(ROOT).unwrap();
        let a = fs.create(ROOT, "a").unwrap();
        assert_eq!((a.kind, a.perm, a.nlink, a.size, a.uid), (FileKind::File, 0o644, 1, 0, 1));
        assert_eq!((a.mtime, a.version), (fs.now(), 1));
        assert_eq!(fs.lookup(ROOT, "a").unwrap(), a);
        let root_after = fs.getattr(ROOT).unwrap();
        assert_eq!(root_after.nlink, 2);
        assert_eq!(root_after.mtime, fs.now());
        assert!(root_after.version > root.version);
        let fifo = fs.attr(create_op(ROOT, "p", FileKind::Fifo)).unwrap();
        assert_eq!(fifo.kind, FileKind::Fifo);
        assert_ne!(fifo.ino, a.ino);
        assert_eq!(fs.create(ROOT, "a"), Err(FsError::Exists));
        assert!(matches!(fs.attr(create_op(ROOT, "d", FileKind::Dir)), Err(FsError::Invalid(_))));
    }

    #[test]
    fn mkdir_counts_subdirectories_in_the_parent() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        assert_eq!((d.kind, d.nlink, d.perm), (FileKind::Dir, 2, 0o755));
        fs.mkdir(ROOT, "e").unwrap();
        fs.create(ROOT, "f").unwrap();
        assert_eq!(fs.getattr(ROOT).unwrap().nlink, 4);
        let inner = fs.mkdir(d.ino, "inner").unwrap();
        assert_eq!(fs.getattr(d.ino).unwrap().nlink, 3);
        assert_eq!(fs.mkdir(ROOT, "d"), Err(FsError::Exists));
        let f = fs.lookup(ROOT, "f").unwrap();
        assert_eq!(fs.create(f.ino, "x"), Err(FsError::NotDir));
        assert_eq!(fs.create(inner.ino, "x").unwrap().nlink, 1);
        assert_eq!(fs.mkdir(stoa_types::InodeId(999), "x"), Err(FsError::NotFound));
    }

    #[test]
    fn a_set_group_id_directory_gives_its_group_and_the_bit_to_new_directories() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        let set = SetAttr { perm: Some(0o2775), gid: Some(42), ..SetAttr::default() };
        fs.attr(MetaOp::SetAttr { ino: d.ino, set }).unwrap();
        let f = fs.create(d.ino, "f").unwrap();
        assert_eq!((f.perm, f.gid, f.uid), (0o644, 42, 1));
        let sub = fs.mkdir(d.ino, "sub").unwrap();
        assert_eq!((sub.perm, sub.gid), (0o2755, 42));
        let deeper = fs.create(sub.ino, "g").unwrap();
        assert_eq!(deeper.gid, 42);
        let link = MetaOp::Symlink {
            parent: d.ino,
            name: b"l".to_vec(),
            target: b"f".to_vec(),
            uid: 1,
            gid: 1,
        };
        assert_eq!(fs.attr(link).unwrap().gid, 42);
        // Without the bit, the caller's group and mode.
        assert_eq!(
            (fs.create(ROOT, "plain").unwrap().gid, fs.mkdir(ROOT, "e").unwrap().perm),
            (1, 0o755)
        );
    }

    #[test]
    fn bad_names_are_refused() {
        let mut fs = Fs::new();
        assert_eq!(fs.create(ROOT, &"x".repeat(NAME_LEN_MAX + 1)), Err(FsError::NameTooLong));
        for bad in ["", ".", "..", "a/b"] {
            assert!(matches!(fs.create(ROOT, bad), Err(FsError::Invalid(_))), "{bad:?}");
            assert!(matches!(fs.lookup(ROOT, bad), Err(FsError::Invalid(_))), "{bad:?}");
        }
        assert!(fs.create(ROOT, &"x".repeat(NAME_LEN_MAX)).is_ok());
    }

    #[test]
    fn a_symlink_keeps_its_target() {
        let mut fs = Fs::new();
        let op = |name: &str, target: &[u8]| MetaOp::Symlink {
            parent: ROOT,
            name: name.as_bytes().to_vec(),
            target: target.to_vec(),
            uid: 3,
            gid: 4,
        };
        let l = fs.attr(op("l", b"../target")).unwrap();
        assert_eq!((l.kind, l.perm, l.size, l.uid, l.version), (FileKind::Symlink, 0o777, 9, 3, 1));
        assert_eq!(
            fs.call(MetaOp::ReadLink { ino: l.ino }),
            Ok(MetaResponse::Data(b"../target".to_vec()))
        );
        assert_eq!(fs.attr(op("empty", b"")), Err(FsError::NotFound));
        assert_eq!(fs.attr(op("long", &[b'a'; 4097])), Err(FsError::NameTooLong));
        assert!(matches!(fs.call(MetaOp::ReadLink { ino: ROOT }), Err(FsError::Invalid(_))));
    }
}
