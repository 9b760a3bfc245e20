//! The open-file state of one inode and its write-behind pipeline.
//!
//! ```text
//!  write() --> WriteBuffer (coalesces per chunk) --full/pushed out/flush--> queue
//!                                                                            |
//!   pump: one write in flight per chunk, so overlapping writes keep order   v
//!   chunk write to the chain head --> CommitWrite(ino, end) on meta --> done, pump again
//!
//!  flush/fsync/close/truncate: push the buffer out, wait until nothing is queued or in
//!  flight, report the first error; fsync then sends Sync for every chunk written.
//! ```
//!
//! Backpressure: a writer waits while its file has `FILE_PENDING_MAX` chunk writes queued
//! or in flight, or while the whole client has `CLIENT_PENDING_BYTES_MAX` of them.

use crate::client::Shared;
use crate::read::Prefetch;
use crate::split::chunk_span;
use crate::write_buffer::{Extent, WriteBuffer};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use stoa_proto::{MetaOp, MetaResponse};
use stoa_types::{Attr, ChunkId, FsError, InodeId, SessionId, SetAttr};
use tokio::sync::Notify;

/// Chunk writes one file may have queued or in flight before its writer waits.
const FILE_PENDING_MAX: usize = 8;
/// Bytes of chunk writes the whole client may have queued or in flight.
pub(crate) const CLIENT_PENDING_BYTES_MAX: usize = 64 << 20;
/// Dirty partial chunks one file buffers before the lowest is sent.
const DIRTY_EXTENTS_MAX: usize = 4;

pub(crate) struct FileState {
    pub ino: InodeId,
    pub(crate) inner: Mutex<FileInner>,
    /// Signalled whenever a chunk write of this file finishes.
    changed: Notify,
    /// Reads and writes share it; truncate takes it alone, so no write lands between
    /// flushing and cutting the chunks.
    pub io_lock: tokio::sync::RwLock<()>,
    /// The session meta knows this client has the file open in, and how many handles
    /// are open in it. Meta hears only of the first open and the last release, and the
    /// lock is held across those calls so that an open and a release never cross.
    pub meta_open: tokio::sync::Mutex<Option<(SessionId, u32)>>,
}

pub(crate) struct FileInner {
    buffer: WriteBuffer,
    /// Extents waiting to be sent, per chunk, in the order they must land.
    queue: BTreeMap<u64, VecDeque<Extent>>,
    /// Chunks with a write in flight.
    inflight: BTreeSet<u64>,
    pending: usize,
    /// The end of the furthest write not yet known to be committed to meta; 0 when the
    /// file has nothing buffered or in flight.
    pub uncommitted_end: u64,
    /// The first error of a background write, reported by the next flush or fsync.
    pub error: Option<FsError>,
    /// Chunks written since the last fsync.
    unsynced: BTreeSet<u64>,
    /// The size meta last reported, if known.
    pub meta_size: Option<u64>,
    pub prefetched: BTreeMap<u64, Arc<Prefetch>>,
    pub opens: u32,
}

impl FileInner {
    pub fn is_idle(&self) -> bool {
        self.buffer.is_empty() && self.pending == 0
    }

    /// Whether any chunk of `span` has data buffered, queued or in flight.
    pub fn is_dirty(&self, span: std::ops::Range<u64>) -> bool {
        self.queue.range(span.clone()).next().is_some()
            || self.inflight.range(span.clone()).next().is_some()
            || self.buffer.has_span(span)
    }

    /// The size to report: meta's, or further if this client wrote past it.
    pub fn size(&self) -> Option<u64> {
        self.meta_size.map(|s| s.max(self.uncommitted_end))
    }
}

