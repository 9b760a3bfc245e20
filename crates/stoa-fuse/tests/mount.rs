//! A real FUSE mount over an in-memory cluster: files written through the kernel read
//! back, directories list, and the mount's lifecycle (busy, shutdown) behaves.
//! Needs /dev/fuse and root (for allow_other); elsewhere it says so and passes.

#[path = "../../stoa-client/tests/support/fake_cluster.rs"]
mod fake_cluster;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use stoa_fuse::{mount, FuseError, MountConfig};

fn can_mount() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root || !Path::new("/dev/fuse").exists() {
        eprintln!("skipping: needs root and /dev/fuse");
        return false;
    }
    true
}

async fn wait_mounted(path: &Path) {
    for _ in 0..200 {
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        if table.lines().any(|l| l.contains(path.to_str().unwrap()) && l.contains("fuse")) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never got mounted", path.display());
}

fn exercise(root: PathBuf) {
    eprintln!("step: stat root");
    assert_eq!(std::fs::metadata(&root).unwrap().ino(), 1);
    eprintln!("step: write");
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("a.bin"), &data).unwrap();
    assert_eq!(std::fs::metadata(root.join("a.bin")).unwrap().len(), data.len() as u64);
    assert!(std::fs::read(root.join("a.bin")).unwrap() == data);

    eprintln!("step: mkdir");
    std::fs::create_dir(root.join("dir")).unwrap();
    for i in 0..300 {
        std::fs::write(root.join(format!("dir/f{i:03}")), format!("{i}")).unwrap();
    }
    let mut names: Vec<String> = std::fs::read_dir(root.join("dir"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names.len(), 300);
    assert_eq!(names[299], "f299");

    eprintln!("step: rename");
    std::fs::rename(root.join("dir/f001"), root.join("moved")).unwrap();
    assert_eq!(std::fs::read_to_string(root.join("moved")).unwrap(), "1");
    std::os::unix::fs::symlink("moved", root.join("link")).unwrap();
    assert_eq!(std::fs::read_link(root.join("link")).unwrap(), PathBuf::from("moved"));

    eprintln!("step: truncate");
    let f = std::fs::OpenOptions::new().write(true).open(root.join("a.bin")).unwrap();
    f.set_len(10).unwrap();
    drop(f);
    assert_eq!(std::fs::read(root.join("a.bin")).unwrap(), &data[..10]);
    std::fs::remove_file(root.join("moved")).unwrap();
    assert!(!root.join("moved").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mounted_cluster_serves_files_and_unmounts_on_shutdown() {
    if !can_mount() {
        return;
    }
    let cluster = fake_cluster::FakeCluster::start(1 << 20).await;
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().canonicalize().unwrap();
    let cfg = MountConfig {
        meta: vec![cluster.addr],
        mountpoint: mnt.clone(),
        name: "t".into(),
        caps_max: stoa_client::CAPS_MAX_DEFAULT,
        data_cache_bytes: stoa_client::DATA_CACHE_DEFAULT,
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(mount(cfg.clone(), async move {
        let _ = stopped.await;
    }));
    wait_mounted(&mnt).await;

    eprintln!("step: busy");
    let again = mount(cfg, std::future::pending()).await.unwrap_err();
    assert!(matches!(again, FuseError::Busy(_)), "{again}");
    assert!(again.to_string().contains("busy: already mounted"), "{again}");

    // The first chunk writes meet a busy server; the client retries them.
    cluster.busy_writes.store(2, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    tokio::task::spawn_blocking(move || exercise(root)).await.unwrap();
    assert!(!cluster.state.lock().unwrap().chunks.is_empty());

    eprintln!("step: a close of a file held alone waits for neither its data nor its size");
    cluster.hold_writes.store(true, std::sync::atomic::Ordering::SeqCst);
    cluster.hold_commits_above.store(0, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    tokio::task::spawn_blocking(move || {
        std::fs::write(root.join("alone.bin"), [5u8; 4096]).unwrap();
        assert_eq!(std::fs::metadata(root.join("alone.bin")).unwrap().len(), 4096);
        assert_eq!(std::fs::read(root.join("alone.bin")).unwrap(), [5u8; 4096]);
    })
    .await
    .unwrap();
    let alone = loop {
        // The create reaches meta in the background.
        if let Some(&ino) = cluster.state.lock().unwrap().dirs[&1].get(&b"alone.bin"[..]) {
            break stoa_types::ChunkId { ino: stoa_types::InodeId(ino), index: 0 };
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    assert!(!cluster.state.lock().unwrap().chunks.contains_key(&alone), "the write is held");
    cluster.hold_writes.store(false, std::sync::atomic::Ordering::SeqCst);
    cluster.hold_commits_above.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    tokio::task::spawn_blocking(move || {
        std::fs::File::open(root.join("alone.bin")).unwrap().sync_all().unwrap();
    })
    .await
    .unwrap();
    assert_eq!(cluster.state.lock().unwrap().chunks[&alone], [5u8; 4096], "fsync waited");

    eprintln!("step: a lookup waits for no queued open or release");
    cluster.hold_batches.store(true, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    let looked = tokio::task::spawn_blocking(move || {
        assert_eq!(std::fs::read(root.join("alone.bin")).unwrap(), [5u8; 4096]);
        std::fs::metadata(root.join("never-made")).unwrap_err().kind()
    });
    let looked = tokio::time::timeout(Duration::from_secs(10), looked).await;
    let looked = looked.expect("the lookup waited for the queued open and release").unwrap();
    assert_eq!(looked, std::io::ErrorKind::NotFound);
    cluster.hold_batches.store(false, std::sync::atomic::Ordering::SeqCst);

    eprintln!("step: a child's close leaves a write error to the owner's fsync");
    // Found by the fault tests: a child inherits the descriptor and closes it at exec;
    // the kernel flushes, the buffered bytes fail, and that flush must not take the
    // error from the owner, whose fsync used to return success over lost data.
    cluster.full_writes.store(1, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut f = std::fs::File::create(root.join("lost.bin")).unwrap();
        f.write_all(b"never stored").unwrap();
        assert!(std::process::Command::new("true").status().unwrap().success());
        let err = f.sync_all().expect_err("fsync after a failed write-behind");
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    })
    .await
    .unwrap();

    eprintln!("step: a close does not wait for the size commit, the unmount does");
    cluster.hold_commits_above.store(0, std::sync::atomic::Ordering::SeqCst);
    let root = mnt.clone();
    tokio::task::spawn_blocking(move || {
        std::fs::write(root.join("small.bin"), [7u8; 4096]).unwrap();
        assert_eq!(std::fs::metadata(root.join("small.bin")).unwrap().len(), 4096);
    })
    .await
    .unwrap();
    let size = |cluster: &fake_cluster::FakeCluster| {
        let st = cluster.state.lock().unwrap();
        let ino = st.dirs[&1][&b"small.bin"[..]];
        st.attrs[&ino].size
    };
    assert_eq!(size(&cluster), 0, "the commit is held at meta");
    cluster.hold_commits_above.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), task).await.unwrap().unwrap().unwrap();
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!table.contains(mnt.to_str().unwrap()), "still mounted after shutdown");
    assert_eq!(size(&cluster), 4096, "the unmount waited for the commit");
}

#[tokio::test]
async fn a_missing_mount_point_is_a_clear_error() {
    let cfg = MountConfig {
        meta: vec!["127.0.0.1:1".parse().unwrap()],
        mountpoint: PathBuf::from("/nonexistent/stoa-mnt"),
        name: "t".into(),
        caps_max: stoa_client::CAPS_MAX_DEFAULT,
        data_cache_bytes: stoa_client::DATA_CACHE_DEFAULT,
    };
    let err = mount(cfg, std::future::pending()).await.unwrap_err();
    assert!(err.to_string().contains("/nonexistent/stoa-mnt"), "{err}");
}
