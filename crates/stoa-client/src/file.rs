//! The open-file state of one inode and its write-behind pipeline.
//!
//! ```text
//!  write() --> WriteBuffer (ranges per chunk) --full/many ranges/pushed out/flush--> queue
//!                                           (one extent per chunk; a newer one merges in)
//!   pump: one write in flight per chunk, so overlapping writes keep order   |
//!   chunk write (all ranges of the chunk) to the chain head  <--------------+
//!     --> done: slot free, pump again; end noted for the commit loop
//!   file held exclusively: Commit(ino, end, time) queued (dirops.rs), one CommitWrites
//!   for many files' commits, after the namespace changes queued before it;
//!   else the commit loop: at most one CommitWrite(ino, furthest end) on meta in flight
//!   per file, covering every chunk write that finished before it started
//!
//!  fsync/truncate/recall: push the buffer out, wait until nothing is queued, in flight
//!  or uncommitted, report the first error; fsync then sends Sync for every chunk
//!  written. close (FUSE flush): push the buffer out; wait for the chunk writes only
//!  without an exclusive cap (or when many are pending, or after a failure), never for
//!  the commit, which goes on in the background (see `FileState::close`).
//!  read: bytes still buffered, queued or in flight are laid over what the chunk servers
//!  return, so a read never waits for the write-behind.
//! ```
//!
//! Backpressure: a writer waits while its file has `FILE_PENDING_MAX` chunk writes queued
//! or in flight, or while the whole client has `CLIENT_PENDING_BYTES_MAX` of them.

use crate::caps::Caps;
use crate::client::Shared;
use crate::dirops;
use crate::file_pages::{Cached, PagePool, Pages};
use crate::read::Prefetch;
use crate::split::{chunk_span, split};
use crate::write_buffer::{clip, Batch, Extent, WriteBuffer};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use stoa_proto::{CapMode, Commit, MetaOp, MetaResponse};
use stoa_types::{Attr, ChunkId, FsError, InodeId, SessionId, SetAttr, SetTime, Timestamp};
use tokio::sync::Notify;

/// Chunk writes one file may have queued or in flight before its writer waits.
const FILE_PENDING_MAX: usize = 8;
/// Bytes of chunk writes the whole client may have queued or in flight.
pub(crate) const CLIENT_PENDING_BYTES_MAX: usize = 64 << 20;
/// Chunk writes the whole client may have queued or in flight for a close to return
/// before its own writes are applied (see `FileState::close`).
const CLOSE_AHEAD_WRITES_MAX: usize = 64;
/// How long after a write-behind failure every close waits for its writes again.
const CLOSE_AHEAD_PAUSE_AFTER_FAILURE: Duration = Duration::from_secs(60);
/// Dirty chunks one file buffers before the lowest is sent.
const DIRTY_CHUNKS_MAX: usize = 16;
/// Ranges one dirty chunk collects before it is sent: a chunk write carries them all.
const DIRTY_RANGES_MAX: usize = 256;
/// Dirty bytes one file buffers before the lowest chunks are sent.
const DIRTY_BYTES_MAX: usize = 16 << 20;
/// How long the commit of overwrites of a file held exclusively (only their mtime is
/// new to meta) may be held here ([`HeldTimes`]). A client that dies loses at most this
/// much of the file's mtime, never its data.
const HELD_TIMES_MAX: Duration = Duration::from_secs(1);

/// The states of the files this client has open, is writing, or has claimed: one per
/// inode, so that every operation on a file sees the same buffers, size and openers.
pub(crate) struct Files {
    map: Mutex<FileMap>,
    chunk_size: u32,
    pages: PagePool,
}

#[derive(Default)]
struct FileMap {
    states: HashMap<InodeId, Arc<FileState>>,
    /// First chunks fetched for files that have no state here (neighbors.rs), each
    /// taken by the state made next for its file.
    fetched: HashMap<InodeId, Arc<Prefetch>>,
}

/// The most first chunks [`FileMap::fetched`] holds.
const FETCHED_MAX: usize = 64;

/// A state claimed by an operation that uses it outside a handle (an open until its
/// handle is counted, a truncate); the claim ends when this is dropped.
pub(crate) struct Claim<'a> {
    files: &'a Files,
    pub file: Arc<FileState>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        self.file.lock().claims -= 1;
        self.files.forget_if_unused(self.file.ino);
    }
}

impl Files {
    pub fn new(chunk_size: u32, pages: PagePool) -> Files {
        Files { map: Mutex::new(FileMap::default()), chunk_size, pages }
    }

    fn map(&self) -> MutexGuard<'_, FileMap> {
        self.map.lock().expect("files lock poisoned")
    }

    /// The state of `ino`, made if there is none, claimed until the claim is dropped.
    /// The claim is counted under the map's lock: otherwise a
    /// [`Files::forget_if_unused`] of the same inode in between (a release or commit of
    /// an earlier handle ending) could drop the state from the map while the caller goes
    /// on with it, and the next operation would make another. An open did so: its
    /// handle wrote into a state nobody else found, so a `stat` right after the write
    /// and close answered meta's size, and the kernel kept it (a `write, link, write
    /// through the other name, unlink` loop on `stoa dev` read the file back empty once
    /// in 44,000 rounds).
    pub fn claim(&self, ino: InodeId) -> Claim<'_> {
        let mut map = self.map();
        let FileMap { states, fetched } = &mut *map;
        let file = states.entry(ino).or_insert_with(|| {
            let file = FileState::new(ino, self.chunk_size, self.pages.clone());
            if let Some(first) = fetched.remove(&ino) {
                file.lock().prefetched.insert(0, first);
            }
            Arc::new(file)
        });
        file.lock().claims += 1;
        Claim { files: self, file: file.clone() }
    }

    /// Keeps the first chunk of `ino` that `fetch` starts fetching, for the state made
    /// next for the file (neighbors.rs). Nothing is fetched if the file has a state here
    /// (its reads and writes go through it) or a fetch kept already. Checked and kept
    /// under the map's lock, so that a state made meanwhile cannot miss the fetch: the
    /// state then drops it on every change this client makes to the file.
    pub fn keep_fetched(&self, ino: InodeId, fetch: impl FnOnce() -> Option<Prefetch>) {
        let mut map = self.map();
        map.fetched.retain(|_, first| first.is_fresh());
        if map.states.contains_key(&ino)
            || map.fetched.contains_key(&ino)
            || map.fetched.len() >= FETCHED_MAX
        {
            return;
        }
        if let Some(first) = fetch() {
            map.fetched.insert(ino, Arc::new(first));
        }
    }

    /// The state of `ino` if this client has it open, busy or claimed.
    pub fn get(&self, ino: InodeId) -> Option<Arc<FileState>> {
        self.map().states.get(&ino).cloned()
    }

    /// Every state, by inode.
    pub fn all(&self) -> Vec<Arc<FileState>> {
        let mut files: Vec<Arc<FileState>> = self.map().states.values().cloned().collect();
        files.sort_unstable_by_key(|f| f.ino);
        files
    }

    /// Drops the state of `ino` once no handle or claim uses it and nothing is in flight.
    pub fn forget_if_unused(&self, ino: InodeId) {
        let mut map = self.map();
        let unused = map.states.get(&ino).is_some_and(|f| {
            // A release still on its way to meta keeps the state: a new open must see
            // it, or its Open could cross that Release.
            let released = f.meta_open.try_lock().is_ok_and(|m| m.is_none());
            let inner = f.lock();
            inner.opens == 0 && inner.claims == 0 && inner.is_idle() && released
        });
        if unused {
            map.states.remove(&ino);
        }
    }
}

