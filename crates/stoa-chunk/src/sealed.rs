//! The small files a chunk server keeps beside its chunks (its identity, the chunk
//! layout), each written whole and durably:
//!
//! ```text
//!  magic [4] | format u32 | body | crc32c u32 of everything before it
//! ```

use std::fs::File;
use std::io::Write;
use std::path::Path;

/// The bytes of a file holding `body` in `format`.
pub(crate) fn seal(magic: &[u8; 4], format: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + 4 + body.len() + 4);
    out.extend_from_slice(magic);
    out.extend_from_slice(&format.to_le_bytes());
    out.extend_from_slice(body);
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The format and the body of `bytes`, a file of `what` ("an identity") whose body is
/// `body_len` bytes; an error that says what is wrong with it otherwise.
pub(crate) fn unseal<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    body_len: usize,
    what: &str,
) -> Result<(u32, &'a [u8]), String> {
    let len = 4 + 4 + body_len + 4;
    if bytes.len() != len || &bytes[..4] != magic {
        return Err(format!("not {what} file ({} bytes)", bytes.len()));
    }
    let (sealed, tail) = bytes.split_at(len - 4);
    if u32::from_le_bytes(tail.try_into().map_err(|_| "short crc")?) != crc32c::crc32c(sealed) {
        return Err("checksum mismatch: the file is damaged".into());
    }
    let format = u32::from_le_bytes(sealed[4..8].try_into().map_err(|_| "short format")?);
    Ok((format, &sealed[8..]))
}

/// Writes `bytes` to `<dir>/<name>` durably: a temporary file, fsync, rename over the
/// name, fsync of the directory. Blocking: call it off the reactor.
pub(crate) fn store(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let path = dir.join(name);
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    File::open(dir)?.sync_all()
}
