//! A scrape: the figures read off a running replica (its Raft metrics,
//! health, lock census and storage) handed to its [`Metrics`] registry, and
//! the task that counts leader changes as they happen.

use openraft::async_runtime::WatchReceiver;
use std::sync::Arc;

use crate::health::Condition;
use crate::replica::Replica;

use super::registry::{Figures, ProcessCounts};

/// A replica's metrics, read for scraping (see [`super::Metrics`]).
#[derive(Clone)]
pub struct MetricsHandle {
    pub(crate) replica: Arc<Replica>,
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

impl MetricsHandle {
    /// Every metric in the OpenMetrics text format, up to date. It scans
    /// the replica's sessions and locks (the lock gauges): call it off the
    /// async workers (`spawn_blocking`) when there may be many.
    ///
    /// ```no_run
    /// # async fn demo(server: latchkey_server::Server) -> Result<(), tokio::task::JoinError> {
    /// let metrics = server.metrics();
    /// let text = tokio::task::spawn_blocking(move || metrics.render()).await?;
    /// assert!(text.contains("latchkey_raft_term"));
    /// # Ok(()) }
    /// ```
    pub fn render(&self) -> String {
        let figures = figures(&self.replica);
        self.replica.metrics().render(&figures)
    }
}

/// Read what a scrape reports off `replica`.
fn figures(replica: &Replica) -> Figures {
    let census = replica.lock_census();
    let m = replica.raft().metrics().borrow_watched().clone();
    let membership = m.membership_config.membership();
    let condition = match replica.health().condition() {
        Condition::Serving => "serving",
        Condition::Waiting(_) => "waiting",
        Condition::Failed(_) => "failed",
    };
    Figures {
        term: m.current_term,
        leader_id: replica.leader().map_or(0, |(id, _)| id),
        is_leader: m.state == openraft::ServerState::Leader
            && m.current_leader == Some(replica.id()),
        state: format!("{:?}", m.state).to_lowercase(),
        last_log: m.last_log_index.unwrap_or(0),
        applied: m.last_applied.map_or(0, |l| l.index),
        snapshot: m.snapshot.map_or(0, |l| l.index),
        voters: membership.voter_ids().count() as u64,
        members: membership.nodes().count() as u64,
        matched: m
            .replication
            .iter()
            .flatten()
            .map(|(member, matched)| (*member, matched.map_or(0, |l| l.index)))
            .collect(),
        census,
        waiting: replica.locks().waiters.len() as u64,
        condition,
        sst_bytes: replica.disk_bytes(),
        background_jobs: replica.storage_background_jobs(),
        rooms_bytes: replica.lock_rooms_bytes(),
        watches_open: replica.watches().open_watches() as u64,
        process: process_counts(),
    }
}

/// The process-wide counters as they stand now.
pub(crate) fn process_counts() -> ProcessCounts {
    ProcessCounts {
        tls_failures: crate::tls_accept::tls_handshake_failures(),
        connections_refused: crate::conn_limit::connections_refused(),
    }
}

/// Count the changes of the leader `replica` knows, as they happen, until
/// its Raft core stops.
pub(crate) fn watch_leader(replica: Arc<Replica>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = replica.raft().metrics();
        let mut last = watch.borrow_and_update().current_leader;
        while watch.changed().await.is_ok() {
            let now = watch.borrow_and_update().current_leader;
            if now.is_some() && now != last {
                if last.is_some() {
                    replica.metrics().leader_changed();
                }
                last = now;
            }
        }
    })
}
