//! Messages to a meta replica: namespace operations from clients, membership and
//! heartbeats from chunk servers, and cluster status.

use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use stoa_types::{
    Attr, Chain, ChainId, ChainTable, ChunkId, ClusterId, DirEntry, FileKind, FsError, InodeId,
    NodeId, RequestId, SessionId, SetAttr, StatFs, Timestamp,
};

/// One request to meta. Every mutation carries the caller's session and a request id
/// that increases per session, so that meta applies a retried mutation once and answers
/// the retry with the first result. Reads carry `RequestId(0)`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaRequest {
    pub session: SessionId,
    pub req_id: RequestId,
    pub op: MetaOp,
}

impl MetaRequest {
    /// Whether the request is numbered in its session: meta answers a retry of it with
    /// the first answer instead of applying it twice.
    pub fn is_numbered(&self) -> bool {
        self.session.0 != 0 && self.req_id.0 != 0
    }
}

/// Every meta operation. The variant order is the method number: append only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaOp {
    /// Starts a client session. Answered with [`MetaResponse::Session`].
    OpenSession {
        client: String,
    },
    /// Ends a session and releases what it held.
    CloseSession,
    Lookup {
        parent: InodeId,
        name: Vec<u8>,
    },
    GetAttr {
        ino: InodeId,
    },
    SetAttr {
        ino: InodeId,
        set: SetAttr,
    },
    /// Creates a regular file, device, FIFO or socket (`mknod` and `create`).
    Create {
        parent: InodeId,
        name: Vec<u8>,
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
    },
    Mkdir {
        parent: InodeId,
        name: Vec<u8>,
        perm: u32,
        uid: u32,
        gid: u32,
    },
    Symlink {
        parent: InodeId,
        name: Vec<u8>,
        target: Vec<u8>,
        uid: u32,
        gid: u32,
    },
    ReadLink {
        ino: InodeId,
    },
    /// Removes a name. `open` is ignored: it once kept a file its caller had open, which
    /// meta now knows from the sessions' opens, and every file whose last name goes is
    /// kept a short while (stoa-meta `ops/unlink.rs`, strays). It stays for the wire
    /// format.
    Unlink {
        parent: InodeId,
        name: Vec<u8>,
        open: bool,
    },
    Rmdir {
        parent: InodeId,
        name: Vec<u8>,
    },
    /// `flags` are Linux `renameat2` flags: `RENAME_NOREPLACE` (1), `RENAME_EXCHANGE` (2).
    Rename {
        parent: InodeId,
        name: Vec<u8>,
        new_parent: InodeId,
        new_name: Vec<u8>,
        flags: u32,
    },
    Link {
        ino: InodeId,
        new_parent: InodeId,
        new_name: Vec<u8>,
    },
    /// Lists entries in name order, starting after `after` (empty: from the start), at
    /// most `limit` of them.
    ReadDir {
        ino: InodeId,
        after: Vec<u8>,
        limit: u32,
    },
    GetXattr {
        ino: InodeId,
        name: Vec<u8>,
    },
    ListXattr {
        ino: InodeId,
    },
    /// `flags`: `XATTR_CREATE` (1) or `XATTR_REPLACE` (2), as in setxattr(2).
    SetXattr {
        ino: InodeId,
        name: Vec<u8>,
        value: Vec<u8>,
        flags: u32,
    },
    RemoveXattr {
        ino: InodeId,
        name: Vec<u8>,
    },
    StatFs,
    /// Records that data up to `size` was written to chunks: grows the file to at least
    /// `size` and sets mtime and ctime.
    CommitWrite {
        ino: InodeId,
        size: u64,
    },
    /// Deletes an orphaned inode (no links left) once its last opener closed it.
    Purge {
        ino: InodeId,
    },
    GetChainTable,
    Status,
    /// A chunk server announces itself. A new server passes `node: None` and `cluster:
    /// None` and is given both; a known one passes what it was given.
    RegisterChunkServer {
        node: Option<NodeId>,
        cluster: Option<ClusterId>,
        addr: SocketAddr,
        zone: String,
        capacity_bytes: u64,
        used_bytes: u64,
    },
    /// A chunk server's periodic liveness and usage report. Answered with the chain table
    /// when the server's copy (`table_version`) is older than meta's.
    ChunkHeartbeat {
        node: NodeId,
        capacity_bytes: u64,
        used_bytes: u64,
        table_version: u64,
        /// Resync, rebuild and scrub progress, for `stoa status`.
        repair: RepairProgress,
    },
    /// A syncing member of `chain` has copied everything and may serve reads.
    ChunkSynced {
        node: NodeId,
        chain: ChainId,
        chain_version: u64,
    },
    /// A chunk server found a replica whose checksum does not match.
    ReportCorrupt {
        node: NodeId,
        chunk: ChunkId,
        detail: String,
    },
    /// Takes, changes or drops a POSIX byte-range lock (`fcntl` F_SETLK, OFD locks, and
    /// `flock` as a whole-file lock of the open file). Never waits: a conflict answers
    /// `WouldBlock`, and a waiting caller (F_SETLKW) polls with [`MetaOp::GetLock`].
    /// While another session keeps the inode's locks ([`MetaOp::LockAndDelegate`]),
    /// answered [`MetaResponse::LocksElsewhere`], as is [`MetaOp::GetLock`].
    SetLock {
        ino: InodeId,
        lock: FileLock,
    },
    /// The first lock of another owner that conflicts with `lock`, if any (F_GETLK).
    /// Answered with [`MetaResponse::Lock`].
    GetLock {
        ino: InodeId,
        lock: FileLock,
    },
    /// Keeps the caller's session alive; sent every third of the lease. Answered with
    /// [`MetaResponse::Renewed`], or `SessionExpired` once meta has expired the session.
    RenewSession,
    /// The caller's session opened `ino`: while any session has it open, an unlinked or
    /// replaced file is kept as an orphan instead of being deleted.
    Open {
        ino: InodeId,
    },
    /// The caller's session closed its last handle of `ino`. An orphan nobody has open
    /// any more is deleted.
    Release {
        ino: InodeId,
    },
    /// Asks the leader for its commit index, confirmed by a quorum (Raft ReadIndex).
    /// Answered with [`MetaResponse::ReadIndex`]; a follower serves a linearizable read
    /// locally once it has applied that index.
    ReadIndex,
    /// Adds a meta replica: it joins as a learner, catches up (by snapshot if the log was
    /// compacted), then becomes a voter.
    AddReplica {
        id: NodeId,
        addr: SocketAddr,
    },
    /// Removes a meta replica from the voters and learners.
    RemoveReplica {
        id: NodeId,
    },
    /// Creates a regular file and opens it in the caller's session, in one log entry
    /// (`open(O_CREAT)` of a new file: [`MetaOp::Create`] then [`MetaOp::Open`]).
    /// Answered with [`MetaResponse::Attr`].
    CreateOpen {
        parent: InodeId,
        name: Vec<u8>,
        perm: u32,
        uid: u32,
        gid: u32,
    },
    /// A chunk server refused a write its chain forwarded to it for lack of space: the
    /// leader takes it out of its chains (so that the chain's writes go on without it
    /// and it serves no stale reads) until its heartbeats show space freed. Leader soft
    /// state, like heartbeats; answered with [`MetaResponse::Done`].
    ChunkServerFull {
        node: NodeId,
    },
    /// Asks the leader for a capability on `ino` (see docs/flows/caps.md). With `name`,
    /// looks `name` up in directory `ino` instead: the caller gets `Shared` on the
    /// directory and `mode` on the child. Answered with [`MetaResponse::Caps`] once every
    /// conflicting holder has let go.
    GetCaps {
        ino: InodeId,
        name: Option<Vec<u8>>,
        mode: CapMode,
    },
    /// The long poll of a client's events stream: answered with
    /// [`MetaResponse::CapEvents`] as soon as recalls are queued for the session, or
    /// empty after a short hold. Carries every cap the client holds, which a new leader
    /// takes as the session's reassertion, and the newest leader term the client learned
    /// from an earlier answer: a new leader counts the session's reassertion complete
    /// only from a poll that names its term (docs/flows/caps.md, invariant 8). Once the
    /// leader of the term named has answered a poll that carried them, `held` is empty:
    /// that leader reads it only until the session reasserted. Renews the session like
    /// `RenewSession`, after the leader confirmed it still leads.
    ///
    /// `poll` numbers the client's polls (a retry of one keeps its number): the leader
    /// answers a poll older than one it has seen at once and empty, and hands a retry
    /// again what it handed the poll's earlier attempt. A poll forwarded by a replica cut
    /// off one way reached the leader after the cut healed, seconds after its client had
    /// moved on, and took a recall whose answer nobody read.
    CapEvents {
        held: Vec<HeldCap>,
        term: u64,
        poll: u64,
    },
    /// The client dropped these caps (answering recalls) and every cache under them.
    CapsReleased {
        released: Vec<CapRef>,
    },
    /// Reserves `count` inode numbers for the caller's session, for the files it creates
    /// itself under an exclusive cap on their directory ([`MetaOp::Batch`]). A new
    /// reservation replaces the last one. Answered with [`MetaResponse::Inodes`].
    AllocInodes {
        count: u32,
    },
    /// Asks the leader for an exclusive cap on directory `ino` and its whole listing, so
    /// that the caller can answer lookups in it and make changes in it by itself (see
    /// docs/flows/caps.md, namespace changes). Granted only when no other session holds
    /// a cap on the directory and it has at most `limit` entries; never recalls anyone.
    /// Answered with [`MetaResponse::Dir`].
    TakeDir {
        ino: InodeId,
        limit: u32,
    },
    /// Namespace changes the caller made under exclusive caps on their directories,
    /// applied in order in one log entry. Each one succeeds or fails alone. Answered
    /// with [`MetaResponse::Batch`].
    Batch {
        ops: Vec<BatchOp>,
    },
    /// Which of `inos` (at most [`DEAD_INODES_MAX`]) are dead: handed out once and now
    /// neither a file, nor garbage still being collected, nor reserved for a session's
    /// creates. No file can own a chunk of a dead inode ever again, so a chunk server
    /// may remove every chunk it holds of one. Answered with
    /// [`MetaResponse::DeadInodes`].
    DeadInodes {
        inos: Vec<InodeId>,
    },
    /// Size commits, each as [`MetaOp::CommitWrite`] but at the client's time, applied
    /// in order in one log entry; each succeeds or fails alone. A client sends a file's
    /// commits this way only while it holds the file exclusively. Answered with
    /// [`MetaResponse::Attrs`]: the attributes each commit left, so that the client
    /// knows the version its size belongs to.
    CommitWrites {
        commits: Vec<Commit>,
    },
    /// The caller's session will never send again a request numbered below `below`:
    /// every one of those was answered, or given up. Meta forgets their answers, which
    /// it keeps until then so that a retry gets the first one. Sent unnumbered.
    /// Answered with [`MetaResponse::Done`].
    ForgetAnswers {
        below: RequestId,
    },
    /// [`MetaOp::SetLock`] from a client that holds the file `Exclusive`: when no other
    /// session holds a lock on `ino` afterwards, meta also hands the caller every lock
    /// of the inode, answering [`MetaResponse::Delegated`] with the caller's locks; the
    /// client then takes and drops locks of the file by itself until it gives them back
    /// with [`MetaOp::ReturnLocks`] (docs/flows/locks.md, "Locks a client keeps").
    /// Answered `Done` when they stay here.
    LockAndDelegate {
        ino: InodeId,
        lock: FileLock,
    },
    /// Gives back the locks of `ino` meta handed this session: `locks` become the
    /// session's locks on the inode, and every other session may lock it again.
    ReturnLocks {
        ino: InodeId,
        locks: Vec<FileLock>,
    },
    /// Looks up `names` (at most [`LOOKUP_MANY_MAX`]) in directory `dir` at once, each
    /// as [`MetaOp::GetCaps`] with a name and `Shared` does, the conflicting holders of
    /// all of them recalled together: a client that sees the entries it just listed
    /// looked up one after another (`ls -l`) asks for the next ones ahead. Answered with
    /// [`MetaResponse::Grants`], which leaves out a name not found, or found naming
    /// another inode by the time its grant was confirmed.
    GetCapsMany {
        dir: InodeId,
        names: Vec<Vec<u8>>,
    },
    /// `Exclusive` on the regular files `names` (at most [`LOOKUP_MANY_MAX`]) of
    /// directory `dir`, looked up as [`MetaOp::GetCapsMany`] does and their other
    /// holders recalled together: a client that holds `dir` with its listing
    /// ([`MetaOp::TakeDir`]) and removes files there (`rm -r`) then removes each by
    /// itself, instead of one log entry per file. Answered with [`MetaResponse::Grants`],
    /// which also leaves out a name that is not a regular file.
    TakeFiles {
        dir: InodeId,
        names: Vec<Vec<u8>>,
    },
}

