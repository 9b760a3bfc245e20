//! Init: the cluster's birth. It fixes the cluster id, chunk size and replica count, and
//! makes the root directory and the id counters.

use crate::kv::KvWrite;
use crate::store::{self, put_cluster, save_inode, set_counter, ClusterInfo, Counter, InodeRec};
use stoa_proto::MetaResponse;
use stoa_types::{Attr, ClusterId, FileKind, FsError, InodeId, Timestamp};

/// Chunk-server ids start here: meta replicas use 1..=99 of the same id space.
pub const FIRST_CHUNK_SERVER_ID: u64 = 100;

/// Creates the cluster. Refused with `Exists` once it exists: two leaders in a row may
/// both propose `Init`, and only the first one counts.
pub(crate) fn init(
    kv: &mut impl KvWrite,
    cluster: ClusterId,
    chunk_size_bytes: u32,
    replicas: u8,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if store::find_cluster(kv)?.is_some() {
        return Err(FsError::Exists);
    }
    if replicas == 0 || chunk_size_bytes == 0 {
        return Err(FsError::Invalid(format!(
            "cannot create a cluster with {replicas} replicas of {chunk_size_bytes}-byte chunks"
        )));
    }
    put_cluster(kv, &ClusterInfo { cluster, chunk_size_bytes, replicas, created: now })?;
    let root = Attr {
        ino: InodeId::ROOT,
        kind: FileKind::Dir,
        perm: 0o755,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: 2,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        version: 0,
    };
    save_inode(kv, &mut InodeRec { attr: root, parent: InodeId::ROOT })?;
    set_counter(kv, Counter::NextInode, InodeId::ROOT.0 + 1)?;
    set_counter(kv, Counter::NextSession, 1)?;
    set_counter(kv, Counter::NextNode, FIRST_CHUNK_SERVER_ID)?;
    set_counter(kv, Counter::Files, 1)?;
    Ok(MetaResponse::Done)
}
