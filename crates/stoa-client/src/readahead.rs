//! Sequential-read detection for one open file handle.
//!
//! The kernel may send the reads of one sequential stream slightly out of order (it
//! issues readahead asynchronously), so a read counts as sequential when it starts close
//! to where the previous one ended, not only exactly there. "Close" is a few reads of
//! the same size: a fixed slack of 1 MiB took one pair in a few thousand of 4 KiB random
//! reads in a 64 MiB file for a stream, and the three chunks then fetched answered a
//! quarter of the reads of a random-read benchmark from the client's memory.

/// How far from the previous read's end a read may start and still count as
/// sequential, in reads of its size.
const SLACK_READS: u64 = 4;
/// How many chunks past the one being read are fetched ahead.
pub const CHUNKS_AHEAD: u64 = 2;

/// The read pattern seen so far on one handle.
#[derive(Debug, Default)]
pub struct Readahead {
    next: u64,
    streak: u32,
}

impl Readahead {
    /// Records a read of `len` bytes at `offset` and returns the chunk indexes worth
    /// fetching ahead (empty unless the reads look sequential).
    pub fn observe(&mut self, offset: u64, len: u64, chunk_size: u32) -> std::ops::Range<u64> {
        let end = offset + len;
        let slack = SLACK_READS * len;
        if offset.abs_diff(self.next) <= slack && (self.streak > 0 || offset > 0) {
            self.streak += 1;
            self.next = self.next.max(end);
        } else {
            // A read at offset 0 is the usual start of a whole-file read.
            self.streak = u32::from(offset == 0);
            self.next = end;
        }
        if self.streak < 2 {
            return 0..0;
        }
        let current = end / u64::from(chunk_size);
        current..current + 1 + CHUNKS_AHEAD
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_reads_start_readahead() {
        let mut ra = Readahead::default();
        assert_eq!(ra.observe(0, 100, 1000), 0..0);
        assert_eq!(ra.observe(100, 100, 1000), 0..3);
        assert_eq!(ra.observe(200, 900, 1000), 1..4);
    }

    #[test]
    fn slightly_reordered_reads_stay_sequential() {
        let mut ra = Readahead::default();
        ra.observe(0, 131072, 4 << 20);
        assert!(!ra.observe(262144, 131072, 4 << 20).is_empty());
        assert!(!ra.observe(131072, 131072, 4 << 20).is_empty());
    }

    #[test]
    fn random_reads_do_not_read_ahead() {
        let mut ra = Readahead::default();
        let chunk = 1 << 20;
        for offset in [50u64 << 20, 3 << 20, 90 << 20, 7 << 20] {
            assert!(ra.observe(offset, 4096, chunk).is_empty(), "at {offset}");
        }
    }

    /// A random-read benchmark's pattern: 4 KiB reads anywhere in a 64 MiB file.
    #[test]
    fn small_random_reads_in_a_small_file_never_read_ahead() {
        let (mut ra, mut x) = (Readahead::default(), 12345u64);
        for _ in 0..100_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let offset = (x >> 33) % (64 << 20) / 4096 * 4096;
            assert!(ra.observe(offset, 4096, 4 << 20).is_empty(), "at {offset}");
        }
    }
}