pub(crate) struct FileState {
    pub ino: InodeId,
    pub(crate) inner: Mutex<FileInner>,
    /// Signalled whenever a chunk write of this file finishes.
    changed: Notify,
    /// Reads and writes share it; truncate takes it alone, so no write lands between
    /// flushing and cutting the chunks.
    pub io_lock: tokio::sync::RwLock<()>,
    /// What meta knows of this client's handles of the file. Meta hears only of the
    /// first open and the last release; the lock is held across an open's call, and a
    /// release is queued under it, so that an open and a release never cross.
    pub meta_open: tokio::sync::Mutex<Option<MetaOpen>>,
    /// Whether the kernel may have put pages of the file in its cache since a direct
    /// write last dropped them (see [`crate::Client::page_cached`]).
    kernel_pages: AtomicBool,
}

/// The session meta knows this client has a file open in, and its handles there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaOpen {
    pub session: SessionId,
    pub handles: u32,
    /// The backlog number of a queued release of the file, sent when no handle comes
    /// back before the batch leaves: an open meanwhile takes it back instead of asking
    /// meta again (a file opened and closed in a loop costs meta nothing).
    pub release: Option<u64>,
    /// The backlog number of the queued change that tells meta of the open (an `Open`,
    /// or the create of a file made open): if it has not left when the last handle
    /// closes, it is taken back, and meta hears of neither the open nor the close.
    pub told: Option<u64>,
}

impl MetaOpen {
    pub fn new(session: SessionId, told: Option<u64>) -> Self {
        MetaOpen { session, handles: 1, release: None, told }
    }
}

/// What an fsync makes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Data, size and times (`fsync`).
    All,
    /// Data and what reading it back needs: the size, not the mtime (`fdatasync`).
    Data,
}

pub(crate) struct FileInner {
    buffer: WriteBuffer,
    /// Extents waiting to be sent, one per chunk (a newer one merges into it).
    queue: BTreeMap<u64, Extent>,
    /// The chunk writes in flight, one per chunk at most.
    inflight: BTreeMap<u64, Batch>,
    /// Queued and in-flight chunk writes.
    pending: usize,
    /// Every extent queued gets the next ticket; per chunk, the oldest ticket its queued
    /// extent and its write in flight hold (an extent merged into a queued one is sent
    /// with it, so the older ticket stands for both). A recall waits for the tickets
    /// issued before it began, not for writes made uncapped while it runs
    /// ([`FileState::flush_recalled`]).
    tickets: u64,
    queued_since: BTreeMap<u64, u64>,
    inflight_since: BTreeMap<u64, u64>,
    /// Every ticket up to this one is written and its size commit answered.
    committed_through: u64,
    /// The furthest end of chunk writes that finished but are not yet committed to meta.
    commit_end: Option<u64>,
    /// Whether a CommitWrite of this file is in flight.
    committing: bool,
    /// The commit-log number of the last size commit queued (dirops.rs, sent in a
    /// `CommitWrites`) and not answered yet.
    batched: Option<u64>,
    /// The commit of overwrites held here, not queued yet ([`HeldTimes`]).
    held_times: Option<HeldTimes>,
    /// The end of the furthest write not yet known to be committed to meta; 0 when the
    /// file has nothing buffered or in flight.
    pub uncommitted_end: u64,
    /// The latest error of a background write, and how many there have been. Every
    /// handle keeps the count it has consumed (an [`ErrorCursor`]; fsync and write
    /// consume, flush and close only report), so an error reaches every handle that was
    /// open when it happened, not only whichever flush came first (like Linux's
    /// errseq_t): no fsync returns success over data that never reached its chain.
    error: Option<FsError>,
    error_seq: u64,
    /// Chunks written since the last fsync, by writes that were not durable.
    unsynced: BTreeSet<u64>,
    /// How many fsyncs of the file are waiting for its writes: while any is, every
    /// chunk write sent is durable ([`ChunkOp::durable`](stoa_proto::ChunkOp::durable)),
    /// so the fsync needs no `Sync` of its own for that chunk.
    syncing: usize,
    /// The size meta last reported, if known.
    pub meta_size: Option<u64>,
    /// The newest inode version meta reported and its size; kept when `meta_size` is
    /// dropped, so an answer meta gave before it (a GetAttr or a grant overtaken by a
    /// commit) is neither taken nor reported: a size once reported never goes back
    /// without a newer version (a truncate), or `tail -f` would start over.
    meta_version: u64,
    newest_size: u64,
    pub prefetched: BTreeMap<u64, Arc<Prefetch>>,
    /// What the handles that read through the mount keep of the file (`file_pages.rs`).
    pub pages: Pages,
    pub opens: u32,
    /// Operations holding this state outside a handle ([`Files::claim`]).
    claims: u32,
    /// The caps generation the oldest data not yet written was buffered under: once the
    /// caps lapse, none of it is sent (it fails with EIO), so a client that was cut off
    /// past its lease never overwrites what another wrote meanwhile.
    dirty_generation: Option<u64>,
    /// Attribute changes with times made while writes from before them were in flight
    /// or committing ([`FileInner::attr_change`]), in order: queued once those writes
    /// are committed and before any later write is sent.
    deferred: Vec<DeferredAttr>,
}

