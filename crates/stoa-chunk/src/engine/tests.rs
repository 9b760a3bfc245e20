use super::*;
use stoa_types::WriteId;
use stoa_types::{InodeId, SessionId};

fn id(index: u64) -> ChunkId {
    ChunkId { ino: InodeId(0x42), index }
}

fn engine() -> (tempfile::TempDir, Engine) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(dir.path()).unwrap();
    (dir, engine)
}

/// Flips one byte of the chunk's data on disk.
fn flip_data_byte(engine: &Engine, chunk: ChunkId, at: u64) {
    flip_file_byte(engine, chunk, DATA_AT + at);
}

/// Flips one byte of the chunk's file on disk.
fn flip_file_byte(engine: &Engine, chunk: ChunkId, at: u64) {
    let file = OpenOptions::new().read(true).write(true).open(engine.paths(chunk).file).unwrap();
    let mut b = [0u8; 1];
    file.read_exact_at(&mut b, at).unwrap();
    file.write_all_at(&[b[0] ^ 0x40], at).unwrap();
}

#[test]
fn a_write_reads_back_and_a_missing_chunk_reads_empty() {
    let (_d, e) = engine();
    assert_eq!(e.read(id(0), 0, 100).unwrap(), Vec::<u8>::new());
    let data: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
    assert_eq!(e.write(id(0), 0, &data, None, None).unwrap(), Outcome::Applied(1));
    assert_eq!(e.read(id(0), 0, 20_000).unwrap(), data);
    assert_eq!(e.read(id(0), 4090, 20).unwrap(), &data[4090..4110]);
    assert_eq!(e.read(id(0), 10_000, 5).unwrap(), Vec::<u8>::new());
    let copy = e.fetch(id(0)).unwrap();
    assert_eq!((copy.version, copy.data), (1, data));
    assert_eq!(e.list().unwrap(), vec![(id(0), 1)]);
}

#[test]
fn partial_block_writes_keep_their_neighbours() {
    let (_d, e) = engine();
    let mut model = vec![7u8; 9000];
    e.write(id(1), 0, &model, None, None).unwrap();
    for (offset, len, byte) in
        [(100usize, 10usize, 1u8), (4090, 12, 2), (8999, 1, 3), (5000, 3000, 4)]
    {
        e.write(id(1), offset as u32, &vec![byte; len], None, None).unwrap();
        model[offset..offset + len].fill(byte);
        assert_eq!(e.read(id(1), 0, 9000).unwrap(), model);
    }
    assert_eq!(e.version(id(1)).unwrap(), 5);
}

#[test]
fn ranges_apply_in_order_as_one_version() {
    let (_d, e) = engine();
    let mut model = vec![5u8; 9000];
    e.write(id(1), 0, &model, None, None).unwrap();
    let ranges = [(4090u32, 10u32), (100, 3), (4095, 2), (12_000, 4)];
    let data: Vec<u8> = [&[1u8; 10][..], &[2u8; 3], &[3u8; 2], &[4u8; 4]].concat();
    assert_eq!(e.write_ranges(id(1), &ranges, &data, None, None).unwrap(), Outcome::Applied(2));
    model[4090..4100].fill(1);
    model[100..103].fill(2);
    model[4095..4097].fill(3);
    model.resize(12_004, 0);
    model[12_000..].fill(4);
    assert_eq!(e.read(id(1), 0, 20_000).unwrap(), model);
    e.verify(id(1)).unwrap();
    let short = e.write_ranges(id(1), &[(0, 8)], b"abc", None, None);
    assert!(matches!(short, Err(FsError::Invalid(_))), "{short:?}");
    assert_eq!(e.version(id(1)).unwrap(), 2);
}

#[test]
fn a_write_past_the_end_leaves_a_hole_of_zeros() {
    let (_d, e) = engine();
    e.write(id(2), 0, b"abc", None, None).unwrap();
    e.write(id(2), 10_000, b"xyz", None, None).unwrap();
    let all = e.read(id(2), 0, 20_000).unwrap();
    assert_eq!(all.len(), 10_003);
    assert_eq!(&all[..3], b"abc");
    assert!(all[3..10_000].iter().all(|&b| b == 0));
    assert_eq!(&all[10_000..], b"xyz");
    // A hole at the start of a new chunk, too.
    e.write(id(3), 5000, b"q", None, None).unwrap();
    let all = e.read(id(3), 0, 6000).unwrap();
    assert_eq!(all.len(), 5001);
    assert!(all[..5000].iter().all(|&b| b == 0));
}

