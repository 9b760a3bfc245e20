//! ReadDir: one page of a directory, streamed from a key-range scan so that a huge
//! directory is never loaded whole.

use crate::kv::{prefix_end, KvRead, Table};
use crate::store::{decode, ino_key, load_dir, Dentry};
use stoa_proto::MetaResponse;
use stoa_types::{DirEntry, FsError, InodeId};

/// The most entries one call returns, whatever the caller asks for, so that a reply
/// stays well under the frame limit.
pub const READDIR_LIMIT_MAX: u32 = 4096;

pub(crate) fn readdir(
    kv: &impl KvRead,
    ino: InodeId,
    after: &[u8],
    limit: u32,
) -> Result<MetaResponse, FsError> {
    load_dir(kv, ino)?;
    if limit == 0 {
        return Err(FsError::Invalid("readdir limit must be at least 1".into()));
    }
    let limit = limit.min(READDIR_LIMIT_MAX) as usize;
    let prefix = ino_key(ino);
    // The smallest key after `prefix ++ after` is that key with a zero byte appended;
    // names are never empty, so an empty `after` starts at the first entry.
    let mut from = prefix.to_vec();
    if !after.is_empty() {
        from.extend_from_slice(after);
        from.push(0);
    }
    let end = prefix_end(&prefix);
    // One row more than asked tells whether there is more.
    let mut rows = kv.scan(Table::Dentries, &from, end.as_deref(), limit + 1)?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let mut entries = Vec::with_capacity(rows.len());
    for (key, value) in rows {
        let dentry: Dentry = decode(Table::Dentries, &key, &value)?;
        entries.push(DirEntry {
            name: key[prefix.len()..].to_vec(),
            ino: dentry.ino,
            kind: dentry.kind,
        });
    }
    Ok(MetaResponse::Entries { entries, more })
}
