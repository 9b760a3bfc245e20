//! [`Client`]: one session with a Stoa cluster, its open files and its handles.

use crate::caps::{spawn_events, Access, Caps};
use crate::chains::ChainCache;
use crate::chunk_io::ChunkIo;
use crate::dirops::{DirOps, NewInode};
use crate::file::{Durability, ErrorCursor, FileState, Files, MetaOpen};
use crate::file_pages::{Cached, PagePool};
use crate::locks::KeptLocks;
use crate::namespace::Owner;
use crate::neighbors::Neighbors;
use crate::readahead::Readahead;
use crate::session::{spawn_renewal, Session};
use bytes::Bytes;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use stoa_net::Pool;
use stoa_proto::{CapMode, MetaOp};
use stoa_types::{validate_name, Attr, FileKind, FsError, InodeId, SessionId, SetAttr};
use tokio::sync::Notify;

/// Where the cluster is and what this client calls itself.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Addresses of meta replicas; any one that answers is enough.
    pub meta: Vec<SocketAddr>,
    /// A name for the session, shown in cluster status.
    pub name: String,
    /// The most caps the client keeps; beyond it, it gives the least recently used ones
    /// back (see `caps.rs`, "Bounded"), so meta's table stays bounded too.
    pub caps_max: usize,
    /// Bytes of file data the client keeps for handles that read and write through it
    /// (`file_pages.rs`), over all files.
    pub data_cache_bytes: usize,
}

/// The default of [`ClientConfig::caps_max`], like CephFS's client cache size.
pub const CAPS_MAX_DEFAULT: usize = 16_384;

/// The default of [`ClientConfig::data_cache_bytes`], about CephFS's client object cache.
pub const DATA_CACHE_DEFAULT: usize = 256 << 20;

/// The most zeros [`Client::fallocate`] writes at once, as large as the kernel's writes.
const ZERO_PIECE: u64 = 1 << 20;

/// An open file, as returned by [`Client::open`]. Unique within one client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileHandle(pub u64);

/// A session with a Stoa cluster: namespace operations by inode, and file I/O through
/// handles. Cheap to clone; clones share the session and its buffers.
#[derive(Clone)]
pub struct Client {
    pub(crate) sh: Arc<Shared>,
}

/// What every operation of one client shares.
pub(crate) struct Shared {
    pub session: Arc<Session>,
    pub io: ChunkIo,
    pub chunk_size: u32,
    /// Bytes of chunk writes queued or in flight, over every file.
    pub pending_bytes: AtomicUsize,
    /// Chunk writes queued or in flight, over every file.
    pub pending_writes: AtomicUsize,
    /// When a write-behind last failed: for a while after, every close waits for its
    /// writes again (see `FileState::close`).
    pub write_failed_at: Mutex<Option<Instant>>,
    /// Signalled whenever a chunk write finishes, for writers waiting for room.
    pub pending_changed: Notify,
    pub prefetch_bytes: Arc<AtomicUsize>,
    /// The scan of small files read in inode order (neighbors.rs).
    pub neighbors: Neighbors,
    /// Files with open handles, pending writes, or a claim (an open or a truncate).
    pub files: Files,
    handles: Mutex<HashMap<u64, Arc<OpenHandle>>>,
    next_handle: AtomicU64,
    /// `(inode, lock owner)` pairs that may hold cluster-wide locks, each with the
    /// number of locks granted to it so far (see `Client::release_locks`).
    pub locked: Mutex<HashMap<(InodeId, u64), u64>>,
    /// The locks of files meta handed this client (see `locks.rs`).
    pub kept: KeptLocks,
    /// The task that renews the session lease; stopped on close and on drop.
    renewal: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// What this session may cache (docs/flows/caps.md).
    pub caps: Caps,
    /// The events stream that brings recalls; stopped on close and on drop.
    events: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Held while an `O_APPEND` write picks its offset and buffers its data.
    appending: tokio::sync::Mutex<()>,
    /// Namespace changes this client makes by itself and queues for meta.
    pub dirops: DirOps,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop_renewal();
        self.stop_events();
    }
}

