//! The checker against histories whose verdict is known, good and bad.

use super::*;
use crate::history::{Call, Outcome, Record, Ret};

/// An operation from `t0` to `t1` (in ms; `None`: outcome unknown).
fn op(client: usize, call: Call, ret: Option<Ret>, t0: u64, t1: Option<u64>) -> Record {
    let outcome = if t1.is_some() { Outcome::Ok } else { Outcome::Unknown };
    Record {
        client,
        key: "k".into(),
        call,
        ret,
        outcome,
        invoke_ns: t0 * 1_000_000,
        complete_ns: t1.map_or(u64::MAX, |t| t * 1_000_000),
        error: None,
        opened_ns: None,
    }
}

fn w(client: usize, v: u64, t0: u64, t1: u64) -> Record {
    op(client, Call::Write(v), Some(Ret::Ok), t0, Some(t1))
}

fn r(client: usize, v: u64, t0: u64, t1: u64) -> Record {
    op(client, Call::Read, Some(Ret::Value(v)), t0, Some(t1))
}

fn verdict<M: Model>(m: &M, h: &[Record]) -> Verdict {
    check(m, &h.iter().collect::<Vec<_>>())
}

fn bad<M: Model>(m: &M, h: &[Record]) {
    let v = verdict(m, h);
    assert!(matches!(v, Verdict::Violation(_)), "expected a violation, got {v:?} for {h:#?}");
}

fn good<M: Model>(m: &M, h: &[Record]) {
    assert_eq!(verdict(m, h), Verdict::Linearizable, "{h:#?}");
}

#[test]
fn a_stale_read_after_a_completed_write_is_a_violation() {
    bad(&Register, &[w(0, 1, 0, 10), r(1, 0, 20, 30)]);
}

#[test]
fn a_read_of_a_value_never_written_is_a_violation() {
    bad(&Register, &[w(0, 1, 0, 10), r(1, 7, 20, 30)]);
    bad(&Register, &[op(1, Call::Read, Some(Ret::Garbage("xx".into())), 0, Some(5))]);
}

#[test]
fn a_lost_acknowledged_write_is_a_violation() {
    // 1 then 2 were acknowledged in order; a later read sees 1 again.
    bad(&Register, &[w(0, 1, 0, 10), w(0, 2, 20, 30), r(1, 2, 40, 50), r(1, 1, 60, 70)]);
}

#[test]
fn reads_that_go_back_in_time_are_a_violation() {
    // Two writes overlap; reads may see either, but not 2 then 1 then 2 with no write
    // between them.
    bad(
        &Register,
        &[
            w(0, 1, 0, 100),
            w(1, 2, 0, 100),
            r(2, 2, 110, 120),
            r(2, 1, 130, 140),
            r(3, 2, 150, 160),
        ],
    );
}

#[test]
fn concurrent_reads_may_see_either_value() {
    good(&Register, &[w(0, 1, 0, 100), r(1, 0, 10, 20), r(2, 1, 30, 40), r(1, 1, 50, 60)]);
    good(&Register, &[w(0, 1, 0, 100), w(1, 2, 0, 100), r(2, 1, 110, 120), r(2, 1, 130, 140)]);
}

#[test]
fn a_write_of_unknown_outcome_may_land_late_or_never() {
    let late = [op(0, Call::Write(5), None, 0, None), r(1, 0, 10, 20), r(1, 5, 500, 510)];
    good(&Register, &late);
    let never = [op(0, Call::Write(5), None, 0, None), r(1, 0, 10, 20), r(1, 0, 500, 510)];
    good(&Register, &never);
    // But once seen, it cannot un-happen.
    let flicker = [op(0, Call::Write(5), None, 0, None), r(1, 5, 10, 20), r(1, 0, 500, 510)];
    bad(&Register, &flicker);
}

#[test]
fn failed_operations_are_ignored() {
    let mut failed = w(0, 9, 0, 10);
    failed.outcome = Outcome::Fail;
    good(&Register, &[failed, r(1, 0, 20, 30)]);
}

fn d(client: usize, call: Call, ret: Ret, t0: u64, t1: u64) -> Record {
    op(client, call, Some(ret), t0, Some(t1))
}

#[test]
fn a_name_seen_after_its_unlink_returned_is_a_violation() {
    bad(
        &Directory,
        &[
            d(0, Call::Create(1), Ret::Ok, 0, 10),
            d(0, Call::Unlink(1), Ret::Ok, 20, 30),
            d(1, Call::Stat(1), Ret::Exists, 40, 50),
        ],
    );
}

#[test]
fn two_exclusive_creates_cannot_both_succeed() {
    bad(
        &Directory,
        &[d(0, Call::Create(2), Ret::Ok, 0, 100), d(1, Call::Create(2), Ret::Ok, 0, 100)],
    );
    good(
        &Directory,
        &[d(0, Call::Create(2), Ret::Ok, 0, 100), d(1, Call::Create(2), Ret::Exists, 0, 100)],
    );
}

