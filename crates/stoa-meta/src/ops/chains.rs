//! Chunk servers and the chain table: registration, the first chains, a server leaving
//! its chains when it goes silent, rejoining them as a syncing member when it returns,
//! and becoming a full member once it has caught up.
//!
//! ```text
//!  register --(>= replicas servers, no chains, or no file made yet)--> chain i = servers
//!           i, i+1, ... (R of them)
//!  member --ChunkServerDown--> out --ChunkServerUp--> syncing --ChunkSynced--> member (tail)
//!  short chain, too long --RebuildChain{chain, other server}--> syncing --> member
//! ```
//!
//! Every change bumps the changed chain's version and the table's version; chunk servers
//! refuse requests that carry another chain version.

use super::cluster::FIRST_CHUNK_SERVER_ID;
use crate::kv::{KvRead, KvWrite, Table};
use crate::store::{
    self, counter, load_chains, load_cluster, node_key, save_chains, set_counter,
    ChunkServerRecord, Counter,
};
use std::net::SocketAddr;
use stoa_proto::MetaResponse;
use stoa_types::{Chain, ChainId, ChunkNode, ClusterId, FsError, InodeId, NodeId};

/// What a chunk server says when it announces itself.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Registration<'a> {
    pub node: Option<NodeId>,
    pub cluster: Option<ClusterId>,
    pub addr: SocketAddr,
    pub zone: &'a str,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
}

/// Every registered chunk server, in registration (id) order.
pub fn chunk_servers(kv: &impl KvRead) -> Result<Vec<ChunkServerRecord>, FsError> {
    let rows = kv.scan(Table::ChunkServers, &[], None, usize::MAX)?;
    rows.iter().map(|(k, v)| store::decode(Table::ChunkServers, k, v)).collect()
}

pub(crate) fn register(kv: &mut impl KvWrite, reg: Registration) -> Result<MetaResponse, FsError> {
    let info = load_cluster(kv)?;
    if let Some(theirs) = reg.cluster.filter(|c| *c != info.cluster) {
        return Err(FsError::WrongCluster {
            expected: info.cluster.to_string(),
            got: theirs.to_string(),
        });
    }
    let id = match reg.node {
        None => NodeId(store::take_next(kv, Counter::NextNode)?),
        Some(id) if id.0 < FIRST_CHUNK_SERVER_ID => {
            return Err(FsError::Invalid(format!(
                "chunk server id {id} is in the meta replicas' range 1..{FIRST_CHUNK_SERVER_ID}"
            )));
        }
        Some(id) => {
            // A server this state machine never gave an id (its registration was lost
            // with a restored backup, say) keeps its id; later ids must not collide.
            if counter(kv, Counter::NextNode)? <= id.0 {
                set_counter(kv, Counter::NextNode, id.0 + 1)?;
            }
            id
        }
    };
    let rec = ChunkServerRecord {
        id,
        addr: reg.addr,
        zone: reg.zone.to_string(),
        capacity_bytes: reg.capacity_bytes,
        used_bytes: reg.used_bytes,
    };
    store::put(kv, Table::ChunkServers, &node_key(id), &rec)?;
    let mut table = load_chains(kv)?;
    let (mut changed, joined) = match table.nodes.iter_mut().find(|n| n.id == id) {
        Some(node) if node.addr == reg.addr => (false, false),
        Some(node) => {
            node.addr = reg.addr;
            (true, false)
        }
        None => {
            table.nodes.push(ChunkNode { id, addr: reg.addr });
            (true, true)
        }
    };
    // While no file was ever made, no chunk exists: the first chains may still be drawn
    // again over every server, so that servers started together all carry data however
    // their registrations interleave. Once a file exists, a chunk's chain is fixed.
    let pristine = counter(kv, Counter::NextInode)? == InodeId::ROOT.0 + 1;
    if table.chains.is_empty() || (pristine && joined) {
        let old =
            std::mem::replace(&mut table.chains, first_chains(&chunk_servers(kv)?, info.replicas));
        for chain in &mut table.chains {
            // A drawn-again chain gets a newer version, so requests for its old
            // members are refused.
            if let Some(was) = old.iter().find(|c| c.id == chain.id) {
                chain.version = was.version + 1;
            }
        }
        changed |= table.chains != old;
    }
    if changed {
        table.version += 1;
        save_chains(kv, &table)?;
    }
    Ok(MetaResponse::Registered { node: id, cluster: info.cluster })
}

