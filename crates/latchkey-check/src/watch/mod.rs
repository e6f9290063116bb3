//! Watch: every watcher sees exactly the committed changes of its prefix,
//! in revision order, with no gap and no duplicate across its reconnects.
//!
//! The workload: writers change keys under one prefix, one command at a
//! time ([`WatchOp::Write`]: puts with values unique per put, and deletes;
//! every write holds at least one put, so each acknowledged write has a
//! revision of its own). Watchers list the prefix ([`WatchOp::List`]),
//! open a watch from the list's revision plus one ([`WatchOp::Open`]) and
//! record each message they receive ([`WatchOp::Changes`],
//! [`WatchOp::Progress`]); now and then they drop the watch and open it
//! again from the revision after the last they had, as a restarted client
//! would.
//!
//! A watcher *covers* revision `r` when `r` lies in one of its spans: from
//! the revision after its list (or the revision it opened at) up to the
//! highest revision it received a message or progress notice for, as long
//! as every open in between resumed at most one past what it had. Rules:
//!
//! 1. **Order**: a watcher's change messages come in strictly rising
//!    revision order, across every reconnect: a message at a revision it
//!    already had everything up to is a duplicate or out of order.
//! 2. **Agreement (no gap)**: a watcher that covers a revision at which any
//!    watcher received changes received the same changes at it.
//! 3. **Acknowledged writes**: every watcher that covers the revision of
//!    an acknowledged write received its puts at that revision, in one
//!    message with the write's other changes.
//! 4. **Validity**: every change received was written: a put's value by a
//!    write of that key that did not fail, was invoked before the change
//!    arrived, and, if acknowledged, at the same revision; a delete by such
//!    a write that deletes the key. No value arrives at two revisions.
//! 5. **Revisions follow real time**: acknowledged writes have distinct
//!    revisions, and a write acknowledged before another was invoked has
//!    the lower one.
//! 6. **List, then watch**: every list equals the state a watcher that
//!    covers the list's revision computes from its own list and messages.
//! 7. **A session's keys go together**: keys put bound to a session
//!    ([`WatchOp::Write`] with a `session`) and deleted by no write are
//!    deleted by the session's end, all at one revision, after they were
//!    put (rule 4 accepts such a delete only from a bound put that did not
//!    fail, began before it arrived and, if acknowledged, was applied at a
//!    lower revision).
//! 8. **A close takes them at once**: a read made after the client's close
//!    of a session was acknowledged ([`WatchOp::Gone`]) finds its key gone.
//! 9. **Every session ends**: the run's last read of the bound keys'
//!    prefix ([`WatchOp::Leftover`]), made when no client is left to keep
//!    a session alive and more than a TTL after a full restart, finds no
//!    key: an abandoned session expired and took its keys.
//!
//! Unknown writes may or may not appear; rules 2 and 6 still hold them to
//! one story across every watcher.

use std::collections::{BTreeMap, BTreeSet};

use crate::history::{Event, History, Key, Op, Operation, Outcome, Value, WatchChange, WatchOp};
use crate::order::later_lower;
use crate::verdict::{conclude, Verdict, Violation};

mod walk;

use walk::{walk, Item, Message, Watcher};

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "watch";

/// Detailed violations collected per rule.
const MAX_PER_RULE: usize = 64;

/// An ok list: revision, keys, operation.
type List<'h> = (u64, &'h BTreeMap<Key, Value>, &'h Operation);