struct OpenHandle {
    file: Arc<FileState>,
    readahead: Mutex<Readahead>,
    /// The session the handle was opened in. Meta released the handle's open when that
    /// session expired, so the handle answers `EIO` once the client is in another.
    session: SessionId,
    /// The write-behind errors of the file this handle has reported.
    errors: ErrorCursor,
    /// Whether the kernel keeps what reads of this handle return in its page cache
    /// (see [`Client::page_cached`]).
    page_cached: AtomicBool,
    /// Whether the handle reads through the file's pages kept by the client (see
    /// [`Client::read_through_pages`]), and whether it has read yet.
    through_pages: AtomicBool,
    has_read: AtomicBool,
}

impl OpenHandle {
    /// How an operation of this handle under `access` meets the file's pages: they are
    /// kept for a handle that reads through them once it has read (a handle opened to
    /// read and write that only writes, as `fio` and `dd` do, keeps none).
    fn cached(&self, access: &Access) -> Cached {
        let keep =
            self.through_pages.load(Ordering::Acquire) && self.has_read.load(Ordering::Acquire);
        match access {
            Access::Capped { cap, .. } => Cached::Under { cap: *cap, keep },
            Access::Uncapped { .. } => Cached::No,
        }
    }
}

impl Client {
    /// Opens a session with the cluster and loads the chain table.
    pub async fn connect(cfg: ClientConfig) -> Result<Client, FsError> {
        let pool = Pool::new();
        let session = Arc::new(Session::open(pool.clone(), cfg.meta, cfg.name).await?);
        let chains = ChainCache::load(&session).await?;
        let grant = session.grant();
        tracing::info!(
            "session {} with cluster {} (chunk size {} bytes)",
            grant.session,
            grant.cluster,
            grant.chunk_size_bytes
        );
        let sh = Shared {
            io: ChunkIo::new(pool, session.clone(), chains),
            chunk_size: grant.chunk_size_bytes,
            pending_bytes: AtomicUsize::new(0),
            pending_writes: AtomicUsize::new(0),
            write_failed_at: Mutex::new(None),
            pending_changed: Notify::new(),
            prefetch_bytes: Arc::new(AtomicUsize::new(0)),
            neighbors: Neighbors::default(),
            files: Files::new(grant.chunk_size_bytes, PagePool::new(cfg.data_cache_bytes)),
            handles: Mutex::new(HashMap::new()),
            next_handle: AtomicU64::new(1),
            locked: Mutex::new(HashMap::new()),
            kept: KeptLocks::default(),
            renewal: Mutex::new(Some(spawn_renewal(&session))),
            session,
            caps: Caps::new(cfg.caps_max),
            events: Mutex::new(None),
            appending: tokio::sync::Mutex::new(()),
            dirops: DirOps::default(),
        };
        let sh = Arc::new(sh);
        *sh.events.lock().expect("events lock poisoned") = Some(spawn_events(&sh));
        Ok(Client { sh })
    }

    /// The session meta granted; a new one after meta expired the previous one.
    pub fn session(&self) -> stoa_proto::SessionGrant {
        self.sh.session.grant()
    }

    /// The size of one chunk of file data in this cluster.
    pub fn chunk_size(&self) -> u32 {
        self.sh.chunk_size
    }

    /// Opens inode `ino` for I/O. Meta is told of the first handle of a file, so that
    /// the file outlives an unlink or a rename over it, by anyone, until released.
    pub async fn open(&self, ino: InodeId) -> Result<FileHandle, FsError> {
        // Claimed until the handle counts: a state dropped meanwhile would take this
        // handle's writes where no other operation looks.
        let claim = self.sh.files.claim(ino);
        let session = self.register_open(&claim.file).await?;
        Ok(self.add_handle(claim.file.clone(), session))
    }

