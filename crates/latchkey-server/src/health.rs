//! A replica's health: serving, waiting to be added to a cluster, or failed;
//! and the watch that fails it when its Raft core stops or its data
//! directory vanishes.
//!
//! The same watch drives the standard gRPC health service
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

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::replica::Replica;

/// How often the data directory's sentinel (the acknowledgement mark) is
/// checked.
const SENTINEL_EVERY: Duration = Duration::from_secs(1);

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

/// The services whose health is reported, besides the overall `""`.
const SERVICES: [&str; 5] = [
    "latchkey.v1.Kv",
    "latchkey.v1.Lock",
    "latchkey.v1.Pipeline",
    "latchkey.v1.Admin",
    "latchkey.v1.Raft",
];

/// Report every service SERVING or NOT_SERVING.
pub(crate) async fn report(reporter: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    for service in SERVICES {
        reporter.set_service_status(service, status).await;
    }
}

/// Stop reporting: every status is cleared, which also ends the health
/// `Watch` streams (a graceful server shutdown waits for open streams), after
/// one last NOT_SERVING for those watching.
async fn withdraw(reporter: &mut HealthReporter) {
    report(reporter, false).await;
    reporter.clear_service_status("").await;
    for service in SERVICES {
        reporter.clear_service_status(service).await;
    }
}

/// Whether `replica` can answer or redirect every request now.
fn can_serve(replica: &Replica) -> bool {
    readiness(replica).is_ok()
}

/// Whether the replica can answer or redirect every request now, and if
/// not, why (grpc.health.v1 and `/readyz` both follow it).
pub(crate) fn readiness(replica: &Replica) -> Result<(), String> {
    match replica.health().condition() {
        Condition::Serving => {}
        Condition::Waiting(why) => return Err(format!("waiting: {why}")),
        Condition::Failed(cause) => return Err(format!("failed: {cause}")),
    }
    if !replica.is_member() {
        return Err("not a member of its cluster".into());
    }
    let raft = replica.raft();
    let metrics = raft.metrics().borrow().clone();
    if metrics.current_leader.is_none() {
        return Err("no leader known".into());
    }
    // openraft 0.9 has no check-quorum: a leader cut off from its majority
    // goes on calling itself leader until it hears a higher term. It is
    // ready only while a majority has acknowledged it within an election
    // timeout, the time after which the others may elect someone else.
    if metrics.state == openraft::ServerState::Leader {
        let limit = raft.config().election_timeout_max;
        match metrics.millis_since_quorum_ack {
            Some(ms) if ms <= limit => {}
            Some(ms) => {
                return Err(format!(
                    "leader without a majority: last acknowledged {ms} ms ago"
                ))
            }
            None => return Err("leader not yet acknowledged by a majority".into()),
        }
    }
    Ok(())
}

/// The identity of the file at `path` (device, inode), to tell it from a
/// file created at the same path later.
fn identity(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// Watch `replica` until `stop`: fail it when its Raft core stops (whatever
/// the reason) or when its data directory's sentinel file is gone or
/// replaced; in the latter case also stop its Raft core, so it stops
/// acknowledging anything.
pub(crate) async fn watch(
    replica: Arc<Replica>,
    sentinel: PathBuf,
    mut reporter: HealthReporter,
    mut stop: oneshot::Receiver<()>,
) {
    let expected = identity(&sentinel).ok();
    let mut serving = false;
    let mut metrics = replica.raft().metrics();
    let mut tick = tokio::time::interval(SENTINEL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut stop => {
                // Stopping: tell load balancers before anything goes down.
                withdraw(&mut reporter).await;
                return;
            }
            changed = metrics.changed() => {
                let cause = match changed {
                    Err(_) => Some("the Raft core ended without a word".to_string()),
                    Ok(()) => metrics
                        .borrow_and_update()
                        .running_state
                        .as_ref()
                        .err()
                        .map(|fatal| fatal.to_string()),
                };
                if let Some(cause) = cause {
                    let dir = sentinel_problem(&sentinel, expected)
                        .map(|p| format!(" ({p})"))
                        .unwrap_or_default();
                    replica.health().fail(format!("the Raft core stopped: {cause}{dir}"));
                    report(&reporter, false).await;
                    return;
                }
                if replica.health().condition() != Condition::Serving
                    && replica.is_member()
                {
                    replica.health().added();
                }
                let now = can_serve(&replica);
                if now != serving {
                    serving = now;
                    report(&reporter, serving).await;
                }
            }
            _ = tick.tick() => {
                if let Some(problem) = sentinel_problem(&sentinel, expected) {
                    replica.health().fail(problem);
                    report(&reporter, false).await;
                    if let Err(e) = replica.raft().shutdown().await {
                        tracing::warn!(error = %e, "stopping the Raft core");
                    }
                    return;
                }
            }
        }
    }
}

/// What is wrong with the sentinel, if anything.
fn sentinel_problem(sentinel: &Path, expected: Option<(u64, u64)>) -> Option<String> {
    match identity(sentinel) {
        Ok(found) if Some(found) == expected => None,
        Ok(_) => Some(format!(
            "the data directory was replaced under the running replica ({} is another file now)",
            sentinel.display()
        )),
        Err(e) => Some(format!(
            "the data directory vanished under the running replica ({}: {e})",
            sentinel.display()
        )),
    }
}
