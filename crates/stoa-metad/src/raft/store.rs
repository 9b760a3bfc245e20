//! The one redb database behind a replica, `<data_dir>/meta.redb`, and the Raft log kept
//! in it.
//!
//! ```text
//!  raft_log    u64 index -> bincode Entry          appended with fsync (group commit)
//!  raft_meta   "vote" | "committed" | "purged"     -> bincode value
//!  sm_meta     "applied" | "membership"            -> bincode value, written with each batch
//!  <Table::name()> ...                              state-machine tables, bytes -> bytes
//! ```
//!
//! Every redb call runs on the blocking pool: commits fsync, and reads may touch the disk.

use super::codec::{decode, encode};
use super::TypeConfig;
use crate::MetadError;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError,
    Vote,
};
use redb::{
    Database, Durability, ReadableTable, ReadableTableMetadata, TableDefinition, TableHandle,
};
use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

    /// Whether this replica has never voted nor logged anything: a new data directory.
    pub fn is_pristine(&self) -> Result<bool, MetadError> {
        let check = || -> Result<bool, String> {
            let txn = self.db.begin_read().map_err(s)?;
            let has_vote =
                txn.open_table(RAFT_META).map_err(s)?.get(KEY_VOTE).map_err(s)?.is_some();
            let has_log = !txn.open_table(LOG).map_err(s)?.is_empty().map_err(s)?;
            Ok(!has_vote && !has_log)
        };
        check().map_err(|detail| MetadError::Store { path: self.path.clone(), detail })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, String> {
        let txn = self.db.begin_read().map_err(s)?;
        let table = txn.open_table(RAFT_META).map_err(s)?;
        let value = table.get(key).map_err(s)?;
        value.map(|v| decode(v.value())).transpose().map_err(s)
    }

    fn write_meta<T: serde::Serialize>(
        &self,
        key: &str,
        value: &T,
        durability: Durability,
    ) -> Result<(), String> {
        let bytes = encode(value).map_err(s)?;
        let mut txn = self.db.begin_write().map_err(s)?;
        txn.set_durability(durability);
        txn.open_table(RAFT_META).map_err(s)?.insert(key, bytes.as_slice()).map_err(s)?;
        txn.commit().map_err(s)
    }
}

/// The Raft log over [`Store`]. Cloning it is cheap; clones share the database.
#[derive(Clone, Debug)]
pub(crate) struct LogStore {
    store: Arc<Store>,
}

impl LogStore {
    pub fn new(store: Arc<Store>) -> LogStore {
        LogStore { store }
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        let bounds: (Bound<u64>, Bound<u64>) =
            (range.start_bound().cloned(), range.end_bound().cloned());
        let store = self.store.clone();
        blocking(move || {
            let txn = store.db.begin_read().map_err(s)?;
            let table = txn.open_table(LOG).map_err(s)?;
            let mut entries = Vec::new();
            for row in table.range(bounds).map_err(s)? {
                let (_, value) = row.map_err(s)?;
                entries.push(decode(value.value()).map_err(s)?);
            }
            Ok(entries)
        })
        .await
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || {
            let last_purged_log_id: Option<LogId<u64>> = store.read_meta(KEY_PURGED)?;
            let txn = store.db.begin_read().map_err(s)?;
            let table = txn.open_table(LOG).map_err(s)?;
            let last = match table.last().map_err(s)? {
                Some((_, value)) => {
                    let entry: Entry<TypeConfig> = decode(value.value()).map_err(s)?;
                    Some(entry.log_id)
                }
                None => last_purged_log_id,
            };
            Ok(LogState { last_purged_log_id, last_log_id: last })
        })
        .await
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let store = self.store.clone();
        let vote = *vote;
        blocking(move || store.write_meta(KEY_VOTE, &vote, Durability::Immediate)).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || store.read_meta(KEY_VOTE)).await
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<u64>>,
    ) -> Result<(), StorageError<u64>> {
        // Only a hint that saves re-applying after a restart; losing it is safe, so it is
        // not worth an fsync. The next durable commit persists it anyway.
        let store = self.store.clone();
        blocking(move || store.write_meta(KEY_COMMITTED, &committed, Durability::None)).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<u64>>, StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || Ok(store.read_meta::<Option<LogId<u64>>>(KEY_COMMITTED)?.flatten())).await
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
        let encoded = entries
            .into_iter()
            .map(|e| encode(&e).map(|bytes| (e.log_id.index, bytes)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(io_err)?;
        let store = self.store.clone();
        // Openraft hands us every entry that arrived while the previous append was being
        // synced, so one fsync here covers a whole batch of concurrent client writes.
        let result = blocking(move || {
            let mut txn = store.db.begin_write().map_err(s)?;
            txn.set_durability(Durability::Immediate);
            {
                let mut table = txn.open_table(LOG).map_err(s)?;
                for (index, bytes) in &encoded {
                    table.insert(*index, bytes.as_slice()).map_err(s)?;
                }
            }
            txn.commit().map_err(s)
        })
        .await;
        match &result {
            Ok(()) => callback.log_io_completed(Ok(())),
            Err(e) => callback.log_io_completed(Err(std::io::Error::other(e.to_string()))),
        }
        result
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || {
            let mut txn = store.db.begin_write().map_err(s)?;
            txn.set_durability(Durability::Immediate);
            txn.open_table(LOG).map_err(s)?.retain_in(log_id.index.., |_, _| false).map_err(s)?;
            txn.commit().map_err(s)
        })
        .await
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || {
            let bytes = encode(&log_id).map_err(s)?;
            let mut txn = store.db.begin_write().map_err(s)?;
            txn.set_durability(Durability::Immediate);
            {
                let mut meta = txn.open_table(RAFT_META).map_err(s)?;
                meta.insert(KEY_PURGED, bytes.as_slice()).map_err(s)?;
                let mut log = txn.open_table(LOG).map_err(s)?;
                log.retain_in(..=log_id.index, |_, _| false).map_err(s)?;
            }
            txn.commit().map_err(s)
        })
        .await
    }
}
