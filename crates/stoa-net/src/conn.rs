//! The calling side: one multiplexed connection per peer, and a pool of them.

use crate::wire::{frame_reader, read_frame, Outgoing, Sender};
use crate::{NetError, ReplyWithPayload};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoa_proto::{FrameKind, Reply, Request, Response};
use stoa_types::FsError;
use tokio::net::TcpStream;
use tokio::sync::oneshot;

/// How long a connection attempt may take before the peer counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// How many frames may wait for the socket before callers wait too.
const SEND_QUEUE_FRAMES: usize = 1024;

type Waiter = oneshot::Sender<Result<ReplyWithPayload, NetError>>;

struct Shared {
    peer: SocketAddr,
    waiting: Mutex<HashMap<u64, Waiter>>,
    dead: AtomicBool,
}

impl Shared {
    /// Fails every waiting call; called once the connection can carry no more replies.
    fn fail_all(&self, detail: &str) {
        self.dead.store(true, Ordering::Release);
        let waiting = std::mem::take(&mut *self.waiting.lock().expect("waiting lock poisoned"));
        for (_, w) in waiting {
            let _ = w.send(Err(NetError::Lost { addr: self.peer, detail: detail.to_string() }));
        }
    }
}

/// One connection to one peer, shared by any number of concurrent callers.
#[derive(Clone)]
pub struct Conn {
    shared: Arc<Shared>,
    sender: Arc<Sender>,
    next_id: Arc<AtomicU64>,
}

impl Conn {
    /// Opens a connection to `peer`.
    pub async fn connect(peer: SocketAddr) -> Result<Conn, NetError> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(peer))
            .await
            .map_err(|_| NetError::Connect {
                addr: peer,
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
            })?
            .map_err(|source| NetError::Connect { addr: peer, source })?;
        stream.set_nodelay(true).map_err(|source| NetError::Connect { addr: peer, source })?;
        let (rd, wr) = stream.into_split();
        let mut rd = frame_reader(rd);
        let shared = Arc::new(Shared {
            peer,
            waiting: Mutex::new(HashMap::new()),
            dead: AtomicBool::new(false),
        });
        let (sender, writer) = Sender::new(wr, peer, SEND_QUEUE_FRAMES);

        let writer_shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = writer.await {
                writer_shared.fail_all(&e.to_string());
            }
        });
        let reader_shared = shared.clone();
        tokio::spawn(async move {
            let detail = loop {
                match read_frame::<Reply, _>(&mut rd, peer).await {
                    Ok(Some(frame)) if frame.kind == FrameKind::Reply => {
                        let waiter = reader_shared
                            .waiting
                            .lock()
                            .expect("waiting lock poisoned")
                            .remove(&frame.id);
                        if let Some(w) = waiter {
                            let _ = w.send(Ok((frame.head, frame.payload)));
                        }
                    }
                    Ok(Some(_)) => break "peer sent a request on a client connection".to_string(),
                    Ok(None) => break "closed by peer".to_string(),
                    Err(e) => break e.to_string(),
                }
            };
            reader_shared.fail_all(&detail);
        });
        Ok(Conn { shared, sender: Arc::new(sender), next_id: Arc::new(AtomicU64::new(1)) })
    }

    /// Whether the connection has failed and can carry no more calls.
    pub fn is_dead(&self) -> bool {
        self.shared.dead.load(Ordering::Acquire)
    }

    /// Sends `req` with `payload` and waits up to `timeout` for the reply.
    pub async fn call(
        &self,
        req: &Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<ReplyWithPayload, NetError> {
        let peer = self.shared.peer;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let out = Outgoing::new(FrameKind::Request, id, req, payload, peer)?;
        let (wtx, wrx) = oneshot::channel();
        self.shared.waiting.lock().expect("waiting lock poisoned").insert(id, wtx);
        let started = tokio::time::Instant::now();
        // The send waits while the writer is stuck on a socket that takes nothing (a peer
        // cut off): it counts against the call's timeout like the wait for the reply.
        let sent = tokio::time::timeout(timeout, self.sender.send(out)).await;
        if self.is_dead() || !matches!(sent, Ok(Ok(()))) {
            self.shared.waiting.lock().expect("waiting lock poisoned").remove(&id);
            return Err(match sent {
                Err(_) => NetError::Timeout { addr: peer, ms: timeout.as_millis() as u64 },
                Ok(_) => NetError::Lost { addr: peer, detail: "connection closed".into() },
            });
        }
        match tokio::time::timeout_at(started + timeout, wrx).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(NetError::Lost { addr: peer, detail: "connection closed".into() }),
            Err(_) => {
                self.shared.waiting.lock().expect("waiting lock poisoned").remove(&id);
                Err(NetError::Timeout { addr: peer, ms: timeout.as_millis() as u64 })
            }
        }
    }
}

/// Connections to many peers, opened on first use and reopened after a failure.
#[derive(Clone, Default)]
pub struct Pool {
    conns: Arc<Mutex<HashMap<SocketAddr, Conn>>>,
    connecting: Arc<Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Pool {
    pub fn new() -> Pool {
        Pool::default()
    }

    fn cached(&self, peer: SocketAddr) -> Option<Conn> {
        let conns = self.conns.lock().expect("pool lock poisoned");
        conns.get(&peer).filter(|c| !c.is_dead()).cloned()
    }

    /// The live connection to `peer`, opening one if needed.
    pub async fn conn(&self, peer: SocketAddr) -> Result<Conn, NetError> {
        if let Some(c) = self.cached(peer) {
            return Ok(c);
        }
        // One connect at a time per peer, so that a burst of callers shares one new
        // connection, while a dead peer's connect timeout delays no other peer.
        let gate =
            self.connecting.lock().expect("pool lock poisoned").entry(peer).or_default().clone();
        let _guard = gate.lock().await;
        if let Some(c) = self.cached(peer) {
            return Ok(c);
        }
        let conn = Conn::connect(peer).await?;
        self.conns.lock().expect("pool lock poisoned").insert(peer, conn.clone());
        Ok(conn)
    }

    /// Drops the connection to `peer`, so that the next call opens a new one.
    pub fn forget(&self, peer: SocketAddr) {
        self.conns.lock().expect("pool lock poisoned").remove(&peer);
    }

    /// Calls `peer` and returns its response, or the error: the peer's own, or
    /// [`FsError::Unavailable`] when no reply came.
    pub async fn call(
        &self,
        peer: SocketAddr,
        req: &Request,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<(Response, Bytes), FsError> {
        // The connect counts against the timeout: a peer cut off made a 1 s probe wait
        // for the 2 s connect timeout, so a held call stayed at a lost meta leader 3 s.
        let started = tokio::time::Instant::now();
        let conn = match tokio::time::timeout(timeout, self.conn(peer)).await {
            Ok(conn) => conn?,
            Err(_) => {
                let ms = timeout.as_millis() as u64;
                return Err(NetError::Timeout { addr: peer, ms }.into());
            }
        };
        match conn.call(req, payload, timeout.saturating_sub(started.elapsed())).await {
            Ok((Ok(resp), payload)) => Ok((resp, payload)),
            Ok((Err(e), _)) => Err(e),
            Err(e) => {
                if matches!(e, NetError::Lost { .. }) {
                    self.forget(peer);
                }
                Err(e.into())
            }
        }
    }
}
