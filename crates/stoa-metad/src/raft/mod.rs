//! Raft for the meta service, and the only module that names openraft types, so that the
//! Raft library can be swapped without touching the service.
//!
//! ```text
//!  service --propose(Command)--> MetaRaft --client_write--> openraft core
//!                                                              | append: returns at once
//!                                                              v
//!          raft-log/*.seg <-- LogStore flusher thread (one fdatasync per group of batches)
//!          redb meta.redb <-- StateMachine (one txn per applied batch), vote, purge point
//!  peers <--Request::Raft(Envelope)-- network::PeerClient      snapshots/current.snap
//! ```

mod codec;
mod network;
mod segments;
mod sm;
mod snapshot;
mod store;

use crate::datadir::ClusterIdentity;
use crate::MetadError;
use network::{Contacts, Envelope, Network};
use openraft::error::{
    CheckIsLeaderError, ClientWriteError, ForwardToLeader, InitializeError, RaftError,
};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_meta::Command;
use stoa_net::Pool;
use stoa_proto::{MetaResponse, RaftRequest};
use stoa_types::{FsError, NodeId};

/// How often a call that only holds while the leader stays (a call only the leader
/// answers, a call forwarded to it) checks the replica's view.
const LEADING_RECHECK: Duration = Duration::from_millis(50);

pub(crate) use sm::SmReader;

openraft::declare_raft_types!(
    /// The Raft types of the meta service.
    pub(crate) TypeConfig:
        D = Command,
        R = Result<MetaResponse, FsError>,
        NodeId = u64,
        Node = BasicNode,
        SnapshotData = Cursor<Vec<u8>>,
);

/// Timing and log-compaction knobs. The defaults give about half a second of failover and
/// keep the log short; tests shrink the compaction numbers.
#[derive(Clone, Debug)]
pub(crate) struct Tuning {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot after this many entries since the last one.
    pub snapshot_every_entries: u64,
    /// Entries kept behind a snapshot, so a briefly lagging follower catches up from the
    /// log instead of a whole snapshot.
    pub entries_kept_after_snapshot: u64,
    /// How long the leader keeps a client session without a renewal. Clients renew every
    /// third of the lease they were granted, which is `stoa_meta::LEASE_MS`; only tests
    /// shorten this.
    pub session_lease_ms: u64,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            heartbeat_ms: 50,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 350,
            snapshot_every_entries: 5000,
            entries_kept_after_snapshot: 1000,
            session_lease_ms: stoa_meta::LEASE_MS,
        }
    }
}

/// What this replica plays in the group right now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Leader,
    /// Raft still calls this replica leader, but no quorum of voters has answered it
    /// within an election timeout (it is cut off, or the others moved on). It acts as
    /// if there were no leader, like Raft's check-quorum: it takes no client work,
    /// answers no chunk heartbeat and runs no leader task, so clients and chunk servers
    /// go to the replicas that can elect a new leader instead of waiting for it.
    Isolated,
    Follower,
    Candidate,
    Learner,
    Stopped,
}

/// A copy of the Raft state the service needs, in Stoa's own terms.
#[derive(Clone, Debug)]
pub(crate) struct RaftView {
    pub role: Role,
    pub term: u64,
    pub leader: Option<NodeId>,
    pub leader_addr: Option<SocketAddr>,
    pub last_applied: u64,
    /// Every voter and its address.
    pub voters: Vec<(NodeId, Option<SocketAddr>)>,
    /// On the leader: how long ago a quorum last acknowledged it.
    pub quorum_ack_ms: Option<u64>,
    /// On the leader: the last log index each replica is known to hold.
    pub matched: BTreeMap<NodeId, Option<u64>>,
    /// Why Raft stopped, if it stopped on its own (a storage failure).
    pub fatal: Option<String>,
}

/// One replica's Raft: the openraft instance, its store, and what the service asks of it.
pub(crate) struct MetaRaft {
    raft: Raft<TypeConfig>,
    store: Arc<store::Store>,
    log: store::LogStore,
    cluster: Arc<ClusterIdentity>,
    contacts: Arc<Contacts>,
    /// When an AppendEntries from a leader was last accepted.
    heard_leader: Mutex<Option<Instant>>,
    /// When this replica started.
    started: Instant,
    tuning: Tuning,
    /// Fires when the store has been closed, after shutdown.
    closed: Mutex<Option<tokio::sync::oneshot::Receiver<()>>>,
}

