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

#[cfg(test)]
mod tests {
    use super::READDIR_LIMIT_MAX;
    use crate::testing::{Fs, ROOT};
    use stoa_proto::{MetaOp, MetaResponse};
    use stoa_types::{FileKind, FsError};

    #[test]
    fn pages_cover_the_directory_in_name_order() {
        let mut fs = Fs::new();
        let d = fs.mkdir(ROOT, "d").unwrap();
        for i in (0..25).rev() {
            fs.create(d.ino, &format!("f{i:02}")).unwrap();
        }
        let sub = fs.mkdir(d.ino, "sub").unwrap();
        // An entry of a neighbouring directory must not leak into this one.
        fs.create(ROOT, "zzz").unwrap();
        for page in [1, 7, 26, 1000] {
            let all = fs.list(d.ino, page).unwrap();
            let names: Vec<String> =
                all.iter().map(|e| String::from_utf8(e.name.clone()).unwrap()).collect();
            let mut want: Vec<String> = (0..25).map(|i| format!("f{i:02}")).collect();
            want.push("sub".into());
            assert_eq!(names, want, "page {page}");
            assert_eq!((all[25].ino, all[25].kind), (sub.ino, FileKind::Dir));
        }
        let page = MetaOp::ReadDir { ino: d.ino, after: b"f23".to_vec(), limit: 2 };
        let Ok(MetaResponse::Entries { entries, more }) = fs.call(page) else { panic!() };
        assert_eq!((entries.len(), more), (2, false));
        let after_all = MetaOp::ReadDir { ino: d.ino, after: b"zz".to_vec(), limit: 5 };
        assert_eq!(fs.call(after_all), Ok(MetaResponse::Entries { entries: vec![], more: false }));
    }

    #[test]
    fn only_directories_are_listed_with_a_positive_limit() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let op = |ino, limit| MetaOp::ReadDir { ino, after: vec![], limit };
        assert_eq!(fs.call(op(a.ino, 10)), Err(FsError::NotDir));
        assert!(matches!(fs.call(op(ROOT, 0)), Err(FsError::Invalid(_))));
        let Ok(MetaResponse::Entries { entries, .. }) = fs.call(op(ROOT, u32::MAX)) else {
            panic!()
        };
        assert!(entries.len() <= READDIR_LIMIT_MAX as usize);
    }
}
