//! A dead holder's lock across leader churn: freed within its TTL plus
//! the documented failover bound, never before its lease ran out.
//!
//! The history's leader-churn phase ([`ChurnOp`]): a holder takes a lock
//! in a session with a short TTL, tells how long its client vouches for
//! the lease ([`ChurnOp::Vouched`]) and is SIGKILLed
//! ([`ChurnOp::HolderKilled`]); a waiter is queued for the lock; while the
//! holder is dead the harness kills the leader several times
//! ([`ChurnOp::LeaderKilled`]) and notes when a new leader serves reads
//! ([`ChurnOp::LeaderReady`]).
//!
//! The server's lock module documents ("Why failovers stretch a countdown
//! only a little") that each leader change lengthens a dead holder's
//! countdown by at most the time since its last record (half the TTL for
//! the first change after a keep-alive, [`RECORD_EVERY_MS`] for the next
//! ones) plus up to [`RECORD_SLOT_WAIT_MS`] waiting for a record slot, plus
//! the time the cluster had no ready leader. For the run at hand, with `n`
//! leader changes between the holder's kill and the waiter's grant and `L`
//! the time from each kill to the next ready leader, summed:
//!
//! ```text
//! extension = (waiter's grant - holder's kill) - TTL
//! bound     = TTL/2 + n × (RECORD_EVERY_MS + RECORD_SLOT_WAIT_MS) + L + OBSERVATION_ALLOWANCE_MS
//!             (without a leader change: L + OBSERVATION_ALLOWANCE_MS)
//! ```
//!
//! Timing belongs in benchmarks, never in pass/fail verdicts (the machine
//! is shared and noisy), so the verdict fails only when the lock leaked or
//! was freed too early:
//!
//! 1. **Never before the lease ran out**: the waiter is not granted before
//!    the holder was killed, nor before the last time the holder's client
//!    vouched for its lease (its last acknowledged keep-alive's send plus
//!    the TTL, less the client's margin: exact, no allowance; the server
//!    counts from the keep-alive's arrival, later still), and its token is
//!    above the holder's.
//! 2. **No leak**: the waiter is granted, with an extension of at most
//!    [`LEAK_FACTOR`] × bound + [`LEAK_SLACK_MS`]. A waiter that stopped
//!    waiting before that point without a grant proves nothing either way:
//!    inconclusive.
//!
//! An extension over the bound but short of a leak passes, with a note;
//! the message and the notes give the measured extension, the bound, the
//! leader changes and the time without a ready leader either way. A phase
//! that was skipped, or in which no leader was killed while the holder was
//! dead, is inconclusive (after rules 1 and 2, which still apply).

use crate::history::{ChurnOp, ChurnRole, Event, History, Op, Operation, Outcome};
use crate::verdict::Verdict;

/// The checker's name in its [`Verdict`].
pub const NAME: &str = "abandoned lock";

/// How often a leader records a session's countdown once it has gone half
/// its TTL without a keep-alive, and how soon after taking over it records
/// every session: what a leader change after the first can leave
/// unrecorded (`RECORD_SESSIONS_EVERY` in the server's
/// `locks/checkpoints.rs`).
pub const RECORD_EVERY_MS: u64 = 250;

/// How long a due record may wait for its slot (records of many
/// countdowns share one entry per 250 ms slot).
pub const RECORD_SLOT_WAIT_MS: u64 = 250;

/// What the bound allows for observing the freeing rather than the
/// freeing itself: from the leader's expiry of the dead session to the
/// waiter's grant being recorded there is the expiry's commit (a quorum
/// fsync), the grant's notice to the waiting client, and the recorder;
/// and the holder's kill is stamped once its process was reaped. On a
/// loaded two-core machine that is hundreds of milliseconds at worst.
pub const OBSERVATION_ALLOWANCE_MS: u64 = 1_000;

/// A grant later than this many bounds (plus [`LEAK_SLACK_MS`]) past the
/// TTL means the lock leaked: no scheduling noise stretches a bound three
/// times over.
pub const LEAK_FACTOR: u64 = 3;

/// Added to [`LEAK_FACTOR`] × bound before a late grant counts as a leak:
/// room for a machine stalled by other work for seconds.
pub const LEAK_SLACK_MS: u64 = 10_000;

