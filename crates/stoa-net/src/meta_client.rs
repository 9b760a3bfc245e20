//! Calling the meta service with failover. Every meta replica accepts every request (it
//! forwards writes to the leader itself), so a caller sticks to one replica and moves to
//! the next only when that one does not answer or has no leader to forward to.

use crate::Pool;
use bytes::Bytes;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use stoa_proto::{MetaRequest, MetaResponse, Request, Response};
use stoa_types::FsError;

/// How long one call to one replica may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// A caller of the meta service over a list of replica addresses.
#[derive(Clone)]
pub struct MetaClient {
    pool: Pool,
    addrs: std::sync::Arc<Vec<SocketAddr>>,
    current: std::sync::Arc<AtomicUsize>,
    /// How long a call keeps retrying retryable errors before it gives up with them.
    deadline: Duration,
}

impl MetaClient {
    /// A client over `addrs` (at least one). `deadline` bounds the retries of one call:
    /// a leader election takes about a second, so a few seconds ride one out.
    pub fn new(pool: Pool, addrs: Vec<SocketAddr>, deadline: Duration) -> MetaClient {
        assert!(!addrs.is_empty(), "a meta client needs at least one address");
        MetaClient {
            pool,
            addrs: std::sync::Arc::new(addrs),
            current: std::sync::Arc::new(AtomicUsize::new(0)),
            deadline,
        }
    }

    /// The replica addresses this client knows.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// Sends `req` to the current replica, moving on to the next one while the answer is
    /// retryable, until the deadline. Mutations carry a request id, so a retry after a
    /// lost reply is answered with the first result instead of being applied twice.
    pub async fn call(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let started = Instant::now();
        let req = Request::Meta(req);
        let mut backoff = Duration::from_millis(20);
        loop {
            let index = self.current.load(Ordering::Relaxed) % self.addrs.len();
            let addr = self.addrs[index];
            let err = match self.pool.call(addr, &req, Bytes::new(), CALL_TIMEOUT).await {
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
            // Move on unless the replica is alive and merely waiting for an election.
            if !matches!(err, FsError::NotLeader { .. } | FsError::Busy) {
                let _ = self.current.compare_exchange(
                    index,
                    index + 1,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                );
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
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
