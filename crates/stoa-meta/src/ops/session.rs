//! Sessions and the answers remembered for retries.
//!
//! A client opens a session and numbers its mutations. The answer to every numbered
//! mutation (an error too) is stored under `session ++ request id`, so a retry after a
//! lost reply gets the first answer instead of being applied twice: a retried create
//! returns the file it made rather than `Exists`. An answer is kept until the client
//! says it will not retry the request ([`MetaOp::ForgetAnswers`]), or until the
//! session has numbered [`ANSWERS_KEPT`] requests after it, which a client never does
//! while it still waits for that answer.
//!
//! The first rule was only the second, with 1,024 ids: a rename that waited 6 s at the
//! leader for another mount's lease was retried after more than 1,024 other mutations
//! of its mount; the retry was applied again, found the name gone and answered
//! `ENOENT` for a rename that had succeeded (a fault run's `client-fenced` scenario).
//!
//! A session also owns what it holds: today the files it has open (`Opens` and
//! `Openers`), later locks and capabilities. [`end`] releases all of it, whether the
//! client closed the session or the leader expired it after a lease without renewals;
//! anything a session comes to hold must be released there.

use crate::kv::{prefix_end, KvRead, KvWrite, Table};
use crate::store::{self, delete_prefix, ino_key, load_cluster, load_inode, take_next, Counter};
use serde::{Deserialize, Serialize};
use stoa_proto::{MetaResponse, SessionGrant, ANSWERS_KEPT};
use stoa_types::{FsError, InodeId, RequestId, SessionId, Timestamp};

/// How long a session lives without a renewal, as told to the client.
pub const LEASE_MS: u64 = 10_000;
/// Old answers deleted per new one at most when a session numbered [`ANSWERS_KEPT`]
/// requests after them; more than one, so that the window catches up after a jump in
/// request ids.
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

/// Ends a session: releases everything it holds and forgets its answers. This is the
/// one place a session's holdings are let go, for a close and for an expiry alike, so
/// whatever a session can hold (open files now; locks and capabilities later) is
/// released here. Ending an unknown session is not an error, so that a retried close
/// or a late expiry succeeds.
pub(crate) fn end(kv: &mut impl KvWrite, session: SessionId) -> Result<MetaResponse, FsError> {
    const PAGE: usize = 256;
    let prefix = session_key(session);
    let end = prefix_end(&prefix);
    loop {
        let rows = kv.scan(Table::Opens, &prefix, end.as_deref(), PAGE)?;
        for (key, _) in &rows {
            // The session is gone, and with it whatever it was about to open.
            let ino = ino_from(&key[8..])?;
            if close(kv, session, ino)? {
                super::unlink::purge(kv, ino)?;
            }
        }
        if rows.len() < PAGE {
            break;
        }
    }
    kv.delete(Table::Sessions, &session_key(session))?;
    delete_prefix(kv, Table::Dedup, &session_key(session))?;
    super::locks::release_session(kv, session)?;
    super::batch::forget(kv, session)?;
    Ok(MetaResponse::Done)
}

/// Every open session, in id order.
pub(crate) fn list(kv: &impl KvRead) -> Result<Vec<SessionId>, FsError> {
    let rows = kv.scan(Table::Sessions, &[], None, usize::MAX)?;
    rows.iter().map(|(key, _)| ino_from(key).map(|n| SessionId(n.0))).collect()
}

fn ino_from(key: &[u8]) -> Result<InodeId, FsError> {
    key.try_into().map(|b| InodeId(u64::from_be_bytes(b))).map_err(|_| {
        FsError::Io(format!("session table key of {} bytes is not a number", key.len()))
    })
}

fn pair_key(first: u64, second: u64) -> [u8; 16] {
    let mut key = [0; 16];
    key[..8].copy_from_slice(&first.to_be_bytes());
    key[8..].copy_from_slice(&second.to_be_bytes());
    key
}

/// Records that `session` has `ino` open. Opening twice is one open: the client counts
/// its own handles and tells meta only about the first and the last.
pub(crate) fn open_file(
    kv: &mut impl KvWrite,
    session: SessionId,
    ino: InodeId,
) -> Result<MetaResponse, FsError> {
    if session.0 == 0 {
        return Err(FsError::Invalid("opening a file needs a session".into()));
    }
    load_inode(kv, ino)?;
    store::put(kv, Table::Opens, &pair_key(session.0, ino.0), &())?;
    store::put(kv, Table::Openers, &pair_key(ino.0, session.0), &())?;
    Ok(MetaResponse::Done)
}

