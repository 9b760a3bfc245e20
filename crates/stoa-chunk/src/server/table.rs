//! This server's copy of meta's chain table, how it is kept fresh (heartbeats, and a
//! fetch when a request shows a newer chain version), and the fence that stops a server
//! cut off from meta from serving anything.

use super::Server;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use stoa_proto::{MetaOp, MetaResponse};
use stoa_types::{Chain, ChainId, ChainTable, FsError};

/// How often the server reports to meta: several beats fit in meta's 1.5 s timeout, so
/// one lost or slow beat does not take a healthy server out of its chains.
pub(crate) const HEARTBEAT_PERIOD: Duration = Duration::from_millis(300);
/// Meta takes a server that was silent this long out of its chains (`DOWN_AFTER` in
/// stoa-metad). A server that has had no heartbeat answered for as long stops serving
/// first: its chains may have moved on without it, and serving reads from an old table
/// would return stale data. The fence counts from when the answered heartbeat was
/// *sent*, meta from when it *arrived*, so the server always fences first.
pub(crate) const FENCE_AFTER: Duration = Duration::from_millis(1500);

#[derive(Default)]
pub(crate) struct ChainView {
    /// A watch, not a lock: a forward waiting on a successor stops as soon as a newer
    /// table moves its chain (see [`ChainView::moved`]).
    table: tokio::sync::watch::Sender<Arc<ChainTable>>,
    /// One fetch from meta at a time; callers that waited reuse its result.
    refreshing: tokio::sync::Mutex<()>,
    /// When the last heartbeat that meta answered was sent.
    last_ack: Mutex<Option<Instant>>,
}

impl ChainView {
    pub fn table(&self) -> Arc<ChainTable> {
        self.table.borrow().clone()
    }

    /// Takes `table` if it is newer than ours; says whether it did.
    fn replace(&self, table: ChainTable) -> bool {
        self.table.send_if_modified(|current| {
            if table.version <= current.version {
                return false;
            }
            *current = Arc::new(table);
            true
        })
    }

    /// Returns once our table gives `chain` another version than `chain.version` (it
    /// moved on: a member left or joined), never while it keeps that version.
    pub async fn moved(&self, chain: &Chain) -> FsError {
        let mut tables = self.table.subscribe();
        let version_of = |t: &ChainTable| t.chain(chain.id).map_or(0, |c| c.version);
        let current =
            tables.wait_for(|t| version_of(t) != chain.version).await.map(|t| version_of(&t));
        match current {
            Ok(current) => FsError::StaleChain { got: chain.version, current },
            // The sender lives as long as the server; without it nothing moves.
            Err(_) => std::future::pending().await,
        }
    }

    pub fn acked(&self, sent: Instant) {
        let mut last = self.last_ack.lock().expect("ack lock poisoned");
        *last = Some(last.map_or(sent, |l| l.max(sent)));
    }

    fn fenced(&self) -> bool {
        self.last_ack.lock().expect("ack lock poisoned").is_none_or(|t| t.elapsed() > FENCE_AFTER)
    }
}

impl Server {
    pub(crate) fn table(&self) -> Arc<ChainTable> {
        self.view.table()
    }

    /// Records that meta answered a call sent at `sent`.
    pub(crate) fn meta_acked(&self, sent: Instant) {
        self.view.acked(sent);
    }

    pub(super) fn check_fence(&self) -> Result<(), FsError> {
        if self.view.fenced() {
            return Err(FsError::Unavailable(format!(
                "chunk server {} has not reached meta for {FENCE_AFTER:?}; its chains may have \
                 moved on",
                self.node
            )));
        }
        Ok(())
    }

    /// Takes a table from meta if it is newer, and starts the resyncs it asks for.
    pub(crate) fn adopt(self: &Arc<Self>, table: ChainTable) {
        let version = table.version;
        if self.view.replace(table) {
            tracing::info!("chunk server {} now has chain table version {version}", self.node);
            self.start_resyncs();
        }
    }

    /// Fetches the chain table from meta.
    pub(super) async fn refresh(self: &Arc<Self>) -> Result<(), FsError> {
        let before = self.table().version;
        let _one = self.view.refreshing.lock().await;
        if self.table().version != before {
            return Ok(());
        }
        match self.call_meta(MetaOp::GetChainTable).await? {
            MetaResponse::ChainTable(table) => {
                self.adopt(table);
                Ok(())
            }
            other => Err(FsError::Protocol(format!("GetChainTable answered {other:?}"))),
        }
    }

    /// The chain a request names, if the request's version is ours. A request that knows a
    /// newer version than ours makes us fetch the table once before judging it.
    pub(super) async fn chain_for_request(
        self: &Arc<Self>,
        id: ChainId,
        version: u64,
    ) -> Result<Chain, FsError> {
        let ours = |table: &ChainTable| table.chain(id).map(|c| (c.version, c.clone()));
        match ours(&self.table()) {
            Some((v, chain)) if v == version => return Ok(chain),
            Some((v, _)) if v > version => {
                return Err(FsError::StaleChain { got: version, current: v })
            }
            _ => self.refresh().await?,
        }
        match ours(&self.table()) {
            Some((v, chain)) if v == version => Ok(chain),
            Some((v, _)) => Err(FsError::StaleChain { got: version, current: v }),
            None => Err(FsError::StaleChain { got: version, current: 0 }),
        }
    }

    /// Starts the heartbeat loop; it runs until the server stops.
    pub(crate) fn start_heartbeats(self: &Arc<Self>) {
        let server = self.clone();
        self.spawn(server.heartbeat_loop());
    }

    /// Reports liveness and usage to meta every [`HEARTBEAT_PERIOD`] and takes the new
    /// chain table when meta sends one.
    async fn heartbeat_loop(self: Arc<Self>) {
        let mut ticker = tokio::time::interval(HEARTBEAT_PERIOD);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let (capacity_bytes, used_bytes) = self.disk(|e| e.usage()).await.unwrap_or_else(|e| {
                tracing::warn!("measuring the chunk store: {e}");
                (0, 0)
            });
            let sent = Instant::now();
            let op = MetaOp::ChunkHeartbeat {
                node: self.node,
                capacity_bytes,
                used_bytes,
                table_version: self.table().version,
                repair: self.repair_progress(),
            };
            match self.call_meta(op).await {
                Ok(MetaResponse::Heartbeat { table, replicas }) => {
                    self.replicas.store(replicas.into(), std::sync::atomic::Ordering::Relaxed);
                    // The new table first, then the fence lifted: a server waking from a
                    // stop must not answer a request from its old table in between.
                    if let Some(table) = table {
                        self.adopt(table);
                    }
                    self.meta_acked(sent);
                }
                Ok(other) => tracing::warn!("meta answered a heartbeat with {other:?}"),
                Err(e) => tracing::debug!("heartbeat to meta failed: {e}"),
            }
        }
    }
}