fn raft_config(t: &Tuning) -> Result<Config, MetadError> {
    let config = Config {
        cluster_name: "stoa-meta".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_timeout_min_ms,
        election_timeout_max: t.election_timeout_max_ms,
        install_snapshot_timeout: 5_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_every_entries),
        max_in_snapshot_log_to_keep: t.entries_kept_after_snapshot,
        // Chunks ride in the frame head, which is limited to 16 MiB.
        snapshot_max_chunk_size: 4 * 1024 * 1024,
        ..Default::default()
    };
    config.validate().map_err(|e| MetadError::Raft(format!("raft config: {e}")))
}

fn parse_addr(node: &BasicNode) -> Option<SocketAddr> {
    node.addr.parse().ok()
}

fn not_leader(f: ForwardToLeader<u64, BasicNode>) -> FsError {
    FsError::NotLeader {
        leader: f.leader_id.map(NodeId),
        addr: f.leader_node.as_ref().and_then(parse_addr),
    }
}

fn membership_err(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> FsError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(f),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            FsError::Invalid(format!("membership change refused: {e}"))
        }
        other => unavailable(other),
    }
}

/// Any other Raft refusal (no quorum, shutting down): retry later or elsewhere.
fn unavailable<E: std::error::Error>(e: RaftError<u64, E>) -> FsError {
    match e {
        RaftError::Fatal(e) => FsError::Unavailable(format!("meta replica is stopping: {e}")),
        RaftError::APIError(e) => FsError::Unavailable(e.to_string()),
    }
}

impl MetaRaft {
    /// Opens `<data_dir>/meta.redb` and starts Raft on it. Nothing is sent until peers
    /// call in or this replica's election timer fires.
    pub async fn start(
        id: NodeId,
        data_dir: &Path,
        pool: Pool,
        cluster: Arc<ClusterIdentity>,
        tuning: Tuning,
    ) -> Result<MetaRaft, MetadError> {
        let config = Arc::new(raft_config(&tuning)?);
        let path = data_dir.join("meta.redb");
        let names: Vec<&'static str> = stoa_meta::Table::ALL.iter().map(|t| t.name()).collect();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        let dir = data_dir.to_path_buf();
        let (store, log, snapshots) = tokio::task::spawn_blocking(move || {
            let store = Arc::new(store::Store::open(&path, &names, closed_tx)?);
            let log = store::LogStore::open(store.clone(), &dir.join("raft-log"))?;
            let snapshots = snapshot::SnapshotDir::new(&dir).map_err(|e| MetadError::Store {
                path: dir.join("snapshots"),
                detail: e.to_string(),
            })?;
            Ok::<_, MetadError>((store, log, snapshots))
        })
        .await
        .map_err(|e| MetadError::Raft(format!("open store task: {e}")))??;
        let contacts = Arc::new(Contacts::default());
        let net = Network { id: id.0, pool, cluster: cluster.clone(), contacts: contacts.clone() };
        let sm = sm::StateMachine::new(store.clone(), Arc::new(snapshots), cluster.clone());
        let raft = Raft::new(id.0, config, net, log.clone(), sm)
            .await
            .map_err(|e| MetadError::Raft(format!("start: {e}")))?;
        Ok(MetaRaft {
            raft,
            store,
            log,
            cluster,
            contacts,
            heard_leader: Mutex::new(None),
            started: Instant::now(),
            tuning,
            closed: Mutex::new(Some(closed)),
        })
    }

