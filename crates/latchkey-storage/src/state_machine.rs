//! [`StateMachine`]: applies committed entries through `latchkey_core` and
//! keeps the result in RocksDB; installs and serves snapshots.
//!
//! One `apply()` call is one RocksDB write batch: every entry runs through
//! [`latchkey_core::apply_with_events`] against an [`Overlay`] over the data,
//! then the overlay's writes, the last applied log id and the membership are
//! written together. A crash therefore never leaves data and "last applied"
//! out of step, and a store failure in the core aborts the whole call with
//! nothing written.
//!
//! The batch is not synced by default ([`crate::StorageOptions::sync_apply`]):
//! the entries are already durable in the log, all column families share one
//! write-ahead log that RocksDB recovers as a prefix, the log store syncs
//! before purging and a snapshot build syncs before saving its file; so
//! whatever a crash loses is still in the log and is applied again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use latchkey_core::Outcome;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, ErrorSubject, ErrorVerb, OptionalSend, Snapshot, StorageIOError};
use rocksdb::{WriteBatch, WriteOptions, DB};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use crate::applied_state::AppliedState;
use crate::blocking;
use crate::columns::Handles;
use crate::data_view::DataView;
use crate::durable::DurableLog;
use crate::error::{any, msg, to_raft, RaftStorageError};
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_install;
use crate::state_change::StateChange;
use crate::state_reader::{AppliedIndex, StateReader};
use crate::types::{Entry, SnapshotMeta, StoredMembership, TypeConfig};
use latchkey_core::overlay::Overlay;

/// The replicated state machine over RocksDB.
pub struct StateMachine {
    db: Arc<DB>,
    file: Arc<SnapshotFile>,
    state: AppliedState,
    applied: Arc<AppliedIndex>,
    sync_apply: bool,
    changes: Option<UnboundedSender<StateChange>>,
    /// The apply gate: entries the leader acknowledged before syncing them
    /// are applied only once synced (see [`crate::durable`]).
    durable: DurableLog,
    /// Where snapshot builds and installs are reported.
    observed: Arc<crate::observe::Observed>,
    /// Set while a snapshot is being received and not yet saved: the log
    /// store's purges wait then (see `snapshot_install::Covered`).
    receiving: Arc<AtomicBool>,
}

impl StateMachine {
    pub(crate) fn new(
        db: Arc<DB>,
        covered: &crate::snapshot_install::Covered,
        state: AppliedState,
        sync_apply: bool,
        durable: DurableLog,
        observed: Arc<crate::observe::Observed>,
    ) -> Self {
        let applied = Arc::clone(&covered.applied);
        applied.set(state.last_index());
        StateMachine {
            db,
            file: Arc::clone(&covered.file),
            state,
            applied,
            receiving: Arc::clone(&covered.receiving),
            sync_apply,
            changes: None,
            durable,
            observed,
        }
    }

