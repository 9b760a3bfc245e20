//! Capabilities on the client side (docs/flows/caps.md): what this session may cache,
//! the events stream that brings recalls, and the recall itself.
//!
//! ```text
//!  op on ino --> usable cap? --yes--> gate (shared) --> cached attr / buffered write
//!            |             \-no, being recalled--> uncapped: read the chunks, write through
//!            \-no--> GetCaps at the leader --> store the grant unless already recalled
//!
//!  events task: CapEvents (long poll, carries held caps) --> Recall{ino, seq}
//!     --> gate (alone): drop the cap, flush write-behind, drop readahead and size
//!     --> kernel: every cached name expired (or inval_entry for each name given out on
//!         kernels before 6.16), inval_inode (pages, attrs),
//!         again while uncapped reads or writes ran meanwhile (they hold kernel pages)
//!     --> CapsReleased{ino, seq}
//! ```
//!
//! Bounded: a client keeps at most `caps_max` caps. Past it, the events task gives the
//! least recently used back, a quarter of the bound at a time, through the same steps as
//! a recall (users waited for, write-behind flushed, kernel caches dropped, then the ack
//! that tells the leader it may forget the grant), skipping files open here. Use is
//! counted in polls of the events stream (a tick a second or so), not read from a clock
//! on every cached `stat`.
//!
//! Uncapped operations during a recall are safe: nobody else can hold a conflicting cap
//! until this client acks, so the chunks and meta hold the truth. They must not wait for
//! a grant, because the kernel holds the pages they fill locked, and the invalidation
//! the recall is waiting for would wait for those pages.

use crate::client::{Client, Shared};
use crate::session::unexpected;
use std::collections::{BTreeMap, HashMap};
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};
use stoa_proto::{cap_seq_term, CapMode, CapRef, DirGrant, HeldCap, MetaOp, MetaResponse, Xattrs};
use stoa_types::{
    Attr, DirEntry, FileKind, FsError, InodeId, SessionId, SetAttr, Timestamp, NAME_LEN_MAX,
};
use tokio::sync::{Notify, OwnedRwLockReadGuard, RwLock};

mod access;
mod ahead;
mod answers;
mod events;
mod pages;

pub(crate) use access::Access;
pub use access::Pinned;
use answers::{keep_newest, trace_answer, Unheld};
use events::{forget, invalidate_kernel};
pub(crate) use events::{send_released, spawn_events};

/// A name in a directory: the directory and the name.
pub type Entry<'a> = (InodeId, &'a [u8]);

/// The longest TTL handed to the kernel under a cap. Shorter when the cap's validity
/// ends sooner (invariant 7).
const KERNEL_TTL_MAX: Duration = Duration::from_secs(60);
/// How long a cap call may wait at the leader: a dead holder blocks it for up to a lease.
const GRANT_TIMEOUT_EXTRA: Duration = Duration::from_secs(5);
/// How long a poll of the events stream may take at the leader (it holds it a second).
const POLL_TIMEOUT: Duration = Duration::from_secs(4);
/// Pause after a failed poll.
const POLL_RETRY: Duration = Duration::from_millis(100);
/// How long caps dropped on the client's own removals gather before one call tells the
/// leader of them all, as the namespace batches gather.
const RELEASE_GATHER: Duration = Duration::from_millis(5);
/// Pause while uncapped operations of a recalled inode finish.
const UNCAPPED_WAIT: Duration = Duration::from_millis(2);
/// How long after a recall of a directory whose names the kernel cached the kernel gets
/// its names with no TTL (see `Table::busy`).
const BUSY_DIR_FOR: Duration = Duration::from_secs(10);
/// The recalled sequence of a cap this client dropped on its own and has not told the
/// leader of yet: above every grant, so none is cached until the telling.
const UNTOLD: u64 = u64::MAX;
/// How many names in directories held by nobody one inode keeps ([`Held::reached`]).
const REACHED_MAX: usize = 16;

/// The longest a grant call may wait for its answer: a lease (a dead holder blocks it
/// that long) and [`GRANT_TIMEOUT_EXTRA`].
fn grant_call_max(sh: &Shared) -> Duration {
    Duration::from_millis(sh.session.grant().lease_ms) + GRANT_TIMEOUT_EXTRA
}

/// The kernel's caches, as a front end exposes them (FUSE notify). Calls may block.
pub trait KernelCache: Send + Sync {
    /// Drops the kernel's cached attributes and pages of `ino`.
    fn inval_inode(&self, ino: InodeId);
    /// Drops the kernel's cached entry `name` in directory `parent`. The kernel does it
    /// under the directory's lock, so this waits for the operations in that directory.
    fn inval_entry(&self, parent: InodeId, name: &[u8]);
    /// Makes every name the kernel cached stale at once, waiting for no directory: the
    /// kernel asks again on its next use of each. False when the kernel cannot (older
    /// than Linux 6.16); then names are dropped one by one with [`Self::inval_entry`].
    fn expire_all_names(&self) -> bool;
    /// Whether [`Self::expire_all_names`] works here, as far as known: true until the
    /// kernel refused it once.
    fn can_expire_all_names(&self) -> bool;
}

/// One cap this client holds.
struct Held {
    mode: CapMode,
    seq: u64,
    /// Unique to this cap, from its first grant until it is dropped, over every inode
    /// and generation: what the file's data pages are kept under (`file_pages.rs`).
    id: u64,
    /// The inode's version when this client began caching it: what the first grant
    /// since the cap was last dropped answered (0 when not known). A new leader recalls
    /// the cap if the inode changed since (caps.md, invariant 8).
    since: u64,
    attr: Option<Attr>,
    /// Every xattr of the inode, as its grant brought them, while `attr` is kept: any
    /// change of them elsewhere recalls the cap, and one made here forgets `attr`.
    xattrs: Option<Xattrs>,
    /// Names looked up in this directory under the cap, and their inodes.
    names: HashMap<Vec<u8>, InodeId>,
    /// Names a lookup found this inode at in directories this client held no cap on (a
    /// contended directory, granted to nobody): a removal of one of them through meta
    /// forgets the attributes here, which no recall does for this client's own change
    /// (`namespace.rs`, `forget_names`). At most [`REACHED_MAX`]; past that the
    /// attributes are not kept.
    reached: Vec<(InodeId, Vec<u8>)>,
    /// Whether the kernel may cache one of `names` past this moment: one was handed to
    /// it with a TTL, or the kernel moved a cached entry here in a rename. Only then
    /// does dropping the cap invalidate the names in the kernel, which waits for the
    /// directory's lock.
    kernel_names: bool,
    /// Whether the kernel may cache, past this moment, that a name is not in this
    /// directory: a name missing from `listing` was handed to it with a TTL
    /// ([`Caps::missing_ttl`]). Such names are not kept: dropping the cap or the listing
    /// expires every name the kernel holds instead (caps.md invariant 31).
    kernel_missing: bool,
    /// Every entry of this directory, under an exclusive cap taken with its listing
    /// (`dirops`): lookups and listings are answered from it and changes are made in it.
    /// In name order, as a listing pages it: a page is a range, not a sort.
    listing: Option<BTreeMap<Vec<u8>, (InodeId, FileKind)>>,
    /// Pages of this directory's listing meta gave under a shared cap, by the name
    /// they start after and their limit (`pages.rs`).
    pages: HashMap<(Vec<u8>, u32), pages::Page>,
    /// The events tick (`Table::tick`) of the cap's last use, for giving back the least
    /// recently used ones.
    used: u64,
    /// The [`Table::forgets`] count at which `attr` was last forgotten: an answer to a
    /// call sent before then is older than what made it stale (caps.md invariant 15).
    forgotten: u64,
    /// The newest version of an answer refused while nothing was cached: no older one
    /// may be cached after it ([`keep_newest`]).
    refused: u64,
}

impl Held {
    /// Drops the cached attributes at forget `now` ([`Table::next_forget`]).
    fn forget_attr(&mut self, now: u64) {
        self.attr = None;
        self.xattrs = None;
        self.forgotten = now;
    }
}

/// An inode being recalled: operations on it run uncapped and are counted.
#[derive(Default)]
struct Recalling {
    inflight: u32,
    /// Uncapped operations finished so far.
    served: u64,
}

