//! Reading and writing whole frames on a stream; shared by both ends of a connection.

use crate::NetError;
use bytes::{Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use std::net::SocketAddr;
use stoa_proto::{decode_head, encode_frame, FrameHeader, FrameKind, FRAME_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One decoded frame.
pub(crate) struct Frame<T> {
    pub kind: FrameKind,
    pub id: u64,
    pub head: T,
    pub payload: Bytes,
}

/// Reads one frame; `Ok(None)` on a clean end of stream between frames.
pub(crate) async fn read_frame<T: DeserializeOwned, R: AsyncRead + Unpin>(
    r: &mut R,
    peer: SocketAddr,
) -> Result<Option<Frame<T>>, NetError> {
    let lost = |e: std::io::Error| NetError::Lost { addr: peer, detail: e.to_string() };
    let mut raw = [0u8; FRAME_HEADER_LEN];
    match r.read_exact(&mut raw).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(lost(e)),
    }
    let header =
        FrameHeader::parse(&raw).map_err(|source| NetError::Frame { addr: peer, source })?;
    let mut head = vec![0u8; header.head_len as usize];
    r.read_exact(&mut head).await.map_err(lost)?;
    let mut payload = BytesMut::zeroed(header.payload_len as usize);
    r.read_exact(&mut payload).await.map_err(lost)?;
    let head = decode_head(&header, &raw, &head, &payload)
        .map_err(|source| NetError::Frame { addr: peer, source })?;
    Ok(Some(Frame { kind: header.kind, id: header.id, head, payload: payload.freeze() }))
}

/// An encoded frame ready to be written: header and head, then the payload untouched.
pub(crate) struct Outgoing {
    pub header: BytesMut,
    pub payload: Bytes,
}

impl Outgoing {
    pub fn new<T: Serialize>(
        kind: FrameKind,
        id: u64,
        head: &T,
        payload: Bytes,
        peer: SocketAddr,
    ) -> Result<Outgoing, NetError> {
        let header = encode_frame(kind, id, head, &payload)
            .map_err(|source| NetError::Frame { addr: peer, source })?;
        Ok(Outgoing { header, payload })
    }
}

/// Writes frames from `rx` until it closes or the stream fails. Small frames are batched
/// in one buffer so that a burst of calls costs one system call.
pub(crate) async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut rx: tokio::sync::mpsc::Receiver<Outgoing>,
) -> std::io::Result<()> {
    const BATCH_BYTES_MAX: usize = 256 * 1024;
    let mut buf = BytesMut::with_capacity(64 * 1024);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next.take() {
            buf.extend_from_slice(&out.header);
            if out.payload.len() > 16 * 1024 {
                // Large payloads go straight from their buffer to the socket.
                w.write_all(&buf).await?;
                buf.clear();
                w.write_all(&out.payload).await?;
            } else {
                buf.extend_from_slice(&out.payload);
            }
            if buf.len() < BATCH_BYTES_MAX {
                next = rx.try_recv().ok();
            }
        }
        if !buf.is_empty() {
            w.write_all(&buf).await?;
            buf.clear();
        }
        w.flush().await?;
    }
    w.shutdown().await
}
