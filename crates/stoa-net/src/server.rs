//! The serving side: accept connections and run a handler per request.

use crate::wire::{frame_reader, read_frame, Outgoing, Sender};
use crate::NetError;
use bytes::Bytes;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use stoa_proto::{FrameKind, Reply, Request};
use stoa_types::FsError;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// How many requests of one connection may run at once; more wait in the socket.
const IN_FLIGHT_PER_CONN_MAX: usize = 256;

/// What a server does with each request.
pub trait Handler: Send + Sync + 'static {
    fn handle(
        &self,
        req: Request,
        payload: Bytes,
        peer: SocketAddr,
    ) -> impl Future<Output = (Reply, Bytes)> + Send;
}

/// Binds a listening socket, with an error that names the address and the cause (for
/// example "address already in use").
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, NetError> {
    TcpListener::bind(addr).await.map_err(|source| NetError::Bind { addr, source })
}

/// Serves every connection accepted on `listener` until the task is dropped.
pub async fn serve<H: Handler>(listener: TcpListener, handler: Arc<H>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let handler = handler.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_conn(stream, peer, handler).await {
                        tracing::debug!("connection from {peer} ended: {e}");
                    }
                });
            }
            Err(e) => {
                // Usually EMFILE: back off instead of spinning.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
    }
}

async fn serve_conn<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: Arc<H>,
) -> Result<(), NetError> {
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = frame_reader(rd);
    let (sender, writer) = Sender::new(wr, peer, IN_FLIGHT_PER_CONN_MAX);
    let (sender, writer) = (Arc::new(sender), tokio::spawn(writer));
    let slots = Arc::new(Semaphore::new(IN_FLIGHT_PER_CONN_MAX));
    let result = loop {
        let frame = match read_frame::<Request, _>(&mut rd, peer).await {
            Ok(Some(frame)) if frame.kind == FrameKind::Request => frame,
            Ok(Some(_)) => {
                break Err(NetError::Lost { addr: peer, detail: "reply sent to a server".into() })
            }
            Ok(None) => break Ok(()),
            Err(e) => break Err(e),
        };
        let permit = slots.clone().acquire_owned().await.expect("semaphore closed");
        let handler = handler.clone();
        let sender = sender.clone();
        tokio::spawn(async move {
            let (reply, payload) = handler.handle(frame.head, frame.payload, peer).await;
            let out = match Outgoing::new(FrameKind::Reply, frame.id, &reply, payload, peer) {
                Ok(out) => out,
                Err(e) => {
                    let err: Reply = Err(FsError::Protocol(e.to_string()));
                    Outgoing::new(FrameKind::Reply, frame.id, &err, Bytes::new(), peer)
                        .expect("an error reply always encodes")
                }
            };
            let _ = sender.send(out).await;
            drop(permit);
        });
    };
    drop(sender);
    let _ = writer.await;
    result
}
