//! `stoa-fault`: runs fault scenarios against a cluster of network namespaces and prints
//! the summary. Exits 1 when any scenario shows an anomaly.

use anyhow::{bail, Context};
use clap::Parser;
use std::path::PathBuf;
use stoa_fault::run::{self, RunConfig};
use stoa_fault::scenario::{self, Scenario};

#[derive(Parser)]
#[command(name = "stoa-fault", about = "Jepsen-style fault tests for Stoa (run as root)")]
struct Args {
    /// Seed of every random choice; a run is reproducible from it.
    #[arg(long)]
    seed: Option<u64>,
    /// Every scenario twice, in a seeded order (about 12 minutes), instead of once.
    #[arg(long)]
    long: bool,
    /// Run these scenarios, in this order (repeatable); see --list.
    #[arg(long = "scenario")]
    scenarios: Vec<String>,
    /// Print the scenario names and exit.
    #[arg(long)]
    list: bool,
    /// The stoa binary (default: next to this one).
    #[arg(long)]
    stoa: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.list {
        for s in scenario::ALL {
            println!("{}", s.name());
        }
        return Ok(());
    }
    let seed = args.seed.unwrap_or_else(time_seed);
    let scenarios = if args.scenarios.is_empty() {
        run::pick(seed, args.long)
    } else {
        args.scenarios
            .iter()
            .map(|n| Scenario::parse(n).with_context(|| format!("no scenario {n}; see --list")))
            .collect::<anyhow::Result<_>>()?
    };
    let stoa = match args.stoa {
        Some(p) => p,
        None => std::env::current_exe()?.with_file_name("stoa"),
    };
    eprintln!(
        "stoa-fault: seed {seed}; reproduce with --seed {seed}{}",
        if args.long { " --long" } else { "" }
    );
    let cfg =
        RunConfig { cluster: run::default_cluster(stoa), seed, scenarios, clients_per_mount: 2 };
    let summary = run::run(&cfg)?;
    print!("{}", summary.render());
    let anomalies = summary.anomalies();
    if anomalies > 0 {
        bail!("{anomalies} anomalies (seed {seed})");
    }
    Ok(())
}

fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}
