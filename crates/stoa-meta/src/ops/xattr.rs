//! Extended attributes: GetXattr, ListXattr, SetXattr and RemoveXattr. Each attribute is
//! one row keyed `ino ++ name`, so listing one inode's attributes is a prefix scan.

use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use crate::store::{self, ino_key, load_inode, save_inode};
use stoa_proto::MetaResponse;
use stoa_types::{FsError, InodeId, Timestamp, XATTR_VALUE_LEN_MAX};

/// Fail with `Exists` if the attribute is already there.
pub const XATTR_CREATE: u32 = 1;
/// Fail with `NoAttr` if the attribute is not there.
pub const XATTR_REPLACE: u32 = 2;
/// Longest attribute name, in bytes (as on Linux).
pub const XATTR_NAME_LEN_MAX: usize = 255;

fn xattr_key(ino: InodeId, name: &[u8]) -> Result<Vec<u8>, FsError> {
    // Linux answers ERANGE for an empty or over-long attribute name.
    if name.is_empty() || name.len() > XATTR_NAME_LEN_MAX {
        return Err(FsError::Range);
    }
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
    let prefix = ino_key(ino);
    let end = prefix_end(&prefix);
    let rows = kv.scan(Table::Xattrs, &prefix, end.as_deref(), usize::MAX)?;
    Ok(MetaResponse::Names(rows.into_iter().map(|(k, _)| k[prefix.len()..].to_vec()).collect()))
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
