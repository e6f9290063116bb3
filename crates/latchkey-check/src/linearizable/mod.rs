//! Linearizability of the register workload.
//!
//! Each key is an independent register (absent until first written; there
//! are no deletes), so each key's operations are checked on their own
//! (P-compositionality: a history is linearizable iff each key's
//! sub-history is). Per key, a Wing–Gong / Lowe search with Porcupine's
//! memo of (set of linearized operations, register value) looks for an
//! order of the operations that respects real time and the register's
//! sequential behaviour (the search module documents the details).
//!
//! Outcomes:
//!
//! - **ok** operations took effect between their invocation and completion;
//! - **fail** operations did not take effect: dropped;
//! - **unknown** writes and CAS (and operations still in flight when the
//!   history ends) may take effect at any point after their invocation, or
//!   never: their completion is at infinity and they may be left out. An
//!   unknown CAS's result is whatever the register's value makes it.
//!   Unknown reads returned nothing: dropped.
//!
//! Before searching, a key is scanned for violations one or two operations
//! show on their own (a value nobody wrote, a read from the future, a key
//! absent after a completed write); these fail at once, whatever the size
//! of the history.
//!
//! The search is bounded by [`Options::max_steps`] per key; a key that
//! exhausts it makes the verdict [`Status::Inconclusive`](crate::Status)
//! (unless another key fails), never a hang.
//!
//! On failure the witness is the failing key's operations within the
//! shortest window found: the earliest prefix that is not linearizable,
//! then the latest start from which the rest still is not (from an
//! unconstrained value), then without the reads and unknown operations it
//! does not need. Each cut is checked by a search and only relaxes the
//! history, so the witness is not linearizable either and neither is the
//! history.
//!
//! Limits: the search is exponential in the worst case. Many operations in
//! flight at once (a few dozen) on one key, or thousands of unknown
//! operations, can exhaust the budget when a violation hides among them.
//! Keep each key's history to a few thousand operations with a handful of
//! concurrent clients, and rotate keys for longer runs.

mod quick;
mod register;
mod search;
mod window;

#[cfg(test)]
mod tests;

use crate::history::History;
use crate::verdict::Verdict;

use register::KeyHistory;
use search::SearchResult;
use window::{shrink, Window};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "linearizability";

/// Search limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Work budget of one search (one unit per step and per memo word):
    /// bounds time and memory. The witness of a failing key costs a few
    /// dozen more searches of smaller windows, each with this budget.
    pub max_steps: u64,
}

impl Default for Options {
    /// 2,000,000 units: well under a second, and under ~100 MB of memo, per
    /// key.
    fn default() -> Options {
        Options {
            max_steps: 2_000_000,
        }
    }
}

/// [`check_with`] the default [`Options`].
pub fn check(history: &History) -> Verdict {
    check_with(history, Options::default())
}

/// A key whose history is not linearizable, explained.
struct Failure {
    key: String,
    message: String,
    witness: Vec<crate::history::Event>,
}

/// Checks every key of the register workload.
pub fn check_with(history: &History, options: Options) -> Verdict {
    let keys = register::per_key(history);
    let ops_checked: u64 = keys.values().map(|k| k.ops.len() as u64).sum();
    if keys.is_empty() {
        return Verdict::pass(NAME, 0, "no register operations");
    }
    let mut failures = Vec::new();
    let mut exhausted = Vec::new();
    for (key, ops) in &keys {
        if let Some(found) = quick::find(ops) {
            failures.push(explain_quick(key, ops, found));
            continue;
        }
        match Window::full(ops).run(ops, options.max_steps) {
            SearchResult::Linearizable => {}
            SearchResult::Exhausted => exhausted.push(*key),
            SearchResult::NotLinearizable { .. } => {
                failures.push(explain(key, ops, options.max_steps));
            }
        }
    }
    let unresolved = if exhausted.is_empty() {
        String::new()
    } else {
        format!(
            "; search budget of {} exhausted on key(s) {exhausted:?}",
            options.max_steps
        )
    };
    let failing_keys: Vec<&str> = failures.iter().map(|f| f.key.as_str()).collect();
    let others = if failing_keys.len() > 1 {
        format!("; not linearizable: key(s) {failing_keys:?}")
    } else {
        String::new()
    };
    let shortest = failures.into_iter().min_by_key(|f| {
        let span = match (f.witness.first(), f.witness.last()) {
            (Some(a), Some(b)) => b.index - a.index,
            _ => 0,
        };
        (span, f.witness.len())
    });
    if let Some(f) = shortest {
        return Verdict::fail(
            NAME,
            ops_checked,
            format!("{}{others}{unresolved}", f.message),
            f.witness,
        );
    }
    if !exhausted.is_empty() {
        return Verdict::inconclusive(
            NAME,
            ops_checked,
            format!(
                "{} key(s) linearizable{unresolved}",
                keys.len() - exhausted.len()
            ),
        );
    }
    Verdict::pass(
        NAME,
        ops_checked,
        format!("{} key(s), each linearizable", keys.len()),
    )
}

fn explain(key: &str, ops: &KeyHistory, budget: u64) -> Failure {
    let window = shrink(ops, budget);
    let witness = window.events(ops);
    let omitted = window
        .dropped
        .iter()
        .filter(|&&k| ops.ops.get(k).is_some_and(|op| op.done.is_none()))
        .count();
    let omitted = if omitted == 0 {
        String::new()
    } else {
        format!("; {omitted} unknown operation(s) left out of the witness cannot fix it")
    };
    let from = if window.start == 0 {
        "starting absent".to_owned()
    } else {
        "starting from any value".to_owned()
    };
    let stuck = match window.run(ops, budget) {
        SearchResult::NotLinearizable { deepest, blocked } => match ops.ops.get(blocked) {
            Some(op) => format!(
                "; the longest linearizable part has {deepest} operation(s), then process {} `{}` (invoked at #{}) cannot be placed",
                op.operation.process,
                op.operation.op(),
                op.operation.invoke.index
            ),
            None => String::new(),
        },
        _ => String::new(),
    };
    let range = match (witness.first(), witness.last()) {
        (Some(a), Some(b)) => format!("events #{}..#{}", a.index, b.index),
        _ => "no events".to_owned(),
    };
    Failure {
        key: key.to_owned(),
        message: format!(
            "key {key:?} is not linearizable: no order of the witness's operations ({range}, {from}) is a register history{stuck}{omitted}"
        ),
        witness,
    }
}

fn explain_quick(key: &str, ops: &KeyHistory, found: quick::Finding) -> Failure {
    let mut witness = Vec::new();
    let mut shown = Vec::new();
    for i in &found.ops {
        if let Some(op) = ops.ops.get(*i) {
            witness.extend(op.operation.events());
            shown.push(format!(
                "process {} `{}` (#{})",
                op.operation.process,
                op.operation.op(),
                op.operation.invoke.index
            ));
        }
    }
    let subject = shown.last().cloned().unwrap_or_default();
    Failure {
        key: key.to_owned(),
        message: format!(
            "key {key:?} is not linearizable: {subject}: {}",
            found.message
        ),
        witness: crate::verdict::sorted_events(witness),
    }
}
