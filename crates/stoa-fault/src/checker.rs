//! A linearizability checker in the style of Wing & Gong and Knossos / Porcupine: a
//! depth-first search for an order of the operations that respects real time (an
//! operation that completed before another was invoked comes first) and that a
//! sequential model accepts, with a cache of (set of linearized operations, model state)
//! so that no configuration is explored twice. The history is partitioned by key (one
//! register file, one directory) and each part is checked alone, which keeps the search
//! small.
//!
//! Operations of unknown outcome may take effect at any time after their invocation or
//! never: they are optional, and never bound the real-time order of others.

use crate::history::{Call, Outcome, Record, Ret};
use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    fn init(&self) -> Self::State;
    /// The state after `call` returned `ret` (`None`: outcome unknown, any return is
    /// fine), or `None` if `ret` is impossible in `state`.
    fn step(&self, state: &Self::State, call: &Call, ret: Option<&Ret>) -> Option<Self::State>;
}

/// A read/write/compare-and-set register holding a u64, initially 0.
pub struct Register;

impl Model for Register {
    type State = u64;
    fn init(&self) -> u64 {
        0
    }
    fn step(&self, state: &u64, call: &Call, ret: Option<&Ret>) -> Option<u64> {
        match (call, ret) {
            (Call::Write(v), _) => Some(*v),
            (Call::Read, None) => Some(*state),
            (Call::Read, Some(Ret::Value(v))) if v == state => Some(*state),
            // Taking effect with an unknown outcome: it swapped if it could.
            (Call::Cas(expected, new), None) => Some(if state == expected { *new } else { *state }),
            (Call::Cas(expected, new), Some(Ret::Ok)) if state == expected => Some(*new),
            (Call::Cas(expected, _), Some(Ret::Value(v))) if v == state && v != expected => {
                Some(*state)
            }
            _ => None,
        }
    }
}

/// A directory of up to eight names; the state is the set of present names as a bitmask.
pub struct Directory;

impl Model for Directory {
    type State = u8;
    fn init(&self) -> u8 {
        0
    }
    fn step(&self, s: &u8, call: &Call, ret: Option<&Ret>) -> Option<u8> {
        let has = |n: u8| s & (1 << n) != 0;
        let want = |r: Ret| ret.is_none() || ret == Some(&r);
        match call {
            Call::Create(n) if has(*n) => want(Ret::Exists).then_some(*s),
            Call::Create(n) => want(Ret::Ok).then_some(s | (1 << n)),
            Call::Unlink(n) if has(*n) => want(Ret::Ok).then_some(s & !(1 << n)),
            Call::Unlink(_) => want(Ret::Missing).then_some(*s),
            Call::Rename(a, b) if has(*a) => want(Ret::Ok).then_some((s & !(1 << a)) | (1 << b)),
            Call::Rename(..) => want(Ret::Missing).then_some(*s),
            Call::Stat(n) => want(if has(*n) { Ret::Exists } else { Ret::Missing }).then_some(*s),
            Call::List => want(Ret::Listing(*s)).then_some(*s),
            _ => None,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order exists; says how far the search got.
    Violation(String),
    /// The search gave up after its budget of steps.
    Undecided,
}

/// Steps one search may take before it gives up.
const BUDGET_STEPS: u64 = 5_000_000;

struct Op<'a> {
    rec: &'a Record,
    /// `u64::MAX` for an operation of unknown outcome.
    complete: u64,
}

/// Checks one key's records against `model`. Failed operations are left out: they had
/// no effect.
pub fn check<M: Model>(model: &M, records: &[&Record]) -> Verdict {
    let mut ops: Vec<Op> = records
        .iter()
        .filter(|r| r.outcome != Outcome::Fail)
        // A read of unknown outcome observed nothing and changed nothing.
        .filter(|r| !(r.outcome == Outcome::Unknown && is_read(&r.call)))
        .map(|r| Op {
            rec: r,
            complete: if r.outcome == Outcome::Ok { r.complete_ns } else { u64::MAX },
        })
        .collect();
    ops.sort_by_key(|o| o.rec.invoke_ns);
    Search::new(model, &ops).run()
}

fn is_read(c: &Call) -> bool {
    matches!(c, Call::Read | Call::Stat(_) | Call::List)
}

struct Frame<S> {
    op: usize,
    prev: S,
    candidates: Vec<usize>,
    next: usize,
}

struct Search<'a, M: Model> {
    model: &'a M,
    ops: &'a [Op<'a>],
    done: Vec<bool>,
    required_left: usize,
    best_depth: usize,
    best_report: String,
}

