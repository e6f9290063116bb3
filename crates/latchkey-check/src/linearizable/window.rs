//! Cutting a non-linearizable key history down to a short witness.
//!
//! A window keeps the events with ranks in `[start, end)` and relaxes what
//! it cuts, so that a window that is not linearizable proves the whole
//! history is not:
//!
//! - an operation invoked before `end` but not completed by then becomes
//!   unknown (a read is dropped, a CAS loses its result);
//! - an operation that completed before `start` is dropped, and the window
//!   starts from "any value" ([`ANY`]) instead of absent;
//! - an operation invoked before `start` that completes inside the window
//!   keeps its result and deadline but may be left out (it may have taken
//!   effect before the dropped ones);
//! - reads and mismatched CAS can be dropped outright (they change nothing).
//!
//! Each relaxation only adds linearizations, so a window the search cannot
//! linearize proves the whole history cannot be either; each cut is kept
//! only when the search confirms that. Last, unknown operations that write values
//! the window never observes are left out of the witness if it still fails
//! without them (see [`drop_unknowns`]).

use std::collections::BTreeSet;

use super::register::{KeyHistory, RegStep, Register, ABSENT, ANY};
use super::search::{search, SearchOp, SearchResult};
use crate::history::Event;

/// Windows with at most this many definite operations try dropping reads
/// one by one.
const MAX_DROP_TRIES: usize = 64;

/// A slice of one key's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Window {
    /// First rank kept.
    pub start: usize,
    /// One past the last rank kept.
    pub end: usize,
    /// Operations (indices into the key's ops) left out.
    pub dropped: BTreeSet<usize>,
}

impl Window {
    /// The whole key history.
    pub fn full(key: &KeyHistory) -> Window {
        Window {
            start: 0,
            end: key.ranks,
            dropped: BTreeSet::new(),
        }
    }

    /// The model state the window starts from.
    pub fn initial(&self) -> u32 {
        if self.start == 0 {
            ABSENT
        } else {
            ANY
        }
    }

    /// The operations of the window as the search sees them, with the
    /// index of each in the key's ops.
    pub(crate) fn search_ops(&self, key: &KeyHistory) -> (Vec<SearchOp<RegStep>>, Vec<usize>) {
        let mut ops = Vec::new();
        let mut origin = Vec::new();
        for (k, op) in key.ops.iter().enumerate() {
            if self.dropped.contains(&k) || op.call >= self.end {
                continue;
            }
            let done = op.done.filter(|d| *d < self.end);
            let mut s = op.step;
            if op.done.is_some() && done.is_none() {
                // Still in flight at the cut: its outcome is unknown here.
                match &mut s {
                    RegStep::Read(_) => continue,
                    RegStep::Cas { result, .. } => *result = None,
                    RegStep::Write(_) => {}
                }
            }
            if done.is_some_and(|d| d < self.start) {
                continue;
            }
            ops.push(SearchOp {
                call: op.call,
                ret: done,
                skippable: op.call < self.start,
                step: s,
            });
            origin.push(k);
        }
        (ops, origin)
    }

    /// Searches the window. On failure, the blocked operation is returned
    /// as an index into the key's ops.
    pub fn run(&self, key: &KeyHistory, budget: u64) -> SearchResult {
        let (ops, origin) = self.search_ops(key);
        match search(&Register, &ops, self.initial(), budget) {
            SearchResult::NotLinearizable { deepest, blocked } => SearchResult::NotLinearizable {
                deepest,
                blocked: origin.get(blocked).copied().unwrap_or(blocked),
            },
            other => other,
        }
    }

    fn fails(&self, key: &KeyHistory, budget: u64) -> bool {
        matches!(self.run(key, budget), SearchResult::NotLinearizable { .. })
    }

    /// The events of the operations in the window, in index order.
    pub fn events(&self, key: &KeyHistory) -> Vec<Event> {
        let (_, origin) = self.search_ops(key);
        let mut events = Vec::new();
        for k in origin {
            let Some(op) = key.ops.get(k) else { continue };
            events.push(op.operation.invoke.clone());
            if let (Some(rank), Some(c)) = (op.end_event, &op.operation.completion) {
                if rank < self.end {
                    events.push(c.clone());
                }
            }
        }
        crate::verdict::sorted_events(events)
    }
}

