//! A chunk's header: what the chunk is, which version it is at, how long it is, and one
//! CRC32C per block of data, all covered by a CRC of its own. It lives in one of the two
//! slots at the start of the chunk's file (see `mod.rs`), each change written to the
//! slot the current header is not in, with the next generation.
//!
//! ```text
//!  0  magic "STCH"       4  format u32 (3)    8  generation u64   16  inode u64
//! 24  index u64         32  version u64      40  length u32       44  blocks u32
//! 48  crc u32 x blocks
//! W = 48 + 4 * blocks:  writes u32, then per write: session u64, seq u64, version u64
//! W + 4 + 24 * writes:  crc32c of everything before it
//! ```
//!
//! Little-endian throughout. The header is small (4 KiB for a 4 MiB chunk), so it is
//! rewritten whole on every change rather than patched in place. A slot holds the header
//! and whatever an older, longer one left after it: the lengths above say where it ends.
//!
//! Formats 1 and 2 were the whole of a separate header file (`<chunk id>.meta`) before
//! chunk layout 3, format 1 without the writes section, neither with a generation; they
//! are read only to convert such a store (layout.rs).

use stoa_types::{ChunkId, InodeId, SessionId, WriteId, WriteRecord, BLOCK_SIZE_BYTES};

const MAGIC: &[u8; 4] = b"STCH";
/// Bumped on any change to the layout above; unknown formats are refused, not misread.
const FORMAT: u32 = 3;
/// The header file of chunk layout 2, with write ids.
const FORMAT_FILE: u32 = 2;
/// The header file before write ids.
const FORMAT_FILE_NO_WRITES: u32 = 1;
const FIXED_LEN: usize = 48;
/// The fixed part of formats 1 and 2: no generation.
const FIXED_LEN_FILE: usize = 40;
const WRITE_LEN: usize = 24;

/// How many applied mutations a chunk remembers. A client keeps one write per chunk in
/// flight and retries it before it sends the next, so its own retry finds its id unless
/// this many other mutations of the chunk (other clients' writes to a file they share)
/// came in between; a shared, contended chunk sees at most a few in a retry's window.
pub(crate) const WRITES_KEPT: usize = 16;

/// Bytes of data covered by one block CRC.
pub(crate) const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// The longest header of a chunk of `blocks` blocks.
pub(crate) const fn len_max(blocks: usize) -> usize {
    FIXED_LEN + 4 * blocks + 4 + WRITE_LEN * WRITES_KEPT + 4
}

/// What a header slot holds.
#[derive(Debug)]
pub(crate) enum Slot {
    /// Never written (its magic is zeros: a hole, or past the end of the file).
    Empty,
    Valid(Header),
    Damaged(String),
}

/// The decoded header of one chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub chunk: ChunkId,
    /// How many times the chunk's file had a header written: the higher of two valid
    /// slots is the current one, and the next goes to slot `(generation + 1) % 2`.
    pub generation: u64,
    pub version: u64,
    pub len: u32,
    /// CRC32C of block `i`: bytes `[i * BLOCK, min((i + 1) * BLOCK, len))`.
    pub crcs: Vec<u32>,
    /// The last [`WRITES_KEPT`] client mutations applied, oldest first.
    pub writes: Vec<WriteRecord>,
}

impl Header {
    /// The header of a chunk that has no data yet.
    pub fn empty(chunk: ChunkId) -> Header {
        Header { chunk, generation: 0, version: 0, len: 0, crcs: Vec::new(), writes: Vec::new() }
    }

    /// The version an earlier attempt of mutation `id` made, if it is remembered.
    pub fn applied(&self, id: WriteId) -> Option<u64> {
        self.writes.iter().find(|w| w.id == id).map(|w| w.version)
    }

    /// Remembers that mutation `id` (if it has one) made `version`, forgetting the oldest
    /// beyond [`WRITES_KEPT`].
    pub fn remember(&mut self, id: Option<WriteId>, version: u64) {
        let Some(id) = id else { return };
        if self.writes.len() >= WRITES_KEPT {
            self.writes.drain(..=self.writes.len() - WRITES_KEPT);
        }
        self.writes.push(WriteRecord { id, version });
    }

    /// CRC32C over the length and the block checksums: equal for replicas with equal
    /// bytes, and almost surely not for others (see `ChunkListing::digest`).
    pub fn digest(&self) -> u32 {
        let len = crc32c::crc32c(&self.len.to_le_bytes());
        self.crcs.iter().fold(len, |digest, crc| crc32c::crc32c_append(digest, &crc.to_le_bytes()))
    }

