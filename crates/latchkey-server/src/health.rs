//! A replica's health: serving, waiting to be added to a cluster, or failed
//! ([`Health`], plain shared state). The watch that fails it when its Raft
//! core stops or its data directory vanishes is `crate::health_watch`.
//!
//! That watch drives the standard gRPC health service
//! (`grpc.health.v1.Health`, for load balancers and probes): the overall
//! status (service name `""`) and that of each latchkey service are SERVING
//! only while the replica is [`Condition::Serving`], is a member of its
//! cluster and knows a leader (it can answer or redirect every request),
//! and NOT_SERVING otherwise: while it waits to be added, has no leader, or
//! has failed.
//!
//! A replica that cannot keep its promises stops and says why; it never
//! limps on. Once [`Condition::Failed`], a replica answers no request as
//! leader (writes, reads and keep-alives get UNAVAILABLE, safe to retry on
//! another replica: nothing was proposed), reports `Failed` with the cause in
//! its status, and [`crate::Server::failed`] resolves, so `latchkey serve`
//! exits non-zero and its supervisor restarts it. Failure is final for the
//! process: there is no way back to serving short of a restart.

use tokio::sync::watch;

/// What a replica can do right now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Serving (as leader, follower or learner, as Raft says).
    Serving,
    /// A new data directory that is not a member of its cluster yet: it
    /// never initialises or votes, and waits to be added. The text says
    /// what to do.
    Waiting(String),
    /// Stopped for good; the text is the cause.
    Failed(String),
}

/// The shared condition of one replica.
pub(crate) struct Health {
    tx: watch::Sender<Condition>,
}

impl Health {
    pub(crate) fn new() -> Self {
        Health {
            tx: watch::Sender::new(Condition::Serving),
        }
    }

    pub(crate) fn condition(&self) -> Condition {
        self.tx.borrow().clone()
    }

    /// The cause, once failed.
    pub(crate) fn failure(&self) -> Option<String> {
        match &*self.tx.borrow() {
            Condition::Failed(cause) => Some(cause.clone()),
            _ => None,
        }
    }

    /// Fail for good (the first cause wins).
    pub(crate) fn fail(&self, cause: String) {
        self.tx.send_if_modified(|c| {
            if matches!(c, Condition::Failed(_)) {
                return false;
            }
            tracing::error!(%cause, "replica failed: it stops serving");
            *c = Condition::Failed(cause);
            true
        });
    }

    /// Waiting to be added (unless failed).
    pub(crate) fn wait_to_be_added(&self, why: String) {
        self.tx.send_if_modified(|c| {
            if *c != Condition::Serving {
                return false;
            }
            tracing::warn!("{why}");
            *c = Condition::Waiting(why);
            true
        });
    }

    /// Back to serving from waiting (the replica was added).
    pub(crate) fn added(&self) {
        self.tx.send_if_modified(|c| {
            if matches!(c, Condition::Waiting(_)) {
                tracing::info!("added to the cluster");
                *c = Condition::Serving;
                true
            } else {
                false
            }
        });
    }

    /// Resolves with the cause once failed.
    pub(crate) async fn failed(&self) -> String {
        let mut rx = self.tx.subscribe();
        loop {
            if let Condition::Failed(cause) = &*rx.borrow_and_update() {
                return cause.clone();
            }
            if rx.changed().await.is_err() {
                return "the replica was dropped".into();
            }
        }
    }
}