    /// Creates a regular file and opens it, in one meta call (`CreateOpen`): one log
    /// entry for `open(O_CREAT)` of a new file instead of a create and an open.
    pub async fn create_open(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        owner: Owner,
    ) -> Result<(Attr, FileHandle), FsError> {
        validate_name(name)?;
        let new = NewInode { kind: FileKind::File, perm, owner, rdev: 0, target: &[], open: true };
        let (attr, told) = match self.create_here(parent, name, new).await {
            Some(made) => made.map(|(attr, number)| (attr, Some(number)))?,
            None => {
                let op = MetaOp::CreateOpen {
                    parent,
                    name: name.to_vec(),
                    perm,
                    uid: owner.uid,
                    gid: owner.gid,
                };
                let attr = self.sh.session.call_attr(op).await;
                self.sh.caps.forget(&[parent], &[]);
                (attr?, None)
            }
        };
        let claim = self.sh.files.claim(attr.ino);
        let file = &claim.file;
        let session = {
            let mut meta_open = file.meta_open.lock().await;
            // The call may have moved to a new session if meta expired the old one.
            let current = self.sh.session.id();
            // Another handle of this client got here first (an open by name right after
            // the create): meta has one open per session, so count this one. Meta hears
            // of the open twice then, so only a release may close it.
            if self.reuse_open(&mut meta_open, current) {
                if let Some(m) = meta_open.as_mut() {
                    m.told = None;
                }
            } else {
                *meta_open = Some(MetaOpen::new(current, told));
            }
            file.lock().opens += 1;
            current
        };
        Ok((attr, self.add_handle(file.clone(), session)))
    }

    fn add_handle(&self, file: Arc<FileState>, session: SessionId) -> FileHandle {
        let fh = self.sh.next_handle.fetch_add(1, Ordering::Relaxed);
        let errors = file.error_cursor();
        let readahead = Mutex::new(Readahead::default());
        let (page_cached, through_pages) = (AtomicBool::new(false), AtomicBool::new(false));
        let has_read = AtomicBool::new(false);
        let handle =
            OpenHandle { file, readahead, session, errors, page_cached, through_pages, has_read };
        self.sh.handles.lock().expect("handles lock poisoned").insert(fh, Arc::new(handle));
        FileHandle(fh)
    }

    /// Counts one more handle of `file`, telling meta if it is the first in the current
    /// session. Returns that session.
    async fn register_open(&self, file: &FileState) -> Result<SessionId, FsError> {
        let mut meta_open = file.meta_open.lock().await;
        let current = self.sh.session.id();
        if !self.reuse_open(&mut meta_open, current) {
            if let Some(told) = self.open_queued(file.ino).await {
                *meta_open = Some(MetaOpen::new(current, Some(told)));
            } else {
                // After any queued release of the file: meta calls wait for the backlog.
                self.sh.session.call_done(MetaOp::Open { ino: file.ino }).await?;
                // The call may have moved to a new session if meta expired the old one.
                *meta_open = Some(MetaOpen::new(self.sh.session.id(), None));
            }
        }
        file.lock().opens += 1;
        Ok(meta_open.expect("just registered").session)
    }

    /// Counts one more handle in what meta knows already, if it knows the file open in
    /// session `current`: also when no handle is left but the release has not left yet
    /// (a queued one is taken back; one not yet queued finds a handle and is not sent).
    /// Whether it did; otherwise meta must hear of the open.
    fn reuse_open(&self, meta_open: &mut Option<MetaOpen>, current: SessionId) -> bool {
        match meta_open {
            Some(m)
                if m.session == current
                    && m.release.is_none_or(|number| self.cancel_queued(number)) =>
            {
                m.release = None;
                m.handles += 1;
                true
            }
            _ => false,
        }
    }

