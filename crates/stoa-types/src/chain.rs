//! The chain table: which chunk servers hold which chains, owned and versioned by meta.

use crate::{ChainId, ChunkId, NodeId};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// A chunk server as meta knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkNode {
    pub id: NodeId,
    pub addr: SocketAddr,
}

/// One replication chain. Writes enter at `members[0]` (the head) and travel to the last
/// member (the tail); the write is acknowledged once the tail has it. `syncing` members
/// receive every write after the tail but serve no reads until they have caught up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chain {
    pub id: ChainId,
    /// Bumped on every membership change; requests carrying another version are refused.
    pub version: u64,
    pub members: Vec<NodeId>,
    pub syncing: Vec<NodeId>,
}

impl Chain {
    /// Every server that receives writes, in the order a write travels.
    pub fn write_path(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.members.iter().chain(self.syncing.iter()).copied()
    }
}

/// Every chain and chunk server of the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainTable {
    /// Bumped on every change to any chain or node.
    pub version: u64,
    pub chains: Vec<Chain>,
    pub nodes: Vec<ChunkNode>,
}

impl ChainTable {
    /// The chain that stores `chunk`. Chunks of one file rotate over the chains so that a
    /// large file spreads its load, and files start on different chains.
    pub fn chain_for(&self, chunk: ChunkId) -> Option<&Chain> {
        if self.chains.is_empty() {
            return None;
        }
        let n = self.chains.len() as u64;
        let start = chunk.ino.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let slot = start.wrapping_add(chunk.index) % n;
        self.chains.get(slot as usize)
    }

    /// The chain with id `id`.
    pub fn chain(&self, id: ChainId) -> Option<&Chain> {
        self.chains.iter().find(|c| c.id == id)
    }

    /// The address of chunk server `id`.
    pub fn addr(&self, id: NodeId) -> Option<SocketAddr> {
        self.nodes.iter().find(|n| n.id == id).map(|n| n.addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::InodeId;

    #[test]
    fn chunks_of_a_file_rotate_over_chains() {
        let table = ChainTable {
            version: 1,
            chains: (0..3)
                .map(|i| Chain { id: ChainId(i), version: 1, members: vec![], syncing: vec![] })
                .collect(),
            nodes: vec![],
        };
        let ids: Vec<ChainId> = (0..6)
            .map(|index| table.chain_for(ChunkId { ino: InodeId(42), index }).unwrap().id)
            .collect();
        assert_eq!(ids[0], ids[3]);
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[1], ids[2]);
        assert!(ChainTable::default().chain_for(ChunkId { ino: InodeId(1), index: 0 }).is_none());
    }
}
