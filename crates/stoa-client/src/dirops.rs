//! Namespace changes this client makes by itself (docs/flows/caps.md, "Namespace changes
//! made by the client"): in a directory it holds exclusively with its whole listing, it
//! answers creates, mkdirs, symlinks, unlinks and rmdirs at once and sends them to meta
//! in batches, so a process creating files does not wait for a Raft round per file.
//!
//! ```text
//!  create / mkdir / symlink in D --> exclusive cap on D with its listing?
//!        no --> TakeDir (unless refused lately) --> still no --> one meta call (as before)
//!        yes --> name free in the listing? --> reserved inode number --> record the
//!                change (listing, attributes, a cap on the new inode) --> queue --> answer
//!  link of file F as D/name --> F held exclusively with its attributes? --> D held
//!        with its listing (taken as for a create)? --> name free? --> record (listing,
//!        D's and F's attributes) --> queue --> answer; otherwise one meta call
//!  unlink / rmdir / rename in D --> TakeDir of D (and of the rename's target) unless
//!        the name is known to go to meta anyway --> the child is held exclusively and
//!        known whole? no: a file --> TakeFiles of it and the files listed after it
//!        (8, doubling per call up to 128); an rmdir's directory --> TakeDir of it if
//!        empty --> same
//!  opens and last closes of files held exclusively --> queue
//!
//!  size commits of files held exclusively (file.rs) --> commit queue --> CommitWrites,
//!  after the namespace changes queued before each (a new file's create comes first);
//!  nothing else waits for them but the file's own fsync, recall and close-then-forget;
//!  each answer (the attributes the commit left) goes to the file and its cap
//!
//!  sender: queue --> Batch (one log entry, each change alone) --> answers --> backlog done
//!  every other meta call waits for the backlog queued before it (session.rs), and a
//!  recall of D waits for it before the ack (caps.rs), so nobody sees D without them
//! ```
//!
//! A change meta refuses after this client answered it (it should not happen: the cap
//! makes this client the only one changing D), or one never sent because the caps it
//! was made under lapsed, is logged, drops the listing of D, fails every handle of a
//! file whose create was lost, and fails the next `fsync` of D (errseq-like).

use crate::caps::{send_released, Change};
use crate::client::{Client, Shared};
use crate::file::{AttrChange, DeferredAttr};
use crate::namespace::Owner;
use crate::session::{unexpected, Backlog};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_proto::{BatchOp, CapMode, Commit, MetaOp, MetaResponse, LOOKUP_MANY_MAX};
use stoa_types::{Attr, FileKind, FsError, InodeId, SessionId, SetAttr, Timestamp};

/// Directories remembered with a loss at most; past it, those already reported go.
const LOST_MAX: usize = 4096;
/// The largest directory taken with its listing.
const LISTING_LIMIT: u32 = 50_000;
/// How long after a refused `TakeDir` the directory is not asked for again.
const REFUSED_PAUSE: Duration = Duration::from_secs(1);
/// Inode numbers reserved at a time.
const RESERVATION: u32 = 4096;
/// Changes sent in one batch at most.
const BATCH_MAX: usize = 1024;
/// A batch shorter than this waits [`GATHER_WAIT`] for more changes first.
const GATHER_OPS: usize = 256;
const GATHER_WAIT: Duration = Duration::from_millis(5);
/// Directories remembered as refused at most; the memory is cleared past it.
const REFUSED_MAX: usize = 4096;
/// How many files a directory's first `TakeFiles` asks for.
const TAKE_FILES_FIRST: usize = 8;
/// How long a `TakeDir` may take, retries included. Meta answers it at once (it refuses
/// rather than waits, even in a new leader's grace period), so a slower answer means an
/// unreachable or frozen leader: the change goes to meta by itself instead, whose calls
/// fail over within seconds, rather than waiting out a long timeout first.
const TAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// The client's queue of changes and what it needs to make them.
#[derive(Default)]
pub(crate) struct DirOps {
    queue: Mutex<Queue>,
    /// Size commits, sent in batches of their own: a namespace change, a recall or
    /// another meta call never waits for them, only a call on the file itself does.
    commits: Mutex<Queue>,
    /// Counts the queued commits and those meta answered.
    pub commit_log: Backlog,
    /// The reserved inode numbers not used yet, and the session they belong to.
    inodes: tokio::sync::Mutex<(SessionId, Range<u64>)>,
    /// Directories meta would not give this client lately.
    refused: Mutex<HashMap<InodeId, Instant>>,
    /// How many files the next `TakeFiles` in a directory asks for.
    windows: Mutex<HashMap<InodeId, usize>>,
    /// Changes this client answered that meta never took.
    lost: Mutex<Lost>,
}

/// Answered changes that never reached meta (docs/flows/caps.md invariant 25), counted
/// like the kernel's errseq: an fsync of a directory reports its loss once to every
/// handle opened before it, and to the first fsync after it when none reported it.
#[derive(Default)]
struct Lost {
    /// Losses so far; a directory handle remembers the count at its open.
    count: u64,
    /// Per directory: the count at its last loss, and whether an fsync reported it.
    dirs: HashMap<InodeId, (u64, bool)>,
}

