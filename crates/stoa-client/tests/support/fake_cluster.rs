//! An in-memory stand-in for a Stoa cluster (one meta replica and one chunk server on one
//! address), enough to drive the client end to end without the real servers. It answers
//! retried mutations (same session and request id) with the first answer, like meta.

use bytes::Bytes;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use stoa_proto::{
    BatchOp, CapRef, ChunkOp, ChunkRequest, ChunkResponse, MetaOp, MetaRequest, MetaResponse,
    Reply, Request, Response, SessionGrant,
};
use stoa_types::{
    Attr, Chain, ChainId, ChainTable, ChunkId, ChunkNode, ClusterId, DirEntry, FileKind, FsError,
    InodeId, NodeId, SessionId, StatFs, Timestamp,
};

#[derive(Default)]
pub struct State {
    pub attrs: HashMap<u64, Attr>,
    pub dirs: HashMap<u64, BTreeMap<Vec<u8>, u64>>,
    pub links: HashMap<u64, Vec<u8>>,
    pub chunks: HashMap<ChunkId, Vec<u8>>,
    pub purged: Vec<u64>,
    /// Inodes some session has open, as told by `Open` and `Release`.
    pub opens: std::collections::HashSet<u64>,
    /// `Open` calls answered.
    pub open_calls: u64,
    /// `Batch` calls that reached meta, held ones included.
    pub batches_arrived: u64,
    /// Sessions opened so far; `expired` ones are refused like meta refuses them.
    pub sessions: u64,
    pub expired: std::collections::HashSet<u64>,
    /// Chunks made durable: by a `Sync`, or by a durable write.
    pub synced: Vec<ChunkId>,
    /// `Sync` calls answered.
    pub sync_calls: u64,
    /// Chunk writes (`Write` and `WriteRanges`) answered.
    pub chunk_writes: u64,
    /// Chunk reads answered.
    pub chunk_reads: u64,
    /// `GetAttr` calls answered.
    pub getattr_calls: u64,
    /// Size commits answered: `CommitWrite` calls, and those carried by `CommitWrites`.
    pub commit_calls: u64,
    pub batched_commits: u64,
    /// Size commits that arrived (held or not).
    pub commits_arrived: u64,
    /// The last cap granted per inode.
    pub granted: HashMap<u64, u64>,
    /// Recalls for the client's next `CapEvents` poll, and the caps it gave back.
    pub recalls: Vec<CapRef>,
    pub released: Vec<CapRef>,
    answered: HashMap<(u64, u64), Reply>,
    next_ino: u64,
    cap_seq: u64,
}

pub struct FakeCluster {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    /// Chunk writes still to refuse with `Busy`, to exercise retries.
    pub busy_writes: Arc<AtomicU32>,
    /// Chunk writes still to refuse with `NoSpace`, a failure the client does not retry.
    pub full_writes: Arc<AtomicU32>,
    /// Size commits (`CommitWrite`, `CommitWrites`) to a size above this wait before
    /// they apply: 0 holds every commit of data, `u64::MAX` (the start) none.
    pub hold_commits_above: Arc<AtomicU64>,
    /// While set, chunk writes wait before they apply.
    pub hold_writes: Arc<AtomicBool>,
    /// While set, batches of queued namespace changes wait before they apply.
    pub hold_batches: Arc<AtomicBool>,
}

struct Handler {
    addr: SocketAddr,
    chunk_size: u32,
    state: Arc<Mutex<State>>,
    busy_writes: Arc<AtomicU32>,
    full_writes: Arc<AtomicU32>,
    hold_commits_above: Arc<AtomicU64>,
    hold_writes: Arc<AtomicBool>,
    hold_batches: Arc<AtomicBool>,
}

/// Takes one from `counter` if it is above zero; says whether it did.
fn take_one(counter: &AtomicU32) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

fn attr(ino: u64, kind: FileKind, perm: u32) -> Attr {
    let now = Timestamp::now();
    Attr {
        ino: InodeId(ino),
        kind,
        perm,
        uid: 0,
        gid: 0,
        size: 0,
        nlink: 1,
        rdev: 0,
        atime: now,
        mtime: now,
        ctime: now,
        version: 1,
    }
}

