use crate::history::ops::{
    watch_changes as changes, watch_list as list, watch_open as open, watch_progress as progress,
    watch_write as write,
};
use crate::history::HistoryBuilder;
use crate::Status;

use super::check;

/// Writer process 1; watchers 2 and 3.
const WRITER: u64 = 1;

/// A writer's acknowledged put of `key = value` at `revision`, at `t`.
fn put(h: &mut HistoryBuilder, t: u64, key: &str, value: &str, revision: u64) {
    h.invoke(WRITER, t, write(&[(key, Some(value))], None));
    h.ok(WRITER, t + 1, write(&[(key, Some(value))], Some(revision)));
}

/// Watcher `p` lists `values` at `revision` and opens from the next one.
fn list_and_open(h: &mut HistoryBuilder, p: u64, t: u64, revision: u64, values: &[(&str, &str)]) {
    h.invoke(p, t, list(None));
    h.ok(p, t + 1, list(Some((revision, values))));
    h.ok(p, t + 2, open(revision + 1));
}

/// Two watchers from revision 10; puts at 11 and 12.
fn healthy() -> HistoryBuilder {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    list_and_open(&mut h, 3, 3, 10, &[]);
    put(&mut h, 10, "a", "1", 11);
    h.ok(2, 12, changes(11, &[("a", Some("1"))]));
    h.ok(3, 13, changes(11, &[("a", Some("1"))]));
    put(&mut h, 20, "b", "2", 12);
    h.ok(2, 22, changes(12, &[("b", Some("2"))]));
    h.ok(3, 23, changes(12, &[("b", Some("2"))]));
    h
}

fn status(h: HistoryBuilder) -> (Status, String) {
    let v = check(&h.build().unwrap());
    (v.status, v.message)
}

#[test]
fn a_healthy_history_passes() {
    let mut h = healthy();
    // Watcher 3 restarts from the revision after its last, then lists again.
    h.ok(3, 30, progress(14));
    h.ok(3, 31, open(13));
    h.invoke(2, 32, list(None));
    h.ok(2, 33, list(Some((14, &[("a", "1"), ("b", "2")]))));
    h.ok(2, 34, open(15));
    let (s, m) = status(h);
    assert_eq!(s, Status::Pass, "{m}");
    assert!(m.contains("2 watcher(s)"), "{m}");
}

#[test]
fn no_workload_passes() {
    let (s, _) = status(HistoryBuilder::new());
    assert_eq!(s, Status::Pass);
}

