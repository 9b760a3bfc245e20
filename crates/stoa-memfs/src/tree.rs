//! The filesystem's tree: inodes in memory, every operation a few map look-ups under
//! one lock. Errors are errno values, as the kernel wants them.
//!
//! Invariants: every name in a directory leads to a live inode; an inode's `nlink` is
//! the number of names that lead to it (plus 2 and one per subdirectory for a
//! directory); an inode leaves the map when it has no name left and no open handle.

use std::collections::{BTreeMap, HashMap};
use stoa_types::{Attr, FileKind, InodeId, SetAttr, Timestamp};

pub const ROOT: u64 = 1;

#[derive(Clone, Debug)]
pub struct Inode {
    /// Its attributes, as Stoa keeps them; the size is the data's length (`attr()`).
    attr: Attr,
    /// A file's bytes, or a symlink's target.
    pub data: Vec<u8>,
    children: BTreeMap<Vec<u8>, u64>,
    open: u32,
}

impl Inode {
    fn new(ino: u64, kind: FileKind, perm: u32, who: Owner) -> Inode {
        let now = Timestamp::now();
        let attr = Attr {
            ino: InodeId(ino),
            kind,
            perm,
            uid: who.uid,
            gid: who.gid,
            size: 0,
            nlink: if kind == FileKind::Dir { 2 } else { 1 },
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version: 0,
        };
        Inode { attr, data: Vec::new(), children: BTreeMap::new(), open: 0 }
    }

    pub fn attr(&self) -> Attr {
        Attr { size: self.data.len() as u64, ..self.attr.clone() }
    }

    pub fn kind(&self) -> FileKind {
        self.attr.kind
    }

    fn touch(&mut self) {
        let now = Timestamp::now();
        self.attr.mtime = now;
        self.attr.ctime = now;
    }
}

/// Who makes a new inode: its owner.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

/// One name of a listing, with the position of the name after it.
pub struct Entry {
    pub next: usize,
    pub ino: u64,
    pub kind: FileKind,
    pub name: Vec<u8>,
}

pub struct Tree {
    inodes: HashMap<u64, Inode>,
    next: u64,
}

pub type Res<T> = Result<T, i32>;

impl Default for Tree {
    fn default() -> Tree {
        let mut inodes = HashMap::new();
        inodes.insert(ROOT, Inode::new(ROOT, FileKind::Dir, 0o755, Owner { uid: 0, gid: 0 }));
        Tree { inodes, next: ROOT + 1 }
    }
}

impl Tree {
    pub fn get(&self, ino: u64) -> Res<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn get_mut(&mut self, ino: u64) -> Res<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Res<&Inode> {
        let d = self.get(ino)?;
        if d.kind() == FileKind::Dir {
            Ok(d)
        } else {
            Err(libc::ENOTDIR)
        }
    }

    pub fn lookup(&self, parent: u64, name: &[u8]) -> Res<u64> {
        self.dir(parent)?.children.get(name).copied().ok_or(libc::ENOENT)
    }

    /// Makes `name` in `parent`; a symlink's target goes in its data.
    pub fn make(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        who: Owner,
    ) -> Res<u64> {
        if self.dir(parent)?.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let ino = self.next;
        self.next += 1;
        self.inodes.insert(ino, Inode::new(ino, kind, perm, who));
        let p = self.get_mut(parent)?;
        p.children.insert(name.to_vec(), ino);
        if kind == FileKind::Dir {
            p.attr.nlink += 1;
        }
        p.touch();
        Ok(ino)
    }

    pub fn link(&mut self, ino: u64, parent: u64, name: &[u8]) -> Res<()> {
        if self.get(ino)?.kind() == FileKind::Dir {
            return Err(libc::EPERM);
        }
        if self.dir(parent)?.children.contains_key(name) {
            return Err(libc::EEXIST);
        }
        self.get_mut(parent)?.children.insert(name.to_vec(), ino);
        self.get_mut(parent)?.touch();
        let i = self.get_mut(ino)?;
        i.attr.nlink += 1;
        i.attr.ctime = Timestamp::now();
        Ok(())
    }