    /// Forms the group from `peers` if this replica's store is new; a replica that has
    /// voted or logged before is already part of a group and is left alone.
    pub async fn initialize(&self, peers: &[(NodeId, SocketAddr)]) -> Result<(), MetadError> {
        if self.store.has_voted()? || !self.log.is_empty() {
            return Ok(());
        }
        let members: BTreeMap<u64, BasicNode> =
            peers.iter().map(|(id, addr)| (id.0, BasicNode::new(addr.to_string()))).collect();
        match self.raft.initialize(members).await {
            Ok(()) => {
                tracing::info!("initialized a new meta group of {} replicas", peers.len());
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(MetadError::Raft(format!("initialize: {e}"))),
        }
    }

    /// Replicates `cmd` and returns the state machine's answer. Only the leader accepts;
    /// elsewhere this is `NotLeader` with the leader, if known. After a `NotLeader` of a
    /// leader that lost its place ([`MetaRaft::while_leading`]) the entry may still be
    /// committed by the next leader; a retried call is answered once (requests are
    /// deduplicated).
    pub async fn propose(&self, cmd: Command) -> Result<MetaResponse, FsError> {
        match self.while_leading(self.raft.client_write(cmd)).await? {
            Ok(resp) => resp.data,
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(not_leader(f)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Waits until this replica, as leader, has applied everything committed before the
    /// call, so that a read afterwards is linearizable: at once under the leader's lease
    /// ([`MetaRaft::lease_index`]), otherwise after a quorum confirmed that this replica
    /// still leads (Raft ReadIndex).
    pub async fn linearize(&self) -> Result<(), FsError> {
        if let Some(index) = self.lease_index() {
            let wait = self.raft.wait(None);
            let applied = wait.applied_index_at_least(Some(index), "lease read");
            return match self.while_leading(applied).await? {
                Ok(_) => Ok(()),
                Err(e) => Err(FsError::Unavailable(format!("waiting to apply: {e}"))),
            };
        }
        match self.while_leading(self.raft.ensure_linearizable()).await? {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(not_leader(f)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// On the leader, while its lease holds: the commit index a linearizable read must
    /// wait for, with no round to the followers.
    ///
    /// A follower that accepted an AppendEntries refuses to vote for anyone else for
    /// `election_timeout_max` after it took it, and starts no election of its own before
    /// `election_timeout_min` (openraft's leader lease), and a replica refuses votes for
    /// `election_timeout_max` after it starts ([`MetaRaft::handle`]), since a restart
    /// forgets the lease. So while a quorum of voters (this replica among them) accepted
    /// AppendEntries sent within the last [`MetaRaft::lease`], which is half of
    /// `election_timeout_min`, no other replica can have been elected, and every change
    /// answered to a client was committed by this leader: once this replica has applied
    /// what it knows committed, in its own term (its first entry is in it), a read sees
    /// every change answered before. `None`: no such quorum, not leading, or a membership
    /// change under way (two voter sets); the caller asks a quorum instead.
    pub(crate) fn lease_index(&self) -> Option<u64> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow();
        if m.state != ServerState::Leader || m.current_leader != Some(m.id) {
            return None;
        }
        let membership = m.membership_config.membership();
        if membership.get_joint_config().len() != 1 {
            return None;
        }
        let committed = self.log.committed()?;
        if committed.leader_id.term != m.current_term {
            return None;
        }
        let lease = self.lease();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let within = |id: &u64| {
            *id == m.id
                || self.contacts.accepted_since(*id, m.current_term).is_some_and(|d| d < lease)
        };
        (voters.iter().filter(|id| within(id)).count() * 2 > voters.len())
            .then_some(committed.index)
    }

    /// How long after a quorum accepted an AppendEntries sent at some instant the leader
    /// still reads under its lease: half of the shortest election timeout, for any drift
    /// between the replicas' clocks.
    pub(crate) fn lease(&self) -> Duration {
        Duration::from_millis(self.tuning.election_timeout_min_ms / 2)
    }

    /// On the leader: the commit index a linearizable read must wait for, after a quorum
    /// confirmed that this replica still leads (Raft ReadIndex). Unlike [`linearize`]
    /// it does not wait for this replica to apply it: the asking follower waits for its
    /// own state machine instead.
    ///
    /// [`linearize`]: MetaRaft::linearize
    pub async fn read_index(&self) -> Result<u64, FsError> {
        if let Some(index) = self.lease_index() {
            return Ok(index);
        }
        match self.while_leading(self.raft.get_read_log_id()).await? {
            Ok((read, _applied)) => Ok(read.map_or(0, |l| l.index)),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => Err(not_leader(f)),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Runs `work`, a call only a leader answers, and gives it up with `NotLeader` once
    /// this replica no longer leads the term it began in, in openraft's view or in ours
    /// ([`Role::Isolated`]: no quorum answered it lately). Openraft answers such a call
    /// when its entry is committed or overwritten, or when a quorum answers; a leader cut
    /// off one way still counts itself leader until the cut heals, and its callers waited
    /// for their call timeout (fault runs: a 3 s stall after each meta leader partition).
    async fn while_leading<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> Result<T, FsError> {
        let term = self.raft.metrics().borrow().current_term;
        self.unless(work, move |view| view.role != Role::Leader || view.term != term).await
    }

    /// Runs `work` until it ends, or until this replica's view, checked every
    /// [`LEADING_RECHECK`], shows `lost`: then `NotLeader`, with the leader this replica
    /// knows, so that the caller retries there.
    pub async fn unless<T>(
        &self,
        work: impl std::future::Future<Output = T>,
        lost: impl Fn(&RaftView) -> bool,
    ) -> Result<T, FsError> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                () = tokio::time::sleep(LEADING_RECHECK) => {
                    let view = self.view();
                    if lost(&view) {
                        return Err(FsError::NotLeader { leader: view.leader, addr: view.leader_addr });
                    }
                }
            }
        }
    }

    /// Waits until this replica has applied log index `index`; a replica that cannot in
    /// `timeout` (it lags far behind) answers `Unavailable`, so the caller tries another.
    pub async fn wait_applied(&self, index: u64, timeout: Duration) -> Result<(), FsError> {
        if self.raft.metrics().borrow().last_applied.map_or(0, |l| l.index) >= index {
            return Ok(());
        }
        self.raft
            .wait(Some(timeout))
            .applied_index_at_least(Some(index), "read index")
            .await
            .map(|_| ())
            .map_err(|e| {
                FsError::Unavailable(format!("replica has not applied index {index}: {e}"))
            })
    }

    /// Adds replica `id` at `addr` as a learner, waits until it has caught up (from the
    /// log, or a snapshot when the log was compacted), then makes it a voter.
    pub async fn add_replica(&self, id: NodeId, addr: SocketAddr) -> Result<(), FsError> {
        let node = BasicNode::new(addr.to_string());
        self.raft.add_learner(id.0, node, true).await.map_err(membership_err)?;
        let voters: BTreeSet<u64> = self.view().voters.iter().map(|(v, _)| v.0).collect();
        if voters.contains(&id.0) {
            return Ok(());
        }
        let change = openraft::ChangeMembers::AddVoterIds([id.0].into_iter().collect());
        self.raft.change_membership(change, false).await.map_err(membership_err)?;
        Ok(())
    }

    /// Removes replica `id` from the voters (and drops it as a learner).
    pub async fn remove_replica(&self, id: NodeId) -> Result<(), FsError> {
        let voters: BTreeSet<u64> = self.view().voters.iter().map(|(v, _)| v.0).collect();
        if !voters.contains(&id.0) {
            return Err(FsError::NotFound);
        }
        if voters.len() == 1 {
            return Err(FsError::Invalid("cannot remove the last meta replica".into()));
        }
        let change = openraft::ChangeMembers::RemoveVoters([id.0].into_iter().collect());
        self.raft.change_membership(change, false).await.map_err(membership_err)?;
        Ok(())
    }

    /// How long the leader keeps a session without a renewal.
    pub fn session_lease(&self) -> Duration {
        Duration::from_millis(self.tuning.session_lease_ms)
    }

    /// Runs `f` on a consistent read-only view of this replica's state machine, on the
    /// blocking pool.
    pub async fn read<T, F>(&self, f: F) -> Result<T, FsError>
    where
        T: Send + 'static,
        F: FnOnce(&SmReader) -> Result<T, FsError> + Send + 'static,
    {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || {
            let txn = store.db.begin_read().map_err(|e| FsError::Io(format!("meta store: {e}")))?;
            let kv = SmReader::open(&txn).map_err(|e| FsError::Io(format!("meta store: {e}")))?;
            f(&kv)
        })
        .await
        .map_err(|e| FsError::Io(format!("meta read task: {e}")))?
    }

    /// The current Raft state.
    pub fn view(&self) -> RaftView {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let addr_of = |id: u64| membership.get_node(&id).and_then(parse_addr);
        let mut role = match m.state {
            ServerState::Leader => Role::Leader,
            ServerState::Follower => Role::Follower,
            ServerState::Candidate => Role::Candidate,
            ServerState::Learner => Role::Learner,
            ServerState::Shutdown => Role::Stopped,
        };
        let mut leader = m.current_leader;
        if role == Role::Leader && !self.quorum_answers(m.id, &voters) {
            role = Role::Isolated;
            leader = None;
        }
        RaftView {
            role,
            term: m.current_term,
            leader: leader.map(NodeId),
            leader_addr: leader.and_then(addr_of),
            last_applied: m.last_applied.map(|l| l.index).unwrap_or(0),
            voters: voters.iter().map(|&id| (NodeId(id), addr_of(id))).collect(),
            quorum_ack_ms: m.millis_since_quorum_ack,
            matched: m
                .replication
                .as_ref()
                .map(|r| r.iter().map(|(id, l)| (NodeId(*id), l.map(|l| l.index))).collect())
                .unwrap_or_default(),
            fatal: m.running_state.as_ref().err().map(|e| e.to_string()),
        }
    }

    /// The last log index covered by a snapshot, and the last one purged from the log.
    #[cfg(test)]
    pub fn compaction(&self) -> (Option<u64>, Option<u64>) {
        let m = self.raft.metrics().borrow().clone();
        (m.snapshot.map(|l| l.index), m.purged.map(|l| l.index))
    }

    /// A receiver that wakes on every change of the Raft state.
    pub fn subscribe(&self) -> RaftWatch {
        RaftWatch { rx: self.raft.metrics() }
    }

    /// Whether a majority of `voters` (this replica, `me`, and peers that answered one
    /// of its Raft calls within the election timeout) stands behind this replica. Our
    /// own clock of answers, not openraft's metrics, which are only refreshed when its
    /// core wakes up.
    fn quorum_answers(&self, me: u64, voters: &BTreeSet<u64>) -> bool {
        let limit = self.election_timeout();
        let answered = voters
            .iter()
            .filter(|&&id| id == me || self.contacts.since(id).is_some_and(|d| d < limit))
            .count();
        answered * 2 > voters.len()
    }

    /// How long ago `peer` last answered a Raft call from this replica.
    pub fn peer_contact(&self, peer: NodeId) -> Option<Duration> {
        self.contacts.since(peer.0)
    }

    /// Whether this replica has heard from a leader within the election timeout.
    pub fn hears_leader(&self) -> bool {
        let limit = Duration::from_millis(self.tuning.election_timeout_max_ms);
        self.heard_leader.lock().expect("heard lock poisoned").is_some_and(|t| t.elapsed() < limit)
    }

    /// The longest a healthy leader goes without a quorum acknowledging it.
    pub fn election_timeout(&self) -> Duration {
        Duration::from_millis(self.tuning.election_timeout_max_ms)
    }

    /// Unwraps a peer's message, refusing one from another cluster.
    fn open<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, FsError> {
        let env: Envelope<T> = codec::decode(bytes)
            .map_err(|e| FsError::Protocol(format!("bad raft message: {e}")))?;
        if let (Some(ours), Some(theirs)) = (self.cluster.get(), env.cluster) {
            if ours != theirs {
                tracing::error!(
                    "REFUSED a Raft message from replica {}: it belongs to cluster {theirs}, \
                     this replica to cluster {ours}; check the peer list and data directories",
                    env.from
                );
                return Err(FsError::WrongCluster {
                    expected: ours.to_string(),
                    got: theirs.to_string(),
                });
            }
        }
        Ok(env.msg)
    }

    /// Serves one Raft message from a peer; the answer is the encoded openraft result.
    pub async fn handle(&self, req: RaftRequest) -> Result<Vec<u8>, FsError> {
        let encoded = match req {
            RaftRequest::AppendEntries(bytes) => {
                let result = self.raft.append_entries(self.open(&bytes)?).await;
                if matches!(result, Ok(ref r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_)))
                {
                    *self.heard_leader.lock().expect("heard lock poisoned") = Some(Instant::now());
                }
                codec::encode(&result)
            }
            RaftRequest::Vote(bytes) => {
                let vote = self.open(&bytes)?;
                // A restarted replica has forgotten the lease it gave the leader it knew
                // (see `lease_index`): it votes only once that lease would have run out.
                let lease_over = self.started + self.election_timeout();
                tokio::time::sleep_until(lease_over.into()).await;
                codec::encode(&self.raft.vote(vote).await)
            }
            RaftRequest::InstallSnapshot(bytes) => {
                codec::encode(&self.raft.install_snapshot(self.open(&bytes)?).await)
            }
        };
        encoded.map_err(FsError::Protocol)
    }

    /// Stops Raft. The store closes once openraft's tasks have let go of it.
    pub async fn shutdown(&self) {
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("raft shutdown: {e}");
        }
    }

    /// A receiver that fires once the store has been closed: after [`MetaRaft::shutdown`],
    /// when the last request and openraft task let go of it.
    pub fn take_closed(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.closed.lock().expect("closed lock poisoned").take()
    }
}

/// Wakes on every change of the Raft state.
pub(crate) struct RaftWatch {
    rx: tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, BasicNode>>,
}

impl RaftWatch {
    /// Waits for the next change; `false` once Raft is gone.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};
    use openraft::StorageError;
    use stoa_types::ClusterId;

    struct Builder;

    impl StoreBuilder<TypeConfig, store::LogStore, sm::StateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, store::LogStore, sm::StateMachine), StorageError<u64>>
        {
            let dir = tempfile::tempdir().unwrap();
            let names: Vec<&'static str> = stoa_meta::Table::ALL.iter().map(|t| t.name()).collect();
            let (tx, _rx) = tokio::sync::oneshot::channel();
            let store =
                Arc::new(store::Store::open(&dir.path().join("meta.redb"), &names, tx).unwrap());
            let snapshots = Arc::new(snapshot::SnapshotDir::new(dir.path()).unwrap());
            let cluster = Arc::new(ClusterIdentity::load(dir.path()).unwrap());
            let log = store::LogStore::open(store.clone(), &dir.path().join("raft-log")).unwrap();
            Ok((dir, log, sm::StateMachine::new(store, snapshots, cluster)))
        }
    }

