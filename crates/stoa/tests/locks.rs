//! POSIX locks hold across mounts: two mounts of one cluster behave like two machines
//! (separate sessions, separate caches). fcntl, OFD and flock locks are tested through
//! Python's `fcntl` module, from processes on both mounts.

mod common;

use common::{sh, wait_all_within, Dev, Mount};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Increments the number in FILE N times, each under an exclusive lock of KIND
/// (`fcntl`, `ofd` or `flock`), reopening the file every time.
const COUNTER: &str = r#"
import fcntl, os, struct, sys
path, n, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3]
for _ in range(n):
    fd = os.open(path, os.O_RDWR)
    if kind == "flock":
        fcntl.flock(fd, fcntl.LOCK_EX)
    elif kind == "ofd":
        fcntl.fcntl(fd, 38, struct.pack("hhqqi", fcntl.F_WRLCK, 0, 0, 0, 0))  # F_OFD_SETLKW
    else:
        fcntl.lockf(fd, fcntl.LOCK_EX)
    value = int(os.pread(fd, 64, 0) or b"0")
    data = b"%d\n" % (value + 1)
    os.pwrite(fd, data, 0)
    os.ftruncate(fd, len(data))
    if kind == "fcntl":
        fcntl.lockf(fd, fcntl.LOCK_UN)
    os.close(fd)
"#;

fn counter_run(file: &Path, n: u32, kind: &str) -> Child {
    Command::new("python3")
        .args(["-c", COUNTER])
        .arg(file)
        .arg(n.to_string())
        .arg(kind)
        .spawn()
        .unwrap()
}

#[test]
fn locks_serialize_processes_on_two_mounts() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    for kind in ["fcntl", "flock", "ofd"] {
        let name = format!("counter-{kind}");
        std::fs::write(dev.mnt.join(&name), b"0\n").unwrap();
        let runs = vec![
            counter_run(&dev.mnt.join(&name), 25, kind),
            counter_run(&dev.mnt.join(&name), 25, kind),
            counter_run(&other.path.join(&name), 25, kind),
            counter_run(&other.path.join(&name), 25, kind),
        ];
        wait_all_within(runs, 180, &format!("{kind} counters"));
        let text = std::fs::read_to_string(other.path.join(&name)).unwrap();
        assert_eq!(text.trim(), "100", "{kind} locks lost increments");
    }
}

/// Runs N transactions on the SQLite database DB as WHO: each checks, under the
/// database's write lock, that it sees every row it added before, then adds one.
const SQLITE: &str = r#"
import sqlite3, sys
db, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = sqlite3.connect(db, timeout=120, isolation_level=None)
for i in range(n):
    c.execute("BEGIN IMMEDIATE")
    (seen,) = c.execute("SELECT count(*) FROM t WHERE who = ?", (who,)).fetchone()
    assert seen == i, f"{who} saw {seen} of its {i} rows"
    c.execute("INSERT INTO t VALUES (?, ?, ?)", (who, i, "x" * 700))
    c.execute("COMMIT")
"#;

/// SQLite, as applications use it: one database written by processes on both mounts
/// at once, under its fcntl locks, each reading the pages the others wrote through a
/// handle open to read and write (the pages the mount keeps for it, caps.md invariant
/// 37). Every transaction sees the rows committed before it, and the database is whole
/// on both mounts.
#[test]
fn a_sqlite_database_written_from_two_mounts_at_once_stays_whole() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let db = |m: &Path| m.join("shared.db").display().to_string();
    sh(&format!(
        "python3 -c \"import sqlite3; sqlite3.connect('{}').execute('CREATE TABLE t (who, i, pad)')\"",
        db(&dev.mnt)
    ));
    let run = |m: &Path, who: &str| {
        let mut c = Command::new("python3");
        c.args(["-c", SQLITE, &db(m), who, "150"]);
        c.spawn().unwrap()
    };
    let runs = vec![run(&dev.mnt, "a1"), run(&dev.mnt, "a2"), run(&other.path, "b1")];
    wait_all_within(runs, 240, "sqlite writers");
    for m in [&dev.mnt, &other.path] {
        let out = sh(&format!(
            "python3 -c \"import sqlite3; c = sqlite3.connect('{}'); \
             print(c.execute('PRAGMA integrity_check').fetchone()[0], \
             c.execute('SELECT count(*), count(DISTINCT who || i) FROM t').fetchone())\"",
            db(m)
        ));
        assert_eq!(out.trim(), "ok (450, 450)", "on {}", m.display());
    }
}

