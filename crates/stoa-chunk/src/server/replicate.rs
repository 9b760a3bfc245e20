//! Chain replication of writes and truncates (CRAQ-style, see ARCHITECTURE.md).
//!
//! ```text
//!  client --Write{None}--> head: lock chunk, version = local + 1, apply
//!                           --Write{Some(v)}--> member: apply if local == v - 1,
//!                                              skip if local >= v, Stale on a gap
//!                           <-- Stale ---------  (then: Install whole chunk, resend)
//!                                              --Write{Some(v)}--> ... tail, syncing
//!  client <--Written{v}--- head, once every server on the write path answered
//! ```
//!
//! A client mutation carries a write id, the same on every attempt. A head whose chunk
//! remembers the id (it, or the server it took over from, applied an earlier attempt
//! whose answer was lost) applies nothing: it passes the mutation down the chain again
//! at the version the first attempt made, so that every replica has it, and answers
//! with that version. So a retry never lands twice, and never over a later write.

use super::Server;
use crate::engine::Outcome;
use bytes::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use stoa_proto::ChunkOp;
use stoa_types::{Chain, ChunkId, FsError, Timestamp};

impl Server {
    /// Applies a write or truncate here and passes it down the chain; returns the chunk's
    /// version. At the head (`version: None`) the version is assigned here, under the
    /// chunk's ordering lock, which is held until the whole chain has answered; a client's
    /// mutation taken after its `deadline_ms` is refused there (see `ChunkRequest`).
    pub(super) async fn mutate(
        self: &Arc<Self>,
        chain: &Chain,
        chunk: ChunkId,
        op: ChunkOp,
        payload: Bytes,
        deadline_ms: u64,
    ) -> Result<u64, FsError> {
        let _order = self.order.lock(chunk).await;
        let now_ms = Timestamp::now().as_millis();
        if deadline_ms != 0 && now_ms > deadline_ms {
            tracing::warn!(
                "refusing a write to {chunk}: it came {} ms after its client's lease ended",
                now_ms - deadline_ms
            );
            return Err(FsError::SessionExpired);
        }
        // Ahead of the tail from the moment it is applied here until the chain answered.
        let ahead_of_tail = chain.members.last().is_some_and(|tail| *tail != self.node)
            && chain.members.contains(&self.node);
        let _writing = ahead_of_tail.then(|| self.writing(chunk));
        let local_op = op.clone();
        let data = payload.clone();
        let reserve = self.reserve_for(&local_op);
        // A durable write makes the chunk durable here while it travels on (what `sync`
        // does, for one chunk): whatever this server holds of the chunk is applied by
        // then, so the flush covers every version up to it. The flush runs on the thread
        // that applied the write, right after it: a second trip through the blocking pool
        // cost the tail 150-250 us before its flush began, all of it in the writer's wait.
        let durable = op.durable();
        let (applied_tx, applied_rx) = tokio::sync::oneshot::channel();
        let flushed = self.disk(move |e| {
            let apply = || match local_op {
                ChunkOp::Write { offset, version, id, .. } => {
                    e.check_space(data.len() as u64, reserve)?;
                    e.write(chunk, offset, &data, version, id)
                }
                ChunkOp::WriteRanges { ranges, version, id, .. } => {
                    e.check_space(data.len() as u64, reserve)?;
                    e.write_ranges(chunk, &ranges, &data, version, id)
                }
                // Cutting to 0 deletes, which must work on a full disk to free it.
                ChunkOp::Truncate { len, version, id, .. } => {
                    if len > 0 {
                        e.check_space(u64::from(len), reserve)?;
                    }
                    e.truncate(chunk, len, version, id)
                }
                other => Err(FsError::Invalid(format!("{other:?} is not a chunk mutation"))),
            };
            let applied = apply();
            let flush = durable && applied.is_ok();
            // Unheard only when the mutation gave up already; then nothing waits.
            let _ = applied_tx.send(applied);
            match flush {
                true => e.sync_all(&[chunk]).map(|()| true),
                false => Ok(false),
            }
        });
        let applied = applied_rx.await.unwrap_or_else(|_| {
            Err(FsError::Io(format!("chunk {chunk}: the disk task ended without an answer")))
        });
        let forwarded_here = matches!(op.mutation_version(), Some(Some(_)));
        let (version, local) = match self.checked(chunk, applied) {
            Ok(Outcome::Duplicate { version, local }) => {
                tracing::info!(
                    "chunk {chunk}: a retried mutation was applied at v{version} already \
                     (now v{local}); passing it down the chain again instead"
                );
                (version, local)
            }
            Ok(Outcome::Skipped(local)) => (local, local),
            Ok(Outcome::Applied(version)) => (version, version),
            // The head applied nothing when it fails; a server further down is now
            // behind its predecessor (see `unsettle`).
            Err(e) if forwarded_here => return Err(self.behind(chunk, e)),
            // A full head asks meta to take it out of its chains too: the writer waits
            // for that and goes on at the new head, if any server has room.
            Err(FsError::NoSpace) => {
                self.report_full();
                return Err(FsError::NoSpace);
            }
            Err(e) => return Err(e),
        };
        let op = op.forwarded_at(version);
        // A mutation behind later ones applied here (a retry whose first attempt went no
        // further than this replica, overtaken by another client's write): a server
        // further down that misses it misses those too, and taking it alone it would
        // serve its bytes as the chunk's (a register read going back, `stoa-fault --seed
        // 15 --scenario chunk-pause`), so it gets this replica's whole copy first.
        let whole = op.mutation_version().flatten().is_some_and(|sent| sent < local);
        // Forward even what was skipped here: a server further down may still miss it,
        // and it skips too if not.
        let flushed = async {
            let synced = flushed.await?;
            self.stats.syncs.fetch_add(u64::from(synced), Ordering::Relaxed);
            Ok::<(), FsError>(())
        };
        let (forwarded, flushed) =
            tokio::join!(self.forward(chain, chunk, op, payload, whole), flushed);
        if let Err(e) = forwarded {
            // Applied here, not (known to be) further down: this replica is ahead of
            // its successors until a later mutation of the chunk reaches all of them.
            self.unsettle(chunk);
            return Err(e);
        }
        self.settle(chunk);
        flushed?;
        Ok(version)
    }

