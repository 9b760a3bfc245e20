//! Lock requests from the kernel, translated for the client: `fcntl` lock types to
//! [`LockKind`], and the answers back.

use crate::attr::errno;
use fuser::{Errno, ReplyEmpty, ReplyLock};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use stoa_client::{Client, FsError, InodeId, LockKind, LockRequest};
use tokio::sync::watch;

/// The kind named by an `fcntl` lock type (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
pub fn kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

fn typ(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

fn log_err(what: &str, e: &FsError) -> Errno {
    if !matches!(e, FsError::WouldBlock | FsError::Interrupted) {
        tracing::warn!("{what} failed: {e}");
    }
    errno(e)
}

/// F_GETLK: the blocking lock, or the range reported free (type F_UNLCK).
pub async fn getlk(c: Client, ino: InodeId, req: LockRequest, reply: ReplyLock) {
    match c.getlk(ino, req).await {
        Ok(Some(held)) => reply.locked(held.start, held.end, typ(held.kind), held.pid),
        Ok(None) => reply.locked(req.start, req.end, libc::F_UNLCK, 0),
        Err(e) => reply.error(log_err("getlk", &e)),
    }
}

/// F_SETLK / F_SETLKW. The kernel's cached pages need no dropping when a lock is
/// taken: it caches a file only under a cap, and another mount's writes recalled that
/// cap first (flows/locks.md). Dropping them here did harm: the kernel's invalidation
/// waits for pages locked by reads in flight, and it ran on a runtime thread, so a lock
/// taken while the same mount read the file could stall the whole mount (the fault
/// runs' compare-and-set found it: three clients stuck, renewals stopped).
pub async fn setlk(c: Client, ino: InodeId, req: LockRequest, wait: bool, reply: ReplyEmpty) {
    match c.setlk(ino, req, wait).await {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(log_err("setlk", &e)),
    }
}

/// What the kernel does not tell about locks, kept here: which lock owners each open
/// file used (it does not say which OFD locks an open file held when it is released),
/// and the unlocks of closes still under way.
///
/// Invariant: a lock request of `(inode, owner)` reaches the client only after every
/// unlock of that pair that the kernel sent before it has finished. The kernel reuses
/// an OFD owner (the address of the open file) as soon as the file is freed, while its
/// release may still be in flight here; without this order the old release could drop
/// the new file's lock (two holders), or forget it (a lock held forever).
#[derive(Default)]
pub struct LockBook {
    inner: Mutex<BookInner>,
}

#[derive(Default)]
struct BookInner {
    /// Open file handle -> owners that locked through it.
    by_handle: HashMap<u64, HashSet<u64>>,
    /// `(inode, owner)` -> the last unlock under way; it finishes after earlier ones.
    unlocking: HashMap<(u64, u64), watch::Receiver<bool>>,
}

/// An unlock of `(inode, owner)` under way, registered in the book. Wait for `earlier`
/// before unlocking; dropping it tells later requests of the pair that it is done.
pub struct Unlock {
    book: Arc<LockBook>,
    key: (u64, u64),
    earlier: Option<watch::Receiver<bool>>,
    done: watch::Sender<bool>,
}

impl LockBook {
    fn inner(&self) -> std::sync::MutexGuard<'_, BookInner> {
        self.inner.lock().expect("lock book poisoned")
    }

    /// A lock request of `owner` on `ino` through `handle` (`takes`: not an unlock); what
    /// it must wait for.
    pub fn locking(
        &self,
        handle: u64,
        ino: u64,
        owner: u64,
        takes: bool,
    ) -> Option<watch::Receiver<bool>> {
        let mut inner = self.inner();
        if takes {
            inner.by_handle.entry(handle).or_default().insert(owner);
        }
        inner.unlocking.get(&(ino, owner)).cloned()
    }

    /// An unlock of all of `owner`'s locks on `ino` (a close).
    pub fn unlocking(self: &Arc<Self>, ino: u64, owner: u64) -> Unlock {
        let (done, watcher) = watch::channel(false);
        let earlier = self.inner().unlocking.insert((ino, owner), watcher);
        Unlock { book: self.clone(), key: (ino, owner), earlier, done }
    }

    /// The last close of `handle`: unlocks of the owners that locked through it (and
    /// `flock_owner`, which the kernel names), except owners another open file also
    /// locked through. Such an owner is a POSIX one (a process, whose locks went with
    /// its flush), or an OFD one the kernel already reused (its locks now belong to the
    /// new file, and go when that one is released).
    pub fn closing(
        self: &Arc<Self>,
        handle: u64,
        ino: u64,
        flock_owner: Option<u64>,
    ) -> Vec<Unlock> {
        let owners: HashSet<u64> = {
            let mut inner = self.inner();
            let mine = inner.by_handle.remove(&handle).unwrap_or_default();
            mine.into_iter()
                .chain(flock_owner)
                .filter(|o| !inner.by_handle.values().any(|other| other.contains(o)))
                .collect()
        };
        owners.into_iter().map(|owner| self.unlocking(ino, owner)).collect()
    }
}

/// Waits until an earlier unlock finished (or was dropped unfinished).
pub async fn after(earlier: Option<watch::Receiver<bool>>) {
    if let Some(mut earlier) = earlier {
        let _ = earlier.wait_for(|done| *done).await;
    }
}

impl Unlock {
    pub fn owner(&self) -> u64 {
        self.key.1
    }

    /// Waits for the earlier unlocks of the same pair.
    pub async fn ready(&mut self) {
        after(self.earlier.take()).await;
    }
}

impl Drop for Unlock {
    fn drop(&mut self) {
        let _ = self.done.send(true);
        let mut inner = self.book.inner();
        if inner
            .unlocking
            .get(&self.key)
            .is_some_and(|last| last.same_channel(&self.done.subscribe()))
        {
            inner.unlocking.remove(&self.key);
        }
    }
}