/// Holds an exclusive fcntl lock on FILE until stdin closes, printing "locked".
const HOLDER: &str = r#"
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"#;

/// Starts a process that holds an exclusive lock on `path`, once it has it. It lets go
/// when its stdin closes.
/// Reads FILE whole, N times, each through a new read-only descriptor (the kernel's
/// page cache, so its reads lock pages while they wait for the mount).
const READER: &str = r#"
import os, sys
path, n = sys.argv[1], int(sys.argv[2])
for _ in range(n):
    fd = os.open(path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    while os.read(fd, 65536):
        pass
    os.close(fd)
"#;

/// Taking a lock never waits for the mount's own reads of the file: the mount once told
/// the kernel to drop the file's pages on every lock, on a runtime thread, and that
/// waits for the pages reads in flight hold, whose answers needed the runtime (the fault
/// runs' compare-and-set stalled a mount that way).
#[test]
fn locks_taken_while_the_same_mount_reads_the_file_never_stall() {
    let dev = Dev::start(3, 3);
    let file = dev.mnt.join("read-and-locked");
    std::fs::write(&file, b"0\n").unwrap();
    let reader = |n: u32| {
        Command::new("python3").args(["-c", READER]).arg(&file).arg(n.to_string()).spawn().unwrap()
    };
    let runs = vec![
        counter_run(&file, 100, "ofd"),
        counter_run(&file, 100, "ofd"),
        reader(400),
        reader(400),
    ];
    wait_all_within(runs, 120, "lockers and readers of one file on one mount");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.trim(), "200", "locks lost increments");
}

fn hold_lock(path: &Path) -> Child {
    let mut holder = Command::new("python3")
        .args(["-c", HOLDER])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(holder.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "locked");
    holder
}

/// Whether F_GETLK of a write lock on `path` reports a write lock held by another owner.
fn getlk_sees_a_writer(path: &Path) -> bool {
    let probe = sh(&format!(
        "python3 -c 'import fcntl,os,struct; fd=os.open(\"{}\",os.O_RDWR); \
         r=fcntl.fcntl(fd,fcntl.F_GETLK,struct.pack(\"hhqqi\",fcntl.F_WRLCK,0,0,0,0)); \
         print(struct.unpack(\"hhqqi\",r)[0]==fcntl.F_WRLCK)'",
        path.display()
    ));
    probe.trim() == "True"
}

/// Whether a non-blocking exclusive lock of `path` (F_SETLK) is refused.
fn nonblocking_lock_refused(path: &Path) -> bool {
    let script = "import fcntl,os,sys; fd=os.open(sys.argv[1],os.O_RDWR); \
                  fcntl.lockf(fd, fcntl.LOCK_EX|fcntl.LOCK_NB)";
    let out = Command::new("python3").args(["-c", script]).arg(path).output().unwrap();
    !out.status.success()
}

/// A process that waits (F_SETLKW, at most 60 s) for an exclusive lock of `path` and
/// exits with success once it has it.
fn lock_waiter(path: &Path) -> Command {
    let script =
        "import fcntl,os,sys; fd=os.open(sys.argv[1],os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX)";
    let mut waiter = Command::new("timeout");
    waiter.args(["60", "python3", "-c", script]).arg(path);
    waiter
}

