//! Cutting a byte range of a file into the chunks it touches.

/// The part of a byte range that falls inside one chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which chunk of the file.
    pub index: u64,
    /// Where the piece starts inside the chunk.
    pub offset: u32,
    pub len: u32,
    /// Where the piece starts inside the caller's range (0 for the first piece).
    pub pos: usize,
}

/// The pieces of `len` bytes at file `offset`, in file order.
pub fn split(offset: u64, len: u64, chunk_size: u32) -> impl Iterator<Item = Piece> {
    assert!(chunk_size > 0, "chunk size must be positive");
    let cs = u64::from(chunk_size);
    let end = offset.saturating_add(len);
    let mut at = offset;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let index = at / cs;
        let within = at % cs;
        let take = (cs - within).min(end - at);
        let piece =
            Piece { index, offset: within as u32, len: take as u32, pos: (at - offset) as usize };
        at += take;
        Some(piece)
    })
}

/// The chunk indexes that hold bytes of `[start, end)`.
pub fn chunk_span(start: u64, end: u64, chunk_size: u32) -> std::ops::Range<u64> {
    let cs = u64::from(chunk_size);
    if end <= start {
        return 0..0;
    }
    start / cs..end.div_ceil(cs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_inside_one_chunk_is_one_piece() {
        let pieces: Vec<Piece> = split(10, 20, 100).collect();
        assert_eq!(pieces, vec![Piece { index: 0, offset: 10, len: 20, pos: 0 }]);
    }

    #[test]
    fn a_range_across_chunks_is_cut_at_each_boundary() {
        let pieces: Vec<Piece> = split(150, 300, 100).collect();
        assert_eq!(
            pieces,
            vec![
                Piece { index: 1, offset: 50, len: 50, pos: 0 },
                Piece { index: 2, offset: 0, len: 100, pos: 50 },
                Piece { index: 3, offset: 0, len: 100, pos: 150 },
                Piece { index: 4, offset: 0, len: 50, pos: 250 },
            ]
        );
        let total: u32 = pieces.iter().map(|p| p.len).sum();
        assert_eq!(total, 300);
    }

    #[test]
    fn exact_chunks_and_empty_ranges() {
        let pieces: Vec<Piece> = split(200, 100, 100).collect();
        assert_eq!(pieces, vec![Piece { index: 2, offset: 0, len: 100, pos: 0 }]);
        assert_eq!(split(5, 0, 100).count(), 0);
    }

    #[test]
    fn chunk_span_covers_partial_chunks() {
        assert_eq!(chunk_span(0, 0, 100), 0..0);
        assert_eq!(chunk_span(0, 1, 100), 0..1);
        assert_eq!(chunk_span(99, 101, 100), 0..2);
        assert_eq!(chunk_span(100, 200, 100), 1..2);
    }
}