    /// This replica failed to apply a mutation its predecessor has: it refuses reads of
    /// the chunk until it catches up, and, out of space, asks meta to take it out of
    /// its chains. Returns the error to answer with.
    pub(super) fn behind(self: &Arc<Self>, chunk: ChunkId, e: FsError) -> FsError {
        self.unsettle(chunk);
        if e == FsError::NoSpace {
            self.report_full();
        }
        e
    }

    /// The free space a mutation must leave: the whole reserve at the head, half of it
    /// further down (see `Limits::reserve_bytes`).
    pub(super) fn reserve_for(&self, op: &ChunkOp) -> u64 {
        match op.mutation_version() {
            Some(None) => self.limits.reserve_bytes,
            _ => self.limits.reserve_bytes / 2,
        }
    }

    /// Sends a mutation to the next server of the write path. A successor with a gap
    /// answers `Stale`: it gets our whole chunk (we hold the chunk's ordering lock, so
    /// our copy cannot change meanwhile) and then the mutation again, which it skips and
    /// passes on. With `whole`, the successor gets the whole chunk first (a no-op for a
    /// successor already at our version).
    async fn forward(
        &self,
        chain: &Chain,
        chunk: ChunkId,
        op: ChunkOp,
        payload: Bytes,
        whole: bool,
    ) -> Result<(), FsError> {
        let Some(addr) = self.successor(chain)? else { return Ok(()) };
        if !whole {
            match self.call_peer(addr, chain, op.clone(), payload.clone()).await {
                Err(FsError::Stale) => {}
                other => return other.map(|_| ()).map_err(|e| successor_failed(addr, e)),
            }
        }
        let fetched = self.disk(move |e| e.fetch(chunk)).await;
        let copy = self.checked(chunk, fetched)?;
        let version = copy.version;
        tracing::info!(
            "chunk server at {addr} missed writes to chunk {chunk}: installing v{version}"
        );
        let install = ChunkOp::Install { chunk, version, writes: copy.writes };
        self.call_peer(addr, chain, install, Bytes::from(copy.data))
            .await
            .map_err(|e| successor_failed(addr, e))?;
        self.call_peer(addr, chain, op, payload)
            .await
            .map(|_| ())
            .map_err(|e| successor_failed(addr, e))
    }
}

/// A successor out of space is not the application's ENOSPC: the chain has room at its
/// head, and the full server asked meta to take it out, so the writer retries on the
/// chain without it (a full head refuses before applying anything, with `NoSpace`).
fn successor_failed(addr: std::net::SocketAddr, e: FsError) -> FsError {
    match e {
        FsError::NoSpace => FsError::Unavailable(format!(
            "chunk server at {addr} is out of space; meta is taking it out of the chain"
        )),
        other => other,
    }
}
