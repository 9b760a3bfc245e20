//! The dead-inode sweep: every `sweep_secs`, each chunk server removes every chunk it
//! holds (data, header, tombstone or not) of an inode meta says is dead. It is what
//! finally frees what the garbage collector leaves: the tombstones its truncations to
//! 0 keep, chunks beyond the size a file had when it was deleted (cut off by an earlier
//! truncate), writes that land after their file was collected, and chunks of a file a
//! client created by itself whose create never reached meta.
//!
//! ```text
//!  every sweep_secs: chunk_ids (names only) --> distinct inodes
//!     --> DeadInodes, DEAD_INODES_MAX at a time (meta unreachable: skip this sweep)
//!     --> per chunk of a dead inode: ordering lock --> engine remove --> chunks_swept
//! ```
//!
//! Why it is safe without coordination (stoa-meta `ops/dead.rs` has the meta side):
//! inode numbers are never reused, and a dead inode stays dead, so no file will ever
//! write the chunks removed here again; the answer may be acted on however late. The
//! chunk's ordering lock keeps the removal from interleaving with a mutation of the
//! chunk in flight through this server (a late write or a garbage truncation, whose
//! leftovers the next sweep removes). Each replica sweeps on its own, without
//! replicating: a chain member that has not swept yet still holds a dead chunk nobody
//! reads, and a resync drops chunks its source lacks.
//!
//! Not to be confused with the scrubber's sweep (scrub.rs), which drops chunks of chains
//! rebuilt elsewhere while this server was away.

use super::Server;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoa_proto::{MetaOp, MetaResponse, DEAD_INODES_MAX};
use stoa_types::{ChunkId, FsError, InodeId};

/// What one sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Swept {
    /// Distinct inodes this server held chunks of.
    pub inodes: usize,
    pub dead_inodes: usize,
    pub removed_chunks: u64,
    /// Chunks of dead inodes whose removal failed; the next sweep tries again.
    pub failed_chunks: u64,
}

impl Server {
    /// Starts the dead-inode sweep, unless it is turned off (`sweep_secs` 0).
    pub(crate) fn start_sweeper(self: &Arc<Self>) {
        if self.limits.sweep_secs == 0 {
            return;
        }
        let server = self.clone();
        self.spawn(server.sweep_loop(Duration::from_secs(self.limits.sweep_secs)));
    }

    async fn sweep_loop(self: Arc<Self>, period: Duration) {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate: a server that just started has its resyncs and
        // registration to do first, and nothing to sweep that cannot wait a period.
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let started = Instant::now();
            let mut swept = Swept::default();
            let result = self.sweep_dead(&mut swept).await;
            if swept.removed_chunks > 0 || swept.failed_chunks > 0 {
                tracing::info!(
                    "chunk server {}: swept {} chunks of {} dead inodes ({} failed; {} inodes \
                     held) in {:?}",
                    self.node,
                    swept.removed_chunks,
                    swept.dead_inodes,
                    swept.failed_chunks,
                    swept.inodes,
                    started.elapsed()
                );
            }
            match result {
                Ok(()) => tracing::debug!("sweep of {} inodes done", swept.inodes),
                Err(e) if e.is_retryable() => {
                    tracing::debug!("sweep stopped, meta is unreachable: {e}")
                }
                Err(e) => tracing::warn!("sweeping the chunks of dead inodes: {e}"),
            }
        }
    }

    /// One sweep: asks meta which inodes this server holds chunks of are dead, a batch
    /// at a time, and removes their chunks, counting in `swept` as it goes. A failed
    /// meta call ends the sweep (the batches before it were swept); a failed removal
    /// only skips that chunk.
    pub(super) async fn sweep_dead(&self, swept: &mut Swept) -> Result<(), FsError> {
        let mut by_inode: BTreeMap<InodeId, Vec<ChunkId>> = BTreeMap::new();
        for chunk in self.disk(|e| e.chunk_ids()).await? {
            by_inode.entry(chunk.ino).or_default().push(chunk);
        }
        let inodes: Vec<InodeId> = by_inode.keys().copied().collect();
        swept.inodes = inodes.len();
        for batch in inodes.chunks(DEAD_INODES_MAX) {
            let dead = self.dead_inodes(batch).await?;
            for ino in dead {
                // Meta answers a subset of what it was asked; anything else is ignored
                // rather than trusted.
                let Some(chunks) = by_inode.remove(&ino) else { continue };
                swept.dead_inodes += 1;
                for chunk in chunks {
                    let _order = self.order.lock(chunk).await;
                    match self.disk(move |e| e.remove(chunk)).await {
                        Ok(()) => {
                            swept.removed_chunks += 1;
                            self.stats.chunks_swept.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            swept.failed_chunks += 1;
                            tracing::warn!("sweep: removing chunk {chunk} of dead inode: {e}");
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The inodes of `inos` meta says are dead.
    async fn dead_inodes(&self, inos: &[InodeId]) -> Result<Vec<InodeId>, FsError> {
        match self.call_meta(MetaOp::DeadInodes { inos: inos.to_vec() }).await? {
            MetaResponse::DeadInodes(dead) => Ok(dead),
            other => Err(FsError::Protocol(format!("DeadInodes answered {other:?}"))),
        }
    }
}
