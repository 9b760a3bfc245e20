//! The Stoa chunk server: stores chunks of file data on local disk, each 4 KiB block
//! with a CRC32C, and replicates every write along a chain of servers (CRAQ-style) so
//! that an acknowledged write is on every replica.
//!
//! ```text
//!  run(cfg) --> validate --> lock DATA/LOCK --> open engine --> bind
//!      --> register with meta (node id + cluster id, persisted in DATA/identity)
//!      --> serve:  requests --> server (chain checks, replication) --> engine (disk)
//!                  heartbeat every 300 ms --> new chain table --> resync if syncing
//!                  scrubber: verify every chunk at a set rate --> repair from a peer
//!                  sweep every sweep_secs: remove the chunks of inodes meta says are dead
//!      --> shutdown: drain requests, stop tasks, flush, mark the store clean
//! ```
//!
//! [`engine`] is the on-disk format and the version rules, with no network and no
//! clock; the server (`server/`) is the async shell around it.

mod datadir;
pub mod engine;
mod error;
mod sealed;
mod server;

pub use error::ChunkError;

use datadir::Identity;
use engine::Engine;
use server::{Server, Service};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoa_datadir::{DirLock, SERVER_LOCK};
use stoa_net::{MetaClient, Pool};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse};
use stoa_types::{FsError, RequestId, SessionId};
use tokio::task::JoinHandle;

/// How long one meta call keeps failing over between replicas before it gives up; the
/// callers (registration, heartbeats, resync) retry on their own schedule.
const META_DEADLINE: Duration = Duration::from_secs(2);
/// Pause between registration attempts while meta does not answer.
const REGISTER_RETRY: Duration = Duration::from_millis(500);

/// What an operator sets for one chunk server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Address to listen on. An unspecified IP (0.0.0.0) is registered with meta as the
    /// local address that reaches the first meta replica.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// Meta replica addresses (at least one).
    pub meta: Vec<SocketAddr>,
    /// Failure domain label; meta spreads replicas across zones.
    pub zone: String,
    /// Bytes per second the scrubber reads to verify checksums; 0 turns it off.
    pub scrub_bytes_per_sec: u64,
    /// Free bytes kept on the data disk: a write that would leave less is refused with
    /// `NoSpace` (ENOSPC), so that the disk never fills and headers can still be written.
    pub reserve_bytes: u64,
    /// Seconds between two sweeps that remove the chunks of dead inodes (deleted files'
    /// tombstones and leftovers); 0 turns the sweep off.
    pub sweep_secs: u64,
}

/// The scrubber's default pace: a full pass over 1 TB takes about a day and a half, and
/// it costs the disk little.
pub const SCRUB_BYTES_PER_SEC_DEFAULT: u64 = 8 * 1024 * 1024;
/// The default free-space reserve: room for headers, renames and the filesystem itself.
pub const RESERVE_BYTES_DEFAULT: u64 = 256 * 1024 * 1024;
/// The default sweep period: a deleted file's last files on disk go within about ten
/// minutes, and the sweep's listing and meta calls cost little at that pace.
pub const SWEEP_SECS_DEFAULT: u64 = 600;
/// The longest sweep period: longer is more likely a mistake than a wish (0 turns the
/// sweep off), and it keeps the timer far from overflowing.
pub const SWEEP_SECS_MAX: u64 = 7 * 24 * 3600;

impl ChunkConfig {
    fn validate(&self) -> Result<(), ChunkError> {
        if self.meta.is_empty() {
            return Err(ChunkError::Config(
                "meta: at least one meta replica address is needed".into(),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(ChunkError::Config("data_dir: must not be empty".into()));
        }
        if self.zone.is_empty()
            || self.zone.len() > 64
            || self.zone.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ChunkError::Config(format!(
                "zone: {:?} must be 1 to 64 characters without spaces",
                self.zone
            )));
        }
        if self.sweep_secs > SWEEP_SECS_MAX {
            return Err(ChunkError::Config(format!(
                "sweep_secs: {} is more than a week ({SWEEP_SECS_MAX}); 0 turns the sweep off",
                self.sweep_secs
            )));
        }
        Ok(())
    }
}