/// The most inodes one [`MetaOp::DeadInodes`] may ask about.
pub const DEAD_INODES_MAX: usize = 4096;

/// The most names one [`MetaOp::GetCapsMany`] may look up.
pub const LOOKUP_MANY_MAX: usize = 128;

/// Xattrs, names and values, in name order.
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// The most bytes of xattr names and values a grant carries ([`MetaResponse::Caps`]):
/// enough for the few short ones files have, if any; an inode with more has its xattr
/// calls go to meta.
pub const XATTRS_IN_GRANT_MAX: usize = 4096;

/// How far past its oldest unanswered request a session may number a new one. Meta
/// keeps the answers of a session's last this many request ids at least (until
/// [`MetaOp::ForgetAnswers`]), so a retry of any request a client still waits for is
/// answered from them; a client that has numbered this many since its oldest
/// unanswered request waits before numbering another.
pub const ANSWERS_KEPT: u64 = 1 << 16;

/// One namespace change of a [`MetaOp::Batch`]. The variant order is part of the
/// protocol and of the Raft log on disk: append only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BatchOp {
    /// A new inode `ino` (from the session's reservation, taken in increasing order)
    /// named `name` in `parent`. `target` is a symlink's target (empty otherwise);
    /// `open` records that the session has the new file open, as `CreateOpen` does.
    /// `at` is when the client made it, the time its attributes show.
    Create {
        ino: InodeId,
        parent: InodeId,
        name: Vec<u8>,
        kind: FileKind,
        perm: u32,
        uid: u32,
        gid: u32,
        rdev: u32,
        target: Vec<u8>,
        open: bool,
        at: Timestamp,
    },
    /// Removes `name` from `parent`: an `Rmdir` when `dir`, else an `Unlink`.
    Remove { parent: InodeId, name: Vec<u8>, dir: bool, at: Timestamp },
    /// The session closed its last handle of `ino`, as [`MetaOp::Release`].
    Release { ino: InodeId },
    /// Renames `parent/name` to `new_parent/new_name`, replacing what is there, as
    /// [`MetaOp::Rename`] without flags.
    Rename { parent: InodeId, name: Vec<u8>, new_parent: InodeId, new_name: Vec<u8>, at: Timestamp },
    /// The session opened `ino`, as [`MetaOp::Open`]: sent in a batch only for a file
    /// whose one name lies in a directory the session holds exclusively, so that no
    /// other session can take that name before the batch applies.
    Open { ino: InodeId },
    /// Changes the mode or owner of `ino`, at `at` (its ctime), as [`MetaOp::SetAttr`]
    /// without a size or times: sent in a batch only for an inode the session holds
    /// exclusively, which answered the change itself.
    SetAttr { ino: InodeId, set: SetAttr, at: Timestamp },
    /// Links file `ino` as `new_parent/new_name`, at `at` (the file's ctime, the
    /// directory's mtime and ctime), as [`MetaOp::Link`]: sent in a batch only by a
    /// session holding the file and the directory exclusively.
    Link { ino: InodeId, new_parent: InodeId, new_name: Vec<u8>, at: Timestamp },
}

