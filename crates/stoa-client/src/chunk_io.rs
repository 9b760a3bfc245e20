//! Calls to chunk servers, with failover and retries.
//!
//! ```text
//!  write / truncate / sync --> chain head ----------------+
//!  read ---------------------> any member (rotating) -----+--> retry hint or no chain?
//!        on error or checksum: the next member            |    refresh the chain table,
//!                                                         |    back off, try again
//!                                                         +--> after ~30 s: EIO
//! ```
//!
//! Writes carry no version: the head assigns it. Each write or truncate carries a write
//! id (this session, a number never used before), the same on every attempt, so a
//! retry after a lost reply is recognised by the chain and never applied twice, which
//! matters when another client wrote the same bytes in between.

use crate::chains::ChainCache;
use crate::session::Session;
use bytes::Bytes;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoa_net::Pool;
use stoa_proto::{ChunkOp, ChunkRequest, ChunkResponse, Request, Response};
use stoa_types::{Chain, ChainTable, ChunkId, FsError, InodeId, NodeId, WriteId};

/// How long a chunk call keeps retrying before the application sees EIO.
const DEADLINE: Duration = Duration::from_secs(30);
/// How long one attempt at one server may take (a whole chunk through a whole chain).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a call still waiting on a server checks that its chain did not change: meta
/// takes a paused or cut-off member out of its chains within about 1.5 s, and the call
/// then goes to the new chain instead of waiting out [`CALL_TIMEOUT`]. Calls waiting at
/// once share one fetch of the table per period, so a client asks meta at most four
/// times a second, and only while some call is slow. (Once a second, with the fetch
/// shared, a read stuck on a paused replica could miss the change twice: 3.1 s stalls in
/// `stoa-fault --seed 15 --scenario chunk-pause`.)
const CHAIN_CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long a mutation refused by a full chain head waits for meta to take that server
/// out of the chain (it reports itself full) before the application sees ENOSPC: with
/// room on other servers the write goes on, and ENOSPC means the cluster has none.
const FULL_HEAD_WAIT: Duration = Duration::from_secs(3);
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The fence of a client write, asked again before every attempt: the Unix time in ms
/// after which the chain head must refuse it, or `SessionExpired` when the caps it was
/// buffered under lapsed (then it is not sent at all: meta may have given them to
/// another client, whose newer data it would overwrite). 0: no fence.
pub(crate) type Deadline<'a> = &'a (dyn Fn() -> Result<u64, FsError> + Sync);

pub(crate) struct ChunkIo {
    pool: Pool,
    session: Arc<Session>,
    chains: ChainCache,
    /// The last write id number handed out in this process (see [`WriteId`]).
    writes: AtomicU64,
}

impl ChunkIo {
    pub fn new(pool: Pool, session: Arc<Session>, chains: ChainCache) -> ChunkIo {
        ChunkIo { pool, session, chains, writes: AtomicU64::new(0) }
    }

    /// A new write id: every attempt of one mutation carries the same one.
    fn write_id(&self) -> WriteId {
        let seq = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        WriteId { session: self.session.id(), seq }
    }

    /// Writes `data`, the bytes of `ranges` (`(offset, len)` in the chunk) back to back,
    /// to `chunk` through its whole chain, as one new version of the chunk. `deadline`
    /// gives each attempt its fence (see [`Deadline`]). A `durable` write is also a
    /// [`ChunkIo::sync`] of the chunk, of every version up to its own.
    pub async fn write(
        &self,
        chunk: ChunkId,
        mut ranges: Vec<(u32, u32)>,
        data: Bytes,
        durable: bool,
        deadline: Deadline<'_>,
    ) -> Result<(), FsError> {
        let id = Some(self.write_id());
        let op = match ranges.len() {
            1 => {
                let offset = ranges.pop().expect("one range").0;
                ChunkOp::Write { chunk, offset, version: None, id, durable }
            }
            _ => ChunkOp::WriteRanges { chunk, ranges, version: None, id, durable },
        };
        self.to_head("write", chunk, op, data, deadline).await.map(|_| ())
    }

