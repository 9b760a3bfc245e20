//! The chunk engine: chunks as files on local disk, each 4 KiB block with a CRC32C, and
//! the version rules that make chain replication idempotent. No network, no clock, and
//! every call blocks: the server runs them on tokio's blocking pool.
//!
//! ```text
//!  DATA/chunks/<ab>/<chunk id>.chunk   one file per chunk:
//!      [0, SLOT_LEN)                    header slot 0 (see header.rs)
//!      [SLOT_LEN, DATA_AT)              header slot 1
//!      [DATA_AT, DATA_AT + length)      the bytes, written in place
//!  DATA/chunks/LAYOUT                  chunk layout 3: which directory <ab> holds a chunk,
//!                                      and this file format (layout.rs)
//! ```
//!
//! A slot is as long as the header of the largest chunk; what a small chunk does not use
//! of it is a hole, which takes no disk space. One file per chunk, its header rewritten
//! in place, means a new chunk costs one inode and a change none: chunk layout 2 kept the
//! header in a second file replaced by rename, so every change allocated an inode and
//! freed one, and a burst of small files cost two inodes each per server (ext4 without a
//! journal made later creates scan past the freed ones; docs/BENCHMARKS.md).
//!
//! Crash safety: a change writes the data first (in place, whole touched blocks), then
//! its header, with the next generation, to the slot the current header is not in. A
//! crash before the header write leaves the old header, whose CRCs disagree with the new
//! data, which every read detects as `Checksum` (never silently wrong data); a crash
//! during it leaves that slot torn and the other one whole. A torn slot is only possible
//! after an unclean stop, which the engine notes (the `DIRTY` marker survives it): then
//! the whole slot is taken, as the old header it is, and the resync after an unclean
//! stop verifies every chunk it would otherwise keep. After a clean stop a damaged slot
//! is rot, and the chunk reads as damaged until it is repaired.
//!
//! Nothing here is fsynced on the write path: `Sync` (the client's fsync) fdatasyncs the
//! chunk file and fsyncs the directory that holds it if a name in it changed since its
//! last fsync (dirs.rs). Writes of 1 MiB or more ask the
//! kernel to start their writeback at once (no waiting), so that a large file reaches
//! the disk while it streams in rather than all at its fsync.
//!
//! Decoded headers of recently used chunks stay in memory (cache.rs), so a small read
//! reads only the data.
//!
//! Locking: operations on one chunk are serialized by one of [`LOCK_STRIPES`] read-write
//! locks picked by the chunk id, so different chunks proceed in parallel and a read never
//! sees a half-applied write.

mod cache;
mod dirs;
mod header;
mod layout;
#[cfg(test)]
mod tests;

use cache::HeaderCache;
use dirs::DirSyncs;
use header::{Header, Slot, BLOCK};
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use stoa_proto::ChunkListing;
use stoa_types::{ChunkId, FsError, InodeId, WriteId, WriteRecord};

/// The largest chunk the engine stores; a frame payload carries at most a little more.
pub const CHUNK_LEN_MAX: u32 = 64 * 1024 * 1024;
const LOCK_STRIPES: usize = 256;
/// The longest read [`Engine::read_cached`] tries on the reactor. On a range that is not
/// in the page cache, `RWF_NOWAIT` starts the readahead of the whole range on the
/// calling thread (pages allocated, I/O submitted) before it gives up: 1.4-5.9 ms for a
/// 4 MiB chunk fetched ahead of a sequential reader, a stall of the reactor every other
/// request on it waited out. A longer read costs the blocking pool's two wake-ups,
/// small beside its copy and checksums.
const CACHED_READ_MAX: u32 = 128 * 1024;
/// Writes at least this large start their writeback at once (see `start_writeback`).
const WRITEBACK_MIN_BYTES: usize = 1 << 20;
pub(crate) const CHUNK_EXT: &str = "chunk";
/// What a chunk file being written whole (an install) is named until its rename over the
/// real name: `<chunk id>.chunk.tmp`.
const TMP_EXT: &str = "tmp";
/// Bytes of one header slot: the longest header of the largest chunk, in whole pages.
const SLOT_LEN: u64 = header::len_max(CHUNK_LEN_MAX as usize / BLOCK).next_multiple_of(4096) as u64;
/// Where a chunk's data starts in its file, after the two header slots.
pub(crate) const DATA_AT: u64 = 2 * SLOT_LEN;
/// What a first read of a header slot takes: the whole header of a chunk up to ~3.5 MiB.
const SLOT_READ_FIRST: usize = 4096;

/// What a versioned mutation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; the chunk is now at this version.
    Applied(u64),
    /// Not applied, because the chunk already was at this version or newer.
    Skipped(u64),
    /// Not applied at the head, because an earlier attempt of the same client mutation
    /// (same [`WriteId`]) made `version`; the chunk is at `local` now.
    Duplicate { version: u64, local: u64 },
}

impl Outcome {
    /// The version this mutation made (for a duplicate, the one its first attempt made).
    pub fn version(self) -> u64 {
        match self {
            Outcome::Applied(v) | Outcome::Skipped(v) | Outcome::Duplicate { version: v, .. } => v,
        }
    }
}

/// A whole chunk as [`Engine::fetch`] reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkCopy {
    /// 0 when the chunk does not exist.
    pub version: u64,
    pub data: Vec<u8>,
    /// The mutations the chunk remembers (see [`WriteId`]).
    pub writes: Vec<WriteRecord>,
}

/// A chunk's header as found on disk.
enum Local {
    Absent,
    Present(Header),
    Corrupt(String),
}

impl Local {
    /// The generation of the header in the chunk's file: 0 for a chunk without one,
    /// None when a slot is damaged (see [`Engine::save_header`]).
    fn generation(&self) -> Option<u64> {
        match self {
            Local::Absent => Some(0),
            Local::Present(h) => Some(h.generation),
            Local::Corrupt(_) => None,
        }
    }

