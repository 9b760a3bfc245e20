//! An overlay that buffers one operation's writes over the store, so that an operation
//! either takes effect whole or not at all.
//!
//! Errors are answers here, not crashes: a rename that finds a non-empty target returns
//! `NotEmpty` and its batch still commits. Without the overlay, every operation would
//! have to check everything before its first write; with it, an operation may write as
//! it goes, and [`apply`](crate::apply) keeps the writes only when the answer is `Ok`.

use crate::kv::{KvRead, KvWrite, Rows, Table};
use std::collections::BTreeMap;
use std::ops::Bound;
use stoa_types::FsError;

/// A pending write: `Some(value)` puts, `None` deletes.
type Pending = BTreeMap<(Table, Vec<u8>), Option<Vec<u8>>>;

/// Reads see the base store with this operation's own writes on top.
pub(crate) struct Txn<'a, K: KvRead> {
    base: &'a K,
    writes: Pending,
}

impl<'a, K: KvRead> Txn<'a, K> {
    pub fn new(base: &'a K) -> Txn<'a, K> {
        Txn { base, writes: Pending::new() }
    }

    /// The buffered writes, to be applied to the store in one go.
    pub fn into_writes(self) -> Pending {
        self.writes
    }

    /// The buffered writes to `table` in `[from, to)`.
    fn pending_in(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
    ) -> Vec<(&[u8], Option<&[u8]>)> {
        let start = Bound::Included((table, from.to_vec()));
        let end = match to {
            Some(to) => Bound::Excluded((table, to.to_vec())),
            None => Bound::Unbounded,
        };
        self.writes
            .range((start, end))
            .take_while(|((t, _), _)| *t == table)
            .map(|((_, k), v)| (k.as_slice(), v.as_deref()))
            .collect()
    }
}

/// Applies writes buffered by a [`Txn`] to the store.
pub(crate) fn commit(kv: &mut impl KvWrite, writes: Pending) -> Result<(), FsError> {
    for ((table, key), value) in writes {
        match value {
            Some(value) => kv.put(table, &key, &value)?,
            None => kv.delete(table, &key)?,
        }
    }
    Ok(())
}

impl<K: KvRead> KvRead for Txn<'_, K> {
    fn get(&self, table: Table, key: &[u8]) -> Result<Option<Vec<u8>>, FsError> {
        match self.writes.get(&(table, key.to_vec())) {
            Some(pending) => Ok(pending.clone()),
            None => self.base.get(table, key),
        }
    }

    /// Merges the base rows with the pending writes. The base is asked for `limit` rows
    /// plus one per pending write in the range: each pending write hides at most one base
    /// row, so at least `limit` visible base rows come back whenever the base has them,
    /// and every row past the last one returned sorts after the first `limit` results.
    fn scan(
        &self,
        table: Table,
        from: &[u8],
        to: Option<&[u8]>,
        limit: usize,
    ) -> Result<Rows, FsError> {
        if to.is_some_and(|to| to <= from) {
            return Ok(Vec::new());
        }
        let pending = self.pending_in(table, from, to);
        if pending.is_empty() {
            return self.base.scan(table, from, to, limit);
        }
        let base = self.base.scan(table, from, to, limit.saturating_add(pending.len()))?;
        let mut merged: BTreeMap<Vec<u8>, Vec<u8>> = base.into_iter().collect();
        for (key, value) in pending {
            match value {
                Some(value) => merged.insert(key.to_vec(), value.to_vec()),
                None => merged.remove(key),
            };
        }
        Ok(merged.into_iter().take(limit).collect())
    }
}

impl<K: KvRead> KvWrite for Txn<'_, K> {
    fn put(&mut self, table: Table, key: &[u8], value: &[u8]) -> Result<(), FsError> {
        self.writes.insert((table, key.to_vec()), Some(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, table: Table, key: &[u8]) -> Result<(), FsError> {
        self.writes.insert((table, key.to_vec()), None);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::MemKv;

    fn keys(rows: Rows) -> Vec<u8> {
        rows.into_iter().map(|(k, _)| k[0]).collect()
    }

    #[test]
    fn reads_see_pending_writes_and_the_base_is_untouched_until_commit() {
        let mut base = MemKv::new();
        for k in 1..=6u8 {
            base.put(Table::Dentries, &[k], b"base").unwrap();
        }
        base.put(Table::Inodes, &[0], b"other table").unwrap();
        let mut txn = Txn::new(&base);
        txn.delete(Table::Dentries, &[1]).unwrap();
        txn.delete(Table::Dentries, &[2]).unwrap();
        txn.put(Table::Dentries, &[4], b"new").unwrap();
        txn.put(Table::Dentries, &[9], b"new").unwrap();
        assert_eq!(txn.get(Table::Dentries, &[1]).unwrap(), None);
        assert_eq!(txn.get(Table::Dentries, &[4]).unwrap(), Some(b"new".to_vec()));
        assert_eq!(keys(txn.scan(Table::Dentries, &[0], None, 3).unwrap()), vec![3, 4, 5]);
        assert_eq!(keys(txn.scan(Table::Dentries, &[0], None, 10).unwrap()), vec![3, 4, 5, 6, 9]);
        assert_eq!(keys(txn.scan(Table::Dentries, &[4], Some(&[6]), 10).unwrap()), vec![4, 5]);
        assert_eq!(keys(txn.scan(Table::Inodes, &[0], None, 10).unwrap()), vec![0]);
        let writes = txn.into_writes();
        assert_eq!(base.len(Table::Dentries), 6);
        commit(&mut base, writes).unwrap();
        assert_eq!(keys(base.scan(Table::Dentries, &[0], None, 10).unwrap()), vec![3, 4, 5, 6, 9]);
    }
}
