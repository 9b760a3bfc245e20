//! Which fan-out directory holds a chunk's file, how a chunk is stored, and the store's
//! layout version.
//!
//! ```text
//!  DATA/chunks/LAYOUT    magic "STLY", layout u32, crc32c u32 (sealed.rs; absent: layout 1)
//! ```
//!
//! Layout 3 (this one) keeps each chunk in one file, `<chunk id>.chunk`, its header in
//! two slots before the data (mod.rs). Layout 2 kept a data file `<chunk id>` and a header
//! file `<chunk id>.meta` (header.rs, formats 1 and 2), replaced by rename on every
//! change. Both put a chunk in directory `((ino >> 8) ^ index) & 0xff`: 256
//! consecutive inodes share a directory. A client creates files with consecutive inode
//! numbers (it reserves them in ranges), so the chunks of a burst of small files are
//! created in one directory, and a filesystem like ext4 gives their inodes and blocks
//! neighbouring places on disk. Layout 1 picked the directory by the inode's low byte,
//! spreading such a burst over all 256 directories: after a cache drop every new or read
//! chunk cost its own read of an inode table (50-100 MiB read per 500 small files per
//! server, against 0-3 MiB now).
//!
//! A store without the file is layout 1 (or empty): [`ensure`] first moves every file to
//! the directory layout 2 gives it. A crash part way leaves each file whole in one of the
//! two places (a rename is atomic) and no `LAYOUT`, so the next open finishes the move.
//! Then it joins each chunk's two files into one: the new file is written whole beside
//! them, synced and renamed into place, and only then are the old ones removed; a crash
//! leaves the old files, or the new file with old ones the next open removes. Last it
//! writes `LAYOUT`.

use super::header::Header;
use super::{
    each_file, io_err, parse_file_name, remove_if_present, slot_at, write_whole, CHUNK_EXT,
    DATA_AT, TMP_EXT,
};
use crate::sealed;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::ErrorKind;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use stoa_types::{ChunkId, FsError};

const MAGIC: &[u8; 4] = b"STLY";
const LAYOUT: u32 = 3;
/// Layout 2: a data file and a header file per chunk.
const LAYOUT_SPLIT: u32 = 2;
const FILE: &str = "LAYOUT";
/// The extension of a layout-2 header file.
pub(super) const HEADER_EXT: &str = "meta";
/// What a joined chunk's header slot holds when its layout-2 header file was damaged: a
/// header of format 0, which reads as damaged, so the chunk is repaired from a replica.
const DAMAGED: &[u8; 8] = b"STCH\0\0\0\0";

/// The fan-out directory of `chunk` (its name is this as two hex digits).
pub(super) fn fan(chunk: ChunkId) -> u8 {
    ((chunk.ino.0 >> 8) ^ chunk.index) as u8
}

/// Makes the store under `chunks_dir` layout 3, converting an older store. A `LAYOUT`
/// file that is damaged or names an unknown layout is an error: nothing is touched then.
pub(super) fn ensure(chunks_dir: &Path) -> Result<(), FsError> {
    let path = chunks_dir.join(FILE);
    let found = match std::fs::read(&path) {
        Ok(bytes) => decode(&bytes).map_err(|detail| {
            FsError::Io(format!("chunk store layout {}: {detail}", path.display()))
        })?,
        Err(e) if e.kind() == ErrorKind::NotFound => 1,
        Err(e) => return Err(io_err(format!("read {}", path.display()), e)),
    };
    if found == LAYOUT {
        return Ok(());
    }
    let moved = if found < LAYOUT_SPLIT { migrate(chunks_dir)? } else { 0 };
    let joined = join_files(chunks_dir)?;
    if moved + joined > 0 {
        tracing::info!(
            "chunk store {}: chunk layout {LAYOUT}: moved {moved} files, joined {joined} chunks",
            chunks_dir.display()
        );
    }
    sealed::store(chunks_dir, FILE, &encode())
        .map_err(|e| io_err(format!("write {}", chunks_dir.join(FILE).display()), e))
}

