//! One fault run: start the cluster, then for each scenario start the workloads, inject
//! the fault, heal, stop the workloads, read every register and directory once more from
//! every mount, check the history and the invariants, and add it all to the summary.

use crate::checker::{self, Directory, Register, Verdict};
use crate::cluster::{Cluster, ClusterConfig, Role};
use crate::error::Result;
use crate::history::{Call, History, Outcome, Record, Ret};
use crate::rng::Rng;
use crate::scenario::{self, Scenario};
use crate::workload::{self, Workloads};
use std::fmt::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct RunConfig {
    pub cluster: ClusterConfig,
    pub seed: u64,
    pub scenarios: Vec<Scenario>,
    /// Register clients per mount.
    pub clients_per_mount: usize,
}

/// What one scenario showed.
#[derive(Debug)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    pub ops_checked: usize,
    pub keys: usize,
    pub faults: usize,
    pub anomalies: Vec<String>,
    pub notes: Vec<String>,
    /// The longest time one client operation took while the fault was on (or in the
    /// settle time after it).
    pub stall: Duration,
    /// The operation that stalled longest.
    pub stall_op: String,
    /// From the heal until every node was up and every chain whole again.
    pub recovery: Duration,
    pub elapsed: Duration,
}

#[derive(Debug)]
pub struct Summary {
    pub seed: u64,
    pub results: Vec<ScenarioResult>,
    pub elapsed: Duration,
}

/// How long the workloads run before and after a fault.
const WARMUP: Duration = Duration::from_secs(3);
const SETTLE: Duration = Duration::from_secs(3);
/// Generous: on a loaded 2-core machine a client retries for up to 30 s.
const STOP_CLIENTS_WITHIN: Duration = Duration::from_secs(90);
const RECOVER_WITHIN: Duration = Duration::from_secs(120);

/// The cluster every run uses: 3 meta replicas, 4 chunk servers (chains of 3), 2 mounts.
pub fn default_cluster(stoa: PathBuf) -> ClusterConfig {
    ClusterConfig { stoa, meta: 3, chunk: 4, clients: 2, chunk_disk_mib: 384 }
}

/// The short run: every scenario once, shuffled. The long run: every scenario twice,
/// shuffled (a scenario then also runs after the others' faults, on a cluster that has
/// been through them).
pub fn pick(seed: u64, long: bool) -> Vec<Scenario> {
    let mut rng = Rng::new(seed);
    let times = if long { 2 } else { 1 };
    let mut pool: Vec<Scenario> =
        scenario::ALL.iter().cycle().take(times * scenario::ALL.len()).copied().collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.below(i as u64 + 1) as usize);
    }
    pool
}

pub fn run(cfg: &RunConfig) -> Result<Summary> {
    let started = Instant::now();
    let mut cluster = Cluster::start(&cfg.cluster, 0)?;
    let mut rng = Rng::new(cfg.seed);
    let mut results = Vec::new();
    for (i, s) in cfg.scenarios.iter().enumerate() {
        eprintln!("stoa-fault: [{}/{}] {}", i + 1, cfg.scenarios.len(), s.name());
        let r = run_scenario(&mut cluster, *s, i, &mut rng, cfg.clients_per_mount)?;
        eprintln!(
            "stoa-fault:   {} ops, {} faults, {} anomalies, stall {:.2} s, recovery {:.2} s",
            r.ops_checked,
            r.faults,
            r.anomalies.len(),
            r.stall.as_secs_f64(),
            r.recovery.as_secs_f64()
        );
        eprintln!("stoa-fault:   longest stall: {}", r.stall_op);
        for a in &r.anomalies {
            eprintln!("stoa-fault:   ANOMALY {a}");
        }
        results.push(r);
    }
    drop(cluster);
    Ok(Summary { seed: cfg.seed, results, elapsed: started.elapsed() })
}

