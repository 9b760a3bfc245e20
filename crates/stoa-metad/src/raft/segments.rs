//! The Raft log on disk: append-only segment files, one fdatasync per batch.
//!
//! ```text
//!  <data_dir>/raft-log/<first index, 20 digits>.seg
//!
//!  segment header (28 bytes): magic "STOALOG\0" | format version u32 | reserved u32 (0)
//!                             | first index u64 | crc32c u32 of the 24 bytes before it
//!  record (16 bytes + body):  body len u32 | crc32c u32 of (index, body) | index u64 | body
//! ```
//!
//! Why not the redb database that holds the state machine: a redb commit with
//! `Durability::Immediate` rewrites several B-tree and allocator pages across the file
//! before its fsync (about 25 page writes and 1 ms per commit here), while an append is
//! one sequential write and one fdatasync. The state machine stays in redb.
//!
//! Recovery ([`Segments::open`]) reads every segment in index order. A record that is
//! short or fails its checksum at the end of the LAST segment is a torn write of a batch
//! whose fdatasync never returned, so nobody was told it is durable: it and everything
//! after it are cut off. The same damage in any earlier segment (fsynced before the next
//! one was started), a gap in the indexes, or a bad header with records behind it is
//! corruption of acknowledged entries, and opening fails with a message saying where.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"STOALOG\0";
/// The on-disk format version; a reader refuses any other.
const FORMAT_VERSION: u32 = 1;
const HEADER_LEN: u64 = 28;
const RECORD_HEADER_LEN: u64 = 16;
/// A record body larger than this is damage, not an entry (the wire frame limit is
/// 16 MiB, and an entry is one request).
const BODY_LEN_MAX: u32 = 64 << 20;
/// A segment that grew past this is closed and a new one started, so that purging the
/// log frees whole files.
pub(crate) const SEGMENT_BYTES: u64 = 8 << 20;

/// Records as `(index, body)`, in index order.
pub(crate) type Records = Vec<(u64, Vec<u8>)>;

/// Where one entry sits on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Position {
    /// The first index of the segment file it is in.
    segment_first: u64,
    offset: u64,
}

struct SegmentFile {
    first: u64,
    path: PathBuf,
    file: File,
    len: u64,
}

/// The open segment files of one replica's log, and where each live record sits.
/// Not thread-safe by itself: one flusher owns it.
pub(crate) struct Segments {
    dir: PathBuf,
    files: Vec<SegmentFile>,
    /// Index -> position of every record on disk, in index order.
    positions: std::collections::VecDeque<(u64, Position)>,
    /// The index the next record must have to continue the current segment; another
    /// (after a snapshot jumped the log ahead) starts a new segment.
    next: Option<u64>,
    segment_bytes: u64,
}

fn err(path: &Path, what: &str, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

fn header(first: u64) -> [u8; HEADER_LEN as usize] {
    let mut h = [0u8; HEADER_LEN as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&first.to_le_bytes());
    let crc = crc32c::crc32c(&h[..24]);
    h[24..28].copy_from_slice(&crc.to_le_bytes());
    h
}

/// The first index a segment header names, or why it is not a valid header.
fn parse_header(h: &[u8]) -> Result<u64, String> {
    if h.len() < HEADER_LEN as usize || &h[..8] != MAGIC {
        return Err("not a Stoa log segment (bad magic)".into());
    }
    let crc = u32::from_le_bytes(h[24..28].try_into().expect("4 bytes"));
    if crc32c::crc32c(&h[..24]) != crc {
        return Err("segment header checksum mismatch".into());
    }
    let version = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
    if version != FORMAT_VERSION {
        return Err(format!(
            "segment format version {version}, this build reads {FORMAT_VERSION} (newer Stoa?)"
        ));
    }
    Ok(u64::from_le_bytes(h[16..24].try_into().expect("8 bytes")))
}

fn record_crc(index: u64, body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&index.to_le_bytes()), body)
}

