//! What a checker says about a history.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::Event;

/// A checker's conclusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The property holds on this history.
    Pass,
    /// The property is violated; the witness shows how.
    Fail,
    /// The checker could not decide (search budget exhausted, no final
    /// observation to check against).
    Inconclusive,
}

/// The result of one checker on one history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// Which checker: `"lock safety"`, `"linearizability"`, `"sequences"`,
    /// `"durability"`.
    pub name: String,
    /// Pass, fail or inconclusive.
    pub status: Status,
    /// How many operations the checker examined.
    pub ops_checked: u64,
    /// One paragraph for a human: what was checked, what went wrong.
    pub message: String,
    /// On failure, the shortest slice of history the checker found that
    /// shows the violation, in index order; empty otherwise.
    pub witness: Vec<Event>,
    /// Findings reported but not failed on (e.g. overlapping client-side
    /// hold windows).
    pub notes: Vec<String>,
}

impl Verdict {
    /// A passing verdict.
    pub fn pass(name: &str, ops_checked: u64, message: impl Into<String>) -> Verdict {
        Verdict {
            name: name.to_owned(),
            status: Status::Pass,
            ops_checked,
            message: message.into(),
            witness: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// A failing verdict with its witness (sorted by index, deduplicated).
    pub fn fail(
        name: &str,
        ops_checked: u64,
        message: impl Into<String>,
        witness: Vec<Event>,
    ) -> Verdict {
        Verdict {
            name: name.to_owned(),
            status: Status::Fail,
            ops_checked,
            message: message.into(),
            witness: sorted_events(witness),
            notes: Vec::new(),
        }
    }

    /// An inconclusive verdict.
    pub fn inconclusive(name: &str, ops_checked: u64, message: impl Into<String>) -> Verdict {
        Verdict {
            name: name.to_owned(),
            status: Status::Inconclusive,
            ops_checked,
            message: message.into(),
            witness: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// True when the property holds.
    pub fn is_pass(&self) -> bool {
        self.status == Status::Pass
    }

    /// True when the property is violated.
    pub fn is_fail(&self) -> bool {
        self.status == Status::Fail
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Inconclusive => "INCONCLUSIVE",
        };
        writeln!(
            f,
            "{status} {} ({} ops): {}",
            self.name, self.ops_checked, self.message
        )?;
        if !self.witness.is_empty() {
            writeln!(f, "  witness:")?;
            for e in &self.witness {
                writeln!(f, "    {e}")?;
            }
        }
        for n in &self.notes {
            writeln!(f, "  note: {n}")?;
        }
        Ok(())
    }
}

/// Sorts events by index and drops duplicates.
pub(crate) fn sorted_events(mut events: Vec<Event>) -> Vec<Event> {
    events.sort_by_key(|e| e.index);
    events.dedup_by_key(|e| e.index);
    events
}

/// A candidate violation: a message and the events that show it. Checkers
/// collect these and report the one with the shortest span.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    pub message: String,
    pub events: Vec<Event>,
}

impl Violation {
    pub fn new(message: String, events: Vec<Event>) -> Violation {
        Violation {
            message,
            events: sorted_events(events),
        }
    }

    /// Index distance from the first to the last event: what "shortest"
    /// means when choosing a witness.
    pub fn span(&self) -> u64 {
        match (self.events.first(), self.events.last()) {
            (Some(a), Some(b)) => b.index - a.index,
            _ => 0,
        }
    }
}

/// Builds the verdict of a checker that found `violations` (none: pass).
/// The witness is the violation with the shortest span (then fewest events,
/// then earliest).
pub(crate) fn conclude(
    name: &str,
    ops_checked: u64,
    pass_message: String,
    violations: Vec<Violation>,
) -> Verdict {
    let count = violations.len();
    let shortest = violations.into_iter().min_by_key(|v| {
        (
            v.span(),
            v.events.len(),
            v.events.first().map_or(0, |e| e.index),
        )
    });
    match shortest {
        None => Verdict::pass(name, ops_checked, pass_message),
        Some(v) => {
            let message = if count == 1 {
                v.message
            } else {
                format!("{count} violations; the shortest: {}", v.message)
            };
            Verdict::fail(name, ops_checked, message, v.events)
        }
    }
}
