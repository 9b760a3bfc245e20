//! Namespace changes a client made by itself under exclusive caps on their directories
//! (docs/flows/caps.md, "Namespace changes made by the client"): the inode numbers it
//! may give new files, and the batch that applies its changes in order.
//!
//! ```text
//!  AllocInodes{count} --> NextInode advances by count --> reservation(session) = [first, end)
//!  Batch{ops} --> each op in its own overlay: Create (ino from the reservation, in
//!                 increasing order) | Remove (unlink or rmdir) | Rename | Link | Open
//!                 | Release | SetAttr
//! ```
//!
//! An inode number is used once: a create must take a number above every number the
//! session used before, so a number whose file was deleted (its chunks may still be
//! garbage on the chunk servers, named by that number) is never given to a new file.

use super::create::{self, NewNode};
use super::Place;
use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use crate::store::{self, counter, set_counter, Counter};
use serde::{Deserialize, Serialize};
use std::ops::Range;
use stoa_proto::{BatchOp, MetaResponse};
use stoa_types::{FileKind, FsError, InodeId, SessionId, Timestamp};

/// The most inode numbers one reservation hands out.
pub const INODE_RESERVATION_MAX: u32 = 1 << 16;
/// The most operations one batch may carry.
pub const BATCH_OPS_MAX: usize = 4096;

/// The inode numbers a session may still give new files: `next..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Reservation {
    next: u64,
    end: u64,
}

/// Reservations live in the counters table, beside the counter they are cut from, each
/// under this prefix and its session id.
const RESERVATION_PREFIX: &[u8] = b"inode_reservation/";

fn reservation_key(session: SessionId) -> Vec<u8> {
    let mut key = RESERVATION_PREFIX.to_vec();
    key.extend_from_slice(&session.0.to_be_bytes());
    key
}

/// The numbers each session may still give new files (`next..end` of every live
/// reservation with numbers left), sorted by their start. Reservations are cut from the
/// inode counter one after another, so they never overlap.
pub(crate) fn open_reservations(kv: &impl KvRead) -> Result<Vec<Range<u64>>, FsError> {
    let end = prefix_end(RESERVATION_PREFIX);
    let rows = kv.scan(Table::Counters, RESERVATION_PREFIX, end.as_deref(), usize::MAX)?;
    let mut ranges = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let r: Reservation = store::decode(Table::Counters, &key, &value)?;
        if r.next < r.end {
            ranges.push(r.next..r.end);
        }
    }
    ranges.sort_by_key(|r| r.start);
    Ok(ranges)
}

/// Reserves `count` inode numbers for `session`, in place of its last reservation.
pub(crate) fn alloc_inodes(
    kv: &mut impl KvWrite,
    session: SessionId,
    count: u32,
) -> Result<MetaResponse, FsError> {
    if count == 0 || count > INODE_RESERVATION_MAX {
        return Err(FsError::Invalid(format!(
            "an inode reservation takes 1 to {INODE_RESERVATION_MAX} numbers, not {count}"
        )));
    }
    let first = counter(kv, Counter::NextInode)?;
    let end = first + u64::from(count);
    set_counter(kv, Counter::NextInode, end)?;
    store::put(kv, Table::Counters, &reservation_key(session), &Reservation { next: first, end })?;
    Ok(MetaResponse::Inodes { first: InodeId(first), count })
}

/// Forgets the reservation of a session that ended.
pub(crate) fn forget(kv: &mut impl KvWrite, session: SessionId) -> Result<(), FsError> {
    kv.delete(Table::Counters, &reservation_key(session))
}

/// Applies `ops` of `session` in order, each alone: one that fails changes nothing and
/// the others still apply. Changes carry the instant the client made them; a release
/// happens at `now`, when meta applies the batch.
pub(crate) fn batch(
    kv: &mut impl KvWrite,
    session: SessionId,
    ops: &[BatchOp],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if ops.len() > BATCH_OPS_MAX {
        return Err(FsError::Invalid(format!(
            "a batch of {} operations is over the limit of {BATCH_OPS_MAX}",
            ops.len()
        )));
    }
    let mut results = Vec::with_capacity(ops.len());
    for op in ops {
        let result =
            crate::atomic(kv, |kv| apply_one(kv, session, op, now).map(|()| MetaResponse::Done));
        results.push(result.map(drop));
    }
    Ok(MetaResponse::Batch(results))
}

