//! The Stoa wire protocol: every message any two Stoa processes exchange, and the frame
//! that carries it.
//!
//! ```text
//!   caller                                   callee
//!   Request  --> frame(kind=request, id) -->  handler
//!   Reply    <-- frame(kind=reply,   id) <--  Result<Response, FsError>
//! ```
//!
//! A frame has a fixed 24-byte header, a bincode-encoded head (the message) and an
//! optional raw payload for bulk data (chunk contents), so that data is never re-encoded
//! and can be sliced out of the receive buffer without a copy. The header carries the
//! protocol version and a CRC32C over head and payload; a frame that fails either check is
//! refused and the connection closed.
//!
//! Compatibility: messages are enums whose variant order is their method number. New
//! variants go at the end; a change to an existing message bumps [`PROTOCOL_VERSION`].

mod chunk;
mod frame;
mod lock;
mod meta;

pub use chunk::{ChunkListing, ChunkOp, ChunkRequest, ChunkResponse, CHUNKS_OF_MAX};
pub use frame::{
    decode_head, encode_frame, FrameError, FrameHeader, FrameKind, FRAME_HEADER_LEN, HEAD_LEN_MAX,
    PAYLOAD_LEN_MAX,
};
pub use lock::{first_blocker, set_lock, LockChange};
pub use meta::{
    cap_seq, cap_seq_term, BatchOp, CapMode, CapRef, ChunkServerStatus, ClusterStatus, Commit,
    DirGrant, FileLock, HeldCap, LockKind, LockOwner, MetaMemberStatus, MetaOp, MetaRequest,
    MetaResponse, NamedGrant, RepairProgress, SessionGrant, Xattrs, ANSWERS_KEPT, DEAD_INODES_MAX,
    GARBAGE_COUNTED, LOOKUP_MANY_MAX, XATTRS_IN_GRANT_MAX,
};

use serde::{Deserialize, Serialize};
use stoa_types::FsError;

/// The version every frame carries. A peer speaking another version is refused with a
/// clear error rather than misread.
///
/// 2: chunk heartbeats and status carry repair progress; `ListChunks` answers lengths;
/// heartbeat answers carry the replica count.
/// 3: `CapEvents` polls and answers carry the leader term; chunk requests carry a
/// client's write deadline.
/// 4: chunk mutations carry a write id and `Install`/`FetchChunk` the remembered ones;
/// `ListChunks` answers a content digest per chunk.
/// 5: the status answer carries the replica count.
/// 6: the status answer carries the count of deleted files whose chunks are not freed yet.
/// 7: held caps carry the inode version their cache began at; grants of a lookup carry
/// the directory's version; `CapEvents` polls are numbered.
/// 8: `LockAndDelegate` and `ReturnLocks`: a client that holds a file exclusively keeps
/// its locks; `GetLock` and `SetLock` may answer `LocksElsewhere`.
/// 9: chunk writes say whether they are durable (a `Sync` of their chunk as well);
/// `BatchOp::SetAttr`.
/// 10: `BatchOp::SetAttr` may set times.
/// 11: grants carry the inode's xattrs ([`meta::XATTRS_IN_GRANT_MAX`]).
/// 12: `GetCapsMany`: one call looks up many names of a directory.
/// 13: `ChunksOf`: which chunks of a file a chain member holds.
/// 14: `TakeFiles`: exclusive caps on many files of a directory at once.
/// 15: `BatchOp::Link`: a hard link made by a client holding the file and the directory.
pub const PROTOCOL_VERSION: u8 = 15;

/// Every request, by service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// A client (or a chunk server, or another replica forwarding) to a meta replica.
    Meta(MetaRequest),
    /// A client or a chain peer to a chunk server.
    Chunk(ChunkRequest),
    /// One meta replica to another: a Raft message, encoded by the Raft module, opaque
    /// here so that the protocol does not depend on the Raft library.
    Raft(RaftRequest),
}

/// Raft messages between meta replicas. The bytes are the Raft module's own encoding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RaftRequest {
    AppendEntries(Vec<u8>),
    Vote(Vec<u8>),
    InstallSnapshot(Vec<u8>),
}

/// Every successful response, by service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Meta(MetaResponse),
    Chunk(ChunkResponse),
    Raft(Vec<u8>),
}

/// What a callee sends back: a response, or the error with its retry hint.
pub type Reply = Result<Response, FsError>;