const MS: u64 = 1_000_000;

/// The documented bound on the extension, in ns, for a session of
/// `ttl_ms` across `leader_changes` changes with `leaderless_ns` without
/// a ready leader (see the module docs).
pub fn bound_ns(ttl_ms: u64, leader_changes: u64, leaderless_ns: u64) -> u64 {
    let changes = if leader_changes == 0 {
        0
    } else {
        (ttl_ms * MS / 2).saturating_add(
            leader_changes.saturating_mul((RECORD_EVERY_MS + RECORD_SLOT_WAIT_MS) * MS),
        )
    };
    changes
        .saturating_add(leaderless_ns)
        .saturating_add(OBSERVATION_ALLOWANCE_MS * MS)
}

/// The extension past which the lock counts as leaked, in ns, for a
/// bound of `bound_ns`: [`LEAK_FACTOR`] × bound + [`LEAK_SLACK_MS`].
pub fn leak_after_ns(bound_ns: u64) -> u64 {
    bound_ns
        .saturating_mul(LEAK_FACTOR)
        .saturating_add(LEAK_SLACK_MS * MS)
}

/// What the leader-churn phase of a history measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measure {
    /// The lock.
    pub resource: String,
    /// The holder's session TTL, in ms.
    pub ttl_ms: u64,
    /// When the holder was killed (the recorder's clock, ns).
    pub killed_ns: u64,
    /// When the waiter was granted the lock, if it was.
    pub granted_ns: Option<u64>,
    /// From the kill to the grant, or to the end of the waiter's last
    /// attempt when it was never granted, in ns.
    pub waited_ns: u64,
    /// Leader changes between the holder's kill and the grant (or the end
    /// of the waiting): the leaders killed, or the terms seen leading
    /// after the first (a leader may also change on its own), whichever
    /// is more.
    pub leader_changes: u64,
    /// How long of that the cluster had no ready leader (from each kill to
    /// the next leader seen serving reads, overlaps counted once), in ns.
    pub leaderless_ns: u64,
    /// The documented bound for these numbers ([`bound_ns`]).
    pub bound_ns: u64,
    /// The grant's lateness past the kill plus the TTL, in ns (negative:
    /// earlier: the countdown started at the last keep-alive, before the
    /// kill).
    pub extension_ns: Option<i64>,
    /// The grant's lateness past the lease the holder's client last
    /// vouched for, in ns (negative: a safety violation).
    pub past_vouched_ns: Option<i64>,
    /// The extension past which the lock counts as leaked
    /// ([`leak_after_ns`]).
    pub leak_after_ns: u64,
    /// Why the phase was skipped, if the harness said so.
    pub skipped: Option<String>,
}

impl Measure {
    /// True when the grant came within the bound.
    pub fn within_bound(&self) -> bool {
        self.extension_ns
            .is_some_and(|e| e <= i64::try_from(self.bound_ns).unwrap_or(i64::MAX))
    }

