//! The chunk server: the engine behind an RPC handler, a copy of meta's chain table, and
//! chain replication.
//!
//! ```text
//!  request --> fenced? --> chain version == ours? (newer: refresh from meta once)
//!          --> role check (head / write path / active member)
//!          --> Read, ListChunks, FetchChunk      -> engine (a scan of small files in
//!                                                   inode order: prefetch.rs)
//!          --> Write, Truncate (replicate.rs)    -> engine, then the next server
//!          --> Sync                              -> fdatasync, then the next server
//!          --> Install                           -> engine (replace whole chunk)
//!
//!  background: heartbeats (table.rs), resync (resync.rs), scrubber (scrub.rs),
//!              dead-inode sweep (sweep.rs)
//! ```

mod locks;
mod prefetch;
mod replicate;
mod resync;
mod scrub;
mod sweep;
mod table;
#[cfg(test)]
mod tests;

use crate::engine::Engine;
use bytes::Bytes;
use locks::OrderLocks;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoa_net::{Handler, MetaClient, Pool};
use stoa_proto::{
    ChunkListing, ChunkOp, ChunkRequest, ChunkResponse, MetaOp, MetaRequest, MetaResponse,
    RepairProgress, Reply, Request, Response, CHUNKS_OF_MAX,
};
use stoa_types::{Chain, ChainId, ChunkId, FsError, InodeId, NodeId, RequestId, SessionId};
use table::ChainView;
use tokio::task::JoinSet;

/// How long a call to the next server of a chain (or a resync source) may take. It waits
/// for the rest of the chain, so it is generous, but short enough that a write stuck on a
/// stopped successor fails soon after meta has taken that successor out.
const PEER_CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a full server repeats its report to meta while writes keep reaching it.
const FULL_REPORT_PERIOD: Duration = Duration::from_millis(500);
/// How soon a report of a full disk that got no answer is sent again.
const FULL_REPORT_RETRY: Duration = Duration::from_millis(200);

/// Counters of what the server did, for tests now and metrics later.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub syncs: AtomicU64,
    pub chunks_copied: AtomicU64,
    pub chunks_dropped: AtomicU64,
    /// Chunks of dead inodes removed by the sweep (sweep.rs).
    pub chunks_swept: AtomicU64,
    pub corrupt_reports: AtomicU64,
    pub copied_bytes: AtomicU64,
    pub scrubbed_bytes: AtomicU64,
    pub corrupt_repaired: AtomicU64,
}

/// Resync bookkeeping per chain, under one lock so that a table change and a finishing
/// resync task never both decide that the other will handle a chain.
#[derive(Debug, Default)]
struct Resyncs {
    running: HashSet<ChainId>,
    /// The chain version each chain was last reported synced at.
    done: HashMap<ChainId, u64>,
}

/// Operator limits of one server.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Limits {
    /// Bytes per second the scrubber verifies; 0: no scrubber.
    pub scrub_bytes_per_sec: u64,
    /// Free bytes the head of a chain keeps on its disk; other servers of the chain keep
    /// half of it, so that a write refused for space is refused at the head, before any
    /// replica applied it, whenever the disks are alike.
    pub reserve_bytes: u64,
    /// Seconds between two sweeps of the chunks of dead inodes; 0: no sweep.
    pub sweep_secs: u64,
}