/// Data up to `size` of file `ino` is written, at `at` (when the client's chunk writes
/// finished; the mtime and ctime it shows): one size commit of a
/// [`MetaOp::CommitWrites`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Commit {
    pub ino: InodeId,
    pub size: u64,
    pub at: Timestamp,
}

/// A directory taken by [`MetaOp::TakeDir`]: its attributes, the grant's sequence
/// number, and every entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirGrant {
    pub attr: Attr,
    pub seq: u64,
    pub entries: Vec<DirEntry>,
}

/// What a capability lets its holder cache (docs/flows/caps.md).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CapMode {
    /// Cache attributes, entries and pages.
    Shared,
    /// Also buffer writes and keep size and mtime locally.
    Exclusive,
}

/// One cap a client holds: the inode, its mode, the sequence number of its grant, and
/// the inode's version when the client began caching it (the version its first grant
/// since it last dropped the cap answered; 0 when not known). A new leader recalls a
/// reasserted cap whose inode changed since: the change's leader may have lost its place
/// before it recalled it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldCap {
    pub ino: InodeId,
    pub mode: CapMode,
    pub seq: u64,
    pub version: u64,
}

/// A grant named by inode and sequence number: what a recall takes back and an ack
/// gives up (every grant of that inode up to `seq`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapRef {
    pub ino: InodeId,
    pub seq: u64,
}

