//! The FUSE filesystem: each kernel request calls the client and replies, first on the
//! fuser thread that read it and, as soon as it has to wait, as a task on the tokio
//! runtime, so many requests are in flight at once while fuser's threads go back to
//! reading the device.

use crate::attr::{errno, file_attr, file_type, missing_attr, set_time, BLOCK_SIZE_BYTES};
use crate::caller::{Call, Creds};
use crate::dirs::{OpenDirs, Stream};
use crate::ids::KernelIds;
use crate::locks::LockBook;
use crate::names::KernelNames;
use crate::slow::{op_name, Counted, Waiting};
use fuser::{
    AccessFlags, BsdFileFlags, CopyFileRangeFlags, Errno, FileAttr, FileHandle, Filesystem,
    FopenFlags, Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};
use std::ffi::OsStr;
use std::future::Future;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Waker};
use std::time::{Duration, SystemTime};
use stoa_client::{
    Attr, Client, FileKind, FsError, InodeId, LockRequest, Owner, Pinned, SetAttr, SetTime,
};

/// Largest write the kernel sends in one request.
const MAX_WRITE_BYTES: u32 = 1 << 20;
/// Readahead we ask the kernel for (it may offer less).
const MAX_READAHEAD_BYTES: u32 = 4 << 20;
/// Background requests (readahead, async writes) the kernel keeps in flight.
const MAX_BACKGROUND: u16 = 64;
/// How long a lookup waits for the kernel to drop the old name of the inode it found
/// (`names.rs`). A free directory takes microseconds. When the lookup itself holds the
/// directory of the old name (shared, as a walk does), the drop waits for its answer:
/// the wait is then long enough for Linux to hand the directory to the waiting drop
/// before any new walk (a writer waiting more than 4 ms, 10 ms at HZ=100, is no longer
/// overtaken by readers), so the kernel's walk again finds the drop done. With 2 ms, a
/// walk overtook it: 5 of 5,286 reads of a name replaced on the other mount met `ESTALE`.
const OLD_NAME_DROP_WAIT: Duration = Duration::from_millis(20);
/// Old names one lookup waits for the kernel to drop, one after another: the other
/// mount may have moved the name's next file as well meanwhile. Meeting one more, it
/// answers `ESTALE`. With one, a link whose lookup met a second file's old name failed
/// with `ESTALE` (two mounts churning five names, `churn.py`: 8 in about 146,000
/// operations; none in about 270,000 with three).
const OLD_NAME_DROPS: u32 = 3;
/// Creates one `open(O_CREAT)` tries again when the name it found taken is gone again
/// by the time it looks (`open_existing`), before it leaves the open to the kernel's
/// walk.
const CREATE_TRIES: u32 = 3;
/// File capabilities are not supported (setting one is `EOPNOTSUPP`), like GlusterFS and
/// JuiceFS by default: the kernel asks for this xattr before every write(2) to decide
/// whether to drop it, and answering from here instead of meta saves a meta round trip
/// per write. No file can have one, so the answer is always true.
const CAPABILITY_XATTR: &[u8] = b"security.capability";
/// POSIX ACLs are not supported: setting one is `EOPNOTSUPP`, and no file has one. Kept
/// as plain xattrs they were never applied: `cp -a` sets a file's mode through its
/// ACL where it can, and every file it copied in kept the mode of its create (0600
/// instead of 0644). Refused, `cp -a`, `rsync -A` and `tar --acls` fall back to
/// `chmod`, as on any filesystem without ACLs.
const ACL_XATTRS: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// Whether `name` is an xattr this filesystem answers itself: no file has one.
fn unsupported_xattr(name: &[u8]) -> bool {
    name == CAPABILITY_XATTR || ACL_XATTRS.contains(&name)
}

/// The kernel side of the mount, for telling it to drop cached pages and attributes.
/// Set once the session exists, which is after this filesystem is built.
pub type Kernel = Arc<std::sync::OnceLock<fuser::Notifier>>;

pub struct StoaFs {
    client: Client,
    rt: tokio::runtime::Handle,
    kernel: Kernel,
    names: Arc<KernelNames>,
    ids: Arc<KernelIds>,
    locks: Arc<LockBook>,
    /// The requests waiting now, for the report of slow ones (`slow.rs`).
    waiting: Arc<Waiting>,
    dirs: Arc<OpenDirs>,
    /// Whether opens for writing use direct I/O (the kernel allows shared mappings of
    /// such files only since Linux 6.6, with `FUSE_DIRECT_IO_ALLOW_MMAP`).
    direct_writes: bool,
}

impl StoaFs {
    pub fn new(
        client: Client,
        rt: tokio::runtime::Handle,
        kernel: Kernel,
        ids: Arc<KernelIds>,
        waiting: Arc<Waiting>,
    ) -> StoaFs {
        let dirs = Arc::new(OpenDirs::default());
        let locks = Arc::new(LockBook::default());
        let names = Arc::new(KernelNames::default());
        let direct_writes = false;
        StoaFs { client, rt, kernel, names, ids, locks, waiting, dirs, direct_writes }
    }

    /// The inode of the kernel's node `i`.
    fn ino(&self, i: INodeNo) -> InodeId {
        self.ids.inode(i.0)
    }

