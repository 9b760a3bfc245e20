//! Typed rows over the raw tables: keys, value encoding, and the records the operations
//! read and write.
//!
//! Every stored value is `format version u8 ++ bincode(record)`. A value with another
//! version, or one that does not decode, is refused with [`FsError::Io`] naming the table
//! and key: corrupt or newer data is a clear error, never a panic or a wrong answer.

use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use bincode::Options;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use stoa_types::{Attr, ChainTable, ClusterId, FileKind, FsError, InodeId, NodeId, Timestamp};

/// The format of every stored value. Bump it when a record changes shape, and teach
/// [`decode`] the old one.
pub const FORMAT_VERSION: u8 = 1;

/// Larger than any record we store (an xattr value is at most 64 KiB), so that a corrupt
/// length gives an error instead of a huge allocation.
const VALUE_LEN_MAX_BYTES: u64 = 16 << 20;

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(VALUE_LEN_MAX_BYTES).reject_trailing_bytes()
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, FsError> {
    let mut out = vec![FORMAT_VERSION];
    options()
        .serialize_into(&mut out, value)
        .map_err(|e| FsError::Io(format!("encode a meta record: {e}")))?;
    Ok(out)
}

pub(crate) fn decode<T: DeserializeOwned>(
    table: Table,
    key: &[u8],
    bytes: &[u8],
) -> Result<T, FsError> {
    let corrupt =
        |what: String| FsError::Io(format!("meta table {} key {}: {what}", table.name(), hex(key)));
    match bytes.split_first() {
        None => Err(corrupt("empty value".into())),
        Some((&FORMAT_VERSION, body)) => {
            options().deserialize(body).map_err(|e| corrupt(format!("undecodable value: {e}")))
        }
        Some((version, _)) => Err(corrupt(format!(
            "value format {version} is not supported (this build reads {FORMAT_VERSION})"
        ))),
    }
}

fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

/// The record under `key`, if any.
pub(crate) fn get<T: DeserializeOwned>(
    kv: &impl KvRead,
    table: Table,
    key: &[u8],
) -> Result<Option<T>, FsError> {
    kv.get(table, key)?.map(|bytes| decode(table, key, &bytes)).transpose()
}

pub(crate) fn put<T: Serialize>(
    kv: &mut impl KvWrite,
    table: Table,
    key: &[u8],
    value: &T,
) -> Result<(), FsError> {
    kv.put(table, key, &encode(value)?)
}

/// Deletes every row of `table` whose key starts with `prefix`, a page at a time so that
/// a large group of rows is never held at once.
pub(crate) fn delete_prefix(
    kv: &mut impl KvWrite,
    table: Table,
    prefix: &[u8],
) -> Result<(), FsError> {
    const PAGE: usize = 256;
    let end = prefix_end(prefix);
    loop {
        let rows = kv.scan(table, prefix, end.as_deref(), PAGE)?;
        for (key, _) in &rows {
            kv.delete(table, key)?;
        }
        if rows.len() < PAGE {
            return Ok(());
        }
    }
}

pub(crate) fn ino_key(ino: InodeId) -> [u8; 8] {
    ino.0.to_be_bytes()
}

/// `parent ++ name`: the entries of one directory are contiguous and in name order.
pub(crate) fn dentry_key(parent: InodeId, name: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + name.len());
    key.extend_from_slice(&parent.0.to_be_bytes());
    key.extend_from_slice(name);
    key
}

/// An inode as stored: its attributes and, for a directory, its one parent, which lets
/// rename refuse to move a directory into its own subtree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InodeRec {
    pub attr: Attr,
    /// The containing directory of a directory (the root is its own parent); unused for
    /// other kinds, which may have many names.
    pub parent: InodeId,
}

pub(crate) fn find_inode(kv: &impl KvRead, ino: InodeId) -> Result<Option<InodeRec>, FsError> {
    get(kv, Table::Inodes, &ino_key(ino))
}

pub(crate) fn load_inode(kv: &impl KvRead, ino: InodeId) -> Result<InodeRec, FsError> {
    find_inode(kv, ino)?.ok_or(FsError::NotFound)
}

/// Stores `rec` as a new version of the inode.
pub(crate) fn save_inode(kv: &mut impl KvWrite, rec: &mut InodeRec) -> Result<(), FsError> {
    rec.attr.version += 1;
    put(kv, Table::Inodes, &ino_key(rec.attr.ino), rec)
}

/// Loads a directory, refusing anything else with `NotDir`.
pub(crate) fn load_dir(kv: &impl KvRead, ino: InodeId) -> Result<InodeRec, FsError> {
    let rec = load_inode(kv, ino)?;
    if rec.attr.kind != FileKind::Dir {
        return Err(FsError::NotDir);
    }
    Ok(rec)
}

/// What a directory entry points at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Dentry {
    pub ino: InodeId,
    pub kind: FileKind,
}

pub(crate) fn find_dentry(
    kv: &impl KvRead,
    parent: InodeId,
    name: &[u8],
) -> Result<Option<Dentry>, FsError> {
    get(kv, Table::Dentries, &dentry_key(parent, name))
}

pub(crate) fn put_dentry(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
    dentry: Dentry,
) -> Result<(), FsError> {
    put(kv, Table::Dentries, &dentry_key(parent, name), &dentry)
}

