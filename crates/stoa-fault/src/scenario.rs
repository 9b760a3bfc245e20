//! The faults, one function each. A scenario injects its fault while the workloads run,
//! holds it long enough to cross the timeouts that matter (chunk server DOWN_AFTER 2 s,
//! Raft election 0.4-0.8 s), heals it, and returns what it did and any anomaly only it can
//! see (a minority that served a write, a fenced client whose late write landed).

use crate::cluster::{Cluster, Role};
use crate::error::Result;
use crate::history::{Call, History, Outcome, Record, Ret};
use crate::rng::Rng;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    MetaLeaderKill,
    MetaLeaderPartition,
    MetaLeaderOneWay,
    MetaMinority,
    ChunkKill,
    ChunkPause,
    ChunkPartition,
    DiskFull,
    BitRot,
    RollingRestart,
    ClientFenced,
}

pub const ALL: [Scenario; 11] = [
    Scenario::MetaLeaderKill,
    Scenario::MetaLeaderPartition,
    Scenario::MetaLeaderOneWay,
    Scenario::MetaMinority,
    Scenario::ChunkKill,
    Scenario::ChunkPause,
    Scenario::ChunkPartition,
    Scenario::DiskFull,
    Scenario::BitRot,
    Scenario::RollingRestart,
    Scenario::ClientFenced,
];

/// How long a client session lease lasts (stoa-meta `LEASE_MS`). The fencing scenario
/// holds its partition past it and expects the cut-off client's late writes refused.
pub const LEASE_ASSUMED: Duration = Duration::from_secs(10);
/// How long the fencing scenario cuts a client off: past its lease, with room to spare.
const FENCE_CUT: Duration = Duration::from_secs(15);

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::MetaLeaderKill => "meta-leader-kill",
            Scenario::MetaLeaderPartition => "meta-leader-partition",
            Scenario::MetaLeaderOneWay => "meta-leader-one-way",
            Scenario::MetaMinority => "meta-minority",
            Scenario::ChunkKill => "chunk-kill",
            Scenario::ChunkPause => "chunk-pause",
            Scenario::ChunkPartition => "chunk-partition",
            Scenario::DiskFull => "disk-full",
            Scenario::BitRot => "bit-rot",
            Scenario::RollingRestart => "rolling-restart",
            Scenario::ClientFenced => "client-fenced",
        }
    }

    pub fn parse(name: &str) -> Option<Scenario> {
        ALL.iter().copied().find(|s| s.name() == name)
    }
}

/// What a scenario did.
#[derive(Default, Debug)]
pub struct Injected {
    pub faults: usize,
    pub notes: Vec<String>,
    pub anomalies: Vec<String>,
    /// History time at which the fault began and was healed.
    pub start_ns: u64,
    pub end_ns: u64,
    /// For the fencing scenario: the fenced clients, when they were cut off and when
    /// their lease ran out; the run looks for their late writes once every client has
    /// stopped.
    pub fenced: Option<Fenced>,
}

pub struct Ctx<'a> {
    pub cluster: &'a mut Cluster,
    pub history: &'a History,
    pub rng: &'a mut Rng,
    /// The scenario's directory, relative to a mount.
    pub dir: String,
    /// Client ids per mount, in the order of the cluster's client names.
    pub clients_on: Vec<Vec<usize>>,
}

fn sleep_s(s: f64) {
    std::thread::sleep(Duration::from_secs_f64(s));
}

pub fn inject(s: Scenario, cx: &mut Ctx) -> Result<Injected> {
    let mut out = Injected { start_ns: cx.history.now_ns(), ..Injected::default() };
    match s {
        Scenario::MetaLeaderKill => meta_leader_kill(cx, &mut out)?,
        Scenario::MetaLeaderPartition => meta_leader_partition(cx, &mut out, false)?,
        Scenario::MetaLeaderOneWay => meta_leader_partition(cx, &mut out, true)?,
        Scenario::MetaMinority => meta_minority(cx, &mut out)?,
        Scenario::ChunkKill => chunk_kill(cx, &mut out)?,
        Scenario::ChunkPause => chunk_pause(cx, &mut out)?,
        Scenario::ChunkPartition => chunk_partition(cx, &mut out)?,
        Scenario::DiskFull => disk_full(cx, &mut out)?,
        Scenario::BitRot => bit_rot(cx, &mut out)?,
        Scenario::RollingRestart => rolling_restart(cx, &mut out)?,
        Scenario::ClientFenced => client_fenced(cx, &mut out)?,
    }
    if out.end_ns == 0 {
        out.end_ns = cx.history.now_ns();
    }
    Ok(out)
}

