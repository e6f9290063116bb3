//! One replica's request handling: propose writes, serve reads, report status.
//!
//! Both the gRPC services and the in-process client path call [`Replica`], so
//! a request behaves the same whichever way it arrives.

use std::sync::RwLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use latchkey_client::{BoxFuture, LocalReplica, MemberInfo, NodeStatus, ReplicaFailure};
use latchkey_core::{validate_command, validate_query, Command, CommandResult, Query, Request};
use latchkey_storage::{StateReader, TypeConfig};
use openraft::error::{CheckIsLeaderError, ClientWriteError, ForwardToLeader, RaftError};
use openraft::{BasicNode, Raft, ServerState};

/// A running replica's request path.
pub struct Replica {
    id: u64,
    raft: Raft<TypeConfig>,
    /// Taken away at shutdown so the RocksDB instance closes even while
    /// clients of this replica are still alive.
    reader: RwLock<Option<StateReader>>,
    write_timeout: Duration,
    read_timeout: Duration,
}

/// Wall-clock milliseconds: the `now` a leader stamps on each entry. The core
/// keeps the largest value seen, so a clock stepping back is harmless.
fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn hint(f: &ForwardToLeader<u64, BasicNode>) -> Option<(u64, String)> {
    match (f.leader_id, &f.leader_node) {
        (Some(id), Some(node)) => Some((id, node.addr.clone())),
        _ => None,
    }
}

impl Replica {
    pub(crate) fn new(
        id: u64,
        raft: Raft<TypeConfig>,
        reader: StateReader,
        write_timeout: Duration,
        read_timeout: Duration,
    ) -> Self {
        Replica {
            id,
            raft,
            reader: RwLock::new(Some(reader)),
            write_timeout,
            read_timeout,
        }
    }

    /// The openraft handle.
    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.raft
    }

    /// The leader as this replica knows it: id and address.
    pub fn leader(&self) -> Option<(u64, String)> {
        let m = self.raft.metrics().borrow().clone();
        let leader = m.current_leader?;
        let node = m.membership_config.membership().get_node(&leader)?;
        Some((leader, node.addr.clone()))
    }

    fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    fn not_leader(&self) -> ReplicaFailure {
        ReplicaFailure::NotLeader {
            leader: self.leader(),
        }
    }

    /// Propose `command` if this replica leads; otherwise refuse without
    /// proposing. Answers once the entry is applied here.
    pub async fn write(&self, command: Command) -> Result<CommandResult, ReplicaFailure> {
        validate_command(&command).map_err(|e| ReplicaFailure::InvalidArgument(e.to_string()))?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let request = Request {
            now: wall_millis(),
            command,
        };
        match tokio::time::timeout(self.write_timeout, self.raft.client_write(request)).await {
            Ok(Ok(response)) => Ok(response.data),
            // Either refused before appending, or appended and then truncated
            // by a new leader: in both cases it was never committed.
            Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ReplicaFailure::NotLeader { leader: hint(&f) })
            }
            Ok(Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(ReplicaFailure::InvalidArgument(e.to_string()))
            }
            Ok(Err(RaftError::Fatal(e))) => Err(ReplicaFailure::UnknownOutcome(format!(
                "replica stopped while the write was pending: {e}"
            ))),
            Err(_) => Err(ReplicaFailure::UnknownOutcome(format!(
                "the write did not commit within {:?}",
                self.write_timeout
            ))),
        }
    }

    /// Serve `query`: linearizable (leader only, after a ReadIndex round)
    /// unless `stale`, in which case from this replica's applied state.
    pub async fn read(&self, query: Query, stale: bool) -> Result<CommandResult, ReplicaFailure> {
        validate_query(&query).map_err(|e| ReplicaFailure::InvalidArgument(e.to_string()))?;
        if !stale {
            if !self.is_leader() {
                return Err(self.not_leader());
            }
            match tokio::time::timeout(self.read_timeout, self.raft.ensure_linearizable()).await {
                Ok(Ok(_)) => {}
                Ok(Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)))) => {
                    return Err(ReplicaFailure::NotLeader { leader: hint(&f) })
                }
                Ok(Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e)))) => {
                    return Err(ReplicaFailure::Unavailable(e.to_string()))
                }
                Ok(Err(RaftError::Fatal(e))) => {
                    return Err(ReplicaFailure::Unavailable(format!("replica stopped: {e}")))
                }
                Err(_) => {
                    return Err(ReplicaFailure::Unavailable(format!(
                        "could not confirm leadership within {:?}",
                        self.read_timeout
                    )))
                }
            }
        }
        let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
        match reader.as_ref() {
            Some(r) => r
                .query(&query)
                .map_err(|e| ReplicaFailure::Unavailable(e.to_string())),
            None => Err(ReplicaFailure::Unavailable(
                "this replica has shut down".into(),
            )),
        }
    }

    /// Drop this replica's handle on the state (called at shutdown, after
    /// Raft has stopped), so its data directory can be opened again.
    pub(crate) fn close(&self) {
        self.reader
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// This replica's view of itself and the cluster.
    pub fn status(&self) -> NodeStatus {
        let m = self.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| MemberInfo {
                id: *id,
                addr: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_addr = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| n.addr.clone()));
        let state = match m.state {
            ServerState::Leader => "Leader",
            ServerState::Follower => "Follower",
            ServerState::Candidate => "Candidate",
            ServerState::Learner => "Learner",
            ServerState::Shutdown => "Shutdown",
        };
        NodeStatus {
            id: self.id,
            leader_id: m.current_leader,
            leader_addr,
            term: m.current_term,
            last_applied: m.last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            state: state.to_string(),
            members,
        }
    }
}

impl LocalReplica for Replica {
    fn write(&self, command: Command) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>> {
        Box::pin(Replica::write(self, command))
    }

    fn read(
        &self,
        query: Query,
        stale: bool,
    ) -> BoxFuture<'_, Result<CommandResult, ReplicaFailure>> {
        Box::pin(Replica::read(self, query, stale))
    }
}
