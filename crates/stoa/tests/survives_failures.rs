//! The whole product under failure: a real source tree and a running writer survive
//! kill -9 of the meta leader, kill -9 of a chunk server, and a full restart, byte for
//! byte. Prints the longest I/O stall each failure caused.

mod common;

use common::{compare_trees, pattern, sh, Dev};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const RECORD_BYTES: usize = 64 * 1024;
const WRITER_SEED: u64 = 0x5704;

/// Appends records to `path` until told to stop; returns the bytes written and the
/// longest time one write (or fsync) took.
fn spawn_writer(path: PathBuf, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(u64, Duration)> {
    std::thread::spawn(move || {
        let mut f = std::fs::File::create(&path).unwrap();
        let (mut written, mut worst) = (0u64, Duration::ZERO);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            f.write_all(&pattern(WRITER_SEED, written, RECORD_BYTES))
                .unwrap_or_else(|e| panic!("write at {written} failed: {e}"));
            written += RECORD_BYTES as u64;
            n += 1;
            if n.is_multiple_of(16) {
                f.sync_all().unwrap_or_else(|e| panic!("fsync at {written} failed: {e}"));
            }
            worst = worst.max(started.elapsed());
        }
        f.sync_all().unwrap();
        (written, worst)
    })
}

fn check_writer_file(path: &Path, written: u64) {
    let data = std::fs::read(path).unwrap();
    assert_eq!(data.len() as u64, written, "writer file has the wrong size");
    for (i, chunk) in data.chunks(RECORD_BYTES).enumerate() {
        let at = (i * RECORD_BYTES) as u64;
        assert!(chunk == pattern(WRITER_SEED, at, chunk.len()), "writer data differs at {at}");
    }
}

/// Runs the writer while `fault` happens, and checks every byte afterwards.
fn write_through(dev: &mut Dev, name: &str, fault: impl FnOnce(&mut Dev)) -> Duration {
    let path = dev.mnt.join(name);
    let stop = Arc::new(AtomicBool::new(false));
    let writer = spawn_writer(path.clone(), stop.clone());
    std::thread::sleep(Duration::from_secs(1));
    fault(dev);
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let (written, worst) = writer.join().expect("writer failed");
    check_writer_file(&path, written);
    worst
}

#[test]
fn a_source_tree_and_a_writer_survive_node_kills_and_a_full_restart() {
    let mut dev = Dev::start(3, 3);
    // The system's C headers: thousands of real source files (the largest trees some
    // machines carry are left out, so the test costs the same everywhere).
    let scratch = dev.dir.join("..");
    let (tar, reference) = (scratch.join("include.tar"), scratch.join("reference"));
    sh(&format!(
        "tar cf {} -C /usr --exclude=include/boost --exclude=include/node \
         --exclude='include/llvm*' include && mkdir {1} && tar xf {0} -C {1}",
        tar.display(),
        reference.display()
    ));
    sh(&format!("tar xf {} -C {}", tar.display(), dev.mnt.display()));
    let reference = reference.join("include");
    let entries = compare_trees(&reference, &dev.mnt.join("include"));
    assert!(entries > 1000, "only {entries} entries compared");

    let leader_stall = write_through(&mut dev, "during-leader-kill", |dev| {
        let leader = dev.leader();
        dev.kill9("meta", leader);
        std::thread::sleep(Duration::from_secs(2));
        dev.restart_node("meta", leader);
    });
    let chunk_stall = write_through(&mut dev, "during-chunk-kill", |dev| {
        dev.kill9("chunk", 2);
        std::thread::sleep(Duration::from_secs(3));
        dev.restart_node("chunk", 2);
    });
    println!(
        "longest write stall: {:.2} s after kill -9 of the meta leader, {:.2} s after kill -9 \
         of a chunk server",
        leader_stall.as_secs_f64(),
        chunk_stall.as_secs_f64()
    );
    dev.wait_healthy(60);

    dev.stop();
    dev.launch();
    compare_trees(&reference, &dev.mnt.join("include"));
    let size = |n: &str| std::fs::metadata(dev.mnt.join(n)).unwrap().len();
    check_writer_file(&dev.mnt.join("during-leader-kill"), size("during-leader-kill"));
    check_writer_file(&dev.mnt.join("during-chunk-kill"), size("during-chunk-kill"));
    dev.stop();
}
