//! Builds this replica's snapshots at the pace
//! [`latchkey_storage::SnapshotPace`] sets: once `snapshot_every` entries
//! were applied since the last snapshot *and* the log appended since holds
//! at least as many bytes as that snapshot, so that the cost of snapshots
//! stays proportional to the log they replace however large the state is.
//! openraft's own policy is off (`SnapshotPolicy::Never` in
//! [`crate::RaftSettings::to_config`]); this task asks openraft for each
//! snapshot (`Trigger::snapshot`), which then builds it and purges the log
//! as it would have. Every replica paces its own snapshots, as before.

use openraft::async_runtime::WatchReceiver;
use std::time::Duration;

use latchkey_storage::types::Raft;
use latchkey_storage::SnapshotPace;

/// Least time between two looks at the metrics: they change with every
/// applied entry, and a snapshot a few milliseconds late costs nothing.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// Run until the Raft core stops.
pub(crate) async fn run(raft: Raft, pace: SnapshotPace, snapshot_every: u64) {
    let mut metrics = raft.metrics();
    loop {
        if metrics.changed().await.is_err() {
            return;
        }
        let (entries_since, current) = {
            let m = metrics.borrow_and_update();
            let applied = m.last_applied.map_or(0, |l| l.index);
            let snapshot = m.snapshot.map_or(0, |l| l.index);
            (applied.saturating_sub(snapshot), m.snapshot)
        };
        if !pace.due(entries_since, snapshot_every) {
            tokio::time::sleep(LOOK_EVERY).await;
            continue;
        }
        tracing::debug!(
            entries_since,
            log_bytes = pace.log_bytes_since_snapshot(),
            snapshot_bytes = pace.snapshot_bytes(),
            "building a snapshot"
        );
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
        // One build at a time: wait until it shows. (In openraft a
        // build that fails stops the Raft core, which ends this wait.)
        if metrics.wait_until(|m| m.snapshot != current).await.is_err() {
            return;
        }
    }
}
