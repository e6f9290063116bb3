use super::*;
use crate::history::ops::{
    churn_acquire, churn_holder_killed, churn_leader_killed, churn_leader_ready, churn_skipped,
    churn_vouched,
};
use crate::history::HistoryBuilder;
use crate::Status;

const S: u64 = 1_000_000_000;
const MS_: u64 = 1_000_000;
const LOCK: &str = "churn/abandoned";
const TTL_MS: u64 = 5_000;

/// A phase: the holder granted at 1.1 s, its client vouching for its lease
/// until `vouched` (ms), killed at 3 s; the waiter queued at 2.2 s; leaders
/// killed and ready again at `kills` (ms pairs); the waiter's attempt ends
/// at `end` (ms): granted `token`, or unknown (`None`).
struct Phase {
    vouched: u64,
    kills: Vec<(u64, u64)>,
    end: u64,
    token: Option<u64>,
    skipped: Option<&'static str>,
    /// From one killed leader's term to the next's (1: no change between).
    term_step: u64,
}

impl Phase {
    fn normal() -> Phase {
        Phase {
            vouched: 6_500,
            kills: vec![(4_000, 5_500), (7_000, 8_000), (10_000, 11_200)],
            end: 12_000,
            token: Some(8),
            skipped: None,
            term_step: 1,
        }
    }

    fn build(&self) -> History {
        let mut events: Vec<(u64, u64, EventKindOp)> = vec![
            (1_000, 1, EventKindOp::Invoke(holder(None))),
            (1_100, 1, EventKindOp::Ok(holder(Some(7)))),
            (
                2_000,
                1,
                EventKindOp::Ok(churn_vouched(LOCK, "h", self.vouched * MS_)),
            ),
            (2_200, 2, EventKindOp::Invoke(waiter(None))),
            (3_000, 0, EventKindOp::Ok(churn_holder_killed(LOCK, "h"))),
        ];
        for (n, &(kill, ready)) in self.kills.iter().enumerate() {
            let term = 10 + n as u64 * self.term_step;
            events.push((kill, 0, EventKindOp::Ok(churn_leader_killed(1, term))));
            events.push((ready, 0, EventKindOp::Ok(churn_leader_ready(2, term + 1))));
        }
        if let Some(reason) = self.skipped {
            events.push((3_500, 0, EventKindOp::Ok(churn_skipped(reason))));
        }
        events.push((
            self.end,
            2,
            match self.token {
                Some(t) => EventKindOp::Ok(waiter(Some(t))),
                None => EventKindOp::Unknown(waiter(None)),
            },
        ));
        events.sort_by_key(|(t, _, _)| *t);
        let mut b = HistoryBuilder::new();
        for (t, p, e) in events {
            match e {
                EventKindOp::Invoke(op) => b.invoke(p, t * MS_, op),
                EventKindOp::Ok(op) => b.ok(p, t * MS_, op),
                EventKindOp::Unknown(op) => b.unknown(p, t * MS_, op),
            };
        }
        b.build().unwrap()
    }
}

enum EventKindOp {
    Invoke(Op),
    Ok(Op),
    Unknown(Op),
}

fn holder(token: Option<u64>) -> Op {
    churn_acquire(LOCK, "h", ChurnRole::Holder, TTL_MS, token)
}

fn waiter(token: Option<u64>) -> Op {
    churn_acquire(LOCK, "w", ChurnRole::Waiter, 10_000, token)
}

#[test]
fn freed_within_the_bound_passes_with_the_numbers() {
    let h = Phase::normal().build();
    let m = measure(&h).unwrap();
    // Freed 9 s after the kill at 3 s: 4 s past the TTL.
    assert_eq!(m.extension_ns, Some(4 * S as i64));
    assert_eq!(m.leader_changes, 3);
    assert_eq!(m.leaderless_ns, 3_700 * MS_);
    // 2.5 s + 3 × 0.5 s + 3.7 s + 1 s.
    assert_eq!(m.bound_ns, 8_700 * MS_);
    assert_eq!(m.leak_after_ns, 3 * 8_700 * MS_ + 10 * S);
    assert_eq!(m.past_vouched_ns, Some(5_500 * MS_ as i64));
    assert!(m.within_bound());
    let v = check(&h);
    assert_eq!(v.status, Status::Pass, "{v}");
    assert!(v.message.contains("within the bound 8.70 s"), "{v}");
    assert!(v.notes[0].contains("extension 4.00 s"), "{v}");
    assert!(v.notes[0].contains("3 leader change(s), 3.70 s without a ready leader"));
    assert_eq!(v.notes.len(), 1);
}