#[test]
fn truncate_shrinks_extends_and_removes() {
    let (dir, e) = engine();
    e.write(id(4), 0, &vec![9u8; 10_000], None, None).unwrap();
    assert_eq!(e.truncate(id(4), 5000, None, None).unwrap(), Outcome::Applied(2));
    assert_eq!(e.read(id(4), 0, 20_000).unwrap(), vec![9u8; 5000]);
    // Bytes past a truncation come back as zeros when the chunk grows again.
    e.truncate(id(4), 6000, None, None).unwrap();
    let all = e.read(id(4), 0, 20_000).unwrap();
    assert_eq!(&all[..5000], &vec![9u8; 5000][..]);
    assert!(all[5000..].iter().all(|&b| b == 0) && all.len() == 6000);
    e.write(id(4), 7000, b"z", None, None).unwrap();
    assert!(e.read(id(4), 5000, 2000).unwrap().iter().all(|&b| b == 0));
    assert_eq!(e.truncate(id(4), 0, None, None).unwrap(), Outcome::Applied(5));
    assert_eq!(e.read(id(4), 0, 10).unwrap(), Vec::<u8>::new());
    // The version survives as a tombstone, so that a rewrite never reuses a version.
    assert_eq!(e.version(id(4)).unwrap(), 5);
    assert_eq!(e.list().unwrap(), vec![(id(4), 5)]);
    let files: Vec<_> = walk(dir.path().join("chunks"));
    assert_eq!(files.len(), 1, "only the chunk file is left: {files:?}");
    let size = std::fs::metadata(&files[0]).unwrap().len();
    assert!(size <= DATA_AT, "a tombstone keeps no data: {size} bytes");
    assert_eq!(e.truncate(id(4), 0, None, None).unwrap(), Outcome::Skipped(5));
    assert_eq!(e.write(id(4), 0, b"again", None, None).unwrap(), Outcome::Applied(6));
    assert_eq!(e.read(id(4), 0, 10).unwrap(), b"again".to_vec());
}

fn walk(dir: PathBuf) -> Vec<PathBuf> {
    let mut out = Vec::new();
    each_file(&dir, |fan, name| {
        out.push(fan.join(name));
        Ok(())
    })
    .unwrap();
    out
}

#[test]
fn a_flipped_byte_on_disk_is_a_checksum_error() {
    let (_d, e) = engine();
    e.write(id(5), 0, &vec![1u8; 12_000], None, None).unwrap();
    flip_data_byte(&e, id(5), 5000);
    assert!(
        matches!(e.read(id(5), 4096, 10), Err(FsError::Checksum(ref m)) if m.contains("block 1"))
    );
    // Blocks that were not touched still read.
    assert_eq!(e.read(id(5), 0, 4096).unwrap(), vec![1u8; 4096]);
    assert!(e.read(id(5), 8192, 100).is_ok());
    assert!(matches!(e.verify(id(5)), Err(FsError::Checksum(_))));
    // A head write over the damaged block's neighbourhood refuses to checksum garbage in.
    assert!(matches!(e.write(id(5), 5001, b"x", None, None), Err(FsError::Checksum(_))));
    // A successor asks for the whole chunk instead.
    assert_eq!(e.write(id(5), 5001, b"x", Some(2), None), Err(FsError::Stale));
    // Installing a good copy repairs it.
    e.install(id(5), 2, &vec![1u8; 12_000], &[], false).unwrap();
    e.verify(id(5)).unwrap();
}

