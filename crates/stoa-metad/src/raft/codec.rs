//! One binary encoding for everything the Raft module stores or sends: bincode with a size
//! limit, so that a corrupt length in a file or a message gives an error instead of a
//! huge allocation.

use bincode::Options;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Larger than any message or stored value we produce (a snapshot chunk, a log entry).
const LEN_MAX_BYTES: u64 = 1 << 30;

fn options() -> impl Options {
    bincode::DefaultOptions::new().with_limit(LEN_MAX_BYTES)
}

pub(crate) fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, String> {
    options().serialize(value).map_err(|e| format!("encode: {e}"))
}

pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    options().deserialize(bytes).map_err(|e| format!("decode: {e}"))
}
