//! The checkers together, on one history holding every workload, read
//! from JSON lines as the harness will write them.

use latchkey_check::history::{ops, ChurnRole};
use latchkey_check::{check_all, History, HistoryBuilder, Status, Verdict};

/// A run with every workload, all correct.
fn correct_run() -> HistoryBuilder {
    let mut h = HistoryBuilder::new();
    let mut t = 0;
    let mut at = || {
        t += 10;
        t
    };
    // Lock workload.
    h.invoke(1, at(), ops::acquire("L", "s1", None));
    h.ok(1, at(), ops::acquire("L", "s1", Some(1)));
    h.ok(1, at(), ops::hold_start("L", "s1", 1));
    h.invoke(1, at(), ops::kv_write("L", "guarded", "s1", 1, None));
    h.ok(1, at(), ops::kv_write("L", "guarded", "s1", 1, Some(true)));
    h.ok(1, at(), ops::hold_end("L", "s1", 1));
    // Register workload.
    h.invoke(2, at(), ops::write("r", "1"));
    h.invoke(3, at(), ops::read("r", None));
    h.ok(2, at(), ops::write("r", "1"));
    h.ok(3, at(), ops::read("r", None));
    h.invoke(3, at(), ops::cas("r", Some("1"), "2", None));
    h.unknown(3, at(), ops::cas("r", Some("1"), "2", None));
    // Sequence workload.
    h.invoke(4, at(), ops::alloc("ids", 10, None));
    h.ok(4, at(), ops::alloc("ids", 10, Some((0, 10))));
    h.invoke(4, at(), ops::alloc("ids", 10, None));
    h.ok(4, at(), ops::alloc("ids", 10, Some((10, 20))));
    // Durability workload, then the read-all after the full restart.
    h.invoke(5, at(), ops::put("d", "d1"));
    h.ok(5, at(), ops::put("d", "d1"));
    h.invoke(6, at(), ops::read_all(None));
    h.ok(6, at(), ops::read_all(Some(&[("d", "d1")])));
    // Watch workload: a watcher lists, watches, and receives a write.
    h.invoke(8, at(), ops::watch_list(None));
    h.ok(8, at(), ops::watch_list(Some((30, &[]))));
    h.ok(8, at(), ops::watch_open(31));
    h.invoke(9, at(), ops::watch_write(&[("w/a", Some("1"))], None));
    h.ok(9, at(), ops::watch_write(&[("w/a", Some("1"))], Some(31)));
    h.ok(8, at(), ops::watch_changes(31, &[("w/a", Some("1"))]));
    // Semaphore workload: a permit and a write it fences.
    h.invoke(10, at(), ops::permit("S", 2, "s10", None));
    h.ok(10, at(), ops::permit("S", 2, "s10", Some(40)));
    h.invoke(10, at(), ops::permit_write("S", "sem/a", "s10", 40, None));
    h.ok(
        10,
        at(),
        ops::permit_write("S", "sem/a", "s10", 40, Some(true)),
    );
    // Election observers: one is told of a campaign's term.
    h.ok(11, at(), ops::observed("E", None, false));
    h.invoke(12, at(), ops::acquire("E", "s12", None));
    h.ok(12, at(), ops::acquire("E", "s12", Some(41)));
    h.ok(11, at(), ops::observed("E", Some(41), false));
    // The leader-churn phase, in seconds: the holder (TTL 5 s) dies at
    // 3 s, the leader is killed at 4 s and ready at 5 s, the waiter is
    // granted at 9 s: 1 s past the TTL, within the bound (2.5 + 0.5 + 1 +
    // 1 s).
    let s = |x: f64| (x * 1e9) as u64;
    let (holder, waiter) = (ChurnRole::Holder, ChurnRole::Waiter);
    let lock = "churn/abandoned";
    h.invoke(
        13,
        s(1.0),
        ops::churn_acquire(lock, "h", holder, 5_000, None),
    );
    h.ok(
        13,
        s(1.1),
        ops::churn_acquire(lock, "h", holder, 5_000, Some(50)),
    );
    h.ok(13, s(2.0), ops::churn_vouched(lock, "h", s(6.5)));
    h.invoke(
        14,
        s(2.2),
        ops::churn_acquire(lock, "w", waiter, 10_000, None),
    );
    h.ok(0, s(3.0), ops::churn_holder_killed(lock, "h"));
    h.ok(0, s(4.0), ops::churn_leader_killed(1, 3));
    h.ok(0, s(5.0), ops::churn_leader_ready(2, 4));
    h.ok(
        14,
        s(9.0),
        ops::churn_acquire(lock, "w", waiter, 10_000, Some(51)),
    );
    h
}

/// Later than every event of [`correct_run`].
const AFTER: u64 = 100_000_000_000;

fn statuses(verdicts: &[Verdict]) -> Vec<(&str, Status)> {
    verdicts
        .iter()
        .map(|v| (v.name.as_str(), v.status))
        .collect()
}

#[test]
fn a_correct_run_passes_every_checker() {
    let history = correct_run().build().unwrap();
    let text = history.to_json_lines();
    let parsed = History::from_json_lines(&text).unwrap();
    assert_eq!(parsed, history);
    let verdicts = check_all(&parsed);
    assert_eq!(
        statuses(&verdicts),
        vec![
            ("lock safety", Status::Pass),
            ("linearizability", Status::Pass),
            ("sequences", Status::Pass),
            ("durability", Status::Pass),
            ("watch", Status::Pass),
            ("semaphores", Status::Pass),
            ("election observers", Status::Pass),
            ("abandoned lock", Status::Pass),
        ],
        "{verdicts:?}"
    );
    for v in &verdicts {
        assert!(v.ops_checked > 0, "{v}");
    }
}

#[test]
fn each_checker_reads_only_its_own_workload() {
    let mut h = correct_run();
    // A lost write on the register, and nothing else wrong.
    h.invoke(7, AFTER, ops::read("r", None));
    h.ok(7, AFTER + 10, ops::read("r", None));
    let verdicts = check_all(&h.build().unwrap());
    assert_eq!(
        statuses(&verdicts),
        vec![
            ("lock safety", Status::Pass),
            ("linearizability", Status::Fail),
            ("sequences", Status::Pass),
            ("durability", Status::Pass),
            ("watch", Status::Pass),
            ("semaphores", Status::Pass),
            ("election observers", Status::Pass),
            ("abandoned lock", Status::Pass),
        ],
        "{verdicts:?}"
    );
}

#[test]
fn verdicts_serialize_for_the_report() {
    let mut h = correct_run();
    h.invoke(4, AFTER, ops::alloc("ids", 10, None));
    h.ok(4, AFTER + 10, ops::alloc("ids", 10, Some((5, 15))));
    let verdicts = check_all(&h.build().unwrap());
    let seq = &verdicts[2];
    assert_eq!(seq.status, Status::Fail);
    let json = serde_json::to_string(seq).unwrap();
    let back: Verdict = serde_json::from_str(&json).unwrap();
    assert_eq!(&back, seq);
    // The human form lists the witness.
    let text = seq.to_string();
    assert!(text.starts_with("FAIL sequences"), "{text}");
    assert!(
        text.contains("next_sequence \"ids\" step 10 -> [5, 15)"),
        "{text}"
    );
}
