//! The events stream of a session and what it brings: recalls of caps (flush, drop
//! what was cached here and in the kernel, ack), giving idle caps back past the bound,
//! and dropping every cap when the session is lost (docs/flows/caps.md).

use super::*;

/// Runs the events stream of `sh`'s session until the client goes away: polls the
/// leader, handles recalls, and drops every cap when the session was lost or could not be
/// renewed in time.
pub(crate) fn spawn_events(sh: &Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let weak = Arc::downgrade(sh);
    tokio::spawn(async move {
        let mut number = 0;
        // The term whose leader took this session's caps as its reassertion: a poll
        // naming that term carries none. A poll carried all of them before, every time:
        // a mount holding 16,384 caps sent about 400 KB per poll, and polled again after
        // each recall answer while another mount looked its files up.
        let mut reasserted = None;
        loop {
            let Some(sh) = weak.upgrade() else { return };
            let session = sh.session.id();
            let lease = Duration::from_millis(sh.session.grant().lease_ms);
            let (held, term) = sh.caps.held_list(reasserted);
            let sent = Instant::now();
            number += 1;
            // The caps lapse at their deadline even while the poll hangs (a partitioned
            // leader): what the kernel cached under them goes then, not at the next poll.
            let polled = {
                let op = MetaOp::CapEvents { held, term, poll: number };
                let poll = sh.session.call_leader(op, POLL_TIMEOUT);
                tokio::pin!(poll);
                loop {
                    let until = sh.caps.lock().valid_until;
                    let Some(until) = until else { break poll.await };
                    tokio::select! {
                        polled = &mut poll => break polled,
                        _ = tokio::time::sleep_until(until.into()) => {
                            let lapsed = sh.caps.drop_lapsed();
                            if !lapsed.is_empty() {
                                tracing::warn!("no renewal for most of a lease: dropping every cap");
                            }
                            forget_soon(&sh, lapsed);
                        }
                    }
                }
            };
            match polled {
                Ok(MetaResponse::CapEvents { recalls, term: answered }) => {
                    // The leader of the term the poll named answered it: it has the
                    // session's caps, carried by this poll or an earlier one naming
                    // that term (a leader of a newer term answers with its own).
                    if answered == term {
                        reasserted = Some(term);
                    }
                    sh.caps.polled(answered, grant_call_max(&sh));
                    forget_soon(&sh, sh.caps.renewed(sent, lease));
                    for r in recalls {
                        tokio::spawn(recall(sh.clone(), r));
                    }
                    give_back_idle(&sh);
                }
                Ok(other) => tracing::warn!("{}", unexpected("CapEvents", &other)),
                Err(FsError::SessionExpired) => {
                    reasserted = None;
                    forget_soon(&sh, sh.caps.drop_all());
                    if let Err(e) = sh.session.reopen(session).await {
                        tracing::warn!("reopening the meta session: {e}");
                    }
                }
                Err(e) => {
                    tracing::debug!("polling for cap recalls failed: {e}");
                    drop(sh);
                    tokio::time::sleep(POLL_RETRY).await;
                }
            }
        }
    })
}

/// Gives back, in the background, the least recently used caps while the client holds
/// more than its bound (see the module doc, "Bounded"); one such task at a time.
fn give_back_idle(sh: &Arc<Shared>) {
    let idle = sh.caps.over_bound(|ino| sh.files.get(ino).is_some());
    if idle.is_empty() || sh.caps.trimming.swap(true, Ordering::AcqRel) {
        return;
    }
    tracing::debug!("holding more than {} caps: giving {} back", sh.caps.max, idle.len());
    let sh = sh.clone();
    tokio::spawn(async move {
        for r in idle {
            // As for a recall: nobody else waits for it, but the leader must hear the
            // ack before it may forget the grant, and the kernel forget first.
            recall(sh.clone(), r).await;
        }
        sh.caps.trimming.store(false, Ordering::Release);
    });
}