#[test]
fn a_rename_moves_the_name_atomically() {
    let listing_with_both = [
        d(0, Call::Create(0), Ret::Ok, 0, 10),
        d(0, Call::Rename(0, 3), Ret::Ok, 20, 100),
        d(1, Call::List, Ret::Listing(0b1001), 30, 40),
    ];
    bad(&Directory, &listing_with_both);
    let either = [
        d(0, Call::Create(0), Ret::Ok, 0, 10),
        d(0, Call::Rename(0, 3), Ret::Ok, 20, 100),
        d(1, Call::List, Ret::Listing(0b0001), 30, 40),
        d(1, Call::Stat(3), Ret::Exists, 50, 60),
        d(2, Call::Stat(0), Ret::Missing, 110, 120),
    ];
    good(&Directory, &either);
}

#[test]
fn a_long_history_of_sequential_operations_checks_quickly() {
    let mut h = Vec::new();
    for i in 0..2000u64 {
        h.push(w((i % 3) as usize, i + 1, i * 10, i * 10 + 5));
        h.push(r(((i + 1) % 3) as usize, i + 1, i * 10 + 6, i * 10 + 9));
    }
    good(&Register, &h);
    h.push(r(0, 3, 100_000, 100_001));
    bad(&Register, &h);
}

#[test]
fn pruning_unread_unknown_writes_keeps_the_verdict_and_the_search_small() {
    // 40 overlapping writes that failed with EIO, none of them ever read: without pruning
    // the search would try their orders; with it the history is three operations.
    let mut h: Vec<Record> =
        (0..40).map(|i| op(i, Call::Write(100 + i as u64), None, 10, None)).collect();
    h.push(w(50, 1, 0, 5));
    h.push(r(51, 1, 20, 30));
    h.push(op(52, Call::Write(7), None, 40, None));
    h.push(r(53, 7, 50, 60));
    let all: Vec<&Record> = h.iter().collect();
    let pruned = prune_unread_writes(&all);
    assert_eq!(pruned.len(), 4, "only the read unknown write stays");
    assert_eq!(check(&Register, &pruned), Verdict::Linearizable);
    // A stale read stays a violation after pruning.
    h.push(r(54, 1, 70, 80));
    let all: Vec<&Record> = h.iter().collect();
    assert!(matches!(check(&Register, &prune_unread_writes(&all)), Verdict::Violation(_)));
}

fn cas(client: usize, expected: u64, new: u64, ret: Ret, t0: u64, t1: u64) -> Record {
    op(client, Call::Cas(expected, new), Some(ret), t0, Some(t1))
}

#[test]
fn compare_and_sets_that_swap_in_turn_are_linearizable() {
    good(
        &Register,
        &[
            cas(0, 0, 1, Ret::Ok, 0, 10),
            cas(1, 0, 2, Ret::Value(1), 20, 30),
            cas(1, 1, 2, Ret::Ok, 40, 50),
            r(0, 2, 60, 70),
        ],
    );
    // Two at once: one swaps, the other finds its value.
    good(&Register, &[cas(0, 0, 1, Ret::Ok, 0, 10), cas(1, 0, 2, Ret::Value(1), 0, 10)]);
}

#[test]
fn two_compare_and_sets_of_one_value_that_both_swap_are_a_violation() {
    // What a lock that two mounts both hold looks like: each read 0 and swapped.
    bad(&Register, &[cas(0, 0, 1, Ret::Ok, 0, 10), cas(1, 0, 2, Ret::Ok, 0, 10)]);
    bad(&Register, &[cas(0, 0, 1, Ret::Ok, 0, 10), cas(1, 0, 2, Ret::Ok, 20, 30)]);
}

#[test]
fn a_compare_and_set_that_finds_a_stale_or_the_expected_value_and_fails_is_a_violation() {
    bad(&Register, &[w(0, 1, 0, 10), cas(1, 5, 2, Ret::Value(0), 20, 30)]);
    bad(&Register, &[w(0, 1, 0, 10), cas(1, 1, 2, Ret::Value(1), 20, 30)]);
}

#[test]
fn a_compare_and_set_of_unknown_outcome_may_have_swapped_or_not() {
    let unknown = op(0, Call::Cas(0, 1), None, 0, None);
    good(&Register, &[unknown.clone(), r(1, 1, 20, 30)]);
    good(&Register, &[unknown.clone(), r(1, 0, 20, 30)]);
    // It cannot swap a value it did not find.
    bad(&Register, &[w(1, 5, 0, 10), unknown, r(1, 1, 20, 30)]);
}

#[test]
fn pruning_keeps_the_unknown_writes_a_compare_and_set_observed() {
    let lost = op(0, Call::Write(7), None, 0, None);
    let swapped_out = op(1, Call::Cas(7, 8), Some(Ret::Ok), 20, Some(30));
    let found = op(1, Call::Cas(0, 9), Some(Ret::Value(7)), 20, Some(30));
    for observer in [swapped_out, found] {
        let h = [lost.clone(), observer];
        let refs: Vec<&Record> = h.iter().collect();
        assert_eq!(prune_unread_writes(&refs).len(), 2, "{h:#?}");
        good(&Register, &h);
    }
    let unseen = op(0, Call::Cas(0, 6), None, 0, None);
    let h = [unseen, r(1, 0, 20, 30)];
    let refs: Vec<&Record> = h.iter().collect();
    assert_eq!(prune_unread_writes(&refs).len(), 1);
}
