use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::history::{ops, Event, EventKind, HistoryBuilder, Op};
use crate::Status;

/// How a test operation ends.
#[derive(Clone)]
enum End {
    Ok(Op),
    Fail,
    Unknown,
    Pending,
}

/// One operation of a hand-made history: process, invocation and
/// completion times, the invoked op and how it ended.
#[derive(Clone)]
struct Spec {
    p: u64,
    start: u64,
    end: u64,
    op: Op,
    result: End,
}

impl Spec {
    fn unknown(mut self) -> Spec {
        self.result = End::Unknown;
        self
    }
    fn fail(mut self) -> Spec {
        self.result = End::Fail;
        self
    }
    fn pending(mut self) -> Spec {
        self.result = End::Pending;
        self
    }
}

fn write(p: u64, start: u64, end: u64, key: &str, v: &str) -> Spec {
    Spec {
        p,
        start,
        end,
        op: ops::write(key, v),
        result: End::Ok(ops::write(key, v)),
    }
}

fn read(p: u64, start: u64, end: u64, key: &str, v: Option<&str>) -> Spec {
    Spec {
        p,
        start,
        end,
        op: ops::read(key, None),
        result: End::Ok(ops::read(key, v)),
    }
}

#[allow(clippy::too_many_arguments)]
fn cas(p: u64, start: u64, end: u64, key: &str, exp: Option<&str>, new: &str, ok: bool) -> Spec {
    Spec {
        p,
        start,
        end,
        op: ops::cas(key, exp, new, None),
        result: End::Ok(ops::cas(key, exp, new, Some(ok))),
    }
}

/// Events in time order (invocations first at equal times), numbered.
fn history(specs: &[Spec]) -> History {
    let mut events: Vec<(u64, u8, usize, u64, EventKind, Op)> = Vec::new();
    for (i, s) in specs.iter().enumerate() {
        events.push((s.start, 0, i, s.p, EventKind::Invoke, s.op.clone()));
        let completion = match &s.result {
            End::Ok(op) => Some((EventKind::Ok, op.clone())),
            End::Fail => Some((EventKind::Fail, s.op.clone())),
            End::Unknown => Some((EventKind::Unknown, s.op.clone())),
            End::Pending => None,
        };
        if let Some((kind, op)) = completion {
            events.push((s.end, 1, i, s.p, kind, op));
        }
    }
    events.sort_by_key(|e| (e.0, e.1, e.2));
    let mut b = HistoryBuilder::new();
    for (time, _, _, p, kind, op) in events {
        b.push(p, time, kind, op);
    }
    b.build().expect("well-formed test history")
}

/// The (process, kind) of each witness event, in order.
fn shape(witness: &[Event]) -> Vec<(u64, EventKind)> {
    witness.iter().map(|e| (e.process, e.kind)).collect()
}

fn assert_pass(specs: &[Spec]) {
    let v = check(&history(specs));
    assert_eq!(v.status, Status::Pass, "{v}");
    assert!(v.witness.is_empty());
}

fn assert_fail(specs: &[Spec]) -> Verdict {
    let v = check(&history(specs));
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(!v.witness.is_empty(), "{v}");
    v
}

use EventKind::{Invoke as I, Ok as K, Unknown as U};

#[test]
fn a_sequential_history_passes() {
    assert_pass(&[
        read(1, 0, 1, "x", None),
        write(1, 2, 3, "x", "1"),
        read(2, 4, 5, "x", Some("1")),
        cas(3, 6, 7, "x", Some("1"), "2", true),
        cas(1, 8, 9, "x", Some("1"), "3", false),
        read(2, 10, 11, "x", Some("2")),
        cas(3, 12, 13, "y", None, "a", true),
        read(2, 14, 15, "y", Some("a")),
    ]);
}

#[test]
fn no_register_operations_passes() {
    let v = check(&History::default());
    assert!(v.is_pass());
    assert_eq!(v.ops_checked, 0);
}

