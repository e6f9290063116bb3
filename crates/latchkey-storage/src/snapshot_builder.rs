//! [`SnapshotBuilder`]: builds a snapshot of the state machine from a
//! RocksDB snapshot, so applies may continue while it runs.

use std::io::BufWriter;
use std::sync::Arc;

use openraft::RaftSnapshotBuilder;
use rocksdb::DB;

use crate::applied_state::AppliedState;
use crate::blocking;
use crate::columns::Handles;
use crate::error::{raft_io, to_raft, RaftStorageError};
use crate::snapshot_file::SnapshotFile;
use crate::snapshot_format::BlobWriter;
use crate::types::{Snapshot, SnapshotMeta, TypeConfig};

/// Builds a snapshot of the applied state and saves it as the current one.
pub struct SnapshotBuilder {
    pub(crate) db: Arc<DB>,
    pub(crate) file: Arc<SnapshotFile>,
    pub(crate) observed: Arc<crate::observe::Observed>,
}

fn write_err(e: impl std::fmt::Display) -> RaftStorageError {
    raft_io::write_snapshot(e)
}

/// Build the snapshot of everything applied, as of one RocksDB snapshot,
/// written straight to a file (a frame at a time) and made the current
/// snapshot (unless a newer one became current meanwhile). Returns it, open
/// for reading, its size in bytes, and whether it is now the current one.
pub(crate) fn build(
    db: &DB,
    file: &SnapshotFile,
) -> Result<(Snapshot, u64, bool), RaftStorageError> {
    let cfs = Handles::of(db).map_err(to_raft)?;
    let view = db.snapshot();
    // Applies are not synced one by one. Make everything this view holds
    // durable before the snapshot file claims it: otherwise a crash could
    // leave a snapshot newer than the state machine on disk.
    db.flush_wal(true).map_err(raft_io::write_state_machine)?;
    let state =
        AppliedState::read(|k| view.get_cf(cfs.sm_meta, k)).map_err(raft_io::read_state_machine)?;
    let meta = SnapshotMeta {
        last_log_id: state.last_applied,
        last_membership: state.membership.clone(),
    };
    let staged = file.stage("building-").map_err(write_err)?;
    let mut writer = BlobWriter::new(BufWriter::new(staged.as_file()), &meta).map_err(write_err)?;
    let mut it = view.raw_iterator_cf(cfs.sm_data);
    it.seek_to_first();
    while let Some((key, value)) = it.item() {
        writer.push(key, value).map_err(write_err)?;
        it.next();
    }
    it.status().map_err(raft_io::read_state_machine)?;
    drop(writer.finish().map_err(write_err)?);
    let (current, built) = file.commit(staged, &meta, true).map_err(write_err)?;
    let bytes = built.metadata().map_err(write_err)?.len();
    tracing::info!(%meta, bytes, "built snapshot");
    Ok((
        Snapshot {
            meta,
            snapshot: tokio::fs::File::from_std(built),
        },
        bytes,
        current,
    ))
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = tokio::fs::File;

    async fn build_snapshot(&mut self) -> Result<Snapshot, RaftStorageError> {
        let db = Arc::clone(&self.db);
        let file = Arc::clone(&self.file);
        let started = std::time::Instant::now();
        let (built, bytes, current) = blocking::run(move || build(&db, &file)).await?;
        if current {
            self.observed.snapshot_current(bytes);
        }
        self.observed.snapshot_built(started.elapsed(), bytes);
        Ok(built)
    }
}