fn meta_leader_kill(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let leader = cx.cluster.leader(Duration::from_secs(30))?;
    let t0 = cx.history.now_ns();
    cx.cluster.kill9(&leader);
    let t1 = cx.history.now_ns();
    out.faults += 1;
    // Down long enough that the others must elect a leader and the clients must find
    // it without the old one coming back.
    sleep_s(8.0);
    cx.cluster.restart(&leader)?;
    let t2 = cx.history.now_ns();
    out.notes.push(format!(
        "kill -9 {leader} (leader) at {:.2} s (dead at {:.2} s), restarted at {:.2} s",
        t0 as f64 / 1e9,
        t1 as f64 / 1e9,
        t2 as f64 / 1e9
    ));
    Ok(())
}

/// Cuts the leader from every other host (or, one way, only its packets to the other
/// meta replicas: it still hears them but cannot lead them).
fn meta_leader_partition(cx: &mut Ctx, out: &mut Injected, one_way: bool) -> Result<()> {
    let leader = cx.cluster.leader(Duration::from_secs(30))?;
    if one_way {
        for m in cx.cluster.names(Role::Meta).iter().filter(|m| **m != leader) {
            cx.cluster.net().cut_one_way(&leader, m)?;
        }
        out.notes.push(format!("{leader} (leader) -> other meta replicas cut one way for 6 s"));
    } else {
        cx.cluster.net().isolate(&leader, &cx.cluster.all_names())?;
        out.notes.push(format!("{leader} (leader) isolated from every host for 6 s"));
    }
    out.faults += 1;
    sleep_s(6.0);
    cx.cluster.net().heal()
}

/// Cuts one follower from the other meta replicas while a probe client that knows only
/// that follower tries to create a file: it must not succeed while cut off.
fn meta_minority(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let leader = cx.cluster.leader(Duration::from_secs(30))?;
    let metas = cx.cluster.names(Role::Meta);
    let follower = metas.iter().find(|m| **m != leader).cloned().unwrap_or_default();
    let probe = cx.cluster.start_probe(&follower)?;
    for m in metas.iter().filter(|m| **m != follower) {
        cx.cluster.net().cut(&follower, m)?;
    }
    out.faults += 1;
    let cut_at = Instant::now();
    let target = probe.join(&cx.dir).join("minority-probe");
    let writer = std::thread::spawn(move || {
        let r = std::fs::OpenOptions::new().write(true).create_new(true).open(&target);
        (Instant::now(), r.map(|_| ()))
    });
    sleep_s(8.0);
    let healed_at = Instant::now();
    cx.cluster.net().heal()?;
    out.end_ns = cx.history.now_ns();
    out.notes.push(format!(
        "{follower} (follower) cut from the other meta replicas for 8 s; probe mount on it"
    ));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !writer.is_finished() && Instant::now() < deadline {
        sleep_s(0.2);
    }
    if writer.is_finished() {
        let Ok((done, result)) = writer.join() else { return Ok(()) };
        let after = done.duration_since(cut_at).as_secs_f64();
        match result {
            Ok(()) if done < healed_at => out.anomalies.push(format!(
                "the minority replica {follower} served a create {after:.2} s into the partition"
            )),
            Ok(()) => out.notes.push(format!(
                "the probe's create waited for the heal and succeeded at {after:.2} s"
            )),
            Err(e) => out.notes.push(format!("the probe's create failed at {after:.2} s: {e}")),
        }
    } else {
        out.notes.push("the probe's create was still stuck 60 s after the heal".into());
    }
    cx.cluster.stop("p1");
    Ok(())
}

