//! Sequences: `next_sequence` never hands out a number twice.
//!
//! Checked per key on acknowledged allocations (ok [`SequenceOp::Alloc`]):
//!
//! 1. **Well formed**: the range `[start, end)` has exactly `step` numbers.
//! 2. **Disjoint**: no number is in two acknowledged ranges.
//! 3. **Increasing in real time**: an allocation that ended before another
//!    was invoked lies wholly below it (`earlier.end <= later.start`).
//! 4. **Applied once**: from the lowest acknowledged start to the highest
//!    acknowledged end, the numbers in no acknowledged range are no more
//!    than the unanswered (unknown) allocations of the key asked for. An
//!    allocation applied twice (a resend the cluster did not recognise as
//!    one) consumes a range nobody was answered with; an allocation whose
//!    answer was lost is unknown, and may have taken one. The nemesis
//!    reads the counter at the end of the
//!    run (a step-0 allocation, acknowledged like any other), so the last
//!    allocations are covered too.
//!
//! Unknown allocations may or may not have consumed numbers and are not
//! checked themselves; failed ones allocated nothing.

use std::collections::BTreeMap;

use crate::history::{History, Op, Operation, Outcome, SeqRange, SequenceOp};
use crate::order::later_lower;
use crate::verdict::{conclude, Verdict, Violation};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "sequences";

/// Detailed violations collected per rule and key.
const MAX_PER_RULE: usize = 256;

struct Alloc<'h> {
    op: &'h Operation,
    step: u64,
    range: SeqRange,
}

/// Checks rules 1-4 on every sequence key.
pub fn check(history: &History) -> Verdict {
    let mut per_key: BTreeMap<&str, Vec<Alloc>> = BTreeMap::new();
    let mut unanswered: BTreeMap<&str, u64> = BTreeMap::new();
    let mut examined = 0u64;
    for op in history.operations() {
        let Op::Sequence(SequenceOp::Alloc { key, step, range }) = op.op() else {
            continue;
        };
        examined += 1;
        match (op.outcome(), range) {
            (Outcome::Ok, Some(range)) => per_key.entry(key).or_default().push(Alloc {
                op,
                step: *step,
                range: *range,
            }),
            (Outcome::Unknown, _) => {
                let steps = unanswered.entry(key).or_default();
                *steps = steps.saturating_add(*step);
            }
            _ => {}
        }
    }
    let mut violations = Vec::new();
    let mut acked = 0usize;
    for (key, allocs) in &per_key {
        acked += allocs.len();
        well_formed(key, allocs, &mut violations);
        disjoint(key, allocs, &mut violations);
        increasing(key, allocs, &mut violations);
        let unanswered = unanswered.get(key).copied().unwrap_or(0);
        applied_once(key, allocs, unanswered, &mut violations);
    }
    let pass = format!(
        "{acked} acknowledged allocations on {} key(s): disjoint, increasing, each applied once",
        per_key.len()
    );
    conclude(NAME, examined, pass, violations)
}

fn show(r: SeqRange) -> String {
    format!("[{}, {})", r.start, r.end)
}

fn well_formed(key: &str, allocs: &[Alloc], violations: &mut Vec<Violation>) {
    let bad = allocs
        .iter()
        .filter(|a| a.range.end < a.range.start || a.range.end - a.range.start != a.step);
    for a in bad.take(MAX_PER_RULE) {
        violations.push(Violation::new(
            format!(
                "sequence {key:?}: step {} answered with {}",
                a.step,
                show(a.range)
            ),
            a.op.events(),
        ));
    }
}

fn disjoint(key: &str, allocs: &[Alloc], violations: &mut Vec<Violation>) {
    let mut by_start: Vec<&Alloc> = allocs
        .iter()
        .filter(|a| a.range.start < a.range.end)
        .collect();
    by_start.sort_by_key(|a| (a.range.start, a.range.end, a.op.invoke.index));
    // The range reaching furthest so far: any later start below its end
    // overlaps it.
    let mut reach: Option<&Alloc> = None;
    let mut found = 0;
    for b in by_start {
        if let Some(a) = reach {
            if b.range.start < a.range.end {
                let mut events = a.op.events();
                events.extend(b.op.events());
                violations.push(Violation::new(
                    format!(
                        "sequence {key:?}: numbers handed out twice: {} and {}",
                        show(a.range),
                        show(b.range)
                    ),
                    events,
                ));
                found += 1;
                if found >= MAX_PER_RULE {
                    return;
                }
            }
        }
        if reach.is_none_or(|a| b.range.end > a.range.end) {
            reach = Some(b);
        }
    }
}

