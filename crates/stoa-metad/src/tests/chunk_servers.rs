//! The leader's dealings with chunk servers: heartbeats, liveness verdicts and garbage
//! collection, against fake chunk servers on real sockets.

use super::*;
use bytes::Bytes;
use std::sync::{Arc, Mutex};
use stoa_net::Handler;
use stoa_proto::{ChunkOp, ChunkRequest, ChunkResponse, Reply, Request, Response};
use stoa_types::{ChainTable, ChunkId};

/// A chunk server that records the chunks it is told to truncate, and fails the
/// truncations of the chunks of the inode in `refused`.
#[derive(Default)]
struct FakeChunkServer {
    truncated: Mutex<Vec<(ChunkId, u32)>>,
    refused: Mutex<Option<InodeId>>,
}

impl Handler for FakeChunkServer {
    async fn handle(&self, req: Request, _: Bytes, _: SocketAddr) -> (Reply, Bytes) {
        let reply = match req {
            Request::Chunk(ChunkRequest { op: ChunkOp::Truncate { chunk, .. }, .. })
                if *self.refused.lock().unwrap() == Some(chunk.ino) =>
            {
                Err(FsError::Io("disk on fire".into()))
            }
            Request::Chunk(ChunkRequest { op: ChunkOp::Truncate { chunk, len, .. }, .. }) => {
                self.truncated.lock().unwrap().push((chunk, len));
                Ok(Response::Chunk(ChunkResponse::Written { version: 1 }))
            }
            other => {
                tracing::warn!("fake chunk server got {other:?}");
                Err(FsError::NotSupported)
            }
        };
        (reply, Bytes::new())
    }
}

async fn start_fake() -> (SocketAddr, Arc<FakeChunkServer>) {
    let listener = stoa_net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let fake = Arc::new(FakeChunkServer::default());
    tokio::spawn(stoa_net::serve(listener, fake.clone()));
    (addr, fake)
}

fn op(op: MetaOp) -> MetaRequest {
    MetaRequest { session: SessionId(0), req_id: RequestId(0), op }
}

async fn register(client: &MetaClient, addr: SocketAddr) -> NodeId {
    let req = op(MetaOp::RegisterChunkServer {
        node: None,
        cluster: None,
        addr,
        zone: "z".into(),
        capacity_bytes: 1 << 30,
        used_bytes: 1 << 20,
    });
    match client.call(req).await.unwrap() {
        MetaResponse::Registered { node, .. } => node,
        other => panic!("register answered {other:?}"),
    }
}

async fn heartbeat(client: &MetaClient, node: NodeId, table_version: u64) -> Option<ChainTable> {
    let req = op(MetaOp::ChunkHeartbeat {
        node,
        capacity_bytes: 1 << 30,
        used_bytes: 1 << 20,
        table_version,
        repair: stoa_proto::RepairProgress::default(),
    });
    match client.call(req).await.unwrap() {
        MetaResponse::Heartbeat { table, .. } => table,
        other => panic!("heartbeat answered {other:?}"),
    }
}

async fn chain_table(client: &MetaClient) -> ChainTable {
    match client.call(op(MetaOp::GetChainTable)).await.unwrap() {
        MetaResponse::ChainTable(table) => table,
        other => panic!("get chain table answered {other:?}"),
    }
}

