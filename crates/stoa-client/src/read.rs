//! The read path of one file.
//!
//! ```text
//!  read(offset, len) -> size known? (else GetAttr) -> clip to size
//!     -> note this client's bytes not yet on the chunk servers (buffered, queued, in
//!        flight) in range
//!     -> per chunk piece: a fresh prefetched chunk that covers it, or a chunk read from
//!        any replica -> missing tail bytes are zeros (a hole)
//!     -> lay the noted bytes over it
//!  a handle reading through the mount's pages (file_pages.rs), under a cap: every page here
//!     -> answered from them; else the same, widened to whole pages, and they are kept
//! ```
//!
//! The dirty bytes are noted before the chunk servers are asked, so a write that lands
//! on them meanwhile is in the answer or in the note, never in neither. A read of dirty
//! bytes therefore never waits for the write-behind.
//!
//! Readahead fetches whole chunks ahead of a sequential reader into a small per-file
//! cache. Entries live about a second, the attribute TTL, and one that is shorter than
//! the piece asked for is not trusted: the file may have grown since it was fetched.

use crate::client::Shared;
use crate::file::FileState;
use crate::file_pages::{Cached, PAGE};
use crate::neighbors::{Neighbors, SMALL_MAX};
use crate::split::{chunk_span, split, Piece};
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoa_proto::MetaOp;
use stoa_types::{ChunkId, FsError};
use tokio::sync::watch;

/// How long a prefetched chunk may be served; about the kernel's attribute TTL.
const PREFETCH_FRESH: Duration = Duration::from_secs(1);
/// Bytes the whole client may hold in prefetched chunks.
pub(crate) const PREFETCH_BYTES_MAX: usize = 64 << 20;

/// A chunk being fetched, or fetched, ahead of the reader.
pub(crate) struct Prefetch {
    started: Instant,
    /// `None` until the fetch ends; then the data, or `None` if the fetch failed.
    data: watch::Receiver<Option<Option<Bytes>>>,
    /// The cap it was fetched under, for a chunk fetched before its file was opened
    /// here (neighbors.rs): served only to reads under that same cap.
    cap: Option<u64>,
    _budget: Budget,
}

impl Prefetch {
    /// Starts fetching the first `len` bytes of `chunk`, within the client's prefetch
    /// budget (`None` past it).
    pub fn start(sh: &Arc<Shared>, chunk: ChunkId, len: u32, cap: Option<u64>) -> Option<Self> {
        let _budget = Budget::take(&sh.prefetch_bytes, len as usize)?;
        let (tx, data) = watch::channel(None);
        let sh = sh.clone();
        tokio::spawn(async move {
            let data = sh.io.read(chunk, 0, len).await;
            if let Err(e) = &data {
                tracing::debug!("prefetch of {chunk} failed: {e}");
            }
            let _ = tx.send(Some(data.ok()));
        });
        Some(Prefetch { started: Instant::now(), data, cap, _budget })
    }

    pub fn is_fresh(&self) -> bool {
        self.started.elapsed() < PREFETCH_FRESH
    }

    /// Whether a read under `cap` may be answered from it.
    fn serves(&self, cap: Option<u64>) -> bool {
        self.is_fresh() && self.cap.is_none_or(|own| cap == Some(own))
    }

    async fn wait(&self) -> Option<Bytes> {
        let mut rx = self.data.clone();
        let fetched = rx.wait_for(|v| v.is_some()).await.ok()?;
        fetched.clone().flatten()
    }
}

/// A share of the client's prefetch memory, given back when dropped.
struct Budget {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl Budget {
    fn take(used: &Arc<AtomicUsize>, bytes: usize) -> Option<Budget> {
        let before = used.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > PREFETCH_BYTES_MAX {
            used.fetch_sub(bytes, Ordering::AcqRel);
            return None;
        }
        Some(Budget { used: used.clone(), bytes })
    }
}

impl Drop for Budget {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

impl FileState {
    /// Reads up to `len` bytes at `offset`, never past the end of the file, and starts
    /// fetching chunks `ahead` in the background. Under a cap the size this client
    /// knows is the file's; without one, a read past it asks meta. A handle that reads
    /// through the file's pages (`cached`) is answered from them when they hold it all.
    pub async fn read(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        offset: u64,
        len: u32,
        ahead: std::ops::Range<u64>,
        cached: Cached,
    ) -> Result<Bytes, FsError> {
        let _io = self.io_lock.read().await;
        let cap = match cached {
            Cached::Under { cap, .. } => Some(cap),
            Cached::No => None,
        };
        let capped = cap.is_some();
        let size = self.size_for_read(sh, offset + u64::from(len), capped).await?;
        if offset >= size {
            return Ok(Bytes::new());
        }
        if offset == 0 && capped && size <= SMALL_MAX {
            Neighbors::on_read(sh, self.ino);
        }
        let end = (offset + u64::from(len)).min(size);
        let Cached::Under { cap, keep: true } = cached else {
            return self.read_range(sh, offset, end, ahead, size, cap).await;
        };
        let epoch = {
            let mut inner = self.lock();
            if let Some(hit) = inner.pages.get(cap, offset, (end - offset) as usize) {
                return Ok(hit.into());
            }
            inner.pages.epoch()
        };
        // Whole pages, as far as the file goes, kept if nothing changed meanwhile.
        let (start, wide_end) = (offset / PAGE * PAGE, end.next_multiple_of(PAGE).min(size));
        let data = self.read_range(sh, start, wide_end, ahead, size, Some(cap)).await?;
        self.lock().pages.fill(epoch, cap, start, &data, wide_end == size);
        Ok(data.slice((offset - start) as usize..(end - start) as usize))
    }

