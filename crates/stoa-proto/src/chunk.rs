//! Messages to a chunk server: reads and writes of chunk data, replicated along chains,
//! and the resync calls a returning server uses to catch up.
//!
//! Chunk data travels as the frame payload, never inside the message head.

use serde::{Deserialize, Serialize};
use stoa_types::{ChainId, ChunkId, InodeId, WriteId, WriteRecord};

/// One request to a chunk server. `chain` and `chain_version` name the chain the caller
/// believes holds the chunk; a server whose chain table has another version refuses the
/// request with `StaleChain`, so a server that was removed from a chain can neither serve
/// stale data nor accept writes.
///
/// `deadline_ms` fences clients: a write or truncate sent by a client (to the head,
/// without a version) is refused with `SessionExpired` if the head takes it after this
/// Unix time in milliseconds, which is when the client's caps stop being valid (its last
/// renewal plus three quarters of a lease). Meta gives a silent client's caps to another
/// only after a whole lease, so a write that was held up in the network (a partition)
/// cannot land after a newer write of another client. 0: no deadline (chain-internal
/// calls, meta's own, reads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRequest {
    pub chain: ChainId,
    pub chain_version: u64,
    pub op: ChunkOp,
    pub deadline_ms: u64,
}

/// Every chunk operation. The variant order is the method number: append only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkOp {
    /// Writes the payload at `offset` of the chunk. A client sends it to the chain head
    /// with `version: None`; the head assigns the chunk's next version and forwards the
    /// write down the chain with it. Acknowledged when the whole chain has applied it.
    /// `id` names the client's mutation (the same on every attempt, and forwarded down
    /// the chain): a head that already applied it answers with that version instead of
    /// applying it again. `None` for mutations that are idempotent anyway (meta's).
    /// `durable`: see [`ChunkOp::durable`].
    Write { chunk: ChunkId, offset: u32, version: Option<u64>, id: Option<WriteId>, durable: bool },
    /// Reads up to `len` bytes at `offset`. The answer's payload is shorter when the chunk
    /// ends first; the caller reads the missing tail as zeros (a hole).
    Read { chunk: ChunkId, offset: u32, len: u32 },
    /// Cuts the chunk to `len` bytes (0 removes it). Replicated like a write.
    Truncate { chunk: ChunkId, len: u32, version: Option<u64>, id: Option<WriteId> },
    /// Makes every earlier write to these chunks durable on every server of the chain.
    Sync { chunks: Vec<ChunkId> },
    /// Lists the chunks of the chain this server holds (see [`ChunkListing`]).
    ListChunks,
    /// Reads a whole chunk with its version, for a resyncing peer.
    FetchChunk { chunk: ChunkId },
    /// Replaces the whole chunk with the payload at `version`, unless the receiver already
    /// has `version` or newer. A chain member sends it down the chain when its successor
    /// reports a version gap (it missed a write), and a resync uses it to copy a chunk.
    /// `writes` are the sender's remembered mutations of the chunk, so a copy still
    /// recognises a retry of a write it got this way.
    Install { chunk: ChunkId, version: u64, writes: Vec<WriteRecord> },
    /// Writes several ranges of one chunk as one new version: the payload holds the
    /// ranges' bytes back to back, `ranges` their `(offset, len)` in the order they are
    /// applied. Replicated like `Write`, so many small writes to one chunk cost one pass
    /// down the chain. `durable`: see [`ChunkOp::durable`].
    WriteRanges {
        chunk: ChunkId,
        ranges: Vec<(u32, u32)>,
        version: Option<u64>,
        id: Option<WriteId>,
        durable: bool,
    },
    /// Lists the indexes of the chunks of file `ino`, at `from` or past it, that this
    /// server holds, of every chain (tombstones too), in order, at most `limit` of them
    /// ([`CHUNKS_OF_MAX`]). Answered with [`ChunkResponse::Indexes`]. A truncation or
    /// deletion of a file much larger than its data cuts what is there instead of every
    /// index its size spans.
    ChunksOf { ino: InodeId, from: u64, limit: u32 },
}

