//! [`StorageObserver`]: how the storage layer reports its work (WAL syncs,
//! snapshots) to whoever measures it, without depending on a metrics crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Told of the storage layer's work as it happens, for metrics. Calls come
/// from the log flusher thread and from blocking-pool threads: keep them
/// short, never block (record into atomics or a histogram) and never panic
/// (a panic in the flusher thread fails the replica).
///
/// ```
/// use std::time::Duration;
/// use latchkey_storage::StorageObserver;
///
/// struct Log;
/// impl StorageObserver for Log {
///     fn wal_synced(&self, took: Duration, appends: usize) {
///         tracing::trace!(?took, appends, "synced");
///     }
///     fn snapshot_built(&self, _took: Duration, _bytes: u64) {}
///     fn snapshot_installed(&self, _took: Duration, _bytes: u64) {}
/// }
/// ```
pub trait StorageObserver: Send + Sync {
    /// One write-ahead-log sync that made `appends` log appends durable
    /// (the group-commit batch) took `took`, failed or not.
    fn wal_synced(&self, took: Duration, appends: usize);
    /// A snapshot of `bytes` was built and saved in `took`.
    fn snapshot_built(&self, took: Duration, bytes: u64);
    /// A snapshot of `bytes` from the leader was installed in `took`.
    fn snapshot_installed(&self, took: Duration, bytes: u64);
}

/// The store's observer slot (set once, by [`crate::LogStore::observe`])
/// and the sync count the store keeps itself.
#[derive(Default)]
pub(crate) struct Observed {
    observer: OnceLock<Arc<dyn StorageObserver>>,
    syncs: AtomicU64,
}

impl Observed {
    /// Set the observer; `false` if one was set already.
    pub(crate) fn set(&self, observer: Arc<dyn StorageObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    pub(crate) fn wal_synced(&self, took: Duration, appends: usize) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        if let Some(o) = self.observer.get() {
            o.wal_synced(took, appends);
        }
    }

    pub(crate) fn snapshot_built(&self, took: Duration, bytes: u64) {
        if let Some(o) = self.observer.get() {
            o.snapshot_built(took, bytes);
        }
    }

    pub(crate) fn snapshot_installed(&self, took: Duration, bytes: u64) {
        if let Some(o) = self.observer.get() {
            o.snapshot_installed(took, bytes);
        }
    }
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observed")
            .field("observed", &self.observer.get().is_some())
            .field("syncs", &self.syncs())
            .finish()
    }
}