    /// Removes `name` from `parent`: a directory only if `dir`, and only when empty.
    pub fn remove(&mut self, parent: u64, name: &[u8], dir: bool) -> Res<()> {
        let ino = self.lookup(parent, name)?;
        let i = self.get(ino)?;
        match (i.kind() == FileKind::Dir, dir) {
            (true, false) => return Err(libc::EISDIR),
            (false, true) => return Err(libc::ENOTDIR),
            (true, true) if !i.children.is_empty() => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        let p = self.get_mut(parent)?;
        p.children.remove(name);
        if dir {
            p.attr.nlink -= 1;
        }
        p.touch();
        self.unlinked(ino, dir);
        Ok(())
    }

    /// One name of `ino` is gone (all of them for a directory).
    fn unlinked(&mut self, ino: u64, dir: bool) {
        let Some(i) = self.inodes.get_mut(&ino) else { return };
        i.attr.nlink = if dir { 0 } else { i.attr.nlink - 1 };
        i.attr.ctime = Timestamp::now();
        if i.attr.nlink == 0 && i.open == 0 {
            self.inodes.remove(&ino);
        }
    }

    /// Renames; `noreplace` refuses an existing target.
    pub fn rename(
        &mut self,
        from: u64,
        name: &[u8],
        to: u64,
        new: &[u8],
        noreplace: bool,
    ) -> Res<()> {
        let ino = self.lookup(from, name)?;
        self.dir(to)?;
        let is_dir = self.get(ino)?.kind() == FileKind::Dir;
        if is_dir && self.below(to, ino) {
            return Err(libc::EINVAL);
        }
        if let Ok(old) = self.lookup(to, new) {
            if old == ino {
                return Ok(());
            }
            if noreplace {
                return Err(libc::EEXIST);
            }
            let old_dir = self.get(old)?.kind() == FileKind::Dir;
            match (is_dir, old_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                _ => {}
            }
            self.remove(to, new, old_dir)?;
        }
        let f = self.get_mut(from)?;
        f.children.remove(name);
        if is_dir {
            f.attr.nlink -= 1;
        }
        f.touch();
        let t = self.get_mut(to)?;
        t.children.insert(new.to_vec(), ino);
        if is_dir {
            t.attr.nlink += 1;
        }
        t.touch();
        self.get_mut(ino)?.attr.ctime = Timestamp::now();
        Ok(())
    }

    /// Whether `ino` is `dir` or below it.
    fn below(&self, mut ino: u64, dir: u64) -> bool {
        loop {
            if ino == dir {
                return true;
            }
            if ino == ROOT {
                return false;
            }
            let parent = self
                .inodes
                .iter()
                .find(|(_, i)| i.children.values().any(|c| *c == ino))
                .map(|(p, _)| *p);
            match parent {
                Some(p) => ino = p,
                None => return false,
            }
        }
    }

    /// Applies a setattr: the size to the data, the rest as meta applies it.
    pub fn set(&mut self, ino: u64, c: &SetAttr) -> Res<&Inode> {
        let i = self.get_mut(ino)?;
        if let Some(size) = c.size {
            if i.kind() == FileKind::Dir {
                return Err(libc::EISDIR);
            }
            i.data.resize(usize::try_from(size).map_err(|_| libc::EFBIG)?, 0);
            i.attr.mtime = Timestamp::now();
        }
        c.apply(&mut i.attr, Timestamp::now());
        Ok(i)
    }

    pub fn open(&mut self, ino: u64) -> Res<()> {
        self.get_mut(ino)?.open += 1;
        Ok(())
    }

    pub fn release(&mut self, ino: u64) {
        let Some(i) = self.inodes.get_mut(&ino) else { return };
        i.open = i.open.saturating_sub(1);
        if i.attr.nlink == 0 && i.open == 0 {
            self.inodes.remove(&ino);
        }
    }

    pub fn read(&self, ino: u64, offset: u64, size: u32) -> Res<&[u8]> {
        let data = &self.get(ino)?.data;
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(data.len());
        let end = start.saturating_add(size as usize).min(data.len());
        Ok(&data[start..end])
    }

    pub fn write(&mut self, ino: u64, offset: u64, bytes: &[u8]) -> Res<()> {
        let i = self.get_mut(ino)?;
        let start = usize::try_from(offset).map_err(|_| libc::EFBIG)?;
        let end = start.checked_add(bytes.len()).ok_or(libc::EFBIG)?;
        if i.data.len() < end {
            i.data.resize(end, 0);
        }
        i.data[start..end].copy_from_slice(bytes);
        i.touch();
        Ok(())
    }

    /// Entries of a directory from position `from`.
    pub fn list(&self, dir: u64, from: usize) -> Res<Vec<Entry>> {
        let d = self.dir(dir)?;
        let dots = [(b".".to_vec(), dir), (b"..".to_vec(), dir)];
        let names = dots.into_iter().chain(d.children.iter().map(|(n, i)| (n.clone(), *i)));
        Ok(names
            .enumerate()
            .skip(from)
            .filter_map(|(at, (name, ino))| {
                Some(Entry { next: at + 1, ino, kind: self.inodes.get(&ino)?.kind(), name })
            })
            .collect())
    }

    pub fn files(&self) -> u64 {
        self.inodes.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: Owner = Owner { uid: 0, gid: 0 };

    #[test]
    fn names_links_and_removal_keep_the_counts() {
        let mut t = Tree::default();
        let d = t.make(ROOT, b"d", FileKind::Dir, 0o755, ME).unwrap();
        assert_eq!(t.get(ROOT).unwrap().attr.nlink, 3);
        let f = t.make(d, b"f", FileKind::File, 0o644, ME).unwrap();
        assert_eq!(t.make(d, b"f", FileKind::File, 0o644, ME), Err(libc::EEXIST));
        t.link(f, ROOT, b"g").unwrap();
        assert_eq!(t.get(f).unwrap().attr.nlink, 2);
        assert_eq!(t.remove(ROOT, b"d", true), Err(libc::ENOTEMPTY));
        assert_eq!(t.remove(d, b"f", true), Err(libc::ENOTDIR));
        t.remove(d, b"f", false).unwrap();
        assert_eq!(t.get(f).unwrap().attr.nlink, 1);
        t.open(f).unwrap();
        t.remove(ROOT, b"g", false).unwrap();
        assert_eq!(t.read(f, 0, 10).unwrap(), b"", "an open file outlives its names");
        t.release(f);
        assert_eq!(t.get(f).err(), Some(libc::ENOENT));
        t.remove(ROOT, b"d", true).unwrap();
        assert_eq!(t.get(ROOT).unwrap().attr.nlink, 2);
        assert_eq!(t.files(), 1);
    }

    #[test]
    fn rename_replaces_refuses_and_moves_directories() {
        let mut t = Tree::default();
        let a = t.make(ROOT, b"a", FileKind::Dir, 0o755, ME).unwrap();
        let b = t.make(a, b"b", FileKind::Dir, 0o755, ME).unwrap();
        let f = t.make(ROOT, b"f", FileKind::File, 0o644, ME).unwrap();
        t.make(ROOT, b"g", FileKind::File, 0o644, ME).unwrap();
        assert_eq!(t.rename(ROOT, b"a", b, b"x", false), Err(libc::EINVAL));
        assert_eq!(t.rename(ROOT, b"f", ROOT, b"g", true), Err(libc::EEXIST));
        assert_eq!(t.rename(ROOT, b"f", ROOT, b"a", false), Err(libc::EISDIR));
        t.rename(ROOT, b"f", ROOT, b"g", false).unwrap();
        assert_eq!(t.lookup(ROOT, b"g"), Ok(f));
        assert_eq!(t.lookup(ROOT, b"f"), Err(libc::ENOENT));
        t.rename(a, b"b", ROOT, b"b", false).unwrap();
        assert_eq!((t.get(a).unwrap().attr.nlink, t.get(ROOT).unwrap().attr.nlink), (2, 4));
        let names: Vec<Vec<u8>> = t.list(ROOT, 0).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, [&b"."[..], b"..", b"a", b"b", b"g"]);
        assert_eq!(t.list(ROOT, 4).unwrap()[0].name, b"g");
    }

    #[test]
    fn writes_reads_and_truncates_at_any_offset() {
        let mut t = Tree::default();
        let f = t.make(ROOT, b"f", FileKind::File, 0o644, ME).unwrap();
        t.write(f, 4, b"abcd").unwrap();
        assert_eq!(t.read(f, 0, 100).unwrap(), b"\0\0\0\0abcd");
        assert_eq!(t.read(f, 6, 100).unwrap(), b"cd");
        assert_eq!(t.read(f, 100, 10).unwrap(), b"");
        t.set(f, &SetAttr { size: Some(5), ..SetAttr::default() }).unwrap();
        assert_eq!(t.get(f).unwrap().attr().size, 5);
        assert_eq!(t.write(f, u64::MAX, b"x"), Err(libc::EFBIG));
    }
}
