//! SetAttr, CommitWrite and CommitWrites: changes to one inode's attributes.
//!
//! A size change here is metadata only: the client truncates or extends the chunk data
//! itself before it calls SetAttr, and records written data with CommitWrite, or with
//! CommitWrites, many files' commits in one log entry.

use super::batch::BATCH_OPS_MAX;
use crate::kv::KvWrite;
use crate::store::{load_inode, save_inode};
use stoa_proto::{Commit, MetaResponse};
use stoa_types::{Attr, FileKind, FsError, InodeId, SetAttr, Timestamp};

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
    set.apply(attr, now);
    save_inode(kv, &mut rec)?;
    Ok(MetaResponse::Attr(rec.attr))
}

pub(crate) fn commit_write(
    kv: &mut impl KvWrite,
    ino: InodeId,
    size: u64,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    grow(kv, ino, size, now).map(MetaResponse::Attr)
}

/// Grows file `ino` to at least `size`, written at `at`; returns its new attributes.
fn grow(kv: &mut impl KvWrite, ino: InodeId, size: u64, at: Timestamp) -> Result<Attr, FsError> {
    let mut rec = load_inode(kv, ino)?;
    check_is_file(rec.attr.kind, ino)?;
    rec.attr.size = rec.attr.size.max(size);
    rec.attr.mtime = at;
    // A mode or owner change the client batched may have applied first with a later
    // time; the change time does not go back.
    rec.attr.ctime = rec.attr.ctime.max(at);
    save_inode(kv, &mut rec)?;
    Ok(rec.attr)
}

/// Applies `commits` in order, each alone (one that fails changes nothing), each at the
/// client's time; answers with the attributes each one left.
pub(crate) fn commit_writes(
    kv: &mut impl KvWrite,
    commits: &[Commit],
) -> Result<MetaResponse, FsError> {
    if commits.len() > BATCH_OPS_MAX {
        return Err(FsError::Invalid(format!(
            "{} size commits are over the limit of {BATCH_OPS_MAX}",
            commits.len()
        )));
    }
    // One inode read and, for a file, one write: a commit that fails writes nothing.
    let attrs = commits.iter().map(|c| grow(kv, c.ino, c.size, c.at)).collect();
    Ok(MetaResponse::Attrs(attrs))
}

/// Only regular files have data whose size can change.
fn check_is_file(kind: FileKind, ino: InodeId) -> Result<(), FsError> {
    match kind {
        FileKind::File => Ok(()),
        FileKind::Dir => Err(FsError::IsDir),
        other => Err(FsError::Invalid(format!("inode {ino} is a {other:?}, not a regular file"))),
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::batch::BATCH_OPS_MAX;
    use crate::testing::{at, Fs, ROOT};
    use stoa_proto::{Commit, MetaOp, MetaResponse};
    use stoa_types::{FsError, InodeId, SetAttr, SetTime};

    #[test]
    fn setattr_changes_only_what_it_is_given() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let set = SetAttr { perm: Some(0o4600 | 0o170000), uid: Some(7), ..SetAttr::default() };
        let b = fs.attr(MetaOp::SetAttr { ino: a.ino, set }).unwrap();
        assert_eq!((b.perm, b.uid, b.gid, b.size), (0o4600, 7, a.gid, 0));
        assert_eq!((b.mtime, b.ctime, b.version), (a.mtime, fs.now(), a.version + 1));
        let set = SetAttr {
            atime: Some(SetTime::At(at(5))),
            mtime: Some(SetTime::Now),
            gid: Some(9),
            ..SetAttr::default()
        };
        let c = fs.attr(MetaOp::SetAttr { ino: a.ino, set }).unwrap();
        assert_eq!((c.atime, c.mtime, c.gid), (at(5), fs.now(), 9));
        assert_eq!(fs.getattr(a.ino).unwrap(), c);
    }

    #[test]
    fn a_size_change_is_for_files_and_moves_mtime() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let size = |size| MetaOp::SetAttr {
            ino: a.ino,
            set: SetAttr { size: Some(size), ..SetAttr::default() },
        };
        let b = fs.attr(size(100)).unwrap();
        assert_eq!((b.size, b.mtime), (100, fs.now()));
        let c = fs.attr(size(100)).unwrap();
        assert_eq!(c.mtime, b.mtime, "an unchanged size leaves mtime alone");
        assert_eq!(fs.attr(size(3)).unwrap().size, 3);
        let on_dir =
            MetaOp::SetAttr { ino: ROOT, set: SetAttr { size: Some(0), ..SetAttr::default() } };
        assert_eq!(fs.attr(on_dir), Err(FsError::IsDir));
        let missing = MetaOp::SetAttr { ino: stoa_types::InodeId(99), set: SetAttr::default() };
        assert_eq!(fs.attr(missing), Err(FsError::NotFound));
    }

    #[test]
    fn commit_writes_apply_in_order_each_alone_at_the_clients_time() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let d = fs.mkdir(ROOT, "d").unwrap().ino;
        let written = at(7);
        let commit = |ino, size| Commit { ino, size, at: written };
        let commits =
            vec![commit(a.ino, 4096), commit(InodeId(999), 1), commit(d, 1), commit(a.ino, 10)];
        let Ok(MetaResponse::Attrs(attrs)) = fs.call(MetaOp::CommitWrites { commits }) else {
            panic!("CommitWrites answers with attributes");
        };
        // Each answer is the version its commit left, which the client orders by.
        let grown = attrs[0].clone().unwrap();
        assert_eq!((grown.size, grown.mtime, grown.ctime), (4096, written, written));
        assert_eq!(grown.version, a.version + 1);
        assert_eq!(attrs[1], Err(FsError::NotFound));
        assert_eq!(attrs[2], Err(FsError::IsDir));
        let last = attrs[3].clone().unwrap();
        assert_eq!((last.size, last.version), (4096, a.version + 2));
        assert_eq!(fs.getattr(a.ino).unwrap(), last);
        let too_many = vec![commit(a.ino, 1); BATCH_OPS_MAX + 1];
        let refused = fs.call(MetaOp::CommitWrites { commits: too_many });
        assert!(matches!(refused, Err(FsError::Invalid(_))));
        assert_eq!(fs.getattr(a.ino).unwrap(), last);
    }

    #[test]
    fn commit_write_only_grows_a_file() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let b = fs.attr(MetaOp::CommitWrite { ino: a.ino, size: 50 }).unwrap();
        assert_eq!((b.size, b.mtime, b.ctime), (50, fs.now(), fs.now()));
        let c = fs.attr(MetaOp::CommitWrite { ino: a.ino, size: 10 }).unwrap();
        assert_eq!((c.size, c.mtime), (50, fs.now()));
        assert_eq!(fs.attr(MetaOp::CommitWrite { ino: ROOT, size: 1 }), Err(FsError::IsDir));
    }
}
