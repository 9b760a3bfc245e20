//! The write-behind buffer of one file: dirty bytes not yet sent to a chunk server.
//!
//! Each dirty chunk holds a set of disjoint byte ranges. A write that touches or overlaps
//! ranges merges with them (sequential writes coalesce into one whole-chunk range); a
//! write elsewhere in the chunk adds a range, so many small random writes to one chunk
//! leave as one chunk write (`WriteRanges`) through the chain instead of one each. A
//! chunk's ranges leave the buffer when they cover the whole chunk, when the chunk holds
//! `ranges_max` ranges, when the file has too many dirty chunks or bytes (the lowest
//! chunk goes first), or on flush.

use crate::split::split;
use bytes::Bytes;
use std::collections::BTreeMap;

/// The dirty bytes of one chunk: disjoint ranges that do not touch, by start offset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Extent {
    pub index: u64,
    ranges: BTreeMap<u32, Vec<u8>>,
    bytes: usize,
}

impl Extent {
    pub fn new(index: u64) -> Extent {
        Extent { index, ranges: BTreeMap::new(), bytes: 0 }
    }

    /// Dirty bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    fn range_count(&self) -> usize {
        self.ranges.len()
    }

    fn is_whole(&self, chunk_size: u32) -> bool {
        self.ranges.get(&0).is_some_and(|d| d.len() == chunk_size as usize)
    }

    /// Writes `data` at `offset` of the chunk, merging it with every range it touches or
    /// overlaps; the new bytes win where they overlap.
    pub fn merge(&mut self, offset: u32, data: &[u8]) {
        let (start, end) = (offset, offset + data.len() as u32);
        // Ranges are disjoint and sorted, so their ends are sorted too: walking down from
        // the last range starting at or before `end`, the touching ones come first.
        let touching: Vec<u32> = self
            .ranges
            .range(..=end)
            .rev()
            .take_while(|(&s, d)| s + d.len() as u32 >= start)
            .map(|(&s, _)| s)
            .collect();
        let Some(&lowest) = touching.last() else {
            self.bytes += data.len();
            self.ranges.insert(offset, data.to_vec());
            return;
        };
        let from = lowest.min(start);
        let mut merged = self.ranges.remove(&lowest).expect("touching range is present");
        self.bytes -= merged.len();
        if lowest > start {
            let mut grown = vec![0u8; (lowest - start) as usize];
            grown.append(&mut merged);
            merged = grown;
        }
        for s in touching.iter().rev().skip(1) {
            let other = self.ranges.remove(s).expect("touching range is present");
            self.bytes -= other.len();
            let at = (s - from) as usize;
            if merged.len() < at + other.len() {
                merged.resize(at + other.len(), 0);
            }
            merged[at..at + other.len()].copy_from_slice(&other);
        }
        let at = (start - from) as usize;
        if merged.len() < at + data.len() {
            merged.resize(at + data.len(), 0);
        }
        merged[at..at + data.len()].copy_from_slice(data);
        self.bytes += merged.len();
        self.ranges.insert(from, merged);
    }

    /// Merges a newer extent of the same chunk into this one.
    pub fn absorb(&mut self, newer: Extent) {
        debug_assert_eq!(self.index, newer.index);
        for (offset, data) in newer.ranges {
            self.merge(offset, &data);
        }
    }

    /// The extent as one chunk write: `(offset, len)` of each range and their bytes back
    /// to back. A single range (a sequential write) moves without a copy.
    pub fn into_batch(mut self) -> Batch {
        let ranges: Vec<(u32, u32)> =
            self.ranges.iter().map(|(&s, d)| (s, d.len() as u32)).collect();
        let data = if self.ranges.len() == 1 {
            Bytes::from(self.ranges.pop_first().expect("one range").1)
        } else {
            let mut all = Vec::with_capacity(self.bytes);
            for d in self.ranges.values() {
                all.extend_from_slice(d);
            }
            Bytes::from(all)
        };
        Batch { index: self.index, ranges, data }
    }

    /// Each range as `(offset in the chunk, bytes)`, in offset order.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, &[u8])> {
        self.ranges.iter().map(|(&s, d)| (s, d.as_slice()))
    }
}

