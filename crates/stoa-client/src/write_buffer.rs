//! The write-behind buffer of one file: dirty bytes not yet sent to a chunk server.
//!
//! Each chunk holds at most one contiguous dirty extent. A write that continues or
//! overlaps the extent grows it (sequential writes coalesce into whole-chunk writes); a
//! write that leaves a gap pushes the old extent out to be sent and starts a new one. An
//! extent leaves the buffer when it covers its whole chunk, when it is pushed out, when
//! the buffer holds too many extents, or on flush.

use crate::split::split;
use std::collections::BTreeMap;

/// Dirty bytes at one place of one chunk, ready to be sent as one chunk write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub index: u64,
    /// Where the bytes start inside the chunk.
    pub offset: u32,
    pub data: Vec<u8>,
}

impl Extent {
    /// The file offset just past this extent.
    pub fn file_end(&self, chunk_size: u32) -> u64 {
        self.index * u64::from(chunk_size) + u64::from(self.offset) + self.data.len() as u64
    }

    fn end(&self) -> u64 {
        u64::from(self.offset) + self.data.len() as u64
    }

    /// Merges `data` at `offset` into this extent if the two touch or overlap; the new
    /// bytes win where they overlap. Returns false (and changes nothing) on a gap.
    fn merge(&mut self, offset: u32, data: &[u8]) -> bool {
        let (start, end) = (u64::from(offset), u64::from(offset) + data.len() as u64);
        if end < u64::from(self.offset) || start > self.end() {
            return false;
        }
        if offset < self.offset {
            let mut grown = vec![0u8; (self.offset - offset) as usize];
            grown.extend_from_slice(&self.data);
            self.data = grown;
            self.offset = offset;
        }
        let at = (offset - self.offset) as usize;
        if at + data.len() > self.data.len() {
            self.data.resize(at + data.len(), 0);
        }
        self.data[at..at + data.len()].copy_from_slice(data);
        true
    }
}

/// The dirty extents of one file, at most one per chunk.
#[derive(Debug)]
pub struct WriteBuffer {
    chunk_size: u32,
    extents: BTreeMap<u64, Extent>,
    /// More dirty chunks than this push the lowest one out.
    extents_max: usize,
}

impl WriteBuffer {
    pub fn new(chunk_size: u32, extents_max: usize) -> WriteBuffer {
        assert!(extents_max > 0, "the buffer must hold at least one extent");
        WriteBuffer { chunk_size, extents: BTreeMap::new(), extents_max }
    }

    /// Buffers `data` at file `offset`. Returns the extents that must be sent now, in the
    /// order they must reach the chunk servers.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Vec<Extent> {
        let mut ready = Vec::new();
        for piece in split(offset, data.len() as u64, self.chunk_size) {
            let bytes = &data[piece.pos..piece.pos + piece.len as usize];
            let merged = match self.extents.get_mut(&piece.index) {
                Some(extent) => extent.merge(piece.offset, bytes),
                None => false,
            };
            if !merged {
                if let Some(old) = self.extents.remove(&piece.index) {
                    ready.push(old);
                }
                let extent =
                    Extent { index: piece.index, offset: piece.offset, data: bytes.to_vec() };
                self.extents.insert(piece.index, extent);
            }
            let full = self
                .extents
                .get(&piece.index)
                .is_some_and(|e| e.offset == 0 && e.data.len() == self.chunk_size as usize);
            if full {
                ready.extend(self.extents.remove(&piece.index));
            }
        }
        while self.extents.len() > self.extents_max {
            ready.extend(self.extents.pop_first().map(|(_, e)| e));
        }
        ready
    }

    /// Takes every buffered extent, in chunk order.
    pub fn take_all(&mut self) -> Vec<Extent> {
        std::mem::take(&mut self.extents).into_values().collect()
    }

    /// Takes the extents of chunks `span`.
    pub fn take_span(&mut self, span: std::ops::Range<u64>) -> Vec<Extent> {
        let keys: Vec<u64> = self.extents.range(span).map(|(k, _)| *k).collect();
        keys.into_iter().filter_map(|k| self.extents.remove(&k)).collect()
    }

    /// Whether any chunk of `span` has dirty bytes here.
    pub fn has_span(&self, span: std::ops::Range<u64>) -> bool {
        self.extents.range(span).next().is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.extents.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_writes_coalesce_into_one_full_chunk() {
        let mut buf = WriteBuffer::new(8, 4);
        assert!(buf.write(0, b"abc").is_empty());
        assert!(buf.write(3, b"def").is_empty());
        let ready = buf.write(6, b"ghij");
        assert_eq!(ready, vec![Extent { index: 0, offset: 0, data: b"abcdefgh".to_vec() }]);
        assert_eq!(buf.take_all(), vec![Extent { index: 1, offset: 0, data: b"ij".to_vec() }]);
        assert!(buf.is_empty());
    }

    #[test]
    fn overlapping_writes_merge_and_the_newest_bytes_win() {
        let mut buf = WriteBuffer::new(16, 4);
        assert!(buf.write(4, b"xxxx").is_empty());
        assert!(buf.write(2, b"yyy").is_empty());
        assert!(buf.write(7, b"zz").is_empty());
        let all = buf.take_all();
        assert_eq!(all, vec![Extent { index: 0, offset: 2, data: b"yyyxxzz".to_vec() }]);
        assert_eq!(all[0].file_end(16), 9);
    }

    #[test]
    fn a_gap_pushes_the_old_extent_out_first() {
        let mut buf = WriteBuffer::new(16, 4);
        assert!(buf.write(0, b"aa").is_empty());
        let ready = buf.write(10, b"bb");
        assert_eq!(ready, vec![Extent { index: 0, offset: 0, data: b"aa".to_vec() }]);
        assert_eq!(buf.take_all(), vec![Extent { index: 0, offset: 10, data: b"bb".to_vec() }]);
    }

    #[test]
    fn too_many_dirty_chunks_push_the_lowest_out() {
        let mut buf = WriteBuffer::new(4, 2);
        assert!(buf.write(1, b"a").is_empty());
        assert!(buf.write(5, b"b").is_empty());
        let ready = buf.write(9, b"c");
        assert_eq!(ready, vec![Extent { index: 0, offset: 1, data: b"a".to_vec() }]);
        assert!(buf.has_span(2..3) && !buf.has_span(0..1));
        let span = buf.take_span(2..3);
        assert_eq!(span, vec![Extent { index: 2, offset: 1, data: b"c".to_vec() }]);
        assert_eq!(buf.take_all().len(), 1);
    }
}
