//! `stoa meta`: one meta replica.

use crate::config::{self, required};
use anyhow::Context;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;
use stoa_metad::{MetaConfig, REBUILD_AFTER_DEFAULT};
use stoa_types::{NodeId, CHUNK_SIZE_BYTES_DEFAULT};

#[derive(clap::Args)]
pub struct Args {
    /// This replica's id, 1..=99, unique in the cluster.
    #[arg(long)]
    id: Option<u64>,
    /// Address to listen on; peers and clients reach the replica there.
    #[arg(long)]
    listen: Option<String>,
    /// Data directory (Raft log, state machine, snapshots).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The initial replicas, including this one: 1=host:port,2=host:port,...
    #[arg(long)]
    peers: Option<String>,
    /// Form the group if this replica's data directory is new (on one replica only).
    #[arg(long)]
    bootstrap: bool,
    /// Copies of every chunk, fixed when the cluster is created (default 3).
    #[arg(long)]
    replicas: Option<u8>,
    /// Bytes per chunk, fixed when the cluster is created (default 4 MiB).
    #[arg(long)]
    chunk_size: Option<u32>,
    /// Seconds a chunk server may stay down before its replicas are rebuilt on other
    /// servers (default 300).
    #[arg(long)]
    rebuild_after_secs: Option<u64>,
    /// TOML file with the same keys (id, listen, data, peers, bootstrap, replicas,
    /// chunk_size, rebuild_after_secs); flags win over it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    id: Option<u64>,
    listen: Option<String>,
    data: Option<PathBuf>,
    peers: Option<String>,
    bootstrap: Option<bool>,
    replicas: Option<u8>,
    chunk_size: Option<u32>,
    rebuild_after_secs: Option<u64>,
}

fn resolve(args: Args) -> anyhow::Result<MetaConfig> {
    let file: File = config::load_file(args.config.as_deref())?;
    let listen = required("listen", args.listen, file.listen)?;
    let peers = required("peers", args.peers, file.peers)?;
    Ok(MetaConfig {
        id: NodeId(required("id", args.id, file.id)?),
        listen: config::addr("listen", &listen)?,
        data_dir: required("data", args.data, file.data)?,
        peers: config::peer_list("peers", &peers)?,
        bootstrap: args.bootstrap || file.bootstrap.unwrap_or(false),
        replicas: args.replicas.or(file.replicas).unwrap_or(3),
        chunk_size_bytes: args.chunk_size.or(file.chunk_size).unwrap_or(CHUNK_SIZE_BYTES_DEFAULT),
        rebuild_after: args
            .rebuild_after_secs
            .or(file.rebuild_after_secs)
            .map_or(REBUILD_AFTER_DEFAULT, Duration::from_secs),
    })
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let cfg = resolve(args)?;
    let rt = crate::signal::runtime()?;
    rt.block_on(async move {
        let shutdown = crate::signal::shutdown()?;
        let id = cfg.id;
        stoa_metad::run(cfg, shutdown).await.with_context(|| format!("meta replica {id}"))
    })
}