#[derive(Default)]
struct Table {
    held: HashMap<InodeId, Held>,
    /// The highest sequence recalled per inode, and when it last was: a grant at or
    /// below it came too late. [`UNTOLD`] marks a cap dropped here until the leader is
    /// told ([`Table::drop_own`]).
    recalled: HashMap<InodeId, (u64, Instant)>,
    recalling: HashMap<InodeId, Recalling>,
    gates: HashMap<InodeId, Arc<RwLock<()>>>,
    /// Caps are usable until then (the last renewal sent, plus most of a lease).
    valid_until: Option<Instant>,
    /// The newest meta leader term a poll answer named. Grants of older terms arriving
    /// later are used once and not cached: that leader's successor may not know them.
    term: u64,
    /// How many times every cap was dropped at once (they lapsed, or the session was
    /// lost). Writes buffered under caps of an earlier generation are never sent.
    generation: u64,
    /// Advanced by every poll of the events stream: the clock of `Held::used`.
    tick: u64,
    /// How many times [`Caps::forget`] ran: the clock of `Held::forgotten`, read by a
    /// caller before it sends a call whose answer carries attributes.
    forgets: u64,
    /// Directories recalled while the kernel cached names in them, and until when the
    /// kernel gets their names with no TTL. The kernel invalidates a cached name only
    /// under the directory's lock, which it holds while this mount's own change there
    /// waits at meta; when that change waits for another mount's ack of the directory
    /// and that mount's change waits for this one's ack, the two wait for each other
    /// (meta lets the later go after 300 ms without the ack). Names with no TTL need
    /// no invalidation: the kernel asks again on every use, and this client answers
    /// from its own cache while it holds the cap. Not used where the kernel expires
    /// all names at once (Linux 6.16+), which takes no directory lock.
    busy: HashMap<InodeId, Instant>,
    /// Caps this client dropped on its own, not yet told to the leader: those of files
    /// whose last name it removed itself (see [`send_released`]), each with the queued
    /// change that removed it, which meta must have applied first.
    released: Vec<(CapRef, u64)>,
    /// Inodes whose own drop the leader has been told of, with the forget number taken
    /// then and when: a grant asked before (an older [`Caps::epoch`]) may be one the
    /// leader made before it dropped the cap, and is never cached; one asked after is.
    released_at: HashMap<InodeId, (u64, Instant)>,
    /// Whether a task is sending `released`.
    releasing: bool,
    /// When [`Table::sweep`] may next run.
    sweep_at: Option<Instant>,
    /// The directories pages were kept of, oldest first, each with the page's entries
    /// (`pages.rs`), and those entries' sum.
    paged: std::collections::VecDeque<(InodeId, usize)>,
    paged_entries: usize,
    /// What forgets left of inodes this client holds no cap on (forgotten while not
    /// held, or held until their cap went), for as long as a call sent before can still
    /// be answered: a grant asked for before such a forget may arrive after it and make
    /// the inode held again, and must find the forget there (caps.md invariant 15).
    unheld: HashMap<InodeId, Unheld>,
    /// The forget number of the last [`Caps::forget_linked`]: an answer counting more
    /// than one link, to a call sent before it, may count a name this client removed
    /// since, and is not cached.
    linked: u64,
}

impl Table {
    /// Counts one more forget and returns its number, for `Held::forgotten`.
    fn next_forget(&mut self) -> u64 {
        self.forgets += 1;
        self.forgets
    }

    /// The attributes of `ino` if it is held exclusively with them: all that changes
    /// them goes through this client, so they are exact (the caps' validity aside).
    fn owned(&mut self, ino: InodeId) -> Option<&mut Attr> {
        let h = self.held.get_mut(&ino).filter(|h| h.mode == CapMode::Exclusive)?;
        h.attr.as_mut()
    }

    /// Records that file `child`, held with its attributes, got a name (`up`) or lost
    /// one at `at`, as meta's link or unlink will count it: one version.
    fn count_link(&mut self, child: InodeId, up: bool, at: Timestamp) {
        if let Some(attr) = self.held.get_mut(&child).and_then(|h| h.attr.as_mut()) {
            attr.nlink =
                if up { attr.nlink.saturating_add(1) } else { attr.nlink.saturating_sub(1) };
            attr.ctime = at;
            attr.version += 1;
        }
    }

    /// Notes that a lookup found held inode `ino` at `name` in `parent`, which this client
    /// holds no cap on ([`Held::reached`]).
    fn reached_at(&mut self, ino: InodeId, parent: InodeId, name: &[u8]) {
        let Some(h) = self.held.get(&ino) else { return };
        if h.reached.iter().any(|(p, n)| *p == parent && n == name) {
            return;
        }
        let full = h.reached.len() >= REACHED_MAX;
        let now = if full { self.next_forget() } else { 0 };
        let h = self.held.get_mut(&ino).expect("held, looked at above");
        if full {
            h.reached.clear();
            h.forget_attr(now);
        } else {
            h.reached.push((parent, name.to_vec()));
        }
    }

    /// Drops the cap on `ino`, a file whose last name this client removed and which it
    /// does not have open: nothing here can reach it any more (no name, no handle), and
    /// the leader hears of it once the removal is applied ([`Caps::give_back_after`])
    /// instead of having to recall it. The release names every grant (`u64::MAX`: the
    /// client does not know the sequence of a cap on a file it created), so a grant of
    /// the file still on its way is marked recalled here too, and never cached when it
    /// arrives. Until the leader has been told ([`Caps::release_told`]): the file may
    /// still be reached by inode (a handle opened from a name the kernel had cached, or
    /// a create that found the name just before the removal), and its next grant must
    /// be cached.
    fn drop_own(&mut self, ino: InodeId) {
        if self.unhold(ino).is_some() {
            self.recalled.insert(ino, (UNTOLD, Instant::now()));
        }
    }

    /// Whether a grant of `ino` at `seq`, asked for at epoch `sent`, came too late to be
    /// cached: from an older leader term, or recalled or dropped after the leader made it.
    fn late(&self, ino: InodeId, seq: u64, sent: u64) -> bool {
        cap_seq_term(seq) < self.term
            || self.recalled.get(&ino).is_some_and(|&(r, _)| r >= seq)
            || self.released_at.get(&ino).is_some_and(|&(epoch, _)| sent < epoch)
    }

    /// Whether this client dropped its cap on `ino` itself and has not told the leader
    /// yet ([`Table::drop_own`]).
    fn untold(&self, ino: InodeId) -> bool {
        self.recalled.get(&ino).is_some_and(|&(seq, _)| seq == UNTOLD)
    }

    /// Forgets, once per `max_call`, what no answer or recall can still need, so that a
    /// long-lived mount keeps only what the last two such spans brought: recalled
    /// sequences and own drops told at least `max_call` ago (no grant call asked before
    /// them can still be answered, and a recall is not resent once acked), expired busy
    /// directories, and the gates nobody holds or waits for (each is taken under this
    /// table's lock, so a gate in use is never replaced).
    fn sweep(&mut self, now: Instant, max_call: Duration) {
        if self.sweep_at.is_some_and(|at| now < at) {
            return;
        }
        self.sweep_at = Some(now + max_call);
        let recent = |at: Instant| now.saturating_duration_since(at) < max_call;
        self.recalled.retain(|_, &mut (seq, at)| seq == UNTOLD || recent(at));
        self.released_at.retain(|_, &mut (_, at)| recent(at));
        self.unheld.retain(|_, u| recent(u.at));
        self.busy.retain(|_, until| *until > now);
        self.gates.retain(|_, gate| Arc::strong_count(gate) > 1);
    }
}

/// The client's caps.
pub(crate) struct Caps {
    table: Mutex<Table>,
    kernel: OnceLock<Arc<dyn KernelCache>>,
    /// The most caps kept (see the module doc, "Bounded").
    max: usize,
    /// Whether a task is giving caps back.
    trimming: AtomicBool,
    /// Woken when the leader has been told of caps this client dropped on its own.
    told: Notify,
    /// Directories listed lately, for looking names up ahead.
    lately: Mutex<ahead::Listed>,
}

impl Caps {
    pub fn new(max: usize) -> Caps {
        Caps {
            table: Mutex::new(Table::default()),
            kernel: OnceLock::new(),
            max,
            trimming: AtomicBool::new(false),
            told: Notify::new(),
            lately: Mutex::new(ahead::Listed::default()),
        }
    }

    /// The usable cap on `ino`, marked used now.
    fn usable(t: &mut Table, ino: InodeId) -> Option<&mut Held> {
        Caps::remaining(t)?;
        let tick = t.tick;
        let h = t.held.get_mut(&ino)?;
        h.used = tick;
        Some(h)
    }

