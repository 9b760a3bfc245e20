//! Session leases kept by the leader, and reads served by followers.

use super::*;
use stoa_proto::{CapMode, CapRef, HeldCap, LOOKUP_MANY_MAX, XATTRS_IN_GRANT_MAX};
use stoa_types::SetAttr;

fn req(session: SessionId, req_id: u64, op: MetaOp) -> MetaRequest {
    MetaRequest { session, req_id: RequestId(req_id), op }
}

async fn renew(client: &MetaClient, session: SessionId) -> Result<MetaResponse, FsError> {
    client.call(req(session, 0, MetaOp::RenewSession)).await
}

/// A poll number above every earlier one (per session is enough; these count for all).
fn next_poll() -> u64 {
    static POLLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    POLLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1
}

/// Takes `mode` on `ino` for `session`: the grant's sequence number and the inode's
/// version it answered.
async fn take_cap(
    client: &MetaClient,
    session: SessionId,
    ino: InodeId,
    mode: CapMode,
) -> (u64, u64) {
    match client.call(req(session, 0, MetaOp::GetCaps { ino, name: None, mode })).await.unwrap() {
        MetaResponse::Caps { seq, attr, .. } => (seq, attr.version),
        other => panic!("GetCaps answered {other:?}"),
    }
}

/// One poll of `session`'s events stream, reasserting `held` and naming `term`: the
/// recalls and the leader's term.
async fn poll(
    client: &MetaClient,
    session: SessionId,
    held: Vec<HeldCap>,
    term: u64,
) -> (Vec<CapRef>, u64) {
    let op = MetaOp::CapEvents { held, term, poll: next_poll() };
    match client.call_leader(req(session, 0, op), Duration::from_secs(5)).await.unwrap() {
        MetaResponse::CapEvents { recalls, term } => (recalls, term),
        other => panic!("CapEvents answered {other:?}"),
    }
}

/// Two sessions opened through `client`.
async fn two_sessions(client: &MetaClient) -> (SessionId, SessionId) {
    (open_session(client).await, open_session(client).await)
}

/// The leader's term, once `session` has reasserted its caps: the first poll learns the
/// term, the second names it.
async fn reasserted(client: &MetaClient, session: SessionId) -> u64 {
    let (_, term) = poll(client, session, vec![], 0).await;
    poll(client, session, vec![], term).await;
    term
}

/// Acks `released`, recalls of `session`'s caps.
async fn ack(client: &MetaClient, session: SessionId, released: Vec<CapRef>) {
    let ack = MetaOp::CapsReleased { released };
    client.call_leader(req(session, 0, ack), Duration::from_secs(5)).await.unwrap();
}

/// Polls `session`'s events stream, renewing it, until a recall of `cap` comes, for at
/// most `secs` seconds; `what` names the recall in the failure.
async fn until_recalled(
    client: &MetaClient,
    session: SessionId,
    term: u64,
    cap: CapRef,
    (secs, what): (u64, &str),
) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        renew(client, session).await.unwrap();
        if poll(client, session, vec![], term).await.0.contains(&cap) {
            return;
        }
        assert!(Instant::now() < deadline, "{what} never came");
    }
}

/// The recalls of `session`'s next poll that brings any, of the next two, the first
/// naming no term (it learns the term the second names).
async fn next_recalls(client: &MetaClient, session: SessionId, term: u64) -> Vec<CapRef> {
    let (recalls, _) = poll(client, session, vec![], 0).await;
    match recalls.is_empty() {
        true => poll(client, session, vec![], term).await.0,
        false => recalls,
    }
}