/// Appends one record (`index`, `body`) to `out`.
pub(crate) fn encode_record(out: &mut Vec<u8>, index: u64, body: &[u8]) {
    let len = u32::try_from(body.len()).expect("a log entry is far below 4 GiB");
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&record_crc(index, body).to_le_bytes());
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(body);
}

/// One record found while reading a segment.
struct Parsed {
    index: u64,
    offset: u64,
    body: Vec<u8>,
}

/// Reads the records of one segment body until its end or the first damaged record.
/// Returns the records and, when reading stopped early, why and at which offset.
fn parse_records(bytes: &[u8]) -> (Vec<Parsed>, Option<(u64, String)>) {
    let mut out = Vec::new();
    let mut at = HEADER_LEN as usize;
    while at < bytes.len() {
        let rest = &bytes[at..];
        if rest.len() < RECORD_HEADER_LEN as usize {
            return (out, Some((at as u64, "short record header".into())));
        }
        let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes"));
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        let index = u64::from_le_bytes(rest[8..16].try_into().expect("8 bytes"));
        if len > BODY_LEN_MAX {
            return (out, Some((at as u64, format!("record length {len} is impossible"))));
        }
        let end = RECORD_HEADER_LEN as usize + len as usize;
        if rest.len() < end {
            return (out, Some((at as u64, "short record body".into())));
        }
        let body = &rest[RECORD_HEADER_LEN as usize..end];
        if record_crc(index, body) != crc {
            return (out, Some((at as u64, format!("checksum mismatch in record {index}"))));
        }
        out.push(Parsed { index, offset: at as u64, body: body.to_vec() });
        at += end;
    }
    (out, None)
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| err(dir, "sync directory", e))
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.seg"))
}

impl Segments {
    /// Opens (creating if needed) the log in `dir` and returns it with every record
    /// found, `(index, body)` in index order, after cutting off a torn tail.
    pub fn open(dir: &Path) -> Result<(Segments, Records), String> {
        Segments::open_with(dir, SEGMENT_BYTES)
    }

