//! [`WatchHub`]: what the feed task and the open watches of one replica
//! share.

use openraft::async_runtime::WatchReceiver;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};

use latchkey_core::history::{Record, Window};
use latchkey_proto::wire::WatchError;
use latchkey_proto::ReplicaFailure;
use latchkey_storage::StateReader;
use tokio::sync::{broadcast, watch};

use super::delivery::Published;
use super::places::{Places, WatchLimits};
use crate::raft_view::RaftView;

/// The replica's reader, taken away at shutdown so that RocksDB closes
/// even while watches are open.
pub(crate) type SharedReader = Arc<RwLock<Option<StateReader>>>;

/// What the feed hands every watch.
#[derive(Debug, Clone)]
pub(crate) enum Feed {
    /// The next revision's record.
    Record(Arc<Published>),
    /// The history was replaced (a snapshot was installed) and now starts
    /// at `oldest`: revisions before it will never come.
    Gap {
        /// The oldest revision the history keeps now.
        oldest: u64,
    },
}

/// The shared state of one replica's watches.
pub(crate) struct WatchHub {
    reader: SharedReader,
    view: RaftView,
    places: Places,
    /// The ring; `None` once the feed has stopped.
    ring: Mutex<Option<broadcast::Sender<Feed>>>,
    /// The last revision handed to the ring.
    published: watch::Sender<u64>,
}

/// One open watch's place, given back when dropped.
pub(crate) struct Registration {
    hub: Arc<WatchHub>,
    connection: Option<SocketAddr>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.hub.places.give_back(self.connection);
    }
}

fn stopped() -> WatchError {
    WatchError::Replica(ReplicaFailure::Unavailable(
        "this replica is shutting down: watch again at another replica".into(),
    ))
}

impl WatchHub {
    pub(crate) fn new(reader: SharedReader, view: RaftView, limits: WatchLimits) -> Arc<Self> {
        let (ring, _) = broadcast::channel(super::FEED_RING);
        Arc::new(WatchHub {
            reader,
            view,
            places: Places::new(limits),
            ring: Mutex::new(Some(ring)),
            published: watch::Sender::new(0),
        })
    }

    /// Take a place for a watch from `connection` (`None`: in-process).
    pub(crate) fn register(
        self: &Arc<Self>,
        connection: Option<SocketAddr>,
    ) -> Result<Registration, WatchError> {
        self.places.take(connection)?;
        Ok(Registration {
            hub: Arc::clone(self),
            connection,
        })
    }

    /// Watches open now.
    pub(crate) fn open_watches(&self) -> usize {
        self.places.open()
    }

    /// Follow the feed: everything handed to the ring after the revision
    /// returned comes through the receiver.
    pub(crate) fn subscribe(&self) -> Result<(broadcast::Receiver<Feed>, u64), WatchError> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let ring = ring.as_ref().ok_or_else(stopped)?;
        Ok((ring.subscribe(), *self.published.borrow()))
    }

    /// The last revision handed to the ring, changing as the feed goes on.
    pub(crate) fn published(&self) -> watch::Receiver<u64> {
        self.published.subscribe()
    }

    /// Hand `feed` to every watch; `revision` is the last revision the
    /// watches have now been given (or told they will never get).
    pub(crate) fn publish(&self, feed: Feed, revision: u64) {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ring) = ring.as_ref() {
            // An error only means no watch is open.
            let _ = ring.send(feed);
        }
        self.published.send_replace(revision);
    }

    /// Start the feed at `revision`: nothing before it is handed out.
    /// Called before any watch can subscribe.
    pub(crate) fn start_at(&self, revision: u64) {
        let _ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        self.published.send_replace(revision);
    }

    /// The feed has stopped: every watch ends.
    pub(crate) fn close(&self) {
        self.ring.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// The history's window and up to `max_records` records from `from`
    /// (from the window's start if `from` is before it).
    pub(crate) fn history(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<(Window, Vec<Record>), WatchError> {
        let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
        let reader = reader.as_ref().ok_or_else(stopped)?;
        reader
            .history(from, max_records, max_bytes)
            .map_err(|e| WatchError::Replica(ReplicaFailure::Unavailable(e.to_string())))
    }

    /// Whether the replica's reader is gone (it is shutting down).
    pub(crate) fn is_stopped(&self) -> bool {
        self.reader
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_none()
    }

    /// Whether this replica may be behind the cluster: a follower that
    /// holds log entries it has not applied, or a replica that knows no
    /// live leader (`RaftView::leader_is_live`). The leader is the
    /// cluster's newest state.
    pub(crate) fn behind(&self) -> bool {
        if self.view.leads() {
            return false;
        }
        let lagging = {
            let metrics = self.view.raft().metrics();
            let m = metrics.borrow_watched();
            let applied = m.last_applied.map(|l| l.index);
            m.current_leader.is_none() || m.last_log_index > applied
        };
        lagging || !self.view.leader_is_live()
    }
}