    /// Runs `op` with a clone of the client: first right here on fuser's thread, and
    /// on the runtime only if it has to wait. Most requests of a mount that holds its
    /// caps (a cached lookup or getattr, a create in a directory held with its listing,
    /// a flush with nothing buffered) finish in that first poll, and handing them to
    /// another thread would cost more than the work. A request that has to wait is
    /// counted among the waiting ones, and logged if it waits long (`slow.rs`).
    fn spawn<F, Fut>(&self, op: F)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.run(op, true)
    }

    /// [`StoaFs::spawn`], counting the request among the waiting ones only if
    /// `watched`: one that may rightly wait for good is never logged as slow.
    fn run<F, Fut>(&self, op: F, watched: bool)
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        // Timers, sockets and tasks the first poll starts need the runtime's context.
        let _runtime = self.rt.enter();
        let count = || watched.then(|| self.waiting.count(op_name(std::any::type_name::<F>())));
        run_here_first(&self.rt, Box::pin(op(self.client.clone())), count);
    }

    fn dir(&self, fh: FileHandle) -> Option<Stream> {
        self.dirs.stream(fh.0)
    }
}

/// A request that had to wait in its first poll on fuser's thread. It becomes a task on
/// the runtime only when what it waits for wakes it, on the thread that woke it (usually
/// a runtime worker that read the reply): spawning it at once would wake an idle worker
/// just to poll it and park again, a thread switch per request that a 4 KiB read through
/// the mount paid on top of the two it needs.
struct Later {
    rt: tokio::runtime::Handle,
    state: Mutex<LaterState>,
}

enum LaterState {
    /// The first poll is under way on fuser's thread.
    Polling,
    /// Woken during the first poll: spawn as soon as it returns.
    WokenEarly,
    Parked(Task),
    /// A task on the runtime now, polled with the runtime's own wakers.
    Spawned,
}

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Polls `task` once on this thread; if it has to wait, it becomes a [`Later`], counted
/// among the waiting requests until it ends if `count` counts it.
fn run_here_first(
    rt: &tokio::runtime::Handle,
    mut task: Task,
    count: impl FnOnce() -> Option<Counted>,
) {
    let later = Arc::new(Later { rt: rt.clone(), state: Mutex::new(LaterState::Polling) });
    let waker = Waker::from(later.clone());
    if task.as_mut().poll(&mut Context::from_waker(&waker)).is_pending() {
        let counted = count();
        later.park(Box::pin(async move {
            task.await;
            drop(counted);
        }));
    }
}

impl Later {
    fn park(&self, task: Task) {
        let mut state = self.state.lock().expect("later lock poisoned");
        match *state {
            LaterState::WokenEarly => {
                *state = LaterState::Spawned;
                drop(state);
                self.rt.spawn(task);
            }
            _ => *state = LaterState::Parked(task),
        }
    }
}

impl std::task::Wake for Later {
    fn wake(self: Arc<Self>) {
        let mut state = self.state.lock().expect("later lock poisoned");
        match std::mem::replace(&mut *state, LaterState::Spawned) {
            LaterState::Polling => *state = LaterState::WokenEarly,
            LaterState::Parked(task) => {
                drop(state);
                self.rt.spawn(task);
            }
            other => *state = other,
        }
    }
}

fn fh(h: FileHandle) -> stoa_client::FileHandle {
    stoa_client::FileHandle(h.0)
}

fn bytes(name: &OsStr) -> Vec<u8> {
    name.as_bytes().to_vec()
}

fn owner(req: &Request) -> Owner {
    Owner { uid: req.uid(), gid: req.gid() }
}

/// How the kernel treats a new open file. `O_APPEND` writes go around the page cache
/// (the client picks their offset, the true end of file, which the kernel may not know),
/// and so do all writes where the kernel allows it (`direct_writes`): the kernel copies a
/// write into its cached pages before it sends it, where other processes of this mount
/// would read it before the client took the exclusive cap that orders it against every
/// other mount (caps.md invariant 21). Read-only opens keep the kernel's cached pages
/// while this client holds a cap on the file (a change elsewhere would have recalled it
/// and dropped them); with `direct_writes`, such a handle is marked page-cached, so that
/// a direct write drops what its reads put in the kernel's cache meanwhile.
fn open_flags(
    c: &Client,
    ino: InodeId,
    handle: stoa_client::FileHandle,
    flags: i32,
    direct_writes: bool,
) -> FopenFlags {
    let writes = flags & libc::O_ACCMODE != libc::O_RDONLY;
    if flags & libc::O_APPEND != 0 || (writes && direct_writes) {
        // The kernel keeps nothing of such a handle's reads; the client keeps the pages
        // of one that reads too, unless the application asked for no caching.
        if flags & libc::O_ACCMODE != libc::O_WRONLY && flags & libc::O_DIRECT == 0 {
            c.read_through_pages(handle);
        }
        return FopenFlags::FOPEN_DIRECT_IO;
    }
    if direct_writes {
        c.page_cached(handle);
    }
    if c.may_keep_cache(ino) {
        FopenFlags::FOPEN_KEEP_CACHE
    } else {
        FopenFlags::empty()
    }
}

pub(crate) fn fail(what: &str, e: &FsError) -> Errno {
    match e {
        FsError::Io(_) | FsError::Protocol(_) | FsError::Checksum(_) => {
            tracing::warn!("{what} failed: {e}")
        }
        _ => tracing::debug!("{what} failed: {e}"),
    }
    errno(e)
}

