//! Reading ahead across small files: when whole small files are read in inode order
//! under caps, the client fetches the first chunks of the next files before they are
//! opened, so that their reads are answered from memory instead of waiting for a chunk
//! server each.
//!
//! ```text
//!  read from the start of a small file (at most SMALL_MAX bytes), under a cap
//!    --> a scan in inode order (stoa-types InodeScan: in order, window half used)?
//!    --> for each of the next FILES_AHEAD inodes that is a small file this client
//!        holds a cap on and has no state for: fetch its first chunk, kept in the file
//!        map (file.rs `Files::keep_fetched`) with the cap's identity
//!  open of such a file: its state is made and takes the fetch as its chunk 0 prefetch
//!  read of it under that same cap, within a second of the fetch: answered from it
//! ```
//!
//! A chunk server answers one small read in about 100 us here, most of it the two
//! processes' wake-ups; a scan of cold small files (a `cp -r`, `tar c`, a build reading
//! its sources) pays that per file, after the open and before the close.
//!
//! Invariant: a fetched chunk answers only a read that a chunk read would have answered
//! the same way.
//! - Other clients: it is served only to a read under the cap it was fetched under (a
//!   cap's identity is never reused), so nobody else wrote the file in between: a
//!   writer needs the exclusive cap, and its grant recalls this one.
//! - This client: a file with a state here is not fetched (its writes go through that
//!   state), and a state made later takes the fetch under the map's lock and drops it on
//!   every change this client makes (a write, a truncate, the cap gone). A state is
//!   dropped only once its writes are done, so a fetch started after sees them.
//!
//! Bounded: one window per client, small files only, within the client's prefetch
//! budget; fetches nobody opened are dropped after a second.

use crate::client::Shared;
use crate::read::Prefetch;
use std::sync::{Arc, Mutex};
use stoa_proto::CapMode;
use stoa_types::{ChunkId, FileKind, InodeId, InodeScan};

/// The largest file whose first chunk is fetched ahead, and whose reads count in a scan:
/// what the kernel reads of a file in one request at its default readahead.
pub(crate) const SMALL_MAX: u64 = 128 * 1024;
/// How many following inodes a window covers.
const FILES_AHEAD: u64 = 16;

/// Where this client's scan of small files stands.
pub(crate) struct Neighbors {
    scan: Mutex<InodeScan>,
}

impl Default for Neighbors {
    fn default() -> Neighbors {
        Neighbors { scan: Mutex::new(InodeScan::new(FILES_AHEAD)) }
    }
}

impl Neighbors {
    /// Notes a read from the start of `ino`, a file of at most [`SMALL_MAX`] bytes read
    /// under a cap, and fetches ahead when the reads are a scan in inode order.
    pub fn on_read(sh: &Arc<Shared>, ino: InodeId) {
        // A run only starts fetches: none is ever in flight.
        let run = sh.neighbors.scan.lock().expect("scan lock poisoned").on_read(ino.0, true, false);
        for next in run.into_iter().flatten() {
            let ino = InodeId(next);
            let Some((attr, _)) = sh.caps.cached_attr(ino) else { continue };
            if attr.kind != FileKind::File || attr.size == 0 || attr.size > SMALL_MAX {
                continue;
            }
            let Some(cap) = sh.caps.held_id(ino, CapMode::Shared) else { continue };
            let (chunk, len) = (ChunkId { ino, index: 0 }, attr.size.min(sh.chunk_size.into()));
            sh.files.keep_fetched(ino, || Prefetch::start(sh, chunk, len as u32, Some(cap)));
        }
    }
}