/// A chunk server that holds chunks: one that registered after the chains were formed
/// is in no chain, and a fault on it would test nothing.
fn pick_chunk(cx: &mut Ctx) -> String {
    let chunks = cx.cluster.names(Role::Chunk);
    let holders: Vec<String> =
        chunks.iter().filter(|c| !cx.cluster.chunk_files(c).is_empty()).cloned().collect();
    if holders.is_empty() {
        cx.rng.pick(&chunks).clone()
    } else {
        cx.rng.pick(&holders).clone()
    }
}

fn chunk_kill(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let c = pick_chunk(cx);
    cx.cluster.kill9(&c);
    out.faults += 1;
    out.notes.push(format!("kill -9 {c}, restarted after 4 s"));
    sleep_s(4.0);
    cx.cluster.restart(&c)
}

fn chunk_pause(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let c = pick_chunk(cx);
    cx.cluster.signal(&c, libc::SIGSTOP);
    out.faults += 1;
    out.notes.push(format!("SIGSTOP {c} for 5 s (past its 2 s lease), then SIGCONT"));
    sleep_s(5.0);
    cx.cluster.signal(&c, libc::SIGCONT);
    Ok(())
}

fn chunk_partition(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let c = pick_chunk(cx);
    cx.cluster.net().isolate(&c, &cx.cluster.all_names())?;
    out.faults += 1;
    out.notes.push(format!("{c} isolated from every host for 5 s, under writes"));
    sleep_s(5.0);
    cx.cluster.net().heal()
}

fn disk_full(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let c = pick_chunk(cx);
    let filled = cx.cluster.fill_disk(&c)?;
    out.faults += 1;
    out.notes.push(format!("{c}'s data disk filled ({} MiB) for 6 s", filled >> 20));
    sleep_s(6.0);
    cx.cluster.free_disk(&c)
}

/// Flips one byte in each of up to 24 chunk files of one server. Every read must still
/// return what was written: the block checksums catch the damage and the client reads
/// another replica.
fn bit_rot(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let c = pick_chunk(cx);
    let files = cx.cluster.chunk_files(&c);
    let mut flipped = 0;
    for _ in 0..24.min(files.len()) {
        let f = cx.rng.pick(&files).clone();
        if flip_byte(&f, cx.rng).is_ok() {
            flipped += 1;
        }
    }
    out.faults += flipped;
    out.notes.push(format!("flipped a byte in {flipped} of {} chunk files on {c}", files.len()));
    sleep_s(4.0);
    Ok(())
}

/// Flips one bit of a byte the file holds: a chunk file's headers and data, not the
/// holes between them (its unused header space), where a flip would change nothing.
fn flip_byte(path: &PathBuf, rng: &mut Rng) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().read(true).write(true).open(path)?;
    let extents = data_extents(&f)?;
    let held: u64 = extents.iter().map(|(start, end)| end - start).sum();
    if held == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let mut pick = rng.below(held);
    let mut at = 0;
    for (start, end) in extents {
        if pick < end - start {
            at = start + pick;
            break;
        }
        pick -= end - start;
    }
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at)?;
    b[0] ^= 1 << rng.below(8);
    f.write_all_at(&b, at)
}

/// The `[start, end)` ranges of `f` that hold data, between its holes (`SEEK_DATA`).
fn data_extents(f: &std::fs::File) -> std::io::Result<Vec<(u64, u64)>> {
    use std::os::unix::io::AsRawFd;
    let len = f.metadata()?.len();
    let seek = |from: u64, whence: libc::c_int| {
        // SAFETY: lseek only reads the descriptor, which `f` keeps open.
        let at = unsafe { libc::lseek(f.as_raw_fd(), from as libc::off_t, whence) };
        match at {
            -1 if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) => Ok(None),
            -1 => Err(std::io::Error::last_os_error()),
            at => Ok(Some(at as u64)),
        }
    };
    let mut out = Vec::new();
    let mut from = 0;
    while from < len {
        let Some(start) = seek(from, libc::SEEK_DATA)? else { break };
        let end = seek(start, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        if end <= start {
            break;
        }
        out.push((start, end));
        from = end;
    }
    Ok(out)
}

