//! The meta service under failure and membership change, through a real mount: metadata
//! operations resume after kill -9 of the leader (the longest gap is printed, not
//! asserted), and replicas are added and removed online while a client works.

mod common;

use common::{eventually, Dev, STOA};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a metadata worker saw: operations completed and the longest gap between two.
struct Worked {
    ops: u64,
    gap_max: Duration,
}

/// Creates, stats and unlinks files in `dir` until told to stop. Any failed operation
/// fails the test: an application must never see a failover.
fn spawn_worker(dir: PathBuf, stop: Arc<AtomicBool>) -> JoinHandle<Worked> {
    std::fs::create_dir_all(&dir).unwrap();
    std::thread::spawn(move || {
        let (mut ops, mut gap_max) = (0u64, Duration::ZERO);
        let mut last = Instant::now();
        let mut done = |ops: &mut u64| {
            gap_max = gap_max.max(last.elapsed());
            last = Instant::now();
            *ops += 1;
        };
        let mut i = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let path = dir.join(format!("f{i}"));
            std::fs::write(&path, b"x").unwrap_or_else(|e| panic!("create {path:?}: {e}"));
            done(&mut ops);
            std::fs::metadata(&path).unwrap_or_else(|e| panic!("stat {path:?}: {e}"));
            done(&mut ops);
            if i.is_multiple_of(2) {
                std::fs::remove_file(&path).unwrap_or_else(|e| panic!("unlink {path:?}: {e}"));
                done(&mut ops);
            }
            i += 1;
        }
        Worked { ops, gap_max }
    })
}

#[test]
fn metadata_operations_resume_after_the_leader_is_killed() {
    let mut dev = Dev::start(3, 1);
    dev.wait_healthy(30);
    for round in 0..2 {
        let leader = dev.leader();
        let stop = Arc::new(AtomicBool::new(false));
        let worker = spawn_worker(dev.mnt.join(format!("round{round}")), stop.clone());
        std::thread::sleep(Duration::from_millis(1500));
        let killed_at = Instant::now();
        dev.kill9("meta", leader);
        std::thread::sleep(Duration::from_secs(4));
        stop.store(true, Ordering::Relaxed);
        let worked = worker.join().expect("metadata worker failed");
        println!(
            "round {round}: kill -9 of meta leader {leader}: longest gap between completed \
             metadata operations {} ms ({} operations in {:.1} s)",
            worked.gap_max.as_millis(),
            worked.ops,
            killed_at.elapsed().as_secs_f64() + 1.5
        );
        assert!(worked.ops > 0);
        dev.restart_node("meta", leader);
        dev.wait_healthy(30);
    }
    dev.stop();
}

/// A meta replica process this test started itself; killed when dropped.
struct Extra(Child);

impl Drop for Extra {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

fn admin(dir: &Path, args: &[&str]) {
    let out = Command::new(STOA)
        .args(["admin", "meta"])
        .args(args)
        .arg("--dir")
        .arg(dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stoa admin meta {args:?} failed: {text}");
}

fn voters(dev: &Dev) -> Vec<u64> {
    let status = dev.status();
    let members = status["meta"]["members"].as_array().unwrap().clone();
    members.iter().filter(|m| m["voter"] == true).map(|m| m["id"].as_u64().unwrap()).collect()
}

#[test]
fn a_meta_replica_is_added_and_another_removed_while_a_client_works() {
    let mut dev = Dev::start(3, 1);
    dev.wait_healthy(30);
    let stop = Arc::new(AtomicBool::new(false));
    let worker = spawn_worker(dev.mnt.join("busy"), stop.clone());
    let addr = free_addr();
    let data = dev.dir.join("../meta-4");
    let log = std::fs::File::create(dev.dir.join("../meta-4.log")).unwrap();
    let _extra = Extra(
        Command::new(STOA)
            .args(["meta", "--id", "4", "--listen", &addr, "--peers", &format!("4={addr}")])
            .arg("--data")
            .arg(&data)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    admin(&dev.dir, &["add", "--id", "4", "--addr", &addr]);
    eventually(20, "replica 4 is a voter", || voters(&dev) == vec![1, 2, 3, 4]);
    // Remove one that is not the leader, so that the client keeps its replica choice
    // honest: the mount still lists replica 2 and must fail over from it.
    let leader = dev.leader();
    let gone = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    admin(&dev.dir, &["remove", "--id", &gone.to_string()]);
    eventually(20, "the removed replica is gone", || !voters(&dev).contains(&gone));
    dev.kill9("meta", gone);
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let worked = worker.join().expect("metadata worker failed");
    assert!(worked.ops > 0);
    println!(
        "membership change under load: {} operations, longest gap {} ms",
        worked.ops,
        worked.gap_max.as_millis()
    );
    dev.stop();
}
