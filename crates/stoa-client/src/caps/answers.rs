//! Attributes meta answered, and which of them the cache keeps (docs/flows/caps.md,
//! invariant 15): answers of calls meta served in one order arrive in another, so each
//! is ordered by the inode's version against what is cached, and by the forget clock
//! (the client's own changes make what it cached stale) when nothing is. The forgets
//! outlive the caps they were made under, for as long as an older call can still be
//! answered.

use super::{Caps, Held, Table};
use std::time::Instant;
use stoa_types::{Attr, InodeId};

/// [`Held::forgotten`] and [`Held::refused`] of an inode no longer held, and when they
/// were left here.
pub(super) struct Unheld {
    forgotten: u64,
    refused: u64,
    pub(super) at: Instant,
}

impl Table {
    /// Removes the cap on `ino`, keeping what its forgets left ([`Table::unheld`]).
    pub(super) fn unhold(&mut self, ino: InodeId) -> Option<Held> {
        let h = self.held.remove(&ino)?;
        self.left(ino, &h);
        Some(h)
    }

    pub(super) fn left(&mut self, ino: InodeId, h: &Held) {
        if h.forgotten > 0 || h.refused > 0 {
            let (forgotten, refused, at) = (h.forgotten, h.refused, Instant::now());
            self.unheld.insert(ino, Unheld { forgotten, refused, at });
        }
    }

    /// The cap on `ino`, made with `new` if none is held, starting from what forgets
    /// left of the inode while it was not.
    pub(super) fn hold(&mut self, ino: InodeId, new: impl FnOnce() -> Held) -> &mut Held {
        let left = self.unheld.get(&ino);
        self.held.entry(ino).or_insert_with(|| match left {
            Some(u) => Held { forgotten: u.forgotten, refused: u.refused, ..new() },
            None => new(),
        })
    }
}

impl Caps {
    /// Where the clock of forgotten attributes stands: read before sending a call
    /// whose answer carries attributes, and passed with them to [`Caps::update_attr`].
    pub fn epoch(&self) -> u64 {
        self.lock().forgets
    }

    /// Whether this client has seen a newer version of `attr`'s inode than `attr`: one
    /// cached, or one refused while nothing was cached.
    pub fn knows_newer(&self, attr: &Attr) -> bool {
        let t = self.lock();
        let Some(h) = t.held.get(&attr.ino) else { return false };
        h.attr.as_ref().map_or(h.refused, |a| a.version.max(h.refused)) > attr.version
    }

    /// Replaces the cached attributes of `ino` with fresher ones, when a cap is held,
    /// from the answer to a call sent at `sent` (an [`Caps::epoch`]).
    pub fn update_attr(&self, attr: Attr, sent: u64) {
        let mut t = self.lock();
        let linked = t.linked;
        if let Some(h) = t.held.get_mut(&attr.ino) {
            let kept = keep_newest(h, &attr, sent, linked);
            trace_answer("answer", &attr, sent, h, kept);
        }
    }

    /// Forgets what this client's own change made stale: the attributes of `inodes`
    /// (and the listings of those that are directories) and the names `names`. Answers
    /// to calls sent before this are not cached after it.
    pub fn forget(&self, inodes: &[InodeId], names: &[(InodeId, &[u8])]) {
        let mut t = self.lock();
        let now = t.next_forget();
        tracing::trace!(?inodes, forget = now, "attributes forgotten");
        let mut missing = false;
        for ino in inodes {
            if let Some(h) = t.held.get_mut(ino) {
                h.forget_attr(now);
                h.listing = None;
                h.pages.clear();
                missing |= std::mem::take(&mut h.kernel_missing);
            } else {
                let refused = t.unheld.get(ino).map_or(0, |u| u.refused);
                t.unheld.insert(*ino, Unheld { forgotten: now, refused, at: Instant::now() });
            }
        }
        for (parent, name) in names {
            if let Some(h) = t.held.get_mut(parent) {
                h.names.remove(*name);
            }
        }
        drop(t);
        // The kernel may hold absences the listing answered, and the listing may have
        // been wrong (a change of this client's that meta refused).
        if missing {
            if let Some(kernel) = self.kernel() {
                if !kernel.expire_all_names() {
                    tracing::warn!("could not expire the kernel's names after dropping a listing");
                }
            }
        }
    }

    /// Forgets the attributes of every hard-linked inode: a name this client removed may
    /// have been one of theirs without this client having looked it up. Nor is an
    /// answer counting more than one link cached if its call was sent before: the inode
    /// may have had nothing cached now, or no cap at all.
    pub fn forget_linked(&self) {
        let mut t = self.lock();
        let now = t.next_forget();
        t.linked = now;
        for h in t.held.values_mut() {
            if h.attr.as_ref().is_some_and(|a| a.nlink > 1) {
                h.forget_attr(now);
            }
        }
    }
}

