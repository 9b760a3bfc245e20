//! The Stoa meta server: one replica of the Raft group that owns the namespace.
//!
//! ```text
//!  clients, chunk servers, peers
//!        |  stoa-net RPC
//!        v
//!  service (forward to leader | propose | linearizable read | heartbeat | status)
//!        |                                   \
//!  raft (openraft over redb: log + state machine + snapshots)   leader tasks
//!        |                                                      (init, liveness, gc)
//!  stoa-meta (deterministic state machine over the KV tables)
//! ```
//!
//! Every replica accepts every request: mutations become Raft log entries on the leader
//! (a follower forwards them), reads are answered by any replica after a Raft ReadIndex
//! (a follower asks the leader for the index, then reads its own state machine), and the
//! leader alone judges chunk-server liveness and session leases and collects garbage. The `stoa`
//! binary calls [`run`].

mod caps;
mod contended;
mod datadir;
mod error;
mod leader;
mod leases;
mod liveness;
mod raft;
mod server;
mod service;
mod status;

pub use error::MetadError;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use stoa_types::NodeId;

/// How to run one meta replica.
#[derive(Clone, Debug)]
pub struct MetaConfig {
    /// This replica's id, 1..=99.
    pub id: NodeId,
    /// Where to listen; also the address peers and clients use.
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// The initial voters, including this replica.
    pub peers: Vec<(NodeId, SocketAddr)>,
    /// Whether this replica forms the group when its data directory is new.
    pub bootstrap: bool,
    /// Chunk replica count, fixed when the cluster is created.
    pub replicas: u8,
    pub chunk_size_bytes: u32,
    /// How long a chain may stay short of replicas (a server down) before the leader
    /// rebuilds the missing replica on another server. A server back sooner resyncs only
    /// what changed; rebuilding copies every chunk of the chain, so it waits.
    pub rebuild_after: std::time::Duration,
}

/// The rebuild delay when none is configured: long enough for a reboot or a process
/// restart, short enough that a dead disk does not leave chunks at fewer copies for long.
pub const REBUILD_AFTER_DEFAULT: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs a meta replica until `shutdown` resolves (then stops cleanly and returns `Ok`) or
/// Raft stops on a storage failure (then returns the error).
pub async fn run(
    cfg: MetaConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), MetadError> {
    let server = server::Server::start(cfg, raft::Tuning::default()).await?;
    let failure = tokio::select! {
        _ = shutdown => None,
        reason = server.failed() => Some(reason),
    };
    server.stop().await;
    match failure {
        None => Ok(()),
        Some(reason) => Err(MetadError::Raft(reason)),
    }
}

#[cfg(test)]
mod tests;
