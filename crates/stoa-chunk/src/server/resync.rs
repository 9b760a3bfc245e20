//! Catching up after a return: a server listed as `syncing` on a chain copies from an
//! active member every chunk whose version or content digest differs, drops chunks the
//! member does not have, and then tells meta it is synced.
//!
//! The digest matters when a head applied a write, died before passing it on, and the
//! new head gave the same version to another write: the returning server's copy has the
//! chain's version but bytes nobody acknowledged, which a comparison of versions alone
//! would keep (and later serve).
//!
//! ```text
//!  table change --> syncing on chain C? --> ListChunks (member) vs our list
//!     --> per differing chunk: lock, FetchChunk (member), install or drop
//!     --> ChunkSynced{C, version} to meta  (StaleChain: refresh and start over)
//! ```
//!
//! New writes reach a syncing server through the write path while this runs. Copying a
//! chunk holds the chunk's ordering lock, and the member is ahead of us on the write
//! path, so whatever it sends is at least as new as anything we applied: a forced
//! install is always right, and the version rules keep everything else idempotent.

use super::Server;
use bytes::Bytes;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use stoa_proto::{ChunkListing, ChunkOp, ChunkResponse, MetaOp};
use stoa_types::{Chain, ChainId, ChunkId, FsError};

/// How long to wait before retrying a resync that failed.
const RETRY_AFTER: Duration = Duration::from_millis(500);
/// A resync logs its progress every this many chunks.
const PROGRESS_EVERY: usize = 64;

/// What one running resync still has to copy, shown in heartbeats; cleared when the
/// pass ends, however it ends.
struct Backlog<'a> {
    server: &'a Server,
    chain: ChainId,
}

impl<'a> Backlog<'a> {
    fn start(server: &'a Server, chain: ChainId, chunks: u64, bytes: u64) -> Backlog<'a> {
        server.backlog.lock().expect("backlog lock poisoned").insert(chain, (chunks, bytes));
        Backlog { server, chain }
    }

    fn copied(&self, bytes: u64) {
        let mut all = self.server.backlog.lock().expect("backlog lock poisoned");
        if let Some((chunks, left)) = all.get_mut(&self.chain) {
            *chunks = chunks.saturating_sub(1);
            *left = left.saturating_sub(bytes);
        }
    }

    fn left(&self) -> (u64, u64) {
        let all = self.server.backlog.lock().expect("backlog lock poisoned");
        all.get(&self.chain).copied().unwrap_or_default()
    }
}

impl Drop for Backlog<'_> {
    fn drop(&mut self) {
        self.server.backlog.lock().expect("backlog lock poisoned").remove(&self.chain);
    }
}

impl Server {
    /// Starts a resync task for every chain that lists us as syncing and has none yet.
    pub(super) fn start_resyncs(self: &Arc<Self>) {
        let table = self.table();
        let mut resyncs = self.resyncs.lock().expect("resync lock poisoned");
        for chain in table.chains.iter().filter(|c| c.syncing.contains(&self.node)) {
            if resyncs.running.contains(&chain.id)
                || resyncs.done.get(&chain.id) == Some(&chain.version)
            {
                continue;
            }
            resyncs.running.insert(chain.id);
            let server = self.clone();
            let id = chain.id;
            self.spawn(async move { server.resync(id).await });
        }
    }

    /// Resyncs chain `id` until meta has heard that we are synced at the current version,
    /// or the chain no longer lists us as syncing.
    async fn resync(self: Arc<Self>, id: ChainId) {
        loop {
            let chain = {
                // Decided under the resync lock, so that a table change that arrives now
                // either is seen here or starts a new task.
                let table = self.table();
                let mut resyncs = self.resyncs.lock().expect("resync lock poisoned");
                match table.chain(id) {
                    Some(c)
                        if c.syncing.contains(&self.node)
                            && resyncs.done.get(&id) != Some(&c.version) =>
                    {
                        c.clone()
                    }
                    _ => {
                        resyncs.running.remove(&id);
                        return;
                    }
                }
            };
            match self.resync_once(&chain).await {
                Ok(()) => {
                    tracing::info!(
                        "chunk server {} synced chain {id} at version {}",
                        self.node,
                        chain.version
                    );
                    self.resyncs
                        .lock()
                        .expect("resync lock poisoned")
                        .done
                        .insert(id, chain.version);
                    continue;
                }
                Err(e) => tracing::warn!("resync of chain {id} failed: {e}; retrying"),
            }
            if let Err(e) = self.refresh().await {
                tracing::debug!("refreshing the chain table: {e}");
            }
            tokio::time::sleep(RETRY_AFTER).await;
        }
    }

