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
//! seeds; `mv` of such a directory, every time). So a lookup within a rename that finds
//! a directory the kernel holds in another directory answers a new alias (`fs.rs`,
//! `names.rs`): under it the kernel has a directory inode with no entry yet, so the new
//! name always takes. The old node id keeps serving what holds it.
//!
//! The kernel holds a node as long as its count of it: each answer that gives the node
//! (a lookup, a create, a link) counts one, and a FORGET takes away what it says. An
//! alias, and what `names.rs` records of a node, end only when that count does. Ending
//! them at any FORGET lost an alias the kernel had been given again meanwhile (its old
//! inode was evicted as a new answer went out): the new inode's requests then named no
//! inode, and a listing of the directory came back empty, a `chmod` or an xattr call
//! `ENOENT` (`nsx.py` seeds 51 and 92, 4 of 6 runs).
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
    map: Mutex<Nodes>,
}

#[derive(Default)]
struct Nodes {
    /// The last alias number taken.
    last: u64,
    /// How many times the kernel was given each node and has not forgotten.
    held: HashMap<u64, u64>,
    /// Alias to its inode.
    inode: HashMap<u64, u64>,
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
        InodeId(self.lock().inode.get(&id).copied().unwrap_or(id))
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

    /// A new alias for an inode: it is the inode's once given ([`KernelIds::given`]).
    pub fn alias(&self) -> u64 {
        let mut map = self.lock();
        map.last += 1;
        ALIAS | map.last
    }

    /// Node `id` of `ino` goes to the kernel in an answer that it counts. An alias is
    /// the inode's, and [`KernelIds::node`] answers it, until the kernel forgets it;
    /// given again after it was forgotten, it is made again.
    pub fn given(&self, id: u64, ino: InodeId) {
        let mut map = self.lock();
        *map.held.entry(id).or_default() += 1;
        if id & ALIAS != 0 && !map.inode.contains_key(&id) {
            map.inode.insert(id, ino.0);
            map.aliases.entry(ino.0).or_default().push(id);
            self.any.store(true, Ordering::Release);
        }
    }

    /// The kernel forgot `count` of the times it was given node `id`. True when it holds
    /// the node no more.
    pub fn forgot(&self, id: u64, count: u64) -> bool {
        let mut map = self.lock();
        let Some(held) = map.held.get_mut(&id) else { return true };
        *held = held.saturating_sub(count);
        if *held > 0 {
            return false;
        }
        map.held.remove(&id);
        if let Some(ino) = map.inode.remove(&id) {
            if let Some(aliases) = map.aliases.get_mut(&ino) {
                aliases.retain(|a| *a != id);
                if aliases.is_empty() {
                    map.aliases.remove(&ino);
                }
            }
            self.any.store(!map.inode.is_empty(), Ordering::Release);
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Nodes> {
        self.map.lock().expect("kernel ids lock poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ids_are_inode_numbers_until_an_alias_is_given() {
        let ids = KernelIds::default();
        assert_eq!(ids.node(InodeId(5)), 5);
        assert_eq!(ids.inode(5), InodeId(5));
        assert_eq!(ids.nodes(InodeId(5)), vec![5]);
        let a = ids.alias();
        assert_ne!(a, 5);
        assert_eq!(ids.node(InodeId(5)), 5, "not given yet");
        ids.given(a, InodeId(5));
        assert_eq!(ids.inode(a), InodeId(5));
        assert_eq!(ids.node(InodeId(5)), a, "new names get the alias");
        assert_eq!(ids.node(InodeId(6)), 6, "other inodes keep their number");
        let b = ids.alias();
        ids.given(b, InodeId(5));
        assert_eq!(ids.node(InodeId(5)), b, "the newest alias");
        assert_eq!(ids.nodes(InodeId(5)), vec![5, a, b]);
        assert!(ids.forgot(b, 1));
        assert_eq!(ids.node(InodeId(5)), a, "back to the alias still held");
        ids.given(5, InodeId(5));
        assert!(ids.forgot(5, 1), "the inode's own node");
        assert_eq!(ids.nodes(InodeId(5)), vec![5, a], "the number is not an alias");
        ids.given(a, InodeId(5));
        assert!(!ids.forgot(a, 1), "given twice, forgotten once");
        assert_eq!(ids.inode(a), InodeId(5));
        assert!(ids.forgot(a, 1));
        assert_eq!(ids.node(InodeId(5)), 5);
        assert_eq!(ids.nodes(InodeId(5)), vec![5]);
        assert!(!ids.any.load(Ordering::Acquire), "no alias left");
        assert_ne!(ids.inode(a), InodeId(5), "a forgotten alias names no inode");
    }

    #[test]
    fn a_node_forgotten_as_it_was_given_again_is_still_held() {
        let ids = KernelIds::default();
        // The kernel was given node 7 twice, then 7 again while it evicted its inode.
        ids.given(7, InodeId(7));
        ids.given(7, InodeId(7));
        ids.given(7, InodeId(7));
        assert!(!ids.forgot(7, 2), "the FORGET of the evicted inode");
        assert!(ids.forgot(7, 1));
        let a = ids.alias();
        ids.given(a, InodeId(5));
        // A lookup picks the alias; the kernel's FORGET of its old inode comes first.
        let picked = ids.node(InodeId(5));
        assert!(ids.forgot(a, 1));
        ids.given(picked, InodeId(5));
        assert_eq!(ids.inode(picked), InodeId(5), "the kernel's new inode is served");
        assert_eq!(ids.node(InodeId(5)), picked);
        assert_eq!(ids.nodes(InodeId(5)), vec![5, picked]);
    }
}
