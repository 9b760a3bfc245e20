//! The client's session with meta: every call to meta goes through here.
//!
//! Mutations carry the session id and a fresh, per-session increasing request id.
//! `MetaClient` retries a call (after a lost reply, or on another replica) with the same
//! request, so meta recognises the id and answers with the first result instead of
//! applying the mutation twice. Reads carry request id 0. Meta keeps an answer until
//! this client says it will not send that request again ([`Numbering`]).
//!
//! The session lives as long as it is renewed: [`spawn_renewal`] renews it every third of
//! its lease. If meta expired it anyway (the client was cut off for a whole lease), meta
//! has released everything it held; the client opens a new session and carries on, and
//! handles opened under the old one answer `EIO` (see `Client`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;
use stoa_net::{MetaClient, Pool};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse, SessionGrant, ANSWERS_KEPT};
use stoa_types::{Attr, FsError, InodeId, RequestId, SessionId};

/// How long one meta call keeps retrying failover and elections before it gives up.
const META_DEADLINE: Duration = Duration::from_secs(30);

/// How many request ids the oldest unanswered one moves on by before meta is told to
/// forget the answers below it: one small log entry per this many mutations.
const FORGET_EVERY: u64 = 512;

pub(crate) struct Session {
    /// Namespace changes this client answered itself and queued for meta (`dirops`):
    /// every other call waits until meta has those queued before it, so meta sees this
    /// client's operations in the order the client made them.
    pub backlog: Backlog,
    /// This client's changes of directory entries that go to meta as calls of their own.
    pub entry_changes: EntryChanges,
    meta: MetaClient,
    name: String,
    grant: RwLock<SessionGrant>,
    numbering: Numbering,
    /// Held while a replacement for an expired session is being opened, so that many
    /// calls that see the expiry at once open one new session, not many.
    reopening: tokio::sync::Mutex<()>,
}

impl Session {
    /// Opens a session with the meta replicas at `meta`, naming this client `name`.
    pub async fn open(
        pool: Pool,
        meta: Vec<std::net::SocketAddr>,
        name: String,
    ) -> Result<Session, FsError> {
        if meta.is_empty() {
            return Err(FsError::Invalid("no meta address given".into()));
        }
        let meta = MetaClient::new(pool, meta, META_DEADLINE);
        let grant = open_grant(&meta, &name).await?;
        let session = Session {
            backlog: Backlog::default(),
            entry_changes: EntryChanges::default(),
            meta,
            name,
            grant: RwLock::new(grant),
            numbering: Numbering::default(),
            reopening: tokio::sync::Mutex::new(()),
        };
        // A first renewal tells where the leader is, so mutations skip a hop from now on.
        if let Err(e) = session.renew().await {
            tracing::debug!("first session renewal failed: {e}");
        }
        Ok(session)
    }

    pub fn grant(&self) -> SessionGrant {
        self.grant.read().expect("grant lock poisoned").clone()
    }

    /// The session in use now; it changes when meta expired the previous one.
    pub fn id(&self) -> SessionId {
        self.grant.read().expect("grant lock poisoned").session
    }

    /// Calls meta with `op`, giving it a new request id if it is a mutation. If meta
    /// expired the session, a new one is opened for later calls, and this one fails
    /// (EIO): it began while this client held state meta has given away, so it is not
    /// made again as if nothing happened (fencing, docs/flows/caps.md invariant 13).
    pub async fn call(&self, op: MetaOp) -> Result<MetaResponse, FsError> {
        let session = self.id();
        let answer = self.call_in(session, op).await;
        if let Err(FsError::SessionExpired) = answer {
            self.replace(session).await?;
        }
        answer
    }

