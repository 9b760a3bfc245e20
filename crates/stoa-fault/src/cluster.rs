//! A Stoa cluster as separate hosts: every meta replica, chunk server and client mount is
//! its own `stoa` process in its own network namespace (see [`crate::net`]). The mounts
//! enter only the network namespace (setns before exec), not a new mount namespace as
//! `ip netns exec` would, so their FUSE mount points are visible to the harness, which
//! runs the workloads on the host.
//!
//! Processes are spawned from the thread that owns the [`Cluster`] and carry
//! PR_SET_PDEATHSIG, so they die with the harness even when it is killed; dropping the
//! cluster stops every process, unmounts every mount and deletes every namespace.

use crate::error::{FaultError, Result};
use crate::net::{self, Host, Net};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const META_PORT: u16 = 7100;
const CHUNK_PORT: u16 = 7200;
/// The free space each chunk server keeps on its small tmpfs disk (see `--reserve-bytes`).
const CHUNK_RESERVE_BYTES: u64 = 16 << 20;

/// How long a mount may take to unmount after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub stoa: PathBuf,
    pub meta: usize,
    pub chunk: usize,
    pub clients: usize,
    /// Size of each chunk server's data disk (a tmpfs, so that it can be filled).
    pub chunk_disk_mib: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Meta,
    Chunk,
    Client,
    /// A mount that talks to one chosen meta replica only, started by a scenario.
    Probe,
}

pub struct Node {
    pub name: String,
    pub role: Role,
    pub host: Host,
    /// The data directory (meta, chunk) or mount point (client).
    pub path: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

pub struct Cluster {
    pub dir: PathBuf,
    pub nodes: Vec<Node>,
    pub replicas: usize,
    stoa: PathBuf,
    ctl: Host,
    tmpfs: Vec<PathBuf>,
    // Declared last: dropped after the processes in it are gone.
    net: Net,
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

impl Cluster {
    /// Builds the network, starts meta and chunk servers, waits for a healthy cluster,
    /// then mounts every client.
    pub fn start(cfg: &ClusterConfig, tag_n: u32) -> Result<Cluster> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(FaultError::NotRoot);
        }
        if !cfg.stoa.exists() {
            return Err(FaultError::NoBinary(cfg.stoa.clone()));
        }
        net::sweep()?;
        let tag = format!("{}x{tag_n}", net::owner_prefix());
        let dir = std::env::temp_dir().join(&tag);
        std::fs::create_dir_all(&dir).map_err(|e| FaultError::io("create", &dir, e))?;
        let mut net = Net::create(&tag)?;
        let ctl = net.add_host("ctl", 250)?;
        let mut cluster = Cluster {
            dir,
            nodes: Vec::new(),
            replicas: cfg.chunk.min(3),
            stoa: cfg.stoa.clone(),
            ctl,
            tmpfs: Vec::new(),
            net,
        };
        cluster.add_nodes(cfg)?;
        for i in 0..cluster.nodes.len() {
            if matches!(cluster.nodes[i].role, Role::Meta | Role::Chunk) {
                cluster.spawn(i)?;
            }
        }
        cluster.wait_healthy(Duration::from_secs(120))?;
        for i in 0..cluster.nodes.len() {
            if cluster.nodes[i].role == Role::Client {
                cluster.spawn(i)?;
                cluster.wait_mounted(i)?;
            }
        }
        Ok(cluster)
    }

    fn add_nodes(&mut self, cfg: &ClusterConfig) -> Result<()> {
        let metas: Vec<String> =
            (1..=cfg.meta).map(|i| format!("10.77.0.{i}:{META_PORT}")).collect();
        let peers: Vec<String> =
            metas.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect();
        let meta_list = metas.join(",");
        for (i, name) in names("m", cfg.meta).into_iter().enumerate() {
            let host = self.net.add_host(&name, i as u8 + 1)?;
            let path = self.dir.join(&name);
            let mut args = vec![
                "meta".into(),
                format!("--id={}", i + 1),
                format!("--listen={}:{META_PORT}", host.ip),
                format!("--data={}", path.display()),
                format!("--peers={}", peers.join(",")),
                format!("--replicas={}", self.replicas),
            ];
            if i == 0 {
                args.push("--bootstrap".into());
            }
            self.push(name, Role::Meta, host, path, args);
        }
        for (i, name) in names("c", cfg.chunk).into_iter().enumerate() {
            let host = self.net.add_host(&name, i as u8 + 11)?;
            let path = self.dir.join(&name);
            self.mount_tmpfs(&path, cfg.chunk_disk_mib)?;
            let args = vec![
                "chunk".into(),
                format!("--listen={}:{CHUNK_PORT}", host.ip),
                format!("--data={}", path.join("data").display()),
                format!("--meta={meta_list}"),
                format!("--zone=zone-{}", i % 3 + 1),
                // The default reserve (256 MiB) is for real disks: on these small ones it
                // would leave a chain head a third of its space, and a long run on one
                // cluster would meet ENOSPC by its third scenario.
                format!("--reserve-bytes={CHUNK_RESERVE_BYTES}"),
            ];
            self.push(name, Role::Chunk, host, path, args);
        }
        for (i, name) in names("k", cfg.clients).into_iter().enumerate() {
            let host = self.net.add_host(&name, i as u8 + 21)?;
            let path = self.dir.join(format!("mnt-{name}"));
            std::fs::create_dir_all(&path).map_err(|e| FaultError::io("create", &path, e))?;
            let args =
                vec!["mount".into(), format!("--meta={meta_list}"), path.display().to_string()];
            self.push(name, Role::Client, host, path, args);
        }
        let host = self.net.add_host("p1", 30)?;
        let path = self.dir.join("mnt-p1");
        std::fs::create_dir_all(&path).map_err(|e| FaultError::io("create", &path, e))?;
        self.push("p1".into(), Role::Probe, host, path, Vec::new());
        Ok(())
    }

