//! Moving leadership to another voter: before a leader stops
//! ([`hand_over`]), so a graceful stop (a deploy, a rolling restart) costs
//! clients a redirect, not an election timeout without a leader; and on an
//! operator's request ([`transfer_leader`], `latchkey members
//! transfer-leader`).
//!
//! The leader pauses its write queue and waits until every write it already
//! proposed is answered (the same pause a leader removing itself uses), so
//! nothing is in flight when leadership moves: clients see retryable
//! refusals, never unknown outcomes. Then it asks openraft to transfer
//! leadership to the target (by default the voter whose log matches its
//! own furthest); openraft tells every member, the target stands for
//! election as soon as its log holds the leader's last entry (voters grant
//! such a vote even while the leader's lease holds), and the leader steps
//! down when it sees the higher term. The wait is bounded
//! ([`HAND_OVER_WAIT`]); a transfer that does not finish leaves the leader
//! without proposals or heartbeats, and the others elect a leader after an
//! election timeout, as after a crash.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_proto::ReplicaFailure;
use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use crate::membership::MembershipHost;

/// How long a leader waits for another voter to take over.
pub(crate) const HAND_OVER_WAIT: Duration = Duration::from_secs(2);

/// What a graceful stop did with leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOver {
    /// This replica was not the leader: nothing to hand over.
    NotLeader,
    /// This replica led; it stepped down and the voter with this node id
    /// leads.
    To(u64),
    /// This replica led, but no other voter took over (why): the others
    /// elect a leader after an election timeout.
    NotDone(String),
}

/// Hand leadership to another voter if this replica leads, before it
/// stops; see the module docs. Writes stay paused until the returned guard
/// is dropped (the caller stops the replica).
pub(crate) async fn hand_over<H: MembershipHost>(
    replica: &H,
) -> (HandOver, Option<crate::write_queue::Paused>) {
    if !replica.is_leader() {
        return (HandOver::NotLeader, None);
    }
    let target = match pick_target(replica, None) {
        Ok(target) => target,
        Err(why) => {
            tracing::info!(
                node = replica.view().id(),
                "not handing leadership over: {why}"
            );
            return (HandOver::NotDone(why.to_string()), None);
        }
    };
    let paused = replica.writes().pause_and_drain().await;
    let outcome = match move_to(replica, target).await {
        Ok(to) => HandOver::To(to),
        Err(why) => HandOver::NotDone(why),
    };
    (outcome, Some(paused))
}

/// Move leadership from this replica, which must lead, to voter `to`
/// (`None`: the voter whose log matches the leader's furthest) and return
/// the id of the voter that leads afterwards: normally the target; another
/// voter if an election overtook the transfer.
///
/// Refused as `NotLeader` on a replica that does not lead, and as an
/// invalid argument for a target that is not a voter. Asking the leader to
/// transfer to itself changes nothing and answers its own id, as does a
/// leader other than `from` (the leader the caller saw: leadership has
/// moved already, so a retried call does not move it twice). A transfer
/// that does not finish within [`HAND_OVER_WAIT`] is `Unavailable`; the
/// old leader no longer proposes, so the voters elect a leader after an
/// election timeout. Writes are paused (refused as retryable) while
/// leadership moves. Runs in a task of its own, to the end, even if the
/// caller goes away, one at a time with membership changes.
pub(crate) async fn transfer_leader(
    replica: Arc<impl MembershipHost>,
    to: Option<u64>,
    from: Option<u64>,
) -> Result<u64, ReplicaFailure> {
    tokio::spawn(async move {
        let _one_at_a_time = replica.membership_changes().lock().await;
        let me = replica.view().id();
        if !replica.is_leader() {
            return Err(ReplicaFailure::NotLeader {
                leader: replica.view().leader(),
            });
        }
        if to == Some(me) || from.is_some_and(|from| from != me) {
            return Ok(me);
        }
        let target = pick_target(&*replica, to)
            .map_err(|why| ReplicaFailure::InvalidArgument(why.to_string()))?;
        let _paused = replica.writes().pause_and_drain().await;
        move_to(&*replica, target)
            .await
            .map_err(ReplicaFailure::Unavailable)
    })
    .await
    .unwrap_or_else(|e| {
        Err(ReplicaFailure::Unavailable(format!(
            "the leader transfer task failed: {e}"
        )))
    })
}

/// Why no voter can be the target of a transfer.
#[derive(Debug, thiserror::Error)]
enum NoTarget {
    #[error("node {0} is not a voter of this cluster: only a voter can lead")]
    NotAVoter(u64),
    #[error("there is no other voter to hand leadership to")]
    NoOtherVoter,
}

/// The target of a transfer: `requested` if it is another voter; without
/// one, the voter other than this one whose matched log id is the highest,
/// else (a leader elected so recently that no follower has answered yet)
/// the other voter with the lowest id: openraft's target waits until its
/// log holds the leader's last entry before it stands for election.
fn pick_target<H: MembershipHost>(replica: &H, requested: Option<u64>) -> Result<u64, NoTarget> {
    let me = replica.view().id();
    let metrics = replica.view().raft().metrics().borrow_watched().clone();
    let voters: BTreeSet<u64> = metrics
        .membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != me)
        .collect();
    if let Some(id) = requested {
        return if voters.contains(&id) {
            Ok(id)
        } else {
            Err(NoTarget::NotAVoter(id))
        };
    }
    let best_matched = metrics.replication.as_ref().and_then(|replication| {
        replication
            .iter()
            .filter_map(|(id, matched)| Some((*id, matched.as_ref()?.index)))
            .filter(|(id, _)| voters.contains(id))
            .max_by_key(|(_, index)| *index)
            .map(|(id, _)| id)
    });
    best_matched
        .or_else(|| voters.first().copied())
        .ok_or(NoTarget::NoOtherVoter)
}

/// Ask openraft to transfer leadership to `target` and wait (bounded) until
/// this replica has stepped down and hears from a new leader, whose id is
/// returned; the error says why it did not happen.
async fn move_to<H: MembershipHost>(replica: &H, target: u64) -> Result<u64, String> {
    let started = Instant::now();
    let raft = replica.view().raft();
    let me = replica.view().id();
    if let Err(e) = raft.trigger().transfer_leader(target).await {
        return Err(format!("the Raft core has stopped: {e}"));
    }
    // openraft names the target as the leader as soon as the transfer
    // starts; only a leader that stepped down and hears from another leader
    // has handed over.
    let mut metrics = raft.metrics();
    let moved = metrics.wait_until(|m| {
        m.state != ServerState::Leader && m.current_leader.is_some_and(|l| l != me)
    });
    match tokio::time::timeout(HAND_OVER_WAIT, moved).await {
        Ok(Ok(m)) => {
            let to = m.current_leader.unwrap_or(target);
            tracing::info!(
                node = me,
                to,
                ms = started.elapsed().as_millis() as u64,
                "handed leadership over"
            );
            Ok(to)
        }
        Ok(Err(_)) => Err("the Raft core stopped during the hand-over".into()),
        Err(_) => {
            let why = format!(
                "node {target} did not take over within {HAND_OVER_WAIT:?}; \
                 the voters elect a leader after an election timeout"
            );
            tracing::warn!(node = me, "{why}");
            Err(why)
        }
    }
}
