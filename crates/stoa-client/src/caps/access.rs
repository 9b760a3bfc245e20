//! How the client's operations use caps: asking the leader for one, pinning caps while
//! the kernel gets an answer given under them, and going ahead on an inode capped, or
//! uncapped while it is being recalled (docs/flows/caps.md).

use super::*;

/// How an operation may go ahead on an inode; kept while the operation relies on it.
pub(crate) enum Access {
    /// Under the usable cap `cap` ([`Caps::held_id`]), which no recall takes while this
    /// is held.
    Capped { _gate: OwnedRwLockReadGuard<()>, cap: u64 },
    /// The inode is being recalled: go ahead without caching; the recall counts the
    /// operation until this is dropped. Or (`None`) the leader granted it to nobody (a
    /// contended directory, which nobody holds exclusively): nothing to count.
    Uncapped { _counted: Option<UncappedGuard> },
}

/// Counts one uncapped operation of a recalled inode until dropped.
pub(crate) struct UncappedGuard {
    caps: Weak<Shared>,
    ino: InodeId,
}

impl Drop for UncappedGuard {
    fn drop(&mut self) {
        if let Some(sh) = self.caps.upgrade() {
            let mut t = sh.caps.lock();
            if let Some(r) = t.recalling.get_mut(&self.ino) {
                r.inflight -= 1;
                r.served += 1;
            }
        }
    }
}

/// Keeps the caps of some inodes from being recalled until the kernel has the answer
/// given under them: a recall invalidates the kernel only after it is dropped, so the
/// kernel never caches an answer after the invalidation that should have removed it.
pub struct Pinned {
    _guards: Vec<OwnedRwLockReadGuard<()>>,
}

impl Pinned {
    /// Pins nothing: for answers that need no cap to stay true (this client's own change).
    pub fn none() -> Pinned {
        Pinned { _guards: Vec::new() }
    }
}

impl Client {
    /// Lets the client drop the front end's kernel caches on recalls.
    pub fn set_kernel_cache(&self, kernel: Arc<dyn KernelCache>) {
        self.sh.caps.set_kernel(kernel);
    }

    /// Forgets what this client cached of the name `parent`/`name` (not a listing):
    /// meta has shown that it no longer leads where the cache says.
    pub fn forget_cached_name(&self, parent: InodeId, name: &[u8]) {
        self.sh.caps.forget(&[], &[(parent, name)]);
    }

    /// The TTL the kernel may cache what this client said of `ino`.
    pub fn cache_ttl(&self, ino: InodeId) -> Duration {
        self.sh.caps.ttl(ino)
    }

    /// Whether the kernel may keep its cached pages of `ino` on open: this client holds
    /// a cap, so they were dropped on every change elsewhere.
    pub fn may_keep_cache(&self, ino: InodeId) -> bool {
        self.sh.caps.holds(ino, CapMode::Shared)
    }

    /// Asks the leader for `mode` on `ino` (or, with `name`, on the child `name` of
    /// directory `ino`) and caches the answer if it was not recalled meanwhile.
    /// Returns the attributes and whether the leader granted the cap at all (not: it
    /// granted the inode to nobody, sequence 0, a contended directory).
    pub(crate) async fn acquire(
        &self,
        ino: InodeId,
        name: Option<&[u8]>,
        mode: CapMode,
    ) -> Result<(Attr, bool), FsError> {
        let op = MetaOp::GetCaps { ino, name: name.map(<[u8]>::to_vec), mode };
        let grant = match self.call_grant(op).await? {
            (MetaResponse::Caps { attr, mode, seq, dir_seq, dir_version, xattrs }, sent) => {
                Grant { attr, mode, seq, dir_seq, dir_version, xattrs, sent }
            }
            (other, _) => return Err(unexpected("GetCaps", &other)),
        };
        self.keep(&grant, name.map(|n| (ino, n)));
        Ok((grant.attr, grant.seq != 0))
    }

    /// Sends a grant call to the leader, whose answer renews the session's caps. Returns
    /// the answer and the [`Caps::epoch`] it was asked at.
    pub(super) async fn call_grant(&self, op: MetaOp) -> Result<(MetaResponse, u64), FsError> {
        let sent = Instant::now();
        let epoch = self.sh.caps.epoch();
        let answer = self.sh.session.call_leader(op, grant_call_max(&self.sh)).await?;
        self.renewed(sent).await;
        Ok((answer, epoch))
    }

