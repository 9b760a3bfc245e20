//! Extended attributes: GetXattr, ListXattr, SetXattr and RemoveXattr. Each attribute is
//! one row keyed `ino ++ name`, so listing one inode's attributes is a prefix scan.

use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use crate::store::{self, ino_key, load_inode, save_inode};
use stoa_proto::{MetaResponse, Xattrs};
use stoa_types::{validate_xattr_name, FsError, InodeId, Timestamp, XATTR_VALUE_LEN_MAX};

/// Fail with `Exists` if the attribute is already there.
pub const XATTR_CREATE: u32 = 1;
/// Fail with `NoAttr` if the attribute is not there.
pub const XATTR_REPLACE: u32 = 2;

fn xattr_key(ino: InodeId, name: &[u8]) -> Result<Vec<u8>, FsError> {
    validate_xattr_name(name)?;
    let mut key = ino_key(ino).to_vec();
    key.extend_from_slice(name);
    Ok(key)
}

pub(crate) fn get(kv: &impl KvRead, ino: InodeId, name: &[u8]) -> Result<MetaResponse, FsError> {
    load_inode(kv, ino)?;
    let value: Vec<u8> =
        store::get(kv, Table::Xattrs, &xattr_key(ino, name)?)?.ok_or(FsError::NoAttr)?;
    Ok(MetaResponse::Data(value))
}

pub(crate) fn list(kv: &impl KvRead, ino: InodeId) -> Result<MetaResponse, FsError> {
    load_inode(kv, ino)?;
    let rows = rows(kv, ino, usize::MAX)?;
    Ok(MetaResponse::Names(rows.into_iter().map(|(name, _)| name).collect()))
}

/// Rows read at a time by [`all`].
const ALL_PAGE_ROWS: usize = 16;

/// Every attribute of `ino`, names and values in name order, unless there are more than
/// `bytes_max` bytes of them. Reads a few rows at a time and stops at the first past
/// `bytes_max`: it read up to `bytes_max + 1` rows at once, and rows of 64 KiB values
/// made a grant of a file with many read 256 MiB to find them too many.
pub fn all(kv: &impl KvRead, ino: InodeId, bytes_max: usize) -> Result<Option<Xattrs>, FsError> {
    let prefix = ino_key(ino);
    let end = prefix_end(&prefix);
    let (mut from, mut out, mut bytes) = (prefix.to_vec(), Vec::new(), 0);
    loop {
        let page = kv.scan(Table::Xattrs, &from, end.as_deref(), ALL_PAGE_ROWS)?;
        let last = page.len() < ALL_PAGE_ROWS;
        for (key, value) in &page {
            let value: Vec<u8> = store::decode(Table::Xattrs, key, value)?;
            bytes += key.len() - prefix.len() + value.len();
            if bytes > bytes_max {
                return Ok(None);
            }
            out.push((key[prefix.len()..].to_vec(), value));
        }
        match page.last() {
            // The next page starts just past the last key of this one.
            Some((key, _)) if !last => from = [key.as_slice(), &[0]].concat(),
            _ => return Ok(Some(out)),
        }
    }
}

/// Up to `limit` attributes of `ino`: names and values.
fn rows(kv: &impl KvRead, ino: InodeId, limit: usize) -> Result<Xattrs, FsError> {
    let prefix = ino_key(ino);
    let end = prefix_end(&prefix);
    let rows = kv.scan(Table::Xattrs, &prefix, end.as_deref(), limit)?;
    rows.into_iter()
        .map(|(key, value)| {
            Ok((key[prefix.len()..].to_vec(), store::decode(Table::Xattrs, &key, &value)?))
        })
        .collect()
}

pub(crate) fn set(
    kv: &mut impl KvWrite,
    ino: InodeId,
    name: &[u8],
    value: &[u8],
    flags: u32,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if flags & !(XATTR_CREATE | XATTR_REPLACE) != 0 || flags == XATTR_CREATE | XATTR_REPLACE {
        return Err(FsError::Invalid(format!("unsupported setxattr flags {flags:#x}")));
    }
    if value.len() > XATTR_VALUE_LEN_MAX {
        // Linux says E2BIG, which FsError has no variant for; EFBIG is the nearest.
        return Err(FsError::TooBig);
    }
    let mut rec = load_inode(kv, ino)?;
    let key = xattr_key(ino, name)?;
    let exists = kv.get(Table::Xattrs, &key)?.is_some();
    if exists && flags & XATTR_CREATE != 0 {
        return Err(FsError::Exists);
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(FsError::NoAttr);
    }
    store::put(kv, Table::Xattrs, &key, &value.to_vec())?;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    Ok(MetaResponse::Done)
}

pub(crate) fn remove(
    kv: &mut impl KvWrite,
    ino: InodeId,
    name: &[u8],
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let mut rec = load_inode(kv, ino)?;
    let key = xattr_key(ino, name)?;
    if kv.get(Table::Xattrs, &key)?.is_none() {
        return Err(FsError::NoAttr);
    }
    kv.delete(Table::Xattrs, &key)?;
    rec.attr.ctime = now;
    save_inode(kv, &mut rec)?;
    Ok(MetaResponse::Done)
}

#[cfg(test)]
mod tests {
    use super::{XATTR_CREATE, XATTR_REPLACE};
    use crate::testing::{Fs, ROOT};
    use stoa_proto::{MetaOp, MetaResponse};
    use stoa_types::{FsError, InodeId, XATTR_NAME_LEN_MAX, XATTR_VALUE_LEN_MAX};