    /// One line of numbers, for notes and reports.
    pub fn numbers(&self) -> String {
        let mut s = match self.extension_ns {
            Some(e) => format!(
                "extension {:.2} s (freed {:.2} s after the holder's kill, TTL {:.2} s)",
                e as f64 / 1e9,
                secs(self.waited_ns),
                self.ttl_ms as f64 / 1e3
            ),
            None => format!(
                "never granted in {:.2} s of waiting after the holder's kill (TTL {:.2} s)",
                secs(self.waited_ns),
                self.ttl_ms as f64 / 1e3
            ),
        };
        s.push_str(&format!(
            "; bound {:.2} s ({} leader change(s), {:.2} s without a ready leader, {:.2} s \
             observation allowance); a leak past an extension of {:.2} s",
            secs(self.bound_ns),
            self.leader_changes,
            secs(self.leaderless_ns),
            OBSERVATION_ALLOWANCE_MS as f64 / 1e3,
            secs(self.leak_after_ns)
        ));
        if let Some(p) = self.past_vouched_ns {
            s.push_str(&format!(
                "; {:.2} s after the lease its client last vouched for",
                p as f64 / 1e9
            ));
        }
        s
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The phase's events, as read from a history.
struct Phase<'h> {
    ops_checked: u64,
    holder: &'h Operation,
    resource: &'h str,
    holder_name: &'h str,
    ttl_ms: u64,
    holder_token: u64,
    killed: &'h Event,
    /// The latest vouched-for lease of the holder.
    vouched: Option<(&'h Event, u64)>,
    waiters: Vec<&'h Operation>,
    /// When leaders were killed and seen ready, with their terms, in
    /// history order.
    kills: Vec<(u64, u64)>,
    readies: Vec<(u64, u64)>,
    skipped: Option<&'h str>,
    last_ns: u64,
}

/// Reads the phase; `Err` says why there is nothing to judge.
fn read(history: &History) -> Result<Phase<'_>, String> {
    let mut ops_checked = 0u64;
    let mut skipped = None;
    let mut holders = Vec::new();
    let mut waiters = Vec::new();
    for op in history.operations() {
        if let Op::Churn(ChurnOp::Acquire { role, .. }) = op.op() {
            ops_checked += 1;
            match role {
                ChurnRole::Holder => holders.push(op),
                ChurnRole::Waiter => waiters.push(op),
            }
        }
    }
    let instants: Vec<&Event> = history
        .instants()
        .iter()
        .filter(|e| matches!(e.op, Op::Churn(_)))
        .collect();
    ops_checked += instants.len() as u64;
    for e in &instants {
        if let Op::Churn(ChurnOp::Skipped { reason }) = &e.op {
            skipped.get_or_insert(reason.as_str());
        }
    }
    if ops_checked == 0 {
        return Err("no leader-churn phase in this history".into());
    }
    let why = |what: &str| match skipped {
        Some(reason) => format!("{what}: the phase was skipped: {reason}"),
        None => what.to_owned(),
    };
    let Some((holder, resource, holder_name, ttl_ms, holder_token)) =
        holders.iter().find_map(|op| match op.op() {
            Op::Churn(ChurnOp::Acquire {
                resource,
                holder,
                ttl_ms,
                token: Some(token),
                ..
            }) if op.outcome() == Outcome::Ok => {
                Some((*op, resource.as_str(), holder.as_str(), *ttl_ms, *token))
            }
            _ => None,
        })
    else {
        return Err(why("the holder was never granted the lock"));
    };
    let killed = instants.iter().copied().find(|e| {
        matches!(&e.op, Op::Churn(ChurnOp::HolderKilled { resource: r, holder: h })
            if r == resource && h == holder_name)
    });
    let Some(killed) = killed else {
        return Err(why("the holder was never killed"));
    };
    let mut vouched: Option<(&Event, u64)> = None;
    let mut kills = Vec::new();
    let mut readies = Vec::new();
    for e in &instants {
        match &e.op {
            Op::Churn(ChurnOp::Vouched {
                resource: r,
                holder: h,
                until_ns,
            }) if r == resource
                && h == holder_name
                && vouched.is_none_or(|(_, u)| *until_ns > u) =>
            {
                vouched = Some((e, *until_ns));
            }
            Op::Churn(ChurnOp::LeaderKilled { term, .. }) => kills.push((e.time_ns, *term)),
            Op::Churn(ChurnOp::LeaderReady { term, .. }) => readies.push((e.time_ns, *term)),
            _ => {}
        }
    }
    let waiters: Vec<&Operation> = waiters
        .into_iter()
        .filter(|op| {
            matches!(op.op(), Op::Churn(ChurnOp::Acquire { resource: r, .. }) if r == resource)
        })
        .collect();
    if waiters.is_empty() {
        return Err(why("no waiter queued for the lock"));
    }
    let last_ns = history.events().last().map_or(0, |e| e.time_ns);
    Ok(Phase {
        ops_checked,
        holder,
        resource,
        holder_name,
        ttl_ms,
        holder_token,
        killed,
        vouched,
        waiters,
        kills,
        readies,
        skipped,
        last_ns,
    })
}

impl Phase<'_> {
    /// The waiter's first grant: the operation, its grant's time, token.
    fn grant(&self) -> Option<(&Operation, u64, u64)> {
        self.waiters
            .iter()
            .filter_map(|op| match (op.op(), op.definite_end_ns()) {
                (
                    Op::Churn(ChurnOp::Acquire {
                        token: Some(token), ..
                    }),
                    Some(end),
                ) if op.outcome() == Outcome::Ok => Some((*op, end, *token)),
                _ => None,
            })
            .min_by_key(|(op, end, _)| (*end, op.invoke.index))
    }

