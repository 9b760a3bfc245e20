//! `stoa bench MNT`: a quick, self-contained benchmark of any mounted directory (a Stoa
//! mount, another filesystem, a local disk), with no fio needed.
//!
//! ```text
//!  args -> sizes (full or --quick) -> plan (groups x workers)
//!    -> for each workload: repeat N times in MNT/stoa-bench.<pid>/ -> samples
//!    -> rows (median per figure, loadavg, longest gap) -> table on stdout, CSV to a file
//! ```
//!
//! Groups: `seq` (1 MiB sequential write with fsync, cold read), `rand` (4 KiB random
//! read and write at QD1, O_DIRECT where the filesystem takes it), `meta` (creates, stats,
//! renames, unlinks in one directory, readdir of it, mkdir/rmdir; from 1 and 8 workers),
//! `small` (4 KiB files written and read back), `study` (the metadata-study table:
//! create, read, delete on 1 file and spread over 100 files), `locks` (fcntl locks taken
//! and dropped on one file, alone and around 4 KiB write + fdatasync transactions, as a
//! database takes them). `--churn SECS` instead runs
//! a metadata load for failover measurements and reports the longest gap between
//! completed operations.

pub mod report;
pub mod workloads;

use anyhow::{bail, Context};
use report::Row;
use std::path::PathBuf;
use std::time::Duration;
use workloads::{Ctx, Sample, Together};

#[derive(clap::Args)]
pub struct Args {
    /// The mounted directory to measure (any filesystem); work happens in a new
    /// subdirectory that is removed afterwards.
    mnt: PathBuf,
    /// Small sizes for a check in seconds rather than minutes.
    #[arg(long)]
    quick: bool,
    /// Workload groups, comma-separated: seq,rand,meta,small,study,locks.
    #[arg(long, default_value = "seq,rand,meta,small,study,locks")]
    only: String,
    /// Repetitions of each workload; figures are medians.
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Parallel workers for the `meta` group, comma-separated.
    #[arg(long, default_value = "1,8")]
    workers: String,
    /// Files created, stated, renamed and unlinked per repetition (default 10000, quick 300).
    #[arg(long)]
    files: Option<u64>,
    /// Directories made and removed per repetition (default 1000, quick 100).
    #[arg(long)]
    dirs: Option<u64>,
    /// Sequential file size in MiB (default 256, quick 16).
    #[arg(long)]
    seq_mib: Option<u64>,
    /// Random I/O file size in MiB (default 64, quick 8).
    #[arg(long)]
    rand_mib: Option<u64>,
    /// Random reads and writes per repetition (default 2000, quick 200).
    #[arg(long)]
    rand_ops: Option<u64>,
    /// Small 4 KiB files per repetition (default 5000, quick 200).
    #[arg(long)]
    small_files: Option<u64>,
    /// Operations of each kind in the study table per repetition (default 2000, quick 200).
    #[arg(long)]
    study_ops: Option<u64>,
    /// Lock and unlock pairs per repetition; a tenth as many transactions (default 2000,
    /// quick 200).
    #[arg(long)]
    lock_ops: Option<u64>,
    /// Run only a metadata churn (create, stat, unlink) for SECS seconds, for failover
    /// measurements; uses the largest --workers count.
    #[arg(long, value_name = "SECS")]
    churn: Option<u64>,
    /// Show the longest gap between completed operations (and errors) for every row.
    #[arg(long)]
    gap: bool,
    /// Also write the rows as CSV to this file.
    #[arg(long)]
    csv: Option<PathBuf>,
    /// No progress line on stderr.
    #[arg(long)]
    quiet: bool,
    /// Run in step with other `stoa bench` processes given the same DIR (on a local
    /// filesystem they share) and the same plan: each timed phase starts when all
    /// `--clients` of them reached it. For figures of several mounts at once.
    #[arg(long, value_name = "DIR")]
    together: Option<PathBuf>,
    /// How many processes share `--together`.
    #[arg(long, default_value_t = 2, requires = "together")]
    clients: usize,
}

