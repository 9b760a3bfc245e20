//! stoa-memfs mounted for real: two mounts of one tree, the operations the benchmarks
//! use, and an unmount of both on SIGTERM.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn mounted(p: &Path) -> bool {
    Command::new("mountpoint").arg("-q").arg(p).status().is_ok_and(|s| s.success())
}

fn wait_until(what: &str, f: impl Fn() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Stops the server if the test fails before it does.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn two_mounts_serve_one_tree_and_sigterm_unmounts_both() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    fs::create_dir(&a).unwrap();
    fs::create_dir(&b).unwrap();
    let mut server =
        Server(Command::new(env!("CARGO_BIN_EXE_stoa-memfs")).arg(&a).arg(&b).spawn().unwrap());
    wait_until("both mounted", || mounted(&a) && mounted(&b));

    fs::create_dir(a.join("d")).unwrap();
    let mut f = fs::File::create(a.join("d/f")).unwrap();
    f.write_all(&[7u8; 10_000]).unwrap();
    f.seek(SeekFrom::Start(5_000)).unwrap();
    f.write_all(b"middle").unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut back = Vec::new();
    fs::File::open(b.join("d/f")).unwrap().read_to_end(&mut back).unwrap();
    assert_eq!(back.len(), 10_000);
    assert_eq!(&back[5_000..5_006], b"middle");

    fs::rename(b.join("d/f"), b.join("g")).unwrap();
    std::os::unix::fs::symlink("g", a.join("s")).unwrap();
    assert_eq!(fs::read_link(a.join("s")).unwrap(), Path::new("g"));
    let mut names: Vec<String> =
        fs::read_dir(&b).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["d", "g", "s"]);
    assert_eq!(fs::remove_dir(a.join("g")).unwrap_err().raw_os_error(), Some(libc::ENOTDIR));
    fs::remove_file(a.join("g")).unwrap();
    fs::remove_dir(a.join("d")).unwrap();
    assert!(!b.join("g").exists() && !b.join("d").exists());

    // SAFETY: kill with a valid pid and signal.
    unsafe { libc::kill(server.0.id() as i32, libc::SIGTERM) };
    wait_until("both unmounted", || !mounted(&a) && !mounted(&b));
    let status = server.0.wait().unwrap();
    assert!(status.success(), "stoa-memfs exited with {status}");
}
