//! Which fan-out directory holds a chunk's files, and the store's layout version.
//!
//! ```text
//!  DATA/chunks/LAYOUT    magic "STLY", layout u32, crc32c u32 (sealed.rs; absent: layout 1)
//! ```
//!
//! Layout 2 (this one) puts a chunk in directory `((ino >> 8) ^ index) & 0xff`: 256
//! consecutive inodes share a directory. A client creates files with consecutive inode
//! numbers (it reserves them in ranges), so the chunks of a burst of small files are
//! created in one directory, and a filesystem like ext4 gives their inodes and blocks
//! neighbouring places on disk. Layout 1 picked the directory by the inode's low byte,
//! spreading such a burst over all 256 directories: after a cache drop every new or read
//! chunk cost its own read of an inode table (50-100 MiB read per 500 small files per
//! server, against 0-3 MiB now).
//!
//! A store without the file is layout 1 (or empty): [`ensure`] moves every file to the
//! directory layout 2 gives it, then writes the file. A crash part way leaves each file
//! whole in one of the two places (a rename is atomic) and no `LAYOUT`, so the next open
//! finishes the move.

use super::{each_file, io_err, parse_file_name};
use crate::sealed;
use std::collections::BTreeSet;
use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use stoa_types::{ChunkId, FsError};

const MAGIC: &[u8; 4] = b"STLY";
const LAYOUT: u32 = 2;
const FILE: &str = "LAYOUT";

/// The fan-out directory of `chunk` (its name is this as two hex digits).
pub(super) fn fan(chunk: ChunkId) -> u8 {
    ((chunk.ino.0 >> 8) ^ chunk.index) as u8
}

/// Makes the store under `chunks_dir` layout 2, moving the files of an older store.
/// A `LAYOUT` file that is damaged or names another layout is an error: nothing is
/// moved then.
pub(super) fn ensure(chunks_dir: &Path) -> Result<(), FsError> {
    let path = chunks_dir.join(FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            return decode(&bytes).map_err(|detail| {
                FsError::Io(format!("chunk store layout {}: {detail}", path.display()))
            })
        }
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(format!("read {}", path.display()), e)),
    }
    let moved = migrate(chunks_dir)?;
    if moved > 0 {
        tracing::info!(
            "chunk store {}: moved {moved} files to chunk layout {LAYOUT}",
            chunks_dir.display()
        );
    }
    sealed::store(chunks_dir, FILE, &encode())
        .map_err(|e| io_err(format!("write {}", chunks_dir.join(FILE).display()), e))
}

/// Moves every chunk file not in its layout-2 directory there; returns how many moved.
/// Each directory a file left or entered is fsynced before the layout is declared.
fn migrate(chunks_dir: &Path) -> Result<u64, FsError> {
    let mut moved = 0;
    let mut touched = BTreeSet::new();
    each_file(chunks_dir, |fan_dir, name| {
        let Some(chunk) = parse_file_name(name) else { return Ok(()) };
        let to_dir = chunks_dir.join(format!("{:02x}", fan(chunk)));
        if to_dir == fan_dir {
            return Ok(());
        }
        std::fs::create_dir_all(&to_dir)
            .map_err(|e| io_err(format!("create {}", to_dir.display()), e))?;
        let (from, to) = (fan_dir.join(name), to_dir.join(name));
        std::fs::rename(&from, &to)
            .map_err(|e| io_err(format!("move {} to {}", from.display(), to.display()), e))?;
        touched.insert(fan_dir.to_path_buf());
        touched.insert(to_dir);
        moved += 1;
        Ok(())
    })?;
    for dir in touched.iter().map(PathBuf::as_path).chain([chunks_dir]) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(format!("fsync {}", dir.display()), e))?;
    }
    Ok(moved)
}

fn encode() -> Vec<u8> {
    sealed::seal(MAGIC, LAYOUT, &[])
}

