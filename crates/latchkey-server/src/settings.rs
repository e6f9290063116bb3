//! Raft timing and log-retention settings of a replica.

use std::sync::Arc;
use std::time::Duration;

use openraft::{Config, SnapshotPolicy};

use crate::NodeError;

/// How a replica runs Raft. The defaults suit three replicas on one LAN or
/// one machine; all replicas of a cluster should use the same values.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RaftSettings {
    /// Leader heartbeat period (default 40 ms).
    pub heartbeat: Duration,
    /// A follower that hears nothing from a leader for a random time in
    /// `[election_min, election_max)` starts an election (default 200–400
    /// ms, drawn again for each campaign). openraft adds
    /// the leader's lease (`election_max`) to that while it knows a leader,
    /// and twice `election_max` more after it lost an election to a longer
    /// log, so a dead leader is replaced after `election_max` + the
    /// quicker follower's draw (0.6–0.8 s with the defaults) when that
    /// follower holds the longer log, else about `3 * election_max` + the
    /// other's draw (1.4–1.6 s). docs/performance-log.md, change 17, has the
    /// A/B against 500–1000 ms (twice as long).
    pub election_min: Duration,
    /// See `election_min`.
    pub election_max: Duration,
    /// Build a snapshot after at least this many applied entries (default
    /// 10 000), and only once the log appended since the last snapshot is
    /// as large as that snapshot (`latchkey_storage::SnapshotPace`), so
    /// that a large state is not rewritten every few thousand entries.
    pub snapshot_every: u64,
    /// Entries kept in the log behind the last snapshot, for followers that
    /// lag only a little (default 1 000).
    pub keep_after_snapshot: u64,
    /// Longest a write waits to commit before the caller is told its outcome
    /// is unknown (default 5 s).
    pub write_timeout: Duration,
    /// Longest a linearizable read waits to confirm leadership (default 3 s).
    pub read_timeout: Duration,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            heartbeat: Duration::from_millis(40),
            election_min: Duration::from_millis(200),
            election_max: Duration::from_millis(400),
            snapshot_every: 10_000,
            keep_after_snapshot: 1_000,
            write_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(3),
        }
    }
}

/// Setters, for callers outside this crate (the struct is
/// `#[non_exhaustive]`, so new options can be added without breaking
/// them): `RaftSettings::default().with_...(..)`.
impl RaftSettings {
    /// Set [`RaftSettings::heartbeat`].
    pub fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// Set [`RaftSettings::election_min`].
    pub fn with_election_min(mut self, election_min: Duration) -> Self {
        self.election_min = election_min;
        self
    }

    /// Set [`RaftSettings::election_max`].
    pub fn with_election_max(mut self, election_max: Duration) -> Self {
        self.election_max = election_max;
        self
    }

    /// Set [`RaftSettings::snapshot_every`].
    pub fn with_snapshot_every(mut self, snapshot_every: u64) -> Self {
        self.snapshot_every = snapshot_every;
        self
    }

    /// Set [`RaftSettings::keep_after_snapshot`].
    pub fn with_keep_after_snapshot(mut self, keep_after_snapshot: u64) -> Self {
        self.keep_after_snapshot = keep_after_snapshot;
        self
    }

    /// Set [`RaftSettings::write_timeout`].
    pub fn with_write_timeout(mut self, write_timeout: Duration) -> Self {
        self.write_timeout = write_timeout;
        self
    }

    /// Set [`RaftSettings::read_timeout`].
    pub fn with_read_timeout(mut self, read_timeout: Duration) -> Self {
        self.read_timeout = read_timeout;
        self
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl RaftSettings {
    /// The openraft configuration for these settings.
    pub fn to_config(&self) -> Result<Arc<Config>, NodeError> {
        let config = Config {
            cluster_name: "latchkey".to_string(),
            heartbeat_interval: millis(self.heartbeat),
            election_timeout_min: millis(self.election_min),
            election_timeout_max: millis(self.election_max),
            // Paced by `crate::snapshot_pace` instead.
            snapshot_policy: SnapshotPolicy::Never,
            max_in_snapshot_log_to_keep: self.keep_after_snapshot,
            // Bound one AppendEntries message: entries carry up to 4 MiB each.
            max_payload_entries: 64,
            install_snapshot_timeout: 10_000,
            // Never resume leadership in the same term at start: a machine
            // crash may have cost the leader an unsynced tail that
            // followers hold (openraft replicates before the leader's own
            // sync), and new entries of the same term would reuse those
            // entries' log ids (`latchkey_storage::durable`).
            // openraft then lowers the vote in memory only and stands for
            // election in a new term.
            enable_leader_restore: Some(false),
            // A candidate asks first whether a majority would grant its
            // vote (`Raft.PreVote`) and raises its term only then: a replica
            // that was cut off and comes back does not depose a leader the
            // others still follow.
            enable_pre_vote: Some(true),
            // A leader removed from the voters hands leadership to the
            // most caught-up remaining voter 150 ms after its removal is
            // committed, rather than leaving the others to an election
            // timeout (`crate::membership::change_voters`).
            removed_leader_step_down: openraft::StepDownPolicy::After(150),
            ..Config::default()
        };
        let config = config
            .validate()
            .map_err(|e| NodeError::Config(format!("raft settings: {e}")))?;
        Ok(Arc::new(config))
    }
}
