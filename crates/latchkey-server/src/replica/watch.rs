//! Opening a watch on this replica: the caller may read the keys, the
//! replica serves, then the watch (`crate::watch`) starts.

use std::net::SocketAddr;

use latchkey_core::watch::Selection;
use latchkey_core::Query;
use latchkey_proto::wire::{WatchError, WatchSpec, MAX_PROGRESS, MIN_PROGRESS};
use latchkey_proto::ReplicaFailure;
use tokio::sync::watch;

use crate::auth::Caller;
use crate::watch::Deliveries;

use super::Replica;

impl Replica {
    /// Open a watch for `caller` on `connection` (`None`: in-process),
    /// checked here whichever way it came: its keys and progress interval
    /// (as the wire checks them), and the caller's right to read the keys.
    /// Access control checks it as a scan of the watched keys, once, when
    /// it opens: a permission revoked later does not end it.
    pub(crate) async fn open_watch(
        &self,
        spec: WatchSpec,
        caller: &Caller,
        connection: Option<SocketAddr>,
        stopping: Option<watch::Receiver<bool>>,
    ) -> Result<Deliveries, WatchError> {
        spec.keys.validate().map_err(ReplicaFailure::invalid)?;
        if !(MIN_PROGRESS..=MAX_PROGRESS).contains(&spec.progress) {
            return Err(ReplicaFailure::InvalidArgument(format!(
                "a watch's progress interval is {:?}; it must be {MIN_PROGRESS:?} to {MAX_PROGRESS:?}",
                spec.progress
            ))
            .into());
        }
        // Checked as a read of the same keys (a key as a get: a scan's end
        // past a key of the longest length would break the key limit).
        let read = match &spec.keys {
            Selection::Key(key) => Query::Get { key: key.clone() },
            keys => Query::Scan(keys.as_scan(1)),
        };
        if let Err(refused) = self.read(read, true, caller).await? {
            return Err(WatchError::Refused(refused));
        }
        crate::watch::start(&self.watches, spec, connection, stopping)
    }
}