#[test]
fn a_stale_read_after_a_completed_write_fails() {
    let v = assert_fail(&[
        write(1, 0, 10, "x", "1"),
        write(1, 20, 30, "x", "2"),
        read(2, 40, 50, "x", Some("1")),
    ]);
    // The second write and the stale read; the first write is not needed.
    assert_eq!(shape(&v.witness), vec![(1, I), (1, K), (2, I), (2, K)]);
    assert_eq!(v.witness[0].op, ops::write("x", "2"));
    assert!(v.message.contains("\"x\""), "{v}");
}

#[test]
fn a_lost_write_fails() {
    let v = assert_fail(&[write(1, 0, 10, "x", "1"), read(2, 20, 30, "x", None)]);
    assert_eq!(shape(&v.witness), vec![(1, I), (1, K), (2, I), (2, K)]);
}

#[test]
fn a_write_lost_after_being_read_fails() {
    let v = assert_fail(&[
        write(1, 0, 10, "x", "1"),
        read(2, 20, 30, "x", Some("1")),
        write(1, 40, 50, "x", "2"),
        read(2, 60, 70, "x", Some("2")),
        read(3, 80, 90, "x", Some("1")),
    ]);
    // Two reads suffice: 2, then 1 again with no write in between.
    assert_eq!(
        shape(&v.witness),
        vec![(2, I), (2, K), (3, I), (3, K)],
        "{v}"
    );
    assert_eq!(v.witness[1].op, ops::read("x", Some("2")));
    assert_eq!(v.witness[3].op, ops::read("x", Some("1")));
}

#[test]
fn a_cas_that_succeeds_twice_from_the_same_value_fails() {
    let v = assert_fail(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 30, "x", Some("0"), "1", true),
        cas(3, 40, 50, "x", Some("0"), "2", true),
    ]);
    assert_eq!(shape(&v.witness), vec![(2, I), (2, K), (3, I), (3, K)]);
}

#[test]
fn two_concurrent_cas_from_the_same_value_cannot_both_succeed() {
    let v = assert_fail(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 50, "x", Some("0"), "1", true),
        cas(3, 25, 45, "x", Some("0"), "2", true),
    ]);
    let procs: Vec<u64> = v.witness.iter().map(|e| e.process).collect();
    assert!(procs.contains(&2) && procs.contains(&3), "{v}");
}

#[test]
fn a_cas_reporting_a_mismatch_on_a_match_fails() {
    assert_fail(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 30, "x", Some("0"), "1", false),
    ]);
}

#[test]
fn an_unknown_write_observed_later_passes() {
    assert_pass(&[
        write(1, 0, 10, "x", "1").unknown(),
        read(2, 20, 30, "x", Some("1")),
    ]);
    // It may take effect long after its unknown completion.
    assert_pass(&[
        write(1, 0, 10, "x", "1").unknown(),
        read(2, 20, 30, "x", None),
        read(2, 40, 50, "x", None),
        read(3, 60, 70, "x", Some("1")),
    ]);
}

#[test]
fn an_unknown_write_never_observed_passes() {
    assert_pass(&[
        write(1, 0, 10, "x", "1").unknown(),
        read(2, 20, 30, "x", None),
        write(2, 40, 50, "x", "2"),
        read(3, 60, 70, "x", Some("2")),
    ]);
    assert_pass(&[
        write(1, 0, 10, "x", "1").pending(),
        read(2, 20, 30, "x", None),
    ]);
}

#[test]
fn an_unknown_write_cannot_take_effect_twice() {
    let v = assert_fail(&[
        write(1, 0, 10, "x", "1").unknown(),
        read(2, 20, 30, "x", Some("1")),
        write(3, 40, 50, "x", "2"),
        read(2, 60, 70, "x", Some("1")),
    ]);
    // The unknown write stays in the witness: it explains one read of 1,
    // not both.
    assert_eq!(
        shape(&v.witness),
        vec![
            (1, I),
            (1, U),
            (2, I),
            (2, K),
            (3, I),
            (3, K),
            (2, I),
            (2, K)
        ],
        "{v}"
    );
}