/// Joins the data and header files of every chunk of a layout-2 store into one chunk
/// file; returns how many chunks it joined. Each directory is fsynced after its chunks.
fn join_files(chunks_dir: &Path) -> Result<u64, FsError> {
    let new_suffix = format!(".{CHUNK_EXT}");
    let mut split: BTreeMap<PathBuf, BTreeSet<ChunkId>> = BTreeMap::new();
    each_file(chunks_dir, |fan_dir, name| {
        let name = name.strip_suffix(&format!(".{TMP_EXT}")).unwrap_or(name);
        if !name.ends_with(&new_suffix) {
            if let Some(chunk) = parse_file_name(name) {
                split.entry(fan_dir.to_path_buf()).or_default().insert(chunk);
            }
        }
        Ok(())
    })?;
    let mut joined = 0;
    for (dir, chunks) in &split {
        for &chunk in chunks {
            joined += u64::from(join_one(dir, chunk)?);
        }
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io_err(format!("fsync {}", dir.display()), e))?;
    }
    Ok(joined)
}

/// Joins the layout-2 files of `chunk` in `dir` into its chunk file, unless that exists
/// already (a crash after the rename), then removes them; whether it joined. A data
/// file without a header is what a crash before a new chunk's first header left, not a
/// chunk, and goes. A damaged header stays damaged.
fn join_one(dir: &Path, chunk: ChunkId) -> Result<bool, FsError> {
    let name = chunk.to_string();
    let data = dir.join(&name);
    let header = dir.join(format!("{name}.{HEADER_EXT}"));
    let file = dir.join(format!("{name}.{CHUNK_EXT}"));
    let tmp = dir.join(format!("{name}.{CHUNK_EXT}.{TMP_EXT}"));
    let read = |path: &Path| match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(format!("read {}", path.display()), e)),
    };
    let joined = match file.exists() {
        true => false,
        false => match read(&header)? {
            None => false,
            Some(bytes) => {
                let mut bytes_data = read(&data)?.unwrap_or_default();
                let written = match Header::decode_file(&bytes, chunk) {
                    Ok(h) => {
                        // Past the length is what a crash between a cut's header and its
                        // truncation left: never read.
                        bytes_data.truncate(h.len as usize);
                        write_whole(&tmp, &Header { generation: 1, ..h }, &bytes_data)
                    }
                    Err(detail) => {
                        tracing::warn!("chunk {chunk}: {}: {detail}", header.display());
                        File::create(&tmp).and_then(|f| {
                            f.write_all_at(DAMAGED, slot_at(1))?;
                            f.write_all_at(&bytes_data, DATA_AT)?;
                            Ok(f)
                        })
                    }
                };
                written
                    .and_then(|f| f.sync_data())
                    .and_then(|()| std::fs::rename(&tmp, &file))
                    .map_err(|e| {
                        io_err(format!("join chunk {chunk} into {}", file.display()), e)
                    })?;
                true
            }
        },
    };
    let data_tmp = dir.join(format!("{name}.{TMP_EXT}"));
    let header_tmp = dir.join(format!("{name}.{HEADER_EXT}.{TMP_EXT}"));
    remove_if_present(&[&data, &header, &data_tmp, &header_tmp])?;
    Ok(joined)
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

