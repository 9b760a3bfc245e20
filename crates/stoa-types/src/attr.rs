//! File attributes as meta stores them and clients see them.

use crate::InodeId;
use serde::{Deserialize, Serialize};

/// A point in time as seconds and nanoseconds since the Unix epoch. The state machine
/// never reads a clock: every mutation carries the time its proposer stamped on it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Timestamp {
    pub secs: i64,
    pub nanos: u32,
}

impl Timestamp {
    /// The wall clock now; only shells (servers, clients) call this.
    pub fn now() -> Timestamp {
        let d =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() }
    }

    /// Milliseconds since the Unix epoch (0 for times before it).
    pub fn as_millis(self) -> u64 {
        u64::try_from(self.secs).map_or(0, |s| s * 1000 + u64::from(self.nanos / 1_000_000))
    }
}

/// What kind of object an inode is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl FileKind {
    /// The `S_IF*` bits of this kind, as in `st_mode`.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileKind::File => libc::S_IFREG,
            FileKind::Dir => libc::S_IFDIR,
            FileKind::Symlink => libc::S_IFLNK,
            FileKind::Fifo => libc::S_IFIFO,
            FileKind::Socket => libc::S_IFSOCK,
            FileKind::CharDevice => libc::S_IFCHR,
            FileKind::BlockDevice => libc::S_IFBLK,
        }
    }

    /// The kind named by the `S_IF*` bits of a full `st_mode`.
    pub fn from_mode(mode: u32) -> Option<FileKind> {
        Some(match mode & libc::S_IFMT {
            m if m == libc::S_IFREG => FileKind::File,
            m if m == libc::S_IFDIR => FileKind::Dir,
            m if m == libc::S_IFLNK => FileKind::Symlink,
            m if m == libc::S_IFIFO => FileKind::Fifo,
            m if m == libc::S_IFSOCK => FileKind::Socket,
            m if m == libc::S_IFCHR => FileKind::CharDevice,
            m if m == libc::S_IFBLK => FileKind::BlockDevice,
            _ => return None,
        })
    }
}

/// The attributes of one inode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attr {
    pub ino: InodeId,
    pub kind: FileKind,
    /// Permission bits only (`0o7777`); the kind is in `kind`.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub nlink: u32,
    pub rdev: u32,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
    /// Bumped on every change to the inode; lets caches tell old from new.
    pub version: u64,
}

impl Attr {
    /// The permission bits and group of an inode of `kind` made in this directory, asked
    /// for with `perm` by a caller in group `gid`. In a directory with the set-group-ID
    /// bit, everything made takes the directory's group, and a directory the bit too, as
    /// on Linux (the kernel has already dropped the bit from `perm` for a caller outside
    /// the group). Giving the same answer again for its own output, it is the same rule
    /// for a mount that makes an inode itself and for meta applying that create.
    pub fn inherited(&self, kind: FileKind, perm: u32, gid: u32) -> (u32, u32) {
        let setgid = libc::S_ISGID;
        if self.perm & setgid == 0 {
            return (perm, gid);
        }
        (if kind == FileKind::Dir { perm | setgid } else { perm }, self.gid)
    }
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub ino: InodeId,
    pub kind: FileKind,
}

/// How a setattr sets a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetTime {
    /// The time the mutation was proposed.
    Now,
    At(Timestamp),
}

/// The fields a setattr changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetAttr {
    pub perm: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
}

impl SetAttr {
    /// Applies everything but the size to `attr`, at time `now` (the change time, and
    /// what [`SetTime::Now`] means): meta's setattr, and a client's record of a change
    /// it sends in a batch, are the same change. The version is the caller's.
    pub fn apply(&self, attr: &mut Attr, now: Timestamp) {
        if let Some(perm) = self.perm {
            attr.perm = perm & 0o7777;
        }
        attr.uid = self.uid.unwrap_or(attr.uid);
        attr.gid = self.gid.unwrap_or(attr.gid);
        let time = |t: SetTime| match t {
            SetTime::Now => now,
            SetTime::At(t) => t,
        };
        attr.atime = self.atime.map_or(attr.atime, time);
        attr.mtime = self.mtime.map_or(attr.mtime, time);
        attr.ctime = now;
    }
}

/// Filesystem-wide usage, as `statfs` reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatFs {
    /// Usable bytes, after replication (raw capacity divided by the replica count).
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub files: u64,
}
