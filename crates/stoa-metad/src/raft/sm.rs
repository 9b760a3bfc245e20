//! The replicated state machine: `stoa_meta` operations applied to the state-machine
//! tables of the redb database.
//!
//! A batch of committed entries is applied in ONE write transaction together with the
//! last applied log id and membership, so the tables and the applied index can never
//! disagree, whatever moment the process dies at.

use super::codec::{decode, encode};
use super::snapshot::{from_blob, to_blob, SnapshotBody, SnapshotDir};
use super::store::{blocking, s, sm_table, Store, KEY_APPLIED, KEY_MEMBERSHIP, SM_META};
use super::TypeConfig;
use crate::datadir::ClusterIdentity;
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot,
    SnapshotMeta, StorageError, StoredMembership,
};
use redb::{Durability, ReadTransaction, ReadableTable, WriteTransaction};
use std::cell::RefCell;
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use stoa_meta::{KvRead, KvWrite, Table};
use stoa_proto::MetaResponse;
use stoa_types::FsError;

type Membership = StoredMembership<u64, BasicNode>;

/// A storage failure inside a state-machine operation. It must stop the replica rather
/// than become the client's answer: an answer is replicated state, and a disk error on
/// one replica is not.
fn kv_err(e: impl std::fmt::Display) -> FsError {
    FsError::Io(format!("meta store: {e}"))
}

/// Key-value rows in key order.
type Rows = Vec<(Vec<u8>, Vec<u8>)>;
type ReadTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;
type WriteTable<'t> = redb::Table<'t, &'static [u8], &'static [u8]>;

/// [`KvRead`] over a read transaction: a consistent view of the state machine.
pub(crate) struct SmReader {
    tables: Vec<(&'static str, ReadTable)>,
}

impl SmReader {
    pub fn open(txn: &ReadTransaction) -> Result<SmReader, String> {
        let mut tables = Vec::with_capacity(Table::ALL.len());
        for t in Table::ALL {
            tables.push((t.name(), txn.open_table(sm_table(t.name())).map_err(s)?));
        }
        Ok(SmReader { tables })
    }

    fn table(&self, t: Table) -> &ReadTable {
        let name = t.name();
        &self.tables.iter().find(|(n, _)| *n == name).expect("every table is opened").1
    }
}

impl KvRead for SmReader {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        get_row(self.table(table), key)
    }

    fn scan(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Rows, FsError> {
        scan_rows(self.table(table), from, to, limit)
    }
}

fn get_row(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, FsError> {
    Ok(table.get(key).map_err(kv_err)?.map(|v| v.value().to_vec()))
}

/// Rows with `from <= key < to` (`to: None` = to the end), at most `limit`.
fn scan_rows(
    table: &impl ReadableTable<&'static [u8], &'static [u8]>,
    from: &[u8],
    to: Option<&[u8]>,
    limit: usize,
) -> Result<Rows, FsError> {
    let range = match to {
        Some(to) => table.range::<&[u8]>(from..to),
        None => table.range::<&[u8]>(from..),
    };
    let mut out = Vec::new();
    for row in range.map_err(kv_err)?.take(limit) {
        let (k, v) = row.map_err(kv_err)?;
        out.push((k.value().to_vec(), v.value().to_vec()));
    }
    Ok(out)
}

/// [`KvWrite`] over a write transaction. The first storage error, of a read as much as
/// of a write, is remembered so that the whole batch is abandoned, whatever the operation
/// made of it: a read error that became an answer would be replicated state that only
/// this replica has.
struct SmWriter<'t> {
    tables: Vec<(&'static str, WriteTable<'t>)>,
    failure: RefCell<Option<String>>,
}

impl<'t> SmWriter<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<SmWriter<'t>, String> {
        let mut tables = Vec::with_capacity(Table::ALL.len());
        for t in Table::ALL {
            tables.push((t.name(), txn.open_table(sm_table(t.name())).map_err(s)?));
        }
        Ok(SmWriter { tables, failure: RefCell::new(None) })
    }

    fn table(&mut self, t: Table) -> &mut WriteTable<'t> {
        let name = t.name();
        &mut self.tables.iter_mut().find(|(n, _)| *n == name).expect("every table is opened").1
    }

    fn table_ref(&self, t: Table) -> &WriteTable<'t> {
        let name = t.name();
        &self.tables.iter().find(|(n, _)| *n == name).expect("every table is opened").1
    }

    /// Passes `r` on, remembering its error if it is the batch's first.
    fn note<T>(&self, r: Result<T, FsError>) -> Result<T, FsError> {
        r.inspect_err(|e| {
            self.failure.borrow_mut().get_or_insert_with(|| e.to_string());
        })
    }
}

impl KvRead for SmWriter<'_> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        self.note(get_row(self.table_ref(table), key))
    }

    fn scan(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Rows, FsError> {
        self.note(scan_rows(self.table_ref(table), from, to, limit))
    }
}