/// The layout a `LAYOUT` file names, if this server reads it.
fn decode(bytes: &[u8]) -> Result<u32, String> {
    let (layout, _) = sealed::unseal(bytes, MAGIC, 0, "a layout")?;
    if layout != LAYOUT && layout != LAYOUT_SPLIT {
        return Err(format!(
            "layout {layout}, this server reads layouts {LAYOUT_SPLIT} and {LAYOUT} (and 1, a \
             store without this file)"
        ));
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::super::Engine;
    use super::*;
    use stoa_types::{InodeId, SessionId};

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
    /// part way through the move leaves) or of layout 2 has every chunk converted to one
    /// file in its layout-3 directory, reading the same, and is declared layout 3;
    /// nothing changes on the next open.
    #[test]
    fn an_older_store_is_converted_to_this_layout_and_reads_the_same() {
        for older in [None, Some(LAYOUT_SPLIT)] {
            let dir = tempfile::tempdir().unwrap();
            let chunks_dir = dir.path().join("chunks");
            let data = vec![9u8; 5000];
            let ids = [0x1234, 0x1235, 0x1236, 0x1237, 0x1238, 0x1239].map(|ino| chunk(ino, 2));
            let [a, b, tomb, damaged, orphan, joined] = ids;
            // A chunk joined before a crash cut the conversion short.
            Engine::open(dir.path()).unwrap().write(joined, 0, b"joined", None, None).unwrap();
            std::fs::remove_file(chunks_dir.join(FILE)).unwrap();
            if let Some(layout) = older {
                let bytes = sealed::seal(MAGIC, layout, &[]);
                std::fs::write(chunks_dir.join(FILE), bytes).unwrap();
            }
            let fan_dir = |c: ChunkId| {
                let d = chunks_dir.join(format!("{:02x}", fan(c)));
                std::fs::create_dir_all(&d).unwrap();
                d
            };
            let put = |c: ChunkId, name: String, bytes: &[u8]| {
                std::fs::write(fan_dir(c).join(name), bytes).unwrap();
            };
            let header = |c: ChunkId, version: u64, bytes: &[u8]| {
                let crcs = bytes.chunks(super::super::BLOCK).map(crc32c::crc32c).collect();
                let mut h = Header { len: bytes.len() as u32, crcs, version, ..Header::empty(c) };
                h.remember(Some(stoa_types::WriteId { session: SessionId(7), seq: 1 }), version);
                h
            };
            put(a, a.to_string(), &data);
            put(a, format!("{a}.meta"), &header(a, 3, &data).encode_file());
            put(a, format!("{a}.meta.tmp"), b"half a header");
            put(a, format!("{a}.tmp"), b"half an install");
            // Data past the header's length: a cut whose truncation a crash stopped.
            put(b, b.to_string(), &[data.clone(), vec![1u8; 300]].concat());
            put(b, format!("{b}.meta"), &header(b, 2, &data).encode_file());
            put(tomb, format!("{tomb}.meta"), &header(tomb, 4, &[]).encode_file());
            put(damaged, damaged.to_string(), &data);
            put(damaged, format!("{damaged}.meta"), b"rot");
            put(orphan, orphan.to_string(), &data);
            put(joined, joined.to_string(), b"older bytes");
            put(joined, format!("{joined}.meta"), &header(joined, 1, b"older bytes").encode_file());
            if older.is_none() {
                // `a`'s files where layout 1 had them.
                let old_dir = chunks_dir.join(format!("{:02x}", a.ino.0 as u8));
                std::fs::create_dir_all(&old_dir).unwrap();
                for name in [a.to_string(), format!("{a}.meta")] {
                    std::fs::rename(fan_dir(a).join(&name), old_dir.join(&name)).unwrap();
                }
            }

            let e = Engine::open(dir.path()).unwrap();
            assert_eq!(e.read(a, 0, 10_000).unwrap(), data);
            let copy = e.fetch(a).unwrap();
            assert_eq!((copy.version, copy.writes), (3, header(a, 3, &data).writes));
            assert_eq!(e.read(b, 0, 10_000).unwrap(), data, "{older:?}");
            assert_eq!(e.version(tomb).unwrap(), 4, "the tombstone keeps its version");
            let err = e.read(damaged, 0, 10).unwrap_err();
            assert!(matches!(err, FsError::Checksum(ref m) if m.contains("format 0")), "{err}");
            assert_eq!(e.read(joined, 0, 10).unwrap(), b"joined");
            assert_eq!(e.chunk_ids().unwrap(), vec![a, b, tomb, damaged, joined]);
            let listed: Vec<(ChunkId, u64)> = e.list().unwrap();
            assert_eq!(listed, vec![(a, 3), (b, 2), (tomb, 4), (damaged, 0), (joined, 1)]);
            let mut left = Vec::new();
            each_file(&chunks_dir, |d, name| {
                left.push(d.join(name));
                Ok(())
            })
            .unwrap();
            assert!(left.iter().all(|p| p.extension().is_some_and(|x| x == CHUNK_EXT)), "{left:?}");
            assert_eq!(left.len(), 5, "{left:?}");
            assert_eq!(std::fs::read(chunks_dir.join(FILE)).unwrap(), encode());
            assert_eq!((migrate(&chunks_dir).unwrap(), join_files(&chunks_dir).unwrap()), (0, 0));
        }
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

        std::fs::write(chunks_dir.join(FILE), sealed::seal(MAGIC, 4, &[])).unwrap();
        let err = Engine::open(dir.path()).err().expect("another layout is refused");
        assert!(err.to_string().contains("layout 4, this server reads layouts 2 and 3"), "{err}");

        std::fs::write(chunks_dir.join(FILE), b"").unwrap();
        let err = Engine::open(dir.path()).err().expect("an empty layout file is refused");
        assert!(err.to_string().contains("not a layout file"), "{err}");
        assert!(misplaced.exists(), "nothing moved");
    }
}