#[test]
fn an_unknown_cas_is_handled_both_ways() {
    assert_pass(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 30, "x", Some("0"), "1", true).unknown(),
        read(3, 40, 50, "x", Some("1")),
    ]);
    assert_pass(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 30, "x", Some("0"), "1", true).unknown(),
        read(3, 40, 50, "x", Some("0")),
    ]);
    // Once seen applied it cannot be undone.
    let v = assert_fail(&[
        write(1, 0, 10, "x", "0"),
        cas(2, 20, 30, "x", Some("0"), "1", true).unknown(),
        read(3, 40, 50, "x", Some("1")),
        read(3, 60, 70, "x", Some("0")),
    ]);
    // The unknown CAS stays: the witness reads what it would write.
    assert_eq!(
        shape(&v.witness),
        vec![(2, I), (2, U), (3, I), (3, K), (3, I), (3, K)],
        "{v}"
    );
}

#[test]
fn a_failed_write_has_no_effect() {
    assert_pass(&[write(1, 0, 10, "x", "1").fail(), read(2, 20, 30, "x", None)]);
    let v = assert_fail(&[
        write(1, 0, 10, "x", "1").fail(),
        read(2, 20, 30, "x", Some("1")),
    ]);
    // The failed write is dropped: the read alone cannot be explained.
    assert_eq!(shape(&v.witness), vec![(2, I), (2, K)]);
}

#[test]
fn unknown_reads_are_dropped() {
    assert_pass(&[
        write(1, 0, 10, "x", "1"),
        read(2, 20, 30, "x", Some("1")).unknown(),
        read(3, 40, 50, "x", None).pending(),
    ]);
}

#[test]
fn concurrent_operations_linearizable_in_one_order_only_pass() {
    // Only absent, write 1, read 1, write 2, read 2 works.
    assert_pass(&[
        write(1, 0, 100, "x", "1"),
        write(4, 5, 90, "x", "2"),
        read(2, 10, 20, "x", None),
        read(3, 30, 40, "x", Some("1")),
        read(5, 50, 60, "x", Some("2")),
    ]);
}

#[test]
fn values_that_flip_back_without_a_write_fail() {
    let v = assert_fail(&[
        write(1, 0, 100, "x", "1"),
        write(4, 5, 90, "x", "2"),
        read(2, 30, 40, "x", Some("2")),
        read(3, 50, 60, "x", Some("1")),
        read(5, 70, 80, "x", Some("2")),
    ]);
    // Every event of the three reads is needed; the writes are in flight.
    assert!(v.witness.len() <= 10, "{v}");
}

#[test]
fn keys_are_checked_independently_and_the_witness_keeps_to_one_key() {
    let v = assert_fail(&[
        write(1, 0, 10, "a", "1"),
        write(2, 1, 11, "b", "1"),
        read(1, 20, 30, "a", Some("1")),
        read(2, 21, 31, "b", Some("2")),
        read(3, 22, 32, "a", Some("1")),
    ]);
    for e in &v.witness {
        let Op::Register(
            crate::history::RegisterOp::Read { key, .. }
            | crate::history::RegisterOp::Write { key, .. },
        ) = &e.op
        else {
            panic!("unexpected witness op {e}");
        };
        assert_eq!(key, "b", "{v}");
    }
    assert_eq!(v.ops_checked, 5);
}

#[test]
fn the_witness_of_a_long_history_is_short() {
    let mut specs = Vec::new();
    for i in 0..200u64 {
        let t = i * 100;
        specs.push(write(1 + i % 3, t, t + 50, "x", &i.to_string()));
        specs.push(read(4 + i % 2, t + 60, t + 90, "x", Some(&i.to_string())));
    }
    // A stale read at the end.
    specs.push(read(9, 30_000, 30_010, "x", Some("150")));
    let v = assert_fail(&specs);
    // The last read of 199 and the stale read.
    assert_eq!(v.witness.len(), 4, "{v}");
    assert_eq!(v.witness[1].op, ops::read("x", Some("199")));
    assert_eq!(v.witness[3].process, 9);
}

