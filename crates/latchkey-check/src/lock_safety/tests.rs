use super::*;
use crate::history::ops::{acquire, gate_write, hold_end, hold_start, kv_write};
use crate::history::testing::Rec;
use crate::history::EventKind;

fn indices(v: &Verdict) -> Vec<u64> {
    v.witness.iter().map(|e| e.index).collect()
}

#[test]
fn the_paused_holder_story_passes() {
    // LOCKS.md: client 1 gets 33 and pauses; its lease expires; client 2
    // gets 34 and writes; client 1 wakes and writes with 33: refused.
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 33);
    r.ok(1, hold_start("L", "c1", 33));
    r.gate(1, "L", "c1", 33, true);
    r.kv(1, "L", "c1", 33, true);
    r.grant(2, "L", "c2", 34);
    r.ok(2, hold_start("L", "c2", 34));
    r.gate(2, "L", "c2", 34, true);
    r.kv(2, "L", "c2", 34, true);
    r.gate(1, "L", "c1", 33, false);
    r.kv(1, "L", "c1", 33, false);
    r.ok(1, hold_end("L", "c1", 33));
    r.ok(2, hold_end("L", "c2", 34));
    // A re-entrant acquire keeps the token.
    r.grant(2, "L", "c2", 34);
    // Another lock, later tokens.
    r.grant(3, "M", "c3", 35);
    r.kv(3, "M", "c3", 35, true);
    // Unknown operations prove nothing.
    r.invoke(4, kv_write("L", "data", "c4", 1, None));
    r.unknown(4, kv_write("L", "data", "c4", 1, None));
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
    assert_eq!(v.ops_checked, 12);
    // The overlap of the two hold windows is reported, not failed on.
    assert_eq!(v.notes.len(), 1, "{v}");
    assert!(v.notes[0].contains("overlapping"), "{v}");
}

#[test]
fn a_gate_accepting_a_lower_token_after_a_higher_one_fails() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 1);
    r.grant(2, "L", "c2", 2);
    r.gate(2, "L", "c2", 2, true); // 4, 5
    r.gate(3, "L", "c3", 7, false);
    r.gate(1, "L", "c1", 1, true); // 8, 9
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("fence gate"), "{v}");
    assert_eq!(indices(&v), vec![4, 5, 8, 9]);
}

#[test]
fn concurrent_gate_writes_may_land_in_either_order() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 1);
    r.grant(2, "L", "c2", 2);
    r.invoke(2, gate_write("L", "c2", 2, None));
    r.invoke(1, gate_write("L", "c1", 1, None));
    r.ok(2, gate_write("L", "c2", 2, Some(true)));
    r.ok(1, gate_write("L", "c1", 1, Some(true)));
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
    // A gate write with a token older than a grant is noted.
    assert!(v.notes.iter().any(|n| n.contains("fence-gate")), "{v}");
}

#[test]
fn a_token_granted_to_two_holders_fails() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 5);
    r.grant(2, "L", "c2", 5);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("token 5 belongs to two holders"), "{v}");
    assert_eq!(indices(&v), vec![0, 1, 2, 3]);
}

#[test]
fn a_write_with_someone_elses_token_fails() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 5);
    r.kv(2, "L", "c2", 5, true);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("two holders"), "{v}");
}

#[test]
fn a_fenced_kv_write_accepted_after_a_higher_grant_fails() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 1);
    r.grant(2, "L", "c2", 2); // 2, 3
    r.kv(1, "L", "c1", 1, true); // 4, 5
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("fenced KV write"), "{v}");
    assert_eq!(indices(&v), vec![2, 3, 4, 5]);
}

#[test]
fn a_kv_write_concurrent_with_the_higher_grant_is_fine() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 1);
    r.invoke(2, acquire("L", "c2", None));
    r.kv(1, "L", "c1", 1, true);
    r.ok(2, acquire("L", "c2", Some(2)));
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
}

#[test]
fn tokens_going_back_across_grants_fail() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 9);
    r.grant(2, "M", "c2", 3);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("token went back"), "{v}");
    assert_eq!(v.witness.len(), 4);
}

#[test]
fn token_zero_fails() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 0);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("token 0"), "{v}");
    assert_eq!(indices(&v), vec![0, 1]);
}

#[test]
fn the_shortest_of_several_violations_is_the_witness() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 10); // 0, 1
    r.gate(1, "L", "c1", 10, true); // 2, 3
    for i in 0..5 {
        r.grant(2, "M", &format!("m{i}"), 20 + i);
    }
    r.gate(3, "L", "c3", 4, true); // 14, 15: far from the first gate write
    r.kv(4, "M", "m1", 21, true); // 16, 17: soon after the grant of 24
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.starts_with("2 violations; the shortest"), "{v}");
    // The KV write (token 21) right after the grant of 24.
    assert_eq!(indices(&v), vec![12, 13, 16, 17], "{v}");
    assert_eq!(v.witness[3].kind, EventKind::Ok);
}

#[test]
fn hold_windows_and_overlaps() {
    let mut r = Rec::new();
    r.ok(1, hold_start("L", "c1", 1)); // 10
    r.ok(2, hold_start("L", "c2", 2)); // 20
    r.ok(1, hold_end("L", "c1", 1)); // 30
    r.ok(3, hold_start("L", "c3", 3)); // 40, open
    r.ok(2, hold_end("L", "c2", 2)); // 50
    r.ok(4, hold_start("M", "c4", 4));
    r.ok(4, hold_end("M", "c4", 4));
    r.ok(5, hold_end("M", "c5", 5)); // no start: ignored
    let h = r.build();
    let windows = hold_windows(&h);
    assert_eq!(windows.len(), 4);
    assert_eq!(windows[2].holder, "c3");
    assert!(windows[2].end.is_none());
    let overlaps = hold_overlaps(&h);
    assert_eq!(overlaps.len(), 2);
    assert_eq!(
        (
            overlaps[0].first.holder.as_str(),
            overlaps[0].second.holder.as_str()
        ),
        ("c1", "c2")
    );
    assert_eq!(overlaps[0].overlap_ns, Some(10));
    assert_eq!(
        (
            overlaps[1].first.holder.as_str(),
            overlaps[1].second.holder.as_str()
        ),
        ("c2", "c3")
    );
    assert_eq!(overlaps[1].overlap_ns, Some(10));
    let v = check(&h);
    assert!(v.is_pass(), "{v}");
    assert!(v.notes[0].starts_with("2 overlapping"), "{v}");
}
