//! The mount's own cache of file data, for the reads the kernel caches nothing of.
//!
//! A handle opened for writing goes around the kernel's page cache (caps.md invariant
//! 21), so without this every read of it (a database's pages, fio's mixed jobs, any
//! `O_RDWR` reader) is a round trip to a chunk server. Handles that read and write
//! through the mount keep the file's pages here instead, in 4 KiB pages, under the cap.
//!
//! ```text
//!  read (capped, handle reads through pages): every page whole here? -> answer
//!    else: read the page-aligned range (chunk servers + this client's dirty bytes)
//!          -> keep its pages if nothing changed since the read was asked (epoch)
//!  write (capped): patch the pages it touches; keep whole new pages if the handle
//!    reads through pages; a write past a short last page drops it
//!  write (uncapped, a recall is on), truncate, punch, failed write-behind, cap gone:
//!    drop every page; a read or write under another cap than the pages': the same
//! ```
//!
//! Invariant (caps.md invariant 37): a page kept here holds the file's bytes as any
//! client would read them, for as long as this client holds the cap on the file the
//! page was kept under. No other client changes the file's data while this one holds a
//! cap (a writer needs the exclusive cap, whose grant recalls every other); a recall
//! drops the pages after its flush and before its ack; and every cap has an identity
//! of its own (a cap dropped any other way, by a lapse of every cap or after this
//! client removed the file, and granted again is another), so pages kept under an
//! earlier cap are never served. Every change this client makes passes through here,
//! and a chunk server's answer is kept only if none did while it was on its way.
//!
//! Bounded: all files' pages together stay within the client's budget
//! ([`ClientConfig::data_cache_bytes`](crate::ClientConfig::data_cache_bytes)); a file
//! that would pass it gives up its own oldest pages first, and keeps nothing new if it
//! has none. Pages live as long as the file's state: until its last handle closes and
//! its writes are done, or the cap goes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The size of one cached page.
pub(crate) const PAGE: u64 = 4096;

/// The client-wide budget of cached pages.
#[derive(Clone)]
pub(crate) struct PagePool {
    used: Arc<AtomicUsize>,
    max_pages: usize,
}

impl PagePool {
    pub fn new(max_bytes: usize) -> PagePool {
        PagePool { used: Arc::new(AtomicUsize::new(0)), max_pages: max_bytes / PAGE as usize }
    }

    fn take(&self) -> bool {
        let before = self.used.fetch_add(1, Ordering::AcqRel);
        if before >= self.max_pages {
            self.used.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    fn give(&self, pages: usize) {
        self.used.fetch_sub(pages, Ordering::AcqRel);
    }
}

/// How a read or write meets the mount's pages of its file.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cached {
    /// Not under a cap: a write drops the pages, a read neither uses nor keeps them.
    No,
    /// Under the cap `cap` ([`Caps::held_id`](crate::caps::Caps::held_id)); `keep` when
    /// the handle reads through the pages.
    Under { cap: u64, keep: bool },
}

/// The cached pages of one file.
pub(crate) struct Pages {
    pool: PagePool,
    /// Page index to the file's bytes from its start; shorter than [`PAGE`] only for the
    /// page holding the end of the file.
    pages: HashMap<u64, Box<[u8]>>,
    /// Page indexes in the order they were kept, the oldest first; may name pages gone
    /// since (skipped when evicting, and compacted when it grows long).
    order: VecDeque<u64>,
    /// Bumped by every change; a read keeps what it fetched only if it is unchanged.
    epoch: u64,
    /// The cap the pages were kept under.
    cap: u64,
}

impl Pages {
    pub fn new(pool: PagePool) -> Pages {
        Pages { pool, pages: HashMap::new(), order: VecDeque::new(), epoch: 0, cap: 0 }
    }

    /// The change count a read notes before it asks the chunk servers.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The bytes `[offset, offset + len)` if every page holding them is here, whole
    /// enough, and kept under `cap`.
    pub fn get(&mut self, cap: u64, offset: u64, len: usize) -> Option<Vec<u8>> {
        self.enter(cap);
        if self.pages.is_empty() || len == 0 {
            return None;
        }
        let end = offset + len as u64;
        let mut out = Vec::with_capacity(len);
        let mut pos = offset;
        while pos < end {
            let (index, from, to) = Pages::span(pos, end);
            let page = self.pages.get(&index)?;
            if page.len() < to {
                return None;
            }
            out.extend_from_slice(&page[from..to]);
            pos = index * PAGE + to as u64;
        }
        Some(out)
    }

