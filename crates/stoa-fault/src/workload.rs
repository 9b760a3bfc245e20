//! Client workloads on the FUSE mounts, each operation recorded in the [`History`]:
//!
//! - registers: small files holding one value, read (open, read, close), overwritten and
//!   compared-and-set by several clients on several mounts. Writes and compare-and-sets
//!   hold an fcntl write lock on the file (cluster-wide, flows/locks.md) from before they
//!   look until after their fsync, so a compare-and-set is atomic only if the locks and
//!   the caches behind them are coherent across mounts; reads take no lock.
//! - namespace: exclusive create, unlink, rename, stat and readdir of a few names in a
//!   few directories, from clients on every mount.
//! - files: a writer that creates files of known content, sets their mtime while the
//!   writes are on their way (as `tar` does) and fsyncs them; every file whose fsync and
//!   close returned must be intact at the end, with that mtime.

use crate::history::{Call, History, Opened, Outcome, Ret};
use crate::rng::Rng;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const REGISTERS: usize = 3;
/// Directory 0 is shared by one namespace client on every mount, so its history checks
/// that every mount's cached entries and attributes are dropped before another mount's
/// change returns (flows/caps.md); directory 1 by two clients on the first mount only,
/// which checks meta's namespace operations and the one client's own caching.
pub const DIRS: usize = 2;
pub const SHARED_DIR: usize = 0;
const LOCAL_DIR: usize = 1;
pub const NAMES: u8 = 5;

/// A file the writer created, fsynced and closed without error.
#[derive(Clone, Debug)]
pub struct AckedFile {
    pub rel: PathBuf,
    pub seed: u64,
    pub len: usize,
}

/// The running workloads of one scenario.
pub struct Workloads {
    stop: Arc<AtomicBool>,
    handles: Vec<JoinHandle<()>>,
    /// The client ids on each mount, in the order of the mounts given.
    pub clients_on: Vec<Vec<usize>>,
    pub acked: Arc<Mutex<Vec<AckedFile>>>,
}

/// The register file `k` of scenario directory `dir`.
pub fn register_path(mount: &Path, dir: &str, k: usize) -> PathBuf {
    mount.join(dir).join(format!("reg-{k}"))
}

pub fn encode(v: u64) -> Vec<u8> {
    format!("reg {v:020}\n").into_bytes()
}

/// Parses a register file; anything but exactly what [`encode`] writes is garbage.
pub fn decode(bytes: &[u8]) -> Ret {
    let text = String::from_utf8_lossy(bytes);
    let parsed = text
        .strip_prefix("reg ")
        .and_then(|t| t.strip_suffix('\n'))
        .filter(|t| t.len() == 20)
        .and_then(|t| t.parse::<u64>().ok());
    match parsed {
        Some(v) if bytes.len() == 25 => Ret::Value(v),
        _ => Ret::Garbage(format!("{:?}", &text[..text.len().min(40)])),
    }
}

/// Creates the scenario directory with its registers (value 0) and empty directories.
pub fn setup(mount: &Path, dir: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(mount.join(dir).join("files"))?;
    for d in 0..DIRS {
        std::fs::create_dir_all(mount.join(dir).join(format!("dir-{d}")))?;
    }
    for k in 0..REGISTERS {
        let mut f = std::fs::File::create(register_path(mount, dir, k))?;
        f.write_all(&encode(0))?;
        f.sync_all()?;
    }
    Ok(())
}

impl Workloads {
    /// Starts `per_mount` register clients and one namespace client on every mount, and
    /// one file writer.
    pub fn start(
        history: &History,
        mounts: &[PathBuf],
        dir: &str,
        seed: u64,
        per_mount: usize,
    ) -> Workloads {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let mut handles = Vec::new();
        let mut client = 0;
        let mut clients_on = vec![Vec::new(); mounts.len()];
        let mut add = |m: usize, client: &mut usize, job: fn(Ctx)| {
            let ctx = Ctx::new(history, &mounts[m], dir, *client, seed, &stop);
            handles.push(std::thread::spawn(move || job(ctx)));
            clients_on[m].push(*client);
            *client += 1;
        };
        for m in 0..mounts.len() {
            for _ in 0..per_mount {
                add(m, &mut client, Ctx::registers);
            }
            add(m, &mut client, |c| c.namespace(SHARED_DIR));
        }
        add(0, &mut client, |c| c.namespace(LOCAL_DIR));
        add(0, &mut client, |c| c.namespace(LOCAL_DIR));
        let ctx = Ctx::new(history, &mounts[0], dir, client, seed, &stop);
        let acked2 = acked.clone();
        handles.push(std::thread::spawn(move || ctx.files(acked2)));
        clients_on[0].push(client);
        Workloads { stop, handles, clients_on, acked }
    }

