//! When the leader records how long a countdown has left
//! ([`LockCommand::Checkpoint`](latchkey_core::lock::LockCommand::Checkpoint)),
//! so that a failover stretches a dead holder's session or a lease only a
//! little (see the module docs of `crate::locks`, *Why failovers stretch a
//! countdown only a little*).
//!
//! Only numbers live here; [`super::timers::Timers`] keeps the countdowns
//! and builds the checkpoint, and the lock task proposes it.

use std::time::Duration;

/// The shortest gap between two records of one countdown, so that short
/// TTLs and leases do not turn into a stream of log entries; also the
/// width of the leader's record slots, to which every record is rounded
/// up, so the leader proposes at most one checkpoint per slot.
pub(crate) const MIN_RECORD_EVERY: Duration = Duration::from_millis(250);

/// How long a session may go without a keep-alive before the leader
/// records its countdown: half its TTL. A healthy client sends one every
/// third of its TTL, so its sessions are never recorded while the leader
/// stays; a third of the TTL would race with every keep-alive.
pub(crate) fn lagging_after(ttl: Duration) -> Duration {
    (ttl / 2).max(MIN_RECORD_EVERY)
}

/// How often a lagging session is recorded again, and how soon a new
/// leader first records every session it took over: every record slot.
/// This, plus the wait for a slot, is the most a failover stretches a
/// session that was recorded before it, on top of the time the cluster had
/// no ready leader. As short as the slots allow because leaders that fail
/// one after another make progress only while they lead: a leader killed
/// before its first record leaves the countdown where it found it. It
/// costs at most one small entry per slot while any session lags (a dead
/// client's session lags until it expires).
pub(crate) const RECORD_SESSIONS_EVERY: Duration = MIN_RECORD_EVERY;

/// How often a lease `full` long is recorded, and how soon a new leader
/// first records every lease it took over: an eighth of its length, at
/// least [`MIN_RECORD_EVERY`] (a lease is held by a live client, recorded
/// for as long as it is held, and each record rewrites its lock's record).
pub(crate) fn record_every(full: Duration) -> Duration {
    (full / 8).max(MIN_RECORD_EVERY)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_follow_the_length_with_a_floor() {
        let s = Duration::from_secs;
        assert_eq!(lagging_after(s(10)), s(5));
        assert_eq!(record_every(s(8)), s(1));
        assert_eq!(record_every(s(1)), MIN_RECORD_EVERY);
        assert_eq!(lagging_after(Duration::ZERO), MIN_RECORD_EVERY);
    }
}