fn decode(bytes: &[u8]) -> Result<(), String> {
    let (layout, _) = sealed::unseal(bytes, MAGIC, 0, "a layout")?;
    if layout != LAYOUT {
        return Err(format!("layout {layout}, this server reads layout {LAYOUT}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::Engine;
    use super::*;
    use stoa_types::InodeId;

    fn chunk(ino: u64, index: u64) -> ChunkId {
        ChunkId { ino: InodeId(ino), index }
    }

    #[test]
    fn a_burst_of_consecutive_inodes_shares_a_directory() {
        assert!((0x100..0x200).all(|ino| fan(chunk(ino, 0)) == fan(chunk(0x100, 0))));
        assert_ne!(fan(chunk(0x1ff, 0)), fan(chunk(0x200, 0)));
        // The chunks of one large file spread out.
        assert_ne!(fan(chunk(0x100, 0)), fan(chunk(0x100, 1)));
    }

    /// A store of layout 1 (no `LAYOUT`, files in other directories; also what a crash
    /// part way through the move leaves) has every file moved where layout 2 wants it,
    /// readable, and is declared layout 2; nothing moves on the next open.
    #[test]
    fn an_older_store_is_moved_to_this_layout_and_reads_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let chunks_dir = dir.path().join("chunks");
        let data = vec![9u8; 5000];
        let (a, b) = (chunk(0x1234, 0), chunk(0x1235, 3));
        {
            let e = Engine::open(dir.path()).unwrap();
            e.write(a, 0, &data, None, None).unwrap();
            e.write(b, 100, &data, None, None).unwrap();
        }
        // Put `a`'s files where layout 1 had them, and `b`'s data only (a move cut short).
        let old_dir = |c: ChunkId| chunks_dir.join(format!("{:02x}", c.ino.0 as u8));
        let moves = [(a, format!("{a}")), (a, format!("{a}.meta")), (b, format!("{b}"))];
        for (c, name) in &moves {
            let new = chunks_dir.join(format!("{:02x}", fan(*c))).join(name);
            std::fs::create_dir_all(old_dir(*c)).unwrap();
            std::fs::rename(new, old_dir(*c).join(name)).unwrap();
        }
        std::fs::remove_file(chunks_dir.join(FILE)).unwrap();

        let e = Engine::open(dir.path()).unwrap();
        assert_eq!(e.read(a, 0, 10_000).unwrap(), data);
        assert_eq!(e.read(b, 100, 10_000).unwrap(), data);
        assert_eq!(e.chunk_ids().unwrap(), vec![a, b]);
        for (c, name) in &moves {
            assert!(!old_dir(*c).join(name).exists(), "{name} left in the old directory");
        }
        assert_eq!(std::fs::read(chunks_dir.join(FILE)).unwrap(), encode());
        assert_eq!(migrate(&chunks_dir).unwrap(), 0, "every file is in place");
    }

    #[test]
    fn a_damaged_or_unknown_layout_file_refuses_the_store_and_moves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let chunks_dir = dir.path().join("chunks");
        drop(Engine::open(dir.path()).unwrap());
        let misplaced = chunks_dir.join("00").join(format!("{}", chunk(0x4200, 0)));
        std::fs::create_dir_all(misplaced.parent().unwrap()).unwrap();
        std::fs::write(&misplaced, b"x").unwrap();

        let mut damaged = encode();
        damaged[5] ^= 1;
        std::fs::write(chunks_dir.join(FILE), &damaged).unwrap();
        let err = Engine::open(dir.path()).err().expect("a damaged layout is refused");
        assert!(err.to_string().contains("checksum mismatch"), "{err}");

        let mut future = MAGIC.to_vec();
        future.extend_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&future);
        future.extend_from_slice(&crc.to_le_bytes());
        std::fs::write(chunks_dir.join(FILE), &future).unwrap();
        let err = Engine::open(dir.path()).err().expect("another layout is refused");
        assert!(err.to_string().contains("layout 3, this server reads layout 2"), "{err}");

        std::fs::write(chunks_dir.join(FILE), b"").unwrap();
        let err = Engine::open(dir.path()).err().expect("an empty layout file is refused");
        assert!(err.to_string().contains("not a layout file"), "{err}");
        assert!(misplaced.exists(), "nothing moved");
    }
}