    /// Keeps `data`, the file's bytes from the page-aligned `offset`, as a read asked at
    /// `epoch` under `cap` found them; `eof` when they end where the file does (its
    /// short last page is kept too). Nothing is kept if anything changed since.
    pub fn fill(&mut self, epoch: u64, cap: u64, offset: u64, data: &[u8], eof: bool) {
        debug_assert_eq!(offset % PAGE, 0, "fills are page-aligned");
        if epoch != self.epoch || cap != self.cap {
            return;
        }
        for (i, bytes) in data.chunks(PAGE as usize).enumerate() {
            if bytes.len() < PAGE as usize && !eof {
                break;
            }
            let index = offset / PAGE + i as u64;
            if !self.pages.contains_key(&index) && !self.insert(index, bytes) {
                break;
            }
        }
    }

    /// A write of `data` at `offset` by this client: the pages it touches take its
    /// bytes; under [`Cached::No`] every page goes instead.
    pub fn write(&mut self, cached: Cached, offset: u64, data: &[u8]) {
        let Cached::Under { cap, keep } = cached else {
            self.clear();
            return;
        };
        self.enter(cap);
        self.epoch += 1;
        if self.pages.is_empty() && !keep {
            return;
        }
        let end = offset + data.len() as u64;
        let mut pos = offset;
        while pos < end {
            let (index, from, to) = Pages::span(pos, end);
            let bytes =
                &data[(pos - offset) as usize..(index * PAGE + to as u64 - offset) as usize];
            match self.pages.get_mut(&index) {
                Some(page) if to <= page.len() => page[from..to].copy_from_slice(bytes),
                // The page holding the end of the file, written on from within it.
                Some(page) if from <= page.len() => {
                    let mut grown = Vec::with_capacity(to);
                    grown.extend_from_slice(&page[..from]);
                    grown.extend_from_slice(bytes);
                    *page = grown.into_boxed_slice();
                }
                // Past a short last page: what lies between is not known here.
                Some(_) => self.remove(index),
                None if keep && from == 0 && to == PAGE as usize => {
                    self.insert(index, bytes);
                }
                None => {}
            }
            pos = index * PAGE + to as u64;
        }
    }

    /// Drops every page (a truncate or punch, a failed write-behind, the cap gone).
    pub fn clear(&mut self) {
        self.epoch += 1;
        self.pool.give(self.pages.len());
        self.pages.clear();
        self.order.clear();
    }

    /// Pages kept under another cap than `cap` are dropped: the cap went in between,
    /// and another client may have written meanwhile.
    fn enter(&mut self, cap: u64) {
        if cap != self.cap {
            self.clear();
            self.cap = cap;
        }
    }

    /// The page holding `pos` and the part of it, `[from, to)`, that lies before `end`.
    fn span(pos: u64, end: u64) -> (u64, usize, usize) {
        let index = pos / PAGE;
        let base = index * PAGE;
        (index, (pos - base) as usize, (end - base).min(PAGE) as usize)
    }

    /// Keeps one page within the budget, giving up this file's oldest pages for it.
    /// Returns whether it was kept.
    fn insert(&mut self, index: u64, bytes: &[u8]) -> bool {
        while !self.pool.take() {
            if !self.evict_oldest() {
                return false;
            }
        }
        self.pages.insert(index, bytes.into());
        self.order.push_back(index);
        if self.order.len() > 2 * self.pages.len() + 64 {
            let pages = &self.pages;
            self.order.retain(|i| pages.contains_key(i));
        }
        true
    }

    fn evict_oldest(&mut self) -> bool {
        while let Some(index) = self.order.pop_front() {
            if self.pages.remove(&index).is_some() {
                self.pool.give(1);
                return true;
            }
        }
        false
    }