#[test]
fn over_the_bound_but_not_leaked_passes_with_a_note() {
    let mut p = Phase::normal();
    p.end = 18_700;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Pass, "{v}");
    assert!(v.message.contains("OVER the bound"), "{v}");
    assert!(
        v.notes[1].contains("over the documented bound by 2.00 s"),
        "{v}"
    );
}

#[test]
fn a_grant_past_three_bounds_and_ten_seconds_is_a_leak() {
    let mut p = Phase::normal();
    // Leak past 3 + 5 + 36.1 = 44.1 s.
    p.end = 44_000;
    assert_eq!(check(&p.build()).status, Status::Pass);
    p.end = 44_200;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("leaked"), "{v}");
    assert!(!v.witness.is_empty());
    assert!(v.notes[0].contains("bound 8.70 s"), "{v}");
}

#[test]
fn never_granted_fails_only_once_the_waiter_waited_past_the_leak() {
    let mut p = Phase::normal();
    p.token = None;
    p.end = 60_000;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("never granted"), "{v}");
    // The waiter gave up early: nothing proven either way.
    p.end = 20_000;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Inconclusive, "{v}");
    assert!(v.message.contains("stopped waiting"), "{v}");
}

#[test]
fn a_grant_before_the_vouched_lease_ran_out_fails() {
    let mut p = Phase::normal();
    p.kills.clear();
    p.end = 6_400;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("before the lease"), "{v}");
    assert!(v
        .witness
        .iter()
        .any(|e| matches!(e.op, Op::Churn(ChurnOp::Vouched { .. }))));
    // Exact: at the vouched instant it is no violation (here inconclusive,
    // no leader was killed).
    p.end = 6_500;
    assert_eq!(check(&p.build()).status, Status::Inconclusive);
}

#[test]
fn a_grant_before_the_holder_died_fails() {
    let mut p = Phase::normal();
    p.kills.clear();
    p.vouched = 2_000;
    p.end = 2_900;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("before the holder was killed"), "{v}");
}

#[test]
fn a_token_not_above_the_holders_fails() {
    let mut p = Phase::normal();
    p.token = Some(7);
    let v = check(&p.build());
    assert_eq!(v.status, Status::Fail, "{v}");
    assert!(v.message.contains("not above"), "{v}");
}

#[test]
fn without_a_leader_change_or_a_phase_it_is_inconclusive() {
    let v = check(&HistoryBuilder::new().build().unwrap());
    assert_eq!(v.status, Status::Inconclusive);
    assert!(v.message.contains("no leader-churn phase"), "{v}");

    let mut p = Phase::normal();
    p.kills.clear();
    p.end = 8_500;
    let v = check(&p.build());
    assert_eq!(v.status, Status::Inconclusive, "{v}");
    assert!(v.message.contains("no leader was killed"), "{v}");

    let mut p = Phase::normal();
    p.skipped = Some("no leader to kill");
    let v = check(&p.build());
    assert_eq!(v.status, Status::Inconclusive, "{v}");
    assert!(v.message.contains("no leader to kill"), "{v}");

    let mut b = HistoryBuilder::new();
    b.ok(0, 1, churn_skipped("replica n2 is down"));
    let v = check(&b.build().unwrap());
    assert_eq!(v.status, Status::Inconclusive, "{v}");
    assert!(v.message.contains("replica n2 is down"), "{v}");
}

#[test]
fn kills_after_the_grant_do_not_count_and_overlaps_count_once() {
    let mut p = Phase::normal();
    // The second kill comes before the first's ready leader; the last
    // comes after the grant.
    p.kills = vec![(4_000, 6_000), (5_000, 7_000), (13_000, 14_000)];
    let m = measure(&p.build()).unwrap();
    assert_eq!(m.leader_changes, 2);
    // 4..6 and 5..6 (the first ready after it), overlapping: 2 s.
    assert_eq!(m.leaderless_ns, 2 * S);
}

#[test]
fn the_phase_round_trips_through_json() {
    let h = Phase::normal().build();
    let text = h.to_json_lines();
    assert!(
        text.contains(r#""workload":"churn","type":"leader_killed""#),
        "{text}"
    );
    assert!(text.contains(r#""role":"waiter""#), "{text}");
    assert_eq!(History::from_json_lines(&text).unwrap(), h);
}

#[test]
fn a_leader_change_between_kills_counts_too() {
    let mut p = Phase::normal();
    // Killed in terms 10, 12, 14, ready in 11, 13, 15: terms 12 and 14
    // began without a kill.
    p.term_step = 2;
    let m = measure(&p.build()).unwrap();
    assert_eq!(m.leader_changes, 5);
    assert_eq!(m.bound_ns, 9_700 * MS_);
}
