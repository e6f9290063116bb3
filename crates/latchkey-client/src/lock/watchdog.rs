//! The watchdog: a session's lease as the client judges it ([`LeaseState`]:
//! until when it is vouched for, and from when it is at risk) and the
//! background task that renews it with keep-alives until it is lost. The session (`session.rs`) starts it and reads the state it
//! publishes; it knows nothing of sessions but their id and secret.

use std::time::{Duration, Instant};

use latchkey_core::lock::{SessionId, SessionSecret};
use latchkey_core::CommandResult;
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
            Ok((Ok(_), sent)) => {
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