    #[test]
    fn the_segment_log_and_redb_store_pass_the_openraft_storage_suite() {
        Suite::test_all(Builder).unwrap();
    }

    async fn lone_replica(dir: &Path) -> MetaRaft {
        let cluster = Arc::new(ClusterIdentity::load(dir).unwrap());
        cluster.learn(ClusterId(1)).unwrap();
        MetaRaft::start(NodeId(1), dir, Pool::new(), cluster, Tuning::default()).await.unwrap()
    }

    fn vote_from(cluster: Option<ClusterId>) -> RaftRequest {
        let vote = openraft::raft::VoteRequest::new(openraft::Vote::new(1, 2), None);
        let env = Envelope { cluster, from: 2, msg: vote };
        RaftRequest::Vote(codec::encode(&env).unwrap())
    }

    #[tokio::test]
    async fn a_replica_of_another_cluster_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let raft = lone_replica(dir.path()).await;
        let err = raft.handle(vote_from(Some(ClusterId(2)))).await.unwrap_err();
        assert!(matches!(err, FsError::WrongCluster { .. }), "{err:?}");
        // Same cluster, or a new replica that does not know its cluster yet: served.
        raft.handle(vote_from(Some(ClusterId(1)))).await.unwrap();
        raft.handle(vote_from(None)).await.unwrap();
        raft.shutdown().await;
    }

    #[tokio::test]
    async fn a_replica_votes_only_once_a_lease_it_may_have_given_before_it_started_ran_out() {
        let dir = tempfile::tempdir().unwrap();
        let raft = lone_replica(dir.path()).await;
        raft.handle(vote_from(None)).await.unwrap();
        assert!(raft.started.elapsed() >= raft.election_timeout());
        raft.shutdown().await;
    }

    #[tokio::test]
    async fn garbage_instead_of_a_raft_message_is_a_protocol_error() {
        let dir = tempfile::tempdir().unwrap();
        let raft = lone_replica(dir.path()).await;
        let err = raft.handle(RaftRequest::AppendEntries(vec![0xff; 7])).await.unwrap_err();
        assert!(matches!(err, FsError::Protocol(_)), "{err:?}");
        raft.shutdown().await;
    }
}
