//! Lock safety: fencing tokens and the writes they guard.
//!
//! The rules (LOCKS.md), checked on acknowledged grants (ok
//! [`LockOp::Acquire`]) and accepted writes (ok [`LockOp::FencedWrite`] with
//! `accepted: Some(true)`); unknown and refused operations prove nothing and
//! are skipped:
//!
//! 1. **Token 0 is never issued.**
//! 2. **Each token belongs to one holder**: every grant and accepted write
//!    carrying a token names the same resource and holder.
//! 3. **Grants increase**: a grant that ended before another was invoked
//!    has a lower token (tokens increase over every exclusive grant in the
//!    cluster, so this holds across resources).
//! 4. **Accepted writes do not go back**: per resource and target (the fence
//!    gate, or one fenced KV key), a write accepted before another was
//!    invoked carries a token not higher than the later one's.
//! 5. **No fenced KV write is accepted after a higher token was granted**
//!    on its lock: the state machine applies a fenced put only while its
//!    sequencer is the current holder.
//!
//! Rule 5 is not applied to fence-gate writes: a gate only knows the tokens
//! it has seen, so it rightly accepts token 33 after 34 was granted but
//! before 34 reached it. Such writes are counted in the notes instead.
//!
//! Also reported, never failed on: overlapping client-side hold windows
//! ([`LockOp::HoldStart`] .. [`LockOp::HoldEnd`]) of different holders on
//! one resource, which a paused or partitioned client can produce without
//! any harm as long as the rules above hold ([`hold_overlaps`]).

use std::collections::BTreeMap;

use crate::claim::{grants_increase, token_owners, zero_tokens, Claim, MAX_PER_RULE};
use crate::history::{Event, FenceTarget, History, LockOp, Op, Operation, Outcome};
use crate::order::later_lower;
use crate::verdict::{conclude, Verdict, Violation};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "lock safety";

/// Overlapping hold windows listed in the verdict's notes.
const MAX_OVERLAPS_NOTED: usize = 5;

/// Checks rules 1-5 and notes overlapping hold windows.
pub fn check(history: &History) -> Verdict {
    let mut grants: Vec<Claim> = Vec::new();
    let mut writes: Vec<(Claim, &FenceTarget)> = Vec::new();
    let mut examined = 0u64;
    for op in history.operations() {
        let Op::Lock(lock) = op.op() else { continue };
        examined += 1;
        if op.outcome() != Outcome::Ok {
            continue;
        }
        match lock {
            LockOp::Acquire {
                resource,
                holder,
                token: Some(token),
            } => grants.push(Claim {
                op,
                place: resource,
                holder,
                token: *token,
            }),
            LockOp::FencedWrite {
                resource,
                target,
                holder,
                token,
                accepted: Some(true),
            } => writes.push((
                Claim {
                    op,
                    place: resource,
                    holder,
                    token: *token,
                },
                target,
            )),
            _ => {}
        }
    }

    let mut violations = Vec::new();
    zero_tokens(&grants, "lock", &mut violations);
    token_owners(
        grants.iter().chain(writes.iter().map(|(c, _)| c)),
        &mut violations,
    );
    grants_increase(&grants, &mut violations);
    writes_do_not_go_back(&writes, &mut violations);
    let late_gate_writes = kv_writes_after_higher_grant(&grants, &writes, &mut violations);

    let pass = format!(
        "{} grants and {} accepted fenced writes obey the token rules",
        grants.len(),
        writes.len()
    );
    let mut verdict = conclude(NAME, examined, pass, violations);
    if late_gate_writes > 0 {
        verdict.notes.push(format!(
            "{late_gate_writes} fence-gate write(s) accepted after a higher token had been granted \
             but before the gate saw it (allowed: a gate knows only the tokens it has seen)"
        ));
    }
    let overlaps = hold_overlaps(history);
    if !overlaps.is_empty() {
        let mut note = format!(
            "{} overlapping client-side hold window pair(s) (reported, not failed)",
            overlaps.len()
        );
        for o in overlaps.iter().take(MAX_OVERLAPS_NOTED) {
            note.push_str("; ");
            note.push_str(&o.to_string());
        }
        verdict.notes.push(note);
    }
    verdict
}

fn writes_do_not_go_back(writes: &[(Claim, &FenceTarget)], violations: &mut Vec<Violation>) {
    let mut streams: BTreeMap<(&str, &FenceTarget), Vec<&Claim>> = BTreeMap::new();
    for (c, target) in writes {
        streams.entry((c.place, target)).or_default().push(c);
    }
    for ((resource, target), claims) in streams {
        let tokens: Vec<(&Operation, u64)> = claims.iter().map(|c| (c.op, c.token)).collect();
        for (i, j) in later_lower(&tokens, &tokens, MAX_PER_RULE) {
            let (Some(a), Some(b)) = (claims.get(i), claims.get(j)) else {
                continue;
            };
            let store = match target {
                FenceTarget::Gate => format!("the fence gate of {resource:?}"),
                FenceTarget::Kv { key } => format!("KV key {key:?} fenced by {resource:?}"),
            };
            let mut events = a.op.events();
            events.extend(b.op.events());
            violations.push(Violation::new(
                format!(
                    "{store} accepted token {} from {} after it had accepted token {} from {}",
                    b.token, b.holder, a.token, a.holder
                ),
                events,
            ));
        }
    }
}

