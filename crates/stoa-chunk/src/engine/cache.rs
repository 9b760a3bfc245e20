//! Decoded headers of recently used chunks, so that a small read costs one read of the
//! data file, not also a read and decode of the header file.
//!
//! Invariant: an entry equals the header file on disk as this engine last wrote or read
//! it. Every header write and removal goes through the engine under the chunk's stripe
//! lock held for writing, and drops the entry before touching the file (so a failed write
//! leaves no stale entry) and puts the new header in after. Rot of a header file while it
//! is cached does not reach readers (the cached copy is the good one); the scrubber reads
//! the file itself and finds it.

use super::header::Header;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use stoa_types::ChunkId;

/// Bytes of CRCs kept (a 4 MiB chunk's header holds 4 KiB of them).
const CACHE_BYTES_MAX: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct HeaderCache {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    headers: HashMap<ChunkId, Header>,
    /// Insertion order, oldest first, for eviction; may name entries already gone.
    order: VecDeque<ChunkId>,
    bytes: usize,
}

fn cost(h: &Header) -> usize {
    h.crcs.len() * 4 + 64
}

impl HeaderCache {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().expect("header cache poisoned")
    }

    pub fn get(&self, chunk: ChunkId) -> Option<Header> {
        self.lock().headers.get(&chunk).cloned()
    }

    pub fn put(&self, header: &Header) {
        let mut inner = self.lock();
        if let Some(old) = inner.headers.insert(header.chunk, header.clone()) {
            inner.bytes -= cost(&old);
        } else {
            inner.order.push_back(header.chunk);
        }
        inner.bytes += cost(header);
        while inner.bytes > CACHE_BYTES_MAX {
            let Some(oldest) = inner.order.pop_front() else { break };
            if let Some(gone) = inner.headers.remove(&oldest) {
                inner.bytes -= cost(&gone);
            }
        }
    }

    pub fn forget(&self, chunk: ChunkId) {
        let mut inner = self.lock();
        if let Some(gone) = inner.headers.remove(&chunk) {
            inner.bytes -= cost(&gone);
        }
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
}