fn run_scenario(
    cluster: &mut Cluster,
    s: Scenario,
    index: usize,
    rng: &mut Rng,
    per_mount: usize,
) -> Result<ScenarioResult> {
    let started = Instant::now();
    cluster.wait_healthy(RECOVER_WITHIN)?;
    let mounts: Vec<PathBuf> =
        cluster.names(Role::Client).iter().map(|n| cluster.mount_point(n)).collect();
    let dir = format!("s{index}-{}", s.name());
    workload::setup(&mounts[0], &dir)
        .map_err(|e| crate::FaultError::io("set up", mounts[0].join(&dir), e))?;
    let history = History::new();
    let seed = rng.next();
    let work = Workloads::start(&history, &mounts, &dir, seed, per_mount);
    let clients_on = work.clients_on.clone();
    std::thread::sleep(WARMUP);
    let mut cx = scenario::Ctx { cluster, history: &history, rng, dir: dir.clone(), clients_on };
    let injected = scenario::inject(s, &mut cx)?;
    let healed = Instant::now();
    std::thread::sleep(SETTLE);
    let acked = work.acked.clone();
    let stuck = work.stop(STOP_CLIENTS_WITHIN);
    let mut anomalies = injected.anomalies;
    if stuck > 0 {
        // They may wait in the kernel for good; the run must still end (and clean up).
        let aborted = cluster.abort_mounts();
        anomalies.push(format!(
            "{stuck} clients still stuck {} s after the workload stopped (aborted {aborted} \
             FUSE connections to free them)",
            STOP_CLIENTS_WITHIN.as_secs()
        ));
    }
    let recovery = match cluster.wait_healthy(RECOVER_WITHIN) {
        Ok(_) => healed.elapsed(),
        Err(e) => {
            anomalies.push(format!("replicas not restored: {e}"));
            RECOVER_WITHIN
        }
    };
    final_reads(&history, &mounts, &dir);
    let acked = acked.lock().expect("acked lock poisoned").clone();
    for bad in workload::verify_files(&mounts[mounts.len() - 1], &acked) {
        anomalies.push(format!("fsynced file damaged: {bad}"));
    }
    let mut records = history.records();
    let mut notes = injected.notes;
    if let Some(f) = &injected.fenced {
        anomalies.extend(scenario::late_writes(&records, f, injected.end_ns));
        let waited = scenario::writes_in_new_session(&records, f, injected.end_ns);
        notes.push(format!(
            "{waited} writes invoked while cut off opened their file only after the heal, in the new session"
        ));
        let excused = scenario::excuse_unsynced_views(&mut records, f, injected.end_ns);
        notes.push(format!(
            "{excused} reads of the cut-off mount's own unsynced namespace changes not checked"
        ));
    }
    let (ops_checked, keys) = check_history(&records, &mut anomalies);
    let (stall, stall_op) =
        longest_stall(&records, injected.start_ns, injected.end_ns + SETTLE.as_nanos() as u64);
    for (key, recs) in checker::by_key(&records) {
        dump_history(key, &recs);
    }
    // The next scenario runs on the same small disks: what this one wrote goes (the
    // garbage collector frees it on every replica).
    if let Err(e) = std::fs::remove_dir_all(mounts[0].join(&dir)) {
        eprintln!("stoa-fault:   removing {dir} after its checks: {e}");
    }
    Ok(ScenarioResult {
        scenario: s,
        ops_checked,
        keys,
        faults: injected.faults,
        anomalies,
        notes,
        stall,
        stall_op,
        recovery,
        elapsed: started.elapsed(),
    })
}

/// Reads every register and lists every directory from every mount, once the cluster
/// is whole: these reads come after every write, so a lost acknowledged write or a value
/// nobody wrote shows up in the check.
fn final_reads(history: &History, mounts: &[PathBuf], dir: &str) {
    let base_client = 1000;
    for (m, mount) in mounts.iter().enumerate() {
        for k in 0..workload::REGISTERS {
            let path = workload::register_path(mount, dir, k);
            history.record(base_client + m, &format!("reg/{dir}/{k}"), Call::Read, |_, _| {
                match std::fs::read(&path) {
                    Ok(b) => (Outcome::Ok, Ok(workload::decode(&b))),
                    Err(e) => (Outcome::Ok, Ok(Ret::Garbage(format!("unreadable: {e}")))),
                }
            });
        }
        for d in 0..workload::DIRS {
            let base = mount.join(dir).join(format!("dir-{d}"));
            history.record(base_client + m, &format!("dir/{dir}/{d}"), Call::List, |_, _| {
                match std::fs::read_dir(&base).and_then(|it| {
                    it.map(|e| e.map(|e| e.file_name())).collect::<std::io::Result<Vec<_>>>()
                }) {
                    Ok(names) => (Outcome::Ok, Ok(Ret::Listing(mask(&names)))),
                    Err(e) => (Outcome::Ok, Ok(Ret::Garbage(format!("unlistable: {e}")))),
                }
            });
        }
    }
}

fn mask(names: &[std::ffi::OsString]) -> u8 {
    let mut m = 0u8;
    for n in names {
        match n.to_string_lossy().strip_prefix('n').and_then(|n| n.parse::<u8>().ok()) {
            Some(i) if i < workload::NAMES => m |= 1 << i,
            _ => return u8::MAX,
        }
    }
    m
}

/// Checks each register and directory; returns the operations checked and the keys.
fn check_history(records: &[Record], anomalies: &mut Vec<String>) -> (usize, usize) {
    let (mut ops, mut keys) = (0, 0);
    for (key, recs) in checker::by_key(records) {
        let verdict = if key.starts_with("reg/") {
            for r in recs.iter().filter(|r| matches!(r.ret, Some(Ret::Garbage(_)))) {
                anomalies.push(format!(
                    "{key}: client {} read data never written: {:?}",
                    r.client, r.ret
                ));
            }
            checker::check(&Register, &checker::prune_unread_writes(&recs))
        } else if key.starts_with("dir/") {
            checker::check(&Directory, &recs)
        } else {
            continue;
        };
        keys += 1;
        ops += recs.iter().filter(|r| r.outcome != Outcome::Fail).count();
        match verdict {
            Verdict::Linearizable => {}
            Verdict::Violation(why) => {
                let dump = dump_history(key, &recs);
                anomalies.push(format!("{key} is not linearizable: {why} (history: {dump})"));
            }
            Verdict::Undecided => {
                anomalies.push(format!("{key}: the checker gave up (search budget)"))
            }
        }
    }
    (ops, keys)
}

