//! Online membership: replicas added (catching up by snapshot) and removed while the
//! group serves, and a five-replica group that survives two failures.

use super::*;

fn admin(op: MetaOp) -> MetaRequest {
    MetaRequest { session: SessionId(0), req_id: RequestId(0), op }
}

fn voters(cluster: &Cluster, i: usize) -> Vec<u64> {
    cluster.server(i).node.raft.view().voters.iter().map(|(id, _)| id.0).collect()
}

impl Cluster {
    /// Starts a new, empty replica that belongs to no group until the leader adds it.
    async fn start_joiner(&mut self) -> (usize, NodeId) {
        let i = self.servers.len();
        let id = NodeId(i as u64 + 1);
        self.dirs.push(tempfile::tempdir().unwrap());
        self.addrs.push(free_addrs(1)[0]);
        let cfg =
            MetaConfig { peers: vec![(id, self.addrs[i])], bootstrap: false, ..self.config(i) };
        self.servers.push(Some(Server::start(cfg, self.tuning.clone()).await.unwrap()));
        (i, id)
    }
}

async fn wait_applied(cluster: &Cluster, i: usize, target: u64) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster.server(i).node.raft.view().last_applied < target {
        assert!(Instant::now() < deadline, "replica {i} did not catch up to {target}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_is_added_by_snapshot_and_another_removed_while_serving() {
    let mut cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    // Enough entries that the log is compacted: the newcomer must take a snapshot.
    for i in 0..250u64 {
        create(&client, session, i + 1, &format!("f{i}")).await;
    }
    assert!(cluster.server(leader).node.raft.compaction().1.is_some(), "log not compacted");
    let (new, new_id) = cluster.start_joiner().await;
    let add = MetaOp::AddReplica { id: new_id, addr: cluster.addrs[new] };
    // Asked of a follower: it forwards to the leader.
    cluster.client((leader + 1) % 3).call(admin(add)).await.unwrap();
    assert_eq!(voters(&cluster, leader), vec![1, 2, 3, 4]);
    wait_applied(&cluster, new, cluster.server(leader).node.raft.view().last_applied).await;
    assert!(cluster.server(new).node.raft.compaction().0.is_some(), "caught up without a snapshot");
    // The newcomer serves reads and forwards writes.
    let newcomer = cluster.client(new);
    assert!(lookup(&newcomer, "f249").await.is_ok());
    create(&newcomer, session, 1000, "via-new").await;

    let gone = (leader + 2) % 3;
    let remove = MetaOp::RemoveReplica { id: NodeId(gone as u64 + 1) };
    client.call(admin(remove.clone())).await.unwrap();
    cluster.stop(gone).await;
    let want: Vec<u64> = (1..=4).filter(|id| *id != gone as u64 + 1).collect();
    assert_eq!(voters(&cluster, leader), want);
    // Removing it again: it is no member.
    assert_eq!(client.call(admin(remove)).await, Err(FsError::NotFound));
    create(&client, session, 1001, "after-remove").await;
    assert!(lookup(&cluster.client(new), "after-remove").await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_replicas_survive_two_failures() {
    let mut cluster = Cluster::start(5, test_tuning()).await;
    let leader = cluster.leader().await;
    let client = cluster.client_all();
    let session = open_session(&client).await;
    create(&client, session, 1, "before").await;
    // The leader and one follower die.
    cluster.stop(leader).await;
    cluster.stop((leader + 1) % 5).await;
    cluster.leader().await;
    create(&client, session, 2, "after").await;
    for i in 0..5 {
        if cluster.servers[i].is_some() {
            assert!(lookup(&cluster.client(i), "before").await.is_ok());
            assert!(lookup(&cluster.client(i), "after").await.is_ok());
        }
    }
}