#[test]
fn a_corrupt_header_is_a_clear_error_not_a_panic() {
    let (_d, e) = engine();
    e.write(id(6), 0, b"hello", None, None).unwrap();
    // The first header is generation 1, in the second slot.
    flip_file_byte(&e, id(6), SLOT_LEN + 30);
    let file = e.paths(id(6)).file;
    // Readers keep the cached good copy; the scrubber's verify reads the file, finds the
    // rot, and from then on the chunk reads as damaged until it is repaired.
    assert_eq!(e.read(id(6), 0, 5).unwrap(), b"hello");
    let err = e.verify(id(6)).unwrap_err();
    assert!(matches!(err, FsError::Checksum(ref m) if m.contains("header crc")), "{err:?}");
    let err = e.read(id(6), 0, 5).unwrap_err();
    assert!(matches!(err, FsError::Checksum(ref m) if m.contains("header crc")), "{err:?}");
    assert!(matches!(e.version(id(6)), Err(FsError::Checksum(_))));
    // Listed as version 0, so that a resync replaces it; a successor asks for a copy.
    assert_eq!(e.list().unwrap(), vec![(id(6), 0)]);
    assert_eq!(e.write(id(6), 0, b"x", Some(2), None), Err(FsError::Stale));
    std::fs::write(&file, b"short").unwrap();
    assert!(
        matches!(e.read(id(6), 0, 5), Err(FsError::Checksum(ref m)) if m.contains("too short"))
    );
    e.install(id(6), 3, b"fixed", &[], false).unwrap();
    assert_eq!(e.read(id(6), 0, 5).unwrap(), b"fixed");
}

#[test]
fn versions_apply_in_order_skip_repeats_and_refuse_gaps() {
    let (_d, e) = engine();
    assert_eq!(e.write(id(7), 0, b"a", Some(1), None).unwrap(), Outcome::Applied(1));
    assert_eq!(e.write(id(7), 0, b"b", Some(1), None).unwrap(), Outcome::Skipped(1));
    assert_eq!(e.read(id(7), 0, 1).unwrap(), b"a");
    assert_eq!(e.write(id(7), 0, b"c", Some(3), None), Err(FsError::Stale));
    assert_eq!(e.truncate(id(7), 1, Some(3), None), Err(FsError::Stale));
    assert_eq!(e.write(id(7), 1, b"d", Some(2), None).unwrap(), Outcome::Applied(2));
    assert_eq!(e.write(id(7), 0, b"e", None, None).unwrap(), Outcome::Applied(3));
    // Install replaces only older copies, unless forced.
    assert_eq!(e.install(id(7), 3, b"zz", &[], false).unwrap(), Outcome::Skipped(3));
    assert_eq!(e.install(id(7), 5, b"zz", &[], false).unwrap(), Outcome::Applied(5));
    assert_eq!(e.install(id(7), 2, b"old", &[], true).unwrap(), Outcome::Applied(2));
    let copy = e.fetch(id(7)).unwrap();
    assert_eq!((copy.version, copy.data), (2, b"old".to_vec()));
    assert_eq!(e.install(id(7), 0, b"", &[], true).unwrap(), Outcome::Applied(0));
    assert_eq!(e.version(id(7)).unwrap(), 0);
    // Removal needs no earlier state, so it crosses a gap.
    e.write(id(8), 0, b"a", None, None).unwrap();
    assert_eq!(e.truncate(id(8), 0, Some(9), None).unwrap(), Outcome::Applied(9));
    assert_eq!(e.truncate(id(8), 0, Some(9), None).unwrap(), Outcome::Skipped(9));
}

#[test]
fn extents_past_the_largest_chunk_are_refused() {
    let (_d, e) = engine();
    assert!(matches!(e.write(id(9), CHUNK_LEN_MAX, b"x", None, None), Err(FsError::Invalid(_))));
    assert!(matches!(e.truncate(id(9), CHUNK_LEN_MAX + 1, None, None), Err(FsError::Invalid(_))));
}

#[test]
fn an_unclean_stop_is_noticed_and_sync_and_usage_work() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path()).unwrap();
    assert!(!e.opened_dirty());
    e.write(id(10), 0, b"data", None, None).unwrap();
    e.sync(id(10)).unwrap();
    e.sync(id(11)).unwrap();
    let (capacity, used) = e.usage().unwrap();
    assert!(capacity > 0 && used <= capacity);
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    assert!(e.opened_dirty(), "no clean close happened");
    e.close_clean().unwrap();
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    assert!(!e.opened_dirty());
    assert_eq!(e.read(id(10), 0, 10).unwrap(), b"data");
}

