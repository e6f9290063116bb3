//! Membership changes a leader makes: adding a member (and replacing one
//! whose data directory was wiped), with the incarnation it finds there.
//!
//! Adding node `id` at `addr`:
//! 1. ask the replica at `addr` who it is (`Raft.Identify`): it must answer
//!    as node `id`; its answer gives the incarnation the membership records;
//! 2. if the membership lists `id` with another incarnation, that member is
//!    gone (its disk was wiped or replaced): remove it first, a joint
//!    consensus change that needs the remaining voters. The new incarnation
//!    is never counted as the old member: it starts as a learner;
//! 3. add it as a learner and wait (bounded) until it has caught up with the
//!    log as of the change, from the log or from a snapshot;
//! 4. with `voter`, promote it (joint consensus).
//!
//! Each step is idempotent, so running the same `members add` again after a
//! timeout carries on where the last one stopped.
//!
//! Every change of the voters (removing one, or the old incarnation in step
//! 2) is refused unless a majority of the current voters and of the new
//! ones answer (see [`check_live_majority`]; `force` overrides): a change
//! that cannot commit would hang, and one that commits with too few live
//! voters leaves a cluster that cannot serve.

use openraft::async_runtime::WatchReceiver;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use latchkey_proto::v1::IdentifyRequest;
use latchkey_proto::ReplicaFailure;
use latchkey_storage::{Member, TypeConfig};
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::ChangeMembers;

use crate::peer_auth::PeerClient;
use crate::raft_view::RaftView;
use crate::write_queue::WriteQueue;

/// What a membership change needs of the replica that makes it (the
/// replica's request path implements it; nothing here imports the
/// replica).
pub(crate) trait MembershipHost: Send + Sync + 'static {
    /// Its Raft core and who it is.
    fn view(&self) -> &RaftView;
    /// Whether it leads and has not failed.
    fn is_leader(&self) -> bool;
    /// A Raft client to the peer at `addr`, with the cluster's credentials.
    fn peer_client(&self, addr: &str) -> Result<PeerClient, latchkey_proto::ChannelError>;
    /// The leader's write path (paused while a leader removes itself).
    fn writes(&self) -> &WriteQueue;
    /// Taken by each change of the membership (one at a time).
    fn membership_changes(&self) -> &tokio::sync::Mutex<()>;
    /// Whether its data directory was seeded from a backup.
    fn was_restored(&self) -> bool;
}

/// Longest wait for a new learner to catch up before it is promoted.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for the replica at the new member's address to answer.
const IDENTIFY_TIMEOUT: Duration = Duration::from_secs(3);

/// A membership change's openraft error as the failure a client sees.
pub(crate) fn failure(
    replica: &impl MembershipHost,
    e: RaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> ReplicaFailure {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ReplicaFailure::NotLeader {
            leader: match (f.leader_id, f.leader_node) {
                (Some(id), Some(n)) => Some((id, n.client_addr)),
                _ => replica.view().leader(),
            },
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(e),
        )) => ReplicaFailure::Unavailable(format!("another membership change is in progress: {e}")),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ReplicaFailure::InvalidArgument(e.to_string())
        }
        // Appended, then dropped at a leader change: it may have committed.
        RaftError::APIError(ClientWriteError::LogEntryDiscarded(f)) => ReplicaFailure::UnknownOutcome(
            format!("the membership change was discarded at a leader change ({f}); check `latchkey members`"),
        ),
        RaftError::APIError(ClientWriteError::PreconditionFailed(e)) => {
            ReplicaFailure::InvalidArgument(e.to_string())
        }
        RaftError::Fatal(e) => ReplicaFailure::Unavailable(format!("replica stopped: {e}")),
    }
}

