//! Sequences: `next_sequence` never hands out a number twice.
//!
//! Checked per key on acknowledged allocations (ok [`SequenceOp::Alloc`]):
//!
//! 1. **Well formed**: the range `[start, end)` has exactly `step` numbers.
//! 2. **Disjoint**: no number is in two acknowledged ranges.
//! 3. **Increasing in real time**: an allocation that ended before another
//!    was invoked lies wholly below it (`earlier.end <= later.start`).
//!
//! Unknown allocations may or may not have consumed numbers and are not
//! checked; failed ones allocated nothing.

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

/// Checks rules 1-3 on every sequence key.
pub fn check(history: &History) -> Verdict {
    let mut per_key: BTreeMap<&str, Vec<Alloc>> = BTreeMap::new();
    let mut examined = 0u64;
    for op in history.operations() {
        let Op::Sequence(SequenceOp::Alloc { key, step, range }) = op.op() else {
            continue;
        };
        examined += 1;
        if let (Outcome::Ok, Some(range)) = (op.outcome(), range) {
            per_key.entry(key).or_default().push(Alloc {
                op,
                step: *step,
                range: *range,
            });
        }
    }
    let mut violations = Vec::new();
    let mut acked = 0usize;
    for (key, allocs) in &per_key {
        acked += allocs.len();
        well_formed(key, allocs, &mut violations);
        disjoint(key, allocs, &mut violations);
        increasing(key, allocs, &mut violations);
    }
    let pass = format!(
        "{acked} acknowledged allocations on {} key(s): disjoint and increasing",
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
