use super::*;
use crate::history::ops::{permit, permit_write};
use crate::history::testing::Rec;

#[test]
fn permits_within_the_count_pass_and_a_paused_holders_refused_write_is_harmless() {
    let mut r = Rec::new();
    r.permit(1, "S", 2, 10);
    r.permit(2, "S", 2, 11);
    r.permit_write(1, "S", 10, true);
    r.permit_write(2, "S", 11, true);
    // Holder 1 pauses; its session ends; holder 3 gets its permit.
    r.permit(3, "S", 2, 12);
    r.permit_write(3, "S", 12, true);
    r.permit_write(2, "S", 11, true);
    // Holder 1 wakes and writes: refused, so it proves nothing.
    r.permit_write(1, "S", 10, false);
    r.permit_write(3, "S", 12, true);
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
    assert_eq!(v.ops_checked, 9);
}

#[test]
fn more_permits_proven_held_than_the_count_fails() {
    let mut r = Rec::new();
    r.permit(1, "S", 2, 10); // 0, 1
    r.permit(2, "S", 2, 11); // 2, 3
    r.permit(3, "S", 2, 12); // 4, 5
    r.permit_write(1, "S", 10, true); // 6, 7
    r.permit_write(2, "S", 11, true); // 8, 9
    r.permit_write(3, "S", 12, true); // 10, 11
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("3 permits of \"S\" (of 2)"), "{v}");
    let witness: Vec<u64> = v.witness.iter().map(|e| e.index).collect();
    assert_eq!(witness, (0..12).collect::<Vec<_>>(), "{v}");
}

/// Permit 10 granted at 10 with its last accepted write invoked at
/// `last_write`; permit 11 granted at 30 and written after.
fn two_spans(last_write: u64) -> History {
    let mut b = crate::history::HistoryBuilder::new();
    b.invoke(1, 0, permit("S", 1, "c1", None));
    b.ok(1, 10, permit("S", 1, "c1", Some(10)));
    b.invoke(2, 20, permit("S", 1, "c2", None));
    b.ok(2, 30, permit("S", 1, "c2", Some(11)));
    b.invoke(1, last_write, permit_write("S", "k", "c1", 10, None));
    b.ok(1, 40, permit_write("S", "k", "c1", 10, Some(true)));
    b.invoke(2, 50, permit_write("S", "k", "c2", 11, None));
    b.ok(2, 60, permit_write("S", "k", "c2", 11, Some(true)));
    b.build().expect("well formed")
}

#[test]
fn spans_that_only_touch_do_not_overlap() {
    // 10's span ends at 30, the instant 11's begins.
    let v = check(&two_spans(30));
    assert!(v.is_pass(), "{v}");
    // One nanosecond later, they overlap.
    let v = check(&two_spans(31));
    assert!(v.is_fail(), "{v}");
}

#[test]
fn a_lost_grant_answer_is_proven_by_the_writes_alone() {
    let mut r = Rec::new();
    r.permit(1, "S", 1, 10);
    // Holder 2's grant answer is lost; its accepted writes prove it held
    // the permit from the first write's completion to the last's
    // invocation, over holder 1's span.
    r.invoke(2, permit("S", 1, "c2", None));
    r.unknown(2, permit("S", 1, "c2", None));
    r.permit_write(2, "S", 11, true);
    r.permit_write(1, "S", 10, true);
    r.permit_write(2, "S", 11, true);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("tokens [10, 11]"), "{v}");
}

#[test]
fn a_token_of_two_holders_and_a_zero_token_fail() {
    let mut r = Rec::new();
    r.permit(1, "S", 3, 10);
    r.permit_write(2, "S", 10, true);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("belongs to two holders"), "{v}");

    let mut r = Rec::new();
    r.permit(1, "S", 3, 0);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("token 0"), "{v}");
}

#[test]
fn tokens_that_go_back_fail() {
    let mut r = Rec::new();
    r.permit(1, "S", 3, 20);
    r.permit(2, "S", 3, 19);
    let v = check(&r.build());
    assert!(v.is_fail(), "{v}");
    assert!(v.message.contains("token went back"), "{v}");
}

#[test]
fn other_workloads_are_not_examined() {
    let mut r = Rec::new();
    r.grant(1, "L", "c1", 1);
    let v = check(&r.build());
    assert!(v.is_pass(), "{v}");
    assert_eq!(v.ops_checked, 0);
}