pub(crate) fn delete_dentry(
    kv: &mut impl KvWrite,
    parent: InodeId,
    name: &[u8],
) -> Result<(), FsError> {
    kv.delete(Table::Dentries, &dentry_key(parent, name))
}

/// Whether directory `dir` has any entry.
pub(crate) fn dir_is_empty(kv: &impl KvRead, dir: InodeId) -> Result<bool, FsError> {
    let prefix = ino_key(dir);
    let end = prefix_end(&prefix);
    Ok(kv.scan(Table::Dentries, &prefix, end.as_deref(), 1)?.is_empty())
}

/// The counters, each one row of [`Table::Counters`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Counter {
    /// The next inode number to hand out.
    NextInode,
    /// The next session id to hand out.
    NextSession,
    /// The next chunk-server id to hand out.
    NextNode,
    /// How many inodes exist.
    Files,
}

impl Counter {
    fn key(self) -> &'static [u8] {
        match self {
            Counter::NextInode => b"next_inode",
            Counter::NextSession => b"next_session",
            Counter::NextNode => b"next_node",
            Counter::Files => b"files",
        }
    }
}

pub(crate) fn counter(kv: &impl KvRead, c: Counter) -> Result<u64, FsError> {
    Ok(get(kv, Table::Counters, c.key())?.unwrap_or(0))
}

pub(crate) fn set_counter(kv: &mut impl KvWrite, c: Counter, value: u64) -> Result<(), FsError> {
    put(kv, Table::Counters, c.key(), &value)
}

/// Hands out the counter's current value and advances it.
pub(crate) fn take_next(kv: &mut impl KvWrite, c: Counter) -> Result<u64, FsError> {
    let value = counter(kv, c)?;
    set_counter(kv, c, value + 1)?;
    Ok(value)
}

/// Adds `delta` (which may be negative) to the inode count.
pub(crate) fn count_files(kv: &mut impl KvWrite, delta: i64) -> Result<(), FsError> {
    let files = counter(kv, Counter::Files)?;
    set_counter(kv, Counter::Files, files.saturating_add_signed(delta))
}

/// What `Init` fixed for the life of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub cluster: ClusterId,
    pub chunk_size_bytes: u32,
    /// Chunk replica count: the length of every chain.
    pub replicas: u8,
    pub created: Timestamp,
}

const CLUSTER_KEY: &[u8] = b"info";

pub(crate) fn find_cluster(kv: &impl KvRead) -> Result<Option<ClusterInfo>, FsError> {
    get(kv, Table::Cluster, CLUSTER_KEY)
}

pub(crate) fn put_cluster(kv: &mut impl KvWrite, info: &ClusterInfo) -> Result<(), FsError> {
    put(kv, Table::Cluster, CLUSTER_KEY, info)
}

/// The cluster, or `Unavailable` before `Init` has run: clients retry until it has.
pub(crate) fn load_cluster(kv: &impl KvRead) -> Result<ClusterInfo, FsError> {
    find_cluster(kv)?.ok_or_else(|| FsError::Unavailable("cluster not created yet".into()))
}

/// A chunk server as it registered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkServerRecord {
    pub id: NodeId,
    pub addr: SocketAddr,
    pub zone: String,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

pub(crate) fn node_key(id: NodeId) -> [u8; 8] {
    id.0.to_be_bytes()
}

const CHAINS_KEY: &[u8] = b"table";

/// The chain table; an empty one at version 0 before any chunk server registered.
pub(crate) fn load_chains(kv: &impl KvRead) -> Result<ChainTable, FsError> {
    Ok(get(kv, Table::Chains, CHAINS_KEY)?.unwrap_or_default())
}

pub(crate) fn save_chains(kv: &mut impl KvWrite, table: &ChainTable) -> Result<(), FsError> {
    put(kv, Table::Chains, CHAINS_KEY, table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemKv;

    #[test]
    fn records_round_trip_and_corrupt_values_are_errors() {
        let mut kv = MemKv::new();
        put(&mut kv, Table::Counters, b"n", &7u64).unwrap();
        assert_eq!(get::<u64>(&kv, Table::Counters, b"n").unwrap(), Some(7));
        assert_eq!(get::<u64>(&kv, Table::Counters, b"missing").unwrap(), None);
        for bad in [&[][..], &[9, 7][..], &[FORMAT_VERSION][..], &[FORMAT_VERSION, 7, 0][..]] {
            kv.put(Table::Counters, b"n", bad).unwrap();
            let err = get::<u64>(&kv, Table::Counters, b"n").unwrap_err();
            assert!(matches!(&err, FsError::Io(m) if m.contains("counters")), "{err:?}");
        }
        kv.put(Table::Counters, b"n", &[9, 7]).unwrap();
        let err = get::<u64>(&kv, Table::Counters, b"n").unwrap_err();
        assert!(err.to_string().contains("format 9"), "{err}");
    }

    #[test]
    fn a_prefix_delete_removes_only_that_group() {
        let mut kv = MemKv::new();
        for ino in [1u64, 2, 3] {
            for i in 0..300u32 {
                let mut key = ino.to_be_bytes().to_vec();
                key.extend_from_slice(&i.to_be_bytes());
                kv.put(Table::Xattrs, &key, b"v").unwrap();
            }
        }
        delete_prefix(&mut kv, Table::Xattrs, &2u64.to_be_bytes()).unwrap();
        assert_eq!(kv.len(Table::Xattrs), 600);
    }
}