/// One running chunk server.
pub(crate) struct Server {
    pub node: NodeId,
    pub engine: Arc<Engine>,
    pub stats: Stats,
    limits: Limits,
    pool: Pool,
    meta: MetaClient,
    view: ChainView,
    order: OrderLocks,
    resyncs: Mutex<Resyncs>,
    /// The cluster's replica count, from meta's heartbeat answers (0 until the first).
    replicas: AtomicU64,
    /// Chunks seen on a whole chain without us in the last sweep (see scrub.rs).
    orphans: Mutex<HashSet<ChunkId>>,
    /// Chunks and bytes each running resync still has to copy.
    backlog: Mutex<HashMap<ChainId, (u64, u64)>>,
    /// Chunks this replica serves no reads of, and why.
    unserved: Mutex<Unserved>,
    /// When this server last told meta it is out of space.
    reported_full: Mutex<Option<std::time::Instant>>,
    /// Reports of a full disk sent and not yet answered with the table they led to:
    /// no read is served meanwhile (see [`Server::report_full`]).
    leaving: AtomicU64,
    tasks: Mutex<JoinSet<()>>,
    /// Read-ahead across small files read in inode order (prefetch.rs).
    prefetch: prefetch::Prefetch,
}

/// Which servers of its chain may answer a request.
enum Role {
    Head,
    WritePath,
    ActiveMember,
}

fn meta_request(op: MetaOp) -> MetaRequest {
    // Chunk servers have no session: registration is keyed by node id, ChunkSynced by
    // chain version, and both are safe to repeat.
    MetaRequest { session: SessionId(0), req_id: RequestId(0), op }
}

impl Server {
    pub fn new(
        node: NodeId,
        engine: Arc<Engine>,
        pool: Pool,
        meta: MetaClient,
        limits: Limits,
    ) -> Server {
        Server {
            node,
            engine,
            stats: Stats::default(),
            limits,
            pool,
            meta,
            view: ChainView::default(),
            order: OrderLocks::default(),
            resyncs: Mutex::new(Resyncs::default()),
            replicas: AtomicU64::new(0),
            orphans: Mutex::new(HashSet::new()),
            backlog: Mutex::new(HashMap::new()),
            unserved: Mutex::new(Unserved::default()),
            reported_full: Mutex::new(None),
            leaving: AtomicU64::new(0),
            tasks: Mutex::new(JoinSet::new()),
            prefetch: Default::default(),
        }
    }

    /// Runs `task` until the server stops.
    fn spawn(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().expect("task lock poisoned").spawn(task);
    }

    /// Stops every background task of the server.
    pub fn stop_tasks(&self) {
        std::mem::take(&mut *self.tasks.lock().expect("task lock poisoned")).abort_all();
    }

