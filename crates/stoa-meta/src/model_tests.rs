//! A seeded random test: the same namespace operations run on the state machine and on
//! a plain model of paths, and every answer and the final trees must agree.

use crate::testing::{Fs, ROOT};
use crate::{file_count, RENAME_EXCHANGE, RENAME_NOREPLACE};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use stoa_proto::MetaOp;
use stoa_types::{FileKind, FsError, InodeId};

type Path = Vec<&'static str>;
type Answer = Result<(), i32>;

const NAMES: [&str; 3] = ["a", "b", "c"];

fn errno(e: FsError) -> i32 {
    assert!(!matches!(e, FsError::Io(_)), "storage error in a clean store: {e}");
    e.errno()
}

/// Paths mapped to model node ids; a node is a directory or a file with a link count.
#[derive(Default)]
struct Model {
    paths: BTreeMap<Path, u64>,
    nodes: BTreeMap<u64, (bool, u32)>,
    next: u64,
}

fn is_within(inner: &[&str], outer: &[&str]) -> bool {
    inner.len() > outer.len() && inner.starts_with(outer)
}

impl Model {
    fn is_dir(&self, path: &[&str]) -> Option<bool> {
        self.paths.get(path).map(|id| self.nodes[id].0)
    }

    /// Whether the parent of `path` is an existing directory, as a lookup walk finds it.
    fn parent(&self, path: &[&str]) -> Answer {
        for i in 1..path.len() {
            match self.is_dir(&path[..i]) {
                None => return Err(libc::ENOENT),
                Some(false) => return Err(libc::ENOTDIR),
                Some(true) => {}
            }
        }
        Ok(())
    }

    fn has_children(&self, path: &[&str]) -> bool {
        self.paths.keys().any(|p| is_within(p, path))
    }

    fn add(&mut self, path: &Path, dir: bool) -> Answer {
        self.parent(path)?;
        if self.paths.contains_key(path) {
            return Err(libc::EEXIST);
        }
        self.next += 1;
        self.paths.insert(path.clone(), self.next);
        self.nodes.insert(self.next, (dir, 1));
        Ok(())
    }

    fn drop_name(&mut self, path: &Path) {
        let id = self.paths.remove(path).expect("name exists");
        let node = self.nodes.get_mut(&id).expect("node exists");
        node.1 -= 1;
        if node.1 == 0 {
            self.nodes.remove(&id);
        }
    }

    fn remove(&mut self, path: &Path, dir: bool) -> Answer {
        self.parent(path)?;
        match self.is_dir(path) {
            None => return Err(libc::ENOENT),
            Some(true) if !dir => return Err(libc::EISDIR),
            Some(false) if dir => return Err(libc::ENOTDIR),
            Some(true) if self.has_children(path) => return Err(libc::ENOTEMPTY),
            _ => {}
        }
        self.drop_name(path);
        Ok(())
    }

    fn link(&mut self, src: &Path, dst: &Path) -> Answer {
        self.parent(src)?;
        let id = *self.paths.get(src).ok_or(libc::ENOENT)?;
        self.parent(dst)?;
        if self.nodes[&id].0 {
            return Err(libc::EPERM);
        }
        if self.paths.contains_key(dst) {
            return Err(libc::EEXIST);
        }
        self.paths.insert(dst.clone(), id);
        self.nodes.get_mut(&id).expect("node exists").1 += 1;
        Ok(())
    }