/// The incarnation and client address of the replica whose peer listener
/// is at `addr`, which must be node `id` and must not hold a restored
/// backup that formed no cluster yet (it would mix the restored rows with
/// this cluster's log).
async fn identify(
    replica: &impl MembershipHost,
    id: u64,
    addr: &str,
) -> Result<(u64, String), ReplicaFailure> {
    let mut client = replica
        .peer_client(addr)
        .map_err(|e| ReplicaFailure::InvalidArgument(e.to_string()))?;
    let request = IdentifyRequest {
        from_id: replica.view().id(),
        from_incarnation: replica.view().incarnation(),
    };
    let reply = tokio::time::timeout(IDENTIFY_TIMEOUT, client.identify(request))
        .await
        .map_err(|_| {
            ReplicaFailure::Unavailable(format!(
                "no answer from {addr} within {IDENTIFY_TIMEOUT:?}: start node {id} there first"
            ))
        })?
        .map_err(|s| {
            ReplicaFailure::Unavailable(format!(
                "cannot ask {addr} who it is (start node {id} there first): {}",
                s.message()
            ))
        })?
        .into_inner();
    if reply.node_id != id {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "the replica at {addr} is node {}, not node {id}",
            reply.node_id
        )));
    }
    if reply.incarnation == 0 {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "the replica at {addr} reports no incarnation"
        )));
    }
    if reply.client_addr.is_empty() {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "the replica at {addr} reports no client address"
        )));
    }
    if reply.restore_seed != 0 {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "the replica at {addr} holds a restored backup (`latchkey snapshot restore`): it can \
             only form a new cluster with the members it was restored for; to add node {id} \
             here, start it with an empty data directory"
        )));
    }
    Ok((reply.incarnation, reply.client_addr))
}

/// Longest wait for a member's answer when counting the live ones.
const LIVE_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether the replica at `member`'s peer address answers as `id` with the
/// incarnation the membership records.
async fn is_live(replica: &impl MembershipHost, id: u64, member: &Member) -> bool {
    let Ok(mut client) = replica.peer_client(&member.peer_addr) else {
        return false;
    };
    let request = IdentifyRequest {
        from_id: replica.view().id(),
        from_incarnation: replica.view().incarnation(),
    };
    match tokio::time::timeout(LIVE_TIMEOUT, client.identify(request)).await {
        Ok(Ok(reply)) => {
            let reply = reply.into_inner();
            reply.node_id == id && reply.incarnation == member.incarnation
        }
        _ => false,
    }
}

/// Refuse (unless `force`) a change of the voters to `new_voters` that
/// would leave the cluster without a live majority: joint consensus needs a
/// majority of the current voters and of `new_voters` to commit the change,
/// and the new voters must then have a majority alive to serve. A voter is
/// live when it is this leader or answers `Raft.Identify` (within 1 s) as
/// the incarnation the membership records.
pub(crate) async fn check_live_majority(
    replica: &impl MembershipHost,
    new_voters: &BTreeSet<u64>,
    force: bool,
) -> Result<(), ReplicaFailure> {
    let membership = replica
        .view()
        .raft()
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .clone();
    let current: BTreeSet<u64> = membership.voter_ids().collect();
    if let Some(unknown) = new_voters
        .iter()
        .find(|id| membership.get_node(id).is_none())
    {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "node {unknown} is not a member: add it first (`latchkey members add {unknown} \
             PEER_ADDR`)"
        )));
    }
    let mut live = BTreeSet::new();
    for id in current.union(new_voters) {
        let up = *id == replica.view().id()
            || match membership.get_node(id) {
                Some(member) => is_live(replica, *id, member).await,
                None => false,
            };
        if up {
            live.insert(*id);
        }
    }
    for (which, voters) in [("current", &current), ("new", new_voters)] {
        let up = voters.intersection(&live).count();
        let need = voters.len() / 2 + 1;
        if up < need {
            let down: Vec<u64> = voters.difference(&live).copied().collect();
            let message = format!(
                "the {which} voters {voters:?} would have {up} live, fewer than the {need} a \
                 majority needs (not answering: {down:?}): the change could not commit, or \
                 would leave the cluster unable to serve. Bring those nodes back first, or \
                 force it (--force)"
            );
            if force {
                tracing::warn!("forced membership change: {message}");
            } else {
                return Err(ReplicaFailure::InvalidArgument(message));
            }
        }
    }
    Ok(())
}

