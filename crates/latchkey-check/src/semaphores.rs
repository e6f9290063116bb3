//! Semaphore safety: never more permits held than the semaphore has, as
//! shown by the writes the store accepted.
//!
//! A permit's fenced write is applied only while the permit is held (the
//! state machine checks the sequencer against the semaphore's current
//! holders), and a permit's token is granted once and released once. So a
//! permit was certainly held from the completion of its grant (or of its
//! first accepted write, when the grant's answer was lost) to the
//! invocation of its last accepted write: its *proven span*. The rules,
//! checked on ok [`SemaphoreOp::Acquire`]s and accepted
//! [`SemaphoreOp::FencedWrite`]s (unknown and refused operations prove
//! nothing):
//!
//! 1. **Token 0 is never issued.**
//! 2. **Each token belongs to one holder**: every grant and accepted write
//!    carrying a token names the same semaphore and holder.
//! 3. **Grants increase**: a grant that ended before another was invoked
//!    has a lower token.
//! 4. **Never more than N**: at no instant do the proven spans of more
//!    than N permits of one semaphore overlap, N being the largest count
//!    any grant of it named (a semaphore is forgotten once nobody holds or
//!    waits for it, so the count may change between uses; the largest is
//!    the cautious bound). Spans that only touch do not overlap.
//!
//! A client paused past its session's end still believes it holds its
//! permit; rule 4 is what makes that harmless: its writes must be refused.

use std::collections::BTreeMap;

use crate::claim::{grants_increase, token_owners, zero_tokens, Claim, MAX_PER_RULE};
use crate::history::{Event, History, Op, Operation, Outcome, SemaphoreOp};
use crate::verdict::{conclude, Verdict, Violation};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "semaphores";

/// Checks rules 1-4.
pub fn check(history: &History) -> Verdict {
    let mut grants: Vec<Claim> = Vec::new();
    let mut writes: Vec<Claim> = Vec::new();
    // Per semaphore, the largest permit count any grant named (rule 4).
    let mut bound: BTreeMap<&str, u32> = BTreeMap::new();
    let mut examined = 0u64;
    for op in history.operations() {
        let Op::Semaphore(s) = op.op() else { continue };
        examined += 1;
        if op.outcome() != Outcome::Ok {
            continue;
        }
        match s {
            SemaphoreOp::Acquire {
                semaphore,
                permits,
                holder,
                token: Some(token),
            } => {
                grants.push(Claim {
                    op,
                    place: semaphore,
                    holder,
                    token: *token,
                });
                let n = bound.entry(semaphore.as_str()).or_insert(0);
                *n = (*n).max(*permits);
            }
            SemaphoreOp::FencedWrite {
                semaphore,
                holder,
                token,
                accepted: Some(true),
                ..
            } => writes.push(Claim {
                op,
                place: semaphore,
                holder,
                token: *token,
            }),
            _ => {}
        }
    }

    let mut violations = Vec::new();
    zero_tokens(&grants, "a permit of", &mut violations);
    token_owners(grants.iter().chain(&writes), &mut violations);
    grants_increase(&grants, &mut violations);
    let spans = proven_spans(&grants, &writes);
    never_more_than_permits(&bound, &spans, &mut violations);

    let pass = format!(
        "{} permits granted and {} accepted fenced writes: tokens unique and increasing, \
         never more permits proven held at once than the semaphore has ({} spans)",
        grants.len(),
        writes.len(),
        spans.len()
    );
    conclude(NAME, examined, pass, violations)
}

/// When one permit was certainly held, and the operations that prove it.
struct Span<'h> {
    semaphore: &'h str,
    token: u64,
    /// The grant's or first accepted write's completion.
    start_ns: u64,
    /// The last accepted write's invocation.
    end_ns: u64,
    /// What proves the start, then what proves the end.
    proof: [&'h Operation; 2],
}

/// Every permit's proven span that is not empty, in token order.
fn proven_spans<'h>(grants: &[Claim<'h>], writes: &[Claim<'h>]) -> Vec<Span<'h>> {
    // Per token: the earliest definite completion (grant or write) and the
    // latest accepted write's invocation.
    let mut starts: BTreeMap<(&str, u64), (u64, &Operation)> = BTreeMap::new();
    let mut ends: BTreeMap<(&str, u64), (u64, &Operation)> = BTreeMap::new();
    for c in grants.iter().chain(writes) {
        if let Some(done) = c.op.definite_end_ns() {
            let e = starts.entry((c.place, c.token)).or_insert((done, c.op));
            if done < e.0 {
                *e = (done, c.op);
            }
        }
    }
    for w in writes {
        let at = w.op.invoke_ns();
        let e = ends.entry((w.place, w.token)).or_insert((at, w.op));
        if at > e.0 {
            *e = (at, w.op);
        }
    }
    let mut spans = Vec::new();
    for ((semaphore, token), (end_ns, last)) in ends {
        if let Some(&(start_ns, first)) = starts.get(&(semaphore, token)) {
            if start_ns < end_ns {
                spans.push(Span {
                    semaphore,
                    token,
                    start_ns,
                    end_ns,
                    proof: [first, last],
                });
            }
        }
    }
    spans
}

fn never_more_than_permits(
    bound: &BTreeMap<&str, u32>,
    spans: &[Span],
    violations: &mut Vec<Violation>,
) {
    let mut per_semaphore: BTreeMap<&str, Vec<&Span>> = BTreeMap::new();
    for s in spans {
        per_semaphore.entry(s.semaphore).or_default().push(s);
    }
    for (semaphore, spans) in per_semaphore {
        // Without a recorded grant the count is unknown: nothing to judge.
        let Some(&permits) = bound.get(semaphore) else {
            continue;
        };
        // Ends sort before starts at the same instant: touching spans do
        // not overlap.
        let mut marks: Vec<(u64, bool, usize)> = Vec::new();
        for (i, s) in spans.iter().enumerate() {
            marks.push((s.start_ns, true, i));
            marks.push((s.end_ns, false, i));
        }
        marks.sort_unstable();
        let mut held: BTreeMap<u64, usize> = BTreeMap::new();
        let mut reported = false;
        for (_, starts, i) in marks {
            let Some(span) = spans.get(i) else { continue };
            if !starts {
                held.remove(&span.token);
                reported = false;
                continue;
            }
            held.insert(span.token, i);
            if held.len() > permits as usize && !reported {
                reported = true;
                let events: Vec<Event> = held
                    .values()
                    .filter_map(|&k| spans.get(k))
                    .flat_map(|s| s.proof.iter().flat_map(|op| op.events()))
                    .collect();
                let tokens: Vec<u64> = held.keys().copied().collect();
                violations.push(Violation::new(
                    format!(
                        "{} permits of {semaphore:?} (of {permits}) were held at once, each shown \
                         by a write the store accepted: tokens {tokens:?}",
                        held.len()
                    ),
                    events,
                ));
                if violations.len() >= MAX_PER_RULE {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
