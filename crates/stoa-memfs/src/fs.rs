//! The FUSE side: each request answered at once from the tree, on the fuser thread that
//! read it. Several mounts may serve one tree (two "clients" of one filesystem).

use crate::tree::{Owner, Res, Tree};
use fuser::{
    Errno, FileHandle, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};
use stoa_fuse::attr::{file_attr, file_type, set_time, BLOCK_SIZE_BYTES};
use stoa_types::{FileKind, SetAttr};

/// How long the kernel may keep names and attributes. No invalidation is sent, so a
/// change made through one mount shows on the other only once this has passed: the
/// benchmark's two clients each work on files of their own.
const TTL: Duration = Duration::from_secs(1);
/// The same sizes as Stoa's mount asks for, so that the two differ only in the work done.
const MAX_WRITE_BYTES: u32 = 1 << 20;
const MAX_READAHEAD_BYTES: u32 = 4 << 20;

pub struct MemFs {
    tree: Arc<Mutex<Tree>>,
}

impl MemFs {
    pub fn new(tree: Arc<Mutex<Tree>>) -> MemFs {
        MemFs { tree }
    }

    fn tree(&self) -> MutexGuard<'_, Tree> {
        // A panic under the lock is a bug in this program: stop.
        self.tree.lock().expect("memfs tree lock poisoned")
    }
}

fn errno(e: i32) -> Errno {
    Errno::from_i32(e)
}

fn owner(req: &Request) -> Owner {
    Owner { uid: req.uid(), gid: req.gid() }
}

fn reply_entry(reply: ReplyEntry, tree: &Tree, ino: Res<u64>) {
    match ino.and_then(|ino| Ok((ino, tree.get(ino)?))) {
        Ok((ino, i)) => reply.entry(&TTL, &file_attr(&i.attr(), ino), Generation(0)),
        Err(e) => reply.error(errno(e)),
    }
}

fn reply_empty(reply: ReplyEmpty, r: Res<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

impl Filesystem for MemFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD_BYTES) {
            let _ = config.set_max_readahead(max);
        }
        let _ =
            config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_ASYNC_DIO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let tree = self.tree();
        let found = tree.lookup(parent.0, name.as_bytes());
        reply_entry(reply, &tree, found);
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.tree().get(i.0) {
            Ok(n) => reply.attr(&TTL, &file_attr(&n.attr(), i.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        i: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let change = SetAttr {
            perm: mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        match self.tree().set(i.0, &change) {
            Ok(n) => reply.attr(&TTL, &file_attr(&n.attr(), i.0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        match self.tree().get(i.0) {
            Ok(n) if n.kind() == FileKind::Symlink => reply.data(&n.data),
            Ok(_) => reply.error(Errno::EINVAL),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let perm = mode & !umask & 0o7777;
        let mut tree = self.tree();
        let made = tree.make(parent.0, name.as_bytes(), FileKind::Dir, perm, owner(req));
        reply_entry(reply, &tree, made);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().remove(parent.0, name.as_bytes(), false));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(reply, self.tree().remove(parent.0, name.as_bytes(), true));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut tree = self.tree();
        let made = tree.make(parent.0, link_name.as_bytes(), FileKind::Symlink, 0o777, owner(req));
        let made = made.and_then(|ino| {
            tree.write(ino, 0, target.as_os_str().as_bytes())?;
            Ok(ino)
        });
        reply_entry(reply, &tree, made);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !(flags - RenameFlags::RENAME_NOREPLACE).is_empty() {
            return reply.error(Errno::EINVAL);
        }
        let noreplace = flags.contains(RenameFlags::RENAME_NOREPLACE);
        let r = self.tree().rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            noreplace,
        );
        reply_empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let mut tree = self.tree();
        let linked = tree.link(i.0, newparent.0, newname.as_bytes()).map(|()| i.0);
        reply_entry(reply, &tree, linked);
    }

    fn open(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.tree().open(i.0) {
            Ok(()) => reply.opened(FileHandle(i.0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.tree().read(i.0, offset, size) {
            Ok(data) => reply.data(data),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.tree().write(i.0, offset, data) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.tree().release(i.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.tree().get(i.0) {
            Ok(n) if n.kind() == FileKind::Dir => {
                reply.opened(FileHandle(i.0), FopenFlags::empty())
            }
            Ok(_) => reply.error(Errno::ENOTDIR),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let from = usize::try_from(offset).unwrap_or(usize::MAX);
        match self.tree().list(i.0, from) {
            Ok(entries) => {
                for e in entries {
                    let (ino, kind) = (INodeNo(e.ino), file_type(e.kind));
                    if reply.add(ino, e.next as u64, kind, OsStr::from_bytes(&e.name)) {
                        break;
                    }
                }
                reply.ok();
            }
            Err(e) => reply.error(errno(e)),
        }
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if mode != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let mut tree = self.tree();
        let r = tree.get(i.0).map(|n| n.attr().size).and_then(|size| {
            let end = offset.checked_add(length).ok_or(libc::EFBIG)?;
            if end > size {
                tree.set(i.0, &SetAttr { size: Some(end), ..SetAttr::default() })?;
            }
            Ok(())
        });
        reply_empty(reply, r);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.tree().files();
        let blocks = 1 << 30;
        reply.statfs(
            blocks,
            blocks,
            blocks,
            files,
            u64::from(u32::MAX),
            BLOCK_SIZE_BYTES,
            255,
            BLOCK_SIZE_BYTES,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let perm = mode & !umask & 0o7777;
        let mut tree = self.tree();
        let made = match tree.make(parent.0, name.as_bytes(), FileKind::File, perm, owner(req)) {
            // O_CREAT without O_EXCL on a name that exists: the kernel sends CREATE when
            // its cache had no entry, and the file is opened as it is.
            Err(libc::EEXIST) if flags & libc::O_EXCL == 0 => {
                tree.lookup(parent.0, name.as_bytes())
            }
            made => made,
        };
        let made = made.and_then(|ino| {
            if tree.get(ino)?.kind() == FileKind::Dir {
                return Err(libc::EISDIR);
            }
            tree.open(ino)?;
            if flags & libc::O_TRUNC != 0 {
                tree.set(ino, &SetAttr { size: Some(0), ..SetAttr::default() })?;
            }
            Ok((ino, file_attr(&tree.get(ino)?.attr(), ino)))
        });
        match made {
            Ok((ino, a)) => {
                reply.created(&TTL, &a, Generation(0), FileHandle(ino), FopenFlags::empty())
            }
            Err(e) => reply.error(errno(e)),
        }
    }
}