/// Grant sequence numbers carry the leader's term in their high bits, so a new leader's
/// grants outnumber an old one's and a client can tell which leader made a grant.
const CAP_SEQ_TERM_SHIFT: u32 = 40;

/// The sequence number of a leader's `counter`th grant in `term`.
pub fn cap_seq(term: u64, counter: u64) -> u64 {
    (term << CAP_SEQ_TERM_SHIFT) | counter
}

/// The term of the leader that made grant `seq`.
pub fn cap_seq_term(seq: u64) -> u64 {
    seq >> CAP_SEQ_TERM_SHIFT
}

/// Who holds a lock: a process (POSIX locks) or an open file (OFD and flock locks) of
/// one client session. Locks of one owner never conflict with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LockOwner {
    pub session: SessionId,
    /// The kernel's lock owner id, unique within the session.
    pub owner: u64,
}

/// What a lock request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockKind {
    /// Shared: any number of readers.
    Read,
    /// Exclusive.
    Write,
    /// Drops the owner's locks in the range.
    Unlock,
}

/// One byte-range lock, or a request for one. `end` is inclusive; `u64::MAX` (or the
/// kernel's `OFFSET_MAX`) reaches the end of the file, however far it grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLock {
    pub owner: LockOwner,
    pub start: u64,
    pub end: u64,
    pub kind: LockKind,
    /// The holder's process id on its own machine, reported by F_GETLK.
    pub pid: u32,
}