impl KvWrite for SmWriter<'_> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), FsError> {
        let r = self.table(table).insert(key, value).map(|_| ()).map_err(kv_err);
        self.note(r)
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<(), FsError> {
        let r = self.table(table).remove(key).map(|_| ()).map_err(kv_err);
        self.note(r)
    }
}

/// The state machine openraft drives.
pub(crate) struct StateMachine {
    store: Arc<Store>,
    snapshots: Arc<SnapshotDir>,
    cluster: Arc<ClusterIdentity>,
    /// Makes snapshot ids unique even when two snapshots cover the same log id.
    snapshot_seq: Arc<AtomicU64>,
    /// Batches applied since this replica started.
    batches: u64,
}

/// Every this many applied batches, the apply commit is fsync'd.
const DURABLE_APPLY_EVERY_BATCHES: u64 = 128;

impl StateMachine {
    pub fn new(
        store: Arc<Store>,
        snapshots: Arc<SnapshotDir>,
        cluster: Arc<ClusterIdentity>,
    ) -> StateMachine {
        StateMachine {
            store,
            snapshots,
            cluster,
            snapshot_seq: Arc::new(AtomicU64::new(0)),
            batches: 0,
        }
    }
}

fn read_sm_meta(txn: &ReadTransaction) -> Result<(Option<LogId<u64>>, Membership), String> {
    let table = txn.open_table(SM_META).map_err(s)?;
    let applied = match table.get(KEY_APPLIED).map_err(s)? {
        Some(v) => decode(v.value())?,
        None => None,
    };
    let membership = match table.get(KEY_MEMBERSHIP).map_err(s)? {
        Some(v) => decode(v.value())?,
        None => Membership::default(),
    };
    Ok((applied, membership))
}

/// Writes the applied log id and membership into the batch's transaction.
fn write_sm_meta(
    txn: &WriteTransaction,
    applied: &Option<LogId<u64>>,
    membership: &Membership,
) -> Result<(), String> {
    let mut table = txn.open_table(SM_META).map_err(s)?;
    let applied = encode(applied)?;
    let membership = encode(membership)?;
    table.insert(KEY_APPLIED, applied.as_slice()).map_err(s)?;
    table.insert(KEY_MEMBERSHIP, membership.as_slice()).map_err(s)?;
    Ok(())
}

/// Learns the cluster id from the state machine once it holds one. Blocking.
fn learn_cluster(store: &Store, cluster: &ClusterIdentity) -> Result<(), String> {
    let txn = store.db.begin_read().map_err(s)?;
    let kv = SmReader::open(&txn).map_err(s)?;
    if let Some(info) = stoa_meta::cluster_info(&kv).map_err(s)? {
        cluster.learn(info.cluster)?;
    }
    Ok(())
}

/// Applies `entries` in one transaction and returns one answer per entry. Blocking.
fn apply_batch(
    store: &Store,
    entries: &[Entry<TypeConfig>],
    durable: bool,
) -> Result<Vec<Result<MetaResponse, FsError>>, String> {
    let mut txn = store.db.begin_write().map_err(s)?;
    // The log is already durable; a crash that loses this commit re-applies the same
    // entries from it (a purge of the log first makes the state machine durable). So
    // most commits skip the fsync (redb's `Eventual` fsyncs too on Linux). redb reuses
    // the pages a commit frees only after an fsync'd commit, so one now and then bounds
    // the file's growth, and what a restart re-applies.
    txn.set_durability(if durable { Durability::Immediate } else { Durability::None });
    let (mut applied, mut membership) = {
        let t = txn.open_table(SM_META).map_err(s)?;
        let applied = t.get(KEY_APPLIED).map_err(s)?.map(|v| v.value().to_vec());
        let member = t.get(KEY_MEMBERSHIP).map_err(s)?.map(|v| v.value().to_vec());
        let applied: Option<LogId<u64>> = applied.map(|b| decode(&b)).transpose()?.flatten();
        let member: Membership = member.map(|b| decode(&b)).transpose()?.unwrap_or_default();
        (applied, member)
    };
    let mut answers = Vec::with_capacity(entries.len());
    {
        let mut kv = SmWriter::open(&txn).map_err(s)?;
        for entry in entries {
            applied = Some(entry.log_id);
            let answer = match &entry.payload {
                EntryPayload::Blank => Ok(MetaResponse::Done),
                EntryPayload::Normal(cmd) => stoa_meta::apply(&mut kv, cmd),
                EntryPayload::Membership(m) => {
                    membership = StoredMembership::new(Some(entry.log_id), m.clone());
                    Ok(MetaResponse::Done)
                }
            };
            if let Some(failure) = kv.failure.take() {
                return Err(format!("apply log {}: {failure}", entry.log_id));
            }
            answers.push(answer);
        }
    }
    write_sm_meta(&txn, &applied, &membership)?;
    txn.commit().map_err(s)?;
    Ok(answers)
}