    /// Closes a handle: flushes its file and reports the first write error. The last
    /// handle of a file tells meta, which deletes the file if it has no names left and
    /// nobody else has it open; that call is made in the background, off the close's
    /// critical path. When the change that tells meta of the open has not left yet, it
    /// is taken back instead, and meta hears of neither (a loop that opens and closes
    /// files one after another costs meta nothing). A handle of an expired session
    /// answers `EIO`.
    pub async fn release(&self, fh: FileHandle) -> Result<(), FsError> {
        let handle = self.sh.handles.lock().expect("handles lock poisoned").remove(&fh.0);
        let handle = handle.ok_or_else(|| FsError::Invalid(format!("unknown handle {}", fh.0)))?;
        let file = handle.file.clone();
        let flushed = file.close(&self.sh, &handle.errors).await;
        let last = {
            let mut meta_open = file.meta_open.lock().await;
            file.lock().opens -= 1;
            let last = match &mut *meta_open {
                Some(m) if m.session == handle.session => {
                    m.handles -= 1;
                    m.handles == 0
                }
                _ => false,
            };
            // An open meta has not heard of yet goes back with its last close.
            let told = meta_open.as_ref().and_then(|m| m.told).filter(|_| last);
            let unsent = told.is_some_and(|n| self.take_back_open(n));
            if unsent {
                *meta_open = None;
            }
            last && !unsent
        };
        if last {
            let client = self.clone();
            tokio::spawn(async move { client.release_in_meta(file).await });
        } else {
            self.sh.files.forget_if_unused(file.ino);
        }
        if handle.session != self.sh.session.id() {
            return Err(expired_handle());
        }
        flushed
    }

    /// Tells meta that this client closed its last handle of `file`, unless it opened
    /// the file again meanwhile (then meta's open simply continues). In the current
    /// session the release is queued in order with this client's namespace changes (a
    /// create of this file may still be on its way) and batched with them, and an open
    /// before it leaves takes it back. A failure is logged, not returned: the
    /// application's close succeeded, and meta releases the file when the session ends.
    async fn release_in_meta(&self, file: Arc<FileState>) {
        let queued = {
            let mut meta_open = file.meta_open.lock().await;
            match *meta_open {
                Some(m) if m.handles == 0 && m.release.is_none() => {
                    if m.session == self.sh.session.id() {
                        let number = self.queue_release(file.ino);
                        *meta_open = Some(MetaOpen { release: Some(number), ..m });
                        Some(number)
                    } else {
                        let op = MetaOp::Release { ino: file.ino };
                        match self.sh.session.call_in(m.session, op).await {
                            Ok(_) | Err(FsError::SessionExpired) => {}
                            Err(e) => {
                                tracing::warn!("releasing inode {} at meta failed: {e}", file.ino)
                            }
                        }
                        *meta_open = None;
                        None
                    }
                }
                _ => None,
            }
        };
        if let Some(number) = queued {
            self.sh.session.backlog.wait(number).await;
            let mut meta_open = file.meta_open.lock().await;
            if meta_open.is_some_and(|m| m.release == Some(number)) {
                *meta_open = None;
            }
        }
        self.sh.files.forget_if_unused(file.ino);
    }

    /// Notes that the kernel keeps what reads of `fh` return in its page cache (a handle
    /// opened without direct I/O). Each such read marks the file, and a direct write of
    /// it then drops the pages it wrote before it returns: the kernel drops them before
    /// it sends the write, but a read answered in between would put the old bytes back
    /// (caps.md invariant 21).
    pub fn page_cached(&self, fh: FileHandle) {
        if let Ok(handle) = self.sh.handle(fh) {
            handle.page_cached.store(true, Ordering::Release);
        }
    }

    /// Notes that reads of `fh` are answered from file pages this client keeps (a
    /// handle that reads and writes, which the kernel caches nothing for), and that its
    /// writes, once it has read, keep the whole pages they write there. See
    /// `file_pages.rs`.
    pub fn read_through_pages(&self, fh: FileHandle) {
        if let Ok(handle) = self.sh.handle(fh) {
            handle.through_pages.store(true, Ordering::Release);
        }
    }

    /// Whether the kernel may have cached pages of the file behind `fh` since the last
    /// call; the caller drops them from the kernel next.
    pub fn take_kernel_pages(&self, fh: FileHandle) -> bool {
        self.sh.handle(fh).is_ok_and(|handle| handle.file.take_kernel_pages())
    }