    pub fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.crcs.len(), (self.len as usize).div_ceil(BLOCK));
        let mut out = Vec::with_capacity(FIXED_LEN + 4 * self.crcs.len() + 4);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&self.generation.to_le_bytes());
        out.extend_from_slice(&self.chunk.ino.0.to_le_bytes());
        out.extend_from_slice(&self.chunk.index.to_le_bytes());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&(self.crcs.len() as u32).to_le_bytes());
        for crc in &self.crcs {
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out.extend_from_slice(&(self.writes.len() as u32).to_le_bytes());
        for w in &self.writes {
            out.extend_from_slice(&w.id.session.0.to_le_bytes());
            out.extend_from_slice(&w.id.seq.to_le_bytes());
            out.extend_from_slice(&w.version.to_le_bytes());
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// What a header slot of chunk `expect` holds: `bytes` starts with it and may run
    /// past its end.
    pub fn decode_slot(bytes: &[u8], expect: ChunkId) -> Slot {
        if bytes.len() < 4 || bytes[..4] == [0; 4] {
            return Slot::Empty;
        }
        match decode(bytes, expect, false) {
            Ok(h) => Slot::Valid(h),
            Err(detail) => Slot::Damaged(detail),
        }
    }

    /// Decodes the whole of a layout-2 header file (format 1 or 2) of chunk `expect`,
    /// or says what is wrong with it.
    pub fn decode_file(bytes: &[u8], expect: ChunkId) -> Result<Header, String> {
        decode(bytes, expect, true)
    }
}

/// Decodes a header of chunk `expect` at the start of `bytes`: a slot's (format 3,
/// `bytes` may run past it) or a layout-2 header file's (formats 1 and 2, exactly
/// `bytes`).
fn decode(bytes: &[u8], expect: ChunkId, file: bool) -> Result<Header, String> {
    let fixed = if file { FIXED_LEN_FILE } else { FIXED_LEN };
    if bytes.len() < fixed + 4 {
        return Err(format!("header is {} bytes, too short", bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err("header has no chunk magic".into());
    }
    let format = u32_at(bytes, 4);
    let known = match file {
        true => format == FORMAT_FILE || format == FORMAT_FILE_NO_WRITES,
        false => format == FORMAT,
    };
    if !known {
        let reads = if file { "1 and 2 in a header file" } else { "3 in a chunk file" };
        return Err(format!("header format {format}, this server reads {reads}"));
    }
    let (generation, at) = if file { (0, 8) } else { (u64_at(bytes, 8), 16) };
    let chunk = ChunkId { ino: InodeId(u64_at(bytes, at)), index: u64_at(bytes, at + 8) };
    let version = u64_at(bytes, at + 16);
    let len = u32_at(bytes, at + 24);
    let blocks = u32_at(bytes, at + 28) as usize;
    let writes_at = fixed + 4 * blocks;
    // Where the header ends, from its own (not yet checked) counts: a damaged count
    // points past the bytes or at the wrong crc, and is refused either way.
    let end = match format {
        FORMAT_FILE_NO_WRITES => Some(writes_at + 4),
        _ => bytes
            .get(writes_at..writes_at + 4)
            .map(|_| u32_at(bytes, writes_at) as usize)
            .filter(|&count| count <= WRITES_KEPT)
            .map(|count| writes_at + 4 + WRITE_LEN * count + 4),
    };
    let end = end.filter(|&end| end <= bytes.len() && (!file || end == bytes.len()));
    let Some(end) = end else {
        return Err(format!("header of {blocks} blocks does not fit its {} bytes", bytes.len()));
    };
    let (body, tail) = bytes[..end].split_at(end - 4);
    let stored = u32_at(tail, 0);
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(format!("header crc is {stored:08x} but its bytes have {actual:08x}"));
    }
    if chunk != expect {
        return Err(format!("header names chunk {chunk}, expected {expect}"));
    }
    if blocks != (len as usize).div_ceil(BLOCK) {
        return Err(format!("header has {blocks} block crcs for length {len}"));
    }
    let crcs = (0..blocks).map(|i| u32_at(body, fixed + 4 * i)).collect();
    let writes = match format {
        FORMAT_FILE_NO_WRITES => Vec::new(),
        _ => decode_writes(body, writes_at),
    };
    Ok(Header { chunk, generation, version, len, crcs, writes })
}

/// The writes section of a header body, which starts at `at` and whose count and length
/// were checked.
fn decode_writes(body: &[u8], at: usize) -> Vec<WriteRecord> {
    let count = u32_at(body, at) as usize;
    (0..count)
        .map(|i| {
            let base = at + 4 + WRITE_LEN * i;
            WriteRecord {
                id: WriteId { session: SessionId(u64_at(body, base)), seq: u64_at(body, base + 8) },
                version: u64_at(body, base + 16),
            }
        })
        .collect()
}

/// Callers have checked that `at + 4 <= bytes.len()`.
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(raw)
}

/// Callers have checked that `at + 8 <= bytes.len()`.
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(raw)
}