/// The commit of chunk writes of a file held exclusively that left the size meta has as
/// it was: a database's overwrites, each with its fdatasync. Only their mtime is new to
/// meta, and nobody else sees the file before a recall of the cap, which sends it first;
/// so it is held for up to [`HELD_TIMES_MAX`], and the overwrites made meanwhile join it,
/// instead of a Raft entry (three more fdatasyncs on meta) per write. The client answers
/// a stat with the held mtime ([`FileInner::held_mtime`]). An fsync, a flush, a change
/// of times and a truncate send it first.
struct HeldTimes {
    /// The furthest end of the writes it covers; within the size meta has.
    end: u64,
    /// When the last of them finished: the mtime meta is to take.
    at: Timestamp,
    /// The caps generation they were written under.
    generation: u64,
    /// When the first of them was held: the commit is sent [`HELD_TIMES_MAX`] after.
    since: tokio::time::Instant,
}

/// An attribute change made here whose sending waits ([`FileInner::deferred`]).
pub(crate) struct DeferredAttr {
    pub set: SetAttr,
    pub at: Timestamp,
    /// The caps generation it was made under (fenced as the writes are).
    pub generation: u64,
}

/// Where an attribute change (no size) of a file this client holds exclusively is made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum AttrChange {
    /// Here, and queued at once.
    Now,
    /// Here, and queued once the writes before it are committed.
    Deferred,
    /// At meta, after a flush.
    Meta,
}

impl FileInner {
    /// Where an attribute change, with times or not, is made (dirops.rs
    /// `setattr_here`). A size commit sets the mtime to when its writes finished, so
    /// meta must apply the commits of the writes before a change of times before it,
    /// and those of the writes after it after it. A change queued now reaches meta
    /// before any commit queued after it (which waits for it), but a commit queued or
    /// on its way already could be applied after it: then a mode or owner change goes
    /// to meta, as does one behind writes not yet sent. A change of times behind
    /// writes already sent waits here instead, with later writes held back: `tar`,
    /// `cp -a` and `rsync` set the times of each file right after closing it, and
    /// the close does not wait for its writes.
    pub fn attr_change(&self, times: bool) -> AttrChange {
        let unsent = !self.buffer.is_empty() || !self.queue.is_empty();
        if !self.deferred.is_empty() || (times && !self.is_idle()) {
            return match unsent {
                true => AttrChange::Meta,
                false => AttrChange::Deferred,
            };
        }
        match self.commit_pending() {
            true => AttrChange::Meta,
            false => AttrChange::Now,
        }
    }

    /// Holds back a change [`FileInner::attr_change`] deferred.
    pub fn defer(&mut self, change: DeferredAttr) {
        self.deferred.push(change);
    }

    /// Takes `attr`, the answer to a size commit sent at epoch `sent`, into the cap's
    /// cache and then the file, under the file's lock: a grant of the file stored
    /// meanwhile, older, is then either replaced by it in the cache or refused there,
    /// never answered from the cache after the file knew better.
    pub(crate) fn committed(&mut self, caps: &Caps, attr: Attr, sent: u64) {
        caps.update_attr(self.with_deferred(attr.clone()), sent);
        self.learn(&attr);
    }

    /// `attr`, a commit's answer, with the deferred changes on top, as meta will have
    /// it once they are applied (a version each): the cache keeps what this client made.
    pub fn with_deferred(&self, mut attr: Attr) -> Attr {
        for d in &self.deferred {
            d.set.apply(&mut attr, d.at);
            attr.version += 1;
        }
        attr
    }

    /// Drops what this client cached of the file under a cap (readahead, its pages, the
    /// size meta reported): the cap is gone.
    pub fn drop_cap_cache(&mut self) {
        self.prefetched.clear();
        self.pages.clear();
        self.meta_size = None;
    }

    /// Records a write-behind (or commit) failure for every handle to see. The pages
    /// go: they may hold bytes that never reached the chunk servers.
    pub(crate) fn fail(&mut self, e: FsError) {
        self.pages.clear();
        self.error = Some(e);
        self.error_seq += 1;
    }

    /// Every ticket up to the one returned has its chunk write finished.
    fn finished_through(&self) -> u64 {
        let oldest = self.queued_since.values().chain(self.inflight_since.values()).min();
        oldest.map_or(self.tickets, |t| t - 1)
    }

    /// Every ticket up to `through` is written and committed, or failed: its chunk
    /// write finished, and either a commit covering it was answered or no commit is
    /// left at all (a failed write has none).
    fn settled_through(&self, through: u64) -> bool {
        self.finished_through() >= through
            && (self.committed_through >= through || self.no_commit_left())
    }

    /// Whether no commit of the file waits to be sent, is on its way, or is held
    /// ([`HeldTimes`]).
    fn no_commit_left(&self) -> bool {
        self.commit_end.is_none()
            && !self.committing
            && self.batched.is_none()
            && self.held_times.is_none()
    }

    /// Whether a size commit of the file is queued or on its way to meta.
    pub fn commit_pending(&self) -> bool {
        self.committing || self.batched.is_some()
    }

    pub fn is_idle(&self) -> bool {
        self.buffer.is_empty()
            && self.pending == 0
            && self.no_commit_left()
            && self.deferred.is_empty()
    }

    /// The mtime of overwrites whose commit is held here ([`HeldTimes`]): newer than
    /// any meta has, as a change of times sends the held commit first.
    pub fn held_mtime(&self) -> Option<Timestamp> {
        self.held_times.as_ref().map(|held| held.at)
    }

    /// What the file still has to send or hear back, for the report of requests that
    /// wait long ([`crate::Client::busy`]); `None` when it is idle.
    pub fn busy(&self) -> Option<String> {
        if self.is_idle() {
            return None;
        }
        Some(format!(
            "{} chunk writes queued or in flight, buffered {}, commit to {:?} waiting, \
             committing {}, batched commit {:?}, held times {}, {} deferred changes, {} opens, \
             failed {}",
            self.pending,
            !self.buffer.is_empty(),
            self.commit_end,
            self.committing,
            self.batched,
            self.held_times.is_some(),
            self.deferred.len(),
            self.opens,
            self.error.is_some()
        ))
    }