impl Lost {
    fn record(&mut self, dir: InodeId) {
        self.count += 1;
        if self.dirs.len() >= LOST_MAX {
            self.dirs.retain(|_, (_, reported)| !*reported);
        }
        self.dirs.insert(dir, (self.count, false));
    }

    /// Whether an fsync of `dir` through a handle that saw the losses up to `seen`
    /// reports one; the handle has seen it then.
    fn take(&mut self, dir: InodeId, seen: &mut u64) -> bool {
        let Some((at, reported)) = self.dirs.get_mut(&dir) else { return false };
        let report = *at > *seen || !*reported;
        *reported = true;
        *seen = (*seen).max(*at);
        report
    }
}

#[derive(Default)]
struct Queue {
    ops: Vec<Queued>,
    /// Whether a sender task runs.
    sending: bool,
}

impl Queue {
    /// The queued change numbered `number`, if it has not left yet. The queue is in
    /// number order: numbers are given under its lock.
    fn get(&mut self, number: u64) -> Option<&mut Queued> {
        let i = self.ops.binary_search_by_key(&number, |q| q.number).ok()?;
        Some(&mut self.ops[i])
    }

    /// Takes back change `number` if it has not left yet; whether it had not.
    fn cancel(&mut self, number: u64) -> bool {
        self.get(number).map(|q| q.cancelled = true).is_some()
    }

    /// Takes back the open that change `number` tells meta of (an `Open`, or the create
    /// of a file made open), if it has not left: the `Open` is not sent, and the create
    /// makes the file closed. Whether it had not left.
    fn take_back_open(&mut self, number: u64) -> bool {
        let Some(queued) = self.get(number) else { return false };
        match &mut queued.op {
            Op::Change(BatchOp::Open { .. }) => queued.cancelled = true,
            Op::Change(BatchOp::Create { open, .. }) if *open => *open = false,
            _ => return false,
        }
        true
    }
}

struct Queued {
    /// Its number in its queue's backlog.
    number: u64,
    /// A commit goes after the namespace changes up to this number (0: no wait).
    after: u64,
    op: Op,
    /// The caps generation it was made under; `None` for a release, which needs no cap.
    generation: Option<u64>,
    /// Taken back before it left (a release whose file was opened again): not sent.
    cancelled: bool,
}

/// What the queues carry: namespace changes (with opens and releases), and size commits.
#[derive(Clone, Debug)]
enum Op {
    Change(BatchOp),
    Commit(Commit),
}

impl Op {
    fn change(self) -> Option<BatchOp> {
        match self {
            Op::Change(op) => Some(op),
            Op::Commit(_) => None,
        }
    }

    fn commit(self) -> Option<Commit> {
        match self {
            Op::Commit(c) => Some(c),
            Op::Change(_) => None,
        }
    }
}

/// What a new inode is.
pub(crate) struct NewInode<'a> {
    pub kind: FileKind,
    pub perm: u32,
    pub owner: Owner,
    pub rdev: u32,
    /// A symlink's target; empty for everything else.
    pub target: &'a [u8],
    /// Created open (`open(O_CREAT)`): meta records the open with the create.
    pub open: bool,
}

impl Client {
    /// Makes `name` in `parent` here if this client holds `parent` with its listing
    /// (taking it if meta gives it): its attributes and the backlog number of its
    /// queued create; `None` when the change must go to meta.
    pub(crate) async fn create_here(
        &self,
        parent: InodeId,
        name: &[u8],
        new: NewInode<'_>,
    ) -> Option<Result<(Attr, u64), FsError>> {
        self.take_dir(parent, LISTING_LIMIT).await;
        let _pin = self.pin(&[parent]).await;
        if self.sh.caps.listed(parent, name)?.is_some() {
            return Some(Err(FsError::Exists));
        }
        let (dir, _) = self.sh.caps.cached_attr(parent)?;
        // Held until the create is queued: meta takes a session's creates only in the
        // order of their numbers and only from its current reservation, so a number must
        // be queued before another task takes the next one or reserves anew.
        let mut reserved = match self.reservation().await {
            Ok(reserved) => reserved,
            Err(e) => return Some(Err(e)),
        };
        let ino = InodeId(reserved.1.start);
        reserved.1.start += 1;
        let at = Timestamp::now();
        let (perm, rdev) = match new.kind {
            FileKind::Symlink => (0o777, 0),
            FileKind::Dir => (new.perm & 0o7777, 0),
            _ => (new.perm & 0o7777, new.rdev),
        };
        let (perm, gid) = dir.inherited(new.kind, perm, new.owner.gid);
        let attr = Attr {
            ino,
            kind: new.kind,
            perm,
            uid: new.owner.uid,
            gid,
            size: new.target.len() as u64,
            nlink: if new.kind == FileKind::Dir { 2 } else { 1 },
            rdev,
            atime: at,
            mtime: at,
            ctime: at,
            version: 1,
        };
        let generation = self.sh.caps.record_change(parent, name, Change::Created(attr.clone()))?;
        let op = BatchOp::Create {
            ino,
            parent,
            name: name.to_vec(),
            kind: new.kind,
            perm,
            uid: new.owner.uid,
            gid,
            rdev,
            target: new.target.to_vec(),
            open: new.open,
            at,
        };
        let number = queue(&self.sh, op, &[parent, ino], Some(generation));
        drop(reserved);
        Some(Ok((attr, number)))
    }

