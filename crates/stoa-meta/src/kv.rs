//! The storage the state machine runs on: named tables of ordered byte keys, read and
//! written through two small traits that any ordered key-value engine can implement.

use stoa_types::FsError;

/// Every table of the state machine. Keys are big-endian so that a scan returns rows in
/// numeric order, and composite keys (`parent ++ name`) group related rows together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// Inode number -> attributes (and, for a directory, its parent).
    Inodes,
    /// Parent inode ++ name -> child inode and kind.
    Dentries,
    /// Inode number -> symlink target.
    Symlinks,
    /// Inode number ++ attribute name -> value.
    Xattrs,
    /// Session id -> who opened it and when.
    Sessions,
    /// Session id ++ request id -> the answer first given to that request.
    Dedup,
    /// Counter name -> next id (inodes, sessions, chunk servers) or a running count.
    Counters,
    /// The one row describing the cluster, written by `Init`.
    Cluster,
    /// Chunk server id -> its registration.
    ChunkServers,
    /// The one row holding the chain table.
    Chains,
    /// Inode number -> size of a deleted file whose chunks are still to be deleted.
    Garbage,
    /// Inode number -> nothing: files with no links left that a client still has open.
    Orphans,
    /// Inode ++ session ++ lock owner ++ start -> a held POSIX lock.
    Locks,
    /// Session ++ inode -> nothing: where a session holds locks.
    SessionLocks,
    /// Session id ++ inode number -> nothing: the files each session has open.
    Opens,
    /// Inode number ++ session id -> nothing: the same rows by inode, to find whether
    /// anyone still has a file open.
    Openers,
    /// Inode number -> when its last name went: orphans kept a short while because
    /// another client may be opening them by inode (see `ops/unlink.rs`).
    Strays,
    /// Inode number -> the session that keeps the inode's locks itself (`ops/locks.rs`).
    LockDelegations,
}

impl Table {
    /// Every table, so that stores can create them all and snapshots can dump them all.
    pub const ALL: [Table; 18] = [
        Table::Inodes,
        Table::Dentries,
        Table::Symlinks,
        Table::Xattrs,
        Table::Sessions,
        Table::Dedup,
        Table::Counters,
        Table::Cluster,
        Table::ChunkServers,
        Table::Chains,
        Table::Garbage,
        Table::Orphans,
        Table::Locks,
        Table::SessionLocks,
        Table::Opens,
        Table::Openers,
        Table::Strays,
        Table::LockDelegations,
    ];

    /// The table's stable name in a store and in snapshots. Never rename one: stores and
    /// snapshots written by older builds refer to it.
    pub fn name(&self) -> &'static str {
        match self {
            Table::Inodes => "inodes",
            Table::Dentries => "dentries",
            Table::Symlinks => "symlinks",
            Table::Xattrs => "xattrs",
            Table::Sessions => "sessions",
            Table::Dedup => "dedup",
            Table::Counters => "counters",
            Table::Cluster => "cluster",
            Table::ChunkServers => "chunk_servers",
            Table::Chains => "chains",
            Table::Garbage => "garbage",
            Table::Orphans => "orphans",
            Table::Locks => "locks",
            Table::SessionLocks => "session_locks",
            Table::Opens => "opens",
            Table::Openers => "openers",
            Table::Strays => "strays",
            Table::LockDelegations => "lock_delegations",
        }
    }
}

/// Key-value rows in key order.
pub type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// Reads from the state machine's tables. Errors are storage failures of the engine.
pub trait KvRead {
    /// The value stored under `key`, if any.
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, FsError>;

    /// Rows with `from <= key < to` (`to: None` means to the end of the table), in key
    /// order, at most `limit` of them.
    fn scan(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Rows, FsError>;
}

/// Writes to the state machine's tables.
pub trait KvWrite: KvRead {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), FsError>;
    fn delete(&mut self, table: Table, key: &[u8]) -> Result<(), FsError>;
}

/// The smallest key greater than every key that starts with `prefix`, or `None` when
/// no such key exists (the prefix is all `0xff`). Used as the end of a prefix scan.
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_unique_and_leave_the_servers_names_alone() {
        let mut names: Vec<&str> = Table::ALL.iter().map(|t| t.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Table::ALL.len());
        for reserved in ["raft_log", "raft_meta", "sm_meta"] {
            assert!(!names.contains(&reserved));
        }
    }

    #[test]
    fn a_prefix_end_bounds_exactly_the_prefixed_keys() {
        assert_eq!(prefix_end(&[1, 2]), Some(vec![1, 3]));
        assert_eq!(prefix_end(&[1, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff, 0xff]), None);
    }
}