/// `session` closed `ino` at `now`. If the file has no names left and nobody else has it
/// open, it becomes a stray, deleted once its grace is over: a kernel may have resolved
/// one of its names before the unlink and be about to open it. Releasing what is not
/// open is harmless, so a retry succeeds.
pub(crate) fn release(
    kv: &mut impl KvWrite,
    session: SessionId,
    ino: InodeId,
    now: Timestamp,
) -> Result<MetaResponse, FsError> {
    if close(kv, session, ino)? {
        super::unlink::stray(kv, ino, now)?;
    }
    Ok(MetaResponse::Done)
}

/// Forgets that `session` has `ino` open; returns whether that leaves an orphan nobody
/// has open.
fn close(kv: &mut impl KvWrite, session: SessionId, ino: InodeId) -> Result<bool, FsError> {
    kv.delete(Table::Opens, &pair_key(session.0, ino.0))?;
    kv.delete(Table::Openers, &pair_key(ino.0, session.0))?;
    Ok(kv.get(Table::Orphans, &ino_key(ino))?.is_some() && !is_open_anywhere(kv, ino)?)
}

/// Whether any session has `ino` open.
pub(crate) fn is_open_anywhere(kv: &impl KvRead, ino: InodeId) -> Result<bool, FsError> {
    let prefix = ino_key(ino);
    let end = prefix_end(&prefix);
    Ok(!kv.scan(Table::Openers, &prefix, end.as_deref(), 1)?.is_empty())
}

/// Whether `session` is open. Session 0 (none) always is.
pub(crate) fn is_open(kv: &impl KvRead, session: SessionId) -> Result<bool, FsError> {
    Ok(session.0 == 0 || kv.get(Table::Sessions, &session_key(session))?.is_some())
}

type Answer = Result<MetaResponse, FsError>;

/// The answer already given to this request, if it was applied before; an error if it
/// was and its answer is forgotten, so that it is never applied twice. (A request may
/// still reach the log after its client had the answer: an attempt the client gave up
/// on, still waiting at the leader for a recall or the grace after an election.)
pub(crate) fn recall(
    kv: &impl KvRead,
    session: SessionId,
    req_id: RequestId,
) -> Result<Option<Answer>, FsError> {
    if let Some(answer) = store::get(kv, Table::Dedup, &dedup_key(session, req_id))? {
        return Ok(Some(answer));
    }
    if req_id.0 < floor(kv, session)? {
        return Ok(Some(Err(FsError::Invalid(format!(
            "request {} of session {session} was applied and answered before (its answer \
             is forgotten); not applied again",
            req_id.0
        )))));
    }
    Ok(None)
}

/// The session's floor: every request numbered below it was applied, or will never be.
/// Kept in the answers table under request id 0, which no request is numbered with, as
/// 8 bytes; absent, 0 (a store from before the floor).
fn floor(kv: &impl KvRead, session: SessionId) -> Result<u64, FsError> {
    match kv.get(Table::Dedup, &dedup_key(session, RequestId(0)))? {
        None => Ok(0),
        Some(raw) => raw.try_into().map(u64::from_be_bytes).map_err(|raw: Vec<u8>| {
            FsError::Protocol(format!("session {session}: a floor of {} bytes", raw.len()))
        }),
    }
}

/// Forgets the answers of `session`'s requests numbered below `below` and raises its
/// floor to it.
fn forget_below(
    kv: &mut impl KvWrite,
    session: SessionId,
    below: u64,
    limit: usize,
) -> Result<(), FsError> {
    if below <= floor(kv, session)? {
        return Ok(());
    }
    let from = dedup_key(session, RequestId(1));
    let to = dedup_key(session, RequestId(below));
    for (key, _) in kv.scan(Table::Dedup, &from, Some(&to), limit)? {
        kv.delete(Table::Dedup, &key)?;
    }
    kv.put(Table::Dedup, &dedup_key(session, RequestId(0)), &below.to_be_bytes())
}