    /// Receive every [`StateChange`] committed from now on, in log order.
    /// Replaces an earlier subscriber. Call it before handing the state
    /// machine to openraft.
    ///
    /// The channel is unbounded so applying never waits for the subscriber;
    /// a subscriber must keep up. Dropping the receiver unsubscribes.
    pub fn subscribe(&mut self) -> UnboundedReceiver<StateChange> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.changes = Some(tx);
        rx
    }

    /// Hand committed changes to the subscriber, if there is one.
    fn publish(&mut self, changes: Vec<StateChange>) {
        let Some(tx) = &self.changes else { return };
        for change in changes {
            if tx.send(change).is_err() {
                tracing::debug!("state change subscriber is gone");
                self.changes = None;
                return;
            }
        }
    }

    /// A handle that tells when every user of this store's RocksDB instance
    /// (log store, state machine, readers, snapshot builders, the flusher
    /// thread) has let go of it, so its directory can be opened again.
    pub fn closed_signal(&self) -> DbClosed {
        DbClosed(Arc::downgrade(&self.db))
    }

    /// A handle serving reads of the applied state, usable from any thread
    /// while this state machine keeps applying.
    pub fn reader(&self) -> StateReader {
        StateReader {
            db: Arc::clone(&self.db),
            applied: Arc::clone(&self.applied),
        }
    }

    /// Commit `writes` and `state` in one write batch.
    fn commit(
        &self,
        writes: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        state: &AppliedState,
    ) -> Result<(), RaftStorageError> {
        let cfs = Handles::of(&self.db).map_err(|e| to_raft(e, ErrorVerb::Write))?;
        let mut batch = WriteBatch::default();
        for (key, value) in writes {
            match value {
                Some(value) => batch.put_cf(cfs.sm_data, key, value),
                None => batch.delete_cf(cfs.sm_data, key),
            }
        }
        state
            .write_into(&mut batch, cfs.sm_meta)
            .map_err(|e| StorageIOError::write_state_machine(&e))?;
        let mut opts = WriteOptions::default();
        opts.set_sync(self.sync_apply);
        self.db
            .write_opt(batch, &opts)
            .map_err(|e| StorageIOError::write_state_machine(&e).into())
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<crate::types::LogId>, StoredMembership), RaftStorageError> {
        Ok((self.state.last_applied, self.state.membership.clone()))
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> Result<Vec<latchkey_core::CommandResult>, RaftStorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut next = self.state.clone();
        let mut replies = Vec::new();
        let mut changes = Vec::new();
        let listening = self.changes.is_some();
        let writes = {
            let base =
                DataView::live(&self.db).map_err(|e| StorageIOError::read_state_machine(&e))?;
            let mut overlay = Overlay::new(&base);
            for entry in entries {
                let log_id = entry.log_id;
                let reply = match entry.payload {
                    EntryPayload::Blank => Ok(Outcome::Done),
                    EntryPayload::Normal(request) => {
                        let (reply, events) =
                            latchkey_core::apply_with_events(&mut overlay, &request)
                                .map_err(|e| StorageIOError::apply(log_id, &e))?;
                        if listening && !events.is_empty() {
                            changes.push(StateChange::Applied { log_id, events });
                        }
                        reply
                    }
                    EntryPayload::Membership(membership) => {
                        next.membership = StoredMembership::new(Some(log_id), membership);
                        Ok(Outcome::Done)
                    }
                };
                next.last_applied = Some(log_id);
                replies.push(reply);
            }
            overlay.into_writes()
        };
        if replies.is_empty() {
            return Ok(replies);
        }
        // The gate: computed above while the leader's own sync may still be
        // running; written (and so visible) only once the entries are on
        // this replica's disk.
        if let Some(last) = next.last_applied {
            self.durable
                .wait_applicable(last.index)
                .await
                .map_err(|e| StorageIOError::apply(last, msg(e)))?;
        }
        self.commit(writes, &next)?;
        self.state = next;
        self.applied.set(self.state.last_index());
        self.publish(changes);
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: Arc::clone(&self.db),
            file: Arc::clone(&self.file),
            observed: Arc::clone(&self.observed),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<tokio::fs::File>, RaftStorageError> {
        self.receiving.store(true, Ordering::SeqCst);
        let file = Arc::clone(&self.file);
        let incoming = blocking::run(ErrorSubject::Snapshot(None), move || {
            file.incoming()
                .map_err(|e| StorageIOError::write_snapshot(None, &e).into())
        })
        .await?;
        Ok(Box::new(tokio::fs::File::from_std(incoming)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> Result<(), RaftStorageError> {
        tracing::info!(%meta, "installing snapshot");
        let failed = |e: &dyn std::fmt::Display| -> RaftStorageError {
            StorageIOError::write_snapshot(Some(meta.signature()), msg(e.to_string())).into()
        };
        let mut incoming = *snapshot;
        // A tokio file writes in the background: wait for the last chunk.
        incoming.flush().await.map_err(|e| failed(&e))?;
        let incoming = incoming.into_std().await;
        let bytes = incoming.metadata().map_err(|e| failed(&e))?.len();
        let started = std::time::Instant::now();
        let (db, file, gate) = (
            Arc::clone(&self.db),
            Arc::clone(&self.file),
            Arc::clone(&self.applied),
        );
        let owned_meta = meta.clone();
        let state = blocking::run(ErrorSubject::Snapshot(Some(meta.signature())), move || {
            snapshot_install::receive(&db, &file, &owned_meta, incoming, &gate).map_err(|e| {
                StorageIOError::write_snapshot(Some(owned_meta.signature()), any(&e)).into()
            })
        })
        .await?;
        self.receiving.store(false, Ordering::SeqCst);
        self.observed.snapshot_installed(started.elapsed(), bytes);
        self.state = state;
        self.applied.set(self.state.last_index());
        self.publish(vec![StateChange::SnapshotInstalled {
            last_log_id: self.state.last_applied,
        }]);
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, RaftStorageError> {
        let file = Arc::clone(&self.file);
        let loaded = blocking::run(ErrorSubject::Snapshot(None), move || {
            file.load()
                .map_err(|e| StorageIOError::read_snapshot(None, &e).into())
        })
        .await?;
        Ok(loaded.map(|(meta, file)| Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }
}

/// See [`StateMachine::closed_signal`].
#[derive(Debug, Clone)]
pub struct DbClosed(std::sync::Weak<DB>);

impl DbClosed {
    /// True once the RocksDB instance is closed (its lock file released).
    pub fn is_closed(&self) -> bool {
        self.0.strong_count() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use latchkey_core::{Command, Request};
    use openraft::{CommittedLeaderId, LogId};
    use tokio::sync::watch;

    use super::*;
    use crate::durable::DurableState;

    fn put(index: u64) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Request {
                now: index,
                command: Command::Put {
                    key: format!("k{index}").into_bytes(),
                    value: b"v".to_vec(),
                },
            }),
        }
    }

    /// The apply gate is wired in: an entry the leader acknowledged before
    /// its sync is neither applied nor visible until the sync is reported.
    #[test]
    fn apply_waits_for_the_leaders_own_sync() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (_log, mut sm) = crate::open(dir.path(), crate::StorageOptions::default()).unwrap();
            let (tx, rx) = watch::channel(DurableState {
                durable: Some(LogId::new(CommittedLeaderId::new(1, 1), 1)),
                acked_early: Some(3),
                ..DurableState::default()
            });
            sm.durable = DurableLog::new(rx);
            let reader = sm.reader();
            let applying = tokio::spawn(async move { sm.apply([put(2), put(3)]).await });
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert!(!applying.is_finished(), "applied before the leader's sync");
            assert_eq!(reader.last_applied_index(), None, "visible before the sync");
            tx.send_modify(|d| {
                d.advance(LogId::new(CommittedLeaderId::new(1, 1), 3));
            });
            let replies = tokio::time::timeout(Duration::from_secs(5), applying)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(replies.len(), 2);
            assert_eq!(reader.last_applied_index(), Some(3));
        });
    }
}