#[test]
fn a_revision_one_watcher_missed_fails() {
    let mut h = healthy();
    put(&mut h, 30, "c", "3", 13);
    h.ok(2, 32, changes(13, &[("c", Some("3"))]));
    put(&mut h, 40, "d", "4", 14);
    h.ok(2, 42, changes(14, &[("d", Some("4"))]));
    // Watcher 3 skips 13.
    h.ok(3, 43, changes(14, &[("d", Some("4"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("revision 13"), "{m}");
}

#[test]
fn a_progress_notice_past_a_missed_revision_fails() {
    let mut h = healthy();
    put(&mut h, 30, "c", "3", 13);
    h.ok(2, 32, changes(13, &[("c", Some("3"))]));
    // Watcher 3 says it has everything up to 13, without 13.
    h.ok(3, 33, progress(13));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("p3") && m.contains("revision 13"), "{m}");
}

#[test]
fn a_duplicate_after_resuming_fails() {
    let mut h = healthy();
    h.ok(2, 30, open(12));
    h.ok(2, 31, changes(12, &[("b", Some("2"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("duplicate or out of order"), "{m}");
}

#[test]
fn out_of_order_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    put(&mut h, 10, "a", "1", 11);
    put(&mut h, 20, "b", "2", 12);
    h.ok(2, 30, changes(12, &[("b", Some("2"))]));
    h.ok(2, 31, changes(11, &[("a", Some("1"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("out of order"), "{m}");
}

#[test]
fn an_acknowledged_write_a_lone_watcher_missed_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    put(&mut h, 10, "a", "1", 11);
    h.ok(2, 20, progress(11));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("acknowledged at revision 11"), "{m}");
}

#[test]
fn a_batch_split_or_partly_delivered_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    let both = [("a", Some("1")), ("b", Some("2"))];
    h.invoke(WRITER, 10, write(&both, None));
    h.ok(WRITER, 11, write(&both, Some(11)));
    h.ok(2, 20, changes(11, &[("a", Some("1"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("\"b\" = 2"), "{m}");
}

#[test]
fn a_value_nobody_wrote_fails() {
    let mut h = healthy();
    h.ok(2, 30, changes(13, &[("a", Some("9"))]));
    h.ok(3, 31, changes(13, &[("a", Some("9"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("nobody wrote"), "{m}");
}

#[test]
fn a_value_at_another_revision_than_acknowledged_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    put(&mut h, 10, "a", "1", 12);
    h.ok(2, 20, changes(11, &[("a", Some("1"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("another revision"), "{m}");
}

#[test]
fn a_failed_write_seen_fails_and_an_unknown_one_passes() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    h.invoke(WRITER, 10, write(&[("a", Some("1"))], None));
    h.unknown(WRITER, 11, write(&[("a", Some("1"))], None));
    h.ok(2, 20, changes(11, &[("a", Some("1"))]));
    let (s, m) = status(h.clone());
    assert_eq!(s, Status::Pass, "{m}");

    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    h.invoke(WRITER, 10, write(&[("a", Some("1"))], None));
    h.fail(WRITER, 11, write(&[("a", Some("1"))], None));
    h.ok(2, 20, changes(11, &[("a", Some("1"))]));
    let (s, _) = status(h);
    assert_eq!(s, Status::Fail);
}

#[test]
fn a_change_before_its_write_began_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    h.ok(2, 5, changes(11, &[("a", Some("1"))]));
    put(&mut h, 10, "a", "1", 11);
    let (s, _) = status(h);
    assert_eq!(s, Status::Fail);
}

#[test]
fn a_value_applied_twice_fails() {
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    h.invoke(WRITER, 10, write(&[("a", Some("1"))], None));
    h.unknown(WRITER, 11, write(&[("a", Some("1"))], None));
    h.ok(2, 20, changes(11, &[("a", Some("1"))]));
    h.ok(2, 21, changes(12, &[("a", Some("1"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("applied twice"), "{m}");
}

#[test]
fn a_delete_needs_a_write_that_deletes() {
    let mut h = healthy();
    h.ok(2, 30, changes(13, &[("a", None)]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("nobody wrote"), "{m}");

    let mut h = healthy();
    h.invoke(WRITER, 30, write(&[("c", Some("3")), ("a", None)], None));
    h.ok(
        WRITER,
        31,
        write(&[("c", Some("3")), ("a", None)], Some(13)),
    );
    h.ok(2, 32, changes(13, &[("c", Some("3")), ("a", None)]));
    h.ok(3, 33, changes(13, &[("c", Some("3")), ("a", None)]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Pass, "{m}");
}

#[test]
fn revisions_against_real_time_fail() {
    let mut h = HistoryBuilder::new();
    put(&mut h, 10, "a", "1", 12);
    put(&mut h, 20, "b", "2", 11);
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("lower revision 11"), "{m}");

    let mut h = HistoryBuilder::new();
    put(&mut h, 10, "a", "1", 11);
    put(&mut h, 20, "b", "2", 11);
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("share revision 11"), "{m}");
}

#[test]
fn a_list_that_disagrees_with_a_watcher_fails() {
    let mut h = healthy();
    h.invoke(2, 30, list(None));
    h.ok(2, 31, list(Some((12, &[("a", "1")]))));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("a list at revision 12"), "{m}");
}

#[test]
fn a_watcher_that_skipped_ahead_is_not_blamed_for_the_gap() {
    let mut h = healthy();
    put(&mut h, 30, "c", "3", 13);
    h.ok(2, 32, changes(13, &[("c", Some("3"))]));
    put(&mut h, 40, "d", "4", 14);
    h.ok(2, 42, changes(14, &[("d", Some("4"))]));
    // Watcher 3 opens again past 13 itself: it does not cover 13.
    h.ok(3, 43, open(14));
    h.ok(3, 44, changes(14, &[("d", Some("4"))]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Pass, "{m}");
}

#[test]
fn the_history_round_trips_through_json() {
    let h = healthy().build().unwrap();
    let text = h.to_json_lines();
    let back = crate::History::from_json_lines(&text).unwrap();
    assert_eq!(back, h);
    assert!(text.contains("\"workload\":\"watch\""), "{text}");
}

/// Writer process 1 binds "e/1" and "e/2" to session 7 at revisions 11
/// and 12; watcher 2 sees them.
fn bound_pair() -> HistoryBuilder {
    use crate::history::ops::watch_bound_put as bound;
    let mut h = HistoryBuilder::new();
    list_and_open(&mut h, 2, 0, 10, &[]);
    h.invoke(WRITER, 10, bound("e/1", "a", 7, None));
    h.ok(WRITER, 11, bound("e/1", "a", 7, Some(11)));
    h.invoke(WRITER, 12, bound("e/2", "b", 7, None));
    h.ok(WRITER, 13, bound("e/2", "b", 7, Some(12)));
    h.ok(2, 14, changes(11, &[("e/1", Some("a"))]));
    h.ok(2, 15, changes(12, &[("e/2", Some("b"))]));
    h
}

#[test]
fn a_sessions_end_deletes_its_keys_together() {
    let mut h = bound_pair();
    h.ok(2, 20, changes(13, &[("e/1", None), ("e/2", None)]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Pass, "{m}");
}

#[test]
fn a_sessions_keys_deleted_at_two_revisions_fail() {
    let mut h = bound_pair();
    h.ok(2, 20, changes(13, &[("e/1", None)]));
    h.ok(2, 21, changes(14, &[("e/2", None)]));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("session 7") && m.contains("[13, 14]"), "{m}");
}

#[test]
fn a_bound_key_deleted_before_it_was_put_fails() {
    let mut h = bound_pair();
    // Deleted at revision 10, below the put's 11: nothing explains it.
    let mut early = HistoryBuilder::new();
    early.ok(9, 0, open(5));
    early.ok(9, 30, changes(10, &[("e/1", None)]));
    for e in early.events() {
        h.push(e.process, 30, e.kind, e.op.clone());
    }
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("no write that could have made"), "{m}");
}

#[test]
fn a_key_still_there_after_its_close_fails() {
    use crate::history::ops::watch_gone as gone;
    let mut h = bound_pair();
    h.invoke(WRITER, 30, gone("e/1", 7, None));
    h.ok(WRITER, 31, gone("e/1", 7, Some(false)));
    let (s, m) = status(h.clone());
    assert_eq!(s, Status::Pass, "{m}");
    h.invoke(WRITER, 32, gone("e/2", 7, None));
    h.ok(WRITER, 33, gone("e/2", 7, Some(true)));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(
        m.contains("still there after its session 7 was closed"),
        "{m}"
    );
}

#[test]
fn a_bound_key_left_at_the_end_of_the_run_fails() {
    use crate::history::ops::watch_leftover as leftover;
    let mut h = bound_pair();
    h.invoke(WRITER, 30, leftover("e/", None));
    h.ok(WRITER, 31, leftover("e/", Some(&[])));
    let (s, m) = status(h.clone());
    assert_eq!(s, Status::Pass, "{m}");
    // A failed final read proves nothing.
    h.invoke(WRITER, 32, leftover("e/", None));
    h.fail(WRITER, 33, leftover("e/", None));
    let (s, m) = status(h.clone());
    assert_eq!(s, Status::Pass, "{m}");
    h.invoke(WRITER, 34, leftover("e/", None));
    h.ok(WRITER, 35, leftover("e/", Some(&["e/1"])));
    let (s, m) = status(h);
    assert_eq!(s, Status::Fail);
    assert!(m.contains("outlived every session"), "{m}");
}
