//! One module per operation family, and the two dispatchers: [`mutate`] for operations
//! that go through the log and [`query`] for reads.
//!
//! Every operation here runs inside a [`Txn`](crate::txn::Txn), so it may write as it
//! goes and return an error half way: the caller drops its writes.

pub(crate) mod batch;
pub(crate) mod chains;
pub(crate) mod cluster;
pub(crate) mod create;
pub(crate) mod dead;
pub(crate) mod link;
pub(crate) mod locks;
pub(crate) mod lookup;
pub(crate) mod readdir;
pub(crate) mod rename;
pub(crate) mod session;
pub(crate) mod setattr;
pub(crate) mod unlink;
pub(crate) mod xattr;

use crate::kv::{KvRead, KvWrite};
use crate::store::{load_dir, save_inode};
use stoa_proto::{MetaOp, MetaResponse};
use stoa_types::{FileKind, FsError, InodeId, SessionId, Timestamp};

/// Applies one mutation of `session`, stamped `now`.
pub(crate) fn mutate(
    kv: &mut impl KvWrite,
    session: SessionId,
    op: &MetaOp,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    match op {
        MetaOp::Open { ino } => session::open_file(kv, session, *ino),
        MetaOp::Release { ino } => session::release(kv, session, *ino, now),
        MetaOp::SetAttr { ino, set } => setattr::setattr(kv, *ino, set, now),
        MetaOp::CommitWrite { ino, size } => setattr::commit_write(kv, *ino, *size, now),
        MetaOp::CommitWrites { commits } => setattr::commit_writes(kv, commits),
        MetaOp::Create { parent, name, kind, perm, uid, gid, rdev } => {
            let new =
                create::NewNode { kind: *kind, perm: *perm, uid: *uid, gid: *gid, rdev: *rdev };
            create::create(kv, *parent, name, new, now)
        }
        MetaOp::CreateOpen { parent, name, perm, uid, gid } => {
            let new = create::NewNode {
                kind: FileKind::File,
                perm: *perm,
                uid: *uid,
                gid: *gid,
                rdev: 0,
            };
            create::create_open(kv, session, *parent, name, new, now)
        }
        MetaOp::Mkdir { parent, name, perm, uid, gid } => {
            let new =
                create::NewNode { kind: FileKind::Dir, perm: *perm, uid: *uid, gid: *gid, rdev: 0 };
            create::mkdir(kv, *parent, name, new, now)
        }
        MetaOp::Symlink { parent, name, target, uid, gid } => {
            let new = create::NewNode {
                kind: FileKind::Symlink,
                perm: 0o777,
                uid: *uid,
                gid: *gid,
                rdev: 0,
            };
            create::symlink(kv, *parent, name, target, new, now)
        }
        MetaOp::Unlink { parent, name, .. } => unlink::unlink(kv, *parent, name, now),
        MetaOp::Rmdir { parent, name } => unlink::rmdir(kv, *parent, name, now),
        MetaOp::Purge { ino } => unlink::purge(kv, *ino),
        MetaOp::Rename { parent, name, new_parent, new_name, flags } => {
            let from = Place { parent: *parent, name };
            let to = Place { parent: *new_parent, name: new_name };
            rename::rename(kv, from, to, *flags, now)
        }
        MetaOp::Link { ino, new_parent, new_name } => {
            link::link(kv, *ino, *new_parent, new_name, now)
        }
        MetaOp::SetXattr { ino, name, value, flags } => {
            xattr::set(kv, *ino, name, value, *flags, now)
        }
        MetaOp::RemoveXattr { ino, name } => xattr::remove(kv, *ino, name, now),
        MetaOp::OpenSession { client } => session::open(kv, client, now),
        MetaOp::SetLock { ino, lock } => locks::set(kv, *ino, lock, false),
        MetaOp::LockAndDelegate { ino, lock } => locks::set(kv, *ino, lock, true),
        MetaOp::ReturnLocks { ino, locks } => locks::give_back(kv, *ino, session, locks),
        MetaOp::AllocInodes { count } => batch::alloc_inodes(kv, session, *count),
        MetaOp::Batch { ops } => batch::batch(kv, session, ops, now),
        MetaOp::RegisterChunkServer { node, cluster, addr, zone, capacity_bytes, used_bytes } => {
            let reg = chains::Registration {
                node: *node,
                cluster: *cluster,
                addr: *addr,
                zone,
                capacity_bytes: *capacity_bytes,
                used_bytes: *used_bytes,
            };
            chains::register(kv, reg)
        }
        MetaOp::ChunkSynced { node, chain, chain_version } => {
            chains::synced(kv, *node, *chain, *chain_version)
        }
        // Reads that reach the log (a client may send one as a mutation by mistake) are
        // answered like reads: they change nothing, so applying them is harmless.
        other => query(kv, other),
    }
}

/// Answers one read.
pub(crate) fn query(kv: &impl KvRead, op: &MetaOp) -> Result<MetaResponse, FsError> {
    match op {
        MetaOp::Lookup { parent, name } => lookup::lookup(kv, *parent, name),
        MetaOp::GetAttr { ino } => lookup::getattr(kv, *ino),
        MetaOp::ReadLink { ino } => lookup::readlink(kv, *ino),
        MetaOp::StatFs => lookup::statfs(kv),
        MetaOp::ReadDir { ino, after, limit } => readdir::readdir(kv, *ino, after, *limit),
        MetaOp::GetXattr { ino, name } => xattr::get(kv, *ino, name),
        MetaOp::ListXattr { ino } => xattr::list(kv, *ino),
        MetaOp::GetLock { ino, lock } => locks::get(kv, *ino, lock),
        MetaOp::GetChainTable => Ok(MetaResponse::ChainTable(crate::store::load_chains(kv)?)),
        MetaOp::DeadInodes { inos } => dead::dead_inodes(kv, inos),
        other => Err(FsError::Invalid(format!(
            "{} is not answered by the namespace state machine",
            op_name(other)
        ))),
    }
}

/// The operation's name for messages, without its (possibly large) arguments.
fn op_name(op: &MetaOp) -> String {
    let text = format!("{op:?}");
    let end = text.find([' ', '{', '(']).unwrap_or(text.len());
    text[..end].to_string()
}

/// One name: a directory and an entry in it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Place<'a> {
    pub parent: InodeId,
    pub name: &'a [u8],
}

/// Records a change of directory `dir`'s contents: mtime and ctime become `now`, and its
/// link count moves by `subdirs` (a subdirectory's `..` links to its parent).
pub(crate) fn touch_dir(
    kv: &mut impl KvWrite,
    dir: InodeId,
    subdirs: i32,
    now: Timestamp,
) -> Result<(), FsError> {
    let mut rec = load_dir(kv, dir)?;
    rec.attr.nlink =
        rec.attr.nlink.checked_add_signed(subdirs).ok_or_else(|| match subdirs > 0 {
            true => FsError::TooManyLinks,
            false => FsError::Io(format!("directory {dir} has a link count below zero")),
        })?;
    rec.attr.mtime = now;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)
}

/// Checks a directory-entry name and hands it back for chaining.
pub(crate) fn valid_name(name: &[u8]) -> Result<&[u8], FsError> {
    stoa_types::validate_name(name)?;
    Ok(name)
}