    /// Reads up to `len` bytes at `offset`; shorter only at the end of the file. Needs
    /// a shared cap, so that another client's buffered writes landed first.
    pub async fn read(&self, fh: FileHandle, offset: u64, len: u32) -> Result<Bytes, FsError> {
        let handle = self.sh.handle(fh)?;
        if handle.page_cached.load(Ordering::Acquire) {
            handle.file.note_kernel_pages();
        }
        handle.has_read.store(true, Ordering::Release);
        let access = self.access(handle.file.ino, CapMode::Shared).await?;
        let ahead = handle.readahead.lock().expect("readahead lock poisoned").observe(
            offset,
            u64::from(len),
            self.sh.chunk_size,
        );
        // Nothing is fetched ahead without a cap: it could not be dropped on a change.
        let ahead = match access {
            Access::Capped { .. } => ahead,
            Access::Uncapped { .. } => 0..0,
        };
        handle.file.read(&self.sh, offset, len, ahead, handle.cached(&access)).await
    }

    /// Writes `data` at `offset`. Under an exclusive cap it is buffered and sent in the
    /// background, and errors show up in a later write, flush, fsync or release; while
    /// the cap is being recalled it is written through.
    pub async fn write(&self, fh: FileHandle, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let handle = self.sh.handle(fh)?;
        offset.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
        let access = self.access(handle.file.ino, CapMode::Exclusive).await?;
        self.check_session(&handle)?;
        handle.file.write(&self.sh, offset, data, &handle.errors, handle.cached(&access)).await?;
        if let Access::Uncapped { .. } = access {
            // The recall stops counting this write once it is buffered: it neither
            // waits for its chunk write nor for its commit (`FileState::flush_recalled`),
            // which may wait at meta for the session this recall serves (caps.md
            // invariant 29). An append keeps its count to the end: its offset is only
            // taken once its commit is in.
            drop(access);
            handle.file.flush(&self.sh, &handle.errors).await?;
        }
        Ok(data.len() as u32)
    }

    /// Appends `data` at the end of the file as every client sees it (`O_APPEND`): the
    /// offset is chosen under an exclusive cap, so appends from many clients never
    /// overlap. Returns the offset written at.
    pub async fn write_append(&self, fh: FileHandle, data: &[u8]) -> Result<u64, FsError> {
        let handle = self.sh.handle(fh)?;
        let _one_at_a_time = self.sh.appending.lock().await;
        let access = self.access(handle.file.ino, CapMode::Exclusive).await?;
        let offset = self.size_under_cap(&handle).await?;
        offset.checked_add(data.len() as u64).ok_or(FsError::TooBig)?;
        self.check_session(&handle)?;
        handle.file.write(&self.sh, offset, data, &handle.errors, handle.cached(&access)).await?;
        if let Access::Uncapped { .. } = access {
            handle.file.flush(&self.sh, &handle.errors).await?;
        }
        Ok(offset)
    }

    /// `fallocate(2)` of `len` bytes at `offset`. Stoa keeps no blocks ahead of their
    /// bytes, so reserving space only makes the file at least `offset + len` long, or
    /// nothing with `keep_size`; a hole punched or a range zeroed (`zero`) reads as
    /// zeros where it lies within the file ([`Client::zero`]), and a zeroed range past
    /// the end grows it unless `keep_size`. Made under an exclusive cap, as an append
    /// is: the size it goes by is the one every mount sees, so it never cuts what
    /// another mount wrote past it.
    pub async fn fallocate(
        &self,
        fh: FileHandle,
        offset: u64,
        len: u64,
        zero: bool,
        keep_size: bool,
    ) -> Result<(), FsError> {
        let handle = self.sh.handle(fh)?;
        let end = offset.checked_add(len).ok_or(FsError::TooBig)?;
        let _one_at_a_time = self.sh.appending.lock().await;
        let ino = handle.file.ino;
        let access = self.access(ino, CapMode::Exclusive).await?;
        let size = self.size_under_cap(&handle).await?;
        self.check_session(&handle)?;
        // Past the end, the file grows below, and reads zeros there.
        let zeroed = end.min(size);
        if zero && offset < zeroed {
            self.zero(&handle, offset, zeroed, handle.cached(&access)).await?;
        }
        if end > size && !keep_size {
            let sent = self.sh.caps.epoch();
            let set = SetAttr { size: Some(end), ..SetAttr::default() };
            let attr = handle.file.truncate(&self.sh, set, size).await?;
            self.sh.caps.update_attr(attr, sent);
        }
        if let Access::Uncapped { .. } = access {
            handle.file.flush(&self.sh, &handle.errors).await?;
        }
        Ok(())
    }