/// The sizes of one run, after defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizes {
    pub files: u64,
    pub dirs: u64,
    pub seq_mib: u64,
    pub rand_mib: u64,
    pub rand_ops: u64,
    pub small_files: u64,
    pub study_ops: u64,
    pub lock_ops: u64,
}

impl Sizes {
    fn resolve(a: &Args) -> Sizes {
        let pick =
            |v: Option<u64>, full: u64, quick: u64| v.unwrap_or(if a.quick { quick } else { full });
        Sizes {
            files: pick(a.files, 10_000, 300),
            dirs: pick(a.dirs, 1_000, 100),
            seq_mib: pick(a.seq_mib, 256, 16),
            rand_mib: pick(a.rand_mib, 64, 8),
            rand_ops: pick(a.rand_ops, 2_000, 200),
            small_files: pick(a.small_files, 5_000, 200),
            study_ops: pick(a.study_ops, 2_000, 200),
            lock_ops: pick(a.lock_ops, 2_000, 200),
        }
    }
}

/// One workload of the plan; each repetition yields several samples.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    Seq,
    Rand,
    Meta { workers: u64 },
    Small,
    Study { spread: u64 },
    Locks,
    Churn { workers: u64, secs: u64 },
}

/// The workloads to run, in order, from the group list and worker counts.
pub fn plan(only: &str, workers: &[u64], churn: Option<u64>) -> anyhow::Result<Vec<Workload>> {
    if let Some(secs) = churn {
        let workers = workers.iter().copied().max().unwrap_or(8);
        return Ok(vec![Workload::Churn { workers, secs }]);
    }
    let mut out = Vec::new();
    for group in only.split(',').map(str::trim).filter(|g| !g.is_empty()) {
        match group {
            "seq" => out.push(Workload::Seq),
            "rand" => out.push(Workload::Rand),
            "meta" => out.extend(workers.iter().map(|&w| Workload::Meta { workers: w })),
            "small" => out.push(Workload::Small),
            "study" => out.extend([1, 100].map(|spread| Workload::Study { spread })),
            "locks" => out.push(Workload::Locks),
            other => bail!(
                "--only: unknown workload group `{other}` (seq, rand, meta, small, study, locks)"
            ),
        }
    }
    if out.is_empty() {
        bail!("--only: no workload group given");
    }
    Ok(out)
}

fn parse_workers(s: &str) -> anyhow::Result<Vec<u64>> {
    let w: Vec<u64> = s
        .split(',')
        .map(|p| {
            p.trim().parse::<u64>().with_context(|| format!("--workers: `{p}` is not a count"))
        })
        .collect::<anyhow::Result<_>>()?;
    if w.is_empty() || w.contains(&0) || w.iter().any(|&n| n > 256) {
        bail!("--workers: give counts between 1 and 256");
    }
    Ok(w)
}

fn run_once(ctx: &Ctx, w: &Workload, s: &Sizes) -> anyhow::Result<Vec<Sample>> {
    match *w {
        Workload::Seq => workloads::seq(ctx, s.seq_mib),
        Workload::Rand => workloads::random(ctx, s.rand_mib, s.rand_ops),
        Workload::Meta { workers } => workloads::meta(ctx, workers, s.files, s.dirs),
        Workload::Small => workloads::small(ctx, s.small_files),
        Workload::Study { spread } => workloads::study(ctx, spread, s.study_ops),
        Workload::Locks => workloads::locks(ctx, s.lock_ops),
        Workload::Churn { workers, secs } => {
            workloads::churn(ctx, workers, secs, Duration::from_secs(30))
        }
    }
}

/// Folds the samples of every repetition into rows, keeping first-seen order.
pub fn merge(rows: &mut Vec<Row>, samples: Vec<Sample>, loadavg: f64) {
    for s in samples {
        match rows.iter_mut().find(|r| r.key == s.key) {
            Some(r) => {
                r.values.push(s.value);
                r.max_gap = r.max_gap.max(s.max_gap);
                r.errors += s.errors;
                r.loadavg = loadavg;
            }
            None => rows.push(Row {
                key: s.key,
                label: s.label,
                unit: s.unit,
                values: vec![s.value],
                loadavg,
                max_gap: s.max_gap,
                errors: s.errors,
            }),
        }
    }
}

