//! Where the kernel may hold a name of each file it got from this mount, so that a lookup
//! never gives it a second name for a file that has one (caps.md invariant 27).
//!
//! The kernel resolves the two names of a rename one after the other, under its own lock
//! of the directory, which another mount does not take: if that mount renames `a` to
//! `b` in between, the kernel gets the old `a` from its cache and the new `b` from us,
//! both the same inode, and renaming a name onto another name of the same file returns
//! success without asking the filesystem. Two mounts renaming one name at once then
//! both succeeded (the fault runs' "stale entry cache across mounts"). So a lookup that
//! finds a file with one link under another name than the kernel may hold it answers
//! `ESTALE`, and keeps answering it until the kernel no longer holds the old name: the
//! mount has the kernel drop it (`fs.rs`), and a lookup of the old name that finds
//! nothing or another file ends it too. Moving the record at the first `ESTALE` was not
//! enough when the kernel had the new name cached as well (a rename onto an existing
//! file): the `ESTALE` then only failed the new name's revalidation, the kernel looked
//! it up again at once within the same rename, got the file, and both mounts' renames
//! succeeded.
//!
//! A directory's old name in another directory is held to the same rule. The kernel
//! moves a directory's cached entry to a new name it is given, but not while it holds
//! the lock of all cross-directory renames: a rename of a directory that another mount
//! had moved here from another directory, whose old name this kernel still held, failed
//! with `ESTALE` every time, its retry included (the namespace model check, `nsx.py`,
//! seed 40; 20 of 20 in `caps.rs`). An old name in the same directory the kernel moves
//! taking no lock, so it is left to it: holding those to the rule too made lookups there
//! answer `ESTALE`, and mkdir, link and rename, whose retry takes the directory again
//! before the drop can, failed with it (11 of 40 model-check seeds). A dropped entry of
//! a directory that is held open stays the kernel inode's all the same, and a rename
//! across directories cannot move it: a rename meeting a directory moved from another
//! directory gets it as another node ([`KernelNames::moved_dir`], `ids.rs`).
//!
//! A lookup that meets the old name waits a little for the kernel to drop it, and then
//! answers (`fs.rs`): once the kernel dropped the old name, no rename holds it (a rename
//! holds its directories' locks, which the drop takes). Only when the drop does not end
//! in that time (a rename, or this very lookup, holds the directory) does the lookup
//! answer `ESTALE`, and the kernel's walk again, with `LOOKUP_REVAL`, waits for the drop
//! already on its way. Before, that second lookup could come before the drop ended and
//! fail the process's `stat` or `open` with `ESTALE` (the model check: 3 in 260,000
//! operations; two mounts replacing and reading one name: 5 in 4,928 reads).
//!
//! For a file, only a rename must never see both names: it alone answers success for two
//! names of one inode without asking, and only when the old name is one of its two. So
//! when the drop does not end in time and the caller is not in a rename from or onto a
//! name like the old one (`caller.rs`: the last components of the rename's paths, read
//! from the caller's memory), the file is given all the same, with no record, and the
//! kernel holds both names until the caller lets go of the directory and the drop runs.
//! An unlink, link, create or walk whose caller held the directory failed with `ESTALE`
//! before: its retry took the directory again before the drop could (two mounts churning
//! five names: 33 in 30,560 operations before, 1 in 37,768 after). Until 2026-12-01 any
//! rename did too, of two names neither of which the kernel held the file under.

use std::collections::HashMap;
use std::sync::Mutex;
use stoa_client::{Attr, FileKind};
use tokio::sync::watch;

/// A name: the directory's inode and the entry's bytes.
type Name = (u64, Vec<u8>);

#[derive(Default)]
pub struct KernelNames(Mutex<Names>);

#[derive(Default)]
struct Names {
    by_ino: HashMap<u64, Name>,
    by_name: HashMap<Name, u64>,
    /// Inodes whose old name the kernel is being told to drop: true once it has.
    dropping: HashMap<u64, watch::Receiver<bool>>,
    /// The directory each directory node was last given in, kept until the kernel
    /// forgets the node: a dropped name of a directory open here stays the inode's
    /// entry, under that directory, while its record above is gone.
    dir_parents: HashMap<u64, u64>,
}

impl Names {
    fn unlink(&mut self, ino: u64) -> Option<Name> {
        let name = self.by_ino.remove(&ino)?;
        self.by_name.remove(&name);
        Some(name)
    }

    fn unname(&mut self, name: &Name) -> Option<u64> {
        let ino = self.by_name.remove(name)?;
        self.by_ino.remove(&ino);
        Some(ino)
    }