    /// Calls meta with `op` in `session` exactly, without opening a new session when it
    /// expired: for what belongs to that session (releasing its open files).
    pub async fn call_in(&self, session: SessionId, op: MetaOp) -> Result<MetaResponse, FsError> {
        self.after_backlog(&op).await;
        let _changing = op.changes_entries().then(|| self.entry_changes.begin());
        if !op.is_mutation() {
            let req = MetaRequest { session, req_id: RequestId(0), op };
            return self.meta.call(req).await.map_err(final_error);
        }
        let numbered = self.numbering.take().await;
        let req = MetaRequest { session, req_id: numbered.id(), op };
        let answer = self.meta.call(req).await.map_err(final_error);
        drop(numbered);
        if let Some(below) = self.numbering.forget_due() {
            let (meta, op) = (self.meta.clone(), MetaOp::ForgetAnswers { below });
            let req = MetaRequest { session, req_id: RequestId(0), op };
            tokio::spawn(async move {
                if let Err(e) = meta.call(req).await {
                    tracing::debug!("telling meta to forget answers below {}: {e}", below.0);
                }
            });
        }
        answer
    }

    /// Calls the leader with `op` (not a mutation) in the current session, allowing it
    /// `timeout` there: for capability calls, which may wait at the leader.
    pub async fn call_leader(
        &self,
        op: MetaOp,
        timeout: Duration,
    ) -> Result<MetaResponse, FsError> {
        self.after_backlog(&op).await;
        let req = MetaRequest { session: self.id(), req_id: RequestId(0), op };
        self.meta.call_leader(req, timeout).await.map_err(final_error)
    }

    /// Waits until meta has answered every namespace change queued before `op`, unless
    /// `op` is one of the calls that must never wait for them: the batch that carries
    /// them, the size commits (whose sender waits for the changes each one follows), the
    /// events stream, acks and renewals, which recalls and leases depend on, and the
    /// chain table, which a chunk read or write refetches while it holds its file's cap
    /// (a recall waits for it, and the backlog may be waiting for that recall's ack at
    /// meta: a fault run stalled 15 s so). (An inode reservation waits too: it replaces
    /// the last one, whose numbers the queued creates use.) A read (a lookup, a grant)
    /// waits only for queued changes of directory entries, not for queued opens and
    /// releases, which change nothing it reads: a first lookup after a file's open
    /// and close waited a whole log commit for them, one per file read on a fresh mount.
    /// Nor does a `TakeFiles`: it asks for files of a directory this client holds with
    /// its listing that it does not hold, and every queued change is of files it holds
    /// (one whose cap went since is not found at meta, and its removal goes to meta
    /// alone); waiting made `rm -r` wait a log commit every few files.
    async fn after_backlog(&self, op: &MetaOp) {
        let independent = matches!(
            op,
            MetaOp::Batch { .. }
                | MetaOp::TakeFiles { .. }
                | MetaOp::CommitWrites { .. }
                | MetaOp::CapEvents { .. }
                | MetaOp::CapsReleased { .. }
                | MetaOp::RenewSession
                | MetaOp::GetChainTable
        );
        if independent {
            return;
        }
        if op.is_mutation() {
            self.backlog.wait_all().await;
        } else {
            self.backlog.wait_entries().await;
        }
    }

    /// Opens a new session in place of `expired` if meta expired it.
    pub async fn reopen(&self, expired: SessionId) -> Result<(), FsError> {
        self.replace(expired).await
    }

    /// Renews the lease; opens a new session if meta already expired this one.
    pub async fn renew(&self) -> Result<(), FsError> {
        let session = self.id();
        match self.call_in(session, MetaOp::RenewSession).await {
            Ok(MetaResponse::Renewed { leader: Some(leader) }) => {
                self.meta.set_leader(leader);
                Ok(())
            }
            Err(FsError::SessionExpired) => self.replace(session).await,
            other => other.map(|_| ()),
        }
    }

    /// Opens a new session in place of `expired`, unless another caller already did.
    async fn replace(&self, expired: SessionId) -> Result<(), FsError> {
        let _one_at_a_time = self.reopening.lock().await;
        if self.id() != expired {
            return Ok(());
        }
        let grant = open_grant(&self.meta, &self.name).await?;
        let old = self.grant();
        if grant.cluster != old.cluster || grant.chunk_size_bytes != old.chunk_size_bytes {
            return Err(FsError::WrongCluster {
                expected: old.cluster.to_string(),
                got: grant.cluster.to_string(),
            });
        }
        tracing::warn!(
            "meta expired session {expired} (no renewal for a whole lease); continuing in \
             session {}: files opened before answer EIO",
            grant.session
        );
        *self.grant.write().expect("grant lock poisoned") = grant;
        Ok(())
    }

