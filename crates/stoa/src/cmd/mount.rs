//! `stoa mount`: one client session mounted with FUSE, in the foreground.

use crate::config;
use anyhow::Context;
use serde::Deserialize;
use std::path::PathBuf;
use stoa_fuse::MountConfig;

#[derive(clap::Args)]
pub struct Args {
    /// Where to mount.
    mountpoint: PathBuf,
    /// Meta replicas: host:port,host:port,...
    #[arg(long)]
    meta: Option<String>,
    /// A `stoa dev` directory: mount that cluster.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The most capabilities (cached inodes) this mount keeps; past it, the least
    /// recently used are given back to meta. Default 16384.
    #[arg(long)]
    caps_max: Option<usize>,
    /// MiB of file data this mount keeps for handles that read and write (the kernel
    /// keeps that of read-only ones); 0 keeps none. Default 256.
    #[arg(long)]
    cache_mib: Option<usize>,
    /// TOML file with the keys `meta`, `caps_max` and `cache_mib`; flags win over it.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct File {
    meta: Option<String>,
    caps_max: Option<usize>,
    cache_mib: Option<usize>,
}

/// Fewer caps than this would have a mount give back what it is using.
const CAPS_MAX_MIN: usize = 64;

pub fn main(args: Args) -> anyhow::Result<()> {
    let file: File = config::load_file(args.config.as_deref())?;
    let given = args.meta.or(file.meta);
    let meta = super::meta_addrs(given.as_deref(), args.dir.as_deref())?;
    let caps_max = args.caps_max.or(file.caps_max).unwrap_or(stoa_client::CAPS_MAX_DEFAULT);
    if caps_max < CAPS_MAX_MIN {
        anyhow::bail!("caps_max is {caps_max}; it must be at least {CAPS_MAX_MIN}");
    }
    let data_cache_bytes = match args.cache_mib.or(file.cache_mib) {
        Some(mib) => mib.checked_mul(1 << 20).context("cache_mib is too large")?,
        None => stoa_client::DATA_CACHE_DEFAULT,
    };
    let cfg = MountConfig {
        meta,
        mountpoint: args.mountpoint,
        name: client_name(),
        caps_max,
        data_cache_bytes,
    };
    let rt = crate::signal::runtime()?;
    let mounted = rt.block_on(async move {
        let shutdown = crate::signal::shutdown()?;
        let at = cfg.mountpoint.display().to_string();
        stoa_fuse::mount(cfg, shutdown).await.with_context(|| format!("mount at {at}"))
    });
    super::hint_dev_stopped(mounted, given.as_deref(), args.dir.as_deref())
}

/// Names this client in meta's session table: host and process.
pub fn client_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into());
    format!("{host}:{}", std::process::id())
}
