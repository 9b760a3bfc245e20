//! `stoa admin`: changes to a running cluster. Today: meta membership.
//!
//! ```text
//!  stoa admin meta add --id 4 --addr 10.0.0.4:7100 --meta ADDRS
//!     start `stoa meta --id 4 --listen 10.0.0.4:7100 --peers 4=10.0.0.4:7100` first (no
//!     --bootstrap): it waits, empty, until the leader adds it; it catches up from a
//!     snapshot as a learner and then becomes a voter.
//!  stoa admin meta remove --id 2 --meta ADDRS
//!  replace a dead replica: add the new one, then remove the dead one.
//! ```

use anyhow::{anyhow, bail};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use stoa_net::{MetaClient, Pool};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse};
use stoa_types::{FsError, NodeId, RequestId, SessionId};

/// A membership change waits for a new replica to catch up, which may mean sending it a
/// large snapshot.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(300);
/// How long to keep retrying while the group elects a leader.
const LEADER_DEADLINE: Duration = Duration::from_secs(30);

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Meta replica membership.
    #[command(subcommand)]
    Meta(MetaVerb),
}

#[derive(clap::Subcommand)]
enum MetaVerb {
    /// Add a replica (already running, started without --bootstrap) to the group.
    Add {
        /// The new replica's id, 1..=99, unused in the group.
        #[arg(long)]
        id: u64,
        /// The address the new replica listens on.
        #[arg(long)]
        addr: String,
        #[command(flatten)]
        target: Target,
    },
    /// Remove a replica from the group.
    Remove {
        #[arg(long)]
        id: u64,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(clap::Args)]
struct Target {
    /// Meta replicas of the cluster: host:port,host:port,...
    #[arg(long)]
    meta: Option<String>,
    /// A `stoa dev` directory: change that cluster.
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn main(args: Args) -> anyhow::Result<()> {
    let What::Meta(verb) = args.what;
    let (op, target, done) = match verb {
        MetaVerb::Add { id, addr, target } => {
            let addr = crate::config::addr("addr", &addr)?;
            let op = MetaOp::AddReplica { id: valid_id(id)?, addr };
            (op, target, format!("meta replica {id} at {addr} added"))
        }
        MetaVerb::Remove { id, target } => (
            MetaOp::RemoveReplica { id: valid_id(id)? },
            target,
            format!("meta replica {id} removed"),
        ),
    };
    let addrs = super::meta_addrs(target.meta.as_deref(), target.dir.as_deref())?;
    let rt = crate::signal::runtime()?;
    let changed = rt.block_on(change(addrs, op));
    super::hint_dev_stopped(changed, target.meta.as_deref(), target.dir.as_deref())?;
    println!("{done}");
    Ok(())
}

fn valid_id(id: u64) -> anyhow::Result<NodeId> {
    if !(1..=99).contains(&id) {
        bail!("--id must be 1..=99, got {id}");
    }
    Ok(NodeId(id))
}

/// Sends the change straight to the leader (found through `Status`), with a timeout long
/// enough for a snapshot, retrying while the group elects one.
async fn change(addrs: Vec<SocketAddr>, op: MetaOp) -> anyhow::Result<()> {
    let client = MetaClient::new(Pool::new(), addrs, Duration::from_secs(10));
    let started = Instant::now();
    loop {
        let status = super::status::fetch(client.addrs().to_vec()).await?;
        let leader = status.leader.and_then(|l| status.members.iter().find(|m| m.id == l));
        let err = match leader {
            None => anyhow!("the meta group has no leader"),
            Some(leader) => {
                let req =
                    MetaRequest { session: SessionId(0), req_id: RequestId(0), op: op.clone() };
                match client.call_one(leader.addr, req, CHANGE_TIMEOUT).await {
                    Ok(MetaResponse::Done) => return Ok(()),
                    Ok(other) => bail!("meta answered {other:?}"),
                    Err(FsError::NotFound) => bail!("no such meta replica"),
                    Err(e) if e.is_retryable() => anyhow!(e),
                    Err(e) => bail!("meta refused the change: {e}"),
                }
            }
        };
        if started.elapsed() > LEADER_DEADLINE {
            return Err(err.context("changing meta membership"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