    /// The bytes `[offset, end)` of the file, within its `size`: the chunk servers'
    /// with this client's own not yet written there laid over them.
    async fn read_range(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        offset: u64,
        end: u64,
        ahead: std::ops::Range<u64>,
        size: u64,
        cap: Option<u64>,
    ) -> Result<Bytes, FsError> {
        let dirty = {
            let inner = self.lock();
            let dirty = inner.is_dirty(chunk_span(offset, end, sh.chunk_size));
            dirty.then(|| inner.dirty_within(offset, end - offset, sh.chunk_size))
        };
        self.prefetch(sh, ahead, size);
        let mut pieces = Vec::new();
        for piece in split(offset, end - offset, sh.chunk_size) {
            pieces.push((piece, self.read_piece(sh, piece, cap).await?));
        }
        let dirty = dirty.unwrap_or_default();
        // One chunk's bytes, whole and with nothing of this client's over them: answered
        // as they came (most reads of a sequential reader), without a copy.
        if let [(piece, data)] = &pieces[..] {
            if dirty.is_empty() && data.len() >= piece.len as usize {
                return Ok(data.slice(..piece.len as usize));
            }
        }
        let mut out = Vec::with_capacity((end - offset) as usize);
        for (piece, data) in pieces {
            let n = data.len().min(piece.len as usize);
            out.extend_from_slice(&data[..n]);
            // Past what the chunk holds is a hole: zeros.
            out.resize(piece.pos + piece.len as usize, 0);
        }
        for (pos, bytes) in dirty {
            out[pos..pos + bytes.len()].copy_from_slice(&bytes);
        }
        Ok(out.into())
    }

    /// The file size, asking meta when this client knows none, or when the read reaches
    /// past it without a cap (another client may have written further meanwhile). Under
    /// a cap no other client changes the size without recalling it first, and the size
    /// known was learnt from the grant or after it (a grant updates an open file's). A
    /// file state made anew under a cap (the kernel forgot the inode, or its last handle
    /// closed) takes the size cached with the cap, the one `stat` answers.
    async fn size_for_read(
        &self,
        sh: &Shared,
        want_end: u64,
        capped: bool,
    ) -> Result<u64, FsError> {
        if let Some(size) = self.lock().size().filter(|&s| capped || want_end <= s) {
            return Ok(size);
        }
        if let Some((attr, _)) = capped.then(|| sh.caps.cached_attr(self.ino)).flatten() {
            let mut inner = self.lock();
            inner.learn_cached(&attr);
            return Ok(inner.size_of(&attr));
        }
        let attr = sh.session.call_attr(MetaOp::GetAttr { ino: self.ino }).await?;
        let mut inner = self.lock();
        inner.learn(&attr);
        Ok(inner.size_of(&attr))
    }

    async fn read_piece(
        &self,
        sh: &Shared,
        piece: Piece,
        cap: Option<u64>,
    ) -> Result<Bytes, FsError> {
        let cached = self.lock().prefetched.get(&piece.index).cloned();
        if let Some(prefetch) = cached.filter(|p| p.serves(cap)) {
            let (start, end) = (piece.offset as usize, (piece.offset + piece.len) as usize);
            if let Some(data) = prefetch.wait().await.filter(|d| d.len() >= end) {
                return Ok(data.slice(start..end));
            }
        }
        let chunk = ChunkId { ino: self.ino, index: piece.index };
        sh.io.read(chunk, piece.offset, piece.len).await
    }

    /// Starts fetching the chunks of `ahead` that lie inside the file and are neither
    /// cached nor dirty, within the client's prefetch budget.
    fn prefetch(self: &Arc<Self>, sh: &Arc<Shared>, ahead: std::ops::Range<u64>, size: u64) {
        if ahead.is_empty() {
            return;
        }
        let cs = u64::from(sh.chunk_size);
        let mut inner = self.lock();
        inner.prefetched.retain(|&index, p| index >= ahead.start && p.is_fresh());
        for index in ahead {
            let start = index * cs;
            if start >= size {
                break;
            }
            if inner.prefetched.contains_key(&index) || inner.is_dirty(index..index + 1) {
                continue;
            }
            let len = (size - start).min(cs) as u32;
            let chunk = ChunkId { ino: self.ino, index };
            let Some(entry) = Prefetch::start(sh, chunk, len, None) else { break };
            inner.prefetched.insert(index, Arc::new(entry));
        }
    }
}