    /// Calls meta with an operation that answers with attributes.
    pub async fn call_attr(&self, op: MetaOp) -> Result<Attr, FsError> {
        let what = op_name(&op);
        match self.call(op).await? {
            MetaResponse::Attr(attr) => Ok(attr),
            other => Err(unexpected(what, &other)),
        }
    }

    /// Calls meta with an operation that answers with nothing worth keeping.
    pub async fn call_done(&self, op: MetaOp) -> Result<(), FsError> {
        self.call(op).await.map(|_| ())
    }
}

/// Counts queued namespace changes and those meta has answered (in order).
#[derive(Default)]
pub(crate) struct Backlog {
    queued: AtomicU64,
    /// The number of the last queued change of directory entries (a create, a removal,
    /// a rename; not an open or a release).
    entries: AtomicU64,
    done: AtomicU64,
    /// Per inode, the number of the last queued change that names it (creates it,
    /// removes or renames it, changes its entries, opens or releases it), until meta
    /// answered that change.
    naming: Mutex<HashMap<InodeId, u64>>,
    changed: tokio::sync::Notify,
    /// Calls waiting for the whole backlog: the sender gathers no more changes then.
    urgent: std::sync::atomic::AtomicUsize,
    /// Signalled when a call starts waiting for the whole backlog.
    pub hurry: tokio::sync::Notify,
}

impl Backlog {
    /// Counts one more queued change; returns its number.
    pub fn queue(&self) -> u64 {
        self.queued.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Change `number` changes directory entries.
    pub fn note_entries_change(&self, number: u64) {
        self.entries.fetch_max(number, Ordering::AcqRel);
    }

    /// Change `number` names the inodes `inos`.
    pub fn note_names(&self, number: u64, inos: &[InodeId]) {
        let mut naming = self.naming.lock().expect("backlog lock poisoned");
        for &ino in inos {
            let last = naming.entry(ino).or_default();
            *last = (*last).max(number);
        }
    }

    /// The number of the last queued change naming `ino` that meta has not answered
    /// yet; 0 if there is none.
    pub fn last_naming(&self, ino: InodeId) -> u64 {
        let naming = self.naming.lock().expect("backlog lock poisoned");
        naming.get(&ino).copied().filter(|&n| n > self.done.load(Ordering::Acquire)).unwrap_or(0)
    }

    /// Every change up to number `upto` has its answer.
    pub fn done(&self, upto: u64) {
        self.done.fetch_max(upto, Ordering::AcqRel);
        let done = self.done.load(Ordering::Acquire);
        self.naming.lock().expect("backlog lock poisoned").retain(|_, n| *n > done);
        self.changed.notify_waiters();
    }

    /// Waits until change number `upto` has its answer.
    pub async fn wait(&self, upto: u64) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.done.load(Ordering::Acquire) >= upto {
                return;
            }
            changed.await;
        }
    }

    /// Waits until every change queued so far has its answer.
    pub async fn wait_all(&self) {
        self.wait_urgently(self.queued.load(Ordering::Acquire)).await;
    }

    /// Waits until every queued change naming `ino` has its answer (and so every change
    /// queued before those: answers come in order).
    pub async fn wait_naming(&self, ino: InodeId) {
        self.wait_urgently(self.last_naming(ino)).await;
    }

    /// Waits until every change of directory entries queued so far has its answer.
    pub async fn wait_entries(&self) {
        self.wait_urgently(self.entries.load(Ordering::Acquire)).await;
    }

    /// Waits until change `upto` has its answer, having the sender send at once.
    async fn wait_urgently(&self, upto: u64) {
        if self.done.load(Ordering::Acquire) >= upto {
            return;
        }
        self.urgent.fetch_add(1, Ordering::AcqRel);
        self.hurry.notify_one();
        self.wait(upto).await;
        self.urgent.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether a call waits for the whole backlog.
    pub fn is_urgent(&self) -> bool {
        self.urgent.load(Ordering::Acquire) > 0
    }

    /// `(answered, queued)`: the numbers of the last change answered and queued.
    pub fn position(&self) -> (u64, u64) {
        (self.done.load(Ordering::Acquire), self.queued.load(Ordering::Acquire))
    }
}

