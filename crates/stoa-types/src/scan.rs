//! Whether reads of whole small files come in inode order, and which inodes to read
//! ahead of them.
//!
//! A client numbers the files it creates from reserved ranges, so a burst of creates (an
//! untar, a copy of a tree, a build's outputs) is a run of consecutive inodes, and such
//! files are very often read back in the same order. Both a chunk server (warming its
//! caches for the next files' first chunks) and a client (fetching them before they are
//! opened) follow such scans with this window.
//!
//! ```text
//!  read of a small file's first chunk from its start (ino)
//!    --> the previous such read was of one of the GAP_MAX inodes before?
//!    --> it had to wait (`missed`), or a window is open and ino is past its middle?
//!    --> read ahead the inodes after the window's end up to ino + ahead, one run at a
//!        time
//! ```

use std::ops::RangeInclusive;

/// The largest step between two inodes read one after the other that still counts as a
/// scan: a chunk server holds only some of a run of inodes (each inode's chain is picked
/// by a hash), and a directory's files need not be every inode of a run.
pub const SCAN_GAP_MAX: u64 = 8;

/// Where a scan in inode order stands.
#[derive(Debug, PartialEq, Eq)]
pub struct InodeScan {
    /// How many inodes after the one read a window reaches.
    files_ahead: u64,
    /// The inode of the last read of a first chunk from its start.
    last: Option<u64>,
    /// The last inode the current window covers (0: none).
    ahead: u64,
}

impl InodeScan {
    pub fn new(files_ahead: u64) -> InodeScan {
        InodeScan { files_ahead, last: None, ahead: 0 }
    }

    /// Notes a read of the first chunk of `ino` from its start that had to wait
    /// (`missed`) or not; the inodes to read ahead now, if any. `busy`: a run this scan
    /// started is still in flight (a caller that only starts fetches has none), so
    /// none starts now.
    pub fn on_read(&mut self, ino: u64, missed: bool, busy: bool) -> Option<RangeInclusive<u64>> {
        let in_order = self.last.is_some_and(|last| last < ino && ino - last <= SCAN_GAP_MAX);
        self.last = Some(ino);
        // A window this read is not inside belongs to another scan, or is used up.
        if self.ahead <= ino || self.ahead > ino.saturating_add(self.files_ahead) {
            self.ahead = 0;
        }
        let start = if self.ahead == 0 { missed } else { self.ahead - ino <= self.files_ahead / 2 };
        if !in_order || busy || !start {
            return None;
        }
        let from = self.ahead.max(ino) + 1;
        let to = ino.saturating_add(self.files_ahead);
        self.ahead = to;
        Some(from..=to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_in_inode_order_starts_on_a_miss_and_keeps_a_window_ahead() {
        let mut w = InodeScan::new(32);
        // The first read of a scan cannot tell it is one.
        assert_eq!(w.on_read(98, true, false), None);
        // The next in order (not every inode need be read), which missed too, starts a
        // run.
        assert_eq!(w.on_read(101, true, false), Some(102..=133));
        // Nothing more while it runs, nor while the window is far enough ahead.
        assert_eq!(w.on_read(102, false, true), None);
        assert_eq!(w.on_read(103, false, false), None);
        for ino in 104..117 {
            assert_eq!(w.on_read(ino, false, false), None, "{ino}");
        }
        // Half way through the window, hits extend it from where it ended.
        assert_eq!(w.on_read(117, false, false), Some(134..=149));
        assert_eq!(w.on_read(118, false, false), None);
    }

    #[test]
    fn reads_out_of_order_or_of_cached_files_start_nothing() {
        let mut w = InodeScan::new(32);
        for ino in [7, 3, 12, 40, 40 + SCAN_GAP_MAX + 1, 9] {
            assert_eq!(w.on_read(ino, true, false), None, "{ino}");
        }
        // A scan of files that are all cached starts nothing either.
        let mut w = InodeScan::new(32);
        for ino in 200..300 {
            assert_eq!(w.on_read(ino, false, false), None, "{ino}");
        }
    }

    #[test]
    fn a_window_another_scan_left_behind_does_not_stop_a_new_one() {
        let mut w = InodeScan::new(32);
        assert_eq!(w.on_read(500, true, false), None);
        assert_eq!(w.on_read(501, true, false), Some(502..=533));
        // Another scan, far below the window: it starts its own on its next miss.
        assert_eq!(w.on_read(10, true, false), None);
        assert_eq!(w.on_read(11, true, false), Some(12..=43));
        // And one that jumped past the window's end.
        assert_eq!(w.on_read(90, true, false), None);
        assert_eq!(w.on_read(91, true, false), Some(92..=123));
    }

    /// A shorter window, as a client keeps: the same rules at its own size.
    #[test]
    fn a_window_of_another_size_extends_half_way_through() {
        let mut w = InodeScan::new(8);
        assert_eq!(w.on_read(1, true, false), None);
        assert_eq!(w.on_read(2, true, false), Some(3..=10));
        assert_eq!(w.on_read(5, true, false), None);
        assert_eq!(w.on_read(6, true, false), Some(11..=14));
    }
}