    /// Removes `name` from `parent` here (an rmdir when `dir`) if this client holds
    /// `parent` with its listing and the child exclusively, knowing it whole (a file
    /// with its attributes, or a directory with its listing), taking them if meta gives
    /// them; `None` when it must go to meta.
    pub(crate) async fn remove_here(
        &self,
        parent: InodeId,
        name: &[u8],
        dir: bool,
    ) -> Option<Result<(), FsError>> {
        let kind = if dir { FileKind::Dir } else { FileKind::File };
        if self.may_take(parent, name, kind, true) {
            self.take_dir(parent, LISTING_LIMIT).await;
        }
        let Some(child) = self.sh.caps.listed(parent, name)? else {
            return Some(Err(FsError::NotFound));
        };
        match dir {
            // Only an empty one is worth a listing: any other answers ENOTEMPTY.
            true if self.sh.caps.listing_len(child).is_none() => self.take_dir(child, 0).await,
            false if self.sh.caps.owns(child).is_none() => self.take_files(parent, name).await,
            _ => {}
        }
        let _pin = self.pin(&[parent, child]).await;
        if self.sh.caps.listed(parent, name)? != Some(child) {
            return None;
        }
        let attr = self.sh.caps.owns(child)?;
        match (dir, attr.kind == FileKind::Dir) {
            (true, false) => return Some(Err(FsError::NotDir)),
            (false, true) => return Some(Err(FsError::IsDir)),
            (true, true) => match self.sh.caps.listing_len(child)? {
                0 => {}
                _ => return Some(Err(FsError::NotEmpty)),
            },
            (false, false) => {}
        }
        let file = self.sh.files.get(child).filter(|_| !dir);
        let inner = file.as_ref().map(|f| f.lock());
        if !dir && attr.nlink > 1 && !counts_links_here(inner.as_deref()) {
            return None;
        }
        // A file this client has open or is writing keeps its cap: its handles go on.
        // So does one with other names: it stays, and its link count is known here.
        let keep = !dir && (attr.nlink > 1 || file.is_some());
        let at = Timestamp::now();
        let change = Change::Removed { child, dir, at, keep };
        let generation = self.sh.caps.record_change(parent, name, change)?;
        let op = BatchOp::Remove { parent, name: name.to_vec(), dir, at };
        let number = queue(&self.sh, op, &[parent, child], Some(generation));
        drop(inner);
        self.sh.caps.give_back_after(&[child], number);
        send_released(&self.sh);
        Some(Ok(()))
    }

    /// Renames `parent/name` to `new_parent/new_name` here (no `renameat2` flags but
    /// `RENAME_NOREPLACE`) if this client holds both directories with their listings, and
    /// exclusively the file it moves and any file it replaces, each with one link,
    /// taking the directories and the file moved as [`Client::remove_here`] does;
    /// `None` when the rename must go to meta. Directories are renamed through meta,
    /// which checks that none moves into its own subtree.
    pub(crate) async fn rename_here(
        &self,
        (parent, name): (InodeId, &[u8]),
        (new_parent, new_name): (InodeId, &[u8]),
        flags: u32,
    ) -> Option<Result<(), FsError>> {
        if flags & !libc::RENAME_NOREPLACE != 0 {
            return None;
        }
        if self.may_take(parent, name, FileKind::File, false) {
            self.take_dir(parent, LISTING_LIMIT).await;
            self.take_dir(new_parent, LISTING_LIMIT).await;
        }
        let Some(child) = self.sh.caps.listed(parent, name)? else {
            return Some(Err(FsError::NotFound));
        };
        let target = self.sh.caps.listed(new_parent, new_name)?;
        if self.sh.caps.owns(child).is_none() {
            self.take_files(parent, name).await;
        }
        let mut pinned = vec![parent, new_parent, child];
        pinned.extend(target);
        let _pin = self.pin(&pinned).await;
        if self.sh.caps.listed(parent, name)? != Some(child)
            || self.sh.caps.listed(new_parent, new_name)? != target
        {
            return None;
        }
        let attr = self.sh.caps.owns(child)?;
        if attr.kind == FileKind::Dir || attr.nlink != 1 || target == Some(child) {
            return None;
        }
        let replaced = match target {
            None => None,
            Some(_) if flags & libc::RENAME_NOREPLACE != 0 => return Some(Err(FsError::Exists)),
            Some(old) => {
                let old_attr = self.sh.caps.owns(old)?;
                if old_attr.kind == FileKind::Dir {
                    return Some(Err(FsError::IsDir));
                }
                if old_attr.nlink != 1 {
                    return None;
                }
                Some((old, self.sh.files.get(old).is_some()))
            }
        };
        let at = Timestamp::now();
        let places = ((parent, name), (new_parent, new_name));
        let generation = self.sh.caps.record_rename(places, child, replaced, at)?;
        let op = BatchOp::Rename {
            parent,
            name: name.to_vec(),
            new_parent,
            new_name: new_name.to_vec(),
            at,
        };
        // The directories, the file moved and the file replaced.
        let number = queue(&self.sh, op, &pinned, Some(generation));
        if let Some((old, false)) = replaced {
            self.sh.caps.give_back_after(&[old], number);
        }
        send_released(&self.sh);
        Some(Ok(()))
    }

