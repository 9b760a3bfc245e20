//! The Stoa namespace as a deterministic state machine over a small key-value trait.
//!
//! `stoa-metad` replicates [`Command`]s through Raft and hands each committed one to
//! [`apply`]; reads go to [`read`]. Nothing here does I/O, reads a clock or draws a
//! random number: time arrives in the command (stamped by the replica that proposed it),
//! ids come from counters in the tables, so every replica that applies the same log
//! reaches the same tables, and tests replay operations against [`mem::MemKv`].
//!
//! ```text
//!  Command::Client { req, now }
//!     | cluster created?  no -> Unavailable
//!     | read op?          yes -> read (nothing stored)
//!     | session open?     no -> SessionExpired
//!     | (session, req_id) answered before?  yes -> that answer again
//!     v
//!  ops::mutate over a Txn overlay --Ok--> writes committed to the KV
//!     |                           \-Err-> writes dropped
//!     v
//!  answer remembered under (session, req_id), returned
//! ```
//!
//! Tables, keys and value encoding are in [`kv`] and `store`; each operation family has
//! one file under `ops/`.

pub mod kv;
pub mod mem;
#[cfg(test)]
mod model_tests;
mod ops;
mod store;
#[cfg(test)]
mod testing;
mod txn;

pub use kv::{KvRead, KvWrite, Rows, Table};
pub use ops::batch::{BATCH_OPS_MAX, INODE_RESERVATION_MAX};
pub use ops::chains::chunk_servers;
pub use ops::cluster::FIRST_CHUNK_SERVER_ID;
pub use ops::locks::delegate_of;
pub use ops::readdir::READDIR_LIMIT_MAX;
pub use ops::rename::{RENAME_EXCHANGE, RENAME_NOREPLACE};
pub use ops::session::LEASE_MS;
pub use ops::xattr::{all as xattrs, XATTR_CREATE, XATTR_REPLACE};
pub use store::{ChunkServerRecord, ClusterInfo, FORMAT_VERSION};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use stoa_proto::{MetaOp, MetaRequest, MetaResponse};
use stoa_types::{ChainId, ChainTable, ClusterId, FsError, InodeId, NodeId, SessionId, Timestamp};

/// One entry of the replicated log.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// A client's request, stamped with the proposing replica's clock.
    Client { req: MetaRequest, now: Timestamp },
    /// Creates the cluster; proposed once by the first leader.
    Init { cluster: ClusterId, chunk_size_bytes: u32, replicas: u8, now: Timestamp },
    /// The leader judged a chunk server dead: take it out of its chains.
    ChunkServerDown { node: NodeId },
    /// A chunk server is heartbeating again: let it rejoin short chains.
    ChunkServerUp { node: NodeId },
    /// The leader deleted the chunks of a garbage inode. Logs written before
    /// `GarbageCollectedMany` hold it; a leader now proposes that instead.
    GarbageCollected { ino: InodeId },
    /// A chain has been short of replicas for longer than the rebuild delay: add `node`
    /// (live, not in the chain) as a syncing member, which copies the chain's chunks.
    RebuildChain { chain: ChainId, node: NodeId },
    /// The leader saw no renewal of `session` for a whole lease: end it and release
    /// everything it held, as if it had closed.
    ExpireSession { session: SessionId },
    /// The grace of these strays is over: release each unless someone has it open.
    PurgeStrays { inos: Vec<InodeId> },
    /// The leader deleted the chunks of these garbage inodes: one entry per collection
    /// round, not one per inode.
    GarbageCollectedMany { inos: Vec<InodeId> },
}

/// Applies one committed command and returns its answer. An `Err` is an answer too
/// (`NotFound`, `Exists`, ...); it changed nothing except, for a numbered request, the
/// remembered answer. A storage failure of `kv` also comes back as an error; the caller
/// must treat those as fatal rather than as answers.
pub fn apply(kv: &mut impl KvWrite, cmd: &Command) -> Result<MetaResponse, FsError> {
    match cmd {
        Command::Client { req, now } => apply_client(kv, req, *now),
        Command::Init { cluster, chunk_size_bytes, replicas, now } => {
            atomic(kv, |kv| ops::cluster::init(kv, *cluster, *chunk_size_bytes, *replicas, *now))
        }
        Command::ChunkServerDown { node } => atomic(kv, |kv| ops::chains::server_down(kv, *node)),
        Command::ChunkServerUp { node } => atomic(kv, |kv| ops::chains::server_up(kv, *node)),
        Command::GarbageCollected { ino } => atomic(kv, |kv| ops::unlink::collected(kv, *ino)),
        Command::RebuildChain { chain, node } => {
            atomic(kv, |kv| ops::chains::rebuild(kv, *chain, *node))
        }
        Command::ExpireSession { session } => end_session(kv, *session),
        Command::PurgeStrays { inos } => atomic(kv, |kv| {
            for &ino in inos {
                ops::unlink::purge(kv, ino)?;
            }
            Ok(MetaResponse::Done)
        }),
        Command::GarbageCollectedMany { inos } => atomic(kv, |kv| {
            for &ino in inos {
                ops::unlink::collected(kv, ino)?;
            }
            Ok(MetaResponse::Done)
        }),
    }
}