    /// The caps to give back so that at most three quarters of the bound stay: the
    /// least recently used, except those of inodes `open` says are open here or that
    /// are being recalled. Empty while the bound is kept.
    fn over_bound(&self, open: impl Fn(InodeId) -> bool) -> Vec<CapRef> {
        let t = self.lock();
        if t.held.len() <= self.max {
            return Vec::new();
        }
        let keep = self.max - self.max / 4;
        let mut idle: Vec<(u64, InodeId, u64)> = t
            .held
            .iter()
            .filter(|(ino, _)| !t.recalling.contains_key(ino) && !open(**ino))
            .map(|(ino, h)| (h.used, *ino, h.seq))
            .collect();
        idle.sort_unstable();
        idle.truncate(t.held.len().saturating_sub(keep));
        idle.into_iter().map(|(_, ino, seq)| CapRef { ino, seq }).collect()
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("caps lock poisoned")
    }

    /// Taken after the table's lock, never before it.
    fn lately(&self) -> MutexGuard<'_, ahead::Listed> {
        self.lately.lock().expect("listed directories lock poisoned")
    }

    pub fn set_kernel(&self, kernel: Arc<dyn KernelCache>) {
        let _ = self.kernel.set(kernel);
    }

    /// The usable cap on `ino` of at least `mode`, marked used now.
    fn usable_as(t: &mut Table, ino: InodeId, mode: CapMode) -> Option<&mut Held> {
        Caps::usable(t, ino).filter(|h| h.mode >= mode)
    }

    /// What is left of the caps' validity, if any.
    fn remaining(t: &Table) -> Option<Duration> {
        t.valid_until.and_then(|until| until.checked_duration_since(Instant::now()))
    }

    /// Whether this client holds a usable cap of at least `mode` on `ino`.
    pub fn holds(&self, ino: InodeId, mode: CapMode) -> bool {
        self.held_in(ino, mode).is_some()
    }

    /// The caps' generation, if this client holds a usable cap of at least `mode` on
    /// `ino`: for a change queued under that cap.
    pub fn held_in(&self, ino: InodeId, mode: CapMode) -> Option<u64> {
        let mut t = self.lock();
        let held = Caps::usable_as(&mut t, ino, mode).is_some();
        held.then_some(t.generation)
    }

    /// The identity of the usable cap of at least `mode` this client holds on `ino`, if
    /// it holds one ([`Held::id`]).
    pub fn held_id(&self, ino: InodeId, mode: CapMode) -> Option<u64> {
        Caps::usable_as(&mut self.lock(), ino, mode).map(|h| h.id)
    }

    /// The kernel TTL for what this client knows of `ino` (its attributes, and the
    /// names in it when a directory): zero without a usable cap, or while the directory
    /// is busy (see `Table::busy`).
    pub fn ttl(&self, ino: InodeId) -> Duration {
        let mut t = self.lock();
        let Some(ttl) = Caps::kernel_ttl(&t, ino) else { return Duration::ZERO };
        match t.held.get_mut(&ino) {
            Some(h) => {
                h.kernel_names = true;
                ttl
            }
            None => Duration::ZERO,
        }
    }

    /// What is left of the caps' validity, at most [`KERNEL_TTL_MAX`], unless `ino` is a
    /// busy directory (see `Table::busy`): the longest the kernel may keep what it is
    /// told under the cap on `ino`.
    fn kernel_ttl(t: &Table, ino: InodeId) -> Option<Duration> {
        let left = Caps::remaining(t)?;
        let busy = t.busy.get(&ino).is_some_and(|until| *until > Instant::now());
        (!busy).then(|| left.min(KERNEL_TTL_MAX))
    }

    /// The kernel TTL for the absence of `name` from directory `dir`: zero unless this
    /// client holds `dir` with its listing, the listing lacks the name, and the kernel
    /// can expire every cached name at once (the only way these are dropped). The caller
    /// holds a pin on `dir` until the kernel has the answer.
    pub fn missing_ttl(&self, dir: InodeId, name: &[u8]) -> Duration {
        if !self.kernel.get().is_some_and(|k| k.can_expire_all_names()) {
            return Duration::ZERO;
        }
        let mut t = self.lock();
        let Some(ttl) = Caps::kernel_ttl(&t, dir) else { return Duration::ZERO };
        match Caps::usable(&mut t, dir) {
            Some(h)
                if h.mode == CapMode::Exclusive
                    && h.listing.as_ref().is_some_and(|l| !l.contains_key(name)) =>
            {
                h.kernel_missing = true;
                ttl
            }
            _ => Duration::ZERO,
        }
    }

    /// The cached attributes of `ino` and their kernel TTL, under a usable cap.
    pub fn cached_attr(&self, ino: InodeId) -> Option<(Attr, Duration)> {
        let mut t = self.lock();
        let left = Caps::remaining(&t)?;
        let attr = Caps::usable(&mut t, ino)?.attr.clone()?;
        Some((attr, left.min(KERNEL_TTL_MAX)))
    }

    /// The xattrs of `ino` its grant brought, under a usable cap (forgotten with its
    /// attributes).
    pub fn cached_xattrs(&self, ino: InodeId) -> Option<Xattrs> {
        let mut t = self.lock();
        Caps::remaining(&t)?;
        Caps::usable(&mut t, ino)?.xattrs.clone()
    }

    /// Whether `name` in `dir` and its inode's attributes are cached under usable caps,
    /// without counting it as a use.
    fn peek(t: &Table, dir: InodeId, name: &[u8]) -> bool {
        let ino = t.held.get(&dir).and_then(|h| h.names.get(name));
        Caps::remaining(t).is_some()
            && ino.and_then(|ino| t.held.get(ino)).is_some_and(|h| h.attr.is_some())
    }

    /// The inode cached for `name` in `parent`, under a usable cap on the directory.
    pub fn cached_name(&self, parent: InodeId, name: &[u8]) -> Option<InodeId> {
        Caps::usable(&mut self.lock(), parent)?.names.get(name).copied()
    }

    /// Records that the kernel holds entry `name` of `parent`, for `ino`, so that a recall
    /// of the directory's cap drops it; `moved` when the kernel moved its cached entry
    /// there in a rename, with whatever TTL it had. False when no cap on `parent` is held.
    fn note_name(&self, parent: InodeId, name: &[u8], ino: InodeId, moved: bool) -> bool {
        let mut t = self.lock();
        if Caps::remaining(&t).is_none() {
            return false;
        }
        let Some(h) = t.held.get_mut(&parent) else { return false };
        h.names.insert(name.to_vec(), ino);
        h.kernel_names |= moved;
        true
    }

    /// What the listing of `parent` says of `name`: `None` without a usable exclusive
    /// cap taken with the listing; else the inode the name leads to, if any.
    pub fn listed(&self, parent: InodeId, name: &[u8]) -> Option<Option<InodeId>> {
        let t = self.lock();
        Caps::remaining(&t)?;
        let h = t.held.get(&parent).filter(|h| h.mode == CapMode::Exclusive)?;
        Some(h.listing.as_ref()?.get(name).map(|&(ino, _)| ino))
    }

    /// A page of the listing of `dir` in name order, as meta's `ReadDir` gives it: up to
    /// `limit` entries named after `after`, and whether more follow. `None` without a
    /// usable exclusive cap taken with the listing: nobody else can change the
    /// directory meanwhile, and this client's own changes, some still on their way to
    /// meta, are in it, as for lookups.
    pub fn list(&self, dir: InodeId, after: &[u8], limit: u32) -> Option<(Vec<DirEntry>, bool)> {
        let t = self.lock();
        Caps::remaining(&t)?;
        let h = t.held.get(&dir).filter(|h| h.mode == CapMode::Exclusive)?;
        let mut later =
            h.listing.as_ref()?.range::<[u8], _>((Bound::Excluded(after), Bound::Unbounded));
        let page = later
            .by_ref()
            .take(limit as usize)
            .map(|(name, &(ino, kind))| DirEntry { name: name.clone(), ino, kind })
            .collect();
        let more = later.next().is_some();
        Some((page, more))
    }

    /// The regular files of the listing of `dir` that this client does not hold
    /// exclusively, from `name` on in name order, `count` at most: what a removal of
    /// `name` takes ahead ([`crate::Client::take_files`]). Empty without the listing.
    pub fn unowned_files_from(&self, dir: InodeId, name: &[u8], count: usize) -> Vec<Vec<u8>> {
        let t = self.lock();
        let listing = Caps::remaining(&t).and_then(|_| t.held.get(&dir)?.listing.as_ref());
        let Some(listing) = listing else { return Vec::new() };
        let owned = |ino| t.held.get(ino).is_some_and(|h| h.mode == CapMode::Exclusive);
        listing
            .range::<[u8], _>((Bound::Included(name), Bound::Unbounded))
            .filter(|(_, (ino, kind))| *kind == FileKind::File && !owned(ino))
            .take(count)
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether this client holds the exclusive cap on `ino` with its attributes: it alone
    /// caches the inode, and knows it whole.
    pub fn owns(&self, ino: InodeId) -> Option<Attr> {
        let mut t = self.lock();
        Caps::remaining(&t)?;
        t.owned(ino).cloned()
    }

    /// Records an attribute change (mode, owner, times) this client made itself, at
    /// `at`, of `ino`, which it holds exclusively with its attributes: returns the new attributes and the caps
    /// generation, or `None` (nothing recorded) when the cap or its attributes are gone.
    pub fn record_attr(&self, ino: InodeId, set: &SetAttr, at: Timestamp) -> Option<(Attr, u64)> {
        let mut t = self.lock();
        Caps::remaining(&t)?;
        let generation = t.generation;
        let attr = t.owned(ino)?;
        set.apply(attr, at);
        attr.version += 1;
        Some((attr.clone(), generation))
    }

    /// How many entries the listing of directory `ino` has, if this client holds it.
    pub fn listing_len(&self, ino: InodeId) -> Option<usize> {
        let t = self.lock();
        Caps::remaining(&t)?;
        t.held.get(&ino)?.listing.as_ref().map(BTreeMap::len)
    }

    /// Stores an exclusive directory cap with its listing, unless a recall named it;
    /// `sent` is the [`Caps::epoch`] the grant was asked for at.
    pub fn store_dir(&self, grant: &DirGrant, sent: u64) -> bool {
        let mut t = self.lock();
        let ino = grant.attr.ino;
        if t.late(ino, grant.seq, sent) {
            return false;
        }
        let listing = grant.entries.iter().map(|e| (e.name.clone(), (e.ino, e.kind))).collect();
        let linked = t.linked;
        let h = t.hold(ino, || Held { since: grant.attr.version, ..empty_held() });
        h.mode = CapMode::Exclusive;
        h.seq = h.seq.max(grant.seq);
        keep_newest(h, &grant.attr, sent, linked);
        h.listing = Some(listing);
        h.pages.clear();
        true
    }

    /// Records a change this client made itself in directory `parent`, which it holds
    /// with its listing: `name` now leads to `child` (a new inode, held exclusively,
    /// whose name the kernel is given; or a file linked here), or to nothing. Returns
    /// the caps generation the change was made under, or `None` (nothing recorded) when
    /// a cap is no longer usable or the listing is gone.
    pub fn record_change(&self, parent: InodeId, name: &[u8], change: Change) -> Option<u64> {
        let mut t = self.lock();
        Caps::remaining(&t)?;
        let generation = t.generation;
        if let Change::Linked { child, .. } = &change {
            // Its link count is known exactly only under its exclusive cap.
            t.owned(*child)?;
        }
        let h = t.held.get_mut(&parent).filter(|h| h.mode == CapMode::Exclusive)?;
        let listing = h.listing.as_mut()?;
        let (at, subdirs) = match &change {
            Change::Created(attr) => {
                listing.insert(name.to_vec(), (attr.ino, attr.kind));
                h.names.insert(name.to_vec(), attr.ino);
                (attr.ctime, i32::from(attr.kind == FileKind::Dir))
            }
            Change::Linked { child, kind, at } => {
                listing.insert(name.to_vec(), (*child, *kind));
                h.names.insert(name.to_vec(), *child);
                (*at, 0)
            }
            Change::Removed { at, dir, .. } => {
                listing.remove(name);
                // The kernel dropped its entry itself; a lookup without the listing
                // (dropped later) must not find the name in what the kernel was given.
                h.names.remove(name);
                (*at, -i32::from(*dir))
            }
        };
        if let Some(attr) = &mut h.attr {
            attr.nlink = attr.nlink.saturating_add_signed(subdirs);
            attr.mtime = at;
            attr.ctime = at;
            attr.version += 1;
        }
        match change {
            Change::Created(attr) => {
                let (ino, listing) = (attr.ino, (attr.kind == FileKind::Dir).then(BTreeMap::new));
                let mode = CapMode::Exclusive;
                let used = t.tick;
                let since = attr.version;
                // Made here just now: it has no xattrs, and only a call of this client's
                // can give it some until another session recalls the cap.
                let (attr, xattrs) = (Some(attr), Some(Vec::new()));
                let held = Held { mode, since, attr, xattrs, listing, used, ..empty_held() };
                t.held.insert(ino, held);
            }
            Change::Linked { child, at, .. } => t.count_link(child, true, at),
            Change::Removed { child, at, keep, .. } => match keep {
                true => t.count_link(child, false, at),
                false => t.drop_own(child),
            },
        }
        Some(generation)
    }

    /// Records a rename this client made itself of `child` from `from` to `to`, both
    /// in directories it holds with their listings, over `replaced` (with whether its
    /// cap is kept, see [`Change::Removed`]). Returns the caps generation, or `None`
    /// (nothing recorded) when a cap or listing is gone.
    pub fn record_rename(
        &self,
        (from, to): (Entry<'_>, Entry<'_>),
        child: InodeId,
        replaced: Option<(InodeId, bool)>,
        at: Timestamp,
    ) -> Option<u64> {
        let mut t = self.lock();
        Caps::remaining(&t)?;
        let generation = t.generation;
        let usable = |h: Option<&Held>| {
            h.is_some_and(|h| h.mode == CapMode::Exclusive && h.listing.is_some())
        };
        if !usable(t.held.get(&from.0)) || !usable(t.held.get(&to.0)) {
            return None;
        }
        // The new name is listed with the kind the old one was.
        let listed = |h: &Held| h.listing.as_ref()?.get(from.1).map(|&(_, kind)| kind);
        let kind = t.held.get(&from.0).and_then(listed)?;
        for (dir, name, entry) in [(from.0, from.1, None), (to.0, to.1, Some(child))] {
            let h = t.held.get_mut(&dir).expect("checked above");
            let listing = h.listing.as_mut().expect("checked above");
            match entry {
                Some(ino) => {
                    listing.insert(name.to_vec(), (ino, kind));
                    h.names.insert(name.to_vec(), ino);
                    // The kernel moved its entry here, TTL and all.
                    h.kernel_names = true;
                }
                None => {
                    listing.remove(name);
                    h.names.remove(name);
                }
            }
            if let Some(attr) = &mut h.attr {
                attr.mtime = at;
                attr.ctime = at;
                attr.version += 1;
            }
        }
        if let Some(h) = t.held.get_mut(&child) {
            if let Some(attr) = &mut h.attr {
                attr.ctime = at;
                attr.version += 1;
            }
        }
        match replaced {
            Some((ino, true)) => {
                if let Some(attr) = t.held.get_mut(&ino).and_then(|h| h.attr.as_mut()) {
                    attr.nlink = attr.nlink.saturating_sub(1);
                    attr.ctime = at;
                    attr.version += 1;
                }
            }
            Some((ino, false)) => t.drop_own(ino),
            None => {}
        }
        Some(generation)
    }

    /// Gives back, with the next [`send_released`], the caps of `inos` this client
    /// dropped on its own in queued change `change`, once meta has applied it. Not
    /// before: another mount with one of those files open (the cap recalled from it,
    /// the handle kept) asks for a grant to `fstat` it, which the leader would answer
    /// at once from the state before the removal (a link count of 1 after the unlink
    /// had returned), where the cap still held makes the leader recall it first, and
    /// the recall waits for the removal.
    pub fn give_back_after(&self, inos: &[InodeId], change: u64) {
        let mut t = self.lock();
        for &ino in inos {
            if t.untold(ino) {
                t.released.push((CapRef { ino, seq: u64::MAX }, change));
            }
        }
    }

    /// The leader has been told of `released`, caps this client dropped on its own (or
    /// the call failed, and the leader recalls them as it would any other: this client
    /// holds none of them and acks). A grant of one of those files asked from now on is
    /// the leader's answer after the drop, and is cached; grants asked before never are.
    pub fn release_told(&self, released: &[CapRef]) {
        let mut t = self.lock();
        let epoch = t.next_forget();
        let now = Instant::now();
        for r in released {
            if t.untold(r.ino) {
                t.recalled.remove(&r.ino);
                t.released_at.insert(r.ino, (epoch, now));
            }
        }
        drop(t);
        self.told.notify_waiters();
    }

    /// Waits until the leader has been told of this client's own drop of the cap on
    /// `ino`, if one is on its way: until then no grant of it is cached.
    async fn until_release_told(&self, ino: InodeId) {
        loop {
            let told = self.told.notified();
            tokio::pin!(told);
            told.as_mut().enable();
            if !self.lock().untold(ino) {
                return;
            }
            told.await;
        }
    }

    /// Drops the listing of `dir`: a change made in it was refused by meta, so the
    /// listing may be wrong; the next change there takes it again.
    pub fn drop_listing(&self, dir: InodeId) {
        self.forget(&[dir], &[]);
    }

    /// The caps being recalled, each with the uncapped operations it still counts, and
    /// whether the recall holds its gate (for [`crate::Client::busy`]).
    pub fn busy(&self) -> Vec<String> {
        let t = self.lock();
        let mut recalls: Vec<_> = t.recalling.iter().collect();
        recalls.sort_unstable_by_key(|(ino, _)| **ino);
        let report = |(ino, r): (&InodeId, &Recalling)| {
            let gated = t.gates.get(ino).is_some_and(|g| g.try_read().is_err());
            format!("recall of inode {ino}: {} operations uncapped, gate held {gated}", r.inflight)
        };
        recalls.into_iter().map(report).collect()
    }

    fn gate(&self, ino: InodeId) -> Arc<RwLock<()>> {
        self.lock().gates.entry(ino).or_default().clone()
    }

    /// Stores a grant unless a recall already named it, or it is none (sequence 0: the
    /// leader granted nobody the inode, a contended directory). Returns whether it was
    /// stored.
    fn store(&self, grant: &Grant, dir: Option<(InodeId, &[u8])>) -> bool {
        let mut t = self.lock();
        let mut stored = false;
        let (used, linked, ino) = (t.tick, t.linked, grant.attr.ino);
        if grant.seq != 0 && !t.late(ino, grant.seq, grant.sent) {
            let since = grant.attr.version;
            let h =
                t.hold(ino, || Held { mode: grant.mode, seq: grant.seq, since, ..empty_held() });
            h.mode = h.mode.max(grant.mode);
            h.seq = h.seq.max(grant.seq);
            h.used = used;
            let kept = keep_newest(h, &grant.attr, grant.sent, linked);
            trace_answer("grant", &grant.attr, grant.sent, h, kept);
            if kept {
                h.xattrs = grant.xattrs.clone();
            }
            stored = true;
        }
        if let Some((parent, name)) = dir {
            if stored && grant.dir_seq != 0 && !t.late(parent, grant.dir_seq, grant.sent) {
                let held = Held { seq: grant.dir_seq, since: grant.dir_version, ..empty_held() };
                let h = t.held.entry(parent).or_insert(held);
                h.seq = h.seq.max(grant.dir_seq);
                h.used = used;
                h.names.insert(name.to_vec(), grant.attr.ino);
            } else if stored {
                t.reached_at(ino, parent, name);
            }
        }
        stored
    }

    /// The inodes held here that a lookup found at `name` in `parent` while this client
    /// held no cap on `parent` ([`Held::reached`]).
    pub fn reached_by(&self, parent: InodeId, name: &[u8]) -> Vec<InodeId> {
        let t = self.lock();
        let at = |h: &Held| h.reached.iter().any(|(p, n)| *p == parent && n == name);
        t.held.iter().filter(|(_, h)| at(h)).map(|(&ino, _)| ino).collect()
    }

    /// The newest leader term known, and every cap held for the events stream to carry
    /// (a new leader takes it as reassertion), or none if the leader of that term has
    /// taken the session's reassertion already (`reasserted` names that term).
    fn held_list(&self, reasserted: Option<u64>) -> (Vec<HeldCap>, u64) {
        let t = self.lock();
        if reasserted == Some(t.term) {
            return (Vec::new(), t.term);
        }
        let held = t.held.iter().map(|(&ino, h)| HeldCap {
            ino,
            mode: h.mode,
            seq: h.seq,
            version: h.since,
        });
        (held.collect(), t.term)
    }

    /// Notes the term a poll answer named, advances the use clock, and sweeps what is
    /// no longer needed ([`Table::sweep`]).
    fn polled(&self, term: u64, max_call: Duration) {
        let mut t = self.lock();
        t.term = t.term.max(term);
        t.tick += 1;
        t.sweep(Instant::now(), max_call);
    }

    /// Starts recalling `r`: later operations on the inode run uncapped. Returns the cap
    /// it takes away, if this client still had it.
    fn begin_recall(&self, r: CapRef) -> Option<Held> {
        let mut t = self.lock();
        let now = Instant::now();
        let (recalled, at) = t.recalled.entry(r.ino).or_insert((0, now));
        // Every grant or change waiting on this holder queues its own recall, so one grant
        // can be recalled more than once: a repeat must not reopen the uncapped window
        // after an ack (the leader may have granted the cap elsewhere by then), and drops
        // only a grant it names.
        let repeated = r.seq <= *recalled;
        *recalled = (*recalled).max(r.seq);
        *at = now;
        if repeated {
            return match t.held.get(&r.ino) {
                Some(h) if h.seq <= r.seq => t.unhold(r.ino),
                _ => None,
            };
        }
        t.recalling.entry(r.ino).or_default();
        // The whole cap goes, even when a newer grant was stored since: one `Held` keeps
        // what was cached under every grant of the inode (a name looked up under the
        // recalled grant and renamed away since by another session), and the leader's
        // wait ends with this ack (invariant 22).
        let held = t.unhold(r.ino)?;
        // Where the kernel expires all names at once, no recall waits for a directory's
        // lock, so there is no cycle to avoid (invariant 24).
        let expires_all = self.kernel.get().is_some_and(|k| k.can_expire_all_names());
        if held.kernel_names && !held.names.is_empty() && !expires_all {
            t.busy.insert(r.ino, now + BUSY_DIR_FOR);
        }
        Some(held)
    }

    /// Ends the recalls of `ino` if no uncapped operation ran since `served` and none is
    /// running. Every recall of the inode ends with it: the ack that follows may let the
    /// leader grant the cap to another session, so no uncapped operation may start after
    /// it, even while a nested recall is still finishing.
    fn try_end_recall(&self, ino: InodeId, served: u64) -> bool {
        let mut t = self.lock();
        let Some(r) = t.recalling.get(&ino) else { return true };
        if r.inflight > 0 || r.served != served {
            return false;
        }
        t.recalling.remove(&ino);
        true
    }

    fn served(&self, ino: InodeId) -> Option<(u32, u64)> {
        self.lock().recalling.get(&ino).map(|r| (r.inflight, r.served))
    }

    /// Records a renewal sent at `sent`: caps stay usable for three quarters of a lease
    /// after it. A new meta leader waits as long before it grants caps no session has
    /// reasserted (stoa-metad `caps.rs::await_grace`), so keep the two in step. Caps that
    /// lapsed before it came are dropped first (the leader may have granted them
    /// elsewhere meanwhile): returns them, for the kernel to forget.
    fn renewed(&self, sent: Instant, lease: Duration) -> Vec<(InodeId, Held)> {
        let until = sent + lease * 3 / 4;
        let mut t = self.lock();
        let dropped = Caps::take_lapsed(&mut t);
        t.valid_until = Some(t.valid_until.map_or(until, |u| u.max(until)));
        dropped
    }

    /// Drops every cap if their validity ran out; returns them, for the kernel to forget.
    fn drop_lapsed(&self) -> Vec<(InodeId, Held)> {
        Caps::take_lapsed(&mut self.lock())
    }

    fn take_lapsed(t: &mut Table) -> Vec<(InodeId, Held)> {
        if t.valid_until.is_none_or(|u| u > Instant::now()) {
            return Vec::new();
        }
        Caps::take_all(t)
    }

    fn take_all(t: &mut Table) -> Vec<(InodeId, Held)> {
        t.valid_until = None;
        t.generation += 1;
        let all: Vec<(InodeId, Held)> = t.held.drain().collect();
        for (ino, h) in &all {
            t.left(*ino, h);
        }
        all
    }

    /// The generation of the caps writes are buffered under now.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// The fence of a write buffered under caps of `generation`: the Unix time in ms
    /// when they stop being valid, after which no chunk server may take it; or
    /// `SessionExpired` if they lapsed since (see `chunk_io::Deadline`).
    pub fn write_deadline(&self, generation: u64) -> Result<u64, FsError> {
        let t = self.lock();
        match Caps::remaining(&t) {
            Some(left) if t.generation == generation => {
                let left = u64::try_from(left.as_millis()).unwrap_or(u64::MAX);
                Ok(Timestamp::now().as_millis().saturating_add(left))
            }
            _ => Err(FsError::SessionExpired),
        }
    }

    /// Drops every cap (the session expired or could not renew in time); returns what
    /// the kernel must forget.
    fn drop_all(&self) -> Vec<(InodeId, Held)> {
        Caps::take_all(&mut self.lock())
    }

    fn kernel(&self) -> Option<Arc<dyn KernelCache>> {
        self.kernel.get().cloned()
    }
}