    /// The kernel moved its entry of `ino` to `to` itself (a rename made here): its
    /// name, and for a directory the directory it is in, go with it.
    fn place(&mut self, ino: u64, to: Name) {
        if let Some(parent) = self.dir_parents.get_mut(&ino) {
            *parent = to.0;
        }
        self.by_name.insert(to.clone(), ino);
        self.by_ino.insert(ino, to);
    }
}

impl KernelNames {
    /// Records that the kernel gets `attr` as node `ino` under `parent`/`name`. Returns
    /// the other name the kernel may still hold the same node under, if it has only one
    /// (a file with one link, or a directory moved from another directory): the caller
    /// must not give it this name then, and has the kernel drop the old one
    /// ([`KernelNames::dropped`] once it has).
    pub fn give(&self, parent: u64, name: &[u8], ino: u64, attr: &Attr) -> Option<Name> {
        let mut n = self.lock();
        if attr.kind == FileKind::Dir {
            n.dir_parents.insert(ino, parent);
        }
        if attr.kind != FileKind::Dir && attr.nlink != 1 {
            // A file with several links has several names.
            n.unlink(ino);
            return None;
        }
        if let Some((p, known)) = n.by_ino.get(&ino) {
            // The common case, a name looked up again, costs no allocation.
            if *p == parent && known == name {
                return None;
            }
            // A directory's old name in the same directory the kernel moves by itself,
            // taking no lock (see the module's notes).
            if attr.kind != FileKind::Dir || *p != parent {
                return Some((*p, known.clone()));
            }
            n.unlink(ino);
        }
        let here = (parent, name.to_vec());
        n.unname(&here);
        n.by_name.insert(here.clone(), ino);
        n.by_ino.insert(ino, here);
        None
    }

    /// The node the kernel was last given under `parent`/`name`, if recorded.
    pub fn node_at(&self, parent: u64, name: &[u8]) -> Option<u64> {
        self.lock().by_name.get(&(parent, name.to_vec())).copied()
    }

    /// Whether the kernel may hold directory node `ino` under another directory than
    /// `parent`: it was last given there, and its entry there, dropped or not, is the
    /// node's until the kernel forgets it.
    pub fn moved_dir(&self, parent: u64, ino: u64) -> bool {
        self.lock().dir_parents.get(&ino).is_some_and(|p| *p != parent)
    }

    /// Whether the kernel may hold directory node `ino` above directory node `dir`: the
    /// directories each was last given in lead from `dir` up to `ino`. Linux cannot move
    /// such an entry to a name below `dir` (it would be its own ancestor: `ELOOP`).
    pub fn holds_above(&self, ino: u64, dir: u64) -> bool {
        let n = self.lock();
        let mut at = dir;
        // Records made at different times may form a cycle: a walk ends within as many
        // steps as there are records.
        for _ in 0..=n.dir_parents.len() {
            match n.dir_parents.get(&at) {
                Some(&up) if up == ino => return true,
                Some(&up) => at = up,
                None => return false,
            }
        }
        false
    }

    /// The drop of `ino`'s old name: a receiver that turns true once the kernel dropped
    /// it, and the sender when no drop was on its way (the caller then makes it, and
    /// passes the sender to [`KernelNames::dropped`]).
    pub fn drop_of(&self, ino: u64) -> (watch::Receiver<bool>, Option<watch::Sender<bool>>) {
        let mut n = self.lock();
        // A drop whose thread ended without a word (it panicked) is made again.
        if let Some(done) = n.dropping.get(&ino).filter(|done| done.has_changed().is_ok()) {
            return (done.clone(), None);
        }
        let (tx, rx) = watch::channel(false);
        n.dropping.insert(ino, rx.clone());
        (rx, Some(tx))
    }

    /// The kernel dropped `parent`/`name`, which it held for `ino`, when told to (a
    /// lookup of the name that finds another file moves the record by itself).
    pub fn dropped(&self, parent: u64, name: &[u8], ino: u64, done: watch::Sender<bool>) {
        let mut n = self.lock();
        let here = (parent, name.to_vec());
        if n.by_name.get(&here) == Some(&ino) {
            n.unname(&here);
        }
        n.dropping.remove(&ino);
        // No one waiting is fine.
        let _ = done.send(true);
    }

