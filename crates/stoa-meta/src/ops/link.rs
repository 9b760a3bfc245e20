//! Link: another name for an existing inode.

use super::{touch_dir, valid_name};
use crate::kv::KvWrite;
use crate::store::{find_dentry, load_dir, load_inode, put_dentry, save_inode, Dentry};
use stoa_proto::MetaResponse;
use stoa_types::{FileKind, FsError, InodeId, Timestamp};

pub(crate) fn link(
    kv: &mut impl KvWrite,
    ino: InodeId,
    parent: InodeId,
    name: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let mut rec = load_inode(kv, ino)?;
    if rec.attr.kind == FileKind::Dir {
        return Err(FsError::NotPermitted);
    }
    if rec.attr.nlink == 0 {
        // An orphan (unlinked but open) cannot be given a name again, as on Linux.
        return Err(FsError::NotFound);
    }
    load_dir(kv, parent)?;
    let name = valid_name(name)?;
    if find_dentry(kv, parent, name)?.is_some() {
        return Err(FsError::Exists);
    }
    rec.attr.nlink = rec.attr.nlink.checked_add(1).ok_or(FsError::TooManyLinks)?;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    put_dentry(kv, parent, name, Dentry { ino, kind: rec.attr.kind })?;
    touch_dir(kv, parent, 0, now)?;
    Ok(MetaResponse::Attr(rec.attr))
}

#[cfg(test)]
mod tests {
    use crate::testing::{Fs, ROOT};
    use stoa_proto::MetaOp;
    use stoa_types::{FsError, InodeId};

    fn link(fs: &mut Fs, ino: InodeId, parent: InodeId, name: &str) -> Result<u32, FsError> {
        let new_name = name.as_bytes().to_vec();
        fs.attr(MetaOp::Link { ino, new_parent: parent, new_name }).map(|a| a.nlink)
    }

    #[test]
    fn a_link_is_a_second_name_for_one_inode() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        let a = fs.create(ROOT, "a").unwrap();
        assert_eq!(link(&mut fs, a.ino, d.ino, "b"), Ok(2));
        let b = fs.lookup(d.ino, "b").unwrap();
        assert_eq!((b.ino, b.nlink, b.ctime), (a.ino, 2, fs.now()));
        assert_eq!(fs.getattr(d.ino).unwrap().mtime, fs.now());
        assert_eq!(link(&mut fs, a.ino, d.ino, "b"), Err(FsError::Exists));
        assert_eq!(link(&mut fs, d.ino, ROOT, "d2"), Err(FsError::NotPermitted));
        assert_eq!(link(&mut fs, InodeId(999), ROOT, "x"), Err(FsError::NotFound));
        assert_eq!(link(&mut fs, a.ino, a.ino, "x"), Err(FsError::NotDir));
        assert!(matches!(link(&mut fs, a.ino, ROOT, "."), Err(FsError::Invalid(_))));
    }
}