/// A change of a directory's entries that this client made itself.
pub(crate) enum Change {
    /// A new inode, with the attributes this client gave it.
    Created(Attr),
    /// `child` lost its name; `keep` keeps its cap (this client still has it open).
    Removed { child: InodeId, dir: bool, at: Timestamp, keep: bool },
    /// `child`, a file (not a directory) held exclusively with its attributes, got
    /// this name too.
    Linked { child: InodeId, kind: FileKind, at: Timestamp },
}

/// A grant from the leader.
struct Grant {
    attr: Attr,
    mode: CapMode,
    seq: u64,
    /// The directory's grant, for a lookup, and the directory's version then.
    dir_seq: u64,
    dir_version: u64,
    xattrs: Option<Xattrs>,
    /// The [`Caps::epoch`] the grant was asked for at.
    sent: u64,
}

fn empty_held() -> Held {
    static IDS: AtomicU64 = AtomicU64::new(1);
    Held {
        mode: CapMode::Shared,
        seq: 0,
        id: IDS.fetch_add(1, Ordering::Relaxed),
        since: 0,
        attr: None,
        xattrs: None,
        names: HashMap::new(),
        reached: Vec::new(),
        kernel_names: false,
        kernel_missing: false,
        listing: None,
        pages: HashMap::new(),
        used: 0,
        forgotten: 0,
        refused: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::events::drop_from_kernel;
    use super::*;
    use stoa_proto::cap_seq;

    const DIR: InodeId = InodeId(1);

    pub(super) fn attr(ino: InodeId) -> Attr {
        let now = Timestamp::now();
        Attr {
            ino,
            kind: FileKind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            size: 0,
            nlink: 1,
            rdev: 0,
            atime: now,
            mtime: now,
            ctime: now,
            version: 1,
        }
    }

    /// A lookup of `name` in `DIR` answered with grants `seq` (the child) and `dir_seq`.
    /// Caps with `DIR` held exclusively, with its (empty) listing.
    fn holding_dir() -> Caps {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let mut dir = attr(DIR);
        dir.kind = FileKind::Dir;
        assert!(caps.store_dir(&DirGrant { attr: dir, seq: cap_seq(1, 1), entries: vec![] }, 0));
        caps
    }

    /// A `Shared` grant of `attr` (of a lookup, when `dir_seq` is not 0).
    pub(super) fn shared(attr: Attr, seq: u64, dir_seq: u64, sent: u64) -> Grant {
        Grant { attr, mode: CapMode::Shared, seq, dir_seq, dir_version: 0, xattrs: None, sent }
    }

    fn looked_up(caps: &Caps, name: &[u8], child: InodeId, seq: u64, dir_seq: u64) {
        let grant = shared(attr(child), seq, dir_seq, 0);
        assert!(caps.store(&grant, Some((DIR, name))));
    }

    /// A poll carries the caps held until the leader of the term it names has taken them
    /// as the session's reassertion; then none, until a newer term is learnt.
    #[test]
    fn a_poll_carries_the_caps_until_the_leader_of_its_term_has_them() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        looked_up(&caps, b"x", InodeId(5), cap_seq(3, 1), cap_seq(3, 2));
        caps.polled(3, Duration::from_secs(20));
        let count = |reasserted| caps.held_list(reasserted).0.len();
        assert_eq!(count(None), 2);
        assert_eq!(count(Some(3)), 0, "the leader of term 3 has them");
        assert_eq!(count(Some(2)), 2, "only a leader of an older term had them");
        caps.polled(4, Duration::from_secs(20));
        assert_eq!(caps.held_list(Some(3)), (caps.held_list(None).0, 4));
    }

    /// The xattrs a grant brought answer while the cap and its attributes are kept: not
    /// after this client's own change forgot them (its setxattr), nor from a grant asked
    /// for before that, nor after a recall.
    #[test]
    fn xattrs_a_grant_brought_answer_until_forgotten_or_recalled() {
        const X: InodeId = InodeId(5);
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let xattrs = vec![(b"user.a".to_vec(), b"1".to_vec())];
        let grant =
            |seq, sent| Grant { xattrs: Some(xattrs.clone()), ..shared(attr(X), seq, 0, sent) };
        assert!(caps.store(&grant(cap_seq(1, 1), 0), None));
        assert_eq!(caps.cached_xattrs(X), Some(xattrs.clone()));
        let before = caps.epoch();
        caps.forget(&[X], &[]);
        assert_eq!(caps.cached_xattrs(X), None);
        assert!(caps.store(&grant(cap_seq(1, 2), before), None));
        assert_eq!(caps.cached_xattrs(X), None, "a grant asked for before the forget");
        assert!(caps.store(&grant(cap_seq(1, 3), caps.epoch()), None));
        assert_eq!(caps.cached_xattrs(X), Some(xattrs.clone()));
        assert!(caps.begin_recall(CapRef { ino: X, seq: cap_seq(1, 3) }).is_some());
        assert_eq!(caps.cached_xattrs(X), None);
    }

    /// A reassertion names, for each cap, the inode's version when this client began
    /// caching it, not a later one: what it cached from the start may be older than what
    /// a later answer showed, and a new leader recalls the cap when the inode changed
    /// since (caps.md, invariant 8).
    #[test]
    fn a_held_cap_names_the_version_its_cache_began_at() {
        const X: InodeId = InodeId(5);
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let grant = |version, seq, dir_seq| {
            let attr = Attr { version, ..attr(X) };
            Grant {
                attr,
                mode: CapMode::Shared,
                seq,
                dir_seq,
                dir_version: 7,
                xattrs: None,
                sent: 0,
            }
        };
        let version_of = |ino| {
            let (held, _) = caps.held_list(None);
            held.iter().find(|cap| cap.ino == ino).map(|cap| cap.version)
        };
        assert!(caps.store(&grant(4, cap_seq(1, 1), cap_seq(1, 2)), Some((DIR, b"x"))));
        assert_eq!((version_of(X), version_of(DIR)), (Some(4), Some(7)));
        assert!(caps.store(&grant(9, cap_seq(1, 3), 0), None));
        assert_eq!(version_of(X), Some(4), "a later grant's version hides older caches");
        assert!(caps.begin_recall(CapRef { ino: X, seq: cap_seq(1, 3) }).is_some());
        assert_eq!(version_of(X), None);
        assert!(caps.store(&grant(9, cap_seq(1, 4), 0), None));
        assert_eq!(version_of(X), Some(9), "a cache begun afresh");
    }

    /// The leader recalled the directory's grant (another mount renamed `n0` away) while
    /// this client looked another name up there and got a newer grant: the recall must
    /// still drop `n0`, which the kernel cached under the recalled grant.
    #[test]
    fn a_recall_drops_the_names_of_the_directory_even_after_a_newer_grant() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 1), cap_seq(1, 2));
        looked_up(&caps, b"n1", InodeId(3), cap_seq(1, 3), cap_seq(1, 4));
        let dropped = caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 2) });
        let names = dropped.expect("the cap is dropped").names;
        assert!(names.contains_key(&b"n0"[..]), "the kernel is told to drop n0");
        assert_eq!(caps.cached_name(DIR, b"n0"), None);
        assert_eq!(caps.cached_name(DIR, b"n1"), None);
        // A repeat of the recall drops nothing stored after it.
        looked_up(&caps, b"n1", InodeId(3), cap_seq(1, 5), cap_seq(1, 6));
        assert!(caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 2) }).is_none());
        assert_eq!(caps.cached_name(DIR, b"n1"), Some(InodeId(3)));
    }

    /// A lookup in a contended directory (answered with no grant of it) caches no name, but
    /// the inode it found remembers where, so that removing that name here forgets it.
    #[test]
    fn a_name_found_in_a_directory_held_by_nobody_leads_back_to_its_inode() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        looked_up(&caps, b"c", InodeId(5), cap_seq(1, 1), 0);
        assert_eq!(caps.cached_name(DIR, b"c"), None, "no grant of the directory");
        assert!(caps.cached_attr(InodeId(5)).is_some());
        assert_eq!(caps.reached_by(DIR, b"c"), vec![InodeId(5)]);
        assert!(caps.reached_by(DIR, b"d").is_empty());
        // Past the bound, the inode keeps no attributes instead of more names.
        for i in 1..REACHED_MAX {
            looked_up(&caps, format!("link{i}").as_bytes(), InodeId(5), cap_seq(1, 1), 0);
        }
        assert!(caps.cached_attr(InodeId(5)).is_some());
        looked_up(&caps, b"one-more", InodeId(5), cap_seq(1, 1), 0);
        assert!(caps.cached_attr(InodeId(5)).is_none());
        assert!(caps.reached_by(DIR, b"c").is_empty());
    }

    /// Two mounts changing one directory: once a recall dropped names the kernel cached
    /// there, the kernel gets the directory's names with no TTL, so the next recall has
    /// no kernel entry to invalidate (which would wait for the directory's lock).
    #[test]
    fn a_recalled_directory_gets_its_names_to_the_kernel_without_a_ttl_for_a_while() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 1), cap_seq(1, 2));
        // A name answered from the cache, with the directory's TTL.
        assert!(caps.ttl(DIR) > Duration::ZERO);
        let dropped = caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 2) });
        assert!(dropped.expect("the cap is dropped").kernel_names, "n0 is invalidated");
        looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 3), cap_seq(1, 4));
        assert_eq!(caps.ttl(DIR), Duration::ZERO, "the directory is busy");
        assert_eq!(caps.cached_name(DIR, b"n0"), Some(InodeId(2)), "this client still caches");
        let dropped = caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 4) });
        assert!(!dropped.expect("the cap is dropped").kernel_names, "nothing to invalidate");
        // A file's recall makes nothing busy.
        looked_up(&caps, b"n1", InodeId(3), cap_seq(1, 5), cap_seq(1, 6));
        assert!(caps.ttl(InodeId(3)) > Duration::ZERO);
        assert!(caps.begin_recall(CapRef { ino: InodeId(3), seq: cap_seq(1, 5) }).is_some());
        looked_up(&caps, b"n1", InodeId(3), cap_seq(1, 7), cap_seq(1, 8));
        assert!(caps.ttl(InodeId(3)) > Duration::ZERO);
    }

    /// A kernel cache that records what it is told.
    #[derive(Default)]
    struct Kernel {
        can_expire: bool,
        calls: Mutex<Vec<String>>,
    }
    impl KernelCache for Kernel {
        fn inval_inode(&self, ino: InodeId) {
            self.calls.lock().unwrap().push(format!("inode {ino}"));
        }
        fn inval_entry(&self, parent: InodeId, name: &[u8]) {
            let name = String::from_utf8_lossy(name);
            self.calls.lock().unwrap().push(format!("entry {parent}/{name}"));
        }
        fn expire_all_names(&self) -> bool {
            self.calls.lock().unwrap().push("all names".into());
            self.can_expire
        }
        fn can_expire_all_names(&self) -> bool {
            self.can_expire
        }
    }

    /// Where the kernel expires all names at once, a recall waits for no directory's
    /// lock, so a recalled directory is not made busy: its names go to the kernel with
    /// a TTL again under the next grant.
    #[test]
    fn a_recalled_directory_keeps_its_kernel_ttl_where_the_kernel_expires_all_names() {
        let caps = Caps::new(16);
        caps.set_kernel(Arc::new(Kernel { can_expire: true, ..Kernel::default() }));
        caps.renewed(Instant::now(), Duration::from_secs(10));
        looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 1), cap_seq(1, 2));
        assert!(caps.ttl(DIR) > Duration::ZERO);
        let dropped = caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 2) });
        assert!(dropped.expect("the cap is dropped").kernel_names);
        looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 3), cap_seq(1, 4));
        assert!(caps.ttl(DIR) > Duration::ZERO, "the directory is not busy");
    }

    /// What a recall tells the kernel: every name expired at once where the kernel can
    /// (no directory lock waited for), else each name given out with a TTL; the inode's
    /// pages and attributes in both cases.
    #[test]
    fn a_recall_expires_the_kernels_names_at_once_where_it_can() {
        let recalled = || {
            let caps = Caps::new(16);
            caps.renewed(Instant::now(), Duration::from_secs(10));
            looked_up(&caps, b"n0", InodeId(2), cap_seq(1, 1), cap_seq(1, 2));
            assert!(caps.ttl(DIR) > Duration::ZERO, "n0 goes to the kernel with a TTL");
            let dir = caps.begin_recall(CapRef { ino: DIR, seq: cap_seq(1, 2) }).unwrap();
            let file = caps.begin_recall(CapRef { ino: InodeId(2), seq: cap_seq(1, 1) }).unwrap();
            vec![(DIR, dir), (InodeId(2), file)]
        };
        for (can_expire, expected) in [
            (true, vec!["all names".to_string(), format!("inode {DIR}"), "inode 2".into()]),
            (
                false,
                vec![
                    "all names".to_string(),
                    format!("entry {DIR}/n0"),
                    format!("inode {DIR}"),
                    "inode 2".into(),
                ],
            ),
        ] {
            let kernel = Kernel { can_expire, ..Kernel::default() };
            drop_from_kernel(&kernel, recalled());
            assert_eq!(*kernel.calls.lock().unwrap(), expected, "expiring works: {can_expire}");
        }
        // A file's recall has no names to drop.
        let kernel = Kernel { can_expire: true, ..Kernel::default() };
        drop_from_kernel(&kernel, recalled().split_off(1));
        assert_eq!(*kernel.calls.lock().unwrap(), vec!["inode 2".to_string()]);
    }

    /// Names this client removed or renamed away itself must not come back from its
    /// cache once the directory's listing is gone (a fault run saw an O_EXCL create fail
    /// with EEXIST right after the same mount renamed the name away).
    #[test]
    fn a_name_removed_or_renamed_here_is_not_found_once_the_listing_goes() {
        let caps = holding_dir();
        let (a, b) = (InodeId(2), InodeId(3));
        assert!(caps.record_change(DIR, b"n3", Change::Created(attr(a))).is_some());
        assert!(caps.record_change(DIR, b"n5", Change::Created(attr(b))).is_some());
        let at = Timestamp::now();
        assert!(caps.record_rename(((DIR, b"n3"), (DIR, b"n4")), a, None, at).is_some());
        let removed = Change::Removed { child: b, dir: false, at, keep: false };
        assert!(caps.record_change(DIR, b"n5", removed).is_some());
        caps.drop_listing(DIR);
        assert_eq!(caps.cached_name(DIR, b"n3"), None, "renamed away");
        assert_eq!(caps.cached_name(DIR, b"n5"), None, "removed");
        assert_eq!(caps.cached_name(DIR, b"n4"), Some(a));
    }

    /// A directory held with its listing is listed here, in meta's order (by name
    /// bytes) and pages (after a name, up to a limit), with the changes made here, a
    /// renamed entry keeping its kind; without the listing, nothing is answered here.
    #[test]
    fn a_directory_held_with_its_listing_is_listed_here_in_pages() {
        let caps = holding_dir();
        let mut sub = attr(InodeId(4));
        sub.kind = FileKind::Dir;
        assert!(caps.record_change(DIR, b"b", Change::Created(attr(InodeId(2)))).is_some());
        assert!(caps.record_change(DIR, b"c", Change::Created(attr(InodeId(3)))).is_some());
        assert!(caps.record_change(DIR, b"a", Change::Created(sub)).is_some());
        let at = Timestamp::now();
        assert!(caps.record_rename(((DIR, b"a"), (DIR, b"d")), InodeId(4), None, at).is_some());
        let entry =
            |name: &[u8], ino: u64, kind| DirEntry { name: name.to_vec(), ino: InodeId(ino), kind };
        let (first, more) = caps.list(DIR, b"", 2).unwrap();
        assert_eq!(first, vec![entry(b"b", 2, FileKind::File), entry(b"c", 3, FileKind::File)]);
        assert!(more);
        let (rest, more) = caps.list(DIR, b"c", 2).unwrap();
        assert_eq!(rest, vec![entry(b"d", 4, FileKind::Dir)]);
        assert!(!more);
        let (last, more) = caps.list(DIR, b"b", 2).unwrap();
        assert_eq!(last, vec![entry(b"c", 3, FileKind::File), entry(b"d", 4, FileKind::Dir)]);
        assert!(!more, "a page that ends at the last entry has none after it");
        caps.drop_listing(DIR);
        assert_eq!(caps.list(DIR, b"", 2), None);
    }

    /// What a removal takes ahead: the listing's regular files from a name on, in name
    /// order, without those this client holds exclusively, `count` at most.
    #[test]
    fn the_files_a_removal_takes_ahead_come_in_name_order() {
        let caps = Caps::new(16);
        caps.renewed(Instant::now(), Duration::from_secs(10));
        let mut dir = attr(DIR);
        dir.kind = FileKind::Dir;
        let entry =
            |name: &[u8], ino: u64, kind| DirEntry { name: name.to_vec(), ino: InodeId(ino), kind };
        let entries = vec![
            entry(b"x4", 5, FileKind::File),
            entry(b"x1", 2, FileKind::File),
            entry(b"x3", 4, FileKind::Dir),
            entry(b"x2", 3, FileKind::File),
            entry(b"x5", 6, FileKind::File),
        ];
        assert!(caps.store_dir(&DirGrant { attr: dir, seq: cap_seq(1, 1), entries }, 0));
        assert!(caps.record_change(DIR, b"x2b", Change::Created(attr(InodeId(7)))).is_some());
        let names = |v: &[&[u8]]| v.iter().map(|n| n.to_vec()).collect::<Vec<_>>();
        assert_eq!(caps.unowned_files_from(DIR, b"x2", 3), names(&[b"x2", b"x4", b"x5"]));
        assert_eq!(caps.unowned_files_from(DIR, b"x0", 2), names(&[b"x1", b"x2"]));
        assert_eq!(caps.unowned_files_from(DIR, b"x6", 2), names(&[]));
    }

    /// A file whose last name this client removed, not open here, is given back to the
    /// leader without a recall: every grant of it, one that was still on its way too.
    #[test]
    fn a_file_removed_here_is_given_back_whole_and_a_late_grant_of_it_is_not_kept() {
        let caps = holding_dir();
        let (kept, gone, replaced) = (InodeId(2), InodeId(3), InodeId(4));
        for (name, ino) in [(&b"k"[..], kept), (b"g", gone), (b"r", replaced)] {
            assert!(caps.record_change(DIR, name, Change::Created(attr(ino))).is_some());
        }
        let at = Timestamp::now();
        let open_here = Change::Removed { child: kept, dir: false, at, keep: true };
        assert!(caps.record_change(DIR, b"k", open_here).is_some());
        let removed = Change::Removed { child: gone, dir: false, at, keep: false };
        assert!(caps.record_change(DIR, b"g", removed).is_some());
        let renamed_over = Some((replaced, false));
        let (from, to) = ((DIR, &b"x"[..]), (DIR, &b"r"[..]));
        assert!(caps.record_change(DIR, b"x", Change::Created(attr(InodeId(5)))).is_some());
        assert!(caps.record_rename((from, to), InodeId(5), renamed_over, at).is_some());
        assert!(caps.lock().released.is_empty(), "given back before the removal applied");
        caps.give_back_after(&[kept, gone, replaced], 7);
        let every = u64::MAX;
        let want =
            vec![(CapRef { ino: gone, seq: every }, 7), (CapRef { ino: replaced, seq: every }, 7)];
        assert_eq!(std::mem::take(&mut caps.lock().released), want);
        assert!(caps.cached_attr(kept).is_some(), "an open file keeps its cap");
        let seq = cap_seq(1, 9);
        let late = shared(attr(gone), seq, 0, 0);
        assert!(!caps.store(&late, None), "a grant of a file given back is not cached");
        assert!(caps.cached_attr(gone).is_none());
    }

    /// A file given back on this client's own removal can still be reached by inode (a
    /// handle opened from a name the kernel cached before the removal): once the leader
    /// has been told of the drop, a grant asked for after that is cached, or a write
    /// through that handle would ask for its cap forever (`churn.py`, 2026-12-01 and
    /// 2026-12-06: a 1-byte write waited until the mount was unmounted while the mount
    /// and meta's leader span on `GetCaps`). Grants asked for before are still refused:
    /// the leader may have made them before it dropped the cap.
    #[tokio::test]
    async fn a_file_given_back_here_can_be_capped_again_once_the_leader_was_told() {
        let caps = holding_dir();
        let gone = InodeId(3);
        assert!(caps.record_change(DIR, b"g", Change::Created(attr(gone))).is_some());
        let at = Timestamp::now();
        let removed = Change::Removed { child: gone, dir: false, at, keep: false };
        assert!(caps.record_change(DIR, b"g", removed).is_some());
        caps.give_back_after(&[gone], 1);
        let released: Vec<CapRef> =
            std::mem::take(&mut caps.lock().released).into_iter().map(|(r, _)| r).collect();
        let asked_before = caps.epoch();
        let told = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            caps.release_told(&released);
        };
        let asked_after = async {
            caps.until_release_told(gone).await;
            caps.epoch()
        };
        let ((), asked_after) = tokio::join!(told, asked_after);
        let early = shared(attr(gone), cap_seq(1, 9), 0, asked_before);
        assert!(!caps.store(&early, None), "asked before the leader was told");
        let fresh = shared(attr(gone), cap_seq(1, 10), 0, asked_after);
        assert!(caps.store(&fresh, None), "asked after the leader was told");
        assert!(caps.cached_attr(gone).is_some());
    }

    /// A long-lived mount forgets what no answer or recall can still need: a recalled
    /// sequence, once no grant call asked before the recall can be answering, and a gate
    /// nobody holds. Before, each inode ever recalled or used kept an entry for good.
    /// A cap dropped here stays marked until the leader is told, however long that takes.
    #[test]
    fn what_no_call_can_still_need_is_swept() {
        let caps = holding_dir();
        let (recalled, gone, used) = (InodeId(2), InodeId(3), InodeId(4));
        assert!(caps.store(&shared(attr(recalled), cap_seq(1, 2), 0, 0), None));
        assert!(caps.begin_recall(CapRef { ino: recalled, seq: cap_seq(1, 2) }).is_some());
        assert!(caps.record_change(DIR, b"g", Change::Created(attr(gone))).is_some());
        let removed =
            Change::Removed { child: gone, dir: false, at: Timestamp::now(), keep: false };
        assert!(caps.record_change(DIR, b"g", removed).is_some());
        let held_gate = caps.gate(DIR);
        drop(caps.gate(used));
        let max_call = Duration::from_secs(10);
        let now = Instant::now();
        let kept = |caps: &Caps| {
            let t = caps.lock();
            let mut recalled: Vec<_> = t.recalled.keys().copied().collect();
            let mut gates: Vec<_> = t.gates.keys().copied().collect();
            recalled.sort();
            gates.sort();
            (recalled, gates)
        };
        caps.lock().sweep(now, max_call);
        assert_eq!(kept(&caps), (vec![recalled, gone], vec![DIR]), "only unheld gates go at once");
        drop(caps.gate(used));
        caps.lock().sweep(now + max_call / 2, max_call);
        assert_eq!(kept(&caps), (vec![recalled, gone], vec![DIR, used]), "once per max_call");
        caps.lock().sweep(now + max_call * 2, max_call);
        assert_eq!(kept(&caps), (vec![gone], vec![DIR]), "the recall is old");
        let late = shared(attr(gone), cap_seq(1, 9), 0, caps.epoch());
        assert!(!caps.store(&late, None), "the leader is not told yet");
        drop(held_gate);
    }
}
