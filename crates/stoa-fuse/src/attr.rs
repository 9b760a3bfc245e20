//! Conversions between Stoa's attribute types and fuser's.

use fuser::{FileAttr, FileType, INodeNo, TimeOrNow};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use stoa_types::{Attr, FileKind, FsError, SetTime, Timestamp};

/// Block size reported by stat; also the unit of `st_blocks` accounting.
pub const BLOCK_SIZE_BYTES: u32 = 4096;

pub fn file_type(kind: FileKind) -> FileType {
    match kind {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDevice => FileType::CharDevice,
        FileKind::BlockDevice => FileType::BlockDevice,
    }
}

pub fn system_time(t: Timestamp) -> SystemTime {
    let nanos = Duration::from_nanos(u64::from(t.nanos));
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::from_secs(t.secs as u64) + nanos
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs()) + nanos
    }
}

pub fn timestamp(t: SystemTime) -> Timestamp {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timestamp { secs: d.as_secs() as i64, nanos: d.subsec_nanos() },
        Err(e) => {
            // Before the epoch: whole seconds down, nanoseconds up.
            let d = e.duration();
            let (mut secs, mut nanos) = (-(d.as_secs() as i64), d.subsec_nanos());
            if nanos > 0 {
                secs -= 1;
                nanos = 1_000_000_000 - nanos;
            }
            Timestamp { secs, nanos }
        }
    }
}

pub fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::Now => SetTime::Now,
        TimeOrNow::SpecificTime(t) => SetTime::At(timestamp(t)),
    }
}

/// `a` as the attributes of the kernel's node `node` (its inode number, or an alias).
pub fn file_attr(a: &Attr, node: u64) -> FileAttr {
    tracing::trace!(
        ino = a.ino.0,
        node,
        version = a.version,
        size = a.size,
        nlink = a.nlink,
        "attributes to the kernel"
    );
    // Meta keeps no size for a directory. A live one reports one block, as a small
    // directory on ext4 does, so `du` of a tree copied in matches the local one; a
    // removed one reports 0, as there.
    let size =
        if a.kind == FileKind::Dir && a.nlink > 0 { BLOCK_SIZE_BYTES.into() } else { a.size };
    FileAttr {
        ino: INodeNo(node),
        size,
        blocks: size.div_ceil(512),
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.ctime),
        kind: file_type(a.kind),
        perm: (a.perm & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

/// The attributes of a lookup's answer that no such name exists: node 0, which the
/// kernel caches as a negative entry for the TTL it comes with.
pub fn missing_attr() -> FileAttr {
    let never = UNIX_EPOCH;
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: never,
        mtime: never,
        ctime: never,
        crtime: never,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: BLOCK_SIZE_BYTES,
        flags: 0,
    }
}

pub fn errno(e: &FsError) -> fuser::Errno {
    fuser::Errno::from_i32(e.errno())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_on_both_sides_of_the_epoch() {
        for t in [
            Timestamp { secs: 1_700_000_000, nanos: 123 },
            Timestamp { secs: 0, nanos: 0 },
            Timestamp { secs: -5, nanos: 250_000_000 },
        ] {
            assert_eq!(timestamp(system_time(t)), t);
        }
    }

    #[test]
    fn errors_map_to_their_errno() {
        assert_eq!(errno(&FsError::NotFound).code(), libc::ENOENT);
        assert_eq!(errno(&FsError::Busy).code(), libc::EIO);
    }
}