    pub fn open_with(dir: &Path, segment_bytes: u64) -> Result<(Segments, Records), String> {
        std::fs::create_dir_all(dir).map_err(|e| err(dir, "create", e))?;
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| err(dir, "list", e))? {
            let path = item.map_err(|e| err(dir, "list", e))?.path();
            let parsed = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(first) = parsed {
                names.push((first, path));
            }
        }
        names.sort();
        let mut segments = Segments {
            dir: dir.to_path_buf(),
            files: Vec::new(),
            positions: Default::default(),
            next: None,
            segment_bytes,
        };
        let mut records = Vec::new();
        let count = names.len();
        for (n, (name_first, path)) in names.into_iter().enumerate() {
            let last = n + 1 == count;
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| err(&path, "open", e))?;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(|e| err(&path, "read", e))?;
            let first = match parse_header(&bytes) {
                Ok(first) if first == name_first => first,
                Ok(first) => {
                    return Err(err(&path, "open", format!("header names first index {first}")))
                }
                // A segment whose creation was cut short: nothing was written behind it.
                Err(_) if last && bytes.len() as u64 <= HEADER_LEN => {
                    tracing::warn!("removing unfinished log segment {}", path.display());
                    std::fs::remove_file(&path).map_err(|e| err(&path, "remove", e))?;
                    sync_dir(dir)?;
                    continue;
                }
                Err(e) => return Err(err(&path, "open", e)),
            };
            let (found, damage) = parse_records(&bytes);
            let mut len = bytes.len() as u64;
            if let Some((offset, why)) = damage {
                if !last {
                    return Err(err(&path, "read", format!("{why} at offset {offset}")));
                }
                tracing::warn!(
                    "cutting the torn tail of the Raft log: {} at offset {offset} of {}, {} \
                     bytes dropped (a batch whose fdatasync never returned)",
                    why,
                    path.display(),
                    len - offset
                );
                file.set_len(offset).map_err(|e| err(&path, "truncate", e))?;
                file.sync_data().map_err(|e| err(&path, "sync", e))?;
                len = offset;
            }
            // A segment may start past the end of the previous one: a snapshot moved the
            // log ahead, and the older segments wait for their purge.
            let mut expect = first;
            for p in found {
                if p.index != expect {
                    return Err(err(
                        &path,
                        "read",
                        format!("record {} at offset {} where {expect} belongs", p.index, p.offset),
                    ));
                }
                expect += 1;
                segments
                    .positions
                    .push_back((p.index, Position { segment_first: first, offset: p.offset }));
                records.push((p.index, p.body));
            }
            file.seek(SeekFrom::Start(len)).map_err(|e| err(&path, "seek", e))?;
            segments.next = Some(expect);
            segments.files.push(SegmentFile { first, path, file, len });
        }
        Ok((segments, records))
    }

    /// Writes `(index, body)` records after the last one. Indexes must follow the last
    /// record's. Not durable until [`Segments::sync`].
    pub fn append(&mut self, records: &[(u64, Vec<u8>)]) -> Result<(), String> {
        let mut buf = Vec::new();
        for (index, body) in records {
            let full = match (self.files.last(), self.next) {
                (Some(f), Some(next)) => {
                    next != *index || f.len + buf.len() as u64 >= self.segment_bytes
                }
                _ => true,
            };
            if full {
                self.write_out(&mut buf)?;
                self.start_segment(*index)?;
            }
            let seg = self.files.last().expect("a segment was just ensured");
            let offset = seg.len + buf.len() as u64;
            let segment_first = seg.first;
            encode_record(&mut buf, *index, body);
            self.positions.push_back((*index, Position { segment_first, offset }));
            self.next = Some(index + 1);
        }
        self.write_out(&mut buf)
    }

    /// Writes buffered record bytes to the end of the current segment.
    fn write_out(&mut self, buf: &mut Vec<u8>) -> Result<(), String> {
        if buf.is_empty() {
            return Ok(());
        }
        let seg = self.files.last_mut().expect("records are written to a segment");
        seg.file.write_all(buf).map_err(|e| err(&seg.path, "write", e))?;
        seg.len += buf.len() as u64;
        buf.clear();
        Ok(())
    }

    /// Closes the current segment (made durable first: only the newest segment may have
    /// a torn tail) and starts one whose first record is `first`.
    fn start_segment(&mut self, first: u64) -> Result<(), String> {
        if let Some(seg) = self.files.last() {
            seg.file.sync_data().map_err(|e| err(&seg.path, "sync", e))?;
        }
        let path = segment_path(&self.dir, first);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| err(&path, "create", e))?;
        file.write_all(&header(first)).map_err(|e| err(&path, "write", e))?;
        file.sync_data().map_err(|e| err(&path, "sync", e))?;
        sync_dir(&self.dir)?;
        self.files.push(SegmentFile { first, path, file, len: HEADER_LEN });
        Ok(())
    }

    /// Makes everything written so far durable: one fdatasync of the current segment
    /// (earlier segments were synced when they were closed).
    pub fn sync(&self) -> Result<(), String> {
        match self.files.last() {
            Some(seg) => seg.file.sync_data().map_err(|e| err(&seg.path, "sync", e)),
            None => Ok(()),
        }
    }

    /// Removes the records from `index` on; durable when this returns.
    pub fn truncate(&mut self, index: u64) -> Result<(), String> {
        let Some(at) = self.positions.iter().position(|(i, _)| *i >= index) else {
            return Ok(());
        };
        let (cut_index, cut) = self.positions[at];
        self.positions.truncate(at);
        self.next = Some(cut_index);
        let mut removed = false;
        while self.files.last().is_some_and(|f| f.first > cut.segment_first) {
            let seg = self.files.pop().expect("checked");
            std::fs::remove_file(&seg.path).map_err(|e| err(&seg.path, "remove", e))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        let seg = self.files.last_mut().expect("the cut record's segment is open");
        debug_assert_eq!(seg.first, cut.segment_first);
        seg.file.set_len(cut.offset).map_err(|e| err(&seg.path, "truncate", e))?;
        seg.file.seek(SeekFrom::Start(cut.offset)).map_err(|e| err(&seg.path, "seek", e))?;
        seg.len = cut.offset;
        seg.file.sync_data().map_err(|e| err(&seg.path, "sync", e))
    }

    /// Forgets the records up to and including `index`, deleting every segment all of
    /// whose records are that old. The newest segment is always kept.
    pub fn purge(&mut self, index: u64) -> Result<(), String> {
        while self.positions.front().is_some_and(|(i, _)| *i <= index) {
            self.positions.pop_front();
        }
        let mut removed = false;
        while self.files.len() > 1 && self.files[1].first <= index + 1 {
            let seg = self.files.remove(0);
            std::fs::remove_file(&seg.path).map_err(|e| err(&seg.path, "remove", e))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// The number of segment files, for tests.
    #[cfg(test)]
    fn file_count(&self) -> usize {
        self.files.len()
    }

    /// Reads back the body of record `index`, for tests.
    #[cfg(test)]
    fn read_body(&self, index: u64) -> Option<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let (_, pos) = *self.positions.iter().find(|(i, _)| *i == index)?;
        let seg = self.files.iter().find(|f| f.first == pos.segment_first)?;
        let mut head = [0u8; RECORD_HEADER_LEN as usize];
        seg.file.read_exact_at(&mut head, pos.offset).ok()?;
        let len = u32::from_le_bytes(head[0..4].try_into().unwrap()) as usize;
        let mut body = vec![0; len];
        seg.file.read_exact_at(&mut body, pos.offset + RECORD_HEADER_LEN).ok()?;
        Some(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(i: u64) -> Vec<u8> {
        format!("entry {i} ").repeat((i % 7 + 1) as usize).into_bytes()
    }

    fn records(range: std::ops::RangeInclusive<u64>) -> Vec<(u64, Vec<u8>)> {
        range.map(|i| (i, body(i))).collect()
    }

    fn indexes(found: &[(u64, Vec<u8>)]) -> Vec<u64> {
        found.iter().map(|(i, _)| *i).collect()
    }

    fn only_segment(dir: &Path) -> PathBuf {
        let mut files: Vec<_> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        files.pop().unwrap()
    }

    #[test]
    fn records_survive_a_reopen_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, found) = Segments::open_with(dir.path(), 300).unwrap();
        assert!(found.is_empty());
        log.append(&records(1..=40)).unwrap();
        log.append(&records(41..=50)).unwrap();
        log.sync().unwrap();
        assert!(log.file_count() > 3, "small segments rotate");
        drop(log);
        let (log, found) = Segments::open_with(dir.path(), 300).unwrap();
        assert_eq!(found, records(1..=50));
        assert_eq!(log.read_body(37), Some(body(37)));
    }

    #[test]
    fn a_torn_tail_is_cut_off_and_the_log_continues() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open(dir.path()).unwrap();
        log.append(&records(1..=10)).unwrap();
        log.sync().unwrap();
        drop(log);
        // A crash in the middle of writing record 11: its header and half its body.
        let path = only_segment(dir.path());
        let mut torn = Vec::new();
        encode_record(&mut torn, 11, &body(11));
        torn.truncate(torn.len() / 2 + 8);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&torn).unwrap();
        let full_len = std::fs::metadata(&path).unwrap().len();

        let (mut log, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(found, records(1..=10));
        assert!(std::fs::metadata(&path).unwrap().len() < full_len, "the tail is cut");
        log.append(&records(11..=12)).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(found, records(1..=12));
    }

    #[test]
    fn a_flipped_byte_in_the_last_record_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open(dir.path()).unwrap();
        log.append(&records(1..=5)).unwrap();
        log.sync().unwrap();
        drop(log);
        let path = only_segment(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        let (_, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(indexes(&found), vec![1, 2, 3, 4]);
    }

    #[test]
    fn damage_in_an_older_segment_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open_with(dir.path(), 200).unwrap();
        log.append(&records(1..=30)).unwrap();
        log.sync().unwrap();
        drop(log);
        let mut files: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let first = &files[0];
        let mut bytes = std::fs::read(first).unwrap();
        let at = HEADER_LEN as usize + RECORD_HEADER_LEN as usize + 1;
        bytes[at] ^= 1;
        std::fs::write(first, &bytes).unwrap();
        let e = Segments::open_with(dir.path(), 200).err().expect("corruption is refused");
        assert!(e.contains("checksum mismatch"), "{e}");
    }

    #[test]
    fn an_unfinished_new_segment_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open(dir.path()).unwrap();
        log.append(&records(1..=3)).unwrap();
        log.sync().unwrap();
        drop(log);
        // A crash while creating the next segment: half a header.
        std::fs::write(segment_path(dir.path(), 4), &header(4)[..10]).unwrap();
        let (mut log, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(indexes(&found), vec![1, 2, 3]);
        log.append(&records(4..=4)).unwrap();
        log.sync().unwrap();
    }

    #[test]
    fn truncate_and_purge_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open_with(dir.path(), 250).unwrap();
        log.append(&records(1..=60)).unwrap();
        log.sync().unwrap();
        let before = log.file_count();
        log.truncate(41).unwrap();
        assert!(log.file_count() < before, "segments after the cut are removed");
        log.append(&[(41, b"new 41".to_vec())]).unwrap();
        log.purge(20).unwrap();
        log.sync().unwrap();
        drop(log);
        let (_, found) = Segments::open_with(dir.path(), 250).unwrap();
        let got = indexes(&found);
        assert_eq!(*got.last().unwrap(), 41);
        assert_eq!(found.last().unwrap().1, b"new 41".to_vec());
        // Whole segments at or below the purge point are gone; what remains is contiguous.
        assert!(got[0] <= 21 && got[0] > 1, "{got:?}");
        assert!(got.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn a_jump_ahead_starts_a_segment_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open(dir.path()).unwrap();
        log.append(&records(1..=5)).unwrap();
        // A snapshot up to 100 was installed: the log continues at 101.
        log.append(&records(101..=103)).unwrap();
        log.sync().unwrap();
        assert_eq!(log.file_count(), 2);
        drop(log);
        let (mut log, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(indexes(&found), vec![1, 2, 3, 4, 5, 101, 102, 103]);
        log.purge(100).unwrap();
        assert_eq!(log.file_count(), 1);
        drop(log);
        let (_, found) = Segments::open(dir.path()).unwrap();
        assert_eq!(indexes(&found), vec![101, 102, 103]);
    }

    #[test]
    fn a_wrong_format_version_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, _) = Segments::open(dir.path()).unwrap();
        log.append(&records(1..=2)).unwrap();
        log.sync().unwrap();
        drop(log);
        let path = only_segment(dir.path());
        let mut bytes = std::fs::read(&path).unwrap();
        let mut h = header(1);
        h[8..12].copy_from_slice(&9u32.to_le_bytes());
        let crc = crc32c::crc32c(&h[..24]);
        h[24..28].copy_from_slice(&crc.to_le_bytes());
        bytes[..HEADER_LEN as usize].copy_from_slice(&h);
        std::fs::write(&path, &bytes).unwrap();
        let e = Segments::open(dir.path()).err().expect("refused");
        assert!(e.contains("format version 9"), "{e}");
    }
}