    /// Links file `ino` as `new_parent/new_name` here if this client holds the directory
    /// with its listing (taking it as a create does) and the file exclusively with its
    /// attributes; `None` when the link must go to meta. Answers with the file's
    /// attributes, its link count raised.
    pub(crate) async fn link_here(
        &self,
        ino: InodeId,
        new_parent: InodeId,
        new_name: &[u8],
    ) -> Option<Result<Attr, FsError>> {
        self.sh.caps.owns(ino)?;
        self.take_dir(new_parent, LISTING_LIMIT).await;
        let _pin = self.pin(&[new_parent, ino]).await;
        if self.sh.caps.listed(new_parent, new_name)?.is_some() {
            return Some(Err(FsError::Exists));
        }
        let kind = self.sh.caps.owns(ino)?.kind;
        if kind == FileKind::Dir {
            return Some(Err(FsError::NotPermitted));
        }
        let file = self.sh.files.get(ino);
        let inner = file.as_ref().map(|f| f.lock());
        if !counts_links_here(inner.as_deref()) {
            return None;
        }
        let at = Timestamp::now();
        let change = Change::Linked { child: ino, kind, at };
        let generation = self.sh.caps.record_change(new_parent, new_name, change)?;
        let op = BatchOp::Link { ino, new_parent, new_name: new_name.to_vec(), at };
        queue(&self.sh, op, &[new_parent, ino], Some(generation));
        drop(inner);
        let attr = self.sh.caps.owns(ino)?;
        Some(Ok(self.adjust(attr)))
    }

    /// Queues telling meta that this client opened file `ino`, if it holds a cap on the
    /// file; the change's backlog number if it did. Meta hears of the open in order
    /// with this client's other changes, and before the file can go: another client's
    /// removal of its last name recalls the cap, whose ack waits for what is queued,
    /// while the file is kept a stray (stoa-meta `ops/unlink.rs`); and the leader
    /// deletes a file's chunks only after every cap on it was given back (stoa-metad
    /// `leader.rs`, `collect_once`), so a read under the cap never finds them gone
    /// (caps.md invariant 19).
    pub(crate) async fn open_queued(&self, ino: InodeId) -> Option<u64> {
        let _pin = self.pin(&[ino]).await;
        let generation = self.sh.caps.held_in(ino, CapMode::Shared)?;
        Some(queue(&self.sh, BatchOp::Open { ino }, &[ino], Some(generation)))
    }

    /// Changes the mode, owner or times of `ino` here if this client holds it
    /// exclusively with its attributes: records the change, queues it (or defers it, see
    /// [`FileInner::attr_change`]), and answers with the attributes it left; `None` when
    /// it must go to meta. Nobody else sees the inode before a recall of the cap, whose
    /// ack waits for what is queued and deferred. SQLite changes the owner of every
    /// journal it creates as root to the one it already has, and `tar`, `cp -a` and
    /// `rsync` set the times of every file they write: a Raft entry each, before. The
    /// file's lock, held until the change is queued, keeps a commit from being queued
    /// meanwhile; one queued after it reaches meta after it.
    pub(crate) async fn setattr_here(&self, ino: InodeId, set: &SetAttr) -> Option<Attr> {
        let _pin = self.pin(&[ino]).await;
        let file = self.sh.files.get(ino);
        let times = set.atime.is_some() || set.mtime.is_some();
        if let Some(file) = file.as_ref().filter(|_| times) {
            // `tar` sets the times before its close: its writes are still buffered.
            file.send_all(&self.sh);
        }
        let mut inner = file.as_ref().map(|f| f.lock());
        if let (Some(file), Some(state), true) = (file.as_ref(), inner.as_mut(), times) {
            // A held commit would set the mtime over this change's.
            file.send_times_locked(&self.sh, state);
        }
        let change = inner.as_ref().map_or(AttrChange::Now, |i| i.attr_change(times));
        if change == AttrChange::Meta {
            return None;
        }
        let at = Timestamp::now();
        let (attr, generation) = self.sh.caps.record_attr(ino, set, at)?;
        let set = set.clone();
        match (change, inner.as_mut()) {
            (AttrChange::Deferred, Some(inner)) => {
                inner.defer(DeferredAttr { set, at, generation });
            }
            _ => queue_setattr(&self.sh, ino, DeferredAttr { set, at, generation }),
        }
        drop(inner);
        Some(attr)
    }

