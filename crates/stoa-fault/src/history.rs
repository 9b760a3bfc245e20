//! The history of a run: every client operation with the time it was invoked, the time
//! it completed, and what it returned. An operation whose outcome is not known (it timed
//! out, or failed with an error that does not prove it had no effect, like EIO) may have
//! taken effect at any time after its invocation; the checker treats it so.

use std::cell::Cell;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// What a client asked for. Namespace names are small integers (bit positions of the
/// directory model); register values are unique per write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    Read,
    Write(u64),
    /// Compare-and-set of a register under an fcntl write lock: `(expected, new)`. It
    /// returns `Ok` when it swapped, and the value it found (`Value`) when that was not
    /// the expected one.
    Cas(u64, u64),
    Create(u8),
    Unlink(u8),
    Rename(u8, u8),
    Stat(u8),
    List,
}

/// What the operation returned when it completed without error or with a definite one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ret {
    Ok,
    Value(u64),
    /// A read returned bytes that no writer ever wrote.
    Garbage(String),
    Exists,
    Missing,
    Listing(u8),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Definitely no effect (a read that failed, a call refused before it was sent).
    Fail,
    /// May or may not have taken effect.
    Unknown,
}

#[derive(Clone, Debug)]
pub struct Record {
    pub client: usize,
    /// The register file or namespace directory the call touched: the checker partitions
    /// the history by it.
    pub key: String,
    pub call: Call,
    pub ret: Option<Ret>,
    pub outcome: Outcome,
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub error: Option<String>,
    /// For a write: when its open returned, so the file it wrote through was open from
    /// then on (the fencing check tells a write through a handle of an expired session
    /// from one whose open waited for the new session).
    pub opened_ns: Option<u64>,
}

impl Record {
    pub fn latency_ns(&self) -> u64 {
        self.complete_ns.saturating_sub(self.invoke_ns)
    }
}

/// A shared, append-only history with one clock.
#[derive(Clone)]
pub struct History {
    start: Instant,
    records: Arc<Mutex<Vec<Record>>>,
}

impl Default for History {
    fn default() -> Self {
        History::new()
    }
}

impl History {
    pub fn new() -> History {
        History { start: Instant::now(), records: Arc::new(Mutex::new(Vec::new())) }
    }

    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    /// Runs `f` as one operation of `client` on `key` and records it. `f` returns the
    /// outcome and the result. The invocation is recorded before `f` runs, as an
    /// operation of unknown outcome, so that one that never returns (a client stuck in
    /// the kernel) still counts as a write that may have happened.
    pub fn record(
        &self,
        client: usize,
        key: &str,
        call: Call,
        f: impl FnOnce(&Call, &Opened) -> (Outcome, Result<Ret, String>),
    ) -> Option<Ret> {
        let invoke_ns = self.now_ns();
        let rec = Record {
            client,
            key: key.to_string(),
            call: call.clone(),
            ret: None,
            outcome: Outcome::Unknown,
            invoke_ns,
            complete_ns: u64::MAX,
            error: Some("never completed".into()),
            opened_ns: None,
        };
        let at = {
            let mut records = self.records.lock().expect("history lock poisoned");
            records.push(rec);
            records.len() - 1
        };
        let opened = Opened { history: self, at: Cell::new(None) };
        let (outcome, result) = f(&call, &opened);
        let complete_ns = self.now_ns();
        let mut records = self.records.lock().expect("history lock poisoned");
        let rec = &mut records[at];
        rec.outcome = outcome;
        rec.complete_ns = complete_ns;
        rec.opened_ns = opened.at.get();
        match result {
            Ok(r) => {
                rec.ret = Some(r.clone());
                rec.error = None;
                Some(r)
            }
            Err(e) => {
                rec.error = Some(e);
                None
            }
        }
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().expect("history lock poisoned").clone()
    }
}

/// Where an operation notes that its open returned ([`Record::opened_ns`]).
pub struct Opened<'a> {
    history: &'a History,
    at: Cell<Option<u64>>,
}

impl Opened<'_> {
    pub fn now(&self) {
        self.at.set(Some(self.history.now_ns()));
    }
}