/// Stores the answer to a request and forgets answers that fell out of the window.
pub(crate) fn remember(
    kv: &mut impl KvWrite,
    session: SessionId,
    req_id: RequestId,
    answer: &Answer,
) -> Result<(), FsError> {
    store::put(kv, Table::Dedup, &dedup_key(session, req_id), answer)?;
    match req_id.0.checked_sub(ANSWERS_KEPT - 1) {
        Some(oldest_kept) => forget_below(kv, session, oldest_kept, TRIM_PER_INSERT),
        None => Ok(()),
    }
}

/// Forgets the answers of `session`'s requests numbered below `below`, which its client
/// will never send again ([`MetaOp::ForgetAnswers`]).
pub(crate) fn forget_answers(
    kv: &mut impl KvWrite,
    session: SessionId,
    below: RequestId,
) -> Result<MetaResponse, FsError> {
    forget_below(kv, session, below.0, usize::MAX)?;
    Ok(MetaResponse::Done)
}

#[cfg(test)]
mod tests {
    use super::{ANSWERS_KEPT, LEASE_MS};
    use crate::kv::{KvRead, Table};
    use crate::testing::{at, create_op, Fs, CLUSTER, ROOT};
    use crate::{apply, Command};
    use crate::{garbage, sessions};
    use stoa_proto::{MetaOp, MetaRequest, MetaResponse, SessionGrant};
    use stoa_types::{FileKind, FsError, InodeId, RequestId, SessionId};

    /// Opens a second session on the same tables and returns its id.
    fn other_session(fs: &mut Fs) -> SessionId {
        match fs.call(MetaOp::OpenSession { client: "other".into() }).unwrap() {
            MetaResponse::Session(grant) => grant.session,
            other => panic!("open session answered {other:?}"),
        }
    }

    /// Runs `f` as `session`, then switches back.
    fn as_session<T>(fs: &mut Fs, session: SessionId, f: impl FnOnce(&mut Fs) -> T) -> T {
        let mine = std::mem::replace(&mut fs.session, session);
        let out = f(fs);
        fs.session = mine;
        out
    }

