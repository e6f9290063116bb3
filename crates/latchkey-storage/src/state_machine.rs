//! [`StateMachine`]: applies committed entries through `latchkey_core` and
//! keeps the result in RocksDB; installs and serves snapshots.
//!
//! One `apply()` call is one RocksDB write batch: every entry runs through
//! [`latchkey_core::apply_with_events`] against an [`Overlay`] over the data
//! (the lock rooms read from memory, the rest from RocksDB: see
//! [`crate::rooms`]), then the overlay's writes, the last applied log id and
//! the membership are written together. A crash therefore never leaves data and "last applied"
//! out of step, and a store failure in the core aborts the whole call with
//! nothing written.
//!
//! The batch is not synced by default ([`crate::StorageOptions::sync_apply`]):
//! a committed entry is on a majority of disks, all column families share
//! one write-ahead log that RocksDB recovers as a prefix, the log store syncs
//! before purging and a snapshot build syncs before saving its file; so
//! whatever a crash loses is applied again from the log. (A leader may apply
//! an entry a majority of followers hold before its own sync covers it;
//! openraft appends the entry before it asks for the apply, so the apply
//! batch comes after the entry in the same WAL, and RocksDB recovers that
//! WAL as a prefix (`DBRecoveryMode::PointInTime`, and a memtable flush
//! syncs the WALs it closes): a machine crash that loses the entry loses the
//! batch too, and the entry comes back from the followers.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use latchkey_core::Outcome;
use openraft::storage::{EntryResponder, RaftStateMachine};
use openraft::{EntryPayload, OptionalSend};
use rocksdb::{WriteBatch, WriteOptions, DB};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};

use crate::applied_state::AppliedState;
use crate::blocking;
use crate::columns::Handles;
use crate::data_view::DataView;
use crate::error::{raft_io, to_raft, RaftStorageError};
use crate::rooms::{ApplyView, Rooms};
use crate::snapshot_builder::SnapshotBuilder;
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_install;
use crate::state_change::StateChange;
use crate::state_reader::{AppliedIndex, StateReader};
use crate::types::{Entry, Snapshot, SnapshotMeta, StoredMembership, TypeConfig};
use latchkey_core::overlay::Overlay;