/// Where a run writes every key's history, for the person who reads its anomalies.
pub fn histories_dir() -> PathBuf {
    std::env::temp_dir().join("stoa-fault-histories")
}

/// Writes one key's records, in invocation order, to a file in [`histories_dir`];
/// returns its path.
fn dump_history(key: &str, recs: &[&Record]) -> String {
    let dir = histories_dir();
    let path = dir.join(format!("{}.txt", key.replace('/', "_")));
    let mut sorted = recs.to_vec();
    sorted.sort_by_key(|r| r.invoke_ns);
    let mut text = String::new();
    for r in sorted {
        let done = if r.complete_ns == u64::MAX {
            "?".to_string()
        } else {
            format!("{:.4}", r.complete_ns as f64 / 1e9)
        };
        let _ = writeln!(
            text,
            "{:>9.4} {:>9} client {:<4} {:?} -> {:?} {:?} {}",
            r.invoke_ns as f64 / 1e9,
            done,
            r.client,
            r.call,
            r.ret,
            r.outcome,
            r.error.as_deref().unwrap_or("")
        );
    }
    let _ = std::fs::create_dir_all(&dir).and_then(|_| std::fs::write(&path, text));
    path.display().to_string()
}

/// The longest operation that overlapped `[from_ns, to_ns]`; one that never completed
/// counts until now.
fn longest_stall(records: &[Record], from_ns: u64, to_ns: u64) -> (Duration, String) {
    let now = records.iter().map(|r| r.invoke_ns).max().unwrap_or(0);
    let worst = records
        .iter()
        .filter(|r| r.invoke_ns <= to_ns && (r.complete_ns == u64::MAX || r.complete_ns >= from_ns))
        .map(|r| (r.complete_ns.min(now.max(r.invoke_ns)).saturating_sub(r.invoke_ns), r))
        .max_by_key(|(ns, _)| *ns);
    match worst {
        Some((ns, r)) => {
            let what = format!(
                "client {} {} {:?} at {:.2} s: {:?} {}",
                r.client,
                r.key,
                r.call,
                r.invoke_ns as f64 / 1e9,
                r.outcome,
                r.error.as_deref().unwrap_or("")
            );
            (Duration::from_nanos(ns), what)
        }
        None => (Duration::ZERO, String::new()),
    }
}

impl Summary {
    /// Anomalies found: must be 0.
    pub fn anomalies(&self) -> usize {
        self.results.iter().map(|r| r.anomalies.len()).sum()
    }

    /// The longest stall per fault kind (scenario), over every time it ran.
    pub fn stalls(&self) -> Vec<(&'static str, Duration)> {
        let mut out: Vec<(&'static str, Duration)> = Vec::new();
        for r in &self.results {
            match out.iter_mut().find(|(n, _)| *n == r.scenario.name()) {
                Some((_, d)) => *d = (*d).max(r.stall),
                None => out.push((r.scenario.name(), r.stall)),
            }
        }
        out
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\nstoa-fault summary (seed {}, {:.0} s)",
            self.seed,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "  {:<22} {:>7} {:>5} {:>7} {:>10} {:>9} {:>9}",
            "SCENARIO", "OPS", "KEYS", "FAULTS", "ANOMALIES", "STALL", "RECOVERY"
        );
        for r in &self.results {
            let _ = writeln!(
                out,
                "  {:<22} {:>7} {:>5} {:>7} {:>10} {:>8.2}s {:>8.2}s",
                r.scenario.name(),
                r.ops_checked,
                r.keys,
                r.faults,
                r.anomalies.len(),
                r.stall.as_secs_f64(),
                r.recovery.as_secs_f64()
            );
        }
        let ops: usize = self.results.iter().map(|r| r.ops_checked).sum();
        let faults: usize = self.results.iter().map(|r| r.faults).sum();
        let _ = writeln!(
            out,
            "  total: {ops} operations checked, {faults} faults injected, {} anomalies",
            self.anomalies()
        );
        let stalls: Vec<String> =
            self.stalls().iter().map(|(n, d)| format!("{n} {:.2} s", d.as_secs_f64())).collect();
        let _ = writeln!(out, "  longest I/O stall per fault: {}", stalls.join(", "));
        for r in &self.results {
            for n in &r.notes {
                let _ = writeln!(out, "  {}: {n}", r.scenario.name());
            }
            for a in &r.anomalies {
                let _ = writeln!(out, "  {}: ANOMALY {a}", r.scenario.name());
            }
        }
        out
    }
}
