//! `stoa dev`: a whole cluster on one machine, mounted, in the foreground.
//!
//! ```text
//!  lock DIR -> layout (ports, fixed at first run) -> wait for the nodes of a killed run
//!    -> spawn meta x N, chunk x M
//!    -> DIR/cluster.json -> wait for quorum and chains -> mount (until SIGINT/SIGTERM)
//!    -> unmount -> stop chunk servers, then meta -> remove DIR/cluster.json
//! ```
//!
//! Every node is its own `stoa meta` / `stoa chunk` process on loopback with its own data
//! directory under DIR, so killing one is a real node failure. The children live in their
//! own process group (Ctrl-C reaches only this process, which stops them in order) and die
//! with it if it is killed (PR_SET_PDEATHSIG).

use crate::cluster_file::{ClusterFile, NodeEntry};
use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stoa_datadir::{DirLock, DirLockError, SERVER_LOCK};
use stoa_fuse::MountConfig;
use tokio::sync::watch;

#[derive(clap::Args)]
pub struct Args {
    /// Where every node keeps its data, logs and the cluster file.
    #[arg(long, default_value = super::DEV_DIR)]
    dir: PathBuf,
    /// Where to mount the filesystem.
    #[arg(long, default_value = "/mnt/stoa")]
    mount: PathBuf,
    /// Meta replicas (1, 3 or 5 make sense: a majority must be up).
    #[arg(long, default_value_t = 3)]
    meta: usize,
    /// Chunk servers; each chunk is kept on min(3, this) of them.
    #[arg(long, default_value_t = 3)]
    chunk: usize,
    /// Passed to every meta replica: seconds before a down chunk server's replicas are
    /// rebuilt elsewhere (needs more chunk servers than replicas).
    #[arg(long)]
    rebuild_after_secs: Option<u64>,
    /// Passed to every chunk server: bytes per second its scrubber verifies.
    #[arg(long)]
    scrub_bytes_per_sec: Option<u64>,
    /// Passed to every chunk server: free bytes it keeps on its disk (ENOSPC below).
    #[arg(long)]
    reserve_bytes: Option<u64>,
    /// Passed to every chunk server: seconds between its sweeps of deleted files' chunks.
    #[arg(long)]
    sweep_secs: Option<u64>,
}

/// How long the cluster may take to elect a leader and form its chains.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a node may take to stop after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The ports and replica count, chosen at the first run and kept, so that every restart
/// brings back the same cluster at the same addresses.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Layout {
    version: u32,
    meta_ports: Vec<u16>,
    chunk_ports: Vec<u16>,
    replicas: u8,
}

/// A free port below Linux's default ephemeral range (32768-60999), so that no
/// outgoing connection takes it between now and the node binding it; random, so that
/// dev clusters started at once rarely pick the same; never one of `taken` (the ports
/// this cluster already chose: each is free until its node binds it, so the probe alone
/// could hand it out twice).
fn free_port(taken: &[u16]) -> anyhow::Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    const LOW: u16 = 20000;
    const HIGH: u16 = 32768;
    let free = |port: u16| {
        !taken.contains(&port) && std::net::TcpListener::bind(("127.0.0.1", port)).is_ok()
    };
    for _ in 0..200 {
        let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
        let port = LOW + (random % u64::from(HIGH - LOW)) as u16;
        if free(port) {
            return Ok(port);
        }
    }
    for _ in 0..16 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").context("find a free port")?;
        let port = listener.local_addr()?.port();
        if !taken.contains(&port) {
            return Ok(port);
        }
    }
    bail!("no free port found on 127.0.0.1")
}

impl Layout {
    fn path(dir: &Path) -> PathBuf {
        dir.join("dev-layout.json")
    }

    /// Loads the layout of an existing dev cluster or makes a new one. More chunk servers
    /// than last time are added; fewer, or another number of meta replicas, is refused,
    /// because it would change a cluster that holds data.
    fn load_or_create(dir: &Path, meta: usize, chunk: usize) -> anyhow::Result<Layout> {
        let path = Layout::path(dir);
        let mut layout = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str::<Layout>(&text).with_context(|| {
                format!("{} is damaged; remove DIR to start over", path.display())
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut meta_ports = Vec::with_capacity(meta);
                while meta_ports.len() < meta {
                    meta_ports.push(free_port(&meta_ports)?);
                }
                Layout {
                    version: 1,
                    meta_ports,
                    chunk_ports: Vec::new(),
                    replicas: chunk.min(3) as u8,
                }
            }
            Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
        };
        if layout.meta_ports.len() != meta {
            bail!(
                "the cluster in {} was created with {} meta replicas, not {meta}; pass --meta {} \
                 or use another --dir",
                dir.display(),
                layout.meta_ports.len(),
                layout.meta_ports.len()
            );
        }
        if chunk < layout.chunk_ports.len() {
            bail!(
                "the cluster in {} has {} chunk servers holding data; pass --chunk {} or more",
                dir.display(),
                layout.chunk_ports.len(),
                layout.chunk_ports.len()
            );
        }
        while layout.chunk_ports.len() < chunk {
            let taken: Vec<u16> =
                layout.meta_ports.iter().chain(&layout.chunk_ports).copied().collect();
            layout.chunk_ports.push(free_port(&taken)?);
        }
        let text = serde_json::to_string_pretty(&layout)?;
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        Ok(layout)
    }
}