/// Checks rules 1-9.
pub fn check(history: &History) -> Verdict {
    let mut writes: Vec<&Operation> = Vec::new();
    let mut gones: Vec<&Operation> = Vec::new();
    let mut leftovers: Vec<&Operation> = Vec::new();
    let mut lists: Vec<List> = Vec::new();
    let mut items: BTreeMap<u64, Vec<(u64, Item)>> = BTreeMap::new();
    let mut examined = 0u64;
    for op in history.operations() {
        match op.op() {
            Op::Watch(WatchOp::Write { .. }) => {
                examined += 1;
                writes.push(op);
            }
            Op::Watch(WatchOp::List {
                revision: Some(r),
                values: Some(v),
            }) if op.outcome() == Outcome::Ok => {
                examined += 1;
                lists.push((*r, v, op));
                let index = op.completion.as_ref().map_or(op.invoke.index, |c| c.index);
                items
                    .entry(op.process)
                    .or_default()
                    .push((index, Item::List(*r, v, op)));
            }
            Op::Watch(WatchOp::List { .. }) => examined += 1,
            Op::Watch(WatchOp::Gone { .. }) => {
                examined += 1;
                gones.push(op);
            }
            Op::Watch(WatchOp::Leftover { .. }) => {
                examined += 1;
                leftovers.push(op);
            }
            _ => {}
        }
    }
    for e in history.instants() {
        if let Op::Watch(_) = e.op {
            examined += 1;
            items
                .entry(e.process)
                .or_default()
                .push((e.index, Item::Instant(e)));
        }
    }
    if items.is_empty() && writes.is_empty() {
        return Verdict::pass(NAME, 0, "no watch workload in this history");
    }
    let mut violations = Vec::new();
    let mut order = Vec::new();
    let watchers: Vec<Watcher> = items
        .into_iter()
        .map(|(process, mut items)| {
            items.sort_by_key(|(index, _)| *index);
            walk(
                process,
                items.into_iter().map(|(_, item)| item).collect(),
                &mut order,
            )
        })
        .collect();
    order.truncate(MAX_PER_RULE);
    violations.extend(order);
    let acked: Vec<(&Operation, u64)> = writes
        .iter()
        .filter_map(|op| match op.op() {
            Op::Watch(WatchOp::Write {
                revision: Some(r), ..
            }) if op.outcome() == Outcome::Ok => Some((*op, *r)),
            _ => None,
        })
        .collect();
    agreement(&watchers, &mut violations);
    acknowledged(&watchers, &acked, &mut violations);
    validity(&watchers, &writes, &mut violations);
    real_time(&acked, &mut violations);
    list_then_watch(&watchers, &lists, &mut violations);
    sessions_end_together(&watchers, &writes, &mut violations);
    closes_take_their_keys(&gones, &mut violations);
    every_session_ends(&leftovers, &mut violations);
    let revisions: usize = watchers.iter().map(|w| w.messages.len()).sum();
    let pass = format!(
        "{} watcher(s) received {revisions} change message(s) over {} span(s); {} acknowledged \
         write(s) and {} list(s) agree with them",
        watchers.len(),
        watchers.iter().map(|w| w.spans.len()).sum::<usize>(),
        acked.len(),
        lists.len()
    );
    conclude(NAME, examined, pass, violations)
}

/// Rule 2: every watcher covering a revision got the same message at it.
fn agreement(watchers: &[Watcher], violations: &mut Vec<Violation>) {
    let mut first: BTreeMap<u64, (u64, &Message)> = BTreeMap::new();
    for w in watchers {
        for (r, m) in &w.messages {
            first.entry(*r).or_insert((w.process, m));
        }
    }
    let mut found = Vec::new();
    for w in watchers {
        for (a, b) in &w.spans {
            for (r, (p, m)) in first.range(*a..=*b) {
                let what = match w.messages.get(r) {
                    Some(mine) if mine.changes == m.changes => continue,
                    Some(mine) => format!(
                        "watcher p{} received {} at revision {r}, but watcher p{p} received {}",
                        w.process,
                        show(mine.changes),
                        show(m.changes)
                    ),
                    None => format!(
                        "watcher p{} saw every change of revisions {a}..={b} but not those of \
                         revision {r}, which watcher p{p} received: {}",
                        w.process,
                        show(m.changes)
                    ),
                };
                let mut events = w.around(*r);
                events.push(m.event.clone());
                found.push(Violation::new(what, events));
                if found.len() >= MAX_PER_RULE {
                    violations.extend(found);
                    return;
                }
            }
        }
    }
    violations.extend(found);
}

/// Rule 3: an acknowledged write's puts reach every watcher covering it.
fn acknowledged(
    watchers: &[Watcher],
    acked: &[(&Operation, u64)],
    violations: &mut Vec<Violation>,
) {
    let mut found = Vec::new();
    for (op, r) in acked {
        let Op::Watch(WatchOp::Write { changes, .. }) = op.op() else {
            continue;
        };
        for w in watchers.iter().filter(|w| w.covers(*r)) {
            let got = w.messages.get(r).map(|m| m.changes);
            let missing: Vec<&WatchChange> = changes
                .iter()
                .filter(|c| c.value.is_some() && !got.is_some_and(|g| g.contains(c)))
                .collect();
            if missing.is_empty() {
                continue;
            }
            let mut events = op.events();
            events.extend(w.around(*r));
            found.push(Violation::new(
                format!(
                    "the write acknowledged at revision {r} put{} but watcher p{}, which saw \
                     every change around it, received {}",
                    missing
                        .iter()
                        .map(|c| format!(" {:?} = {}", c.key, c.value.as_deref().unwrap_or("")))
                        .collect::<String>(),
                    w.process,
                    got.map_or_else(|| "nothing at that revision".to_owned(), show)
                ),
                events,
            ));
            if found.len() >= MAX_PER_RULE {
                violations.extend(found);
                return;
            }
        }
    }
    violations.extend(found);
}

