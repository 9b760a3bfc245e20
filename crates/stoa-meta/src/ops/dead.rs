//! Dead inodes: the numbers no file can ever own again, asked for by the chunk servers'
//! sweep, which then removes every chunk they hold of them (tombstones the garbage
//! collector left, chunks of files cut short before their deletion, late writes, and
//! chunks of files whose create never reached meta).
//!
//! ```text
//!  DeadInodes{inos} --> for each: below NextInode?  no  --> alive (not handed out yet)
//!                                 in Inodes?        yes --> alive (a file, or an orphan)
//!                                 in Garbage?       yes --> alive (the leader deletes its
//!                                                           chunks first; the next sweep
//!                                                           after GarbageCollected runs)
//!                                 reserved?         yes --> alive (a session may create it)
//!                                 otherwise             --> dead
//! ```
//!
//! Why dead is for good: a number enters the inode table only through a create, which
//! takes it either from the inode counter (so at or above `NextInode`, never a number
//! already handed out) or from the creating session's reservation, at or above the
//! reservation's next number (`batch::take_reserved`). A reservation is cut from the
//! counter, so it never covers a number handed out before; its next number only grows; a
//! new one replaces the session's last one and a session's end forgets it. So a number
//! below the counter that is in no reservation now is in none later, and the garbage
//! table is fed only from the inode table. Nothing the state machine applies later can
//! bring a dead number back, which is what lets a chunk server act on the answer after
//! any delay and without coordinating with writers.
//!
//! Why only the current reservations count: meta refuses a batched create whose number
//! is not in the session's current reservation, whatever the client believed. A client
//! (stoa-client `dirops.rs`, `reserved_ino`) asks for a new reservation only once the
//! last one is used up or its session changed, and that call first waits until meta
//! answered every change queued before it (`session.rs`, `after_backlog`), so the old
//! reservation's creates are applied before it is replaced. A create that still arrives
//! with an older number (one taken just as another task reserved anew), and the queued
//! creates of a session that ended, are refused: those files never existed in meta, and
//! the chunks their writers made belong to no file, so removing them is right.

use super::batch::open_reservations;
use crate::kv::{KvRead, Table};
use crate::store::{counter, ino_key, Counter};
use stoa_proto::{MetaResponse, DEAD_INODES_MAX};
use stoa_types::{FsError, InodeId};

/// The subset of `inos` that are dead, in the order asked.
pub(crate) fn dead_inodes(kv: &impl KvRead, inos: &[InodeId]) -> Result<MetaResponse, FsError> {
    if inos.len() > DEAD_INODES_MAX {
        return Err(FsError::Invalid(format!(
            "asked about {} inodes at once; the limit is {DEAD_INODES_MAX}",
            inos.len()
        )));
    }
    let next = counter(kv, Counter::NextInode)?;
    let reserved = open_reservations(kv)?;
    let is_reserved = |ino: u64| {
        // The ranges are disjoint and sorted: the only candidate is the last one that
        // starts at or below `ino`.
        let after = reserved.partition_point(|r| r.start <= ino);
        after > 0 && reserved[after - 1].contains(&ino)
    };
    let mut dead = Vec::new();
    for &ino in inos {
        if ino.0 >= next || is_reserved(ino.0) {
            continue;
        }
        let key = ino_key(ino);
        // Existence is enough: a row that does not decode still keeps its inode alive.
        if kv.get(Table::Inodes, &key)?.is_some() || kv.get(Table::Garbage, &key)?.is_some() {
            continue;
        }
        dead.push(ino);
    }
    Ok(MetaResponse::DeadInodes(dead))
}

#[cfg(test)]
mod tests {
    use crate::testing::{Fs, ROOT};
    use crate::{apply, Command};
    use stoa_proto::{BatchOp, MetaOp, MetaResponse, DEAD_INODES_MAX};
    use stoa_types::{FileKind, FsError, InodeId, Timestamp};

    fn dead(fs: &mut Fs, inos: &[InodeId]) -> Vec<InodeId> {
        match fs.call(MetaOp::DeadInodes { inos: inos.to_vec() }).unwrap() {
            MetaResponse::DeadInodes(dead) => dead,
            other => panic!("DeadInodes answered {other:?}"),
        }
    }

    fn reserve(fs: &mut Fs, count: u32) -> InodeId {
        match fs.call(MetaOp::AllocInodes { count }).unwrap() {
            MetaResponse::Inodes { first, .. } => first,
            other => panic!("AllocInodes answered {other:?}"),
        }
    }

    fn batch_create(fs: &mut Fs, ino: InodeId, name: &str) -> Result<(), FsError> {
        let op = BatchOp::Create {
            ino,
            parent: ROOT,
            name: name.as_bytes().to_vec(),
            kind: FileKind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: Vec::new(),
            open: false,
            at: Timestamp::default(),
        };
        match fs.call(MetaOp::Batch { ops: vec![op] }).unwrap() {
            MetaResponse::Batch(mut results) => results.remove(0),
            other => panic!("Batch answered {other:?}"),
        }
    }

