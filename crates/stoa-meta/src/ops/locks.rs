//! POSIX advisory locks, held across every client of the cluster.
//!
//! A lock belongs to an owner, `(session, kernel lock owner)`: a process for `fcntl`
//! locks, an open file for OFD and `flock` locks. Locks of one owner never conflict with
//! each other; a new lock of an owner replaces (splitting where needed) that owner's
//! locks in its range, as POSIX requires. `SetLock` never waits: a caller that wants to
//! wait (F_SETLKW) polls `GetLock` and tries again when the range is free, so no request
//! is parked inside the state machine.
//!
//! ```text
//!  locks          ino ++ session ++ owner ++ start -> { end, kind, pid }
//!  session_locks  session ++ ino -> ()      which inodes a session holds locks on
//!                                           or keeps, so a dead session's locks go
//!                                           in one sweep
//!  lock_delegations  ino -> session         the session that keeps the inode's locks
//! ```
//!
//! A client that holds a file `Exclusive` may keep its locks (`LockAndDelegate`, when
//! no other session holds one there): it then takes and drops them by itself, and
//! every other session's `SetLock` or `GetLock` of the inode is answered
//! `LocksElsewhere` until the keeper gives them back (`ReturnLocks`, which the leader
//! makes it do by recalling its cap). The rows of `locks` of a kept inode are the
//! keeper's locks when it took them; its own are in its memory.
//!
//! Invariant: for every row of `locks` and of `lock_delegations` there is a row of
//! `session_locks` for its session and inode, and the locks of different owners on one
//! inode never conflict.

use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use crate::store::{self, delete_prefix, ino_key, load_inode};
use serde::{Deserialize, Serialize};
use stoa_proto::{first_blocker, set_lock, FileLock, LockKind, LockOwner, MetaResponse};
use stoa_types::{FsError, InodeId, SessionId};

/// How a held lock is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct LockRec {
    end: u64,
    exclusive: bool,
    pid: u32,
}

fn lock_key(ino: InodeId, owner: LockOwner, start: u64) -> [u8; 32] {
    let mut key = [0; 32];
    key[..8].copy_from_slice(&ino_key(ino));
    key[8..16].copy_from_slice(&owner.session.0.to_be_bytes());
    key[16..24].copy_from_slice(&owner.owner.to_be_bytes());
    key[24..].copy_from_slice(&start.to_be_bytes());
    key
}

fn index_key(session: SessionId, ino: InodeId) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&session.0.to_be_bytes());
    key[8..].copy_from_slice(&ino_key(ino));
    key
}

fn be64(bytes: &[u8]) -> u64 {
    let mut word = [0; 8];
    word.copy_from_slice(&bytes[..8]);
    u64::from_be_bytes(word)
}

/// Every lock held on `ino`, as requests would describe them.
fn locks_on(kv: &impl KvRead, ino: InodeId) -> Result<Vec<FileLock>, FsError> {
    let prefix = ino_key(ino);
    let end = prefix_end(&prefix);
    let rows = kv.scan(Table::Locks, &prefix, end.as_deref(), usize::MAX)?;
    rows.into_iter()
        .map(|(key, value)| {
            if key.len() != 32 {
                return Err(FsError::Io(format!("lock key of {} bytes", key.len())));
            }
            let rec: LockRec = store::decode(Table::Locks, &key, &value)?;
            let owner = LockOwner { session: SessionId(be64(&key[8..])), owner: be64(&key[16..]) };
            let kind = if rec.exclusive { LockKind::Write } else { LockKind::Read };
            Ok(FileLock { owner, start: be64(&key[24..]), end: rec.end, kind, pid: rec.pid })
        })
        .collect()
}

/// The session that keeps `ino`'s locks itself, if one does.
pub fn delegate_of(kv: &impl KvRead, ino: InodeId) -> Result<Option<SessionId>, FsError> {
    Ok(store::get::<u64>(kv, Table::LockDelegations, &ino_key(ino))?.map(SessionId))
}

/// Whether a session other than `session` keeps `ino`'s locks: it must give them back
/// before anyone else's lock request can be answered.
fn kept_elsewhere(kv: &impl KvRead, ino: InodeId, session: SessionId) -> Result<bool, FsError> {
    Ok(delegate_of(kv, ino)?.is_some_and(|keeper| keeper != session))
}

/// F_GETLK: the first lock of another owner in the way of `lock`.
pub(crate) fn get(
    kv: &impl KvRead,
    ino: InodeId,
    lock: &FileLock,
) -> Result<MetaResponse, FsError> {
    lock.check_range()?;
    load_inode(kv, ino)?;
    if kept_elsewhere(kv, ino, lock.owner.session)? {
        return Ok(MetaResponse::LocksElsewhere);
    }
    Ok(MetaResponse::Lock(first_blocker(&locks_on(kv, ino)?, lock)))
}

