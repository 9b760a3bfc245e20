//! The meta RPC service: what a replica does with each request.
//!
//! ```text
//!  request --> mutation? --leader--> propose Command::Client --> answer
//!          |            \-follower-> forward to the leader (one hop)
//!          +-> read -----leader--> ensure_linearizable, read txn --> answer
//!          |            \-follower-> ReadIndex from the leader, wait until applied
//!          |                         here, read txn here --> answer
//!          +-> ChunkHeartbeat, ChunkServerFull, RenewSession (leader soft state),
//!              Status, ReportCorrupt
//!          +-> AddReplica, RemoveReplica (leader: Raft membership change)
//! ```

use crate::caps::{self, CapTable};
use crate::datadir::ClusterIdentity;
use crate::leases::Leases;
use crate::liveness::{Liveness, DOWN_AFTER};
use crate::raft::{MetaRaft, RaftView, Role};
use crate::MetaConfig;
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use stoa_meta::Command;
use stoa_net::{Handler, Pool};
use stoa_proto::{BatchOp, CapMode, MetaOp, MetaRequest, MetaResponse, Reply, Request, Response};
use stoa_types::{
    FsError, InodeId, NodeId, RequestId, SessionId, StatFs, Timestamp, XATTR_BYTES_MAX,
};

/// How long a forwarded request may take at the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a follower asks the leader for a read index, and then waits to apply it.
/// Short, so that a read on a replica cut off from its leader fails over quickly.
const READ_INDEX_TIMEOUT: Duration = Duration::from_secs(1);

/// Everything one running replica has; shared by the service and the leader's tasks.
pub(crate) struct Node {
    pub cfg: MetaConfig,
    pub raft: MetaRaft,
    pub pool: Pool,
    pub cluster: Arc<ClusterIdentity>,
    pub liveness: Liveness,
    pub leases: Leases,
    pub caps: CapTable,
    pub attempts: Attempts,
    pub corrupt_reports: AtomicU64,
}

/// The numbered mutations this replica is answering. A retry of one still in progress
/// (its caller timed out while it waited for the others' acks) waits for it: the retry
/// finds the change made and cannot name again everything the first attempt recalls
/// (an unlinked file is no longer found by its name), so answered at once it would
/// return before those caches are gone (caps.md invariant 2).
#[derive(Default)]
pub(crate) struct Attempts {
    gates: std::sync::Mutex<Gates>,
}

/// One gate per request with an attempt in progress, held by the attempt answering it.
type Gates = HashMap<(SessionId, RequestId), Arc<tokio::sync::Mutex<()>>>;

impl Attempts {
    /// Waits until no earlier attempt of `key` is in progress here, and marks this one.
    async fn begin(&self, key: (SessionId, RequestId)) -> Attempt<'_> {
        let gate = self.lock().entry(key).or_default().clone();
        let guard = gate.clone().lock_owned().await;
        Attempt { attempts: self, key, gate, guard: Some(guard) }
    }

    /// How many requests have an attempt in progress here.
    #[cfg(test)]
    pub(crate) fn in_progress(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gates> {
        self.gates.lock().expect("attempts lock poisoned")
    }
}

/// An attempt of a numbered mutation in progress, until dropped.
struct Attempt<'a> {
    attempts: &'a Attempts,
    key: (SessionId, RequestId),
    gate: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let mut gates = self.attempts.lock();
        // Clones are taken under this lock: two are the map's and this one's, so no
        // other attempt of the request waits.
        if Arc::strong_count(&self.gate) == 2 {
            gates.remove(&self.key);
        }
    }
}

impl Node {
    pub fn id(&self) -> NodeId {
        self.cfg.id
    }