/// One chain per server once there are enough servers: chain i is `replicas` servers
/// starting at server i in registration order, so every server heads one chain and the
/// load spreads evenly.
fn first_chains(servers: &[ChunkServerRecord], replicas: u8) -> Vec<Chain> {
    let (n, r) = (servers.len(), usize::from(replicas));
    if n < r {
        return Vec::new();
    }
    (0..n)
        .map(|i| Chain {
            id: ChainId(i as u32),
            version: 1,
            members: (0..r).map(|j| servers[(i + j) % n].id).collect(),
            syncing: Vec::new(),
        })
        .collect()
}

/// Applies `change` to every chain; bumps the version of each chain it changed and of
/// the table if any changed.
fn change_chains(
    kv: &mut impl KvWrite,
    mut change: impl FnMut(&mut Chain) -> bool,
) -> Result<(), FsError> {
    let mut table = load_chains(kv)?;
    let mut changed = false;
    for chain in &mut table.chains {
        if change(chain) {
            chain.version += 1;
            changed = true;
        }
    }
    if changed {
        table.version += 1;
        save_chains(kv, &table)?;
    }
    Ok(())
}

/// Takes a silent server out of every chain, except where it is the last member: a
/// chain with no member could not serve its chunks at all.
pub(crate) fn server_down(kv: &mut impl KvWrite, node: NodeId) -> Result<MetaResponse, FsError> {
    change_chains(kv, |chain| {
        let syncing = chain.syncing.len();
        chain.syncing.retain(|&n| n != node);
        let mut changed = chain.syncing.len() != syncing;
        if chain.members.len() > 1 && chain.members.contains(&node) {
            chain.members.retain(|&n| n != node);
            changed = true;
        }
        changed
    })?;
    Ok(MetaResponse::Done)
}

/// Adds a returning server as a syncing member of every chain that is short of replicas
/// and does not hold it already.
pub(crate) fn server_up(kv: &mut impl KvWrite, node: NodeId) -> Result<MetaResponse, FsError> {
    let replicas = usize::from(load_cluster(kv)?.replicas);
    if kv.get(Table::ChunkServers, &node_key(node))?.is_none() {
        return Err(FsError::NotFound);
    }
    change_chains(kv, |chain| {
        let short = chain.write_path().count() < replicas;
        let add = short && !chain.write_path().any(|n| n == node);
        if add {
            chain.syncing.push(node);
        }
        add
    })?;
    Ok(MetaResponse::Done)
}

/// Adds `node` as a syncing member of `chain` if the chain is still short of replicas and
/// does not hold it. The leader proposes this once a chain stayed short for longer than
/// the rebuild delay; a stale proposal (the chain healed meanwhile) changes nothing.
pub(crate) fn rebuild(
    kv: &mut impl KvWrite,
    chain: ChainId,
    node: NodeId,
) -> Result<MetaResponse, FsError> {
    let replicas = usize::from(load_cluster(kv)?.replicas);
    if kv.get(Table::ChunkServers, &node_key(node))?.is_none() {
        return Err(FsError::NotFound);
    }
    change_chains(kv, |c| {
        let add = c.id == chain
            && c.write_path().count() < replicas
            && !c.write_path().any(|n| n == node);
        if add {
            c.syncing.push(node);
        }
        add
    })?;
    Ok(MetaResponse::Done)
}

/// A syncing server of `chain` has caught up: it becomes the chain's tail. Refused with
/// `StaleChain` when the chain changed since the server started syncing.
pub(crate) fn synced(
    kv: &mut impl KvWrite,
    node: NodeId,
    chain: ChainId,
    chain_version: u64,
) -> Result<MetaResponse, FsError> {
    let current = load_chains(kv)?
        .chain(chain)
        .map(|c| (c.version, c.syncing.contains(&node)))
        .ok_or_else(|| FsError::Invalid(format!("there is no chain {chain}")))?;
    if current != (chain_version, true) {
        return Err(FsError::StaleChain { got: chain_version, current: current.0 });
    }
    change_chains(kv, |c| {
        let promote = c.id == chain;
        if promote {
            c.syncing.retain(|&n| n != node);
            c.members.push(node);
        }
        promote
    })?;
    Ok(MetaResponse::Done)
}

#[cfg(test)]
mod tests {
    use super::chunk_servers;
    use crate::testing::{Fs, CLUSTER};
    use crate::{apply, chain_table, Command};
    use stoa_proto::{MetaOp, MetaResponse};
    use stoa_types::{ChainId, ClusterId, FsError, InodeId, NodeId};