/// The most indexes one `ChunksOf` answers.
pub const CHUNKS_OF_MAX: u32 = 65_536;

impl ChunkOp {
    /// For a replicated mutation (write, ranges, truncate), the version it carries:
    /// `Some(None)` on its way to the head, which assigns one, `Some(Some(v))` once
    /// forwarded down the chain. `None` for every other operation.
    pub fn mutation_version(&self) -> Option<Option<u64>> {
        match self {
            ChunkOp::Write { version, .. }
            | ChunkOp::WriteRanges { version, .. }
            | ChunkOp::Truncate { version, .. } => Some(*version),
            _ => None,
        }
    }

    /// This mutation as the head passes it down the chain: at `version` unless it
    /// already carries one (then it is passed on as it came). Other operations are
    /// returned as they are.
    pub fn forwarded_at(mut self, assigned: u64) -> ChunkOp {
        if let ChunkOp::Write { version, .. }
        | ChunkOp::WriteRanges { version, .. }
        | ChunkOp::Truncate { version, .. } = &mut self
        {
            version.get_or_insert(assigned);
        }
        self
    }

    /// Whether this write is also a `Sync` of its chunk: every server of the write path,
    /// once it has applied (or skipped) the write, makes the chunk durable while it
    /// passes the write on, and answers when both are done. It covers every version of
    /// the chunk up to the write's, so a client that sends one write at a time per
    /// chunk needs no `Sync` after it for that chunk: one pass down the chain instead
    /// of two for an `fsync` of what was still buffered.
    pub fn durable(&self) -> bool {
        matches!(
            self,
            ChunkOp::Write { durable: true, .. } | ChunkOp::WriteRanges { durable: true, .. }
        )
    }

    /// The chunk this operation is about, if it is about one.
    pub fn chunk(&self) -> Option<ChunkId> {
        match self {
            ChunkOp::Write { chunk, .. }
            | ChunkOp::WriteRanges { chunk, .. }
            | ChunkOp::Read { chunk, .. }
            | ChunkOp::Truncate { chunk, .. }
            | ChunkOp::FetchChunk { chunk }
            | ChunkOp::Install { chunk, .. } => Some(*chunk),
            ChunkOp::Sync { .. } | ChunkOp::ListChunks | ChunkOp::ChunksOf { .. } => None,
        }
    }
}

/// Every chunk response. The variant order is part of the protocol: append only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChunkResponse {
    Done,
    /// The chunk's version after a write or truncate.
    Written {
        version: u64,
    },
    /// Data follows as the payload.
    Data,
    Chunks(Vec<ChunkListing>),
    /// A whole chunk follows as the payload, with its remembered mutations.
    Chunk {
        version: u64,
        writes: Vec<WriteRecord>,
    },
    /// Chunk indexes, in order (the answer to `ChunksOf`).
    Indexes(Vec<u64>),
}

/// One chunk a server holds, as `ListChunks` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkListing {
    pub chunk: ChunkId,
    pub version: u64,
    pub len: u32,
    /// CRC32C over the chunk's block checksums: replicas at the same version with other
    /// bytes (a write applied only by a head that died, then another write given the same
    /// version by the new head) differ here, so a resync copies them instead of keeping
    /// bytes nobody acknowledged.
    pub digest: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mutation_is_forwarded_at_the_version_the_head_assigned_and_keeps_one_it_had() {
        let chunk = ChunkId { ino: InodeId(3), index: 0 };
        let ranges = ChunkOp::WriteRanges {
            chunk,
            ranges: vec![(0, 1)],
            version: None,
            id: None,
            durable: false,
        };
        assert_eq!(ranges.mutation_version(), Some(None));
        let forwarded = ranges.forwarded_at(7);
        assert_eq!(forwarded.mutation_version(), Some(Some(7)));
        assert_eq!(forwarded.forwarded_at(9).mutation_version(), Some(Some(7)));
        let read = ChunkOp::Read { chunk, offset: 0, len: 1 };
        assert_eq!(read.mutation_version(), None);
        assert_eq!(read.clone().forwarded_at(7), read);
    }
}