    /// Caches `grant` (of the child `dir` names, for a lookup) unless it was recalled
    /// meanwhile, and tells the file open here of its attributes. Returns whether it
    /// was cached.
    pub(super) fn keep(&self, grant: &Grant, dir: Option<(InodeId, &[u8])>) -> bool {
        let stored = self.sh.caps.store(grant, dir);
        if stored {
            if let Some(file) = self.sh.files.get(grant.attr.ino) {
                file.lock().learn(&grant.attr);
            }
        }
        stored
    }

    /// The leader renewed the session with a call sent at `sent` (a grant): the caps
    /// stay usable longer, once those that lapsed before are dropped.
    pub(crate) async fn renewed(&self, sent: Instant) {
        let lease = Duration::from_millis(self.session().lease_ms);
        forget(&self.sh, self.sh.caps.renewed(sent, lease)).await;
    }

    /// After this client renamed an entry the kernel cached to `to`: the kernel moved
    /// its entry and kept the TTL the old name had, so the new name must be dropped on
    /// the next recall of its directory, or now when no cap on that directory is held.
    pub(crate) fn entry_moved(&self, (parent, name): (InodeId, &[u8]), ino: InodeId) {
        if self.sh.caps.note_name(parent, name, ino, true) {
            return;
        }
        // Not awaited: the kernel holds the directories locked until the rename's reply.
        let sh = self.sh.clone();
        let names = HashMap::from([(name.to_vec(), ino)]);
        let held = Held { names, kernel_names: true, ..empty_held() };
        tokio::spawn(async move { invalidate_kernel(&sh, vec![(parent, held)]).await });
    }

    /// Pins the caps of `inodes` (see [`Pinned`]), in inode order so that pins never wait
    /// on each other in a cycle.
    pub(crate) async fn pin(&self, inodes: &[InodeId]) -> Pinned {
        let mut inodes = inodes.to_vec();
        inodes.sort();
        inodes.dedup();
        let mut guards = Vec::with_capacity(inodes.len());
        for ino in inodes {
            guards.push(self.sh.caps.gate(ino).read_owned().await);
        }
        Pinned { _guards: guards }
    }

    /// The attributes of `ino`, from the cache under a cap or from a new grant, with the
    /// TTL the kernel may keep them and a pin to hold until the kernel has them.
    pub async fn getattr_cached(&self, ino: InodeId) -> Result<(Attr, Duration, Pinned), FsError> {
        let fresh = match self.sh.caps.cached_attr(ino) {
            Some(_) => None,
            None => Some(self.acquire(ino, None, CapMode::Shared).await?.0),
        };
        let pin = self.pin(&[ino]).await;
        match (self.sh.caps.cached_attr(ino), fresh) {
            (Some((attr, ttl)), _) => Ok((self.adjust(attr), ttl, pin)),
            // Not cached (recalled as soon as it came, or a contended directory the
            // leader granted nobody): the answer's attributes, for this call only.
            (None, Some(attr)) => {
                drop(pin);
                Ok((self.newest(attr, false).await?, Duration::ZERO, Pinned::none()))
            }
            (None, None) => {
                drop(pin);
                let attr = self.sh.session.call_attr(MetaOp::GetAttr { ino }).await?;
                Ok((self.newest(attr, false).await?, Duration::ZERO, Pinned::none()))
            }
        }
    }

