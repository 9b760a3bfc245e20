//! The kernel side of capabilities: the client drops the kernel's cached entries, pages
//! and attributes through FUSE notifications when meta recalls a cap, and `O_APPEND`
//! writes land where the client (not the kernel) says the file ends.

use crate::fs::{fail, Kernel};
use fuser::{FileHandle, INodeNo, ReplyWrite};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use stoa_client::{Client, InodeId, KernelCache};

/// The mount's FUSE notifier, as the client's [`KernelCache`]. Before the session exists
/// there is nothing cached to drop.
pub struct Notify(pub Kernel);

impl KernelCache for Notify {
    fn inval_inode(&self, ino: InodeId) {
        if let Some(kernel) = self.0.get() {
            // Offset 0 and length 0: every page, and the attributes.
            if let Err(e) = kernel.inval_inode(INodeNo(ino.0), 0, 0) {
                // ENOENT: the kernel has no node for it, so nothing cached either.
                tracing::debug!("invalidating inode {ino} in the kernel: {e}");
            }
        }
    }

    fn inval_entry(&self, parent: InodeId, name: &[u8]) {
        if let Some(kernel) = self.0.get() {
            if let Err(e) = kernel.inval_entry(INodeNo(parent.0), OsStr::from_bytes(name)) {
                tracing::debug!("invalidating entry {parent}/{:?}: {e}", OsStr::from_bytes(name));
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
