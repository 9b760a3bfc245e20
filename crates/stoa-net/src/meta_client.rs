//! Calling the meta service with failover. Every meta replica accepts every request (it
//! forwards writes to the leader itself and serves reads after a ReadIndex), so reads
//! stick to one replica, and mutations go straight to the leader when the client knows
//! it (from a `NotLeader` hint or a session renewal), saving the forwarding hop.
//!
//! Failover is fast: a refused or reset connection moves to the next replica at once,
//! without sleeping, and every call has a short timeout, so a dead or frozen replica
//! costs at most one timeout, never a connect or call timeout per request. A call that
//! may take longer than a second at the leader (a mutation, or a call that may
//! legitimately wait long there) is watched too: a `ReadIndex` every second shows the
//! replica still answers and leads, and the call moves on when one does not come back.

use crate::Pool;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse, Request, Response};
use stoa_types::{FsError, RequestId, SessionId};

/// How long one read may take at one replica before the client tries another. A read is
/// one ReadIndex round and a local lookup; a healthy replica answers in milliseconds.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one mutation may take at one replica: a Raft commit, possibly behind a
/// batch. A retry elsewhere is safe (request ids make it idempotent).
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);
/// No leader known.
const NONE: usize = usize::MAX;
/// A call allowed to wait at one replica longer than this (a mutation, a capability
/// grant waiting for a recall, the events long poll) checks this often that the replica
/// still answers and leads, and moves on when it does not.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a replica that did not answer in time is passed over when the client moves
/// on from another one, unless every replica failed: moving on in a ring otherwise came
/// back to an unreachable old leader during an election, and a call waited for it a
/// second time (a meta leader partition stalled a create 6.5 s so).
const PASS_OVER: Duration = Duration::from_secs(5);

/// A caller of the meta service over a list of replica addresses.
#[derive(Clone)]
pub struct MetaClient {
    pool: Pool,
    addrs: Arc<Vec<SocketAddr>>,
    /// The replica reads go to.
    current: Arc<AtomicUsize>,
    /// The replica believed to lead, where mutations go; `NONE` when unknown.
    leader: Arc<AtomicUsize>,
    /// Per replica, until when it is passed over (it did not answer in time).
    passed_over: Arc<Mutex<Vec<Option<Instant>>>>,
    /// How long a call keeps retrying retryable errors before it gives up with them.
    deadline: Duration,
}

impl MetaClient {
    /// A client over `addrs` (at least one). `deadline` bounds the retries of one call:
    /// a leader election takes about a second, so a few seconds ride one out.
    pub fn new(pool: Pool, addrs: Vec<SocketAddr>, deadline: Duration) -> MetaClient {
        assert!(!addrs.is_empty(), "a meta client needs at least one address");
        // Clients start on different replicas, so that their reads spread.
        let n = addrs.len();
        let start = std::process::id() as usize % n;
        MetaClient {
            pool,
            addrs: Arc::new(addrs),
            current: Arc::new(AtomicUsize::new(start)),
            leader: Arc::new(AtomicUsize::new(NONE)),
            passed_over: Arc::new(Mutex::new(vec![None; n])),
            deadline,
        }
    }

    /// The replica addresses this client knows.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Remembers that the replica at `addr` leads, if it is one of ours.
    pub fn set_leader(&self, addr: SocketAddr) {
        if let Some(i) = self.addrs.iter().position(|a| *a == addr) {
            self.leader.store(i, Ordering::Relaxed);
        }
    }

    /// Sends `req`, moving between replicas while the answer is retryable, until the
    /// deadline. Mutations carry a request id, so a retry after a lost reply is answered
    /// with the first result instead of being applied twice.
    pub async fn call(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let mutation = req.op.is_mutation();
        let timeout = if mutation { WRITE_TIMEOUT } else { READ_TIMEOUT };
        self.call_routed(req, mutation, timeout).await
    }

    /// Sends `req` like [`MetaClient::call`], but to the leader when it is known and with
    /// `timeout` at each replica: for calls only the leader answers that may wait there
    /// (capability grants and the events long poll).
    pub async fn call_leader(
        &self,
        req: MetaRequest,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        self.call_routed(req, true, timeout).await
    }