    /// Answers one meta request.
    pub async fn meta(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        match &req.op {
            MetaOp::Status => self.status(req).await,
            MetaOp::ReportCorrupt { node, chunk, detail } => {
                let count = self.corrupt_reports.fetch_add(1, Ordering::Relaxed) + 1;
                tracing::warn!(
                    "chunk server {node} reports a corrupt replica of chunk {chunk}: {detail} \
                     ({count} reports so far)"
                );
                Ok(MetaResponse::Done)
            }
            MetaOp::ChunkHeartbeat { .. } => self.heartbeat(req).await,
            &MetaOp::ChunkServerFull { node } => {
                let view = self.raft.view();
                if view.role != Role::Leader {
                    return self.forward(&view, req).await;
                }
                if self.liveness.mark_full(node) {
                    tracing::warn!(
                        "chunk server {node} is out of space: taking it out of its chains"
                    );
                }
                // Out of its chains before the answer, which carries the new table: the
                // server serves no reads until it has it, so none of its copies is read
                // once a write was acknowledged without it (stoa-chunk `report_full`).
                self.raft.propose(Command::ChunkServerDown { node }).await?;
                let table = self.raft.read(stoa_meta::chain_table).await?;
                Ok(MetaResponse::Heartbeat { table: Some(table), replicas: self.cfg.replicas })
            }
            MetaOp::RenewSession
            | MetaOp::GetCaps { .. }
            | MetaOp::GetCapsMany { .. }
            | MetaOp::TakeFiles { .. }
            | MetaOp::CapEvents { .. }
            | MetaOp::CapsReleased { .. }
            | MetaOp::TakeDir { .. }
            | MetaOp::ReadIndex
            | MetaOp::AddReplica { .. }
            | MetaOp::RemoveReplica { .. } => self.leader_call(req).await,
            MetaOp::GetLock { .. } => self.get_lock(req).await,
            op if op.is_mutation() => self.mutate(req).await,
            _ => self.read(req).await,
        }
    }

    /// Refuses (`NoSpace`) an xattr `name` of `len` bytes that would take `ino` past
    /// [`XATTR_BYTES_MAX`]. Checked here, before the change is proposed, not where it
    /// applies: a log written by an older build must apply the same on every replica.
    /// So two sets at once may pass it together, by a value each at most. Without a
    /// bound one file took any number of 64 KiB values, and every grant of it read up
    /// to 4,097 of them (256 MiB) to find them too many to carry.
    async fn check_xattr_room(&self, ino: InodeId, name: &[u8], len: usize) -> Result<(), FsError> {
        let held = self.raft.read(move |kv| stoa_meta::xattrs(kv, ino, XATTR_BYTES_MAX)).await?;
        let others: Option<usize> = held.map(|rows| {
            let others = rows.iter().filter(|(n, _)| n.as_slice() != name);
            others.map(|(n, v)| n.len() + v.len()).sum()
        });
        match others {
            Some(bytes) if bytes + name.len() + len <= XATTR_BYTES_MAX => Ok(()),
            _ => Err(FsError::NoSpace),
        }
    }

