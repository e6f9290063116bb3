//! [`DurableLog`]: how far this replica's Raft log is on disk.
//!
//! Every append is acknowledged to openraft only once a WAL sync covers it
//! and the acknowledgement mark records it (`crate::group_commit`), on a
//! leader as on a follower. openraft 0.10's core replicates a leader's
//! entries as soon as they are *submitted* to its log, in parallel with the
//! leader's own fsync, and counts the leader in the quorum only once that
//! fsync completes; so a commit waits until a majority of {the leader's
//! fsync, each follower's round trip and fsync} are done, and every
//! committed entry is on a majority of disks, whichever replicas they are.
//!
//! (Earlier builds, on openraft 0.9 and for a while on 0.10, had the leader
//! acknowledge its own appends before syncing them, which needed an apply
//! gate, a clamp on the commit index it sent and a lowered vote at
//! start-up. On 0.10 that saved nothing measurable, interleaved:
//! docs/PERFORMANCE.md. It is gone.)
//!
//! What remains here: the last durable entry, for the commit index the log
//! store saves ([`DurableLog::clamp_commit`]). A leader may see an entry
//! committed by the followers before its own sync covers it; recording that
//! commit index could, after a machine crash that lost the local tail, point
//! past the local log at start-up.
//!
//! A leader's machine crash can still lose the tail of its log that the
//! followers hold. It must then not resume leadership in the same term (new
//! entries would reuse the lost entries' log ids, and a follower keeps an
//! entry whose id it already has): latchkey-server sets openraft's
//! `enable_leader_restore` off, so a restarted leader wins a new term first.

use tokio::sync::watch;

use crate::types::LogId;

/// What is durable in the local log; one value shared through a watch by
/// the flusher (which advances it) and the log store (which reads it, and
/// resets it on a truncation).
#[derive(Debug, Clone, Default)]
pub(crate) struct DurableState {
    /// Every entry up to and including this one is on disk (or purged into
    /// a snapshot).
    pub(crate) durable: Option<LogId>,
    /// Bumped by every truncation, so a sync queued before it cannot mark
    /// as durable entries that the truncation removed.
    pub(crate) epoch: u64,
    /// Set once a WAL sync failed: nothing later will ever be durable.
    pub(crate) failed: Option<String>,
}

impl DurableState {
    fn durable_index(&self) -> Option<u64> {
        self.durable.map(|l| l.index)
    }

    /// Record that everything up to `last` is on disk.
    pub(crate) fn advance(&mut self, last: LogId) -> bool {
        if Some(last.index) > self.durable_index() {
            self.durable = Some(last);
            true
        } else {
            false
        }
    }
}

/// A read-only view of how far the local Raft log is durable.
///
/// Cheap to clone; see the module docs for what it is for.
#[derive(Debug, Clone)]
pub struct DurableLog {
    rx: watch::Receiver<DurableState>,
}

impl DurableLog {
    pub(crate) fn new(rx: watch::Receiver<DurableState>) -> Self {
        DurableLog { rx }
    }

    /// The last entry known to be on disk, with every entry before it.
    pub fn last(&self) -> Option<LogId> {
        self.rx.borrow().durable
    }

    /// `committed`, capped at the last durable entry of the local log.
    ///
    /// A leader syncs its own log in parallel with replication, so it may
    /// see openraft commit an entry (on two followers' disks) that it has
    /// not synced yet; this is the commit index it may save without ever
    /// pointing past its own log after a machine crash.
    ///
    /// ```
    /// # use latchkey_storage::{open, StorageOptions};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let (log, _sm) = open(dir.path(), StorageOptions::default()).unwrap();
    /// // An empty log: nothing is durable, so no commit index may be told.
    /// let committed = Some(latchkey_storage::types::log_id(1, 1, 5));
    /// assert_eq!(log.durable().clamp_commit(committed), None);
    /// ```
    pub fn clamp_commit(&self, committed: Option<LogId>) -> Option<LogId> {
        let durable = self.rx.borrow().durable;
        match (committed, durable) {
            (Some(c), Some(d)) if c.index > d.index => Some(d),
            (Some(_), None) => None,
            (c, _) => c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(index: u64) -> LogId {
        crate::types::log_id(1, 1, index)
    }

    fn view(state: DurableState) -> (watch::Sender<DurableState>, DurableLog) {
        let (tx, rx) = watch::channel(state);
        (tx, DurableLog::new(rx))
    }

    #[test]
    fn clamp_caps_commit_at_the_durable_log() {
        let (tx, log) = view(DurableState::default());
        assert_eq!(log.clamp_commit(None), None);
        assert_eq!(log.clamp_commit(Some(id(3))), None, "nothing durable yet");
        tx.send_modify(|d| {
            d.advance(id(5));
        });
        assert_eq!(log.clamp_commit(Some(id(3))), Some(id(3)));
        assert_eq!(log.clamp_commit(Some(id(5))), Some(id(5)));
        assert_eq!(log.clamp_commit(Some(id(9))), Some(id(5)));
        assert_eq!(log.last(), Some(id(5)));
    }

    #[test]
    fn advance_never_goes_back() {
        let mut d = DurableState::default();
        assert!(d.advance(id(0)), "index 0 is an entry too");
        assert!(d.advance(id(4)));
        assert!(!d.advance(id(2)));
        assert!(!d.advance(id(4)));
        assert_eq!(d.durable, Some(id(4)));
    }
}
