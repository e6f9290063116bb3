//! Jeopardy: warning before a session is lost, and running work only while
//! a lock is held.
//!
//! A session is **at risk** once its keep-alives have gone unacknowledged
//! for a third of its TTL: the keep-alive due `ttl/3` after the last
//! acknowledged one has not been answered `ttl/3` later still (the leader
//! may be failing over, or this process is cut off or starved). It stays
//! at risk until a keep-alive is acknowledged, which clears it, or until
//! the lease runs out, which loses the session for good
//! ([`Session::lost`] stays the final word). With the default margin the
//! warning comes about a quarter of the TTL before the loss: 2.3 s for a
//! 10 s session. This is Chubby's jeopardy and Curator's `SUSPENDED`:
//! time to finish or pause work cleanly before the hard stop at loss.
//! Being at risk changes nothing on the cluster: the locks are still held.

use std::future::Future;

use super::guard::LockGuard;
use super::lease_clock;
use super::session::Session;
use crate::error::Error;

impl Session {
    /// True while the session is live but at risk: keep-alives have gone
    /// unacknowledged for a third of the TTL (see
    /// [`Session::at_risk`]).
    pub fn is_at_risk(&self) -> bool {
        let at_risk_from = self.lease().borrow().at_risk_from;
        self.is_live() && lease_clock::now() >= at_risk_from
    }

    /// Resolves once the session is at risk (keep-alives have gone
    /// unacknowledged for a third of the TTL) or lost, whichever comes
    /// first; at once if it already is. A later acknowledged keep-alive
    /// clears the risk ([`Session::recovered`]).
    ///
    /// ```no_run
    /// # async fn demo(session: latchkey_client::Session) {
    /// session.at_risk().await;
    /// if session.is_live() {
    ///     // Finish or checkpoint the current step: the lease may end in
    ///     // about a quarter of the TTL.
    ///     if session.recovered().await {
    ///         // A keep-alive went through: carry on.
    ///     }
    /// }
    /// # }
    /// ```
    pub async fn at_risk(&self) {
        let mut lease = self.lease();
        loop {
            let (at_risk_from, valid_until, lost) = {
                let l = lease.borrow_and_update();
                (l.at_risk_from, l.valid_until, l.lost.is_some())
            };
            let now = lease_clock::now();
            if lost || self.is_closed() || now >= valid_until || now >= at_risk_from {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(lease_clock::timer(at_risk_from)) => {}
                changed = lease.changed() => if changed.is_err() { return; },
            }
        }
    }

    /// Resolves once the session is no longer at risk: `true` when a
    /// keep-alive was acknowledged (at once if it is not at risk now),
    /// `false` when the session is lost instead.
    pub async fn recovered(&self) -> bool {
        let mut lease = self.lease();
        loop {
            if !self.is_live() {
                return false;
            }
            let (at_risk_from, valid_until) = {
                let l = lease.borrow_and_update();
                (l.at_risk_from, l.valid_until)
            };
            if lease_clock::now() < at_risk_from {
                return true;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(lease_clock::timer(valid_until)) => {}
                changed = lease.changed() => if changed.is_err() { return false; },
            }
        }
    }
}

impl LockGuard {
    /// True while the lock is held but its session is at risk
    /// ([`Session::is_at_risk`]).
    pub fn is_at_risk(&self) -> bool {
        self.is_held() && self.session().is_at_risk()
    }

    /// Resolves once the session holding this lock is at risk, or the lock
    /// can no longer be relied on ([`LockGuard::lost`]).
    pub async fn at_risk(&self) {
        tokio::select! {
            _ = self.session().at_risk() => {}
            _ = self.lost() => {}
        }
    }

    /// Run `work` while this lock is held: its output, or
    /// [`Error::LockLost`] as soon as the lock can no longer be relied on,
    /// with `work` dropped (cancelled) at that point. Work that must not
    /// stop halfway should also watch [`LockGuard::at_risk`] to finish
    /// cleanly first; writes to storage should carry the
    /// [`token`](LockGuard::token) all the same, since a paused process can
    /// act after the lock has passed on.
    ///
    /// ```no_run
    /// # async fn demo(guard: latchkey_client::LockGuard) -> Result<(), latchkey_client::Error> {
    /// let report = guard
    ///     .while_held(async {
    ///         // ... the work only the holder may do ...
    ///         42
    ///     })
    ///     .await?;
    /// # let _ = report;
    /// # Ok(()) }
    /// ```
    pub async fn while_held<F: Future>(&self, work: F) -> Result<F::Output, Error> {
        if !self.is_held() {
            return Err(self.lost_lock());
        }
        tokio::select! {
            biased;
            _ = self.lost() => Err(self.lost_lock()),
            output = work => Ok(output),
        }
    }

    /// Why this lock can no longer be relied on.
    fn lost_lock(&self) -> Error {
        let reason = if self.session().is_revoked(self.token()) {
            "an operator force-released it".to_string()
        } else if self.session().is_live() {
            "its lease ran out or it was released".to_string()
        } else {
            self.session().lost_error().to_string()
        };
        Error::LockLost {
            lock: self.sequencer().name.clone(),
            token: self.token().0,
            reason,
        }
    }
}