    fn set(fs: &mut Fs, ino: InodeId, name: &str, value: &[u8], flags: u32) -> Result<(), FsError> {
        let (name, value) = (name.as_bytes().to_vec(), value.to_vec());
        fs.call(MetaOp::SetXattr { ino, name, value, flags }).map(|_| ())
    }

    fn get(fs: &mut Fs, ino: InodeId, name: &str) -> Result<MetaResponse, FsError> {
        fs.call(MetaOp::GetXattr { ino, name: name.as_bytes().to_vec() })
    }

    #[test]
    fn attributes_are_set_read_listed_and_removed() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let b = fs.create(ROOT, "b").unwrap();
        set(&mut fs, b.ino, "user.other", b"x", 0).unwrap();
        set(&mut fs, a.ino, "user.z", b"1", 0).unwrap();
        set(&mut fs, a.ino, "user.a", b"", 0).unwrap();
        let attr = fs.getattr(a.ino).unwrap();
        assert_eq!((attr.ctime, attr.version), (fs.now(), a.version + 2));
        assert_eq!(get(&mut fs, a.ino, "user.z"), Ok(MetaResponse::Data(b"1".to_vec())));
        assert_eq!(get(&mut fs, a.ino, "user.a"), Ok(MetaResponse::Data(vec![])));
        assert_eq!(get(&mut fs, a.ino, "user.none"), Err(FsError::NoAttr));
        let names = vec![b"user.a".to_vec(), b"user.z".to_vec()];
        assert_eq!(fs.call(MetaOp::ListXattr { ino: a.ino }), Ok(MetaResponse::Names(names)));
        let remove = |name: &str| MetaOp::RemoveXattr { ino: a.ino, name: name.into() };
        fs.call(remove("user.z")).unwrap();
        assert_eq!(fs.call(remove("user.z")), Err(FsError::NoAttr));
        assert_eq!(get(&mut fs, a.ino, "user.z"), Err(FsError::NoAttr));
        let missing = MetaOp::ListXattr { ino: InodeId(99) };
        assert_eq!(fs.call(missing), Err(FsError::NotFound));
    }

    #[test]
    fn all_of_an_inodes_attributes_come_in_name_order_up_to_a_size() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        let b = fs.create(ROOT, "b").unwrap();
        assert_eq!(super::all(&fs.kv, a.ino, 100), Ok(Some(vec![])));
        set(&mut fs, a.ino, "user.z", b"1", 0).unwrap();
        set(&mut fs, a.ino, "user.a", b"22", 0).unwrap();
        set(&mut fs, b.ino, "user.b", b"x", 0).unwrap();
        let both = vec![(b"user.a".to_vec(), b"22".to_vec()), (b"user.z".to_vec(), b"1".to_vec())];
        // 6 + 2 + 6 + 1 bytes.
        assert_eq!(super::all(&fs.kv, a.ino, 15), Ok(Some(both)));
        assert_eq!(super::all(&fs.kv, a.ino, 14), Ok(None));
        // Across pages of rows, and the next inode's first attribute is not one of them.
        let names: Vec<String> = (0..40).map(|i| format!("user.k{i:02}")).collect();
        for name in &names {
            set(&mut fs, a.ino, name, b"v", 0).unwrap();
        }
        // 15 bytes as above, and 40 times 8 + 1.
        let all = super::all(&fs.kv, a.ino, 375).unwrap().unwrap();
        let got: Vec<&[u8]> = all.iter().map(|(n, _)| n.as_slice()).collect();
        let mut want: Vec<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
        want.insert(0, b"user.a");
        want.push(b"user.z");
        assert_eq!(got, want);
        assert_eq!(super::all(&fs.kv, a.ino, 374), Ok(None));
    }

    #[test]
    fn flags_and_limits_are_checked() {
        let mut fs = Fs::new();
        let a = fs.create(ROOT, "a").unwrap();
        assert_eq!(set(&mut fs, a.ino, "user.k", b"1", XATTR_REPLACE), Err(FsError::NoAttr));
        set(&mut fs, a.ino, "user.k", b"1", XATTR_CREATE).unwrap();
        assert_eq!(set(&mut fs, a.ino, "user.k", b"2", XATTR_CREATE), Err(FsError::Exists));
        set(&mut fs, a.ino, "user.k", b"3", XATTR_REPLACE).unwrap();
        assert_eq!(get(&mut fs, a.ino, "user.k"), Ok(MetaResponse::Data(b"3".to_vec())));
        assert!(matches!(set(&mut fs, a.ino, "user.k", b"", 3), Err(FsError::Invalid(_))));
        let big = vec![0; XATTR_VALUE_LEN_MAX + 1];
        assert_eq!(set(&mut fs, a.ino, "user.big", &big, 0), Err(FsError::TooBig));
        set(&mut fs, a.ino, "user.max", &big[1..], 0).unwrap();
        let long = "u".repeat(XATTR_NAME_LEN_MAX + 1);
        assert_eq!(set(&mut fs, a.ino, &long, b"", 0), Err(FsError::Range));
        assert_eq!(set(&mut fs, a.ino, "", b"", 0), Err(FsError::Range));
        assert!(matches!(set(&mut fs, a.ino, "user.", b"1", 0), Err(FsError::Invalid(_))));
        for name in ["bogus.k", "system.posix_acl_access", "userk", "k"] {
            assert_eq!(set(&mut fs, a.ino, name, b"1", 0), Err(FsError::NotSupported), "{name}");
            assert_eq!(get(&mut fs, a.ino, name), Err(FsError::NotSupported), "{name}");
        }
        set(&mut fs, a.ino, "trusted.k", b"1", 0).unwrap();
        set(&mut fs, a.ino, "security.k", b"1", 0).unwrap();
    }
}
