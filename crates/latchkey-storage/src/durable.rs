//! [`DurableLog`]: how far this replica's Raft log is on disk, and the two
//! rules that let a leader sync its own log in parallel with replication.
//!
//! # Why
//!
//! openraft 0.10's core replicates an entry as soon as the leader has
//! *submitted* it to its log, in parallel with the leader's own fsync, but
//! it counts the leader in the quorum only once that fsync completes, so a
//! commit waits for the second fastest of {leader fsync, each follower's
//! round trip and fsync}. With [`crate::StorageOptions::overlap_leader_fsync`]
//! on, the log store acknowledges a leader's own appends to openraft as soon
//! as they are written (readable, not yet synced) and syncs them in the
//! background: the leader counts at once, and a commit waits only for the
//! fastest follower (the Raft thesis, §10.2.1, allows the leader to write
//! its log in parallel with replicating it). Whether that still pays on
//! openraft 0.10 is measured, not assumed: docs/PERFORMANCE.md.
//!
//! # Why it stays safe
//!
//! openraft now counts the leader in the quorum for entries it has not
//! synced, so its *commit index* may run ahead of what a majority holds on
//! disk. Nothing outside the leader's core may act on that difference, and
//! two rules make sure nothing does:
//!
//! 1. **Apply gate.** The state machine applies an entry only once the local
//!    log holds it durably (`DurableLog::wait_applicable`). Every reply to
//!    a client, every read and every lock event comes from applied state, so
//!    by the time anything is visible the entry is on the leader's disk and
//!    on a follower's disk (openraft committed it only after a follower
//!    reported it flushed, and followers never acknowledge early): a
//!    majority of three.
//! 2. **Commit clamp.** The commit index a leader sends to followers is
//!    capped at its own durable log ([`DurableLog::clamp_commit`]), and so is
//!    the commit index it saves. A follower therefore never applies an entry
//!    that a leader crash (losing its unsynced tail) could let a new leader
//!    overwrite.
//!
//! Two more rules close what the above leaves open (both found in review):
//!
//! 3. **No same-term restart.** openraft resumes leadership at startup,
//!    in the same term, when its saved vote is its own committed vote
//!    (unless `Config::enable_leader_restore` is off, as latchkey's replica
//!    sets it). After
//!    a machine crash the leader's log may have lost an unsynced tail that a
//!    follower holds; new entries of the same term would then reuse those
//!    entries' log ids, and a follower keeps an entry whose id it already
//!    has: the replicas would diverge. So enabling early acknowledgement
//!    saves such a vote again as not committed, and the replica must win a
//!    new term (whose entries have new ids) before it leads again.
//! 4. **Membership entries are synced before they are acknowledged.**
//!    openraft's core acts on its own commit index when it changes
//!    membership (a joint configuration it believes committed lets it
//!    propose the next step), so for those entries the commit index must
//!    mean "on a majority of disks".
//!
//! Only a replica whose current vote names itself acknowledges early: in
//! that term no other leader can send it entries, so every append it makes
//! is its own proposal. openraft saves a new leader's vote (a synced write)
//! before appending that leader's entries, so the switch to synced
//! acknowledgements happens before the first follower append. A process
//! crash loses nothing (unsynced writes are in the page cache); a machine
//! crash can lose the leader's unsynced tail, which by the rules above was
//! never applied anywhere nor acknowledged to anyone. On open, the store
//! syncs whatever it recovered before it reports anything durable.

use std::cmp::min;

use tokio::sync::watch;

use crate::types::LogId;

/// What is durable in the local log; one value shared through a watch by
/// the flusher (which advances it), the log store, the state machine and
/// the network.
#[derive(Debug, Clone, Default)]
pub(crate) struct DurableState {
    /// Every entry up to and including this one is on disk (or purged into
    /// a snapshot).
    pub(crate) durable: Option<LogId>,
    /// The highest index acknowledged to openraft before it was synced;
    /// `None` while no append was ever acknowledged early.
    pub(crate) acked_early: Option<u64>,
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
/// Cheap to clone. The replica's network uses [`DurableLog::clamp_commit`]
/// on every AppendEntries it sends; see the module docs for why.
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
    /// A leader that syncs its own log in parallel with replication may see
    /// openraft commit an entry it has not synced yet; this is the commit
    /// index it may tell followers (or save) without letting them apply an
    /// entry that is not on a majority of disks.
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