/// Has the kernel drop `parent`/`name`, which it may hold for inode `ino` that now has
/// another name, then lets the inode have the other name (`names.rs`). On a thread of
/// its own: the kernel takes the directory's lock for it, which a rename holds until
/// the lookup that met the old name returns. True once the kernel dropped it, false when
/// that took longer than [`OLD_NAME_DROP_WAIT`] (it goes on in the background).
async fn drop_old_name(
    kernel: &Kernel,
    names: &Arc<KernelNames>,
    (parent, name): (u64, Vec<u8>),
    ino: u64,
) -> bool {
    let (mut done, start) = names.drop_of(ino);
    if let Some(tx) = start {
        let (kernel, names) = (kernel.clone(), names.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(kernel) = kernel.get() {
                if let Err(e) = kernel.inval_entry(INodeNo(parent), OsStr::from_bytes(&name)) {
                    // ENOENT: the kernel does not hold the name.
                    tracing::debug!(
                        "dropping the kernel's entry {parent}/{:?}: {e}",
                        OsStr::from_bytes(&name)
                    );
                }
            }
            names.dropped(parent, &name, ino, tx);
        });
    }
    let dropped = tokio::time::timeout(OLD_NAME_DROP_WAIT, done.wait_for(|d| *d)).await;
    matches!(dropped, Ok(Ok(_)))
}

/// The kernel gets new inode `attr` under `parent`/`name`: its name is recorded, the
/// answer counted, and its attributes given as its own node (a new inode has no other
/// name, and no alias).
fn give_new(
    names: &KernelNames,
    ids: &KernelIds,
    parent: INodeNo,
    name: &[u8],
    attr: &Attr,
) -> FileAttr {
    names.give(parent.0, name, attr.ino.0, attr);
    ids.given(attr.ino.0, attr.ino);
    file_attr(attr, attr.ino.0)
}

/// What [`open_existing`] made of a name a CREATE found taken.
enum Existing {
    /// The file, open.
    Opened(Attr, stoa_client::FileHandle),
    /// Its `O_TRUNC` failed.
    Failed(FsError),
    /// Removed again since: the create may be tried again.
    Gone,
    /// Not opened here: the kernel's own walk must open it (ESTALE).
    Walk,
}

/// Opens the regular file another mount made under `name` in `dir` meanwhile, for an
/// `open(O_CREAT)` without `O_EXCL` whose CREATE found the name taken. Left to the
/// kernel's own walk (ESTALE), such an open failed when the other mount removed the
/// name and made it again between the walk's two tries (`churn.py`: about one
/// operation in 50,000). The kernel takes any file CREATE answers as one it made: it
/// checks no permission and does not apply `O_TRUNC` (`FMODE_CREATED`). So both are
/// done here as the kernel would for an open of an existing file
/// ([`Creds::may_open`]; the truncate after the open), and the rest is left to the
/// walk: credentials unread or refused, not a regular file, `O_NOATIME` (owner only),
/// `O_TRUNC` of a file with set-ID bits (which that truncate drops), a file the kernel
/// holds under an old name.
async fn open_existing(
    c: &Client,
    (names, ids): (&KernelNames, &KernelIds),
    (parent, dir, name): (INodeNo, InodeId, &[u8]),
    flags: i32,
    creds: Option<Creds>,
) -> Existing {
    let truncate = flags & libc::O_TRUNC != 0;
    if flags & libc::O_NOATIME != 0 {
        return Existing::Walk;
    }
    // Not pinned: the open and the truncate may need the file's cap, whose recall
    // would wait for the pin. The kernel may not cache the answer then.
    let attr = match c.lookup_cached(dir, name).await {
        Ok((attr, _, _)) => attr,
        Err(FsError::NotFound) => return Existing::Gone,
        Err(_) => return Existing::Walk,
    };
    let allowed = creds.is_some_and(|creds| creds.may_open(&attr, flags));
    if !allowed || (truncate && attr.perm & 0o6000 != 0) {
        return Existing::Walk;
    }
    if names.give(parent.0, name, attr.ino.0, &attr).is_some() {
        return Existing::Walk;
    }
    // Until it is given, the kernel's entry stays negative.
    let handle = match c.open(attr.ino).await {
        Ok(handle) => handle,
        Err(e) => {
            names.removed(parent.0, name);
            return match e {
                FsError::NotFound => Existing::Gone,
                _ => Existing::Walk,
            };
        }
    };
    let ino = attr.ino;
    let opened = match truncate {
        false => Ok(attr),
        // As Linux truncates for `O_TRUNC`: the times change even if the size does not.
        true => {
            let set = SetAttr { size: Some(0), mtime: Some(SetTime::Now), ..SetAttr::default() };
            c.setattr(ino, set).await
        }
    };
    match opened {
        Ok(attr) => {
            let shown = OsStr::from_bytes(name);
            tracing::debug!("create found {parent}/{shown:?} made meanwhile: opened {ino}");
            ids.given(attr.ino.0, attr.ino);
            Existing::Opened(attr, handle)
        }
        Err(e) => {
            names.removed(parent.0, name);
            if let Err(e) = c.release(handle).await {
                tracing::warn!("releasing inode {ino} after its truncate failed: {e}");
            }
            Existing::Failed(e)
        }
    }
}

/// Answers with a new entry. The kernel may cache it only when this client made it
/// itself, under exclusive caps on the directory and the new inode (which a recall
/// drops); otherwise its next lookup asks, and gets a cap.
fn reply_entry(
    c: &Client,
    reply: ReplyEntry,
    what: &str,
    (names, ids): (&KernelNames, &KernelIds),
    (parent, dir, name): (INodeNo, InodeId, &[u8]),
    r: Result<Attr, FsError>,
) {
    match r {
        Ok(attr) => {
            let ttl = c.cache_ttl(attr.ino).min(c.cache_ttl(dir));
            reply.entry(&ttl, &give_new(names, ids, parent, name, &attr), Generation(0))
        }
        Err(e) => reply.error(fail(what, &e)),
    }
}

