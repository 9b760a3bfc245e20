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

use std::collections::HashMap;
use std::sync::Mutex;
use stoa_client::{Attr, FileKind};

/// A name: the directory's inode and the entry's bytes.
type Name = (u64, Vec<u8>);

#[derive(Default)]
pub struct KernelNames(Mutex<Names>);

#[derive(Default)]
struct Names {
    by_ino: HashMap<u64, Name>,
    by_name: HashMap<Name, u64>,
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
}

impl KernelNames {
    /// Records that the kernel gets `attr` under `parent`/`name`. Returns the other name
    /// the kernel may still hold the same file under, if it has only one link: the
    /// caller must not give it this name then, and has the kernel drop the old one
    /// ([`KernelNames::dropped`] once it has).
    pub fn give(&self, parent: u64, name: &[u8], attr: &Attr) -> Option<(u64, Vec<u8>)> {
        let mut n = self.lock();
        let ino = attr.ino.0;
        if attr.kind == FileKind::Dir || attr.nlink != 1 {
            // A directory the kernel moves to its new name itself; a file with several
            // links has several names.
            n.unlink(ino);
            return None;
        }
        if let Some((p, known)) = n.by_ino.get(&ino) {
            // The common case, a name looked up again, costs no allocation.
            if *p == parent && known == name {
                return None;
            }
            return Some((*p, known.clone()));
        }
        let here = (parent, name.to_vec());
        n.unname(&here);
        n.by_name.insert(here.clone(), ino);
        n.by_ino.insert(ino, here);
        None
    }

    /// The kernel dropped `parent`/`name`, which it held for `ino`, when told to (a
    /// lookup of the name that finds another file moves the record by itself).
    pub fn dropped(&self, parent: u64, name: &[u8], ino: u64) {
        let mut n = self.lock();
        let here = (parent, name.to_vec());
        if n.by_name.get(&here) == Some(&ino) {
            n.unname(&here);
        }
    }

    /// This mount renamed `from` to `to` (the kernel moves its entry).
    pub fn moved(&self, from: (u64, &[u8]), to: (u64, &[u8])) {
        let mut n = self.lock();
        let to = (to.0, to.1.to_vec());
        n.unname(&to);
        if let Some(ino) = n.unname(&(from.0, from.1.to_vec())) {
            n.by_name.insert(to.clone(), ino);
            n.by_ino.insert(ino, to);
        }
    }

    /// The kernel holds nothing under `parent`/`name` any more: this mount removed it,
    /// or a lookup found nothing there.
    pub fn removed(&self, parent: u64, name: &[u8]) {
        self.lock().unname(&(parent, name.to_vec()));
    }

    /// The kernel forgot `ino` (FORGET): it holds no name of it any more.
    pub fn forgot(&self, ino: u64) {
        self.lock().unlink(ino);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Names> {
        self.0.lock().expect("kernel names lock poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_types::{InodeId, Timestamp};

    fn attr(ino: u64, kind: FileKind, nlink: u32) -> Attr {
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
        assert_eq!(names.give(1, b"a", &x), None);
        assert_eq!(names.give(1, b"a", &x), None, "the same name again");
        // Another mount renamed a to b: the kernel may still hold a, until it drops it.
        assert_eq!(names.give(1, b"b", &x), Some((1, b"a".to_vec())));
        assert_eq!(names.give(1, b"b", &x), Some((1, b"a".to_vec())), "still held");
        names.dropped(1, b"a", 8);
        assert_eq!(names.give(1, b"b", &x), Some((1, b"a".to_vec())), "another file's drop");
        names.dropped(1, b"a", 7);
        assert_eq!(names.give(1, b"b", &x), None, "dropped: the new name is given");
        // Another file now under a: no conflict, and b's record is untouched.
        assert_eq!(names.give(1, b"a", &attr(8, FileKind::File, 1)), None);
        assert_eq!(names.give(1, b"b", &x), None);
        // A lookup of a that finds nothing ends it as well.
        names.removed(1, b"a");
        names.give(1, b"c", &attr(8, FileKind::File, 1));
        assert_eq!(names.give(1, b"c", &attr(8, FileKind::File, 1)), None);
    }

    #[test]
    fn own_renames_removals_forgets_links_and_directories_raise_nothing() {
        let names = KernelNames::default();
        let x = attr(7, FileKind::File, 1);
        names.give(1, b"a", &x);
        names.moved((1, b"a"), (2, b"b"));
        assert_eq!(names.give(2, b"b", &x), None, "moved by this mount");
        names.removed(2, b"b");
        assert_eq!(names.give(3, b"c", &x), None, "removed here");
        names.forgot(7);
        assert_eq!(names.give(1, b"d", &x), None, "forgotten by the kernel");
        let linked = attr(7, FileKind::File, 2);
        assert_eq!(names.give(1, b"e", &linked), None, "two links, two names");
        assert_eq!(names.give(1, b"f", &x), None, "nothing recorded while linked");
        let dir = attr(9, FileKind::Dir, 2);
        names.give(1, b"g", &dir);
        assert_eq!(names.give(1, b"h", &dir), None, "the kernel moves directories");
    }
}