    /// Stops every client and waits up to `within` for them; returns how many are still
    /// stuck (in the kernel, on a mount that does not answer). Their last operation stays
    /// in the history with an unknown outcome.
    pub fn stop(self, within: Duration) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + within;
        while self.handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        let stuck = self.handles.iter().filter(|h| !h.is_finished()).count();
        for h in self.handles.into_iter().filter(|h| h.is_finished()) {
            // A client that panicked is a harness bug; let it show.
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        stuck
    }
}

struct Ctx {
    history: History,
    mount: PathBuf,
    dir: String,
    client: usize,
    rng: Rng,
    stop: Arc<AtomicBool>,
}

fn errno(e: &std::io::Error) -> String {
    format!("{e}")
}

impl Ctx {
    fn new(
        history: &History,
        mount: &Path,
        dir: &str,
        client: usize,
        seed: u64,
        stop: &Arc<AtomicBool>,
    ) -> Ctx {
        Ctx {
            history: history.clone(),
            mount: mount.to_path_buf(),
            dir: dir.to_string(),
            client,
            rng: Rng::new(seed ^ (client as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)),
            stop: stop.clone(),
        }
    }

    fn running(&self) -> bool {
        !self.stop.load(Ordering::Relaxed)
    }

    /// A short pause between operations, so that eight clients leave CPU to the cluster
    /// on a small machine.
    fn pause(&mut self) {
        std::thread::sleep(Duration::from_millis(10 + self.rng.below(30)));
    }

    fn registers(mut self) {
        let mut counter = 0u64;
        // The last value this client saw in each register: what its compare-and-sets
        // expect (often stale on purpose, so that both outcomes occur).
        let mut seen = [0u64; REGISTERS];
        while self.running() {
            let k = self.rng.below(REGISTERS as u64) as usize;
            let key = format!("reg/{}/{k}", self.dir);
            let path = register_path(&self.mount, &self.dir, k);
            let dice = self.rng.below(10);
            let ret = if dice < 5 {
                counter += 1;
                let v = ((self.client as u64 + 1) << 32) | counter;
                let call = if dice < 3 { Call::Write(v) } else { Call::Cas(seen[k], v) };
                let ret = self
                    .history
                    .record(self.client, &key, call, |c, o| change_register(&path, c, o));
                if ret == Some(Ret::Ok) {
                    seen[k] = v;
                }
                ret
            } else {
                self.history.record(self.client, &key, Call::Read, |_, _| read_register(&path))
            };
            if let Some(Ret::Value(v)) = ret {
                seen[k] = v;
            }
            self.pause();
        }
    }

    fn namespace(mut self, d: usize) {
        while self.running() {
            let key = format!("dir/{}/{d}", self.dir);
            let base = self.mount.join(&self.dir).join(format!("dir-{d}"));
            let a = self.rng.below(NAMES as u64) as u8;
            let b = (a + 1 + self.rng.below(NAMES as u64 - 1) as u8) % NAMES;
            let call = match self.rng.below(10) {
                0..=2 => Call::Create(a),
                3..=4 => Call::Unlink(a),
                5..=6 => Call::Rename(a, b),
                7..=8 => Call::Stat(a),
                _ => Call::List,
            };
            self.history.record(self.client, &key, call, |c, _| namespace_op(&base, c));
            self.pause();
        }
    }

