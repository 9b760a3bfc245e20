//! Requests that wait long. A kernel request that has to wait in its first poll
//! (`fs.rs` `run_here_first`) is counted here until it is answered. A watch logs each
//! one that has waited [`SLOW_AFTER`], again every time its wait doubles, with what
//! the client is still waiting for ([`Client::busy`]), and once more when it is
//! answered: a request that never returns (an application stuck in a system call on
//! the mount) shows in the log with the state that holds it, as Ceph reports its
//! "slow requests". Requests answered in their first poll are never counted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_client::Client;

/// How long a request waits before it is logged. Longer than a meta leader election
/// and a lapsed client's lease (both a few seconds), which a request may rightly wait
/// out.
const SLOW_AFTER: Duration = Duration::from_secs(30);
/// How often the watch looks.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// The requests of a mount waiting now.
#[derive(Default)]
pub(crate) struct Waiting {
    next: AtomicU64,
    table: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    op: &'static str,
    since: Instant,
    /// The wait at which it is logged next.
    report_at: Duration,
}

/// One waiting request, counted until it is dropped (answered, or given up).
pub(crate) struct Counted {
    waiting: Arc<Waiting>,
    id: u64,
}

impl Waiting {
    /// Counts a request of operation `op` from now.
    pub fn count(self: &Arc<Self>, op: &'static str) -> Counted {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let entry = Entry { op, since: Instant::now(), report_at: SLOW_AFTER };
        self.table.lock().expect("waiting lock poisoned").insert(id, entry);
        Counted { waiting: self.clone(), id }
    }

    /// How many requests wait now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.lock().expect("waiting lock poisoned").len()
    }

    /// The requests due a report at `now`, each with how long it has waited; each is
    /// due again once its wait has doubled.
    fn due(&self, now: Instant) -> Vec<(&'static str, Duration)> {
        let mut table = self.table.lock().expect("waiting lock poisoned");
        let mut due = Vec::new();
        for entry in table.values_mut() {
            let waited = now.saturating_duration_since(entry.since);
            if waited >= entry.report_at {
                due.push((entry.op, waited));
                while entry.report_at <= waited {
                    entry.report_at *= 2;
                }
            }
        }
        due.sort_unstable_by_key(|&(_, waited)| std::cmp::Reverse(waited));
        due
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let entry = self.waiting.table.lock().expect("waiting lock poisoned").remove(&self.id);
        if let Some(entry) = entry.filter(|e| e.report_at > SLOW_AFTER) {
            let waited = entry.since.elapsed().as_secs_f64();
            tracing::warn!("a slow {} request was answered after {waited:.1} s", entry.op);
        }
    }
}

/// Logs the requests of `waiting` that wait long, with what `client` waits for, until
/// the task is aborted (at unmount).
pub(crate) async fn watch(waiting: Arc<Waiting>, client: Client) {
    let mut tick = tokio::time::interval(WATCH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let due = waiting.due(Instant::now());
        if due.is_empty() {
            continue;
        }
        for (op, waited) in &due {
            tracing::warn!("a {op} request has waited {} s for its answer", waited.as_secs());
        }
        tracing::warn!("the client is waiting for: {}", client.busy());
    }
}

/// The operation a request handler's closure was made in, from the closure's type
/// name: `stoa_fuse::fs::<impl ...>::write::{{closure}}` is a `write`.
pub(crate) fn op_name(closure: &'static str) -> &'static str {
    let mut name = closure;
    while let Some(outer) = name.strip_suffix("::{{closure}}") {
        name = outer;
    }
    name.rsplit("::").next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(due: Vec<(&'static str, Duration)>) -> Vec<&'static str> {
        due.into_iter().map(|d| d.0).collect()
    }

    #[test]
    fn a_request_is_reported_at_the_limit_and_again_each_time_its_wait_doubles() {
        let waiting = Arc::new(Waiting::default());
        let write = waiting.count("write");
        let lookup = waiting.count("lookup");
        let t0 = Instant::now();
        let at = |secs| t0 + Duration::from_secs(secs);
        {
            let mut table = waiting.table.lock().unwrap();
            table.get_mut(&write.id).unwrap().since = t0;
            table.get_mut(&lookup.id).unwrap().since = at(1);
        }
        assert!(waiting.due(at(15)).is_empty());
        assert_eq!(ops(waiting.due(at(30))), ["write"]);
        assert_eq!(ops(waiting.due(at(31))), ["lookup"]);
        assert!(waiting.due(at(45)).is_empty(), "reported again before its wait doubled");
        assert_eq!(ops(waiting.due(at(61))), ["write", "lookup"]);
        // Answered: gone from the table.
        drop(write);
        assert_eq!(ops(waiting.due(at(200))), ["lookup"]);
        assert!(waiting.due(at(210)).is_empty());
    }

    #[test]
    fn the_operation_is_the_handler_the_closure_was_made_in() {
        let name = "stoa_fuse::fs::<impl fuser::Filesystem for stoa_fuse::fs::StoaFs>::write::\
                    {{closure}}";
        assert_eq!(op_name(name), "write");
        assert_eq!(op_name("a::b::lookup::{{closure}}::{{closure}}"), "lookup");
        assert_eq!(op_name("read"), "read");
    }
}