/// Dumps every state-machine table from one consistent read. Blocking.
fn dump(store: &Store, seq: u64) -> Result<SnapshotBody, String> {
    let txn = store.db.begin_read().map_err(s)?;
    let (last_applied, membership) = read_sm_meta(&txn)?;
    let mut tables = Vec::with_capacity(Table::ALL.len());
    for t in Table::ALL {
        let table = txn.open_table(sm_table(t.name())).map_err(s)?;
        let mut rows = Vec::new();
        for row in table.iter().map_err(s)? {
            let (k, v) = row.map_err(s)?;
            rows.push((k.value().to_vec(), v.value().to_vec()));
        }
        tables.push((t.name().to_string(), rows));
    }
    let snapshot_id = match &last_applied {
        Some(id) => format!("{}-{}-{seq}", id.leader_id.term, id.index),
        None => format!("0-0-{seq}"),
    };
    Ok(SnapshotBody { snapshot_id, last_applied, membership, tables })
}

/// Replaces every state-machine table with the snapshot's rows, in one transaction.
/// Blocking.
fn restore(store: &Store, body: &SnapshotBody) -> Result<(), String> {
    for (name, _) in &body.tables {
        if !Table::ALL.iter().any(|t| t.name() == name) {
            return Err(format!("snapshot holds unknown table {name:?} (newer version?)"));
        }
    }
    let mut txn = store.db.begin_write().map_err(s)?;
    txn.set_durability(Durability::Immediate);
    for t in Table::ALL {
        txn.delete_table(sm_table(t.name())).map_err(s)?;
        let mut table = txn.open_table(sm_table(t.name())).map_err(s)?;
        if let Some((_, rows)) = body.tables.iter().find(|(n, _)| n == t.name()) {
            for (k, v) in rows {
                table.insert(k.as_slice(), v.as_slice()).map_err(s)?;
            }
        }
    }
    write_sm_meta(&txn, &body.last_applied, &body.membership)?;
    txn.commit().map_err(s)
}

/// Builds snapshots from a consistent read while the state machine keeps applying.
pub(crate) struct SnapshotBuilder {
    store: Arc<Store>,
    snapshots: Arc<SnapshotDir>,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let (store, snapshots, seq) = (self.store.clone(), self.snapshots.clone(), self.seq);
        blocking(move || {
            let body = dump(&store, seq).map_err(s)?;
            let blob = to_blob(&body).map_err(s)?;
            snapshots.save(&blob, body.last_applied).map_err(|e| format!("save snapshot: {e}"))?;
            tracing::info!(
                "built snapshot {} ({} bytes, {} rows)",
                body.snapshot_id,
                blob.len(),
                body.tables.iter().map(|(_, rows)| rows.len()).sum::<usize>()
            );
            Ok(Snapshot { meta: body.meta(), snapshot: Box::new(Cursor::new(blob)) })
        })
        .await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, Membership), StorageError<u64>> {
        let store = self.store.clone();
        blocking(move || {
            let txn = store.db.begin_read().map_err(s)?;
            read_sm_meta(&txn).map_err(s)
        })
        .await
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> Result<Vec<Result<MetaResponse, FsError>>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let (store, cluster) = (self.store.clone(), self.cluster.clone());
        self.batches += 1;
        let durable = self.batches % DURABLE_APPLY_EVERY_BATCHES == 0;
        blocking(move || {
            let answers = apply_batch(&store, &entries, durable).map_err(s)?;
            if cluster.get().is_none() {
                learn_cluster(&store, &cluster).map_err(s)?;
            }
            Ok(answers)
        })
        .await
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            store: self.store.clone(),
            snapshots: self.snapshots.clone(),
            seq: self.snapshot_seq.fetch_add(1, Ordering::Relaxed),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let blob = snapshot.into_inner();
        let (store, snapshots, cluster) =
            (self.store.clone(), self.snapshots.clone(), self.cluster.clone());
        let want = meta.last_log_id;
        blocking(move || {
            let body = from_blob(&blob).map_err(|e| format!("received snapshot: {e}"))?;
            if body.last_applied != want {
                return Err(format!(
                    "received snapshot covers {:?} but was announced as {want:?}",
                    body.last_applied
                ));
            }
            restore(&store, &body).map_err(s)?;
            snapshots.save(&blob, body.last_applied).map_err(|e| format!("save snapshot: {e}"))?;
            learn_cluster(&store, &cluster).map_err(s)?;
            tracing::info!("installed snapshot {}", body.snapshot_id);
            Ok(())
        })
        .await
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let snapshots = self.snapshots.clone();
        blocking(move || {
            let loaded = snapshots.load().map_err(s)?;
            Ok(loaded.map(|(blob, body)| Snapshot {
                meta: body.meta(),
                snapshot: Box::new(Cursor::new(blob)),
            }))
        })
        .await
    }
}
