//! Three chunk servers on loopback against a small fake meta whose chain table the test
//! controls.

use crate::{ChunkConfig, Running};
use bytes::Bytes;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_net::{Handler, Pool};
use stoa_proto::{
    ChunkOp, ChunkRequest, ChunkResponse, MetaOp, MetaResponse, Reply, Request, Response,
};
use stoa_types::{
    Chain, ChainId, ChainTable, ChunkId, ChunkNode, ClusterId, FsError, InodeId, NodeId, SessionId,
    Timestamp, WriteId,
};

const CLUSTER: ClusterId = ClusterId(0x5707);
const TEST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Default)]
struct MetaState {
    next_node: u64,
    table: ChainTable,
    synced: Vec<(NodeId, ChainId, u64)>,
    corrupt: Vec<(NodeId, ChunkId)>,
    full: Vec<NodeId>,
    /// Holds back meta's answer to a full server's report, and any newer table from its
    /// heartbeats: the moment after meta took it out and before it heard.
    hold_full: bool,
    /// Inodes `DeadInodes` calls dead; `None` answers it `Unavailable`.
    dead: Option<Vec<InodeId>>,
}

/// Answers what chunk servers ask meta, from a table the test sets.
#[derive(Default)]
struct FakeMeta {
    state: Mutex<MetaState>,
}

impl FakeMeta {
    fn answer(&self, op: MetaOp) -> Result<MetaResponse, FsError> {
        let mut s = self.state.lock().unwrap();
        match op {
            MetaOp::RegisterChunkServer { node, cluster, addr, .. } => {
                if let Some(c) = cluster.filter(|c| *c != CLUSTER) {
                    return Err(FsError::WrongCluster {
                        expected: CLUSTER.to_string(),
                        got: c.to_string(),
                    });
                }
                let id = node.unwrap_or_else(|| {
                    s.next_node += 1;
                    NodeId(s.next_node)
                });
                s.table.nodes.retain(|n| n.id != id);
                s.table.nodes.push(ChunkNode { id, addr });
                s.table.version += 1;
                Ok(MetaResponse::Registered { node: id, cluster: CLUSTER })
            }
            MetaOp::ChunkHeartbeat { node, table_version, .. } => Ok(MetaResponse::Heartbeat {
                table: (table_version != s.table.version
                    && !(s.hold_full && s.full.contains(&node)))
                .then(|| s.table.clone()),
                replicas: 3,
            }),
            MetaOp::GetChainTable => Ok(MetaResponse::ChainTable(s.table.clone())),
            MetaOp::ChunkSynced { node, chain, chain_version } => {
                s.synced.push((node, chain, chain_version));
                let table_version = s.table.version + 1;
                let c =
                    s.table.chains.iter_mut().find(|c| c.id == chain).ok_or(FsError::NotFound)?;
                if c.version != chain_version {
                    return Err(FsError::StaleChain { got: chain_version, current: c.version });
                }
                c.syncing.retain(|n| *n != node);
                c.members.push(node);
                c.version += 1;
                s.table.version = table_version;
                Ok(MetaResponse::Done)
            }
            MetaOp::ReportCorrupt { node, chunk, .. } => {
                s.corrupt.push((node, chunk));
                Ok(MetaResponse::Done)
            }
            MetaOp::ChunkServerFull { node } => {
                s.full.push(node);
                if s.hold_full {
                    return Err(FsError::Unavailable("meta is busy".into()));
                }
                Ok(MetaResponse::Heartbeat { table: Some(s.table.clone()), replicas: 3 })
            }
            MetaOp::DeadInodes { inos } => match &s.dead {
                Some(dead) => Ok(MetaResponse::DeadInodes(
                    inos.into_iter().filter(|i| dead.contains(i)).collect(),
                )),
                None => Err(FsError::Unavailable("no leader".into())),
            },
            other => Err(FsError::NotSupported)
                .inspect_err(|_| tracing::warn!("fake meta got {other:?}")),
        }
    }

    /// Sets the one chain of the cluster and bumps the versions.
    fn set_chain(&self, members: &[NodeId], syncing: &[NodeId]) -> Chain {
        let mut s = self.state.lock().unwrap();
        let version = s.table.chains.first().map_or(1, |c| c.version + 1);
        let chain =
            Chain { id: ChainId(0), version, members: members.to_vec(), syncing: syncing.to_vec() };
        s.table.chains = vec![chain.clone()];
        s.table.version += 1;
        chain
    }

    fn table(&self) -> ChainTable {
        self.state.lock().unwrap().table.clone()
    }
}

impl Handler for FakeMeta {
    async fn handle(&self, req: Request, _: Bytes, _: SocketAddr) -> (Reply, Bytes) {
        let reply = match req {
            Request::Meta(m) => self.answer(m.op).map(Response::Meta),
            _ => Err(FsError::NotSupported),
        };
        (reply, Bytes::new())
    }
}

struct Cluster {
    meta: Arc<FakeMeta>,
    meta_addr: SocketAddr,
    servers: Vec<Option<Running>>,
    dirs: Vec<tempfile::TempDir>,
    pool: Pool,
}

fn config(dir: &std::path::Path, meta: SocketAddr) -> ChunkConfig {
    ChunkConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        meta: vec![meta],
        zone: "z1".into(),
        scrub_bytes_per_sec: 0,
        reserve_bytes: 0,
        // Tests that sweep call it themselves, at the moment they choose.
        sweep_secs: 0,
    }
}

impl Cluster {
    /// Three servers, all members of the one chain (head first).
    async fn start() -> Cluster {
        Cluster::start_with_reserves([0; 3]).await
    }

