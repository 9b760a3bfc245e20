//! Read-ahead across small files: when reads of whole small files come in inode order
//! and the first of them had to wait for the disk, the server warms its caches for the
//! files of the next inodes before they are asked for.
//!
//! ```text
//!  read of (ino, chunk 0) from offset 0
//!    --> the previous such read was of one of the GAP_MAX inodes before (a scan in
//!        inode order)?
//!    --> it missed the page cache, or a window is open and ino is past its middle?
//!    --> prefetch chunk 0 of ino+1 ..= ino+FILES_AHEAD it holds (blocking pool,
//!        one run at a time): header into the header cache, data readahead
//! ```
//!
//! A client numbers the files it creates from reserved ranges, so a burst of creates
//! (an untar, a copy of a tree, a build's outputs) is a run of consecutive inodes, and
//! such files are very often read back in the same order. Their chunk files are also
//! neighbours on this server's disk (engine/layout.rs). A read that waits for the disk
//! costs about 200 us here against about 40 us for one answered from memory on the
//! reactor, so a scan of cold small files runs at the disk's latency per file unless
//! the next files are already on their way. The client sends all reads of the first
//! chunks of 64 consecutive inodes to one replica (stoa-client chunk_io.rs) so that one
//! server sees the run.
//!
//! Invariant: prefetching changes no answer. It only fills caches that a read checks
//! as it always does (the chunk's lock, the header, every block's CRC); a prefetched
//! chunk that changes is read as it is then.
//!
//! Bounded: at most one run per server at a time, FILES_AHEAD files of at most
//! BYTES_EACH each; a run starts only on a miss or to extend a window a scan is using,
//! so random reads of small files and scans of cached ones prefetch nothing.

use crate::engine::Engine;
use std::ops::RangeInclusive;
use std::sync::{Arc, Mutex};
use stoa_types::{ChunkId, InodeId};

/// How many following inodes one run covers.
const FILES_AHEAD: u64 = 32;
/// The largest step between two inodes read one after the other that still counts as
/// a scan: in a cluster of more servers than a chain has, this server holds only some of
/// a run of inodes (each inode's chain is picked by a hash).
const GAP_MAX: u64 = 8;
/// Bytes of each file's first chunk warmed; a large file's own reads bring the rest.
const BYTES_EACH: u32 = 128 * 1024;

/// Where a scan in inode order stands, on this server.
#[derive(Default)]
pub(super) struct Prefetch {
    state: Arc<Mutex<Window>>,
}

#[derive(Default, Debug, PartialEq, Eq)]
struct Window {
    /// The inode of the last read of a first chunk from its start.
    last: Option<u64>,
    /// The last inode the current window covers (0: none).
    ahead: u64,
    /// A run is in flight.
    busy: bool,
}

impl Window {
    /// Notes a read of the first chunk of `ino` from its start that missed the page
    /// cache (`missed`) or not; the inodes to prefetch now, if any.
    fn on_read(&mut self, ino: u64, missed: bool) -> Option<RangeInclusive<u64>> {
        let in_order = self.last.is_some_and(|last| last < ino && ino - last <= GAP_MAX);
        self.last = Some(ino);
        // A window this read is not inside belongs to another scan, or is used up.
        if self.ahead <= ino || self.ahead > ino.saturating_add(FILES_AHEAD) {
            self.ahead = 0;
        }
        let start = if self.ahead == 0 { missed } else { self.ahead - ino <= FILES_AHEAD / 2 };
        if !in_order || self.busy || !start {
            return None;
        }
        let from = self.ahead.max(ino) + 1;
        let to = ino.saturating_add(FILES_AHEAD);
        self.ahead = to;
        self.busy = true;
        Some(from..=to)
    }
}

impl Prefetch {
    /// Called after each read of `chunk` from `offset`: starts a run on the blocking
    /// pool when the reads look like a scan of small files in inode order.
    pub fn on_read(&self, engine: &Arc<Engine>, chunk: ChunkId, offset: u32, missed: bool) {
        if chunk.index != 0 || offset != 0 {
            return;
        }
        let Some(inodes) = lock(&self.state).on_read(chunk.ino.0, missed) else {
            return;
        };
        let engine = engine.clone();
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            for ino in inodes {
                engine.prefetch(ChunkId { ino: InodeId(ino), index: 0 }, BYTES_EACH);
            }
            lock(&state).busy = false;
        });
    }
}