    async fn mutate(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader {
            return self.forward(&view, req).await;
        }
        let session = req.session;
        let numbered = req.is_numbered();
        let _attempt = match numbered {
            true => Some(self.attempts.begin((session, req.req_id)).await),
            false => None,
        };
        // Other sessions' caches of what this changes are recalled before it is answered
        // (docs/flows/caps.md); a new leader first learns every cap there is. Exclusive
        // holders of what it changes are recalled before it applies: they may have
        // changed it themselves, and meta must have those changes first (invariant 14:
        // entries of a directory; the mode, owner, times or size of a file).
        let named = caps::parents(&req.op);
        let _changing = self.caps.changing(&named);
        if !named.is_empty() {
            caps::await_grace(self).await?;
            caps::recall_exclusive(self, session, &named).await?;
        }
        let touched = caps::touched(self, &req.op).await?;
        if !touched.inodes.is_empty() {
            caps::await_grace(self).await?;
        }
        let _changing_found = self.caps.changing(&touched.dirs);
        self.caps.note_change(session, &touched.dirs);
        caps::recall_exclusive(self, session, &touched.inodes).await?;
        if let MetaOp::Batch { ops } = &req.op {
            let created = ops.iter().filter_map(|op| match op {
                BatchOp::Create { ino, .. } => Some(*ino),
                _ => None,
            });
            self.caps.register_created(session, &created.collect::<Vec<_>>());
        }
        let locking = match req.op {
            MetaOp::SetLock { ino, .. } | MetaOp::LockAndDelegate { ino, .. } => Some(ino),
            _ => None,
        };
        if let Some(ino) = locking {
            caps::recall_lock_keeper(self, session, ino).await?;
        }
        if let MetaOp::SetXattr { ino, name, value, .. } = &req.op {
            self.check_xattr_room(*ino, name, value.len()).await?;
        }
        let closing = matches!(req.op, MetaOp::CloseSession);
        let answer = self.raft.propose(Command::Client { req, now: Timestamp::now() }).await;
        if let (Some(ino), Ok(MetaResponse::LocksElsewhere)) = (locking, &answer) {
            // The keeper took the locks again before this applied: have them back for
            // the caller's next try.
            caps::recall_lock_keeper(self, session, ino).await?;
        }
        // Any call of a session shows that its client is alive, and a new session starts
        // its lease now rather than at this leader's election.
        match &answer {
            Ok(MetaResponse::Session(grant)) => {
                self.leases.renew(grant.session);
                self.caps.opened(grant.session);
            }
            _ if session.0 != 0 => self.leases.renew(session),
            _ => {}
        }
        if answer.is_ok() {
            // Fails only when this replica stopped leading meanwhile. The change is made,
            // but other sessions may still cache what it changed: the caller retries at
            // the new leader, which answers the same request once more (it is numbered)
            // after recalling the caps the holders reassert there (caps.md, "A change
            // made just before its leader loses its place").
            if let Err(e) = caps::recall_touched(self, session, &touched.inodes).await {
                if numbered {
                    return Err(e);
                }
                tracing::warn!(
                    "a change was made, but recalling the cached copies of others failed: {e}"
                );
            }
        }
        if closing {
            self.caps.drop_session(session);
        }
        answer
    }

    /// F_GETLK, answered by the leader: another session that keeps the inode's locks
    /// gives them back first.
    async fn get_lock(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader {
            return self.forward(&view, req).await;
        }
        if let MetaOp::GetLock { ino, .. } = req.op {
            caps::recall_lock_keeper(self, req.session, ino).await?;
        }
        self.read(req).await
    }

    /// Calls only the leader answers; a follower forwards them.
    async fn leader_call(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader {
            return self.forward(&view, req).await;
        }
        match req.op {
            MetaOp::RenewSession => self.renew(req.session).await,
            MetaOp::GetCaps { ino, name, mode } => {
                self.renew(req.session).await?;
                caps::get_caps(self, req.session, ino, name, mode).await
            }
            MetaOp::GetCapsMany { dir, names } => {
                self.renew(req.session).await?;
                caps::get_caps_many(self, req.session, dir, names, CapMode::Shared).await
            }
            MetaOp::TakeFiles { dir, names } => {
                self.renew(req.session).await?;
                caps::get_caps_many(self, req.session, dir, names, CapMode::Exclusive).await
            }
            MetaOp::CapEvents { held, term, poll } => {
                // The client counts its caps valid from when it sent this poll: only a
                // replica that still leads after it arrived may renew them, or a leader
                // cut off from the others would keep them alive past a new leader's
                // grace period (docs/flows/caps.md, invariant 8).
                self.raft.linearize().await?;
                self.renew(req.session).await?;
                let versions = match self.caps.reasserting(req.session) {
                    true => {
                        let inodes: Vec<InodeId> = held.iter().map(|cap| cap.ino).collect();
                        self.raft.read(move |kv| stoa_meta::versions(kv, &inodes)).await?
                    }
                    false => HashMap::new(),
                };
                let ask = caps::Poll { held: &held, term, number: poll, versions: &versions };
                let (recalls, term) = self.caps.poll(req.session, &ask).await?;
                Ok(MetaResponse::CapEvents { recalls, term })
            }
            MetaOp::CapsReleased { released } => {
                self.caps.release(req.session, &released);
                Ok(MetaResponse::Done)
            }
            MetaOp::TakeDir { ino, limit } => {
                self.renew(req.session).await?;
                caps::take_dir(self, req.session, ino, limit).await
            }
            MetaOp::ReadIndex => {
                Ok(MetaResponse::ReadIndex { index: self.raft.read_index().await? })
            }
            MetaOp::AddReplica { id, addr } => {
                tracing::info!("adding meta replica {id} at {addr}");
                self.raft.add_replica(id, addr).await.map(|()| MetaResponse::Done)
            }
            MetaOp::RemoveReplica { id } => {
                tracing::info!("removing meta replica {id}");
                self.raft.remove_replica(id).await.map(|()| MetaResponse::Done)
            }
            other => Err(FsError::Invalid(format!("{other:?} is not a leader call"))),
        }
    }

