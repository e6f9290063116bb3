//! Election observers: every observer is told the terms in increasing
//! order, and none it should have seen is left out.
//!
//! An election's leader key changes in the same log entry as every grant
//! of its lock (a campaign won, a leader's session ended and the next
//! candidate promoted), and an observer follows that key through the
//! watch history. So, checked on [`ElectionOp::Observed`] instants (per
//! observer, the event's process, and election) against ok
//! [`LockOp::Acquire`]s of the election's name (a campaign's grant, whose
//! token is the term):
//!
//! 1. **Terms never go back**: after term `t` an observer is never told
//!    of a term below `t` (the same term again is a proclamation).
//! 2. **No term is skipped**: between two terms `a < b` an observer was
//!    told one after the other, no campaign was granted a term strictly
//!    between them, unless the observer said it may have missed changes
//!    there (`skipped`: the history no longer held them).
//!
//! Grants that are not recorded (an unknown campaign outcome) are not
//! judged: an observer may well report terms no worker knew it won.

use std::collections::BTreeMap;

use crate::history::{ElectionOp, Event, History, LockOp, Op, Outcome};
use crate::verdict::{conclude, Verdict, Violation};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "election observers";

/// Detailed violations collected; enough to pick a short witness.
const MAX_VIOLATIONS: usize = 256;

/// One observation: the event, the term told (`None`: nobody leads), and
/// whether changes before it may have been missed.
type Told<'h> = (&'h Event, Option<u64>, bool);

/// Checks rules 1 and 2.
pub fn check(history: &History) -> Verdict {
    // Per (observer, election): what it was told, in order.
    let mut told: BTreeMap<(u64, &str), Vec<Told>> = BTreeMap::new();
    for e in history.instants() {
        if let Op::Election(ElectionOp::Observed {
            election,
            term,
            skipped,
        }) = &e.op
        {
            told.entry((e.process, election.as_str()))
                .or_default()
                .push((e, *term, *skipped));
        }
    }
    // Per election: the terms campaigns were granted, with their grant.
    let mut granted: BTreeMap<&str, BTreeMap<u64, Vec<Event>>> = BTreeMap::new();
    for op in history.operations() {
        if op.outcome() != Outcome::Ok {
            continue;
        }
        if let Op::Lock(LockOp::Acquire {
            resource,
            token: Some(token),
            ..
        }) = op.op()
        {
            granted
                .entry(resource.as_str())
                .or_default()
                .insert(*token, op.events());
        }
    }

    let mut violations = Vec::new();
    let mut observations = 0u64;
    let mut judged_pairs = 0u64;
    for ((observer, election), seen) in &told {
        observations += seen.len() as u64;
        let terms = granted.get(election);
        // The last term told, and whether a gap was declared since.
        let mut last: Option<(&Event, u64)> = None;
        let mut gap = false;
        for &(event, term, skipped) in seen {
            gap |= skipped;
            let Some(term) = term else { continue };
            if let Some((before, previous)) = last {
                if term < previous {
                    violations.push(Violation::new(
                        format!(
                            "observer {observer} of {election:?} was told term {term} after term {previous}"
                        ),
                        vec![before.clone(), event.clone()],
                    ));
                } else if term > previous && !gap {
                    judged_pairs += 1;
                    let between = terms.and_then(|t| t.range(previous + 1..term).next());
                    if let Some((missed, grant)) = between {
                        let mut events = grant.clone();
                        events.push(before.clone());
                        events.push(event.clone());
                        violations.push(Violation::new(
                            format!(
                                "observer {observer} of {election:?} went from term {previous} to \
                                 {term}, but term {missed} was granted in between and never shown"
                            ),
                            events,
                        ));
                    }
                }
            }
            if violations.len() >= MAX_VIOLATIONS {
                break;
            }
            last = Some((event, term));
            gap = false;
        }
    }
    let elections: std::collections::BTreeSet<&str> = told.keys().map(|(_, e)| *e).collect();
    let pass = format!(
        "{} observers, {observations} observations: terms in increasing order, none of {} \
         recorded campaign grants skipped in {judged_pairs} hand-overs",
        told.len(),
        elections
            .iter()
            .filter_map(|e| granted.get(e))
            .map(BTreeMap::len)
            .sum::<usize>(),
    );
    conclude(NAME, observations, pass, violations)
}

#[cfg(test)]
mod tests;