    /// The bytes of `[offset, offset + len)` this client wrote but the chunk servers may
    /// not have yet, as `(position in the range, bytes)`: in-flight, then queued, then
    /// buffered bytes, so that copying them in order leaves the newest on top.
    pub fn dirty_within(&self, offset: u64, len: u64, chunk_size: u32) -> Vec<(usize, Vec<u8>)> {
        let mut out = Vec::new();
        for piece in split(offset, len, chunk_size) {
            let (at, n) = (piece.offset, piece.len);
            let mut take = |parts: &mut dyn Iterator<Item = (usize, &[u8])>| {
                out.extend(parts.map(|(p, b)| (piece.pos + p, b.to_vec())));
            };
            if let Some(batch) = self.inflight.get(&piece.index) {
                take(&mut clip(batch.ranges(), at, n));
            }
            if let Some(extent) = self.queue.get(&piece.index) {
                take(&mut clip(extent.ranges(), at, n));
            }
            if let Some(extent) = self.buffer.get(piece.index) {
                take(&mut clip(extent.ranges(), at, n));
            }
        }
        out
    }

    /// Whether any chunk of `span` has data buffered, queued or in flight.
    pub fn is_dirty(&self, span: std::ops::Range<u64>) -> bool {
        self.queue.range(span.clone()).next().is_some()
            || self.inflight.range(span.clone()).next().is_some()
            || self.buffer.has_span(span)
    }

    /// Takes the size meta reports in `attr`, unless this file already knows a newer
    /// version of the inode: a GetAttr answered before this client's last commit can
    /// arrive after it, and its size would place the next append over committed lines.
    /// Two answers of one version must agree: one that does not shows a version this
    /// client made up or mixed up (docs/flows/write.md), a bug, reported.
    pub fn learn(&mut self, attr: &Attr) {
        tracing::trace!(
            ino = attr.ino.0,
            version = attr.version,
            size = attr.size,
            newest = self.meta_version,
            uncommitted_end = self.uncommitted_end,
            "open file learns"
        );
        if attr.version == self.meta_version && attr.size != self.newest_size {
            tracing::error!(
                "inode {}: two answers of version {} disagree on its size ({} and {}): a \
                 version counted here is wrong",
                attr.ino,
                attr.version,
                self.newest_size,
                attr.size
            );
        }
        if attr.version >= self.meta_version {
            self.meta_version = attr.version;
            self.newest_size = attr.size;
            self.meta_size = Some(attr.size);
        }
    }

    /// [`FileInner::learn`] for attributes from this client's cache. While a change is
    /// deferred, the cache holds versions this client counted on from it, ahead of the
    /// size commits meta has not answered yet and will number first: taken here, such a
    /// version (with the size before those commits) would hide the commits' answers, and
    /// once the writes settled the file would read as that old size (empty, for a file
    /// `tar` had just written). The commits' answers are learnt as they come instead.
    /// So too while a size commit is on its way: a link or rename this client recorded
    /// meanwhile counted on from the version before it, where meta numbers the commit
    /// first, and the cache's version then names the size before the commit (`churn.py`:
    /// three `two answers of version` errors in about 700,000 operations).
    pub fn learn_cached(&mut self, attr: &Attr) {
        if self.deferred.is_empty() && !self.commit_pending() {
            self.learn(attr);
        }
    }

    /// The size to report for `attr`: the size of the newest version this client knows
    /// if `attr` is older (even after a recall dropped `meta_size`), and further if this
    /// client wrote past it.
    pub fn size_of(&self, attr: &Attr) -> u64 {
        let meta = if attr.version < self.meta_version { self.newest_size } else { attr.size };
        meta.max(self.uncommitted_end)
    }

    /// The size to report: meta's, or further if this client wrote past it.
    pub fn size(&self) -> Option<u64> {
        self.meta_size.map(|s| s.max(self.uncommitted_end))
    }
}

impl FileState {
    pub fn new(ino: InodeId, chunk_size: u32, pages: PagePool) -> FileState {
        FileState {
            ino,
            inner: Mutex::new(FileInner {
                buffer: WriteBuffer::new(
                    chunk_size,
                    DIRTY_CHUNKS_MAX,
                    DIRTY_RANGES_MAX,
                    DIRTY_BYTES_MAX,
                ),
                queue: BTreeMap::new(),
                inflight: BTreeMap::new(),
                pending: 0,
                tickets: 0,
                queued_since: BTreeMap::new(),
                inflight_since: BTreeMap::new(),
                committed_through: 0,
                commit_end: None,
                committing: false,
                batched: None,
                held_times: None,
                uncommitted_end: 0,
                error: None,
                error_seq: 0,
                unsynced: BTreeSet::new(),
                syncing: 0,
                meta_size: None,
                newest_size: 0,
                meta_version: 0,
                prefetched: BTreeMap::new(),
                pages: Pages::new(pages),
                opens: 0,
                claims: 0,
                dirty_generation: None,
                deferred: Vec::new(),
            }),
            changed: Notify::new(),
            io_lock: tokio::sync::RwLock::new(()),
            meta_open: tokio::sync::Mutex::new(None),
            kernel_pages: AtomicBool::new(false),
        }
    }

    pub fn note_kernel_pages(&self) {
        self.kernel_pages.store(true, Ordering::Release);
    }

    pub fn take_kernel_pages(&self) -> bool {
        self.kernel_pages.swap(false, Ordering::AcqRel)
    }