#[cfg(test)]
impl Header {
    /// The layout-2 header file (format 2) of this header, as older servers wrote it.
    pub fn encode_file(&self) -> Vec<u8> {
        let slot = self.encode();
        let mut out = slot[..8].to_vec();
        out[4..8].copy_from_slice(&FORMAT_FILE.to_le_bytes());
        out.extend_from_slice(&slot[16..slot.len() - 4]);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> ChunkId {
        ChunkId { ino: InodeId(9), index: 3 }
    }

    fn header(version: u64, len: u32, crcs: Vec<u32>) -> Header {
        Header { chunk: id(), generation: 5, version, len, crcs, writes: vec![] }
    }

    fn valid(slot: Slot) -> Header {
        match slot {
            Slot::Valid(h) => h,
            other => panic!("not a valid slot: {other:?}"),
        }
    }

    fn damaged(slot: Slot) -> String {
        match slot {
            Slot::Damaged(detail) => detail,
            other => panic!("not a damaged slot: {other:?}"),
        }
    }

    #[test]
    fn a_header_round_trips_also_with_an_older_longer_one_behind_it() {
        let mut h = header(7, 5000, vec![1, 2]);
        assert_eq!(valid(Header::decode_slot(&h.encode(), id())), h);
        h.remember(Some(WriteId { session: SessionId(4), seq: 9 }), 7);
        let mut slot = h.encode();
        let shorter = header(8, 10, vec![3]);
        slot[..shorter.encode().len()].copy_from_slice(&shorter.encode());
        assert_eq!(valid(Header::decode_slot(&slot, id())), shorter);
        slot.resize(70_000, 0);
        assert_eq!(valid(Header::decode_slot(&slot, id())), shorter);
        assert!(matches!(Header::decode_slot(&[0u8; 4096], id()), Slot::Empty));
        assert!(matches!(Header::decode_slot(&[], id()), Slot::Empty));
    }

    #[test]
    fn header_files_of_formats_1_and_2_read_without_a_generation() {
        let mut h = header(3, 10, vec![5]);
        h.remember(Some(WriteId { session: SessionId(4), seq: 9 }), 3);
        let h = Header { generation: 0, ..h };
        assert_eq!(Header::decode_file(&h.encode_file(), id()).unwrap(), h);
        let h = Header { writes: vec![], ..h };
        let mut bytes = h.encode_file();
        bytes.truncate(bytes.len() - 8); // the crc and the empty writes count
        bytes[4..8].copy_from_slice(&FORMAT_FILE_NO_WRITES.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(Header::decode_file(&bytes, id()).unwrap(), h);
        // Neither is a slot's format, nor the other way round.
        let file = header(3, 10, vec![5]).encode_file();
        assert!(damaged(Header::decode_slot(&file, id())).contains("format 2"));
        let slot = header(3, 10, vec![5]).encode();
        assert!(Header::decode_file(&slot, id()).unwrap_err().contains("format 3"));
    }

    #[test]
    fn a_chunk_remembers_only_its_latest_writes() {
        let mut h = Header::empty(id());
        let w = |seq| WriteId { session: SessionId(1), seq };
        for seq in 0..(WRITES_KEPT as u64 + 5) {
            h.remember(Some(w(seq)), seq + 1);
        }
        h.remember(None, 99);
        assert_eq!(h.writes.len(), WRITES_KEPT);
        assert_eq!(h.applied(w(4)), None);
        assert_eq!(h.applied(w(5)), Some(6));
        assert_eq!(h.applied(w(WRITES_KEPT as u64 + 4)), Some(WRITES_KEPT as u64 + 5));
        assert_eq!(valid(Header::decode_slot(&h.encode(), id())), h);
        assert!(h.encode().len() <= len_max(0));
    }

    #[test]
    fn the_digest_tells_other_bytes_apart() {
        let a = header(3, 10, vec![5]);
        let b = Header { crcs: vec![6], ..a.clone() };
        let c = Header { writes: vec![], version: 4, generation: 9, ..a.clone() };
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), c.digest());
    }

    #[test]
    fn damaged_or_foreign_headers_are_refused_with_a_reason() {
        let h = header(7, 10, vec![1]);
        let mut bytes = h.encode();
        bytes[33] ^= 1;
        assert!(damaged(Header::decode_slot(&bytes, id())).contains("crc"));
        assert!(damaged(Header::decode_slot(&bytes[..10], id())).contains("too short"));
        let other = ChunkId { ino: InodeId(9), index: 4 };
        assert!(damaged(Header::decode_slot(&h.encode(), other)).contains("expected"));
        assert!(damaged(Header::decode_slot(&[1u8; 64], id())).contains("magic"));
        // A block count that points past the slot, or a writes count over the limit.
        let mut bytes = h.encode();
        bytes[44..48].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(damaged(Header::decode_slot(&bytes, id())).contains("does not fit"));
        let mut bytes = h.encode();
        bytes[52..56].copy_from_slice(&1000u32.to_le_bytes());
        assert!(damaged(Header::decode_slot(&bytes, id())).contains("does not fit"));
    }
}
