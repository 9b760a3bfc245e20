//! Cluster-wide POSIX advisory locks (fcntl, OFD and flock) for this client's processes.
//!
//! Meta holds every lock; this client remembers which `(inode, owner)` pairs it has
//! locked, so that closing a file that never held a lock (the common case) costs no
//! meta round trip. A waiting lock (F_SETLKW) polls meta with `GetLock`, a read, and
//! tries `SetLock` again once the range looks free; it gives up with EINTR when the
//! waiting process is gone.

use crate::client::Client;
use crate::session::unexpected;
use std::time::Duration;
use stoa_proto::{FileLock, LockKind, LockOwner, MetaOp, MetaResponse};
use stoa_types::{FsError, InodeId};

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

impl Client {
    fn file_lock(&self, req: &LockRequest) -> FileLock {
        let owner = LockOwner { session: self.session().session, owner: req.owner };
        FileLock { owner, start: req.start, end: req.end, kind: req.kind, pid: req.pid }
    }

    /// F_GETLK: the lock of another owner, on any client, that is in the way.
    pub async fn getlk(&self, ino: InodeId, req: LockRequest) -> Result<Option<FileLock>, FsError> {
        let op = MetaOp::GetLock { ino, lock: self.file_lock(&req) };
        match self.sh.session.call(op).await? {
            MetaResponse::Lock(found) => Ok(found),
            other => Err(unexpected("get lock", &other)),
        }
    }

    /// F_SETLK, or F_SETLKW when `wait`: takes, converts or drops a lock.
    pub async fn setlk(&self, ino: InodeId, req: LockRequest, wait: bool) -> Result<(), FsError> {
        let lock = self.file_lock(&req);
        if req.kind == LockKind::Unlock {
            // What was written under the lock must be visible to the next holder.
            self.flush_inode(ino).await?;
        }
        let mut pause = POLL_MIN;
        loop {
            match self.sh.session.call_done(MetaOp::SetLock { ino, lock }).await {
                Ok(()) => {
                    self.note_lock(ino, req.owner, req.kind);
                    if req.kind != LockKind::Unlock {
                        // The previous holder may have changed the file: read it afresh.
                        self.drop_cached_data(ino);
                    }
                    return Ok(());
                }
                Err(FsError::WouldBlock) if wait => {}
                Err(e) => return Err(e),
            }
            // Wait for the range to look free without writing to the log each time.
            while self.getlk(ino, req).await?.is_some() {
                if !process_alive(req.pid) {
                    return Err(FsError::Interrupted);
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(POLL_MAX);
            }
        }
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
        match self.sh.open_file(ino) {
            Some(file) => file.flush_unowned(&self.sh).await,
            None => Ok(()),
        }
    }

    fn drop_cached_data(&self, ino: InodeId) {
        if let Some(file) = self.sh.open_file(ino) {
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

/// Whether process `pid` of this machine still exists. The kernel gives 0 when it does
/// not say; such a waiter is never abandoned here.
fn process_alive(pid: u32) -> bool {
    pid == 0 || std::path::Path::new(&format!("/proc/{pid}")).exists()
}
