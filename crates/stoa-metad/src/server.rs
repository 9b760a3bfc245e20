//! Starting and stopping one replica: data directory, store, listener, Raft, service and
//! the leader's tasks, in that order, and the reverse on the way down.

use crate::datadir::ClusterIdentity;
use crate::leader::follow_leadership;
use crate::liveness::Liveness;
use crate::raft::{MetaRaft, Tuning};
use crate::service::{Node, Service};
use crate::{MetaConfig, MetadError};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;
use stoa_datadir::{DirLock, SERVER_LOCK};
use stoa_net::Pool;
use stoa_types::BLOCK_SIZE_BYTES;
use tokio::task::JoinHandle;

/// How long shutdown waits for requests in flight to let go of the store.
const CLOSE_WAIT: Duration = Duration::from_secs(10);

/// Checks a config for mistakes an operator can make.
pub(crate) fn validate(cfg: &MetaConfig) -> Result<(), MetadError> {
    let bad = |m: String| Err(MetadError::Config(m));
    if !(1..=99).contains(&cfg.id.0) {
        return bad(format!("id must be 1..=99, got {}", cfg.id));
    }
    if !cfg.peers.iter().any(|(id, _)| *id == cfg.id) {
        return bad(format!("peers must include this replica (id {})", cfg.id));
    }
    let ids: BTreeSet<_> = cfg.peers.iter().map(|(id, _)| *id).collect();
    if ids.len() != cfg.peers.len() {
        return bad("peers lists an id twice".into());
    }
    if let Some((id, _)) = cfg.peers.iter().find(|(id, _)| !(1..=99).contains(&id.0)) {
        return bad(format!("peer ids must be 1..=99, got {id}"));
    }
    if cfg.replicas == 0 {
        return bad("replicas must be at least 1".into());
    }
    if cfg.chunk_size_bytes < BLOCK_SIZE_BYTES || cfg.chunk_size_bytes % BLOCK_SIZE_BYTES != 0 {
        return bad(format!(
            "chunk_size_bytes must be a positive multiple of {BLOCK_SIZE_BYTES}, got {}",
            cfg.chunk_size_bytes
        ));
    }
    Ok(())
}

/// One running replica.
pub(crate) struct Server {
    pub node: Arc<Node>,
    pub addr: SocketAddr,
    service: Arc<Service>,
    serving: JoinHandle<()>,
    leading: JoinHandle<()>,
    _lock: DirLock,
}

impl Server {
    pub async fn start(cfg: MetaConfig, tuning: Tuning) -> Result<Server, MetadError> {
        validate(&cfg)?;
        let dir = cfg.data_dir.clone();
        let (lock, cluster) = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || -> Result<_, MetadError> {
                std::fs::create_dir_all(&dir)
                    .map_err(|source| MetadError::DataDir { path: dir.clone(), source })?;
                let lock = DirLock::acquire(&dir, SERVER_LOCK)?;
                Ok((lock, ClusterIdentity::load(&dir)?))
            }
        })
        .await
        .map_err(|e| MetadError::Raft(format!("prepare data directory task: {e}")))??;
        let cluster = Arc::new(cluster);
        // Bind before Raft starts, so that a port in use fails here, clearly, instead of
        // as a replica that never answers.
        let listener = stoa_net::bind(cfg.listen)
            .await
            .map_err(|source| MetadError::Bind { addr: cfg.listen, source })?;
        let addr = listener.local_addr().map_err(|e| MetadError::Bind {
            addr: cfg.listen,
            source: stoa_net::NetError::Bind { addr: cfg.listen, source: e },
        })?;
        let pool = Pool::new();
        let raft = MetaRaft::start(cfg.id, &dir, pool.clone(), cluster.clone(), tuning).await?;
        let node = Arc::new(Node {
            cfg: cfg.clone(),
            raft,
            pool,
            cluster,
            liveness: Liveness::default(),
            leases: crate::leases::Leases::default(),
            caps: crate::caps::CapTable::default(),
            attempts: crate::service::Attempts::default(),
            corrupt_reports: AtomicU64::new(0),
        });
        let service = Arc::new(Service::new(node.clone()));
        let serving = tokio::spawn(stoa_net::serve(listener, service.clone()));
        if cfg.bootstrap {
            if let Err(e) = node.raft.initialize(&cfg.peers).await {
                service.close();
                serving.abort();
                node.raft.shutdown().await;
                return Err(e);
            }
        }
        let leading = tokio::spawn(follow_leadership(node.clone()));
        tracing::info!("meta replica {} serving on {addr}", cfg.id);
        Ok(Server { node, addr, service, serving, leading, _lock: lock })
    }

    /// Resolves with the reason when Raft stops on its own (a storage failure).
    pub async fn failed(&self) -> String {
        let mut watch = self.node.raft.subscribe();
        loop {
            if let Some(reason) = self.node.raft.view().fatal {
                return reason;
            }
            if !watch.changed().await {
                return "raft stopped".into();
            }
        }
    }

    /// Stops serving, stops Raft, and waits until the store is closed so that the data
    /// directory can be opened again at once.
    pub async fn stop(self) {
        let Server { node, addr, service, serving, leading, _lock } = self;
        service.close();
        leading.abort();
        let _ = leading.await;
        node.raft.shutdown().await;
        serving.abort();
        let _ = serving.await;
        let closed = node.raft.take_closed();
        drop(node);
        if let Some(closed) = closed {
            if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
                tracing::warn!("meta store still in use {CLOSE_WAIT:?} after shutdown");
            }
        }
        tracing::info!("meta replica at {addr} stopped");
    }
}