/// One chunk write on its way to the chain: what `Extent::into_batch` made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub index: u64,
    pub ranges: Vec<(u32, u32)>,
    pub data: Bytes,
}

impl Batch {
    /// Each range as `(offset in the chunk, bytes)`, in the order they are applied.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, &[u8])> {
        let mut pos = 0usize;
        self.ranges.iter().map(move |&(s, len)| {
            let bytes = &self.data[pos..pos + len as usize];
            pos += len as usize;
            (s, bytes)
        })
    }

    /// The file offset just past the batch's last byte.
    pub fn file_end(&self, chunk_size: u32) -> u64 {
        let end = self.ranges.iter().map(|&(s, len)| u64::from(s) + u64::from(len)).max();
        self.index * u64::from(chunk_size) + end.unwrap_or(0)
    }
}

/// The parts of `ranges` (`(offset, bytes)` in a chunk) that fall inside `[at, at + len)`
/// of the chunk, each as `(position relative to at, bytes)`, in the same order.
pub fn clip<'a>(
    ranges: impl Iterator<Item = (u32, &'a [u8])>,
    at: u32,
    len: u32,
) -> impl Iterator<Item = (usize, &'a [u8])> {
    let (at, stop) = (u64::from(at), u64::from(at) + u64::from(len));
    ranges.filter_map(move |(s, bytes)| {
        let (s, e) = (u64::from(s), u64::from(s) + bytes.len() as u64);
        let (from, to) = (s.max(at), e.min(stop));
        (from < to).then(|| ((from - at) as usize, &bytes[(from - s) as usize..(to - s) as usize]))
    })
}

/// The dirty extents of one file, at most one per chunk.
#[derive(Debug)]
pub struct WriteBuffer {
    chunk_size: u32,
    extents: BTreeMap<u64, Extent>,
    /// More dirty chunks than this push the lowest one out.
    chunks_max: usize,
    /// A chunk with this many ranges leaves at once.
    ranges_max: usize,
    /// More dirty bytes than this push the lowest chunks out.
    bytes_max: usize,
    bytes: usize,
}

impl WriteBuffer {
    pub fn new(chunk_size: u32, chunks_max: usize, ranges_max: usize, bytes_max: usize) -> Self {
        assert!(chunks_max > 0 && ranges_max > 0, "the buffer must hold at least one range");
        WriteBuffer {
            chunk_size,
            extents: BTreeMap::new(),
            chunks_max,
            ranges_max,
            bytes_max,
            bytes: 0,
        }
    }

