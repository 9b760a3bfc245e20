//! A small harness for the unit tests: a created cluster in a [`MemKv`], one open
//! session, and a clock that advances one second per mutation.

use crate::mem::MemKv;
use crate::{apply, read, Command};
use stoa_proto::{MetaOp, MetaRequest, MetaResponse};
use stoa_types::{
    Attr, ClusterId, DirEntry, FileKind, FsError, InodeId, RequestId, SessionId, Timestamp,
};

pub(crate) const CLUSTER: ClusterId = ClusterId(0xc1);
pub(crate) const ROOT: InodeId = InodeId::ROOT;

pub(crate) struct Fs {
    pub kv: MemKv,
    pub session: SessionId,
    pub next_req: u64,
    pub secs: i64,
}

impl Fs {
    /// A new cluster keeping `replicas` copies of each chunk, with a session open.
    pub fn with_replicas(replicas: u8) -> Fs {
        let mut kv = MemKv::new();
        let init = Command::Init { cluster: CLUSTER, chunk_size_bytes: 4096, replicas, now: at(1) };
        apply(&mut kv, &init).unwrap();
        let mut fs = Fs { kv, session: SessionId(0), next_req: 1, secs: 1 };
        fs.session = fs.open_session();
        fs
    }

    /// Opens another session (the harness goes on calling in its own).
    pub fn open_session(&mut self) -> SessionId {
        match self.call(MetaOp::OpenSession { client: "test".into() }).unwrap() {
            MetaResponse::Session(grant) => grant.session,
            other => panic!("open session answered {other:?}"),
        }
    }

    pub fn new() -> Fs {
        Fs::with_replicas(2)
    }

    pub fn now(&self) -> Timestamp {
        at(self.secs)
    }

    /// Applies a mutation under the next request id, or answers a read.
    pub fn call(&mut self, op: MetaOp) -> Result<MetaResponse, FsError> {
        if !op.is_mutation() {
            return read(&self.kv, &op);
        }
        self.secs += 1;
        let req = MetaRequest { session: self.session, req_id: RequestId(self.next_req), op };
        self.next_req += 1;
        let now = self.now();
        apply(&mut self.kv, &Command::Client { req, now })
    }

    pub fn attr(&mut self, op: MetaOp) -> Result<Attr, FsError> {
        match self.call(op)? {
            MetaResponse::Attr(attr) => Ok(attr),
            other => panic!("expected attributes, got {other:?}"),
        }
    }

    pub fn create(&mut self, parent: InodeId, name: &str) -> Result<Attr, FsError> {
        self.attr(create_op(parent, name, FileKind::File))
    }

    pub fn mkdir(&mut self, parent: InodeId, name: &str) -> Result<Attr, FsError> {
        let name = name.as_bytes().to_vec();
        self.attr(MetaOp::Mkdir { parent, name, perm: 0o755, uid: 1, gid: 1 })
    }

    pub fn lookup(&mut self, parent: InodeId, name: &str) -> Result<Attr, FsError> {
        self.attr(MetaOp::Lookup { parent, name: name.as_bytes().to_vec() })
    }

    pub fn getattr(&mut self, ino: InodeId) -> Result<Attr, FsError> {
        self.attr(MetaOp::GetAttr { ino })
    }

    pub fn unlink(&mut self, parent: InodeId, name: &str, open: bool) -> Result<(), FsError> {
        self.call(MetaOp::Unlink { parent, name: name.as_bytes().to_vec(), open }).map(|_| ())
    }

    /// Purges every stray, as the leader does once their grace is over.
    pub fn purge_strays(&mut self) {
        let inos = crate::strays(&self.kv, self.now(), usize::MAX).unwrap();
        crate::apply(&mut self.kv, &crate::Command::PurgeStrays { inos }).unwrap();
    }

    pub fn rmdir(&mut self, parent: InodeId, name: &str) -> Result<(), FsError> {
        self.call(MetaOp::Rmdir { parent, name: name.as_bytes().to_vec() }).map(|_| ())
    }

    pub fn rename(
        &mut self,
        (parent, name): (InodeId, &str),
        (new_parent, new_name): (InodeId, &str),
        flags: u32,
    ) -> Result<(), FsError> {
        let (name, new_name) = (name.as_bytes().to_vec(), new_name.as_bytes().to_vec());
        self.call(MetaOp::Rename { parent, name, new_parent, new_name, flags }).map(|_| ())
    }

    /// Every entry of `dir`, read in pages of `page`.
    pub fn list(&mut self, dir: InodeId, page: u32) -> Result<Vec<DirEntry>, FsError> {
        let mut all: Vec<DirEntry> = Vec::new();
        loop {
            let after = all.last().map(|e| e.name.clone()).unwrap_or_default();
            match self.call(MetaOp::ReadDir { ino: dir, after, limit: page })? {
                MetaResponse::Entries { entries, more } => {
                    all.extend(entries);
                    if !more {
                        return Ok(all);
                    }
                }
                other => panic!("readdir answered {other:?}"),
            }
        }
    }

    /// The names in `dir`, in order.
    pub fn names(&mut self, dir: InodeId) -> Vec<String> {
        let entries = self.list(dir, 100).unwrap();
        entries.into_iter().map(|e| String::from_utf8(e.name).unwrap()).collect()
    }
}

pub(crate) fn at(secs: i64) -> Timestamp {
    Timestamp { secs, nanos: 0 }
}

pub(crate) fn create_op(parent: InodeId, name: &str, kind: FileKind) -> MetaOp {
    let name = name.as_bytes().to_vec();
    MetaOp::Create { parent, name, kind, perm: 0o644, uid: 1, gid: 1, rdev: 0 }
}
