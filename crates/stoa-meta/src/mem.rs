//! An in-memory [`KvWrite`] over B-trees: the store of every unit test, and a reference
//! that other crates can run the state machine on without a disk.

use crate::kv::{KvRead, KvWrite, Rows, Table};
use std::collections::BTreeMap;
use std::ops::Bound;
use stoa_types::FsError;

/// Every table as an ordered map of byte keys to byte values.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemKv {
    tables: BTreeMap<Table, BTreeMap<Vec<u8>, Vec<u8>>>,
}

impl MemKv {
    pub fn new() -> MemKv {
        MemKv::default()
    }

    /// How many rows `table` holds.
    pub fn len(&self, table: Table) -> usize {
        self.tables.get(&table).map_or(0, BTreeMap::len)
    }

    /// Whether `table` holds no rows.
    pub fn is_empty(&self, table: Table) -> bool {
        self.len(table) == 0
    }
}

impl KvRead for MemKv {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        Ok(self.tables.get(&table).and_then(|t| t.get(key)).cloned())
    }

    fn scan(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Rows, FsError> {
        let Some(rows) = self.tables.get(&table) else { return Ok(Vec::new()) };
        let end = match to {
            Some(to) if to <= from => return Ok(Vec::new()),
            Some(to) => Bound::Excluded(to),
            None => Bound::Unbounded,
        };
        let range = rows.range::<[u8], _>((Bound::Included(from), end));
        Ok(range.take(limit).map(|(k, v)| (k.clone(), v.clone())).collect())
    }
}

impl KvWrite for MemKv {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), FsError> {
        self.tables.entry(table).or_default().insert(key.to_vec(), value.to_vec());
        Ok(())
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<(), FsError> {
        if let Some(rows) = self.tables.get_mut(&table) {
            rows.remove(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_is_half_open_ordered_and_limited() {
        let mut kv = MemKv::new();
        for k in [3u8, 1, 2, 5] {
            kv.put(Table::Inodes, &[k], &[k * 10]).unwrap();
        }
        let keys = |rows: Rows| rows.into_iter().map(|(k, _)| k[0]).collect::<Vec<_>>();
        assert_eq!(keys(kv.scan(Table::Inodes, &[2], Some(&[5]), 10).unwrap()), vec![2, 3]);
        assert_eq!(keys(kv.scan(Table::Inodes, &[0], None, 2).unwrap()), vec![1, 2]);
        assert!(kv.scan(Table::Inodes, &[5], Some(&[2]), 10).unwrap().is_empty());
        assert!(kv.scan(Table::Dentries, &[], None, 10).unwrap().is_empty());
        kv.delete(Table::Inodes, &[3]).unwrap();
        assert_eq!(kv.len(Table::Inodes), 3);
    }
}