    /// The version replication compares: a damaged header counts as nothing, so that a
    /// peer's copy replaces it.
    fn version(&self) -> u64 {
        match self {
            Local::Present(h) => h.version,
            Local::Absent | Local::Corrupt(_) => 0,
        }
    }
}

/// The version rule for a mutation arriving with `incoming` (None: at the head, which
/// assigns the next version). Returns the version to apply, or `None` to skip.
fn admit(local: &Local, chunk: ChunkId, incoming: Option<u64>) -> Result<Option<u64>, FsError> {
    match (local, incoming) {
        (Local::Corrupt(detail), None) => {
            Err(FsError::Checksum(format!("chunk {chunk}: {detail}")))
        }
        // A successor with a damaged header asks its predecessor for the whole chunk.
        (Local::Corrupt(_), Some(_)) => Err(FsError::Stale),
        (_, None) => Ok(Some(local.version() + 1)),
        (_, Some(v)) if local.version() >= v => Ok(None),
        (_, Some(v)) if local.version() + 1 == v => Ok(Some(v)),
        (_, Some(_)) => Err(FsError::Stale),
    }
}

/// A client mutation arriving at the head (`incoming` None) that this chunk already
/// applied: its outcome, so that a retry after a lost reply does not apply it again.
fn duplicate(local: &Local, incoming: Option<u64>, id: Option<WriteId>) -> Option<Outcome> {
    match (local, incoming, id) {
        (Local::Present(h), None, Some(id)) => {
            h.applied(id).map(|version| Outcome::Duplicate { version, local: h.version })
        }
        _ => None,
    }
}

struct Paths {
    /// Which fan-out directory: `dir` is `chunks/<fan, 2 hex digits>`.
    fan: u8,
    dir: PathBuf,
    /// `<chunk id>.chunk`: the headers and the data.
    file: PathBuf,
    /// `<chunk id>.chunk.tmp`: an install being written.
    tmp: PathBuf,
}

/// The chunk store of one data directory.
pub struct Engine {
    chunks_dir: PathBuf,
    dirty_marker: PathBuf,
    stripes: Vec<RwLock<()>>,
    opened_dirty: bool,
    headers: HeaderCache,
    dirs: DirSyncs,
}

impl Engine {
    /// Opens (creating if needed) the store under `data_dir`. The caller holds the data
    /// directory's lock, so no other process shares the store.
    pub fn open(data_dir: &Path) -> Result<Engine, FsError> {
        let chunks_dir = data_dir.join("chunks");
        std::fs::create_dir_all(&chunks_dir)
            .map_err(|e| io_err(format!("create {}", chunks_dir.display()), e))?;
        layout::ensure(&chunks_dir)?;
        let dirty_marker = data_dir.join("DIRTY");
        let opened_dirty = dirty_marker.exists();
        File::create(&dirty_marker)
            .and_then(|_| File::open(data_dir)?.sync_all())
            .map_err(|e| io_err(format!("create {}", dirty_marker.display()), e))?;
        // The fan-out directories' own names: made once each, durable from here on.
        File::open(&chunks_dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(format!("sync {}", chunks_dir.display()), e))?;
        if opened_dirty {
            tracing::warn!("chunk store {} was not shut down cleanly", data_dir.display());
        }
        let stripes = (0..LOCK_STRIPES).map(|_| RwLock::new(())).collect();
        Ok(Engine {
            chunks_dir,
            dirty_marker,
            stripes,
            opened_dirty,
            headers: HeaderCache::default(),
            dirs: DirSyncs::new(),
        })
    }

    /// Whether the last process using this store stopped without [`Engine::close_clean`]:
    /// then a chunk may have data newer than its header.
    pub fn opened_dirty(&self) -> bool {
        self.opened_dirty
    }