/// Heartbeats for `nodes` every 200 ms while the returned task lives.
fn keep_beating(client: MetaClient, nodes: Vec<NodeId>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for &node in &nodes {
                heartbeat(&client, node, 0).await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Polls `check` until it holds, for up to `secs` seconds.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_is_answered_with_the_table_only_when_it_changed() {
    let cluster = Cluster::start(3, test_tuning()).await;
    let leader = cluster.leader().await;
    // Through a follower: heartbeats are the leader's business and get forwarded.
    let client = cluster.client((leader + 1) % 3);
    let node = register(&client, "127.0.0.1:1".parse().unwrap()).await;
    let table = heartbeat(&client, node, 0).await.expect("a stale copy gets the table");
    assert!(table.nodes.iter().any(|n| n.id == node));
    assert_eq!(heartbeat(&client, node, table.version).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_chunk_server_leaves_its_chains_and_rejoins_when_it_returns() {
    let cluster = Cluster::start_with(1, test_tuning(), 2).await;
    cluster.leader().await;
    let client = cluster.client(0);
    let a = register(&client, "127.0.0.1:1".parse().unwrap()).await;
    let b = register(&client, "127.0.0.1:2".parse().unwrap()).await;
    let before = chain_table(&client).await;
    assert_eq!(before.chains.len(), 2, "{before:?}");
    assert!(before.chains.iter().all(|c| c.members.len() == 2), "{before:?}");

    // Only `a` heartbeats: after the leader's grace period `b` is taken out.
    let beating_a = keep_beating(client.clone(), vec![a]);
    eventually(10, "b leaves every chain", || async {
        let t = chain_table(&client).await;
        t.chains.iter().all(|c| !c.write_path().any(|n| n == b))
    })
    .await;
    let after = chain_table(&client).await;
    assert!(after.version > before.version);
    assert!(after.chains.iter().all(|c| c.members == vec![a]), "{after:?}");

    // `b` comes back: it is added to the short chains as a syncing member.
    let beating_b = keep_beating(client.clone(), vec![b]);
    eventually(10, "b rejoins the chains as syncing", || async {
        let t = chain_table(&client).await;
        t.chains.iter().all(|c| c.syncing.contains(&b))
    })
    .await;

    let MetaResponse::Status(status) = client.call(op(MetaOp::Status)).await.unwrap() else {
        panic!("status answered something else")
    };
    let up: Vec<_> = status.chunk_servers.iter().filter(|s| s.up).map(|s| s.id).collect();
    assert_eq!(up, vec![a, b], "{status:?}");
    beating_a.abort();
    beating_b.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chunks_of_deleted_files_are_deleted_and_their_garbage_entries_dropped() {
    let cluster = Cluster::start(1, test_tuning()).await;
    cluster.leader().await;
    let client = cluster.client(0);
    let (addr, fake) = start_fake().await;
    let node = register(&client, addr).await;
    let beating = keep_beating(client.clone(), vec![node]);
    let session = open_session(&client).await;
    // Sizes of 4 chunks, 1 chunk, none, and 2 chunks (64 KiB chunks in tests).
    let sizes = [3 * 64 * 1024 + 1, 10, 0, 64 * 1024 + 1];
    let mut inos = Vec::new();
    for (i, &size) in sizes.iter().enumerate() {
        let req_id = 10 * i as u64;
        let ino = create(&client, session, req_id + 1, &format!("f{i}")).await;
        let commit = MetaOp::CommitWrite { ino, size };
        client
            .call(MetaRequest { session, req_id: RequestId(req_id + 2), op: commit })
            .await
            .unwrap();
        inos.push(ino);
    }
    // The last file's chunk server fails its deletions until told otherwise.
    *fake.refused.lock().unwrap() = Some(inos[3]);
    for (i, _) in sizes.iter().enumerate() {
        let unlink = MetaOp::Unlink {
            parent: InodeId::ROOT,
            name: format!("f{i}").into_bytes(),
            open: false,
        };
        let req_id = RequestId(10 * i as u64 + 3);
        client.call(MetaRequest { session, req_id, op: unlink }).await.unwrap();
    }

    let server = cluster.server(0);
    let garbage = || async {
        server.node.raft.read(move |kv| stoa_meta::garbage(kv, InodeId(0), 10)).await.unwrap()
    };
    // Kept a while as strays (stoa-meta `ops/unlink.rs`), then garbage, then gone: all
    // but the file whose deletion fails, which stays garbage.
    eventually(10, "the garbage entries of the deleted files are dropped", || async {
        garbage().await.iter().map(|(ino, _)| *ino).collect::<Vec<_>>() == vec![inos[3]]
    })
    .await;
    let truncated = || {
        let mut truncated = fake.truncated.lock().unwrap().clone();
        truncated.sort();
        truncated.dedup();
        truncated
    };
    let chunks = |ino, n| (0..n).map(move |index| (ChunkId { ino, index }, 0));
    let want: Vec<_> = chunks(inos[0], 4).chain(chunks(inos[1], 1)).collect();
    assert_eq!(truncated(), want);

    // Once the chunk server deletes again, so does the next round.
    *fake.refused.lock().unwrap() = None;
    eventually(10, "the last garbage entry is dropped", || async { garbage().await.is_empty() })
        .await;
    let want: Vec<_> = want.into_iter().chain(chunks(inos[3], 2)).collect();
    assert_eq!(truncated(), want);
    for ino in inos {
        let gone = server
            .node
            .raft
            .read(move |kv| Ok(stoa_meta::read(kv, &MetaOp::GetAttr { ino }).is_err()))
            .await
            .unwrap();
        assert!(gone, "inode {ino} is still there");
    }
    beating.abort();
}