/// Rule 5 for KV writes; returns how many gate writes would break it.
fn kv_writes_after_higher_grant<'h>(
    grants: &[Claim<'h>],
    writes: &[(Claim<'h>, &FenceTarget)],
    violations: &mut Vec<Violation>,
) -> usize {
    // Per resource: grants, fenced KV writes, fence-gate writes.
    type Lists<'a, 'h> = (Vec<&'a Claim<'h>>, Vec<&'a Claim<'h>>, Vec<&'a Claim<'h>>);
    let mut per_resource: BTreeMap<&str, Lists> = BTreeMap::new();
    for g in grants {
        per_resource.entry(g.place).or_default().0.push(g);
    }
    for (c, target) in writes {
        let entry = per_resource.entry(c.place).or_default();
        match target {
            FenceTarget::Kv { .. } => entry.1.push(c),
            FenceTarget::Gate => entry.2.push(c),
        }
    }
    let tokens = |claims: &[&Claim<'h>]| -> Vec<(&'h Operation, u64)> {
        claims.iter().map(|c| (c.op, c.token)).collect()
    };
    let mut late_gate_writes = 0;
    for (resource, (granted, kv_writes, gate_writes)) in &per_resource {
        let befores = tokens(granted);
        for (i, j) in later_lower(&befores, &tokens(kv_writes), MAX_PER_RULE) {
            let (Some(g), Some(w)) = (granted.get(i), kv_writes.get(j)) else {
                continue;
            };
            let mut events = g.op.events();
            events.extend(w.op.events());
            violations.push(Violation::new(
                format!(
                    "fenced KV write by {} with token {} accepted after {} had been granted {:?} with token {}",
                    w.holder, w.token, g.holder, resource, g.token
                ),
                events,
            ));
        }
        late_gate_writes += later_lower(&befores, &tokens(gate_writes), usize::MAX).len();
    }
    late_gate_writes
}

/// A client-side "I hold it" window, from a hold-start to the matching
/// hold-end of the same resource, holder and token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldWindow {
    /// The lock.
    pub resource: String,
    /// Who believed it held the lock.
    pub holder: String,
    /// The token of the grant.
    pub token: u64,
    /// The hold-start event.
    pub start: Event,
    /// The hold-end event; `None` if the window was still open when the
    /// history ended.
    pub end: Option<Event>,
}

impl HoldWindow {
    fn end_ns(&self) -> Option<u64> {
        self.end.as_ref().map(|e| e.time_ns)
    }
}

/// Two windows of different holders on one resource that overlap in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldOverlap {
    /// The window that started first.
    pub first: HoldWindow,
    /// The window that started while `first` was open.
    pub second: HoldWindow,
    /// How long both were open; `None` if neither ended.
    pub overlap_ns: Option<u64>,
}

impl std::fmt::Display for HoldOverlap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let window = |w: &HoldWindow| match &w.end {
            Some(e) => format!(
                "{} token {} #{}..#{}",
                w.holder, w.token, w.start.index, e.index
            ),
            None => format!("{} token {} #{}..open", w.holder, w.token, w.start.index),
        };
        write!(
            f,
            "{:?}: {} and {}",
            self.first.resource,
            window(&self.first),
            window(&self.second)
        )?;
        match self.overlap_ns {
            Some(ns) => write!(f, " overlap {ns}ns"),
            None => write!(f, " overlap unbounded"),
        }
    }
}

/// Every hold window, in order of their start. A hold-end with no open
/// window is ignored; a second hold-start of an open window is ignored.
pub fn hold_windows(history: &History) -> Vec<HoldWindow> {
    let mut open: BTreeMap<(&str, &str, u64), &Event> = BTreeMap::new();
    let mut windows = Vec::new();
    for e in history.instants() {
        match &e.op {
            Op::Lock(LockOp::HoldStart {
                resource,
                holder,
                token,
            }) => {
                open.entry((resource, holder, *token)).or_insert(e);
            }
            Op::Lock(LockOp::HoldEnd {
                resource,
                holder,
                token,
            }) => {
                if let Some(start) = open.remove(&(resource.as_str(), holder.as_str(), *token)) {
                    windows.push(HoldWindow {
                        resource: resource.clone(),
                        holder: holder.clone(),
                        token: *token,
                        start: start.clone(),
                        end: Some(e.clone()),
                    });
                }
            }
            _ => {}
        }
    }
    for ((resource, holder, token), start) in open {
        windows.push(HoldWindow {
            resource: resource.to_owned(),
            holder: holder.to_owned(),
            token,
            start: start.clone(),
            end: None,
        });
    }
    windows.sort_by_key(|w| w.start.index);
    windows
}

/// Every pair of overlapping hold windows of different holders on one
/// resource. Windows that merely touch (one ends at the instant the other
/// starts) do not overlap.
pub fn hold_overlaps(history: &History) -> Vec<HoldOverlap> {
    let mut per_resource: BTreeMap<String, Vec<HoldWindow>> = BTreeMap::new();
    for w in hold_windows(history) {
        per_resource.entry(w.resource.clone()).or_default().push(w);
    }
    let mut overlaps = Vec::new();
    for windows in per_resource.values() {
        // Already in start order.
        for (i, a) in windows.iter().enumerate() {
            for b in &windows[i + 1..] {
                if a.end_ns().is_some_and(|end| end <= b.start.time_ns) {
                    // Later windows start later still: none overlaps `a`.
                    break;
                }
                if a.holder == b.holder {
                    continue;
                }
                let overlap_ns = match (a.end_ns(), b.end_ns()) {
                    (Some(x), Some(y)) => Some(x.min(y).saturating_sub(b.start.time_ns)),
                    (Some(x), None) | (None, Some(x)) => Some(x.saturating_sub(b.start.time_ns)),
                    (None, None) => None,
                };
                overlaps.push(HoldOverlap {
                    first: a.clone(),
                    second: b.clone(),
                    overlap_ns,
                });
            }
        }
    }
    overlaps
}

#[cfg(test)]
mod tests;
