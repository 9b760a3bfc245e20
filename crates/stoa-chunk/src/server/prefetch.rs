//! Read-ahead across small files: when reads of whole small files come in inode order
//! and the first of them had to wait for the disk, the server warms its caches for the
//! files of the next inodes before they are asked for.
//!
//! ```text
//!  read of (ino, chunk 0) from offset 0
//!    --> the previous such read was of one of the SCAN_GAP_MAX inodes before (a scan
//!        in inode order; the window is stoa-types' `InodeScan`)?
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use stoa_types::{ChunkId, InodeId, InodeScan};

/// How many following inodes one run covers.
const FILES_AHEAD: u64 = 32;
/// Bytes of each file's first chunk warmed; a large file's own reads bring the rest.
const BYTES_EACH: u32 = 128 * 1024;

/// Where a scan in inode order stands, on this server.
pub(super) struct Prefetch {
    state: Mutex<InodeScan>,
    /// A run is in flight; set under `state`'s lock.
    busy: Arc<AtomicBool>,
}

impl Default for Prefetch {
    fn default() -> Prefetch {
        Prefetch { state: Mutex::new(InodeScan::new(FILES_AHEAD)), busy: Arc::default() }
    }
}

impl Prefetch {
    /// Called after each read of `chunk` from `offset`: starts a run on the blocking
    /// pool when the reads look like a scan of small files in inode order.
    pub fn on_read(&self, engine: &Arc<Engine>, chunk: ChunkId, offset: u32, missed: bool) {
        if chunk.index != 0 || offset != 0 {
            return;
        }
        let inodes = {
            let mut scan = self.state.lock().expect("prefetch state poisoned");
            let run = scan.on_read(chunk.ino.0, missed, self.busy.load(Ordering::Acquire));
            let Some(inodes) = run else { return };
            self.busy.store(true, Ordering::Release);
            inodes
        };
        let (engine, busy) = (engine.clone(), self.busy.clone());
        tokio::task::spawn_blocking(move || {
            for ino in inodes {
                engine.prefetch(ChunkId { ino: InodeId(ino), index: 0 }, BYTES_EACH);
            }
            busy.store(false, Ordering::Release);
        });
    }
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
        while prefetch.busy.load(Ordering::Acquire) {
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
}
