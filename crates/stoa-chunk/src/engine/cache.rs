//! Decoded headers of recently used chunks, so that a small read costs one read of the
//! data file, not also a read and decode of the header file; and the open data files of
//! the most recently read of them, so that it costs no open either.
//!
//! Invariant: an entry equals the header file on disk as this engine last wrote or read
//! it, and a file kept with it is the chunk's file at its path. Every header write and
//! removal, and every install (a new file renamed over the path), goes through the engine
//! under the chunk's stripe lock held for writing, and drops the entry (its file with it)
//! before touching the file (so a failed write leaves no stale entry) and puts the new
//! header in after, without a file. A file is kept only by a reader holding the stripe
//! for reading, which it opened at the path under that lock, or by a write holding it
//! for writing, once its header is in: the file it wrote, opened at the path under that
//! lock or taken from the entry under it. Rot of a header file while
//! it is cached does not reach readers (the cached copy is the good one); the scrubber
//! reads the file itself and finds it.

use super::header::Header;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::sync::{Arc, Mutex};
use stoa_types::ChunkId;

/// Bytes of CRCs kept (a 4 MiB chunk's header holds 4 KiB of them).
const CACHE_BYTES_MAX: usize = 16 << 20;
/// Open chunk files kept. On a 4 KiB read served from the page cache, the open and close
/// of the chunk's file (with its path built) were a sixth of the chunk server's CPU.
const FILES_MAX: usize = 256;

#[derive(Default)]
pub(crate) struct HeaderCache {
    inner: Mutex<Inner>,
}

/// What a read finds in the cache: the header, and the chunk's open file when kept.
pub(crate) struct ForRead {
    pub header: Arc<Header>,
    pub file: Option<Arc<File>>,
}

struct Entry {
    header: Arc<Header>,
    file: Option<Arc<File>>,
}

#[derive(Default)]
struct Inner {
    headers: HashMap<ChunkId, Entry>,
    /// Insertion order, oldest first, for eviction; may name entries already gone.
    order: VecDeque<ChunkId>,
    bytes: usize,
    /// Entries a file was kept with, oldest first; may name entries whose file is gone.
    opened: VecDeque<ChunkId>,
    /// Entries holding a file now.
    files: usize,
}

fn cost(h: &Header) -> usize {
    h.crcs.len() * 4 + 64
}

impl Inner {
    /// Takes an entry no longer in the map off the byte and file counts.
    fn uncount(&mut self, gone: &Entry) {
        self.bytes -= cost(&gone.header);
        self.files -= usize::from(gone.file.is_some());
    }

    fn remove(&mut self, chunk: ChunkId) {
        if let Some(gone) = self.headers.remove(&chunk) {
            self.uncount(&gone);
        }
    }
}