/// Answers a read. Mutations, and the calls a server answers itself (`Status`,
/// heartbeats, corruption reports), are refused with `Invalid`.
pub fn read(kv: &impl KvRead, op: &MetaOp) -> Result<MetaResponse, FsError> {
    store::load_cluster(kv)?;
    if op.is_mutation() {
        return Err(FsError::Invalid("a mutation must go through the log".into()));
    }
    ops::query(kv, op)
}

fn apply_client(
    kv: &mut impl KvWrite,
    req: &MetaRequest,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    store::load_cluster(kv)?;
    match &req.op {
        op if !op.is_mutation() => return ops::query(kv, op),
        // A retried open makes a second session, which is harmless; it cannot be
        // remembered under a session that does not exist yet.
        MetaOp::OpenSession { client } => {
            return atomic(kv, |kv| ops::session::open(kv, client, now))
        }
        MetaOp::CloseSession => return end_session(kv, req.session),
        MetaOp::SetLock { lock, .. } | MetaOp::LockAndDelegate { lock, .. }
            if lock.owner.session != req.session =>
        {
            return Err(FsError::Invalid(format!(
                "session {} cannot change a lock of session {}",
                req.session, lock.owner.session
            )))
        }
        _ => {}
    }
    if !ops::session::is_open(kv, req.session)? {
        return Err(FsError::SessionExpired);
    }
    if let &MetaOp::ForgetAnswers { below } = &req.op {
        return ops::session::forget_answers(kv, req.session, below);
    }
    let numbered = req.is_numbered();
    if numbered {
        if let Some(answer) = ops::session::recall(kv, req.session, req.req_id)? {
            return answer;
        }
    }
    let answer = atomic(kv, |kv| ops::mutate(kv, req.session, &req.op, now));
    if numbered {
        ops::session::remember(kv, req.session, req.req_id, &answer)?;
    }
    answer
}

/// Ends `session` and releases everything it held (open files today; the hook where
/// locks and capabilities will be released too). Used by a client's close and by the
/// leader's expiry of a session that stopped renewing; ending an unknown session is a
/// no-op, so replays and late expiries are harmless.
pub fn end_session(kv: &mut impl KvWrite, session: SessionId) -> Result<MetaResponse, FsError> {
    atomic(kv, |kv| ops::session::end(kv, session))
}

/// Whether `session` is open.
pub fn session_is_open(kv: &impl KvRead, session: SessionId) -> Result<bool, FsError> {
    ops::session::is_open(kv, session)
}

/// Every open session, for the leader's lease keeping.
pub fn sessions(kv: &impl KvRead) -> Result<Vec<SessionId>, FsError> {
    ops::session::list(kv)
}

/// The inode's current version, or `None` when it does not exist.
pub fn version(kv: &impl KvRead, ino: InodeId) -> Result<Option<u64>, FsError> {
    Ok(store::find_inode(kv, ino)?.map(|rec| rec.attr.version))
}

/// The current version of each of `inodes` that exists, for a new leader checking the
/// caps a client reasserts against what changed since it cached them.
pub fn versions(kv: &impl KvRead, inodes: &[InodeId]) -> Result<HashMap<InodeId, u64>, FsError> {
    let mut found = HashMap::with_capacity(inodes.len());
    for &ino in inodes {
        if let Some(version) = version(kv, ino)? {
            found.insert(ino, version);
        }
    }
    Ok(found)
}

