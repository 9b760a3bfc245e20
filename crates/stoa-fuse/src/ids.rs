//! The kernel's node ids of Stoa's inodes. A node id is the inode's number, except for a
//! directory the kernel could not take under its new name: that one gets a second node
//! id, an alias, and the kernel a second inode for it (caps.md invariant 32).
//!
//! Linux moves a directory's cached entry to a new name the filesystem gives it, but
//! across directories only outside a rename (it needs the lock of all cross-directory
//! renames, which a rename already holds). When another mount moved a directory to
//! another directory while a process here held it (its descriptor, its working
//! directory, or any file below it open), the kernel keeps the old entry alive, dropped
//! but still the inode's, and each lookup of the new name within a rename across
//! directories failed with `ESTALE`, the kernel's retry included (`nsx.py`, 9 of 40
//! seeds; `mv` of such a directory, every time). Under an alias the kernel has a
//! directory inode with no entry yet, so the new name always takes. The alias lives
//! until the kernel forgets it; the old node id keeps serving what holds it.
//!
//! An alias lives as long as the kernel's count of it: each answer that gives it counts
//! one, and a FORGET takes away what it says. Dropping it at any FORGET lost an alias
//! the kernel had been given again meanwhile (its old inode was evicted as a new answer
//! went out): its requests then named no inode, and a listing of the directory came back
//! empty, a `chmod` or an xattr call `ENOENT` (`nsx.py` seeds 51 and 92).
//!
//! An alias is the one thing that differs from a local disk: the directory's `st_ino`
//! on this mount is the alias from then on (fuser answers a node id as the inode
//! number), while other mounts see its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use stoa_client::InodeId;

/// The bit that marks a node id as an alias. Inode numbers are counted up from 1 by
/// meta and never reach it.
const ALIAS: u64 = 1 << 63;

#[derive(Default)]
pub struct KernelIds {
    /// Whether any alias exists: without one, every node id is its inode's number and
    /// nothing is looked up.
    any: AtomicBool,
    map: Mutex<Aliases>,
}

#[derive(Default)]
struct Aliases {
    next: u64,
    /// Alias to its inode, and how many times the kernel was given it and has not
    /// forgotten.
    inode: HashMap<u64, (u64, u64)>,
    /// Inode to its aliases, the newest last: new names get that one.
    aliases: HashMap<u64, Vec<u64>>,
}

impl KernelIds {
    /// The inode of the kernel's node `id`. An alias the kernel forgot (it sends no
    /// request for a node it forgot) names no inode meta has.
    pub fn inode(&self, id: u64) -> InodeId {
        if id & ALIAS == 0 {
            return InodeId(id);
        }
        InodeId(self.lock().inode.get(&id).map_or(id, |(ino, _)| *ino))
    }

    /// The node id the kernel gets for `ino` under a new name.
    pub fn node(&self, ino: InodeId) -> u64 {
        if !self.any.load(Ordering::Acquire) {
            return ino.0;
        }
        let map = self.lock();
        map.aliases.get(&ino.0).and_then(|a| a.last().copied()).unwrap_or(ino.0)
    }

    /// Every node id the kernel may hold for `ino`, for dropping what it cached.
    pub fn nodes(&self, ino: InodeId) -> Vec<u64> {
        let mut all = vec![ino.0];
        if self.any.load(Ordering::Acquire) {
            all.extend(self.lock().aliases.get(&ino.0).into_iter().flatten());
        }
        all
    }

    /// Gives `ino` a new alias, which [`KernelIds::node`] answers from now on. The
    /// kernel holds it once given ([`KernelIds::given`]).
    pub fn alias(&self, ino: InodeId) -> u64 {
        let mut map = self.lock();
        map.next += 1;
        let id = ALIAS | map.next;
        map.inode.insert(id, (ino.0, 0));
        map.aliases.entry(ino.0).or_default().push(id);
        self.any.store(true, Ordering::Release);
        id
    }

    /// Node `id` of `ino` goes to the kernel in an answer that it counts (a lookup's):
    /// an alias is kept until the kernel forgets it, made again if it was forgotten
    /// since it was picked.
    pub fn given(&self, id: u64, ino: InodeId) {
        if id & ALIAS == 0 {
            return;
        }
        let mut map = self.lock();
        let map = &mut *map;
        let (_, count) = map.inode.entry(id).or_insert_with(|| {
            map.aliases.entry(ino.0).or_default().push(id);
            (ino.0, 0)
        });
        *count += 1;
        self.any.store(true, Ordering::Release);
    }

    /// The kernel forgot `count` of the times it was given node `id`.
    pub fn forgot(&self, id: u64, count: u64) {
        if id & ALIAS == 0 {
            return;
        }
        let mut map = self.lock();
        let Some((ino, held)) = map.inode.get_mut(&id) else { return };
        *held = held.saturating_sub(count);
        if *held > 0 {
            return;
        }
        let ino = *ino;
        map.inode.remove(&id);
        if let Some(aliases) = map.aliases.get_mut(&ino) {
            aliases.retain(|a| *a != id);
            if aliases.is_empty() {
                map.aliases.remove(&ino);
            }
        }
        self.any.store(!map.inode.is_empty(), Ordering::Release);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Aliases> {
        self.map.lock().expect("kernel ids lock poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_inode_numbers_until_an_alias_is_made() {
        let ids = KernelIds::default();
        assert_eq!(ids.node(InodeId(5)), 5);
        assert_eq!(ids.inode(5), InodeId(5));
        assert_eq!(ids.nodes(InodeId(5)), vec![5]);
        let a = ids.alias(InodeId(5));
        ids.given(a, InodeId(5));
        assert_ne!(a, 5);
        assert_eq!(ids.inode(a), InodeId(5));
        assert_eq!(ids.node(InodeId(5)), a, "new names get the alias");
        assert_eq!(ids.node(InodeId(6)), 6, "other inodes keep their number");
        let b = ids.alias(InodeId(5));
        ids.given(b, InodeId(5));
        assert_eq!(ids.node(InodeId(5)), b, "the newest alias");
        assert_eq!(ids.nodes(InodeId(5)), vec![5, a, b]);
        ids.forgot(b, 1);
        assert_eq!(ids.node(InodeId(5)), a, "back to the alias still held");
        ids.forgot(5, 1);
        assert_eq!(ids.nodes(InodeId(5)), vec![5, a], "the number is not an alias");
        ids.given(a, InodeId(5));
        ids.forgot(a, 1);
        assert_eq!(ids.inode(a), InodeId(5), "given twice, forgotten once");
        ids.forgot(a, 1);
        assert_eq!(ids.node(InodeId(5)), 5);
        assert_eq!(ids.nodes(InodeId(5)), vec![5]);
        assert!(!ids.any.load(Ordering::Acquire), "no alias left");
        assert_ne!(ids.inode(a), InodeId(5), "a forgotten alias names no inode");
    }

    #[test]
    fn an_alias_forgotten_as_it_was_given_again_is_made_again() {
        let ids = KernelIds::default();
        let a = ids.alias(InodeId(5));
        ids.given(a, InodeId(5));
        // A lookup picks the alias; the kernel's FORGET of its old inode comes first.
        let picked = ids.node(InodeId(5));
        ids.forgot(a, 1);
        ids.given(picked, InodeId(5));
        assert_eq!(ids.inode(picked), InodeId(5), "the kernel's new inode is served");
        assert_eq!(ids.node(InodeId(5)), picked);
        assert_eq!(ids.nodes(InodeId(5)), vec![5, picked]);
    }
}
