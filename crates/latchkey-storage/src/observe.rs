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

/// The store's observer slot (set once, by [`crate::LogStore::observe`]),
/// the sync count the store keeps itself, and what [`SnapshotPace`] reads.
#[derive(Default)]
pub(crate) struct Observed {
    observer: OnceLock<Arc<dyn StorageObserver>>,
    syncs: AtomicU64,
    /// Bytes of log entries appended since the store opened.
    log_appended: AtomicU64,
    /// `log_appended` when the current snapshot was built or installed.
    log_at_snapshot: AtomicU64,
    /// The current snapshot's size in bytes.
    snapshot_bytes: AtomicU64,
}

/// When to build the next snapshot: the pace that keeps the cost of
/// snapshots proportional to the log they replace.
///
/// A snapshot is the whole state, so building one after a fixed number of
/// entries costs more the larger the state: with a million keys (~150
/// MB), a snapshot every 10,000 small lock entries had every replica
/// rewriting the whole state every few seconds, and lock rounds measured
/// meanwhile lost a third of their throughput (docs/performance-log.md, change
/// 21). So a replica builds a snapshot only once both hold:
///
/// - at least `snapshot_every` entries were applied since the last one
///   (`RaftSettings::snapshot_every` in latchkey-server), as before; and
/// - the log appended since then holds at least as many bytes as the
///   current snapshot ([`SnapshotPace::due`]).
///
/// Each snapshot then writes at most as many bytes as the log it lets the
/// replica purge, whatever the size of the state: snapshots at most double
/// what the replica writes for its log, and the log between snapshots
/// holds at most about one snapshot's worth of bytes (plus `snapshot_every`
/// entries). A small state is snapshotted every `snapshot_every` entries,
/// exactly as before. At open, the log entries past the current snapshot
/// count as appended, so restarts do not postpone the next snapshot.
///
/// Not handled: a state that shrinks at once (one `DeleteRange` of most of
/// the keys) is compared with the size of the snapshot taken before, so
/// the next snapshot waits for that much log.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let (log, _sm) = latchkey_storage::open(dir.path(), Default::default())?;
/// let pace = log.snapshot_pace();
/// // No snapshot yet: due as soon as enough entries were applied.
/// assert!(pace.due(10_000, 10_000));
/// assert!(!pace.due(9_999, 10_000));
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct SnapshotPace(pub(crate) Arc<Observed>);

impl SnapshotPace {
    /// Bytes of log entries this replica appended since its current
    /// snapshot (since it opened, if the snapshot is older).
    pub fn log_bytes_since_snapshot(&self) -> u64 {
        let o = &self.0;
        o.log_appended
            .load(Ordering::Relaxed)
            .saturating_sub(o.log_at_snapshot.load(Ordering::Relaxed))
    }

    /// The current snapshot's size in bytes (0 without one).
    pub fn snapshot_bytes(&self) -> u64 {
        self.0.snapshot_bytes.load(Ordering::Relaxed)
    }

    /// Is a snapshot due, with `entries_since` entries applied since the
    /// current one and at least `snapshot_every` wanted between two? See
    /// the type's docs.
    pub fn due(&self, entries_since: u64, snapshot_every: u64) -> bool {
        entries_since >= snapshot_every.max(1)
            && self.log_bytes_since_snapshot() >= self.snapshot_bytes()
    }
}

impl std::fmt::Debug for SnapshotPace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotPace")
            .field("log_bytes_since_snapshot", &self.log_bytes_since_snapshot())
            .field("snapshot_bytes", &self.snapshot_bytes())
            .finish()
    }
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

    /// Log entries of `bytes` were appended.
    pub(crate) fn log_appended(&self, bytes: u64) {
        self.log_appended.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A snapshot of `bytes` became current (built, installed, or found
    /// at open): the log is counted from here.
    pub(crate) fn snapshot_current(&self, bytes: u64) {
        self.snapshot_bytes.store(bytes, Ordering::Relaxed);
        self.log_at_snapshot
            .store(self.log_appended.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    pub(crate) fn snapshot_built(&self, took: Duration, bytes: u64) {
        if let Some(o) = self.observer.get() {
            o.snapshot_built(took, bytes);
        }
    }

    pub(crate) fn snapshot_installed(&self, took: Duration, bytes: u64) {
        self.snapshot_current(bytes);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_due_after_enough_entries_and_as_much_log() {
        let pace = SnapshotPace(Arc::new(Observed::default()));
        // No snapshot yet: entries alone decide.
        assert!(!pace.due(49, 50));
        assert!(pace.due(50, 50));
        // A snapshot of 1,000 bytes: the log must reach as much again.
        pace.0.log_appended(300);
        pace.0.snapshot_current(1_000);
        assert_eq!(pace.log_bytes_since_snapshot(), 0);
        pace.0.log_appended(999);
        assert!(!pace.due(10_000, 50), "999 bytes of log < 1,000");
        pace.0.log_appended(1);
        assert!(pace.due(50, 50));
        assert!(!pace.due(49, 50), "entries still count");
        // An installed snapshot resets the count the same way.
        pace.0.snapshot_installed(Duration::ZERO, 10);
        assert_eq!(pace.snapshot_bytes(), 10);
        assert!(!pace.due(50, 50));
        pace.0.log_appended(10);
        assert!(pace.due(50, 50));
        // `snapshot_every` 0 means every entry, never "always".
        assert!(!pace.due(0, 0));
    }
}
