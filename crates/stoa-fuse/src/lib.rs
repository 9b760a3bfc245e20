//! A thin FUSE adapter over `stoa-client`: it turns kernel requests into client calls
//! and client answers into kernel replies, and owns the mount's lifecycle.
//!
//! ```text
//!  kernel --/dev/fuse--> fuser thread: Client call --> reply
//!                                     \--(has to wait)--> tokio task --> reply
//!
//!  mount(): check mount point (missing / not a dir / busy / stale -> detach)
//!        -> Client::connect -> fuser Session (mount + INIT) -> run until
//!           shutdown resolves (flush all, unmount) or someone unmounts it
//! ```
//!
//! The FUSE node id is the inode number (the root is inode 1, FUSE's root id), so every
//! hard link of a file is one kernel node. The kernel checks permissions itself
//! (`default_permissions`) and caches attributes, entries and pages for as long as the
//! client holds a capability on them (docs/flows/caps.md): a recall drops them through
//! FUSE notifications. Data goes through the page cache, so mmap works.

pub mod attr;
mod caller;
mod caps;
mod dirs;
mod error;
mod fs;
mod ids;
mod locks;
mod mountpoint;
mod names;
mod slow;

pub use error::FuseError;
pub use mountpoint::prepare as prepare_mount_point;

use fuser::{Config, MountOption, Session, SessionACL};
use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use stoa_client::{Client, ClientConfig};

/// What to mount where.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// Addresses of meta replicas.
    pub meta: Vec<SocketAddr>,
    pub mountpoint: PathBuf,
    /// The client's name, shown in cluster status.
    pub name: String,
    /// The most caps the client keeps ([`stoa_client::ClientConfig::caps_max`]).
    pub caps_max: usize,
    /// Bytes of file data the client keeps ([`stoa_client::ClientConfig::data_cache_bytes`]).
    pub data_cache_bytes: usize,
}

/// How long shutdown waits for the kernel to end the session after the unmount.
const SESSION_END_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Threads reading the FUSE device; a request that has to wait goes on to tokio.
const FUSE_THREADS: usize = 2;

/// Mounts the cluster at `cfg.mountpoint` and serves it until `shutdown` resolves (then
/// flushes every file, unmounts and returns) or the filesystem is unmounted from
/// outside. Must run inside a multi-threaded tokio runtime.
pub async fn mount(
    cfg: MountConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), FuseError> {
    let requested = cfg.mountpoint.clone();
    let path = tokio::task::spawn_blocking(move || mountpoint::prepare(&requested))
        .await
        .expect("mount point check panicked")?;
    let client_cfg = ClientConfig {
        meta: cfg.meta,
        name: cfg.name,
        caps_max: cfg.caps_max,
        data_cache_bytes: cfg.data_cache_bytes,
    };
    let client = Client::connect(client_cfg).await.map_err(FuseError::Connect)?;
    let (kernel, ids) = (fs::Kernel::default(), Arc::new(ids::KernelIds::default()));
    let rt = tokio::runtime::Handle::current();
    let waiting = Arc::new(slow::Waiting::default());
    let _watch = Watch(tokio::spawn(slow::watch(waiting.clone(), client.clone())));
    let fs = fs::StoaFs::new(client.clone(), rt, kernel.clone(), ids.clone(), waiting);
    let config = fuse_config();
    let at = path.clone();
    let mut session = tokio::task::spawn_blocking(move || Session::new(fs, &at, &config))
        .await
        .expect("FUSE mount panicked")
        .map_err(|source| FuseError::Mount { path: path.clone(), source })?;
    tracing::info!("mounted Stoa at {}", path.display());
    let _ = kernel.set(session.notifier());
    let dev = std::os::fd::AsFd::as_fd(&session)
        .try_clone_to_owned()
        .map_err(|source| FuseError::Mount { path: path.clone(), source })?;
    client.set_kernel_cache(Arc::new(caps::Notify::new(kernel.clone(), ids, dev)));
    let unmounter = session.unmount_callable();
    let mut run = tokio::task::spawn_blocking(move || session.run());
    tokio::pin!(shutdown);
    let by_shutdown = tokio::select! {
        _ = &mut run => false,
        () = &mut shutdown => true,
    };
    if by_shutdown {
        if let Err(e) = client.flush_all().await {
            tracing::warn!("flushing before unmount: {e}");
        }
        if let Err(e) = unmount(&path, unmounter).await {
            close(&client).await;
            return Err(e);
        }
        let ended = match tokio::time::timeout(SESSION_END_WAIT, run).await {
            Ok(ended) => ended.expect("FUSE session panicked"),
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the FUSE session did not end after unmount",
            )),
        };
        // The session is closed either way, so that meta releases what it held (locks)
        // at once instead of when its lease runs out.
        close(&client).await;
        return ended.map_err(|source| FuseError::Session { path: path.clone(), source });
    }
    tracing::info!("{} was unmounted", path.display());
    close(&client).await;
    Ok(())
}

/// The slow-request watch of a mount, stopped when the mount ends.
struct Watch(tokio::task::JoinHandle<()>);

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn close(client: &Client) {
    if let Err(e) = client.close().await {
        tracing::warn!("closing the session: {e}");
    }
}

/// Unmounts `path`. When the plain unmount fails (files still open), the mount is
/// detached from the namespace and its FUSE connection aborted, so the session ends.
async fn unmount(path: &Path, mut unmounter: fuser::SessionUnmounter) -> Result<(), FuseError> {
    let at = path.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let dev = std::fs::metadata(&at).ok().map(|m| std::os::unix::fs::MetadataExt::dev(&m));
        if let Err(e) = unmounter.unmount() {
            tracing::warn!("unmounting {} failed ({e}); detaching it", at.display());
            mountpoint::detach(&at)?;
            if let Some(dev) = dev {
                abort_connection(dev);
            }
        }
        Ok(())
    })
    .await
    .expect("unmount panicked")
}

/// Aborts the FUSE connection of device `dev` through fusectl, ending its session even
/// while files on a detached mount are still open.
fn abort_connection(dev: u64) {
    const FUSECTL: &str = "/sys/fs/fuse/connections";
    let minor = libc::minor(dev);
    let abort = format!("{FUSECTL}/{minor}/abort");
    if !std::path::Path::new(&abort).exists() {
        // fusectl is often not mounted in containers; as root we can mount it.
        let status = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl", FUSECTL])
            .stderr(std::process::Stdio::null())
            .status();
        tracing::debug!("mounting fusectl on {FUSECTL}: {status:?}");
    }
    if let Err(e) = std::fs::write(&abort, b"1") {
        tracing::warn!("aborting the FUSE connection via {abort}: {e}");
    }
}

fn fuse_config() -> Config {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let options = vec![
        MountOption::FSName("stoa".into()),
        MountOption::Subtype("stoa".into()),
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    // No AutoUnmount: it hands the unmount to a fusermount3 helper process that does not
    // survive in every environment (containers), and then unmount on shutdown silently
    // does nothing. A mount left behind by a killed process is detached by the next
    // `mount` on that mount point instead.
    let mut config = Config::default();
    config.mount_options = options;
    // allow_other needs root, or user_allow_other in /etc/fuse.conf.
    config.acl = if root { SessionACL::All } else { SessionACL::Owner };
    config.n_threads = Some(FUSE_THREADS);
    config
}