impl MetaOp {
    /// Whether the operation changes state and so goes through the Raft log.
    pub fn is_mutation(&self) -> bool {
        !matches!(
            self,
            MetaOp::Lookup { .. }
                | MetaOp::GetAttr { .. }
                | MetaOp::ReadLink { .. }
                | MetaOp::ReadDir { .. }
                | MetaOp::GetXattr { .. }
                | MetaOp::ListXattr { .. }
                | MetaOp::StatFs
                | MetaOp::GetChainTable
                | MetaOp::Status
                | MetaOp::ChunkHeartbeat { .. }
                | MetaOp::ReportCorrupt { .. }
                | MetaOp::GetLock { .. }
                | MetaOp::RenewSession
                | MetaOp::ReadIndex
                | MetaOp::AddReplica { .. }
                | MetaOp::RemoveReplica { .. }
                | MetaOp::ChunkServerFull { .. }
                | MetaOp::GetCaps { .. }
                | MetaOp::CapEvents { .. }
                | MetaOp::CapsReleased { .. }
                | MetaOp::TakeDir { .. }
                | MetaOp::DeadInodes { .. }
                | MetaOp::GetCapsMany { .. }
                | MetaOp::TakeFiles { .. }
        )
    }

    /// Whether the operation adds, removes or moves directory entries.
    pub fn changes_entries(&self) -> bool {
        matches!(
            self,
            MetaOp::Create { .. }
                | MetaOp::CreateOpen { .. }
                | MetaOp::Mkdir { .. }
                | MetaOp::Symlink { .. }
                | MetaOp::Link { .. }
                | MetaOp::Unlink { .. }
                | MetaOp::Rmdir { .. }
                | MetaOp::Rename { .. }
        )
    }
}