    /// Flushes the whole filesystem holding the store and clears the unclean-stop marker.
    pub fn close_clean(&self) -> Result<(), FsError> {
        let dir = File::open(&self.chunks_dir)
            .map_err(|e| io_err(format!("open {}", self.chunks_dir.display()), e))?;
        // SAFETY: syncfs only reads the descriptor, which `dir` keeps open.
        if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
            return Err(io_err("syncfs the chunk store".into(), std::io::Error::last_os_error()));
        }
        std::fs::remove_file(&self.dirty_marker)
            .map_err(|e| io_err(format!("remove {}", self.dirty_marker.display()), e))
    }

    fn stripe(&self, chunk: ChunkId) -> &RwLock<()> {
        let key = chunk.ino.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ chunk.index;
        &self.stripes[(key % LOCK_STRIPES as u64) as usize]
    }

    fn paths(&self, chunk: ChunkId) -> Paths {
        let fan = layout::fan(chunk);
        let dir = self.chunks_dir.join(format!("{fan:02x}"));
        let file = dir.join(format!("{chunk}.{CHUNK_EXT}"));
        Paths { fan, tmp: dir.join(format!("{chunk}.{CHUNK_EXT}.{TMP_EXT}")), file, dir }
    }

    /// Opens the chunk's file for writing, making it (and its directory) if missing. An
    /// open that finds the file is all a write in place costs: a `mkdir` and a `stat`
    /// on every write were a third of a small write's system calls.
    fn create_file(&self, paths: &Paths) -> Result<File, FsError> {
        let what = |e| io_err(format!("open {}", paths.file.display()), e);
        match open_raw(paths, false) {
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            opened => return opened.map_err(what),
        }
        let file = match open_raw(paths, true) {
            Err(e) if e.kind() == ErrorKind::NotFound => {
                self.make_dir(paths)?;
                open_raw(paths, true)
            }
            opened => opened,
        }
        .map_err(what)?;
        self.dirs.changed(paths.fan);
        Ok(file)
    }

    /// Makes the chunk's fan-out directory if it is missing, durably: the store's
    /// directory is fsynced after a directory is made in it (at most 256 times).
    fn make_dir(&self, paths: &Paths) -> Result<(), FsError> {
        let what = |e| io_err(format!("create {}", paths.dir.display()), e);
        match std::fs::create_dir(&paths.dir) {
            Ok(()) => File::open(&self.chunks_dir).and_then(|d| d.sync_all()).map_err(what),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(e) => Err(what(e)),
        }
    }

    /// The chunk's file and where its bytes start in it, for tests that damage them.
    #[cfg(test)]
    pub(crate) fn data_path(&self, chunk: ChunkId) -> (PathBuf, u64) {
        (self.paths(chunk).file, DATA_AT)
    }

    /// The chunk's version; 0 when it does not exist. A damaged header is `Checksum`.
    pub fn version(&self, chunk: ChunkId) -> Result<u64, FsError> {
        let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
        match self.load(chunk)? {
            Local::Absent => Ok(0),
            Local::Present(h) => Ok(h.version),
            Local::Corrupt(detail) => Err(FsError::Checksum(format!("chunk {chunk}: {detail}"))),
        }
    }

    /// Reads up to `len` bytes at `offset`, shorter where the chunk ends (a missing chunk
    /// reads as empty). Every block touched is checked against its CRC.
    pub fn read(&self, chunk: ChunkId, offset: u32, len: u32) -> Result<Vec<u8>, FsError> {
        let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
        if let Some(cached) = self.headers.for_read(chunk) {
            return self.read_blocks(chunk, &cached.header, cached.file, offset, len, Wait::Disk);
        }
        let header = match self.load(chunk)? {
            Local::Absent => return Ok(Vec::new()),
            Local::Present(h) => h,
            Local::Corrupt(detail) => {
                return Err(FsError::Checksum(format!("chunk {chunk}: {detail}")))
            }
        };
        self.read_verified(chunk, &header, offset, len)
    }

    /// [`Engine::read`] when nothing of it would wait for the disk, to be called on the
    /// server's reactor: the read is at most [`CACHED_READ_MAX`] long, the chunk's lock
    /// is free, its header cached, its data file kept open or its path in the kernel's
    /// name cache, and the bytes in its page cache. None otherwise, and on any error (the
    /// caller then reads on the blocking pool, which reports it): this never answers with
    /// something the blocking read would not.
    pub fn read_cached(&self, chunk: ChunkId, offset: u32, len: u32) -> Option<Vec<u8>> {
        if len > CACHED_READ_MAX {
            return None;
        }
        let _lock = self.stripe(chunk).try_read().ok()?;
        let cached = self.headers.for_read(chunk)?;
        self.read_blocks(chunk, &cached.header, cached.file, offset, len, Wait::Never).ok()
    }

    /// Warms the caches for a read of the first `bytes` of `chunk` that may come soon:
    /// its header into the header cache, its data into the kernel's page cache
    /// (`readahead`, which returns once the reads are issued). Changes nothing a read
    /// answers: the read still takes the chunk's lock and checks every block. Advisory,
    /// so a chunk this server does not hold, or any error, is passed over in silence; the
    /// read that follows reports what is wrong.
    pub fn prefetch(&self, chunk: ChunkId, bytes: u32) {
        let len = {
            let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
            match self.load(chunk) {
                Ok(Local::Present(h)) => h.len.min(bytes),
                _ => return,
            }
        };
        if len == 0 {
            return;
        }
        if let Ok(file) = File::open(self.paths(chunk).file) {
            // SAFETY: a plain system call on a descriptor `file` owns for the call.
            unsafe { libc::readahead(file.as_raw_fd(), DATA_AT as libc::off64_t, len as usize) };
        }
    }

    /// The whole chunk with its version and remembered writes (version 0 and nothing
    /// when it does not exist).
    pub fn fetch(&self, chunk: ChunkId) -> Result<ChunkCopy, FsError> {
        let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
        match self.load(chunk)? {
            Local::Absent => Ok(ChunkCopy { version: 0, data: Vec::new(), writes: Vec::new() }),
            Local::Present(h) => Ok(ChunkCopy {
                version: h.version,
                data: self.read_verified(chunk, &h, 0, h.len)?,
                writes: h.writes,
            }),
            Local::Corrupt(detail) => Err(FsError::Checksum(format!("chunk {chunk}: {detail}"))),
        }
    }

    /// Checks the header file and every block of the chunk against their CRCs, reading
    /// the header from disk (the cached copy hides rot of the file). A damaged header is
    /// dropped from the cache, so the chunk reads as damaged until it is repaired.
    pub fn verify(&self, chunk: ChunkId) -> Result<(), FsError> {
        let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
        match self.load_from_disk(chunk)? {
            Local::Absent => Ok(()),
            Local::Present(h) => self.read_verified(chunk, &h, 0, h.len).map(|_| ()),
            Local::Corrupt(detail) => {
                self.headers.forget(chunk);
                Err(FsError::Checksum(format!("chunk {chunk}: {detail}")))
            }
        }
    }

    /// Writes `data` at `offset` under the version rule (see [`admit`]): at the head
    /// (`version: None`) as the next version, elsewhere only on top of `version - 1`.
    /// A gap is `Stale`; so is a damaged block at a successor, whose predecessor then
    /// sends the whole chunk. A mutation `id` the chunk remembers is a `Duplicate` at the
    /// head; an applied one is remembered.
    pub fn write(
        &self,
        chunk: ChunkId,
        offset: u32,
        data: &[u8],
        version: Option<u64>,
        id: Option<WriteId>,
    ) -> Result<Outcome, FsError> {
        let len = u32::try_from(data.len()).map_err(|_| {
            FsError::Invalid(format!("chunk {chunk}: a write of {} bytes", data.len()))
        })?;
        self.write_ranges(chunk, &[(offset, len)], data, version, id)
    }

    /// Writes several ranges as one version, like [`Engine::write`]: `data` holds the
    /// bytes of `ranges` (`(offset, len)`) back to back; they are applied in order, so a
    /// later range wins where two overlap. One header update covers them all.
    pub fn write_ranges(
        &self,
        chunk: ChunkId,
        ranges: &[(u32, u32)],
        data: &[u8],
        version: Option<u64>,
        id: Option<WriteId>,
    ) -> Result<Outcome, FsError> {
        let total: u64 = ranges.iter().map(|&(_, len)| u64::from(len)).sum();
        if total != data.len() as u64 {
            return Err(FsError::Invalid(format!(
                "chunk {chunk}: ranges hold {total} bytes but {} came",
                data.len()
            )));
        }
        for &(offset, len) in ranges {
            check_extent(chunk, u64::from(offset) + u64::from(len))?;
        }
        let _lock = self.stripe(chunk).write().expect("chunk lock poisoned");
        let local = self.load(chunk)?;
        if let Some(done) = duplicate(&local, version, id) {
            return Ok(done);
        }
        let Some(next) = admit(&local, chunk, version)? else {
            return Ok(Outcome::Skipped(local.version()));
        };
        let previous = local.generation();
        let mut header = match local {
            Local::Present(h) => h,
            _ => Header::empty(chunk),
        };
        let paths = self.paths(chunk);
        // The file a reader or the last write kept is the chunk's (cache.rs): no open.
        let file = match self.headers.kept_file(chunk) {
            Some(file) => file,
            None => Arc::new(self.create_file(&paths)?),
        };
        let mut pos = 0usize;
        for &(offset, len) in ranges {
            let bytes = &data[pos..pos + len as usize];
            pos += len as usize;
            write_blocks(&file, &mut header, offset as usize, bytes).map_err(|e| match e {
                FsError::Checksum(_) if version.is_some() => FsError::Stale,
                e => e,
            })?;
        }
        header.version = next;
        header.remember(id, next);
        self.save_header(&paths, &file, header, previous)?;
        self.headers.keep_file(chunk, &file);
        Ok(Outcome::Applied(next))
    }

    /// Cuts (or zero-extends) the chunk to `len` bytes under the version rule. `len` 0
    /// removes the data but keeps the header as a tombstone with the new version: if it
    /// removed the header too, the chunk would restart at version 1 when written again,
    /// and a replica that missed the removal could hold other bytes at the same version,
    /// which a resync (comparing versions) would keep. Removing needs no earlier state, so
    /// it is applied across a gap.
    pub fn truncate(
        &self,
        chunk: ChunkId,
        len: u32,
        version: Option<u64>,
        id: Option<WriteId>,
    ) -> Result<Outcome, FsError> {
        check_extent(chunk, u64::from(len))?;
        let _lock = self.stripe(chunk).write().expect("chunk lock poisoned");
        let local = self.load(chunk)?;
        if let Some(done) = duplicate(&local, version, id) {
            return Ok(done);
        }
        let paths = self.paths(chunk);
        if len == 0 {
            return match (&local, version) {
                (Local::Absent, None) => Ok(Outcome::Skipped(0)),
                (Local::Present(h), None) if h.len == 0 => Ok(Outcome::Skipped(h.version)),
                (_, Some(v)) if local.version() >= v => Ok(Outcome::Skipped(local.version())),
                _ => {
                    let next = version.unwrap_or(local.version() + 1);
                    let writes = match &local {
                        Local::Present(h) => h.writes.clone(),
                        _ => Vec::new(),
                    };
                    let mut tombstone = Header { version: next, writes, ..Header::empty(chunk) };
                    tombstone.remember(id, next);
                    let file = self.create_file(&paths)?;
                    self.save_header(&paths, &file, tombstone, local.generation())?;
                    cut_data(&file, chunk, 0)?;
                    Ok(Outcome::Applied(next))
                }
            };
        }
        let Some(next) = admit(&local, chunk, version)? else {
            return Ok(Outcome::Skipped(local.version()));
        };
        let previous = local.generation();
        let mut header = match local {
            Local::Present(h) => h,
            _ => Header::empty(chunk),
        };
        let file = self.create_file(&paths)?;
        let old_len = header.len as usize;
        let new_len = len as usize;
        if new_len > old_len {
            let zeros = vec![0u8; new_len - old_len];
            write_blocks(&file, &mut header, old_len, &zeros)?;
        } else if new_len < old_len {
            shrink_header(&file, &mut header, new_len)?;
        }
        header.version = next;
        header.remember(id, next);
        self.save_header(&paths, &file, header, previous)?;
        if new_len < old_len {
            // After the header: a crash in between leaves bytes past the end, never read.
            cut_data(&file, chunk, len)?;
        }
        Ok(Outcome::Applied(next))
    }

    /// Replaces the whole chunk with `data` at `version`, unless the chunk already is at
    /// `version` or newer and `force` is false. Version 0 means "absent": the chunk is
    /// removed. A resync forces, because the active member it copies from is the truth
    /// even when it is behind (a chunk deleted and written anew restarts at version 1).
    /// `writes` are the source's remembered mutations, kept with the copy.
    pub fn install(
        &self,
        chunk: ChunkId,
        version: u64,
        data: &[u8],
        writes: &[WriteRecord],
        force: bool,
    ) -> Result<Outcome, FsError> {
        check_extent(chunk, data.len() as u64)?;
        let _lock = self.stripe(chunk).write().expect("chunk lock poisoned");
        let local = self.load(chunk)?;
        if !force && matches!(&local, Local::Present(h) if h.version >= version) {
            return Ok(Outcome::Skipped(local.version()));
        }
        let paths = self.paths(chunk);
        if version == 0 {
            self.remove_files(chunk, &paths)?;
            return Ok(Outcome::Applied(0));
        }
        self.make_dir(&paths)?;
        let crcs = data.chunks(BLOCK).map(crc32c::crc32c).collect();
        let header = Header {
            chunk,
            generation: 1,
            version,
            len: data.len() as u32,
            crcs,
            writes: writes.to_vec(),
        };
        self.headers.forget(chunk);
        write_whole(&paths.tmp, &header, data)
            .and_then(|_| std::fs::rename(&paths.tmp, &paths.file))
            .map_err(|e| io_err(format!("install chunk {chunk}"), e))?;
        self.dirs.changed(paths.fan);
        self.headers.put(&header);
        Ok(Outcome::Applied(version))
    }

    /// Makes the chunk's data, header and directory entry durable. A missing chunk
    /// syncs its directory if a name in it changed, so that a removal is durable too.
    pub fn sync(&self, chunk: ChunkId) -> Result<(), FsError> {
        self.sync_all(&[chunk])
    }

    /// [`Engine::sync`] of every chunk of `chunks`, flushing each directory that holds
    /// any of them once, after all their files.
    pub fn sync_all(&self, chunks: &[ChunkId]) -> Result<(), FsError> {
        let mut dirs = std::collections::BTreeMap::new();
        for &chunk in chunks {
            let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
            let paths = self.paths(chunk);
            let what = || format!("sync chunk {chunk}");
            // The headers are file data too: fdatasync covers them and the length.
            let kept = self.headers.kept_file(chunk);
            match kept.map_or_else(|| File::open(&paths.file).map(Arc::new), Ok) {
                Ok(f) => f.sync_data().map_err(|e| io_err(what(), e))?,
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(what(), e)),
            }
            dirs.insert(paths.fan, paths.dir);
        }
        for (fan, dir) in dirs {
            self.dirs.sync(fan, &dir)?;
        }
        Ok(())
    }

    /// Every chunk held, with its version (0 for a damaged header, so that a resync
    /// replaces it).
    pub fn list(&self) -> Result<Vec<(ChunkId, u64)>, FsError> {
        Ok(self.list_sized()?.into_iter().map(|l| (l.chunk, l.version)).collect())
    }

    /// Every chunk held, with its version (as [`Engine::list`]), length in bytes and
    /// content digest.
    pub fn list_sized(&self) -> Result<Vec<ChunkListing>, FsError> {
        let suffix = format!(".{CHUNK_EXT}");
        let mut out = Vec::new();
        self.for_each_file(|name| {
            let Some(chunk) = name.strip_suffix(&suffix).and_then(|id| id.parse().ok()) else {
                return Ok(());
            };
            let _lock = self.stripe(chunk).read().expect("chunk lock poisoned");
            let (version, len, digest) = match self.load(chunk)? {
                Local::Absent => return Ok(()),
                Local::Present(h) => (h.version, h.len, h.digest()),
                Local::Corrupt(_) => (0, 0, 0),
            };
            out.push(ChunkListing { chunk, version, len, digest });
            Ok(())
        })?;
        out.sort_by_key(|l| l.chunk);
        Ok(out)
    }

    /// Every chunk that has any file in the store: a chunk file (tombstones included, and
    /// one a crash left without a header), or an install a crash left unfinished. Reads no
    /// header, so it is cheap, and it finds what [`Engine::list`] cannot see, so that
    /// [`Engine::remove`] of the chunks of a dead file leaves nothing of them behind.
    pub fn chunk_ids(&self) -> Result<Vec<ChunkId>, FsError> {
        let mut out = Vec::new();
        self.for_each_file(|name| {
            out.extend(parse_file_name(name));
            Ok(())
        })?;
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// The indexes of file `ino`'s chunks at `from` or past it that have any file here
    /// (as [`Engine::chunk_ids`] finds them), in order, the first `limit` of them. Reads
    /// names only, and keeps no more than `limit` at a time, however many chunks the
    /// store holds.
    pub fn chunks_of(&self, ino: InodeId, from: u64, limit: usize) -> Result<Vec<u64>, FsError> {
        let mut first = std::collections::BTreeSet::new();
        self.for_each_file(|name| {
            match parse_file_name(name) {
                Some(c) if c.ino == ino && c.index >= from => {
                    first.insert(c.index);
                    if first.len() > limit {
                        first.pop_last();
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        Ok(first.into_iter().collect())
    }

    /// Removes the chunk: its file (a tombstone too) and any unfinished install of it.
    /// Unlike a truncation to 0 it leaves no tombstone, so the chunk would restart at
    /// version 1 if written again: only for chunks nobody will write again (those of
    /// dead inodes, whose numbers are never reused). A missing chunk is not an error.
    pub fn remove(&self, chunk: ChunkId) -> Result<(), FsError> {
        let _lock = self.stripe(chunk).write().expect("chunk lock poisoned");
        self.remove_files(chunk, &self.paths(chunk))
    }

    /// Calls `f` with the name of every file in the store's fan-out directories.
    fn for_each_file(&self, mut f: impl FnMut(&str) -> Result<(), FsError>) -> Result<(), FsError> {
        each_file(&self.chunks_dir, |_, name| f(name))
    }

    /// Bytes the store's filesystem holds in all, and bytes not available to it.
    pub fn usage(&self) -> Result<(u64, u64), FsError> {
        let path = std::ffi::CString::new(self.chunks_dir.as_os_str().as_encoded_bytes())
            .map_err(|_| FsError::Invalid("data directory path has a NUL byte".into()))?;
        // SAFETY: statvfs writes only into `st`, and `path` is a valid C string.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
            return Err(io_err("statvfs the chunk store".into(), std::io::Error::last_os_error()));
        }
        let frsize = st.f_frsize as u64;
        let capacity = st.f_blocks as u64 * frsize;
        let available = st.f_bavail as u64 * frsize;
        Ok((capacity, capacity.saturating_sub(available)))
    }

    /// Refuses with `NoSpace` when writing `need` more bytes would leave less than
    /// `reserve_bytes` free on the store's filesystem.
    pub fn check_space(&self, need: u64, reserve_bytes: u64) -> Result<(), FsError> {
        if reserve_bytes == 0 {
            return Ok(());
        }
        let (capacity, used) = self.usage()?;
        if capacity.saturating_sub(used) < need.saturating_add(reserve_bytes) {
            return Err(FsError::NoSpace);
        }
        Ok(())
    }

    /// The chunk's header, from the cache or from disk (then cached).
    fn load(&self, chunk: ChunkId) -> Result<Local, FsError> {
        if let Some(h) = self.headers.get(chunk) {
            return Ok(Local::Present(h));
        }
        let local = self.load_from_disk(chunk)?;
        if let Local::Present(h) = &local {
            self.headers.put(h);
        }
        Ok(local)
    }

    /// The chunk's header from its file's two slots: the valid one of the higher
    /// generation. A damaged slot beside a valid one is a write torn by a crash only
    /// after an unclean stop (then the valid one is the header); otherwise it is rot.
    /// A file with no header at all is a new chunk's whose first write a crash cut short.
    fn load_from_disk(&self, chunk: ChunkId) -> Result<Local, FsError> {
        let path = self.paths(chunk).file;
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Local::Absent),
            Err(e) => return Err(io_err(format!("open {}", path.display()), e)),
        };
        let read = |slot| {
            read_slot(&file, slot, chunk).map_err(|e| io_err(format!("read {}", path.display()), e))
        };
        let corrupt = |detail: String| Local::Corrupt(format!("{}: {detail}", path.display()));
        Ok(match (read(0)?, read(1)?) {
            (Slot::Valid(a), Slot::Valid(b)) => {
                Local::Present(if a.generation > b.generation { a } else { b })
            }
            (Slot::Valid(h), Slot::Empty) | (Slot::Empty, Slot::Valid(h)) => Local::Present(h),
            (Slot::Valid(h), Slot::Damaged(_)) | (Slot::Damaged(_), Slot::Valid(h))
                if self.opened_dirty =>
            {
                Local::Present(h)
            }
            (Slot::Empty, Slot::Empty) => Local::Absent,
            (Slot::Damaged(detail), _) | (_, Slot::Damaged(detail)) => corrupt(detail),
        })
    }

    /// Reads `[offset, offset + len)` clipped to the chunk, checking every block, from
    /// the file at the chunk's path opened now.
    fn read_verified(
        &self,
        chunk: ChunkId,
        header: &Header,
        offset: u32,
        len: u32,
    ) -> Result<Vec<u8>, FsError> {
        self.read_blocks(chunk, header, None, offset, len, Wait::Disk)
    }

    /// [`Engine::read_verified`] from the chunk's file `kept` open in the header cache,
    /// or else one opened now (and kept there), either waiting for the disk or failing
    /// rather than waiting (`WouldBlock`).
    fn read_blocks(
        &self,
        chunk: ChunkId,
        header: &Header,
        kept: Option<Arc<File>>,
        offset: u32,
        len: u32,
        wait: Wait,
    ) -> Result<Vec<u8>, FsError> {
        let chunk_len = header.len as usize;
        let offset = offset as usize;
        let end = (offset + len as usize).min(chunk_len);
        if offset >= end {
            return Ok(Vec::new());
        }
        let start = offset / BLOCK * BLOCK;
        let stop = (end.div_ceil(BLOCK) * BLOCK).min(chunk_len);
        let file = match kept {
            Some(file) => file,
            None => {
                let paths = self.paths(chunk);
                let file = Arc::new(match wait {
                    Wait::Disk => open_file(&paths)?,
                    Wait::Never => open_cached(&paths.file)?,
                });
                self.headers.keep_file(chunk, &file);
                file
            }
        };
        let mut buf = Vec::new();
        let (want, at) = (stop - start, DATA_AT + start as u64);
        match wait {
            Wait::Disk => {
                let got = pread_append(file.as_raw_fd(), &mut buf, want, at, 0)
                    .map_err(|e| io_err(format!("read {chunk}"), e))?;
                if got < want {
                    return Err(data_short(chunk));
                }
            }
            Wait::Never => {
                let would_block =
                    || FsError::Io(format!("reading {chunk} would wait for the disk"));
                match pread_append(file.as_raw_fd(), &mut buf, want, at, libc::RWF_NOWAIT) {
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Err(would_block()),
                    Err(e) => return Err(io_err(format!("read {chunk} (cached)"), e)),
                    Ok(got) if got < want => return Err(would_block()),
                    Ok(_) => {}
                }
            }
        }
        for (i, block) in buf.chunks(BLOCK).enumerate() {
            check_block(chunk, header, start / BLOCK + i, block)?;
        }
        buf.truncate(end - start);
        buf.drain(..offset - start);
        Ok(buf)
    }
}

/// Shortens `header` to `new_len` (> 0), re-checksumming the new last block, which it
/// reads from the chunk's `file`.
fn shrink_header(file: &File, header: &mut Header, new_len: usize) -> Result<(), FsError> {
    let last = (new_len - 1) / BLOCK;
    let block_start = last * BLOCK;
    if new_len - block_start < BLOCK {
        let old_stop = (block_start + BLOCK).min(header.len as usize);
        let mut old = vec![0u8; old_stop - block_start];
        read_data(file, header.chunk, &mut old, block_start)?;
        check_block(header.chunk, header, last, &old)?;
        header.crcs[last] = crc32c::crc32c(&old[..new_len - block_start]);
    }
    header.crcs.truncate(last + 1);
    header.len = new_len as u32;
    Ok(())
}

/// Writes `data` at `offset` into the chunk's `file` and updates `header`'s length
/// and CRCs. Whole blocks are written: partial blocks at either end are read (and
/// checked) first, and the gap between the old end and `offset` is written as zeros, so
/// that a hole never depends on what a crashed earlier write left past the end.
fn write_blocks(
    file: &File,
    header: &mut Header,
    offset: usize,
    data: &[u8],
) -> Result<(), FsError> {
    if data.is_empty() {
        return Ok(());
    }
    let chunk = header.chunk;
    let old_len = header.len as usize;
    let end = offset + data.len();
    let new_len = old_len.max(end);
    let start = offset.min(old_len) / BLOCK * BLOCK;
    let stop = (end.div_ceil(BLOCK) * BLOCK).min(new_len);
    // The blocks at either end that keep old bytes next to new ones must be read first.
    let mut edges = vec![start / BLOCK, (stop - 1) / BLOCK];
    edges.dedup();
    edges.retain(|&block| {
        let block_start = block * BLOCK;
        let overwritten = offset <= block_start && end >= (block_start + BLOCK).min(new_len);
        block_start < old_len && !overwritten
    });
    header.crcs.resize(new_len.div_ceil(BLOCK), 0);
    let write_err = |e| io_err(format!("write {chunk}"), e);
    if edges.is_empty() && start == offset && stop == end {
        // Whole blocks (a sequential writer's usual case): straight from the caller's
        // buffer, no copy.
        file.write_all_at(data, DATA_AT + start as u64).map_err(write_err)?;
        for (i, block) in data.chunks(BLOCK).enumerate() {
            header.crcs[start / BLOCK + i] = crc32c::crc32c(block);
        }
    } else {
        let mut buf = vec![0u8; stop - start];
        for block in edges {
            let block_start = block * BLOCK;
            let old_stop = (block_start + BLOCK).min(old_len);
            let old = &mut buf[block_start - start..old_stop - start];
            read_data(file, chunk, old, block_start)?;
            check_block(chunk, header, block, old)?;
        }
        buf[offset - start..end - start].copy_from_slice(data);
        file.write_all_at(&buf, DATA_AT + start as u64).map_err(write_err)?;
        for (i, block) in buf.chunks(BLOCK).enumerate() {
            header.crcs[start / BLOCK + i] = crc32c::crc32c(block);
        }
    }
    header.len = new_len as u32;
    if stop - start >= WRITEBACK_MIN_BYTES {
        start_writeback(file, start, stop - start);
    }
    Ok(())
}

/// Asks the kernel to start writing `[start, start + len)` of `file` to disk now,
/// without waiting for it. Large writes then reach the disk while the chain is still
/// busy, instead of all at the next fsync: with the kernel's usual dirty limits (10% of
/// memory before background writeback), a 1 GiB file on three local replicas would
/// otherwise be 3 GiB for one fsync to flush. Nothing here promises durability; `Sync`
/// still does.
fn start_writeback(file: &File, start: usize, len: usize) {
    // SAFETY: sync_file_range only reads the descriptor, which `file` keeps open.
    let rc = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            (DATA_AT + start as u64) as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if rc != 0 {
        // Only a hint; a real I/O error shows up again at the next Sync.
        tracing::debug!("starting writeback: {}", std::io::Error::last_os_error());
    }
}

/// Cuts the chunk's data in `file` to `len` bytes (its header says so already).
fn cut_data(file: &File, chunk: ChunkId, len: u32) -> Result<(), FsError> {
    let end = DATA_AT + u64::from(len);
    let size = file.metadata().map_err(|e| io_err(format!("stat {chunk}"), e))?.len();
    if size > end {
        file.set_len(end).map_err(|e| io_err(format!("truncate {chunk}"), e))?;
    }
    Ok(())
}

/// Writes a new chunk file at `path` holding `header` (in the slot of its generation)
/// and `data`, not synced.
fn write_whole(path: &Path, header: &Header, data: &[u8]) -> std::io::Result<File> {
    let file = File::create(path)?;
    file.write_all_at(&header.encode(), slot_at(header.generation))?;
    file.write_all_at(data, DATA_AT)?;
    Ok(file)
}

/// Where the header of `generation` goes in a chunk file.
fn slot_at(generation: u64) -> u64 {
    (generation % 2) * SLOT_LEN
}

/// What header slot `slot` of the chunk `file` holds.
fn read_slot(file: &File, slot: u64, chunk: ChunkId) -> std::io::Result<Slot> {
    let at = slot * SLOT_LEN;
    let mut buf = vec![0u8; SLOT_READ_FIRST];
    let n = read_up_to(file, &mut buf, at)?;
    buf.truncate(n);
    // A longer header (a chunk of more than ~3.5 MiB): its block count, unchecked until
    // the header's crc is, only bounds how much more is read.
    if n == SLOT_READ_FIRST {
        let blocks = u32::from_le_bytes([buf[44], buf[45], buf[46], buf[47]]) as usize;
        let want = header::len_max(blocks).min(SLOT_LEN as usize);
        if want > n {
            buf.resize(want, 0);
            let more = read_up_to(file, &mut buf[n..], at + n as u64)?;
            buf.truncate(n + more);
        }
    }
    Ok(Header::decode_slot(&buf, chunk))
}

/// Reads from `at` into `buf` until it is full or the file ends; how much it read.
fn read_up_to(file: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn check_extent(chunk: ChunkId, end: u64) -> Result<(), FsError> {
    if end > u64::from(CHUNK_LEN_MAX) {
        return Err(FsError::Invalid(format!(
            "chunk {chunk}: extent ends at {end}, past the largest chunk ({CHUNK_LEN_MAX} bytes)"
        )));
    }
    Ok(())
}

fn check_block(chunk: ChunkId, header: &Header, block: usize, bytes: &[u8]) -> Result<(), FsError> {
    let actual = crc32c::crc32c(bytes);
    match header.crcs.get(block) {
        Some(&stored) if stored == actual => Ok(()),
        Some(&stored) => Err(FsError::Checksum(format!(
            "chunk {chunk} block {block}: header says crc {stored:08x}, data has {actual:08x}"
        ))),
        None => Err(FsError::Checksum(format!("chunk {chunk} block {block}: header has no crc"))),
    }
}

fn open_file(paths: &Paths) -> Result<File, FsError> {
    open_raw(paths, false).map_err(|e| match e.kind() {
        // A header was read from it a moment ago: that is damage, not a hole.
        ErrorKind::NotFound => FsError::Checksum(format!("{} is missing", paths.file.display())),
        _ => io_err(format!("open {}", paths.file.display()), e),
    })
}

/// The chunk's file, read-write; with `create`, made if missing.
fn open_raw(paths: &Paths, create: bool) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(create).truncate(false).open(&paths.file)
}

/// Whether a read may wait for the disk.
#[derive(Clone, Copy)]
enum Wait {
    Disk,
    Never,
}

/// Opens the file at `path` to read and write (as `open_raw`: a write may use the file
/// kept), resolving the path from the kernel's name cache alone (`RESOLVE_CACHED`): an
/// error where the disk would have been needed.
fn open_cached(path: &Path) -> Result<File, FsError> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| FsError::Invalid(format!("{} holds a NUL", path.display())))?;
    // SAFETY: open_how is plain integers, for which zero is valid.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDWR | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_CACHED;
    // SAFETY: `c_path` and `how` outlive the call, and the size passed is `how`'s.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(io_err(format!("open (cached) {}", path.display()), e));
    }
    // SAFETY: openat2 just returned this descriptor, and nothing else owns it.
    Ok(unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd as libc::c_int) })
}