    /// One pass: copy from the first member that answers, then report to meta.
    async fn resync_once(self: &Arc<Self>, chain: &Chain) -> Result<(), FsError> {
        let table = self.table();
        let mut last = FsError::Unavailable(format!("chain {} has no active member", chain.id));
        for &member in chain.members.iter().filter(|m| **m != self.node) {
            let Some(addr) = table.addr(member) else { continue };
            match self.copy_from(chain, addr).await {
                Ok(()) => {
                    let op = MetaOp::ChunkSynced {
                        node: self.node,
                        chain: chain.id,
                        chain_version: chain.version,
                    };
                    return self.call_meta(op).await.map(|_| ());
                }
                Err(e) => {
                    tracing::debug!("resync of chain {} from {addr} failed: {e}", chain.id);
                    last = e;
                }
            }
        }
        Err(last)
    }

    /// Brings every chunk of `chain` to the version the member at `addr` has.
    async fn copy_from(&self, chain: &Chain, addr: std::net::SocketAddr) -> Result<(), FsError> {
        let theirs: HashMap<ChunkId, ChunkListing> = match self
            .call_peer(addr, chain, ChunkOp::ListChunks, Bytes::new())
            .await?
        {
            (ChunkResponse::Chunks(list), _) => list.into_iter().map(|l| (l.chunk, l)).collect(),
            (other, _) => return Err(FsError::Protocol(format!("ListChunks answered {other:?}"))),
        };
        let ours: HashMap<ChunkId, (u64, u32)> = self
            .list(chain.id)
            .await?
            .into_iter()
            .map(|l| (l.chunk, (l.version, l.digest)))
            .collect();
        // After an unclean stop a chunk's data may be newer than its header, so chunks
        // whose versions agree are checked too.
        let verify = self.engine.opened_dirty();
        let mut work: Vec<(ChunkId, u32, bool)> = Vec::new();
        for (&chunk, listing) in &theirs {
            let (version, len) = (listing.version, listing.len);
            let mine = ours.get(&chunk).copied();
            let differs = mine != Some((version, listing.digest));
            if differs || (verify && self.disk(move |e| e.verify(chunk)).await.is_err()) {
                // At the same version, the copy must replace ours anyway.
                let same_version = mine.map(|(v, _)| v) == Some(version);
                work.push((chunk, len, same_version));
            }
        }
        // Ours alone: the member deleted them while we were away (garbage collection).
        work.extend(ours.keys().filter(|c| !theirs.contains_key(c)).map(|&c| (c, 0, false)));
        let total = work.iter().map(|(_, len, _)| u64::from(*len)).sum();
        let backlog = Backlog::start(self, chain.id, work.len() as u64, total);
        if !work.is_empty() {
            tracing::info!(
                "chunk server {}: chain {} needs {} chunks ({total} bytes) from {addr}",
                self.node,
                chain.id,
                work.len()
            );
        }
        for (done, (chunk, len, repair)) in work.into_iter().enumerate() {
            self.copy_chunk(chain, addr, chunk, repair).await?;
            backlog.copied(u64::from(len));
            if (done + 1) % PROGRESS_EVERY == 0 {
                let (chunks, bytes) = backlog.left();
                tracing::info!(
                    "chunk server {}: chain {}: {chunks} chunks ({bytes} bytes) left to copy",
                    self.node,
                    chain.id
                );
            }
        }
        Ok(())
    }

    /// Copies one chunk from the member at `addr` (dropping ours if it has none). `repair`
    /// replaces our copy even at the same version (other bytes, or damaged ones).
    async fn copy_chunk(
        &self,
        chain: &Chain,
        addr: std::net::SocketAddr,
        chunk: ChunkId,
        repair: bool,
    ) -> Result<(), FsError> {
        let _order = self.order.lock(chunk).await;
        let (version, writes, data) = match self
            .call_peer(addr, chain, ChunkOp::FetchChunk { chunk }, Bytes::new())
            .await?
        {
            (ChunkResponse::Chunk { version, writes }, data) => (version, writes, data),
            (other, _) => return Err(FsError::Protocol(format!("FetchChunk answered {other:?}"))),
        };
        let ours = self.disk(move |e| e.version(chunk)).await.unwrap_or(0);
        if ours == version && !repair {
            // The same version as an active member's: settled, whatever failed here.
            self.settle(chunk);
            return Ok(());
        }
        let len = data.len() as u64;
        self.disk(move |e| e.install(chunk, version, &data, &writes, true)).await?;
        self.settle(chunk);
        self.stats.copied_bytes.fetch_add(len, Ordering::Relaxed);
        let counter =
            if version == 0 { &self.stats.chunks_dropped } else { &self.stats.chunks_copied };
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("resync: chunk {chunk} v{ours} -> v{version} from {addr}");
        Ok(())
    }
}