    fn register(
        fs: &mut Fs,
        node: Option<NodeId>,
        cluster: Option<ClusterId>,
        port: u16,
    ) -> Result<NodeId, FsError> {
        let op = MetaOp::RegisterChunkServer {
            node,
            cluster,
            addr: ([127, 0, 0, 1], port).into(),
            zone: format!("z{port}"),
            capacity_bytes: 1000,
            used_bytes: 10,
        };
        match fs.call(op)? {
            MetaResponse::Registered { node, cluster } => {
                assert_eq!(cluster, CLUSTER);
                Ok(node)
            }
            other => panic!("register answered {other:?}"),
        }
    }

    /// Replica 2; servers 100 and 101 form the chains, 102 registers after a file exists.
    fn two_chains_and_a_spare_server() -> Fs {
        let mut fs = Fs::with_replicas(2);
        for port in 1..=2 {
            register(&mut fs, None, None, port).unwrap();
        }
        fs.create(InodeId::ROOT, "f").unwrap();
        register(&mut fs, None, None, 3).unwrap();
        fs
    }

    fn ids(ids: &[u64]) -> Vec<NodeId> {
        ids.iter().map(|&i| NodeId(i)).collect()
    }

    #[test]
    fn chains_appear_once_there_are_enough_servers() {
        let mut fs = Fs::with_replicas(2);
        assert_eq!(register(&mut fs, None, None, 1), Ok(NodeId(100)));
        let one = chain_table(&fs.kv).unwrap();
        assert!(one.chains.is_empty());
        assert_eq!((one.version, one.nodes.len()), (1, 1));
        assert_eq!(register(&mut fs, None, None, 2), Ok(NodeId(101)));
        let two = chain_table(&fs.kv).unwrap();
        assert_eq!(two.chains.len(), 2);
        assert_eq!(two.chains[0].members, ids(&[100, 101]));
        assert_eq!(two.chains[1].members, ids(&[101, 100]));
        assert_eq!((two.chains[1].id, two.chains[1].version), (ChainId(1), 1));
        // No file yet: a third server is drawn into new chains, the old ones move on.
        assert_eq!(register(&mut fs, None, None, 3), Ok(NodeId(102)));
        let three = chain_table(&fs.kv).unwrap();
        assert_eq!(three.chains.len(), 3);
        assert_eq!(three.chains[1].members, ids(&[101, 102]));
        assert_eq!(three.chains[2].members, ids(&[102, 100]));
        let versions: Vec<u64> = three.chains.iter().map(|c| c.version).collect();
        assert_eq!(versions, [2, 2, 1]);
        assert_eq!(three.version, two.version + 1);
        // A file exists: a fourth server is known but unused.
        fs.create(InodeId::ROOT, "f").unwrap();
        assert_eq!(register(&mut fs, None, None, 4), Ok(NodeId(103)));
        let table = chain_table(&fs.kv).unwrap();
        assert_eq!(table.chains, three.chains);
        assert_eq!(table.nodes.len(), 4);
        let servers = chunk_servers(&fs.kv).unwrap();
        assert_eq!(servers.iter().map(|s| s.id).collect::<Vec<_>>(), ids(&[100, 101, 102, 103]));
        assert_eq!(servers[2].zone, "z3");
    }

    #[test]
    fn a_known_server_reregisters_and_a_stranger_is_refused() {
        let mut fs = Fs::with_replicas(1);
        let id = register(&mut fs, None, None, 1).unwrap();
        let before = chain_table(&fs.kv).unwrap();
        assert_eq!(register(&mut fs, Some(id), Some(CLUSTER), 1), Ok(id));
        assert_eq!(chain_table(&fs.kv).unwrap(), before, "nothing changed");
        assert_eq!(register(&mut fs, Some(id), Some(CLUSTER), 9), Ok(id));
        let moved = chain_table(&fs.kv).unwrap();
        assert_eq!(
            (moved.version, moved.addr(id)),
            (before.version + 1, Some(([127, 0, 0, 1], 9).into()))
        );
        let wrong = register(&mut fs, Some(id), Some(ClusterId(5)), 1);
        assert!(matches!(wrong, Err(FsError::WrongCluster { .. })), "{wrong:?}");
        assert!(matches!(register(&mut fs, Some(NodeId(3)), None, 1), Err(FsError::Invalid(_))));
        // An id this cluster never gave out is kept, and later ids skip past it.
        assert_eq!(register(&mut fs, Some(NodeId(500)), Some(CLUSTER), 2), Ok(NodeId(500)));
        assert_eq!(register(&mut fs, None, None, 3), Ok(NodeId(501)));
    }