/// What meta grants a new session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionGrant {
    pub session: SessionId,
    pub cluster: ClusterId,
    pub chunk_size_bytes: u32,
    /// How long the session lives without a renewal.
    pub lease_ms: u64,
}

/// Every meta response. The variant order is part of the protocol: append only.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum MetaResponse {
    Done,
    Session(SessionGrant),
    Attr(Attr),
    Data(Vec<u8>),
    Entries {
        entries: Vec<DirEntry>,
        more: bool,
    },
    Names(Vec<Vec<u8>>),
    StatFs(StatFs),
    ChainTable(ChainTable),
    Status(ClusterStatus),
    Registered {
        node: NodeId,
        cluster: ClusterId,
    },
    /// `replicas`: the cluster's replica count, which tells a server when a chain that
    /// no longer lists it is whole without it (its old copies there are garbage).
    Heartbeat {
        table: Option<ChainTable>,
        replicas: u8,
    },
    /// The conflicting lock found by [`MetaOp::GetLock`], or `None` when the range is free.
    Lock(Option<FileLock>),
    /// The leader's read index: the log index a linearizable read must wait for.
    ReadIndex {
        index: u64,
    },
    /// The session was renewed by the leader at `leader`, where a client may send its
    /// mutations directly.
    Renewed {
        leader: Option<SocketAddr>,
    },
    /// A grant: `mode` on `attr.ino` as of `seq`, and for a lookup `Shared` on the
    /// directory as of `dir_seq`, with the directory's version then (both 0 otherwise).
    /// `attr` and `xattrs` (every xattr of the inode, by name, unless they take more
    /// than [`XATTRS_IN_GRANT_MAX`] bytes) are read after every conflicting holder let
    /// go; the holder may answer xattr calls from them while it holds the cap.
    Caps {
        attr: Attr,
        mode: CapMode,
        seq: u64,
        dir_seq: u64,
        dir_version: u64,
        xattrs: Option<Xattrs>,
    },
    /// Recalls queued for the polling session (empty when the hold ran out first), and
    /// the leader's term.
    CapEvents {
        recalls: Vec<CapRef>,
        term: u64,
    },
    /// The inode numbers `first..first + count`, reserved for the session.
    Inodes {
        first: InodeId,
        count: u32,
    },
    /// The directory, or `None` when it cannot be taken now (another session holds a
    /// cap on it, or it has too many entries).
    Dir(Option<DirGrant>),
    /// The outcome of each operation of a batch, in order.
    Batch(Vec<Result<(), FsError>>),
    /// The inodes [`MetaOp::DeadInodes`] asked about that are dead, in the order asked.
    DeadInodes(Vec<InodeId>),
    /// The outcome of each commit of a [`MetaOp::CommitWrites`], in order.
    Attrs(Vec<Result<Attr, FsError>>),
    /// The locks of an inode are now the caller's to keep ([`MetaOp::LockAndDelegate`]):
    /// the caller's locks on it, which it keeps from here on.
    Delegated(Vec<FileLock>),
    /// Another session keeps the locks of the inode; the leader asked it to give them
    /// back, and the caller asks again.
    LocksElsewhere,
    /// The grants of a [`MetaOp::GetCapsMany`] or [`MetaOp::TakeFiles`]: `Shared` on the
    /// directory (`dir_seq`, at `dir_version`) and one on each child found, as
    /// [`MetaResponse::Caps`] gives them, in the order asked.
    Grants {
        dir_seq: u64,
        dir_version: u64,
        grants: Vec<NamedGrant>,
    },
}

