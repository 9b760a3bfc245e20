//! `stoa`: the one binary. Every role of a Stoa cluster is a subcommand, so the same
//! binary runs a laptop cluster (`stoa dev`) and each machine of a production one.
//!
//! ```text
//!  stoa dev     -> spawns `stoa meta` x N and `stoa chunk` x M, waits for quorum, mounts
//!  stoa meta    -> stoa_metad::run      (one Raft replica of the namespace)
//!  stoa chunk   -> stoa_chunk::run      (one chunk server)
//!  stoa mount   -> stoa_fuse::mount     (one client session, FUSE)
//!  stoa status  -> MetaOp::Status on any replica, printed like corosync-quorumtool
//!  stoa admin   -> membership changes (meta add / remove) sent to the leader
//! ```
//!
//! Each command follows one path: flags and an optional TOML file are merged, validated
//! into a resolved config (a bad key or value is a one-line error naming it), then run.

mod cluster_file;
mod cmd;
mod config;
mod signal;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "stoa", version, about = "Stoa: a highly available distributed POSIX filesystem")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole cluster on this machine (meta replicas and chunk servers as separate
    /// processes on loopback) and mount it, in the foreground until Ctrl-C.
    Dev(cmd::dev::Args),
    /// Run one meta replica.
    Meta(cmd::meta::Args),
    /// Run one chunk server.
    Chunk(cmd::chunk::Args),
    /// Mount a cluster with FUSE, in the foreground until Ctrl-C or SIGTERM.
    Mount(cmd::mount::Args),
    /// Show membership, leader, quorum, chunk servers and chains.
    Status(cmd::status::Args),
    /// Change a running cluster: add or remove meta replicas.
    Admin(cmd::admin::Args),
    /// Measure a mounted directory: sequential and random I/O, metadata, small files.
    Bench(cmd::bench::Args),
}

fn init_logs() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("STOA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    // Colours only on a terminal: a log file or the journal would keep the escapes.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

fn main() {
    let cli = Cli::parse();
    init_logs();
    let result = match cli.command {
        Command::Dev(args) => cmd::dev::main(args),
        Command::Meta(args) => cmd::meta::main(args),
        Command::Chunk(args) => cmd::chunk::main(args),
        Command::Mount(args) => cmd::mount::main(args),
        Command::Status(args) => cmd::status::main(args),
        Command::Admin(args) => cmd::admin::main(args),
        Command::Bench(args) => cmd::bench::main(args),
    };
    if let Err(e) = result {
        eprintln!("stoa: error: {e:#}");
        std::process::exit(1);
    }
}