    #[test]
    fn a_server_leaves_its_chains_rejoins_syncing_and_becomes_the_tail() {
        let mut fs = two_chains_and_a_spare_server();
        let start = chain_table(&fs.kv).unwrap();
        assert_eq!(start.chains.len(), 2);
        apply(&mut fs.kv, &Command::ChunkServerDown { node: NodeId(101) }).unwrap();
        let down = chain_table(&fs.kv).unwrap();
        assert_eq!(down.version, start.version + 1);
        assert!(down.chains.iter().all(|c| c.members == ids(&[100]) && c.version == 2));
        // The last member of a chain stays, even when it is down too.
        apply(&mut fs.kv, &Command::ChunkServerDown { node: NodeId(100) }).unwrap();
        assert_eq!(chain_table(&fs.kv).unwrap(), down);

        apply(&mut fs.kv, &Command::ChunkServerUp { node: NodeId(102) }).unwrap();
        let up = chain_table(&fs.kv).unwrap();
        assert!(up.chains.iter().all(|c| c.syncing == ids(&[102])), "{up:?}");
        // No chain is short any more: a second returning server is not needed.
        apply(&mut fs.kv, &Command::ChunkServerUp { node: NodeId(101) }).unwrap();
        apply(&mut fs.kv, &Command::ChunkServerUp { node: NodeId(102) }).unwrap();
        assert_eq!(chain_table(&fs.kv).unwrap(), up);

        let chain = &up.chains[1];
        let synced = |version| MetaOp::ChunkSynced {
            node: NodeId(102),
            chain: chain.id,
            chain_version: version,
        };
        let stale = fs.call(synced(chain.version - 1));
        assert_eq!(
            stale,
            Err(FsError::StaleChain { got: chain.version - 1, current: chain.version })
        );
        fs.call(synced(chain.version)).unwrap();
        let done = chain_table(&fs.kv).unwrap();
        assert_eq!(done.chains[1].members, ids(&[100, 102]));
        assert!(done.chains[1].syncing.is_empty());
        assert_eq!(done.chains[1].version, chain.version + 1);
        assert_eq!(done.chains[0], up.chains[0]);
        assert_eq!(done.version, up.version + 1);
        // A second report for the same version is stale: the chain moved on.
        assert!(matches!(fs.call(synced(chain.version)), Err(FsError::StaleChain { .. })));
        let unknown = apply(&mut fs.kv, &Command::ChunkServerUp { node: NodeId(999) });
        assert_eq!(unknown, Err(FsError::NotFound));
        let no_chain =
            MetaOp::ChunkSynced { node: NodeId(102), chain: ChainId(9), chain_version: 1 };
        assert!(matches!(fs.call(no_chain), Err(FsError::Invalid(_))));
    }

    #[test]
    fn a_short_chain_is_rebuilt_on_another_server_once() {
        let mut fs = two_chains_and_a_spare_server();
        apply(&mut fs.kv, &Command::ChunkServerDown { node: NodeId(101) }).unwrap();
        let down = chain_table(&fs.kv).unwrap();
        // Chain 0 was 100,101 and is now 100 alone.
        assert_eq!(down.chains[0].members, ids(&[100]));
        let rebuild = Command::RebuildChain { chain: ChainId(0), node: NodeId(102) };
        apply(&mut fs.kv, &rebuild).unwrap();
        let rebuilt = chain_table(&fs.kv).unwrap();
        assert_eq!(rebuilt.chains[0].syncing, ids(&[102]));
        assert_eq!(rebuilt.chains[0].version, down.chains[0].version + 1);
        assert_eq!(rebuilt.chains[1..], down.chains[1..], "other chains untouched");
        // Repeated, or for a server already in the chain: nothing changes.
        apply(&mut fs.kv, &rebuild).unwrap();
        let member = Command::RebuildChain { chain: ChainId(0), node: NodeId(100) };
        apply(&mut fs.kv, &member).unwrap();
        assert_eq!(chain_table(&fs.kv).unwrap(), rebuilt);
        let unknown = Command::RebuildChain { chain: ChainId(0), node: NodeId(999) };
        assert_eq!(apply(&mut fs.kv, &unknown), Err(FsError::NotFound));
    }
}
