//! Per-chunk ordering locks. The head holds one from assigning a version until the whole
//! chain has acknowledged, so writes to one chunk reach every replica in version order;
//! other chunks are not held up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use stoa_types::ChunkId;
use tokio::sync::OwnedMutexGuard;

type Lock = Arc<tokio::sync::Mutex<()>>;

#[derive(Default)]
pub(crate) struct OrderLocks {
    locks: Mutex<HashMap<ChunkId, Lock>>,
}

/// Held while a chunk's mutation is in flight; releasing it forgets an unused lock.
pub(crate) struct OrderGuard<'a> {
    owner: &'a OrderLocks,
    chunk: ChunkId,
    lock: Lock,
    guard: Option<OwnedMutexGuard<()>>,
}

impl OrderLocks {
    pub async fn lock(&self, chunk: ChunkId) -> OrderGuard<'_> {
        let lock =
            self.locks.lock().expect("order locks poisoned").entry(chunk).or_default().clone();
        let guard = lock.clone().lock_owned().await;
        OrderGuard { owner: self, chunk, lock, guard: Some(guard) }
    }
}

impl Drop for OrderGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut locks = self.owner.locks.lock().expect("order locks poisoned");
        // The map and this guard are the only holders: nobody waits, so forget it.
        if Arc::strong_count(&self.lock) == 2 {
            locks.remove(&self.chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoa_types::InodeId;

    #[tokio::test]
    async fn one_chunk_is_serialized_and_others_are_not() {
        let locks = OrderLocks::default();
        let a = ChunkId { ino: InodeId(1), index: 0 };
        let b = ChunkId { ino: InodeId(1), index: 1 };
        let held = locks.lock(a).await;
        let _other = locks.lock(b).await;
        let waiting = tokio::time::timeout(std::time::Duration::from_millis(50), locks.lock(a));
        assert!(waiting.await.is_err(), "a second holder of one chunk must wait");
        drop(held);
        drop(locks.lock(a).await);
        drop(_other);
        assert!(locks.locks.lock().unwrap().is_empty(), "unused locks are forgotten");
    }
}
