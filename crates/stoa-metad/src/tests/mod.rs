//! Whole replicas over real TCP on 127.0.0.1, each with its own temporary data directory.

mod chunk_servers;
mod membership;
mod sessions;

use crate::raft::{Role, Tuning};
use crate::server::Server;
use crate::{MetaConfig, MetadError};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use stoa_net::{MetaClient, Pool};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse};
use stoa_types::{FileKind, FsError, InodeId, NodeId, RequestId, SessionId};

/// Logs to the test output when RUST_LOG is set.
fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Fast compaction so that tests reach it with a few hundred entries.
fn test_tuning() -> Tuning {
    Tuning { snapshot_every_entries: 100, entries_kept_after_snapshot: 10, ..Tuning::default() }
}

/// Addresses that were free a moment ago (the listeners are dropped before use).
fn free_addrs(n: usize) -> Vec<SocketAddr> {
    let listeners: Vec<_> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    listeners.iter().map(|l| l.local_addr().unwrap()).collect()
}

/// A one-replica cluster's config.
fn lone_config(dir: &std::path::Path, addr: SocketAddr) -> MetaConfig {
    MetaConfig {
        id: NodeId(1),
        listen: addr,
        data_dir: dir.to_path_buf(),
        peers: vec![(NodeId(1), addr)],
        bootstrap: true,
        replicas: 1,
        chunk_size_bytes: 64 * 1024,
        rebuild_after: crate::REBUILD_AFTER_DEFAULT,
    }
}

struct Cluster {
    dirs: Vec<tempfile::TempDir>,
    addrs: Vec<SocketAddr>,
    servers: Vec<Option<Server>>,
    tuning: Tuning,
    replicas: u8,
}

impl Cluster {
    async fn start(n: usize, tuning: Tuning) -> Cluster {
        Cluster::start_with(n, tuning, 1).await
    }

    /// `n` replicas of a cluster that keeps `replicas` copies of each chunk.
    async fn start_with(n: usize, tuning: Tuning, replicas: u8) -> Cluster {
        init_logs();
        let mut cluster = Cluster {
            dirs: (0..n).map(|_| tempfile::tempdir().unwrap()).collect(),
            addrs: free_addrs(n),
            servers: (0..n).map(|_| None).collect(),
            tuning,
            replicas,
        };
        for i in 0..n {
            cluster.restart(i).await;
        }
        cluster
    }

    fn config(&self, i: usize) -> MetaConfig {
        MetaConfig {
            id: NodeId(i as u64 + 1),
            listen: self.addrs[i],
            data_dir: self.dirs[i].path().to_path_buf(),
            peers: self.addrs.iter().enumerate().map(|(j, a)| (NodeId(j as u64 + 1), *a)).collect(),
            bootstrap: true,
            replicas: self.replicas,
            chunk_size_bytes: 64 * 1024,
            rebuild_after: crate::REBUILD_AFTER_DEFAULT,
        }
    }

    async fn restart(&mut self, i: usize) {
        let server = Server::start(self.config(i), self.tuning.clone()).await.unwrap();
        self.servers[i] = Some(server);
    }

    async fn stop(&mut self, i: usize) {
        if let Some(server) = self.servers[i].take() {
            server.stop().await;
        }
    }

    fn server(&self, i: usize) -> &Server {
        self.servers[i].as_ref().expect("server is running")
    }

    /// Waits until every running replica agrees on one leader and the cluster has been
    /// created, and returns the leader's index.
    async fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let running: Vec<(usize, &Server)> = self
                .servers
                .iter()
                .enumerate()
                .filter_map(|(i, s)| Some((i, s.as_ref()?)))
                .collect();
            let views: Vec<_> = running.iter().map(|(i, s)| (*i, s.node.raft.view())).collect();
            let leaders: Vec<usize> =
                views.iter().filter(|(_, v)| v.role == Role::Leader).map(|(i, _)| *i).collect();
            if let [leader] = leaders[..] {
                let id = NodeId(leader as u64 + 1);
                let agreed = views.iter().all(|(_, v)| v.leader == Some(id));
                let created = running.iter().all(|(_, s)| s.node.cluster.get().is_some());
                if agreed && created {
                    return leader;
                }
            }
            assert!(Instant::now() < deadline, "no agreed leader: {views:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn client(&self, i: usize) -> MetaClient {
        MetaClient::new(Pool::new(), vec![self.addrs[i]], Duration::from_secs(10))
    }