    /// Runs `f` on the blocking pool: disk I/O never runs on the reactor.
    fn disk<T, F>(
        &self,
        f: F,
    ) -> impl std::future::Future<Output = Result<T, FsError>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&Engine) -> Result<T, FsError> + Send + 'static,
    {
        let engine = self.engine.clone();
        // Started now, not when first polled: a caller may await something else first.
        let task = tokio::task::spawn_blocking(move || f(&engine));
        async move { task.await.map_err(|e| FsError::Io(format!("chunk disk task: {e}")))? }
    }

    async fn call_meta(&self, op: MetaOp) -> Result<MetaResponse, FsError> {
        self.meta.call(meta_request(op)).await
    }

    /// Calls another chunk server about `chain`. The call stops early, with
    /// `StaleChain`, when our table moves the chain on: a mutation forwarded to a
    /// successor that stopped (SIGSTOP, a cut link) holds the chunk's ordering lock, and
    /// the writer's retry on the chain without that successor needs the lock; waiting
    /// out [`PEER_CALL_TIMEOUT`] would stall every write to the chunk for that long
    /// although meta took the successor out within 1.5 s (`stoa-fault --scenario
    /// chunk-pause`).
    async fn call_peer(
        &self,
        addr: SocketAddr,
        chain: &Chain,
        op: ChunkOp,
        payload: Bytes,
    ) -> Result<(ChunkResponse, Bytes), FsError> {
        let req = Request::Chunk(ChunkRequest {
            chain: chain.id,
            chain_version: chain.version,
            op,
            deadline_ms: 0,
        });
        let answer = tokio::select! {
            answer = self.pool.call(addr, &req, payload, PEER_CALL_TIMEOUT) => answer?,
            moved = self.view.moved(chain) => return Err(moved),
        };
        match answer {
            (Response::Chunk(resp), payload) => Ok((resp, payload)),
            (other, _) => Err(FsError::Protocol(format!("chunk server {addr} answered {other:?}"))),
        }
    }

    /// Tells meta, in the background, that our replica of `chunk` is damaged.
    fn report_corrupt(&self, chunk: ChunkId, detail: String) {
        tracing::warn!("chunk {chunk} is corrupt on this server: {detail}");
        self.stats.corrupt_reports.fetch_add(1, Ordering::Relaxed);
        let meta = self.meta.clone();
        let op = MetaOp::ReportCorrupt { node: self.node, chunk, detail };
        self.spawn(async move {
            if let Err(e) = meta.call(meta_request(op)).await {
                tracing::warn!("reporting corrupt chunk {chunk} to meta: {e}");
            }
        });
    }

    fn unserved(&self) -> std::sync::MutexGuard<'_, Unserved> {
        self.unserved.lock().expect("unserved lock poisoned")
    }

    fn unsettle(&self, chunk: ChunkId) {
        self.unserved().unsettled.insert(chunk);
    }

    fn settle(&self, chunk: ChunkId) {
        self.unserved().unsettled.remove(&chunk);
    }

    /// Whether this replica may answer a read of `chunk` with what it read: called after
    /// the bytes were read, so that bytes of a mutation applied here meanwhile are never
    /// answered before the tail has them (`writing` is marked before the mutation is
    /// applied, and cleared only once the chain answered).
    fn check_settled(&self, chunk: ChunkId) -> Result<(), FsError> {
        let unserved = self.unserved();
        let why = if unserved.unsettled.contains(&chunk) {
            "a write not settled on its chain"
        } else if unserved.writing.contains(&chunk) {
            "a write not yet at the chain's tail"
        } else {
            return Ok(());
        };
        Err(FsError::Unavailable(format!("chunk {chunk} has {why}; read another replica")))
    }

    /// Marks `chunk` as written here ahead of the tail until the guard is dropped.
    fn writing(self: &Arc<Self>, chunk: ChunkId) -> Writing {
        self.unserved().writing.insert(chunk);
        Writing { server: self.clone(), chunk }
    }

    /// Tells meta, in the background and at most every `FULL_REPORT_PERIOD`, that this
    /// server refused a chain's write for lack of space, so that it leaves its chains.
    ///
    /// Meta takes it out at once, not after a silence it would have fenced itself in, so
    /// writes may be acknowledged on a chain without it while its own table still lists
    /// it, and a reader with that old table could get its copy, older than a write
    /// another mount finished (`stoa-fault --seed 784 --scenario disk-full`: a
    /// compare-and-set under a lock read the value before another mount's fsynced
    /// write). So from the report until meta's answer, which carries the table the
    /// report led to, this server serves no reads; the answer is awaited, retried if
    /// need be, and adopted before reads resume.
    fn report_full(self: &Arc<Self>) {
        {
            let mut last = self.reported_full.lock().expect("report lock poisoned");
            if last.is_some_and(|t| t.elapsed() < FULL_REPORT_PERIOD) {
                return;
            }
            *last = Some(std::time::Instant::now());
        }
        tracing::warn!("chunk server {} is out of space: asking meta to take it out", self.node);
        self.leaving.fetch_add(1, Ordering::AcqRel);
        let server = self.clone();
        self.spawn(async move {
            loop {
                match server.call_meta(MetaOp::ChunkServerFull { node: server.node }).await {
                    Ok(MetaResponse::Heartbeat { table, .. }) => {
                        if let Some(table) = table {
                            server.adopt(table);
                        }
                        break;
                    }
                    // A meta of an earlier version answers without the table.
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!("reporting a full disk to meta: {e}; retrying");
                        tokio::time::sleep(FULL_REPORT_RETRY).await;
                    }
                }
            }
            server.leaving.fetch_sub(1, Ordering::AcqRel);
        });
    }

    /// Refuses a read while a report of a full disk awaits meta's answer.
    fn check_not_leaving(&self) -> Result<(), FsError> {
        if self.leaving.load(Ordering::Acquire) > 0 {
            return Err(FsError::Unavailable(format!(
                "chunk server {} is out of space and leaving its chains; read another replica",
                self.node
            )));
        }
        Ok(())
    }

    /// Repair progress for the next heartbeat.
    pub(crate) fn repair_progress(&self) -> RepairProgress {
        let (backlog_chunks, backlog_bytes) = self
            .backlog
            .lock()
            .expect("backlog lock poisoned")
            .values()
            .fold((0, 0), |(c, b), (cc, bb)| (c + cc, b + bb));
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RepairProgress {
            backlog_chunks,
            backlog_bytes,
            copied_chunks: load(&self.stats.chunks_copied),
            copied_bytes: load(&self.stats.copied_bytes),
            scrubbed_bytes: load(&self.stats.scrubbed_bytes),
            corrupt_found: load(&self.stats.corrupt_reports),
            corrupt_repaired: load(&self.stats.corrupt_repaired),
        }
    }

    /// Passes a checksum error through, reporting it first.
    fn checked<T>(&self, chunk: ChunkId, result: Result<T, FsError>) -> Result<T, FsError> {
        if let Err(FsError::Checksum(detail)) = &result {
            self.report_corrupt(chunk, detail.clone());
        }
        result
    }

    /// Answers one chunk request.
    pub async fn handle(
        self: &Arc<Self>,
        req: ChunkRequest,
        payload: Bytes,
    ) -> Result<(ChunkResponse, Bytes), FsError> {
        self.check_fence()?;
        let chain = self.chain_for_request(req.chain, req.chain_version).await?;
        self.check_role(&chain, &req.op)?;
        if let Some(chunk) = req.op.chunk() {
            self.check_owner(&chain, chunk)?;
        }
        let none = Bytes::new();
        match req.op {
            ChunkOp::Read { chunk, offset, len } => {
                // Answered here on the reactor when it is short and nothing of it waits
                // for the disk: a trip through the blocking pool costs two thread
                // wake-ups, the larger part of a small read's time on this server. A
                // long read is never tried here, so the prefetch counts it as a miss.
                let cached = self.engine.read_cached(chunk, offset, len);
                self.prefetch.on_read(&self.engine, chunk, offset, cached.is_none());
                let data = match cached {
                    Some(data) => Ok(data),
                    None => self.disk(move |e| e.read(chunk, offset, len)).await,
                };
                self.check_settled(chunk)?;
                self.check_not_leaving()?;
                Ok((ChunkResponse::Data, Bytes::from(self.checked(chunk, data)?)))
            }
            op @ (ChunkOp::Write { chunk, .. } | ChunkOp::WriteRanges { chunk, .. }) => {
                let version = self.mutate(&chain, chunk, op, payload, req.deadline_ms).await?;
                Ok((ChunkResponse::Written { version }, none))
            }
            op @ ChunkOp::Truncate { chunk, .. } => {
                let version = self.mutate(&chain, chunk, op, payload, req.deadline_ms).await?;
                Ok((ChunkResponse::Written { version }, none))
            }
            ChunkOp::Sync { chunks } => {
                self.sync(&chain, chunks).await?;
                Ok((ChunkResponse::Done, none))
            }
            ChunkOp::ListChunks => Ok((ChunkResponse::Chunks(self.list(chain.id).await?), none)),
            ChunkOp::ChunksOf { ino, from, limit } => {
                let indexes = self.chunks_of(ino, from, limit).await?;
                Ok((ChunkResponse::Indexes(indexes), none))
            }
            ChunkOp::FetchChunk { chunk } => {
                let fetched = self.disk(move |e| e.fetch(chunk)).await;
                let copy = self.checked(chunk, fetched)?;
                let answer = ChunkResponse::Chunk { version: copy.version, writes: copy.writes };
                Ok((answer, Bytes::from(copy.data)))
            }
            ChunkOp::Install { chunk, version, writes } => {
                let _order = self.order.lock(chunk).await;
                let reserve = self.limits.reserve_bytes / 2;
                let installed = self
                    .disk(move |e| {
                        e.check_space(payload.len() as u64, reserve)?;
                        e.install(chunk, version, &payload, &writes, false)
                    })
                    .await;
                let outcome = installed.map_err(|e| self.behind(chunk, e))?;
                Ok((ChunkResponse::Written { version: outcome.version() }, none))
            }
        }
    }

    fn check_role(&self, chain: &Chain, op: &ChunkOp) -> Result<(), FsError> {
        let role = match op {
            ChunkOp::Write { version: None, .. }
            | ChunkOp::WriteRanges { version: None, .. }
            | ChunkOp::Truncate { version: None, .. } => Role::Head,
            ChunkOp::Write { .. }
            | ChunkOp::WriteRanges { .. }
            | ChunkOp::Truncate { .. }
            | ChunkOp::Install { .. }
            | ChunkOp::Sync { .. } => Role::WritePath,
            ChunkOp::Read { .. }
            | ChunkOp::ListChunks
            | ChunkOp::ChunksOf { .. }
            | ChunkOp::FetchChunk { .. } => Role::ActiveMember,
        };
        let me = self.node;
        let (ok, what) = match role {
            Role::Head => (chain.members.first() == Some(&me), "the head"),
            Role::WritePath => (chain.write_path().any(|n| n == me), "on the write path"),
            Role::ActiveMember => (chain.members.contains(&me), "an active member"),
        };
        if ok {
            return Ok(());
        }
        // Retryable: the caller's table is behind, or it picked a syncing replica.
        Err(FsError::Unavailable(format!(
            "chunk server {me} is not {what} of chain {} at version {}",
            chain.id, chain.version
        )))
    }

    /// A chunk must be asked of the chain that stores it; a caller whose table maps it
    /// elsewhere has another table and must refresh.
    fn check_owner(&self, chain: &Chain, chunk: ChunkId) -> Result<(), FsError> {
        let table = self.view.table();
        match table.chain_for(chunk) {
            Some(owner) if owner.id == chain.id => Ok(()),
            _ => Err(FsError::StaleChain { got: chain.version, current: table.version }),
        }
    }

    /// The chunks of `chain` this server holds, with their versions, lengths and digests.
    async fn list(&self, chain: ChainId) -> Result<Vec<ChunkListing>, FsError> {
        let table = self.view.table();
        let all = self.disk(|e| e.list_sized()).await?;
        Ok(all
            .into_iter()
            .filter(|l| table.chain_for(l.chunk).is_some_and(|c| c.id == chain))
            .collect())
    }

    /// The indexes of file `ino`'s chunks at `from` or past it that this server holds,
    /// of every chain, in order, at most `limit` ([`CHUNKS_OF_MAX`]). It reads the names
    /// of every chunk file here, no header: what a file's data is made of, however large
    /// its size says it is.
    async fn chunks_of(&self, ino: InodeId, from: u64, limit: u32) -> Result<Vec<u64>, FsError> {
        let limit = limit.min(CHUNKS_OF_MAX) as usize;
        self.disk(move |e| e.chunks_of(ino, from, limit)).await
    }

    /// Makes `chunks` durable here and on the rest of the chain; answers when both are
    /// done. The local flush and the rest of the chain run at the same time: the writes
    /// being made durable were acknowledged by every server already, so no order between
    /// the servers' flushes matters, only that all of them finished.
    async fn sync(&self, chain: &Chain, chunks: Vec<ChunkId>) -> Result<(), FsError> {
        let successor = self.successor(chain)?;
        let here = self.flush_here(chunks.clone());
        let rest = async {
            match successor {
                Some(addr) => {
                    let op = ChunkOp::Sync { chunks };
                    self.call_peer(addr, chain, op, Bytes::new()).await.map(|_| ())
                }
                None => Ok(()),
            }
        };
        let (here, rest) = tokio::join!(here, rest);
        here.and(rest)
    }

    /// Makes `chunks` durable on this server's disk.
    pub(super) async fn flush_here(&self, chunks: Vec<ChunkId>) -> Result<(), FsError> {
        self.disk(move |e| e.sync_all(&chunks)).await?;
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The address of the server after this one on the chain's write path, if any.
    fn successor(&self, chain: &Chain) -> Result<Option<SocketAddr>, FsError> {
        let mut path = chain.write_path().skip_while(|n| *n != self.node);
        path.next();
        let Some(next) = path.next() else { return Ok(None) };
        let addr = self.view.table().addr(next).ok_or_else(|| {
            FsError::Unavailable(format!(
                "chunk server {next} of chain {} has no address",
                chain.id
            ))
        })?;
        Ok(Some(addr))
    }
}

