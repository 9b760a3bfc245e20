//! The scrubber: a background task that reads every chunk this server holds, at a set
//! pace, and checks every block against its CRC32C. A damaged replica is reported to meta
//! and replaced by a good member's copy of it, so that silent disk corruption is found
//! before a second failure could make it the only copy.
//!
//! ```text
//!  loop: list chunks --> from a random one on, per chunk: verify (paced to scrub_bytes_per_sec)
//!        Checksum --> ReportCorrupt to meta --> lock chunk --> FetchChunk (a member)
//!                 --> install over ours (forced) --> corrupt_repaired += 1
//! ```
//!
//! After each pass the scrubber also sweeps garbage: a chunk whose chain is whole (has
//! the cluster's replica count of servers on its write path) without this server was
//! rebuilt elsewhere while we were away, and nothing will ever bring us back into that
//! chain except as a syncing server, whose resync copies what it needs anyway. Such a
//! chunk is dropped when two passes in a row saw it so, which rides out a table that
//! changes in between.
//!
//! Readers never see the damage: every read checks the CRCs of the blocks it returns and
//! answers `Checksum`, and the client then reads another replica.
//!
//! The repair holds the chunk's ordering lock, as a resync does: no write to the chunk is
//! in flight through this server meanwhile, and a member earlier on the write path is at
//! least as new as we are, so installing its copy loses nothing.

use super::Server;
use bytes::Bytes;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use stoa_proto::{ChunkListing, ChunkOp, ChunkResponse};
use stoa_types::{ChunkId, FsError};
use tokio::time::Instant;

/// Pause between two passes, so that a store with few chunks is not read in a loop.
const PASS_PAUSE: Duration = Duration::from_secs(1);
/// What one chunk costs of the scrubber's byte budget at least: about what a disk reads
/// sequentially in the time of the seeks a chunk takes (a listing entry, two opens, a
/// header read), so that a store of many small chunks is paced by its seeks, not only
/// its bytes. Counted as one 4 KiB block each, 3,000 chunks of 4 KiB were checked 2,000
/// times a second per server and kept three idle chunk servers at 16 % of this 2-core
/// machine at the default pace.
const CHUNK_COST_MIN: u64 = 1 << 20;
/// How often garbage is swept when the scrubber is off.
const SWEEP_ONLY_PERIOD: Duration = Duration::from_secs(30);

impl Server {
    /// Starts the scrubber; with a rate of 0 it only sweeps garbage.
    pub(crate) fn start_scrubber(self: &Arc<Self>) {
        let server = self.clone();
        self.spawn(server.scrub_loop());
    }

    async fn scrub_loop(self: Arc<Self>) {
        let rate = self.limits.scrub_bytes_per_sec as f64;
        loop {
            if rate == 0.0 {
                tokio::time::sleep(SWEEP_ONLY_PERIOD).await;
                if let Ok(chunks) = self.disk(|e| e.list_sized()).await {
                    self.sweep(chunks.iter().map(|l| l.chunk)).await;
                }
                continue;
            }
            let mut chunks = match self.disk(|e| e.list_sized()).await {
                Ok(chunks) => chunks,
                Err(e) => {
                    tracing::warn!("scrubber: listing the chunk store: {e}");
                    tokio::time::sleep(PASS_PAUSE).await;
                    continue;
                }
            };
            // The servers of a chain hold the same chunks, list them in the same order and
            // start together: from one place, all three read the same chunk at the same
            // moment, pass after pass.
            if !chunks.is_empty() {
                let start = rand::random::<usize>() % chunks.len();
                chunks.rotate_left(start);
            }
            let started = Instant::now();
            let mut paced = 0u64;
            let mut damaged = 0u64;
            for &ChunkListing { chunk, len, .. } in &chunks {
                if !self.scrub_chunk(chunk).await {
                    damaged += 1;
                }
                let len = u64::from(len);
                self.stats.scrubbed_bytes.fetch_add(len, Ordering::Relaxed);
                paced += len.max(CHUNK_COST_MIN);
                tokio::time::sleep_until(started + Duration::from_secs_f64(paced as f64 / rate))
                    .await;
            }
            tracing::debug!(
                "scrubber: checked {} chunks in {:?}, {damaged} damaged",
                chunks.len(),
                started.elapsed()
            );
            self.sweep(chunks.iter().map(|l| l.chunk)).await;
            tokio::time::sleep(PASS_PAUSE).await;
        }
    }

