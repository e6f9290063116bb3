use super::*;
use crate::history::testing::Rec;

#[test]
fn terms_in_order_with_none_skipped_pass() {
    let mut r = Rec::new();
    r.observed(9, "E", None, false);
    r.grant(1, "E", "c1", 5);
    r.observed(9, "E", Some(5), false);
    r.observed(9, "E", Some(5), false); // a proclamation: same term
    r.observed(9, "E", None, false);
    r.grant(2, "E", "c2", 8);
    r.observed(9, "E", Some(8), false);
    // Another lock's grants are not this election's terms.
    r.grant(3, "L", "c3", 6);
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
    assert_eq!(v.ops_checked, 5);
}

#[test]
fn a_term_told_after_a_higher_one_fails() {
    let mut r = Rec::new();
    r.observed(9, "E", Some(8), false); // 0
    r.observed(9, "E", Some(5), false); // 1
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("told term 5 after term 8"), "{v}");
    let witness: Vec<u64> = v.witness.iter().map(|e| e.index).collect();
    assert_eq!(witness, [0, 1]);
}

#[test]
fn a_granted_term_left_out_fails_unless_a_gap_was_declared() {
    let mut r = Rec::new();
    r.grant(1, "E", "c1", 5); // 0, 1
    r.observed(9, "E", Some(5), false); // 2
    r.grant(2, "E", "c2", 6); // 3, 4
    r.grant(3, "E", "c3", 7);
    r.observed(9, "E", Some(7), false); // 7
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("term 6 was granted in between"), "{v}");
    let witness: Vec<u64> = v.witness.iter().map(|e| e.index).collect();
    assert_eq!(witness, [2, 3, 4, 7]);

    let mut r = Rec::new();
    r.grant(1, "E", "c1", 5);
    r.observed(9, "E", Some(5), false);
    r.grant(2, "E", "c2", 6);
    r.grant(3, "E", "c3", 7);
    r.observed(9, "E", None, true); // re-read after a compaction
    r.observed(9, "E", Some(7), false);
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
}

#[test]
fn observers_are_judged_apart() {
    let mut r = Rec::new();
    r.observed(8, "E", Some(7), false);
    r.observed(9, "E", Some(5), false);
    r.grant(1, "E", "c1", 6);
    r.observed(9, "E", Some(6), false);
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
}