/// Chunks a replica serves no reads of.
#[derive(Default)]
struct Unserved {
    /// Chunks whose last mutation here did not settle on the whole write path: applied
    /// here but failed further down, or failed here but applied before us. Replicas of
    /// such a chunk may differ, so this one serves no reads of it until a later
    /// mutation (or a copy from an active member) settles it: a failed write must never
    /// be seen by one read and gone for the next, and no read may go back to a version
    /// older than one another replica served.
    unsettled: HashSet<ChunkId>,
    /// Chunks with a mutation applied here that the chain's last active member may not
    /// have yet (one at a time per chunk: the ordering lock is held until the chain
    /// answered). A read here could see the new bytes and a later read at the tail the
    /// old ones, a read going back (CRAQ sends such reads to the tail; the client tries
    /// the next replica). The tail never marks one, so a healthy chain always has a
    /// replica that answers.
    writing: HashSet<ChunkId>,
}

/// A chunk's mark in `Unserved::writing`, removed when dropped.
struct Writing {
    server: Arc<Server>,
    chunk: ChunkId,
}

impl Drop for Writing {
    fn drop(&mut self) {
        self.server.unserved().writing.remove(&self.chunk);
    }
}

/// The RPC handler. It holds the server behind a gate that shutdown closes: in-flight
/// requests finish first, and connections that outlive the server get a retryable error
/// instead of reaching a closed store.
pub(crate) struct Service {
    gate: tokio::sync::RwLock<Option<Arc<Server>>>,
}

impl Service {
    pub fn new(server: Arc<Server>) -> Service {
        Service { gate: tokio::sync::RwLock::new(Some(server)) }
    }

    /// Waits for in-flight requests, then stops answering; returns the server.
    pub async fn close(&self) -> Option<Arc<Server>> {
        self.gate.write().await.take()
    }
}

impl Handler for Service {
    async fn handle(&self, req: Request, payload: Bytes, _peer: SocketAddr) -> (Reply, Bytes) {
        let gate = self.gate.read().await;
        let Some(server) = gate.as_ref() else {
            let err = FsError::Unavailable("chunk server is shut down".into());
            return (Err(err), Bytes::new());
        };
        match req {
            Request::Chunk(req) => match server.handle(req, payload).await {
                Ok((resp, payload)) => (Ok(Response::Chunk(resp)), payload),
                Err(e) => (Err(e), Bytes::new()),
            },
            Request::Meta(_) | Request::Raft(_) => {
                let err = FsError::Invalid(
                    "this is a chunk server; meta requests go to meta replicas".into(),
                );
                (Err(err), Bytes::new())
            }
        }
    }
}