/// The replicated state machine over RocksDB.
pub struct StateMachine {
    db: Arc<DB>,
    file: Arc<SnapshotFile>,
    state: AppliedState,
    /// The lock rooms, in memory as well as in RocksDB ([`crate::rooms`]).
    rooms: Rooms,
    /// `rooms.bytes()`, for readers (a gauge).
    rooms_bytes: Arc<std::sync::atomic::AtomicU64>,
    applied: Arc<AppliedIndex>,
    sync_apply: bool,
    changes: Option<UnboundedSender<StateChange>>,
    /// The cluster's revision in the applied state, published once the
    /// batch that raised it is committed (see [`StateMachine::revisions`]).
    revision: tokio::sync::watch::Sender<u64>,
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
        rooms: Rooms,
        sync_apply: bool,
        observed: Arc<crate::observe::Observed>,
    ) -> Self {
        let applied = Arc::clone(&covered.applied);
        applied.set(state.last_index());
        let revision = tokio::sync::watch::Sender::new(0);
        StateMachine {
            revision,
            db,
            file: Arc::clone(&covered.file),
            state,
            rooms_bytes: Arc::new(std::sync::atomic::AtomicU64::new(rooms.bytes() as u64)),
            rooms,
            applied,
            receiving: Arc::clone(&covered.receiving),
            sync_apply,
            changes: None,
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

    /// The cluster's revision in the applied state: changes (to a higher
    /// value) once a committed batch raised it, or a snapshot install
    /// replaced the state; a reader then sees that revision's record in
    /// the watch history. Starts at the revision of the state opened
    /// ([`StateMachine::publish_revision`]). Ends (the sender is dropped)
    /// when the state machine is.
    pub fn revisions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// Read the revision of the committed state and publish it.
    pub(crate) fn publish_revision(&self) -> Result<(), latchkey_core::StoreError> {
        let view = DataView::live(&self.db)?;
        self.set_revision(latchkey_core::data::revision(&view)?);
        Ok(())
    }

    fn set_revision(&self, revision: u64) {
        self.revision.send_if_modified(|r| {
            let raised = revision != *r;
            *r = revision;
            raised
        });
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
            rooms_bytes: Arc::clone(&self.rooms_bytes),
        }
    }

    /// Commit `writes` and `state` in one write batch, then hand the writes
    /// to the in-memory rooms (only once RocksDB has them).
    fn commit(
        &mut self,
        writes: std::collections::BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        state: &AppliedState,
    ) -> Result<(), RaftStorageError> {
        let cfs = Handles::of(&self.db).map_err(to_raft)?;
        let mut batch = WriteBatch::default();
        for (key, value) in &writes {
            match value {
                Some(value) => batch.put_cf(cfs.sm_data, key, value),
                None => batch.delete_cf(cfs.sm_data, key),
            }
        }
        state
            .write_into(&mut batch, cfs.sm_meta)
            .map_err(raft_io::write_state_machine)?;
        let mut opts = WriteOptions::default();
        opts.set_sync(self.sync_apply);
        self.db
            .write_opt(batch, &opts)
            .map_err(raft_io::write_state_machine)?;
        self.rooms.commit(writes);
        self.rooms_bytes
            .store(self.rooms.bytes() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl StateMachine {
    /// Apply committed `entries` in one RocksDB write batch and return what
    /// each one yields, in order: the body of openraft's `apply`, callable
    /// without openraft's responders (tests, tools).
    ///
    /// Nothing is visible to readers, and no reply is sent, before the
    /// whole batch is committed.
    pub async fn apply_entries<I>(
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
            let base = ApplyView {
                rooms: &self.rooms,
                data: DataView::live(&self.db).map_err(raft_io::read_state_machine)?,
            };
            let mut overlay = Overlay::new(&base);
            for entry in entries {
                let log_id = entry.log_id;
                let reply = match entry.payload {
                    EntryPayload::Blank => Ok(Outcome::Done),
                    EntryPayload::Normal(request) => {
                        let (reply, events) =
                            latchkey_core::apply_with_events(&mut overlay, &request)
                                .map_err(|e| raft_io::apply(log_id, e))?;
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
            let revision =
                latchkey_core::data::revision(&overlay).map_err(raft_io::read_state_machine)?;
            (overlay.into_writes(), revision)
        };
        let (writes, revision) = writes;
        if replies.is_empty() {
            return Ok(replies);
        }
        self.commit(writes, &next)?;
        self.state = next;
        self.applied.set(self.state.last_index());
        self.publish(changes);
        self.set_revision(revision);
        Ok(replies)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = tokio::fs::File;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<crate::types::LogId>, StoredMembership), RaftStorageError> {
        Ok((self.state.last_applied, self.state.membership.clone()))
    }

    /// Takes the whole batch openraft hands over (one `Apply` command:
    /// finite), applies it as one write batch ([`StateMachine::apply_entries`]),
    /// and only then answers the waiting clients: a client never sees its
    /// reply before a read can see its write.
    async fn apply<Strm>(&mut self, mut entries: Strm) -> Result<(), RaftStorageError>
    where
        Strm: Stream<Item = Result<EntryResponder<TypeConfig>, RaftStorageError>>
            + Unpin
            + OptionalSend,
    {
        let mut batch = Vec::new();
        let mut responders = Vec::new();
        while let Some(item) = entries.next().await {
            let (entry, responder) = item?;
            batch.push(entry);
            responders.push(responder);
        }
        let replies = self.apply_entries(batch).await?;
        for (responder, reply) in responders.into_iter().zip(replies) {
            if let Some(responder) = responder {
                responder.send(reply);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            db: Arc::clone(&self.db),
            file: Arc::clone(&self.file),
            observed: Arc::clone(&self.observed),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: tokio::fs::File,
    ) -> Result<(), RaftStorageError> {
        tracing::info!(%meta, "installing snapshot");
        let failed = |e: &dyn std::fmt::Display| -> RaftStorageError {
            raft_io::write_snapshot(format_args!("{meta}: {e}"))
        };
        let mut incoming = snapshot;
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
        let (state, rooms) = blocking::run(move || {
            let state = snapshot_install::receive(&db, &file, &owned_meta, incoming, &gate)
                .map_err(raft_io::write_snapshot)?;
            let rooms = Rooms::load(&db).map_err(raft_io::write_snapshot)?;
            Ok((state, rooms))
        })
        .await?;
        self.rooms = rooms;
        self.rooms_bytes
            .store(self.rooms.bytes() as u64, Ordering::Relaxed);
        self.receiving.store(false, Ordering::SeqCst);
        self.observed.snapshot_installed(started.elapsed(), bytes);
        self.state = state;
        self.applied.set(self.state.last_index());
        self.publish(vec![StateChange::SnapshotInstalled {
            last_log_id: self.state.last_applied,
        }]);
        self.publish_revision()
            .map_err(raft_io::read_state_machine)?;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, RaftStorageError> {
        let file = Arc::clone(&self.file);
        let loaded = blocking::run(move || file.load().map_err(raft_io::read_snapshot)).await?;
        Ok(loaded.map(|(meta, file)| Snapshot {
            meta,
            snapshot: tokio::fs::File::from_std(file),
        }))
    }
}

/// Receiving a snapshot in chunks (openraft's v1 snapshot protocol, which
/// latchkey's peer service speaks): into a temporary file beside the
/// current one, never into memory.
impl openraft_legacy::network_v1::SnapshotReceiverFactory<TypeConfig> for StateMachine {
    type SnapshotReceiver = tokio::fs::File;

    async fn begin_receiving_snapshot(&mut self) -> Result<tokio::fs::File, RaftStorageError> {
        self.receiving.store(true, Ordering::SeqCst);
        let file = Arc::clone(&self.file);
        let incoming =
            blocking::run(move || file.incoming().map_err(raft_io::write_snapshot)).await?;
        Ok(tokio::fs::File::from_std(incoming))
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
    use latchkey_core::{Command, Request};

    use super::*;

    /// One step of [`the_rooms_in_memory_always_equal_rocksdb`].
    #[derive(Debug, Clone)]
    enum Op {
        Open,
        Close(usize),
        Expire(usize),
        Acquire {
            slot: usize,
            owner: u64,
            lock: usize,
            wait: bool,
        },
        Release {
            slot: usize,
            owner: u64,
            lock: usize,
        },
        Cancel {
            slot: usize,
            owner: u64,
            lock: usize,
        },
        Put(u8),
        DeleteAll,
        /// Close and open the store again.
        Reopen,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        let slot = 0usize..4;
        prop_oneof![
            2 => Just(Op::Open),
            1 => slot.clone().prop_map(Op::Close),
            1 => slot.clone().prop_map(Op::Expire),
            6 => (slot.clone(), 0u64..2, 0usize..2, any::<bool>())
                .prop_map(|(slot, owner, lock, wait)| Op::Acquire { slot, owner, lock, wait }),
            5 => (slot.clone(), 0u64..2, 0usize..2)
                .prop_map(|(slot, owner, lock)| Op::Release { slot, owner, lock }),
            1 => (slot, 0u64..2, 0usize..2)
                .prop_map(|(slot, owner, lock)| Op::Cancel { slot, owner, lock }),
            2 => any::<u8>().prop_map(Op::Put),
            1 => Just(Op::DeleteAll),
            1 => Just(Op::Reopen),
        ]
    }

    /// Every row under a cached tag, read from RocksDB.
    fn cached_rows_on_disk(sm: &StateMachine) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
        let cfs = Handles::of(&sm.db).unwrap();
        sm.db
            .iterator_cf(cfs.sm_data, rocksdb::IteratorMode::Start)
            .map(|row| row.unwrap())
            .filter(|(k, _)| crate::rooms::CACHED_TAGS.contains(&k[0]))
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect()
    }

    fn all_rows_on_disk(sm: &StateMachine) -> std::collections::BTreeMap<Vec<u8>, Vec<u8>> {
        let cfs = Handles::of(&sm.db).unwrap();
        sm.db
            .iterator_cf(cfs.sm_data, rocksdb::IteratorMode::Start)
            .map(|row| row.unwrap())
            .map(|(k, v)| (k.into_vec(), v.into_vec()))
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(24))]

        /// The in-memory rooms equal what RocksDB holds under their tags
        /// after any sequence of lock and KV commands, applied in batches of
        /// any size, across reopening the store and installing a snapshot;
        /// and applying through them leaves RocksDB with exactly the rows
        /// the core leaves in a plain in-memory store.
        #[test]
        fn the_rooms_in_memory_always_equal_rocksdb(
            ops in proptest::collection::vec(op(), 1..60),
            batch in 1usize..5,
        ) {
            use latchkey_core::lock::{LockCommand, LockMode, LockOutcome, SessionId, SessionSecret, Token};
            use std::collections::BTreeMap;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let dir = tempfile::tempdir().unwrap();
            let mut sm = Some(crate::open(dir.path(), crate::StorageOptions::default()).unwrap().1);
            let mut model = latchkey_core::MemStore::default();
            let mut slots: [Option<(SessionId, SessionSecret)>; 4] = [None; 4];
            let mut tokens: BTreeMap<(usize, u64, usize), Token> = BTreeMap::new();
            let mut request_id = 0u64;
            let mut index = 0u64;
            let mut pending: Vec<Entry> = Vec::new();
            let locks = ["a", "b"];
            for (i, op) in ops.iter().enumerate() {
                request_id += 1;
                let session = |slot: usize| slots[slot].unwrap_or((SessionId(99), SessionSecret([0; 16])));
                let command = match op.clone() {
                    Op::Open => Command::Lock(LockCommand::OpenSession {
                        ttl_ms: 10_000,
                        secret: SessionSecret([i as u8; 16]),
                        name: String::new(),
                    }),
                    Op::Close(slot) => Command::Lock(LockCommand::CloseSession {
                        session: session(slot).0,
                        secret: session(slot).1,
                    }),
                    Op::Expire(slot) => Command::Lock(LockCommand::ExpireSession { session: session(slot).0 }),
                    Op::Acquire { slot, owner, lock, wait } => Command::Lock(LockCommand::Acquire {
                        session: session(slot).0,
                        secret: session(slot).1,
                        owner,
                        request_id,
                        name: locks[lock].to_string(),
                        mode: LockMode::Exclusive,
                        wait_ms: wait.then_some(60_000),
                        lease_ms: None,
                        lock_delay_ms: None,
                        value: Vec::new(),
                        permits: None,
                    }),
                    Op::Release { slot, owner, lock } => Command::Lock(LockCommand::Release {
                        session: session(slot).0,
                        secret: session(slot).1,
                        owner,
                        request_id,
                        name: locks[lock].to_string(),
                        token: tokens.get(&(slot, owner, lock)).copied().unwrap_or(Token(0)),
                    }),
                    Op::Cancel { slot, owner, lock } => Command::Lock(LockCommand::CancelWait {
                        session: session(slot).0,
                        secret: session(slot).1,
                        owner,
                        name: locks[lock].to_string(),
                        request_id: request_id.saturating_sub(2),
                    }),
                    Op::Put(k) => Command::Put { key: vec![k % 8], value: vec![k] },
                    Op::DeleteAll => Command::DeleteRange { start: vec![0], end: vec![8] },
                    Op::Reopen => {
                        rt.block_on(sm.as_mut().unwrap().apply_entries(std::mem::take(&mut pending))).unwrap();
                        let closed = sm.take().unwrap().closed_signal();
                        while !closed.is_closed() {
                            std::thread::sleep(std::time::Duration::from_millis(5));
                        }
                        sm = Some(crate::open(dir.path(), crate::StorageOptions::default()).unwrap().1);
                        continue;
                    }
                };
                index += 1;
                let request = Request { now: index, command };
                // The model learns sessions and tokens from the outcome.
                let (outcome, _) = latchkey_core::apply_with_events(&mut model, &request).unwrap();
                match (op, outcome) {
                    (Op::Open, Ok(latchkey_core::Outcome::Lock(LockOutcome::SessionOpened { session, secret, .. }))) => {
                        let slot = slots.iter().position(Option::is_none).unwrap_or(0);
                        slots[slot] = Some((session, secret));
                    }
                    (Op::Acquire { slot, owner, lock, .. }, Ok(latchkey_core::Outcome::Lock(LockOutcome::Granted { sequencer, .. }))) => {
                        tokens.insert((*slot, *owner, *lock), sequencer.token);
                    }
                    _ => {}
                }
                pending.push(Entry {
                    log_id: crate::types::log_id(1, 1, index),
                    payload: EntryPayload::Normal(request),
                });
                if pending.len() >= batch {
                    let sm = sm.as_mut().unwrap();
                    rt.block_on(sm.apply_entries(std::mem::take(&mut pending))).unwrap();
                    proptest::prop_assert_eq!(sm.rooms.rows(), &cached_rows_on_disk(sm));
                }
            }
            let sm = sm.as_mut().unwrap();
            rt.block_on(sm.apply_entries(std::mem::take(&mut pending))).unwrap();
            proptest::prop_assert_eq!(sm.rooms.rows(), &cached_rows_on_disk(sm));
            proptest::prop_assert_eq!(&all_rows_on_disk(sm), &model.map);
            if index == 0 {
                return Ok(());
            }

            // A snapshot installed elsewhere brings the same rooms.
            let other_dir = tempfile::tempdir().unwrap();
            let mut other = crate::open(other_dir.path(), crate::StorageOptions::default()).unwrap().1;
            rt.block_on(other.apply_entries([Entry {
                log_id: crate::types::log_id(1, 1, 1),
                payload: EntryPayload::Normal(Request {
                    now: 1,
                    command: Command::Lock(LockCommand::OpenSession { ttl_ms: 10_000, secret: SessionSecret([7; 16]), name: String::new() }),
                }),
            }])).unwrap();
            rt.block_on(async {
                use openraft::RaftSnapshotBuilder;
                use openraft_legacy::network_v1::SnapshotReceiverFactory;
                use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
                let mut snap = sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
                let mut bytes = Vec::new();
                snap.snapshot.seek(std::io::SeekFrom::Start(0)).await.unwrap();
                snap.snapshot.read_to_end(&mut bytes).await.unwrap();
                let mut incoming = other.begin_receiving_snapshot().await.unwrap();
                incoming.write_all(&bytes).await.unwrap();
                other.install_snapshot(&snap.meta, incoming).await.unwrap();
            });
            proptest::prop_assert_eq!(other.rooms.rows(), sm.rooms.rows());
            proptest::prop_assert_eq!(other.rooms.rows(), &cached_rows_on_disk(&other));
            proptest::prop_assert_eq!(other.rooms.bytes(), sm.rooms.bytes());
        }
    }
}
