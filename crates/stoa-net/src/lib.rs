//! Framed, multiplexed RPC over TCP.
//!
//! ```text
//!  Pool::call(addr, req) -> Conn (one per peer) --frames--> serve() -> Handler::handle
//!                             ^  reader task routes replies by request id  |
//!                             +------------------------------------------- +
//! ```
//!
//! One TCP connection per peer carries any number of concurrent calls; each call has a
//! request id, and replies may come back in any order. A connection that fails fails
//! every call waiting on it, and the pool opens a new one on the next call. Retrying is
//! the caller's decision: only it knows whether a call is idempotent.

mod conn;
mod cut;
mod error;
mod meta_client;
mod server;
mod wire;

pub use conn::{Conn, Pool};
pub use cut::{chunks_to_cut, CUT_BY_INDEX_MAX};
pub use error::NetError;
pub use meta_client::MetaClient;
pub use server::{bind, serve, Handler};

use bytes::Bytes;
use stoa_proto::Reply;

/// A reply and the bulk payload that came with it.
pub type ReplyWithPayload = (Reply, Bytes);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;
    use stoa_proto::{ChunkOp, ChunkRequest, ChunkResponse, Request, Response};
    use stoa_types::{ChainId, ChunkId, FsError, InodeId};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Echoes the payload back; fails reads of chunk index 13.
    struct Echo;

    impl Handler for Echo {
        async fn handle(
            &self,
            req: Request,
            payload: Bytes,
            _: std::net::SocketAddr,
        ) -> (Reply, Bytes) {
            match req {
                Request::Chunk(ChunkRequest { op: ChunkOp::Read { chunk, len, .. }, .. }) => {
                    if chunk.index == 13 {
                        return (Err(FsError::NotFound), Bytes::new());
                    }
                    // Later requests answer sooner, so replies come back out of order.
                    tokio::time::sleep(Duration::from_millis(u64::from(100 - len.min(100)))).await;
                    (Ok(Response::Chunk(ChunkResponse::Data)), payload)
                }
                _ => (Ok(Response::Chunk(ChunkResponse::Done)), payload),
            }
        }
    }

    fn read(index: u64, len: u32) -> Request {
        Request::Chunk(ChunkRequest {
            chain: ChainId(0),
            chain_version: 1,
            op: ChunkOp::Read { chunk: ChunkId { ino: InodeId(1), index }, offset: 0, len },
            deadline_ms: 0,
        })
    }

    /// A peer whose connect hangs (its listen queue is full, so the kernel drops new
    /// handshakes) fails a call within the call's timeout, not the connect timeout's 2 s:
    /// a 1 s probe of a meta leader cut off took 3 s so.
    #[tokio::test]
    async fn a_call_whose_connect_hangs_ends_at_its_timeout() {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(0).unwrap();
        let addr = listener.local_addr().unwrap();
        // Never accepted: these fill the queue, and a connect that waits shows it full.
        let mut queued = Vec::new();
        loop {
            let connect = tokio::net::TcpStream::connect(addr);
            match tokio::time::timeout(Duration::from_millis(300), connect).await {
                Ok(stream) => queued.push(stream.unwrap()),
                Err(_) => break,
            }
            assert!(queued.len() < 64, "the listen queue never filled");
        }
        let started = std::time::Instant::now();
        let answer =
            Pool::new().call(addr, &read(1, 1), Bytes::new(), Duration::from_millis(200)).await;
        assert!(matches!(answer, Err(FsError::Unavailable(_))), "{answer:?}");
        assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
        drop((listener, queued));
    }

    async fn start() -> std::net::SocketAddr {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, Arc::new(Echo)));
        addr
    }

    #[tokio::test]
    async fn concurrent_calls_share_one_connection_and_match_replies() {
        let addr = start().await;
        let pool = Pool::new();
        let mut calls = Vec::new();
        for i in 0..50u32 {
            let pool = pool.clone();
            calls.push(tokio::spawn(async move {
                let payload = Bytes::from(vec![i as u8; (i as usize) * 1000]);
                let (resp, back) = pool
                    .call(addr, &read(1, i), payload.clone(), Duration::from_secs(5))
                    .await
                    .unwrap();
                assert_eq!(resp, Response::Chunk(ChunkResponse::Data));
                assert_eq!(back, payload);
            }));
        }
        for c in calls {
            c.await.unwrap();
        }
        let big = Bytes::from(vec![9u8; 8 * 1024 * 1024]);
        let (_, back) =
            pool.call(addr, &read(2, 100), big.clone(), Duration::from_secs(5)).await.unwrap();
        assert_eq!(back, big);
    }

    /// Frames written straight from the caller and frames queued behind a full socket
    /// (payloads far larger than its buffer, sent at once) never interleave.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn frames_sent_now_and_frames_queued_arrive_whole() {
        let addr = start().await;
        let pool = Pool::new();
        let mut calls = Vec::new();
        for i in 0..64u32 {
            let pool = pool.clone();
            calls.push(tokio::spawn(async move {
                let size = if i % 2 == 0 { 3 << 20 } else { i as usize * 7 };
                let payload = Bytes::from(vec![i as u8; size]);
                let (_, back) = pool
                    .call(addr, &read(1, 100 + i), payload.clone(), Duration::from_secs(20))
                    .await
                    .unwrap();
                assert!(back == payload, "call {i} got {} bytes back", back.len());
            }));
        }
        for c in calls {
            c.await.unwrap();
        }
    }

    #[tokio::test]
    async fn dropping_the_last_handle_closes_the_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let conn = Conn::connect(addr).await.unwrap();
        let (mut peer, _) = listener.accept().await.unwrap();
        let copy = conn.clone();
        drop(conn);
        let mut buf = [0u8; 16];
        let still_open = tokio::time::timeout(Duration::from_millis(300), peer.read(&mut buf));
        assert!(still_open.await.is_err(), "closed while a handle was left");
        drop(copy);
        let n = tokio::time::timeout(Duration::from_secs(5), peer.read(&mut buf))
            .await
            .expect("the connection must close once no handle is left")
            .unwrap();
        assert_eq!(n, 0);
    }

    #[tokio::test]
    async fn errors_from_the_handler_reach_the_caller() {
        let addr = start().await;
        let err = Pool::new().call(addr, &read(13, 0), Bytes::new(), Duration::from_secs(5)).await;
        assert_eq!(err.unwrap_err(), FsError::NotFound);
    }

    #[tokio::test]
    async fn an_unreachable_peer_is_a_retryable_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = Pool::new()
            .call(addr, &read(1, 1), Bytes::new(), Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
    }

    #[tokio::test]
    async fn a_port_in_use_is_a_clear_error() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err().to_string();
        assert!(err.contains(&addr.to_string()) && err.contains("in use"), "{err}");
    }

    #[tokio::test]
    async fn garbage_closes_that_connection_and_the_server_keeps_serving() {
        let addr = start().await;
        let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
        sock.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
        let mut buf = [0u8; 16];
        let n = tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, 0, "server must close a connection that sends garbage");
        let (resp, _) = Pool::new()
            .call(addr, &read(1, 1), Bytes::new(), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(resp, Response::Chunk(ChunkResponse::Data));
    }

    #[tokio::test]
    async fn a_silent_peer_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _hold = tokio::spawn(async move {
            let (_s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(30)).await;
        });
        let err = Pool::new()
            .call(addr, &read(1, 1), Bytes::new(), Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(matches!(err, FsError::Unavailable(ref m) if m.contains("timed out")), "{err:?}");
    }
}
