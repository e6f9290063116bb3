//! The watch over one replica's health: it fails the replica when its Raft
//! core stops (whatever the reason) or its data directory's sentinel is
//! gone or replaced, marks it added once the membership lists it, and
//! reports SERVING or NOT_SERVING to the standard gRPC health service as
//! [`readiness`] changes (see `crate::health` for what each means).

use openraft::async_runtime::WatchReceiver;
use openraft::Instant as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::sync::oneshot;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::health::{Condition, Health};
use crate::raft_view::RaftView;

/// How often the data directory's sentinel (the acknowledgement mark) is
/// checked.
const SENTINEL_EVERY: Duration = Duration::from_secs(1);

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

/// Whether the replica can answer or redirect every request now, and if
/// not, why (grpc.health.v1 and `/readyz` both follow it).
pub(crate) fn readiness(view: &RaftView, health: &Health) -> Result<(), String> {
    match health.condition() {
        Condition::Serving => {}
        Condition::Waiting(why) => return Err(format!("waiting: {why}")),
        Condition::Failed(cause) => return Err(format!("failed: {cause}")),
    }
    if !view.is_member() {
        return Err("not a member of its cluster".into());
    }
    let raft = view.raft();
    let metrics = raft.metrics().borrow_watched().clone();
    if metrics.current_leader.is_none() {
        return Err("no leader known".into());
    }
    if !view.leader_is_live() {
        return Err(format!(
            "no word from leader {:?} within the election timeout",
            metrics.current_leader
        ));
    }
    // openraft's check-quorum refuses proposals once a leader's lease runs
    // out, but the leader still calls itself leader until it hears a
    // higher term. It is ready only while a majority has acknowledged it
    // within an election timeout, the time after which the others may
    // elect someone else.
    if metrics.state == openraft::ServerState::Leader {
        let limit = raft.config().election_timeout_max;
        let since_ack = metrics
            .last_quorum_acked
            .map(|at| u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX));
        match since_ack {
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

/// Watch the replica of `view` and `health` until `stop`: fail it when its Raft core stops (whatever
/// the reason) or when its data directory's sentinel file is gone or
/// replaced; in the latter case also stop its Raft core, so it stops
/// acknowledging anything.
pub(crate) async fn watch(
    view: RaftView,
    health: std::sync::Arc<Health>,
    sentinel: PathBuf,
    mut reporter: HealthReporter,
    mut stop: oneshot::Receiver<()>,
) {
    let expected = identity(&sentinel).ok();
    let mut serving = false;
    let mut metrics = view.raft().metrics();
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
                    health.fail(format!("the Raft core stopped: {cause}{dir}"));
                    report(&reporter, false).await;
                    return;
                }
                if health.condition() != Condition::Serving
                    && view.is_member()
                {
                    health.added();
                }
                let now = readiness(&view, &health).is_ok();
                if now != serving {
                    serving = now;
                    report(&reporter, serving).await;
                }
            }
            _ = tick.tick() => {
                if let Some(problem) = sentinel_problem(&sentinel, expected) {
                    health.fail(problem);
                    report(&reporter, false).await;
                    if let Err(e) = view.raft().shutdown().await {
                        tracing::warn!(error = %e, "stopping the Raft core");
                    }
                    return;
                }
                // Silence changes no metric: a leader whose majority went
                // quiet, a follower whose leader did.
                let now = readiness(&view, &health).is_ok();
                if now != serving {
                    serving = now;
                    report(&reporter, serving).await;
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
