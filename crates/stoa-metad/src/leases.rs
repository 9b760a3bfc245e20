//! Client session leases: soft state on the leader, like chunk-server liveness. Renewals
//! are never replicated (they would put a log entry per client every few seconds); only
//! the verdict is, as a `Command::ExpireSession`. A new leader knows nothing of past
//! renewals, so it gives every session one full lease from its election: a session
//! survives any number of leader changes as long as its client keeps renewing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stoa_types::SessionId;

#[derive(Debug)]
struct State {
    /// When this replica last started leading.
    since: Instant,
    renewed: HashMap<SessionId, Instant>,
}

/// The last renewal of every session this leader has heard from.
#[derive(Debug)]
pub(crate) struct Leases {
    state: Mutex<State>,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases { state: Mutex::new(State { since: Instant::now(), renewed: HashMap::new() }) }
    }
}

impl Leases {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("leases lock poisoned")
    }

    /// Forgets every renewal: called when this replica becomes leader.
    pub fn restart(&self) {
        let mut s = self.lock();
        s.since = Instant::now();
        s.renewed.clear();
    }

    pub fn renew(&self, session: SessionId) {
        self.lock().renewed.insert(session, Instant::now());
    }

    /// Whether `session` renewed within `lease`, counting from when this leader started.
    pub fn is_live(&self, session: SessionId, lease: Duration) -> bool {
        let s = self.lock();
        let last = s.renewed.get(&session).map_or(s.since, |t| (*t).max(s.since));
        last.elapsed() < lease
    }

    /// Drops what is known of sessions that no longer exist.
    pub fn retain(&self, open: &[SessionId]) {
        self.lock().renewed.retain(|s, _| open.binary_search(s).is_ok());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_leader_gives_every_session_a_full_lease() {
        let leases = Leases::default();
        leases.restart();
        let lease = Duration::from_millis(40);
        assert!(leases.is_live(SessionId(3), lease));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!leases.is_live(SessionId(3), lease));
        leases.renew(SessionId(3));
        assert!(leases.is_live(SessionId(3), lease));
        leases.retain(&[SessionId(4)]);
        assert!(!leases.is_live(SessionId(3), lease));
        // Another election: the clock starts again for everyone.
        leases.restart();
        assert!(leases.is_live(SessionId(3), lease));
    }
}
