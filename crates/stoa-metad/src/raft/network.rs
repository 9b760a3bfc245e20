//! Raft messages between replicas, carried as `Request::Raft` over the ordinary Stoa RPC
//! connections. Each message travels in an [`Envelope`] naming the sender's cluster, so a
//! replica of another cluster is refused instead of being merged into this one.

use super::codec::{decode, encode};
use super::TypeConfig;
use bytes::Bytes;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, BasicNode, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_net::Pool;
use stoa_proto::{RaftRequest, Request, Response};
use stoa_types::{ClusterId, FsError};

use crate::datadir::ClusterIdentity;

/// What one replica sends another: the message and who sends it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Envelope<T> {
    /// The sender's cluster, once it knows it.
    pub cluster: Option<ClusterId>,
    pub from: u64,
    pub msg: T,
}

/// When each peer last answered a Raft call: the leader talks to every voter at least
/// every heartbeat, so this tells which voters are up without extra traffic. And, for
/// the leader's lease (`MetaRaft::lease_index`), when the newest AppendEntries each peer
/// accepted was sent, and in which term.
#[derive(Debug, Default)]
pub(crate) struct Contacts {
    last_ok: Mutex<HashMap<u64, Instant>>,
    accepted: Mutex<HashMap<u64, (u64, Instant)>>,
}

impl Contacts {
    fn touch(&self, peer: u64) {
        self.last_ok.lock().expect("contacts lock poisoned").insert(peer, Instant::now());
    }

    /// How long ago `peer` last answered, if it ever did.
    pub fn since(&self, peer: u64) -> Option<Duration> {
        self.last_ok.lock().expect("contacts lock poisoned").get(&peer).map(|t| t.elapsed())
    }

    /// Notes that `peer` accepted an AppendEntries of this replica as leader of `term`,
    /// sent at `sent`: it took it after `sent`, so it refuses to vote for another
    /// replica until an election timeout after that.
    fn accepted(&self, peer: u64, term: u64, sent: Instant) {
        let mut accepted = self.accepted.lock().expect("contacts lock poisoned");
        let newer = accepted.get(&peer).is_none_or(|&(t, at)| (t, at) < (term, sent));
        if newer {
            accepted.insert(peer, (term, sent));
        }
    }

    /// How long ago the newest AppendEntries of `term` that `peer` accepted was sent.
    pub fn accepted_since(&self, peer: u64, term: u64) -> Option<Duration> {
        let accepted = self.accepted.lock().expect("contacts lock poisoned");
        accepted.get(&peer).filter(|(t, _)| *t == term).map(|(_, sent)| sent.elapsed())
    }
}

/// Makes one [`PeerClient`] per peer for openraft.
#[derive(Clone)]
pub(crate) struct Network {
    pub id: u64,
    pub pool: Pool,
    pub cluster: Arc<ClusterIdentity>,
    pub contacts: Arc<Contacts>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        let addr = node
            .addr
            .parse()
            .map_err(|e| format!("replica {target} has a bad address {:?}: {e}", node.addr));
        PeerClient { net: self.clone(), target, addr }
    }
}

/// Sends Raft messages to one peer.
pub(crate) struct PeerClient {
    net: Network,
    target: u64,
    addr: Result<SocketAddr, String>,
}

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

fn unreachable<E: std::error::Error>(detail: impl ToString) -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error(detail)))
}

fn network<E: std::error::Error>(detail: impl ToString) -> RPCError<u64, BasicNode, E> {
    RPCError::Network(NetworkError::new(&AnyError::error(detail)))
}

impl PeerClient {
    async fn call<Req, Resp, E>(
        &self,
        wrap: fn(Vec<u8>) -> RaftRequest,
        msg: Req,
        option: &RPCOption,
    ) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let addr = *self.addr.as_ref().map_err(unreachable)?;
        let envelope = Envelope { cluster: self.net.cluster.get(), from: self.net.id, msg };
        let bytes = encode(&envelope).map_err(network)?;
        let req = Request::Raft(wrap(bytes));
        // Time out before openraft does (at its hard limit it drops this future), so that
        // the error below forgets the connection: after a partition heals, a connection
        // whose lost packets TCP retransmits on a backed-off timer would otherwise stall
        // every later call to the peer for tens of seconds.
        let body = match self.net.pool.call(addr, &req, Bytes::new(), option.soft_ttl()).await {
            Ok((Response::Raft(body), _)) => body,
            Ok((other, _)) => {
                return Err(network(format!(
                    "replica {} at {addr} answered a Raft call with {other:?}",
                    self.target
                )))
            }
            Err(e @ FsError::WrongCluster { .. }) => {
                tracing::error!(
                    "REFUSED: replica {} at {addr} belongs to another cluster ({e}); check the \
                     peer list and data directories",
                    self.target
                );
                return Err(network(e));
            }
            // Down, partitioned or restarting: openraft backs off before trying again,
            // on a new connection (the old one may lead to a replica that has stopped).
            Err(e) if e.is_retryable() => {
                self.net.pool.forget(addr);
                return Err(unreachable(e));
            }
            Err(e) => return Err(network(e)),
        };
        let result: Result<Resp, RaftError<u64, E>> = decode(&body).map_err(network)?;
        self.net.contacts.touch(self.target);
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, openraft::error::Infallible> {
        let (sent, term) = (Instant::now(), rpc.vote.leader_id().term);
        let answer = self.call(RaftRequest::AppendEntries, rpc, &option).await;
        // Every answer but a higher vote means the peer took this replica's vote, and
        // renewed its lease of it, before it looked at the entries.
        if matches!(answer, Ok(ref a) if !matches!(a, AppendEntriesResponse::HigherVote(_))) {
            self.net.contacts.accepted(self.target, term, sent);
        }
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.call(RaftRequest::InstallSnapshot, rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, openraft::error::Infallible> {
        self.call(RaftRequest::Vote, rpc, &option).await
    }

    fn backoff(&self) -> openraft::network::Backoff {
        // Short enough that a restarted replica rejoins well within a second.
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(200)))
    }
}
