//! A `stoa dev` cluster for end-to-end tests: real processes on loopback, mounted with
//! FUSE in a temporary directory. Every process a test starts is stopped when the
//! [`Dev`] is dropped, even when the test fails.
#![allow(dead_code)] // Each test binary uses its own part of this harness.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const STOA: &str = env!("CARGO_BIN_EXE_stoa");

/// Fails the test early, with a reason, when it cannot mount.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "end-to-end tests mount FUSE and must run as root");
    assert!(Path::new("/dev/fuse").exists(), "/dev/fuse is missing: install fuse3");
}

/// Whether `path` is a mount point right now.
pub fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// `statvfs(3)` of the filesystem holding `path`.
pub fn statvfs(path: &Path) -> libc::statvfs {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs(3) fills the zeroed struct it is given; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    st
}

/// Polls `check` until it holds or `secs` pass.
pub fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !check() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub struct Dev {
    pub dir: PathBuf,
    pub mnt: PathBuf,
    tmp: Option<tempfile::TempDir>,
    dev: Option<Child>,
    /// Nodes this test restarted itself (dev does not know them).
    restarted: Vec<Child>,
    meta: usize,
    chunk: usize,
    /// More `stoa dev` flags, passed on every launch.
    extra: Vec<String>,
}

impl Dev {
    /// Starts `stoa dev` with `meta` replicas and `chunk` servers in a new directory.
    pub fn start(meta: usize, chunk: usize) -> Dev {
        Dev::start_with(meta, chunk, &[])
    }

    /// Starts `stoa dev` with more flags (`--rebuild-after-secs=2`, ...).
    pub fn start_with(meta: usize, chunk: usize, extra: &[&str]) -> Dev {
        require_root();
        let tmp = tempfile::Builder::new().prefix("stoa-e2e-").tempdir().unwrap();
        let dir = tmp.path().join("cluster");
        let mnt = tmp.path().join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut dev =
            Dev { dir, mnt, tmp: Some(tmp), dev: None, restarted: vec![], meta, chunk, extra };
        dev.launch();
        dev
    }

