//! Namespace operations by inode: thin calls to meta, plus what the client's own state
//! adds (sizes of files it is writing, the open flag of unlink, truncating chunk data).

use crate::client::Client;
use crate::dirops::NewInode;
use crate::session::unexpected;
use stoa_proto::{CapMode, MetaOp, MetaResponse};
use stoa_types::{
    validate_name, validate_xattr_name, Attr, DirEntry, FileKind, FsError, InodeId, SetAttr, StatFs,
};

/// Who creates an object and with which permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
}

impl Client {
    /// Looks `name` up in `parent`: from the cache under caps, else from meta (which
    /// grants caps). See [`Client::lookup_cached`] for the kernel's TTL.
    pub async fn lookup(&self, parent: InodeId, name: &[u8]) -> Result<Attr, FsError> {
        Ok(self.lookup_cached(parent, name).await?.0)
    }

    pub async fn getattr(&self, ino: InodeId) -> Result<Attr, FsError> {
        Ok(self.getattr_cached(ino).await?.0)
    }

    /// Before a write by a caller without `CAP_FSETID` (the kernel's
    /// `FUSE_WRITE_KILL_SUIDGID`): drops the set-user-ID bit of the file, and its
    /// set-group-ID bit if it is group-executable, as a local filesystem does on such a
    /// write. The kernel does it itself only for writes through its page cache; those
    /// the mount takes directly are left to it. Under a cap the mode is known here, and a
    /// file without those bits costs nothing more.
    pub async fn drop_setid(&self, ino: InodeId) -> Result<(), FsError> {
        let attr = match self.sh.caps.cached_attr(ino) {
            Some((attr, _)) => attr,
            None => self.getattr(ino).await?,
        };
        let mut perm = attr.perm & !libc::S_ISUID;
        if perm & (libc::S_ISGID | libc::S_IXGRP) == libc::S_ISGID | libc::S_IXGRP {
            perm &= !libc::S_ISGID;
        }
        if perm != attr.perm {
            self.setattr(ino, SetAttr { perm: Some(perm), ..SetAttr::default() }).await?;
        }
        Ok(())
    }

    /// Changes attributes. A size change cuts or extends the data first; any change waits
    /// for this client's pending writes, whose commits would otherwise overwrite a newly
    /// set mtime or size. A mode or owner change of an inode this client holds
    /// exclusively is made here and sent in a batch (a size commit does not touch them,
    /// and never sets the change time back).
    pub async fn setattr(&self, ino: InodeId, set: SetAttr) -> Result<Attr, FsError> {
        // A file held exclusively keeps its attributes here; truncated to the size it
        // has (`O_TRUNC` of an empty file), it has nothing cut, and the change is one
        // of its times, made here (meta's `SetAttr` leaves the mtime of such a truncate
        // as `SetAttr::apply` does).
        let owned = self.sh.caps.owns(ino);
        let same_size = |attr: &Attr| {
            attr.kind == FileKind::File && Some(self.adjust(attr.clone()).size) == set.size
        };
        if set.size.is_none() || owned.as_ref().is_some_and(same_size) {
            let set = SetAttr { size: None, ..set.clone() };
            if let Some(attr) = self.setattr_here(ino, &set).await {
                return Ok(self.adjust(attr));
            }
        }
        let sent = self.sh.caps.epoch();
        let attr = if set.size.is_some() {
            let old = match owned {
                Some(attr) => attr,
                None => self.sh.session.call_attr(MetaOp::GetAttr { ino }).await?,
            };
            if old.kind != FileKind::File {
                return Err(if old.kind == FileKind::Dir {
                    FsError::IsDir
                } else {
                    FsError::Invalid("truncate of a special file".into())
                });
            }
            // Other clients' buffered writes land first, and their cached pages go. The
            // size their commits left is in the grant: what was written up to it is cut.
            let _access = self.access(ino, CapMode::Exclusive).await?;
            let granted = self.sh.caps.owns(ino).map_or(0, |attr| attr.size);
            let claim = self.sh.files.claim(ino);
            let result = claim.file.truncate(&self.sh, set, old.size.max(granted)).await;
            drop(claim);
            result?
        } else {
            if let Some(file) = self.sh.files.get(ino) {
                file.flush_unowned(&self.sh).await?;
                drop(file);
                // Its writes out and committed, the change may be made here after all.
                if let Some(attr) = self.setattr_here(ino, &set).await {
                    return Ok(self.adjust(attr));
                }
            }
            self.sh.session.call_attr(MetaOp::SetAttr { ino, set }).await?
        };
        self.sh.caps.update_attr(attr.clone(), sent);
        Ok(self.adjust(attr))
    }