/// Make `voters` the voting members (learners outside it stay learners),
/// on the leader, after [`check_live_majority`] unless `force`. One change
/// of the membership runs at a time on a replica (`MembershipHost::membership_changes`).
///
/// A leader that removes itself first pauses its write queue
/// (`WriteQueue::pause_and_drain`): the writes it already proposed are
/// answered, later ones are refused as retryable, and the next leader
/// takes them, so replacing the leader's machine costs clients retries,
/// not unknown outcomes. Leadership moves without an election: once the
/// removal is committed, openraft's step-down of a removed leader
/// (`Config::removed_leader_step_down`, left at its 150 ms) transfers it
/// to the remaining voter whose log matches the leader's furthest, then
/// turns this replica into a learner. Writes stay paused until this
/// replica no longer leads (at most [`STEP_DOWN_WAIT`]).
///
/// The change runs in a task of its own, to the end, even if the caller
/// goes away: a change dropped halfway could leave the cluster in its
/// joint configuration, or let writes in before the leader stepped down.
pub(crate) async fn change_voters(
    replica: std::sync::Arc<impl MembershipHost>,
    voters: BTreeSet<u64>,
    force: bool,
) -> Result<(), ReplicaFailure> {
    tokio::spawn(async move {
        let _one_at_a_time = replica.membership_changes().lock().await;
        change_voters_now(&*replica, voters, force).await
    })
    .await
    .unwrap_or_else(|e| {
        Err(ReplicaFailure::UnknownOutcome(format!(
            "the membership change task failed: {e}"
        )))
    })
}

async fn change_voters_now(
    replica: &impl MembershipHost,
    voters: BTreeSet<u64>,
    force: bool,
) -> Result<(), ReplicaFailure> {
    if voters.is_empty() {
        return Err(ReplicaFailure::InvalidArgument(
            "the voter set must not be empty".into(),
        ));
    }
    if !replica.is_leader() {
        return Err(ReplicaFailure::NotLeader {
            leader: replica.view().leader(),
        });
    }
    check_live_majority(replica, &voters, force).await?;
    let paused = if voters.contains(&replica.view().id()) {
        None
    } else {
        tracing::info!("this leader is removing itself: pausing writes until it has stepped down");
        Some(replica.writes().pause_and_drain().await)
    };
    let result = replica
        .view()
        .raft()
        .change_membership(voters, false)
        .await
        .map(|_| ())
        .map_err(|e| failure(replica, e));
    if result.is_ok() && paused.is_some() {
        // openraft hands leadership over about 150 ms after the removal
        // is committed; a write proposed meanwhile would likely be in
        // flight at the step-down and end as an unknown outcome. So
        // writes stay paused until then.
        let mut metrics = replica.view().raft().metrics();
        let stepped_down = metrics.wait_until(|m| m.state != openraft::ServerState::Leader);
        if tokio::time::timeout(STEP_DOWN_WAIT, stepped_down)
            .await
            .is_err()
        {
            tracing::warn!(
                "removed from the voters but still leading after {STEP_DOWN_WAIT:?}; writes resume"
            );
        }
    }
    drop(paused);
    result
}

/// How long a leader that removed itself waits to step down before it lets
/// writes in again.
const STEP_DOWN_WAIT: Duration = Duration::from_secs(5);

/// Add (or replace) node `id` at `addr`; see the module docs.
pub(crate) async fn add_member(
    replica: &impl MembershipHost,
    id: u64,
    addr: &str,
    voter: bool,
    force: bool,
) -> Result<(), ReplicaFailure> {
    let _one_at_a_time = replica.membership_changes().lock().await;
    if id == 0 {
        return Err(ReplicaFailure::InvalidArgument(
            "node id 0 is reserved".into(),
        ));
    }
    if !replica.is_leader() {
        return Err(ReplicaFailure::NotLeader {
            leader: replica.view().leader(),
        });
    }
    if id == replica.view().id() {
        return Err(ReplicaFailure::InvalidArgument(format!(
            "node {id} is the leader answering this call; it cannot be added again"
        )));
    }
    let (incarnation, client_addr) = identify(replica, id, addr).await?;
    let raft = replica.view().raft();
    let membership = raft
        .metrics()
        .borrow_watched()
        .membership_config
        .membership()
        .clone();
    let known = membership.get_node(&id).cloned();
    let is_voter = membership.voter_ids().any(|v| v == id);
    if let Some(old) = known.as_ref().filter(|m| m.incarnation != incarnation) {
        tracing::warn!(
            node = id,
            old = %old,
            new = incarnation,
            "replacing a member whose data directory was wiped or replaced: removing the old one first"
        );
        let change = if is_voter {
            let remaining: BTreeSet<u64> = membership.voter_ids().filter(|v| *v != id).collect();
            check_live_majority(replica, &remaining, force).await?;
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        };
        raft.change_membership(change, false)
            .await
            .map_err(|e| failure(replica, e))?;
    }
    purge_restored_log(replica).await?;
    let member = Member::new(addr, client_addr, incarnation);
    let already = known.as_ref() == Some(&member);
    let added = raft
        .add_learner(id, member, false)
        .await
        .map_err(|e| failure(replica, e))?;
    if !already {
        tracing::info!(node = id, %addr, incarnation, "added as a learner; waiting for it to catch up");
    }
    wait_caught_up(replica, id, added.log_id.index).await?;
    if voter && !(already && is_voter) {
        raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| failure(replica, e))?;
        tracing::info!(node = id, "promoted to voter");
    }
    Ok(())
}