    /// Makes `[start, end)` of the handle's file read as zeros: its whole chunks are
    /// punched out (those that hold data are cut to nothing and take no space), and the
    /// parts of chunks at its ends are written with zeros. Writing zeros over all of it
    /// took as long as the range was large: 1 PiB of a sparse file, for ever.
    async fn zero(
        &self,
        handle: &OpenHandle,
        start: u64,
        end: u64,
        cached: Cached,
    ) -> Result<(), FsError> {
        let cs = u64::from(self.sh.chunk_size);
        let whole = start.div_ceil(cs)..end / cs;
        let mut written = [start..end, end..end];
        if !whole.is_empty() {
            let sent = self.sh.caps.epoch();
            let attr = handle.file.punch(&self.sh, whole.clone()).await?;
            self.sh.caps.update_attr(attr, sent);
            written = [start..whole.start * cs, whole.end * cs..end];
        }
        let zeros = vec![0u8; ZERO_PIECE.min(end - start) as usize];
        for piece in written {
            let mut at = piece.start;
            while at < piece.end {
                let n = ZERO_PIECE.min(piece.end - at) as usize;
                handle.file.write(&self.sh, at, &zeros[..n], &handle.errors, cached).await?;
                at += n as u64;
            }
        }
        Ok(())
    }

    /// The size of the handle's file as every mount sees it, for a caller holding its
    /// exclusive cap.
    async fn size_under_cap(&self, handle: &OpenHandle) -> Result<u64, FsError> {
        if let Some(size) = handle.file.lock().size() {
            return Ok(size);
        }
        let attr = self.sh.session.call_attr(MetaOp::GetAttr { ino: handle.file.ino }).await?;
        let mut inner = handle.file.lock();
        inner.learn(&attr);
        Ok(inner.size_of(&attr))
    }

    /// Sends the buffered writes of the handle's file and, unless the file is held
    /// exclusively (`FileState::close`), waits until every server of their chains
    /// applied them; the size commit follows in the background.
    pub async fn flush(&self, fh: FileHandle) -> Result<(), FsError> {
        let handle = self.sh.handle(fh)?;
        let flushed = handle.file.close(&self.sh, &handle.errors).await;
        let flushed = flushed.and_then(|()| self.check_session(&handle));
        self.forget_failed_writes(handle.file.ino, flushed).await
    }

    /// Flushes, then makes the file's data and attributes durable: its chunks on every
    /// replica, its size and times on meta.
    pub async fn fsync(&self, fh: FileHandle) -> Result<(), FsError> {
        self.sync(fh, Durability::All).await
    }

    /// `fdatasync`: as [`Client::fsync`], except that a file held exclusively whose size
    /// meta already has does not wait for the commit of its new mtime, which reading the
    /// data back after a crash does not need (POSIX `fdatasync`).
    pub async fn fdatasync(&self, fh: FileHandle) -> Result<(), FsError> {
        self.sync(fh, Durability::Data).await
    }

    async fn sync(&self, fh: FileHandle, what: Durability) -> Result<(), FsError> {
        let handle = self.sh.handle(fh)?;
        // The file's create (and every other change made before) is on meta first.
        self.sync_namespace().await;
        let synced = handle.file.fsync(&self.sh, &handle.errors, what).await;
        let synced = synced.and_then(|()| self.check_session(&handle));
        self.forget_failed_writes(handle.file.ino, synced).await
    }

    /// Fails for a handle opened in a session meta has expired since: what the client
    /// held in it (caps, locks, the open itself) may belong to others by now, so its
    /// writes must not land (docs/flows/caps.md, fencing).
    fn check_session(&self, handle: &OpenHandle) -> Result<(), FsError> {
        match handle.session == self.sh.session.id() {
            true => Ok(()),
            false => Err(expired_handle()),
        }
    }

