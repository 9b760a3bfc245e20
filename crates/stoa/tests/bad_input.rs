//! Bad input gets a clear one-line error and loses nothing: missing or busy mount point,
//! port in use, bad config, a data directory from another cluster, a corrupted chunk
//! block on disk.

mod common;

use common::{pattern, require_root, sh, Dev, STOA};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Runs `stoa ARGS` expecting failure; returns its last stderr line, which must be the
/// one-line error.
fn fails(args: &[&str]) -> String {
    let out = Command::new(STOA).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "stoa {args:?} succeeded:\n{stderr}");
    let last = stderr.lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("stoa: error: "), "stoa {args:?} ended with {last:?}:\n{stderr}");
    last
}

#[test]
fn bad_commands_fail_with_a_clear_error() {
    require_root();
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p).display().to_string();

    let err = fails(&["mount", "--meta", "127.0.0.1:1", "/nonexistent/stoa-mnt"]);
    assert!(err.contains("/nonexistent/stoa-mnt"), "{err}");

    std::fs::write(t("bad.toml"), "listen = \"127.0.0.1:0\"\nlisen = 1\n").unwrap();
    let err = fails(&["chunk", "--config", &t("bad.toml")]);
    assert!(err.contains("lisen") && err.contains("bad.toml"), "{err}");
    let err = fails(&["chunk", "--config", &t("missing.toml")]);
    assert!(err.contains("missing.toml"), "{err}");
    let slow = format!(
        "listen = \"127.0.0.1:0\"\ndata = \"{}\"\nmeta = \"127.0.0.1:1\"\nsweep_secs = 9999999\n",
        t("c")
    );
    std::fs::write(t("slow.toml"), slow).unwrap();
    let err = fails(&["chunk", "--config", &t("slow.toml")]);
    assert!(err.contains("sweep_secs"), "{err}");
    let err = fails(&[
        "meta",
        "--id",
        "1",
        "--listen",
        "nonsense",
        "--data",
        &t("m"),
        "--peers",
        "1=127.0.0.1:1",
    ]);
    assert!(err.contains("listen"), "{err}");

    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let peers = format!("1={addr}");
    let err = fails(&[
        "meta",
        "--id",
        "1",
        "--listen",
        &addr,
        "--data",
        &t("m"),
        "--peers",
        &peers,
        "--bootstrap",
    ]);
    assert!(err.contains(&addr) && err.contains("in use"), "{err}");
}

#[test]
fn a_busy_mount_point_and_a_foreign_data_directory_are_refused() {
    let mut first = Dev::start(1, 1);
    let foreign = first.dir.join("chunk-1");
    first.stop();
    let second = Dev::start(1, 1);
    let dir = second.dir.display().to_string();
    let mnt = second.mnt.display().to_string();
    let err = fails(&["mount", "--dir", &dir, &mnt]);
    assert!(err.contains("busy") || err.contains("already mounted"), "{err}");
    // `stoa dev` refuses a live mount before it starts a node or makes its directory.
    let other = second.dir.with_file_name("other");
    let err = fails(&["dev", "--dir", &other.display().to_string(), "--mount", &mnt]);
    assert!(err.contains("busy"), "{err}");
    assert!(!other.exists(), "a refused stoa dev made {}", other.display());

    let meta = second.node("meta", 1)["addr"].as_str().unwrap().to_string();
    let err = fails(&[
        "chunk",
        "--listen",
        "127.0.0.1:0",
        "--data",
        &foreign.display().to_string(),
        "--meta",
        &meta,
    ]);
    assert!(err.contains("cluster"), "{err}");
    // The refused server changed nothing: the mount still works.
    std::fs::write(second.mnt.join("ok"), b"fine").unwrap();
    assert_eq!(std::fs::read(second.mnt.join("ok")).unwrap(), b"fine");
}

#[test]
fn a_killed_dev_cluster_starts_again_over_its_dead_mount() {
    let mut dev = Dev::start(1, 1);
    std::fs::write(dev.mnt.join("kept"), b"before the kill").unwrap();
    sh(&format!("sync {}", dev.mnt.join("kept").display()));
    dev.crash();
    // Just after the kill the dead mount may still answer `stat` from the kernel's cache;
    // it must be detached all the same.
    dev.launch();
    common::eventually(60, "the new mount serves the file", || {
        std::fs::read(dev.mnt.join("kept")).is_ok_and(|b| b == b"before the kill")
    });
    assert!(dev.dev_log().contains("dead FUSE mount; detaching it"), "{}", dev.dev_log());
}

/// The chunk files of every replica of chunk 0 of inode `ino`.
fn replica_files(dir: &Path, ino: u64) -> Vec<PathBuf> {
    let name = format!("{ino:016x}-{:08x}.chunk", 0);
    let out = sh(&format!("find {}/chunk-*/ -type f -name '{name}'", dir.display()));
    out.lines().map(PathBuf::from).collect()
}

#[test]
fn a_corrupted_block_is_served_from_another_replica_and_reported() {
    let dev = Dev::start(3, 3);
    let f = dev.mnt.join("victim");
    let data = pattern(11, 0, 1 << 20);
    std::fs::write(&f, &data).unwrap();
    std::fs::File::open(&f).unwrap().sync_all().unwrap();
    let files = replica_files(&dev.dir, std::fs::metadata(&f).unwrap().ino());
    assert_eq!(files.len(), 3, "want 3 replicas, found {files:?}");
    // Flip a byte in two of the three copies: whichever the client reads first, a bad
    // copy is met within a few reads, and the good one must answer.
    for bad in &files[..2] {
        let mut bytes = std::fs::read(bad).unwrap();
        // The data ends the file, after the chunk's headers.
        let data_at = bytes.len() - data.len();
        bytes[data_at + 5000] ^= 0xff;
        std::fs::write(bad, bytes).unwrap();
    }
    for _ in 0..6 {
        sh("sync; echo 3 > /proc/sys/vm/drop_caches");
        assert!(std::fs::read(&f).unwrap() == data, "a corrupt copy reached the reader");
    }
    common::eventually(10, "meta logs the corrupt replica", || {
        (1..=3).any(|i| {
            let log = dev.node("meta", i)["log"].as_str().unwrap().to_string();
            std::fs::read_to_string(log).unwrap_or_default().contains("corrupt")
        })
    });
    std::thread::sleep(Duration::from_millis(100));
}