async fn open_grant(meta: &MetaClient, name: &str) -> Result<SessionGrant, FsError> {
    let req = MetaRequest {
        session: SessionId(0),
        // The open itself is not deduplicated: a retried open makes a spare session,
        // which expires unrenewed.
        req_id: RequestId(0),
        op: MetaOp::OpenSession { client: name.to_string() },
    };
    let grant = match meta.call(req).await.map_err(final_error)? {
        MetaResponse::Session(grant) => grant,
        other => return Err(unexpected("OpenSession", &other)),
    };
    if grant.chunk_size_bytes == 0 {
        return Err(FsError::Protocol("meta granted a zero chunk size".into()));
    }
    Ok(grant)
}

/// Renews `session` every third of its lease until it is dropped. Holding only a weak
/// reference lets the client go away without stopping this task first.
pub(crate) fn spawn_renewal(session: &Arc<Session>) -> tokio::task::JoinHandle<()> {
    let weak: Weak<Session> = Arc::downgrade(session);
    let period =
        Duration::from_millis(session.grant().lease_ms / 3).max(Duration::from_millis(100));
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            let Some(session) = weak.upgrade() else { return };
            if let Err(e) = session.renew().await {
                tracing::warn!("renewing meta session {} failed: {e}", session.id());
            }
        }
    })
}

/// The request ids this client numbered and has not seen answered. Meta keeps the
/// answer to each of them for a retry until told that every id below some mark is done
/// with (`MetaOp::ForgetAnswers`); the client never numbers a request
/// [`ANSWERS_KEPT`] or more past its oldest unanswered one, past which meta may forget
/// answers on its own.
#[derive(Default)]
struct Numbering {
    state: Mutex<NumberingState>,
    freed: tokio::sync::Notify,
}

#[derive(Default)]
struct NumberingState {
    /// The last id handed out (ids start at 1).
    last: u64,
    unanswered: BTreeSet<u64>,
    /// The mark meta was last told to forget answers below.
    forgotten_below: u64,
}

impl NumberingState {
    /// Every id below this one is answered or given up.
    fn done_below(&self) -> u64 {
        self.unanswered.first().copied().unwrap_or(self.last + 1)
    }
}

impl Numbering {
    /// A new request id, once it is within [`ANSWERS_KEPT`] of the oldest unanswered.
    async fn take(&self) -> Numbered<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut s = self.state.lock().expect("numbering lock poisoned");
                if s.last + 1 - s.done_below() < ANSWERS_KEPT {
                    s.last += 1;
                    let id = s.last;
                    s.unanswered.insert(id);
                    return Numbered { numbering: self, id };
                }
            }
            freed.await;
        }
    }

    /// The mark to tell meta to forget answers below, when it moved on enough since the
    /// last time.
    fn forget_due(&self) -> Option<RequestId> {
        let mut s = self.state.lock().expect("numbering lock poisoned");
        let below = s.done_below();
        if below < s.forgotten_below + FORGET_EVERY {
            return None;
        }
        s.forgotten_below = below;
        Some(RequestId(below))
    }
}

/// A numbered request not answered yet; answered (or given up) once dropped.
struct Numbered<'a> {
    numbering: &'a Numbering,
    id: u64,
}

impl Numbered<'_> {
    fn id(&self) -> RequestId {
        RequestId(self.id)
    }
}

impl Drop for Numbered<'_> {
    fn drop(&mut self) {
        self.numbering.state.lock().expect("numbering lock poisoned").unanswered.remove(&self.id);
        self.numbering.freed.notify_waiters();
    }
}

/// Counts this client's calls that change directory entries at meta, so that a
/// directory's listing fetched while one was under way is not trusted: meta may have
/// taken the listing before the change and answered the change after, and nobody
/// recalls a session for its own changes (dirops.rs, `take`).
#[derive(Default)]
pub(crate) struct EntryChanges {
    /// Changes begun so far.
    begun: AtomicU64,
    /// Changes begun and not answered yet.
    open: AtomicU64,
}