/// Rule 4: every change received was written, once.
fn validity(watchers: &[Watcher], writes: &[&Operation], violations: &mut Vec<Violation>) {
    // (key, value) -> the writes that put it; key -> the writes deleting it.
    let mut puts: BTreeMap<(&str, &str), Vec<&Operation>> = BTreeMap::new();
    let mut deletes: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    // A bound put may be undone by its session's end: it explains a delete
    // of its key at a later revision.
    let mut bound: BTreeMap<&str, Vec<&Operation>> = BTreeMap::new();
    for op in writes {
        let Op::Watch(WatchOp::Write {
            changes, session, ..
        }) = op.op()
        else {
            continue;
        };
        for c in changes {
            match &c.value {
                Some(v) => {
                    puts.entry((&c.key, v)).or_default().push(op);
                    if session.is_some() {
                        bound.entry(&c.key).or_default().push(op);
                    }
                }
                None => deletes.entry(&c.key).or_default().push(op),
            }
        }
    }
    let mut first_seen: BTreeMap<(&str, &str), (u64, &Event)> = BTreeMap::new();
    let mut found = Vec::new();
    for w in watchers {
        for (r, m) in &w.messages {
            for c in m.changes {
                let candidates = match &c.value {
                    Some(v) => puts.get(&(c.key.as_str(), v.as_str())).cloned(),
                    None => {
                        let mut ops = deletes.get(c.key.as_str()).cloned().unwrap_or_default();
                        ops.extend(bound.get(c.key.as_str()).into_iter().flatten());
                        (!ops.is_empty()).then_some(ops)
                    }
                };
                let fits = |op: &&Operation| {
                    let at = match op.op() {
                        Op::Watch(WatchOp::Write {
                            revision: Some(at), ..
                        }) if op.outcome() == Outcome::Ok => Some(*at),
                        _ => None,
                    };
                    // A bound put explains a delete by its session's end,
                    // at a later revision.
                    let ends_session = c.value.is_none()
                        && matches!(
                            op.op(),
                            Op::Watch(WatchOp::Write {
                                session: Some(_),
                                ..
                            })
                        );
                    op.outcome() != Outcome::Fail
                        && op.invoke_ns() <= m.event.time_ns
                        && match (at, ends_session) {
                            (Some(at), true) => at < *r,
                            (Some(at), false) => at == *r,
                            (None, _) => true,
                        }
                };
                let wrong = match &candidates {
                    None => Some((
                        format!("nobody wrote {}", show(std::slice::from_ref(c))),
                        Vec::new(),
                    )),
                    Some(ops) if !ops.iter().any(fits) => Some((
                        format!(
                            "no write that could have made {} at revision {r} (each failed, \
                             began after it arrived, or was acknowledged at another revision)",
                            show(std::slice::from_ref(c))
                        ),
                        ops.iter().flat_map(|op| op.events()).collect(),
                    )),
                    Some(_) => None,
                };
                if let Some((why, mut events)) = wrong {
                    events.push(m.event.clone());
                    found.push(Violation::new(
                        format!("watcher p{} received a change that {why}", w.process),
                        events,
                    ));
                }
                if let Some(v) = &c.value {
                    let (at, e) = *first_seen
                        .entry((c.key.as_str(), v.as_str()))
                        .or_insert((*r, m.event));
                    if at != *r {
                        found.push(Violation::new(
                            format!(
                                "{:?} = {v} arrived at revision {at} and again at revision {r}: \
                                 one put applied twice",
                                c.key
                            ),
                            vec![e.clone(), m.event.clone()],
                        ));
                    }
                }
                if found.len() >= MAX_PER_RULE {
                    violations.extend(found);
                    return;
                }
            }
        }
    }
    violations.extend(found);
}

/// Rule 5: acknowledged writes' revisions are distinct and follow real
/// time.
fn real_time(acked: &[(&Operation, u64)], violations: &mut Vec<Violation>) {
    let mut by_revision: BTreeMap<u64, &Operation> = BTreeMap::new();
    for (op, r) in acked {
        if let Some(other) = by_revision.insert(*r, op) {
            let mut events = other.events();
            events.extend(op.events());
            violations.push(Violation::new(
                format!("two acknowledged writes share revision {r}"),
                events,
            ));
        }
    }
    for (i, j) in later_lower(acked, acked, MAX_PER_RULE) {
        if let (Some((a, ra)), Some((b, rb))) = (acked.get(i), acked.get(j)) {
            let mut events = a.events();
            events.extend(b.events());
            violations.push(Violation::new(
                format!(
                    "a write acknowledged at revision {ra} ended before a write that got the \
                     lower revision {rb} began"
                ),
                events,
            ));
        }
    }
}