fn apply_one(
    kv: &mut impl KvWrite,
    session: SessionId,
    op: &BatchOp,
    now: Timestamp,
) -> Result<(), FsError> {
    match op {
        BatchOp::Create { ino, parent, name, kind, perm, uid, gid, rdev, target, open, at } => {
            take_reserved(kv, session, *ino)?;
            let new = match kind {
                FileKind::Dir => {
                    NewNode { kind: *kind, perm: *perm, uid: *uid, gid: *gid, rdev: 0 }
                }
                FileKind::Symlink => {
                    NewNode { kind: *kind, perm: 0o777, uid: *uid, gid: *gid, rdev: 0 }
                }
                _ => NewNode { kind: *kind, perm: *perm, uid: *uid, gid: *gid, rdev: *rdev },
            };
            if *open && *kind != FileKind::File {
                return Err(FsError::Invalid("only a regular file is created open".into()));
            }
            let target: &[u8] = if *kind == FileKind::Symlink { target } else { &[] };
            create::make(kv, *ino, Place { parent: *parent, name }, new, target, *at)?;
            if *open {
                super::session::open_file(kv, session, *ino)?;
            }
            Ok(())
        }
        BatchOp::Remove { parent, name, dir: true, at } => {
            super::unlink::rmdir(kv, *parent, name, *at).map(drop)
        }
        BatchOp::Remove { parent, name, dir: false, at } => {
            super::unlink::unlink(kv, *parent, name, *at).map(drop)
        }
        BatchOp::Rename { parent, name, new_parent, new_name, at } => {
            let from = Place { parent: *parent, name };
            let to = Place { parent: *new_parent, name: new_name };
            super::rename::rename(kv, from, to, 0, *at).map(drop)
        }
        BatchOp::Link { ino, new_parent, new_name, at } => {
            super::link::link(kv, *ino, *new_parent, new_name, *at).map(drop)
        }
        BatchOp::Release { ino } => super::session::release(kv, session, *ino, now).map(drop),
        BatchOp::Open { ino } => super::session::open_file(kv, session, *ino).map(drop),
        BatchOp::SetAttr { ino, set, at } => {
            // A size change cuts chunk data first: never batched (see the client's
            // `FileState::truncate`).
            if set.size.is_some() {
                return Err(FsError::Invalid("a batched attribute change sets no size".into()));
            }
            super::setattr::setattr(kv, *ino, set, *at).map(drop)
        }
    }
}

/// Takes `ino` from `session`'s reservation: it must lie in it, above every number
/// taken before.
fn take_reserved(kv: &mut impl KvWrite, session: SessionId, ino: InodeId) -> Result<(), FsError> {
    let key = reservation_key(session);
    let found: Option<Reservation> = store::get(kv, Table::Counters, &key)?;
    match found {
        Some(r) if (r.next..r.end).contains(&ino.0) => {
            store::put(kv, Table::Counters, &key, &Reservation { next: ino.0 + 1, ..r })
        }
        _ => Err(FsError::Invalid(format!(
            "inode {ino} is not reserved for session {session} (or was used already)"
        ))),
    }
}