/// Longest wait for the snapshot and purge of a restored replica's log.
const PURGE_TIMEOUT: Duration = Duration::from_secs(120);

/// A replica restored from a backup holds rows its log does not: the log
/// starts at the new cluster's membership entry. Before a new member is
/// added, its log is replaced by a snapshot (built now and the log purged
/// up to it), so that the new member gets the restored rows in a snapshot
/// rather than an empty state plus the log. Each restored replica does
/// this the first time it adds a member as leader; afterwards its purged
/// log says it is done.
async fn purge_restored_log(replica: &impl MembershipHost) -> Result<(), ReplicaFailure> {
    let raft = replica.view().raft();
    if !replica.was_restored() || raft.metrics().borrow_watched().purged.is_some() {
        return Ok(());
    }
    let stopped = |e: &dyn std::fmt::Display| {
        ReplicaFailure::Unavailable(format!(
            "cannot snapshot the restored state before adding a member: {e}"
        ))
    };
    tracing::info!(
        "this replica was restored from a backup its log does not hold: snapshotting it and \
         purging the log before adding a member"
    );
    let applied = raft
        .metrics()
        .borrow_watched()
        .last_applied
        .map_or(0, |l| l.index);
    raft.trigger().snapshot().await.map_err(|e| stopped(&e))?;
    let m = raft
        .wait(Some(PURGE_TIMEOUT))
        .metrics(
            |m| m.snapshot.is_some_and(|s| s.index >= applied),
            "a snapshot of the restored state",
        )
        .await
        .map_err(|e| stopped(&e))?;
    let upto = m.snapshot.map_or(applied, |s| s.index);
    raft.trigger()
        .purge_log(upto)
        .await
        .map_err(|e| stopped(&e))?;
    raft.wait(Some(PURGE_TIMEOUT))
        .metrics(|m| m.purged.is_some(), "the restored log purged")
        .await
        .map_err(|e| stopped(&e))?;
    Ok(())
}

/// Wait until the leader's replication to `id` has matched `index`.
async fn wait_caught_up(
    replica: &impl MembershipHost,
    id: u64,
    index: u64,
) -> Result<(), ReplicaFailure> {
    let started = Instant::now();
    let mut metrics = replica.view().raft().metrics();
    loop {
        let matched = {
            let m = metrics.borrow_and_update();
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| l.index)
        };
        if matched.is_some_and(|m| m >= index) {
            return Ok(());
        }
        let left = CATCH_UP_TIMEOUT.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(ReplicaFailure::Unavailable(format!(
                "node {id} did not catch up within {CATCH_UP_TIMEOUT:?} (it has index {} of {index}); \
                 it stays a learner: run the same `members add` again to carry on",
                matched.unwrap_or(0)
            )));
        }
        if !replica.is_leader() {
            return Err(ReplicaFailure::NotLeader {
                leader: replica.view().leader(),
            });
        }
        match tokio::time::timeout(left, metrics.changed()).await {
            Ok(Ok(())) | Err(_) => {}
            Ok(Err(_)) => {
                return Err(ReplicaFailure::Unavailable(
                    "this replica stopped while the new member caught up".into(),
                ))
            }
        }
    }
}