impl HeaderCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("header cache poisoned")
    }

    /// A copy of the chunk's header, for a change to make from it.
    pub fn get(&self, chunk: ChunkId) -> Option<Header> {
        self.lock().headers.get(&chunk).map(|e| Header::clone(&e.header))
    }

    /// The chunk's header and kept file, shared: no copy of the CRCs.
    pub fn for_read(&self, chunk: ChunkId) -> Option<ForRead> {
        let inner = self.lock();
        let e = inner.headers.get(&chunk)?;
        Some(ForRead { header: e.header.clone(), file: e.file.clone() })
    }

    /// The chunk's file kept open, if any.
    pub fn kept_file(&self, chunk: ChunkId) -> Option<Arc<File>> {
        self.lock().headers.get(&chunk)?.file.clone()
    }

    pub fn put(&self, header: &Header) {
        let mut inner = self.lock();
        let entry = Entry { header: Arc::new(header.clone()), file: None };
        match inner.headers.insert(header.chunk, entry) {
            Some(old) => inner.uncount(&old),
            None => inner.order.push_back(header.chunk),
        }
        inner.bytes += cost(header);
        while inner.bytes > CACHE_BYTES_MAX {
            let Some(oldest) = inner.order.pop_front() else { break };
            inner.remove(oldest);
        }
    }

    /// Keeps `file`, the chunk's file at its path (see the invariant above), with
    /// the chunk's entry (if it has one and no file yet), giving up the file kept longest
    /// when [`FILES_MAX`] are open.
    pub fn keep_file(&self, chunk: ChunkId, file: &Arc<File>) {
        let mut inner = self.lock();
        match inner.headers.get_mut(&chunk) {
            Some(e) if e.file.is_none() => e.file = Some(file.clone()),
            _ => return,
        }
        inner.files += 1;
        inner.opened.push_back(chunk);
        while inner.files > FILES_MAX {
            let Some(oldest) = inner.opened.pop_front() else { break };
            if let Some(e) = inner.headers.get_mut(&oldest) {
                inner.files -= usize::from(e.file.take().is_some());
            }
        }
        if inner.opened.len() > 2 * FILES_MAX {
            let Inner { headers, opened, .. } = &mut *inner;
            let mut seen = HashSet::new();
            opened.retain(|c| headers.get(c).is_some_and(|e| e.file.is_some()) && seen.insert(*c));
        }
    }

    pub fn forget(&self, chunk: ChunkId) {
        self.lock().remove(chunk);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().headers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_types::InodeId;

    fn header(index: u64, blocks: usize) -> Header {
        let chunk = ChunkId { ino: InodeId(1), index };
        Header {
            chunk,
            generation: 1,
            version: 1,
            len: (blocks * 4096) as u32,
            crcs: vec![7; blocks],
            writes: vec![],
        }
    }

    #[test]
    fn keeps_what_was_put_and_forgets_on_request() {
        let c = HeaderCache::default();
        let h = header(1, 3);
        c.put(&h);
        assert_eq!(c.get(h.chunk), Some(h.clone()));
        let newer = Header { version: 2, ..h.clone() };
        c.put(&newer);
        assert_eq!(c.get(h.chunk), Some(newer));
        c.forget(h.chunk);
        assert_eq!(c.get(h.chunk), None);
    }

    #[test]
    fn stays_within_its_byte_budget_dropping_the_oldest() {
        let c = HeaderCache::default();
        let blocks = 1024;
        let fit = CACHE_BYTES_MAX / cost(&header(0, blocks));
        for i in 0..(fit as u64 + 10) {
            c.put(&header(i, blocks));
        }
        assert!(c.len() <= fit, "{} entries, budget {fit}", c.len());
        assert_eq!(c.get(header(0, blocks).chunk), None, "the oldest stayed");
        assert!(c.get(header(fit as u64 + 9, blocks).chunk).is_some(), "the newest went");
        // Forgotten and re-put entries keep the byte count exact.
        c.forget(header(fit as u64 + 9, blocks).chunk);
        c.put(&header(fit as u64 + 9, blocks));
        assert!(c.lock().bytes <= CACHE_BYTES_MAX);
    }

    #[test]
    fn keeps_a_bounded_number_of_files_and_drops_them_with_their_entry() {
        let c = HeaderCache::default();
        let file = Arc::new(File::open("/dev/null").unwrap());
        c.keep_file(header(0, 1).chunk, &file);
        assert!(c.for_read(header(0, 1).chunk).is_none(), "no entry, no file kept");
        for i in 0..(FILES_MAX as u64 + 10) {
            c.put(&header(i, 1));
            c.keep_file(header(i, 1).chunk, &file);
        }
        let kept = |i: u64| c.for_read(header(i, 1).chunk).unwrap().file.is_some();
        assert_eq!(c.lock().files, FILES_MAX);
        assert!(!kept(0) && kept(FILES_MAX as u64 + 9), "the file kept longest went first");
        // A new header for the chunk (its file was changed) and a forget drop the file.
        c.put(&header(FILES_MAX as u64 + 9, 1));
        assert!(!kept(FILES_MAX as u64 + 9));
        c.forget(header(FILES_MAX as u64 + 8, 1).chunk);
        assert_eq!(c.lock().files, FILES_MAX - 2);
        // Files dropped and kept again many times leave the order within its bound.
        for _ in 0..10 * FILES_MAX {
            c.put(&header(3 * FILES_MAX as u64, 1));
            c.keep_file(header(3 * FILES_MAX as u64, 1).chunk, &file);
        }
        assert!(c.lock().opened.len() <= 2 * FILES_MAX + 1);
        assert_eq!(Arc::strong_count(&file), c.lock().files + 1);
    }
}