#[test]
fn different_chunks_are_written_in_parallel_safely() {
    let (_d, e) = engine();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let e = &e;
            s.spawn(move || {
                for i in 0..50u32 {
                    e.write(id(100 + t), i * 100, &[t as u8; 100], None, None).unwrap();
                }
            });
        }
    });
    for t in 0..4u64 {
        assert_eq!(e.read(id(100 + t), 0, 1 << 20).unwrap(), vec![t as u8; 5000]);
        assert_eq!(e.version(id(100 + t)).unwrap(), 50);
    }
}

#[test]
fn a_write_that_would_eat_the_reserve_is_no_space() {
    let (_d, e) = engine();
    e.check_space(1 << 20, 0).unwrap();
    e.check_space(1 << 20, 1).unwrap();
    assert_eq!(e.check_space(1 << 20, u64::MAX / 2), Err(FsError::NoSpace));
}

#[test]
fn a_remembered_mutation_is_a_duplicate_at_the_head_and_its_record_travels_with_copies() {
    let (d, e) = engine();
    let w = Some(WriteId { session: SessionId(3), seq: 1 });
    assert_eq!(e.write(id(0), 0, b"one", None, w).unwrap(), Outcome::Applied(1));
    e.write(id(0), 0, b"two", None, None).unwrap();
    let dup = Outcome::Duplicate { version: 1, local: 2 };
    assert_eq!(e.write(id(0), 0, b"one", None, w).unwrap(), dup);
    assert_eq!(e.truncate(id(0), 1, None, w).unwrap(), dup);
    // Forwarded with a version, the version rule decides, as for any mutation.
    assert_eq!(e.write(id(0), 0, b"one", Some(1), w).unwrap(), Outcome::Skipped(2));
    assert_eq!(e.read(id(0), 0, 10).unwrap(), b"two");
    // Remembered on disk, through a tombstone and in a copy installed elsewhere.
    drop(e);
    let e = Engine::open(d.path()).unwrap();
    assert_eq!(e.write(id(0), 0, b"one", None, w).unwrap(), dup);
    e.truncate(id(0), 0, None, None).unwrap();
    assert_eq!(
        e.write(id(0), 0, b"one", None, w).unwrap(),
        Outcome::Duplicate { version: 1, local: 3 }
    );
    let copy = e.fetch(id(0)).unwrap();
    e.install(id(1), copy.version, &copy.data, &copy.writes, true).unwrap();
    assert_eq!(
        e.write(id(1), 0, b"one", None, w).unwrap(),
        Outcome::Duplicate { version: 1, local: 3 }
    );
}

#[test]
fn listings_tell_replicas_with_other_bytes_at_one_version_apart() {
    let (_d, a) = engine();
    let (_d2, b) = engine();
    a.write(id(0), 0, b"acknowledged", None, None).unwrap();
    b.write(id(0), 0, b"never acked!", None, None).unwrap();
    let (la, lb) = (a.list_sized().unwrap()[0], b.list_sized().unwrap()[0]);
    assert_eq!((la.version, la.len), (lb.version, lb.len));
    assert_ne!(la.digest, lb.digest);
    b.install(id(0), 1, b"acknowledged", &[], true).unwrap();
    assert_eq!(b.list_sized().unwrap()[0], la);
}