    /// Queues, in order with this client's other changes, telling meta that it closed
    /// its last handle of `ino`; returns the change's backlog number.
    pub(crate) fn queue_release(&self, ino: InodeId) -> u64 {
        queue(&self.sh, BatchOp::Release { ino }, &[ino], None)
    }

    /// Takes back queued change `number` if it has not left yet; whether it had not.
    pub(crate) fn cancel_queued(&self, number: u64) -> bool {
        self.sh.dirops.queue.lock().expect("dirops queue lock poisoned").cancel(number)
    }

    /// Takes back the open that queued change `number` tells meta of, if it has not
    /// left ([`Queue::take_back_open`]); whether it had not.
    pub(crate) fn take_back_open(&self, number: u64) -> bool {
        self.sh.dirops.queue.lock().expect("dirops queue lock poisoned").take_back_open(number)
    }

    /// Waits until meta has every namespace change this client answered so far.
    pub async fn sync_namespace(&self) {
        self.sh.session.backlog.wait_all().await;
    }

    /// How many answered changes were lost so far: a directory handle notes it at its
    /// open, for [`Client::lost_in`].
    pub fn lost_mark(&self) -> u64 {
        self.sh.dirops.lost.lock().expect("lost lock poisoned").count
    }

    /// For an `fsync` of directory `dir`, after [`Client::sync_namespace`], through a
    /// handle whose [`Client::lost_mark`] is `seen`: fails once for a change this client
    /// answered in `dir` that never reached meta (its session expired first, or meta
    /// refused it), so a process that syncs its changes learns of the loss instead of
    /// trusting them.
    pub fn lost_in(&self, dir: InodeId, seen: &mut u64) -> Result<(), FsError> {
        if !self.sh.dirops.lost.lock().expect("lost lock poisoned").take(dir, seen) {
            return Ok(());
        }
        Err(FsError::Io(format!(
            "changes this mount made in directory {dir} were lost: its session with meta \
             expired (or meta refused them) before they were sent"
        )))
    }

    /// Asks meta for `dir` with its listing, if it has at most `limit` entries, unless
    /// this client holds it already or meta refused it lately.
    async fn take_dir(&self, dir: InodeId, limit: u32) {
        if self.sh.caps.listing_len(dir).is_some() {
            return;
        }
        {
            let mut refused = self.sh.dirops.refused.lock().expect("refused lock poisoned");
            if refused.get(&dir).is_some_and(|at| at.elapsed() < REFUSED_PAUSE) {
                return;
            }
            if refused.len() > REFUSED_MAX {
                refused.clear();
            }
        }
        // A grant whose answer never came stays registered at meta like any lost answer:
        // this client acks its recall when another wants the directory.
        let taken = tokio::time::timeout(TAKE_TIMEOUT, self.take(dir, limit))
            .await
            .unwrap_or_else(|_| Err(FsError::Unavailable("no answer in time".into())));
        let taken = taken.unwrap_or_else(|e| {
            tracing::debug!("taking directory {dir} with its listing: {e}");
            false
        });
        if !taken {
            let mut refused = self.sh.dirops.refused.lock().expect("refused lock poisoned");
            refused.insert(dir, Instant::now());
        }
    }

    /// Whether to take `parent` for a removal or rename of `name`, which must be of
    /// `kind` to be made here: unless this client knows the name leads to something
    /// that goes to meta all the same (a directory moved, a symlink or device, a file
    /// renamed with other links), whose change there would only drop the listing just
    /// taken. A file with other links is removed here too.
    fn may_take(&self, parent: InodeId, name: &[u8], kind: FileKind, removal: bool) -> bool {
        let caps = &self.sh.caps;
        let known = caps.cached_name(parent, name).and_then(|ino| caps.cached_attr(ino));
        known.is_none_or(|(attr, _)| {
            attr.kind == kind && (kind == FileKind::Dir || removal || attr.nlink == 1)
        })
    }

    /// Takes the file `name` of `dir` (held with its listing) exclusively, with the
    /// files listed after it that this client does not hold so, as many as the
    /// directory's window, which then doubles up to [`LOOKUP_MANY_MAX`]: `rm -r`
    /// removes a directory's files in the order its listing gives them, each then here,
    /// not one log entry each at meta. The window starts small, so that removing one
    /// file recalls few others from the mounts that use them. A call that fails costs
    /// the removal its own call to meta.
    async fn take_files(&self, dir: InodeId, name: &[u8]) {
        let windows = &self.sh.dirops.windows;
        let now = windows.lock().expect("windows lock poisoned").get(&dir).copied();
        let now = now.unwrap_or(TAKE_FILES_FIRST);
        let names = self.sh.caps.unowned_files_from(dir, name, now);
        if names.first().is_none_or(|first| first != name) {
            return;
        }
        {
            let mut windows = windows.lock().expect("windows lock poisoned");
            if windows.len() > REFUSED_MAX {
                windows.clear();
            }
            windows.insert(dir, (now * 2).min(LOOKUP_MANY_MAX));
        }
        self.grant_many(MetaOp::TakeFiles { dir, names }, dir, name).await;
    }