    /// When the waiter stopped waiting without a grant: the latest end of
    /// its attempts (an attempt still open ends with the history).
    fn waited_until(&self) -> u64 {
        self.waiters
            .iter()
            .map(|op| op.completion.as_ref().map_or(self.last_ns, |c| c.time_ns))
            .max()
            .unwrap_or(self.last_ns)
    }

    fn measure(&self) -> Measure {
        let grant = self.grant();
        let end = grant.map_or_else(|| self.waited_until(), |(_, at, _)| at);
        let from = self.killed.time_ns;
        // Each kill in [from, end) is a leader change; it has no ready
        // leader until the next ready after it (or the end).
        let mut kills = 0u64;
        let mut leaderless = 0u64;
        let mut covered_to = from;
        let during = |at: u64| at >= from && at < end;
        for &(at, _) in &self.kills {
            if !during(at) {
                continue;
            }
            kills += 1;
            let ready = self
                .readies
                .iter()
                .map(|&(r, _)| r)
                .find(|r| *r >= at)
                .unwrap_or(end)
                .min(end);
            let start = at.max(covered_to);
            leaderless += ready.saturating_sub(start);
            covered_to = covered_to.max(ready);
        }
        // A leader may also change on its own between two kills: every
        // term seen leading in the window after the first is a change.
        let terms: std::collections::BTreeSet<u64> = self
            .kills
            .iter()
            .chain(&self.readies)
            .filter(|(at, _)| during(*at))
            .map(|&(_, term)| term)
            .collect();
        let changes = kills.max((terms.len() as u64).saturating_sub(1));
        let bound = bound_ns(self.ttl_ms, changes, leaderless);
        let ttl_ns = self.ttl_ms.saturating_mul(MS);
        let signed = |a: u64, b: u64| {
            i64::try_from(a).unwrap_or(i64::MAX) - i64::try_from(b).unwrap_or(i64::MAX)
        };
        Measure {
            resource: self.resource.to_owned(),
            ttl_ms: self.ttl_ms,
            killed_ns: from,
            granted_ns: grant.map(|(_, at, _)| at),
            waited_ns: end.saturating_sub(from),
            leader_changes: changes,
            leaderless_ns: leaderless,
            bound_ns: bound,
            extension_ns: grant.map(|(_, at, _)| signed(at, from.saturating_add(ttl_ns))),
            past_vouched_ns: grant
                .zip(self.vouched)
                .map(|((_, at, _), (_, until))| signed(at, until)),
            leak_after_ns: leak_after_ns(bound),
            skipped: self.skipped.map(str::to_owned),
        }
    }
}

/// What the leader-churn phase of `history` measured; `Err` says why
/// there is nothing to measure (no phase, skipped before the holder was
/// killed, no waiter).
pub fn measure(history: &History) -> Result<Measure, String> {
    read(history).map(|p| p.measure())
}

