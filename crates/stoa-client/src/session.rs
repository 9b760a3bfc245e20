//! The client's session with meta: every call to meta goes through here.
//!
//! Mutations carry the session id and a fresh, per-session increasing request id.
//! `MetaClient` retries a call (after a lost reply, or on another replica) with the same
//! request, so meta recognises the id and answers with the first result instead of
//! applying the mutation twice. Reads carry request id 0.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use stoa_net::{MetaClient, Pool};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse, SessionGrant};
use stoa_types::{Attr, FsError, RequestId, SessionId};

/// How long one meta call keeps retrying failover and elections before it gives up.
const META_DEADLINE: Duration = Duration::from_secs(30);

pub(crate) struct Session {
    meta: MetaClient,
    grant: SessionGrant,
    next_req: AtomicU64,
}

impl Session {
    /// Opens a session with the meta replicas at `meta`, naming this client `name`.
    pub async fn open(
        pool: Pool,
        meta: Vec<std::net::SocketAddr>,
        name: String,
    ) -> Result<Session, FsError> {
        if meta.is_empty() {
            return Err(FsError::Invalid("no meta address given".into()));
        }
        let meta = MetaClient::new(pool, meta, META_DEADLINE);
        let req = MetaRequest {
            session: SessionId(0),
            // A session's first request id; the open itself is not deduplicated.
            req_id: RequestId(0),
            op: MetaOp::OpenSession { client: name },
        };
        let grant = match meta.call(req).await.map_err(final_error)? {
            MetaResponse::Session(grant) => grant,
            other => return Err(unexpected("OpenSession", &other)),
        };
        if grant.chunk_size_bytes == 0 {
            return Err(FsError::Protocol("meta granted a zero chunk size".into()));
        }
        Ok(Session { meta, grant, next_req: AtomicU64::new(1) })
    }

    pub fn grant(&self) -> &SessionGrant {
        &self.grant
    }

    /// Calls meta with `op`, giving it a new request id if it is a mutation.
    pub async fn call(&self, op: MetaOp) -> Result<MetaResponse, FsError> {
        let req_id = if op.is_mutation() {
            RequestId(self.next_req.fetch_add(1, Ordering::Relaxed))
        } else {
            RequestId(0)
        };
        let req = MetaRequest { session: self.grant.session, req_id, op };
        self.meta.call(req).await.map_err(final_error)
    }

    /// Calls meta with an operation that answers with attributes.
    pub async fn call_attr(&self, op: MetaOp) -> Result<Attr, FsError> {
        let what = op_name(&op);
        match self.call(op).await? {
            MetaResponse::Attr(attr) => Ok(attr),
            other => Err(unexpected(what, &other)),
        }
    }

    /// Calls meta with an operation that answers with nothing worth keeping.
    pub async fn call_done(&self, op: MetaOp) -> Result<(), FsError> {
        self.call(op).await.map(|_| ())
    }
}

/// A retry hint that outlived the deadline is shown to applications as an I/O error.
pub(crate) fn final_error(e: FsError) -> FsError {
    if e.is_retryable() {
        FsError::Io(format!("meta unavailable: {e}"))
    } else {
        e
    }
}

pub(crate) fn unexpected(what: &str, resp: &MetaResponse) -> FsError {
    FsError::Protocol(format!("meta answered {what} with {resp:?}"))
}

fn op_name(op: &MetaOp) -> &'static str {
    match op {
        MetaOp::Lookup { .. } => "Lookup",
        MetaOp::GetAttr { .. } => "GetAttr",
        MetaOp::SetAttr { .. } => "SetAttr",
        MetaOp::Create { .. } => "Create",
        MetaOp::Mkdir { .. } => "Mkdir",
        MetaOp::Symlink { .. } => "Symlink",
        MetaOp::Link { .. } => "Link",
        _ => "a meta call",
    }
}
