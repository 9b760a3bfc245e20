//! Chunk-server liveness: soft state on the leader, rebuilt from heartbeats after every
//! election. It is never replicated; only its verdicts are (as `ChunkServerDown` and
//! `ChunkServerUp` commands).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use stoa_proto::RepairProgress;
use stoa_types::NodeId;

/// A chunk server silent this long is taken out of its chains. With the judge running
/// every 250 ms, a dead server leaves its chains within 1.75 s (plus one Raft commit).
/// Chunk servers fence themselves after the same time (`FENCE_AFTER` in stoa-chunk),
/// counted from an earlier instant, so they stop serving before meta moves on.
pub(crate) const DOWN_AFTER: Duration = Duration::from_millis(1500);

/// A server reported full is taken back once its free space grew by this share of its
/// capacity above the least it had since the report (files deleted, or an operator made
/// room).
const FULL_UNTIL_FREED_DIVISOR: u64 = 16;

/// What the last heartbeat of one chunk server said.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Beat {
    pub at: Instant,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub repair: RepairProgress,
    /// Bytes per second copied into the server, between its last two heartbeats.
    pub copy_rate_bytes_per_sec: u64,
}

#[derive(Debug)]
struct State {
    /// When this replica started judging (its last election win): a server is given
    /// one full timeout from then, so a failover does not evict healthy servers.
    since: Instant,
    beats: HashMap<NodeId, Beat>,
    /// Servers that refused a chain's write for lack of space, with the least free bytes
    /// a heartbeat showed since (the last one before the report, at first).
    full: HashMap<NodeId, u64>,
}

/// Heartbeats received by this replica while it leads.
#[derive(Debug)]
pub(crate) struct Liveness {
    state: Mutex<State>,
}

impl Default for Liveness {
    fn default() -> Liveness {
        let state = State { since: Instant::now(), beats: HashMap::new(), full: HashMap::new() };
        Liveness { state: Mutex::new(state) }
    }
}

impl Liveness {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().expect("liveness lock poisoned")
    }

    /// Forgets everything: called when this replica becomes leader, because heartbeats
    /// seen in an earlier term say nothing about now.
    pub fn restart(&self) {
        let mut s = self.lock();
        s.since = Instant::now();
        s.beats.clear();
        s.full.clear();
    }

    pub fn beat(&self, node: NodeId, capacity_bytes: u64, used_bytes: u64, repair: RepairProgress) {
        let at = Instant::now();
        let mut s = self.lock();
        let copy_rate_bytes_per_sec = match s.beats.get(&node) {
            Some(prev) if at > prev.at => {
                let copied = repair.copied_bytes.saturating_sub(prev.repair.copied_bytes);
                (copied as f64 / (at - prev.at).as_secs_f64()) as u64
            }
            _ => 0,
        };
        let beat = Beat { at, capacity_bytes, used_bytes, repair, copy_rate_bytes_per_sec };
        s.beats.insert(node, beat);
        let free = capacity_bytes.saturating_sub(used_bytes);
        let Some(least) = s.full.get_mut(&node) else { return };
        // The free space recorded with the report came from the heartbeat before it,
        // which may predate the disk filling up (a heartbeat every 300 ms, a disk can
        // fill faster): measured from there, the space that is free again after the
        // fill would never count as freed, and the server would stay out for good.
        *least = (*least).min(free);
        if free > least.saturating_add(capacity_bytes / FULL_UNTIL_FREED_DIVISOR) {
            tracing::info!("chunk server {node} has space again: it may rejoin its chains");
            s.full.remove(&node);
        }
    }

    /// Records that `node` refused a write for lack of space; says whether it was news.
    pub fn mark_full(&self, node: NodeId) -> bool {
        let mut s = self.lock();
        let free = s.beats.get(&node).map_or(0, |b| b.capacity_bytes.saturating_sub(b.used_bytes));
        s.full.insert(node, free).is_none()
    }

    /// Whether `node` is out of space: it must leave its chains and not rejoin them.
    pub fn is_full(&self, node: NodeId) -> bool {
        self.lock().full.contains_key(&node)
    }

    /// Whether `node` heartbeated within `limit` (counting from when judging started).
    pub fn is_alive(&self, node: NodeId, limit: Duration) -> bool {
        let s = self.lock();
        let last = s.beats.get(&node).map_or(s.since, |b| b.at.max(s.since));
        last.elapsed() < limit
    }

    /// The last heartbeat of `node`, if it sent one since judging started.
    pub fn last(&self, node: NodeId) -> Option<Beat> {
        self.lock().beats.get(&node).copied()
    }

    /// Every server that heartbeated within `limit`.
    pub fn alive(&self, limit: Duration) -> Vec<(NodeId, Beat)> {
        let s = self.lock();
        let mut out: Vec<_> =
            s.beats.iter().filter(|(_, b)| b.at.elapsed() < limit).map(|(n, b)| (*n, *b)).collect();
        out.sort_by_key(|(n, _)| *n);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_leader_gives_silent_servers_one_full_timeout() {
        let live = Liveness::default();
        live.restart();
        assert!(live.is_alive(NodeId(5), Duration::from_millis(200)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!live.is_alive(NodeId(5), Duration::from_millis(20)));
        live.beat(NodeId(5), 100, 10, RepairProgress::default());
        assert!(live.is_alive(NodeId(5), Duration::from_millis(20)));
        assert_eq!(live.alive(Duration::from_secs(1)).len(), 1);
        live.restart();
        assert!(live.last(NodeId(5)).is_none());
    }

    #[test]
    fn a_full_server_stays_full_until_its_heartbeats_show_space_freed() {
        let live = Liveness::default();
        live.beat(NodeId(3), 1600, 1590, RepairProgress::default());
        assert!(live.mark_full(NodeId(3)));
        assert!(!live.mark_full(NodeId(3)), "already known");
        // A little space (less than a sixteenth of the disk) is not enough.
        live.beat(NodeId(3), 1600, 1550, RepairProgress::default());
        assert!(live.is_full(NodeId(3)));
        live.beat(NodeId(3), 1600, 1400, RepairProgress::default());
        assert!(!live.is_full(NodeId(3)));
    }

    #[test]
    fn a_server_that_filled_up_between_two_heartbeats_rejoins_once_space_is_freed() {
        let live = Liveness::default();
        // Its last heartbeat before the report still showed most of the disk free.
        live.beat(NodeId(3), 1600, 100, RepairProgress::default());
        assert!(live.mark_full(NodeId(3)));
        live.beat(NodeId(3), 1600, 1595, RepairProgress::default());
        assert!(live.is_full(NodeId(3)));
        // The big file is deleted: free space is back to where it was before the report.
        live.beat(NodeId(3), 1600, 100, RepairProgress::default());
        assert!(!live.is_full(NodeId(3)));
    }
}
