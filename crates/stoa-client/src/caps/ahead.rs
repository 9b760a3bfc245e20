//! Looking names up ahead (caps.md invariant 34): `ls -l` lists a directory, then looks
//! up each entry it listed, one after the other. On another mount than the one that
//! wrote them, each cold lookup is a grant at the leader, which recalls the writer's cap
//! first: three messages in turn per file. A lookup that misses the cache for a name
//! this client just listed asks, in one `GetCapsMany`, for that name and the ones listed
//! after it that are not cached either, so the leader recalls them together and the
//! lookups that follow are answered here.
//!
//! ```text
//!  readdir page from meta --> Listed::note(dir, names)
//!  lookup miss (dir, name) --> Listed::ahead: name listed? --no--> GetCaps alone
//!                                  | yes: name + the next uncached, up to the window
//!                                  v      (8, doubling per batch, up to LOOKUP_MANY_MAX)
//!                              GetCapsMany --> store each grant as a lookup's
//! ```
//!
//! The window starts small, so that one `stat` after a listing costs a few grants, not
//! a hundred recalls at the mount that writes there.

use super::*;
use std::collections::VecDeque;
use stoa_proto::LOOKUP_MANY_MAX;

/// How many directories' listings are kept.
const LISTED_DIRS_MAX: usize = 16;
/// How many names a directory's first look-ahead asks for.
const WINDOW_FIRST: usize = 8;

/// The directories this client listed from meta lately: the names of the last page
/// of each, in the order listed.
#[derive(Default)]
pub(super) struct Listed {
    /// The most recently listed last.
    dirs: VecDeque<Listing>,
}

struct Listing {
    dir: InodeId,
    names: Vec<Vec<u8>>,
    /// How many names the next look-ahead in the directory asks for.
    window: usize,
}

impl Listed {
    /// Notes that `names` were listed in `dir` (one page, in order).
    pub(super) fn note(&mut self, dir: InodeId, names: Vec<Vec<u8>>) {
        let at = self.dirs.iter().position(|l| l.dir == dir);
        let window = at.and_then(|i| self.dirs.remove(i)).map_or(WINDOW_FIRST, |l| l.window);
        self.dirs.push_back(Listing { dir, names, window });
        if self.dirs.len() > LISTED_DIRS_MAX {
            self.dirs.pop_front();
        }
    }

    /// The names to look up with `name` in `dir`: `name`, then those listed after it
    /// that `cached` does not know, as many as the directory's window, which then
    /// doubles. `None` when `name` was not in its last page or nothing follows it.
    pub(super) fn ahead(
        &mut self,
        dir: InodeId,
        name: &[u8],
        cached: impl Fn(&[u8]) -> bool,
    ) -> Option<Vec<Vec<u8>>> {
        let listing = self.dirs.iter_mut().find(|l| l.dir == dir)?;
        let at = listing.names.iter().position(|n| n == name)?;
        let mut names = vec![name.to_vec()];
        let next = listing.names[at + 1..].iter().filter(|n| !cached(n));
        names.extend(next.take(listing.window - 1).cloned());
        if names.len() < 2 {
            return None;
        }
        listing.window = (listing.window * 2).min(LOOKUP_MANY_MAX);
        Some(names)
    }
}

impl Client {
    /// Notes a page of `dir`'s entries listed from meta, for looking names up ahead.
    pub(crate) fn note_listed(&self, dir: InodeId, entries: &[DirEntry]) {
        let names = entries.iter().map(|e| e.name.clone()).collect();
        self.sh.caps.lately().note(dir, names);
    }

    /// After a lookup of `name` in `parent` missed the cache: when the name was just
    /// listed here, asks for it and the names listed after it in one call and caches
    /// their grants as lookups'. Returns whether `name`'s own grant was cached. A call
    /// that fails only costs the lookup its own call after it.
    pub(crate) async fn look_ahead(&self, parent: InodeId, name: &[u8]) -> bool {
        let names = {
            let t = self.sh.caps.lock();
            let cached = |n: &[u8]| Caps::peek(&t, parent, n);
            self.sh.caps.lately().ahead(parent, name, cached)
        };
        let Some(names) = names else { return false };
        self.grant_many(MetaOp::GetCapsMany { dir: parent, names }, parent, name).await
    }

