//! `stoa status`: the cluster at a glance, like corosync-quorumtool: meta members, which
//! is leader, whether quorum holds, every chunk server up or down with its capacity, and
//! the chains. `--json` prints the same for scripts.

use anyhow::anyhow;
use serde_json::json;
use std::path::PathBuf;
use std::time::Duration;
use stoa_net::{MetaClient, Pool};
use stoa_proto::{ClusterStatus, MetaOp, MetaRequest, MetaResponse, GARBAGE_COUNTED};
use stoa_types::{RequestId, SessionId};

#[derive(clap::Args)]
pub struct Args {
    /// Meta replicas: host:port,host:port,... (any one that answers will do).
    #[arg(long)]
    meta: Option<String>,
    /// A `stoa dev` directory: show that cluster.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Asks the replicas in turn for the cluster status.
pub async fn fetch(addrs: Vec<std::net::SocketAddr>) -> anyhow::Result<ClusterStatus> {
    let shown = addrs.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(",");
    let client = MetaClient::new(Pool::new(), addrs, Duration::from_secs(3));
    let req = MetaRequest { session: SessionId(0), req_id: RequestId(0), op: MetaOp::Status };
    match client.call(req).await {
        Ok(MetaResponse::Status(status)) => Ok(status),
        Ok(other) => Err(anyhow!("meta answered status with {other:?}")),
        Err(e) => Err(anyhow!("no meta replica answers at {shown}: {e}")),
    }
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let addrs = super::meta_addrs(args.meta.as_deref(), args.dir.as_deref())?;
    let rt = crate::signal::runtime()?;
    let status = super::hint_dev_stopped(
        rt.block_on(fetch(addrs)),
        args.meta.as_deref(),
        args.dir.as_deref(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&to_json(&status))?);
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

pub fn to_json(s: &ClusterStatus) -> serde_json::Value {
    json!({
        "cluster": s.cluster.to_string(),
        "answered_by": s.answered_by.0,
        "meta": {
            "leader": s.leader.map(|l| l.0),
            "quorate": s.quorate,
            "term": s.term,
            "last_applied": s.last_applied,
            "members": s.members.iter().map(|m| json!({
                "id": m.id.0,
                "addr": m.addr.to_string(),
                "up": m.up,
                "voter": m.voter,
                "leader": Some(m.id) == s.leader,
                "matched_index": m.matched_index,
            })).collect::<Vec<_>>(),
        },
        "chunk": s.chunk_servers.iter().map(|c| json!({
            "id": c.id.0,
            "addr": c.addr.to_string(),
            "zone": c.zone,
            "up": c.up,
            "capacity_bytes": c.capacity_bytes,
            "used_bytes": c.used_bytes,
            "last_heartbeat_ms": c.last_heartbeat_ms,
            "repair": {
                "backlog_chunks": c.repair.backlog_chunks,
                "backlog_bytes": c.repair.backlog_bytes,
                "copied_chunks": c.repair.copied_chunks,
                "copied_bytes": c.repair.copied_bytes,
                "copy_rate_bytes_per_sec": c.copy_rate_bytes_per_sec,
                "scrubbed_bytes": c.repair.scrubbed_bytes,
                "corrupt_found": c.repair.corrupt_found,
                "corrupt_repaired": c.repair.corrupt_repaired,
            },
        })).collect::<Vec<_>>(),
        "repair_backlog": {
            "chunks": s.chunk_servers.iter().map(|c| c.repair.backlog_chunks).sum::<u64>(),
            "bytes": s.chunk_servers.iter().map(|c| c.repair.backlog_bytes).sum::<u64>(),
            "rate_bytes_per_sec":
                s.chunk_servers.iter().map(|c| c.copy_rate_bytes_per_sec).sum::<u64>(),
        },
        "replicas": s.replicas,
        "chains_short": chains_short(s),
        "chains": s.chains.iter().map(|c| json!({
            "id": c.id.0,
            "version": c.version,
            "members": c.members.iter().map(|n| n.0).collect::<Vec<_>>(),
            "syncing": c.syncing.iter().map(|n| n.0).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
        "table_version": s.table_version,
        "files": s.files,
        "caps": s.caps,
        "garbage": s.garbage,
    })
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

/// The human table.
pub fn render(s: &ClusterStatus) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let up = s.members.iter().filter(|m| m.up).count();
    let leader = s.leader.map_or("none".to_string(), |l| l.to_string());
    let _ = writeln!(out, "Cluster      {}", s.cluster);
    let _ = writeln!(out, "Answered by  meta {}", s.answered_by);
    let _ = writeln!(
        out,
        "Quorate      {}   ({up} of {} meta replicas up, leader {leader}, term {}, applied {})",
        yes(s.quorate),
        s.members.len(),
        s.term,
        s.last_applied
    );
    let _ = writeln!(out, "Files        {}   (caps granted: {})", s.files, s.caps);
    if s.garbage > 0 {
        let at_least = if s.garbage >= GARBAGE_COUNTED as u64 { "at least " } else { "" };
        let _ = writeln!(out, "Deleting     {at_least}{} deleted files' chunks to free", s.garbage);
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "Meta replicas");
    let _ = writeln!(out, "  {:<4} {:<22} {:<8} {:<4} LOG", "ID", "ADDRESS", "ROLE", "UP");
    for m in &s.members {
        let role = if Some(m.id) == s.leader { "leader" } else { "follower" };
        let log = m.matched_index.map_or("-".to_string(), |i| i.to_string());
        let _ = writeln!(
            out,
            "  {:<4} {:<22} {:<8} {:<4} {log}",
            m.id.to_string(),
            m.addr.to_string(),
            role,
            yes(m.up)
        );
    }
    let _ = writeln!(out, "\nChunk servers");
    let _ =
        writeln!(out, "  {:<4} {:<22} {:<10} {:<4} USED / CAPACITY", "ID", "ADDRESS", "ZONE", "UP");
    for c in &s.chunk_servers {
        let _ = writeln!(
            out,
            "  {:<4} {:<22} {:<10} {:<4} {} / {}",
            c.id.to_string(),
            c.addr.to_string(),
            c.zone,
            yes(c.up),
            gib(c.used_bytes),
            gib(c.capacity_bytes)
        );
    }
    render_repair(&mut out, s);
    let _ = writeln!(out, "\nChains (table version {})", s.table_version);
    let _ = writeln!(out, "  {:<6} {:<8} {:<16} SYNCING", "CHAIN", "VERSION", "MEMBERS");
    for c in &s.chains {
        let ids = |v: &[stoa_types::NodeId]| {
            v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(",")
        };
        let syncing = if c.syncing.is_empty() { "-".to_string() } else { ids(&c.syncing) };
        let _ = writeln!(
            out,
            "  {:<6} {:<8} {:<16} {syncing}",
            c.id.to_string(),
            c.version,
            ids(&c.members)
        );
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// How many chains have fewer servers than the cluster's replica count.
fn chains_short(s: &ClusterStatus) -> usize {
    s.chains.iter().filter(|c| c.members.len() < usize::from(s.replicas)).count()
}

/// Resync and rebuild backlog with its rate, chains short of servers, and what the
/// scrubbers found.
fn render_repair(out: &mut String, s: &ClusterStatus) {
    use std::fmt::Write;
    let sum = |f: fn(&stoa_proto::ChunkServerStatus) -> u64| s.chunk_servers.iter().map(f).sum();
    let chunks: u64 = sum(|c| c.repair.backlog_chunks);
    let bytes: u64 = sum(|c| c.repair.backlog_bytes);
    let rate: u64 = sum(|c| c.copy_rate_bytes_per_sec);
    let found: u64 = sum(|c| c.repair.corrupt_found);
    let repaired: u64 = sum(|c| c.repair.corrupt_repaired);
    let _ = write!(out, "\nRepair       ");
    let short = chains_short(s);
    if chunks == 0 && short > 0 {
        // Nothing is being copied, yet data has fewer copies than it should: every live
        // chunk server is in those chains already, or the rebuild delay has not passed.
        let _ = write!(
            out,
            "{short} of {} chains on fewer than {} servers, nothing to copy: waiting for a \
             chunk server to rebuild on",
            s.chains.len(),
            s.replicas
        );
    } else if chunks == 0 {
        let _ = write!(out, "no backlog");
    } else {
        let eta = bytes.checked_div(rate).map_or(String::new(), |s| format!(", about {s} s left"));
        let _ = write!(out, "{chunks} chunks ({}) to copy at {}/s{eta}", mib(bytes), mib(rate));
    }
    let _ = writeln!(out, "; scrub found {found} damaged replicas, repaired {repaired}");
}

#[cfg(test)]
mod tests {
    use super::{render, to_json};
    use stoa_proto::{ClusterStatus, GARBAGE_COUNTED};
    use stoa_types::{Chain, ChainId, ClusterId, NodeId};

    /// A status with two chains on servers 100 and 101.
    fn status(replicas: u8) -> ClusterStatus {
        let chain = |id| Chain {
            id: ChainId(id),
            version: 2,
            members: vec![NodeId(100), NodeId(101)],
            syncing: vec![],
        };
        ClusterStatus {
            cluster: ClusterId(1),
            answered_by: NodeId(1),
            leader: Some(NodeId(1)),
            term: 1,
            quorate: true,
            last_applied: 10,
            members: vec![],
            chunk_servers: vec![],
            chains: vec![chain(0), chain(1)],
            replicas,
            table_version: 4,
            files: 0,
            caps: 0,
            garbage: 0,
        }
    }

    /// Every chain lost a server and no spare one exists: nothing is queued to copy, but
    /// the status must not say all is well.
    #[test]
    fn chains_short_of_servers_are_shown_even_with_nothing_to_copy() {
        let s = status(3);
        let text = render(&s);
        assert!(text.contains("2 of 2 chains on fewer than 3 servers"), "{text}");
        assert!(!text.contains("no backlog"), "{text}");
        assert_eq!(to_json(&s)["chains_short"], 2);
        assert!(render(&status(2)).contains("no backlog"));
    }

    #[test]
    fn deleted_files_whose_chunks_are_not_freed_yet_are_shown() {
        let mut s = status(2);
        assert!(!render(&s).contains("Deleting"));
        s.garbage = 12;
        assert!(render(&s).contains("Deleting     12 deleted files' chunks to free"));
        assert_eq!(to_json(&s)["garbage"], 12);
        s.garbage = GARBAGE_COUNTED as u64;
        assert!(render(&s).contains("at least 10000 deleted files"));
    }
}
