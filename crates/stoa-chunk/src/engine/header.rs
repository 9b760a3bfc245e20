//! The chunk header file (`<chunk id>.meta`): what the chunk is, which version it is at,
//! how long it is, and one CRC32C per block of data, all covered by a CRC of its own.
//!
//! ```text
//!  0  magic "STCH"       4  format u32         8  inode u64       16  index u64
//! 24  version u64       32  length u32        36  blocks u32      40  crc u32 x blocks
//! 40 + 4 * blocks: crc32c of everything before it
//! ```
//!
//! Little-endian throughout. The header is small (4 KiB for a 4 MiB chunk), so it is
//! rewritten whole on every change rather than patched in place.

use stoa_types::{ChunkId, InodeId, BLOCK_SIZE_BYTES};

const MAGIC: &[u8; 4] = b"STCH";
/// Bumped on any change to the layout above; older files are refused, not misread.
const FORMAT: u32 = 1;
const FIXED_LEN: usize = 40;

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
}

impl Header {
    /// The header of a chunk that has no data yet.
    pub fn empty(chunk: ChunkId) -> Header {
        Header { chunk, version: 0, len: 0, crcs: Vec::new() }
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
        if format != FORMAT {
            return Err(format!("header format {format}, this server reads {FORMAT}"));
        }
        let chunk = ChunkId { ino: InodeId(u64_at(body, 8)), index: u64_at(body, 16) };
        if chunk != expect {
            return Err(format!("header names chunk {chunk}, expected {expect}"));
        }
        let version = u64_at(body, 24);
        let len = u32_at(body, 32);
        let blocks = u32_at(body, 36) as usize;
        if blocks != (len as usize).div_ceil(BLOCK) || body.len() != FIXED_LEN + 4 * blocks {
            return Err(format!("header has {blocks} block crcs for length {len}"));
        }
        let crcs = (0..blocks).map(|i| u32_at(body, FIXED_LEN + 4 * i)).collect();
        Ok(Header { chunk, version, len, crcs })
    }
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
        let h = Header { chunk: id(), version: 7, len: 5000, crcs: vec![1, 2] };
        assert_eq!(Header::decode(&h.encode(), id()).unwrap(), h);
    }

    #[test]
    fn damaged_or_foreign_headers_are_refused_with_a_reason() {
        let h = Header { chunk: id(), version: 7, len: 10, crcs: vec![1] };
        let mut bytes = h.encode();
        bytes[25] ^= 1;
        assert!(Header::decode(&bytes, id()).unwrap_err().contains("crc"));
        assert!(Header::decode(&bytes[..10], id()).unwrap_err().contains("too short"));
        let other = ChunkId { ino: InodeId(9), index: 4 };
        assert!(Header::decode(&h.encode(), other).unwrap_err().contains("expected"));
        assert!(Header::decode(&[0u8; 64], id()).unwrap_err().contains("magic"));
    }
}