impl<'a, M: Model> Search<'a, M> {
    fn new(model: &'a M, ops: &'a [Op<'a>]) -> Self {
        let required_left = ops.iter().filter(|o| o.complete != u64::MAX).count();
        let done = vec![false; ops.len()];
        Search { model, ops, done, required_left, best_depth: 0, best_report: String::new() }
    }

    /// Operations that may come next: not yet linearized and invoked before every
    /// pending required operation completed.
    fn candidates(&self) -> Vec<usize> {
        let bound = (0..self.ops.len())
            .filter(|&i| !self.done[i])
            .map(|i| self.ops[i].complete)
            .min()
            .unwrap_or(u64::MAX);
        (0..self.ops.len())
            .filter(|&i| !self.done[i])
            .take_while(|&i| self.ops[i].rec.invoke_ns <= bound)
            .collect()
    }

    fn run(&mut self) -> Verdict {
        let mut seen: HashSet<(Vec<bool>, M::State)> = HashSet::new();
        let mut stack: Vec<Frame<M::State>> = Vec::new();
        let mut state = self.model.init();
        let mut candidates = self.candidates();
        let mut next = 0;
        let mut steps = 0u64;
        loop {
            if self.required_left == 0 {
                return Verdict::Linearizable;
            }
            steps += 1;
            if steps > BUDGET_STEPS {
                return Verdict::Undecided;
            }
            if let Some((at, s2)) = self.try_from(&state, &candidates, next, &mut seen) {
                let op = candidates[at];
                stack.push(Frame { op, prev: state, candidates, next: at + 1 });
                state = s2;
                candidates = self.candidates();
                next = 0;
                continue;
            }
            self.note_stuck(stack.len(), &state, &candidates);
            let Some(f) = stack.pop() else {
                return Verdict::Violation(self.best_report.clone());
            };
            self.undo(f.op);
            state = f.prev;
            candidates = f.candidates;
            next = f.next;
        }
    }

    /// The first candidate from `next` on that the model accepts in a configuration not
    /// seen before; marks it linearized.
    fn try_from(
        &mut self,
        state: &M::State,
        candidates: &[usize],
        next: usize,
        seen: &mut HashSet<(Vec<bool>, M::State)>,
    ) -> Option<(usize, M::State)> {
        for (at, &c) in candidates.iter().enumerate().skip(next) {
            let op = &self.ops[c];
            let ret = if op.complete == u64::MAX { None } else { op.rec.ret.as_ref() };
            let Some(s2) = self.model.step(state, &op.rec.call, ret) else { continue };
            self.done[c] = true;
            if seen.insert((self.done.clone(), s2.clone())) {
                if op.complete != u64::MAX {
                    self.required_left -= 1;
                }
                return Some((at, s2));
            }
            self.done[c] = false;
        }
        None
    }

    fn undo(&mut self, op: usize) {
        self.done[op] = false;
        if self.ops[op].complete != u64::MAX {
            self.required_left += 1;
        }
    }

    fn note_stuck(&mut self, depth: usize, state: &M::State, candidates: &[usize]) {
        if depth < self.best_depth || !self.best_report.is_empty() && depth == self.best_depth {
            return;
        }
        self.best_depth = depth;
        let shown: Vec<String> = candidates
            .iter()
            .take(6)
            .map(|&c| {
                let r = self.ops[c].rec;
                format!(
                    "client {} {:?} -> {:?} [{:.3}s..{}]",
                    r.client,
                    r.call,
                    r.ret,
                    r.invoke_ns as f64 / 1e9,
                    secs(self.ops[c].complete)
                )
            })
            .collect();
        self.best_report = format!(
            "linearized {depth} of {} operations; in state {state:?} none of these can come next: {}",
            self.ops.len(),
            shown.join("; ")
        );
    }
}

fn secs(ns: u64) -> String {
    if ns == u64::MAX {
        "?".into()
    } else {
        format!("{:.3}s", ns as f64 / 1e9)
    }
}

/// Drops register writes (and compare-and-sets) of unknown outcome whose value nothing
/// observed: no read returned it, no compare-and-set found it or swapped it out. Sound
/// for a register whose writes carry unique values: in any linearization such a write
/// is followed by no observation of it before the next write, so taking it out leaves
/// every observation's state as it was. It keeps the search small when a fault fails
/// many writes with EIO.
pub fn prune_unread_writes<'a>(records: &[&'a Record]) -> Vec<&'a Record> {
    let observed: HashSet<u64> = records
        .iter()
        .filter(|r| r.outcome == Outcome::Ok)
        .filter_map(|r| match (&r.call, &r.ret) {
            (Call::Read | Call::Cas(..), Some(Ret::Value(v))) => Some(*v),
            (Call::Cas(expected, _), Some(Ret::Ok)) => Some(*expected),
            _ => None,
        })
        .collect();
    records
        .iter()
        .copied()
        .filter(|r| match r.call {
            Call::Write(v) | Call::Cas(_, v) => {
                r.outcome != Outcome::Unknown || observed.contains(&v)
            }
            _ => true,
        })
        .collect()
}

/// Splits `records` by key.
pub fn by_key(records: &[Record]) -> BTreeMap<&str, Vec<&Record>> {
    let mut out: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for r in records {
        out.entry(r.key.as_str()).or_default().push(r);
    }
    out
}

#[cfg(test)]
mod tests;