    /// Moves every path under `from` (itself included) to be under `to`.
    fn rekey(paths: &BTreeMap<Path, u64>, from: &[&str], to: &[&'static str]) -> Vec<(Path, u64)> {
        let moved = paths.iter().filter(|(p, _)| p.starts_with(from));
        moved.map(|(p, id)| ([to, &p[from.len()..]].concat(), *id)).collect()
    }

    fn rename(&mut self, src: &Path, dst: &Path, flags: u32) -> Answer {
        self.parent(src)?;
        self.parent(dst)?;
        let src_dir = self.is_dir(src).ok_or(libc::ENOENT)?;
        let dst_dir = self.is_dir(dst);
        if flags == RENAME_EXCHANGE {
            let dst_dir = dst_dir.ok_or(libc::ENOENT)?;
            if (src_dir && is_within(dst, src)) || (dst_dir && is_within(src, dst)) {
                return Err(libc::EINVAL);
            }
            let a = Model::rekey(&self.paths, src, dst);
            let b = Model::rekey(&self.paths, dst, src);
            self.paths.retain(|p, _| !p.starts_with(src) && !p.starts_with(dst));
            self.paths.extend(a.into_iter().chain(b));
            return Ok(());
        }
        if dst_dir.is_some() && flags == RENAME_NOREPLACE {
            return Err(libc::EEXIST);
        }
        if src_dir && is_within(dst, src) {
            return Err(libc::EINVAL);
        }
        if let Some(dst_dir) = dst_dir {
            if self.paths[src] == self.paths[dst] {
                return Ok(());
            }
            match (src_dir, dst_dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if self.has_children(dst) => return Err(libc::ENOTEMPTY),
                _ => self.drop_name(dst),
            }
        }
        let moved = Model::rekey(&self.paths, src, dst);
        self.paths.retain(|p, _| !p.starts_with(src));
        self.paths.extend(moved);
        Ok(())
    }
}

/// The inode at `path`, walking lookups from the root.
fn resolve(fs: &mut Fs, path: &[&str]) -> Result<InodeId, FsError> {
    let mut ino = ROOT;
    for name in path {
        ino = fs.lookup(ino, name)?.ino;
    }
    Ok(ino)
}

/// The parent directory and name of `path`. Like a kernel path walk, it fails with
/// `NotDir` when the parent is not a directory, before the operation is even sent.
fn place(fs: &mut Fs, path: &[&str]) -> Result<(InodeId, Vec<u8>), FsError> {
    let parent = resolve(fs, &path[..path.len() - 1])?;
    if fs.getattr(parent)?.kind != FileKind::Dir {
        return Err(FsError::NotDir);
    }
    Ok((parent, path[path.len() - 1].as_bytes().to_vec()))
}

fn real_rename(fs: &mut Fs, src: &Path, dst: &Path, flags: u32) -> Result<(), FsError> {
    let (parent, name) = place(fs, src)?;
    let (new_parent, new_name) = place(fs, dst)?;
    fs.call(MetaOp::Rename { parent, name, new_parent, new_name, flags }).map(|_| ())
}

fn real_link(fs: &mut Fs, src: &Path, dst: &Path) -> Result<(), FsError> {
    let (parent, name) = place(fs, src)?;
    let ino = fs.lookup(parent, std::str::from_utf8(&name).unwrap())?.ino;
    let (new_parent, new_name) = place(fs, dst)?;
    fs.call(MetaOp::Link { ino, new_parent, new_name }).map(|_| ())
}

/// Short paths mostly, so that most operations find their parent and succeed.
fn random_path(rng: &mut StdRng) -> Path {
    let depth = [1, 1, 1, 1, 1, 2, 2, 2, 3][rng.gen_range(0..9)];
    (0..depth).map(|_| NAMES[rng.gen_range(0..NAMES.len())]).collect()
}

/// Runs one random operation on both sides and returns both answers.
fn step(rng: &mut StdRng, fs: &mut Fs, model: &mut Model) -> (String, Answer, Answer) {
    let (p, q) = (random_path(rng), random_path(rng));
    let done = |r: Result<stoa_proto::MetaResponse, FsError>| r.map(|_| ()).map_err(errno);
    let (what, real, want) = match rng.gen_range(0..6) {
        0 => {
            let real = place(fs, &p).and_then(|(parent, name)| {
                let name = String::from_utf8(name).unwrap();
                fs.attr(crate::testing::create_op(parent, &name, FileKind::File))
            });
            ("create", real.map(|_| ()).map_err(errno), model.add(&p, false))
        }
        1 => {
            let real = place(fs, &p)
                .and_then(|(parent, name)| fs.mkdir(parent, &String::from_utf8(name).unwrap()));
            ("mkdir", real.map(|_| ()).map_err(errno), model.add(&p, true))
        }
        2 => {
            let real = place(fs, &p)
                .and_then(|(parent, name)| fs.call(MetaOp::Unlink { parent, name, open: false }));
            ("unlink", done(real), model.remove(&p, false))
        }
        3 => {
            let real =
                place(fs, &p).and_then(|(parent, name)| fs.call(MetaOp::Rmdir { parent, name }));
            ("rmdir", done(real), model.remove(&p, true))
        }
        4 => ("link", real_link(fs, &p, &q).map_err(errno), model.link(&p, &q)),
        _ => {
            let flags = [0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.gen_range(0..4)];
            let real = real_rename(fs, &p, &q, flags).map_err(errno);
            ("rename", real, model.rename(&p, &q, flags))
        }
    };
    (format!("{what} {p:?} {q:?}"), real, want)
}

/// Walks the real tree and checks it against the model: names, kinds, which names share
/// an inode, link counts, and directory link counts of 2 + subdirectories.
fn check_tree(fs: &mut Fs, model: &Model) {
    let mut seen: BTreeMap<Path, InodeId> = BTreeMap::new();
    let mut stack: Vec<(Path, InodeId)> = vec![(vec![], ROOT)];
    while let Some((path, dir)) = stack.pop() {
        let entries = fs.list(dir, 2).unwrap();
        let subdirs = entries.iter().filter(|e| e.kind == FileKind::Dir).count() as u32;
        assert_eq!(fs.getattr(dir).unwrap().nlink, 2 + subdirs, "nlink of {path:?}");
        for e in entries {
            let name = *NAMES.iter().find(|n| n.as_bytes() == e.name).expect("known name");
            let child = [path.clone(), vec![name]].concat();
            let id = model.paths.get(&child).unwrap_or_else(|| panic!("extra {child:?}"));
            let (is_dir, nlink) = model.nodes[id];
            let attr = fs.getattr(e.ino).unwrap();
            assert_eq!(is_dir, attr.kind == FileKind::Dir, "kind of {child:?}");
            if !is_dir {
                assert_eq!(nlink, attr.nlink, "nlink of {child:?}");
            }
            for (other, ino) in &seen {
                assert_eq!(model.paths[other] == *id, *ino == e.ino, "{other:?} vs {child:?}");
            }
            seen.insert(child.clone(), e.ino);
            if is_dir {
                stack.push((child, e.ino));
            }
        }
    }
    assert_eq!(seen.len(), model.paths.len(), "names missing from the real tree");
    fs.purge_strays();
    assert_eq!(file_count(&fs.kv).unwrap(), model.nodes.len() as u64 + 1);
}

#[test]
fn random_namespace_operations_match_a_model() {
    let (mut steps, mut succeeded) = (0, 0);
    for seed in 0..64u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut fs, mut model) = (Fs::new(), Model::default());
        let mut history = Vec::new();
        for i in 0..500 {
            let (what, real, want) = step(&mut rng, &mut fs, &mut model);
            steps += 1;
            succeeded += usize::from(real.is_ok());
            history.push(format!("{what} -> {real:?}"));
            assert_eq!(
                real,
                want,
                "seed {seed} step {i}: {what}; history:\n{}",
                history.join("\n")
            );
            if i % 50 == 49 {
                check_tree(&mut fs, &model);
            }
        }
    }
    // Guards against a test that only ever compares two identical errors.
    assert!(succeeded * 10 > steps, "only {succeeded} of {steps} operations succeeded");
}