/// Appends up to `len` bytes from `at` of `fd` to `buf`, read (`preadv2` with `flags`)
/// straight into its spare capacity: a chunk read used to zero its buffer first, which
/// cost as much as a CRC pass over it. Fewer than `len` only where the file ends.
fn pread_append(
    fd: std::os::fd::RawFd,
    buf: &mut Vec<u8>,
    len: usize,
    at: u64,
    flags: libc::c_int,
) -> std::io::Result<usize> {
    buf.reserve(len);
    let mut got = 0;
    while got < len {
        let spare = &mut buf.spare_capacity_mut()[..len - got];
        let iov = libc::iovec { iov_base: spare.as_mut_ptr().cast(), iov_len: spare.len() };
        // SAFETY: `iov` describes spare capacity of `buf`, live and writable for the call.
        let n = unsafe { libc::preadv2(fd, &iov, 1, (at + got as u64) as libc::off_t, flags) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            break;
        }
        // SAFETY: the kernel initialised the first `n` bytes of the spare capacity.
        unsafe { buf.set_len(buf.len() + n as usize) };
        got += n as usize;
    }
    Ok(got)
}

/// Reads the chunk's bytes at `at` (of the data, not of the file).
fn read_data(file: &File, chunk: ChunkId, buf: &mut [u8], at: usize) -> Result<(), FsError> {
    file.read_exact_at(buf, DATA_AT + at as u64).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => data_short(chunk),
        _ => io_err(format!("read {chunk}"), e),
    })
}

