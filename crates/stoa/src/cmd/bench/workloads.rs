//! The workloads of `stoa bench`. Each function runs one repetition in its own fresh
//! directory and returns one [`Sample`] per figure; the caller repeats and takes medians.
//! Every completed operation ticks the repetition's [`GapClock`].

use super::report::{rate, split, GapClock, Progress};
use anyhow::{bail, Context};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const BLOCK_4K: usize = 4096;

/// One figure of one repetition.
#[derive(Clone, Debug)]
pub struct Sample {
    pub key: String,
    pub label: String,
    pub unit: &'static str,
    pub value: f64,
    pub max_gap: Duration,
    pub errors: u64,
}

/// Where a repetition runs and how it reports.
pub struct Ctx {
    pub dir: PathBuf,
    pub quiet: bool,
    /// Set when several `stoa bench` processes (one per mount) run the same plan at
    /// once: each timed phase starts when all of them have reached it.
    pub together: Option<Together>,
}

/// A barrier between `clients` benchmark processes, through a directory of a local
/// filesystem they share (not the one measured): a process reaching its `n`th phase
/// creates `n.<pid>` there, and starts once `clients` such names exist. Without it, two
/// clients' phases drift apart and one's mkdirs overlap the other's stats, so a "two
/// clients at once" figure would measure whichever phases happened to meet.
pub struct Together {
    pub dir: PathBuf,
    pub clients: usize,
    reached: AtomicU64,
}

/// How long a client waits for the others at a phase before giving up.
const TOGETHER_WAIT: Duration = Duration::from_secs(600);

impl Together {
    pub fn new(dir: PathBuf, clients: usize) -> Together {
        Together { dir, clients, reached: AtomicU64::new(0) }
    }