    #[test]
    fn an_unlinked_file_lives_until_the_last_opener_anywhere_releases_it() {
        let mut fs = Fs::new();
        let other = other_session(&mut fs);
        let a = fs.create(ROOT, "a").unwrap();
        fs.call(MetaOp::Open { ino: a.ino }).unwrap();
        as_session(&mut fs, other, |fs| fs.call(MetaOp::Open { ino: a.ino })).unwrap();
        // Unlinked by a third party that says nothing about opens: still an orphan.
        fs.unlink(ROOT, "a", false).unwrap();
        assert_eq!(fs.getattr(a.ino).unwrap().nlink, 0);
        fs.call(MetaOp::Release { ino: a.ino }).unwrap();
        // A purge from anyone leaves it while the other session has it open.
        fs.call(MetaOp::Purge { ino: a.ino }).unwrap();
        assert!(fs.getattr(a.ino).is_ok());
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
        as_session(&mut fs, other, |fs| fs.call(MetaOp::Release { ino: a.ino })).unwrap();
        // Closed everywhere, it is a stray: a kernel that resolved its name before the
        // unlink may still open it until the grace is over.
        let closed = fs.now();
        assert_eq!(crate::strays(&fs.kv, at(closed.secs - 1), 10).unwrap(), vec![]);
        assert_eq!(crate::strays(&fs.kv, closed, 10).unwrap(), vec![a.ino]);
        fs.call(MetaOp::Open { ino: a.ino }).unwrap();
        fs.purge_strays();
        assert!(fs.getattr(a.ino).is_ok(), "opened in its grace");
        fs.call(MetaOp::Release { ino: a.ino }).unwrap();
        fs.purge_strays();
        assert_eq!(fs.getattr(a.ino), Err(FsError::NotFound));
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(a.ino, 0)]);
        assert!(fs.kv.is_empty(Table::Opens) && fs.kv.is_empty(Table::Openers));
        assert!(fs.kv.is_empty(Table::Orphans));
    }

    #[test]
    fn create_open_makes_a_file_that_is_open_until_released() {
        let mut fs = Fs::new();
        let op =
            MetaOp::CreateOpen { parent: ROOT, name: b"c".to_vec(), perm: 0o640, uid: 5, gid: 6 };
        let c = fs.attr(op.clone()).unwrap();
        assert_eq!((c.kind, c.perm, c.nlink, c.uid, c.gid), (FileKind::File, 0o640, 1, 5, 6));
        assert_eq!(fs.lookup(ROOT, "c").unwrap().ino, c.ino);
        // Open: an unlink leaves an orphan until the release.
        fs.unlink(ROOT, "c", false).unwrap();
        assert_eq!(fs.getattr(c.ino).unwrap().nlink, 0);
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
        fs.call(MetaOp::Release { ino: c.ino }).unwrap();
        fs.purge_strays();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(c.ino, 0)]);
        // An existing name is refused and opens nothing.
        fs.create(ROOT, "d").unwrap();
        let again =
            MetaOp::CreateOpen { parent: ROOT, name: b"d".to_vec(), perm: 0o640, uid: 5, gid: 6 };
        assert_eq!(fs.attr(again), Err(FsError::Exists));
        assert!(fs.kv.is_empty(Table::Opens) && fs.kv.is_empty(Table::Openers));
    }

    #[test]
    fn a_file_renamed_over_while_open_is_kept_until_released() {
        let mut fs = Fs::new();
        let victim = fs.create(ROOT, "v").unwrap();
        fs.create(ROOT, "new").unwrap();
        fs.call(MetaOp::Open { ino: victim.ino }).unwrap();
        fs.rename((ROOT, "new"), (ROOT, "v"), 0).unwrap();
        assert_eq!(fs.getattr(victim.ino).unwrap().nlink, 0);
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty());
        fs.call(MetaOp::Release { ino: victim.ino }).unwrap();
        assert!(garbage(&fs.kv, InodeId(0), 10).unwrap().is_empty(), "a stray first");
        fs.purge_strays();
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(victim.ino, 0)]);
    }

    #[test]
    fn an_expired_session_releases_its_files_and_is_refused() {
        let mut fs = Fs::new();
        let other = other_session(&mut fs);
        let a = fs.create(ROOT, "a").unwrap();
        let b = fs.create(ROOT, "b").unwrap();
        as_session(&mut fs, other, |fs| {
            fs.call(MetaOp::Open { ino: a.ino }).unwrap();
            fs.call(MetaOp::Open { ino: b.ino }).unwrap();
        });
        fs.unlink(ROOT, "a", false).unwrap();
        assert_eq!(sessions(&fs.kv).unwrap(), vec![fs.session, other]);
        apply(&mut fs.kv, &Command::ExpireSession { session: other }).unwrap();
        // The orphan is garbage; the linked file is untouched; nothing of `other` is left.
        assert_eq!(garbage(&fs.kv, InodeId(0), 10).unwrap(), vec![(a.ino, 0)]);
        assert!(fs.getattr(b.ino).is_ok());
        assert!(fs.kv.is_empty(Table::Opens) && fs.kv.is_empty(Table::Openers));
        assert_eq!(sessions(&fs.kv).unwrap(), vec![fs.session]);
        let late = as_session(&mut fs, other, |fs| fs.call(MetaOp::Open { ino: b.ino }));
        assert_eq!(late, Err(FsError::SessionExpired));
        // A second expiry (a new leader that judged the same) changes nothing.
        apply(&mut fs.kv, &Command::ExpireSession { session: other }).unwrap();
    }

    #[test]
    fn opening_a_missing_file_or_without_a_session_is_refused() {
        let mut fs = Fs::new();
        assert_eq!(fs.call(MetaOp::Open { ino: stoa_types::InodeId(999) }), Err(FsError::NotFound));
        let a = fs.create(ROOT, "a").unwrap();
        let none = as_session(&mut fs, SessionId(0), |fs| fs.call(MetaOp::Open { ino: a.ino }));
        assert!(matches!(none, Err(FsError::Invalid(_))), "{none:?}");
        // Releasing what is not open is harmless.
        fs.call(MetaOp::Release { ino: a.ino }).unwrap();
    }

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

    /// Applies `op` in `fs`'s session as request `req_id`.
    fn numbered(fs: &mut Fs, req_id: u64, op: MetaOp) -> Result<MetaResponse, FsError> {
        let req = MetaRequest { session: fs.session, req_id: RequestId(req_id), op };
        let now = fs.now();
        apply(&mut fs.kv, &Command::Client { req, now })
    }

    #[test]
    fn only_a_window_of_recent_answers_is_kept() {
        let mut fs = Fs::new();
        let total = ANSWERS_KEPT + 300;
        for i in 0..total {
            // Reads in the log are not remembered; creates are.
            let op = if i % 2 == 0 {
                create_op(ROOT, &format!("f{i}"), FileKind::File)
            } else {
                MetaOp::GetAttr { ino: ROOT }
            };
            let _ = numbered(&mut fs, i + 1, op);
        }
        let kept = fs.kv.scan(Table::Dedup, &[], None, usize::MAX).unwrap();
        // The first row is the session's floor (request id 0).
        assert_eq!(kept[0].0[8..], [0; 8]);
        let kept = &kept[1..];
        assert!(kept.len() <= ANSWERS_KEPT as usize, "{} answers kept", kept.len());
        let oldest = u64::from_be_bytes(kept[0].0[8..].try_into().unwrap());
        assert!(oldest > total - ANSWERS_KEPT, "answer to request {oldest} outlived the window");
        let trimmed = numbered(&mut fs, 2, create_op(ROOT, "f2", FileKind::File));
        assert!(matches!(trimmed, Err(FsError::Invalid(_))), "applied twice: {trimmed:?}");
        // Other sessions' answers are untouched by this session's trimming.
        let mut other = Fs::new();
        other.create(ROOT, "x").unwrap();
        assert_eq!(other.kv.len(Table::Dedup), 1);
    }

    /// A rename waited at the leader while its mount made thousands of other changes;
    /// its retry must still get the first answer, until the client says it is done
    /// with it.
    #[test]
    fn an_answer_is_kept_until_its_client_forgets_it() {
        let mut fs = Fs::new();
        let first = numbered(&mut fs, 1, create_op(ROOT, "kept", FileKind::File));
        assert!(first.is_ok(), "{first:?}");
        for i in 2..3000 {
            numbered(&mut fs, i, create_op(ROOT, &format!("f{i}"), FileKind::File)).unwrap();
        }
        let retry = numbered(&mut fs, 1, create_op(ROOT, "kept", FileKind::File));
        assert_eq!(retry, first, "a retry after 3,000 other requests");
        let forget = MetaOp::ForgetAnswers { below: RequestId(2000) };
        let req = MetaRequest { session: fs.session, req_id: RequestId(0), op: forget };
        let now = fs.now();
        assert_eq!(apply(&mut fs.kv, &Command::Client { req, now }).unwrap(), MetaResponse::Done);
        assert_eq!(fs.kv.len(Table::Dedup), 1001, "the answers to requests 2000 to 2999, a floor");
        // An attempt the client gave up on reaches the log late: refused, not applied.
        let unlink = MetaOp::Unlink { parent: ROOT, name: b"f5".to_vec(), open: false };
        let late = numbered(&mut fs, 5, unlink.clone());
        assert!(matches!(late, Err(FsError::Invalid(_))), "{late:?}");
        assert!(fs.lookup(ROOT, "f5").is_ok(), "a forgotten request was applied again");
        assert!(numbered(&mut fs, 3000, unlink).is_ok());
        let other = other_session(&mut fs);
        let req = MetaRequest {
            session: other,
            req_id: RequestId(1),
            op: create_op(ROOT, "theirs", FileKind::File),
        };
        let now = fs.now();
        apply(&mut fs.kv, &Command::Client { req, now }).unwrap();
        let forget = MetaOp::ForgetAnswers { below: RequestId(u64::MAX) };
        let req = MetaRequest { session: fs.session, req_id: RequestId(0), op: forget };
        let now = fs.now();
        apply(&mut fs.kv, &Command::Client { req, now }).unwrap();
        let rows = fs.kv.scan(Table::Dedup, &[], None, usize::MAX).unwrap();
        let theirs: Vec<_> = rows.iter().filter(|(k, _)| k[..8] == other.0.to_be_bytes()).collect();
        assert_eq!(theirs.len(), 1, "another session's answers stay");
    }
}