impl FakeCluster {
    pub async fn start(chunk_size: u32) -> FakeCluster {
        let listener = stoa_net::bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut state = State { next_ino: 2, ..Default::default() };
        state.attrs.insert(1, attr(1, FileKind::Dir, 0o777));
        state.dirs.insert(1, BTreeMap::new());
        let state = Arc::new(Mutex::new(state));
        let busy_writes = Arc::new(AtomicU32::new(0));
        let full_writes = Arc::new(AtomicU32::new(0));
        let hold_commits_above = Arc::new(AtomicU64::new(u64::MAX));
        let hold_writes = Arc::new(AtomicBool::new(false));
        let hold_batches = Arc::new(AtomicBool::new(false));
        let handler = Handler {
            addr,
            chunk_size,
            state: state.clone(),
            busy_writes: busy_writes.clone(),
            full_writes: full_writes.clone(),
            hold_commits_above: hold_commits_above.clone(),
            hold_writes: hold_writes.clone(),
            hold_batches: hold_batches.clone(),
        };
        tokio::spawn(stoa_net::serve(listener, Arc::new(handler)));
        FakeCluster {
            addr,
            state,
            busy_writes,
            full_writes,
            hold_commits_above,
            hold_writes,
            hold_batches,
        }
    }
}

impl stoa_net::Handler for Handler {
    async fn handle(&self, req: Request, payload: Bytes, _: SocketAddr) -> (Reply, Bytes) {
        match req {
            // The events poll answers the recalls a test queued, or empty after a hold,
            // as the real one does.
            Request::Meta(m) if matches!(m.op, MetaOp::CapEvents { .. }) => {
                for _ in 0..40 {
                    if !self.state.lock().unwrap().recalls.is_empty() {
                        break;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                (self.meta(m), Bytes::new())
            }
            Request::Meta(m) => {
                let largest = match &m.op {
                    MetaOp::CommitWrite { size, .. } => Some(*size),
                    MetaOp::CommitWrites { commits } => commits.iter().map(|c| c.size).max(),
                    _ => None,
                };
                if let Some(size) = largest {
                    self.state.lock().unwrap().commits_arrived += 1;
                    while size > self.hold_commits_above.load(Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                }
                if matches!(m.op, MetaOp::Batch { .. }) {
                    self.state.lock().unwrap().batches_arrived += 1;
                }
                while matches!(m.op, MetaOp::Batch { .. })
                    && self.hold_batches.load(Ordering::SeqCst)
                {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                (self.meta(m), Bytes::new())
            }
            Request::Chunk(c) => {
                if matches!(c.op, ChunkOp::Write { .. } | ChunkOp::WriteRanges { .. }) {
                    while self.hold_writes.load(Ordering::SeqCst) {
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                }
                self.chunk(c, payload)
            }
            Request::Raft(_) => (Err(FsError::NotSupported), Bytes::new()),
        }
    }
}

impl Handler {
    fn meta(&self, req: MetaRequest) -> Reply {
        let mut st = self.state.lock().unwrap();
        if st.expired.contains(&req.session.0) {
            return Err(FsError::SessionExpired);
        }
        let key = (req.session.0, req.req_id.0);
        if req.req_id.0 != 0 {
            if let Some(first) = st.answered.get(&key) {
                return first.clone();
            }
        }
        let reply = self.apply(&mut st, req.op).map(Response::Meta);
        if req.req_id.0 != 0 {
            st.answered.insert(key, reply.clone());
        }
        reply
    }

    fn apply(&self, st: &mut State, op: MetaOp) -> Result<MetaResponse, FsError> {
        Ok(match op {
            MetaOp::OpenSession { .. } => MetaResponse::Session(SessionGrant {
                session: SessionId({
                    st.sessions += 1;
                    st.sessions
                }),
                cluster: ClusterId(1),
                chunk_size_bytes: self.chunk_size,
                lease_ms: 10_000,
            }),
            MetaOp::GetChainTable => MetaResponse::ChainTable(ChainTable {
                version: 1,
                chains: vec![Chain {
                    id: ChainId(0),
                    version: 1,
                    members: vec![NodeId(1)],
                    syncing: vec![],
                }],
                nodes: vec![ChunkNode { id: NodeId(1), addr: self.addr }],
            }),
            MetaOp::Lookup { parent, name } => {
                let ino = *st
                    .dirs
                    .get(&parent.0)
                    .ok_or(FsError::NotDir)?
                    .get(&name)
                    .ok_or(FsError::NotFound)?;
                MetaResponse::Attr(st.attrs[&ino].clone())
            }
            MetaOp::GetAttr { ino } => {
                st.getattr_calls += 1;
                MetaResponse::Attr(st.attrs.get(&ino.0).cloned().ok_or(FsError::NotFound)?)
            }
            MetaOp::SetAttr { ino, set } => {
                let a = st.attrs.get_mut(&ino.0).ok_or(FsError::NotFound)?;
                if let Some(size) = set.size {
                    a.size = size;
                }
                set.apply(a, Timestamp::now());
                a.version += 1;
                MetaResponse::Attr(a.clone())
            }
            MetaOp::Create { parent, name, kind, perm, .. } => {
                self.make(st, parent, name, kind, perm)?
            }
            MetaOp::CreateOpen { parent, name, perm, .. } => {
                let resp = self.make(st, parent, name, FileKind::File, perm)?;
                if let MetaResponse::Attr(a) = &resp {
                    st.opens.insert(a.ino.0);
                }
                resp
            }
            MetaOp::Mkdir { parent, name, perm, .. } => {
                let resp = self.make(st, parent, name, FileKind::Dir, perm)?;
                if let MetaResponse::Attr(a) = &resp {
                    st.dirs.insert(a.ino.0, BTreeMap::new());
                }
                resp
            }
            MetaOp::Symlink { parent, name, target, .. } => {
                let resp = self.make(st, parent, name, FileKind::Symlink, 0o777)?;
                if let MetaResponse::Attr(a) = &resp {
                    st.links.insert(a.ino.0, target);
                }
                resp
            }
            MetaOp::ReadLink { ino } => MetaResponse::Data(
                st.links.get(&ino.0).cloned().ok_or(FsError::Invalid("not a link".into()))?,
            ),
            MetaOp::Unlink { parent, name, open } => {
                let ino = st
                    .dirs
                    .get_mut(&parent.0)
                    .ok_or(FsError::NotDir)?
                    .remove(&name)
                    .ok_or(FsError::NotFound)?;
                let a = st.attrs.get_mut(&ino).unwrap();
                a.nlink -= 1;
                if a.nlink == 0 && !open && !st.opens.contains(&ino) {
                    st.attrs.remove(&ino);
                }
                MetaResponse::Done
            }
            MetaOp::Rename { parent, name, new_parent, new_name, .. } => {
                let ino = st
                    .dirs
                    .get_mut(&parent.0)
                    .ok_or(FsError::NotDir)?
                    .remove(&name)
                    .ok_or(FsError::NotFound)?;
                st.dirs.get_mut(&new_parent.0).ok_or(FsError::NotDir)?.insert(new_name, ino);
                MetaResponse::Done
            }
            MetaOp::ReadDir { ino, after, limit } => {
                let dir = st.dirs.get(&ino.0).ok_or(FsError::NotDir)?;
                let mut entries: Vec<DirEntry> = dir
                    .iter()
                    .filter(|(n, _)| after.is_empty() || **n > after)
                    .map(|(n, i)| DirEntry {
                        name: n.clone(),
                        ino: InodeId(*i),
                        kind: st.attrs[i].kind,
                    })
                    .take(limit as usize + 1)
                    .collect();
                let more = entries.len() > limit as usize;
                entries.truncate(limit as usize);
                MetaResponse::Entries { entries, more }
            }
            MetaOp::CommitWrite { ino, size } => {
                st.commit_calls += 1;
                let a = st.attrs.get_mut(&ino.0).ok_or(FsError::NotFound)?;
                a.size = a.size.max(size);
                a.version += 1;
                MetaResponse::Attr(a.clone())
            }
            MetaOp::CommitWrites { commits } => MetaResponse::Attrs(
                commits
                    .into_iter()
                    .map(|c| {
                        st.batched_commits += 1;
                        let a = st.attrs.get_mut(&c.ino.0).ok_or(FsError::NotFound)?;
                        a.size = a.size.max(c.size);
                        (a.mtime, a.ctime) = (c.at, c.at);
                        a.version += 1;
                        Ok(a.clone())
                    })
                    .collect(),
            ),
            MetaOp::RenewSession => MetaResponse::Renewed { leader: None },
            MetaOp::Open { ino } => {
                st.attrs.get(&ino.0).ok_or(FsError::NotFound)?;
                st.opens.insert(ino.0);
                st.open_calls += 1;
                MetaResponse::Done
            }
            MetaOp::Release { ino } => {
                st.opens.remove(&ino.0);
                if st.attrs.get(&ino.0).is_some_and(|a| a.nlink == 0) {
                    st.attrs.remove(&ino.0);
                    st.purged.push(ino.0);
                }
                MetaResponse::Done
            }
            MetaOp::Purge { ino } => {
                st.attrs.remove(&ino.0);
                st.purged.push(ino.0);
                MetaResponse::Done
            }
            MetaOp::StatFs => MetaResponse::StatFs(StatFs {
                total_bytes: 1 << 30,
                free_bytes: 1 << 29,
                files: st.attrs.len() as u64,
            }),
            MetaOp::CloseSession => MetaResponse::Done,
            // One client: every cap is granted at once; only a test recalls.
            MetaOp::GetCaps { ino, name, mode } => {
                let dir_version = st.attrs.get(&ino.0).map_or(0, |dir| dir.version);
                let ino = match name {
                    None => ino.0,
                    Some(name) => *st
                        .dirs
                        .get(&ino.0)
                        .ok_or(FsError::NotDir)?
                        .get(&name)
                        .ok_or(FsError::NotFound)?,
                };
                st.cap_seq += 1;
                let seq = st.cap_seq;
                st.granted.insert(ino, seq);
                let attr = st.attrs.get(&ino).cloned().ok_or(FsError::NotFound)?;
                MetaResponse::Caps { attr, mode, seq, dir_seq: seq, dir_version, xattrs: None }
            }
            MetaOp::CapEvents { .. } => {
                MetaResponse::CapEvents { recalls: std::mem::take(&mut st.recalls), term: 0 }
            }
            MetaOp::CapsReleased { released } => {
                st.released.extend(released);
                MetaResponse::Done
            }
            // Directories are never handed out here, so the client makes every namespace
            // change through meta; its batches carry only the opens of files it holds a
            // cap on, the releases of last closes, and mode changes of files it holds
            // exclusively.
            MetaOp::TakeDir { .. } => MetaResponse::Dir(None),
            MetaOp::Batch { ops } => MetaResponse::Batch(
                ops.into_iter()
                    .map(|op| match op {
                        BatchOp::Release { ino } => {
                            self.apply(st, MetaOp::Release { ino }).map(drop)
                        }
                        BatchOp::Open { ino } => self.apply(st, MetaOp::Open { ino }).map(drop),
                        BatchOp::SetAttr { ino, set, .. } => {
                            self.apply(st, MetaOp::SetAttr { ino, set }).map(drop)
                        }
                        _ => Err(FsError::NotSupported),
                    })
                    .collect(),
            ),
            _ => return Err(FsError::NotSupported),
        })
    }

    fn make(
        &self,
        st: &mut State,
        parent: InodeId,
        name: Vec<u8>,
        kind: FileKind,
        perm: u32,
    ) -> Result<MetaResponse, FsError> {
        let ino = st.next_ino;
        let dir = st.dirs.get_mut(&parent.0).ok_or(FsError::NotDir)?;
        if dir.contains_key(&name) {
            return Err(FsError::Exists);
        }
        dir.insert(name, ino);
        st.next_ino += 1;
        let a = attr(ino, kind, perm);
        st.attrs.insert(ino, a.clone());
        Ok(MetaResponse::Attr(a))
    }

    fn write_ranges(
        &self,
        st: &mut State,
        chunk: ChunkId,
        ranges: Vec<(u32, u32)>,
        payload: Bytes,
    ) -> (Reply, Bytes) {
        if take_one(&self.busy_writes) {
            return (Err(FsError::Busy), Bytes::new());
        }
        if take_one(&self.full_writes) {
            return (Err(FsError::NoSpace), Bytes::new());
        }
        st.chunk_writes += 1;
        let data = st.chunks.entry(chunk).or_default();
        let mut pos = 0usize;
        for (offset, len) in ranges {
            let (offset, len) = (offset as usize, len as usize);
            if data.len() < offset + len {
                data.resize(offset + len, 0);
            }
            data[offset..offset + len].copy_from_slice(&payload[pos..pos + len]);
            pos += len;
        }
        (Ok(Response::Chunk(ChunkResponse::Written { version: 1 })), Bytes::new())
    }

    fn chunk(&self, req: ChunkRequest, payload: Bytes) -> (Reply, Bytes) {
        let mut st = self.state.lock().unwrap();
        let done = |r: ChunkResponse| Ok(Response::Chunk(r));
        if let Some(chunk) = req.op.chunk().filter(|_| req.op.durable()) {
            st.synced.push(chunk);
        }
        match req.op {
            ChunkOp::Write { chunk, offset, .. } => {
                let ranges = vec![(offset, payload.len() as u32)];
                self.write_ranges(&mut st, chunk, ranges, payload)
            }
            ChunkOp::WriteRanges { chunk, ranges, .. } => {
                self.write_ranges(&mut st, chunk, ranges, payload)
            }
            ChunkOp::Read { chunk, offset, len } => {
                st.chunk_reads += 1;
                let data = st.chunks.get(&chunk).map(|d| {
                    let start = (offset as usize).min(d.len());
                    let end = (offset as usize + len as usize).min(d.len());
                    Bytes::copy_from_slice(&d[start..end])
                });
                (done(ChunkResponse::Data), data.unwrap_or_default())
            }
            ChunkOp::Truncate { chunk, len, .. } => {
                if len == 0 {
                    st.chunks.remove(&chunk);
                } else if let Some(d) = st.chunks.get_mut(&chunk) {
                    d.truncate(len as usize);
                }
                (done(ChunkResponse::Written { version: 2 }), Bytes::new())
            }
            ChunkOp::Sync { chunks } => {
                st.synced.extend(chunks);
                st.sync_calls += 1;
                (done(ChunkResponse::Done), Bytes::new())
            }
            _ => (Err(FsError::NotSupported), Bytes::new()),
        }
    }
}