/// Answers with attributes of node `i` the kernel may cache for `ttl` (zero without a
/// cap). `pin` keeps the cap from being recalled until the kernel has them.
fn reply_attr(
    reply: ReplyAttr,
    i: INodeNo,
    what: &str,
    r: Result<(Attr, Duration, Pinned), FsError>,
) {
    match r {
        Ok((attr, ttl, pin)) => {
            reply.attr(&ttl, &file_attr(&attr, i.0));
            drop(pin);
        }
        Err(e) => reply.error(fail(what, &e)),
    }
}

fn reply_empty(reply: ReplyEmpty, what: &str, r: Result<(), FsError>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(fail(what, &e)),
    }
}

/// Answers an xattr query: the size when asked for 0 bytes, else the data if it fits.
fn reply_xattr(reply: ReplyXattr, size: u32, r: Result<Vec<u8>, FsError>) {
    match r {
        Ok(data) if size == 0 => reply.size(data.len() as u32),
        Ok(data) if data.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(data) => reply.data(&data),
        Err(e) => reply.error(fail("xattr", &e)),
    }
}

/// Permission bits of a new object: the caller's mode less its umask.
fn perm(mode: u32, umask: u32) -> u32 {
    mode & !umask & 0o7777
}

impl Filesystem for StoaFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE_BYTES);
        if let Err(max) = config.set_max_readahead(MAX_READAHEAD_BYTES) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(MAX_BACKGROUND);
        // Lookups and listings of one directory may run in parallel: meta orders them.
        let _ = config.add_capabilities(InitFlags::FUSE_PARALLEL_DIROPS);
        // O_DIRECT requests of an asynchronous submitter (libaio, io_uring) reach us
        // together, not one after another, so a queue depth of 64 means 64 in flight.
        let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
        // Writes go around the page cache (see `open_flags`) only if shared mappings of
        // such files still work.
        self.direct_writes = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP).is_ok();
        if !self.direct_writes {
            tracing::warn!(
                "the kernel cannot map files opened with direct I/O: writes go through its \
                 page cache, where other processes of this mount may read them before they \
                 are ordered against other mounts"
            );
        }
        // A symlink's target never changes, and its inode number is never used again
        // (caps.md invariant 16): the kernel may keep every target it read.
        let _ = config.add_capabilities(InitFlags::FUSE_CACHE_SYMLINKS);
        // Without these the kernel keeps fcntl and flock locks to this machine; with them
        // every lock goes to meta and holds across the cluster.
        if let Err(missing) =
            config.add_capabilities(InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS)
        {
            tracing::warn!("the kernel cannot pass locks to Stoa ({missing:?}): locks stay local");
        }
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (name, names, kernel) = (bytes(name), self.names.clone(), self.kernel.clone());
        let (dir, ids, caller) = (self.ino(parent), self.ids.clone(), req.pid());
        self.spawn(|c| async move {
            // Old names this lookup has waited for the kernel to drop.
            let mut drops = 0;
            // An inode whose old name the kernel keeps until this caller lets go of the
            // directory, given all the same: a file unrecorded, a directory as a new node.
            let mut despite_old_name = None;
            let (found, node) = loop {
                let found = c.lookup_cached(dir, &name).await;
                let Ok((attr, _, _)) = &found else { break (found, 0) };
                let is_dir = attr.kind == FileKind::Dir;
                if despite_old_name == Some(attr.ino) && !is_dir {
                    // A file: its node is its number.
                    let node = attr.ino.0;
                    break (found, node);
                }
                // An inode with aliases: the node the kernel has under this name, if it
                // is one of them (a revalidation given another would drop the kernel's
                // entry, and a rename that walked through it would no longer see it as
                // the same directory), else the newest. Without one, only its number.
                let newest = ids.node(attr.ino);
                let held = (newest != attr.ino.0)
                    .then(|| names.node_at(parent.0, &name))
                    .flatten()
                    .filter(|n| ids.inode(*n) == attr.ino);
                let mut node = held.unwrap_or(newest);
                // A directory the kernel holds in another directory cannot take this
                // name inside a rename, nor while its old name waits for the caller to
                // let go, nor below itself (another mount moved it under a directory
                // the kernel holds below it): it gets a new node (caps.md invariant 32).
                if is_dir
                    && (despite_old_name == Some(attr.ino)
                        || names.moved_dir(parent.0, node)
                            && (Call::of(caller).renaming() || names.holds_above(node, parent.0)))
                {
                    node = ids.alias();
                    tracing::debug!(
                        "lookup of {}/{:?}: directory {} is node {node:#x} from now on",
                        parent.0,
                        OsStr::from_bytes(&name),
                        attr.ino
                    );
                }
                let Some(old) = names.give(parent.0, &name, node, attr) else {
                    break (found, node);
                };
                // The kernel may hold this inode under its old name, which another mount
                // renamed away: it must not see both (see `names`). This client no longer
                // answers the old name from its cache, and the kernel is told to drop it;
                // once it has, the name is looked up again. Else ESTALE: the kernel's walk
                // asks again.
                tracing::debug!(
                    "lookup of {}/{:?} found inode {} (links {}), which the kernel may hold \
                     as {}/{:?}",
                    parent.0,
                    OsStr::from_bytes(&name),
                    attr.ino,
                    attr.nlink,
                    old.0,
                    OsStr::from_bytes(&old.1)
                );
                // Lets go of the cap's pin while the kernel drops the name.
                let ino = attr.ino;
                drop(found);
                c.forget_cached_name(ids.inode(old.0), &old.1);
                if drops == OLD_NAME_DROPS {
                    tracing::debug!("the kernel still holds it after {drops} drops: ESTALE");
                    return reply.error(Errno::ESTALE);
                }
                let old_name = old.1.clone();
                if !drop_old_name(&kernel, &names, old, node).await {
                    // The drop waits for the directory, which the caller holds: for a
                    // file, only a rename of the old name must not see both names.
                    let call = Call::of(caller);
                    if !is_dir && call.may_rename(&old_name) {
                        tracing::debug!(
                            "the kernel still holds it, the caller in {call:?}: ESTALE"
                        );
                        return reply.error(Errno::ESTALE);
                    }
                    tracing::debug!("the caller holds the old name's directory");
                    despite_old_name = Some(ino);
                }
                drops += 1;
            };
            match found {
                Ok((attr, ttl, pin)) => {
                    ids.given(node, attr.ino);
                    reply.entry(&ttl, &file_attr(&attr, node), Generation(0));
                    drop(pin);
                }
                Err(FsError::NotFound) => {
                    names.removed(parent.0, &name);
                    // Under the directory's listing the kernel may remember the absence,
                    // and an open(O_CREAT) then needs no lookup first.
                    match c.missing_entry(dir, &name).await {
                        Some((ttl, pin)) => {
                            reply.entry(&ttl, &missing_attr(), Generation(0));
                            drop(pin);
                        }
                        None => reply.error(Errno::ENOENT),
                    }
                }
                Err(e) => reply.error(fail("lookup", &e)),
            }
        });
    }

    /// fuser's `batch_forget` comes here once per inode.
    fn forget(&self, _req: &Request, i: INodeNo, nlookup: u64) {
        if self.ids.forgot(i.0, nlookup) {
            self.names.forgot(i.0);
        }
    }

    fn getattr(&self, _req: &Request, i: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let inode = self.ino(i);
        let dirs = self.dirs.clone();
        // The kernel gives no handle with a directory's getattr: any handle open on it
        // keeps it for `fstat` (dirs.rs).
        self.spawn(|c| async move { reply_attr(reply, i, "getattr", dirs.attr(&c, inode).await) });
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
        _flags: Option<BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let inode = self.ino(i);
        let set = SetAttr {
            perm: mode.map(|m| m & 0o7777),
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
        };
        self.spawn(|c| async move {
            let r = c.setattr(inode, set).await;
            // The answer is this client's own change: as fresh as a cap makes it.
            let r = r.map(|attr| (attr, c.cache_ttl(inode), Pinned::none()));
            reply_attr(reply, i, "setattr", r);
        });
    }

    fn readlink(&self, _req: &Request, i: INodeNo, reply: ReplyData) {
        let inode = self.ino(i);
        self.spawn(|c| async move {
            match c.readlink(inode).await {
                Ok(target) => reply.data(&target),
                Err(e) => reply.error(fail("readlink", &e)),
            }
        });
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let dir = self.ino(parent);
        let Some(kind) = FileKind::from_mode(mode).filter(|k| *k != FileKind::Dir) else {
            return reply.error(Errno::EINVAL);
        };
        let (name, owner, names) = (bytes(name), owner(req), self.names.clone());
        let ids = self.ids.clone();
        self.spawn(|c| async move {
            let r = c.create(dir, &name, kind, perm(mode, umask), owner, rdev).await;
            reply_entry(&c, reply, "mknod", (&names, &ids), (parent, dir, &name), r);
        });
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
        let dir = self.ino(parent);
        let (name, owner, names) = (bytes(name), owner(req), self.names.clone());
        let ids = self.ids.clone();
        self.spawn(|c| async move {
            let r = c.mkdir(dir, &name, perm(mode, umask), owner).await;
            reply_entry(&c, reply, "mkdir", (&names, &ids), (parent, dir, &name), r);
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let dir = self.ino(parent);
        let (name, names) = (bytes(name), self.names.clone());
        self.spawn(|c| async move {
            let r = c.unlink(dir, &name).await;
            if r.is_ok() {
                names.removed(parent.0, &name);
            }
            reply_empty(reply, "unlink", r);
        });
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let dir = self.ino(parent);
        let name = bytes(name);
        self.spawn(|c| async move {
            reply_empty(reply, "rmdir", c.rmdir(dir, &name).await);
        });
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let dir = self.ino(parent);
        let (name, target, owner) = (bytes(link_name), bytes(target.as_os_str()), owner(req));
        let (names, ids) = (self.names.clone(), self.ids.clone());
        self.spawn(|c| async move {
            let r = c.symlink(dir, &name, &target, owner).await;
            reply_entry(&c, reply, "symlink", (&names, &ids), (parent, dir, &name), r);
        });
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
        let dir = self.ino(parent);
        let newdir = self.ino(newparent);
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            return reply.error(Errno::EINVAL);
        }
        let (name, newname, names) = (bytes(name), bytes(newname), self.names.clone());
        self.spawn(|c| async move {
            let r = c.rename(dir, &name, newdir, &newname, flags.bits()).await;
            if r.is_ok() {
                if flags.contains(RenameFlags::RENAME_EXCHANGE) {
                    names.exchanged((parent.0, &name), (newparent.0, &newname));
                } else {
                    names.moved((parent.0, &name), (newparent.0, &newname));
                }
            }
            reply_empty(reply, "rename", r);
        });
    }

    fn link(
        &self,
        _req: &Request,
        i: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let inode = self.ino(i);
        let newdir = self.ino(newparent);
        let (newname, ids) = (bytes(newname), self.ids.clone());
        self.spawn(|c| async move {
            // Never cached: a link made through meta is not recorded under the
            // directory's cap (one made here is; a lookup answers it without meta).
            match c.link(inode, newdir, &newname).await {
                // A file: it has no alias.
                Ok(attr) => {
                    ids.given(attr.ino.0, attr.ino);
                    reply.entry(&Duration::ZERO, &file_attr(&attr, attr.ino.0), Generation(0))
                }
                Err(e) => reply.error(fail("link", &e)),
            }
        });
    }

    fn open(&self, _req: &Request, i: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let inode = self.ino(i);
        let direct_writes = self.direct_writes;
        self.spawn(move |c| async move {
            match c.open(inode).await {
                Ok(handle) => {
                    let open = open_flags(&c, inode, handle, flags.0, direct_writes);
                    reply.opened(FileHandle(handle.0), open);
                }
                // The kernel found the inode by a name another mount removed since (with
                // the file's last link): ESTALE makes it walk the path once more with
                // LOOKUP_REVAL, which finds the name gone (ENOENT, or a new file for
                // O_CREAT) or leading to another inode.
                Err(FsError::NotFound) => {
                    tracing::debug!("open of inode {} removed meanwhile: reopening", i.0);
                    reply.error(Errno::ESTALE);
                }
                Err(e) => reply.error(fail("open", &e)),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        h: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        self.spawn(|c| async move {
            match c.read(fh(h), offset, size).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(fail("read", &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        i: INodeNo,
        h: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let inode = self.ino(i);
        let data = data.to_vec();
        let drop_setid = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        // A write-back of the kernel's pages (a shared mapping's) goes where the pages
        // are, whichever handle the kernel picked for it, even one opened `O_APPEND`;
        // and its pages stay under write-back until it is answered, so dropping them
        // before would wait for itself (they hold what it writes anyway).
        let from_pages = write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let append = flags.0 & libc::O_APPEND != 0 && !from_pages;
        // Whether this write went around the kernel's pages.
        let direct = self.direct_writes && !from_pages;
        let kernel = self.kernel.clone();
        self.spawn(|c| async move {
            if drop_setid {
                if let Err(e) = c.drop_setid(inode).await {
                    return reply.error(fail("write", &e));
                }
            }
            if append {
                return crate::caps::append(c, kernel, i, h, offset, data, reply).await;
            }
            match c.write(fh(h), offset, &data).await {
                Ok(n) => {
                    // A read answered while the kernel sent this write may have put the
                    // old bytes back in its cache (see `Client::page_cached`).
                    if direct && c.take_kernel_pages(fh(h)) {
                        crate::caps::drop_pages(&kernel, i, offset, data.len()).await;
                    }
                    reply.written(n)
                }
                Err(e) => reply.error(fail("write", &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        i: INodeNo,
        h: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let inode = self.ino(i);
        // Any close drops the closing process's POSIX locks on the file.
        let mut unlock = self.locks.unlocking(i.0, lock_owner.0);
        self.spawn(|c| async move {
            let flushed = c.flush(fh(h)).await;
            unlock.ready().await;
            let unlocked = c.release_locks(inode, lock_owner.0).await;
            drop(unlock);
            reply_empty(reply, "flush", flushed.and(unlocked));
        });
    }

    fn release(
        &self,
        _req: &Request,
        i: INodeNo,
        h: FileHandle,
        _flags: OpenFlags,
        lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let inode = self.ino(i);
        // The last close of an open file drops its flock and OFD locks.
        let unlocks = self.locks.closing(h.0, i.0, lock_owner.map(|o| o.0));
        self.spawn(|c| async move {
            let mut unlocked = Ok(());
            for mut unlock in unlocks {
                unlock.ready().await;
                unlocked = unlocked.and(c.release_locks(inode, unlock.owner()).await);
            }
            reply_empty(reply, "release", c.release(fh(h)).await.and(unlocked));
        });
    }

    fn getlk(
        &self,
        _req: &Request,
        i: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        reply: ReplyLock,
    ) {
        let inode = self.ino(i);
        let Some(kind) = crate::locks::kind(typ) else { return reply.error(Errno::EINVAL) };
        let req = LockRequest { owner: lock_owner.0, start, end, kind, pid };
        self.spawn(|c| crate::locks::getlk(c, inode, req, reply));
    }

    fn setlk(
        &self,
        _req: &Request,
        i: INodeNo,
        fh_raw: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        reply: ReplyEmpty,
    ) {
        let inode = self.ino(i);
        let Some(kind) = crate::locks::kind(typ) else { return reply.error(Errno::EINVAL) };
        let req = LockRequest { owner: lock_owner.0, start, end, kind, pid };
        let takes = kind != stoa_client::LockKind::Unlock;
        let earlier = self.locks.locking(fh_raw.0, i.0, lock_owner.0, takes);
        let op = |c| async move {
            crate::locks::after(earlier).await;
            crate::locks::setlk(c, inode, req, sleep, reply).await
        };
        // One that sleeps until the holder lets go may rightly wait for good.
        self.run(op, !sleep);
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        h: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.spawn(move |c| async move {
            let synced = match datasync {
                true => c.fdatasync(fh(h)).await,
                false => c.fsync(fh(h)).await,
            };
            reply_empty(reply, "fsync", synced)
        });
    }

    fn opendir(&self, _req: &Request, i: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let inode = self.ino(i);
        let seen = self.client.lost_mark();
        let dirs = self.dirs.clone();
        self.spawn(|c| async move {
            // A directory removed while a handle holds it open is opened again through
            // that handle (`/proc/self/fd/N`), as on a local disk: with its attributes
            // and an empty listing.
            match dirs.attr(&c, inode).await {
                Ok((attr, _, _pin)) => {
                    let id = dirs.open(attr, seen);
                    reply.opened(FileHandle(id), FopenFlags::empty());
                }
                Err(e) => reply.error(fail("opendir", &e)),
            }
        });
    }

    fn readdir(
        &self,
        _req: &Request,
        i: INodeNo,
        h: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(stream) = self.dir(h) else { return reply.error(Errno::EBADF) };
        let ids = self.ids.clone();
        self.spawn(|c| async move {
            let mut stream = stream.lock().await;
            if offset == 0 {
                stream.rewind();
            }
            let mut at = offset as usize;
            stream.taken(at.saturating_sub(2));
            loop {
                let next = at as u64 + 1;
                let dir = fuser::FileType::Directory;
                let full = match at {
                    0 => reply.add(i, next, dir, OsStr::new(".")),
                    1 => reply.add(i, next, dir, OsStr::new("..")),
                    n => match stream.entry(&c, n - 2).await {
                        Ok(Some(e)) => {
                            let (node, kind) = (INodeNo(ids.node(e.ino)), file_type(e.kind));
                            reply.add(node, next, kind, OsStr::from_bytes(&e.name))
                        }
                        // Removed while open: the listing ends, as on a local disk.
                        Ok(None) | Err(FsError::NotFound) => break,
                        Err(e) => return reply.error(fail("readdir", &e)),
                    },
                };
                if full {
                    break;
                }
                at += 1;
            }
            reply.ok();
        });
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        h: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.close(h.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        i: INodeNo,
        h: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let inode = self.ino(i);
        let Some(stream) = self.dir(h) else { return reply.error(Errno::EBADF) };
        // Namespace changes this client made by itself reach meta (a majority's disks)
        // first; the others were there when they returned. One that never got there
        // (its session expired first) fails the sync.
        self.spawn(|c| async move {
            c.sync_namespace().await;
            match c.lost_in(inode, &mut stream.lock().await.seen_lost) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(fail("fsyncdir", &e)),
            }
        });
    }

    /// No ioctl is supported: answered `ENOTTY`, as a local file does, without fuser's
    /// warning. Programs ask one of many files they open (Python's `open` checks
    /// `isatty` with `TCGETS`), which logged a line for each before.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(Errno::ENOTTY);
    }

    /// `ENOSYS`, without fuser's warning: the kernel then seeks by itself (`SEEK_DATA`
    /// finds the whole file data, `SEEK_HOLE` its end, as on filesystems that do not
    /// track holes) and never asks this mount again.
    fn lseek(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: i64,
        _whence: i32,
        reply: ReplyLseek,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// `ENOSYS`, without fuser's warning: the kernel then copies through reads and
    /// writes of this mount (each under its caps) and never asks it again. A copy made
    /// here could not save those: the chunk servers hold no copy operation.
    fn copy_file_range(
        &self,
        _req: &Request,
        _ino_in: INodeNo,
        _fh_in: FileHandle,
        _offset_in: u64,
        _ino_out: INodeNo,
        _fh_out: FileHandle,
        _offset_out: u64,
        _len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::ENOSYS);
    }

    /// Reserving space makes the file long enough, punching a hole or zeroing a range
    /// frees its whole chunks and writes zeros at its ends ([`Client::fallocate`]);
    /// moving ranges (`FALLOC_FL_COLLAPSE_RANGE`, `FALLOC_FL_INSERT_RANGE`) is
    /// `EOPNOTSUPP`, as on filesystems without extents.
    /// The kernel drops its pages of a zeroed range and learns a new size itself.
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        h: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let zeroing = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE;
        if mode & !(libc::FALLOC_FL_KEEP_SIZE | zeroing) != 0 {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let (zero, keep_size) = (mode & zeroing != 0, mode & libc::FALLOC_FL_KEEP_SIZE != 0);
        self.spawn(|c| async move {
            let r = c.fallocate(fh(h), offset, length, zero, keep_size).await;
            reply_empty(reply, "fallocate", r);
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(|c| async move {
            match c.statfs().await {
                Ok(s) => {
                    let bs = u64::from(BLOCK_SIZE_BYTES);
                    let (blocks, free) = (s.total_bytes / bs, s.free_bytes / bs);
                    // Inodes are not a fixed pool; report plenty free.
                    let ffree = u64::from(u32::MAX);
                    let name_max = stoa_types::NAME_LEN_MAX as u32;
                    reply.statfs(
                        blocks,
                        free,
                        free,
                        s.files,
                        ffree,
                        BLOCK_SIZE_BYTES,
                        name_max,
                        BLOCK_SIZE_BYTES,
                    );
                }
                Err(e) => reply.error(fail("statfs", &e)),
            }
        });
    }

    fn setxattr(
        &self,
        _req: &Request,
        i: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let inode = self.ino(i);
        let (name, value) = (bytes(name), value.to_vec());
        if unsupported_xattr(&name) {
            return reply.error(Errno::EOPNOTSUPP);
        }
        self.spawn(|c| async move {
            let r = c.setxattr(inode, &name, &value, flags as u32).await;
            reply_empty(reply, "setxattr", r);
        });
    }

    fn getxattr(&self, _req: &Request, i: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let inode = self.ino(i);
        let name = bytes(name);
        if unsupported_xattr(&name) {
            return reply.error(Errno::ENODATA);
        }
        self.spawn(|c| async move { reply_xattr(reply, size, c.getxattr(inode, &name).await) });
    }

    fn listxattr(&self, _req: &Request, i: INodeNo, size: u32, reply: ReplyXattr) {
        let inode = self.ino(i);
        self.spawn(|c| async move {
            let names = c.listxattr(inode).await.map(|names| {
                names
                    .into_iter()
                    .flat_map(|mut n| {
                        n.push(0);
                        n
                    })
                    .collect()
            });
            reply_xattr(reply, size, names);
        });
    }

    fn removexattr(&self, _req: &Request, i: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let inode = self.ino(i);
        let name = bytes(name);
        self.spawn(|c| async move {
            reply_empty(reply, "removexattr", c.removexattr(inode, &name).await);
        });
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // The mount uses default_permissions: the kernel checks access itself.
        reply.ok();
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
        let dir = self.ino(parent);
        let kind = FileKind::from_mode(mode).unwrap_or(FileKind::File);
        let (name, owner, names) = (bytes(name), owner(req), self.names.clone());
        let (ids, direct_writes, caller) = (self.ids.clone(), self.direct_writes, req.pid());
        self.spawn(|c| async move {
            let mut gone = 0;
            loop {
                // A regular file is created and opened in one meta call (one log entry).
                let opened = if kind == FileKind::File {
                    c.create_open(dir, &name, perm(mode, umask), owner).await
                } else {
                    match c.create(dir, &name, kind, perm(mode, umask), owner, 0).await {
                        Ok(attr) => c.open(attr.ino).await.map(|handle| (attr, handle)),
                        Err(e) => Err(e),
                    }
                };
                let (ino, fa, handle, ttl) = match opened {
                    Ok((attr, handle)) => {
                        let fa = give_new(&names, &ids, parent, &name, &attr);
                        let ttl = c.cache_ttl(attr.ino).min(c.cache_ttl(dir));
                        (attr.ino, fa, handle, ttl)
                    }
                    // The kernel sends CREATE only for a name it believes absent (a
                    // negative entry, or another mount made it meanwhile). Without
                    // O_EXCL the open must find the file instead; EEXIST would be an
                    // error POSIX never gives an open without O_EXCL.
                    Err(FsError::Exists) if flags & libc::O_EXCL == 0 => {
                        let creds = Creds::of(caller, owner.uid, owner.gid);
                        let at = (parent, dir, name.as_slice());
                        match open_existing(&c, (&names, &ids), at, flags, creds).await {
                            Existing::Opened(attr, handle) => {
                                let fa = file_attr(&attr, attr.ino.0);
                                (attr.ino, fa, handle, Duration::ZERO)
                            }
                            Existing::Failed(e) => return reply.error(fail("create", &e)),
                            Existing::Gone if gone < CREATE_TRIES => {
                                gone += 1;
                                continue;
                            }
                            // ESTALE makes the kernel walk the path once more with
                            // LOOKUP_REVAL, which looks the name up afresh and opens
                            // the file as any open of an existing file, its permission
                            // checks and O_TRUNC included.
                            Existing::Gone | Existing::Walk => {
                                tracing::debug!("create of an existing name: reopening");
                                return reply.error(Errno::ESTALE);
                            }
                        }
                    }
                    Err(e) => return reply.error(fail("create", &e)),
                };
                let open = open_flags(&c, ino, handle, flags, direct_writes);
                reply.created(&ttl, &fa, Generation(0), FileHandle(handle.0), open);
                return;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc;
    use std::task::Poll;

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
    }

    /// Waits at most 5 s for `done` to say the task finished, and how many times.
    fn finished(done: &mpsc::Receiver<usize>) -> usize {
        done.recv_timeout(Duration::from_secs(5)).expect("the task never finished")
    }

    #[test]
    fn a_task_done_in_its_first_poll_runs_once_here() {
        let rt = runtime();
        let (tx, done) = mpsc::channel();
        let here = std::thread::current().id();
        let waiting = Arc::new(Waiting::default());
        run_here_first(
            rt.handle(),
            Box::pin(
                async move { tx.send(usize::from(std::thread::current().id() == here)).unwrap() },
            ),
            || Some(waiting.count("test")),
        );
        assert_eq!(finished(&done), 1, "ran on another thread");
        assert_eq!(waiting.len(), 0, "counted as waiting");
    }

    #[test]
    fn a_task_woken_during_its_first_poll_still_finishes() {
        let rt = runtime();
        let (tx, done) = mpsc::channel();
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = polls.clone();
        run_here_first(
            rt.handle(),
            Box::pin(async move {
                std::future::poll_fn(|cx| {
                    if counted.fetch_add(1, Ordering::SeqCst) == 0 {
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                    Poll::Ready(())
                })
                .await;
                tx.send(counted.load(Ordering::SeqCst)).unwrap();
            }),
            || None,
        );
        assert_eq!(finished(&done), 2);
    }

    #[test]
    fn a_task_woken_later_from_anywhere_finishes_once() {
        let rt = runtime();
        let (tx, done) = mpsc::channel();
        let (wake_tx, wake_rx) = tokio::sync::oneshot::channel::<()>();
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let waiting = Arc::new(Waiting::default());
        run_here_first(
            rt.handle(),
            Box::pin(async move {
                wake_rx.await.unwrap();
                tx.send(counted.fetch_add(1, Ordering::SeqCst) + 1).unwrap();
            }),
            || Some(waiting.count("test")),
        );
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(runs.load(Ordering::SeqCst), 0, "ran before it was woken");
        assert_eq!(waiting.len(), 1, "not counted while it waits");
        std::thread::spawn(move || wake_tx.send(()).unwrap()).join().unwrap();
        assert_eq!(finished(&done), 1);
        // The count ends just after the task's last step.
        for _ in 0..100 {
            if waiting.len() == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("still counted after it ended");
    }
}
