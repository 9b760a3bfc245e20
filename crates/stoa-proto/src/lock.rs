//! What taking or dropping a byte-range lock does to the locks held on one inode: the
//! one definition meta's state machine and a client keeping an inode's locks both use.
//!
//! Locks of one owner never conflict with each other; a new lock of an owner replaces
//! that owner's locks in its range, splitting them at its edges (POSIX). Readers share;
//! a writer excludes every other owner.

use crate::meta::{FileLock, LockKind};
use stoa_types::FsError;

/// The locks a request removes from an inode's set, and those it adds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LockChange {
    pub removed: Vec<FileLock>,
    pub added: Vec<FileLock>,
}

impl FileLock {
    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, other: &FileLock) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// Whether this held lock stops `want` from being granted.
    pub fn blocks(&self, want: &FileLock) -> bool {
        self.owner != want.owner
            && self.overlaps(want)
            && (self.kind == LockKind::Write || want.kind == LockKind::Write)
    }

    /// Refuses an empty range.
    pub fn check_range(&self) -> Result<(), FsError> {
        if self.start > self.end {
            return Err(FsError::Invalid(format!(
                "lock range {}..={} is empty",
                self.start, self.end
            )));
        }
        Ok(())
    }
}

/// F_GETLK over `held`: the first lock of another owner in the way of `want`.
pub fn first_blocker(held: &[FileLock], want: &FileLock) -> Option<FileLock> {
    if want.kind == LockKind::Unlock {
        return None;
    }
    held.iter().find(|h| h.blocks(want)).copied()
}

/// F_SETLK over `held`: what taking, converting or dropping `lock` changes, or
/// `WouldBlock` when another owner holds a conflicting lock.
pub fn set_lock(held: &[FileLock], lock: &FileLock) -> Result<LockChange, FsError> {
    lock.check_range()?;
    if first_blocker(held, lock).is_some() {
        return Err(FsError::WouldBlock);
    }
    let mut change = LockChange::default();
    for mine in held.iter().filter(|h| h.owner == lock.owner && h.overlaps(lock)) {
        change.removed.push(*mine);
        if mine.start < lock.start {
            change.added.push(FileLock { end: lock.start - 1, ..*mine });
        }
        if mine.end > lock.end {
            change.added.push(FileLock { start: lock.end + 1, ..*mine });
        }
    }
    if lock.kind != LockKind::Unlock {
        change.added.push(*lock);
    }
    Ok(change)
}

impl LockChange {
    /// Applies the change to a set of locks held in memory.
    pub fn apply(self, held: &mut Vec<FileLock>) {
        held.retain(|h| !self.removed.contains(h));
        held.extend(self.added);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::meta::LockOwner;
    use stoa_types::SessionId;

    fn lock(owner: u64, start: u64, end: u64, kind: LockKind) -> FileLock {
        FileLock { owner: LockOwner { session: SessionId(1), owner }, start, end, kind, pid: 7 }
    }

    fn set(held: &mut Vec<FileLock>, l: FileLock) -> Result<(), FsError> {
        set_lock(held, &l)?.apply(held);
        Ok(())
    }

    #[test]
    fn unlocking_the_middle_splits_and_a_writer_waits_for_readers() {
        let mut held = Vec::new();
        set(&mut held, lock(1, 0, 99, LockKind::Write)).unwrap();
        set(&mut held, lock(1, 40, 59, LockKind::Unlock)).unwrap();
        held.sort_by_key(|l| l.start);
        assert_eq!(held, vec![lock(1, 0, 39, LockKind::Write), lock(1, 60, 99, LockKind::Write)]);
        assert_eq!(first_blocker(&held, &lock(2, 40, 59, LockKind::Write)), None);
        assert_eq!(first_blocker(&held, &lock(2, 30, 45, LockKind::Read)), Some(held[0]));
        // Downgrade to shared: another reader fits, a writer does not.
        set(&mut held, lock(1, 0, 99, LockKind::Read)).unwrap();
        assert_eq!(held, vec![lock(1, 0, 99, LockKind::Read)]);
        set(&mut held, lock(2, 50, 50, LockKind::Read)).unwrap();
        assert_eq!(set(&mut held, lock(3, 0, 0, LockKind::Write)), Err(FsError::WouldBlock));
        assert_eq!(set(&mut held, lock(2, 50, 50, LockKind::Write)), Err(FsError::WouldBlock));
        assert!(matches!(set(&mut held, lock(2, 5, 4, LockKind::Read)), Err(FsError::Invalid(_))));
    }
}