    /// Mounts the probe client, which knows only meta replica `meta`, and returns its
    /// mount point.
    pub fn start_probe(&mut self, meta: &str) -> Result<PathBuf> {
        let addr = format!("{}:{META_PORT}", self.nodes[self.index(meta)].host.ip);
        let i = self.index("p1");
        let path = self.nodes[i].path.clone();
        self.nodes[i].args =
            vec!["mount".into(), format!("--meta={addr}"), path.display().to_string()];
        self.spawn(i)?;
        self.wait_mounted(i)?;
        Ok(path)
    }

    fn push(&mut self, name: String, role: Role, host: Host, path: PathBuf, args: Vec<String>) {
        let log = self.dir.join(format!("{name}.log"));
        self.nodes.push(Node { name, role, host, path, args, log, child: None });
    }

    fn mount_tmpfs(&mut self, path: &Path, mib: u64) -> Result<()> {
        std::fs::create_dir_all(path).map_err(|e| FaultError::io("create", path, e))?;
        let p = path.to_string_lossy();
        net::run("mount", &["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs", &p])?;
        self.tmpfs.push(path.to_path_buf());
        Ok(())
    }

    pub fn index(&self, name: &str) -> usize {
        self.nodes.iter().position(|n| n.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    pub fn names(&self, role: Role) -> Vec<String> {
        self.nodes.iter().filter(|n| n.role == role).map(|n| n.name.clone()).collect()
    }

    pub fn all_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    pub fn mount_point(&self, name: &str) -> PathBuf {
        self.nodes[self.index(name)].path.clone()
    }

    pub fn net(&self) -> &Net {
        &self.net
    }

    /// Starts node `i` in its namespace, appending to its log.
    fn spawn(&mut self, i: usize) -> Result<()> {
        let node = &self.nodes[i];
        let ns_path = format!("/run/netns/{}", node.host.ns);
        let ns = File::open(&ns_path).map_err(|e| FaultError::io("open", &ns_path, e))?;
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .map_err(|e| FaultError::io("open", &node.log, e))?;
        let log2 = log.try_clone().map_err(|e| FaultError::io("open", &node.log, e))?;
        let mut cmd = Command::new(&self.stoa);
        cmd.args(&node.args).stdin(Stdio::null()).stdout(log).stderr(log2);
        enter_netns(&mut cmd, &ns);
        let child =
            cmd.spawn().map_err(|source| FaultError::Spawn { node: node.name.clone(), source })?;
        drop(ns);
        self.nodes[i].child = Some(child);
        Ok(())
    }

    fn wait_mounted(&mut self, i: usize) -> Result<()> {
        let what = format!("{} is mounted", self.nodes[i].name);
        let path = self.nodes[i].path.clone();
        eventually(Duration::from_secs(60), &what, || is_mounted(&path))
    }

    /// Sends `sig` to node `name`.
    pub fn signal(&mut self, name: &str, sig: i32) {
        let i = self.index(name);
        if let Some(c) = self.nodes[i].child.as_ref() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// kill -9 of a node; a killed mount is also unmounted, as the kernel would leave it
    /// dead otherwise.
    pub fn kill9(&mut self, name: &str) {
        self.signal(name, libc::SIGKILL);
        let i = self.index(name);
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.wait();
        }
        if matches!(self.nodes[i].role, Role::Client | Role::Probe) {
            let _ = net::run("fusermount3", &["-uz", &self.nodes[i].path.to_string_lossy()]);
        }
    }

    /// SIGTERM and wait (a clean stop, as systemd would do it).
    pub fn stop(&mut self, name: &str) {
        let i = self.index(name);
        stop_child(&mut self.nodes[i]);
        let n = &self.nodes[i];
        if matches!(n.role, Role::Client | Role::Probe) && is_mounted(&n.path) {
            let _ = net::run("fusermount3", &["-uz", &n.path.to_string_lossy()]);
        }
    }

    /// Starts a stopped or killed node again with the same command line and data.
    pub fn restart(&mut self, name: &str) -> Result<()> {
        let i = self.index(name);
        if self.nodes[i].child.is_some() {
            self.kill9(name);
        }
        self.spawn(i)?;
        if matches!(self.nodes[i].role, Role::Client | Role::Probe) {
            self.wait_mounted(i)?;
        }
        Ok(())
    }

    /// The addresses of the meta replicas, as `stoa --meta` takes them.
    pub fn meta_list(&self) -> String {
        self.nodes
            .iter()
            .filter(|n| n.role == Role::Meta)
            .map(|n| format!("{}:{META_PORT}", n.host.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `stoa status --json`, asked from the control host, which no fault ever cuts.
    pub fn status(&self) -> Result<Value> {
        let ns_path = format!("/run/netns/{}", self.ctl.ns);
        let ns = File::open(&ns_path).map_err(|e| FaultError::io("open", &ns_path, e))?;
        let mut cmd = Command::new(&self.stoa);
        cmd.args(["status", "--json", "--meta", &self.meta_list()]);
        enter_netns(&mut cmd, &ns);
        let out =
            cmd.output().map_err(|source| FaultError::Spawn { node: "status".into(), source })?;
        if !out.status.success() {
            return Err(FaultError::Status(
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        serde_json::from_slice(&out.stdout).map_err(|e| FaultError::Status(e.to_string()))
    }

    /// The name of the meta leader, waiting for one.
    pub fn leader(&self, within: Duration) -> Result<String> {
        let mut leader = None;
        eventually(within, "meta has a leader", || {
            leader = self.status().ok().and_then(|s| s["meta"]["leader"].as_u64());
            leader.is_some()
        })?;
        Ok(format!("m{}", leader.unwrap_or_default()))
    }

    /// Whether every node is up and every chain has all its replicas, none syncing.
    pub fn healthy(&self) -> bool {
        let Ok(s) = self.status() else { return false };
        let all_up =
            |key: &Value| key.as_array().is_some_and(|a| a.iter().all(|n| n["up"] == true));
        let chains_whole = s["chains"].as_array().is_some_and(|a| {
            !a.is_empty()
                && a.iter().all(|c| {
                    c["members"].as_array().map_or(0, Vec::len) == self.replicas
                        && c["syncing"].as_array().is_some_and(Vec::is_empty)
                })
        });
        let chunks_known =
            s["chunk"].as_array().map_or(0, Vec::len) == self.names(Role::Chunk).len();
        s["meta"]["leader"].is_u64()
            && all_up(&s["meta"]["members"])
            && all_up(&s["chunk"])
            && chunks_known
            && chains_whole
    }

    pub fn wait_healthy(&self, within: Duration) -> Result<Duration> {
        let started = Instant::now();
        eventually(within, "every node is up and every chain whole", || self.healthy())?;
        Ok(started.elapsed())
    }

    /// Fills chunk server `name`'s data disk until the kernel says ENOSPC.
    pub fn fill_disk(&self, name: &str) -> Result<u64> {
        let path = self.nodes[self.index(name)].path.join("filler");
        let mut f = File::create(&path).map_err(|e| FaultError::io("create", &path, e))?;
        let block = vec![0xA5u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match std::io::Write::write(&mut f, &block) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => return Err(FaultError::io("fill", &path, e)),
            }
        }
        Ok(written)
    }

    pub fn free_disk(&self, name: &str) -> Result<()> {
        let path = self.nodes[self.index(name)].path.join("filler");
        std::fs::remove_file(&path).map_err(|e| FaultError::io("remove", &path, e))
    }

    /// Aborts the FUSE connections of every client mount (see [`abort_fuse`]), so that
    /// workload threads stuck on a mount that will never answer return with an error;
    /// returns how many it aborted.
    pub fn abort_mounts(&self) -> usize {
        let clients = self.nodes.iter().filter(|n| matches!(n.role, Role::Client | Role::Probe));
        clients.filter(|n| abort_fuse(&n.path)).count()
    }

    /// Every chunk file (`<chunk id>.chunk`: its headers and data; not an unfinished
    /// install, nor the store's `LAYOUT` beside the fan-out directories) of chunk server
    /// `name`.
    pub fn chunk_files(&self, name: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let chunks = self.nodes[self.index(name)].path.join("data/chunks");
        let fans = std::fs::read_dir(chunks).into_iter().flatten().flatten();
        for fan in fans.filter(|f| f.path().is_dir()) {
            for e in std::fs::read_dir(fan.path()).into_iter().flatten().flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "chunk") {
                    out.push(p);
                }
            }
        }
        out.sort();
        out
    }

    fn teardown(&mut self) {
        // Mounts first (their sessions end cleanly while meta is still up), then chunk
        // servers, then meta.
        for role in [Role::Probe, Role::Client, Role::Chunk, Role::Meta] {
            for n in self.nodes.iter_mut().filter(|n| n.role == role) {
                // SAFETY: plain kill(2) of our own child; a paused node must run to stop.
                if let Some(c) = n.child.as_ref() {
                    unsafe { libc::kill(c.id() as i32, libc::SIGCONT) };
                }
                stop_child(n);
                if matches!(role, Role::Client | Role::Probe) && is_mounted(&n.path) {
                    let _ = net::run("fusermount3", &["-uz", &n.path.to_string_lossy()]);
                }
            }
        }
        for p in self.tmpfs.drain(..) {
            let _ = net::run("umount", &["-l", &p.to_string_lossy()]);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.teardown();
        if std::env::var_os("STOA_FAULT_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Makes `cmd` run in the network namespace open at `ns`, in its own process group, and
/// die with the thread that spawns it.
fn enter_netns(cmd: &mut Command, ns: &File) {
    let fd = ns.as_raw_fd();
    // SAFETY: only async-signal-safe calls between fork and exec; `ns` outlives spawn().
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::setpgid(0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

fn stop_child(n: &mut Node) {
    let Some(mut c) = n.child.take() else { return };
    // SAFETY: plain kill(2) of our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + STOP_TIMEOUT;
    while c.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            save_stacks(&n.name, c.id(), &n.log.with_extension("stacks"));
            let _ = c.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.wait();
}

/// Writes every thread's stack of `pid`, a node that ignored SIGTERM (a hung runtime, a
/// deadlock), to `path` with gdb, so that the hang can be read after the run; says where
/// on stderr. Without gdb (scripts/deps.sh installs it) it says so instead.
fn save_stacks(name: &str, pid: u32, path: &Path) {
    let out = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx", "-ex", "thread apply all bt"])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) => {
            let mut text = out.stdout;
            text.extend_from_slice(&out.stderr);
            match std::fs::write(path, text) {
                Ok(()) => eprintln!(
                    "stoa-fault: {name} ignored SIGTERM for {} s; its thread stacks are in {}",
                    STOP_TIMEOUT.as_secs(),
                    path.display()
                ),
                Err(e) => eprintln!("stoa-fault: writing {}: {e}", path.display()),
            }
        }
        Err(e) => eprintln!(
            "stoa-fault: {name} ignored SIGTERM for {} s; no stacks taken (gdb: {e})",
            STOP_TIMEOUT.as_secs()
        ),
    }
}

/// Whether `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    mount_device(path).is_some()
}

/// The device (`major:minor`) mounted at `path`, from `/proc/self/mountinfo`: reading it
/// never touches the mount, so it does not block on one that no longer answers.
fn mount_device(path: &Path) -> Option<String> {
    let want = path.to_string_lossy().to_string();
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounts.lines().find_map(|l| {
        let fields: Vec<&str> = l.split(' ').collect();
        (fields.get(4) == Some(&want.as_str())).then(|| fields[2].to_string())
    })
}

/// Where the kernel lists FUSE connections (fusectl).
const FUSECTL: &str = "/sys/fs/fuse/connections";

/// Aborts the FUSE connection of the mount at `path`: every request waiting on it fails
/// at once. Killing a FUSE daemon does not free threads stuck on its mount when one of
/// its own threads is stuck in the kernel too (an invalidation waiting for a request
/// only it could answer); an abort does. Returns whether it aborted.
fn abort_fuse(path: &Path) -> bool {
    let Some(minor) = mount_device(path).and_then(|d| d.split(':').nth(1).map(str::to_string))
    else {
        return false;
    };
    let conn = Path::new(FUSECTL).join(&minor);
    if !conn.exists() {
        let _ = net::run("mount", &["-t", "fusectl", "none", FUSECTL]);
    }
    std::fs::write(conn.join("abort"), b"1").is_ok()
}

/// Polls `check` every 200 ms until it holds or `within` passes.
pub fn eventually(within: Duration, what: &str, mut check: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + within;
    while !check() {
        if Instant::now() > deadline {
            return Err(FaultError::Timeout { secs: within.as_secs(), what: what.to_string() });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mounts_are_found_by_their_mount_point_only() {
        let root = mount_device(Path::new("/")).expect("/ is a mount");
        assert!(root.split(':').all(|n| n.parse::<u32>().is_ok()), "device {root}");
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(mount_device(dir.path()), None);
        assert!(!abort_fuse(dir.path()), "nothing to abort where nothing is mounted");
    }
}
