//! Lock requests from the kernel, translated for the client: `fcntl` lock types to
//! [`LockKind`], and the answers back.

use crate::attr::errno;
use crate::fs::Kernel;
use fuser::{Errno, INodeNo, ReplyEmpty, ReplyLock};
use stoa_client::{Client, FsError, InodeId, LockKind, LockRequest};

/// The kind named by an `fcntl` lock type (`F_RDLCK`, `F_WRLCK`, `F_UNLCK`).
pub fn kind(typ: i32) -> Option<LockKind> {
    match typ {
        libc::F_RDLCK => Some(LockKind::Read),
        libc::F_WRLCK => Some(LockKind::Write),
        libc::F_UNLCK => Some(LockKind::Unlock),
        _ => None,
    }
}

fn typ(kind: LockKind) -> i32 {
    match kind {
        LockKind::Read => libc::F_RDLCK,
        LockKind::Write => libc::F_WRLCK,
        LockKind::Unlock => libc::F_UNLCK,
    }
}

fn log_err(what: &str, e: &FsError) -> Errno {
    if !matches!(e, FsError::WouldBlock | FsError::Interrupted) {
        tracing::warn!("{what} failed: {e}");
    }
    errno(e)
}

/// F_GETLK: the blocking lock, or the range reported free (type F_UNLCK).
pub async fn getlk(c: Client, ino: InodeId, req: LockRequest, reply: ReplyLock) {
    match c.getlk(ino, req).await {
        Ok(Some(held)) => reply.locked(held.start, held.end, typ(held.kind), held.pid),
        Ok(None) => reply.locked(req.start, req.end, libc::F_UNLCK, 0),
        Err(e) => reply.error(log_err("getlk", &e)),
    }
}

/// F_SETLK / F_SETLKW. A lock taken makes the kernel drop what it cached of the file,
/// so that the holder reads what the previous holder wrote.
pub async fn setlk(
    c: Client,
    kernel: Kernel,
    ino: InodeId,
    req: LockRequest,
    wait: bool,
    reply: ReplyEmpty,
) {
    match c.setlk(ino, req, wait).await {
        Ok(()) => {
            if req.kind != LockKind::Unlock {
                if let Some(kernel) = kernel.get() {
                    if let Err(e) = kernel.inval_inode(INodeNo(ino.0), 0, 0) {
                        tracing::debug!("invalidating inode {ino} after a lock: {e}");
                    }
                }
            }
            reply.ok()
        }
        Err(e) => reply.error(log_err("setlk", &e)),
    }
}
