//! Cluster-wide POSIX advisory locks (fcntl, OFD and flock) for this client's processes.
//!
//! Meta holds every lock, except those of a file this client holds `Exclusive`: its
//! first lock request there asks meta to hand it the file's locks (`LockAndDelegate`),
//! which meta does when no other session holds one. The client then takes and drops
//! the file's locks by itself, without a meta round trip, until a recall of its cap
//! makes it give them back (`ReturnLocks`, before the ack): another session's lock
//! request of the file makes the leader recall that cap first (docs/flows/locks.md,
//! "Locks a client keeps").
//!
//! This client also remembers which `(inode, owner)` pairs it has locked, so that
//! closing a file that never held a lock (the common case) costs nothing. A waiting lock
//! (F_SETLKW) polls with `GetLock` and tries `SetLock` again once the range looks free;
//! it gives up with EINTR when the waiting process is gone.

use crate::client::{expired_handle, Client, Shared};
use crate::session::unexpected;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoa_proto::{
    first_blocker, set_lock, CapMode, FileLock, LockKind, LockOwner, MetaOp, MetaResponse,
};
use stoa_types::{FsError, InodeId, SessionId};
use tokio::sync::OwnedMutexGuard;

/// How often a waiting lock asks meta again, at first and at most.
const POLL_MIN: Duration = Duration::from_millis(5);
const POLL_MAX: Duration = Duration::from_millis(100);

/// A lock request as a front end sees it: the kernel's owner id and range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockRequest {
    pub owner: u64,
    pub start: u64,
    /// Inclusive.
    pub end: u64,
    pub kind: LockKind,
    pub pid: u32,
}

/// The locks of the files meta handed this client, and one turn per file for the lock
/// requests of this client.
///
/// Invariant: a file's kept locks are used and changed only under its turn and a pin of
/// its cap (a request of this client), and given back under its turn (a request, or a
/// recall, which takes the turn before the cap's gate, as requests do). They are used
/// only while the client holds the file `Exclusive` in the session meta handed them to,
/// by requests made in that session.
#[derive(Default)]
pub(crate) struct KeptLocks {
    files: Mutex<HashMap<InodeId, Kept>>,
    turns: Mutex<HashMap<InodeId, Arc<tokio::sync::Mutex<()>>>>,
}

struct Kept {
    session: SessionId,
    locks: Vec<FileLock>,
}

/// One lock request's turn on a file: the client's requests of one file go to meta one
/// at a time, so that none is applied there between a hand-over and its use here.
pub(crate) struct Turn<'a> {
    kept: &'a KeptLocks,
    ino: InodeId,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = self.kept.turns.lock().expect("lock turns poisoned");
        if turns.get(&self.ino).is_some_and(|turn| Arc::strong_count(turn) == 1) {
            turns.remove(&self.ino);
        }
    }
}

impl KeptLocks {
    pub(crate) async fn turn(&self, ino: InodeId) -> Turn<'_> {
        let turn = self.turns.lock().expect("lock turns poisoned").entry(ino).or_default().clone();
        Turn { kept: self, ino, guard: Some(turn.lock_owned().await) }
    }

    fn files(&self) -> std::sync::MutexGuard<'_, HashMap<InodeId, Kept>> {
        self.files.lock().expect("kept locks poisoned")
    }

    fn holds(&self, ino: InodeId) -> bool {
        self.files().contains_key(&ino)
    }
}

/// What one try of a lock request came to.
enum Outcome {
    Taken,
    Blocked,
    /// Another session keeps the file's locks; the leader asked for them back.
    Elsewhere,
}

impl Client {
    fn file_lock(&self, req: &LockRequest) -> FileLock {
        let owner = LockOwner { session: self.session().session, owner: req.owner };
        FileLock { owner, start: req.start, end: req.end, kind: req.kind, pid: req.pid }
    }

    /// F_GETLK: the lock of another owner, on any client, that is in the way.
    pub async fn getlk(&self, ino: InodeId, req: LockRequest) -> Result<Option<FileLock>, FsError> {
        let lock = self.file_lock(&req);
        loop {
            {
                let _turn = self.sh.kept.turn(ino).await;
                self.same_session(&lock)?;
                if let Some(found) =
                    self.kept_locally(ino, |held| Ok(first_blocker(held, &lock))).await?
                {
                    return Ok(found);
                }
                match self.sh.session.call(MetaOp::GetLock { ino, lock }).await? {
                    MetaResponse::Lock(found) => return Ok(found),
                    MetaResponse::LocksElsewhere => {}
                    other => return Err(unexpected("get lock", &other)),
                }
            }
            tokio::time::sleep(POLL_MIN).await;
        }
    }

