//! Open directory streams.
//!
//! A stream keeps every entry it has listed so far, fetched page by page from meta in
//! name order. The FUSE offset of an entry is its position in the stream (after `.` and
//! `..`), so entries created or removed while a reader walks the directory never shift
//! the offsets it already holds; a rewind to offset 0 starts a fresh listing.

use stoa_client::{Client, DirEntry, FsError, InodeId};

/// Entries fetched from meta per page.
const PAGE_ENTRIES: u32 = 256;

pub struct DirStream {
    ino: InodeId,
    entries: Vec<DirEntry>,
    /// Whether meta has more entries after the last one fetched.
    more: bool,
}

impl DirStream {
    pub fn new(ino: InodeId) -> DirStream {
        DirStream { ino, entries: Vec::new(), more: true }
    }

    /// Forgets what was listed, so the next entries come fresh from meta.
    pub fn rewind(&mut self) {
        self.entries.clear();
        self.more = true;
    }

    /// The `i`-th entry of the stream (not counting `.` and `..`), fetching pages as
    /// needed; `None` past the end.
    pub async fn entry(&mut self, client: &Client, i: usize) -> Result<Option<&DirEntry>, FsError> {
        while i >= self.entries.len() && self.more {
            let after = self.entries.last().map(|e| e.name.clone()).unwrap_or_default();
            let (page, more) = client.readdir(self.ino, &after, PAGE_ENTRIES).await?;
            // An empty page that claims more would loop forever; treat it as the end.
            self.more = more && !page.is_empty();
            self.entries.extend(page);
        }
        Ok(self.entries.get(i))
    }
}