/// A chunk file that ends before its header says its data does: damage.
fn data_short(chunk: ChunkId) -> FsError {
    FsError::Checksum(format!("chunk {chunk}: its data is shorter than its header says"))
}

impl Engine {
    /// Writes `header` into the chunk's `file` as the next generation after `previous`,
    /// in the slot the current header is not in (the caller holds the stripe for
    /// writing). With a damaged slot (`previous` None) the first slot is cleared before
    /// the new header goes to the second, so that no older header can outrank it.
    fn save_header(
        &self,
        paths: &Paths,
        file: &File,
        mut header: Header,
        previous: Option<u64>,
    ) -> Result<(), FsError> {
        self.headers.forget(header.chunk);
        header.generation = previous.unwrap_or(0) + 1;
        let write = || -> std::io::Result<()> {
            if previous.is_none() {
                file.write_all_at(&[0u8; 4], slot_at(0))?;
            }
            file.write_all_at(&header.encode(), slot_at(header.generation))
        };
        write().map_err(|e| io_err(format!("write {}", paths.file.display()), e))?;
        self.headers.put(&header);
        Ok(())
    }

    /// Removes the chunk (the caller holds the stripe for writing).
    fn remove_files(&self, chunk: ChunkId, paths: &Paths) -> Result<(), FsError> {
        self.headers.forget(chunk);
        remove_files(paths)?;
        self.dirs.changed(paths.fan);
        Ok(())
    }
}