#[test]
fn remove_leaves_nothing_of_a_chunk_tombstone_or_crash_leftover() {
    let (d, e) = engine();
    let other = ChunkId { ino: InodeId(0x43), index: 0 };
    e.write(id(0), 0, &[1u8; 9000], None, None).unwrap();
    e.write(id(1), 0, b"cut", None, None).unwrap();
    e.truncate(id(1), 0, None, None).unwrap();
    e.write(other, 0, b"kept", None, None).unwrap();
    // A crash after a new chunk's data but before its header, and one during an
    // install: files that `list` does not show.
    let crashed = e.paths(id(2));
    std::fs::create_dir_all(&crashed.dir).unwrap();
    File::create(&crashed.file).unwrap().write_all_at(b"orphaned data", DATA_AT).unwrap();
    std::fs::write(e.paths(id(0)).tmp, b"half an install").unwrap();
    assert_eq!(e.version(id(2)).unwrap(), 0, "a chunk file without a header");
    assert_eq!(e.list().unwrap(), vec![(id(0), 1), (id(1), 2), (other, 1)]);
    assert_eq!(e.chunk_ids().unwrap(), vec![id(0), id(1), id(2), other]);

    for chunk in [id(0), id(1), id(2), id(3)] {
        e.remove(chunk).unwrap();
    }
    assert_eq!(e.chunk_ids().unwrap(), vec![other]);
    assert_eq!(e.list().unwrap(), vec![(other, 1)]);
    assert_eq!(e.version(id(0)).unwrap(), 0, "the cached header went too");
    assert_eq!(e.read(id(0), 0, 10).unwrap(), Vec::<u8>::new());
    assert_eq!(e.read(other, 0, 10).unwrap(), b"kept");
    let mut left: Vec<String> = walk(d.path().join("chunks"))
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, vec![format!("{other}.chunk")]);
}

#[test]
fn a_cached_read_answers_only_what_a_read_from_disk_would() {
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7) as u8).collect();
    Engine::open(dir.path()).unwrap().write(id(0), 0, &data, None, None).unwrap();
    // A fresh engine has no header in memory: a read without the disk cannot check blocks.
    let e = Engine::open(dir.path()).unwrap();
    assert_eq!(e.read_cached(id(0), 0, 100), None);
    assert_eq!(e.read(id(0), 4090, 20).unwrap(), &data[4090..4110]);
    assert_eq!(e.read_cached(id(0), 4090, 20).as_deref(), Some(&data[4090..4110]));
    assert_eq!(e.read_cached(id(0), 19_990, 100).as_deref(), Some(&data[19_990..]));
    assert_eq!(e.read_cached(id(0), 20_000, 100), Some(Vec::new()));
    // A chunk being changed is left to the blocking read, which waits for the change.
    {
        let _writing = e.stripe(id(0)).write().unwrap();
        assert_eq!(e.read_cached(id(0), 0, 100), None);
    }
    // A damaged block is never answered; the read from disk reports it.
    flip_data_byte(&e, id(0), 5000);
    assert_eq!(e.read_cached(id(0), 4096, 4096), None);
    assert!(matches!(e.read(id(0), 4096, 4096), Err(FsError::Checksum(_))));
    assert_eq!(e.read_cached(id(0), 0, 4096).as_deref(), Some(&data[..4096]));
    // What the engine just wrote, it reads back without the disk.
    e.write(id(1), 0, &data, None, None).unwrap();
    assert_eq!(e.read_cached(id(1), 100, 200).as_deref(), Some(&data[100..300]));
}

/// A long read is never tried on the reactor, even with every byte cached: on a cold
/// range, the attempt would start the readahead of all of it on the reactor's thread.
#[test]
fn a_read_longer_than_the_cached_limit_goes_to_the_blocking_read() {
    let (_d, e) = engine();
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    e.write(id(0), 0, &data, None, None).unwrap();
    let limit = CACHED_READ_MAX as usize;
    assert_eq!(e.read_cached(id(0), 0, CACHED_READ_MAX).as_deref(), Some(&data[..limit]));
    assert_eq!(e.read_cached(id(0), 0, CACHED_READ_MAX + 1), None);
    assert_eq!(e.read_cached(id(0), 0, 1_000_000), None);
    assert_eq!(e.read(id(0), 0, 1_000_000).unwrap(), data);
}

/// A chunk file cut short on disk (its data ends before the header says) reads as
/// damage from disk, and is never answered from the page cache.
#[test]
fn a_chunk_file_cut_short_is_a_checksum_error() {
    let (_d, e) = engine();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
    e.write(id(2), 0, &data, None, None).unwrap();
    let file = OpenOptions::new().write(true).open(e.paths(id(2)).file).unwrap();
    file.set_len(DATA_AT + 10_000).unwrap();
    assert_eq!(e.read_cached(id(2), 12_000, 100), None);
    assert!(
        matches!(e.read(id(2), 12_000, 100), Err(FsError::Checksum(ref m)) if m.contains("shorter"))
    );
    // The blocks before the cut still read, from disk and from the cache.
    assert_eq!(e.read(id(2), 0, 8192).unwrap(), &data[..8192]);
    assert_eq!(e.read_cached(id(2), 100, 4000).as_deref(), Some(&data[100..4100]));
}

