//! The watchdog: a session's lease as the client judges it ([`LeaseState`]:
//! until when it is vouched for, and from when it is at risk) and the
//! background task that renews it with keep-alives until it is lost. The session (`session.rs`) starts it and reads the state it
//! publishes; it knows nothing of sessions but their id and secret.

use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use latchkey_core::lock::{ForcedReleases, LockOutcome, SessionId, SessionSecret, Token};
use latchkey_core::{CommandResult, Outcome};
use tokio::sync::watch;

use super::lease_clock;
use crate::error::Error;
use crate::kv::Client;
use crate::writer;

impl Client {
    /// One keep-alive, retried across replicas until `within` has passed;
    /// also answers when the acknowledged attempt was sent.
    async fn keep_alive_call(
        &self,
        session: SessionId,
        secret: SessionSecret,
        within: Duration,
    ) -> Result<(CommandResult, Instant), Error> {
        let mut sent = lease_clock::now();
        let result = writer::keep_alive(self.router(), session, secret, within, || {
            sent = lease_clock::now();
        })
        .await?;
        Ok((result, sent))
    }
}

#[derive(Debug, Clone)]
pub(super) struct LeaseState {
    /// Until when the lease is vouched for, on the lease clock.
    pub(super) valid_until: Instant,
    /// From when the session is at risk if no keep-alive is acknowledged
    /// meanwhile: the send of the last acknowledged one plus two thirds of
    /// the TTL, that is, once the next one, due a third of the TTL after
    /// it, has gone unacknowledged for another third.
    pub(super) at_risk_from: Instant,
    /// Why the session is lost, once it is (sticky).
    pub(super) lost: Option<String>,
    /// How many of the session's grants the cluster said operators
    /// force-released ([`ForcedReleases::total`]).
    pub(super) forced_seen: u64,
    /// The tokens of those grants: each counts as lost for good.
    pub(super) revoked: BTreeSet<Token>,
}

impl LeaseState {
    /// A lease vouched for until `valid_until`, at risk from
    /// `at_risk_from`, with nothing lost or revoked yet.
    pub(super) fn new(valid_until: Instant, at_risk_from: Instant) -> LeaseState {
        LeaseState {
            valid_until,
            at_risk_from,
            lost: None,
            forced_seen: 0,
            revoked: BTreeSet::new(),
        }
    }

    /// Take in what a keep-alive said of forced releases: the tokens of
    /// those not seen yet become revoked. `Err` with the reason if more
    /// were forced than the cluster still names (which grants were lost
    /// cannot be told: the whole session must count as lost).
    fn take_forced(&mut self, forced: &ForcedReleases) -> Result<(), String> {
        let new = forced.total.saturating_sub(self.forced_seen);
        if new == 0 {
            return Ok(());
        }
        let named = forced.recent.len() as u64;
        if new > named {
            return Err(format!(
                "operators force-released {new} of its grants since the last keep-alive, more \
                 than the {named} the cluster names: every grant counts as lost"
            ));
        }
        let skip = forced.recent.len() - new as usize;
        self.revoked
            .extend(forced.recent.iter().skip(skip).copied());
        self.forced_seen = forced.total;
        Ok(())
    }
}

/// Renew the lease every `ttl / 3` until it is lost or the session closes
/// (which aborts this task).
pub(super) async fn watchdog(
    client: Client,
    id: SessionId,
    secret: SessionSecret,
    ttl: Duration,
    margin: Duration,
    opened: Instant,
    lease: watch::Sender<LeaseState>,
) {
    let interval = ttl / 3;
    let mut next = opened + interval;
    loop {
        tokio::time::sleep_until(lease_clock::timer(next)).await;
        let valid_until = lease.borrow().valid_until;
        let now = lease_clock::now();
        if now >= valid_until {
            mark_lost(
                &lease,
                id,
                "the lease ran out before a keep-alive could be sent".into(),
            );
            return;
        }
        match client.keep_alive_call(id, secret, valid_until - now).await {
            Ok((Ok(outcome), sent)) => {
                if let Outcome::Lock(LockOutcome::Session(Some(info))) = &outcome {
                    let mut too_many = None;
                    lease.send_if_modified(|l| {
                        let before = l.forced_seen;
                        if let Err(reason) = l.take_forced(&info.forced) {
                            too_many = Some(reason);
                        }
                        l.forced_seen != before
                    });
                    if let Some(reason) = too_many {
                        mark_lost(&lease, id, reason);
                        return;
                    }
                }
                let acked = lease_clock::now();
                if acked >= valid_until {
                    // Guards may already have reported the lock lost: stay lost.
                    mark_lost(
                        &lease,
                        id,
                        "a keep-alive was acknowledged only after the lease ran out".into(),
                    );
                    return;
                }
                lease.send_modify(|l| {
                    l.valid_until = l.valid_until.max(sent + ttl - margin);
                    l.at_risk_from = l.at_risk_from.max(at_risk_from(sent, ttl));
                });
                next = sent + interval;
            }
            Ok((Err(e), _)) => {
                mark_lost(&lease, id, format!("the cluster ended it: {e}"));
                return;
            }
            Err(e) => {
                mark_lost(
                    &lease,
                    id,
                    format!("no keep-alive was acknowledged before the lease ran out: {e}"),
                );
                return;
            }
        }
    }
}

/// When a lease renewed by a keep-alive sent at `sent` becomes at risk.
pub(super) fn at_risk_from(sent: Instant, ttl: Duration) -> Instant {
    sent + ttl * 2 / 3
}

fn mark_lost(lease: &watch::Sender<LeaseState>, id: SessionId, reason: String) {
    tracing::warn!(session = id.0, %reason, "session lost");
    lease.send_modify(|l| {
        if l.lost.is_none() {
            l.lost = Some(reason);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forced(total: u64, recent: &[u64]) -> ForcedReleases {
        ForcedReleases {
            total,
            recent: recent.iter().copied().map(Token).collect(),
        }
    }

    fn revoked(l: &LeaseState) -> Vec<u64> {
        l.revoked.iter().map(|t| t.0).collect()
    }

    #[test]
    fn only_the_newly_forced_tokens_are_revoked() {
        let now = Instant::now();
        let mut l = LeaseState::new(now, now);
        assert_eq!(l.take_forced(&forced(0, &[])), Ok(()));
        assert!(l.revoked.is_empty());
        // Two forced: both named.
        assert_eq!(l.take_forced(&forced(2, &[5, 9])), Ok(()));
        assert_eq!(revoked(&l), [5, 9]);
        // The same answer again changes nothing.
        assert_eq!(l.take_forced(&forced(2, &[5, 9])), Ok(()));
        assert_eq!(l.forced_seen, 2);
        // One more: only the newest is new (older ones may have scrolled
        // out of the cluster's list).
        assert_eq!(l.take_forced(&forced(3, &[9, 12])), Ok(()));
        assert_eq!(revoked(&l), [5, 9, 12]);
    }

    #[test]
    fn more_forced_than_named_is_an_error() {
        let now = Instant::now();
        let mut l = LeaseState::new(now, now);
        assert_eq!(l.take_forced(&forced(1, &[4])), Ok(()));
        let err = l.take_forced(&forced(4, &[7, 8]));
        assert!(err.is_err_and(|e| e.contains('3')), "3 new, 2 named");
    }
}