impl EntryChanges {
    fn begin(&self) -> EntryChange<'_> {
        self.open.fetch_add(1, Ordering::SeqCst);
        self.begun.fetch_add(1, Ordering::SeqCst);
        EntryChange(self)
    }

    /// A mark to pass to [`EntryChanges::quiet_since`]; `None` when a change is under
    /// way already.
    pub fn mark(&self) -> Option<u64> {
        // `begin` counts a change open before begun, so one that begins between these
        // two loads is seen open here or begun later.
        let begun = self.begun.load(Ordering::SeqCst);
        (self.open.load(Ordering::SeqCst) == 0).then_some(begun)
    }

    /// Whether no change was under way at any time since `mark` was taken.
    pub fn quiet_since(&self, mark: Option<u64>) -> bool {
        mark.is_some_and(|begun| {
            self.open.load(Ordering::SeqCst) == 0 && self.begun.load(Ordering::SeqCst) == begun
        })
    }
}

/// One change under way; it ends when dropped.
struct EntryChange<'a>(&'a EntryChanges);

impl Drop for EntryChange<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A retry hint that outlived the deadline is shown to applications as an I/O error.
pub(crate) fn final_error(e: FsError) -> FsError {
    if e.is_retryable() {
        FsError::Io(format!("meta unavailable: {e}"))
    } else {
        e
    }
}

pub(crate) fn unexpected(what: &str, resp: &MetaResponse) -> FsError {
    FsError::Protocol(format!("meta answered {what} with {resp:?}"))
}

fn op_name(op: &MetaOp) -> &'static str {
    match op {
        MetaOp::Lookup { .. } => "Lookup",
        MetaOp::GetAttr { .. } => "GetAttr",
        MetaOp::SetAttr { .. } => "SetAttr",
        MetaOp::Create { .. } => "Create",
        MetaOp::Mkdir { .. } => "Mkdir",
        MetaOp::Symlink { .. } => "Symlink",
        MetaOp::Link { .. } => "Link",
        _ => "a meta call",
    }
}

#[cfg(test)]
mod tests {
    use super::{EntryChanges, Numbering, ANSWERS_KEPT, FORGET_EVERY};
    use stoa_types::RequestId;

    /// Meta forgets answers below the mark it is told, and may forget those
    /// [`ANSWERS_KEPT`] ids behind the newest: a request still waiting for its answer
    /// (a rename held by another mount's lease) must stay out of both.
    #[tokio::test]
    async fn an_unanswered_request_keeps_the_marks_and_new_numbers_behind_it() {
        let numbering = Numbering::default();
        let waiting = numbering.take().await;
        assert_eq!(waiting.id(), RequestId(1));
        for _ in 0..FORGET_EVERY * 2 {
            drop(numbering.take().await);
        }
        assert_eq!(numbering.forget_due(), None, "request 1 is unanswered");
        while numbering.state.lock().unwrap().last + 1 < ANSWERS_KEPT + 1 {
            drop(numbering.take().await);
        }
        let next = numbering.take();
        tokio::pin!(next);
        tokio::select! {
            biased;
            _ = &mut next => panic!("numbered {} past unanswered request 1", ANSWERS_KEPT),
            () = tokio::task::yield_now() => {}
        }
        drop(waiting);
        assert_eq!(next.await.id(), RequestId(ANSWERS_KEPT + 1));
        assert_eq!(numbering.forget_due(), Some(RequestId(ANSWERS_KEPT + 2)));
        assert_eq!(numbering.forget_due(), None, "told once");
    }

    #[test]
    fn a_change_under_way_at_any_time_since_the_mark_is_seen() {
        let changes = EntryChanges::default();
        let mark = changes.mark();
        assert!(changes.quiet_since(mark));
        // Begun after the mark, answered before the check.
        drop(changes.begin());
        assert!(!changes.quiet_since(mark));
        // Under way at the mark, answered before the check.
        let change = changes.begin();
        let mark = changes.mark();
        drop(change);
        assert!(!changes.quiet_since(mark));
        assert!(changes.quiet_since(changes.mark()));
    }
}