fn increasing(key: &str, allocs: &[Alloc], violations: &mut Vec<Violation>) {
    let ends: Vec<(&Operation, u64)> = allocs.iter().map(|a| (a.op, a.range.end)).collect();
    let starts: Vec<(&Operation, u64)> = allocs.iter().map(|a| (a.op, a.range.start)).collect();
    for (i, j) in later_lower(&ends, &starts, MAX_PER_RULE) {
        let (Some(a), Some(b)) = (allocs.get(i), allocs.get(j)) else {
            continue;
        };
        let mut events = a.op.events();
        events.extend(b.op.events());
        violations.push(Violation::new(
            format!(
                "sequence {key:?} went back: {} was allocated after {} had been acknowledged",
                show(b.range),
                show(a.range)
            ),
            events,
        ));
    }
}

fn applied_once(key: &str, allocs: &[Alloc], unanswered: u64, violations: &mut Vec<Violation>) {
    // A range that ends before it starts is rule 1's.
    let mut by_start: Vec<&Alloc> = allocs
        .iter()
        .filter(|a| a.range.start <= a.range.end)
        .collect();
    by_start.sort_by_key(|a| (a.range.start, a.range.end, a.op.invoke.index));
    let (Some(lowest), Some(highest)) = (
        by_start.first().map(|a| a.range.start),
        by_start.iter().map(|a| a.range.end).max(),
    ) else {
        return;
    };
    // The numbers no acknowledged range covers (overlaps are rule 2's), and
    // the first hole, between the two answers around it.
    let mut reach = lowest;
    let mut holes = 0u64;
    let mut first: Option<(&Alloc, &Alloc)> = None;
    let mut before: Option<&Alloc> = None;
    for a in &by_start {
        if a.range.start > reach {
            holes = holes.saturating_add(a.range.start - reach);
            if let (None, Some(b)) = (first, before) {
                first = Some((b, a));
            }
        }
        if a.range.end >= reach {
            reach = a.range.end;
            before = Some(a);
        }
    }
    if holes <= unanswered {
        return;
    }
    let Some((below, above)) = first else {
        return;
    };
    let mut events = below.op.events();
    events.extend(above.op.events());
    violations.push(Violation::new(
        format!(
            "sequence {key:?}: {holes} numbers in [{lowest}, {highest}) were answered to nobody, \
             more than the {unanswered} unanswered allocations asked for (the first hole is \
             between {} and {}): an allocation applied more than once?",
            show(below.range),
            show(above.range)
        ),
        events,
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{ops::alloc, HistoryBuilder};

    fn acked(b: &mut HistoryBuilder, p: u64, t: u64, key: &str, step: u64, r: (u64, u64)) {
        b.invoke(p, t, alloc(key, step, None));
        b.ok(p, t + 1, alloc(key, step, Some(r)));
    }

    #[test]
    fn disjoint_increasing_allocations_pass() {
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 10));
        acked(&mut b, 2, 10, "s", 5, (10, 15));
        acked(&mut b, 1, 20, "s", 0, (15, 15));
        acked(&mut b, 1, 30, "s", 5, (15, 20));
        // Another key has its own numbers.
        acked(&mut b, 3, 40, "t", 10, (0, 10));
        // Concurrent allocations may be served in either order.
        b.invoke(1, 50, alloc("s", 5, None));
        b.invoke(2, 51, alloc("s", 5, None));
        b.ok(2, 52, alloc("s", 5, Some((20, 25))));
        b.ok(1, 53, alloc("s", 5, Some((25, 30))));
        // Unknown and failed allocations prove nothing.
        b.invoke(4, 60, alloc("s", 5, None));
        b.unknown(4, 61, alloc("s", 5, None));
        b.invoke(5, 62, alloc("s", 5, None));
        b.fail(5, 63, alloc("s", 5, None));
        let v = check(&b.build().unwrap());
        assert!(v.is_pass(), "{v}");
        assert_eq!(v.ops_checked, 9);
    }

    #[test]
    fn a_number_handed_out_twice_fails() {
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 10));
        acked(&mut b, 1, 10, "s", 10, (10, 20));
        b.invoke(1, 20, alloc("s", 10, None));
        b.invoke(2, 21, alloc("s", 10, None));
        b.ok(1, 22, alloc("s", 10, Some((20, 30))));
        b.ok(2, 23, alloc("s", 10, Some((25, 35))));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
        let idx: Vec<u64> = v.witness.iter().map(|e| e.index).collect();
        assert_eq!(idx, vec![4, 5, 6, 7], "{v}");
        assert!(v.message.contains("handed out twice"), "{v}");
    }

    #[test]
    fn numbers_handed_out_twice_far_apart_fail() {
        let mut b = HistoryBuilder::new();
        b.invoke(9, 0, alloc("s", 100, None));
        b.invoke(2, 1, alloc("s", 1, None));
        for i in 0..10 {
            acked(&mut b, 1, 10 + 10 * i, "s", 1, (100 + i, 101 + i));
        }
        b.ok(2, 600, alloc("s", 1, Some((5, 6))));
        b.ok(9, 700, alloc("s", 100, Some((0, 100))));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
        assert!(v.message.contains("[0, 100) and [5, 6)"), "{v}");
        let idx: Vec<u64> = v.witness.iter().map(|e| e.index).collect();
        assert_eq!(idx, vec![0, 1, 22, 23], "{v}");
    }

    #[test]
    fn going_back_in_real_time_fails() {
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (100, 110));
        acked(&mut b, 2, 10, "s", 10, (0, 10));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
        assert!(v.message.contains("went back"), "{v}");
        assert_eq!(v.witness.len(), 4);
    }

    #[test]
    fn a_range_of_the_wrong_size_fails() {
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 5));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
        assert_eq!(v.witness.len(), 2);
        // One that ends before it starts is reported, not a panic.
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 5, (10, 5));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
    }

    #[test]
    fn numbers_answered_to_nobody_fail_unless_unanswered_allocations_cover_them() {
        // A resend applied twice: [10, 15) went to no answer.
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 10));
        acked(&mut b, 2, 10, "s", 5, (15, 20));
        acked(&mut b, 1, 20, "s", 0, (20, 20));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
        assert!(v.message.contains("5 numbers in [0, 20)"), "{v}");
        assert!(v.message.contains("between [0, 10) and [15, 20)"), "{v}");
        assert_eq!(v.witness.len(), 4, "{v}");

        // The same hole, with an allocation of 5 never answered: it may
        // have taken them.
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 10));
        b.invoke(3, 5, alloc("s", 5, None));
        b.unknown(3, 6, alloc("s", 5, None));
        acked(&mut b, 2, 10, "s", 5, (15, 20));
        let v = check(&b.build().unwrap());
        assert!(v.is_pass(), "{v}");

        // One unanswered step of 2 does not cover a hole of 5; a failed
        // allocation covers nothing.
        let mut b = HistoryBuilder::new();
        acked(&mut b, 1, 0, "s", 10, (0, 10));
        b.invoke(3, 5, alloc("s", 2, None));
        b.unknown(3, 6, alloc("s", 2, None));
        b.invoke(4, 7, alloc("s", 5, None));
        b.fail(4, 8, alloc("s", 5, None));
        acked(&mut b, 2, 10, "s", 5, (15, 20));
        let v = check(&b.build().unwrap());
        assert!(v.is_fail(), "{v}");
    }

    #[test]
    fn overlap_with_an_unknown_allocation_is_not_a_failure() {
        let mut b = HistoryBuilder::new();
        b.invoke(1, 0, alloc("s", 10, None));
        b.unknown(1, 1, alloc("s", 10, None));
        acked(&mut b, 2, 2, "s", 10, (0, 10));
        let v = check(&b.build().unwrap());
        assert!(v.is_pass(), "{v}");
    }
}
