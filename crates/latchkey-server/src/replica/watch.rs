//! Opening a watch on this replica: the caller may read the keys, the
//! replica serves, then the watch (`crate::watch`) starts.

use std::net::SocketAddr;

use latchkey_core::Query;
use latchkey_proto::wire::{WatchError, WatchSpec};
use latchkey_proto::WatchStream;
use tokio::sync::watch;

use crate::auth::Caller;

use super::Replica;

impl Replica {
    /// Open a watch for `caller` on `connection` (`None`: in-process).
    /// Access control checks it as a scan of the watched keys, once, when
    /// it opens: a permission revoked later does not end it.
    pub(crate) async fn open_watch(
        &self,
        spec: WatchSpec,
        caller: &Caller,
        connection: Option<SocketAddr>,
        stopping: Option<watch::Receiver<bool>>,
    ) -> Result<WatchStream, WatchError> {
        let scan = Query::Scan(spec.keys.as_scan(1));
        if let Err(refused) = self.read(scan, true, caller).await? {
            return Err(WatchError::Refused(refused));
        }
        crate::watch::start(&self.watches, spec, connection, stopping)
    }
}