/// Holds `DIR/dev.lock` so that two `stoa dev` never run one cluster.
fn lock_dir(dir: &Path) -> anyhow::Result<DirLock> {
    DirLock::acquire(dir, super::DEV_LOCK).map_err(|e| match e {
        DirLockError::Busy { .. } => anyhow!("another `stoa dev` is running on {}", dir.display()),
        other => other.into(),
    })
}

/// How long a new `stoa dev` waits for the nodes of a killed one to stop.
const OLD_NODES_WAIT: Duration = Duration::from_secs(30);

/// The data directory of node `id` with `role` (`meta` or `chunk`).
fn node_dir(dir: &Path, role: &str, id: u64) -> PathBuf {
    dir.join(format!("{role}-{id}"))
}

/// The nodes of a `stoa dev` killed with SIGKILL stop on their own (parent-death signal),
/// but a meta replica can take seconds to. Waits, at most [`OLD_NODES_WAIT`], until no
/// process holds a node's data directory, so that a restart right after a kill starts.
fn wait_for_old_nodes(dir: &Path, layout: &Layout) -> anyhow::Result<()> {
    let metas = (1..=layout.meta_ports.len() as u64).map(|id| node_dir(dir, "meta", id));
    let chunks = (1..=layout.chunk_ports.len() as u64).map(|id| node_dir(dir, "chunk", id));
    let deadline = Instant::now() + OLD_NODES_WAIT;
    let mut told = false;
    for data in metas.chain(chunks).filter(|d| d.is_dir()) {
        loop {
            match DirLock::acquire(&data, SERVER_LOCK) {
                Ok(_) => break,
                Err(DirLockError::Busy { .. }) if Instant::now() < deadline => {
                    if !told {
                        eprintln!(
                            "stoa dev: waiting for the nodes of an earlier `stoa dev` to stop"
                        );
                        told = true;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// One running child node.
struct Node {
    entry: NodeEntry,
    child: Child,
}

fn spawn_node(
    dir: &Path,
    role: &str,
    id: u64,
    addr: SocketAddr,
    args: Vec<String>,
) -> anyhow::Result<Node> {
    let exe = std::env::current_exe().context("find the stoa binary")?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("create {}", logs.display()))?;
    let log = logs.join(format!("{role}-{id}.log"));
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("open {}", log.display()))?;
    let mut cmd = Command::new(&exe);
    cmd.args(&args).stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| format!("start {role} {id}"))?;
    let mut line = vec![exe.display().to_string()];
    line.extend(args);
    let data_dir = node_dir(dir, role, id);
    let entry =
        NodeEntry { id, role: role.into(), pid: child.id(), addr, data_dir, log, cmd: line };
    Ok(Node { entry, child })
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn spawn_all(dir: &Path, layout: &Layout, tuning: &Args) -> anyhow::Result<Vec<Node>> {
    let metas: Vec<SocketAddr> = layout.meta_ports.iter().map(|p| loopback(*p)).collect();
    let peers = metas
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}={a}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let meta_list = metas.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let mut nodes = Vec::new();
    for (i, addr) in metas.iter().enumerate() {
        let id = i as u64 + 1;
        let data = node_dir(dir, "meta", id);
        let mut args = vec![
            "meta".to_string(),
            format!("--id={id}"),
            format!("--listen={addr}"),
            format!("--data={}", data.display()),
            format!("--peers={peers}"),
            format!("--replicas={}", layout.replicas),
        ];
        if id == 1 {
            args.push("--bootstrap".into());
        }
        if let Some(secs) = tuning.rebuild_after_secs {
            args.push(format!("--rebuild-after-secs={secs}"));
        }
        nodes.push(spawn_node(dir, "meta", id, *addr, args)?);
    }
    for (j, port) in layout.chunk_ports.iter().enumerate() {
        let id = j as u64 + 1;
        let addr = loopback(*port);
        let data = node_dir(dir, "chunk", id);
        let mut args = vec![
            "chunk".to_string(),
            format!("--listen={addr}"),
            format!("--data={}", data.display()),
            format!("--meta={meta_list}"),
            format!("--zone=zone-{}", j % 3 + 1),
        ];
        if let Some(rate) = tuning.scrub_bytes_per_sec {
            args.push(format!("--scrub-bytes-per-sec={rate}"));
        }
        if let Some(reserve) = tuning.reserve_bytes {
            args.push(format!("--reserve-bytes={reserve}"));
        }
        if let Some(secs) = tuning.sweep_secs {
            args.push(format!("--sweep-secs={secs}"));
        }
        nodes.push(spawn_node(dir, "chunk", id, addr, args)?);
    }
    Ok(nodes)
}

/// The last lines of a node's log, to explain why it stopped.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n    ")
}

/// Fails if any node has exited, with the end of its log.
fn check_alive(nodes: &mut [Node]) -> anyhow::Result<()> {
    for n in nodes.iter_mut() {
        if let Some(status) = n.child.try_wait()? {
            bail!(
                "{} {} exited ({status}); its log {} ends with:\n    {}",
                n.entry.role,
                n.entry.id,
                n.entry.log.display(),
                log_tail(&n.entry.log)
            );
        }
    }
    Ok(())
}

/// Waits until meta has a quorate leader and every chunk server is up in a chain.
async fn wait_ready(
    nodes: &mut [Node],
    metas: Vec<SocketAddr>,
    chunks: usize,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        check_alive(nodes)?;
        if let Ok(s) = super::status::fetch(metas.clone()).await {
            let up = s.chunk_servers.iter().filter(|c| c.up).count();
            if s.quorate && s.leader.is_some() && up >= chunks && !s.chains.is_empty() {
                return Ok(());
            }
        }
        if started.elapsed() > READY_TIMEOUT {
            bail!("the cluster did not become ready within {READY_TIMEOUT:?}; see the logs in DIR/logs");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = stop.changed() => bail!("interrupted while starting"),
        }
    }
}

/// Stops nodes with SIGTERM (chunk servers first, so that no write is cut mid-chain by
/// a vanishing meta), killing any that outlive the timeout.
fn stop_all(nodes: &mut [Node]) {
    for role in ["chunk", "meta"] {
        let group: Vec<&mut Node> = nodes.iter_mut().filter(|n| n.entry.role == role).collect();
        for n in &group {
            // SAFETY: plain kill(2) on our own child.
            unsafe { libc::kill(n.child.id() as i32, libc::SIGTERM) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        for n in group {
            while n.child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    tracing::warn!("{} {} did not stop in time: killing it", role, n.entry.id);
                    let _ = n.child.kill();
                    let _ = n.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn check_args(args: &Args) -> anyhow::Result<()> {
    if !(1..=9).contains(&args.meta) {
        bail!("--meta must be 1..=9, got {}", args.meta);
    }
    if !(1..=64).contains(&args.chunk) {
        bail!("--chunk must be 1..=64, got {}", args.chunk);
    }
    // Before any node starts: a dead FUSE mount left by a killed `stoa dev` is detached
    // here, a live one refused.
    stoa_fuse::prepare_mount_point(&args.mount)?;
    Ok(())
}

pub fn main(args: Args) -> anyhow::Result<()> {
    check_args(&args)?;
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    let _lock = lock_dir(&args.dir)?;
    let layout = Layout::load_or_create(&args.dir, args.meta, args.chunk)?;
    wait_for_old_nodes(&args.dir, &layout)?;
    let rt = crate::signal::runtime()?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let signals = rt.block_on(async { crate::signal::shutdown() })?;
    rt.spawn(async move {
        signals.await;
        let _ = stop_tx.send(true);
    });
    // Children are spawned on this thread, which lives as long as the command:
    // PR_SET_PDEATHSIG fires when the spawning thread exits.
    let mut nodes = spawn_all(&args.dir, &layout, &args)?;
    let result = rt.block_on(run(&args, &mut nodes, stop_rx));
    stop_all(&mut nodes);
    let _ = std::fs::remove_file(ClusterFile::path(&args.dir));
    if result.is_ok() {
        eprintln!("stoa dev: stopped; data kept in {}", args.dir.display());
    }
    result
}

async fn run(args: &Args, nodes: &mut [Node], stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    let entries = nodes.iter().map(|n| n.entry.clone()).collect();
    let file = ClusterFile::new(std::process::id(), Some(args.mount.clone()), entries);
    file.save(&args.dir)?;
    let metas = file.meta_addrs();
    let mut waiting = stop.clone();
    wait_ready(nodes, metas.clone(), args.chunk, &mut waiting).await?;
    let cfg = MountConfig {
        meta: metas,
        mountpoint: args.mount.clone(),
        name: super::mount::client_name(),
        caps_max: stoa_client::CAPS_MAX_DEFAULT,
        data_cache_bytes: stoa_client::DATA_CACHE_DEFAULT,
    };
    eprintln!(
        "stoa dev: {} meta replicas and {} chunk servers up; mounting at {} (Ctrl-C to stop)\n  \
         status: stoa status --dir {}",
        args.meta,
        args.chunk,
        args.mount.display(),
        args.dir.display()
    );
    let mut stop = stop;
    let shutdown = async move {
        let _ = stop.wait_for(|s| *s).await;
    };
    stoa_fuse::mount(cfg, shutdown)
        .await
        .with_context(|| format!("mount at {}", args.mount.display()))
}

#[cfg(test)]
mod tests {
    use super::free_port;

    #[test]
    fn a_port_the_cluster_already_chose_is_never_chosen_again() {
        // Every port of the random range but one is taken: whatever is picked is not one
        // of them (the ports are free on this machine, so a probe alone would take them).
        let taken: Vec<u16> = (20000..32767).collect();
        for _ in 0..20 {
            let port = free_port(&taken).unwrap();
            assert!(!taken.contains(&port), "{port} was taken");
        }
    }
}