#[test]
fn an_exhausted_budget_is_inconclusive_not_a_pass() {
    let specs: Vec<Spec> = (0..20)
        .map(|i| write(i, i, 100 + i, "x", &i.to_string()))
        .chain([read(30, 200, 210, "x", Some("7"))])
        .collect();
    let h = history(&specs);
    let v = check_with(&h, Options { max_steps: 5 });
    assert_eq!(v.status, Status::Inconclusive, "{v}");
    assert!(check(&h).is_pass());
}

#[test]
fn a_failure_on_one_key_wins_over_an_exhausted_one() {
    let mut specs: Vec<Spec> = (0..20)
        .map(|i| write(i, i, 100 + i, "big", &i.to_string()))
        .collect();
    specs.push(write(40, 0, 1, "small", "1"));
    specs.push(read(41, 2, 3, "small", None));
    let v = check_with(&history(&specs), Options { max_steps: 40 });
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("exhausted"), "{v}");
}

// ---- generated histories -------------------------------------------------

/// One generated operation: key, kind (read/write/cas), value, expected
/// value (4 = absent), how far its invocation and completion lie from its
/// linearization point, and its outcome.
type Gen = (u8, u8, u8, u8, u64, u64, u8);

fn gen_op() -> impl Strategy<Value = Gen> {
    (
        0u8..2,
        0u8..3,
        0u8..3,
        0u8..5,
        0u64..400,
        0u64..400,
        0u8..12,
    )
}

/// Runs the generated operations against a real register, each taking
/// effect at its own instant, and records what clients would have seen.
fn reference_history(gen: &[Gen], sequential: bool) -> History {
    let mut regs: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut specs = Vec::new();
    // When each process is next free (None: stuck in a pending op).
    let mut free_at: Vec<Option<u64>> = Vec::new();
    for (i, &(k, kind, v, e, before, after, outcome)) in gen.iter().enumerate() {
        let key = format!("k{k}");
        let value = v.to_string();
        let expected = (e < 3).then(|| e.to_string());
        let at = 1_000 + 100 * i as u64;
        let (start, end) = if sequential {
            (at - 10, at + 10)
        } else {
            (at - before, at + after)
        };
        // 0: fail (no effect); 1: unknown, applied; 2: unknown, not
        // applied; 3: pending, applied; else ok.
        let (applied, result) = match outcome {
            0 if !sequential => (false, End::Fail),
            1 if !sequential => (true, End::Unknown),
            2 if !sequential => (false, End::Unknown),
            3 if !sequential => (true, End::Pending),
            _ => (true, End::Ok(ops::read("", None))),
        };
        let reg = regs.entry(key.clone()).or_default();
        let (op, ok_op) = match kind {
            0 => (ops::read(&key, None), ops::read(&key, reg.as_deref())),
            1 => {
                if applied {
                    *reg = Some(value.clone());
                }
                (ops::write(&key, &value), ops::write(&key, &value))
            }
            _ => {
                let swapped = *reg == expected;
                if applied && swapped {
                    *reg = Some(value.clone());
                }
                (
                    ops::cas(&key, expected.as_deref(), &value, None),
                    ops::cas(&key, expected.as_deref(), &value, Some(swapped)),
                )
            }
        };
        let result = match result {
            End::Ok(_) => End::Ok(ok_op),
            other => other,
        };
        let p = match free_at.iter().position(|f| f.is_some_and(|f| f < start)) {
            Some(p) => p,
            None => {
                free_at.push(None);
                free_at.len() - 1
            }
        };
        free_at[p] = match result {
            End::Pending => None,
            _ => Some(end),
        };
        specs.push(Spec {
            p: p as u64,
            start,
            end,
            op,
            result,
        });
    }
    history(&specs)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn histories_of_a_real_register_pass(gen in proptest::collection::vec(gen_op(), 1..40)) {
        let h = reference_history(&gen, false);
        let v = check(&h);
        prop_assert_eq!(v.status, Status::Pass, "{}\n{}", v, h.to_json_lines());
    }

    #[test]
    fn a_sequential_history_with_one_wrong_read_fails(
        gen in proptest::collection::vec(gen_op(), 1..30),
        pick in any::<proptest::sample::Index>(),
    ) {
        // Always at least one read.
        let mut gen = gen;
        gen.push((0, 0, 0, 0, 0, 0, 11));
        let h = reference_history(&gen, true);
        let reads: Vec<usize> = h
            .events()
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == EventKind::Ok && matches!(e.op, Op::Register(crate::history::RegisterOp::Read { .. })))
            .map(|(i, _)| i)
            .collect();
        let mut events = h.events().to_vec();
        let target = reads[pick.index(reads.len())];
        if let Op::Register(crate::history::RegisterOp::Read { value, .. }) = &mut events[target].op {
            *value = Some("corrupt".to_owned());
        }
        let bad = History::new(events).expect("still well formed");
        let v = check(&bad);
        prop_assert_eq!(v.status, Status::Fail, "{}", v);
        prop_assert!(v.witness.iter().any(|e| e.index == target as u64), "{}", v);
    }
}

