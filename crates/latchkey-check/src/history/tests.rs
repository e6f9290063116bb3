use super::ops::*;
use super::*;

#[test]
fn pairs_invocations_with_completions_by_process() {
    let mut b = HistoryBuilder::new();
    b.invoke(1, 10, write("x", "1"));
    b.invoke(2, 11, read("x", None));
    b.ok(2, 12, read("x", Some("1")));
    b.ok(1, 13, write("x", "1"));
    b.invoke(3, 14, write("x", "2"));
    let h = b.build().unwrap();
    assert_eq!(h.operations().len(), 3);
    let w1 = &h.operations()[0];
    assert_eq!(w1.process, 1);
    assert_eq!(w1.completion.as_ref().unwrap().index, 3);
    assert_eq!(w1.outcome(), Outcome::Ok);
    assert_eq!(h.operations()[1].op(), &read("x", Some("1")));
    let pending = &h.operations()[2];
    assert_eq!(pending.outcome(), Outcome::Unknown);
    assert_eq!(pending.definite_end_ns(), None);
    assert!(!w1.precedes(&h.operations()[1]));
    assert!(w1.precedes(pending));
}

#[test]
fn equal_timestamps_are_concurrent() {
    let mut b = HistoryBuilder::new();
    b.invoke(1, 10, write("x", "1"));
    b.ok(1, 20, write("x", "1"));
    b.invoke(2, 20, read("x", None));
    b.ok(2, 30, read("x", None));
    let h = b.build().unwrap();
    assert!(!h.operations()[0].precedes(&h.operations()[1]));
}

#[test]
fn json_lines_round_trip() {
    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, cas("x", None, "a", None));
    b.ok(1, 2, cas("x", None, "a", Some(true)));
    b.ok(2, 3, hold_start("L", "s1", 4));
    b.invoke(2, 4, kv_write("L", "k", "s1", 4, None));
    b.ok(2, 5, kv_write("L", "k", "s1", 4, Some(true)));
    b.invoke(3, 6, alloc("seq", 10, None));
    b.unknown(3, 7, alloc("seq", 10, None));
    b.invoke(4, 8, read_all(None));
    b.ok(4, 9, read_all(Some(&[("a", "1")])));
    b.invoke(5, 10, read("x", None));
    b.ok(5, 11, read("x", None));
    let h = b.build().unwrap();
    let text = h.to_json_lines();
    assert!(text.contains(r#""workload":"register","type":"cas""#));
    let back = History::from_json_lines(&text).unwrap();
    assert_eq!(back, h);
}

#[test]
fn invocation_json_may_omit_results() {
    let line = r#"{"index":0,"process":1,"time_ns":5,"kind":"invoke","op":{"workload":"register","type":"read","key":"x"}}"#;
    let h = History::from_json_lines(line).unwrap();
    assert_eq!(h.events()[0].op, read("x", None));
}

#[test]
fn rejects_malformed_histories() {
    let bad_json = History::from_json_lines("{\"index\":0}\n");
    assert!(matches!(bad_json, Err(HistoryError::Json { line: 1, .. })));

    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, write("x", "1"));
    b.invoke(1, 2, write("x", "2"));
    assert_eq!(
        b.build(),
        Err(HistoryError::OverlappingInvoke {
            index: 1,
            process: 1
        })
    );

    let mut b = HistoryBuilder::new();
    b.ok(1, 1, write("x", "1"));
    assert_eq!(b.build(), Err(HistoryError::OrphanCompletion { index: 0 }));

    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, write("x", "1"));
    b.ok(1, 2, write("x", "2"));
    assert_eq!(
        b.build(),
        Err(HistoryError::MismatchedCompletion { index: 1 })
    );

    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, cas("x", None, "1", None));
    b.ok(1, 2, cas("x", None, "1", None));
    assert_eq!(b.build(), Err(HistoryError::MissingResult { index: 1 }));

    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, hold_start("L", "s", 1));
    assert_eq!(b.build(), Err(HistoryError::InstantNotOk { index: 0 }));

    let mut b = HistoryBuilder::new();
    b.invoke(1, 5, write("x", "1"));
    b.ok(1, 4, write("x", "1"));
    assert_eq!(b.build(), Err(HistoryError::TimeWentBackwards { index: 1 }));

    let e = Event {
        index: 3,
        process: 1,
        time_ns: 1,
        kind: EventKind::Invoke,
        op: write("x", "1"),
    };
    assert_eq!(
        History::new(vec![e.clone(), e]),
        Err(HistoryError::DuplicateIndex(3))
    );
}

#[test]
fn sorts_events_by_index() {
    let mut b = HistoryBuilder::new();
    b.invoke(1, 1, write("x", "1"));
    b.ok(1, 2, write("x", "1"));
    let mut events = b.events().to_vec();
    events.reverse();
    let h = History::new(events).unwrap();
    assert_eq!(h.events()[0].index, 0);
    assert_eq!(h.operations().len(), 1);
}