/// F_SETLK: takes, converts or drops the owner's locks in the range, or answers
/// `WouldBlock` when another owner holds a conflicting one. With `delegate` (the caller
/// holds the file exclusively), hands the caller the inode's locks when no other
/// session holds one.
pub(crate) fn set(
    kv: &mut impl KvWrite,
    ino: InodeId,
    lock: &FileLock,
    delegate: bool,
) -> Result<MetaResponse, FsError> {
    lock.check_range()?;
    // The kernel has checked that the file is open for the kind of lock asked for;
    // flock on a directory is legal, so any existing inode may hold locks.
    load_inode(kv, ino)?;
    let session = lock.owner.session;
    if kept_elsewhere(kv, ino, session)? {
        return Ok(MetaResponse::LocksElsewhere);
    }
    let mut held = locks_on(kv, ino)?;
    let change = set_lock(&held, lock)?;
    for gone in &change.removed {
        kv.delete(Table::Locks, &lock_key(ino, gone.owner, gone.start))?;
    }
    for new in &change.added {
        put_lock(kv, ino, new)?;
    }
    change.apply(&mut held);
    let answer = if delegate && held.iter().all(|h| h.owner.session == session) {
        store::put(kv, Table::LockDelegations, &ino_key(ino), &session.0)?;
        MetaResponse::Delegated(held)
    } else {
        MetaResponse::Done
    };
    refresh_index(kv, ino, session)?;
    Ok(answer)
}

/// Takes back the locks of `ino` that `session` kept: `locks` become its locks there.
pub(crate) fn give_back(
    kv: &mut impl KvWrite,
    ino: InodeId,
    session: SessionId,
    locks: &[FileLock],
) -> Result<MetaResponse, FsError> {
    if delegate_of(kv, ino)? != Some(session) {
        return Err(FsError::Invalid(format!(
            "session {session} does not keep the locks of inode {ino}"
        )));
    }
    for lock in locks {
        lock.check_range()?;
        if lock.owner.session != session || lock.kind == LockKind::Unlock {
            return Err(FsError::Invalid(format!("session {session} cannot return {lock:?}")));
        }
    }
    let mut mine = ino_key(ino).to_vec();
    mine.extend_from_slice(&session.0.to_be_bytes());
    delete_prefix(kv, Table::Locks, &mine)?;
    for lock in locks {
        put_lock(kv, ino, lock)?;
    }
    kv.delete(Table::LockDelegations, &ino_key(ino))?;
    refresh_index(kv, ino, session)?;
    Ok(MetaResponse::Done)
}

fn put_lock(kv: &mut impl KvWrite, ino: InodeId, lock: &FileLock) -> Result<(), FsError> {
    let rec = LockRec { end: lock.end, exclusive: lock.kind == LockKind::Write, pid: lock.pid };
    store::put(kv, Table::Locks, &lock_key(ino, lock.owner, lock.start), &rec)
}

/// Keeps the session's index row for `ino` exactly when it holds a lock there or keeps
/// the inode's locks.
fn refresh_index(kv: &mut impl KvWrite, ino: InodeId, session: SessionId) -> Result<(), FsError> {
    let mut prefix = ino_key(ino).to_vec();
    prefix.extend_from_slice(&session.0.to_be_bytes());
    let end = prefix_end(&prefix);
    let holds = !kv.scan(Table::Locks, &prefix, end.as_deref(), 1)?.is_empty()
        || delegate_of(kv, ino)? == Some(session);
    let key = index_key(session, ino);
    if holds {
        kv.put(Table::SessionLocks, &key, &[])
    } else {
        kv.delete(Table::SessionLocks, &key)
    }
}

/// Drops every lock of `session`: it closed, or its lease ran out.
pub(crate) fn release_session(kv: &mut impl KvWrite, session: SessionId) -> Result<(), FsError> {
    let prefix = session.0.to_be_bytes();
    let end = prefix_end(&prefix);
    let rows = kv.scan(Table::SessionLocks, &prefix, end.as_deref(), usize::MAX)?;
    for (key, _) in rows {
        let ino = InodeId(be64(&key[8..]));
        let mut locks = ino_key(ino).to_vec();
        locks.extend_from_slice(&prefix);
        delete_prefix(kv, Table::Locks, &locks)?;
        if delegate_of(kv, ino)? == Some(session) {
            kv.delete(Table::LockDelegations, &ino_key(ino))?;
        }
        kv.delete(Table::SessionLocks, &key)?;
    }
    Ok(())
}