    pub fn lock(&self) -> MutexGuard<'_, FileInner> {
        self.inner.lock().expect("file state lock poisoned")
    }

    /// A cursor that reports only errors from now on (for a new handle).
    pub fn error_cursor(&self) -> ErrorCursor {
        ErrorCursor(AtomicU64::new(self.lock().error_seq))
    }

    /// Buffers `data` at `offset`, and in the file's pages as `cached` says; full chunks
    /// go out in the background. Fails while a write-behind error is unreported to `seen`.
    pub async fn write(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        offset: u64,
        data: &[u8],
        seen: &ErrorCursor,
        cached: Cached,
    ) -> Result<(), FsError> {
        self.wait_for_room(sh).await;
        let _io = self.io_lock.read().await;
        {
            let mut inner = self.lock();
            seen.check(&inner, true)?;
            let end = offset + data.len() as u64;
            let span = chunk_span(offset, end, sh.chunk_size);
            let stale: Vec<u64> = inner.prefetched.range(span).map(|(k, _)| *k).collect();
            for k in stale {
                inner.prefetched.remove(&k);
            }
            inner.pages.write(cached, offset, data);
            inner.uncommitted_end = inner.uncommitted_end.max(end);
            inner.dirty_generation.get_or_insert_with(|| sh.caps.generation());
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
        if !inner.deferred.is_empty() {
            // Written after a deferred change: sent once it is queued.
            return;
        }
        let ready: Vec<u64> =
            inner.queue.keys().filter(|k| !inner.inflight.contains_key(k)).copied().collect();
        for index in ready {
            let Some(extent) = inner.queue.remove(&index) else { continue };
            if let Some(since) = inner.queued_since.remove(&index) {
                inner.inflight_since.insert(index, since);
            }
            let batch = extent.into_batch();
            inner.inflight.insert(index, batch.clone());
            let durable = inner.syncing > 0;
            let (file, sh) = (self.clone(), sh.clone());
            tokio::spawn(async move { file.send(sh, batch, durable).await });
        }
    }

    /// Writes one chunk's batch to its chain and hands its end to the commit loop.
    /// This client sends one write per chunk at a time, each after the one before it
    /// was applied by the whole chain, so a `durable` one leaves every earlier write of
    /// the chunk durable too.
    async fn send(self: Arc<Self>, sh: Arc<Shared>, batch: Batch, durable: bool) {
        let index = batch.index;
        let end = batch.file_end(sh.chunk_size);
        let len = batch.data.len();
        let chunk = ChunkId { ino: self.ino, index };
        let generation = self.lock().dirty_generation.unwrap_or_else(|| sh.caps.generation());
        let deadline = || sh.caps.write_deadline(generation);
        let result = sh.io.write(chunk, batch.ranges, batch.data, durable, &deadline).await;
        let failed = result.is_err();
        {
            let mut inner = self.lock();
            inner.inflight.remove(&index);
            inner.inflight_since.remove(&index);
            inner.pending -= 1;
            sh.pending_writes.fetch_sub(1, Ordering::AcqRel);
            match result {
                Ok(()) => {
                    match durable {
                        true => inner.unsynced.remove(&index),
                        false => inner.unsynced.insert(index),
                    };
                    if !self.commit_batched(&sh, &mut inner, end, generation) {
                        inner.commit_end = Some(inner.commit_end.map_or(end, |e| e.max(end)));
                    }
                }
                Err(e) => {
                    tracing::warn!("write-behind of {chunk} failed: {e}");
                    *sh.write_failed_at.lock().expect("failure time lock poisoned") =
                        Some(Instant::now());
                    inner.fail(e);
                }
            }
            self.settle(&mut inner);
        }
        sh.pending_bytes.fetch_sub(len, Ordering::AcqRel);
        sh.pending_changed.notify_waiters();
        self.changed.notify_waiters();
        self.pump(&sh);
        self.start_commit(&sh);
        if failed {
            // No commit follows whose answer would let a deferred change go.
            self.release_deferred(&sh);
        }
        // A close may have returned before this write (`close`), and a failed write has
        // no commit whose answer would let the file's state go.
        self.forget_if_closed(&sh);
    }

    /// Lets the state of a file with no handle left go once nothing is left of it.
    fn forget_if_closed(&self, sh: &Shared) {
        if self.lock().opens == 0 {
            sh.files.forget_if_unused(self.ino);
        }
    }

    /// Forgets the local size lead once nothing is left to write or commit.
    fn settle(&self, inner: &mut FileInner) {
        if inner.is_idle() {
            inner.uncommitted_end = 0;
            inner.dirty_generation = None;
        }
    }

    /// Queues the size commit of a chunk write that just finished (dirops.rs), if the
    /// file is held exclusively under the caps the data was written under and no commit
    /// of the loop is pending: one call then carries the commits of many files, one
    /// Raft entry instead of one per file. It reaches meta after the namespace changes
    /// queued before it (the file's create); its answer updates the file and its cap.
    /// Until then the size is the file's own (`uncommitted_end`). The commit of an
    /// overwrite is held here instead ([`HeldTimes`]), unless a change of times waits
    /// for it; one queued replaces what was held, as its time is later. Returns whether
    /// it did either.
    fn commit_batched(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        inner: &mut FileInner,
        end: u64,
        generation: u64,
    ) -> bool {
        if inner.committing
            || inner.commit_end.is_some()
            || sh.caps.held_in(self.ino, CapMode::Exclusive) != Some(generation)
        {
            return false;
        }
        let at = Timestamp::now();
        let overwrite = inner.meta_size.is_some_and(|size| size >= end)
            && inner.deferred.is_empty()
            && inner.held_times.as_ref().is_none_or(|held| held.generation == generation);
        if overwrite {
            let (end, since) = match &inner.held_times {
                Some(held) => (held.end.max(end), held.since),
                None => {
                    let since = tokio::time::Instant::now();
                    let (file, sh) = (self.clone(), sh.clone());
                    tokio::spawn(async move {
                        tokio::time::sleep_until(since + HELD_TIMES_MAX).await;
                        file.send_times_due(&sh);
                    });
                    (end, since)
                }
            };
            inner.held_times = Some(HeldTimes { end, at, generation, since });
            return true;
        }
        inner.held_times = None;
        self.queue_commit(sh, inner, Commit { ino: self.ino, size: end, at }, generation);
        true
    }

    /// Queues the commit held here, if any ([`HeldTimes`]).
    pub(crate) fn send_times(self: &Arc<Self>, sh: &Arc<Shared>) {
        let mut inner = self.lock();
        self.send_times_locked(sh, &mut inner);
    }

    /// Queues the commit held here if it has been held for [`HELD_TIMES_MAX`]: the timer
    /// of a hold that an fsync already sent finds a later hold, not yet due, and leaves it
    /// to its own timer.
    fn send_times_due(self: &Arc<Self>, sh: &Arc<Shared>) {
        let mut inner = self.lock();
        let now = tokio::time::Instant::now();
        if inner.held_times.as_ref().is_some_and(|held| held.since + HELD_TIMES_MAX <= now) {
            self.send_times_locked(sh, &mut inner);
        }
    }

    /// [`FileState::send_times`] under the file's lock.
    pub(crate) fn send_times_locked(self: &Arc<Self>, sh: &Arc<Shared>, inner: &mut FileInner) {
        if let Some(held) = inner.held_times.take() {
            let commit = Commit { ino: self.ino, size: held.end, at: held.at };
            self.queue_commit(sh, inner, commit, held.generation);
        }
    }

    /// Queues `commit` (dirops.rs) and, once it is answered, marks the writes finished
    /// by now committed.
    fn queue_commit(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        inner: &mut FileInner,
        commit: Commit,
        generation: u64,
    ) {
        let number = dirops::queue_commit(sh, commit, generation);
        inner.batched = Some(number);
        let covers = inner.finished_through();
        let (file, sh) = (self.clone(), sh.clone());
        tokio::spawn(async move {
            sh.dirops.commit_log.wait(number).await;
            let mut inner = file.lock();
            // The commit log answers in order: every earlier commit is answered too.
            inner.committed_through = inner.committed_through.max(covers);
            if inner.batched == Some(number) {
                inner.batched = None;
            }
            file.commit_done(&sh, inner);
        });
    }

    /// Starts the commit loop unless it runs already or has nothing to do.
    fn start_commit(self: &Arc<Self>, sh: &Arc<Shared>) {
        {
            let mut inner = self.lock();
            if inner.committing || inner.commit_end.is_none() {
                return;
            }
            inner.committing = true;
        }
        let (file, sh) = (self.clone(), sh.clone());
        tokio::spawn(async move { file.commit_loop(&sh).await });
    }

    /// Tells meta that data up to the furthest finished end is written (it grows the
    /// size and sets mtime), again while chunk writes keep finishing meanwhile. One
    /// CommitWrite covers every chunk write that finished before it was sent, so meta
    /// sees one update per round trip, not one per chunk write.
    async fn commit_loop(self: Arc<Self>, sh: &Arc<Shared>) {
        loop {
            let (end, generation, covers) = {
                let mut inner = self.lock();
                let Some(end) = inner.commit_end.take() else { break };
                let generation = inner.dirty_generation.unwrap_or_else(|| sh.caps.generation());
                (end, generation, inner.finished_through())
            };
            // Fenced like the chunk writes it commits: after the caps lapsed, in the
            // session it was written in only (a new session would take it).
            let session = sh.session.id();
            let commit = MetaOp::CommitWrite { ino: self.ino, size: end };
            let sent = sh.caps.epoch();
            let result = match sh.caps.write_deadline(generation) {
                Ok(_) => sh.session.call_in(session, commit).await,
                Err(e) => Err(e),
            };
            let mut inner = self.lock();
            match result {
                Ok(MetaResponse::Attr(attr)) => inner.committed(&sh.caps, attr, sent),
                Ok(_) => {
                    inner.meta_size = Some(inner.meta_size.map_or(end, |s| s.max(end)));
                    // No attributes to update the cap's with: they are stale now.
                    sh.caps.forget(&[self.ino], &[]);
                }
                Err(e) => {
                    tracing::warn!("committing writes of inode {} failed: {e}", self.ino);
                    inner.fail(e);
                }
            }
            // Answered (or failed, for every handle to see): a recall waiting for these
            // writes may go on while the loop commits later ones.
            inner.committed_through = inner.committed_through.max(covers);
            drop(inner);
            self.changed.notify_waiters();
        }
        let mut inner = self.lock();
        inner.committing = false;
        self.commit_done(sh, inner);
    }

    /// After a commit's answer: wakes the waiters and, since a close does not wait for
    /// the commit (see `close`), lets the state of a file closed meanwhile go.
    fn commit_done(self: &Arc<Self>, sh: &Arc<Shared>, mut inner: MutexGuard<'_, FileInner>) {
        self.settle(&mut inner);
        drop(inner);
        self.release_deferred(sh);
        self.changed.notify_waiters();
        self.forget_if_closed(sh);
    }

    /// Queues the deferred attribute changes once every write sent before them is
    /// committed (or failed), then sends the writes made since. Under the file's lock,
    /// so that no commit is queued in between: one queued later reaches meta after them.
    fn release_deferred(self: &Arc<Self>, sh: &Arc<Shared>) {
        {
            let mut inner = self.lock();
            if inner.deferred.is_empty() || !inner.inflight.is_empty() || !inner.no_commit_left() {
                return;
            }
            for change in std::mem::take(&mut inner.deferred) {
                dirops::queue_setattr(sh, self.ino, change);
            }
            self.settle(&mut inner);
        }
        self.changed.notify_waiters();
        self.pump(sh);
    }

    /// Sends everything buffered, waits for every write in flight, and reports a
    /// write-behind error that `seen` has not reported yet. A flush (a close) reports
    /// without consuming: the kernel also flushes when a forked child closes its copy of
    /// the descriptor, and that must not hide the error from the owner's fsync.
    pub async fn flush(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        seen: &ErrorCursor,
    ) -> Result<(), FsError> {
        self.drain(sh).await;
        seen.check(&self.lock(), false)
    }

    /// Sends everything buffered and waits until nothing is queued or in flight.
    async fn drain(self: &Arc<Self>, sh: &Arc<Shared>) {
        self.drain_for(sh, Durability::All).await
    }

    /// [`FileState::drain`], for what `what` makes durable. For `fdatasync`, once the
    /// chunk writes are applied, their commits are waited for only when one may grow the
    /// size meta has, or when the file is not held exclusively (another client may have
    /// changed that size); left to commit otherwise is the mtime, which goes on in the
    /// background.
    async fn drain_for(self: &Arc<Self>, sh: &Arc<Shared>, what: Durability) {
        if self.send_all(sh) {
            return;
        }
        // The commit that ends the drain waits for the namespace changes queued before
        // it (often the file's own create, answered locally): have them sent now, while
        // the chunk writes travel, instead of after them; and a commit that went into
        // the queue, as soon as the last chunk write queued it.
        let written = async {
            self.wait_until(|inner| inner.buffer.is_empty() && inner.pending == 0).await;
            if what == Durability::Data && self.size_on_meta(sh) {
                return;
            }
            self.send_times(sh);
            sh.dirops.commit_log.wait_all().await;
            self.wait_until(FileInner::is_idle).await;
            // A change of times deferred behind those writes was queued just now.
            sh.session.backlog.wait_naming(self.ino).await;
        };
        tokio::join!(sh.session.backlog.wait_all(), written);
    }

    /// Whether meta has a size that covers every write of this file, and nobody else can
    /// change it (the file is held exclusively).
    fn size_on_meta(&self, sh: &Shared) -> bool {
        let covered = {
            let inner = self.lock();
            inner.meta_size.is_some_and(|size| size >= inner.uncommitted_end)
        };
        covered && sh.caps.holds(self.ino, CapMode::Exclusive)
    }

    /// Queues everything buffered and starts sending it; returns whether the file was
    /// idle already.
    pub(crate) fn send_all(self: &Arc<Self>, sh: &Arc<Shared>) -> bool {
        self.send_all_through(sh).is_none()
    }

    /// [`FileState::send_all`], returning the last ticket issued unless the file was
    /// idle.
    fn send_all_through(self: &Arc<Self>, sh: &Arc<Shared>) -> Option<u64> {
        let through = {
            let mut inner = self.lock();
            for extent in inner.buffer.take_all() {
                enqueue(&mut inner, sh, extent);
            }
            (!inner.is_idle()).then_some(inner.tickets)
        };
        if through.is_some() {
            self.pump(sh);
        }
        through
    }

    /// What a `close` waits for. Everything buffered is sent. If it was written under
    /// an exclusive cap still held, the close returns at once (caps.md invariant 30):
    /// anyone else must recall that cap first, and the recall waits until those writes
    /// are applied on every server of their chains and their size is committed (caps.md
    /// invariant 5); `fsync`, `syncfs` and the unmount wait for them too. As on a local
    /// filesystem, the data of a file closed but not fsynced is in this client's memory
    /// until its chunk writes are applied, and an error of such a write reaches a later
    /// `fsync` of a handle open at the time, or only the log. So the close waits until
    /// its writes are applied, as a close without a cap always does, when the client
    /// already has [`CLOSE_AHEAD_WRITES_MAX`] chunk writes queued or in flight (that
    /// bounds what closes leave behind), and for [`CLOSE_AHEAD_PAUSE_AFTER_FAILURE`]
    /// after a write-behind failed (a full cluster, then, answers `ENOSPC` at the close
    /// of the next file it refuses). An error `seen` has not reported is reported. The
    /// size commit is never waited for.
    pub async fn close(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        seen: &ErrorCursor,
    ) -> Result<(), FsError> {
        if !self.send_all(sh) && !self.closes_ahead(sh) {
            self.wait_until(|inner| inner.buffer.is_empty() && inner.pending == 0).await;
        }
        seen.check(&self.lock(), false)
    }

    /// Whether a close may return before the chunk writes of this file are applied
    /// (see [`FileState::close`]).
    fn closes_ahead(&self, sh: &Shared) -> bool {
        let generation = self.lock().dirty_generation;
        let capped =
            generation.is_some() && sh.caps.held_in(self.ino, CapMode::Exclusive) == generation;
        let room = sh.pending_writes.load(Ordering::Acquire) <= CLOSE_AHEAD_WRITES_MAX;
        let failed = sh.write_failed_at.lock().expect("failure time lock poisoned");
        let failed_lately = failed.is_some_and(|at| at.elapsed() < CLOSE_AHEAD_PAUSE_AFTER_FAILURE);
        capped && room && !failed_lately
    }

    /// Flushes for a recall of the file's cap: what was written before the recall began
    /// is applied on every server of its chains and its size committed; writes made
    /// uncapped since (the recall sends later ones through at once) are not waited for.
    /// Their commits may wait at meta for the very client whose request this recall
    /// serves, and that client's own commit for this recall's ack: waiting for them
    /// would close the circle (docs/flows/caps.md, invariant 29). Reports like
    /// [`FileState::flush_unowned`].
    pub async fn flush_recalled(self: &Arc<Self>, sh: &Arc<Shared>) -> Result<(), FsError> {
        let seen = self.error_cursor();
        self.send_times(sh);
        if let Some(through) = self.send_all_through(sh) {
            let finished = self.wait_until(|inner| inner.finished_through() >= through);
            tokio::join!(finished, sh.dirops.commit_log.wait_all());
            // A deferred attribute change goes out once those writes are committed.
            self.wait_until(|inner| inner.settled_through(through) && inner.deferred.is_empty())
                .await;
        }
        seen.check(&self.lock(), false)
    }

    /// Flushes for a caller without a handle (setattr, locks, unmount): reports only
    /// errors of writes that fail during this flush, and leaves every handle's errors
    /// for its own flush, fsync or close.
    pub async fn flush_unowned(self: &Arc<Self>, sh: &Arc<Shared>) -> Result<(), FsError> {
        let seen = self.error_cursor();
        self.flush(sh, &seen).await
    }

    /// Flushes, reports (and consumes) an error `seen` has not reported, then makes
    /// every chunk written since the last fsync durable on every replica of its chain.
    pub async fn fsync(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        seen: &ErrorCursor,
        what: Durability,
    ) -> Result<(), FsError> {
        self.lock().syncing += 1;
        let syncing = Syncing(self);
        self.drain_for(sh, what).await;
        drop(syncing);
        seen.check(&self.lock(), true)?;
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
    /// old size to nothing: of a file much larger than its data, those that exist), then
    /// applies `set` on meta. Data goes first so that a crash in between leaves zeros
    /// past the new end rather than old bytes reappearing.
    pub async fn truncate(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        set: SetAttr,
        old_size: u64,
    ) -> Result<Attr, FsError> {
        let size = set.size.expect("truncate needs a size");
        let cs = u64::from(sh.chunk_size);
        self.cut(sh, set, |known| {
            let old_size = old_size.max(known.unwrap_or(0));
            if size >= old_size {
                return (None, 0..0);
            }
            let partial = (!size.is_multiple_of(cs)).then(|| (size / cs, (size % cs) as u32));
            (partial, size.div_ceil(cs)..old_size.div_ceil(cs))
        })
        .await
    }

    /// Punches a hole of the whole chunks `whole`: cuts those that hold data to nothing
    /// (they read as zeros and take no space), and marks the file changed on meta.
    pub async fn punch(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        whole: std::ops::Range<u64>,
    ) -> Result<Attr, FsError> {
        let set = SetAttr { mtime: Some(SetTime::Now), ..SetAttr::default() };
        self.cut(sh, set, |_| (None, whole)).await
    }

    /// Stops the file's I/O and sends its buffered writes (so that none lands in what
    /// is cut), then cuts what `plan` says, given the size this client knows of the
    /// file: a chunk to a length, and the chunks of a range that hold data to nothing
    /// ([`ChunkIo::chunks_to_cut`](crate::chunk_io::ChunkIo::chunks_to_cut)); then
    /// applies `set` on meta.
    async fn cut(
        self: &Arc<Self>,
        sh: &Arc<Shared>,
        set: SetAttr,
        plan: impl FnOnce(Option<u64>) -> (Option<(u64, u32)>, std::ops::Range<u64>),
    ) -> Result<Attr, FsError> {
        let _io = self.io_lock.write().await;
        // No read runs until this is done, and a cut that fails half-way leaves chunks
        // cut that a kept page would still show.
        self.lock().pages.clear();
        self.flush_unowned(sh).await?;
        let (partial, whole) = plan(self.lock().size());
        let generation = sh.caps.generation();
        let deadline = || sh.caps.write_deadline(generation);
        if let Some((index, len)) = partial {
            sh.io.truncate(ChunkId { ino: self.ino, index }, len, &deadline).await?;
        }
        for index in sh.io.chunks_to_cut(self.ino, whole.start, whole.end).await? {
            sh.io.truncate(ChunkId { ino: self.ino, index }, 0, &deadline).await?;
        }
        self.lock().prefetched.clear();
        let sets_size = set.size.is_some();
        let attr = sh.session.call_attr(MetaOp::SetAttr { ino: self.ino, set }).await?;
        let mut inner = self.lock();
        if sets_size {
            // The size set replaces whatever this client wrote past it.
            inner.uncommitted_end = 0;
        }
        inner.learn(&attr);
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

/// How many write-behind errors of a file one handle has reported.
#[derive(Debug)]
pub(crate) struct ErrorCursor(AtomicU64);

impl ErrorCursor {
    /// Fails with the file's latest error if it came after what this cursor reported;
    /// `consume` marks it reported.
    fn check(&self, inner: &FileInner, consume: bool) -> Result<(), FsError> {
        if inner.error_seq <= self.0.load(Ordering::Acquire) {
            return Ok(());
        }
        if consume {
            self.0.store(inner.error_seq, Ordering::Release);
        }
        inner.error.clone().map_or(Ok(()), Err)
    }
}

/// An fsync waiting for a file's writes ([`FileInner::syncing`]), counted until it is
/// dropped, so an fsync given up half way does not leave every later write durable.
struct Syncing<'a>(&'a FileState);

impl Drop for Syncing<'_> {
    fn drop(&mut self) {
        self.0.lock().syncing -= 1;
    }
}

/// Queues `extent` to be sent, merging it into the chunk's queued extent if there is one.
fn enqueue(inner: &mut FileInner, sh: &Shared, extent: Extent) {
    let (before, after) = match inner.queue.get_mut(&extent.index) {
        Some(queued) => {
            let before = queued.bytes();
            queued.absorb(extent);
            (before, queued.bytes())
        }
        None => {
            inner.pending += 1;
            sh.pending_writes.fetch_add(1, Ordering::AcqRel);
            inner.tickets += 1;
            let ticket = inner.tickets;
            inner.queued_since.insert(extent.index, ticket);
            let bytes = extent.bytes();
            inner.queue.insert(extent.index, extent);
            (0, bytes)
        }
    };
    sh.pending_bytes.fetch_add(after - before, Ordering::AcqRel);
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_types::{FileKind, Timestamp};

    /// An open claims the state before it waits for a release of the file under way: a
    /// forget of the inode meanwhile (that release, or an earlier commit, ending) leaves
    /// it, so that the handle writes where every other operation on the file looks.
    #[test]
    fn a_claimed_state_stays_the_inodes_until_the_claim_ends() {
        let (files, ino) = (Files::new(1 << 20, PagePool::new(0)), InodeId(7));
        let claim = files.claim(ino);
        files.forget_if_unused(ino);
        let found = files.get(ino).expect("a claimed state is kept");
        assert!(Arc::ptr_eq(&found, &claim.file));
        let again = files.claim(ino);
        assert!(Arc::ptr_eq(&again.file, &claim.file), "a second claim finds the same state");
        drop(again);
        assert!(files.get(ino).is_some(), "the first claim still holds it");
        // The open's handle is counted, then its claim ends.
        claim.file.lock().opens += 1;
        drop(claim);
        assert!(Arc::ptr_eq(&files.get(ino).expect("an open handle keeps it"), &found));
        found.lock().opens -= 1;
        files.forget_if_unused(ino);
        assert!(files.get(ino).is_none(), "nothing uses it any more");
    }

    fn attr(size: u64, version: u64) -> Attr {
        let now = Timestamp::now();
        Attr {
            ino: InodeId(7),
            kind: FileKind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            size,
            nlink: 1,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version,
        }
    }

    /// A reader's GetAttr answered before an append's commit but handled after it must
    /// not shrink the size the next append goes to (it overwrote the committed line).
    #[test]
    fn a_size_older_than_the_last_commit_is_not_taken() {
        let file = FileState::new(InodeId(7), 1 << 20, PagePool::new(0));
        let mut inner = file.lock();
        inner.learn(&attr(23, 4));
        inner.learn(&attr(46, 5));
        let stale = attr(23, 4);
        inner.learn(&stale);
        assert_eq!(inner.size(), Some(46));
        assert_eq!(inner.size_of(&stale), 46);
        // A recall drops the size but not the version: a stale answer stays out.
        inner.meta_size = None;
        inner.learn(&stale);
        assert_eq!(inner.size(), None);
        assert_eq!(inner.size_of(&stale), 46, "a stale size reported after a recall");
        inner.learn(&attr(69, 6));
        assert_eq!(inner.size(), Some(69));
    }

    /// While a size commit is on its way, the cache may hold a version this client
    /// counted for a link it made after it, which meta numbers after the commit: it is
    /// not learnt, and the commit's answer, of the same version, is.
    #[test]
    fn the_cache_is_not_learnt_from_while_a_commit_is_on_its_way() {
        let file = FileState::new(InodeId(7), 1 << 20, PagePool::new(0));
        let mut inner = file.lock();
        inner.learn(&attr(0, 1));
        inner.committing = true;
        inner.learn_cached(&attr(0, 2));
        assert_eq!((inner.meta_version, inner.size()), (1, Some(0)), "learnt from the cache");
        inner.learn(&attr(1, 2));
        inner.committing = false;
        assert_eq!((inner.meta_version, inner.size()), (2, Some(1)));
        // Once no commit is on its way, the cache is learnt from again.
        inner.learn_cached(&attr(1, 3));
        assert_eq!(inner.meta_version, 3);
    }
}
