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
    super::locks::release_session(kv, session)?;
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

#[cfg(test)]
mod tests {
    use super::{DEDUP_WINDOW, LEASE_MS};
    use crate::kv::{KvRead, Table};
    use crate::testing::{create_op, Fs, CLUSTER, ROOT};
    use crate::{apply, Command};
    use stoa_proto::{MetaOp, MetaRequest, MetaResponse, SessionGrant};
    use stoa_types::{FileKind, RequestId, SessionId};

    #[test]
    fn sessions_are_numbered_from_one_and_carry_the_cluster() {
        let mut fs = Fs::new();
        assert_eq!(fs.session, SessionId(1));
        let grant = fs.call(MetaOp::OpenSession { client: "other".into() }).unwrap();
        let want = SessionGrant {
            session: SessionId(2),
            cluster: CLUSTER,
            chunk_size_bytes: 4096,
            lease_ms: LEASE_MS,
        };
        assert_eq!(grant, MetaResponse::Session(want));
        assert_eq!(fs.kv.len(Table::Sessions), 2);
    }

    #[test]
    fn only_a_window_of_recent_answers_is_kept() {
        let mut fs = Fs::new();
        let total = DEDUP_WINDOW + 300;
        for i in 0..total {
            let op = MetaOp::GetAttr { ino: ROOT };
            // Reads in the log are not remembered; creates are.
            let op =
                if i % 2 == 0 { create_op(ROOT, &format!("f{i}"), FileKind::File) } else { op };
            let req = MetaRequest { session: fs.session, req_id: RequestId(i + 1), op };
            let now = fs.now();
            apply(&mut fs.kv, &Command::Client { req, now }).unwrap();
        }
        let kept = fs.kv.scan(Table::Dedup, &[], None, usize::MAX).unwrap();
        assert!(kept.len() <= DEDUP_WINDOW as usize, "{} answers kept", kept.len());
        let oldest = u64::from_be_bytes(kept[0].0[8..].try_into().unwrap());
        assert!(oldest > total - DEDUP_WINDOW, "answer to request {oldest} outlived the window");
        // Other sessions' answers are untouched by this session's trimming.
        let mut other = Fs::new();
        other.create(ROOT, "x").unwrap();
        assert_eq!(other.kv.len(Table::Dedup), 1);
    }
}