    /// Cuts `chunk` to `len` bytes (0 removes it). A chunk that was never written is
    /// already as short as asked.
    pub async fn truncate(
        &self,
        chunk: ChunkId,
        len: u32,
        deadline: Deadline<'_>,
    ) -> Result<(), FsError> {
        let op = ChunkOp::Truncate { chunk, len, version: None, id: Some(self.write_id()) };
        match self.to_head("truncate", chunk, op, Bytes::new(), deadline).await {
            Ok(_) | Err(FsError::NotFound) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The indexes of file `ino`'s chunks that a cut from chunk index `from` must
    /// truncate, for a file whose size spans indexes up to `to` (exclusive): all of them
    /// for a few, else those the chunk servers hold ([`stoa_net::chunks_to_cut`]).
    pub async fn chunks_to_cut(
        &self,
        ino: InodeId,
        from: u64,
        to: u64,
    ) -> Result<Vec<u64>, FsError> {
        let chunk = ChunkId { ino, index: from };
        self.retrying("chunk listing", chunk, |table| async move {
            stoa_net::chunks_to_cut(&self.pool, &table, ino, from, to, CALL_TIMEOUT).await
        })
        .await
    }

    /// Makes earlier writes to `chunks` durable on every replica: one Sync per chain, to
    /// its head, which passes it down the chain.
    pub async fn sync(&self, chunks: &[ChunkId]) -> Result<(), FsError> {
        let table = self.chains.current();
        let mut by_chain: std::collections::BTreeMap<u32, Vec<ChunkId>> = Default::default();
        for &chunk in chunks {
            let chain = table.chain_for(chunk).map_or(u32::MAX, |c| c.id.0);
            by_chain.entry(chain).or_default().push(chunk);
        }
        for group in by_chain.into_values() {
            let op = ChunkOp::Sync { chunks: group.clone() };
            self.to_head("sync", group[0], op, Bytes::new(), &|| Ok(0)).await?;
        }
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` of `chunk`. The answer is shorter where the
    /// chunk ends first; a chunk never written reads as empty.
    pub async fn read(&self, chunk: ChunkId, offset: u32, len: u32) -> Result<Bytes, FsError> {
        let op = ChunkOp::Read { chunk, offset, len };
        self.retrying("read", chunk, |table| self.read_any(table, chunk, offset, op.clone())).await
    }

    async fn read_any(
        &self,
        table: Arc<ChainTable>,
        chunk: ChunkId,
        offset: u32,
        op: ChunkOp,
    ) -> Result<Bytes, FsError> {
        let chain = chain_of(&table, chunk)?;
        let members = &chain.members;
        if members.is_empty() {
            return Err(FsError::Unavailable(format!("chain {} has no members", chain.id)));
        }
        let start = first_replica(chunk, offset, members);
        let mut worst: Option<FsError> = None;
        for i in 0..members.len() {
            let node = members[(start + i) % members.len()];
            match self.call(&table, chain, node, op.clone(), Bytes::new(), 0).await {
                Ok((ChunkResponse::Data, payload)) => return Ok(payload),
                Ok((other, _)) => {
                    worst = Some(FsError::Protocol(format!("read answered {other:?}")));
                }
                Err(FsError::NotFound) => return Ok(Bytes::new()),
                Err(e) => {
                    tracing::debug!("read of {chunk} from {node} failed: {e}; trying another");
                    // Keep a retry hint over a final error, so the caller retries.
                    if worst.as_ref().is_none_or(|w| !is_transient(w)) {
                        worst = Some(e);
                    }
                }
            }
        }
        Err(worst.unwrap_or_else(|| FsError::Unavailable("no replica answered".into())))
    }

    async fn to_head(
        &self,
        what: &str,
        chunk: ChunkId,
        op: ChunkOp,
        payload: Bytes,
        deadline: Deadline<'_>,
    ) -> Result<ChunkResponse, FsError> {
        self.retrying(what, chunk, |table| {
            let (op, payload) = (op.clone(), payload.clone());
            async move {
                let deadline_ms = deadline()?;
                let chain = chain_of(&table, chunk)?;
                let head = *chain.members.first().ok_or_else(|| {
                    FsError::Unavailable(format!("chain {} has no members", chain.id))
                })?;
                self.call(&table, chain, head, op, payload, deadline_ms).await.map(|(resp, _)| resp)
            }
        })
        .await
    }

    /// One attempt at one server; `deadline_ms` as in [`ChunkRequest`] (0 for reads).
    async fn call(
        &self,
        table: &ChainTable,
        chain: &Chain,
        node: stoa_types::NodeId,
        op: ChunkOp,
        payload: Bytes,
        deadline_ms: u64,
    ) -> Result<(ChunkResponse, Bytes), FsError> {
        let addr = table
            .addr(node)
            .ok_or_else(|| FsError::Unavailable(format!("chunk server {node} has no address")))?;
        let (chain, chain_version) = (chain.id, chain.version);
        let req = Request::Chunk(ChunkRequest { chain, chain_version, op, deadline_ms });
        match self.pool.call(addr, &req, payload, CALL_TIMEOUT).await? {
            (Response::Chunk(resp), payload) => Ok((resp, payload)),
            (other, _) => Err(FsError::Protocol(format!("chunk server {addr} answered {other:?}"))),
        }
    }

    /// Runs `attempt` against the current chain table until it succeeds, fails for good,
    /// or the deadline passes; between attempts the table is refreshed from meta.
    async fn retrying<T, F, Fut>(
        &self,
        what: &str,
        chunk: ChunkId,
        attempt: F,
    ) -> Result<T, FsError>
    where
        F: Fn(Arc<ChainTable>) -> Fut,
        Fut: Future<Output = Result<T, FsError>>,
    {
        let started = Instant::now();
        let mut backoff = BACKOFF_FIRST;
        loop {
            let table = self.chains.current();
            let result = tokio::select! {
                result = attempt(table.clone()) => result,
                moved = self.chain_moved(&table, chunk) => Err(moved),
            };
            let err = match result {
                Ok(v) => return Ok(v),
                Err(e) if is_transient(&e) => e,
                Err(FsError::NoSpace) => {
                    let moved = self.chain_moved(&table, chunk);
                    match tokio::time::timeout(FULL_HEAD_WAIT, moved).await {
                        Ok(moved) => moved,
                        Err(_) => return Err(FsError::NoSpace),
                    }
                }
                Err(e) => return Err(e),
            };
            if started.elapsed() + backoff > DEADLINE {
                tracing::warn!("{what} of {chunk} gave up after {:?}: {err}", started.elapsed());
                return Err(FsError::Io(format!("{what} of chunk {chunk}: {err}")));
            }
            tracing::debug!("{what} of {chunk} failed ({err}); refreshing chains and retrying");
            if let Err(e) = self.chains.refresh(&self.session, table.version).await {
                tracing::debug!("refreshing the chain table failed: {e}");
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// Returns once the chain of `chunk` in meta's table differs from its chain in
    /// `table` (checked every [`CHAIN_CHECK_EVERY`]); never while it stays the same.
    async fn chain_moved(&self, table: &ChainTable, chunk: ChunkId) -> FsError {
        let key = |t: &ChainTable| t.chain_for(chunk).map(|c| (c.id, c.version));
        let before = key(table);
        loop {
            tokio::time::sleep(CHAIN_CHECK_EVERY).await;
            if let Err(e) = self.chains.refresh_older(&self.session, CHAIN_CHECK_EVERY).await {
                tracing::debug!("refreshing the chain table failed: {e}");
            }
            if key(&self.chains.current()) != before {
                return FsError::Unavailable(format!(
                    "the chain of {chunk} changed during the call"
                ));
            }
        }
    }
}

fn chain_of(table: &ChainTable, chunk: ChunkId) -> Result<&Chain, FsError> {
    table
        .chain_for(chunk)
        .ok_or_else(|| FsError::Unavailable("no chains yet: no chunk servers registered".into()))
}

/// Which member of a chain a read of `chunk` at `offset` tries first: the same server
/// for every read of a region, whatever chain the chunk is on, and regions spread over
/// the servers (rendezvous hashing: the member that scores highest for the region). A
/// region is 1 MiB of a chunk, so a large read still draws on every replica, and each
/// server's page cache holds its share of a file rather than all of it; the first
/// chunks of 64 consecutive inodes are one region, so one server sees a scan of small
/// files in inode order and reads ahead of it (stoa-chunk server/prefetch.rs).
fn first_replica(chunk: ChunkId, offset: u32, members: &[NodeId]) -> usize {
    let region = (chunk.ino.0 / 64)
        .wrapping_add(chunk.index.wrapping_mul(7))
        .wrapping_add(u64::from(offset >> 20));
    // splitmix64's finaliser over region and node: every bit of both moves the score.
    let score = |node: &NodeId| {
        let mut x = region.wrapping_add(node.0.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    };
    (0..members.len()).max_by_key(|&i| score(&members[i])).unwrap_or(0)
}

/// Errors worth another attempt: retry hints, and a checksum mismatch on every replica
/// tried (a repair may fix it).
fn is_transient(e: &FsError) -> bool {
    e.is_retryable() || matches!(e, FsError::Checksum(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_types::InodeId;

    fn chunk(ino: u64, index: u64) -> ChunkId {
        ChunkId { ino: InodeId(ino), index }
    }

    #[test]
    fn a_region_is_read_from_one_server_whatever_its_chain_and_regions_spread() {
        let orders = [[1, 2, 3], [2, 3, 1], [3, 1, 2], [3, 2, 1]].map(|o| o.map(NodeId));
        let first = |c: ChunkId, offset: u32, members: &[NodeId]| {
            members[first_replica(c, offset, members)]
        };
        let mut counts = [0usize; 4];
        for ino in 0..6_400u64 {
            let node = first(chunk(ino, 0), 0, &orders[0]);
            // Every order of the same servers, and the rest of the first MiB, agree.
            for members in &orders {
                assert_eq!(first(chunk(ino, 0), 4096, members), node);
            }
            // So do the 64 inodes of a run.
            assert_eq!(first(chunk(ino / 64 * 64, 0), 0, &orders[0]), node);
            counts[node.0 as usize] += 1;
        }
        // 100 runs over three servers: each gets a fair share.
        assert!(counts[1..].iter().all(|&n| (1_280..=3_000).contains(&n)), "{counts:?}");
        // The MiBs of a large chunk spread too.
        let nodes: std::collections::HashSet<NodeId> =
            (0..4u32).map(|mib| first(chunk(7, 3), mib << 20, &orders[1])).collect();
        assert!(nodes.len() >= 2, "{nodes:?}");
        // A member that is not among the others still gets chosen for some regions.
        let four = [1, 2, 3, 4].map(NodeId);
        assert!((0..640u64).any(|ino| first(chunk(ino, 0), 0, &four) == NodeId(4)));
    }
}
