//! Open directory streams.
//!
//! A stream walks the directory page by page from meta in name order, and keeps only the
//! entries the kernel may still ask for: those from the offset of its last request on
//! (a request at offset `o` means it took everything before). The FUSE offset of an
//! entry is its position in the stream (after `.` and `..`), so entries created or
//! removed while a reader walks the directory never shift the offsets it already holds.
//! A request before the kept entries (`seekdir` back) lists again from the start; a
//! rewind to offset 0 starts a fresh listing.
//!
//! Each open handle also keeps the directory's attributes as they were when it was
//! opened. A directory removed while a handle holds it open is gone from meta, but the
//! handle still names it: `fstat` through it answers those attributes with no links,
//! a listing through it ends at once, and opening it again through the handle
//! (`/proc/self/fd/N`) gives another such handle, as on a local disk.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use stoa_client::{Attr, Client, DirEntry, FsError, InodeId, Pinned};

/// The stream of one open handle, shared by the kernel's requests on it.
pub type Stream = Arc<tokio::sync::Mutex<DirStream>>;

/// The directory handles the kernel holds open.
pub struct OpenDirs {
    by_handle: Mutex<HashMap<u64, OpenDir>>,
    next: AtomicU64,
}

struct OpenDir {
    /// The directory's attributes when the handle was opened.
    attr: Attr,
    stream: Stream,
}

impl Default for OpenDirs {
    fn default() -> OpenDirs {
        OpenDirs { by_handle: Mutex::new(HashMap::new()), next: AtomicU64::new(1) }
    }
}

impl OpenDirs {
    /// A new handle on the directory with attributes `attr`; `seen_lost` as in
    /// [`DirStream::seen_lost`].
    pub fn open(&self, attr: Attr, seen_lost: u64) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let stream = Arc::new(tokio::sync::Mutex::new(DirStream::new(attr.ino, seen_lost)));
        self.handles().insert(id, OpenDir { attr, stream });
        id
    }

    pub fn stream(&self, handle: u64) -> Option<Stream> {
        self.handles().get(&handle).map(|d| d.stream.clone())
    }

    pub fn close(&self, handle: u64) {
        self.handles().remove(&handle);
    }

    /// The attributes of `ino` as `getattr` and `opendir` answer them: from the client,
    /// or, for a directory meta no longer has that a handle holds open, those of
    /// [`OpenDirs::removed`], with no TTL.
    pub async fn attr(
        &self,
        client: &Client,
        ino: InodeId,
    ) -> Result<(Attr, Duration, Pinned), FsError> {
        match client.getattr_cached(ino).await {
            Err(FsError::NotFound) => match self.removed(ino) {
                Some(attr) => Ok((attr, Duration::ZERO, Pinned::none())),
                None => Err(FsError::NotFound),
            },
            r => r,
        }
    }

    /// The attributes of `ino`, a directory meta no longer has, if a handle still holds
    /// it open: those of its open, with no links.
    fn removed(&self, ino: InodeId) -> Option<Attr> {
        let handles = self.handles();
        let open = handles.values().find(|d| d.attr.ino == ino)?;
        Some(Attr { nlink: 0, ..open.attr.clone() })
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<u64, OpenDir>> {
        self.by_handle.lock().expect("open directories lock poisoned")
    }
}

/// Entries fetched from meta in the first page: most directories fit in it whole.
const FIRST_PAGE_ENTRIES: u32 = 1024;
/// Pages double up to this many entries (meta's own limit), so a large directory costs
/// a few dozen calls, not one per 256 entries.
const PAGE_ENTRIES_MAX: u32 = 4096;

pub struct DirStream {
    ino: InodeId,
    /// The client's count of lost namespace changes this handle has seen: at the open
    /// (`Client::lost_mark`), then through its fsyncs (`Client::lost_in`).
    pub seen_lost: u64,
    /// Stream position of `kept[0]`.
    start: usize,
    kept: VecDeque<DirEntry>,
    /// The name of the last entry fetched: the next page starts after it.
    last: Vec<u8>,
    /// Whether meta has more entries after `last`.
    more: bool,
    page: u32,
}

impl DirStream {
    pub fn new(ino: InodeId, seen_lost: u64) -> DirStream {
        DirStream {
            ino,
            seen_lost,
            start: 0,
            kept: VecDeque::new(),
            last: Vec::new(),
            more: true,
            page: FIRST_PAGE_ENTRIES,
        }
    }

    /// Forgets what was listed, so the next entries come fresh from meta.
    pub fn rewind(&mut self) {
        *self = DirStream::new(self.ino, self.seen_lost);
    }

    /// The kernel took every entry before position `i`: they are dropped.
    pub fn taken(&mut self, i: usize) {
        let n = i.saturating_sub(self.start).min(self.kept.len());
        self.kept.drain(..n);
        self.start += n;
    }

    /// The `i`-th entry of the stream (not counting `.` and `..`), fetching pages as
    /// needed; `None` past the end.
    pub async fn entry(&mut self, client: &Client, i: usize) -> Result<Option<&DirEntry>, FsError> {
        if i < self.start {
            self.rewind();
        }
        while i >= self.start + self.kept.len() && self.more {
            // Entries before `i` are only passed over (a seek forward, or after a rewind).
            self.taken(i);
            let (page, more) = client.readdir(self.ino, &self.last, self.page).await?;
            self.page = (self.page * 2).min(PAGE_ENTRIES_MAX);
            // An empty page that claims more would loop forever; treat it as the end.
            self.more = more && !page.is_empty();
            if let Some(e) = page.last() {
                self.last = e.name.clone();
            }
            self.kept.extend(page);
        }
        Ok(self.kept.get(i - self.start))
    }
}
