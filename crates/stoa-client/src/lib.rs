//! The Stoa client library: the VFS that the FUSE mount (and any other front end) sits
//! on. It talks to any meta replica for the namespace and directly to chunk servers for
//! data, and knows nothing of FUSE.
//!
//! ```text
//!  front end (stoa-fuse, tests, tools)
//!      |  Client: ops by inode, file handles
//!      v
//!  namespace.rs --------------------------------> session.rs --> meta replicas
//!  client.rs: handles, open files                  (session id + request id per
//!      |                                             mutation; MetaClient failover)
//!      v
//!  file.rs: write buffer -> queue -> chunk writes -> CommitWrite
//!  read.rs: size check -> flush dirty range -> prefetched chunk or chunk read
//!           (neighbors.rs: the next small files' first chunks, fetched ahead of a scan)
//!      |
//!      v
//!  chunk_io.rs: head for writes, any member for reads, retry with a fresh
//!               chain table (chains.rs) for up to 30 s, then EIO
//! ```
//!
//! Pure parts, tested alone: `split` (byte ranges into chunk pieces), `write_buffer`
//! (coalescing dirty extents), `readahead` (sequential-read detection).

mod caps;
mod chains;
mod chunk_io;
mod client;
mod dirops;
mod file;
mod file_pages;
mod locks;
mod namespace;
mod neighbors;
mod read;
mod readahead;
mod session;
mod split;
mod write_buffer;

pub use caps::{KernelCache, Pinned};
pub use client::{Client, ClientConfig, FileHandle, CAPS_MAX_DEFAULT, DATA_CACHE_DEFAULT};
pub use locks::LockRequest;
pub use namespace::Owner;
pub use stoa_proto::{FileLock, LockKind};
pub use stoa_types::{Attr, DirEntry, FileKind, FsError, InodeId, SetAttr, SetTime, StatFs};