/// Caches `attr`, the answer to a call sent at epoch `sent`, unless what is cached is a
/// newer version; or, with nothing cached, unless the attributes were forgotten after
/// the call was sent or an answer refused so had a newer version. Answers from meta (a
/// grant, a commit) can arrive in another order than meta gave them, and once
/// forgotten nothing cached is left to compare a version with (caps.md invariant 15).
/// What is cached came from a call sent after the last forget, so a newer version than
/// it is newer than what made the forget too, even in the answer to a call sent before.
/// An answer counting more than one link is not cached if its call was sent before
/// `linked` ([`Caps::forget_linked`]).
/// Returns whether it was cached.
pub(super) fn keep_newest(h: &mut Held, attr: &Attr, sent: u64, linked: u64) -> bool {
    let newer = match &h.attr {
        _ if attr.nlink > 1 && linked > sent => false,
        Some(cached) => cached.version <= attr.version,
        None if h.forgotten > sent => {
            h.refused = h.refused.max(attr.version);
            false
        }
        None => attr.version >= h.refused,
    };
    if newer {
        h.attr = Some(attr.clone());
    }
    newer
}

/// Traces what [`keep_newest`] made of attributes meta answered (`STOA_LOG` with
/// `stoa_client=trace`): with the kernel's side (`stoa_fuse=trace`) and each open file's
/// (`learn`), a stale answer can be followed to the call that brought it.
pub(super) fn trace_answer(what: &str, attr: &Attr, sent: u64, h: &Held, kept: bool) {
    tracing::trace!(
        ino = attr.ino.0,
        version = attr.version,
        size = attr.size,
        nlink = attr.nlink,
        sent,
        forgotten = h.forgotten,
        refused = h.refused,
        kept,
        "{what} attributes"
    );
}

#[cfg(test)]
mod tests {
    use super::super::tests::{attr, shared};
    use super::super::*;
    use stoa_proto::cap_seq;