    /// Verifies one chunk and repairs it if it is damaged; says whether it was whole.
    async fn scrub_chunk(self: &Arc<Self>, chunk: ChunkId) -> bool {
        let detail = match self.disk(move |e| e.verify(chunk)).await {
            Ok(()) => return true,
            // Deleted since the listing: nothing to check.
            Err(FsError::NotFound) => return true,
            Err(FsError::Checksum(detail)) => detail,
            Err(e) => {
                tracing::warn!("scrubber: reading chunk {chunk}: {e}");
                return true;
            }
        };
        self.report_corrupt(chunk, detail);
        match self.repair(chunk).await {
            Ok(version) => {
                self.stats.corrupt_repaired.fetch_add(1, Ordering::Relaxed);
                tracing::warn!("scrubber: repaired chunk {chunk} from a peer (version {version})");
            }
            Err(e) => {
                tracing::warn!("scrubber: repairing chunk {chunk}: {e}; the next pass retries")
            }
        }
        false
    }

    /// Replaces our copy of `chunk` with the copy of another active member of its chain;
    /// returns the version installed.
    pub(super) async fn repair(&self, chunk: ChunkId) -> Result<u64, FsError> {
        let table = self.table();
        let chain = table
            .chain_for(chunk)
            .filter(|c| c.write_path().any(|n| n == self.node))
            .cloned()
            .ok_or_else(|| {
                FsError::Unavailable(format!("chunk {chunk} is on a chain without this server"))
            })?;
        let _order = self.order.lock(chunk).await;
        let mut last = FsError::Unavailable(format!("chain {} has no other member", chain.id));
        for &member in chain.members.iter().filter(|m| **m != self.node) {
            let Some(addr) = table.addr(member) else { continue };
            let op = ChunkOp::FetchChunk { chunk };
            match self.call_peer(addr, &chain, op, Bytes::new()).await {
                Ok((ChunkResponse::Chunk { version, writes }, data)) => {
                    self.disk(move |e| e.install(chunk, version, &data, &writes, true)).await?;
                    return Ok(version);
                }
                Ok((other, _)) => {
                    last = FsError::Protocol(format!("FetchChunk answered {other:?}"));
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Drops the chunks that two sweeps in a row found on a whole chain without us.
    async fn sweep(&self, chunks: impl Iterator<Item = ChunkId>) {
        let replicas = self.replicas.load(Ordering::Relaxed) as usize;
        if replicas == 0 || self.check_fence().is_err() {
            return;
        }
        let table = self.table();
        let orphan = |chunk: &ChunkId| {
            table.chain_for(*chunk).is_some_and(|c| {
                !c.write_path().any(|n| n == self.node) && c.write_path().count() >= replicas
            })
        };
        let now: HashSet<ChunkId> = chunks.filter(orphan).collect();
        let before = std::mem::replace(
            &mut *self.orphans.lock().expect("orphan lock poisoned"),
            now.clone(),
        );
        let mut dropped = 0u64;
        for &chunk in now.intersection(&before) {
            let _order = self.order.lock(chunk).await;
            match self.disk(move |e| e.remove(chunk)).await {
                Ok(_) => dropped += 1,
                Err(e) => tracing::warn!("sweeping chunk {chunk}: {e}"),
            }
        }
        if dropped > 0 {
            self.stats.chunks_dropped.fetch_add(dropped, Ordering::Relaxed);
            tracing::info!(
                "chunk server {}: dropped {dropped} chunks of chains rebuilt without it",
                self.node
            );
        }
    }
}