    #[test]
    fn live_files_and_garbage_are_alive_and_collected_files_are_dead() {
        let mut fs = Fs::new();
        let live = fs.create(ROOT, "live").unwrap().ino;
        let pending = fs.create(ROOT, "pending").unwrap().ino;
        let collected = fs.create(ROOT, "collected").unwrap().ino;
        let orphan = fs.create(ROOT, "orphan").unwrap().ino;
        let all = [ROOT, live, pending, collected, orphan];
        assert_eq!(dead(&mut fs, &all), vec![]);
        fs.unlink(ROOT, "pending", false).unwrap();
        fs.unlink(ROOT, "collected", false).unwrap();
        fs.call(MetaOp::Open { ino: orphan }).unwrap();
        fs.unlink(ROOT, "orphan", false).unwrap();
        fs.purge_strays();
        // Both deleted files are garbage until the leader has deleted their chunks.
        assert_eq!(dead(&mut fs, &all), vec![]);
        apply(&mut fs.kv, &Command::GarbageCollected { ino: collected }).unwrap();
        assert_eq!(dead(&mut fs, &all), vec![collected]);
        // An orphan is alive while open and dead once its last opener let go and its
        // garbage was collected.
        fs.call(MetaOp::Release { ino: orphan }).unwrap();
        fs.purge_strays();
        assert_eq!(dead(&mut fs, &all), vec![collected]);
        apply(&mut fs.kv, &Command::GarbageCollected { ino: orphan }).unwrap();
        assert_eq!(dead(&mut fs, &all), vec![collected, orphan]);
    }

    #[test]
    fn numbers_not_handed_out_yet_are_alive() {
        let mut fs = Fs::new();
        let last = fs.create(ROOT, "a").unwrap().ino;
        let unborn = [InodeId(last.0 + 1), InodeId(last.0 + 1000), InodeId(u64::MAX)];
        assert_eq!(dead(&mut fs, &unborn), vec![]);
        // Numbers below the counter that never became a file (none here but 0) are dead.
        assert_eq!(dead(&mut fs, &[InodeId(0)]), vec![InodeId(0)]);
    }

    #[test]
    fn reserved_numbers_are_alive_until_skipped_replaced_or_their_session_ends() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 4);
        let r: Vec<InodeId> = (0..4).map(|i| InodeId(first.0 + i)).collect();
        assert_eq!(dead(&mut fs, &r), vec![], "a session may still create any of them");
        batch_create(&mut fs, r[2], "made").unwrap();
        // Creates take numbers in increasing order: the two below can no longer be used.
        assert_eq!(dead(&mut fs, &r), vec![r[0], r[1]]);
        // A new reservation replaces the old one, whose numbers meta no longer accepts.
        let second = reserve(&mut fs, 2);
        assert!(matches!(batch_create(&mut fs, r[3], "late"), Err(FsError::Invalid(_))));
        assert_eq!(dead(&mut fs, &r), vec![r[0], r[1], r[3]]);
        let s = [second, InodeId(second.0 + 1)];
        assert_eq!(dead(&mut fs, &s), vec![]);
        // A session's end forgets its reservation.
        fs.call(MetaOp::CloseSession).unwrap();
        assert_eq!(dead(&mut fs, &s), s.to_vec());
        assert_eq!(dead(&mut fs, &[r[2]]), vec![], "the file made from it lives on");
    }

    #[test]
    fn another_sessions_reservation_keeps_its_numbers_alive() {
        let mut fs = Fs::new();
        let first = reserve(&mut fs, 3);
        let mine: Vec<InodeId> = (0..3).map(|i| InodeId(first.0 + i)).collect();
        // A second session, whose reservation lies above the first one's.
        let MetaResponse::Session(grant) =
            fs.call(MetaOp::OpenSession { client: "other".into() }).unwrap()
        else {
            panic!("no session")
        };
        let me = std::mem::replace(&mut fs.session, grant.session);
        let theirs = reserve(&mut fs, 3);
        fs.session = me;
        let all = [mine.clone(), (0..3).map(|i| InodeId(theirs.0 + i)).collect()].concat();
        assert_eq!(dead(&mut fs, &all), vec![]);
        fs.call(MetaOp::CloseSession).unwrap();
        assert_eq!(dead(&mut fs, &all), mine, "only the ended session's numbers die");
    }

    #[test]
    fn too_many_inodes_at_once_are_refused() {
        let mut fs = Fs::new();
        let inos = vec![ROOT; DEAD_INODES_MAX + 1];
        let asked = fs.call(MetaOp::DeadInodes { inos });
        assert!(matches!(asked, Err(FsError::Invalid(_))), "{asked:?}");
        assert_eq!(dead(&mut fs, &vec![ROOT; DEAD_INODES_MAX]), vec![]);
    }
}
