//! Identifiers. Each is a newtype so that an inode can never be passed where a node is
//! meant.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty)) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    };
}

id_type!(
    /// An inode number. It is also the FUSE node id, so every hard link of a file is one
    /// kernel node.
    InodeId(u64)
);
id_type!(
    /// A server: meta replicas and chunk servers share one id space per cluster.
    NodeId(u64)
);
id_type!(
    /// A replication chain of chunk servers.
    ChainId(u32)
);
id_type!(
    /// A client session granted by meta.
    SessionId(u64)
);
id_type!(
    /// A client-chosen, per-session increasing number on every mutation, so that a retry
    /// of the same mutation is applied at most once.
    RequestId(u64)
);

impl InodeId {
    /// The root directory; FUSE fixes it at 1.
    pub const ROOT: InodeId = InodeId(1);
}

/// Which cluster a data directory or a peer belongs to. Chosen once, at cluster creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClusterId(pub u128);

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for ClusterId {
    type Err = std::num::ParseIntError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        u128::from_str_radix(s.trim(), 16).map(ClusterId)
    }
}

/// One chunk of one file: the `index`-th run of `chunk_size` bytes of inode `ino`. Chunk
/// ids are derived, never allocated, so writing a new chunk needs no metadata round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ChunkId {
    pub ino: InodeId,
    pub index: u64,
}

impl fmt::Display for ChunkId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{:08x}", self.ino.0, self.index)
    }
}

impl std::str::FromStr for ChunkId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ino, index) = s.split_once('-').ok_or_else(|| format!("bad chunk id {s:?}"))?;
        let ino = u64::from_str_radix(ino, 16).map_err(|e| format!("bad chunk id {s:?}: {e}"))?;
        let index =
            u64::from_str_radix(index, 16).map_err(|e| format!("bad chunk id {s:?}: {e}"))?;
        Ok(ChunkId { ino: InodeId(ino), index })
    }
}

/// One client mutation of a chunk: the session that made it and a number the client
/// never uses twice in that session. Every attempt of a chunk write or truncate carries
/// the same id, and every replica remembers the ids of the last few mutations it applied
/// to a chunk, so a retry after a lost reply is answered with the first attempt's version
/// instead of being applied again (possibly over another client's later write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WriteId {
    pub session: SessionId,
    pub seq: u64,
}

impl fmt::Display for WriteId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.session, self.seq)
    }
}

/// A mutation a replica applied: its id and the chunk version it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteRecord {
    pub id: WriteId,
    pub version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_id_round_trips_through_text() {
        let id = ChunkId { ino: InodeId(0x1234), index: 7 };
        assert_eq!(id.to_string().parse::<ChunkId>().unwrap(), id);
        assert!("nonsense".parse::<ChunkId>().is_err());
        assert!("zz-1".parse::<ChunkId>().is_err());
    }

    #[test]
    fn cluster_id_round_trips_through_text() {
        let id = ClusterId(0xdead_beef_0000_0000_0000_0000_0000_0001);
        assert_eq!(id.to_string().parse::<ClusterId>().unwrap(), id);
    }
}