    fn files(mut self, acked: Arc<Mutex<Vec<AckedFile>>>) {
        let mut n = 0u64;
        while self.running() {
            n += 1;
            let len = (64 << 10) + self.rng.below(1 << 20) as usize;
            let rel = PathBuf::from(&self.dir).join("files").join(format!("f-{n}"));
            let path = self.mount.join(&rel);
            let seed = self.rng.next();
            let key = format!("file/{}/{n}", self.dir);
            let ret = self
                .history
                .record(self.client, &key, Call::Write(n), |_, o| write_file(&path, seed, len, o));
            if ret.is_some() {
                acked.lock().expect("acked lock poisoned").push(AckedFile { rel, seed, len });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A write or compare-and-set of a register: open, an fcntl write lock on the whole
/// file, (for a compare-and-set) read and compare, write, fsync; the close drops the
/// lock. Anything that fails before the write changed nothing.
fn change_register(path: &Path, call: &Call, opened: &Opened) -> (Outcome, Result<Ret, String>) {
    let f = match std::fs::OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => {
            opened.now();
            f
        }
        Err(e) => return (Outcome::Fail, Err(errno(&e))),
    };
    if let Err(e) = lock_whole(&f) {
        return (Outcome::Fail, Err(format!("fcntl F_SETLKW: {}", errno(&e))));
    }
    let new = match *call {
        Call::Write(v) => v,
        Call::Cas(expected, new) => {
            let mut buf = [0u8; 64];
            let n = match f.read_at(&mut buf, 0) {
                Ok(n) => n,
                Err(e) => return (Outcome::Fail, Err(errno(&e))),
            };
            match decode(&buf[..n]) {
                Ret::Value(v) if v == expected => new,
                found => return (Outcome::Ok, Ok(found)),
            }
        }
        _ => unreachable!("not a register change: {call:?}"),
    };
    match f.write_all_at(&encode(new), 0).and_then(|_| f.sync_all()) {
        Ok(()) => (Outcome::Ok, Ok(Ret::Ok)),
        Err(e) => (Outcome::Unknown, Err(errno(&e))),
    }
}

/// Takes an fcntl write lock on all of `f`, waiting for it. An open-file-description
/// lock (`F_OFD_SETLKW`), not a classic POSIX one: the clients are threads of one
/// process, and a process never conflicts with its own POSIX locks, so those would let
/// two clients of one mount hold the lock at once (the first runs with compare-and-set
/// found exactly that).
fn lock_whole(f: &std::fs::File) -> std::io::Result<()> {
    // SAFETY: a zeroed flock is a valid value (l_pid must be 0 for an OFD lock); the
    // fields that matter are set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    // SAFETY: fcntl on a descriptor we own with a valid flock; l_start 0 and l_len 0
    // cover the whole file.
    match unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_SETLKW, &fl) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

fn read_register(path: &Path) -> (Outcome, Result<Ret, String>) {
    let mut buf = Vec::new();
    match std::fs::File::open(path).and_then(|mut f| f.read_to_end(&mut buf)) {
        Ok(_) => (Outcome::Ok, Ok(decode(&buf))),
        Err(e) => (Outcome::Fail, Err(errno(&e))),
    }
}

fn name(base: &Path, n: u8) -> PathBuf {
    base.join(format!("n{n}"))
}

/// Runs one namespace call; a change then fsyncs the directory. Errors that prove the
/// state (EEXIST, ENOENT) are results; any other error (the fsync's too) leaves a
/// change's outcome unknown and fails a read.
fn namespace_op(base: &Path, call: &Call) -> (Outcome, Result<Ret, String>) {
    let result = match call {
        Call::Create(n) => std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(name(base, *n))
            .map(|_| Ret::Ok),
        Call::Unlink(n) => std::fs::remove_file(name(base, *n)).map(|_| Ret::Ok),
        Call::Rename(a, b) => std::fs::rename(name(base, *a), name(base, *b)).map(|_| Ret::Ok),
        Call::Stat(n) => std::fs::metadata(name(base, *n)).map(|_| Ret::Exists),
        Call::List => list(base),
        Call::Read | Call::Write(_) | Call::Cas(..) => {
            unreachable!("not a namespace call: {call:?}")
        }
    };
    let read = matches!(call, Call::Stat(_) | Call::List);
    // A change is checked once synced: an answered change that never reached meta
    // (the mount's session expired first) fails the directory's fsync.
    if let Ok(Ret::Ok) = result {
        if let Err(e) = std::fs::File::open(base).and_then(|d| d.sync_all()) {
            return (Outcome::Unknown, Err(format!("fsync of the directory: {}", errno(&e))));
        }
    }
    match result {
        Ok(r) => (Outcome::Ok, Ok(r)),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => (Outcome::Ok, Ok(Ret::Exists)),
        Err(e) if e.kind() == ErrorKind::NotFound => (Outcome::Ok, Ok(Ret::Missing)),
        Err(e) if read => (Outcome::Fail, Err(errno(&e))),
        Err(e) => (Outcome::Unknown, Err(errno(&e))),
    }
}

fn list(base: &Path) -> std::io::Result<Ret> {
    let mut mask = 0u8;
    for e in std::fs::read_dir(base)? {
        let file_name = e?.file_name();
        let n = file_name.to_string_lossy().strip_prefix('n').and_then(|n| n.parse::<u8>().ok());
        match n {
            Some(n) if n < NAMES => mask |= 1 << n,
            // A name no client creates: the listing is not of this directory's history.
            _ => return Ok(Ret::Listing(u8::MAX)),
        }
    }
    Ok(Ret::Listing(mask))
}

fn write_file(
    path: &Path,
    seed: u64,
    len: usize,
    opened: &Opened,
) -> (Outcome, Result<Ret, String>) {
    let result = std::fs::File::create(path).and_then(|mut f| {
        opened.now();
        f.write_all(&pattern(seed, 0, len))?;
        f.set_times(std::fs::FileTimes::new().set_modified(mtime_of(seed)))?;
        f.sync_all()
    });
    match result {
        Ok(()) => (Outcome::Ok, Ok(Ret::Ok)),
        Err(e) => (Outcome::Unknown, Err(errno(&e))),
    }
}

/// Deterministic file contents: the byte at `offset` of the stream named `seed`.
pub fn pattern(seed: u64, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    let mut word = offset / 8;
    let skip = (offset % 8) as usize;
    while out.len() < len + skip {
        let mut x = seed ^ word.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        x ^= x >> 31;
        x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x ^= x >> 29;
        out.extend_from_slice(&x.to_le_bytes());
        word += 1;
    }
    out.drain(..skip);
    out.truncate(len);
    out
}

/// The mtime the writer sets on the file of stream `seed`: a time in the past, as
/// `tar` sets from an archive.
fn mtime_of(seed: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_500_000_000 + seed % 100_000_000)
}

/// Checks every acknowledged file through `mount`; returns a line per damaged one.
pub fn verify_files(mount: &Path, acked: &[AckedFile]) -> Vec<String> {
    let mut bad = Vec::new();
    for f in acked {
        match std::fs::read(mount.join(&f.rel)) {
            Ok(data) if data == pattern(f.seed, 0, f.len) => {
                match std::fs::metadata(mount.join(&f.rel)).and_then(|m| m.modified()) {
                    Ok(t) if t == mtime_of(f.seed) => {}
                    Ok(t) => bad.push(format!(
                        "{}: mtime {t:?}, want {:?} (set after its writes)",
                        f.rel.display(),
                        mtime_of(f.seed)
                    )),
                    Err(e) => bad.push(format!("{}: stat: {e}", f.rel.display())),
                }
            }
            Ok(data) => {
                let at = data.iter().zip(pattern(f.seed, 0, f.len)).position(|(a, b)| *a != b);
                bad.push(format!(
                    "{}: {} bytes (want {}), first difference at {at:?}",
                    f.rel.display(),
                    data.len(),
                    f.len
                ));
            }
            Err(e) => bad.push(format!("{}: {e}", f.rel.display())),
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_values_round_trip_and_anything_else_is_garbage() {
        assert_eq!(decode(&encode(0)), Ret::Value(0));
        assert_eq!(decode(&encode(u64::MAX)), Ret::Value(u64::MAX));
        assert!(matches!(decode(b""), Ret::Garbage(_)));
        assert!(matches!(decode(&[0u8; 25]), Ret::Garbage(_)));
        let mut torn = encode(12345);
        torn[10] = b'x';
        assert!(matches!(decode(&torn), Ret::Garbage(_)));
    }

    #[test]
    fn pattern_at_an_offset_is_a_slice_of_the_whole() {
        let whole = pattern(7, 0, 100);
        assert_eq!(pattern(7, 13, 40), whole[13..53]);
    }
}