    /// Creates a regular file, device, FIFO or socket (`mknod`, and `create` before
    /// [`Client::open`]).
    pub async fn create(
        &self,
        parent: InodeId,
        name: &[u8],
        kind: FileKind,
        perm: u32,
        owner: Owner,
        rdev: u32,
    ) -> Result<Attr, FsError> {
        validate_name(name)?;
        let new = NewInode { kind, perm, owner, rdev, target: &[], open: false };
        if kind != FileKind::Dir {
            if let Some(made) = self.create_here(parent, name, new).await {
                return made.map(|(attr, _)| attr);
            }
        }
        let op = MetaOp::Create {
            parent,
            name: name.to_vec(),
            kind,
            perm,
            uid: owner.uid,
            gid: owner.gid,
            rdev,
        };
        let attr = self.sh.session.call_attr(op).await;
        self.sh.caps.forget(&[parent], &[]);
        attr
    }

    pub async fn mkdir(
        &self,
        parent: InodeId,
        name: &[u8],
        perm: u32,
        owner: Owner,
    ) -> Result<Attr, FsError> {
        validate_name(name)?;
        let new = NewInode { kind: FileKind::Dir, perm, owner, rdev: 0, target: &[], open: false };
        if let Some(made) = self.create_here(parent, name, new).await {
            return made.map(|(attr, _)| attr);
        }
        let op =
            MetaOp::Mkdir { parent, name: name.to_vec(), perm, uid: owner.uid, gid: owner.gid };
        let attr = self.sh.session.call_attr(op).await;
        self.sh.caps.forget(&[parent], &[]);
        attr
    }

    pub async fn symlink(
        &self,
        parent: InodeId,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<Attr, FsError> {
        validate_name(name)?;
        if target.is_empty() || target.len() > stoa_types::PATH_LEN_MAX {
            return Err(FsError::Invalid("bad symlink target length".into()));
        }
        let new =
            NewInode { kind: FileKind::Symlink, perm: 0o777, owner, rdev: 0, target, open: false };
        if let Some(made) = self.create_here(parent, name, new).await {
            return made.map(|(attr, _)| attr);
        }
        let op = MetaOp::Symlink {
            parent,
            name: name.to_vec(),
            target: target.to_vec(),
            uid: owner.uid,
            gid: owner.gid,
        };
        let attr = self.sh.session.call_attr(op).await;
        self.sh.caps.forget(&[parent], &[]);
        attr
    }

    pub async fn readlink(&self, ino: InodeId) -> Result<Vec<u8>, FsError> {
        match self.sh.session.call(MetaOp::ReadLink { ino }).await? {
            MetaResponse::Data(target) => Ok(target),
            other => Err(unexpected("ReadLink", &other)),
        }
    }

    /// Removes a name. Meta knows who has the file open (every client tells it), so a
    /// file someone still has open stays as an orphan until its last release anywhere.
    pub async fn unlink(&self, parent: InodeId, name: &[u8]) -> Result<(), FsError> {
        if let Some(removed) = self.remove_here(parent, name, false).await {
            return removed;
        }
        let op = MetaOp::Unlink { parent, name: name.to_vec(), open: false };
        let done = self.sh.session.call_done(op).await;
        self.forget_names(&[parent], &[(parent, name)]);
        done
    }

    pub async fn rmdir(&self, parent: InodeId, name: &[u8]) -> Result<(), FsError> {
        if let Some(removed) = self.remove_here(parent, name, true).await {
            return removed;
        }
        let done = self.sh.session.call_done(MetaOp::Rmdir { parent, name: name.to_vec() }).await;
        self.forget_names(&[parent], &[(parent, name)]);
        done
    }

    /// Forgets what this client cached of `inodes`, of the names `names`, and of the
    /// inodes those names led to: this client just changed them (other clients' caches
    /// are recalled by meta). A name looked up while its directory was held by nobody
    /// is not cached, but the inode found there is known
    /// ([`crate::caps::Caps::reached_by`]).
    fn forget_names(&self, inodes: &[InodeId], names: &[(InodeId, &[u8])]) {
        let mut all = inodes.to_vec();
        let mut unknown = false;
        for (parent, name) in names {
            match self.sh.caps.cached_name(*parent, name) {
                Some(child) => all.push(child),
                None => {
                    unknown = true;
                    all.extend(self.sh.caps.reached_by(*parent, name));
                }
            }
        }
        if unknown {
            self.sh.caps.forget_linked();
        }
        self.sh.caps.forget(&all, names);
    }

    /// Renames `parent/name` to `new_parent/new_name`; `flags` are `renameat2` flags.
    pub async fn rename(
        &self,
        parent: InodeId,
        name: &[u8],
        new_parent: InodeId,
        new_name: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        validate_name(new_name)?;
        if let Some(renamed) = self.rename_here((parent, name), (new_parent, new_name), flags).await
        {
            return renamed;
        }
        let op = MetaOp::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            flags,
        };
        let done = self.sh.session.call_done(op).await;
        let (from, to) = ((parent, name), (new_parent, new_name));
        let cached = (
            self.sh.caps.cached_name(parent, name),
            self.sh.caps.cached_name(new_parent, new_name),
        );
        self.forget_names(&[parent, new_parent], &[from, to]);
        if done.is_ok() {
            if let Some(ino) = cached.0 {
                self.entry_moved(to, ino);
            }
            if let Some(ino) = cached.1.filter(|_| flags & libc::RENAME_EXCHANGE != 0) {
                self.entry_moved(from, ino);
            }
        }
        done
    }