    /// Starts `stoa dev` again on the same directory, after [`Dev::stop`].
    pub fn launch(&mut self) {
        std::fs::create_dir_all(&self.dir).unwrap();
        let log = std::fs::File::create(self.dir.join("../dev.log")).unwrap();
        let child = Command::new(STOA)
            .arg("dev")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--mount")
            .arg(&self.mnt)
            .arg(format!("--meta={}", self.meta))
            .arg(format!("--chunk={}", self.chunk))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.dev = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !is_mounted(&self.mnt) {
            if let Some(status) = self.dev.as_mut().unwrap().try_wait().unwrap() {
                panic!("stoa dev exited ({status}):\n{}", self.dev_log());
            }
            assert!(Instant::now() < deadline, "not mounted after 120 s:\n{}", self.dev_log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn dev_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("../dev.log")).unwrap_or_default()
    }

    /// Kills `stoa dev` with SIGKILL and waits for it: its nodes stop with it (their
    /// parent-death signal), its mount stays behind, dead.
    pub fn crash(&mut self) {
        let mut dev = self.dev.take().expect("stoa dev is not running");
        dev.kill().unwrap();
        dev.wait().unwrap();
    }

    /// Stops `stoa dev` with SIGTERM, as Ctrl-C would, and waits for it.
    pub fn stop(&mut self) {
        for mut c in self.restarted.drain(..) {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
        if let Some(mut dev) = self.dev.take() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(dev.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while dev.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = dev.kill();
                    let _ = dev.wait();
                    panic!("stoa dev did not stop within 60 s:\n{}", self.dev_log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        assert!(!is_mounted(&self.mnt), "still mounted after stoa dev stopped");
    }

    pub fn cluster_file(&self) -> Value {
        let text = std::fs::read_to_string(self.dir.join("cluster.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    /// `stoa status --dir DIR --json`.
    pub fn status(&self) -> Value {
        let out =
            Command::new(STOA).args(["status", "--json", "--dir"]).arg(&self.dir).output().unwrap();
        assert!(out.status.success(), "status failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The cluster.json entry of node `id` with `role`.
    pub fn node(&self, role: &str, id: u64) -> Value {
        let file = self.cluster_file();
        file["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["role"] == role && n["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("no {role} {id} in cluster.json"))
    }

    /// The id of the meta leader, waiting for one.
    pub fn leader(&self) -> u64 {
        let mut leader = None;
        eventually(30, "meta has a leader", || {
            leader = self.status()["meta"]["leader"].as_u64();
            leader.is_some()
        });
        leader.unwrap()
    }

    /// kill -9 of a node started by `stoa dev`.
    pub fn kill9(&self, role: &str, id: u64) {
        let pid = self.node(role, id)["pid"].as_i64().unwrap();
        // SAFETY: plain kill(2).
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0, "kill {role} {id}");
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to a node started by `stoa dev`.
    pub fn signal(&self, role: &str, id: u64, signal: i32) {
        let pid = self.node(role, id)["pid"].as_i64().unwrap();
        // SAFETY: plain kill(2).
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "signal {role} {id}");
    }

    /// Starts a killed node again with its command line from cluster.json.
    pub fn restart_node(&mut self, role: &str, id: u64) {
        let node = self.node(role, id);
        let cmd: Vec<String> =
            node["cmd"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().into()).collect();
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(node["log"].as_str().unwrap())
            .unwrap();
        let child = Command::new(&cmd[0])
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.restarted.push(child);
    }

    /// Waits until every meta replica and chunk server is up and no chain is short.
    pub fn wait_healthy(&self, secs: u64) {
        eventually(secs, "every node is up and every chain whole", || {
            let s = self.status();
            let metas = s["meta"]["members"].as_array().unwrap();
            let chunks = s["chunk"].as_array().unwrap();
            let chains = s["chains"].as_array().unwrap();
            let want = self.chunk.min(3);
            metas.iter().all(|m| m["up"] == true)
                && chunks.iter().all(|c| c["up"] == true)
                && chains.iter().all(|c| c["members"].as_array().unwrap().len() == want)
        });
    }
}

impl Dev {
    /// Prints the warnings and errors of every log of this cluster, so that a failure in
    /// CI can be understood from its output alone.
    fn dump_logs(&self) {
        let mut logs = vec![self.dir.join("../dev.log")];
        if let Ok(entries) = std::fs::read_dir(self.dir.join("logs")) {
            logs.extend(entries.flatten().map(|e| e.path()));
        }
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> =
                text.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
            eprintln!("==== {} ({} warnings and errors, last 40)", log.display(), lines.len());
            for line in &lines[lines.len().saturating_sub(40)..] {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump_logs();
        }
        for c in self.restarted.iter_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(dev) = self.dev.as_mut() {
            // SAFETY: plain kill(2) of our own child.
            unsafe { libc::kill(dev.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            while dev.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = dev.kill();
            let _ = dev.wait();
        }
        if is_mounted(&self.mnt) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.mnt).status();
        }
        if std::thread::panicking() && std::env::var_os("STOA_E2E_KEEP").is_some() {
            if let Some(tmp) = self.tmp.take() {
                eprintln!("STOA_E2E_KEEP: logs kept in {}", tmp.keep().display());
            }
        }
    }
}

/// Deterministic file contents: the byte at `offset` of the stream named `seed`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut word = offset / 8;
    let mut skip = (offset % 8) as usize;
    while out.len() < len {
        let mut x = seed ^ word.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        let bytes = x.to_le_bytes();
        let take = (8 - skip).min(len - out.len());
        out.extend_from_slice(&bytes[skip..skip + take]);
        skip = 0;
        word += 1;
    }
    out
}

/// Waits for every child to exit successfully within `secs` seconds in all; on a
/// timeout kills the ones left and fails the test, so a hang costs minutes, not the run.
pub fn wait_all_within(children: Vec<Child>, secs: u64, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut left = children;
    let mut failed = 0;
    while !left.is_empty() {
        let mut running = Vec::new();
        for mut c in left {
            match c.try_wait().unwrap() {
                Some(status) => failed += usize::from(!status.success()),
                None => running.push(c),
            }
        }
        left = running;
        if !left.is_empty() && Instant::now() > deadline {
            let stuck = left.len();
            // Not waited for: a process stuck in a FUSE request the mount never answers
            // does not die of SIGKILL; it goes when the test's cluster stops and the
            // kernel aborts the connection.
            for mut c in left {
                let _ = c.kill();
            }
            panic!("{what}: {stuck} process(es) still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(failed, 0, "{what}: {failed} process(es) failed");
}

/// Runs a shell command, failing the test with its output if it fails.
pub fn sh(script: &str) -> String {
    let out = Command::new("bash").arg("-c").arg(script).output().unwrap();
    assert!(
        out.status.success(),
        "`{script}` failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Compares two trees: same names, same kinds, same bytes, same symlink targets.
/// Returns how many entries were compared.
pub fn compare_trees(want: &Path, got: &Path) -> usize {
    let mut count = 0;
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let (w, g) = (want.join(&rel), got.join(&rel));
        let wm = std::fs::symlink_metadata(&w).unwrap();
        let gm = std::fs::symlink_metadata(&g)
            .unwrap_or_else(|e| panic!("{} missing in the mount: {e}", g.display()));
        count += 1;
        if wm.file_type().is_symlink() {
            assert!(gm.file_type().is_symlink(), "{} is not a symlink", g.display());
            assert_eq!(std::fs::read_link(&w).unwrap(), std::fs::read_link(&g).unwrap());
        } else if wm.is_dir() {
            assert!(gm.is_dir(), "{} is not a directory", g.display());
            let mut names: Vec<_> =
                std::fs::read_dir(&w).unwrap().map(|e| e.unwrap().file_name()).collect();
            let mut got_names: Vec<_> =
                std::fs::read_dir(&g).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            got_names.sort();
            assert_eq!(names, got_names, "listing of {} differs", g.display());
            stack.extend(names.into_iter().map(|n| rel.join(n)));
        } else {
            assert_eq!(wm.len(), gm.len(), "size of {}", g.display());
            let (wb, gb) = (std::fs::read(&w).unwrap(), std::fs::read(&g).unwrap());
            assert_eq!(wb.len(), gb.len(), "bytes read back from {}", g.display());
            if wb != gb {
                let differ: Vec<usize> = (0..wb.len()).filter(|&i| wb[i] != gb[i]).collect();
                let (first, last) = (differ[0], differ[differ.len() - 1]);
                let zeros = gb[first..=last].iter().all(|&b| b == 0);
                panic!(
                    "contents of {} differ: {} of {} bytes, from {first} to {last}; the mount \
                     has {} there; read again: {}",
                    g.display(),
                    differ.len(),
                    wb.len(),
                    if zeros { "zeros" } else { "other bytes" },
                    if std::fs::read(&g).unwrap() == wb { "right" } else { "still wrong" },
                );
            }
        }
    }
    count
}

/// A second client: `stoa mount --dir DIR MNT`, its own session and caches, stopped
/// (SIGTERM, as an operator would) when dropped.
pub struct Mount {
    pub path: PathBuf,
    child: Child,
}

impl Mount {
    pub fn new(dev: &Dev, name: &str) -> Mount {
        Mount::with_args(dev, name, &[])
    }

    /// A mount of `dev`'s cluster at `../name` with `extra` flags for `stoa mount`.
    pub fn with_args(dev: &Dev, name: &str, extra: &[&str]) -> Mount {
        let path = dev.dir.join(format!("../{name}"));
        std::fs::create_dir_all(&path).unwrap();
        let path = path.canonicalize().unwrap();
        let log = std::fs::File::create(dev.dir.join(format!("../{name}.log"))).unwrap();
        let mut child = Command::new(STOA)
            .args(["mount", "--dir"])
            .arg(&dev.dir)
            .args(extra)
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&path) {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("stoa mount exited early ({status})");
            }
            assert!(Instant::now() < deadline, "second mount not up after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        Mount { path, child }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) of our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if is_mounted(&self.path) {
            let _ = Command::new("fusermount3").arg("-uz").arg(&self.path).status();
        }
    }
}