/// Checks rules 1 and 2 (see the module docs).
pub fn check(history: &History) -> Verdict {
    let phase = match read(history) {
        Ok(p) => p,
        Err(why) => {
            let n = history
                .events()
                .iter()
                .filter(|e| matches!(e.op, Op::Churn(_)))
                .count() as u64;
            return Verdict::inconclusive(NAME, n, why);
        }
    };
    let m = phase.measure();
    let n = phase.ops_checked;
    let who = format!("{:?} of {}", phase.resource, phase.holder_name);
    let numbers = m.numbers();
    let fail = |message: String, events: Vec<Event>| {
        let mut verdict = Verdict::fail(NAME, n, message, events);
        verdict.notes.push(numbers.clone());
        verdict
    };

    // Rule 1: never before the lease ran out.
    if let Some((op, at, token)) = phase.grant() {
        let mut events = phase.holder.events();
        events.push(phase.killed.clone());
        events.extend(op.events());
        if at < phase.killed.time_ns {
            return fail(
                format!(
                    "the lock {who} was granted to the waiter {:.3} s before the holder was \
                     killed, while it kept its session alive",
                    secs(phase.killed.time_ns - at)
                ),
                events,
            );
        }
        if let Some((vouched, until)) = phase.vouched {
            if at < until {
                events.push(vouched.clone());
                return fail(
                    format!(
                        "the lock {who} was granted to the waiter {:.3} s before the lease its \
                         dead holder's client last vouched for ran out: its session ended early",
                        secs(until - at)
                    ),
                    events,
                );
            }
        }
        if token <= phase.holder_token {
            return fail(
                format!(
                    "the waiter was granted {:?} with token {token}, not above the dead \
                     holder's {}",
                    phase.resource, phase.holder_token
                ),
                events,
            );
        }
    }

    // Rule 2: no leak.
    match m.extension_ns {
        Some(e) if e > i64::try_from(m.leak_after_ns).unwrap_or(i64::MAX) => {
            let mut events = phase.holder.events();
            events.push(phase.killed.clone());
            if let Some((op, _, _)) = phase.grant() {
                events.extend(op.events());
            }
            return fail(
                format!(
                    "the lock {who} leaked: it was freed {:.2} s after its holder's kill, an \
                     extension of {:.2} s past the TTL, more than {LEAK_FACTOR} × the bound \
                     {:.2} s + {} s",
                    secs(m.waited_ns),
                    e as f64 / 1e9,
                    secs(m.bound_ns),
                    LEAK_SLACK_MS / 1000
                ),
                events,
            );
        }
        Some(_) => {}
        None => {
            let deadline = m.ttl_ms.saturating_mul(MS).saturating_add(m.leak_after_ns);
            if m.waited_ns > deadline {
                let mut events = phase.holder.events();
                events.push(phase.killed.clone());
                if let Some(last) = phase.waiters.last() {
                    events.extend(last.events());
                }
                return fail(
                    format!(
                        "the lock {who} leaked: never granted to the waiter, which waited \
                         {:.2} s after the holder's kill (a leak past {:.2} s)",
                        secs(m.waited_ns),
                        secs(deadline)
                    ),
                    events,
                );
            }
            let mut v = Verdict::inconclusive(
                NAME,
                n,
                format!(
                    "the waiter stopped waiting for {who} {:.2} s after the holder's kill, \
                     without a grant, before it could count as leaked ({:.2} s){}",
                    secs(m.waited_ns),
                    secs(deadline),
                    skipped_text(&m)
                ),
            );
            v.notes.push(numbers);
            return v;
        }
    }

    if m.leader_changes == 0 || m.skipped.is_some() {
        let why = if m.leader_changes == 0 {
            "no leader was killed while the holder was dead"
        } else {
            "the phase did not run as planned"
        };
        let mut v = Verdict::inconclusive(
            NAME,
            n,
            format!(
                "the lock {who} was freed without a leak, but {why}{}",
                skipped_text(&m)
            ),
        );
        v.notes.push(numbers);
        return v;
    }
    let extension = m.extension_ns.unwrap_or(0) as f64 / 1e9;
    let mut v = Verdict::pass(
        NAME,
        n,
        format!(
            "the lock {who} was freed {:.2} s after its holder's kill across {} leader \
             change(s): extension {extension:.2} s, {} the bound {:.2} s; never before the \
             lease its client vouched for",
            secs(m.waited_ns),
            m.leader_changes,
            if m.within_bound() { "within" } else { "OVER" },
            secs(m.bound_ns),
        ),
    );
    v.notes.push(numbers);
    if !m.within_bound() {
        v.notes.push(format!(
            "over the documented bound by {:.2} s: reported, not failed (timing on a shared \
             machine is no verdict; a leak is past {:.2} s)",
            extension - secs(m.bound_ns),
            secs(m.leak_after_ns)
        ));
    }
    v
}

fn skipped_text(m: &Measure) -> String {
    match &m.skipped {
        Some(reason) => format!(" (the harness skipped the rest: {reason})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests;