impl FileState {
    pub fn new(ino: InodeId, chunk_size: u32) -> FileState {
        FileState {
            ino,
            inner: Mutex::new(FileInner {
                buffer: WriteBuffer::new(chunk_size, DIRTY_EXTENTS_MAX),
                queue: BTreeMap::new(),
                inflight: BTreeSet::new(),
                pending: 0,
                uncommitted_end: 0,
                error: None,
                unsynced: BTreeSet::new(),
                meta_size: None,
                prefetched: BTreeMap::new(),
                opens: 0,
            }),
            changed: Notify::new(),
            io_lock: tokio::sync::RwLock::new(()),
            meta_open: tokio::sync::Mutex::new(None),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, FileInner> {
        self.inner.lock().expect("file state lock poisoned")
    }

    /// Buffers `data` at `offset`; full chunks go out in the background.
    pub async fn write(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        offset: u64,
        data: &[u8],
    ) -> Result<(), FsError> {
        self.wait_for_room(sh).await;
        let _io = self.io_lock.read().await;
        {
            let mut inner = self.lock();
            if let Some(e) = inner.error.clone() {
                return Err(e);
            }
            let end = offset + data.len() as u64;
            let span = chunk_span(offset, end, sh.chunk_size);
            let stale: Vec<u64> = inner.prefetched.range(span).map(|(k, _)| *k).collect();
            for k in stale {
                inner.prefetched.remove(&k);
            }
            inner.uncommitted_end = inner.uncommitted_end.max(end);
            let ready = inner.buffer.write(offset, data);
            for extent in ready {
                enqueue(&mut inner, sh, extent);
            }
        }
        self.pump(sh);
        Ok(())
    }

    /// Waits until this file and the client have room for more chunk writes.
    async fn wait_for_room(&self, sh: &Shared) {
        loop {
            let notified = sh.pending_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let file_full = self.lock().pending >= FILE_PENDING_MAX;
            let client_full = sh.pending_bytes.load(Ordering::Acquire) >= CLIENT_PENDING_BYTES_MAX;
            if !file_full && !client_full {
                return;
            }
            notified.await;
        }
    }

    /// Sends every queued extent whose chunk has no write in flight.
    fn pump(self: &Arc<Self>, sh: &Arc<Shared>) {
        let mut inner = self.lock();
        let ready: Vec<u64> =
            inner.queue.keys().filter(|k| !inner.inflight.contains(k)).copied().collect();
        for index in ready {
            let Some(queue) = inner.queue.get_mut(&index) else { continue };
            let Some(extent) = queue.pop_front() else { continue };
            if queue.is_empty() {
                inner.queue.remove(&index);
            }
            inner.inflight.insert(index);
            let (file, sh) = (self.clone(), sh.clone());
            tokio::spawn(async move { file.send(sh, extent).await });
        }
    }

    /// Writes one extent to its chain and commits the new end to meta.
    async fn send(self: Arc<Self>, sh: Arc<Shared>, extent: Extent) {
        let index = extent.index;
        let end = extent.file_end(sh.chunk_size);
        let len = extent.data.len();
        let chunk = ChunkId { ino: self.ino, index };
        let mut result = sh.io.write(chunk, extent.offset, Bytes::from(extent.data)).await;
        if result.is_ok() {
            result = self.commit(&sh, end).await;
        }
        {
            let mut inner = self.lock();
            inner.inflight.remove(&index);
            inner.pending -= 1;
            match result {
                Ok(()) => {
                    inner.unsynced.insert(index);
                }
                Err(e) => {
                    tracing::warn!("write-behind of {chunk} failed: {e}");
                    inner.error.get_or_insert(e);
                }
            }
            if inner.is_idle() {
                inner.uncommitted_end = 0;
            }
        }
        sh.pending_bytes.fetch_sub(len, Ordering::AcqRel);
        sh.pending_changed.notify_waiters();
        self.changed.notify_waiters();
        self.pump(&sh);
    }

    /// Tells meta that data up to `end` is written: it grows the size and sets mtime.
    async fn commit(&self, sh: &Shared, end: u64) -> Result<(), FsError> {
        let resp = sh.session.call(MetaOp::CommitWrite { ino: self.ino, size: end }).await?;
        let mut inner = self.lock();
        let size = match resp {
            MetaResponse::Attr(attr) => {
                let size = attr.size;
                sh.caps.update_attr(attr);
                size
            }
            _ => end,
        };
        inner.meta_size = Some(inner.meta_size.map_or(size, |s| s.max(size)));
        Ok(())
    }

    /// Sends everything buffered, waits for every write in flight, and reports the first
    /// error since the last flush.
    pub async fn flush(self: &Arc<Self>, sh: &Arc<Shared>) -> Result<(), FsError> {
        {
            let mut inner = self.lock();
            for extent in inner.buffer.take_all() {
                enqueue(&mut inner, sh, extent);
            }
        }
        self.pump(sh);
        self.wait_until(|inner| inner.is_idle()).await;
        self.lock().error.take().map_or(Ok(()), Err)
    }

    /// Sends and waits for the writes to chunks `span` only (before reading them).
    pub async fn flush_span(self: &Arc<Self>, sh: &Arc<Shared>, span: std::ops::Range<u64>) {
        {
            let mut inner = self.lock();
            for extent in inner.buffer.take_span(span.clone()) {
                enqueue(&mut inner, sh, extent);
            }
        }
        self.pump(sh);
        self.wait_until(|inner| {
            inner.queue.range(span.clone()).next().is_none()
                && inner.inflight.range(span.clone()).next().is_none()
        })
        .await;
    }

    /// Flushes, then makes every chunk written since the last fsync durable on every
    /// replica of its chain.
    pub async fn fsync(self: &Arc<Self>, sh: &Arc<Shared>) -> Result<(), FsError> {
        self.flush(sh).await?;
        let indexes = std::mem::take(&mut self.lock().unsynced);
        let chunks: Vec<ChunkId> =
            indexes.iter().map(|&index| ChunkId { ino: self.ino, index }).collect();
        if chunks.is_empty() {
            return Ok(());
        }
        if let Err(e) = sh.io.sync(&chunks).await {
            self.lock().unsynced.extend(indexes);
            return Err(e);
        }
        Ok(())
    }

    /// Cuts the file to the size in `set`: flushes, cuts the chunk data on the chunk
    /// servers (the chunk holding the new end to its offset, every later chunk up to the
    /// old size to nothing), then applies `set` on meta. Data goes first so that a crash
    /// in between leaves zeros past the new end rather than old bytes reappearing.
    pub async fn truncate(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        set: SetAttr,
        old_size: u64,
    ) -> Result<Attr, FsError> {
        let size = set.size.expect("truncate needs a size");
        let _io = self.io_lock.write().await;
        self.flush(sh).await?;
        let old_size = old_size.max(self.lock().size().unwrap_or(0));
        if size < old_size {
            let cs = u64::from(sh.chunk_size);
            if !size.is_multiple_of(cs) {
                let chunk = ChunkId { ino: self.ino, index: size / cs };
                sh.io.truncate(chunk, (size % cs) as u32).await?;
            }
            for index in size.div_ceil(cs)..old_size.div_ceil(cs) {
                sh.io.truncate(ChunkId { ino: self.ino, index }, 0).await?;
            }
        }
        self.lock().prefetched.clear();
        let attr = sh.session.call_attr(MetaOp::SetAttr { ino: self.ino, set }).await?;
        let mut inner = self.lock();
        inner.uncommitted_end = 0;
        inner.meta_size = Some(attr.size);
        Ok(attr)
    }

    async fn wait_until(&self, done: impl Fn(&FileInner) -> bool) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(&self.lock()) {
                return;
            }
            notified.await;
        }
    }
}

fn enqueue(inner: &mut FileInner, sh: &Shared, extent: Extent) {
    sh.pending_bytes.fetch_add(extent.data.len(), Ordering::AcqRel);
    inner.pending += 1;
    inner.queue.entry(extent.index).or_default().push_back(extent);
}