/// One child's grant in [`MetaResponse::Grants`]: the name looked up, and what
/// [`MetaResponse::Caps`] carries of the child.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedGrant {
    pub name: Vec<u8>,
    pub attr: Attr,
    pub mode: CapMode,
    pub seq: u64,
    pub xattrs: Option<Xattrs>,
}

/// One meta replica as the cluster sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaMemberStatus {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub voter: bool,
    /// Whether the replica answering the status call could reach this one.
    pub up: bool,
    /// The last log index this replica is known to hold, where the answering replica
    /// knows it (the leader knows it for everyone).
    pub matched_index: Option<u64>,
}

/// One chunk server as the meta leader sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkServerStatus {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub zone: String,
    pub up: bool,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// Milliseconds since its last heartbeat, if it ever sent one to this leader.
    pub last_heartbeat_ms: Option<u64>,
    /// What its last heartbeat said about repair work.
    pub repair: RepairProgress,
    /// Bytes per second copied into this server by resync and rebuild, measured by the
    /// leader between heartbeats.
    pub copy_rate_bytes_per_sec: u64,
}

/// Repair work one chunk server reports in every heartbeat: what it still has to copy
/// from its chains (resync after a return, or a rebuild onto it), and what its copying and
/// scrubbing did so far (counters since the server started).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairProgress {
    /// Chunks still to copy in the resyncs running now.
    pub backlog_chunks: u64,
    /// Bytes of those chunks, as their source reported them.
    pub backlog_bytes: u64,
    pub copied_chunks: u64,
    pub copied_bytes: u64,
    /// Bytes whose checksums the scrubber verified.
    pub scrubbed_bytes: u64,
    /// Damaged replicas found (by the scrubber or a read) and repaired from a peer.
    pub corrupt_found: u64,
    pub corrupt_repaired: u64,
}

/// The whole cluster at a glance, as `stoa status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster: ClusterId,
    /// The replica that answered.
    pub answered_by: NodeId,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub quorate: bool,
    pub last_applied: u64,
    pub members: Vec<MetaMemberStatus>,
    pub chunk_servers: Vec<ChunkServerStatus>,
    pub chains: Vec<Chain>,
    /// How many servers each chain should have: the cluster's replica count.
    pub replicas: u8,
    pub table_version: u64,
    pub files: u64,
    /// Capabilities the leader has granted and not had back (0 when no leader answered):
    /// every client keeps at most its `caps_max`, so this stays bounded.
    pub caps: u64,
    /// Deleted files whose chunks the leader has not freed yet, counted up to
    /// [`GARBAGE_COUNTED`] (at that figure: at least that many).
    pub garbage: u64,
}

/// How far a status answer counts the files waiting for their chunks to be freed.
pub const GARBAGE_COUNTED: usize = 10_000;
