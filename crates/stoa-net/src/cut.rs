//! Which chunks a cut of a file's data must truncate: shared by the client (a truncation,
//! a punched hole) and meta (the deletion of a removed file's data).
//!
//! A file's size says which chunk indexes it spans, not which chunks hold data: a sparse
//! file of 1 PiB (`truncate -s 1P`, a raw disk image made with `qemu-img create`) spans
//! 268 million chunks of 4 MiB and may have none. Cutting every index one call at a time
//! kept a `truncate -s 0` of such a file in the kernel for hours, and the chunk servers
//! busy with the deletion as long. So past [`CUT_BY_INDEX_MAX`] indexes the chunk
//! servers are asked which chunks of the file they hold (`ChunksOf`), and only those are
//! cut: the work follows the data, not the size.
//!
//! Invariant: every chunk of the file in the range cut that some active member of its
//! chain holds is in the answer, and nothing outside the range is. Each server is asked once (for every
//! chain it is a member of: it answers every chunk of the file it holds), and the answer
//! stands only if every chain had a member answer; chain replication gives every member
//! of a chain the same chunks, but for writes still on their way down the chain, which
//! the head already holds.

use crate::Pool;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::time::Duration;
use stoa_proto::{ChunkOp, ChunkRequest, ChunkResponse, Request, Response, CHUNKS_OF_MAX};
use stoa_types::{Chain, ChainTable, FsError, InodeId, NodeId};

/// The most chunk indexes a cut goes through one by one; past it, it asks which chunks
/// the file has (4 GiB of 4 MiB chunks).
pub const CUT_BY_INDEX_MAX: u64 = 1024;

/// The indexes of file `ino`'s chunks that a cut from chunk index `from` must truncate,
/// for a file whose size spans chunk indexes up to `to` (exclusive): every index from
/// `from` to `to` when there are at most [`CUT_BY_INDEX_MAX`], else those of them that
/// the chunk servers of `table` hold. Fails when some chain had no member answer.
pub async fn chunks_to_cut(
    pool: &Pool,
    table: &ChainTable,
    ino: InodeId,
    from: u64,
    to: u64,
    timeout: Duration,
) -> Result<Vec<u64>, FsError> {
    if to.saturating_sub(from) <= CUT_BY_INDEX_MAX {
        return Ok((from..to).collect());
    }
    // Each server once, through the first chain it is a member of.
    let mut servers: BTreeMap<NodeId, &Chain> = BTreeMap::new();
    for chain in &table.chains {
        for &node in &chain.members {
            servers.entry(node).or_insert(chain);
        }
    }
    let mut held = BTreeSet::new();
    let mut answered: BTreeSet<NodeId> = BTreeSet::new();
    let mut failure = None;
    for (&node, chain) in &servers {
        match held_by(pool, table, node, chain, ino, from..to, timeout).await {
            Ok(indexes) => {
                // Nothing outside the range, whatever a server answers: those chunks stay.
                held.extend(indexes.into_iter().filter(|index| (from..to).contains(index)));
                answered.insert(node);
            }
            Err(e) => failure = Some(e),
        }
    }
    if let Some(chain) =
        table.chains.iter().find(|c| !c.members.iter().any(|m| answered.contains(m)))
    {
        let why = failure.map_or_else(|| "it has no members".to_string(), |e| e.to_string());
        return Err(FsError::Unavailable(format!(
            "no member of chain {} said which chunks of inode {ino} it holds: {why}",
            chain.id
        )));
    }
    Ok(held.into_iter().collect())
}

/// The indexes of `ino`'s chunks in `range` that server `node` holds, page by page (the
/// last page may run past the range).
async fn held_by(
    pool: &Pool,
    table: &ChainTable,
    node: NodeId,
    chain: &Chain,
    ino: InodeId,
    range: Range<u64>,
    timeout: Duration,
) -> Result<Vec<u64>, FsError> {
    let mut from = range.start;
    let (chain, chain_version) = (chain.id, chain.version);
    let addr = table
        .addr(node)
        .ok_or_else(|| FsError::Unavailable(format!("chunk server {node} has no address")))?;
    let mut all = Vec::new();
    loop {
        let op = ChunkOp::ChunksOf { ino, from, limit: CHUNKS_OF_MAX };
        let req = Request::Chunk(ChunkRequest { chain, chain_version, op, deadline_ms: 0 });
        let page = match pool.call(addr, &req, bytes::Bytes::new(), timeout).await? {
            (Response::Chunk(ChunkResponse::Indexes(page)), _) => page,
            (other, _) => {
                return Err(FsError::Protocol(format!(
                    "chunk server {addr} answered ChunksOf with {other:?}"
                )))
            }
        };
        let full = page.len() >= CHUNKS_OF_MAX as usize;
        match page.last() {
            // A page must go forward: a server that answers otherwise would loop us.
            Some(&last) if full && last >= from && last < u64::MAX => from = last + 1,
            Some(_) if full => {
                return Err(FsError::Protocol(format!(
                    "chunk server {addr} answered ChunksOf with a page that does not go forward"
                )))
            }
            _ => {}
        }
        all.extend(page);
        if !full || from >= range.end {
            return Ok(all);
        }
    }
}