    /// Sends `op`, a `GetCapsMany` or `TakeFiles` of names of `dir`, and caches each
    /// grant of its answer as a lookup's. Returns whether `name`'s grant was cached. A
    /// call that fails is logged and caches nothing: its caller then asks alone.
    pub(crate) async fn grant_many(&self, op: MetaOp, dir: InodeId, name: &[u8]) -> bool {
        let what = match op {
            MetaOp::TakeFiles { .. } => "TakeFiles",
            _ => "GetCapsMany",
        };
        let (dir_seq, dir_version, grants, epoch) = match self.call_grant(op).await {
            Ok((MetaResponse::Grants { dir_seq, dir_version, grants }, epoch)) => {
                (dir_seq, dir_version, grants, epoch)
            }
            Ok((other, _)) => {
                tracing::warn!("{}", unexpected(what, &other));
                return false;
            }
            Err(e) => {
                tracing::debug!("{what} in directory {dir}: {e}");
                return false;
            }
        };
        let mut asked = false;
        for g in grants {
            let grant = Grant {
                attr: g.attr,
                mode: g.mode,
                seq: g.seq,
                dir_seq,
                dir_version,
                xattrs: g.xattrs,
                sent: epoch,
            };
            let stored = self.keep(&grant, Some((dir, &g.name)));
            asked |= stored && g.name == name;
        }
        asked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<Vec<u8>> {
        list.iter().map(|n| n.as_bytes().to_vec()).collect()
    }

    #[test]
    fn a_lookup_of_a_listed_name_asks_for_the_next_uncached_in_a_growing_window() {
        let mut listed = Listed::default();
        let dir = InodeId(7);
        let all: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
        listed.note(dir, all.iter().map(|n| n.as_bytes().to_vec()).collect());
        let none = |_: &[u8]| false;
        // The first asks for a window of 8: the name and the 7 after it.
        let first = listed.ahead(dir, b"f000", none).unwrap();
        assert_eq!(first, names(&["f000", "f001", "f002", "f003", "f004", "f005", "f006", "f007"]));
        // Names already cached are passed over; the window doubled.
        let cached = |n: &[u8]| n < b"f010".as_slice() || n == b"f012";
        let second = listed.ahead(dir, b"f008", cached).unwrap();
        assert_eq!(second.len(), 16);
        assert_eq!(second[..4], names(&["f008", "f010", "f011", "f013"]));
        // It grows up to the most one call may ask.
        for _ in 0..10 {
            listed.ahead(dir, b"f100", none).unwrap();
        }
        assert_eq!(listed.ahead(dir, b"f100", none).unwrap().len(), LOOKUP_MANY_MAX);
        // A name not listed, another directory, or nothing after the name: looked up alone.
        assert_eq!(listed.ahead(dir, b"nope", none), None);
        assert_eq!(listed.ahead(InodeId(8), b"f000", none), None);
        assert_eq!(listed.ahead(dir, b"f299", none), None);
        assert_eq!(listed.ahead(dir, b"f290", |n: &[u8]| n != b"f290"), None);
    }

    #[test]
    fn a_new_page_replaces_the_last_and_only_the_latest_directories_are_kept() {
        let mut listed = Listed::default();
        listed.note(InodeId(1), names(&["a", "b"]));
        listed.ahead(InodeId(1), b"a", |_: &[u8]| false).unwrap();
        listed.note(InodeId(1), names(&["c", "d", "e"]));
        assert_eq!(listed.ahead(InodeId(1), b"a", |_: &[u8]| false), None);
        // The directory keeps its grown window across its pages.
        assert_eq!(listed.ahead(InodeId(1), b"c", |_: &[u8]| false).unwrap().len(), 3);
        for dir in 2..=LISTED_DIRS_MAX as u64 {
            listed.note(InodeId(dir), names(&["x", "y"]));
        }
        assert!(listed.ahead(InodeId(1), b"d", |_: &[u8]| false).is_some());
        listed.note(InodeId(99), names(&["x", "y"]));
        assert_eq!(listed.ahead(InodeId(1), b"d", |_: &[u8]| false), None);
        assert!(listed.ahead(InodeId(2), b"x", |_: &[u8]| false).is_some());
    }
}