    /// A call that changes a link count makes the client forget the inode's attributes;
    /// the answer to a call sent before that (a size commit or a grant read at meta
    /// before the change) must not fill the cache again with the old count, whatever its
    /// version says. Found in CI (`posix.rs`): a second hard link showed 2 links after
    /// the first was unlinked.
    #[test]
    fn an_answer_to_a_call_sent_before_a_forget_is_not_cached_after_it() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let file = InodeId(2);
        let mut linked = attr(file);
        linked.nlink = 2;
        let seq = cap_seq(1, 1);
        let grant = shared(linked.clone(), seq, 0, 0);
        assert!(caps.store(&grant, None));
        let before = caps.epoch();
        caps.forget(&[file], &[]);
        let mut committed = linked.clone();
        committed.version = 2;
        caps.update_attr(committed.clone(), before);
        assert!(caps.cached_attr(file).is_none(), "a commit sent before the unlink");
        let seq = cap_seq(1, 2);
        let late = shared(committed.clone(), seq, 0, before);
        assert!(caps.store(&late, None));
        assert!(caps.cached_attr(file).is_none(), "a grant asked for before the unlink");
        let mut unlinked = committed;
        unlinked.nlink = 1;
        unlinked.version = 3;
        caps.update_attr(unlinked.clone(), caps.epoch());
        assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(unlinked.clone()));
        // Once something is cached again, versions order the answers, whenever their
        // calls were sent: a size commit sent before a forget and applied after a
        // grant (sent after it) read the file is newer than that grant.
        let before = caps.epoch();
        caps.forget(&[file], &[]);
        let seq = cap_seq(1, 3);
        assert!(caps.store(&shared(unlinked.clone(), seq, 0, caps.epoch()), None));
        let mut grown = unlinked.clone();
        (grown.size, grown.version) = (7, 4);
        caps.update_attr(grown.clone(), before);
        assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(grown.clone()));
        // An older one, sent before or after, is not kept.
        caps.update_attr(unlinked.clone(), before);
        caps.update_attr(unlinked.clone(), caps.epoch());
        assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(grown.clone()));
        // Nor one that comes after a newer answer that was not kept: the commit's
        // answer came first, while nothing was cached, and the grant read before it
        // applied comes second.
        let before = caps.epoch();
        caps.forget(&[file], &[]);
        let mut longer = grown.clone();
        (longer.size, longer.version) = (9, 6);
        caps.update_attr(longer.clone(), before);
        assert!(caps.cached_attr(file).is_none(), "a commit sent before the forget");
        let mut read_before = grown;
        read_before.version = 5;
        assert!(caps.store(&shared(read_before, cap_seq(1, 4), 0, caps.epoch()), None));
        assert!(caps.cached_attr(file).is_none(), "a grant older than an answer seen");
        caps.update_attr(longer.clone(), caps.epoch());
        assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(longer));
    }

    /// A forget holds for an inode with no cap too, and outlasts a cap that goes: a
    /// grant asked for before it, arriving after, gives a cap but its attributes are not
    /// cached. The same after every cap lapsed, and after a recall.
    #[test]
    fn a_forget_holds_for_a_grant_asked_before_it_while_the_inode_had_no_cap() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let file = InodeId(2);
        let mut linked = attr(file);
        linked.nlink = 2;
        let before = caps.epoch();
        caps.forget(&[file], &[]);
        assert!(caps.store(&shared(linked.clone(), cap_seq(1, 1), 0, before), None));
        assert!(caps.holds(file, CapMode::Shared));
        assert!(caps.cached_attr(file).is_none(), "asked for before the forget");
        let mut unlinked = linked.clone();
        (unlinked.nlink, unlinked.version) = (1, 2);
        assert!(caps.store(&shared(unlinked.clone(), cap_seq(1, 2), 0, caps.epoch()), None));
        assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(unlinked.clone()));
        // Forgotten under a cap that then lapses, or is recalled.
        for lose in [
            |c: &Caps| drop(c.drop_all()),
            |c: &Caps| drop(c.begin_recall(CapRef { ino: InodeId(2), seq: cap_seq(1, 9) })),
        ] {
            let before = caps.epoch();
            caps.forget(&[file], &[]);
            lose(&caps);
            caps.renewed(Instant::now(), Duration::from_secs(10));
            assert!(caps.store(&shared(linked.clone(), cap_seq(2, 1), 0, before), None));
            assert!(caps.cached_attr(file).is_none(), "asked for before the forget");
            assert!(caps.store(&shared(unlinked.clone(), cap_seq(2, 2), 0, caps.epoch()), None));
            assert_eq!(caps.cached_attr(file).map(|(a, _)| a), Some(unlinked.clone()));
        }
    }

    /// After this client removed a name without knowing its inode, no answer counting
    /// more than one link to a call sent before is cached, whether the inode had its
    /// attributes cached, had them forgotten, or had no cap: the name removed may have
    /// been one of its links. One link is not in doubt.
    #[test]
    fn a_removal_by_an_unknown_name_keeps_out_link_counts_asked_for_before_it() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let (cached, forgotten, unheld, single) = (InodeId(2), InodeId(3), InodeId(4), InodeId(5));
        let linked = |ino| Attr { nlink: 2, ..attr(ino) };
        for ino in [cached, forgotten] {
            assert!(caps.store(&shared(linked(ino), cap_seq(1, ino.0), 0, 0), None));
        }
        caps.forget(&[forgotten], &[]);
        let before = caps.epoch();
        caps.forget_linked();
        for ino in [cached, forgotten] {
            caps.update_attr(Attr { version: 2, ..linked(ino) }, before);
            assert!(caps.cached_attr(ino).is_none(), "inode {ino}");
        }
        assert!(caps.store(&shared(linked(unheld), cap_seq(1, 6), 0, before), None));
        assert!(caps.cached_attr(unheld).is_none());
        assert!(caps.store(&shared(attr(single), cap_seq(1, 7), 0, before), None));
        assert!(caps.cached_attr(single).is_some(), "one link");
        let after = caps.epoch();
        for ino in [cached, forgotten, unheld] {
            caps.update_attr(Attr { version: 3, ..linked(ino) }, after);
        }
        for ino in [cached, forgotten, unheld] {
            assert!(caps.cached_attr(ino).is_some(), "inode {ino}: asked for after");
        }
    }

    /// A newer version is known when one is cached, or was refused while nothing was
    /// cached; an answer older than either is not handed to the kernel as it is
    /// (`Client::newest`).
    #[test]
    fn a_newer_version_is_known_cached_or_refused() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let file = InodeId(2);
        let at = |version| Attr { version, ..attr(file) };
        assert!(!caps.knows_newer(&at(1)), "not held");
        assert!(caps.store(&shared(at(3), cap_seq(1, 1), 0, caps.epoch()), None));
        assert!(caps.knows_newer(&at(2)));
        assert!(!caps.knows_newer(&at(3)));
        let before = caps.epoch();
        caps.forget(&[file], &[]);
        assert!(!caps.knows_newer(&at(2)), "forgotten");
        caps.update_attr(at(5), before);
        assert!(caps.cached_attr(file).is_none());
        assert!(caps.knows_newer(&at(4)), "refused");
        assert!(!caps.knows_newer(&at(5)));
    }
}