    async fn take(&self, dir: InodeId, limit: u32) -> Result<bool, FsError> {
        let op = MetaOp::TakeDir { ino: dir, limit };
        let sent = Instant::now();
        let epoch = self.sh.caps.epoch();
        let changes = &self.sh.session.entry_changes;
        let mark = changes.mark();
        let grant = match self.sh.session.call_leader(op, TAKE_TIMEOUT).await? {
            MetaResponse::Dir(grant) => grant,
            other => return Err(unexpected("TakeDir", &other)),
        };
        self.renewed(sent).await;
        let Some(grant) = grant else { return Ok(false) };
        if !self.sh.caps.store_dir(&grant, epoch) {
            return Ok(false);
        }
        // A change of ours that went to meta meanwhile may have been applied after the
        // listing was taken (meta recalls only other sessions): keep the cap, not the
        // listing; the next change here takes it again.
        if !changes.quiet_since(mark) {
            self.sh.caps.drop_listing(dir);
        }
        Ok(true)
    }

    /// The session's inode reservation, locked, with a number left (reserving more when
    /// none is): the caller takes the next number and queues its create under the lock.
    async fn reservation(
        &self,
    ) -> Result<tokio::sync::MutexGuard<'_, (SessionId, Range<u64>)>, FsError> {
        let mut reserved = self.sh.dirops.inodes.lock().await;
        let session = self.sh.session.id();
        // A reservation dies with its session.
        if reserved.0 != session || reserved.1.is_empty() {
            let op = MetaOp::AllocInodes { count: RESERVATION };
            match self.sh.session.call_in(session, op).await? {
                MetaResponse::Inodes { first, count } => {
                    *reserved = (session, first.0..first.0 + u64::from(count));
                }
                other => return Err(unexpected("AllocInodes", &other)),
            }
        }
        Ok(reserved)
    }
}

/// The two queues of changes: namespace changes (with opens and releases), and size
/// commits.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Lane {
    Namespace,
    Commits,
}

impl Lane {
    fn parts(self, sh: &Shared) -> (&Mutex<Queue>, &Backlog) {
        match self {
            Lane::Namespace => (&sh.dirops.queue, &sh.session.backlog),
            Lane::Commits => (&sh.dirops.commits, &sh.dirops.commit_log),
        }
    }
}

/// Whether a file, with `inner` its state if it has one, held locked until the change
/// is queued, may have a new link count recorded here. The cache keeps the count this
/// client records, one version above meta's, until meta applies the queued change; a
/// size commit of the file queued or on its way now could be applied before it, and its
/// answer, of that same version, would put back the count from before (as for a mode
/// change, [`FileInner::attr_change`](crate::file::FileInner::attr_change)). A commit
/// queued later waits for the change.
fn counts_links_here(inner: Option<&crate::file::FileInner>) -> bool {
    inner.is_none_or(|inner| inner.attr_change(false) == AttrChange::Now)
}

/// Queues namespace change `op`, which names the inodes `named` (a recall of one of them
/// waits for it), for meta and starts a sender if none runs; returns its backlog number.
fn queue(sh: &Arc<Shared>, op: BatchOp, named: &[InodeId], generation: Option<u64>) -> u64 {
    let entries =
        !matches!(op, BatchOp::Open { .. } | BatchOp::Release { .. } | BatchOp::SetAttr { .. });
    let backlog = &sh.session.backlog;
    let number = enqueue(sh, Lane::Namespace, Op::Change(op), 0, generation);
    backlog.note_names(number, named);
    if entries {
        backlog.note_entries_change(number);
    }
    number
}

/// Queues attribute change `change` of `ino`, which the client made already.
pub(crate) fn queue_setattr(sh: &Arc<Shared>, ino: InodeId, change: DeferredAttr) {
    let op = BatchOp::SetAttr { ino, set: change.set, at: change.at };
    queue(sh, op, &[ino], Some(change.generation));
}

/// Queues size commit `commit`, made under caps generation `generation`, after the
/// queued namespace changes naming its file (its create first of all); returns its
/// number in the commit log.
pub(crate) fn queue_commit(sh: &Arc<Shared>, commit: Commit, generation: u64) -> u64 {
    let after = sh.session.backlog.last_naming(commit.ino);
    enqueue(sh, Lane::Commits, Op::Commit(commit), after, Some(generation))
}

