//! The kernel side of capabilities: the client drops the kernel's cached entries, pages
//! and attributes through FUSE notifications when meta recalls a cap, and `O_APPEND`
//! writes land where the client (not the kernel) says the file ends.

use crate::fs::{fail, Kernel};
use crate::ids::KernelIds;
use fuser::{FileHandle, INodeNo, ReplyWrite};
use std::ffi::OsStr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use stoa_client::{Client, InodeId, KernelCache};

/// `FUSE_NOTIFY_INC_EPOCH` (protocol 7.44, Linux 6.16): every dentry the kernel cached
/// before it is revalidated on its next use. fuser does not send it, so it is written to
/// the FUSE device here: a bare `fuse_out_header` whose `unique` is 0 and whose `error`
/// is the notification code.
const FUSE_NOTIFY_INC_EPOCH: i32 = 8;

/// The mount's FUSE notifier, as the client's [`KernelCache`]. Before the session exists
/// there is nothing cached to drop.
pub struct Notify {
    kernel: Kernel,
    /// The kernel's node ids of each inode: each is told.
    ids: Arc<KernelIds>,
    /// The FUSE device (a duplicate of the session's descriptor), for notifications
    /// fuser does not send.
    dev: OwnedFd,
    /// Cleared when the kernel refused `FUSE_NOTIFY_INC_EPOCH`.
    epochs: AtomicBool,
    /// Set once the kernel was asked for `FUSE_NOTIFY_INC_EPOCH`: until then, whether it
    /// takes it is not known.
    probed: AtomicBool,
}

impl Notify {
    pub fn new(kernel: Kernel, ids: Arc<KernelIds>, dev: OwnedFd) -> Notify {
        let (epochs, probed) = (AtomicBool::new(true), AtomicBool::new(false));
        Notify { kernel, ids, dev, epochs, probed }
    }

    fn inc_epoch(&self) -> std::io::Result<()> {
        const LEN: usize = 16;
        let mut header = [0u8; LEN];
        header[0..4].copy_from_slice(&(LEN as u32).to_ne_bytes());
        header[4..8].copy_from_slice(&FUSE_NOTIFY_INC_EPOCH.to_ne_bytes());
        // SAFETY: writes `header.len()` bytes from a live buffer to a descriptor we own.
        let n = unsafe { libc::write(self.dev.as_raw_fd(), header.as_ptr().cast(), LEN) };
        match n {
            n if n == LEN as isize => Ok(()),
            n if n < 0 => Err(std::io::Error::last_os_error()),
            n => Err(std::io::Error::other(format!("the FUSE device took {n} of 16 bytes"))),
        }
    }
}

impl KernelCache for Notify {
    fn expire_all_names(&self) -> bool {
        self.probed.store(true, Ordering::Relaxed);
        if !self.epochs.load(Ordering::Relaxed) {
            return false;
        }
        match self.inc_epoch() {
            Ok(()) => true,
            Err(e) => {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    tracing::info!(
                        "the kernel cannot expire all names at once (before Linux 6.16): \
                         names are dropped one at a time"
                    );
                    self.epochs.store(false, Ordering::Relaxed);
                } else {
                    tracing::debug!("expiring the kernel's names: {e}");
                }
                false
            }
        }
    }

    fn can_expire_all_names(&self) -> bool {
        // The first answer is the kernel's, not a guess: an absence is cached only where
        // a recall can expire it. Expiring every name once costs a lookup of each.
        if !self.probed.load(Ordering::Relaxed) {
            self.expire_all_names();
        }
        self.epochs.load(Ordering::Relaxed)
    }

    fn inval_inode(&self, ino: InodeId) {
        let Some(kernel) = self.kernel.get() else { return };
        for node in self.ids.nodes(ino) {
            // Offset 0 and length 0: every page, and the attributes.
            if let Err(e) = kernel.inval_inode(INodeNo(node), 0, 0) {
                // ENOENT: the kernel has no node for it, so nothing cached either.
                tracing::debug!("invalidating node {node:#x} in the kernel: {e}");
            }
        }
    }

    fn inval_entry(&self, parent: InodeId, name: &[u8]) {
        let Some(kernel) = self.kernel.get() else { return };
        for node in self.ids.nodes(parent) {
            if let Err(e) = kernel.inval_entry(INodeNo(node), OsStr::from_bytes(name)) {
                tracing::debug!("invalidating entry {node:#x}/{:?}: {e}", OsStr::from_bytes(name));
            }
        }
    }
}

/// An `O_APPEND` write: the client appends at the end of the file as every mount sees
/// it. When that is not where the kernel thought the file ended, or the kernel may have
/// cached pages of the file meanwhile, the kernel's pages of the range written are dropped
/// before the answer (the file is open with direct I/O, so the kernel put nothing there
/// itself).
pub async fn append(
    c: Client,
    kernel: Kernel,
    i: INodeNo,
    h: FileHandle,
    kernel_offset: u64,
    data: Vec<u8>,
    reply: ReplyWrite,
) {
    match c.write_append(stoa_client::FileHandle(h.0), &data).await {
        Ok(offset) => {
            let fh = stoa_client::FileHandle(h.0);
            if c.take_kernel_pages(fh) || offset != kernel_offset {
                drop_pages(&kernel, i, offset, data.len()).await;
            }
            reply.written(data.len() as u32);
        }
        Err(e) => reply.error(fail("write", &e)),
    }
}

/// Drops the kernel's cached pages of `len` bytes of inode `i` at `offset`.
pub async fn drop_pages(kernel: &Kernel, i: INodeNo, offset: u64, len: usize) {
    let kernel = kernel.clone();
    let (offset, len) = (offset as i64, len as i64);
    let dropped = tokio::task::spawn_blocking(move || match kernel.get() {
        Some(k) => k.inval_inode(i, offset, len),
        None => Ok(()),
    });
    if let Ok(Err(e)) = dropped.await {
        tracing::debug!("invalidating pages of inode {}: {e}", i.0);
    }
}
