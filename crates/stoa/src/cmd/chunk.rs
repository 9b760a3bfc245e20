//! `stoa chunk`: one chunk server.

use crate::config::{self, required};
use anyhow::Context;
use serde::Deserialize;
use std::path::PathBuf;
use stoa_chunk::ChunkConfig;

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
    /// TOML file with the same keys (listen, data, meta, zone); flags win over it.
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