/// Restarts every server, one at a time, waiting for a whole cluster between them. The
/// mounts are not restarted: a restarted mount is a new client, and the workloads on it
/// would only see ENOTCONN.
fn rolling_restart(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let mut order = cx.cluster.names(Role::Chunk);
    order.extend(cx.cluster.names(Role::Meta));
    for n in &order {
        cx.cluster.stop(n);
        out.faults += 1;
        sleep_s(1.0);
        cx.cluster.restart(n)?;
        cx.cluster.wait_healthy(Duration::from_secs(90))?;
    }
    out.notes.push(format!("restarted {} one at a time (SIGTERM, 1 s, start)", order.join(", ")));
    Ok(())
}

#[derive(Debug)]
pub struct Fenced {
    pub clients: Vec<usize>,
    /// When the first link was cut.
    pub cut_ns: u64,
    /// When the last link was cut: a write invoked from then on reached nobody before
    /// the heal.
    pub cut_done_ns: u64,
    pub expiry_ns: u64,
}

/// Cuts the first mount from every server for three leases. A client that cannot renew
/// its lease must stop writing: any write of its clients that was pending when the lease
/// ran out and that still returned success is a late write the cluster should have
/// refused.
fn client_fenced(cx: &mut Ctx, out: &mut Injected) -> Result<()> {
    let client = cx.cluster.names(Role::Client)[0].clone();
    let mut servers = cx.cluster.names(Role::Meta);
    servers.extend(cx.cluster.names(Role::Chunk));
    let cutting_ns = cx.history.now_ns();
    for s in &servers {
        cx.cluster.net().cut(&client, s)?;
    }
    out.faults += 1;
    let cut_ns = cx.history.now_ns();
    let hold = FENCE_CUT;
    std::thread::sleep(hold);
    cx.cluster.net().heal()?;
    out.end_ns = cx.history.now_ns();
    let lasted = (out.end_ns - cutting_ns) as f64 / 1e9;
    out.notes.push(format!("{client} cut from every server for {lasted:.1} s"));
    let expiry_ns = cut_ns + LEASE_ASSUMED.as_nanos() as u64;
    let clients = cx.clients_on[0].clone();
    out.fenced = Some(Fenced { clients, cut_ns: cutting_ns, cut_done_ns: cut_ns, expiry_ns });
    Ok(())
}

/// How long before the cut a change the cut-off mount answered may still be unsent: its
/// batch waits up to 5 ms for more changes and then takes a Raft round.
const UNSENT_BEFORE_CUT: Duration = Duration::from_millis(50);

/// Takes out of the check what the cut-off clients read of their own namespace while
/// they were cut off: a mount answers from its own changes that meta does not have yet
/// (docs/flows/caps.md invariant 18), and a session that expires loses them, as a
/// machine that crashes loses its unsynced directory entries. The changes themselves
/// stay checked: the workload fsyncs the directory after each one and counts a change
/// whose fsync failed as unknown (invariant 25), so a change lost after it returned
/// synced is still an anomaly. Returns how many calls were taken out.
pub fn excuse_unsynced_views(records: &mut [Record], f: &Fenced, heal_ns: u64) -> usize {
    let from = f.cut_ns.saturating_sub(UNSENT_BEFORE_CUT.as_nanos() as u64);
    let mut excused = 0;
    for r in records.iter_mut() {
        let view = r.key.starts_with("dir/") && r.ret.as_ref().is_some_and(|v| *v != Ret::Ok);
        if f.clients.contains(&r.client)
            && view
            && r.outcome == Outcome::Ok
            && (from..=heal_ns).contains(&r.complete_ns)
        {
            r.outcome = Outcome::Fail;
            r.error = Some("a view of the cut-off mount's own unsynced changes".into());
            excused += 1;
        }
    }
    excused
}