/// Shrinks the failing window `key` (the whole key history is known not
/// to be linearizable): the earliest end that still fails, then the latest
/// start, then drops reads that are not needed. Every step is verified by
/// a search, so the result fails too.
pub(crate) fn shrink(key: &KeyHistory, budget: u64) -> Window {
    let mut w = Window::full(key);
    // Prefixes: more events only remove linearizations, so the failing
    // ends are a suffix of [0, ranks]; find the first.
    let (mut pass, mut fail) = (0, w.end);
    while fail - pass > 1 {
        let mid = pass + (fail - pass) / 2;
        let probe = Window {
            end: mid,
            ..w.clone()
        };
        if probe.fails(key, budget) {
            fail = mid;
        } else {
            pass = mid;
        }
    }
    w.end = fail;
    // Starts: keep the latest start found to fail.
    let (mut fail, mut pass) = (0, w.end);
    while pass - fail > 1 {
        let mid = fail + (pass - fail) / 2;
        let probe = Window {
            start: mid,
            ..w.clone()
        };
        if probe.fails(key, budget) {
            fail = mid;
        } else {
            pass = mid;
        }
    }
    w.start = fail;
    // Reads and mismatched CAS that the violation does not need.
    let (ops, inside) = w.search_ops(key);
    let definite = ops.iter().filter(|op| op.ret.is_some()).count();
    if definite <= MAX_DROP_TRIES {
        for (op, k) in ops.iter().zip(inside) {
            let droppable = op.ret.is_some()
                && matches!(
                    op.step,
                    RegStep::Read(_)
                        | RegStep::Cas {
                            result: Some(false),
                            ..
                        }
                );
            if droppable {
                w.dropped.insert(k);
                if !w.fails(key, budget) {
                    w.dropped.remove(&k);
                }
            }
        }
    }
    drop_unknowns(key, &mut w, budget);
    w
}

/// Leaves out of the witness the unknown operations that write a value no
/// operation of the window observes (reads, CAS expectations): all of them,
/// or those invoked before the window, or (when few are left) one at a
/// time, each time only if the window still fails without them. Runs last:
/// the window with them fails too, so they cannot fix the violation the
/// witness shows; they would only make it longer.
fn drop_unknowns(key: &KeyHistory, w: &mut Window, budget: u64) {
    let (ops, inside) = w.search_ops(key);
    let observed: BTreeSet<u32> = ops
        .iter()
        .filter(|op| op.ret.is_some())
        .filter_map(|op| match op.step {
            RegStep::Read(v) => Some(v),
            RegStep::Cas {
                expected,
                result: Some(_),
                ..
            } => Some(expected),
            _ => None,
        })
        .collect();
    let unknown: Vec<usize> = ops
        .iter()
        .zip(&inside)
        .filter(|(op, _)| op.ret.is_none())
        .filter(|(op, _)| match op.step {
            RegStep::Write(v) | RegStep::Cas { new: v, .. } => !observed.contains(&v),
            RegStep::Read(_) => true,
        })
        .map(|(_, &k)| k)
        .collect();
    if unknown.is_empty() {
        return;
    }
    let before_start: Vec<usize> = unknown
        .iter()
        .copied()
        .filter(|&k| key.ops.get(k).is_some_and(|op| op.call < w.start))
        .collect();
    for group in [&unknown, &before_start] {
        if group.is_empty() {
            continue;
        }
        let mut probe = w.clone();
        probe.dropped.extend(group.iter().copied());
        if probe.fails(key, budget) {
            *w = probe;
            break;
        }
    }
    let left: Vec<usize> = unknown
        .into_iter()
        .filter(|k| !w.dropped.contains(k))
        .collect();
    if left.len() <= MAX_DROP_TRIES / 2 {
        for k in left {
            w.dropped.insert(k);
            if !w.fails(key, budget) {
                w.dropped.remove(&k);
            }
        }
    }
}