    /// F_SETLK, or F_SETLKW when `wait`: takes, converts or drops a lock.
    pub async fn setlk(&self, ino: InodeId, req: LockRequest, wait: bool) -> Result<(), FsError> {
        let lock = self.file_lock(&req);
        let mut pause = POLL_MIN;
        loop {
            match self.try_setlk(ino, &lock).await? {
                Outcome::Taken => {
                    self.note_lock(ino, req.owner, req.kind);
                    return Ok(());
                }
                Outcome::Blocked if !wait => return Err(FsError::WouldBlock),
                Outcome::Blocked => {
                    // Wait for the range to look free without writing to the log each time.
                    while self.getlk(ino, req).await?.is_some() {
                        if !process_alive(req.pid) {
                            return Err(FsError::Interrupted);
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(POLL_MAX);
                    }
                }
                Outcome::Elsewhere => tokio::time::sleep(POLL_MIN).await,
            }
        }
    }

    /// A request made in a session meta has expired since (a waiter that outlived it)
    /// fails like every other use of what the old session held.
    fn same_session(&self, lock: &FileLock) -> Result<(), FsError> {
        match lock.owner.session == self.sh.session.id() {
            true => Ok(()),
            false => Err(expired_handle()),
        }
    }

    async fn try_setlk(&self, ino: InodeId, lock: &FileLock) -> Result<Outcome, FsError> {
        let _turn = self.sh.kept.turn(ino).await;
        self.same_session(lock)?;
        if lock.kind == LockKind::Unlock && !self.sh.kept.holds(ino) {
            // What was written under the lock must be visible to the next holder (kept
            // locks have no other holder before the cap's recall, which flushes).
            self.flush_inode(ino).await?;
        }
        let local = self
            .kept_locally(ino, |held| match set_lock(held, lock) {
                Ok(change) => {
                    change.apply(held);
                    Ok(Outcome::Taken)
                }
                Err(FsError::WouldBlock) => Ok(Outcome::Blocked),
                Err(e) => Err(e),
            })
            .await?;
        if let Some(outcome) = local {
            return Ok(outcome);
        }
        let keep = self.sh.caps.holds(ino, CapMode::Exclusive);
        let op = match keep {
            true => MetaOp::LockAndDelegate { ino, lock: *lock },
            false => MetaOp::SetLock { ino, lock: *lock },
        };
        // No pin of the cap is held here: the leader may wait for other sessions' acks
        // before it answers, and their changes may wait for a recall of this client's
        // cap. A recall that comes before the hand-over is installed finds nothing to
        // give back; the hand-over is then given back at once below.
        match self.sh.session.call(op).await {
            Ok(MetaResponse::Done) => {}
            Ok(MetaResponse::Delegated(locks)) => {
                let session = lock.owner.session;
                self.sh.kept.files().insert(ino, Kept { session, locks });
                if !self.sh.caps.holds(ino, CapMode::Exclusive) {
                    give_back(&self.sh, ino).await?;
                }
                return Ok(Outcome::Taken);
            }
            Ok(MetaResponse::LocksElsewhere) => return Ok(Outcome::Elsewhere),
            Ok(other) => return Err(unexpected("set lock", &other)),
            Err(FsError::WouldBlock) => return Ok(Outcome::Blocked),
            Err(e) => return Err(e),
        }
        if lock.kind != LockKind::Unlock {
            // The previous holder may have changed the file: read it afresh.
            self.drop_cached_data(ino);
        }
        Ok(Outcome::Taken)
    }

    /// Answers with `answer` over the locks this client keeps of `ino`, if it keeps them
    /// and holds the file `Exclusive`, under a pin of the cap (its recall waits). None
    /// when meta holds them: kept locks the client may no longer use (the cap lapsed) are
    /// given back first, and those of an ended session are dropped (they ended with
    /// it). Called under the file's turn.
    async fn kept_locally<T>(
        &self,
        ino: InodeId,
        answer: impl FnOnce(&mut Vec<FileLock>) -> Result<T, FsError>,
    ) -> Result<Option<T>, FsError> {
        if !self.sh.kept.holds(ino) {
            return Ok(None);
        }
        let lapsed = {
            let _pin = self.pin(&[ino]).await;
            let mut files = self.sh.kept.files();
            let Some(kept) = files.get_mut(&ino) else { return Ok(None) };
            let session = self.sh.session.id();
            if kept.session == session && self.sh.caps.holds(ino, CapMode::Exclusive) {
                return answer(&mut kept.locks).map(Some);
            }
            let lapsed = kept.session == session;
            if !lapsed {
                files.remove(&ino);
            }
            lapsed
        };
        if lapsed {
            give_back(&self.sh, ino).await?;
        }
        Ok(None)
    }

    /// Drops every lock `owner` holds on `ino`: a process closed the file (POSIX locks
    /// go with any close) or the last descriptor of an open file went (flock and OFD).
    ///
    /// A lock granted to the same owner while this release is under way (another thread
    /// of the process) may or may not be dropped by it, as with a close racing a lock on
    /// a local disk; either way it stays remembered, so a later close releases it.
    pub async fn release_locks(&self, ino: InodeId, owner: u64) -> Result<(), FsError> {
        let Some(granted) = self.granted(ino, owner) else { return Ok(()) };
        let all = LockRequest { owner, start: 0, end: u64::MAX, kind: LockKind::Unlock, pid: 0 };
        self.setlk(ino, all, false).await?;
        self.forget_lock(ino, owner, granted);
        Ok(())
    }

    /// How many locks `(ino, owner)` was granted, if any.
    fn granted(&self, ino: InodeId, owner: u64) -> Option<u64> {
        self.sh.locked.lock().expect("locked set poisoned").get(&(ino, owner)).copied()
    }

    async fn flush_inode(&self, ino: InodeId) -> Result<(), FsError> {
        match self.sh.files.get(ino) {
            Some(file) => file.flush_unowned(&self.sh).await,
            None => Ok(()),
        }
    }

    fn drop_cached_data(&self, ino: InodeId) {
        if let Some(file) = self.sh.files.get(ino) {
            file.lock().prefetched.clear();
        }
    }

    fn note_lock(&self, ino: InodeId, owner: u64, kind: LockKind) {
        let mut locked = self.sh.locked.lock().expect("locked set poisoned");
        // A partial unlock may leave locks behind; only a full release forgets the pair,
        // so remembering too much costs a harmless unlock at close.
        if kind == LockKind::Unlock {
            return;
        }
        *locked.entry((ino, owner)).or_default() += 1;
    }

    /// Forgets `(ino, owner)` after a full release, unless it was granted a lock since
    /// the release began (`granted` is the count the release saw).
    fn forget_lock(&self, ino: InodeId, owner: u64, granted: u64) {
        let mut locked = self.sh.locked.lock().expect("locked set poisoned");
        if locked.get(&(ino, owner)) == Some(&granted) {
            locked.remove(&(ino, owner));
        }
    }
}

/// Gives the locks this client keeps of `ino` back to meta, if it keeps them: for the
/// recall of the file's cap (before its ack), or when the cap lapsed. While meta cannot
/// be reached it tries again: until they are back, meta answers every other session's
/// lock request of the file `LocksElsewhere`. Those of an ended session or a removed
/// file ended with it. Any other refusal is a bug; the locks are dropped and the error
/// returned.
pub(crate) async fn give_back(sh: &Shared, ino: InodeId) -> Result<(), FsError> {
    let Some(kept) = sh.kept.files().remove(&ino) else { return Ok(()) };
    loop {
        let op = MetaOp::ReturnLocks { ino, locks: kept.locks.clone() };
        match sh.session.call_in(kept.session, op).await {
            Ok(_) | Err(FsError::SessionExpired) | Err(FsError::NotFound) => return Ok(()),
            Err(e @ (FsError::Unavailable(_) | FsError::NotLeader { .. } | FsError::Busy)) => {
                tracing::warn!("giving back the locks of inode {ino}: {e}; trying again");
                tokio::time::sleep(POLL_MAX).await;
            }
            Err(e) => {
                tracing::error!("meta refused the locks of inode {ino} back: {e}");
                return Err(e);
            }
        }
    }
}

/// Whether process `pid` of this machine still exists. The kernel gives 0 when it does
/// not say; such a waiter is never abandoned here.
fn process_alive(pid: u32) -> bool {
    pid == 0 || std::path::Path::new(&format!("/proc/{pid}")).exists()
}