    async fn call_routed(
        &self,
        req: MetaRequest,
        mutation: bool,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        let started = Instant::now();
        let req = Request::Meta(req);
        let mut backoff = Duration::from_millis(10);
        let mut failed_in_a_row = 0;
        loop {
            let leader = self.leader.load(Ordering::Relaxed);
            let to_leader = mutation && leader != NONE;
            let index = if to_leader { leader } else { self.current.load(Ordering::Relaxed) };
            let addr = self.addrs[index % self.addrs.len()];
            let answer = async {
                let call = self.pool.call(addr, &req, Bytes::new(), timeout);
                // A mutation too: one sent to a leader just cut off is found out by the
                // probe in 2 s rather than at its 3 s timeout.
                if timeout <= PROBE_EVERY {
                    return call.await;
                }
                tokio::select! {
                    answer = call => answer,
                    lost = self.watch(addr) => Err(lost),
                }
            };
            let err = match answer.await {
                Ok((Response::Meta(resp), _)) => return Ok(resp),
                Ok((other, _)) => {
                    return Err(FsError::Protocol(format!("meta at {addr} answered {other:?}")))
                }
                Err(e) if e.is_retryable() => e,
                Err(e) => return Err(e),
            };
            if started.elapsed() + backoff > self.deadline {
                return Err(err);
            }
            tracing::debug!("meta call to {addr} failed ({err}); retrying");
            let sleep = self.learn_from(index, to_leader, &err, &mut failed_in_a_row);
            if sleep {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(100));
            }
        }
    }

    /// Updates where the next attempt goes after `err` from replica `index`; returns
    /// whether to wait before it. Waiting is only useful while the group elects a
    /// leader; a dead replica is skipped at once.
    fn learn_from(
        &self,
        index: usize,
        to_leader: bool,
        err: &FsError,
        failed_in_a_row: &mut usize,
    ) -> bool {
        let unreachable = !matches!(err, FsError::NotLeader { .. } | FsError::Busy);
        if to_leader || unreachable {
            // A replica that cannot be reached leads no more calls either: until a call
            // to the leader failed itself, they all went to a leader cut off (a meta
            // leader partition held a register write 5 s so).
            let _ = self.leader.compare_exchange(index, NONE, Ordering::Relaxed, Ordering::Relaxed);
        }
        match err {
            FsError::NotLeader { addr: Some(addr), .. } if self.addrs.contains(addr) => {
                self.set_leader(*addr);
                // Only mutations use the hint; a read retries where it was, after a pause.
                !to_leader
            }
            FsError::Busy => true,
            // This replica knows no leader it can reach (an election, or it is cut off
            // from the rest): another replica may know one, so move on as from a dead
            // replica rather than waiting here.
            FsError::NotLeader { .. } => self.next_replica(index, failed_in_a_row),
            _ => {
                // Unreachable, timed out, or stopping: drop the connection (it may lead
                // to a frozen peer) and move on.
                let index = index % self.addrs.len();
                self.pool.forget(self.addrs[index]);
                self.passed_over.lock().expect("passed-over lock poisoned")[index] =
                    Some(Instant::now() + PASS_OVER);
                self.next_replica(index, failed_in_a_row)
            }
        }
    }

    /// Moves reads off replica `index` (also after a failed call to the leader: when
    /// reads went to that replica too, the retry must not wait for it a second time), to
    /// the next one not passed over ([`PASS_OVER`]), or the next one if all are; returns
    /// whether to wait first, which is only after every replica failed once in a row.
    fn next_replica(&self, index: usize, failed_in_a_row: &mut usize) -> bool {
        let n = self.addrs.len();
        let next = {
            let now = Instant::now();
            let passed_over = self.passed_over.lock().expect("passed-over lock poisoned");
            (1..n)
                .map(|step| (index + step) % n)
                .find(|&i| passed_over[i].is_none_or(|until| until <= now))
                .unwrap_or((index + 1) % n)
        };
        let _ = self.current.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
        *failed_in_a_row += 1;
        failed_in_a_row.is_multiple_of(self.addrs.len())
    }

    /// Returns once the replica at `addr`, which holds a long call of this client, no
    /// longer answers within [`READ_TIMEOUT`] that it (or the leader it forwards to)
    /// leads: with the error that shows it. Found by the fault tests
    /// (meta-leader-partition): a capability grant sent to a leader just cut off waited
    /// for its whole 15 s timeout, or until the cut healed, while another replica led
    /// within a second.
    async fn watch(&self, addr: SocketAddr) -> FsError {
        let probe =
            MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::ReadIndex };
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            match self.call_one(addr, probe.clone(), READ_TIMEOUT).await {
                Ok(_) => {}
                Err(e) if e.is_retryable() => {
                    tracing::debug!("meta replica {addr} holding a call stopped answering: {e}");
                    return e;
                }
                // Not a sign of a lost leader: keep waiting for the call's own answer.
                Err(_) => {}
            }
        }
    }

    /// Calls one specific replica once, without failover (for status probes).
    pub async fn call_one(
        &self,
        addr: SocketAddr,
        req: MetaRequest,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        match self.pool.call(addr, &Request::Meta(req), Bytes::new(), timeout).await? {
            (Response::Meta(resp), _) => Ok(resp),
            (other, _) => Err(FsError::Protocol(format!("meta at {addr} answered {other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{bind, serve, Handler};
    use std::sync::atomic::AtomicU32;
    use stoa_proto::{MetaOp, Reply};
    use stoa_types::{RequestId, SessionId};

    /// A meta replica that answers every call the same way, or never, and counts calls
    /// and, apart, the probes of watched calls.
    struct Replica {
        answer: Option<Reply>,
        calls: AtomicU32,
        probes: AtomicU32,
    }

    impl Handler for Replica {
        async fn handle(&self, req: Request, _: Bytes, _: SocketAddr) -> (Reply, Bytes) {
            match req {
                Request::Meta(MetaRequest { op: MetaOp::ReadIndex, .. }) => &self.probes,
                _ => &self.calls,
            }
            .fetch_add(1, Ordering::SeqCst);
            match &self.answer {
                Some(reply) => (reply.clone(), Bytes::new()),
                None => std::future::pending().await,
            }
        }
    }

    /// A read of the root's attributes.
    fn getattr() -> MetaRequest {
        let op = MetaOp::GetAttr { ino: stoa_types::InodeId(1) };
        MetaRequest { session: SessionId(0), req_id: RequestId(0), op }
    }

    async fn replica(answer: Option<Reply>) -> (SocketAddr, Arc<Replica>) {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let replica =
            Arc::new(Replica { answer, calls: AtomicU32::new(0), probes: AtomicU32::new(0) });
        tokio::spawn(serve(listener, replica.clone()));
        (addr, replica)
    }

    /// A leader holding a long call (a grant waiting for a recall) that answers the
    /// probes is waited for; one that answers nothing is left for the next replica long
    /// before the call's timeout.
    #[tokio::test]
    async fn a_long_call_waits_for_a_live_leader_and_leaves_a_silent_one() {
        struct Holding;
        impl Handler for Holding {
            async fn handle(&self, req: Request, _: Bytes, _: SocketAddr) -> (Reply, Bytes) {
                if let Request::Meta(MetaRequest { op: MetaOp::ReadIndex, .. }) = req {
                    return (
                        Ok(Response::Meta(MetaResponse::ReadIndex { index: 1 })),
                        Bytes::new(),
                    );
                }
                tokio::time::sleep(Duration::from_millis(3500)).await;
                (Ok(Response::Meta(MetaResponse::Done)), Bytes::new())
            }
        }
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let holding = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Holding)));
        let (silent, _) = replica(None).await;
        let other = MetaResponse::Inodes { first: stoa_types::InodeId(9), count: 1 };
        let (good, good_calls) = replica(Some(Ok(Response::Meta(other.clone())))).await;
        let poll = || MetaRequest {
            session: SessionId(1),
            req_id: RequestId(0),
            op: MetaOp::CapEvents { held: vec![], term: 0, poll: 1 },
        };
        let long = Duration::from_secs(30);
        let client = MetaClient::new(Pool::new(), vec![holding, good], long);
        client.set_leader(holding);
        assert_eq!(client.call_leader(poll(), long).await, Ok(MetaResponse::Done));
        assert_eq!(good_calls.calls.load(Ordering::SeqCst), 0, "left a live leader");
        let client = MetaClient::new(Pool::new(), vec![silent, good], long);
        client.set_leader(silent);
        let moved = tokio::time::timeout(Duration::from_secs(10), client.call_leader(poll(), long));
        assert_eq!(moved.await.expect("waited for the silent leader"), Ok(other));
    }

    /// Found by the fault tests (meta leader isolated): a mutation waited for the
    /// unreachable leader, then for the same replica again as the read replica, and a
    /// replica that knew no leader was asked again and again instead of the next one.
    #[tokio::test]
    async fn a_silent_leader_costs_one_timeout_and_a_leaderless_replica_is_skipped() {
        let (silent, silent_calls) = replica(None).await;
        let (leaderless, _) =
            replica(Some(Err(FsError::NotLeader { leader: None, addr: None }))).await;
        let (good, _) = replica(Some(Ok(Response::Meta(MetaResponse::Done)))).await;
        let client =
            MetaClient::new(Pool::new(), vec![silent, leaderless, good], Duration::from_secs(60));
        client.set_leader(silent);
        // Reads start on the silent replica, whichever replica the pid picked.
        client.current.store(0, Ordering::Relaxed);
        let op = MetaOp::Mkdir {
            parent: stoa_types::InodeId(1),
            name: b"d".to_vec(),
            perm: 0o755,
            uid: 0,
            gid: 0,
        };
        let req = MetaRequest { session: SessionId(1), req_id: RequestId(1), op };
        assert_eq!(client.call(req).await, Ok(MetaResponse::Done));
        assert_eq!(
            silent_calls.calls.load(Ordering::SeqCst),
            1,
            "the silent replica was asked twice"
        );
        // Found out by a probe, before the mutation's own timeout.
        assert_eq!(silent_calls.probes.load(Ordering::SeqCst), 1, "the mutation was not watched");
        // A read skips the replica without a leader at once.
        client.current.store(1, Ordering::Relaxed);
        assert_eq!(client.call(getattr()).await, Ok(MetaResponse::Done));
        assert_eq!(client.current.load(Ordering::Relaxed), 2);
    }

    /// Found by the fault tests (meta leader partition): a replica that did not answer a
    /// read was still the leader calls went to, until one of them failed there too.
    #[tokio::test]
    async fn a_replica_that_did_not_answer_a_read_leads_no_more_calls() {
        let (silent, silent_calls) = replica(None).await;
        let (good, good_calls) = replica(Some(Ok(Response::Meta(MetaResponse::Done)))).await;
        let client = MetaClient::new(Pool::new(), vec![silent, good], Duration::from_secs(60));
        client.set_leader(silent);
        client.current.store(0, Ordering::Relaxed);
        assert_eq!(client.call(getattr()).await, Ok(MetaResponse::Done));
        assert_eq!(silent_calls.calls.load(Ordering::SeqCst), 1);
        let op = MetaOp::CapEvents { held: vec![], term: 0, poll: 1 };
        let poll = MetaRequest { session: SessionId(1), req_id: RequestId(0), op };
        assert_eq!(client.call_leader(poll, Duration::from_secs(30)).await, Ok(MetaResponse::Done));
        assert_eq!(silent_calls.calls.load(Ordering::SeqCst), 1, "sent to the silent leader");
        assert_eq!(good_calls.calls.load(Ordering::SeqCst), 2);
    }

    /// Found by the fault tests (meta leader partition): during the election, a replica
    /// without a leader sent the client on in a ring, back to the unreachable old leader,
    /// which a read waited for a second time.
    #[tokio::test]
    async fn a_replica_that_did_not_answer_is_passed_over_for_a_while() {
        let (leaderless, _) =
            replica(Some(Err(FsError::NotLeader { leader: None, addr: None }))).await;
        let (silent, silent_calls) = replica(None).await;
        let (good, _) = replica(Some(Ok(Response::Meta(MetaResponse::Done)))).await;
        let client =
            MetaClient::new(Pool::new(), vec![leaderless, silent, good], Duration::from_secs(60));
        client.current.store(1, Ordering::Relaxed);
        assert_eq!(client.call(getattr()).await, Ok(MetaResponse::Done));
        assert_eq!(silent_calls.calls.load(Ordering::SeqCst), 1);
        // From the replica without a leader, the next is the silent one: passed over.
        client.current.store(0, Ordering::Relaxed);
        assert_eq!(client.call(getattr()).await, Ok(MetaResponse::Done));
        assert_eq!(silent_calls.calls.load(Ordering::SeqCst), 1, "asked the silent one again");
        assert_eq!(client.current.load(Ordering::Relaxed), 2);
    }
}