/// Tells the leader of the caps this client dropped on its own (files whose last name it
/// removed), in one call per few milliseconds, once meta applied the removals
/// ([`Caps::give_back_after`]); one such task at a time. Without it the leader would
/// recall each of them before it purges the file (a call and an ack per deleted file,
/// 2 s after an `rm -r`). A call that fails costs only that recall.
pub(crate) fn send_released(sh: &Arc<Shared>) {
    {
        let mut t = sh.caps.lock();
        if t.released.is_empty() || t.releasing {
            return;
        }
        t.releasing = true;
    }
    let sh = sh.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(RELEASE_GATHER).await;
            // Taken, or the task ends, under one lock: a cap dropped later finds either
            // this task still running or none.
            let released = {
                let mut t = sh.caps.lock();
                t.releasing = !t.released.is_empty();
                std::mem::take(&mut t.released)
            };
            if released.is_empty() {
                break;
            }
            let after = released.iter().map(|&(_, change)| change).max().unwrap_or(0);
            sh.session.backlog.wait(after).await;
            let released: Vec<CapRef> = released.into_iter().map(|(r, _)| r).collect();
            let op = MetaOp::CapsReleased { released: released.clone() };
            if let Err(e) = sh.session.call_leader(op, POLL_TIMEOUT).await {
                tracing::debug!("telling the leader of caps given up: {e}");
            }
            sh.caps.release_told(&released);
        }
    });
}

/// Drops what was cached under the caps `dropped`, the kernel's caches included.
pub(super) async fn forget(sh: &Arc<Shared>, dropped: Vec<(InodeId, Held)>) {
    if dropped.is_empty() {
        return;
    }
    drop_file_caches(sh, &dropped);
    invalidate_kernel(sh, dropped).await;
}

/// Like [`forget`], for the events stream: the kernel part runs in the background. The
/// kernel makes an entry invalidation wait for the operations in flight in that
/// directory, and those may wait for what only this stream brings (renewals, the news
/// that the session expired), so the stream must not wait for it.
fn forget_soon(sh: &Arc<Shared>, dropped: Vec<(InodeId, Held)>) {
    if dropped.is_empty() {
        return;
    }
    drop_file_caches(sh, &dropped);
    let sh = sh.clone();
    tokio::spawn(async move { invalidate_kernel(&sh, dropped).await });
}

fn drop_file_caches(sh: &Shared, dropped: &[(InodeId, Held)]) {
    for (ino, _) in dropped {
        if let Some(file) = sh.files.get(*ino) {
            file.lock().drop_cap_cache();
        }
    }
}

/// Tells the kernel to forget the inodes and the names given out under `dropped`.
pub(super) async fn invalidate_kernel(sh: &Arc<Shared>, dropped: Vec<(InodeId, Held)>) {
    let Some(kernel) = sh.caps.kernel() else { return };
    let task = tokio::task::spawn_blocking(move || drop_from_kernel(&*kernel, dropped));
    if let Err(e) = task.await {
        tracing::warn!("kernel cache invalidation task: {e}");
    }
}

/// Makes the kernel forget the names and inodes cached under `dropped`. The names go all
/// at once where the kernel can, which waits for no directory lock: dropping them one by
/// one waits for the operations in flight in each directory, which may be this client's
/// own changes waiting at meta for the other session, whose change waits for this
/// recall (invariant 24).
pub(super) fn drop_from_kernel(kernel: &dyn KernelCache, dropped: Vec<(InodeId, Held)>) {
    // Names handed out with no TTL are not cached: the kernel asks again.
    let names = dropped.iter().any(|(_, held)| held.kernel_names && !held.names.is_empty());
    // Absences were handed out only where the kernel expires all names at once.
    let missing = dropped.iter().any(|(_, held)| held.kernel_missing);
    let one_by_one = (names || missing) && !kernel.expire_all_names();
    if one_by_one && missing {
        tracing::warn!(
            "could not expire the kernel's names: absences it cached stay until their TTL"
        );
    }
    for (ino, held) in dropped {
        if one_by_one && held.kernel_names {
            for name in held.names.keys() {
                kernel.inval_entry(ino, name);
            }
        }
        kernel.inval_inode(ino);
    }
}