    /// Renews a session's lease, or says it has expired. A session missing here may only
    /// be missing from a state machine that lags (a new leader), so absence is checked
    /// again after a ReadIndex before the client is told to start over. A session whose
    /// lease ran out is expired even before the expiry round removes it: its caps may
    /// have gone to others already, so it must not get them back (fencing).
    async fn renew(&self, session: SessionId) -> Result<MetaResponse, FsError> {
        if !self.leases.is_live(session, self.raft.session_lease()) {
            return Err(FsError::SessionExpired);
        }
        let exists = move |kv: &crate::raft::SmReader| stoa_meta::session_is_open(kv, session);
        if !self.raft.read(exists).await? {
            self.raft.linearize().await?;
            if !self.raft.read(exists).await? {
                return Err(FsError::SessionExpired);
            }
        }
        self.leases.renew(session);
        Ok(MetaResponse::Renewed { leader: self.raft.view().leader_addr })
    }

    async fn read(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader {
            // StatFs reports the capacity live chunk servers told the leader.
            if matches!(req.op, MetaOp::StatFs) {
                return self.forward(&view, req).await;
            }
            return self.follower_read(&view, req.op).await;
        }
        self.raft.linearize().await?;
        let op = req.op;
        let resp = self.raft.read(move |kv| stoa_meta::read(kv, &op)).await?;
        Ok(match resp {
            MetaResponse::StatFs(s) => MetaResponse::StatFs(self.live_statfs(s).await),
            other => other,
        })
    }

