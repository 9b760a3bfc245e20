//! Contended directories: those that two sessions use while one of them changes them.
//! The leader grants no cap on such a directory for a while, so that its changes recall
//! nothing (docs/flows/caps.md, invariant 40).
//!
//! A shared cap on a directory lets a client answer lookups in it from its cache, and
//! every change of the directory by another session recalls that cap before it is
//! answered; the holder's next lookup takes it again. With two mounts working in one
//! directory, each change so waited for a recall, and each lookup for a new grant:
//! 140-250 creates a second together, against 5,000 and more in directories of their
//! own. In a contended directory each lookup goes to meta instead, and a change waits
//! only for its Raft round.
//!
//! ```text
//!  change of dir by S, others hold caps --> contended: S and the holders use it now
//!  change or cap asked on it by S       --> S uses it now
//!  cap asked on it: changed, and used by 2+ sessions, within CONTENDED_FOR
//!      yes --> answered without a grant
//!      no  --> no longer contended --> granted
//! ```
//!
//! Invariant: being contended only decides whether a new grant of the directory is
//! registered. Grants registered before stay registered, and every change recalls them
//! as ever, so no cache's coherence depends on this table, which a new leader starts
//! empty.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use stoa_types::{InodeId, SessionId};

/// How long a change and a use keep a directory contended.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// The leader's contended directories.
#[derive(Default)]
pub(crate) struct ContendedDirs {
    dirs: HashMap<InodeId, Contention>,
}

struct Contention {
    /// The last change of the directory.
    changed: Instant,
    /// The sessions that used the directory within [`CONTENDED_FOR`], with their last use.
    used: Vec<(SessionId, Instant)>,
}

impl Contention {
    /// Notes a use by `session` at `now`, and forgets uses older than [`CONTENDED_FOR`].
    fn used_by(&mut self, session: SessionId, now: Instant) {
        self.used.retain(|(s, at)| *s != session && now.duration_since(*at) < CONTENDED_FOR);
        self.used.push((session, now));
    }

    fn contended(&self, now: Instant) -> bool {
        now.duration_since(self.changed) < CONTENDED_FOR && self.used.len() >= 2
    }
}

impl ContendedDirs {
    /// Notes that `session` changes `dir` at `now`, while the sessions `holders` (others)
    /// hold caps on it.
    pub fn changed(
        &mut self,
        session: SessionId,
        dir: InodeId,
        holders: &[SessionId],
        now: Instant,
    ) {
        if !self.dirs.contains_key(&dir) {
            if holders.is_empty() {
                return;
            }
            // Only directories changed lately are kept.
            self.dirs.retain(|_, entry| now.duration_since(entry.changed) < CONTENDED_FOR);
            let used = holders.iter().map(|&holder| (holder, now)).collect();
            self.dirs.insert(dir, Contention { changed: now, used });
        }
        let entry = self.dirs.get_mut(&dir).expect("inserted above");
        entry.changed = now;
        entry.used_by(session, now);
    }

    /// Notes that `session` asks for a cap on `dir` at `now`; returns whether to answer
    /// it without one (the directory is contended).
    pub fn uncapped(&mut self, session: SessionId, dir: InodeId, now: Instant) -> bool {
        let Some(entry) = self.dirs.get_mut(&dir) else { return false };
        entry.used_by(session, now);
        if entry.contended(now) {
            return true;
        }
        self.dirs.remove(&dir);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: SessionId = SessionId(1);
    const B: SessionId = SessionId(2);
    const D: InodeId = InodeId(10);

    fn count(dirs: &ContendedDirs, now: Instant) -> usize {
        dirs.dirs.values().filter(|entry| entry.contended(now)).count()
    }

    #[test]
    fn a_change_that_finds_other_holders_makes_the_directory_contended_while_both_use_it() {
        let mut dirs = ContendedDirs::default();
        let t0 = Instant::now();
        // A change with nobody else holding the directory leaves it alone.
        dirs.changed(A, D, &[], t0);
        assert!(!dirs.uncapped(B, D, t0));
        // One that recalls B makes it contended: B's next lookups are answered uncapped.
        dirs.changed(A, D, &[B], t0);
        assert!(dirs.uncapped(B, D, t0 + Duration::from_millis(10)));
        assert!(dirs.uncapped(A, D, t0 + Duration::from_millis(20)));
        assert_eq!(count(&dirs, t0 + Duration::from_millis(20)), 1);
        // It stays contended while A keeps changing it and B keeps looking.
        let mut now = t0;
        for _ in 0..10 {
            now += CONTENDED_FOR / 2;
            dirs.changed(A, D, &[], now);
            assert!(dirs.uncapped(B, D, now));
        }
    }

    #[test]
    fn a_contended_directory_is_capped_again_once_changes_or_other_users_stop() {
        let mut dirs = ContendedDirs::default();
        let t0 = Instant::now();
        // No change for CONTENDED_FOR: both readers get caps again.
        dirs.changed(A, D, &[B], t0);
        assert!(dirs.uncapped(B, D, t0 + CONTENDED_FOR / 2));
        assert!(!dirs.uncapped(B, D, t0 + CONTENDED_FOR));
        assert_eq!(count(&dirs, t0 + CONTENDED_FOR), 0);
        // The other session gone for CONTENDED_FOR: the one still changing it may take it.
        dirs.changed(A, D, &[B], t0);
        dirs.changed(A, D, &[], t0 + CONTENDED_FOR / 2);
        dirs.changed(A, D, &[], t0 + CONTENDED_FOR * 3 / 2);
        assert!(!dirs.uncapped(A, D, t0 + CONTENDED_FOR * 3 / 2));
        // A session coming back then is granted a cap, which the next change recalls,
        // and the directory is contended again.
        assert!(!dirs.uncapped(B, D, t0 + CONTENDED_FOR * 2));
        dirs.changed(A, D, &[B], t0 + CONTENDED_FOR * 2);
        assert!(dirs.uncapped(B, D, t0 + CONTENDED_FOR * 2));
    }

    #[test]
    fn directories_not_changed_lately_are_forgotten_when_another_becomes_contended() {
        let mut dirs = ContendedDirs::default();
        let t0 = Instant::now();
        for i in 0..100 {
            dirs.changed(A, InodeId(100 + i), &[B], t0);
        }
        dirs.changed(A, D, &[B], t0 + CONTENDED_FOR);
        assert_eq!(dirs.dirs.len(), 1);
        assert_eq!(count(&dirs, t0 + CONTENDED_FOR), 1);
    }
}