/// The reservation of `session`, if any (for tests).
#[cfg(test)]
fn reserved(kv: &impl KvRead, session: SessionId) -> Option<Reservation> {
    store::get(kv, Table::Counters, &reservation_key(session)).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Fs, ROOT};
    use stoa_proto::MetaOp;
    use stoa_types::{SetAttr, SetTime, Timestamp};

    fn node(ino: InodeId, at: Place<'_>, kind: FileKind, open: bool, time: Timestamp) -> BatchOp {
        BatchOp::Create {
            ino,
            parent: at.parent,
            name: at.name.to_vec(),
            kind,
            perm: if kind == FileKind::Dir { 0o750 } else { 0o640 },
            uid: 5,
            gid: 6,
            rdev: 0,
            target: Vec::new(),
            open,
            at: time,
        }
    }

    fn file(ino: InodeId, parent: InodeId, name: &str, at: Timestamp) -> BatchOp {
        node(ino, Place { parent, name: name.as_bytes() }, FileKind::File, false, at)
    }

    fn reserve(fs: &mut Fs, count: u32) -> InodeId {
        match fs.call(MetaOp::AllocInodes { count }).unwrap() {
            MetaResponse::Inodes { first, count: got } => {
                assert_eq!(got, count);
                first
            }
            other => panic!("{other:?}"),
        }
    }

    fn run(fs: &mut Fs, ops: Vec<BatchOp>) -> Vec<Result<(), FsError>> {
        match fs.call(MetaOp::Batch { ops }).unwrap() {
            MetaResponse::Batch(results) => results,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_batch_applies_in_order_with_the_clients_numbers_and_times() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 8);
        let at = Timestamp { secs: 1234, nanos: 5 };
        let d = InodeId(first.0 + 1);
        let mkdir = node(d, Place { parent: ROOT, name: b"d" }, FileKind::Dir, false, at);
        let results = run(
            &mut fs,
            vec![
                file(first, ROOT, "a", at),
                mkdir,
                file(InodeId(first.0 + 2), d, "inner", at),
                BatchOp::Remove { parent: ROOT, name: b"a".to_vec(), dir: false, at },
            ],
        );
        assert_eq!(results, vec![Ok(()), Ok(()), Ok(()), Ok(())]);
        let inner = fs.lookup(d, "inner").unwrap();
        assert_eq!(
            (inner.ino, inner.perm, inner.uid, inner.mtime),
            (InodeId(first.0 + 2), 0o640, 5, at)
        );
        let dir = fs.getattr(d).unwrap();
        assert_eq!((dir.kind, dir.nlink, dir.mtime), (FileKind::Dir, 2, at));
        assert_eq!(fs.lookup(ROOT, "a"), Err(FsError::NotFound));
        assert_eq!(fs.names(ROOT), vec!["d"]);
        // Another session's ordinary creates never take reserved numbers.
        let other = fs.create(ROOT, "plain").unwrap();
        assert!(other.ino.0 >= first.0 + 8);
    }

    #[test]
    fn numbers_outside_the_reservation_or_used_before_are_refused_alone() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 4);
        let at = Timestamp::default();
        let results = run(
            &mut fs,
            vec![
                file(InodeId(first.0 + 2), ROOT, "a", at),
                // Below a number already taken: it may name garbage chunks.
                file(first, ROOT, "b", at),
                file(InodeId(first.0 + 4), ROOT, "c", at),
                file(InodeId(first.0 + 3), ROOT, "a", at),
                file(InodeId(first.0 + 3), ROOT, "d", at),
            ],
        );
        assert!(results[0].is_ok());
        assert!(matches!(results[1], Err(FsError::Invalid(_))));
        assert!(matches!(results[2], Err(FsError::Invalid(_))));
        assert_eq!(results[3], Err(FsError::Exists));
        // The failed create took nothing: its number is still free.
        assert!(results[4].is_ok());
        assert_eq!(fs.names(ROOT), vec!["a", "d"]);
        // A new reservation replaces the old one.
        let again = reserve(&mut fs, 2);
        assert!(again.0 >= first.0 + 4);
        assert!(matches!(
            run(&mut fs, vec![file(InodeId(first.0 + 3), ROOT, "e", at)])[0],
            Err(FsError::Invalid(_))
        ));
        fs.call(MetaOp::CloseSession).unwrap();
        assert_eq!(reserved(&fs.kv, fs.session), None, "a session's end forgets its reservation");
    }

    #[test]
    fn created_open_files_are_orphans_until_released_and_bad_requests_are_refused() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 4);
        let at = Timestamp::default();
        let opened = node(first, Place { parent: ROOT, name: b"f" }, FileKind::File, true, at);
        let remove = BatchOp::Remove { parent: ROOT, name: b"f".to_vec(), dir: false, at };
        assert_eq!(run(&mut fs, vec![opened, remove]), vec![Ok(()), Ok(())]);
        assert_eq!(fs.getattr(first).unwrap().nlink, 0, "kept while open");
        assert_eq!(run(&mut fs, vec![BatchOp::Release { ino: first }]), vec![Ok(())]);
        assert_eq!(crate::strays(&fs.kv, fs.now(), 10).unwrap(), vec![first], "then a stray");
        fs.purge_strays();
        assert_eq!(fs.getattr(first), Err(FsError::NotFound));
        let x = Place { parent: ROOT, name: b"x" };
        let dir_open = node(InodeId(first.0 + 1), x, FileKind::Dir, true, at);
        assert!(matches!(run(&mut fs, vec![dir_open])[0], Err(FsError::Invalid(_))));
        let rmdir_file = BatchOp::Remove { parent: ROOT, name: b"x".to_vec(), dir: true, at };
        assert_eq!(run(&mut fs, vec![rmdir_file]), vec![Err(FsError::NotFound)]);
        // A batched open keeps a file as an orphan like any open; one of a file that is
        // gone fails alone.
        let g = InodeId(first.0 + 2);
        let made = node(g, Place { parent: ROOT, name: b"g" }, FileKind::File, false, at);
        let remove_g = BatchOp::Remove { parent: ROOT, name: b"g".to_vec(), dir: false, at };
        let ops = vec![made, BatchOp::Open { ino: g }, remove_g, BatchOp::Open { ino: first }];
        assert_eq!(run(&mut fs, ops), vec![Ok(()), Ok(()), Ok(()), Err(FsError::NotFound)]);
        assert_eq!(fs.getattr(g).unwrap().nlink, 0, "kept while open");
        assert_eq!(run(&mut fs, vec![BatchOp::Release { ino: g }]), vec![Ok(())]);
        fs.purge_strays();
        assert_eq!(fs.getattr(g), Err(FsError::NotFound));
        for count in [0, INODE_RESERVATION_MAX + 1] {
            assert!(matches!(fs.call(MetaOp::AllocInodes { count }), Err(FsError::Invalid(_))));
        }
        let too_many = vec![BatchOp::Release { ino: first }; BATCH_OPS_MAX + 1];
        assert!(matches!(fs.call(MetaOp::Batch { ops: too_many }), Err(FsError::Invalid(_))));
    }

    /// A batched link gives a file another name at the client's time, with the link count
    /// and versions a direct `Link` leaves; the refusals are `Link`'s, each alone.
    #[test]
    fn a_batched_link_names_a_file_again_at_the_clients_time() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 2);
        let (made, at) = (Timestamp { secs: 100, nanos: 0 }, Timestamp { secs: 300, nanos: 9 });
        let d = InodeId(first.0 + 1);
        let mkdir = node(d, Place { parent: ROOT, name: b"new" }, FileKind::Dir, false, made);
        let link = |ino: InodeId, new_parent: InodeId, name: &str| BatchOp::Link {
            ino,
            new_parent,
            new_name: name.as_bytes().to_vec(),
            at,
        };
        let remove = BatchOp::Remove { parent: ROOT, name: b"m".to_vec(), dir: false, at };
        let ops = vec![
            file(first, ROOT, "m", made),
            mkdir,
            link(first, d, "m"),
            link(first, d, "m"),
            link(d, ROOT, "d2"),
            link(InodeId(first.0 + 9), d, "x"),
            remove,
        ];
        let results = run(&mut fs, ops);
        assert_eq!(results[..3], [Ok(()), Ok(()), Ok(())]);
        assert_eq!(
            results[3..6],
            [Err(FsError::Exists), Err(FsError::NotPermitted), Err(FsError::NotFound)]
        );
        assert_eq!(results[6], Ok(()));
        let attr = fs.lookup(d, "m").unwrap();
        assert_eq!((attr.ino, attr.nlink, attr.ctime), (first, 1, at));
        // Made (1), linked (2), unlinked (3): one version per change, as the client counts.
        assert_eq!(attr.version, 3);
        let dir = fs.getattr(d).unwrap();
        assert_eq!((dir.mtime, dir.ctime, dir.nlink), (at, at, 2));
        assert_eq!(fs.names(d), vec!["m"]);
        assert_eq!(fs.names(ROOT), vec!["new"]);
    }

    /// A batched change of mode, owner or times applies at the client's time; one with a
    /// size is refused, and a size commit with an earlier time keeps the change time.
    #[test]
    fn a_batched_attribute_change_sets_mode_owner_and_times_at_the_clients_time() {
        let mut fs = Fs::new();
        let ino = reserve(&mut fs, 1);
        let made = Timestamp { secs: 100, nanos: 0 };
        let at = Timestamp { secs: 200, nanos: 7 };
        let set = SetAttr { perm: Some(0o600), uid: Some(0), gid: Some(9), ..SetAttr::default() };
        let chown = BatchOp::SetAttr { ino, set, at };
        let grow =
            BatchOp::SetAttr { ino, set: SetAttr { size: Some(1), ..SetAttr::default() }, at };
        let archived = Timestamp { secs: 50, nanos: 3 };
        let touch = BatchOp::SetAttr {
            ino,
            set: SetAttr {
                mtime: Some(SetTime::At(archived)),
                atime: Some(SetTime::Now),
                ..SetAttr::default()
            },
            at,
        };
        let results = run(&mut fs, vec![file(ino, ROOT, "j", made), chown, grow, touch]);
        assert_eq!(results[..2], [Ok(()), Ok(())]);
        assert!(matches!(results[2], Err(FsError::Invalid(_))), "{:?}", results[2]);
        assert_eq!(results[3], Ok(()));
        let attr = fs.attr(MetaOp::GetAttr { ino }).unwrap();
        assert_eq!((attr.perm, attr.uid, attr.gid, attr.size), (0o600, 0, 9, 0));
        assert_eq!((attr.ctime, attr.mtime, attr.atime), (at, archived, at));
        let commit = stoa_proto::Commit { ino, size: 10, at: Timestamp { secs: 150, nanos: 0 } };
        fs.call(MetaOp::CommitWrites { commits: vec![commit.clone()] }).unwrap();
        let attr = fs.attr(MetaOp::GetAttr { ino }).unwrap();
        assert_eq!((attr.size, attr.mtime, attr.ctime), (10, commit.at, at));
    }
}