/// Runs a chunk server until `shutdown` completes.
pub async fn run(
    cfg: ChunkConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ChunkError> {
    tokio::pin!(shutdown);
    let running = tokio::select! {
        running = Running::start(cfg) => running?,
        _ = &mut shutdown => return Ok(()),
    };
    tracing::info!("chunk server {} serving on {}", running.server.node, running.addr);
    shutdown.await;
    running.stop().await;
    Ok(())
}

/// A started chunk server.
pub(crate) struct Running {
    pub server: Arc<Server>,
    /// The address registered with meta.
    pub addr: SocketAddr,
    service: Arc<Service>,
    serve: JoinHandle<()>,
    _lock: DirLock,
}

impl Running {
    pub async fn start(cfg: ChunkConfig) -> Result<Running, ChunkError> {
        cfg.validate()?;
        std::fs::create_dir_all(&cfg.data_dir).map_err(|e| {
            ChunkError::Config(format!("data_dir: create {}: {e}", cfg.data_dir.display()))
        })?;
        let lock = DirLock::acquire(&cfg.data_dir, SERVER_LOCK)?;
        let dir = cfg.data_dir.clone();
        let engine = tokio::task::spawn_blocking(move || Engine::open(&dir))
            .await
            .map_err(|e| store_err(&cfg, FsError::Io(e.to_string())))?
            .map_err(|e| store_err(&cfg, e))?;
        let engine = Arc::new(engine);
        let known = Identity::load(&cfg.data_dir)?;
        let listener = stoa_net::bind(cfg.listen).await?;
        let local =
            listener.local_addr().map_err(|e| ChunkError::Config(format!("listen: {e}")))?;
        let addr = advertised(local, cfg.meta[0]);
        let pool = Pool::new();
        let meta = MetaClient::new(pool.clone(), cfg.meta.clone(), META_DEADLINE);
        let (identity, acked) = register(&cfg, &meta, known, addr, &engine).await?;
        if known != Some(identity) {
            let dir = cfg.data_dir.clone();
            tokio::task::spawn_blocking(move || identity.store(&dir)).await.map_err(|e| {
                ChunkError::Identity { path: Identity::path(&cfg.data_dir), detail: e.to_string() }
            })??;
        }
        let limits = server::Limits {
            scrub_bytes_per_sec: cfg.scrub_bytes_per_sec,
            reserve_bytes: cfg.reserve_bytes,
            sweep_secs: cfg.sweep_secs,
        };
        let server = Arc::new(Server::new(identity.node, engine, pool, meta, limits));
        server.meta_acked(acked);
        let service = Arc::new(Service::new(server.clone()));
        let serve = tokio::spawn(stoa_net::serve(listener, service.clone()));
        server.start_heartbeats();
        server.start_scrubber();
        server.start_sweeper();
        Ok(Running { server, addr, service, serve, _lock: lock })
    }

    /// Finishes in-flight requests, stops every task and marks the store clean.
    pub async fn stop(self) {
        self.serve.abort();
        let server = self.service.close().await.unwrap_or(self.server);
        server.stop_tasks();
        let engine = server.engine.clone();
        match tokio::task::spawn_blocking(move || engine.close_clean()).await {
            Ok(Ok(())) => tracing::info!("chunk server {} stopped cleanly", server.node),
            Ok(Err(e)) => tracing::warn!("closing the chunk store: {e}"),
            Err(e) => tracing::warn!("closing the chunk store: {e}"),
        }
    }
}

fn store_err(cfg: &ChunkConfig, source: FsError) -> ChunkError {
    ChunkError::Store { path: cfg.data_dir.clone(), source }
}

/// The address peers reach us at: the listening address, or for an unspecified IP the
/// local IP the kernel would use to reach meta (no packet is sent).
fn advertised(local: SocketAddr, meta: SocketAddr) -> SocketAddr {
    if !local.ip().is_unspecified() {
        return local;
    }
    let any: IpAddr = if meta.is_ipv4() { [0, 0, 0, 0].into() } else { [0u16; 8].into() };
    let probe = std::net::UdpSocket::bind((any, 0)).and_then(|s| {
        s.connect(meta)?;
        s.local_addr()
    });
    match probe {
        Ok(found) => SocketAddr::new(found.ip(), local.port()),
        Err(e) => {
            tracing::warn!("finding the address that reaches meta at {meta}: {e}");
            local
        }
    }
}

/// Registers with meta, waiting for it as long as it does not answer. Returns who we
/// are and when the answered call was sent.
async fn register(
    cfg: &ChunkConfig,
    meta: &MetaClient,
    known: Option<Identity>,
    addr: SocketAddr,
    engine: &Arc<Engine>,
) -> Result<(Identity, Instant), ChunkError> {
    let e = engine.clone();
    let (capacity_bytes, used_bytes) = tokio::task::spawn_blocking(move || e.usage())
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or((0, 0));
    let op = MetaOp::RegisterChunkServer {
        node: known.map(|i| i.node),
        cluster: known.map(|i| i.cluster),
        addr,
        zone: cfg.zone.clone(),
        capacity_bytes,
        used_bytes,
    };
    let wrong_cluster =
        |detail: String| ChunkError::WrongCluster { path: cfg.data_dir.clone(), detail };
    loop {
        let sent = Instant::now();
        let req = MetaRequest { session: SessionId(0), req_id: RequestId(0), op: op.clone() };
        match meta.call(req).await {
            Ok(MetaResponse::Registered { node, cluster }) => {
                if let Some(k) = known.filter(|k| k.cluster != cluster) {
                    return Err(wrong_cluster(format!(
                        "it is of cluster {}, meta is cluster {cluster}",
                        k.cluster
                    )));
                }
                return Ok((Identity { node, cluster }, sent));
            }
            Ok(other) => {
                return Err(ChunkError::Register(FsError::Protocol(format!(
                    "registration answered {other:?}"
                ))))
            }
            Err(FsError::WrongCluster { expected, got }) => {
                return Err(wrong_cluster(format!(
                    "meta is cluster {expected}, the directory says {got}"
                )))
            }
            Err(e) if e.is_retryable() => {
                tracing::info!("waiting for meta at {:?} to register: {e}", cfg.meta);
                tokio::time::sleep(REGISTER_RETRY).await;
            }
            Err(e) => return Err(ChunkError::Register(e)),
        }
    }
}