/// A change rewrites the header in place, in the slot the current one is not in: the
/// chunk keeps its one file (no inode is allocated or freed), and the slots alternate.
#[test]
fn a_change_rewrites_the_other_header_slot_of_the_same_file() {
    use std::os::unix::fs::MetadataExt;
    let (_d, e) = engine();
    e.write(id(0), 0, &[1u8; 6000], None, None).unwrap();
    let file = e.paths(id(0)).file;
    let inode = std::fs::metadata(&file).unwrap().ino();
    let slot = |n: u64| {
        let f = File::open(&file).unwrap();
        match read_slot(&f, n, id(0)).unwrap() {
            Slot::Valid(h) => Some((h.generation, h.version)),
            Slot::Empty => None,
            Slot::Damaged(detail) => panic!("slot {n}: {detail}"),
        }
    };
    assert_eq!((slot(0), slot(1)), (None, Some((1, 1))));
    e.write(id(0), 100, b"second", None, None).unwrap();
    assert_eq!((slot(0), slot(1)), (Some((2, 2)), Some((1, 1))));
    e.truncate(id(0), 50, None, None).unwrap();
    assert_eq!((slot(0), slot(1)), (Some((2, 2)), Some((3, 3))));
    e.truncate(id(0), 0, None, None).unwrap();
    assert_eq!((slot(0), slot(1)), (Some((4, 4)), Some((3, 3))));
    e.write(id(0), 0, b"again", None, None).unwrap();
    assert_eq!(std::fs::metadata(&file).unwrap().ino(), inode, "the same file throughout");
    assert_eq!(e.read(id(0), 0, 100).unwrap(), b"again");
    assert_eq!(walk(e.chunks_dir.clone()), vec![file]);
}

/// A damaged header slot beside a whole one is a write a crash tore only after an
/// unclean stop: then the whole one is the header (its CRCs catch the data the torn
/// change wrote). After a clean stop it is rot, and the chunk reads as damaged.
#[test]
fn a_torn_header_slot_falls_back_only_after_an_unclean_stop() {
    let dir = tempfile::tempdir().unwrap();
    let e = Engine::open(dir.path()).unwrap();
    e.write(id(0), 0, &[1u8; 8192], None, None).unwrap();
    e.write(id(0), 4096, &[2u8; 4096], None, None).unwrap();
    e.close_clean().unwrap();
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    // Generation 2, the second write's header, is in the first slot.
    flip_file_byte(&e, id(0), 30);
    e.close_clean().unwrap();
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    assert!(!e.opened_dirty());
    let err = e.read(id(0), 0, 10).unwrap_err();
    assert!(matches!(err, FsError::Checksum(ref m) if m.contains("header crc")), "{err:?}");
    assert_eq!(e.list().unwrap(), vec![(id(0), 0)]);
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    assert!(e.opened_dirty());
    assert_eq!(e.version(id(0)).unwrap(), 1, "the first write's header");
    assert_eq!(e.read(id(0), 0, 4096).unwrap(), vec![1u8; 4096]);
    assert!(matches!(e.read(id(0), 4096, 10), Err(FsError::Checksum(_))));
    // The next change goes to the torn slot, which is whole again after it.
    assert_eq!(e.write(id(0), 4096, &[4u8; 4096], None, None).unwrap(), Outcome::Applied(2));
    e.close_clean().unwrap();
    drop(e);
    let e = Engine::open(dir.path()).unwrap();
    assert_eq!(e.version(id(0)).unwrap(), 2);
    assert_eq!(e.read(id(0), 0, 8192).unwrap(), [[1u8; 4096], [4u8; 4096]].concat());
}