fn lease_tuning() -> Tuning {
    Tuning { session_lease_ms: 1500, ..test_tuning() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_expires_and_its_open_orphan_becomes_garbage() {
    let cluster = Cluster::start(3, lease_tuning()).await;
    let leader = cluster.leader().await;
    let client = cluster.client_all();
    let (silent, alive) = two_sessions(&client).await;
    let ino = create(&client, alive, 1, "f").await;
    client.call(req(silent, 1, MetaOp::Open { ino })).await.unwrap();
    let unlink = MetaOp::Unlink { parent: InodeId::ROOT, name: b"f".to_vec(), open: false };
    client.call(req(alive, 2, unlink)).await.unwrap();
    let getattr = req(SessionId(0), 0, MetaOp::GetAttr { ino });
    assert!(client.call(getattr.clone()).await.is_ok(), "an open file was deleted");
    // `alive` renews through a follower until `silent`, which says nothing, expires.
    let follower = cluster.client((leader + 1) % 3);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        renew(&follower, alive).await.unwrap();
        match client.call(getattr.clone()).await {
            Err(FsError::NotFound) => break,
            Ok(_) => {}
            Err(e) => panic!("getattr of the orphan failed: {e}"),
        }
        assert!(Instant::now() < deadline, "the silent session never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(renew(&client, silent).await, Err(FsError::SessionExpired));
    let late = client.call(req(silent, 2, MetaOp::Release { ino })).await;
    assert_eq!(late, Err(FsError::SessionExpired));
    renew(&client, alive).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewing_session_survives_a_leader_change() {
    let mut cluster = Cluster::start(3, lease_tuning()).await;
    let old = cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    cluster.stop(old).await;
    let started = Instant::now();
    // Renew every third of the lease for well over a lease after the failover.
    while started.elapsed() < Duration::from_millis(4000) {
        renew(&client, session).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    create(&client, session, 1, "after").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_reads_its_own_store_after_a_read_index() {
    let cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let client = cluster.client(leader);
    let session = open_session(&client).await;
    for i in 0..20u64 {
        let ino = create(&client, session, i + 1, &format!("f{i}")).await;
        // Written through the leader, read at once from each follower: never stale.
        for f in [(leader + 1) % 3, (leader + 2) % 3] {
            assert_eq!(lookup(&cluster.client(f), &format!("f{i}")).await.unwrap(), ino);
        }
    }
    let ask = req(SessionId(0), 0, MetaOp::ReadIndex);
    let MetaResponse::ReadIndex { index } = client.call(ask).await.unwrap() else {
        panic!("ReadIndex answered something else")
    };
    assert!(index > 20, "read index {index} is behind the 20 creates");
}

/// A new leader refuses `TakeDir` at once while a session may still use caps granted by
/// the old leader (its grace period), instead of holding the call until the grace ends:
/// the client makes its changes through meta meanwhile. Once the grace is over, the
/// directory is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_refuses_take_dir_in_its_grace_period_without_waiting() {
    let mut cluster = Cluster::start(3, Tuning { session_lease_ms: 8000, ..test_tuning() }).await;
    let old = cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    cluster.stop(old).await;
    cluster.leader().await;
    let take = || req(session, 0, MetaOp::TakeDir { ino: InodeId::ROOT, limit: 100 });
    // The session never polls, so the grace lasts three quarters of its lease (6 s):
    // an answer that waited for it would be a grant.
    let first = client.call_leader(take(), Duration::from_secs(15)).await.unwrap();
    assert_eq!(first, MetaResponse::Dir(None), "refused during the grace period");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        renew(&client, session).await.unwrap();
        match client.call_leader(take(), Duration::from_secs(15)).await.unwrap() {
            MetaResponse::Dir(Some(grant)) => {
                assert_eq!(grant.attr.ino, InodeId::ROOT);
                break;
            }
            MetaResponse::Dir(None) => {}
            other => panic!("TakeDir answered {other:?}"),
        }
        assert!(Instant::now() < deadline, "never granted after the grace period");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A recall whose poll answer never reached its client (a call the client gave up while
/// the leader held it) is queued again until it is acked: the grant waiting for it
/// waited for its caller's whole timeout before (FAULT_TESTS.md, `--seed 36`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recall_whose_answer_was_lost_is_sent_again() {
    // A lease the waiting session, which never renews, outlives.
    let cluster = Cluster::start(1, Tuning { session_lease_ms: 8000, ..test_tuning() }).await;
    cluster.leader().await;
    let client = cluster.client_all();
    let (holder, waiter) = two_sessions(&client).await;
    let ino = create(&client, holder, 1, "f").await;
    let caps = move |session| {
        req(session, 0, MetaOp::GetCaps { ino, name: None, mode: CapMode::Exclusive })
    };
    let (seq, _) = take_cap(&client, holder, ino, CapMode::Exclusive).await;
    let term = reasserted(&client, holder).await;
    let wanted = tokio::spawn({
        let client = client.clone();
        async move { client.call_leader(caps(waiter), Duration::from_secs(15)).await }
    });
    let recall = CapRef { ino, seq };
    until_recalled(&client, holder, term, recall, (10, "the recall")).await;
    // That answer is lost: the holder never sees it, and keeps renewing and polling.
    let again = (8, "a recall whose answer was lost, again");
    until_recalled(&client, holder, term, recall, again).await;
    assert!(!wanted.is_finished(), "granted before the holder acked");
    ack(&client, holder, vec![recall]).await;
    let granted = tokio::time::timeout(Duration::from_secs(5), wanted).await.unwrap().unwrap();
    assert!(matches!(granted, Ok(MetaResponse::Caps { .. })), "{granted:?}");
}

/// A grant waiting at a leader for a recall's ack ends with `NotLeader` when that leader
/// loses its place, so that its client retries at the new leader: the acks go there. A
/// fault run's grant waited out its call's 15 s at a leader cut off one way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_waiting_at_a_leader_that_loses_its_place_is_sent_elsewhere() {
    // A lease the silent holder keeps for the whole test: only the lost place ends the wait.
    let mut cluster = Cluster::start(3, Tuning { session_lease_ms: 30_000, ..test_tuning() }).await;
    let leader = cluster.leader().await;
    let client = cluster.client_all();
    let (holder, waiter) = two_sessions(&client).await;
    let ino = create(&client, holder, 1, "f").await;
    let caps = move |session| {
        req(session, 0, MetaOp::GetCaps { ino, name: None, mode: CapMode::Exclusive })
    };
    client.call(caps(holder)).await.unwrap();
    let node = cluster.server(leader).node.clone();
    let wanted = tokio::spawn(async move { node.meta(caps(waiter)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!wanted.is_finished(), "granted while the holder still held it");
    for i in (0..3).filter(|&i| i != leader) {
        cluster.stop(i).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(15), wanted)
        .await
        .expect("the grant still waits at a replica that no longer leads")
        .unwrap();
    assert!(matches!(answer, Err(FsError::NotLeader { .. })), "{answer:?}");
}

/// A change committed just before its leader lost its place, while it waited for the
/// others' acks, is answered `NotLeader`, not done: its caller retries at the new leader,
/// which answers the same request once more only after the holders, who reasserted their
/// caps there, dropped what they cached. Answered done, the holder kept serving the state
/// from before the change (caps.md, until 2026-11-27 a known limit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_leader_lost_its_place_before_the_acks_is_answered_after_them_elsewhere() {
    // A lease the silent holder keeps for the whole test: only the lost place ends the wait.
    let mut cluster = Cluster::start(3, Tuning { session_lease_ms: 30_000, ..test_tuning() }).await;
    let old = cluster.leader().await;
    let client = cluster.client_all();
    let (holder, changer) = two_sessions(&client).await;
    let ino = create(&client, holder, 1, "f").await;
    let (seq, version) = take_cap(&client, holder, ino, CapMode::Shared).await;
    let set = SetAttr { perm: Some(0o600), ..SetAttr::default() };
    let chmod = req(changer, 1, MetaOp::SetAttr { ino, set });
    let node = cluster.server(old).node.clone();
    let first = tokio::spawn({
        let chmod = chmod.clone();
        async move { node.meta(chmod).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_finished(), "answered while the holder still cached the old mode");
    cluster.stop(old).await;
    let answer = tokio::time::timeout(Duration::from_secs(15), first).await.unwrap().unwrap();
    assert!(matches!(answer, Err(FsError::NotLeader { .. })), "{answer:?}");

    cluster.leader().await;
    // Each session learns the new term, then reasserts what it holds.
    let held = vec![HeldCap { ino, mode: CapMode::Shared, seq, version }];
    let (_, term) = poll(&client, holder, held.clone(), 0).await;
    poll(&client, changer, vec![], 0).await;
    poll(&client, changer, vec![], term).await;
    let recall = CapRef { ino, seq };
    let (recalls, _) = poll(&client, holder, held, term).await;
    let retried = tokio::spawn({
        let client = client.clone();
        async move { client.call(chmod).await }
    });
    let mut recalled = recalls.contains(&recall);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !recalled {
        assert!(Instant::now() < deadline, "the new leader never recalled the holder's cap");
        recalled = poll(&client, holder, vec![], term).await.0.contains(&recall);
    }
    assert!(!retried.is_finished(), "the retry was answered before the holder acked");
    ack(&client, holder, vec![recall]).await;
    let answer = tokio::time::timeout(Duration::from_secs(10), retried).await.unwrap().unwrap();
    match answer {
        Ok(MetaResponse::Attr(attr)) => assert_eq!(attr.perm, 0o600),
        other => panic!("the retried chmod answered {other:?}"),
    }
}

/// A retry of an unlink whose first attempt still waits for a holder of the file (its
/// caller timed out) waits for that attempt: the retry finds the name gone and would
/// recall nobody, so it was answered before the holder dropped the file from its cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_change_still_waiting_for_acks_waits_with_it() {
    // A lease the silent holder keeps for the whole test: only its ack ends the wait.
    let cluster = Cluster::start(1, Tuning { session_lease_ms: 30_000, ..test_tuning() }).await;
    let leader = cluster.leader().await;
    let client = cluster.client_all();
    let (holder, changer) = two_sessions(&client).await;
    let ino = create(&client, holder, 1, "f").await;
    let (seq, _) = take_cap(&client, holder, ino, CapMode::Shared).await;
    let unlink = MetaOp::Unlink { parent: InodeId::ROOT, name: b"f".to_vec(), open: false };
    let unlink = req(changer, 1, unlink);
    let attempt = || {
        let (node, unlink) = (cluster.server(leader).node.clone(), unlink.clone());
        tokio::spawn(async move { node.meta(unlink).await })
    };
    let first = attempt();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = attempt();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!first.is_finished(), "answered while the holder still cached the file");
    assert!(!retry.is_finished(), "the retry was answered before the holder acked");
    ack(&client, holder, vec![CapRef { ino, seq }]).await;
    for answer in [first, retry] {
        let answer = tokio::time::timeout(Duration::from_secs(10), answer).await.unwrap().unwrap();
        assert_eq!(answer, Ok(MetaResponse::Done));
    }
    assert_eq!(cluster.server(leader).node.attempts.in_progress(), 0, "an attempt stayed");
}

/// A grant carries the inode's xattrs, read with its attributes, so that the holder can
/// answer xattr calls from them; an inode with more than a grant carries gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_carries_the_inodes_xattrs_unless_they_are_too_many() {
    let cluster = Cluster::start(3, test_tuning()).await;
    cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    let grant = |ino| {
        let op = MetaOp::GetCaps { ino, name: None, mode: CapMode::Shared };
        let client = &client;
        async move {
            match client.call(req(session, 0, op)).await.unwrap() {
                MetaResponse::Caps { xattrs, .. } => xattrs,
                other => panic!("GetCaps answered {other:?}"),
            }
        }
    };
    let set = |ino, req_id, name: &str, value: Vec<u8>| {
        let op = MetaOp::SetXattr { ino, name: name.into(), value, flags: 0 };
        let client = &client;
        async move { client.call(req(session, req_id, op)).await.unwrap() }
    };
    let ino = create(&client, session, 1, "f").await;
    assert_eq!(grant(ino).await, Some(vec![]));
    set(ino, 2, "user.b", b"2".to_vec()).await;
    set(ino, 3, "user.a", b"1".to_vec()).await;
    let both = vec![(b"user.a".to_vec(), b"1".to_vec()), (b"user.b".to_vec(), b"2".to_vec())];
    assert_eq!(grant(ino).await, Some(both));
    set(ino, 4, "user.big", vec![7; XATTRS_IN_GRANT_MAX]).await;
    assert_eq!(grant(ino).await, None);
}

/// `GetCapsMany` looks up many names of a directory at once: the holders of all of
/// them are recalled together, a name not found is left out, and the grants come in
/// the order asked, each naming the inode its name does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_names_are_looked_up_at_once_and_their_holders_recalled_together() {
    let cluster = Cluster::start(3, Tuning { session_lease_ms: 8000, ..test_tuning() }).await;
    cluster.leader().await;
    let client = cluster.client_all();
    let (holder, looker) = two_sessions(&client).await;
    let mut inodes = Vec::new();
    for (i, name) in ["f0", "f1", "f2", "f3"].into_iter().enumerate() {
        inodes.push(create(&client, holder, i as u64 + 1, name).await);
    }
    let held = [
        CapRef {
            ino: inodes[0],
            seq: take_cap(&client, holder, inodes[0], CapMode::Exclusive).await.0,
        },
        CapRef {
            ino: inodes[2],
            seq: take_cap(&client, holder, inodes[2], CapMode::Exclusive).await.0,
        },
    ];
    let term = reasserted(&client, holder).await;
    let names = |list: &[&str]| list.iter().map(|n| n.as_bytes().to_vec()).collect::<Vec<_>>();
    let many = move |names| req(looker, 0, MetaOp::GetCapsMany { dir: InodeId::ROOT, names });
    let asked = many(names(&["f3", "f0", "missing", "f2", "f1"]));
    let wanted = tokio::spawn({
        let client = client.clone();
        async move { client.call_leader(asked, Duration::from_secs(15)).await }
    });
    let mut recalled = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while recalled.len() < held.len() {
        let (recalls, _) = poll(&client, holder, vec![], term).await;
        recalled.extend(recalls);
        assert!(Instant::now() < deadline, "recalled only {recalled:?}");
    }
    recalled.sort_by_key(|r| r.ino);
    assert_eq!(recalled, held);
    assert!(!wanted.is_finished(), "granted before the holder acked");
    ack(&client, holder, held.to_vec()).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), wanted).await.unwrap().unwrap();
    let Ok(MetaResponse::Grants { dir_seq, dir_version, grants }) = answer else {
        panic!("GetCapsMany answered {answer:?}")
    };
    assert!(dir_seq > 0 && dir_version > 0);
    let found: Vec<(Vec<u8>, InodeId)> =
        grants.iter().map(|g| (g.name.clone(), g.attr.ino)).collect();
    let expected = [("f3", 3), ("f0", 0), ("f2", 2), ("f1", 1)];
    let expected: Vec<_> =
        expected.iter().map(|(n, i)| (n.as_bytes().to_vec(), inodes[*i])).collect();
    assert_eq!(found, expected);
    assert!(grants
        .iter()
        .all(|g| g.mode == CapMode::Shared && g.seq > 0 && g.xattrs == Some(vec![])));
    // The looker's grants are real: a change by the holder recalls them.
    let chmod = SetAttr { perm: Some(0o600), ..SetAttr::default() };
    let change = tokio::spawn({
        let client = client.clone();
        let op = MetaOp::SetAttr { ino: inodes[1], set: chmod };
        async move { client.call(req(holder, 10, op)).await }
    });
    let recalls = next_recalls(&client, looker, term).await;
    assert_eq!(recalls.iter().map(|r| r.ino).collect::<Vec<_>>(), vec![inodes[1]]);
    ack(&client, looker, recalls).await;
    tokio::time::timeout(Duration::from_secs(5), change).await.unwrap().unwrap().unwrap();
    // More names than one call may look up are refused.
    let too_many = vec![b"f0".to_vec(); LOOKUP_MANY_MAX + 1];
    let refused = client.call_leader(many(too_many), Duration::from_secs(5)).await;
    assert!(matches!(refused, Err(FsError::Invalid(_))), "{refused:?}");
}

/// `TakeFiles` grants `Exclusive` on many files of a directory at once, for a client
/// about to remove them itself: another session's caps on them are recalled together
/// first, and a directory or a name not found is left out of the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_files_are_taken_exclusively_at_once_and_other_holders_recalled() {
    let cluster = Cluster::start(3, Tuning { session_lease_ms: 8000, ..test_tuning() }).await;
    cluster.leader().await;
    let client = cluster.client_all();
    let (holder, taker) = two_sessions(&client).await;
    let f0 = create(&client, holder, 1, "f0").await;
    let f1 = create(&client, holder, 2, "f1").await;
    let mkdir =
        MetaOp::Mkdir { parent: InodeId::ROOT, name: b"d".to_vec(), perm: 0o755, uid: 0, gid: 0 };
    client.call(req(holder, 3, mkdir)).await.unwrap();
    let held = CapRef { ino: f0, seq: take_cap(&client, holder, f0, CapMode::Shared).await.0 };
    let term = reasserted(&client, holder).await;
    let names = ["f1", "d", "missing", "f0"].map(|n| n.as_bytes().to_vec()).to_vec();
    let take = req(taker, 0, MetaOp::TakeFiles { dir: InodeId::ROOT, names });
    let wanted = tokio::spawn({
        let client = client.clone();
        async move { client.call_leader(take, Duration::from_secs(15)).await }
    });
    until_recalled(&client, holder, term, held, (10, "the recall of the shared cap")).await;
    assert!(!wanted.is_finished(), "taken before the holder acked");
    ack(&client, holder, vec![held]).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), wanted).await.unwrap().unwrap();
    let Ok(MetaResponse::Grants { grants, .. }) = answer else {
        panic!("TakeFiles answered {answer:?}")
    };
    let taken: Vec<(Vec<u8>, InodeId, CapMode)> =
        grants.iter().map(|g| (g.name.clone(), g.attr.ino, g.mode)).collect();
    let want =
        vec![(b"f1".to_vec(), f1, CapMode::Exclusive), (b"f0".to_vec(), f0, CapMode::Exclusive)];
    assert_eq!(taken, want);
    // The grants are real: a shared cap another session asks for waits for the taker.
    let asked = tokio::spawn({
        let client = client.clone();
        async move { take_cap(&client, holder, f1, CapMode::Shared).await }
    });
    let recalls = next_recalls(&client, taker, term).await;
    assert_eq!(recalls.iter().map(|r| r.ino).collect::<Vec<_>>(), vec![f1]);
    assert!(!asked.is_finished(), "granted shared while the taker held the file exclusively");
    ack(&client, taker, recalls).await;
    tokio::time::timeout(Duration::from_secs(5), asked).await.unwrap().unwrap();
}