/// Queues `op` in `lane`, to be sent after namespace change `after` has its answer.
fn enqueue(sh: &Arc<Shared>, lane: Lane, op: Op, after: u64, generation: Option<u64>) -> u64 {
    let (queue, log) = lane.parts(sh);
    let mut q = queue.lock().expect("dirops queue lock poisoned");
    // Numbered under the queue's lock, so numbers follow the queue's order.
    let number = log.queue();
    q.ops.push(Queued { number, after, op, generation, cancelled: false });
    if !std::mem::replace(&mut q.sending, true) {
        tokio::spawn(send(sh.clone(), lane));
    }
    number
}

/// Sends a lane's queued changes in batches, one batch at a time, until its queue is
/// empty. A short batch waits a moment for more (one Raft entry and one apply serve
/// them all), unless a call is waiting for the lane's backlog.
async fn send(sh: Arc<Shared>, lane: Lane) {
    let (queue, log) = lane.parts(&sh);
    loop {
        let short = queue.lock().expect("dirops queue lock poisoned").ops.len() < GATHER_OPS;
        if short && !log.is_urgent() {
            tokio::select! {
                () = tokio::time::sleep(GATHER_WAIT) => {}
                () = log.hurry.notified() => {}
            }
        }
        let batch: Vec<Queued> = {
            let mut q = queue.lock().expect("dirops queue lock poisoned");
            if q.ops.is_empty() {
                q.sending = false;
                return;
            }
            let n = q.ops.len().min(BATCH_MAX);
            q.ops.drain(..n).collect()
        };
        let last = batch.last().map_or(0, |q| q.number);
        // A file's create, answered locally, reaches meta before its size.
        let after = batch.iter().map(|q| q.after).max().unwrap_or(0);
        sh.session.backlog.wait(after).await;
        let batch = batch.into_iter().filter(|q| !q.cancelled);
        // Changes made under caps that lapsed since are never sent: another client may
        // hold those directories now (fencing, as for buffered writes).
        let generation = sh.caps.generation();
        let (live, stale): (Vec<Queued>, Vec<Queued>) =
            batch.partition(|q| q.generation.is_none_or(|g| g == generation));
        for q in &stale {
            refused(&sh, &q.op, &FsError::SessionExpired);
        }
        if !live.is_empty() {
            let sent = sh.caps.epoch();
            match call(&sh, lane, &live).await {
                Ok(results) => {
                    for (q, result) in live.iter().zip(results) {
                        match result {
                            Ok(Some(attr)) => committed(&sh, attr, sent),
                            Ok(None) => {}
                            Err(e) => refused(&sh, &q.op, &e),
                        }
                    }
                }
                Err(e) => {
                    for q in &live {
                        refused(&sh, &q.op, &e);
                    }
                }
            }
        }
        log.done(last);
    }
}

/// Sends `live`, a lane's changes, in one call; the outcome of each, with the
/// attributes a size commit left.
async fn call(
    sh: &Shared,
    lane: Lane,
    live: &[Queued],
) -> Result<Vec<Result<Option<Attr>, FsError>>, FsError> {
    let ops = live.iter().map(|q| q.op.clone());
    let (request, name) = match lane {
        Lane::Namespace => (MetaOp::Batch { ops: ops.filter_map(Op::change).collect() }, "Batch"),
        Lane::Commits => {
            (MetaOp::CommitWrites { commits: ops.filter_map(Op::commit).collect() }, "CommitWrites")
        }
    };
    match sh.session.call(request).await? {
        MetaResponse::Batch(results) if results.len() == live.len() => {
            Ok(results.into_iter().map(|r| r.map(|()| None)).collect())
        }
        MetaResponse::Attrs(results) if results.len() == live.len() => {
            Ok(results.into_iter().map(|r| r.map(Some)).collect())
        }
        other => Err(unexpected(name, &other)),
    }
}

/// Meta applied a size commit of this client's, sent at epoch `sent`: the file and its
/// cap take the attributes it left, whose version orders them against every other
/// answer.
fn committed(sh: &Shared, attr: Attr, sent: u64) {
    match sh.files.get(attr.ino) {
        Some(file) => file.lock().committed(&sh.caps, attr, sent),
        None => sh.caps.update_attr(attr, sent),
    }
}

/// Meta refused a change this client had already answered, or it was never sent: the
/// listing of its directory may be wrong now, the next fsync there reports the loss, and
/// a file whose create was refused fails its handles.
fn refused(sh: &Shared, op: &Op, e: &FsError) {
    let op = match op {
        Op::Change(op) => op,
        Op::Commit(Commit { ino, .. }) => return commit_refused(sh, *ino, e),
    };
    tracing::error!("a change this client had answered was lost: {op:?}: {e}");
    let lost = |dir: InodeId| {
        sh.dirops.lost.lock().expect("lost lock poisoned").record(dir);
        sh.caps.drop_listing(dir);
    };
    match op {
        BatchOp::Create { ino, parent, .. } => {
            lost(*parent);
            sh.caps.forget(&[*ino], &[]);
            if let Some(file) = sh.files.get(*ino) {
                file.lock()
                    .fail(FsError::Io(format!("meta refused the create of inode {ino}: {e}")));
            }
        }
        BatchOp::Remove { parent, .. } => lost(*parent),
        BatchOp::Rename { parent, new_parent, .. } => {
            lost(*parent);
            lost(*new_parent);
        }
        BatchOp::Link { ino, new_parent, .. } => {
            lost(*new_parent);
            sh.caps.forget(&[*ino], &[]);
        }
        BatchOp::Open { ino } => {
            if let Some(file) = sh.files.get(*ino) {
                file.lock().fail(FsError::Io(format!("meta refused the open of inode {ino}: {e}")));
            }
        }
        BatchOp::SetAttr { ino, .. } => {
            sh.caps.forget(&[*ino], &[]);
            if let Some(file) = sh.files.get(*ino) {
                let lost = format!("meta refused an attribute change of inode {ino}: {e}");
                file.lock().fail(FsError::Io(lost));
            }
        }
        BatchOp::Release { .. } => {}
    }
}