    /// Three servers keeping these free bytes on their disks (a reserve larger than the
    /// disk makes a server refuse every write that needs space, as a full disk does).
    async fn start_with_reserves(reserves: [u64; 3]) -> Cluster {
        let listener = stoa_net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let meta_addr = listener.local_addr().unwrap();
        let meta = Arc::new(FakeMeta::default());
        tokio::spawn(stoa_net::serve(listener, meta.clone()));
        let mut cluster =
            Cluster { meta, meta_addr, servers: Vec::new(), dirs: Vec::new(), pool: Pool::new() };
        for reserve_bytes in reserves {
            let dir = tempfile::tempdir().unwrap();
            let cfg = ChunkConfig { reserve_bytes, ..config(dir.path(), meta_addr) };
            cluster.servers.push(Some(Running::start(cfg).await.unwrap()));
            cluster.dirs.push(dir);
        }
        let nodes: Vec<NodeId> = (0..3).map(|i| cluster.node(i)).collect();
        cluster.meta.set_chain(&nodes, &[]);
        cluster.converge().await;
        cluster
    }

    fn server(&self, i: usize) -> &Running {
        self.servers[i].as_ref().expect("server is running")
    }

    fn node(&self, i: usize) -> NodeId {
        self.server(i).server.node
    }

    fn chain(&self) -> Chain {
        self.meta.table().chains[0].clone()
    }

    /// Waits until every running server has meta's table.
    async fn converge(&self) {
        let want = self.meta.table().version;
        eventually("servers have the chain table", || {
            self.servers.iter().flatten().all(|r| r.server.table().version == want)
        })
        .await;
    }

    async fn call(
        &self,
        i: usize,
        chain: &Chain,
        op: ChunkOp,
        payload: &[u8],
    ) -> Result<(ChunkResponse, Bytes), FsError> {
        self.call_until(i, chain, op, payload, 0).await
    }

    async fn call_until(
        &self,
        i: usize,
        chain: &Chain,
        op: ChunkOp,
        payload: &[u8],
        deadline_ms: u64,
    ) -> Result<(ChunkResponse, Bytes), FsError> {
        let (chain, chain_version) = (chain.id, chain.version);
        let req = Request::Chunk(ChunkRequest { chain, chain_version, op, deadline_ms });
        let (resp, payload) = self
            .pool
            .call(
                self.server(i).addr,
                &req,
                Bytes::copy_from_slice(payload),
                Duration::from_secs(10),
            )
            .await?;
        match resp {
            Response::Chunk(resp) => Ok((resp, payload)),
            other => panic!("chunk server answered {other:?}"),
        }
    }

    async fn write(&self, chain: &Chain, chunk: ChunkId, offset: u32, data: &[u8]) -> u64 {
        match self
            .call(
                0,
                chain,
                ChunkOp::Write { chunk, offset, version: None, id: None, durable: false },
                data,
            )
            .await
            .unwrap()
            .0
        {
            ChunkResponse::Written { version } => version,
            other => panic!("write answered {other:?}"),
        }
    }

    async fn read(&self, i: usize, chain: &Chain, chunk: ChunkId) -> Result<Bytes, FsError> {
        self.call(i, chain, ChunkOp::Read { chunk, offset: 0, len: 1 << 20 }, b"")
            .await
            .map(|(_, data)| data)
    }
}

fn chunk(index: u64) -> ChunkId {
    ChunkId { ino: InodeId(77), index }
}

/// The id of a client mutation of session 9.
fn write_id(seq: u64) -> Option<WriteId> {
    Some(WriteId { session: SessionId(9), seq })
}

/// A client's write of chunk 0 at `offset`, as it reaches the head: no version yet.
fn client_write(offset: u32, id: Option<WriteId>) -> ChunkOp {
    ChunkOp::Write { chunk: chunk(0), offset, version: None, id, durable: false }
}

async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs a test body with a deadline, so that a hang fails instead of stalling the suite.
async fn bounded(body: impl Future<Output = ()>) {
    tokio::time::timeout(TEST_TIMEOUT, body).await.expect("test timed out");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_to_the_head_is_readable_from_every_replica() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(c.write(&chain, chunk(0), 0, &data).await, 1);
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), data, "replica {i}");
            // A chunk nobody wrote reads as a hole.
            assert!(c.read(i, &chain, chunk(1)).await.unwrap().is_empty());
        }
        // Only the head takes client writes.
        let err = c.call(1, &chain, client_write(0, None), b"x").await;
        assert!(matches!(err, Err(FsError::Unavailable(ref m)) if m.contains("head")), "{err:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_is_idempotent_and_truncate_replicates() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        c.write(&chain, chunk(0), 100, b"hello").await;
        assert_eq!(c.write(&chain, chunk(0), 100, b"hello").await, 2);
        let mut want = vec![0u8; 105];
        want[100..].copy_from_slice(b"hello");
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), want);
            assert_eq!(c.server(i).server.engine.version(chunk(0)).unwrap(), 2);
        }
        // A forwarded write that arrives twice is skipped the second time.
        let again = ChunkOp::Write {
            chunk: chunk(0),
            offset: 0,
            version: Some(2),
            id: None,
            durable: false,
        };
        c.call(2, &chain, again, b"zzzzz").await.unwrap();
        assert_eq!(c.read(2, &chain, chunk(0)).await.unwrap(), want);
        let cut = ChunkOp::Truncate { chunk: chunk(0), len: 102, version: None, id: None };
        assert_eq!(
            c.call(0, &chain, cut, b"").await.unwrap().0,
            ChunkResponse::Written { version: 3 }
        );
        let remove = ChunkOp::Truncate { chunk: chunk(0), len: 0, version: None, id: None };
        c.call(0, &chain, remove, b"").await.unwrap();
        for i in 0..3 {
            assert!(c.read(i, &chain, chunk(0)).await.unwrap().is_empty());
            // Removed to a tombstone that keeps the version (see Engine::truncate).
            assert_eq!(c.server(i).server.engine.version(chunk(0)).unwrap(), 4);
        }
    })
    .await;
}