    /// Waits until every client has reached this process's next phase.
    fn wait(&self, label: &str) -> anyhow::Result<()> {
        let n = self.reached.fetch_add(1, Ordering::Relaxed);
        let mark = self.dir.join(format!("{n}.{}", std::process::id()));
        File::create(&mark).with_context(|| format!("create {}", mark.display()))?;
        let prefix = format!("{n}.");
        let give_up = Instant::now() + TOGETHER_WAIT;
        loop {
            let here = std::fs::read_dir(&self.dir)
                .with_context(|| format!("list {}", self.dir.display()))?
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count();
            if here >= self.clients {
                return Ok(());
            }
            if Instant::now() > give_up {
                bail!(
                    "{label}: {here} of {} clients reached it within {TOGETHER_WAIT:?}",
                    self.clients
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Ctx {
    fn sample(
        &self,
        key: String,
        label: String,
        unit: &'static str,
        value: f64,
        gap: &GapClock,
    ) -> Sample {
        Sample { key, label, unit, value, max_gap: gap.max_gap_closed(), errors: 0 }
    }
}

/// A cheap deterministic generator for offsets and file contents (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Runs `op(worker, i)` for `total` operations split over `workers` threads started
/// together, showing progress, and returns the wall time from start to the last one.
fn parallel<F>(
    label: &str,
    workers: u64,
    total: u64,
    ctx: &Ctx,
    gap: &GapClock,
    op: F,
) -> anyhow::Result<Duration>
where
    F: Fn(u64, u64) -> anyhow::Result<()> + Sync,
{
    if let Some(together) = &ctx.together {
        together.wait(label)?;
    }
    let parts = split(total, workers);
    let base = gap.completed();
    let mut progress = Progress::new(label, total, ctx.quiet);
    let start = Instant::now();
    let result = std::thread::scope(|s| {
        let mut first = 0;
        let mut handles = Vec::new();
        for (w, &n) in parts.iter().enumerate() {
            let (op, lo) = (&op, first);
            first += n;
            handles.push(s.spawn(move || -> anyhow::Result<Instant> {
                for i in lo..lo + n {
                    op(w as u64, i)?;
                    gap.tick();
                }
                Ok(Instant::now())
            }));
        }
        while !handles.iter().all(|h| h.is_finished()) {
            progress.update(gap.completed() - base);
            std::thread::sleep(Duration::from_millis(50));
        }
        handles
            .into_iter()
            .map(|h| h.join().expect("bench worker panicked"))
            .collect::<anyhow::Result<Vec<_>>>()
    });
    progress.finish();
    // The end is when the last worker finished, not when the polling loop noticed.
    let end = result?.into_iter().max().unwrap_or(start);
    Ok(end - start)
}

/// Writes back dirty pages and asks the kernel to drop clean caches, so that the next
/// read comes from the filesystem. Dropping needs root; without it reads may be warm.
pub fn drop_caches(file: Option<&File>) {
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    if let Some(f) = file {
        // SAFETY: fadvise on an open descriptor we own; the result is only advice.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
}

fn fresh_dir(ctx: &Ctx, name: &str) -> anyhow::Result<PathBuf> {
    let d = ctx.dir.join(name);
    if d.exists() {
        std::fs::remove_dir_all(&d).with_context(|| format!("remove {}", d.display()))?;
    }
    std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    Ok(d)
}

fn create_empty(path: &Path) -> anyhow::Result<()> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("create {}", path.display()))?;
    Ok(())
}

/// Sequential 1 MiB writes of `mib` MiB with an fsync at the end, then a cold read.
pub fn seq(ctx: &Ctx, mib: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let path = fresh_dir(ctx, "seq")?.join("seq.bin");
    let mut block = vec![0u8; MIB as usize];
    Rng::new(mib).fill(&mut block);
    let mut f = File::create(&path).with_context(|| format!("create {}", path.display()))?;
    let mut progress = Progress::new("seq write", mib, ctx.quiet);
    let start = Instant::now();
    for i in 0..mib {
        f.write_all(&block).context("write seq.bin")?;
        gap.tick();
        progress.update(i + 1);
    }
    f.sync_all().context("fsync seq.bin")?;
    let write = start.elapsed();
    progress.finish();
    drop_caches(Some(&f));
    drop(f);
    let mut f = File::open(&path).context("open seq.bin")?;
    let mut progress = Progress::new("seq read", mib, ctx.quiet);
    let (start, mut read_bytes) = (Instant::now(), 0u64);
    loop {
        let n = f.read(&mut block).context("read seq.bin")?;
        if n == 0 {
            break;
        }
        read_bytes += n as u64;
        gap.tick();
        progress.update(read_bytes / MIB);
    }
    let read = start.elapsed();
    progress.finish();
    if read_bytes != mib * MIB {
        bail!("read back {read_bytes} bytes of seq.bin, wrote {}", mib * MIB);
    }
    std::fs::remove_file(&path).context("remove seq.bin")?;
    let size = format!("{mib} MiB");
    Ok(vec![
        ctx.sample(
            "seq.write".into(),
            format!("seq write 1 MiB, {size}, fsync"),
            "MiB/s",
            mib as f64 / write.as_secs_f64(),
            &gap,
        ),
        ctx.sample(
            "seq.read".into(),
            format!("seq read 1 MiB, {size}, cold"),
            "MiB/s",
            mib as f64 / read.as_secs_f64(),
            &gap,
        ),
    ])
}

/// A 4 KiB-aligned buffer inside an over-allocated vector (O_DIRECT needs alignment).
fn aligned(storage: &mut Vec<u8>, len: usize) -> &mut [u8] {
    storage.resize(len + BLOCK_4K, 0);
    let off = storage.as_ptr().align_offset(BLOCK_4K);
    &mut storage[off..off + len]
}

/// Opens `path` for random I/O: O_DIRECT if the filesystem takes it (checked with one
/// real read), else buffered with the file's cache dropped first. Says which.
fn open_random(path: &Path) -> anyhow::Result<(File, bool)> {
    let direct = OpenOptions::new().read(true).write(true).custom_flags(libc::O_DIRECT).open(path);
    if let Ok(f) = direct {
        let mut storage = Vec::new();
        if f.read_at(aligned(&mut storage, BLOCK_4K), 0).is_ok() {
            return Ok((f, true));
        }
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    drop_caches(Some(&f));
    Ok((f, false))
}

/// 4 KiB random reads, then random writes, one at a time (QD1), over a `file_mib` file.
pub fn random(ctx: &Ctx, file_mib: u64, ops: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let path = fresh_dir(ctx, "rand")?.join("rand.bin");
    {
        let mut block = vec![0u8; MIB as usize];
        Rng::new(7).fill(&mut block);
        let mut f = File::create(&path).context("create rand.bin")?;
        for _ in 0..file_mib {
            f.write_all(&block).context("fill rand.bin")?;
        }
        f.sync_all().context("fsync rand.bin")?;
    }
    let (f, direct) = open_random(&path)?;
    let blocks = file_mib * MIB / BLOCK_4K as u64;
    let mut storage = Vec::new();
    let buf = aligned(&mut storage, BLOCK_4K);
    let mut rng = Rng::new(ops);
    let mut progress = Progress::new("4k random read", ops, ctx.quiet);
    let start = Instant::now();
    for i in 0..ops {
        let off = rng.next() % blocks * BLOCK_4K as u64;
        let n = f.read_at(buf, off).context("pread rand.bin")?;
        if n != BLOCK_4K {
            bail!("short read of {n} bytes at {off}");
        }
        gap.tick();
        progress.update(i + 1);
    }
    let read = start.elapsed();
    progress.finish();
    let mut progress = Progress::new("4k random write", ops, ctx.quiet);
    let start = Instant::now();
    for i in 0..ops {
        let off = rng.next() % blocks * BLOCK_4K as u64;
        f.write_all_at(buf, off).context("pwrite rand.bin")?;
        gap.tick();
        progress.update(i + 1);
    }
    f.sync_all().context("fsync rand.bin")?;
    let write = start.elapsed();
    progress.finish();
    std::fs::remove_file(&path).context("remove rand.bin")?;
    let how = if direct { "O_DIRECT" } else { "buffered, cold" };
    Ok(vec![
        ctx.sample(
            "rand.read.qd1".into(),
            format!("4k random read QD1 ({how})"),
            "IOPS",
            rate(ops, read),
            &gap,
        ),
        ctx.sample(
            "rand.write.qd1".into(),
            format!("4k random write QD1 ({how}, fsync)"),
            "IOPS",
            rate(ops, write),
            &gap,
        ),
    ])
}

/// Creates, stats, renames and unlinks `files` files in one directory, from `workers`
/// threads, then `dirs` mkdir and rmdir; with one worker also lists the full directory.
pub fn meta(ctx: &Ctx, workers: u64, files: u64, dirs: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let d = fresh_dir(ctx, &format!("meta.w{workers}"))?;
    let f = |i: u64| d.join(format!("f{i}"));
    let r = |i: u64| d.join(format!("r{i}"));
    let many = format!("{files} in one dir");
    let few = format!("{dirs} dirs");
    let stat = |_, i| std::fs::metadata(f(i)).with_context(|| format!("stat f{i}")).map(drop);
    let mut out = vec![
        phase(ctx, &gap, &d, ("create", &many), workers, files, &|_, i| create_empty(&f(i)))?,
        phase(ctx, &gap, &d, ("stat", &many), workers, files, &stat)?,
        phase(ctx, &gap, &d, ("rename", &many), workers, files, &|_, i| {
            std::fs::rename(f(i), r(i)).with_context(|| format!("rename f{i}"))
        })?,
    ];
    if workers == 1 {
        out.push(readdir(ctx, &d, files, &gap)?);
    }
    out.push(phase(ctx, &gap, &d, ("unlink", &many), workers, files, &|_, i| {
        std::fs::remove_file(r(i)).with_context(|| format!("unlink r{i}"))
    })?);
    let sub = |i: u64| d.join(format!("d{i}"));
    out.push(phase(ctx, &gap, &d, ("mkdir", &few), workers, dirs, &|_, i| {
        std::fs::create_dir(sub(i)).with_context(|| format!("mkdir d{i}"))
    })?);
    out.push(phase(ctx, &gap, &d, ("rmdir", &few), workers, dirs, &|_, i| {
        std::fs::remove_dir(sub(i)).with_context(|| format!("rmdir d{i}"))
    })?);
    Ok(out)
}

/// One timed metadata phase in `dir`: `n` operations `op` over `workers` threads, as
/// ops/s. It ends with an fsync of `dir`, timed with it: what a client answered and
/// still has to send (a batch of creates) counts to the phase that made it, not to the
/// next one, and the figure is of changes on meta's disks.
fn phase(
    ctx: &Ctx,
    gap: &GapClock,
    dir: &Path,
    (name, what): (&str, &str),
    workers: u64,
    n: u64,
    op: &(dyn Fn(u64, u64) -> anyhow::Result<()> + Sync),
) -> anyhow::Result<Sample> {
    let who = if workers == 1 { "1 worker".to_string() } else { format!("{workers} workers") };
    let elapsed = parallel(&format!("{name}, {who}"), workers, n, ctx, gap, op)?;
    let synced = Instant::now();
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))?;
    let elapsed = elapsed + synced.elapsed();
    let label = format!("{name} ({what}), {who}");
    Ok(ctx.sample(format!("{name}.w{workers}"), label, "ops/s", rate(n, elapsed), gap))
}

/// Lists `dir` (which holds `want` entries) to the end, counting entries per second.
fn readdir(ctx: &Ctx, dir: &Path, want: u64, gap: &GapClock) -> anyhow::Result<Sample> {
    let mut progress = Progress::new("readdir", want, ctx.quiet);
    let start = Instant::now();
    let mut n = 0u64;
    for entry in std::fs::read_dir(dir).context("readdir")? {
        entry.context("readdir entry")?;
        n += 1;
        gap.tick();
        progress.update(n);
    }
    let elapsed = start.elapsed();
    progress.finish();
    if n != want {
        bail!("readdir of {} saw {n} entries, expected {want}", dir.display());
    }
    let label = format!("readdir ({want} entries, {:.0} ms)", elapsed.as_secs_f64() * 1e3);
    Ok(ctx.sample("readdir".into(), label, "entries/s", rate(n, elapsed), gap))
}

/// Writes `count` files of 4 KiB (create, write, close), drops caches, reads them back
/// (open, read, close) and checks every length.
pub fn small(ctx: &Ctx, count: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let d = fresh_dir(ctx, "small")?;
    let mut data = vec![0u8; BLOCK_4K];
    Rng::new(count).fill(&mut data);
    let write = parallel("small files write", 1, count, ctx, &gap, |_, i| {
        std::fs::write(d.join(format!("s{i}")), &data).with_context(|| format!("write s{i}"))
    })?;
    drop_caches(None);
    let read = parallel("small files read", 1, count, ctx, &gap, |_, i| {
        let got = std::fs::read(d.join(format!("s{i}"))).with_context(|| format!("read s{i}"))?;
        if got.len() != BLOCK_4K {
            bail!("s{i} has {} bytes, wrote {BLOCK_4K}", got.len());
        }
        Ok(())
    })?;
    std::fs::remove_dir_all(&d).context("remove small files")?;
    let what = format!("{count} x 4 KiB");
    Ok(vec![
        ctx.sample(
            "small.write".into(),
            format!("small files write ({what})"),
            "files/s",
            rate(count, write),
            &gap,
        ),
        ctx.sample(
            "small.read".into(),
            format!("small files read back ({what}, cold)"),
            "files/s",
            rate(count, read),
            &gap,
        ),
    ])
}

/// The metadata-study table: create, read (open, read, close) and delete, each timed on
/// its own, cycling over `spread` files (1 or 100) until `ops` of each are done.
pub fn study(ctx: &Ctx, spread: u64, ops: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let d = fresh_dir(ctx, &format!("study.{spread}"))?;
    let rounds = ops.div_ceil(spread);
    let mut spent = [Duration::ZERO; 3];
    let mut progress =
        Progress::new(&format!("study, {spread} file(s)"), rounds * spread, ctx.quiet);
    for round in 0..rounds {
        let timed =
            |slot: &mut Duration, op: &dyn Fn(&Path) -> anyhow::Result<()>| -> anyhow::Result<()> {
                for i in 0..spread {
                    let path = d.join(format!("s{i}"));
                    let start = Instant::now();
                    op(&path)?;
                    *slot += start.elapsed();
                    gap.tick();
                }
                Ok(())
            };
        timed(&mut spent[0], &create_empty)?;
        timed(&mut spent[1], &|p| {
            let mut f = File::open(p).with_context(|| format!("open {}", p.display()))?;
            let mut buf = [0u8; 64];
            while f.read(&mut buf).context("read")? > 0 {}
            Ok(())
        })?;
        timed(&mut spent[2], &|p| {
            std::fs::remove_file(p).with_context(|| format!("delete {}", p.display()))
        })?;
        progress.update((round + 1) * spread);
    }
    progress.finish();
    let n = rounds * spread;
    let files = if spread == 1 { "1 file".to_string() } else { format!("{spread} files") };
    let names = [("create", "create"), ("read", "read (open+read+close)"), ("delete", "delete")];
    Ok(names
        .iter()
        .zip(spent)
        .map(|((key, what), t)| {
            ctx.sample(
                format!("study.{key}.{spread}"),
                format!("study: {what}, {files}"),
                "ops/s",
                rate(n, t),
                &gap,
            )
        })
        .collect())
}

/// Locks as a database takes them, from one process on one file: `ops` pairs of a write
/// lock of the whole file (F_SETLKW) and its unlock, then `ops / 10` transactions of
/// lock, 4 KiB write, fdatasync and unlock.
pub fn locks(ctx: &Ctx, ops: u64) -> anyhow::Result<Vec<Sample>> {
    let gap = GapClock::new();
    let d = fresh_dir(ctx, "locks")?;
    let path = d.join("db");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    let page = [0x5au8; BLOCK_4K];
    file.write_all_at(&page, 0).context("write the first page")?;
    file.sync_all().context("fsync")?;
    let lock = |kind: i32| -> anyhow::Result<()> {
        // SAFETY: an all-zero flock is a valid value of the plain C struct.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = kind as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        // SAFETY: fcntl on a descriptor we own, with a flock that lives for the call.
        if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_SETLKW, &fl) } != 0 {
            return Err(std::io::Error::last_os_error()).context("fcntl F_SETLKW");
        }
        gap.tick();
        Ok(())
    };
    let transactions = (ops / 10).max(1);
    let mut progress = Progress::new("locks", ops + transactions, ctx.quiet);
    let start = Instant::now();
    for i in 0..ops {
        lock(libc::F_WRLCK)?;
        lock(libc::F_UNLCK)?;
        progress.update(i + 1);
    }
    let pairs = start.elapsed();
    let start = Instant::now();
    for i in 0..transactions {
        lock(libc::F_WRLCK)?;
        file.write_all_at(&page, (i % 16) * BLOCK_4K as u64).context("write")?;
        file.sync_data().context("fdatasync")?;
        lock(libc::F_UNLCK)?;
        progress.update(ops + i + 1);
    }
    let written = start.elapsed();
    progress.finish();
    Ok(vec![
        ctx.sample(
            "locks.pairs".into(),
            "fcntl lock + unlock of one file, 1 process".into(),
            "pairs/s",
            rate(ops, pairs),
            &gap,
        ),
        ctx.sample(
            "locks.transactions".into(),
            "lock, 4 KiB write, fdatasync, unlock".into(),
            "tx/s",
            rate(transactions, written),
            &gap,
        ),
    ])
}

/// Metadata churn for failover measurements: `workers` threads loop create, stat, unlink
/// until `secs` pass. Errors are counted, not fatal (the point is to see whether any
/// reach the application). Workers stuck in a call are given `grace` to return; the gap
/// then includes the time they are still stuck.
pub fn churn(ctx: &Ctx, workers: u64, secs: u64, grace: Duration) -> anyhow::Result<Vec<Sample>> {
    let d = fresh_dir(ctx, "churn")?;
    let gap = Arc::new(GapClock::new());
    let stop = Arc::new(AtomicBool::new(false));
    let (errors, finished) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    for w in 0..workers {
        let (d, gap, stop, errors, finished) =
            (d.clone(), gap.clone(), stop.clone(), errors.clone(), finished.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = d.join(format!("c{w}_{i}"));
                i += 1;
                let steps: [&dyn Fn() -> std::io::Result<()>; 3] = [
                    &|| OpenOptions::new().write(true).create_new(true).open(&p).map(drop),
                    &|| std::fs::metadata(&p).map(drop),
                    &|| std::fs::remove_file(&p),
                ];
                for step in steps {
                    match step() {
                        Ok(()) => gap.tick(),
                        Err(e) => {
                            if errors.fetch_add(1, Ordering::Relaxed) < 5 {
                                eprintln!("stoa bench: churn: {}: {e}", p.display());
                            }
                            std::thread::sleep(Duration::from_millis(10));
                        }
                    }
                }
            }
            finished.fetch_add(1, Ordering::Relaxed);
        });
    }
    let mut progress = Progress::new("metadata churn (s)", secs, ctx.quiet);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(secs) {
        progress.update(start.elapsed().as_secs());
        std::thread::sleep(Duration::from_millis(100));
    }
    let ops = gap.completed();
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    while finished.load(Ordering::Relaxed) < workers && start.elapsed() < elapsed + grace {
        std::thread::sleep(Duration::from_millis(20));
    }
    progress.finish();
    let stuck = workers - finished.load(Ordering::Relaxed);
    let max_gap = if stuck > 0 { gap.max_gap() } else { gap.max_gap_closed() };
    let label = format!("churn create+stat+unlink, {workers} workers, {secs} s");
    let label = if stuck > 0 { format!("{label}, {stuck} stuck") } else { label };
    let errors = errors.load(Ordering::Relaxed);
    Ok(vec![Sample {
        key: format!("churn.w{workers}"),
        label,
        unit: "ops/s",
        value: rate(ops, elapsed),
        max_gap,
        errors,
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_phase_starts_only_when_the_other_client_reached_it_too() {
        let dir = tempfile::tempdir().unwrap();
        let together = Together::new(dir.path().to_path_buf(), 2);
        let other = dir.path().join("0.1");
        let arrives = std::thread::spawn({
            let other = other.clone();
            move || {
                std::thread::sleep(Duration::from_millis(100));
                let came = Instant::now();
                File::create(other).unwrap();
                came
            }
        });
        together.wait("first phase").unwrap();
        let released = Instant::now();
        assert!(released >= arrives.join().unwrap(), "started before the other client came");
        assert!(dir.path().join(format!("0.{}", std::process::id())).exists());
        // The next phase counts its own arrivals: the first phase's names do not count.
        File::create(dir.path().join("1.1")).unwrap();
        together.wait("second phase").unwrap();
        assert!(dir.path().join(format!("1.{}", std::process::id())).exists());
    }
}