    /// Looks `name` up in `parent`, from the cache under caps or from a new grant, with
    /// the TTL the kernel may keep the entry and attributes, and a pin (see
    /// [`Client::getattr_cached`]).
    pub async fn lookup_cached(
        &self,
        parent: InodeId,
        name: &[u8],
    ) -> Result<(Attr, Duration, Pinned), FsError> {
        // No entry has such a name; the kernel asks all the same.
        if name.len() > NAME_LEN_MAX {
            return Err(FsError::NameTooLong);
        }
        // In a directory this client holds with its listing, the listing answers.
        if let Some(listed) = self.sh.caps.listed(parent, name) {
            let Some(child) = listed else { return Err(FsError::NotFound) };
            let pin = self.pin(&[parent, child]).await;
            if self.sh.caps.listed(parent, name) == Some(Some(child)) {
                if let Some((attr, ttl)) = self.sh.caps.cached_attr(child) {
                    if self.sh.caps.note_name(parent, name, child, false) {
                        let ttl = ttl.min(self.sh.caps.ttl(parent));
                        return Ok((self.adjust(attr), ttl, pin));
                    }
                }
            }
        }
        let cached = |c: &Client| {
            let ino = c.sh.caps.cached_name(parent, name)?;
            let (attr, ttl) = c.sh.caps.cached_attr(ino)?;
            Some((attr, ttl.min(c.sh.caps.ttl(parent))))
        };
        let fresh = match cached(self) {
            Some(_) => None,
            None if self.look_ahead(parent, name).await => None,
            None => Some(self.acquire(parent, Some(name), CapMode::Shared).await?.0),
        };
        let ino =
            fresh.as_ref().map_or_else(|| self.sh.caps.cached_name(parent, name), |a| Some(a.ino));
        let pin = self.pin(&[parent, ino.unwrap_or(parent)]).await;
        match (cached(self), fresh) {
            (Some((attr, ttl)), _) => Ok((self.adjust(attr), ttl, pin)),
            (None, Some(attr)) => {
                drop(pin);
                Ok((self.newest(attr, false).await?, Duration::ZERO, Pinned::none()))
            }
            (None, None) => {
                drop(pin);
                let (attr, _) = self.acquire(parent, Some(name), CapMode::Shared).await?;
                Ok((self.newest(attr, false).await?, Duration::ZERO, Pinned::none()))
            }
        }
    }

    /// After a lookup of `name` in `parent` found nothing: how long the kernel may
    /// remember that (with a pin to hold until it has the answer), when this client
    /// holds `parent` with a listing that lacks the name. `None`: the kernel must ask
    /// again next time.
    pub async fn missing_entry(&self, parent: InodeId, name: &[u8]) -> Option<(Duration, Pinned)> {
        self.sh.caps.listed(parent, name)?;
        let pin = self.pin(&[parent]).await;
        let ttl = self.sh.caps.missing_ttl(parent, name);
        (!ttl.is_zero()).then_some((ttl, pin))
    }

    /// Waits until an operation on `ino` may go ahead with `mode`, getting the cap from
    /// the leader when needed.
    pub(crate) async fn access(&self, ino: InodeId, mode: CapMode) -> Result<Access, FsError> {
        loop {
            {
                let mut t = self.sh.caps.lock();
                if let Some(r) = t.recalling.get_mut(&ino) {
                    r.inflight += 1;
                    let guard = UncappedGuard { caps: Arc::downgrade(&self.sh), ino };
                    return Ok(Access::Uncapped { _counted: Some(guard) });
                }
            }
            if self.sh.caps.holds(ino, mode) {
                let guard = self.sh.caps.gate(ino).read_owned().await;
                // A recall may have taken the cap while this waited for the gate.
                if let Some(cap) = self.sh.caps.held_id(ino, mode) {
                    return Ok(Access::Capped { _gate: guard, cap });
                }
                continue;
            }
            // A grant asked before the leader hears of this client's own drop of the
            // cap would not be cached, and this would ask again at once, until then.
            self.sh.caps.until_release_told(ino).await;
            // Asked again, it would be answered the same while the directory is
            // contended: a listing of it spun until its changes stopped.
            if !self.acquire(ino, None, mode).await?.1 {
                return Ok(Access::Uncapped { _counted: None });
            }
        }
    }
}

impl Client {
    /// Passes `result` of an fsync or flush (close) of `ino` on, dropping the kernel's
    /// pages and attributes of the file first when it failed: a write(2) left its bytes
    /// in the kernel's page cache, and once the application hears that they never
    /// reached the chunk servers, no read may return them (one read seeing a failed
    /// write and a later one not, after a recall dropped the pages, is what the
    /// disk-full fault runs found). Neither request holds page locks while it waits for
    /// its answer, so the invalidation cannot wait on it.
    pub(crate) async fn forget_failed_writes(
        &self,
        ino: InodeId,
        result: Result<(), FsError>,
    ) -> Result<(), FsError> {
        if result.is_err() {
            invalidate_kernel(&self.sh, vec![(ino, empty_held())]).await;
        }
        result
    }
}