/// Removes the chunk's file, then what a crash may have left of an install.
fn remove_files(paths: &Paths) -> Result<(), FsError> {
    remove_if_present(&[&paths.file, &paths.tmp])
}

/// Removes each of `paths` that exists, in order.
fn remove_if_present(paths: &[&Path]) -> Result<(), FsError> {
    for path in paths {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(format!("remove {}", path.display()), e)),
        }
    }
    Ok(())
}

/// Calls `f` with each fan-out directory of the store under `chunks_dir` and the name
/// of every file in it.
fn each_file(
    chunks_dir: &Path,
    mut f: impl FnMut(&Path, &str) -> Result<(), FsError>,
) -> Result<(), FsError> {
    let what = |p: &Path| format!("list {}", p.display());
    let fans = std::fs::read_dir(chunks_dir).map_err(|e| io_err(what(chunks_dir), e))?;
    for fan in fans {
        let fan = fan.map_err(|e| io_err(what(chunks_dir), e))?.path();
        if !fan.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&fan).map_err(|e| io_err(what(&fan), e))? {
            let name = entry.map_err(|e| io_err(what(&fan), e))?.file_name();
            if let Some(name) = name.to_str() {
                f(&fan, name)?;
            }
        }
    }
    Ok(())
}

/// The chunk whose file (a chunk file or an unfinished install, and in a store of chunk
/// layout 2 its data, header, or a temporary one of either) is named `name`.
fn parse_file_name(name: &str) -> Option<ChunkId> {
    fn strip<'a>(name: &'a str, ext: &str) -> Option<&'a str> {
        name.strip_suffix(ext)?.strip_suffix('.')
    }
    let name = strip(name, TMP_EXT).unwrap_or(name);
    let name = strip(name, CHUNK_EXT).or_else(|| strip(name, layout::HEADER_EXT)).unwrap_or(name);
    name.parse().ok()
}

/// An I/O error with what was being done ("verb object"); ENOSPC stays `NoSpace`.
fn io_err(what: String, e: std::io::Error) -> FsError {
    match FsError::from(e) {
        FsError::Io(detail) => FsError::Io(format!("{what}: {detail}")),
        other => other,
    }
}