    /// Wait, at most `limit`, until the local log is durable up to `index`.
    /// Returns whether it is.
    ///
    /// A leader uses it before sending a message that carries only a commit
    /// index (openraft's commit notice, heartbeats): waiting for its own
    /// sync (well under a millisecond) lets the message carry the real
    /// commit index instead of a capped one, so followers are not left a
    /// heartbeat behind.
    pub async fn wait_durable(&mut self, index: u64, limit: std::time::Duration) -> bool {
        let ready = |d: &DurableState| d.failed.is_some() || d.durable_index() >= Some(index);
        match tokio::time::timeout(limit, self.rx.wait_for(ready)).await {
            Ok(Ok(d)) => d.failed.is_none(),
            _ => false,
        }
    }

    /// Wait until the entries up to `last_index` may be applied: until every
    /// one of them that was acknowledged before its sync is on disk.
    ///
    /// Returns at once on a replica that never acknowledged early (a
    /// follower, or a store used without a leader). Fails if a WAL sync
    /// failed: the replica must stop rather than apply what may be lost.
    pub(crate) async fn wait_applicable(&mut self, last_index: u64) -> Result<(), String> {
        let ready = |d: &DurableState| match d.acked_early {
            None => true,
            Some(early) => d.failed.is_some() || d.durable_index() >= Some(min(last_index, early)),
        };
        let state = self
            .rx
            .wait_for(ready)
            .await
            .map_err(|_| "the log store is closed".to_string())?;
        match &state.failed {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn nothing_acknowledged_early_means_no_wait() {
        rt().block_on(async {
            // A follower (or a store used alone) never waits, even for
            // entries it does not hold: openraft only commits what it flushed.
            let (_tx, mut log) = view(DurableState::default());
            log.wait_applicable(100).await.unwrap();
        });
    }

    #[test]
    fn gate_waits_for_the_sync_of_early_acknowledged_entries() {
        rt().block_on(async {
            let (tx, mut log) = view(DurableState {
                durable: Some(id(2)),
                acked_early: Some(6),
                ..DurableState::default()
            });
            // Entries up to 2 are synced already.
            log.wait_applicable(2).await.unwrap();
            // Entries up to 4 are not.
            let mut waiting = log.clone();
            let gate = tokio::spawn(async move { waiting.wait_applicable(4).await });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!gate.is_finished(), "applied before the leader's sync");
            tx.send_modify(|d| {
                d.advance(id(3));
            });
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!gate.is_finished(), "applied 4 with only 3 synced");
            tx.send_modify(|d| {
                d.advance(id(5));
            });
            tokio::time::timeout(Duration::from_secs(5), gate)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            // Beyond the early-acknowledged range (synced before openraft
            // heard of it) only the early part must be durable.
            tx.send_modify(|d| {
                d.advance(id(6));
            });
            log.wait_applicable(50).await.unwrap();
        });
    }

    #[test]
    fn wait_durable_is_bounded() {
        rt().block_on(async {
            let (tx, mut log) = view(DurableState {
                durable: Some(id(2)),
                ..DurableState::default()
            });
            assert!(log.wait_durable(2, Duration::from_millis(1)).await);
            assert!(!log.wait_durable(3, Duration::from_millis(10)).await);
            let mut waiting = log.clone();
            let wait =
                tokio::spawn(async move { waiting.wait_durable(3, Duration::from_secs(5)).await });
            tx.send_modify(|d| {
                d.advance(id(3));
            });
            assert!(wait.await.unwrap());
            tx.send_modify(|d| d.failed = Some("gone".into()));
            assert!(!log.wait_durable(9, Duration::from_secs(5)).await);
        });
    }

    #[test]
    fn a_failed_sync_fails_the_gate() {
        rt().block_on(async {
            let (tx, mut log) = view(DurableState {
                durable: Some(id(1)),
                acked_early: Some(3),
                ..DurableState::default()
            });
            let mut waiting = log.clone();
            let gate = tokio::spawn(async move { waiting.wait_applicable(3).await });
            tx.send_modify(|d| d.failed = Some("WAL sync failed: disk gone".into()));
            let got = tokio::time::timeout(Duration::from_secs(5), gate)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(got, Err("WAL sync failed: disk gone".to_string()));
            assert!(log.wait_applicable(1).await.is_err());
        });
    }
}
