//! What one replica's Raft core says about its place in the cluster: who
//! leads, whether the membership lists this replica (as this incarnation of
//! its data directory), read off openraft's metrics.
//!
//! A small handle ([`RaftView`], cheap to clone) for the rooms that need
//! these facts and nothing else of the replica: its health watch, the
//! bootstrap, membership changes and the request path itself.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_storage::types::Raft;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

/// One replica's Raft core and who it is.
#[derive(Clone)]
pub(crate) struct RaftView {
    id: u64,
    incarnation: u64,
    raft: Raft,
    /// When this replica last accepted a message from the leader it
    /// follows: milliseconds since `epoch`, plus one (0: never).
    leader_contact: Arc<AtomicU64>,
    epoch: Instant,
}

impl RaftView {
    pub(crate) fn new(id: u64, incarnation: u64, raft: Raft) -> Self {
        RaftView {
            id,
            incarnation,
            raft,
            leader_contact: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        }
    }

    /// Note that openraft accepted a message of the leader (an
    /// AppendEntries it did not refuse for a higher vote).
    pub(crate) fn heard_from_leader(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.leader_contact.store(ms + 1, Ordering::Relaxed);
    }

    /// Whether this replica leads, or follows a leader it heard from within
    /// the maximum election timeout (the time after which the others may
    /// have elected another). With pre-vote, a follower cut off from its
    /// leader keeps openraft's `current_leader`: its term changes only once
    /// a majority would vote for it, which a minority never does. So
    /// "knows a leader" needs the time since it last heard from one.
    pub(crate) fn leader_is_live(&self) -> bool {
        if self.leads() {
            return true;
        }
        let heard = self.leader_contact.load(Ordering::Relaxed);
        if heard == 0 {
            return false;
        }
        let limit = Duration::from_millis(self.raft.config().election_timeout_max);
        let since = self
            .epoch
            .elapsed()
            .saturating_sub(Duration::from_millis(heard - 1));
        since <= limit
    }

    /// This replica's node id.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// This replica's data-directory incarnation.
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The openraft handle.
    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Whether this replica's membership lists it, as this incarnation.
    pub(crate) fn is_member(&self) -> bool {
        self.knows(self.id, self.incarnation) == Some(true)
    }

    /// Whether this replica holds a membership (it belongs to a cluster).
    pub(crate) fn has_membership(&self) -> bool {
        self.raft
            .metrics()
            .borrow_watched()
            .membership_config
            .membership()
            .nodes()
            .next()
            .is_some()
    }

    /// Whether the membership this replica knows lists node `id` with
    /// incarnation `incarnation`; `None` when it does not list `id` at all.
    pub(crate) fn knows(&self, id: u64, incarnation: u64) -> Option<bool> {
        // Borrowed, not cloned: the health watch asks on every metrics change.
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.membership_config
            .membership()
            .get_node(&id)
            .map(|n| n.incarnation == incarnation)
    }

    /// The leader as this replica knows it: id and client address. Never
    /// itself unless it leads: a leader that removed itself keeps its vote
    /// (and openraft's `current_leader`) but leads no longer.
    pub(crate) fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics().borrow_watched().clone();
        let leader = m.current_leader?;
        if leader == self.id && m.state != ServerState::Leader {
            return None;
        }
        let node = m.membership_config.membership().get_node(&leader)?;
        Some((leader, node.client_addr.clone()))
    }

    /// Whether Raft has this replica lead (whatever its health).
    pub(crate) fn leads(&self) -> bool {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        m.state == ServerState::Leader && m.current_leader == Some(self.id)
    }
}