fn lock(state: &Mutex<Window>) -> std::sync::MutexGuard<'_, Window> {
    state.lock().expect("prefetch state poisoned")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn first(ino: u64) -> ChunkId {
        ChunkId { ino: InodeId(ino), index: 0 }
    }

    /// The whole path on a real store: two cold reads in order warm the next files, so
    /// their reads are answered from memory; files past the window stay cold, and
    /// inodes the store does not hold are passed over without creating anything.
    #[tokio::test]
    async fn two_cold_reads_in_inode_order_warm_the_next_files_of_the_store() {
        let dir = tempfile::tempdir().unwrap();
        let held: Vec<u64> = (1..=50).filter(|ino| ino % 5 != 0).collect();
        {
            let engine = Engine::open(dir.path()).unwrap();
            for &ino in &held {
                engine.write(first(ino), 0, &[ino as u8; 4096], None, None).unwrap();
            }
        }
        // A new engine has no header cached: every read would go to the blocking pool.
        let engine = Arc::new(Engine::open(dir.path()).unwrap());
        assert_eq!(engine.read_cached(first(3), 0, 4096), None);
        let prefetch = Prefetch::default();
        prefetch.on_read(&engine, first(1), 0, true);
        prefetch.on_read(&engine, first(2), 0, true);
        let deadline = Instant::now() + Duration::from_secs(10);
        while lock(&prefetch.state).busy {
            assert!(Instant::now() < deadline, "the prefetch run did not end");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        for ino in held.iter().copied().filter(|&ino| (3..=34).contains(&ino)) {
            assert_eq!(engine.read_cached(first(ino), 0, 4096), Some(vec![ino as u8; 4096]));
        }
        assert_eq!(engine.read_cached(first(36), 0, 4096), None);
        let listed: Vec<u64> = engine.list().unwrap().iter().map(|(c, _)| c.ino.0).collect();
        assert_eq!(listed.len(), held.len());
    }

    #[test]
    fn a_scan_in_inode_order_starts_on_a_miss_and_keeps_a_window_ahead() {
        let mut w = Window::default();
        // The first read of a scan cannot tell it is one.
        assert_eq!(w.on_read(98, true), None);
        // The next in order (this server may not hold every inode), which missed too,
        // starts a run.
        assert_eq!(w.on_read(101, true), Some(102..=133));
        // Nothing more while it runs, nor while the window is far enough ahead.
        assert_eq!(w.on_read(102, false), None);
        w.busy = false;
        assert_eq!(w.on_read(103, false), None);
        for ino in 104..117 {
            assert_eq!(w.on_read(ino, false), None, "{ino}");
        }
        // Half way through the window, hits extend it from where it ended.
        assert_eq!(w.on_read(117, false), Some(134..=149));
        w.busy = false;
        assert_eq!(w.on_read(118, false), None);
    }

    #[test]
    fn reads_out_of_order_or_of_cached_files_start_nothing() {
        let mut w = Window::default();
        for ino in [7, 3, 12, 40, 40 + GAP_MAX + 1, 9] {
            assert_eq!(w.on_read(ino, true), None, "{ino}");
        }
        // A scan of files that are all cached starts nothing either.
        let mut w = Window::default();
        for ino in 200..300 {
            assert_eq!(w.on_read(ino, false), None, "{ino}");
        }
    }

    #[test]
    fn a_window_another_scan_left_behind_does_not_stop_a_new_one() {
        let mut w = Window::default();
        assert_eq!(w.on_read(500, true), None);
        assert_eq!(w.on_read(501, true), Some(502..=533));
        w.busy = false;
        // Another scan, far below the window: it starts its own on its next miss.
        assert_eq!(w.on_read(10, true), None);
        assert_eq!(w.on_read(11, true), Some(12..=43));
        w.busy = false;
        // And one that jumped past the window's end.
        assert_eq!(w.on_read(90, true), None);
        assert_eq!(w.on_read(91, true), Some(92..=123));
    }
}
