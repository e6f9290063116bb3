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

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;

use openraft::storage::LogFlushed;
use rocksdb::DB;

use crate::types::TypeConfig;

/// The flusher: owns the thread; dropping it (with the last log store clone)
/// lets the thread finish its queue and joins it, so the database is closed
/// when the stores are gone.
pub(crate) struct GroupCommit {
    queue: Option<Sender<LogFlushed<TypeConfig>>>,
    thread: Option<JoinHandle<()>>,
    fsyncs: Arc<AtomicU64>,
}

impl GroupCommit {
    /// Start the flusher thread for `db`.
    pub(crate) fn start(db: Arc<DB>) -> io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let fsyncs = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&fsyncs);
        let thread = std::thread::Builder::new()
            .name("latchkey-log-flush".into())
            .spawn(move || run(&db, &rx, &counter))?;
        Ok(GroupCommit {
            queue: Some(tx),
            thread: Some(thread),
            fsyncs,
        })
    }

    /// Queue `callback` to be fired after the next WAL sync.
    pub(crate) fn submit(&self, callback: LogFlushed<TypeConfig>) -> Result<(), io::Error> {
        let queue = self
            .queue
            .as_ref()
            .ok_or_else(|| io::Error::other("group-commit flusher is shut down"))?;
        queue.send(callback).map_err(|e| {
            // The flusher is gone (it only stops when the queue closes, or if
            // it panicked): fail this callback rather than leave it hanging.
            e.0.log_io_completed(Err(io::Error::other("group-commit flusher has stopped")));
            io::Error::other("group-commit flusher has stopped")
        })
    }

    /// WAL syncs done so far for appends.
    pub(crate) fn fsync_count(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
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

fn run(db: &DB, queue: &Receiver<LogFlushed<TypeConfig>>, fsyncs: &AtomicU64) {
    // Block for the first waiter, then take everyone who queued meanwhile.
    while let Ok(first) = queue.recv() {
        let mut batch = vec![first];
        batch.extend(queue.try_iter());
        let result = db.flush_wal(true);
        fsyncs.fetch_add(1, Ordering::Relaxed);
        tracing::trace!(callbacks = batch.len(), "log group commit");
        match result {
            Ok(()) => {
                for callback in batch {
                    callback.log_io_completed(Ok(()));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, callbacks = batch.len(), "log WAL sync failed");
                for callback in batch {
                    callback
                        .log_io_completed(Err(io::Error::other(format!("WAL sync failed: {e}"))));
                }
            }
        }
    }
    tracing::debug!("group-commit flusher stopped");
}
