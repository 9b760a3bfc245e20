//! Work only the leader does, started when this replica wins an election and stopped
//! when it loses leadership:
//!
//! - create the cluster (`Init`) the first time a leader finds none;
//! - judge chunk-server liveness and propose `ChunkServerDown` / `ChunkServerUp` (a
//!   server that reported itself full is taken out when it reports, and is not added
//!   back until it has space again), and
//!   `RebuildChain` for chains short of replicas for longer than the rebuild delay;
//! - delete the chunks of garbage inodes and then propose `GarbageCollectedMany`;
//! - purge strays whose grace is over (`PurgeStrays`);
//! - expire client sessions that stopped renewing (`ExpireSession`).

use crate::caps;
use crate::liveness::DOWN_AFTER;
use crate::raft::Role;
use crate::service::Node;
use bytes::Bytes;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoa_meta::Command;
use stoa_net::chunks_to_cut;
use stoa_proto::{ChunkOp, ChunkRequest, Request};
use stoa_types::{
    Chain, ChainId, ChainTable, ChunkId, ClusterId, FsError, InodeId, NodeId, Timestamp,
};
use tokio::task::JoinSet;

const LIVENESS_PERIOD: Duration = Duration::from_millis(250);
const GC_PERIOD: Duration = Duration::from_millis(500);
/// Garbage inodes handled per round, all committed in one log entry: after a large
/// `rm -rf`, one entry per inode was a log commit per file, which ran for seconds after
/// the removal had returned and slowed the reads and writes meanwhile.
const GC_BATCH: usize = 1000;
/// How long a stray is kept after its unlink (stoa-meta `ops/unlink.rs`): far longer
/// than a kernel takes from resolving a name to opening the inode.
const STRAY_GRACE: Duration = Duration::from_secs(2);
/// Rows of the strays table looked at per round.
const STRAY_BATCH: usize = 1000;
/// Chunk deletions in flight at once, over all the inodes of a round.
const GC_PARALLEL: usize = 16;
const CHUNK_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Follows the Raft role and runs the leader's tasks while this replica leads. Returns
/// when Raft stops.
pub(crate) async fn follow_leadership(node: Arc<Node>) {
    let mut watch = node.raft.subscribe();
    // Dropping a JoinSet aborts its tasks, so losing leadership stops them at once.
    let mut running: Option<(u64, JoinSet<()>)> = None;
    loop {
        let view = node.raft.view();
        let leading = view.role == Role::Leader;
        let current_term = running.as_ref().map(|(term, _)| *term);
        if leading && current_term != Some(view.term) {
            tracing::info!("replica {} leads in term {}", node.id(), view.term);
            node.liveness.restart();
            node.leases.restart();
            node.caps.restart(view.term);
            let mut tasks = JoinSet::new();
            tasks.spawn(create_cluster(node.clone()));
            tasks.spawn(judge_liveness(node.clone()));
            tasks.spawn(collect_garbage(node.clone()));
            tasks.spawn(purge_strays(node.clone()));
            tasks.spawn(expire_sessions(node.clone()));
            running = Some((view.term, tasks));
        } else if !leading && running.is_some() {
            tracing::info!("replica {} no longer leads", node.id());
            running = None;
        }
        if !watch.changed().await {
            return;
        }
    }
}