/// Answers one recall: waits for the users of the cap, flushes the file's buffered
/// writes, drops what was cached under the cap (here and in the kernel), then acks.
async fn recall(sh: Arc<Shared>, r: CapRef) {
    let session = sh.session.id();
    tracing::debug!("meta recalls the cap on inode {} (grant {})", r.ino, r.seq);
    // The file's lock requests take their turn before the cap's gate, and so does this:
    // a give-back below must not reach meta while a request of this client is on its way
    // there (which could land first, on the locks meta still counts this client's).
    let turn = sh.kept.turn(r.ino).await;
    let gate = sh.caps.gate(r.ino);
    let mut steps = RecallSteps::new();
    let dropped = {
        let _alone = gate.write().await;
        steps.mark("users of the cap");
        let dropped = sh.caps.begin_recall(r);
        // Changes this client made itself under the cap (creates in a directory it held,
        // the file's open) reach meta before the ack lets anyone else look; changes that
        // name other inodes need not (another client that looks at those recalls their
        // caps), and may be held up at a meta leader that lost its place.
        sh.session.backlog.wait_naming(r.ino).await;
        steps.mark("namespace changes queued");
        if dropped.is_some() {
            if let Some(file) = sh.files.get(r.ino) {
                if let Err(e) = file.flush_recalled(&sh).await {
                    // The file keeps the error for every handle's next flush, fsync
                    // or close.
                    tracing::warn!("flushing inode {} for a recall: {e}", r.ino);
                }
                file.lock().drop_cap_cache();
                // A change of times made behind those writes was queued once they were
                // committed (`FileInner::attr_change`): it reaches meta before the ack too.
                sh.session.backlog.wait_naming(r.ino).await;
                steps.mark("buffered writes");
            }
        }
        // Locks kept under the cap go back before the ack lets another session lock.
        if crate::locks::give_back(&sh, r.ino).await.is_ok() {
            steps.mark("kept locks");
        }
        drop(turn);
        dropped
    };
    // Operations that ran uncapped meanwhile may have filled kernel pages: drop them
    // again until a pass saw none.
    let mut dropped = dropped.map(|held| vec![(r.ino, held)]);
    while let Some((inflight, served)) = sh.caps.served(r.ino) {
        if inflight > 0 {
            tokio::time::sleep(UNCAPPED_WAIT).await;
            continue;
        }
        let names = dropped.take().unwrap_or_else(|| vec![(r.ino, empty_held())]);
        invalidate_kernel(&sh, names).await;
        if sh.caps.try_end_recall(r.ino, served) {
            break;
        }
    }
    // Another recall of the inode ended the window first: drop the names all the same.
    if let Some(names) = dropped {
        invalidate_kernel(&sh, names).await;
    }
    steps.mark("operations without the cap");
    ack(&sh, session, r).await;
    steps.mark("the ack");
    let lease = Duration::from_millis(sh.session.grant().lease_ms);
    if steps.total() > lease / 2 {
        // Another client waited this long for the cap (FAULT_TESTS.md, 15 s stalls).
        tracing::warn!("the recall of inode {} took {:?}: {}", r.ino, steps.total(), steps);
    }
}

/// How long each step of a recall took, for the warning about a slow one.
struct RecallSteps {
    start: Instant,
    last: Instant,
    took: Vec<(&'static str, Duration)>,
}

impl RecallSteps {
    fn new() -> RecallSteps {
        let now = Instant::now();
        RecallSteps { start: now, last: now, took: Vec::new() }
    }

    /// Ends the step waiting for `what`.
    fn mark(&mut self, what: &'static str) {
        let now = Instant::now();
        self.took.push((what, now - self.last));
        self.last = now;
    }

    fn total(&self) -> Duration {
        self.last - self.start
    }
}

impl std::fmt::Display for RecallSteps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps: Vec<String> =
            self.took.iter().map(|(what, took)| format!("{what} {took:.2?}")).collect();
        write!(f, "waited for {}", steps.join(", "))
    }
}

/// Tells the leader the cap is gone. A lost ack costs the recaller a lease at most.
async fn ack(sh: &Shared, session: SessionId, r: CapRef) {
    if sh.session.id() != session {
        return;
    }
    let op = MetaOp::CapsReleased { released: vec![r] };
    if let Err(e) = sh.session.call_leader(op, POLL_TIMEOUT).await {
        tracing::warn!("acking the recall of inode {}: {e}", r.ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slow_recall_is_told_step_by_step() {
        let mut steps = RecallSteps::new();
        std::thread::sleep(Duration::from_millis(20));
        steps.mark("users of the cap");
        steps.mark("the ack");
        let text = steps.to_string();
        assert!(text.starts_with("waited for users of the cap "), "{text}");
        assert!(text.contains(", the ack "), "{text}");
        assert!(steps.total() >= Duration::from_millis(20));
        assert!(steps.took[0].1 >= Duration::from_millis(20) && steps.took[1].1 < steps.took[0].1);
    }
}