    pub async fn link(
        &self,
        ino: InodeId,
        new_parent: InodeId,
        new_name: &[u8],
    ) -> Result<Attr, FsError> {
        validate_name(new_name)?;
        if let Some(linked) = self.link_here(ino, new_parent, new_name).await {
            return linked;
        }
        let op = MetaOp::Link { ino, new_parent, new_name: new_name.to_vec() };
        let attr = self.sh.session.call_attr(op).await;
        // A size commit meta applied after the link can be answered first: the kernel
        // must not get the size from before it (the reply has no TTL, but a page fault
        // of a mapping would meet that size meanwhile). The forget drops it from the
        // cache, so the cache is asked before.
        let seen = attr.as_ref().is_ok_and(|a| self.sh.caps.knows_newer(a));
        self.sh.caps.forget(&[ino, new_parent], &[]);
        self.newest(attr?, seen).await
    }

    /// Lists up to `limit` entries of directory `ino` in name order, after the name
    /// `after` (empty: from the start). The flag says whether more follow.
    pub async fn readdir(
        &self,
        ino: InodeId,
        after: &[u8],
        limit: u32,
    ) -> Result<(Vec<DirEntry>, bool), FsError> {
        // Another client holding the directory exclusively may have changed it without
        // meta knowing yet: its cap is recalled (and its changes sent) first.
        let _access = self.access(ino, CapMode::Shared).await?;
        // Held exclusively with its listing: listed here, without asking meta or
        // waiting for this client's own changes to get there.
        if let Some(page) = self.sh.caps.list(ino, after, limit) {
            return Ok(page);
        }
        // Held shared: a page meta gave under this cap, if kept.
        if let Some(page) = self.sh.caps.kept_page(ino, after, limit) {
            self.note_listed(ino, &page.0);
            return Ok(page);
        }
        let ticket = self.sh.caps.page_ticket(ino);
        let op = MetaOp::ReadDir { ino, after: after.to_vec(), limit };
        let page = match self.sh.session.call(op).await? {
            MetaResponse::Entries { entries, more } => (entries, more),
            other => return Err(unexpected("ReadDir", &other)),
        };
        if let Some(ticket) = ticket {
            self.sh.caps.keep_page(ino, ticket, (after, limit), &page);
        }
        self.note_listed(ino, &page.0);
        Ok(page)
    }

    /// The value of xattr `name` of `ino`: from the xattrs a grant brought while the cap
    /// is held, else from meta.
    pub async fn getxattr(&self, ino: InodeId, name: &[u8]) -> Result<Vec<u8>, FsError> {
        if let Some(xattrs) = self.sh.caps.cached_xattrs(ino) {
            validate_xattr_name(name)?;
            let found = xattrs.into_iter().find(|(n, _)| n == name);
            return found.map(|(_, value)| value).ok_or(FsError::NoAttr);
        }
        match self.sh.session.call(MetaOp::GetXattr { ino, name: name.to_vec() }).await? {
            MetaResponse::Data(value) => Ok(value),
            other => Err(unexpected("GetXattr", &other)),
        }
    }

    /// The names of the xattrs of `ino`, as [`Client::getxattr`] finds them.
    pub async fn listxattr(&self, ino: InodeId) -> Result<Vec<Vec<u8>>, FsError> {
        if let Some(xattrs) = self.sh.caps.cached_xattrs(ino) {
            return Ok(xattrs.into_iter().map(|(name, _)| name).collect());
        }
        match self.sh.session.call(MetaOp::ListXattr { ino }).await? {
            MetaResponse::Names(names) => Ok(names),
            other => Err(unexpected("ListXattr", &other)),
        }
    }

    /// Sets an xattr; `flags` are `XATTR_CREATE` (1) or `XATTR_REPLACE` (2).
    pub async fn setxattr(
        &self,
        ino: InodeId,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<(), FsError> {
        if value.len() > stoa_types::XATTR_VALUE_LEN_MAX {
            return Err(FsError::Range);
        }
        let op = MetaOp::SetXattr { ino, name: name.to_vec(), value: value.to_vec(), flags };
        let done = self.sh.session.call_done(op).await;
        self.sh.caps.forget(&[ino], &[]);
        done
    }

    pub async fn removexattr(&self, ino: InodeId, name: &[u8]) -> Result<(), FsError> {
        let done =
            self.sh.session.call_done(MetaOp::RemoveXattr { ino, name: name.to_vec() }).await;
        self.sh.caps.forget(&[ino], &[]);
        done
    }

    pub async fn statfs(&self) -> Result<StatFs, FsError> {
        match self.sh.session.call(MetaOp::StatFs).await? {
            MetaResponse::StatFs(stat) => Ok(stat),
            other => Err(unexpected("StatFs", &other)),
        }
    }
}
