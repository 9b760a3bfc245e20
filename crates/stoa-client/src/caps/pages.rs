//! Listings kept under a shared cap (caps.md invariant 35): a page of a directory's
//! entries that meta gave while this client held `Shared` on the directory answers the
//! same `ReadDir` again until the cap goes. Every change of the directory's entries by
//! another session recalls the cap first (its parents are among what a change touches),
//! and this client's own changes there forget the pages with its attributes.
//!
//! ```text
//!  readdir(dir, after, limit) --> exclusive listing? --> page from it
//!                             --> kept page (Shared held)? --> it
//!                             --> ticket (seq, forget epoch) --> ReadDir at meta
//!                                 --> keep the page if the same cap, with no newer
//!                                     grant and no forget, still stands
//! ```
//!
//! A page is kept only when the cap it was asked under still stands unchanged when the
//! answer comes: a recall in between drops the `Held`, a grant after it raises its
//! sequence (possibly a new cap after a recall), and one of this client's own changes
//! marks it forgotten. Pages are kept for `Shared` caps only: an exclusive holder's
//! listing changes here, with no call to meta. At most [`PAGED_ENTRIES_MAX`] entries are
//! kept over every directory, the oldest pages dropped first.

use super::*;

/// The most listed entries kept over every directory.
const PAGED_ENTRIES_MAX: usize = 262_144;

/// What a page of a listing is asked under: the grant of the directory's cap and the
/// forget count when it was asked.
#[derive(Clone, Copy, Debug)]
pub struct PageTicket {
    seq: u64,
    epoch: u64,
}

/// One page of a listing: the entries and whether more follow.
pub(super) type Page = (Vec<DirEntry>, bool);

impl Caps {
    /// The page of `dir` from `after`, of up to `limit` entries, if one is kept under a
    /// usable shared cap.
    pub fn kept_page(&self, dir: InodeId, after: &[u8], limit: u32) -> Option<Page> {
        let mut t = self.lock();
        let h = Caps::usable(&mut t, dir).filter(|h| h.mode == CapMode::Shared)?;
        h.pages.get(&(after.to_vec(), limit)).cloned()
    }

    /// What a `ReadDir` of `dir` about to be sent is asked under, when this client holds
    /// a usable shared cap on it.
    pub fn page_ticket(&self, dir: InodeId) -> Option<PageTicket> {
        let mut t = self.lock();
        let epoch = t.forgets;
        let h = Caps::usable(&mut t, dir).filter(|h| h.mode == CapMode::Shared)?;
        Some(PageTicket { seq: h.seq, epoch })
    }

    /// Keeps a page of `dir` meta gave for a `ReadDir` asked under `ticket`, if that cap
    /// still stands as it was.
    pub fn keep_page(&self, dir: InodeId, ticket: PageTicket, key: (&[u8], u32), page: &Page) {
        let mut t = self.lock();
        let Some(h) = t.held.get_mut(&dir) else { return };
        let unchanged = h.mode == CapMode::Shared && h.seq == ticket.seq;
        if !unchanged || h.forgotten > ticket.epoch {
            return;
        }
        h.pages.insert((key.0.to_vec(), key.1), page.clone());
        t.paged.push_back((dir, page.0.len()));
        t.paged_entries += page.0.len();
        while t.paged_entries > PAGED_ENTRIES_MAX {
            let Some((oldest, n)) = t.paged.pop_front() else { break };
            t.paged_entries -= n;
            // Kept again since, perhaps: dropped all the same, which costs a call.
            if let Some(h) = t.held.get_mut(&oldest) {
                h.pages.clear();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_proto::cap_seq;

    const DIR: InodeId = InodeId(1);

    fn entries(names: &[&str]) -> Vec<DirEntry> {
        let entry = |(i, n): (usize, &&str)| DirEntry {
            name: n.as_bytes().to_vec(),
            ino: InodeId(10 + i as u64),
            kind: FileKind::File,
        };
        names.iter().enumerate().map(entry).collect()
    }

    /// Caps holding `DIR` shared under grant `seq`, usable for a minute.
    fn holding(seq: u64) -> Caps {
        let caps = Caps::new(100);
        let mut t = caps.lock();
        t.valid_until = Some(Instant::now() + Duration::from_secs(60));
        t.held.insert(DIR, Held { seq, ..empty_held() });
        drop(t);
        caps
    }

    #[test]
    fn a_page_is_kept_while_the_shared_cap_it_was_asked_under_stands() {
        let caps = holding(cap_seq(1, 1));
        let page = (entries(&["a", "b"]), false);
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.keep_page(DIR, ticket, (b"", 1024), &page);
        assert_eq!(caps.kept_page(DIR, b"", 1024), Some(page.clone()));
        // Another page is another call.
        assert_eq!(caps.kept_page(DIR, b"b", 1024), None);
        assert_eq!(caps.kept_page(DIR, b"", 2048), None);
        // This client's own change there forgets it.
        caps.forget(&[DIR], &[]);
        assert_eq!(caps.kept_page(DIR, b"", 1024), None);
        // A recall drops it with the cap.
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.keep_page(DIR, ticket, (b"", 1024), &page);
        caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 1) });
        assert_eq!(caps.kept_page(DIR, b"", 1024), None);
        assert!(caps.page_ticket(DIR).is_none());
    }

    #[test]
    fn a_page_whose_cap_changed_while_it_was_asked_is_not_kept() {
        let page = (entries(&["a"]), false);
        // A forget (this client's own change) while the call was out.
        let caps = holding(cap_seq(1, 1));
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.forget(&[DIR], &[]);
        caps.keep_page(DIR, ticket, (b"", 1024), &page);
        assert_eq!(caps.kept_page(DIR, b"", 1024), None);
        // A recall, then a new grant, while the call was out.
        let caps = holding(cap_seq(1, 1));
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.lock().held.get_mut(&DIR).unwrap().seq = cap_seq(1, 2);
        caps.keep_page(DIR, ticket, (b"", 1024), &page);
        assert_eq!(caps.kept_page(DIR, b"", 1024), None);
        // The directory taken exclusively: its listing, not pages, answers.
        let caps = holding(cap_seq(1, 1));
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.lock().held.get_mut(&DIR).unwrap().mode = CapMode::Exclusive;
        caps.keep_page(DIR, ticket, (b"", 1024), &page);
        assert_eq!(caps.kept_page(DIR, b"", 1024), None);
        assert!(caps.page_ticket(DIR).is_none());
    }

    #[test]
    fn the_oldest_pages_go_past_the_bound() {
        let caps = holding(cap_seq(1, 1));
        let other = InodeId(2);
        caps.lock().held.insert(other, Held { seq: cap_seq(1, 2), ..empty_held() });
        let big = (vec![entries(&["x"])[0].clone(); PAGED_ENTRIES_MAX / 2 + 1], true);
        let ticket = caps.page_ticket(DIR).unwrap();
        caps.keep_page(DIR, ticket, (b"", 4096), &big);
        let ticket = caps.page_ticket(other).unwrap();
        caps.keep_page(other, ticket, (b"", 4096), &big);
        assert_eq!(caps.kept_page(DIR, b"", 4096), None);
        assert_eq!(caps.kept_page(other, b"", 4096), Some(big));
    }
}
