//! One watcher's record, walked in order: what it received and which
//! revisions it saw all of.

use std::collections::BTreeMap;

use crate::history::{Event, Key, Operation, Value, WatchChange, WatchOp};
use crate::verdict::Violation;

/// What one watcher (one history process) saw.
pub(super) struct Watcher<'h> {
    pub process: u64,
    /// Revision ranges `[first, last]` the watcher saw every change of,
    /// ascending and disjoint.
    pub spans: Vec<(u64, u64)>,
    /// Its change messages by revision.
    pub messages: BTreeMap<u64, Message<'h>>,
    /// Its opens, change messages and progress notices with the revision
    /// each names, in order: for witnesses.
    pub marks: Vec<(u64, &'h Event)>,
    /// Stretches that start with a list, so the state is known.
    pub runs: Vec<Run<'h>>,
}

/// One change message.
pub(super) struct Message<'h> {
    pub changes: &'h [WatchChange],
    pub event: &'h Event,
}

/// A stretch of a watcher's record that starts with a list at `base_rev`
/// and sees every change up to `last`.
pub(super) struct Run<'h> {
    pub base_rev: u64,
    pub base: &'h BTreeMap<Key, Value>,
    pub list: &'h Operation,
    pub last: u64,
}

impl<'h> Run<'h> {
    /// The keys under the prefix at revision `at` (`base_rev..=last`), as
    /// this watcher's list and messages make them.
    pub fn state_at(&self, watcher: &Watcher<'h>, at: u64) -> BTreeMap<&'h str, &'h str> {
        let mut state: BTreeMap<&str, &str> = self
            .base
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let after_base = watcher
            .messages
            .range(self.base_rev.saturating_add(1)..)
            .take_while(|(r, _)| **r <= at);
        for (_, m) in after_base {
            for c in m.changes {
                match &c.value {
                    Some(v) => state.insert(&c.key, v),
                    None => state.remove(c.key.as_str()),
                };
            }
        }
        state
    }
}

/// One item of a watcher's record.
pub(super) enum Item<'h> {
    /// An ok list: the revision, the keys, the operation.
    List(u64, &'h BTreeMap<Key, Value>, &'h Operation),
    /// An open, a change message or a progress notice.
    Instant(&'h Event),
}

/// Where the walk stands.
struct Walk<'h> {
    w: Watcher<'h>,
    /// The first revision of the current span; `None` before any open.
    start: Option<u64>,
    /// Every change up to here was received in the current span.
    known: u64,
    /// The current run (a list began it).
    run: Option<(u64, &'h BTreeMap<Key, Value>, &'h Operation)>,
}

impl<'h> Walk<'h> {
    fn close(&mut self) {
        if let Some(start) = self.start.take() {
            if self.known >= start {
                self.w.spans.push((start, self.known));
            }
        }
        if let Some((base_rev, base, list)) = self.run.take() {
            self.w.runs.push(Run {
                base_rev,
                base,
                list,
                last: self.known.max(base_rev),
            });
        }
    }
}

/// Walks one watcher's items (in index order), reporting changes that come
/// out of order or twice.
pub(super) fn walk<'h>(
    process: u64,
    items: Vec<Item<'h>>,
    violations: &mut Vec<Violation>,
) -> Watcher<'h> {
    let mut walk = Walk {
        w: Watcher {
            process,
            spans: Vec::new(),
            messages: BTreeMap::new(),
            marks: Vec::new(),
            runs: Vec::new(),
        },
        start: None,
        known: 0,
        run: None,
    };
    let mut last_list_rev: Option<u64> = None;
    for item in items {
        let e = match item {
            Item::List(revision, values, op) => {
                walk.close();
                walk.known = revision;
                walk.run = Some((revision, values, op));
                last_list_rev = Some(revision);
                continue;
            }
            Item::Instant(e) => e,
        };
        let crate::history::Op::Watch(op) = &e.op else {
            continue;
        };
        match op {
            WatchOp::Open { from } => {
                walk.w.marks.push((*from, e));
                let listed = last_list_rev.take();
                let continues = match (walk.start, listed) {
                    // The open that follows a list starts the run's span.
                    (_, Some(r)) => *from == r + 1,
                    // A resume: the span goes on if nothing was skipped.
                    (Some(_), None) => *from <= walk.known + 1,
                    (None, None) => false,
                };
                match (continues, listed) {
                    (true, Some(r)) => {
                        walk.start = Some(r + 1);
                        walk.known = r;
                    }
                    (true, None) => {}
                    (false, _) => {
                        walk.close();
                        walk.start = Some(*from);
                        walk.known = from.saturating_sub(1);
                    }
                }
            }
            WatchOp::Changes { revision, changes } => {
                walk.w.marks.push((*revision, e));
                if walk.start.is_none() {
                    violations.push(Violation::new(
                        format!(
                            "watcher p{process} received changes at revision {revision} with \
                             no watch open"
                        ),
                        vec![e.clone()],
                    ));
                    continue;
                }
                if *revision <= walk.known {
                    let earlier: Vec<Event> = walk
                        .w
                        .marks
                        .iter()
                        .rev()
                        .skip(1)
                        .find(|(r, _)| *r >= *revision)
                        .map(|(_, m)| (*m).clone())
                        .into_iter()
                        .collect();
                    let mut events = earlier;
                    events.push(e.clone());
                    violations.push(Violation::new(
                        format!(
                            "watcher p{process} received changes at revision {revision} after it \
                             had received everything up to revision {}: a duplicate or out of \
                             order",
                            walk.known
                        ),
                        events,
                    ));
                    continue;
                }
                walk.known = *revision;
                walk.w
                    .messages
                    .insert(*revision, Message { changes, event: e });
            }
            WatchOp::Progress { revision } => {
                walk.w.marks.push((*revision, e));
                if walk.start.is_some() {
                    walk.known = walk.known.max(*revision);
                }
            }
            WatchOp::Write { .. }
            | WatchOp::List { .. }
            | WatchOp::Gone { .. }
            | WatchOp::Leftover { .. } => {}
        }
    }
    walk.close();
    walk.w
}

impl Watcher<'_> {
    /// Whether the watcher saw every change at revision `r`.
    pub fn covers(&self, r: u64) -> bool {
        let i = self.spans.partition_point(|(_, last)| *last < r);
        self.spans.get(i).is_some_and(|(first, _)| *first <= r)
    }

    /// The watcher's events on either side of revision `r`: what shows it
    /// had passed `r` without a message at `r`.
    pub fn around(&self, r: u64) -> Vec<Event> {
        let i = self
            .marks
            .iter()
            .position(|(m, _)| *m >= r)
            .unwrap_or(self.marks.len());
        let mut out = Vec::new();
        if let Some((_, e)) = i.checked_sub(1).and_then(|j| self.marks.get(j)) {
            out.push((*e).clone());
        }
        if let Some((_, e)) = self.marks.get(i) {
            out.push((*e).clone());
        }
        out
    }
}
