//! `stoa-memfs MNT...`: one filesystem in memory, mounted at each mount point given (two
//! mount points are two clients of it), served until SIGINT or SIGTERM or until every
//! mount is unmounted. A benchmark ceiling: every request is answered at once, so its
//! figures are what FUSE itself allows on the machine (bench/peers.sh).

mod fs;
mod tree;

use fuser::{Config, MountOption, Session, SessionACL};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// As many threads reading the device as Stoa's mount has.
const FUSE_THREADS: usize = 2;

fn main() {
    let mounts: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    if mounts.is_empty() || mounts.iter().any(|m| m.as_os_str() == "--help") {
        eprintln!("usage: stoa-memfs MOUNTPOINT... (one filesystem in memory, mounted at each)");
        std::process::exit(2);
    }
    if let Err(e) = run(&mounts) {
        eprintln!("stoa-memfs: {e}");
        std::process::exit(1);
    }
}

fn run(mounts: &[PathBuf]) -> Result<(), String> {
    let signals = block_signals();
    let tree = Arc::new(Mutex::new(tree::Tree::default()));
    let mut sessions = Vec::new();
    for m in mounts {
        // On an error, the sessions already made unmount as they are dropped.
        let session = Session::new(fs::MemFs::new(tree.clone()), m, &config())
            .and_then(Session::spawn)
            .map_err(|e| format!("mounting {}: {e}", m.display()))?;
        sessions.push(session);
    }
    let all = mounts.to_vec();
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: `signals` is an initialised set; sigwait only writes `sig`.
        unsafe { libc::sigwait(&signals, &mut sig) };
        unmount(&all);
    });
    for s in sessions {
        s.join().map_err(|e| format!("serving: {e}"))?;
    }
    Ok(())
}

fn config() -> Config {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("memfs".into()),
        MountOption::Subtype("memfs".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    config.acl = if root { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(FUSE_THREADS);
    config
}

/// Blocks SIGINT and SIGTERM in every thread to come, for one thread to wait for them.
fn block_signals() -> libc::sigset_t {
    // SAFETY: the set is initialised by sigemptyset before use; the calls only read it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

fn unmount(mounts: &[PathBuf]) {
    for m in mounts {
        let done = std::process::Command::new("fusermount3").arg("-u").arg(m).status();
        if !matches!(done, Ok(s) if s.success()) {
            eprintln!("stoa-memfs: could not unmount {}", m.display());
        }
    }
}
