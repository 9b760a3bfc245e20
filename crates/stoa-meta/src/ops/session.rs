//! Sessions and the answers remembered for retries.
//!
//! A client opens a session and numbers its mutations. The answer to every numbered
//! mutation (an error too) is stored under `session ++ request id`, so a retry after a
//! lost reply gets the first answer instead of being applied twice: a retried create
//! returns the file it made rather than `Exists`. Only the last [`DEDUP_WINDOW`] request
//! ids of a session are kept; a client never has that many mutations in flight.

use crate::kv::{KvRead, KvWrite, Table};
use crate::store::{self, delete_prefix, load_cluster, take_next, Counter};
use serde::{Deserialize, Serialize};
use stoa_proto::{MetaResponse, SessionGrant};
use stoa_types::{FsError, RequestId, SessionId, Timestamp};

/// How many recent request ids of a session keep their answers.
pub const DEDUP_WINDOW: u64 = 1024;
/// How long a session lives without a renewal, as told to the client.
pub const LEASE_MS: u64 = 10_000;
/// Old answers deleted per new one at most; more than one, so that the window catches up
/// after a jump in request ids.
const TRIM_PER_INSERT: usize = 64;

/// A session as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionRec {
    pub client: String,
    pub created: Timestamp,
}

fn session_key(session: SessionId) -> [u8; 8] {
    session.0.to_be_bytes()
}

fn dedup_key(session: SessionId, req_id: RequestId) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&session.0.to_be_bytes());
    key[8..].copy_from_slice(&req_id.0.to_be_bytes());
    key
}

pub(crate) fn open(
    kv: &mut impl KvWrite,
    client: &str,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    let info = load_cluster(kv)?;
    // `Init` starts the counter at 1: session 0 means "no session".
    let session = SessionId(take_next(kv, Counter::NextSession)?);
    let rec = SessionRec { client: client.to_string(), created: now };
    store::put(kv, Table::Sessions, &session_key(session), &rec)?;
    Ok(MetaResponse::Session(SessionGrant {
        session,
        cluster: info.cluster,
        chunk_size_bytes: info.chunk_size_bytes,
        lease_ms: LEASE_MS,
    }))
}

/// Ends a session and forgets its answers. Closing an unknown session is not an error,
/// so that a retried close succeeds.
pub(crate) fn close(kv: &mut impl KvWrite, session: SessionId) -> Result<MetaResponse, FsError> {
    kv.delete(Table::Sessions, &session_key(session))?;
    delete_prefix(kv, Table::Dedup, &session_key(session))?;
    Ok(MetaResponse::Done)
}

/// Whether `session` is open. Session 0 (none) always is.
pub(crate) fn is_open(kv: &impl KvRead, session: SessionId) -> Result<bool, FsError> {
    Ok(session.0 == 0 || kv.get(Table::Sessions, &session_key(session))?.is_some())
}

type Answer = Result<MetaResponse, FsError>;

/// The answer already given to this request, if it was applied before.
pub(crate) fn recall(
    kv: &impl KvRead,
    session: SessionId,
    req_id: RequestId,
) -> Result<Option<Answer>, FsError> {
    store::get(kv, Table::Dedup, &dedup_key(session, req_id))
}

/// Stores the answer to a request and forgets answers that fell out of the window.
pub(crate) fn remember(
    kv: &mut impl KvWrite,
    session: SessionId,
    req_id: RequestId,
    answer: &Answer,
) -> Result<(), FsError> {
    store::put(kv, Table::Dedup, &dedup_key(session, req_id), answer)?;
    let Some(oldest_kept) = req_id.0.checked_sub(DEDUP_WINDOW - 1) else { return Ok(()) };
    let from = dedup_key(session, RequestId(0));
    let to = dedup_key(session, RequestId(oldest_kept));
    for (key, _) in kv.scan(Table::Dedup, &from, Some(&to), TRIM_PER_INSERT)? {
        kv.delete(Table::Dedup, &key)?;
    }
    Ok(())
}