/// Found by the fault tests (disk-full): with a chain member out of space, the head
/// applied a write the full member refused, and answered ENOSPC; reads then saw the
/// new value at the head and the old one elsewhere, back and forth. Now the replicas
/// that may differ serve no reads of the chunk, the full server asks meta to take it
/// out, the writer is told to retry, and the retry on the shorter chain settles it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_member_leaves_no_replica_serving_a_write_it_refused() {
    bounded(async {
        let c = Cluster::start_with_reserves([0, u64::MAX / 4, 0]).await;
        // The chunk exists on the head and the tail, at version 1, before the full
        // server joins between them.
        let without = c.meta.set_chain(&[c.node(0), c.node(2)], &[]);
        c.converge().await;
        c.write(&without, chunk(0), 0, b"old").await;
        let chain = c.meta.set_chain(&[c.node(0), c.node(1), c.node(2)], &[]);
        c.converge().await;
        let write = client_write(0, None);
        let err = c.call(0, &chain, write.clone(), b"new").await.unwrap_err();
        assert!(
            matches!(err, FsError::Unavailable(ref m) if m.contains("out of space")),
            "{err:?}"
        );
        eventually("the full server reports to meta", || {
            c.meta.state.lock().unwrap().full.contains(&c.node(1))
        })
        .await;
        // The head has the refused write, the full server nothing: neither serves it.
        for i in [0, 1] {
            let read = c.read(i, &chain, chunk(0)).await;
            assert!(
                matches!(read, Err(FsError::Unavailable(ref m)) if m.contains("settled")),
                "{read:?}"
            );
        }
        assert_eq!(c.read(2, &chain, chunk(0)).await.unwrap(), &b"old"[..]);
        // Meta takes the full server out; the writer's retry settles the chain.
        let shorter = c.meta.set_chain(&[c.node(0), c.node(2)], &[]);
        c.converge().await;
        c.call(0, &shorter, write, b"new").await.unwrap();
        for i in [0, 2] {
            assert_eq!(c.read(i, &shorter, chunk(0)).await.unwrap(), &b"new"[..], "replica {i}");
        }
    })
    .await;
}

/// A full head refuses before anything is applied, and asks meta to take it out of its
/// chains like a full successor, so that the writer goes on at the next head instead
/// of failing with ENOSPC while other servers have room (`stoa-fault --long --seed 42`,
/// disk-full: over a hundred register writes failed so, with three servers of four
/// nearly empty).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_head_asks_to_leave_its_chains_and_applies_nothing() {
    bounded(async {
        let c = Cluster::start_with_reserves([u64::MAX / 4, 0, 0]).await;
        let chain = c.meta.set_chain(&[c.node(0), c.node(1), c.node(2)], &[]);
        c.converge().await;
        let write = refused_by_full_head(&c, &chain).await;
        for i in [1, 2] {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), &b""[..], "replica {i}");
        }
        // Meta takes it out; the writer's retry goes on at the new head.
        let shorter = c.meta.set_chain(&[c.node(1), c.node(2)], &[]);
        c.converge().await;
        c.call(1, &shorter, write, b"new").await.unwrap();
        for i in [1, 2] {
            assert_eq!(c.read(i, &shorter, chunk(0)).await.unwrap(), &b"new"[..], "replica {i}");
        }
    })
    .await;
}

/// Writes `new` to chunk 0 at server 0, a full head: refused with `NoSpace`, and
/// reported to meta. Returns the write, for its retry on the chain without the head.
async fn refused_by_full_head(c: &Cluster, chain: &Chain) -> ChunkOp {
    let write = client_write(0, write_id(1));
    let err = c.call(0, chain, write.clone(), b"new").await.unwrap_err();
    assert_eq!(err, FsError::NoSpace);
    eventually("the full head reports to meta", || {
        c.meta.state.lock().unwrap().full.contains(&c.node(0))
    })
    .await;
    write
}

