//! The one redb database behind a replica, `<data_dir>/meta.redb`, and the Raft log
//! ([`LogStore`]): entries in memory for readers, and on disk in the append-only segment
//! files of [`super::segments`], written by one flusher thread.
//!
//! ```text
//!  raft_meta   "vote" | "committed" | "purged"     -> bincode value (fsync'd)
//!  sm_meta     "applied" | "membership"            -> bincode value, written with each batch
//!  <Table::name()> ...                              state-machine tables, bytes -> bytes
//!  raft_log    u64 index -> bincode Entry          only read, to move an older replica's
//!                                                  log into segment files
//!
//!  append --> memory (readable at once) --> flusher thread: write every queued batch,
//!                                            ONE fdatasync, then every batch's callback
//! ```
//!
//! Every redb call runs on the blocking pool: commits fsync, and reads may touch the disk.

use super::codec::{decode, encode};
use super::segments::Segments;
use super::TypeConfig;
use crate::MetadError;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError,
    Vote,
};
use redb::{Database, Durability, ReadableTable, TableDefinition, TableHandle};
use std::collections::VecDeque;
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

pub(crate) const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(crate) const RAFT_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
pub(crate) const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("sm_meta");

const KEY_VOTE: &str = "vote";
const KEY_COMMITTED: &str = "committed";
const KEY_PURGED: &str = "purged";
pub(crate) const KEY_APPLIED: &str = "applied";
pub(crate) const KEY_MEMBERSHIP: &str = "membership";

/// The state-machine table named `name`: byte keys to byte values.
pub(crate) fn sm_table(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// Turns any storage failure into openraft's error. Storage errors are fatal to Raft:
/// a replica that cannot trust its disk must stop rather than diverge.
pub(crate) fn io_err(e: impl std::fmt::Display) -> StorageError<u64> {
    StorageIOError::write(AnyError::error(e.to_string())).into()
}

/// Describes any error as text; storage work returns text so that its results stay
/// small, and [`blocking`] turns it into openraft's error.
pub(crate) fn s(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// Runs blocking storage work on the blocking pool.
pub(crate) async fn blocking<T, F>(f: F) -> Result<T, StorageError<u64>>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, String> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(io_err),
        Err(e) => Err(io_err(format!("storage task: {e}"))),
    }
}

/// Sends its signal when dropped.
#[derive(Debug)]
pub(crate) struct OnDrop(Option<tokio::sync::oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}

/// The open database.
#[derive(Debug)]
pub(crate) struct Store {
    pub db: Database,
    pub path: PathBuf,
    /// Declared after `db`, so it fires once the database is closed: fields drop in
    /// declaration order.
    _closed: OnDrop,
}

impl Store {
    /// Opens (or creates) the database and makes sure every table exists, so that read
    /// transactions never meet a missing table. Blocking.
    /// `closed` fires when the database has been closed.
    pub fn open(
        path: &Path,
        sm_tables: &[&'static str],
        closed: tokio::sync::oneshot::Sender<()>,
    ) -> Result<Store, MetadError> {
        let fail = |detail: String| MetadError::Store { path: path.to_path_buf(), detail };
        for name in sm_tables {
            if [LOG.name(), RAFT_META.name(), SM_META.name()].contains(name) {
                return Err(fail(format!("state-machine table name {name:?} is reserved")));
            }
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => {
                fail("the database is already open in this process".into())
            }
            redb::DatabaseError::Storage(redb::StorageError::Corrupted(m)) => {
                fail(format!("the database is corrupt: {m}"))
            }
            other => {
                fail(format!("cannot open the database (damaged or not a redb file?): {other}"))
            }
        })?;
        let create = || -> Result<(), String> {
            let txn = db.begin_write().map_err(s)?;
            txn.open_table(LOG).map_err(s)?;
            txn.open_table(RAFT_META).map_err(s)?;
            txn.open_table(SM_META).map_err(s)?;
            for name in sm_tables {
                txn.open_table(sm_table(name)).map_err(s)?;
            }
            txn.commit().map_err(s)
        };
        create().map_err(|e| fail(format!("prepare tables: {e}")))?;
        Ok(Store { db, path: path.to_path_buf(), _closed: OnDrop(Some(closed)) })
    }

    /// Whether this replica has ever voted.
    pub fn has_voted(&self) -> Result<bool, MetadError> {
        self.read_meta::<Vote<u64>>(KEY_VOTE)
            .map(|v| v.is_some())
            .map_err(|detail| MetadError::Store { path: self.path.clone(), detail })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        let txn = self.db.begin_read().map_err(s)?;
        let table = txn.open_table(RAFT_META).map_err(s)?;
        let value = table.get(key).map_err(s)?;
        value.map(|v| decode(v.value())).transpose().map_err(s)
    }