    fn remove(&mut self, index: u64) {
        if self.pages.remove(&index).is_some() {
            self.pool.give(1);
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        self.pool.give(self.pages.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: usize = PAGE as usize;
    const CAP: u64 = 1;

    fn under(keep: bool) -> Cached {
        Cached::Under { cap: CAP, keep }
    }

    fn filled(pool: &PagePool, data: &[u8], eof: bool) -> Pages {
        let mut pages = Pages::new(pool.clone());
        pages.enter(CAP);
        let epoch = pages.epoch();
        pages.fill(epoch, CAP, 0, data, eof);
        pages
    }

    fn used(pool: &PagePool) -> usize {
        pool.used.load(Ordering::Acquire)
    }

    #[test]
    fn a_read_is_answered_only_when_every_page_is_here_and_long_enough() {
        let pool = PagePool::new(1 << 20);
        let data: Vec<u8> = (0..2 * P + 100).map(|i| i as u8).collect();
        let mut pages = filled(&pool, &data, true);
        assert_eq!(used(&pool), 3);
        assert_eq!(pages.get(CAP, 10, 2 * P + 90), Some(data[10..].to_vec()));
        assert_eq!(pages.get(CAP, 2 * P as u64, 101), None, "past the short last page");
        assert_eq!(pages.get(CAP, 3 * P as u64, 1), None, "a page never kept");
        // Not at the end of the file: the short page is not kept.
        let mut mid = filled(&pool, &data, false);
        assert_eq!(mid.get(CAP, 0, 2 * P), Some(data[..2 * P].to_vec()));
        assert_eq!(mid.get(CAP, 2 * P as u64, 1), None);
    }

    #[test]
    fn a_read_that_crossed_a_change_keeps_nothing() {
        let pool = PagePool::new(1 << 20);
        let mut pages = Pages::new(pool.clone());
        pages.enter(CAP);
        let epoch = pages.epoch();
        pages.write(under(false), 0, b"new");
        pages.fill(epoch, CAP, 0, &[0u8; P], false);
        assert_eq!(pages.get(CAP, 0, 3), None, "the old bytes must not be kept over the write");
        let epoch = pages.epoch();
        pages.clear();
        pages.fill(epoch, CAP, 0, &[0u8; P], false);
        assert_eq!(pages.get(CAP, 0, 1), None);
        assert_eq!(used(&pool), 0);
    }

    #[test]
    fn writes_patch_grow_or_drop_what_they_touch() {
        let pool = PagePool::new(1 << 20);
        let data = vec![1u8; P + 10];
        let mut pages = filled(&pool, &data, true);
        // Within a page, and on past the end of the short last page.
        pages.write(under(false), 5, b"ab");
        pages.write(under(false), P as u64 + 8, b"xyzw");
        let mut want = data.clone();
        want[5..7].copy_from_slice(b"ab");
        want.truncate(P + 8);
        want.extend_from_slice(b"xyzw");
        assert_eq!(pages.get(CAP, 0, P + 12), Some(want));
        // A write leaving a gap after the short last page drops it.
        pages.write(under(false), P as u64 + 100, b"q");
        assert_eq!(pages.get(CAP, P as u64, 1), None);
        // A whole page not here is kept only for a handle that reads through pages.
        pages.write(under(false), 4 * PAGE, &[7u8; P]);
        assert_eq!(pages.get(CAP, 4 * PAGE, 1), None);
        pages.write(under(true), 4 * PAGE, &[7u8; P]);
        assert_eq!(pages.get(CAP, 4 * PAGE, P), Some(vec![7u8; P]));
        // Not whole: not kept.
        pages.write(under(true), 6 * PAGE, &[7u8; P - 1]);
        assert_eq!(pages.get(CAP, 6 * PAGE, 1), None);
    }

    #[test]
    fn an_uncapped_write_or_another_cap_drops_every_page() {
        let pool = PagePool::new(1 << 20);
        let mut pages = filled(&pool, &[3u8; 2 * P], false);
        pages.write(Cached::No, 0, b"x");
        assert_eq!(pages.get(CAP, PAGE, 1), None);
        assert_eq!(used(&pool), 0);
        let mut pages = filled(&pool, &[3u8; 2 * P], false);
        assert_eq!(pages.get(CAP + 1, PAGE, 1), None);
        assert_eq!(pages.get(CAP, PAGE, 1), None, "gone, not only hidden");
        assert_eq!(used(&pool), 0);
    }

    #[test]
    fn the_budget_holds_over_every_file_and_a_file_gives_up_its_oldest_pages() {
        let pool = PagePool::new(4 * P);
        let mut a = filled(&pool, &[1u8; 3 * P], false);
        let mut b = Pages::new(pool.clone());
        b.enter(CAP);
        let epoch = b.epoch();
        b.fill(epoch, CAP, 0, &[2u8; 3 * P], false);
        assert_eq!(used(&pool), 4, "b holds one page at a time: the newest");
        assert_eq!(b.get(CAP, 0, 1), None);
        assert!(b.get(CAP, 2 * PAGE, P).is_some());
        // a makes room from its own oldest pages.
        a.write(under(true), 8 * PAGE, &[9u8; 2 * P]);
        assert_eq!(used(&pool), 4);
        assert_eq!(a.get(CAP, 0, 1), None);
        assert_eq!(a.get(CAP, PAGE, 1), None);
        assert!(a.get(CAP, 2 * PAGE, P).is_some());
        assert!(a.get(CAP, 8 * PAGE, 2 * P).is_some());
        drop(a);
        drop(b);
        assert_eq!(used(&pool), 0);
    }
}
