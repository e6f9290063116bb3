//! [`ReadGate`]: leadership confirmations (ReadIndex rounds) shared by
//! concurrent reads.
//!
//! A linearizable read needs a read index taken, and leadership confirmed by
//! a quorum, *after* the read arrived. openraft's `get_read_log_id` does one
//! such round per call: a heartbeat to every follower. Here one task runs the
//! rounds, one at a time: every read that arrives while a round is in flight
//! waits for the next round, which begins after it arrived, and shares it
//! with every other read that queued meanwhile. So reads cost heartbeats per
//! round, not per read, and none is served from a round that began before it.
//!
//! openraft 0.10 queues linearizable reads in its core too (one heartbeat
//! broadcast per read, coalesced per follower). Calling it once per read
//! instead of through this gate was measured, interleaved: linearizable get
//! x64 0.79 (the ranges of the rounds apart), x1 0.92 (overlapping)
//! (docs/PERFORMANCE.md), since every read then costs a
//! message through the Raft core. So the gate stays, and asks openraft for
//! one round per batch of reads.

use latchkey_proto::ReplicaFailure;
use latchkey_storage::types::Raft;
use openraft::error::{LinearizableReadError, RaftError};
use openraft::ReadPolicy;
use tokio::sync::{mpsc, oneshot};

use crate::write_queue::hint;

/// What a confirmed round tells its reads: the read index (the last log
/// index a read must see applied), if any entry exists.
pub(crate) type ReadIndex = Option<u64>;

type Reply = oneshot::Sender<Result<ReadIndex, ReplicaFailure>>;

/// The sending half of the read queue; dropping it ends the task.
pub(crate) struct ReadGate {
    queue: mpsc::UnboundedSender<Reply>,
}

impl ReadGate {
    /// Start the confirmation task of `raft`.
    pub(crate) fn start(raft: Raft) -> ReadGate {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, rx));
        ReadGate { queue }
    }

    /// Wait for a confirmation round begun after this call, and return its
    /// read index.
    pub(crate) async fn confirm(&self) -> Result<ReadIndex, ReplicaFailure> {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(reply)
            .map_err(|_| ReplicaFailure::Unavailable("this replica is shutting down".into()))?;
        answer
            .await
            .map_err(|_| ReplicaFailure::Unavailable("this replica is shutting down".into()))?
    }
}

async fn run(raft: Raft, mut rx: mpsc::UnboundedReceiver<Reply>) {
    while let Some(first) = rx.recv().await {
        // Everyone queued so far arrived before the round below begins.
        let mut readers = vec![first];
        while let Ok(next) = rx.try_recv() {
            readers.push(next);
        }
        readers.retain(|r| !r.is_closed());
        if readers.is_empty() {
            continue;
        }
        // ReadIndex: a quorum acknowledgement of a heartbeat sent after
        // the call (never a lease, which would rest on clocks).
        let result = match raft.get_read_log_id(ReadPolicy::ReadIndex).await {
            Ok((read_log_id, _applied)) => Ok(Some(read_log_id.index())),
            Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(f))) => {
                Err(ReplicaFailure::NotLeader { leader: hint(&f) })
            }
            Err(RaftError::APIError(LinearizableReadError::QuorumNotEnough(e))) => {
                Err(ReplicaFailure::Unavailable(e.to_string()))
            }
            Err(RaftError::Fatal(e)) => {
                Err(ReplicaFailure::Unavailable(format!("replica stopped: {e}")))
            }
        };
        for reader in readers {
            let _ = reader.send(result.clone());
        }
    }
    tracing::debug!("read gate stopped");
}