    /// Writes `values` into `raft_meta` in one fsync'd transaction, which also makes
    /// every earlier state-machine commit (written without fsync) durable.
    fn write_meta_durably(&self, values: &[(&str, Vec<u8>)]) -> Result<(), String> {
        let mut txn = self.db.begin_write().map_err(s)?;
        txn.set_durability(Durability::Immediate);
        {
            let mut table = txn.open_table(RAFT_META).map_err(s)?;
            for (key, bytes) in values {
                table.insert(*key, bytes.as_slice()).map_err(s)?;
            }
        }
        txn.commit().map_err(s)
    }

    /// Takes the log entries an older version kept in redb, for [`LogStore::open`] to
    /// move into segment files. Blocking.
    fn legacy_log(&self) -> Result<Vec<(u64, Vec<u8>)>, String> {
        let txn = self.db.begin_read().map_err(s)?;
        let table = txn.open_table(LOG).map_err(s)?;
        let mut out = Vec::new();
        for row in table.iter().map_err(s)? {
            let (k, v) = row.map_err(s)?;
            out.push((k.value(), v.value().to_vec()));
        }
        Ok(out)
    }

    fn drop_legacy_log(&self) -> Result<(), String> {
        let mut txn = self.db.begin_write().map_err(s)?;
        txn.set_durability(Durability::Immediate);
        txn.open_table(LOG).map_err(s)?.retain(|_, _| false).map_err(s)?;
        txn.commit().map_err(s)
    }
}

/// What the flusher thread does, in the order the log store asked.
enum DiskOp {
    Append { records: Vec<(u64, Vec<u8>)>, done: LogFlushed<TypeConfig> },
    Truncate { index: u64, done: tokio::sync::oneshot::Sender<Result<(), String>> },
    Purge { index: u64, done: tokio::sync::oneshot::Sender<Result<(), String>> },
}

/// The log as readers see it: every entry not purged, in index order, including those
/// still being flushed (Raft may send an entry to followers before its own fsync).
#[derive(Debug, Default)]
struct LogMem {
    entries: VecDeque<Entry<TypeConfig>>,
    purged: Option<LogId<u64>>,
    committed: Option<LogId<u64>>,
}

impl LogMem {
    fn last(&self) -> Option<LogId<u64>> {
        self.entries.back().map(|e| e.log_id).or(self.purged)
    }
}

#[derive(Debug)]
struct LogShared {
    mem: Mutex<LogMem>,
    disk: Mutex<mpsc::Sender<DiskOp>>,
}

/// The Raft log. Cloning it is cheap; clones share the entries and the flusher.
#[derive(Clone, Debug)]
pub(crate) struct LogStore {
    store: Arc<Store>,
    shared: Arc<LogShared>,
}

/// Group commit: takes every operation queued, writes them in order, makes them durable
/// with ONE fdatasync, then reports to every batch. A failure is final: every later
/// operation fails too, and Raft stops this replica rather than let it diverge.
/// Holds the store, so the database closes only after the last write finished.
fn flusher(mut segments: Segments, rx: mpsc::Receiver<DiskOp>, _store: Arc<Store>) {
    let mut broken: Option<String> = None;
    while let Ok(first) = rx.recv() {
        let batch: Vec<DiskOp> = std::iter::once(first).chain(rx.try_iter()).collect();
        let mut result: Result<(), String> = broken.clone().map_or(Ok(()), Err);
        let mut flushed = Vec::new();
        // Heartbeats reach the log as empty appends: they need no fdatasync.
        let mut written = false;
        for op in batch {
            match op {
                DiskOp::Append { records, done } => {
                    if result.is_ok() && !records.is_empty() {
                        result = segments.append(&records);
                        written = true;
                    }
                    flushed.push(done);
                }
                DiskOp::Truncate { index, done } => {
                    result = result.and_then(|()| segments.truncate(index));
                    let _ = done.send(result.clone());
                }
                DiskOp::Purge { index, done } => {
                    result = result.and_then(|()| segments.purge(index));
                    let _ = done.send(result.clone());
                }
            }
        }
        if written {
            result = result.and_then(|()| segments.sync());
        }
        if let Err(e) = &result {
            if broken.is_none() {
                tracing::error!("the Raft log cannot be written: {e}");
            }
            broken = Some(e.clone());
        }
        for done in flushed {
            done.log_io_completed(result.clone().map_err(std::io::Error::other));
        }
    }
}