/// Writes by the fenced clients invoked while they were cut off from everyone and
/// before their lease expired, through a file they opened before the heal, that yet
/// succeeded after the partition healed: they reached no server before the heal, so a
/// server took them after the lease expired, from a handle of the expired session.
/// (A write invoked while the links were being cut may have landed in time, its answer
/// lost: the check leaves it to the linearizability check. A write whose open returned
/// only after the heal waited for the mount's new session: nothing of the expired one
/// was used, and the linearizability check orders it like any other.)
pub fn late_writes(records: &[Record], f: &Fenced, heal_ns: u64) -> Vec<String> {
    let expiry_ns = f.expiry_ns;
    ok_after_heal(records, f, heal_ns)
        .filter(|r| r.opened_ns.is_some_and(|at| at <= heal_ns))
        .map(|r| {
            format!(
                "late write accepted: client {} {} {:?} invoked {:.2} s, returned ok {:.2} s (lease expired {:.2} s)",
                r.client,
                r.key,
                r.call,
                r.invoke_ns as f64 / 1e9,
                r.complete_ns as f64 / 1e9,
                expiry_ns as f64 / 1e9
            )
        })
        .collect()
}

/// Writes by the fenced clients invoked while they were cut off and that succeeded only
/// after the heal, their open too: they waited for the mount's new session.
pub fn writes_in_new_session(records: &[Record], f: &Fenced, heal_ns: u64) -> usize {
    ok_after_heal(records, f, heal_ns)
        .filter(|r| r.opened_ns.is_some_and(|at| at > heal_ns))
        .count()
}

/// Writes (and compare-and-sets that swapped) by the fenced clients invoked after the
/// last link was cut and before their lease expired that succeeded after the heal.
fn ok_after_heal<'a>(
    records: &'a [Record],
    f: &'a Fenced,
    heal_ns: u64,
) -> impl Iterator<Item = &'a Record> {
    records
        .iter()
        .filter(|r| f.clients.contains(&r.client))
        .filter(|r| match r.call {
            Call::Write(_) => true,
            Call::Cas(..) => r.ret == Some(Ret::Ok),
            _ => false,
        })
        .filter(|r| (f.cut_done_ns..f.expiry_ns).contains(&r.invoke_ns))
        .filter(move |r| r.outcome == Outcome::Ok && r.complete_ns > heal_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(client: usize, invoke_s: f64, complete_s: f64, outcome: Outcome) -> Record {
        let ns = |s: f64| (s * 1e9) as u64;
        Record {
            client,
            key: "reg/x/0".into(),
            call: Call::Write(1),
            ret: None,
            outcome,
            invoke_ns: ns(invoke_s),
            complete_ns: ns(complete_s),
            error: None,
            opened_ns: Some(ns(invoke_s + 0.001)),
        }
    }

    #[test]
    fn only_writes_through_files_opened_while_cut_off_that_succeed_after_the_heal_are_late() {
        let f = Fenced {
            clients: vec![0],
            cut_ns: 3e9 as u64,
            cut_done_ns: 3.1e9 as u64,
            expiry_ns: 13.1e9 as u64,
        };
        let records = [
            write(0, 5.0, 19.0, Outcome::Ok),      // late
            write(0, 3.05, 19.0, Outcome::Ok),     // sent while links were being cut
            write(0, 5.0, 19.0, Outcome::Unknown), // refused or unknown
            write(1, 5.0, 19.0, Outcome::Ok),      // another client
            write(0, 14.0, 19.0, Outcome::Ok),     // invoked after the lease: a new session
            write(0, 5.0, 17.0, Outcome::Ok),      // returned before the heal
            // Its open waited for the new session after the heal.
            Record { opened_ns: Some(18.5e9 as u64), ..write(0, 5.0, 19.0, Outcome::Ok) },
        ];
        let late = late_writes(&records, &f, 18e9 as u64);
        assert_eq!(late.len(), 1, "{late:?}");
        assert_eq!(writes_in_new_session(&records, &f, 18e9 as u64), 1);
        assert!(late[0].contains("invoked 5.00 s"), "{late:?}");
    }
}
