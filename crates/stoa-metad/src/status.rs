//! `Status`: the cluster at a glance. The leader knows the most (replication progress,
//! chunk-server heartbeats), so a follower forwards the call to it and answers itself
//! only when there is no leader to ask, which is exactly when an operator needs it.

use crate::liveness::DOWN_AFTER;
use crate::raft::{RaftView, Role};
use crate::service::Node;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;
use stoa_proto::{
    ChunkServerStatus, ClusterStatus, MetaMemberStatus, MetaRequest, MetaResponse, GARBAGE_COUNTED,
};
use stoa_types::{ClusterId, FsError, InodeId};

/// How long a non-leader waits for a peer to accept a connection before calling it down.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

impl Node {
    pub(crate) async fn status(&self, req: MetaRequest) -> Result<MetaResponse, FsError> {
        let view = self.raft.view();
        if view.role != Role::Leader && view.leader.is_some_and(|l| l != self.id()) {
            match self.forward(&view, req).await {
                Ok(resp) => return Ok(resp),
                Err(e) => tracing::debug!("status: leader did not answer ({e}); answering here"),
            }
        }
        Ok(MetaResponse::Status(self.local_status(&view).await?))
    }

    async fn local_status(&self, view: &RaftView) -> Result<ClusterStatus, FsError> {
        let leading = view.role == Role::Leader;
        let quorate = if leading {
            view.quorum_ack_ms
                .is_some_and(|ms| u128::from(ms) < self.raft.election_timeout().as_millis())
        } else {
            view.leader.is_some() && self.raft.hears_leader()
        };
        let (info, table, records, files, garbage) = self
            .raft
            .read(|kv| {
                Ok((
                    stoa_meta::cluster_info(kv)?,
                    stoa_meta::chain_table(kv)?,
                    stoa_meta::chunk_servers(kv)?,
                    stoa_meta::file_count(kv)?,
                    stoa_meta::garbage(kv, InodeId(0), GARBAGE_COUNTED)?.len() as u64,
                ))
            })
            .await?;
        let cluster =
            info.as_ref().map(|i| i.cluster).or(self.cluster.get()).unwrap_or(ClusterId(0));
        let replicas = info.map_or(self.cfg.replicas, |i| i.replicas);
        let chunk_servers = records
            .into_iter()
            .map(|r| {
                let beat = if leading { self.liveness.last(r.id) } else { None };
                ChunkServerStatus {
                    id: r.id,
                    addr: r.addr,
                    zone: r.zone,
                    up: leading && self.liveness.is_alive(r.id, DOWN_AFTER) && beat.is_some(),
                    capacity_bytes: beat.map_or(r.capacity_bytes, |b| b.capacity_bytes),
                    used_bytes: beat.map_or(r.used_bytes, |b| b.used_bytes),
                    last_heartbeat_ms: beat.map(|b| b.at.elapsed().as_millis() as u64),
                    repair: beat.map(|b| b.repair).unwrap_or_default(),
                    copy_rate_bytes_per_sec: beat.map_or(0, |b| b.copy_rate_bytes_per_sec),
                }
            })
            .collect();
        Ok(ClusterStatus {
            cluster,
            answered_by: self.id(),
            leader: view.leader,
            term: view.term,
            quorate,
            last_applied: view.last_applied,
            members: self.members(view).await,
            chunk_servers,
            chains: table.chains,
            replicas,
            table_version: table.version,
            files,
            caps: if leading { self.caps.count() } else { 0 },
            garbage,
        })
    }

    /// Every voter and whether it is up. The leader knows from its replication traffic;
    /// anyone else probes the peers with a connection attempt.
    async fn members(&self, view: &RaftView) -> Vec<MetaMemberStatus> {
        let leading = view.role == Role::Leader;
        let recent = self.raft.election_timeout();
        let mut probes = tokio::task::JoinSet::new();
        for (id, addr) in &view.voters {
            if let (false, false, Some(addr)) = (leading, *id == self.id(), *addr) {
                let (pool, id) = (self.pool.clone(), *id);
                probes.spawn(async move {
                    let up = tokio::time::timeout(PROBE_TIMEOUT, pool.conn(addr)).await;
                    (id, matches!(up, Ok(Ok(_))))
                });
            }
        }
        let mut probed = Vec::new();
        while let Some(Ok(result)) = probes.join_next().await {
            probed.push(result);
        }
        let unknown = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
        view.voters
            .iter()
            .map(|(id, addr)| {
                let up = if *id == self.id() {
                    true
                } else if leading {
                    self.raft.peer_contact(*id).is_some_and(|d| d < recent)
                } else {
                    probed.iter().any(|(p, up)| p == id && *up)
                };
                MetaMemberStatus {
                    id: *id,
                    addr: addr.unwrap_or(unknown),
                    voter: true,
                    up,
                    matched_index: view.matched.get(id).copied().flatten(),
                }
            })
            .collect()
    }
}