    /// Flushes every file with buffered writes; returns the first error.
    pub async fn flush_all(&self) -> Result<(), FsError> {
        self.sync_namespace().await;
        let mut first = Ok(());
        for file in self.sh.files.all() {
            if let Err(e) = file.flush_unowned(&self.sh).await {
                tracing::warn!("flushing inode {} failed: {e}", file.ino);
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Flushes everything and ends the session, which releases every file it has open.
    pub async fn close(&self) -> Result<(), FsError> {
        let flushed = self.flush_all().await;
        // Stop renewing first: a renewal after the close would open a new session.
        self.sh.stop_renewal();
        self.sh.stop_events();
        let session = self.sh.session.id();
        match self.sh.session.call_in(session, MetaOp::CloseSession).await {
            Ok(_) | Err(FsError::SessionExpired) => {}
            Err(e) => return Err(e),
        }
        flushed
    }

    /// What this client is still waiting for, in one line for a log: how far meta has
    /// answered its queued namespace changes and size commits, the caps it is recalling
    /// and the files with writes or commits outstanding. The mount logs it when a
    /// request has waited long (`stoa-fuse` `slow.rs`).
    pub fn busy(&self) -> String {
        let (changes_done, changes) = self.sh.session.backlog.position();
        let (commits_done, commits) = self.sh.dirops.commit_log.position();
        let mut parts = vec![
            format!("namespace changes answered {changes_done} of {changes}"),
            format!("size commits answered {commits_done} of {commits}"),
        ];
        parts.extend(self.sh.caps.busy());
        let files = self.sh.files.all();
        let busy =
            |f: &Arc<FileState>| f.lock().busy().map(|busy| format!("inode {}: {busy}", f.ino));
        parts.extend(files.iter().filter_map(busy));
        parts.join("; ")
    }

    /// Corrects attributes from meta with what this client knows better: the size of a
    /// file it is writing, and the mtime of overwrites whose commit it holds (`HeldTimes`).
    pub(crate) fn adjust(&self, mut attr: Attr) -> Attr {
        let file = self.sh.files.get(attr.ino);
        if let Some(file) = file {
            let capped = self.sh.caps.holds(attr.ino, CapMode::Shared);
            let mut inner = file.lock();
            // A size learnt without a cap may be stale by the next read.
            if capped {
                inner.learn_cached(&attr);
            }
            attr.size = inner.size_of(&attr);
            if let Some(at) = inner.held_mtime() {
                attr.mtime = at;
                attr.ctime = attr.ctime.max(at);
            }
        }
        attr
    }

    /// `attr`, from meta, as the kernel is to get it ([`Client::adjust`]), unless this
    /// client has seen a newer version of the inode (`seen`: before a forget dropped
    /// it), which the kernel must not be given an older one after: answers of calls meta
    /// served in one order can arrive in another (a size commit's before a grant read
    /// ahead of it). Then meta is asked again, after that newer answer arrived, so its
    /// answer is at least as new.
    pub(crate) async fn newest(&self, attr: Attr, seen: bool) -> Result<Attr, FsError> {
        let attr = self.adjust(attr);
        if !seen && !self.sh.caps.knows_newer(&attr) {
            return Ok(attr);
        }
        tracing::trace!(ino = attr.ino.0, version = attr.version, "older than seen: asked again");
        let fresh = self.sh.session.call_attr(MetaOp::GetAttr { ino: attr.ino }).await?;
        Ok(self.adjust(fresh))
    }
}

impl Shared {
    /// The open handle `fh`; `EIO` if it belongs to a session meta expired.
    fn handle(&self, fh: FileHandle) -> Result<Arc<OpenHandle>, FsError> {
        let handle = {
            let handles = self.handles.lock().expect("handles lock poisoned");
            handles
                .get(&fh.0)
                .cloned()
                .ok_or_else(|| FsError::Invalid(format!("unknown handle {}", fh.0)))?
        };
        if handle.session != self.session.id() {
            return Err(expired_handle());
        }
        Ok(handle)
    }

    fn stop_events(&self) {
        if let Some(task) = self.events.lock().expect("events lock poisoned").take() {
            task.abort();
        }
    }

    fn stop_renewal(&self) {
        if let Some(task) = self.renewal.lock().expect("renewal lock poisoned").take() {
            task.abort();
        }
    }
}

pub(crate) fn expired_handle() -> FsError {
    FsError::Io("the meta session this file was opened in expired; reopen the file".into())
}