    /// This mount renamed `from` to `to` (the kernel moves its entry).
    pub fn moved(&self, from: (u64, &[u8]), to: (u64, &[u8])) {
        let mut n = self.lock();
        let to = (to.0, to.1.to_vec());
        n.unname(&to);
        if let Some(ino) = n.unname(&(from.0, from.1.to_vec())) {
            n.place(ino, to);
        }
    }

    /// This mount exchanged `a` and `b` (`RENAME_EXCHANGE`; the kernel swaps its
    /// entries): what it held under each, it holds under the other. A directory's record
    /// of where it was given moves with it: left behind, the directory counted as moved
    /// from another directory, and the next rename that looked it up gave it a second
    /// node, so that the kernel no longer saw the rename's target as its source's parent
    /// (`nsx.py` seed 307: `rename("c/d", "c")` answered `EISDIR`, not `ENOTEMPTY`).
    pub fn exchanged(&self, a: (u64, &[u8]), b: (u64, &[u8])) {
        let mut n = self.lock();
        let (a, b) = ((a.0, a.1.to_vec()), (b.0, b.1.to_vec()));
        let (at_a, at_b) = (n.unname(&a), n.unname(&b));
        for (ino, to) in [(at_a, b), (at_b, a)] {
            if let Some(ino) = ino {
                n.place(ino, to);
            }
        }
    }

    /// The kernel holds nothing under `parent`/`name` any more: this mount removed it,
    /// or a lookup found nothing there.
    pub fn removed(&self, parent: u64, name: &[u8]) {
        self.lock().unname(&(parent, name.to_vec()));
    }