impl LogStore {
    /// Opens the log in `dir` (recovering from a torn tail) and starts its flusher.
    /// A log an older version kept in redb is moved into segment files first. Blocking.
    pub fn open(store: Arc<Store>, dir: &Path) -> Result<LogStore, MetadError> {
        let fail = |detail: String| MetadError::Store { path: dir.to_path_buf(), detail };
        let (mut segments, mut records) = Segments::open(dir).map_err(fail)?;
        let legacy = store.legacy_log().map_err(fail)?;
        if !legacy.is_empty() {
            if !records.is_empty() {
                return Err(fail("both the redb log table and segment files hold entries".into()));
            }
            tracing::info!(
                "moving {} Raft log entries from redb into {}",
                legacy.len(),
                dir.display()
            );
            segments.append(&legacy).map_err(fail)?;
            segments.sync().map_err(fail)?;
            store.drop_legacy_log().map_err(fail)?;
            records = legacy;
        }
        let purged: Option<LogId<u64>> = store.read_meta(KEY_PURGED).map_err(fail)?;
        let committed = store.read_meta::<Option<LogId<u64>>>(KEY_COMMITTED).map_err(fail)?;
        let mut entries = VecDeque::new();
        for (index, body) in records {
            if purged.is_some_and(|p| index <= p.index) {
                continue;
            }
            let entry: Entry<TypeConfig> =
                decode(&body).map_err(|e| fail(format!("log entry {index}: {e}")))?;
            if let Some(prev) = entries.back().map(|e: &Entry<TypeConfig>| e.log_id.index) {
                if index != prev + 1 {
                    return Err(fail(format!("log entry {index} follows {prev}: a gap")));
                }
            }
            entries.push_back(entry);
        }
        let (tx, rx) = mpsc::channel();
        let flusher_store = store.clone();
        std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || flusher(segments, rx, flusher_store))
            .map_err(|e| fail(format!("start the log flusher: {e}")))?;
        let mem = LogMem { entries, purged, committed: committed.flatten() };
        Ok(LogStore {
            store,
            shared: Arc::new(LogShared { mem: Mutex::new(mem), disk: Mutex::new(tx) }),
        })
    }

    /// The newest entry this replica knows to be committed.
    pub fn committed(&self) -> Option<LogId<u64>> {
        self.mem().committed
    }

    fn mem(&self) -> std::sync::MutexGuard<'_, LogMem> {
        self.shared.mem.lock().expect("raft log lock poisoned")
    }

    fn send(&self, op: DiskOp) -> Result<(), String> {
        let tx = self.shared.disk.lock().expect("raft log sender poisoned");
        tx.send(op).map_err(|_| "the Raft log flusher has stopped".to_string())
    }

    /// Whether the log holds nothing and never did (no purge either).
    pub fn is_empty(&self) -> bool {
        self.mem().last().is_none()
    }

    /// Sends `op` to the flusher and waits for it.
    async fn on_disk(
        &self,
        op: impl FnOnce(tokio::sync::oneshot::Sender<Result<(), String>>) -> DiskOp,
    ) -> Result<(), StorageError<u64>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(op(tx)).map_err(io_err)?;
        match rx.await {
            Ok(result) => result.map_err(io_err),
            Err(_) => Err(io_err("the Raft log flusher has stopped")),
        }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let mem = self.mem();
        let Some(first) = mem.entries.front().map(|e| e.log_id.index) else {
            return Ok(Vec::new());
        };
        let skip = match range.start_bound() {
            Bound::Included(&i) => i.saturating_sub(first),
            Bound::Excluded(&i) => (i + 1).saturating_sub(first),
            Bound::Unbounded => 0,
        };
        let skip = usize::try_from(skip).unwrap_or(usize::MAX);
        Ok(mem
            .entries
            .iter()
            .skip(skip)
            .take_while(|e| range.contains(&e.log_id.index))
            .cloned()
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let mem = self.mem();
        Ok(LogState { last_purged_log_id: mem.purged, last_log_id: mem.last() })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let store = self.store.clone();
        let bytes = encode(vote).map_err(io_err)?;
        blocking(move || store.write_meta_durably(&[(KEY_VOTE, bytes)])).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || store.read_meta(KEY_VOTE)).await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        // Only a hint that saves re-applying after a restart, so it costs no disk write
        // here: it is persisted with the next purge.
        self.mem().committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        Ok(self.mem().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut records = Vec::new();
        {
            let mut mem = self.mem();
            for entry in entries {
                records.push((entry.log_id.index, encode(&entry).map_err(io_err)?));
                mem.entries.push_back(entry);
            }
        }
        // Returns before the fsync: the flusher gathers every batch queued meanwhile into
        // one fdatasync and then calls each batch's callback (group commit), while Raft
        // goes on replicating and accepting writes.
        self.send(DiskOp::Append { records, done: callback }).map_err(io_err)
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        self.mem().entries.retain(|e| e.log_id.index < log_id.index);
        self.on_disk(|done| DiskOp::Truncate { index: log_id.index, done }).await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        // Record the purge point first. The same fsync'd transaction makes the state
        // machine's earlier commits durable, so a restart never needs the entries that
        // are about to go.
        let committed = self.mem().committed;
        let values = vec![
            (KEY_PURGED, encode(&log_id).map_err(io_err)?),
            (KEY_COMMITTED, encode(&committed).map_err(io_err)?),
        ];
        let store = self.store.clone();
        blocking(move || store.write_meta_durably(&values)).await?;
        {
            let mut mem = self.mem();
            mem.entries.retain(|e| e.log_id.index > log_id.index);
            mem.purged = Some(log_id);
        }
        self.on_disk(|done| DiskOp::Purge { index: log_id.index, done }).await
    }
}
