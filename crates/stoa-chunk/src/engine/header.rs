//! The chunk header file (`<chunk id>.meta`): what the chunk is, which version it is at,
//! how long it is, and one CRC32C per block of data, all covered by a CRC of its own.
//!
//! ```text
//!  0  magic "STCH"       4  format u32         8  inode u64       16  index u64
//! 24  version u64       32  length u32        36  blocks u32      40  crc u32 x blocks
//! W = 40 + 4 * blocks:  writes u32, then per write: session u64, seq u64, version u64
//! W + 4 + 24 * writes:  crc32c of everything before it
//! ```
//!
//! Little-endian throughout. The header is small (4 KiB for a 4 MiB chunk), so it is
//! rewritten whole on every change rather than patched in place. Format 1 (before write
//! ids) had no writes section; it is still read, as a chunk with no remembered writes,
//! and the next change rewrites it as format 2.

use stoa_types::{ChunkId, InodeId, SessionId, WriteId, WriteRecord, BLOCK_SIZE_BYTES};

const MAGIC: &[u8; 4] = b"STCH";
/// Bumped on any change to the layout above; unknown formats are refused, not misread.
const FORMAT: u32 = 2;
/// The format before write ids, still read.
const FORMAT_NO_WRITES: u32 = 1;
const FIXED_LEN: usize = 40;
const WRITE_LEN: usize = 24;

/// How many applied mutations a chunk remembers. A client keeps one write per chunk in
/// flight and retries it before it sends the next, so its own retry finds its id unless
/// this many other mutations of the chunk (other clients' writes to a file they share)
/// came in between; a shared, contended chunk sees at most a few in a retry's window.
pub(crate) const WRITES_KEPT: usize = 16;

/// Bytes of data covered by one block CRC.
pub(crate) const BLOCK: usize = BLOCK_SIZE_BYTES as usize;

/// The decoded header of one chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub chunk: ChunkId,
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
        Header { chunk, version: 0, len: 0, crcs: Vec::new(), writes: Vec::new() }
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

    /// Decodes a header read from disk for `expect`, or says what is wrong with it.
    pub fn decode(bytes: &[u8], expect: ChunkId) -> Result<Header, String> {
        if bytes.len() < FIXED_LEN + 4 {
            return Err(format!("header is {} bytes, too short", bytes.len()));
        }
        if &bytes[..4] != MAGIC {
            return Err("header has no chunk magic".into());
        }
        let (body, tail) = bytes.split_at(bytes.len() - 4);
        let stored = u32_at(tail, 0);
        let actual = crc32c::crc32c(body);
        if stored != actual {
            return Err(format!("header crc is {stored:08x} but its bytes have {actual:08x}"));
        }
        let format = u32_at(body, 4);
        if format != FORMAT && format != FORMAT_NO_WRITES {
            return Err(format!(
                "header format {format}, this server reads {FORMAT_NO_WRITES} and {FORMAT}"
            ));
        }
        let chunk = ChunkId { ino: InodeId(u64_at(body, 8)), index: u64_at(body, 16) };
        if chunk != expect {
            return Err(format!("header names chunk {chunk}, expected {expect}"));
        }
        let version = u64_at(body, 24);
        let len = u32_at(body, 32);
        let blocks = u32_at(body, 36) as usize;
        let writes_at = FIXED_LEN + 4 * blocks;
        if blocks != (len as usize).div_ceil(BLOCK) || body.len() < writes_at {
            return Err(format!("header has {blocks} block crcs for length {len}"));
        }
        let crcs = (0..blocks).map(|i| u32_at(body, FIXED_LEN + 4 * i)).collect();
        let writes = match format {
            FORMAT_NO_WRITES if body.len() == writes_at => Vec::new(),
            FORMAT if body.len() >= writes_at + 4 => decode_writes(body, writes_at)?,
            _ => return Err(format!("header of {} bytes has a damaged length", body.len())),
        };
        Ok(Header { chunk, version, len, crcs, writes })
    }
}

/// The writes section of a format-2 header body, which starts at `at`.
fn decode_writes(body: &[u8], at: usize) -> Result<Vec<WriteRecord>, String> {
    let count = u32_at(body, at) as usize;
    if count > WRITES_KEPT || body.len() != at + 4 + WRITE_LEN * count {
        return Err(format!("header lists {count} writes in {} bytes", body.len() - at));
    }
    Ok((0..count)
        .map(|i| {
            let base = at + 4 + WRITE_LEN * i;
            WriteRecord {
                id: WriteId { session: SessionId(u64_at(body, base)), seq: u64_at(body, base + 8) },
                version: u64_at(body, base + 16),
            }
        })
        .collect())
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
mod tests {
    use super::*;

    fn id() -> ChunkId {
        ChunkId { ino: InodeId(9), index: 3 }
    }

    #[test]
    fn a_header_round_trips() {
        let mut h = Header { chunk: id(), version: 7, len: 5000, crcs: vec![1, 2], writes: vec![] };
        assert_eq!(Header::decode(&h.encode(), id()).unwrap(), h);
        h.remember(Some(WriteId { session: SessionId(4), seq: 9 }), 7);
        assert_eq!(Header::decode(&h.encode(), id()).unwrap(), h);
    }

    #[test]
    fn a_format_1_header_reads_as_one_with_no_remembered_writes() {
        let h = Header { chunk: id(), version: 3, len: 10, crcs: vec![5], writes: vec![] };
        let mut bytes = h.encode();
        bytes.truncate(bytes.len() - 8); // the crc and the empty writes count
        bytes[4..8].copy_from_slice(&FORMAT_NO_WRITES.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(Header::decode(&bytes, id()).unwrap(), h);
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
        assert_eq!(Header::decode(&h.encode(), id()).unwrap(), h);
    }

    #[test]
    fn the_digest_tells_other_bytes_apart() {
        let a = Header { chunk: id(), version: 3, len: 10, crcs: vec![5], writes: vec![] };
        let b = Header { crcs: vec![6], ..a.clone() };
        let c = Header { writes: vec![], version: 4, ..a.clone() };
        assert_ne!(a.digest(), b.digest());
        assert_eq!(a.digest(), c.digest());
    }

    #[test]
    fn damaged_or_foreign_headers_are_refused_with_a_reason() {
        let h = Header { chunk: id(), version: 7, len: 10, crcs: vec![1], writes: vec![] };
        let mut bytes = h.encode();
        bytes[25] ^= 1;
        assert!(Header::decode(&bytes, id()).unwrap_err().contains("crc"));
        assert!(Header::decode(&bytes[..10], id()).unwrap_err().contains("too short"));
        let other = ChunkId { ino: InodeId(9), index: 4 };
        assert!(Header::decode(&h.encode(), other).unwrap_err().contains("expected"));
        assert!(Header::decode(&[0u8; 64], id()).unwrap_err().contains("magic"));
    }
}