    /// A linearizable read served by this follower: the leader confirms its commit index
    /// with a quorum (ReadIndex), this replica applies up to it, then reads its own
    /// state machine. Read load thus spreads over every replica; the leader only
    /// answers one small call.
    async fn follower_read(&self, view: &RaftView, op: MetaOp) -> Result<MetaResponse, FsError> {
        let ask =
            MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::ReadIndex };
        let index = match self.forward_with(view, ask, READ_INDEX_TIMEOUT).await? {
            MetaResponse::ReadIndex { index } => index,
            other => {
                return Err(FsError::Protocol(format!("leader answered ReadIndex with {other:?}")))
            }
        };
        self.raft.wait_applied(index, READ_INDEX_TIMEOUT).await?;
        self.raft.read(move |kv| stoa_meta::read(kv, &op)).await
    }

    /// Replaces the recorded capacity with what live chunk servers last reported, when
    /// any have reported to this leader.
    async fn live_statfs(&self, recorded: StatFs) -> StatFs {
        let alive = self.liveness.alive(DOWN_AFTER);
        if alive.is_empty() {
            return recorded;
        }
        let replicas = u64::from(self.cfg.replicas.max(1));
        let total: u64 = alive.iter().map(|(_, b)| b.capacity_bytes).sum();
        let free: u64 =
            alive.iter().map(|(_, b)| b.capacity_bytes.saturating_sub(b.used_bytes)).sum();
        StatFs { total_bytes: total / replicas, free_bytes: free / replicas, ..recorded }
    }

    async fn heartbeat(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader {
            return self.forward(&view, req).await;
        }
        let MetaOp::ChunkHeartbeat { node, capacity_bytes, used_bytes, table_version, repair } =
            req.op
        else {
            return Err(FsError::Invalid("not a heartbeat".into()));
        };
        self.liveness.beat(node, capacity_bytes, used_bytes, repair);
        let table = self.raft.read(stoa_meta::chain_table).await?;
        Ok(MetaResponse::Heartbeat {
            table: (table.version != table_version).then_some(table),
            replicas: self.cfg.replicas,
        })
    }

    /// Sends `req` to the leader and returns its answer. One hop: the leader answers
    /// itself or says `NotLeader`, and the caller retries.
    pub async fn forward(
        &self,
        view: &RaftView,
        req: MetaRequest,
    ) -> Result<MetaResponse, FsError> {
        self.forward_with(view, req, FORWARD_TIMEOUT).await
    }

    async fn forward_with(
        &self,
        view: &RaftView,
        req: MetaRequest,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        let (leader, addr) = match (view.leader, view.leader_addr) {
            (Some(leader), Some(addr)) if leader != self.id() => (leader, addr),
            _ => return Err(FsError::NotLeader { leader: None, addr: None }),
        };
        // A leader cut off one way takes calls and its answers never come back: the
        // call is given up as soon as this replica learns of another leader (or leads),
        // and the caller retries there. Before, it waited for the whole forward timeout
        // (fault runs: 5 s stalls after every meta leader partition).
        let call = self.call_meta(addr, req, timeout);
        let another = |view: &RaftView| view.leader.is_some_and(|l| l != leader);
        let answer = self.raft.unless(call, another).await.and_then(|answer| answer);
        answer.inspect_err(|e| {
            tracing::debug!("forwarding to leader {leader} at {addr} failed: {e}");
        })
    }

    async fn call_meta(
        &self,
        addr: SocketAddr,
        req: MetaRequest,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        match self.pool.call(addr, &Request::Meta(req), Bytes::new(), timeout).await {
            Ok((Response::Meta(resp), _)) => Ok(resp),
            Ok((other, _)) => Err(FsError::Protocol(format!("meta at {addr} answered {other:?}"))),
            Err(e @ FsError::Unavailable(_)) => {
                // The next call opens a new connection: this one may lead to a replica
                // that has stopped.
                self.pool.forget(addr);
                Err(e)
            }
            Err(e) => Err(e),
        }
    }
}

/// The [`Handler`] given to the RPC server. It holds the replica behind a gate that
/// shutdown closes, so connections that outlive the replica get a retryable error and
/// stop holding its store open.
#[derive(Default)]
pub(crate) struct Service {
    node: RwLock<Option<Arc<Node>>>,
}

impl Service {
    pub fn new(node: Arc<Node>) -> Service {
        Service { node: RwLock::new(Some(node)) }
    }

    /// Stops answering; returns the replica.
    pub fn close(&self) -> Option<Arc<Node>> {
        self.node.write().expect("service lock poisoned").take()
    }

    fn current(&self) -> Option<Arc<Node>> {
        self.node.read().expect("service lock poisoned").clone()
    }
}

impl Handler for Service {
    async fn handle(&self, req: Request, _payload: Bytes, _peer: SocketAddr) -> (Reply, Bytes) {
        let Some(node) = self.current() else {
            let err = FsError::Unavailable("meta replica is shut down".into());
            return (Err(err), Bytes::new());
        };
        let reply = match req {
            Request::Raft(r) => node.raft.handle(r).await.map(Response::Raft),
            Request::Meta(m) => node.meta(m).await.map(Response::Meta),
            Request::Chunk(_) => Err(FsError::Invalid(
                "this is a meta server; chunk requests go to chunk servers".into(),
            )),
        };
        (reply, Bytes::new())
    }
}
