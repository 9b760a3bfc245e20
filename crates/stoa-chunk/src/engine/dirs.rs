//! Which fan-out directories hold entries no fsync of the directory has made durable.
//!
//! A sync makes a chunk durable: its file's data (`fdatasync`) and its name in its
//! directory. The name changes only when the file is made, replaced by an install or
//! removed, so a sync of a chunk written in place before needs no fsync of the
//! directory: on a database's commit (one durable 4 KiB write) that fsync was a quarter
//! of each server's flush.
//!
//! Invariant: a directory is fsynced by a sync unless an fsync of it that *started
//! after* the directory's latest change has *finished*. Each directory counts its
//! changes (`changed`, raised after the change is made) and remembers the count the
//! last finished fsync started from (`synced`); a sync that finds `synced < changed`
//! fsyncs itself, even while another fsync of the same directory is under way, since
//! that one may have started before the change.
//!
//! A store opened after a crash of the process may hold names only in the page cache,
//! so every directory starts changed.

use std::fs::File;
use std::path::Path;
use std::sync::Mutex;
use stoa_types::FsError;

#[derive(Clone, Copy)]
struct Counts {
    changed: u64,
    synced: u64,
}

pub(super) struct DirSyncs {
    fans: Mutex<Vec<Counts>>,
    /// fsyncs of directories made, for tests.
    #[cfg(test)]
    pub(super) flushes: std::sync::atomic::AtomicU64,
}

impl DirSyncs {
    pub(super) fn new() -> DirSyncs {
        DirSyncs {
            fans: Mutex::new(vec![Counts { changed: 1, synced: 0 }; 256]),
            #[cfg(test)]
            flushes: Default::default(),
        }
    }

    /// Notes a change of an entry of directory `fan`, after it was made.
    pub(super) fn changed(&self, fan: u8) {
        self.lock()[usize::from(fan)].changed += 1;
    }

    /// Makes every change of directory `fan` (at `dir`) noted so far durable.
    pub(super) fn sync(&self, fan: u8, dir: &Path) -> Result<(), FsError> {
        let wanted = {
            let counts = self.lock()[usize::from(fan)];
            if counts.synced >= counts.changed {
                return Ok(());
            }
            counts.changed
        };
        let what = || format!("sync {}", dir.display());
        match File::open(dir) {
            Ok(d) => {
                d.sync_all().map_err(|e| super::io_err(what(), e))?;
                #[cfg(test)]
                self.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            // Never made: nothing in it to make durable.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(super::io_err(what(), e)),
        }
        let mut fans = self.lock();
        let counts = &mut fans[usize::from(fan)];
        counts.synced = counts.synced.max(wanted);
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Counts>> {
        self.fans.lock().expect("directory sync counts lock poisoned")
    }
}