/// Meta takes a full server out of its chains as soon as it reports, so writes may go on
/// without it while it still has the old table, and so may a reader: until meta's answer
/// brings the new table, the full server must serve no read, or the reader gets a copy
/// older than a write that finished (`stoa-fault --seed 784 --scenario disk-full`: a
/// compare-and-set under a lock read the value before another mount's fsynced write).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_server_serves_no_read_until_meta_answered_its_report() {
    bounded(async {
        let c = Cluster::start_with_reserves([u64::MAX / 4, 0, 0]).await;
        let chain = c.meta.set_chain(&[c.node(0), c.node(1), c.node(2)], &[]);
        c.converge().await;
        c.meta.state.lock().unwrap().hold_full = true;
        let write = refused_by_full_head(&c, &chain).await;
        // Meta took it out; the write goes on without it.
        let shorter = c.meta.set_chain(&[c.node(1), c.node(2)], &[]);
        c.call(1, &shorter, write, b"new").await.unwrap();
        let stale = c.read(0, &chain, chunk(0)).await;
        assert!(matches!(stale, Err(FsError::Unavailable(_))), "read before the answer: {stale:?}");
        // The answer comes with the new table: the old one is refused from then on.
        c.meta.state.lock().unwrap().hold_full = false;
        eventually("the full server hears from meta", || {
            c.server(0).server.leaving.load(Ordering::Acquire) == 0
        })
        .await;
        let old = c.read(0, &chain, chunk(0)).await;
        assert!(matches!(old, Err(FsError::StaleChain { .. })), "read after the answer: {old:?}");
        assert_eq!(c.read(1, &shorter, chunk(0)).await.unwrap(), &b"new"[..]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_ranges_of_a_chunk_replicate_as_one_version() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        c.write(&chain, chunk(0), 0, &[1u8; 12_288]).await;
        let ranges = vec![(0, 2), (8_192, 4_096), (20_000, 3)];
        let op = ChunkOp::WriteRanges {
            chunk: chunk(0),
            ranges,
            version: None,
            id: None,
            durable: false,
        };
        let payload: Vec<u8> = [&b"ab"[..], &[9u8; 4_096], b"xyz"].concat();
        let (resp, _) = c.call(0, &chain, op, &payload).await.unwrap();
        assert_eq!(resp, ChunkResponse::Written { version: 2 });
        let mut want = vec![1u8; 12_288];
        want[..2].copy_from_slice(b"ab");
        want[8_192..].fill(9);
        want.resize(20_003, 0);
        want[20_000..].copy_from_slice(b"xyz");
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), want, "replica {i}");
            assert_eq!(c.server(i).server.engine.version(chunk(0)).unwrap(), 2);
        }
        // Ranges that do not add up to the payload are refused before anything changes.
        let bad = ChunkOp::WriteRanges {
            chunk: chunk(0),
            ranges: vec![(0, 5)],
            version: None,
            id: None,
            durable: false,
        };
        let err = c.call(0, &chain, bad, b"abc").await;
        assert!(matches!(err, Err(FsError::Invalid(_))), "{err:?}");
        assert_eq!(c.server(0).server.engine.version(chunk(0)).unwrap(), 2);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_write_past_its_deadline_is_refused_and_changes_nothing() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let now = Timestamp::now().as_millis();
        let write = || client_write(0, None);
        c.call_until(0, &chain, write(), b"fresh", now + 60_000).await.unwrap();
        let late = c.call_until(0, &chain, write(), b"stale", now - 1).await;
        assert_eq!(late.unwrap_err(), FsError::SessionExpired);
        let cut = ChunkOp::Truncate { chunk: chunk(0), len: 1, version: None, id: None };
        let late = c.call_until(0, &chain, cut, b"", now - 1).await;
        assert_eq!(late.unwrap_err(), FsError::SessionExpired);
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), &b"fresh"[..], "replica {i}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_chain_version_is_refused() {
    bounded(async {
        let c = Cluster::start().await;
        let mut old = c.chain();
        old.version -= 1;
        let err = c.read(1, &old, chunk(0)).await.unwrap_err();
        assert_eq!(err, FsError::StaleChain { got: old.version, current: old.version + 1 });
        // A version newer than anyone's makes the server ask meta, then refuse.
        let mut future = c.chain();
        future.version += 5;
        let err = c.read(1, &future, chunk(0)).await.unwrap_err();
        assert!(matches!(err, FsError::StaleChain { .. }), "{err:?}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_removed_from_a_chain_refuses_reads_and_writes() {
    bounded(async {
        let c = Cluster::start().await;
        let before = c.chain();
        c.write(&before, chunk(0), 0, b"v1").await;
        let after = c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        c.converge().await;
        // Old version: stale. New version: not a member any more.
        assert!(matches!(c.read(2, &before, chunk(0)).await, Err(FsError::StaleChain { .. })));
        let err = c.read(2, &after, chunk(0)).await.unwrap_err();
        assert!(
            matches!(err, FsError::Unavailable(ref m) if m.contains("active member")),
            "{err:?}"
        );
        let forwarded = ChunkOp::Write {
            chunk: chunk(0),
            offset: 0,
            version: Some(2),
            id: None,
            durable: false,
        };
        assert!(c.call(2, &after, forwarded, b"x").await.is_err());
        // The shorter chain still takes writes, and the removed server does not see them.
        c.write(&after, chunk(0), 0, b"v2").await;
        assert_eq!(c.read(1, &after, chunk(0)).await.unwrap(), &b"v2"[..]);
        assert_eq!(c.server(2).server.engine.version(chunk(0)).unwrap(), 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_server_resyncs_only_differing_chunks_and_reports_synced() {
    bounded(async {
        let mut c = Cluster::start().await;
        let chain = c.chain();
        for index in 0..4 {
            c.write(&chain, chunk(index), 0, format!("first {index}").as_bytes()).await;
        }
        // Server 2 goes away; meta takes it out; the chain moves on without it.
        let gone = c.node(2);
        c.servers[2].take().unwrap().stop().await;
        let short = c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        c.converge().await;
        c.write(&short, chunk(0), 0, b"second 0").await;
        c.write(&short, chunk(9), 0, b"new 9").await;
        let remove = ChunkOp::Truncate { chunk: chunk(3), len: 0, version: None, id: None };
        c.call(0, &short, remove, b"").await.unwrap();
        // It returns (same data directory, so the same node id) and meta adds it as syncing.
        let back = Running::start(config(c.dirs[2].path(), c.meta_addr)).await.unwrap();
        assert_eq!(back.server.node, gone);
        c.servers[2] = Some(back);
        let syncing = c.meta.set_chain(&[c.node(0), c.node(1)], &[gone]);
        eventually("the server reports it is synced", || {
            c.meta.state.lock().unwrap().synced.contains(&(gone, ChainId(0), syncing.version))
        })
        .await;
        let stats = &c.server(2).server.stats;
        // Chunk 3 was cut to nothing: its tombstone (a newer version) is copied too.
        assert_eq!(stats.chunks_copied.load(Ordering::Relaxed), 3, "chunks 0, 3 and 9 differ");
        assert_eq!(stats.chunks_dropped.load(Ordering::Relaxed), 0);
        c.converge().await;
        let full = c.chain();
        assert_eq!(full.members, vec![c.node(0), c.node(1), gone]);
        for (index, want) in [(0, &b"second 0"[..]), (1, b"first 1"), (3, b""), (9, b"new 9")] {
            assert_eq!(c.read(2, &full, chunk(index)).await.unwrap(), want, "chunk {index}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_server_with_other_bytes_at_the_chains_version_takes_the_chains() {
    bounded(async {
        let c = Cluster::start().await;
        c.write(&c.chain(), chunk(5), 0, b"v1 everywhere").await;
        // Server 2 leaves the chain holding a v2 nobody acknowledged (a head that applied
        // a write and died before passing it on); the chain gives v2 to another write.
        let gone = c.node(2);
        let short = c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        c.converge().await;
        c.server(2).server.engine.write(chunk(5), 0, b"never acked!!", Some(2), None).unwrap();
        assert_eq!(c.write(&short, chunk(5), 0, b"acknowledged!").await, 2);
        let syncing = c.meta.set_chain(&[c.node(0), c.node(1)], &[gone]);
        eventually("the server reports it is synced", || {
            c.meta.state.lock().unwrap().synced.contains(&(gone, ChainId(0), syncing.version))
        })
        .await;
        let chains = c.server(0).server.engine.fetch(chunk(5)).unwrap();
        assert_eq!(c.server(2).server.engine.fetch(chunk(5)).unwrap(), chains);
        assert_eq!(&chains.data[..], b"acknowledged!");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_an_applied_mutation_is_not_applied_again_over_a_later_write() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let written = |version| ChunkResponse::Written { version };
        let first = || client_write(0, write_id(1));
        assert_eq!(c.call(0, &chain, first(), b"first").await.unwrap().0, written(1));
        // Another client writes the same bytes; then the first client, whose answer was
        // lost, sends its write again: it is answered with its first version, not applied.
        let other = WriteId { session: SessionId(10), seq: 1 };
        let later = client_write(0, Some(other));
        assert_eq!(c.call(0, &chain, later, b"LATER").await.unwrap().0, written(2));
        assert_eq!(c.call(0, &chain, first(), b"first").await.unwrap().0, written(1));
        let cut = || ChunkOp::Truncate { chunk: chunk(0), len: 2, version: None, id: write_id(2) };
        assert_eq!(c.call(0, &chain, cut(), b"").await.unwrap().0, written(3));
        let grow = client_write(2, write_id(3));
        assert_eq!(c.call(0, &chain, grow, b"TER").await.unwrap().0, written(4));
        assert_eq!(c.call(0, &chain, cut(), b"").await.unwrap().0, written(3));
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), &b"LATER"[..], "replica {i}");
            assert_eq!(c.server(i).server.engine.version(chunk(0)).unwrap(), 4, "replica {i}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_behind_a_later_write_brings_the_replicas_to_the_later_write() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        // Two writes reached the head only (its successor was paused): the first
        // client's, then another's. The first client retries before the other does.
        let head = c.server(0).server.engine.clone();
        head.write(chunk(0), 0, b"first", None, write_id(1)).unwrap();
        let other = Some(WriteId { session: SessionId(10), seq: 1 });
        head.write(chunk(0), 0, b"LATER", None, other).unwrap();
        let retry = client_write(0, write_id(1));
        let answer = c.call(0, &chain, retry, b"first").await.unwrap().0;
        assert_eq!(answer, ChunkResponse::Written { version: 1 });
        // No replica may take the retried write alone: it would serve "first", which
        // the later write replaced.
        for i in 0..3 {
            assert_eq!(c.read(i, &chain, chunk(0)).await.unwrap(), &b"LATER"[..], "replica {i}");
            assert_eq!(c.server(i).server.engine.version(chunk(0)).unwrap(), 2, "replica {i}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_to_a_new_head_reaches_the_replicas_the_first_attempt_missed() {
    bounded(async {
        let c = Cluster::start().await;
        // The first attempt reached the head and the middle server; the head died before
        // it answered, so the tail never had it. The client retries at the new head.
        let engines: Vec<_> = (0..2).map(|i| c.server(i).server.engine.clone()).collect();
        engines[0].write(chunk(0), 0, b"first", None, write_id(1)).unwrap();
        engines[1].write(chunk(0), 0, b"first", Some(1), write_id(1)).unwrap();
        let short = c.meta.set_chain(&[c.node(1), c.node(2)], &[]);
        c.converge().await;
        let retry = client_write(0, write_id(1));
        let answer = c.call(1, &short, retry, b"first").await.unwrap().0;
        assert_eq!(answer, ChunkResponse::Written { version: 1 });
        let tail = c.server(2).server.engine.fetch(chunk(0)).unwrap();
        assert_eq!((tail.version, &tail.data[..]), (1, &b"first"[..]));
        // The tail remembers the write too, so it would know the retry as head.
        assert_eq!(tail.writes, engines[1].fetch(chunk(0)).unwrap().writes);
        let again = client_write(0, write_id(2));
        let answer = c.call(1, &short, again, b"again").await.unwrap().0;
        assert_eq!(answer, ChunkResponse::Written { version: 2 });
        assert_eq!(c.read(2, &short, chunk(0)).await.unwrap(), &b"again"[..]);
    })
    .await;
}

/// A server that takes connections and requests and never answers, as a stopped process
/// (SIGSTOP) or one behind a cut link does; the returned receiver fires when the first
/// request bytes arrived.
async fn stopped_server() -> (SocketAddr, tokio::sync::oneshot::Receiver<()>) {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (arrived, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut arrived = Some(arrived);
        while stream.read(&mut buf).await.is_ok_and(|n| n > 0) {
            if let Some(tx) = arrived.take() {
                let _ = tx.send(());
            }
        }
    });
    (addr, rx)
}

impl Cluster {
    /// Sets the chain to servers 0 and 1 and then a [`stopped_server`] as its tail; the
    /// receiver fires when a request reached the tail.
    async fn chain_with_stopped_tail(&self) -> (Chain, tokio::sync::oneshot::Receiver<()>) {
        let (addr, arrived) = stopped_server().await;
        let stopped = NodeId(99);
        self.meta.state.lock().unwrap().table.nodes.push(ChunkNode { id: stopped, addr });
        let chain = self.meta.set_chain(&[self.node(0), self.node(1), stopped], &[]);
        self.converge().await;
        (chain, arrived)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_stuck_on_a_stopped_successor_ends_when_the_chain_moves_on() {
    bounded(async {
        let c = Cluster::start().await;
        // The chain's tail is stopped: the middle server's forward gets no answer while
        // it, and the head, hold the chunk's ordering lock.
        let (chain, arrived) = c.chain_with_stopped_tail().await;
        let op = client_write(0, write_id(1));
        let stuck = c.call(0, &chain, op, b"first");
        let moved = async {
            arrived.await.unwrap();
            // Meta takes the stopped server out; the servers learn it by heartbeat.
            c.meta.set_chain(&[c.node(0), c.node(1)], &[])
        };
        let (stuck, short) = tokio::join!(stuck, moved);
        // The write ends as soon as the chain moved, with an answer that makes the
        // writer retry on the new chain, not after the peer call's timeout.
        let err = stuck.unwrap_err();
        assert!(matches!(err, FsError::StaleChain { .. }), "{err:?}");
        // The retry takes the ordering lock at once and reaches both replicas.
        c.converge().await;
        let retry = client_write(0, write_id(1));
        let answer = c.call(0, &short, retry, b"first").await.unwrap().0;
        assert_eq!(answer, ChunkResponse::Written { version: 1 });
        assert_eq!(c.read(1, &short, chunk(0)).await.unwrap(), &b"first"[..]);
    })
    .await;
}

/// Found by `stoa-fault` (two mounts writing one register, no fault injected): reads
/// returned the value of a write in flight, then the older one, then the new one again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_not_yet_at_the_tail_is_read_from_no_replica() {
    bounded(async {
        let c = Cluster::start().await;
        let short = c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        c.converge().await;
        c.write(&short, chunk(0), 0, b"old").await;
        // The tail stops answering: the next write is applied at the head and the middle
        // and waits there for the tail.
        let (chain, arrived) = c.chain_with_stopped_tail().await;
        let op = client_write(0, write_id(1));
        let stuck = c.call(0, &chain, op, b"new");
        let reads = async {
            arrived.await.unwrap();
            for i in [0, 1] {
                let read = c.read(i, &chain, chunk(0)).await;
                assert!(
                    matches!(read, Err(FsError::Unavailable(ref m)) if m.contains("tail")),
                    "server {i} answered {read:?} while the tail lacks the write"
                );
            }
            c.meta.set_chain(&[c.node(0), c.node(1)], &[])
        };
        let (stuck, short) = tokio::join!(stuck, reads);
        assert!(stuck.is_err());
        // The writer's retry on the new chain settles it; then every replica answers.
        c.converge().await;
        let retry = client_write(0, write_id(1));
        c.call(0, &short, retry, b"new").await.unwrap();
        for i in [0, 1] {
            assert_eq!(c.read(i, &short, chunk(0)).await.unwrap(), &b"new"[..]);
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_during_a_resync_reach_the_syncing_server() {
    bounded(async {
        let c = Cluster::start().await;
        let short = c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        c.converge().await;
        c.write(&short, chunk(0), 0, b"before").await;
        c.write(&short, chunk(0), 0, b"BEFORE").await;
        // Server 2 is syncing. Whether its resync copies the chunk first or the write
        // finds a gap there (and the tail installs the chunk), it ends with every write.
        c.meta.set_chain(&[c.node(0), c.node(1)], &[c.node(2)]);
        loop {
            let chain = c.chain();
            let op = client_write(6, write_id(1));
            match c.call(0, &chain, op, b"+after").await {
                Ok(_) => break,
                // The resync may finish first and move the chain on.
                Err(FsError::StaleChain { .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => panic!("write failed: {e}"),
            }
        }
        // A write retried after StaleChain is applied once, alike on every replica.
        let head = c.server(0).server.engine.fetch(chunk(0)).unwrap();
        assert_eq!(&head.data[..], b"BEFORE+after");
        assert_eq!(head.version, 3);
        assert_eq!(c.server(2).server.engine.fetch(chunk(0)).unwrap(), head);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_block_is_reported_and_other_replicas_serve_it() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let data = vec![0xabu8; 10_000];
        c.write(&chain, chunk(5), 0, &data).await;
        let path = c.dirs[1].path().join("chunks");
        let file = find_file(&path, chunk(5));
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[crate::engine::DATA_AT as usize + 4097] ^= 0xff;
        std::fs::write(&file, bytes).unwrap();
        let err = c.read(1, &chain, chunk(5)).await.unwrap_err();
        assert!(matches!(err, FsError::Checksum(ref m) if m.contains("block 1")), "{err:?}");
        eventually("meta hears of the corrupt replica", || {
            c.meta.state.lock().unwrap().corrupt.contains(&(c.node(1), chunk(5)))
        })
        .await;
        assert_eq!(c.read(0, &chain, chunk(5)).await.unwrap(), data);
        assert_eq!(c.read(2, &chain, chunk(5)).await.unwrap(), data);
        // The next write finds the damage at the middle server, which gets a whole copy.
        c.write(&chain, chunk(5), 4100, b"fix").await;
        assert_eq!(
            c.read(1, &chain, chunk(5)).await.unwrap(),
            c.read(0, &chain, chunk(5)).await.unwrap()
        );
    })
    .await;
}

/// The file of `chunk` in the store under `dir`.
fn find_file(dir: &std::path::Path, chunk: ChunkId) -> std::path::PathBuf {
    let name = format!("{chunk}.{}", crate::engine::CHUNK_EXT);
    for fan in std::fs::read_dir(dir).unwrap() {
        let candidate = fan.unwrap().path().join(&name);
        if candidate.exists() {
            return candidate;
        }
    }
    panic!("no file {name} under {}", dir.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_reaches_every_replica() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        c.write(&chain, chunk(0), 0, b"durable").await;
        let before: Vec<u64> =
            (0..3).map(|i| c.server(i).server.stats.syncs.load(Ordering::Relaxed)).collect();
        let (resp, _) = c
            .call(0, &chain, ChunkOp::Sync { chunks: vec![chunk(0), chunk(1)] }, b"")
            .await
            .unwrap();
        assert_eq!(resp, ChunkResponse::Done);
        for (i, b) in before.iter().enumerate() {
            assert_eq!(c.server(i).server.stats.syncs.load(Ordering::Relaxed), b + 1, "server {i}");
        }
    })
    .await;
}

/// A durable write is a `Sync` of its chunk as well, on every server of the chain; so
/// is its retry, which every server recognises and passes on without applying it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_write_is_flushed_on_every_replica_and_so_is_its_retry() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let syncs = || -> Vec<u64> {
            (0..3).map(|i| c.server(i).server.stats.syncs.load(Ordering::Relaxed)).collect()
        };
        c.write(&chain, chunk(0), 0, b"buffered").await;
        assert_eq!(syncs(), [0, 0, 0], "a write that is not durable was flushed");
        let durable = ChunkOp::Write {
            chunk: chunk(0),
            offset: 0,
            version: None,
            id: write_id(1),
            durable: true,
        };
        for (attempt, expected) in [(1, 1), (2, 2)] {
            let (resp, _) = c.call(0, &chain, durable.clone(), b"durable").await.unwrap();
            assert_eq!(resp, ChunkResponse::Written { version: 2 }, "attempt {attempt}");
            assert_eq!(syncs(), [expected; 3], "attempt {attempt}");
        }
        for i in 0..3 {
            let (_, data) = c
                .call(i, &chain, ChunkOp::Read { chunk: chunk(0), offset: 0, len: 16 }, b"")
                .await
                .unwrap();
            // The 7 bytes over the 8 written first.
            assert_eq!(&data[..], b"durabled", "server {i}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_errors_are_clear() {
    bounded(async {
        let c = Cluster::start().await;
        // A second server on the same data directory.
        let err =
            Running::start(config(c.dirs[0].path(), c.meta_addr)).await.err().unwrap().to_string();
        assert!(err.contains("in use by another process"), "{err}");
        // A port in use.
        let dir = tempfile::tempdir().unwrap();
        let cfg = ChunkConfig { listen: c.server(0).addr, ..config(dir.path(), c.meta_addr) };
        let err = Running::start(cfg).await.err().unwrap().to_string();
        assert!(err.contains(&c.server(0).addr.to_string()) && err.contains("in use"), "{err}");
        // A directory of another cluster.
        let other = tempfile::tempdir().unwrap();
        let identity = crate::datadir::Identity { node: NodeId(40), cluster: ClusterId(1) };
        identity.store(other.path()).unwrap();
        let err = crate::run(config(other.path(), c.meta_addr), std::future::pending())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("belongs to another cluster"), "{err}");
        let bad = ChunkConfig { meta: vec![], ..config(other.path(), c.meta_addr) };
        assert!(crate::run(bad, std::future::pending())
            .await
            .unwrap_err()
            .to_string()
            .contains("meta"));
        let slow = crate::SWEEP_SECS_MAX + 1;
        let bad = ChunkConfig { sweep_secs: slow, ..config(other.path(), c.meta_addr) };
        let err = crate::run(bad, std::future::pending()).await.unwrap_err().to_string();
        assert!(err.contains("sweep_secs"), "{err}");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unclean_restart_repairs_chunks_whose_data_disagrees_with_their_header() {
    bounded(async {
        let mut c = Cluster::start().await;
        let chain = c.chain();
        c.write(&chain, chunk(1), 0, &[5u8; 6000]).await;
        c.write(&chain, chunk(2), 0, b"intact").await;
        let gone = c.node(2);
        c.servers[2].take().unwrap().stop().await;
        c.meta.set_chain(&[c.node(0), c.node(1)], &[]);
        // As if the process died between writing data and writing the new header.
        let file = find_file(&c.dirs[2].path().join("chunks"), chunk(1));
        let file = std::fs::OpenOptions::new().write(true).open(file).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&file, &[6u8; 6000], crate::engine::DATA_AT)
            .unwrap();
        std::fs::write(c.dirs[2].path().join("DIRTY"), b"").unwrap();
        c.servers[2] = Some(Running::start(config(c.dirs[2].path(), c.meta_addr)).await.unwrap());
        let syncing = c.meta.set_chain(&[c.node(0), c.node(1)], &[gone]);
        eventually("the server reports it is synced", || {
            c.meta.state.lock().unwrap().synced.contains(&(gone, ChainId(0), syncing.version))
        })
        .await;
        let stats = &c.server(2).server.stats;
        assert_eq!(stats.chunks_copied.load(Ordering::Relaxed), 1, "only the torn chunk");
        assert_eq!(c.server(2).server.engine.fetch(chunk(1)).unwrap().data, vec![5u8; 6000]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_replica_is_repaired_from_a_chain_member() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        let version = c.write(&chain, chunk(3), 0, &data).await;
        let damaged = &c.server(1).server;
        let (path, data_at) = damaged.engine.data_path(chunk(3));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[data_at as usize + 9000] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        // The damage never reaches a reader: the read is refused and reported.
        let read = c.read(1, &chain, chunk(3)).await;
        assert!(matches!(read, Err(FsError::Checksum(_))), "{read:?}");
        assert_eq!(damaged.repair(chunk(3)).await.unwrap(), version);
        assert_eq!(c.read(1, &chain, chunk(3)).await.unwrap(), data);
        assert!(damaged.stats.corrupt_reports.load(Ordering::Relaxed) >= 1);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_removes_every_chunk_of_dead_inodes_and_only_those() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let live = chunk(0);
        let dead = [ChunkId { ino: InodeId(78), index: 0 }, ChunkId { ino: InodeId(78), index: 5 }];
        for id in [live, dead[0], dead[1]] {
            c.write(&chain, id, 0, b"bytes").await;
        }
        // A tombstone, as the garbage collector leaves it.
        let remove = ChunkOp::Truncate { chunk: dead[1], len: 0, version: None, id: None };
        c.call(0, &chain, remove, b"").await.unwrap();
        let ids = |i: usize| c.server(i).server.engine.chunk_ids().unwrap();
        assert_eq!(ids(0), vec![live, dead[0], dead[1]]);

        // Meta unreachable: nothing is removed, and the sweep says why it stopped.
        let mut swept = super::sweep::Swept::default();
        let err = c.server(0).server.sweep_dead(&mut swept).await.unwrap_err();
        assert!(err.is_retryable(), "{err:?}");
        assert_eq!((swept.inodes, swept.removed_chunks), (2, 0));
        assert_eq!(ids(0).len(), 3);

        c.meta.state.lock().unwrap().dead = Some(vec![InodeId(78), InodeId(99)]);
        let mut swept = super::sweep::Swept::default();
        c.server(0).server.sweep_dead(&mut swept).await.unwrap();
        let want =
            super::sweep::Swept { inodes: 2, dead_inodes: 1, removed_chunks: 2, failed_chunks: 0 };
        assert_eq!(swept, want);
        assert_eq!(ids(0), vec![live]);
        assert_eq!(c.server(0).server.stats.chunks_swept.load(Ordering::Relaxed), 2);
        assert_eq!(c.read(0, &chain, live).await.unwrap(), &b"bytes"[..]);
        // Each replica sweeps on its own.
        assert_eq!(ids(1), vec![live, dead[0], dead[1]]);
    })
    .await;
}

/// A cut of a file far larger than its data goes by the chunks the servers hold, not by
/// every index its size spans (a `truncate -s 0` of a 1 PiB sparse file made 268 million
/// calls): `ChunksOf` names every chunk of the file a server holds from an index on,
/// tombstones too, in pages; `chunks_to_cut` asks every server, keeps nothing outside
/// the range cut, and fails when no member of a chain answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_of_a_huge_sparse_file_lists_the_chunks_held() {
    bounded(async {
        let c = Cluster::start().await;
        let chain = c.chain();
        let far = 1u64 << 40;
        for index in [0, 3, 70_000, far] {
            c.write(&chain, chunk(index), 0, b"x").await;
        }
        c.write(&chain, ChunkId { ino: InodeId(78), index: 5 }, 0, b"other file").await;
        let tombstone = ChunkOp::Truncate { chunk: chunk(3), len: 0, version: None, id: None };
        c.call(0, &chain, tombstone, b"").await.unwrap();

        let op = |from, limit| ChunkOp::ChunksOf { ino: InodeId(77), from, limit };
        for i in 0..3 {
            let (answer, _) = c.call(i, &chain, op(1, 2), b"").await.unwrap();
            assert_eq!(answer, ChunkResponse::Indexes(vec![3, 70_000]), "server {i}");
        }
        let (answer, _) = c.call(2, &chain, op(70_001, 100), b"").await.unwrap();
        assert_eq!(answer, ChunkResponse::Indexes(vec![far]));

        let table = c.meta.table();
        let cut = |table: ChainTable, from, to| {
            let pool = c.pool.clone();
            async move {
                let timeout = Duration::from_secs(10);
                stoa_net::chunks_to_cut(&pool, &table, InodeId(77), from, to, timeout).await
            }
        };
        assert_eq!(cut(table.clone(), 1, far + 1).await.unwrap(), vec![3, 70_000, far]);
        assert_eq!(cut(table.clone(), 4, 5).await.unwrap(), vec![4], "a few go by index");

        // Two members that cannot be reached: the third answers for the chain.
        let gone = stoa_net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let gone_addr = gone.local_addr().unwrap();
        drop(gone);
        let mut some_gone = table.clone();
        for node in &mut some_gone.nodes[..2] {
            node.addr = gone_addr;
        }
        assert_eq!(cut(some_gone.clone(), 1, far + 1).await.unwrap(), vec![3, 70_000, far]);
        some_gone.nodes[2].addr = gone_addr;
        let err = cut(some_gone, 1, far + 1).await.unwrap_err();
        assert!(matches!(err, FsError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("no member of chain 0"), "{err}");
    })
    .await;
}