/// Is there a linearization? By brute force over every order and every
/// subset of unknown operations: an oracle for tiny histories.
fn brute_force(
    ops: &[search::SearchOp<register::RegStep>],
    state: u32,
    done: &mut Vec<bool>,
) -> bool {
    let definite_left = ops
        .iter()
        .zip(done.iter())
        .any(|(op, d)| !d && op.ret.is_some());
    if !definite_left {
        return true;
    }
    for (i, op) in ops.iter().enumerate() {
        if done[i] {
            continue;
        }
        // Everything still pending must not have returned before this call.
        let blocked = ops
            .iter()
            .zip(done.iter())
            .any(|(p, d)| !d && p.ret.is_some_and(|r| r < op.call));
        if blocked {
            continue;
        }
        done[i] = true;
        if let Some(next) = register::step(state, &op.step) {
            if brute_force(ops, next, done) {
                done[i] = false;
                return true;
            }
        }
        if (op.ret.is_none() || op.skippable) && brute_force(ops, state, done) {
            done[i] = false;
            return true;
        }
        done[i] = false;
    }
    false
}

/// A random operation, not from any real register: key-less (one key),
/// kind, value, expected, start, length, outcome.
fn arbitrary_op() -> impl Strategy<Value = (u8, u8, u8, u64, u64, u8)> {
    (0u8..3, 0u8..3, 0u8..4, 0u64..60, 1u64..40, 0u8..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn the_search_agrees_with_brute_force(
        raw in proptest::collection::vec(arbitrary_op(), 1..8),
        skippable in proptest::collection::vec(any::<bool>(), 8),
        from_any in any::<bool>(),
    ) {
        let specs: Vec<Spec> = raw
            .iter()
            .enumerate()
            .map(|(i, &(kind, v, e, start, len, outcome))| {
                let value = v.to_string();
                let expected = (e < 3).then(|| e.to_string());
                let read_value = (v < 2).then(|| value.clone());
                let (op, ok) = match kind {
                    0 => (ops::read("x", None), ops::read("x", read_value.as_deref())),
                    1 => (ops::write("x", &value), ops::write("x", &value)),
                    _ => (
                        ops::cas("x", expected.as_deref(), &value, None),
                        ops::cas("x", expected.as_deref(), &value, Some(outcome % 2 == 0)),
                    ),
                };
                let result = match outcome {
                    0 | 1 => End::Unknown,
                    _ => End::Ok(ok),
                };
                Spec { p: i as u64, start, end: start + len, op, result }
            })
            .collect();
        let h = history(&specs);
        let keys = register::per_key(&h);
        for key in keys.values() {
            let (mut search_ops, _) = window::Window::full(key).search_ops(key);
            // Also exercise what windows use: skippable operations and an
            // unconstrained start.
            for (op, s) in search_ops.iter_mut().zip(&skippable) {
                op.skippable = *s && op.ret.is_some();
            }
            let initial = if from_any { register::ANY } else { register::ABSENT };
            let expected = brute_force(&search_ops, initial, &mut vec![false; search_ops.len()]);
            let got = search::search(&register::Register, &search_ops, initial, 1_000_000);
            prop_assert_eq!(
                got == search::SearchResult::Linearizable,
                expected,
                "search said {:?}\n{}",
                got,
                h.to_json_lines()
            );
            prop_assert!(got != search::SearchResult::Exhausted);
        }
    }
}

/// A register history as a harness would record it: unique values, CAS
/// with the current or an older expected value, ~5 operations in flight,
/// `unknown_pct` percent of operations unknown (applied or not). Returns
/// the specs and, for some acknowledged reads, a value 20 writes older
/// than the one they returned (to plant a stale read).
fn harness_like(n: u64, unknown_pct: u64, seed: u64) -> (Vec<Spec>, Vec<(usize, String)>) {
    let mut x = seed;
    let mut rnd = |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let mut reg: Option<String> = None;
    let mut written: Vec<String> = Vec::new();
    let mut specs = Vec::new();
    let mut stale = Vec::new();
    let mut free_at: Vec<u64> = Vec::new();
    for i in 0..n {
        let at = 10_000 + 100 * i;
        let (start, end) = (at - rnd(300), at + rnd(300));
        let unknown = rnd(100) < unknown_pct;
        let applied = !unknown || rnd(2) == 0;
        let value = format!("v{i}");
        let (op, ok) = match rnd(3) {
            0 => {
                if !unknown && written.len() > 20 {
                    stale.push((specs.len(), written[written.len() - 20].clone()));
                }
                (ops::read("x", None), ops::read("x", reg.as_deref()))
            }
            1 => {
                if applied {
                    reg = Some(value.clone());
                    written.push(value.clone());
                }
                (ops::write("x", &value), ops::write("x", &value))
            }
            _ => {
                let expected = if rnd(2) == 0 {
                    reg.clone()
                } else {
                    written.get(rnd(written.len() as u64 + 1) as usize).cloned()
                };
                let swapped = reg == expected;
                if applied && swapped {
                    reg = Some(value.clone());
                    written.push(value.clone());
                }
                (
                    ops::cas("x", expected.as_deref(), &value, None),
                    ops::cas("x", expected.as_deref(), &value, Some(swapped)),
                )
            }
        };
        let p = match free_at.iter().position(|f| *f < start) {
            Some(p) => p,
            None => {
                free_at.push(0);
                free_at.len() - 1
            }
        };
        free_at[p] = end;
        let result = if unknown { End::Unknown } else { End::Ok(ok) };
        specs.push(Spec {
            p: p as u64,
            start,
            end,
            op,
            result,
        });
    }
    (specs, stale)
}

#[test]
fn a_long_history_full_of_unknowns_passes_and_its_stale_read_fails_shortly() {
    let (specs, stale) = harness_like(2_000, 20, 12345);
    assert_pass(&specs);
    let mut bad = specs.clone();
    let (i, old) = stale[stale.len() / 2].clone();
    bad[i].result = End::Ok(ops::read("x", Some(&old)));
    let v = assert_fail(&bad);
    assert!(v.witness.len() <= 12, "{v}");
    assert!(
        v.witness
            .iter()
            .any(|e| e.process == bad[i].p && e.op == ops::read("x", Some(&old))),
        "{v}"
    );
}