#[test]
fn a_sync_flushes_a_directory_only_after_a_name_in_it_changed() {
    let dir = tempfile::tempdir().unwrap();
    let flushes = |e: &Engine| e.dirs.flushes.load(std::sync::atomic::Ordering::Relaxed);
    let e = Engine::open(dir.path()).unwrap();
    // Chunks 0 and 256 share a directory, chunk 1 has its own.
    assert_eq!(e.paths(id(0)).dir, e.paths(id(256)).dir);
    assert_ne!(e.paths(id(0)).dir, e.paths(id(1)).dir);
    e.write(id(0), 0, b"new file", None, None).unwrap();
    e.sync(id(0)).unwrap();
    assert_eq!(flushes(&e), 1, "a new file's name is flushed");
    e.write(id(0), 4, b"in place", None, None).unwrap();
    e.truncate(id(0), 6, None, None).unwrap();
    e.sync(id(0)).unwrap();
    e.sync(id(0)).unwrap();
    assert_eq!(flushes(&e), 1, "writes in place change no name");
    e.write(id(256), 0, b"neighbour", None, None).unwrap();
    e.sync(id(0)).unwrap();
    assert_eq!(flushes(&e), 2, "a new name in the directory is flushed by any sync there");
    e.install(id(1), 3, b"copied", &[], false).unwrap();
    e.sync_all(&[id(0), id(1), id(256)]).unwrap();
    assert_eq!(flushes(&e), 3, "an install renames");
    e.remove(id(1)).unwrap();
    e.sync(id(1)).unwrap();
    e.sync(id(1)).unwrap();
    assert_eq!(flushes(&e), 4, "a removal is flushed once");
    drop(e);
    // A process that crashed may have left names in the page cache only.
    let e = Engine::open(dir.path()).unwrap();
    e.sync(id(0)).unwrap();
    assert_eq!(flushes(&e), 1, "a reopened store flushes each directory once");
    assert_eq!(e.read(id(0), 0, 100).unwrap(), b"new in");
}

/// A read or a write keeps the chunk's file open for the next one; every change that
/// puts another file at the chunk's path (an install, a removal and a new write) drops
/// it, so neither a read nor a write ever uses a file no longer the chunk's.
#[test]
fn a_kept_file_is_always_the_chunks_file() {
    let (_d, e) = engine();
    e.write(id(0), 0, &[1u8; 9000], None, None).unwrap();
    assert!(e.headers.for_read(id(0)).unwrap().file.is_some(), "the write kept its file");
    assert_eq!(e.read(id(0), 0, 4).unwrap(), [1u8; 4]);
    e.install(id(0), 5, &[2u8; 9000], &[], false).unwrap();
    assert_eq!(e.read_cached(id(0), 8000, 4).as_deref(), Some(&[2u8; 4][..]));
    assert_eq!(e.read(id(0), 0, 4).unwrap(), [2u8; 4]);
    assert!(e.headers.for_read(id(0)).unwrap().file.is_some(), "the read kept the file");
    e.write(id(0), 0, &[5u8; 4], None, None).unwrap();
    e.sync_all(&[id(0)]).unwrap();
    assert_eq!(e.read(id(0), 0, 8).unwrap(), [5, 5, 5, 5, 2, 2, 2, 2]);
    e.remove(id(0)).unwrap();
    assert_eq!(e.read(id(0), 0, 4).unwrap(), Vec::<u8>::new());
    e.write(id(0), 0, &[3u8; 100], None, None).unwrap();
    assert_eq!(e.read_cached(id(0), 0, 4).as_deref(), Some(&[3u8; 4][..]));
    e.truncate(id(0), 0, None, None).unwrap();
    e.write(id(0), 0, &[4u8; 100], None, None).unwrap();
    assert_eq!(e.read(id(0), 96, 10).unwrap(), [4u8; 4]);
    // The scrubber's check opens the file at the path: a file renamed over it behind
    // the engine's back is what it checks.
    let fresh = e.paths(id(0)).file.with_extension("fresh");
    std::fs::copy(e.paths(id(0)).file, &fresh).unwrap();
    std::fs::rename(&fresh, e.paths(id(0)).file).unwrap();
    flip_data_byte(&e, id(0), 50);
    assert!(matches!(e.verify(id(0)), Err(FsError::Checksum(_))));
}