#[test]
fn getlk_sees_a_holder_on_the_other_mount_and_a_waiter_wakes_when_it_exits() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let file = dev.mnt.join("held");
    std::fs::write(&file, b"x").unwrap();
    let mut holder = hold_lock(&other.path.join("held"));

    // F_GETLK on the first mount reports the holder; a non-blocking lock fails.
    assert!(getlk_sees_a_writer(&file), "F_GETLK did not see the other mount's lock");
    assert!(nonblocking_lock_refused(&file), "a conflicting F_SETLK succeeded");

    // A blocked F_SETLKW wakes when the holder exits (its close drops the lock).
    let waiter = std::thread::spawn(move || {
        let started = Instant::now();
        let ok = lock_waiter(&file).status().unwrap().success();
        (ok, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    let (ok, waited) = waiter.join().unwrap();
    assert!(ok, "the waiter failed");
    println!("waiter got the lock after {:.2} s", waited.as_secs_f64());
}

#[test]
fn the_locks_of_a_mount_that_goes_away_are_released() {
    let dev = Dev::start(3, 3);
    let file = dev.mnt.join("orphan-lock");
    std::fs::write(&file, b"x").unwrap();
    {
        let other = Mount::new(&dev, "mnt2");
        let mut holder = hold_lock(&other.path.join("orphan-lock"));
        // The mount goes away (SIGTERM) while the holder still has the file open.
        drop(other);
        let _ = holder.kill();
        let _ = holder.wait();
    }
    let status = Command::new("timeout")
        .args(["20", "python3", "-c", "import fcntl,os,sys; fd=os.open(sys.argv[1],os.O_RDWR); fcntl.lockf(fd, fcntl.LOCK_EX)"])
        .arg(&file)
        .status()
        .unwrap();
    assert!(status.success(), "the lock of a gone mount was never released");
}

/// Writes FILE, then takes and drops an exclusive fcntl lock on it N times through one
/// descriptor, as a database does around its transactions.
const LOCK_LOOP: &str = r#"
import fcntl, os, sys
path, n = sys.argv[1], int(sys.argv[2])
fd = os.open(path, os.O_RDWR)
os.pwrite(fd, b"x", 0)
for _ in range(n):
    fcntl.lockf(fd, fcntl.LOCK_EX)
    fcntl.lockf(fd, fcntl.LOCK_UN)
os.close(fd)
"#;

fn applied(dev: &Dev) -> u64 {
    dev.status()["meta"]["last_applied"].as_u64().expect("status names the applied index")
}

/// A file one mount writes and locks alone keeps its locks on that mount: taking and
/// dropping them costs meta nothing (a lock there was one Raft entry each). Once the
/// other mount asks about the file, the locks are back at meta and hold across both.
#[test]
fn a_file_locked_by_one_mount_alone_keeps_its_locks_there_until_another_asks() {
    let dev = Dev::start(3, 3);
    let other = Mount::new(&dev, "mnt2");
    let file = dev.mnt.join("db");
    std::fs::write(&file, b"0").unwrap();
    let before = applied(&dev);
    let run =
        Command::new("python3").args(["-c", LOCK_LOOP]).arg(&file).arg("200").spawn().unwrap();
    wait_all_within(vec![run], 120, "200 locks and unlocks on one mount");
    let entries = applied(&dev) - before;
    println!("200 locks and unlocks on one mount added {entries} log entries");
    assert!(entries < 100, "{entries} log entries for 200 locks kept by one mount");

    // The mount that keeps the file's locks holds one; the other mount sees it, is
    // refused, and its waiter gets the lock when the holder exits.
    let mut holder = hold_lock(&file);
    let theirs = other.path.join("db");
    assert!(getlk_sees_a_writer(&theirs), "F_GETLK did not see the lock the other mount kept");
    assert!(nonblocking_lock_refused(&theirs), "a conflicting F_SETLK succeeded");
    let waiter = lock_waiter(&theirs).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(holder.stdin.take());
    assert!(holder.wait().unwrap().success());
    wait_all_within(vec![waiter], 60, "the other mount's waiter");
}

/// A database page written over and `fdatasync`ed on a mount that holds the file alone
/// is durable when the call returns, though the mount commits the new mtime later: after
/// a kill -9 of that mount, the other mount reads the new page and the same size.
#[test]
fn an_fdatasynced_overwrite_survives_the_death_of_its_mount() {
    let dev = Dev::start(3, 3);
    let old: Vec<u8> = (0..65_536u32).map(|i| (i % 251) as u8).collect();
    let page = vec![0xa5u8; 4096];
    let other = Mount::new(&dev, "mnt2");
    let theirs = other.path.join("db");
    {
        let mut open = std::fs::OpenOptions::new();
        let f = open.create_new(true).read(true).write(true).open(&theirs).unwrap();
        f.write_all_at(&old, 0).unwrap();
        f.sync_all().unwrap();
        for round in 0..20u64 {
            f.write_all_at(&page, 4096 * (round % 8)).unwrap();
            f.sync_data().unwrap();
        }
        // SAFETY: plain kill(2) of our own child, with the file still open.
        unsafe { libc::kill(other.pid() as i32, libc::SIGKILL) };
    }
    drop(other);
    let mut want = old;
    want[..8 * 4096].fill(0xa5);
    let got = std::fs::read(dev.mnt.join("db")).unwrap();
    assert_eq!(got.len(), want.len(), "the size changed");
    assert!(got == want, "an fdatasynced page was lost with its mount");
}