    /// The kernel forgot `ino` (FORGET): it holds no name of it any more.
    pub fn forgot(&self, ino: u64) {
        let mut n = self.lock();
        n.unlink(ino);
        n.dir_parents.remove(&ino);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Names> {
        self.0.lock().expect("kernel names lock poisoned")
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use stoa_types::{InodeId, Timestamp};

    /// Gives `attr` to the kernel as its own inode number.
    fn give(names: &KernelNames, parent: u64, name: &[u8], attr: &Attr) -> Option<Name> {
        names.give(parent, name, attr.ino.0, attr)
    }

    /// Attributes of inode `ino`, for tests.
    pub(crate) fn attr(ino: u64, kind: FileKind, nlink: u32) -> Attr {
        let t = Timestamp::default();
        Attr {
            ino: InodeId(ino),
            kind,
            perm: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            nlink,
            rdev: 0,
            atime: t,
            mtime: t,
            ctime: t,
            version: 1,
        }
    }

    #[test]
    fn a_file_found_under_a_second_name_is_caught_once() {
        let names = KernelNames::default();
        let x = attr(7, FileKind::File, 1);
        assert_eq!(give(&names, 1, b"a", &x), None);
        assert_eq!(give(&names, 1, b"a", &x), None, "the same name again");
        // Another mount renamed a to b: the kernel may still hold a, until it drops it.
        assert_eq!(give(&names, 1, b"b", &x), Some((1, b"a".to_vec())));
        assert_eq!(give(&names, 1, b"b", &x), Some((1, b"a".to_vec())), "still held");
        let (mut done, tx) = names.drop_of(7);
        let tx = tx.expect("the first drop is made by its caller");
        assert!(names.drop_of(7).1.is_none(), "one drop of a name at a time");
        names.dropped(1, b"a", 8, watch::channel(false).0);
        assert_eq!(give(&names, 1, b"b", &x), Some((1, b"a".to_vec())), "another file's drop");
        assert!(!*done.borrow_and_update());
        names.dropped(1, b"a", 7, tx);
        assert!(*done.borrow_and_update(), "the waiters learn of the drop");
        assert!(names.drop_of(7).1.is_some(), "a later conflict makes a new drop");
        assert_eq!(give(&names, 1, b"b", &x), None, "dropped: the new name is given");
        // Another file now under a: no conflict, and b's record is untouched.
        assert_eq!(give(&names, 1, b"a", &attr(8, FileKind::File, 1)), None);
        assert_eq!(give(&names, 1, b"b", &x), None);
        // A lookup of a that finds nothing ends it as well.
        names.removed(1, b"a");
        give(&names, 1, b"c", &attr(8, FileKind::File, 1));
        assert_eq!(give(&names, 1, b"c", &attr(8, FileKind::File, 1)), None);
    }

    #[test]
    fn own_renames_removals_forgets_and_links_raise_nothing() {
        let names = KernelNames::default();
        let x = attr(7, FileKind::File, 1);
        give(&names, 1, b"a", &x);
        names.moved((1, b"a"), (2, b"b"));
        assert_eq!(give(&names, 2, b"b", &x), None, "moved by this mount");
        names.removed(2, b"b");
        assert_eq!(give(&names, 3, b"c", &x), None, "removed here");
        names.forgot(7);
        assert_eq!(give(&names, 1, b"d", &x), None, "forgotten by the kernel");
        let linked = attr(7, FileKind::File, 2);
        assert_eq!(give(&names, 1, b"e", &linked), None, "two links, two names");
        assert_eq!(give(&names, 1, b"f", &x), None, "nothing recorded while linked");
    }

    #[test]
    fn a_directory_found_in_another_directory_is_caught_with_any_link_count() {
        let names = KernelNames::default();
        let dir = attr(9, FileKind::Dir, 3);
        assert_eq!(give(&names, 1, b"g", &dir), None);
        assert_eq!(give(&names, 2, b"h", &dir), Some((1, b"g".to_vec())), "moved elsewhere");
        names.moved((1, b"g"), (2, b"h"));
        assert_eq!(give(&names, 2, b"h", &dir), None, "moved by this mount");
        assert_eq!(give(&names, 2, b"i", &dir), None, "renamed in its directory");
        assert_eq!(give(&names, 1, b"g", &dir), Some((2, b"i".to_vec())), "the new name moved");
    }

    #[test]
    fn a_directory_given_in_another_directory_is_seen_moved_until_forgotten() {
        let names = KernelNames::default();
        let dir = attr(9, FileKind::Dir, 2);
        assert!(!names.moved_dir(1, 9), "never given");
        give(&names, 1, b"g", &dir);
        assert_eq!(names.node_at(1, b"g"), Some(9));
        assert_eq!(names.node_at(1, b"x"), None);
        assert!(!names.moved_dir(1, 9));
        assert!(names.moved_dir(2, 9), "moved elsewhere");
        // The old name's record is gone (a lookup there found nothing), but the kernel
        // may still hold the entry: the move is seen all the same.
        names.removed(1, b"g");
        assert!(names.moved_dir(2, 9));
        give(&names, 2, b"h", &dir);
        assert!(!names.moved_dir(2, 9), "given there");
        // Renamed by this mount: the kernel moved the entry itself.
        names.moved((2, b"h"), (3, b"k"));
        assert!(!names.moved_dir(3, 9));
        assert!(!names.moved_dir(1, attr(7, FileKind::File, 1).ino.0), "files are not");
        names.forgot(9);
        assert!(!names.moved_dir(4, 9), "forgotten by the kernel");
    }

    #[test]
    fn a_directory_is_held_above_the_directories_given_below_it() {
        let names = KernelNames::default();
        let dir = |ino| attr(ino, FileKind::Dir, 2);
        // 1/x (9), 9/y (10), 10/z (11); 12 given elsewhere.
        give(&names, 1, b"x", &dir(9));
        give(&names, 9, b"y", &dir(10));
        give(&names, 10, b"z", &dir(11));
        give(&names, 1, b"w", &dir(12));
        assert!(names.holds_above(9, 11) && names.holds_above(10, 11) && names.holds_above(9, 10));
        assert!(!names.holds_above(11, 9), "below, not above");
        assert!(!names.holds_above(12, 11));
        assert!(!names.holds_above(9, 1), "1 was never given: nothing is known above it");
        // Records that form a cycle (each made at another time) end the walk.
        give(&names, 11, b"x", &dir(9));
        assert!(!names.holds_above(12, 9));
    }

    #[test]
    fn an_exchange_made_here_swaps_the_names_and_moves_the_directories() {
        let names = KernelNames::default();
        let (dir, file) = (attr(9, FileKind::Dir, 2), attr(7, FileKind::File, 1));
        give(&names, 1, b"d", &dir);
        give(&names, 2, b"f", &file);
        names.exchanged((1, b"d"), (2, b"f"));
        assert_eq!((names.node_at(2, b"f"), names.node_at(1, b"d")), (Some(9), Some(7)));
        assert!(!names.moved_dir(2, 9), "the kernel moved the directory's entry itself");
        assert!(names.moved_dir(1, 9));
        assert_eq!(give(&names, 2, b"f", &dir), None, "looked up again where it went");
        assert_eq!(give(&names, 1, b"d", &file), None);
        // With a name the kernel held nothing under, the other name only moves.
        names.exchanged((2, b"f"), (3, b"e"));
        assert_eq!((names.node_at(3, b"e"), names.node_at(2, b"f")), (Some(9), None));
        assert!(!names.moved_dir(3, 9));
    }
}
