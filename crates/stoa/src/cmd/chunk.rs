//! `stoa chunk`: one chunk server.

use crate::config::{self, required};
use anyhow::Context;
use serde::Deserialize;
use std::path::PathBuf;
use stoa_chunk::{
    ChunkConfig, RESERVE_BYTES_DEFAULT, SCRUB_BYTES_PER_SEC_DEFAULT, SWEEP_SECS_DEFAULT,
};

#[derive(clap::Args)]
pub struct Args {
    /// Address to listen on; clients and chain peers reach the server there.
    #[arg(long)]
    listen: Option<String>,
    /// Data directory for chunks.
    #[arg(long)]
    data: Option<PathBuf>,
    /// Meta replicas: host:port,host:port,...
    #[arg(long)]
    meta: Option<String>,
    /// Failure-domain label; replicas of a chunk are spread over zones.
    #[arg(long)]
    zone: Option<String>,
    /// Bytes per second the background scrubber reads to verify checksums (0: off;
    /// default 8 MiB/s).
    #[arg(long)]
    scrub_bytes_per_sec: Option<u64>,
    /// Free bytes to keep on the data disk: writes that would go below are refused with
    /// ENOSPC, so that the server can still run (default 256 MiB).
    #[arg(long)]
    reserve_bytes: Option<u64>,
    /// Seconds between two sweeps that remove the chunks of deleted files (0: off;
    /// default 600, at most a week).
    #[arg(long)]
    sweep_secs: Option<u64>,
    /// TOML file with the same keys (listen, data, meta, zone, scrub_bytes_per_sec,
    /// reserve_bytes, sweep_secs); flags win over it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    listen: Option<String>,
    data: Option<PathBuf>,
    meta: Option<String>,
    zone: Option<String>,
    scrub_bytes_per_sec: Option<u64>,
    reserve_bytes: Option<u64>,
    sweep_secs: Option<u64>,
}

fn resolve(args: Args) -> anyhow::Result<ChunkConfig> {
    let file: File = config::load_file(args.config.as_deref())?;
    let listen = required("listen", args.listen, file.listen)?;
    let meta = required("meta", args.meta, file.meta)?;
    Ok(ChunkConfig {
        listen: config::addr("listen", &listen)?,
        data_dir: required("data", args.data, file.data)?,
        meta: config::addr_list("meta", &meta)?,
        zone: args.zone.or(file.zone).unwrap_or_else(|| "default".into()),
        scrub_bytes_per_sec: args
            .scrub_bytes_per_sec
            .or(file.scrub_bytes_per_sec)
            .unwrap_or(SCRUB_BYTES_PER_SEC_DEFAULT),
        reserve_bytes: args.reserve_bytes.or(file.reserve_bytes).unwrap_or(RESERVE_BYTES_DEFAULT),
        sweep_secs: args.sweep_secs.or(file.sweep_secs).unwrap_or(SWEEP_SECS_DEFAULT),
    })
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let cfg = resolve(args)?;
    let rt = crate::signal::runtime()?;
    rt.block_on(async move {
        let shutdown = crate::signal::shutdown()?;
        let listen = cfg.listen;
        stoa_chunk::run(cfg, shutdown).await.with_context(|| format!("chunk server on {listen}"))
    })
}
