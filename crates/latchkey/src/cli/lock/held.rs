//! [`Held`]: what `lock`, `sem` and `elect -- CMD` hold while the command
//! runs: one grant, or every grant of a multi-lock (`lock A B C -- CMD`).

use std::time::Duration;

use latchkey::{Error, LockGuard, MultiLockGuard, Session};

/// One grant (a lock, a permit, a leadership) or a multi-lock's grants.
pub(super) enum Held {
    One(LockGuard),
    All(MultiLockGuard),
}

impl Held {
    /// The grants, in the order asked (never empty).
    pub(super) fn guards(&self) -> &[LockGuard] {
        match self {
            Held::One(g) => std::slice::from_ref(g),
            Held::All(all) => all.guards(),
        }
    }

    /// The first grant: the lock's, or a multi-lock's first lock's.
    fn first(&self) -> Option<&LockGuard> {
        self.guards().first()
    }

    /// The session holding the grants.
    pub(super) fn session(&self) -> Option<&Session> {
        self.first().map(LockGuard::session)
    }

    /// The first grant's token (the term of a leadership), for messages.
    pub(super) fn token(&self) -> String {
        self.first()
            .map_or_else(String::new, |g| g.token().to_string())
    }

    /// Every grant's token, space-separated, in the order asked.
    fn tokens(&self) -> String {
        join(self.guards().iter().map(|g| g.token().to_string()))
    }

    /// True while every grant can be vouched for.
    pub(super) fn is_held(&self) -> bool {
        !self.guards().is_empty() && self.guards().iter().all(LockGuard::is_held)
    }

    /// How long every grant can still be vouched for.
    pub(super) fn remaining(&self) -> Duration {
        self.guards()
            .iter()
            .map(LockGuard::remaining)
            .min()
            .unwrap_or(Duration::ZERO)
    }

    /// Resolves once any grant can no longer be relied on.
    pub(super) async fn lost(&self) {
        match self {
            Held::One(g) => g.lost().await,
            Held::All(all) => all.lost().await,
        }
    }

    /// Resolves once the session is at risk, or any grant is lost.
    pub(super) async fn at_risk(&self) {
        if let Some(session) = self.session() {
            tokio::select! {
                _ = session.at_risk() => {}
                _ = self.lost() => {}
            }
        }
    }

    /// Release every grant (a multi-lock's in one step).
    pub(super) async fn release(self) -> Result<(), Error> {
        match self {
            Held::One(g) => g.release().await,
            Held::All(all) => all.release().await,
        }
    }

    /// The command's environment: the first lock's name, token and
    /// sequencer (`LATCHKEY_LOCK`, `LATCHKEY_TOKEN`, `LATCHKEY_SEQUENCER`),
    /// every lock's in the same order, space-separated (`LATCHKEY_LOCKS`,
    /// `LATCHKEY_TOKENS`, `LATCHKEY_SEQUENCERS`; one each for a single
    /// lock), and the session's secret (`LATCHKEY_SESSION_SECRET`).
    pub(super) fn environment(&self) -> Vec<(&'static str, String)> {
        let Some(first) = self.first() else {
            return Vec::new();
        };
        let guards = self.guards();
        vec![
            ("LATCHKEY_LOCK", first.sequencer().name.clone()),
            ("LATCHKEY_TOKEN", first.token().to_string()),
            ("LATCHKEY_SEQUENCER", first.sequencer().to_string()),
            (
                "LATCHKEY_LOCKS",
                join(guards.iter().map(|g| g.sequencer().name.clone())),
            ),
            ("LATCHKEY_TOKENS", self.tokens()),
            (
                "LATCHKEY_SEQUENCERS",
                join(guards.iter().map(|g| g.sequencer().to_string())),
            ),
            ("LATCHKEY_SESSION_SECRET", first.session().secret().to_hex()),
        ]
    }
}

fn join(items: impl Iterator<Item = String>) -> String {
    items.collect::<Vec<_>>().join(" ")
}