/// Drops every lock on an inode that no longer exists.
pub(crate) fn release_inode(kv: &mut impl KvWrite, ino: InodeId) -> Result<(), FsError> {
    for lock in locks_on(kv, ino)? {
        kv.delete(Table::SessionLocks, &index_key(lock.owner.session, ino))?;
    }
    kv.delete(Table::LockDelegations, &ino_key(ino))?;
    delete_prefix(kv, Table::Locks, &ino_key(ino))
}

#[cfg(test)]
mod tests {
    use crate::kv::KvRead;
    use crate::testing::{Fs, ROOT};
    use stoa_proto::{FileLock, LockKind, LockOwner, MetaOp, MetaResponse};
    use stoa_types::{FsError, InodeId, SessionId};

    const EOF: u64 = u64::MAX;

    fn lock(session: SessionId, owner: u64, start: u64, end: u64, kind: LockKind) -> FileLock {
        FileLock { owner: LockOwner { session, owner }, start, end, kind, pid: 7 }
    }

    fn set(fs: &mut Fs, ino: InodeId, l: FileLock) -> Result<(), FsError> {
        fs.call(MetaOp::SetLock { ino, lock: l }).map(|_| ())
    }

    fn get(fs: &mut Fs, ino: InodeId, l: FileLock) -> Option<FileLock> {
        match fs.call(MetaOp::GetLock { ino, lock: l }).unwrap() {
            MetaResponse::Lock(found) => found,
            other => panic!("get lock answered {other:?}"),
        }
    }

    #[test]
    fn readers_share_and_writers_exclude() {
        let mut fs = Fs::new();
        let s = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        set(&mut fs, ino, lock(s, 1, 0, 99, LockKind::Read)).unwrap();
        set(&mut fs, ino, lock(s, 2, 50, 150, LockKind::Read)).unwrap();
        let w = lock(s, 3, 90, 95, LockKind::Write);
        assert_eq!(set(&mut fs, ino, w), Err(FsError::WouldBlock));
        let holder = get(&mut fs, ino, w).expect("a holder is reported");
        assert!(holder.owner.owner == 1 || holder.owner.owner == 2);
        // Beyond both read locks the write lock is free.
        set(&mut fs, ino, lock(s, 3, 151, EOF, LockKind::Write)).unwrap();
        assert!(get(&mut fs, ino, lock(s, 3, 0, 10, LockKind::Write)).is_some());
        assert!(get(&mut fs, ino, lock(s, 1, 0, 10, LockKind::Write)).is_none());
    }

    #[test]
    fn unlocking_the_middle_splits_a_lock_and_upgrades_replace() {
        let mut fs = Fs::new();
        let s = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        set(&mut fs, ino, lock(s, 1, 0, 99, LockKind::Write)).unwrap();
        set(&mut fs, ino, lock(s, 1, 40, 59, LockKind::Unlock)).unwrap();
        assert!(get(&mut fs, ino, lock(s, 2, 40, 59, LockKind::Write)).is_none());
        assert!(get(&mut fs, ino, lock(s, 2, 39, 39, LockKind::Read)).is_some());
        assert!(get(&mut fs, ino, lock(s, 2, 60, 60, LockKind::Read)).is_some());
        // Downgrade part of it to shared: other readers fit there, writers do not.
        set(&mut fs, ino, lock(s, 1, 0, 9, LockKind::Read)).unwrap();
        set(&mut fs, ino, lock(s, 2, 0, 9, LockKind::Read)).unwrap();
        assert_eq!(set(&mut fs, ino, lock(s, 2, 10, 10, LockKind::Read)), Err(FsError::WouldBlock));
        // Owner 2 cannot upgrade while owner 1 shares the range.
        assert_eq!(set(&mut fs, ino, lock(s, 2, 0, 9, LockKind::Write)), Err(FsError::WouldBlock));
        set(&mut fs, ino, lock(s, 1, 0, EOF, LockKind::Unlock)).unwrap();
        set(&mut fs, ino, lock(s, 2, 0, 9, LockKind::Write)).unwrap();
    }

    #[test]
    fn a_closed_session_leaves_no_locks_behind() {
        let mut fs = Fs::new();
        let s = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        let mine = lock(s, 1, 0, EOF, LockKind::Write);
        set(&mut fs, ino, mine).unwrap();
        let other = FileLock { owner: LockOwner { session: SessionId(999), owner: 1 }, ..mine };
        assert!(get(&mut fs, ino, other).is_some());
        fs.call(MetaOp::CloseSession).unwrap();
        assert!(get(&mut fs, ino, other).is_none());
        assert!(fs.kv.scan(crate::Table::SessionLocks, &[], None, 10).unwrap().is_empty());
    }