/// Meta refused a size commit of file `ino`, or it was never sent: the file's next
/// `fsync` fails, as for a failed chunk write.
fn commit_refused(sh: &Shared, ino: InodeId, e: &FsError) {
    if *e == FsError::NotFound {
        // The file's last name went and its last handle closed before its size
        // reached meta (the commit does not wait for the release and unlink queued
        // after it): nobody can read it any more.
        tracing::debug!("the size commit of inode {ino} found it gone");
        return;
    }
    tracing::error!("a size commit of inode {ino} this client had answered was lost: {e}");
    if let Some(file) = sh.files.get(ino) {
        file.lock().fail(FsError::Io(format!("meta refused the size commit of inode {ino}: {e}")));
    }
}

#[cfg(test)]
mod tests {
    use super::{Lost, Op, Queue, Queued};
    use stoa_proto::BatchOp;
    use stoa_types::{FileKind, InodeId, Timestamp};

    fn create(open: bool) -> BatchOp {
        let (ino, parent, name, kind) = (InodeId(9), InodeId(1), b"f".to_vec(), FileKind::File);
        let (perm, uid, gid, rdev, target, at) = (0o644, 0, 0, 0, Vec::new(), Timestamp::now());
        BatchOp::Create { ino, parent, name, kind, perm, uid, gid, rdev, target, open, at }
    }

    /// The last close of a file takes back the change that tells meta of its open while
    /// that change is queued: an `Open` is not sent, a create is sent making the file
    /// closed; nothing else is an open, and a change that left is not found.
    #[test]
    fn an_open_is_taken_back_only_while_its_change_is_queued() {
        let ops = [
            BatchOp::Open { ino: InodeId(5) },
            create(true),
            create(false),
            BatchOp::Release { ino: InodeId(5) },
        ];
        let mut q = Queue::default();
        for (number, op) in (1..).zip(ops) {
            let op = Op::Change(op);
            q.ops.push(Queued { number, after: 0, op, generation: None, cancelled: false });
        }
        assert!(q.take_back_open(1));
        assert!(q.ops[0].cancelled, "the open is not sent");
        assert!(q.take_back_open(2));
        assert!(!q.ops[1].cancelled, "the create is sent");
        assert!(matches!(q.ops[1].op, Op::Change(BatchOp::Create { open: false, .. })));
        assert!(!q.take_back_open(2), "taken back once");
        assert!(!q.take_back_open(3), "a create of a file not made open");
        assert!(!q.take_back_open(4), "a release");
        assert!(!q.ops[3].cancelled);
        q.ops.drain(..2);
        assert!(!q.take_back_open(1), "left already");
        assert!(q.cancel(4) && !q.cancel(1));
    }

    #[test]
    fn a_lost_change_fails_one_fsync_of_each_handle_open_before_it_and_the_first_after() {
        let (d, other) = (InodeId(7), InodeId(8));
        let mut lost = Lost::default();
        let (mut before_a, mut before_b) = (lost.count, lost.count);
        lost.record(d);
        // Every handle open at the loss reports it, once.
        assert!(lost.take(d, &mut before_a));
        assert!(!lost.take(d, &mut before_a));
        assert!(lost.take(d, &mut before_b));
        // A handle opened after it: the loss was reported already.
        let mut after = lost.count;
        assert!(!lost.take(d, &mut after));
        // A loss nobody reported goes to the first fsync, even of a later handle.
        lost.record(d);
        let mut late = lost.count;
        assert!(lost.take(d, &mut late));
        assert!(!lost.take(d, &mut late));
        assert!(lost.take(d, &mut after));
        // Other directories lost nothing.
        let mut elsewhere = 0;
        assert!(!lost.take(other, &mut elsewhere));
    }

    #[test]
    fn losses_already_reported_make_room_past_the_bound() {
        let mut lost = Lost::default();
        for i in 0..super::LOST_MAX as u64 {
            lost.record(InodeId(i + 1));
            let mut seen = 0;
            assert!(lost.take(InodeId(i + 1), &mut seen));
        }
        lost.record(InodeId(u64::MAX));
        assert_eq!(lost.dirs.len(), 1, "only the unreported loss stays");
    }
}
