//! [`GroupCommit`]: one flusher thread that makes appended log entries
//! durable, sharing each fsync among every append waiting for it.
//!
//! `append()` writes its entries to RocksDB without syncing (so they are
//! readable at once) and hands its callback here. The flusher takes every
//! callback queued while its previous fsync ran, syncs the write-ahead log
//! once (`flush_wal(true)`), and only then fires those callbacks, in the
//! order they were queued. A callback is never fired before the sync that
//! covers its entries: the entries were written before the callback was
//! queued, and the sync covers everything written before it starts.
//!
//! Each sync also advances the [`DurableState`] and records the new durable
//! index in the [`AckMark`] (both before any callback fires: a replica
//! acknowledges nothing its mark does not cover).

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use openraft::storage::IOFlushed;
use rocksdb::DB;
use tokio::sync::watch;

use crate::ack_mark::AckMark;
use crate::durable::DurableState;
use crate::log_store::lock_mark;
use crate::observe::Observed;
use crate::types::{LogId, TypeConfig};

/// One append waiting for the next sync.
pub(crate) struct Pending {
    /// openraft's callback, fired once a sync covers the append.
    pub(crate) callback: IOFlushed<TypeConfig>,
    /// What the append wrote.
    pub(crate) written: Written,
}

/// Where an append left the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Written {
    /// The append's last entry.
    pub(crate) last: LogId,
    /// The [`DurableState::epoch`] when the append was written.
    pub(crate) epoch: u64,
}

/// The flusher: owns the thread; dropping it (with the last log store clone)
/// lets the thread finish its queue and joins it, so the database is closed
/// when the stores are gone.
pub(crate) struct GroupCommit {
    queue: Option<Sender<Pending>>,
    thread: Option<JoinHandle<()>>,
    observed: Arc<Observed>,
}

impl GroupCommit {
    /// Start the flusher thread for `db`, publishing what it syncs to
    /// `durable`.
    pub(crate) fn start(
        db: Arc<DB>,
        durable: Arc<watch::Sender<DurableState>>,
        mark: Arc<Mutex<AckMark>>,
        observed: Arc<Observed>,
    ) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let counter = Arc::clone(&observed);
        let thread = std::thread::Builder::new()
            .name("latchkey-log-flush".into())
            .spawn(move || run(&db, &rx, &counter, &durable, &mark))?;
        Ok(GroupCommit {
            queue: Some(tx),
            thread: Some(thread),
            observed,
        })
    }

    /// Queue `pending` to be made durable (and its callback fired) by the
    /// next WAL sync.
    pub(crate) fn submit(&self, pending: Pending) -> Result<(), io::Error> {
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| io::Error::other("group-commit flusher is shut down"))?;
        queue.send(pending).map_err(|e| {
            // The flusher is gone (it only stops when the queue closes, or if
            // it panicked): fail this callback rather than leave it hanging.
            e.0.callback
                .io_completed(Err(io::Error::other("group-commit flusher has stopped")));
            io::Error::other("group-commit flusher has stopped")
        })
    }

    /// Where the flusher reports its syncs.
    pub(crate) fn observed(&self) -> &Arc<Observed> {
        &self.observed
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        // Closing the queue stops the thread once it has flushed what is queued.
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("group-commit flusher thread panicked");
            }
        }
    }
}

/// Record that a sync covered `batch`. Appends written before the last
/// truncation are skipped: what they wrote below it is durable already (the
/// truncation was a synced write), and what they wrote above it is gone.
fn mark_durable<'a>(d: &mut DurableState, batch: impl Iterator<Item = &'a Written>) -> bool {
    let epoch = d.epoch;
    let mut changed = false;
    for w in batch.filter(|w| w.epoch == epoch) {
        changed |= d.advance(w.last);
    }
    changed
}

fn run(
    db: &DB,
    queue: &Receiver<Pending>,
    observed: &Observed,
    durable: &watch::Sender<DurableState>,
    mark: &Mutex<AckMark>,
) {
    // If this thread dies (a panic), nothing will be durable again: later
    // appends fail rather than wait forever.
    struct OnPanic<'a>(&'a watch::Sender<DurableState>);
    impl Drop for OnPanic<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0
                    .send_modify(|d| d.failed = Some("the log flusher thread panicked".into()));
            }
        }
    }
    let _guard = OnPanic(durable);
    // Block for the first waiter, then take everyone who queued meanwhile.
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        let appends = batch.len();
        let started = std::time::Instant::now();
        let synced = db.flush_wal(true);
        let took = started.elapsed();
        let result = synced
            .map_err(|e| format!("WAL sync failed: {e}"))
            .and_then(|()| {
                // Under the mark's lock, so a truncation cannot come between
                // recording the new durable index and publishing it. The mark
                // first: everything that acts on the durable state (the
                // saved commit index, openraft through the callbacks) must
                // find it covered by the mark.
                let mut mark = lock_mark(mark);
                let mut next = durable.borrow().clone();
                if !mark_durable(&mut next, batch.iter().map(|p| &p.written)) {
                    return Ok(());
                }
                mark.record_flushed(next.durable.map_or(0, |l| l.index))
                    .map_err(|e| format!("recording the acknowledgement mark failed: {e}"))?;
                durable.send_if_modified(|d| mark_durable(d, batch.iter().map(|p| &p.written)));
                Ok(())
            });
        tracing::trace!(appends = batch.len(), "log group commit");
        match result {
            Ok(()) => {
                // Durable (and marked) first, then the callbacks: whoever
                // learns of the flush from openraft finds it in the durable
                // state too.
                for p in batch {
                    p.callback.io_completed(Ok(()));
                }
            }
            Err(failure) => {
                tracing::error!(error = %failure, appends = batch.len(), "log sync failed");
                durable.send_modify(|d| d.failed = Some(failure.clone()));
                for p in batch {
                    p.callback
                        .io_completed(Err(io::Error::other(failure.clone())));
                }
            }
        }
        // After the callbacks: measuring stays off the acknowledgement path.
        observed.wal_synced(took, appends);
    }
    tracing::debug!("group-commit flusher stopped");
}

#[cfg(test)]
mod tests {

    use super::*;

    fn written(term: u64, index: u64, epoch: u64) -> Written {
        Written {
            last: crate::types::log_id(term, 1, index),
            epoch,
        }
    }

    #[test]
    fn a_sync_marks_its_appends_durable() {
        let mut d = DurableState::default();
        assert!(mark_durable(
            &mut d,
            [written(1, 3, 0), written(1, 7, 0)].iter()
        ));
        assert_eq!(d.durable.map(|l| l.index), Some(7));
        assert!(
            !mark_durable(&mut d, [written(1, 5, 0)].iter()),
            "never backwards"
        );
    }

    #[test]
    fn appends_from_before_a_truncation_are_not_marked() {
        // A leader wrote 1..=9 unsynced, stepped down; the new leader's
        // truncation at 5 (synced) left 1..=4 durable, then 5 was appended
        // again (term 2). The old sync of 9 must not mark 5..=9 durable.
        let mut d = DurableState {
            durable: Some(crate::types::log_id(1, 1, 4)),
            epoch: 1,
            ..DurableState::default()
        };
        assert!(!mark_durable(&mut d, [written(1, 9, 0)].iter()));
        assert_eq!(d.durable.map(|l| l.index), Some(4));
        assert!(mark_durable(
            &mut d,
            [written(1, 9, 0), written(2, 5, 1)].iter()
        ));
        assert_eq!(d.durable, Some(crate::types::log_id(2, 1, 5)));
    }
}