    fn client_all(&self) -> MetaClient {
        MetaClient::new(Pool::new(), self.addrs.clone(), Duration::from_secs(15))
    }
}

async fn open_session(client: &MetaClient) -> SessionId {
    let req = MetaRequest {
        session: SessionId(0),
        req_id: RequestId(0),
        op: MetaOp::OpenSession { client: "test".into() },
    };
    match client.call(req).await.unwrap() {
        MetaResponse::Session(grant) => grant.session,
        other => panic!("open session answered {other:?}"),
    }
}

fn create_req(session: SessionId, req_id: u64, name: &str) -> MetaRequest {
    MetaRequest {
        session,
        req_id: RequestId(req_id),
        op: MetaOp::Create {
            parent: InodeId::ROOT,
            name: name.as_bytes().to_vec(),
            kind: FileKind::File,
            perm: 0o644,
            uid: 0,
            gid: 0,
            rdev: 0,
        },
    }
}

async fn create(client: &MetaClient, session: SessionId, req_id: u64, name: &str) -> InodeId {
    match client.call(create_req(session, req_id, name)).await.unwrap() {
        MetaResponse::Attr(attr) => attr.ino,
        other => panic!("create answered {other:?}"),
    }
}

async fn lookup(client: &MetaClient, name: &str) -> Result<InodeId, FsError> {
    let req = MetaRequest {
        session: SessionId(0),
        req_id: RequestId(0),
        op: MetaOp::Lookup { parent: InodeId::ROOT, name: name.as_bytes().to_vec() },
    };
    match client.call(req).await? {
        MetaResponse::Attr(attr) => Ok(attr.ino),
        other => panic!("lookup answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_elect_a_leader_and_apply_creates_sent_to_a_follower() {
    let cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    let client = cluster.client(follower);
    let session = open_session(&client).await;
    let a = create(&client, session, 1, "a").await;
    let b = create(&client, session, 2, "b").await;
    assert_ne!(a, b);
    // Reads through any replica see the writes (they are linearizable at the leader).
    for i in 0..3 {
        assert_eq!(lookup(&cluster.client(i), "a").await.unwrap(), a);
    }
    assert_eq!(lookup(&client, "missing").await, Err(FsError::NotFound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_takes_over_and_a_retried_create_gets_the_first_answer() {
    let mut cluster = Cluster::start(3, test_tuning()).await;
    let old = cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    let first = create(&client, session, 1, "x").await;

    let stopped_at = Instant::now();
    cluster.stop(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    assert!(
        stopped_at.elapsed() < Duration::from_secs(5),
        "failover took {:?}",
        stopped_at.elapsed()
    );

    // The same (session, request id) again: the original answer, not EEXIST.
    let again = create(&client, session, 1, "x").await;
    assert_eq!(again, first);
    let other = create(&client, session, 2, "y").await;
    assert_ne!(other, first);
}

/// Found by the fault tests: a leader cut off from the other replicas kept answering
/// chunk-server heartbeats and taking client calls for as long as the cut lasted (and
/// tens of seconds more), so neither found the new leader. Without a quorum answering
/// it, it must act as if there were no leader (check quorum), and lead again once it
/// can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_a_quorum_stops_acting_as_leader() {
    let mut cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &followers {
        cluster.stop(i).await;
    }
    let node = cluster.server(leader).node.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    while node.raft.view().role != Role::Isolated {
        assert!(Instant::now() < deadline, "still leading alone: {:?}", node.raft.view());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let session = SessionId(1);
    let not_leader = |r: Result<MetaResponse, FsError>| {
        assert!(matches!(r, Err(FsError::NotLeader { leader: None, .. })), "{r:?}")
    };
    not_leader(node.meta(create_req(session, 1, "lost")).await);
    let beat = MetaOp::ChunkHeartbeat {
        node: NodeId(100),
        capacity_bytes: 1,
        used_bytes: 0,
        table_version: 0,
        repair: Default::default(),
    };
    not_leader(
        node.meta(MetaRequest { session: SessionId(0), req_id: RequestId(0), op: beat }).await,
    );
    cluster.restart(followers[0]).await;
    cluster.leader().await;
}

/// Reads under the leader's lease (`MetaRaft::lease_index`) skip the round to the
/// followers, so they must stop as soon as the followers may have stopped listening.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_reads_under_its_lease_only_while_a_quorum_accepts_it() {
    let mut cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let client = cluster.client(leader);
    let session = open_session(&client).await;
    create(&client, session, 1, "f").await;
    let node = cluster.server(leader).node.clone();
    let deadline = Instant::now() + Duration::from_secs(15);
    while node.raft.lease_index().is_none() {
        assert!(Instant::now() < deadline, "no lease: {:?}", node.raft.view());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(node.raft.lease_index() >= Some(node.raft.view().last_applied - 1));
    node.raft.linearize().await.unwrap();
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &i in &followers {
        cluster.stop(i).await;
    }
    // Nothing sent from now on can be accepted: the lease ends within its length.
    tokio::time::sleep(node.raft.lease()).await;
    assert_eq!(node.raft.lease_index(), None);
    let read = tokio::time::timeout(Duration::from_secs(10), node.raft.linearize()).await;
    assert!(matches!(read, Ok(Err(_))), "a read without a quorum: {read:?}");
    cluster.restart(followers[0]).await;
    cluster.leader().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_keeps_its_state() {
    let mut cluster = Cluster::start(1, test_tuning()).await;
    cluster.leader().await;
    let client = cluster.client(0);
    let session = open_session(&client).await;
    let ino = create(&client, session, 1, "kept").await;
    let cluster_id = cluster.server(0).node.cluster.get();
    let applied = cluster.server(0).node.raft.view().last_applied;

    cluster.stop(0).await;
    cluster.restart(0).await;
    cluster.leader().await;
    assert_eq!(cluster.server(0).node.cluster.get(), cluster_id);
    assert!(cluster.server(0).node.raft.view().last_applied >= applied);
    assert_eq!(lookup(&cluster.client(0), "kept").await.unwrap(), ino);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_replica_cluster_creates_itself_and_reports_status() {
    let cluster = Cluster::start(1, test_tuning()).await;
    cluster.leader().await;
    let client = cluster.client(0);
    let session = open_session(&client).await;
    create(&client, session, 1, "f").await;
    let req = MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::Status };
    let MetaResponse::Status(status) = client.call(req).await.unwrap() else {
        panic!("status answered something else")
    };
    assert_eq!(Some(status.cluster), cluster.server(0).node.cluster.get());
    assert_eq!(status.answered_by, NodeId(1));
    assert_eq!(status.leader, Some(NodeId(1)));
    assert!(status.quorate, "{status:?}");
    assert_eq!(status.members.len(), 1);
    assert!(status.members[0].up);
    assert!(status.files >= 1, "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_asked_of_a_follower_is_answered_by_the_leader() {
    let cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let follower = (leader + 2) % 3;
    // Let the leader hear from every peer at least once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let req = MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::Status };
    let MetaResponse::Status(status) = cluster.client(follower).call(req).await.unwrap() else {
        panic!("status answered something else")
    };
    assert_eq!(status.answered_by, NodeId(leader as u64 + 1), "{status:?}");
    assert_eq!(status.leader, Some(NodeId(leader as u64 + 1)));
    assert!(status.quorate);
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.up), "{:?}", status.members);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_replica_catches_up_by_snapshot_after_compaction() {
    let mut cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let lagging = (leader + 1) % 3;
    cluster.stop(lagging).await;
    let client = cluster.client(leader);
    let session = open_session(&client).await;
    for i in 0..250u64 {
        create(&client, session, i + 1, &format!("f{i}")).await;
    }
    let view = cluster.server(leader).node.raft.view();
    // The purge follows the snapshot in the background: give it a moment (bounded).
    let compacted = Instant::now() + Duration::from_secs(10);
    let (snapshot, purged) = loop {
        let (snapshot, purged) = cluster.server(leader).node.raft.compaction();
        if purged.is_some() || Instant::now() > compacted {
            break (snapshot, purged);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(snapshot.is_some(), "no snapshot built: {view:?}");
    assert!(purged.is_some(), "log not compacted: {view:?}");
    assert!(cluster.dirs[leader].path().join("snapshots/current.snap").exists());

    cluster.restart(lagging).await;
    let target = view.last_applied;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = cluster.server(lagging).node.raft.view();
        if v.last_applied >= target {
            let (snapshot, _) = cluster.server(lagging).node.raft.compaction();
            assert!(snapshot.is_some(), "caught up without a snapshot: {v:?}");
            break;
        }
        assert!(Instant::now() < deadline, "lagging replica stuck at {}", v.last_applied);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The installed state answers locally: stop the others' leadership by asking the
    // lagging replica's own store.
    let ino = cluster
        .server(lagging)
        .node
        .raft
        .read(|kv| {
            stoa_meta::read(kv, &MetaOp::Lookup { parent: InodeId::ROOT, name: b"f249".to_vec() })
        })
        .await
        .unwrap();
    assert!(matches!(ino, MetaResponse::Attr(_)), "{ino:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_server_on_the_same_data_dir_fails_clearly() {
    let cluster = Cluster::start(1, test_tuning()).await;
    let mut cfg = cluster.config(0);
    cfg.listen = free_addrs(1)[0];
    let err = Server::start(cfg, test_tuning()).await.err().expect("second server started");
    assert!(matches!(err, MetadError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("is in use by another process"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_a_clear_error() {
    let cluster = Cluster::start(1, test_tuning()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = cluster.config(0);
    cfg.data_dir = dir.path().to_path_buf();
    let err = Server::start(cfg, test_tuning()).await.err().expect("second bind succeeded");
    let text = err.to_string();
    assert!(text.contains(&cluster.addrs[0].to_string()) && text.contains("in use"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_store_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("meta.redb"), vec![0x5a; 64 * 1024]).unwrap();
    let cfg = lone_config(dir.path(), free_addrs(1)[0]);
    let err = Server::start(cfg, test_tuning()).await.err().expect("started on garbage");
    let text = err.to_string();
    assert!(matches!(err, MetadError::Store { .. }) && text.contains("meta.redb"), "{text}");
}

#[tokio::test]
async fn run_stops_cleanly_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = lone_config(dir.path(), free_addrs(1)[0]);
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(crate::run(cfg.clone(), async move {
        let _ = rx.await;
    }));
    tokio::time::sleep(Duration::from_millis(300)).await;
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(15), running).await.unwrap().unwrap().unwrap();
    // The directory is free again at once.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tx.send(()).unwrap();
    crate::run(cfg, async move {
        let _ = rx.await;
    })
    .await
    .unwrap();
}

#[test]
fn bad_configs_are_refused_with_the_reason() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let good = lone_config(std::path::Path::new("/nonexistent"), addr);
    assert!(crate::server::validate(&good).is_ok());
    let cases: Vec<(MetaConfig, &str)> = vec![
        (MetaConfig { id: NodeId(0), ..good.clone() }, "1..=99"),
        (MetaConfig { peers: vec![(NodeId(2), addr)], ..good.clone() }, "include this replica"),
        (MetaConfig { replicas: 0, ..good.clone() }, "replicas"),
        (MetaConfig { chunk_size_bytes: 1000, ..good.clone() }, "chunk_size_bytes"),
        (MetaConfig { peers: vec![(NodeId(1), addr), (NodeId(1), addr)], ..good.clone() }, "twice"),
    ];
    for (cfg, want) in cases {
        let err = crate::server::validate(&cfg).unwrap_err().to_string();
        assert!(err.contains(want), "{err} should mention {want}");
    }
}