/// Proposes `Init` with a fresh cluster id if the state machine has none yet.
async fn create_cluster(node: Arc<Node>) {
    loop {
        match try_create_cluster(&node).await {
            Ok(()) => return,
            Err(e) => tracing::warn!("creating the cluster: {e}; retrying"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn try_create_cluster(node: &Node) -> Result<(), FsError> {
    // Wait until everything committed before this term is applied, so that an Init
    // from an earlier leader is seen.
    node.raft.linearize().await?;
    if node.raft.read(stoa_meta::cluster_info).await?.is_some() {
        return Ok(());
    }
    let cluster = ClusterId(rand::random::<u128>());
    let cmd = Command::Init {
        cluster,
        chunk_size_bytes: node.cfg.chunk_size_bytes,
        replicas: node.cfg.replicas,
        now: Timestamp::now(),
    };
    node.raft.propose(cmd).await?;
    tracing::info!("created cluster {cluster}");
    Ok(())
}

/// What the liveness judge last proposed, so that it does not repeat itself while the
/// chain table has not changed.
type Proposed = HashSet<(NodeId, u64, bool)>;

/// The judge's memory between rounds: soft state, restarted with each term.
#[derive(Default)]
struct Judge {
    proposed: Proposed,
    /// When each chain that is short of replicas was first seen short.
    short_since: HashMap<ChainId, Instant>,
    /// Rebuilds proposed at a table version, not repeated until the table changes.
    rebuilding: HashSet<(ChainId, u64)>,
}

async fn judge_liveness(node: Arc<Node>) {
    // Give every server one full timeout to find this new leader.
    tokio::time::sleep(DOWN_AFTER).await;
    let mut judge = Judge::default();
    let mut ticker = tokio::time::interval(LIVENESS_PERIOD);
    loop {
        ticker.tick().await;
        if let Err(e) = judge_once(&node, &mut judge).await {
            tracing::debug!("liveness round failed: {e}");
        }
    }
}

async fn judge_once(node: &Node, judge: &mut Judge) -> Result<(), FsError> {
    let (table, info) = node
        .raft
        .read(|kv| Ok((stoa_meta::chain_table(kv)?, stoa_meta::cluster_info(kv)?)))
        .await?;
    let Some(info) = info else { return Ok(()) };
    let proposed = &mut judge.proposed;
    proposed.retain(|(_, version, _)| *version == table.version);
    let in_path: BTreeSet<NodeId> = table.chains.iter().flat_map(|c| c.write_path()).collect();
    for &server in &in_path {
        let key = (server, table.version, false);
        // A full server is taken out when it reports itself full, with the new table in
        // the answer (`Node::meta`, `ChunkServerFull`); taken out here, it could serve
        // reads from its old table after writes went on without it.
        let silent = !node.liveness.is_alive(server, DOWN_AFTER);
        if silent && !proposed.contains(&key) {
            tracing::warn!(
                "chunk server {server} silent for {DOWN_AFTER:?}: taking it out of its chains"
            );
            node.raft.propose(Command::ChunkServerDown { node: server }).await?;
            proposed.insert(key);
        }
    }
    let short = table.chains.iter().any(|c| c.write_path().count() < usize::from(info.replicas));
    if !short {
        judge.short_since.clear();
        return Ok(());
    }
    for (server, _) in node.liveness.alive(DOWN_AFTER) {
        let key = (server, table.version, true);
        let known = table.nodes.iter().any(|n| n.id == server);
        let eligible = known && !node.liveness.is_full(server);
        if eligible && !in_path.contains(&server) && !proposed.contains(&key) {
            tracing::info!("chunk server {server} is back: adding it to short chains");
            node.raft.propose(Command::ChunkServerUp { node: server }).await?;
            proposed.insert(key);
        }
    }
    rebuild_short_chains(node, judge, &table, usize::from(info.replicas)).await
}

/// Rebuilds, on another live server, the missing replica of every chain that has been
/// short for longer than the rebuild delay. The server chosen is the live one in the
/// fewest chains, so that rebuilt replicas spread over the cluster.
async fn rebuild_short_chains(
    node: &Node,
    judge: &mut Judge,
    table: &ChainTable,
    replicas: usize,
) -> Result<(), FsError> {
    let now = Instant::now();
    let short: Vec<&Chain> =
        table.chains.iter().filter(|c| c.write_path().count() < replicas).collect();
    judge.short_since.retain(|id, _| short.iter().any(|c| c.id == *id));
    judge.rebuilding.retain(|(_, version)| *version == table.version);
    let alive: Vec<NodeId> = node
        .liveness
        .alive(DOWN_AFTER)
        .into_iter()
        .map(|(id, _)| id)
        .filter(|id| table.nodes.iter().any(|n| n.id == *id) && !node.liveness.is_full(*id))
        .collect();
    let load = |server: NodeId| {
        table.chains.iter().filter(|c| c.write_path().any(|n| n == server)).count()
    };
    for chain in short {
        let since = *judge.short_since.entry(chain.id).or_insert(now);
        let key = (chain.id, table.version);
        if now.duration_since(since) < node.cfg.rebuild_after || judge.rebuilding.contains(&key) {
            continue;
        }
        let target = alive
            .iter()
            .copied()
            .filter(|id| !chain.write_path().any(|n| n == *id))
            .min_by_key(|id| (load(*id), *id));
        let Some(target) = target else { continue };
        tracing::warn!(
            "chain {} short of replicas for {:?}: rebuilding a replica on chunk server {target}",
            chain.id,
            now.duration_since(since)
        );
        node.raft.propose(Command::RebuildChain { chain: chain.id, node: target }).await?;
        judge.rebuilding.insert(key);
        // One change per round: the next round sees the new table and its loads.
        return Ok(());
    }
    Ok(())
}

/// Ends every session that has not renewed for a whole lease. Sessions are given one
/// full lease from this leader's election, since renewals sent to earlier leaders were
/// not replicated.
/// Runs `round` every `period` while this replica leads; a failed round is logged and
/// the next one tries again.
async fn every<F, Fut>(period: Duration, what: &str, mut round: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), FsError>>,
{
    let mut ticker = tokio::time::interval(period);
    loop {
        ticker.tick().await;
        if let Err(e) = round().await {
            tracing::debug!("{what} round failed: {e}");
        }
    }
}

async fn expire_sessions(node: Arc<Node>) {
    let lease = node.raft.session_lease();
    tokio::time::sleep(lease).await;
    let period = (lease / 8).max(Duration::from_millis(100));
    every(period, "session expiry", || expire_once(&node, lease)).await
}

async fn expire_once(node: &Node, lease: Duration) -> Result<(), FsError> {
    let sessions = node.raft.read(stoa_meta::sessions).await?;
    for &session in &sessions {
        if !node.leases.is_live(session, lease) {
            tracing::info!("session {session} did not renew for {lease:?}: expiring it");
            node.raft.propose(Command::ExpireSession { session }).await?;
            node.caps.drop_session(session);
        }
    }
    node.leases.retain(&sessions);
    Ok(())
}

async fn collect_garbage(node: Arc<Node>) {
    // Where the next round starts: past the last inode of a full round, so that inodes
    // whose chunks cannot be deleted yet (every server of their chain down) never keep
    // the rounds from the garbage behind them.
    let from = AtomicU64::new(0);
    every(GC_PERIOD, "garbage", || async {
        let next = collect_once(&node, InodeId(from.load(Ordering::Relaxed))).await?;
        from.store(next.0, Ordering::Relaxed);
        Ok(())
    })
    .await
}

/// Where the round after one that took `items` from the garbage table starts.
fn next_round_from(items: &[(InodeId, u64)]) -> InodeId {
    match items.last() {
        Some((last, _)) if items.len() >= GC_BATCH => InodeId(last.0 + 1),
        _ => InodeId(0),
    }
}

/// Deletes the chunks of garbage inodes. Every cap on an inode is recalled first, and
/// its holders' acks awaited: a client may read a file under its cap without meta
/// having applied its open yet (queued in its next batch, which the ack waits for), and
/// such a read must never find the chunks gone (caps.md invariant 19). A new leader
/// first waits until the clients told it which caps they hold.
async fn collect_once(node: &Node, from: InodeId) -> Result<InodeId, FsError> {
    let (items, table, info) = node
        .raft
        .read(move |kv| {
            Ok((
                stoa_meta::garbage(kv, from, GC_BATCH)?,
                stoa_meta::chain_table(kv)?,
                stoa_meta::cluster_info(kv)?,
            ))
        })
        .await?;
    let next = next_round_from(&items);
    let Some(info) = info else { return Ok(next) };
    if items.is_empty() {
        return Ok(next);
    }
    let mut inos: Vec<InodeId> = items.iter().map(|(ino, _)| *ino).collect();
    caps::recall_all(node, &inos).await?;
    let failed = delete_chunks(node, &table, &items, info.chunk_size_bytes).await?;
    inos.retain(|ino| !failed.contains(ino));
    if !inos.is_empty() {
        node.raft.propose(Command::GarbageCollectedMany { inos }).await?;
    }
    Ok(next)
}

async fn purge_strays(node: Arc<Node>) {
    every(GC_PERIOD, "stray purge", || purge_strays_once(&node)).await
}

/// Releases strays whose grace is over. Every cap on them is recalled first, and its
/// holders' acks awaited, for the same reason as in [`collect_once`]: an open queued
/// under a cap reaches meta with the holder's next batch, which the ack waits for, so a
/// holder held up past the grace (stopped, slow, cut off for less than its lease) still
/// has its open applied first, and the stray stays as an open orphan.
async fn purge_strays_once(node: &Node) -> Result<(), FsError> {
    let now = Timestamp::now();
    let before = Timestamp { secs: now.secs - STRAY_GRACE.as_secs() as i64, ..now };
    let inos = node.raft.read(move |kv| stoa_meta::strays(kv, before, STRAY_BATCH)).await?;
    if !inos.is_empty() {
        caps::recall_all(node, &inos).await?;
        node.raft.propose(Command::PurgeStrays { inos }).await?;
    }
    Ok(())
}

/// Chunk indexes of a file of `size` bytes.
fn chunk_count(size: u64, chunk_size_bytes: u32) -> u64 {
    size.div_ceil(u64::from(chunk_size_bytes.max(1)))
}

/// Truncates every chunk of each garbage inode (`(ino, size)`) to nothing at the head of
/// its chain, which replicates the deletion down the chain, and returns the inodes some
/// chunk of which is left (they stay garbage for the next round). Of a file much larger
/// than its data, only the chunks the servers hold ([`chunks_to_cut`]): a deleted 1 PiB
/// sparse file kept the chunk servers busy with 268 million truncations. The tombstones
/// this leaves, and chunks beyond `size` (cut off by a truncate before the deletion), go
/// in the chunk servers' dead-inode sweep once the collection has applied (stoa-chunk
/// `server/sweep.rs`).
async fn delete_chunks(
    node: &Node,
    table: &ChainTable,
    items: &[(InodeId, u64)],
    chunk_size_bytes: u32,
) -> Result<BTreeSet<InodeId>, FsError> {
    let mut failed = BTreeSet::new();
    let mut calls = JoinSet::new();
    let mut note = |(ino, result): (InodeId, Result<(), FsError>)| {
        if let Err(e) = result {
            tracing::debug!("deleting the chunks of inode {ino} failed ({e}); will retry");
            failed.insert(ino);
        }
    };
    for &(ino, size) in items {
        let count = chunk_count(size, chunk_size_bytes);
        let indexes =
            match chunks_to_cut(&node.pool, table, ino, 0, count, CHUNK_CALL_TIMEOUT).await {
                Ok(indexes) => indexes,
                Err(e) => {
                    note((ino, Err(e)));
                    continue;
                }
            };
        for index in indexes {
            if calls.len() >= GC_PARALLEL {
                note(calls.join_next().await.expect("set is not empty").map_err(join_err)?);
            }
            let (addr, req) = match truncate_at_head(table, ChunkId { ino, index }) {
                Ok(call) => call,
                Err(e) => {
                    note((ino, Err(e)));
                    break;
                }
            };
            let pool = node.pool.clone();
            calls.spawn(async move {
                let result = match pool.call(addr, &req, Bytes::new(), CHUNK_CALL_TIMEOUT).await {
                    Ok(_) | Err(FsError::NotFound) => Ok(()),
                    Err(e) => Err(e),
                };
                (ino, result)
            });
        }
    }
    while let Some(done) = calls.join_next().await {
        note(done.map_err(join_err)?);
    }
    Ok(failed)
}

/// Where to send the deletion of `chunk`, and the request: a truncation to nothing at
/// the head of its chain.
fn truncate_at_head(
    table: &ChainTable,
    chunk: ChunkId,
) -> Result<(std::net::SocketAddr, Request), FsError> {
    let chain = table
        .chain_for(chunk)
        .ok_or_else(|| FsError::Unavailable("no chains to delete chunks from".into()))?;
    let head = chain
        .members
        .first()
        .copied()
        .ok_or_else(|| FsError::Unavailable(format!("chain {} has no members", chain.id)))?;
    let addr = table
        .addr(head)
        .ok_or_else(|| FsError::Unavailable(format!("chunk server {head} has no address")))?;
    let req = Request::Chunk(ChunkRequest {
        chain: chain.id,
        chain_version: chain.version,
        op: ChunkOp::Truncate { chunk, len: 0, version: None, id: None },
        deadline_ms: 0,
    });
    Ok((addr, req))
}

fn join_err(e: tokio::task::JoinError) -> FsError {
    FsError::Io(format!("chunk deletion task: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_garbage_round_is_followed_by_one_from_past_its_last_inode() {
        let items = |n: u64| (0..n).map(|i| (InodeId(10 + i), 0)).collect::<Vec<_>>();
        assert_eq!(next_round_from(&items(GC_BATCH as u64)), InodeId(10 + GC_BATCH as u64));
        assert_eq!(next_round_from(&items(3)), InodeId(0));
        assert_eq!(next_round_from(&[]), InodeId(0));
    }

    #[test]
    fn a_file_has_one_chunk_per_started_chunk_size() {
        assert_eq!(chunk_count(0, 4096), 0);
        assert_eq!(chunk_count(1, 4096), 1);
        assert_eq!(chunk_count(4096, 4096), 1);
        assert_eq!(chunk_count(4097, 4096), 2);
    }
}