pub fn main(args: Args) -> anyhow::Result<()> {
    if !args.mnt.is_dir() {
        bail!("{} is not a directory", args.mnt.display());
    }
    if args.reps == 0 {
        bail!("--reps: at least 1");
    }
    let sizes = Sizes::resolve(&args);
    let plan = plan(&args.only, &parse_workers(&args.workers)?, args.churn)?;
    let dir = args.mnt.join(format!("stoa-bench.{}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
    let together = match &args.together {
        Some(d) if !d.is_dir() => bail!("--together: {} is not a directory", d.display()),
        Some(_) if args.clients < 2 => bail!("--clients: at least 2 run together"),
        Some(d) => Some(Together::new(d.clone(), args.clients)),
        None => None,
    };
    let ctx = Ctx { dir: dir.clone(), quiet: args.quiet, together };
    let reps = if args.churn.is_some() { 1 } else { args.reps };
    eprintln!(
        "stoa bench: {} ({sizes:?}, {reps} repetition(s), load {:.2})",
        args.mnt.display(),
        report::loadavg()
    );
    let mut rows = Vec::new();
    let result = (|| -> anyhow::Result<()> {
        for w in &plan {
            for rep in 0..reps {
                let samples = run_once(&ctx, w, &sizes)
                    .with_context(|| format!("{w:?}, repetition {}", rep + 1))?;
                merge(&mut rows, samples, report::loadavg());
            }
        }
        Ok(())
    })();
    if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("stoa bench: could not remove {}: {e}", dir.display());
    }
    result?;
    print!("{}", report::table(&rows, args.gap || args.churn.is_some()));
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&rows))
            .with_context(|| format!("write {}", path.display()))?;
    }
    if args.churn.is_some() {
        // A worker stuck in the filesystem must not keep the process alive.
        std::process::exit(0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_expands_groups_and_workers() {
        let p = plan("meta,study", &[1, 8], None).unwrap();
        assert_eq!(
            p,
            vec![
                Workload::Meta { workers: 1 },
                Workload::Meta { workers: 8 },
                Workload::Study { spread: 1 },
                Workload::Study { spread: 100 },
            ]
        );
        assert_eq!(plan("seq,rand,meta,small,study,locks", &[1, 8], None).unwrap().len(), 8);
        assert_eq!(
            plan("seq", &[1, 8], Some(20)).unwrap(),
            vec![Workload::Churn { workers: 8, secs: 20 }]
        );
        assert!(plan("seq,bogus", &[1], None).is_err());
        assert!(plan("", &[1], None).is_err());
    }

    #[test]
    fn workers_must_be_counts() {
        assert_eq!(parse_workers("1, 8").unwrap(), vec![1, 8]);
        assert!(parse_workers("0").is_err());
        assert!(parse_workers("x").is_err());
    }

    #[test]
    fn merge_collects_repetitions_by_key() {
        let s = |key: &str, value: f64, gap_ms: u64| Sample {
            key: key.into(),
            label: key.into(),
            unit: "ops/s",
            value,
            max_gap: Duration::from_millis(gap_ms),
            errors: 1,
        };
        let mut rows = Vec::new();
        merge(&mut rows, vec![s("a", 1.0, 5), s("b", 2.0, 1)], 0.5);
        merge(&mut rows, vec![s("a", 3.0, 2), s("b", 4.0, 9)], 0.7);
        merge(&mut rows, vec![s("a", 2.0, 1), s("b", 6.0, 1)], 0.9);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].key, "a");
        assert_eq!(rows[0].values, vec![1.0, 3.0, 2.0]);
        assert_eq!(rows[0].median(), 2.0);
        assert_eq!(rows[0].max_gap, Duration::from_millis(5));
        assert_eq!(rows[1].max_gap, Duration::from_millis(9));
        assert_eq!(rows[1].errors, 3);
        assert_eq!(rows[1].loadavg, 0.9);
    }
}