    /// Buffers `data` at file `offset`. Returns the extents that must be sent now, in the
    /// order they must reach the chunk servers.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> Vec<Extent> {
        let mut ready = Vec::new();
        for piece in split(offset, data.len() as u64, self.chunk_size) {
            let bytes = &data[piece.pos..piece.pos + piece.len as usize];
            let extent =
                self.extents.entry(piece.index).or_insert_with(|| Extent::new(piece.index));
            self.bytes -= extent.bytes();
            extent.merge(piece.offset, bytes);
            self.bytes += extent.bytes();
            if extent.is_whole(self.chunk_size) || extent.range_count() >= self.ranges_max {
                ready.extend(self.remove(piece.index));
            }
        }
        while self.extents.len() > self.chunks_max || self.bytes > self.bytes_max {
            let Some(&lowest) = self.extents.keys().next() else { break };
            ready.extend(self.remove(lowest));
        }
        ready
    }

    fn remove(&mut self, index: u64) -> Option<Extent> {
        let extent = self.extents.remove(&index)?;
        self.bytes -= extent.bytes();
        Some(extent)
    }

    /// Takes every buffered extent, in chunk order.
    pub fn take_all(&mut self) -> Vec<Extent> {
        self.bytes = 0;
        std::mem::take(&mut self.extents).into_values().collect()
    }

    /// The buffered extent of chunk `index`, if any.
    pub fn get(&self, index: u64) -> Option<&Extent> {
        self.extents.get(&index)
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

    fn ranges(e: &Extent) -> Vec<(u32, Vec<u8>)> {
        e.ranges.iter().map(|(&s, d)| (s, d.clone())).collect()
    }

    #[test]
    fn sequential_writes_coalesce_into_one_full_chunk() {
        let mut buf = WriteBuffer::new(8, 4, 16, 1 << 20);
        assert!(buf.write(0, b"abc").is_empty());
        assert!(buf.write(3, b"def").is_empty());
        let ready = buf.write(6, b"ghij");
        assert_eq!(ready.len(), 1);
        assert_eq!(ranges(&ready[0]), vec![(0, b"abcdefgh".to_vec())]);
        let rest = buf.take_all();
        assert_eq!((rest[0].index, ranges(&rest[0])), (1, vec![(0, b"ij".to_vec())]));
        assert!(buf.is_empty());
    }

    #[test]
    fn overlapping_writes_merge_and_the_newest_bytes_win() {
        let mut buf = WriteBuffer::new(16, 4, 16, 1 << 20);
        assert!(buf.write(4, b"xxxx").is_empty());
        assert!(buf.write(2, b"yyy").is_empty());
        assert!(buf.write(7, b"zz").is_empty());
        let all = buf.take_all();
        assert_eq!(ranges(&all[0]), vec![(2, b"yyyxxzz".to_vec())]);
        assert_eq!(all[0].clone().into_batch().file_end(16), 9);
    }

    #[test]
    fn scattered_writes_to_one_chunk_stay_separate_ranges_until_one_bridges_them() {
        let mut e = Extent::new(0);
        e.merge(10, b"bb");
        e.merge(0, b"aa");
        e.merge(20, b"cc");
        assert_eq!(e.range_count(), 3);
        assert_eq!(e.bytes(), 6);
        e.merge(1, b"0123456789012345678");
        assert_eq!(ranges(&e), vec![(0, b"a0123456789012345678cc".to_vec())]);
        assert_eq!(e.bytes(), 22);
    }

    #[test]
    fn a_batch_carries_every_range_and_clips_like_the_extent() {
        let mut e = Extent::new(3);
        e.merge(8, b"xy");
        e.merge(2, b"abc");
        let from_extent: Vec<(usize, Vec<u8>)> =
            clip(e.ranges(), 3, 6).map(|(p, b)| (p, b.to_vec())).collect();
        assert_eq!(from_extent, vec![(0, b"bc".to_vec()), (5, b"x".to_vec())]);
        let batch = e.into_batch();
        assert_eq!(batch.ranges, vec![(2, 3), (8, 2)]);
        assert_eq!(&batch.data[..], b"abcxy");
        assert_eq!(batch.file_end(16), 3 * 16 + 10);
        let from_batch: Vec<(usize, Vec<u8>)> =
            clip(batch.ranges(), 3, 6).map(|(p, b)| (p, b.to_vec())).collect();
        assert_eq!(from_batch, from_extent);
    }

    #[test]
    fn too_many_ranges_in_a_chunk_send_it() {
        let mut buf = WriteBuffer::new(64, 4, 3, 1 << 20);
        assert!(buf.write(0, b"a").is_empty());
        assert!(buf.write(10, b"b").is_empty());
        let ready = buf.write(20, b"c");
        assert_eq!(ready.len(), 1);
        assert_eq!(ready[0].clone().into_batch().ranges, vec![(0, 1), (10, 1), (20, 1)]);
        assert!(buf.is_empty());
    }

    #[test]
    fn too_many_dirty_chunks_or_bytes_push_the_lowest_out() {
        let mut buf = WriteBuffer::new(4, 2, 16, 1 << 20);
        assert!(buf.write(1, b"a").is_empty());
        assert!(buf.write(5, b"b").is_empty());
        let ready = buf.write(9, b"c");
        assert_eq!((ready.len(), ready[0].index), (1, 0));
        assert!(buf.has_span(2..3) && !buf.has_span(0..1));
        let mut buf = WriteBuffer::new(16, 8, 16, 4);
        assert!(buf.write(0, b"ab").is_empty());
        let ready = buf.write(16, b"cde");
        assert_eq!((ready.len(), ready[0].index), (1, 0));
        assert_eq!(buf.get(1).map(Extent::bytes), Some(3));
    }
}