/// Rule 6: each list equals what a watcher covering its revision computes.
fn list_then_watch(watchers: &[Watcher], lists: &[List], violations: &mut Vec<Violation>) {
    let mut found = Vec::new();
    for (at, values, op) in lists {
        let listed: BTreeMap<&str, &str> = values
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for w in watchers {
            for run in w
                .runs
                .iter()
                .filter(|run| run.base_rev <= *at && *at <= run.last)
            {
                let state = run.state_at(w, *at);
                if state == listed {
                    continue;
                }
                let mut events = op.events();
                events.extend(run.list.events());
                events.extend(w.around(*at));
                found.push(Violation::new(
                    format!(
                        "a list at revision {at} read {listed:?}, but watcher p{}'s list at \
                         revision {} and the changes it received after make {state:?}",
                        w.process, run.base_rev
                    ),
                    events,
                ));
                if found.len() >= MAX_PER_RULE {
                    violations.extend(found);
                    return;
                }
            }
        }
    }
    violations.extend(found);
}

/// Rule 7: the keys bound to one session, deleted by no write, are
/// deleted at one revision.
fn sessions_end_together(
    watchers: &[Watcher],
    writes: &[&Operation],
    violations: &mut Vec<Violation>,
) {
    // Key -> its session (`None`: bound to more than one), and the keys
    // some write deletes.
    let mut session_of: BTreeMap<&str, Option<u64>> = BTreeMap::new();
    let mut deleted: BTreeSet<&str> = BTreeSet::new();
    for op in writes {
        let Op::Watch(WatchOp::Write {
            changes, session, ..
        }) = op.op()
        else {
            continue;
        };
        for c in changes {
            match (&c.value, session) {
                (Some(_), Some(s)) => {
                    let entry = session_of.entry(&c.key).or_insert(Some(*s));
                    if *entry != Some(*s) {
                        *entry = None;
                    }
                }
                (None, _) => {
                    deleted.insert(&c.key);
                }
                (Some(_), None) => {}
            }
        }
    }
    // Session -> revision -> a message that deleted one of its keys there.
    let mut ends: BTreeMap<u64, BTreeMap<u64, &Event>> = BTreeMap::new();
    for w in watchers {
        for (r, m) in &w.messages {
            for c in m.changes.iter().filter(|c| c.value.is_none()) {
                if deleted.contains(c.key.as_str()) {
                    continue;
                }
                if let Some(Some(s)) = session_of.get(c.key.as_str()) {
                    ends.entry(*s).or_default().entry(*r).or_insert(m.event);
                }
            }
        }
    }
    for (session, at) in ends {
        if at.len() > 1 {
            let revisions: Vec<u64> = at.keys().copied().collect();
            violations.push(Violation::new(
                format!(
                    "the keys bound to session {session} were deleted at revisions \
                     {revisions:?}: a session's end deletes them all at one revision"
                ),
                at.values().map(|e| (*e).clone()).collect(),
            ));
        }
    }
}

/// Rule 8: after an acknowledged close, the session's key is gone.
fn closes_take_their_keys(gones: &[&Operation], violations: &mut Vec<Violation>) {
    for op in gones {
        if let (
            Outcome::Ok,
            Op::Watch(WatchOp::Gone {
                key,
                session,
                present: Some(true),
            }),
        ) = (op.outcome(), op.op())
        {
            violations.push(Violation::new(
                format!(
                    "{key:?} was still there after its session {session} was closed: a close \
                     deletes the session's keys in the same step"
                ),
                op.events(),
            ));
        }
    }
}

/// Rule 9: the run's last read finds no key bound to a session: every
/// session ended. A final read that failed proves nothing either way.
fn every_session_ends(leftovers: &[&Operation], violations: &mut Vec<Violation>) {
    for op in leftovers {
        if let (
            Outcome::Ok,
            Op::Watch(WatchOp::Leftover {
                prefix,
                keys: Some(keys),
            }),
        ) = (op.outcome(), op.op())
        {
            if !keys.is_empty() {
                violations.push(Violation::new(
                    format!(
                        "{} key(s) under {prefix:?} outlived every session that could hold them \
                         (no client left, a full restart, then more than a TTL): {:?}",
                        keys.len(),
                        keys.iter().take(8).collect::<Vec<_>>()
                    ),
                    op.events(),
                ));
            }
        }
    }
}

/// Changes as ` "k" = v, "j" = <absent>`.
fn show(changes: &[WatchChange]) -> String {
    let parts: Vec<String> = changes
        .iter()
        .map(|c| format!("{:?} = {}", c.key, c.value.as_deref().unwrap_or("<absent>")))
        .collect();
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests;
