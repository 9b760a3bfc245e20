//! The client's copy of the chain table, refreshed from meta when a chunk server says it
//! is stale.

use crate::session::{unexpected, Session};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use stoa_proto::{MetaOp, MetaResponse};
use stoa_types::{ChainTable, FsError};

pub(crate) struct ChainCache {
    table: RwLock<Arc<ChainTable>>,
    /// One refresh at a time: a burst of failing calls shares one GetChainTable. Holds
    /// when the last fetch finished.
    refreshing: tokio::sync::Mutex<Option<Instant>>,
}

impl ChainCache {
    pub async fn load(session: &Session) -> Result<ChainCache, FsError> {
        let table = fetch(session).await?;
        Ok(ChainCache { table: RwLock::new(Arc::new(table)), refreshing: Default::default() })
    }

    pub fn current(&self) -> Arc<ChainTable> {
        self.table.read().expect("chain table lock poisoned").clone()
    }

    /// Fetches the table from meta unless someone already replaced the copy whose
    /// version was `seen` while this caller waited.
    pub async fn refresh(&self, session: &Session, seen: u64) -> Result<(), FsError> {
        let mut last = self.refreshing.lock().await;
        if self.current().version != seen {
            return Ok(());
        }
        self.fetch_into(session, &mut last).await
    }

    /// Fetches the table from meta unless a fetch finished less than `age` ago: calls
    /// waiting on a server check their chain this way, and share the fetches.
    pub async fn refresh_older(&self, session: &Session, age: Duration) -> Result<(), FsError> {
        let mut last = self.refreshing.lock().await;
        if last.is_some_and(|at| at.elapsed() < age) {
            return Ok(());
        }
        self.fetch_into(session, &mut last).await
    }

    async fn fetch_into(
        &self,
        session: &Session,
        last: &mut Option<Instant>,
    ) -> Result<(), FsError> {
        let table = fetch(session).await?;
        *last = Some(Instant::now());
        let mut slot = self.table.write().expect("chain table lock poisoned");
        if table.version >= slot.version {
            *slot = Arc::new(table);
        }
        Ok(())
    }
}

async fn fetch(session: &Session) -> Result<ChainTable, FsError> {
    match session.call(MetaOp::GetChainTable).await? {
        MetaResponse::ChainTable(table) => Ok(table),
        other => Err(unexpected("GetChainTable", &other)),
    }
}