/// Runs `op` over an overlay of `kv` and keeps its writes only if it succeeds.
fn atomic<K: KvWrite>(
    kv: &mut K,
    op: impl FnOnce(&mut txn::Txn<'_, K>) -> Result<MetaResponse, FsError>,
) -> Result<MetaResponse, FsError> {
    let mut overlay = txn::Txn::new(&*kv);
    let answer = op(&mut overlay)?;
    let writes = overlay.into_writes();
    txn::commit(kv, writes)?;
    Ok(answer)
}

/// The cluster's fixed parameters, or `None` before `Init`.
pub fn cluster_info(kv: &impl KvRead) -> Result<Option<ClusterInfo>, FsError> {
    store::find_cluster(kv)
}

/// The chain table; empty at version 0 until chunk servers register.
pub fn chain_table(kv: &impl KvRead) -> Result<ChainTable, FsError> {
    store::load_chains(kv)
}

/// Up to `limit` deleted files whose chunks are still to be deleted, with their sizes,
/// in inode order from inode `from` on.
pub fn garbage(
    kv: &impl KvRead,
    from: InodeId,
    limit: usize,
) -> Result<Vec<(InodeId, u64)>, FsError> {
    inode_rows(kv, Table::Garbage, from, limit)
}

/// Strays whose last name went at `before` or earlier (see `ops/unlink.rs`), at most
/// `limit` of the table's first rows looked at.
pub fn strays(kv: &impl KvRead, before: Timestamp, limit: usize) -> Result<Vec<InodeId>, FsError> {
    let rows = inode_rows::<Timestamp>(kv, Table::Strays, InodeId(0), limit)?;
    Ok(rows.into_iter().filter(|(_, since)| *since <= before).map(|(ino, _)| ino).collect())
}

/// The first `limit` rows from inode `from` on of a table keyed by inode number, decoded.
fn inode_rows<T: serde::de::DeserializeOwned>(
    kv: &impl KvRead,
    table: Table,
    from: InodeId,
    limit: usize,
) -> Result<Vec<(InodeId, T)>, FsError> {
    let rows = kv.scan(table, &from.0.to_be_bytes(), None, limit)?;
    rows.iter()
        .map(|(key, value)| {
            let ino = key.as_slice().try_into().map(u64::from_be_bytes).map_err(|_| {
                let table = table.name();
                FsError::Io(format!("{table} key of {} bytes is not an inode number", key.len()))
            })?;
            Ok((InodeId(ino), store::decode(table, key, value)?))
        })
        .collect()
}

/// How many inodes exist, the root included.
pub fn file_count(kv: &impl KvRead) -> Result<u64, FsError> {
    store::counter(kv, store::Counter::Files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemKv;
    use crate::testing::{at, create_op, Fs, ROOT};
    use stoa_types::{FileKind, RequestId};

    #[test]
    fn nothing_is_served_before_init_and_init_happens_once() {
        let mut kv = MemKv::new();
        let getattr = MetaOp::GetAttr { ino: ROOT };
        let unavailable = Err(FsError::Unavailable("cluster not created yet".into()));
        assert_eq!(read(&kv, &getattr), unavailable);
        let req = MetaRequest { session: SessionId(0), req_id: RequestId(0), op: getattr.clone() };
        assert_eq!(apply(&mut kv, &Command::Client { req, now: at(1) }), unavailable);
        assert_eq!(cluster_info(&kv).unwrap(), None);
        let init = Command::Init {
            cluster: ClusterId(7),
            chunk_size_bytes: 4096,
            replicas: 3,
            now: at(1),
        };
        apply(&mut kv, &init).unwrap();
        let info = cluster_info(&kv).unwrap().unwrap();
        assert_eq!((info.cluster, info.chunk_size_bytes, info.replicas), (ClusterId(7), 4096, 3));
        let MetaResponse::Attr(root) = read(&kv, &getattr).unwrap() else { panic!() };
        assert_eq!((root.kind, root.perm, root.nlink), (FileKind::Dir, 0o755, 2));
        let again =
            Command::Init { cluster: ClusterId(8), chunk_size_bytes: 1, replicas: 1, now: at(2) };
        assert_eq!(apply(&mut kv, &again), Err(FsError::Exists));
        assert_eq!(cluster_info(&kv).unwrap().unwrap().cluster, ClusterId(7));
        assert_eq!(file_count(&kv).unwrap(), 1);
    }

    #[test]
    fn a_retried_create_gets_the_first_answer_and_is_applied_once() {
        let mut fs = Fs::new();
        let req = MetaRequest {
            session: fs.session,
            req_id: RequestId(500),
            op: create_op(ROOT, "a", FileKind::File),
        };
        let first = apply(&mut fs.kv, &Command::Client { req: req.clone(), now: at(10) }).unwrap();
        let counted = file_count(&fs.kv).unwrap();
        let retry = apply(&mut fs.kv, &Command::Client { req: req.clone(), now: at(20) }).unwrap();
        assert_eq!(retry, first);
        assert_eq!(file_count(&fs.kv).unwrap(), counted);
        assert_eq!(fs.names(ROOT), vec!["a"]);
        // The same request under a new id is a new request, and fails as a second create.
        let other = MetaRequest { req_id: RequestId(501), ..req };
        assert_eq!(
            apply(&mut fs.kv, &Command::Client { req: other, now: at(30) }),
            Err(FsError::Exists)
        );
    }

    #[test]
    fn an_error_answer_is_remembered_too() {
        let mut fs = Fs::new();
        let op = MetaOp::Unlink { parent: ROOT, name: b"x".to_vec(), open: false };
        let req = MetaRequest { session: fs.session, req_id: RequestId(9), op };
        let cmd = Command::Client { req, now: at(10) };
        assert_eq!(apply(&mut fs.kv, &cmd), Err(FsError::NotFound));
        fs.create(ROOT, "x").unwrap();
        // Applying again would now succeed; the retry must still see the first answer.
        assert_eq!(apply(&mut fs.kv, &cmd), Err(FsError::NotFound));
        assert!(fs.lookup(ROOT, "x").is_ok());
    }

    #[test]
    fn a_failed_operation_changes_nothing() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        fs.create(d.ino, "inner").unwrap();
        fs.create(ROOT, "f").unwrap();
        fs.mkdir(ROOT, "e").unwrap();
        let mut before = fs.kv.clone();
        assert_eq!(fs.rename((ROOT, "f"), (ROOT, "d"), 0), Err(FsError::IsDir));
        assert_eq!(fs.rename((ROOT, "e"), (ROOT, "d"), 0), Err(FsError::NotEmpty));
        assert!(matches!(fs.rename((ROOT, "d"), (d.ino, "x"), 0), Err(FsError::Invalid(_))));
        assert_eq!(fs.rmdir(ROOT, "d"), Err(FsError::NotEmpty));
        assert_eq!(fs.create(ROOT, "f"), Err(FsError::Exists));
        // Only the remembered answers differ.
        for kv in [&mut before, &mut fs.kv] {
            for (k, _) in kv.scan(Table::Dedup, &[], None, usize::MAX).unwrap() {
                kv.delete(Table::Dedup, &k).unwrap();
            }
        }
        assert_eq!(fs.kv, before);
    }

    #[test]
    fn a_closed_or_unknown_session_is_refused() {
        let mut fs = Fs::new();
        fs.create(ROOT, "a").unwrap();
        assert!(!fs.kv.is_empty(Table::Dedup));
        fs.call(MetaOp::CloseSession).unwrap();
        assert!(fs.kv.is_empty(Table::Dedup));
        assert_eq!(fs.create(ROOT, "b"), Err(FsError::SessionExpired));
        // Closing again is fine; reads need no session.
        fs.call(MetaOp::CloseSession).unwrap();
        assert!(fs.lookup(ROOT, "a").is_ok());
    }

    #[test]
    fn a_mutation_cannot_be_read_and_server_calls_are_not_ours() {
        let fs = Fs::new();
        let rmdir = MetaOp::Rmdir { parent: ROOT, name: b"x".to_vec() };
        assert!(matches!(read(&fs.kv, &rmdir), Err(FsError::Invalid(_))));
        let err = read(&fs.kv, &MetaOp::Status).unwrap_err();
        assert!(err.to_string().contains("Status"), "{err}");
    }

    #[test]
    fn a_corrupt_row_is_an_error_not_a_panic() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let key = a.ino.0.to_be_bytes();
        fs.kv.put(Table::Inodes, &key, &[FORMAT_VERSION + 1, 1, 2, 3]).unwrap();
        let err = fs.getattr(a.ino).unwrap_err();
        assert!(matches!(&err, FsError::Io(m) if m.contains("inodes")), "{err:?}");
        fs.kv.put(Table::Inodes, &key, &[FORMAT_VERSION, 0xff, 0xff]).unwrap();
        assert!(matches!(fs.lookup(ROOT, "a"), Err(FsError::Io(_))));
        assert!(matches!(fs.unlink(ROOT, "a", false), Err(FsError::Io(_))));
        fs.kv.put(Table::Garbage, b"short", &[FORMAT_VERSION, 0]).unwrap();
        assert!(matches!(garbage(&fs.kv, InodeId(0), 10), Err(FsError::Io(_))));
        fs.kv.put(Table::Chains, b"table", &[]).unwrap();
        assert!(matches!(chain_table(&fs.kv), Err(FsError::Io(_))));
    }
}