    #[test]
    fn a_lock_of_another_session_is_refused_and_bad_ranges_are_invalid() {
        let mut fs = Fs::new();
        let s = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        let mut forged = lock(s, 1, 0, 1, LockKind::Write);
        forged.owner.session = SessionId(fs.session.0 + 1);
        assert!(matches!(set(&mut fs, ino, forged), Err(FsError::Invalid(_))));
        let bad = lock(s, 1, 5, 4, LockKind::Write);
        assert!(matches!(set(&mut fs, ino, bad), Err(FsError::Invalid(_))));
        let missing = InodeId(4242);
        assert_eq!(set(&mut fs, missing, lock(s, 1, 0, 1, LockKind::Read)), Err(FsError::NotFound));
    }

    #[test]
    fn a_kept_inode_answers_others_elsewhere_until_its_locks_come_back() {
        let mut fs = Fs::new();
        let a = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        let b = fs.open_session();
        let mine = lock(a, 1, 0, 9, LockKind::Write);
        let kept = fs.call(MetaOp::LockAndDelegate { ino, lock: mine });
        assert_eq!(kept, Ok(MetaResponse::Delegated(vec![mine])));

        fs.session = b;
        let theirs = lock(b, 1, 0, 9, LockKind::Read);
        let elsewhere = Ok(MetaResponse::LocksElsewhere);
        assert_eq!(fs.call(MetaOp::SetLock { ino, lock: theirs }), elsewhere);
        assert_eq!(fs.call(MetaOp::LockAndDelegate { ino, lock: theirs }), elsewhere);
        assert_eq!(fs.call(MetaOp::GetLock { ino, lock: theirs }), elsewhere);
        let stolen = fs.call(MetaOp::ReturnLocks { ino, locks: vec![] });
        assert!(matches!(stolen, Err(FsError::Invalid(_))), "{stolen:?}");

        // The keeper took another lock by itself meanwhile, and gives back both.
        fs.session = a;
        let shared = lock(a, 2, 20, 29, LockKind::Read);
        let forged = lock(b, 2, 20, 29, LockKind::Read);
        let refused = fs.call(MetaOp::ReturnLocks { ino, locks: vec![forged] });
        assert!(matches!(refused, Err(FsError::Invalid(_))), "{refused:?}");
        fs.call(MetaOp::ReturnLocks { ino, locks: vec![mine, shared] }).unwrap();

        fs.session = b;
        assert_eq!(get(&mut fs, ino, lock(b, 1, 25, 25, LockKind::Write)), Some(shared));
        assert_eq!(set(&mut fs, ino, theirs), Err(FsError::WouldBlock));
        let beside = lock(b, 1, 50, 59, LockKind::Read);
        assert_eq!(fs.call(MetaOp::SetLock { ino, lock: beside }), Ok(MetaResponse::Done));

        // Another session holds a lock there now: the inode's locks stay with meta.
        fs.session = a;
        let unlock = lock(a, 1, 0, 9, LockKind::Unlock);
        assert_eq!(fs.call(MetaOp::LockAndDelegate { ino, lock: unlock }), Ok(MetaResponse::Done));
        assert!(fs.kv.scan(crate::Table::LockDelegations, &[], None, 10).unwrap().is_empty());
    }

    #[test]
    fn a_keeper_that_ends_leaves_the_inode_to_the_others() {
        let mut fs = Fs::new();
        let a = fs.session;
        let ino = fs.create(ROOT, "f").unwrap().ino;
        let b = fs.open_session();
        let mine = lock(a, 1, 0, EOF, LockKind::Write);
        fs.call(MetaOp::LockAndDelegate { ino, lock: mine }).unwrap();
        // Its locks are kept even when it held none at meta when it ended.
        fs.call(MetaOp::ReturnLocks { ino, locks: vec![] }).unwrap();
        let again = fs.call(MetaOp::LockAndDelegate { ino, lock: mine }).unwrap();
        assert_eq!(again, MetaResponse::Delegated(vec![mine]));
        fs.call(MetaOp::CloseSession).unwrap();
        fs.session = b;
        set(&mut fs, ino, lock(b, 1, 0, EOF, LockKind::Write)).unwrap();
        assert!(fs.kv.scan(crate::Table::LockDelegations, &[], None, 10).unwrap().is_empty());
    }
}
