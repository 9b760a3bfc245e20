//! Reading and writing whole frames on a stream; shared by both ends of a connection.

use crate::NetError;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use std::collections::VecDeque;
use std::future::Future;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use stoa_proto::{decode_head, encode_frame, FrameHeader, FrameKind, FRAME_HEADER_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// One decoded frame.
pub(crate) struct Frame<T> {
    pub kind: FrameKind,
    pub id: u64,
    pub head: T,
    pub payload: Bytes,
}

/// Bytes a connection's reader takes from its socket at once. A frame is a fixed
/// header, a head and a payload; read straight from the socket, each was a system call
/// of its own, three for a 4 KiB read's reply, where one buffered read takes a small
/// frame whole. A payload larger than this goes from the socket to its own buffer.
const READ_BUFFER_BYTES: usize = 32 * 1024;

/// The reading side of a connection, buffered for [`read_frame`].
pub(crate) fn frame_reader<R: AsyncRead>(r: R) -> BufReader<R> {
    BufReader::with_capacity(READ_BUFFER_BYTES, r)
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
    // Read into spare capacity: zeroing a 1 MiB buffer first cost as much as a CRC pass.
    let len = header.payload_len as usize;
    let mut payload = BytesMut::with_capacity(len);
    while payload.len() < len {
        let want = len - payload.len();
        let mut rest = (&mut payload).limit(want);
        if r.read_buf(&mut rest).await.map_err(lost)? == 0 {
            return Err(lost(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
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

/// Frames in one batch of the writer task.
const BATCH_BYTES_MAX: usize = 256 * 1024;
/// Payloads above this go from their own buffer to the socket instead of being copied
/// into the batch.
const COPY_BYTES_MAX: usize = 16 * 1024;

/// The sending side of one connection, shared by every task that sends on it.
///
/// A frame is written straight from the sender's thread when nothing waits ahead of it
/// and the socket takes it whole. Otherwise it waits in a bounded queue that one writer
/// task drains, copying small frames into one buffer so that a burst costs one system
/// call. Writing from the sender saves waking the writer: on a 4 KiB read through the
/// mount, that wake-up was one of the three thread switches the client made per call.
///
/// Invariant: a sender writes only while the socket is in `SendState::wr` and the queue
/// is empty, under the state's lock; the writer task writes only with the socket taken
/// out of the state. A frame the socket took in part stays first in the queue, so
/// frames never interleave.
pub(crate) struct Sender {
    inner: Arc<SendShared>,
}

struct SendShared {
    peer: SocketAddr,
    queue_max: usize,
    state: Mutex<SendState>,
    /// The writer has frames, a close or a failure to see.
    work: Notify,
    /// The queue has room again, or the connection failed.
    room: Notify,
}

struct SendState {
    wr: Option<OwnedWriteHalf>,
    queue: VecDeque<Outgoing>,
    /// The last sender is gone: write what is queued, then shut the write side down.
    closing: bool,
    /// Why the connection can send no more.
    failed: Option<String>,
}

impl SendShared {
    fn lock(&self) -> std::sync::MutexGuard<'_, SendState> {
        self.state.lock().expect("send state lock poisoned")
    }

    /// Marks the connection failed: senders get the error, the writer stops.
    fn fail(&self, s: &mut SendState, detail: String) {
        s.failed.get_or_insert(detail);
        s.wr = None;
        s.queue.clear();
        self.work.notify_one();
        self.room.notify_waiters();
    }

    fn lost(&self, detail: &str) -> NetError {
        NetError::Lost { addr: self.peer, detail: detail.to_string() }
    }
}

impl Sender {
    /// A sender on `wr`, and the writer task to spawn with it, which ends with the
    /// error that failed the connection, or `Ok` once the sender is dropped and every
    /// queued frame is written.
    pub fn new(
        wr: OwnedWriteHalf,
        peer: SocketAddr,
        queue_max: usize,
    ) -> (Sender, impl Future<Output = Result<(), NetError>>) {
        let state =
            SendState { wr: Some(wr), queue: VecDeque::new(), closing: false, failed: None };
        let inner = Arc::new(SendShared {
            peer,
            queue_max,
            state: Mutex::new(state),
            work: Notify::new(),
            room: Notify::new(),
        });
        (Sender { inner: inner.clone() }, write_queued(inner))
    }

    /// Sends `out`: written or queued when this returns. Waits while the queue is full
    /// (a peer that takes nothing); fails once the connection has.
    pub async fn send(&self, mut out: Outgoing) -> Result<(), NetError> {
        let inner = &self.inner;
        loop {
            let room = inner.room.notified();
            tokio::pin!(room);
            {
                let mut s = inner.lock();
                if let Some(detail) = &s.failed {
                    return Err(inner.lost(detail));
                }
                if let Some(wr) = s.wr.as_ref().filter(|_| s.queue.is_empty()) {
                    match write_now(wr, &mut out) {
                        Ok(true) => return Ok(()),
                        // The rest goes first in the queue; the writer waits for room.
                        Ok(false) => {}
                        Err(e) => {
                            let detail = format!("write: {e}");
                            inner.fail(&mut s, detail.clone());
                            return Err(inner.lost(&detail));
                        }
                    }
                }
                if s.queue.len() < inner.queue_max {
                    s.queue.push_back(out);
                    inner.work.notify_one();
                    return Ok(());
                }
                room.as_mut().enable();
            }
            room.await;
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        self.inner.lock().closing = true;
        self.inner.work.notify_one();
    }
}

/// Writes as much of `out` as the socket takes without waiting; true if all of it.
fn write_now(wr: &OwnedWriteHalf, out: &mut Outgoing) -> std::io::Result<bool> {
    let n = match wr.try_write_vectored(&[IoSlice::new(&out.header), IoSlice::new(&out.payload)]) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    let from_header = n.min(out.header.len());
    out.header.advance(from_header);
    out.payload.advance(n - from_header);
    Ok(out.header.is_empty() && out.payload.is_empty())
}

/// The writer task: drains the queue whenever senders leave frames in it.
async fn write_queued(inner: Arc<SendShared>) -> Result<(), NetError> {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        inner.work.notified().await;
        loop {
            let (mut wr, batch) = {
                let mut s = inner.lock();
                if let Some(detail) = &s.failed {
                    return Err(inner.lost(detail));
                }
                if s.queue.is_empty() && !s.closing {
                    break;
                }
                let wr = s.wr.take().expect("the socket is at hand while frames wait");
                let (mut batch, mut bytes) = (Vec::new(), 0);
                while bytes < BATCH_BYTES_MAX {
                    let Some(out) = s.queue.pop_front() else { break };
                    bytes += out.header.len() + out.payload.len();
                    batch.push(out);
                }
                inner.room.notify_waiters();
                (wr, batch)
            };
            if batch.is_empty() {
                // Closing, and all is written.
                let _ = wr.shutdown().await;
                return Ok(());
            }
            if let Err(e) = write_batch(&mut wr, batch, &mut buf).await {
                let detail = format!("write: {e}");
                inner.fail(&mut inner.lock(), detail.clone());
                return Err(inner.lost(&detail));
            }
            let mut s = inner.lock();
            if s.failed.is_none() {
                s.wr = Some(wr);
            }
        }
    }
}

async fn write_batch(
    wr: &mut OwnedWriteHalf,
    batch: Vec<Outgoing>,
    buf: &mut BytesMut,
) -> std::io::Result<()> {
    for out in batch {
        buf.extend_from_slice(&out.header);
        if out.payload.len() > COPY_BYTES_MAX {
            wr.write_all(buf).await?;
            buf.clear();
            wr.write_all(&out.payload).await?;
        } else {
            buf.extend_from_slice(&out.payload);
        }
    }
    if !buf.is_empty() {
        wr.write_all(buf).await?;
        buf.clear();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use tokio::net::{TcpListener, TcpStream};

    /// A frame sent after one the socket took only part of waits behind it, even when
    /// the socket has room again: written at once, it would land inside the first.
    #[tokio::test]
    async fn a_frame_never_cuts_into_one_the_socket_took_in_part() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let peer = listener.local_addr().unwrap();
        let stream = TcpStream::connect(peer).await.unwrap();
        let far = listener.accept().await.unwrap().0.into_std().unwrap();
        far.set_nonblocking(false).unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = Vec::new();
            (&far).read_to_end(&mut all).map(|_| all)
        });
        let (_rd, wr) = stream.into_split();
        let (sender, writer) = Sender::new(wr, peer, 16);
        let big = Bytes::from(vec![7u8; 16 << 20]);
        let small = Bytes::from_static(b"small");
        let first = Outgoing::new(FrameKind::Request, 1, &1u32, big.clone(), peer).unwrap();
        let second = Outgoing::new(FrameKind::Request, 2, &2u32, small.clone(), peer).unwrap();
        sender.send(first).await.unwrap();
        // The far side drains the socket meanwhile; the writer task has had no turn on
        // this one-thread runtime, so the rest of the first frame still waits.
        std::thread::sleep(std::time::Duration::from_millis(200));
        sender.send(second).await.unwrap();
        drop(sender);
        writer.await.unwrap();
        let mut got: &[u8] = &reader.join().unwrap().unwrap();
        for (id, payload) in [(1, big), (2, small)] {
            let frame = read_frame::<u32, _>(&mut got, peer).await.unwrap().expect("a frame");
            assert_eq!((frame.id, frame.head), (id, id as u32));
            assert!(frame.payload == payload, "frame {id}: payload differs");
        }
        assert!(got.is_empty(), "{} bytes after the frames", got.len());
    }
}
