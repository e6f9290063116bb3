//! Moving leadership to another voter: before a leader stops
//! ([`hand_over`]), so a graceful stop (a deploy, a rolling restart) costs
//! clients a redirect, not an election timeout without a leader; and on an
//! operator's request ([`transfer_leader`], `latchkey members
//! transfer-leader`).
//!
//! The leader pauses its write queue and waits until every write it already
//! proposed is answered (the same pause a leader removing itself uses), so
//! nothing is in flight when leadership moves: clients see retryable
//! refusals, never unknown outcomes. Then it picks the target: a voter
//! that answered the leader within five heartbeat intervals (at least
//! 500 ms) and whose
//! log holds the leader's last entry (the named one, or the one that
//! answered last), waiting up to [`CATCH_UP_WAIT`] for one. A transfer
//! cannot be called off in openraft once started (the leader stops
//! proposing and heartbeating), so a target that is down or far behind is
//! refused before anything starts, and the leader carries on. Then it asks
//! openraft to transfer leadership; openraft tells every member, the target
//! stands for election at once (voters grant such a vote even while the
//! leader's lease holds), and the leader steps down when it sees the higher
//! term. The wait is bounded ([`HAND_OVER_WAIT`]); a transfer that does not
//! finish leaves the leader without proposals or heartbeats, and the others
//! elect a leader after an election timeout, as after a crash.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_proto::ReplicaFailure;
use openraft::async_runtime::WatchReceiver;
use openraft::Instant as _;
use openraft::ServerState;

use crate::membership::MembershipHost;

/// How long a leader waits for another voter to take over.
pub(crate) const HAND_OVER_WAIT: Duration = Duration::from_secs(2);

/// How long a leader waits for a target that answers and holds its last
/// entry, before it gives up without starting a transfer.
pub(crate) const CATCH_UP_WAIT: Duration = Duration::from_secs(1);

/// How long a transfer on request waits for a membership change in
/// progress (which may wait minutes for a learner) before it is refused.
const MEMBERSHIP_CHANGE_WAIT: Duration = Duration::from_secs(5);

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
/// is dropped (the caller stops the replica), also when no voter takes
/// over: whatever was proposed has been answered by then.
pub(crate) async fn hand_over<H: MembershipHost>(
    replica: &H,
) -> (HandOver, Option<crate::write_queue::Paused>) {
    if !replica.is_leader() {
        return (HandOver::NotLeader, None);
    }
    let paused = replica.writes().pause_and_drain().await;
    let outcome = match ready_target(replica, None).await {
        Err(why) => {
            tracing::info!(
                node = replica.view().id(),
                "not handing leadership over: {why}"
            );
            HandOver::NotDone(why.to_string())
        }
        Ok(target) => match move_to(replica, target).await {
            Ok(to) => HandOver::To(to),
            Err(why) => HandOver::NotDone(why),
        },
    };
    (outcome, Some(paused))
}

/// Move leadership from this replica, which must lead, to voter `to`
/// (`None`: a voter that answers and holds the leader's last entry) and
/// return the id of the voter that leads afterwards. Without `to`,
/// `away_from` names the leader the caller wants to move away from: when
/// this replica is another, leadership has moved already (a repeat after a
/// lost reply) and nothing changes.
///
/// Refused as `NotLeader` on a replica that does not lead; as an invalid
/// argument for a target that is not a voter, or that has not answered the
/// leader lately (nothing starts, the leader carries on); as `Unavailable`
/// when the target is still catching up after [`CATCH_UP_WAIT`] (nothing
/// starts), when a membership change holds the cluster for longer than
/// [`MEMBERSHIP_CHANGE_WAIT`], when no voter took over within
/// [`HAND_OVER_WAIT`] (the voters then elect a leader after an election
/// timeout) or when another voter than the named one took over. Asking the
/// leader to transfer to itself changes nothing and answers its own id, so
/// a call naming its target may be repeated. Writes are paused (refused as
/// retryable) while leadership moves. Runs in a task of its own, to the
/// end, even if the caller goes away, one at a time with membership
/// changes.
pub(crate) async fn transfer_leader(
    replica: Arc<impl MembershipHost>,
    to: Option<u64>,
    away_from: Option<u64>,
) -> Result<u64, ReplicaFailure> {
    tokio::spawn(async move {
        let lock = replica.membership_changes().lock();
        let Ok(_one_at_a_time) = tokio::time::timeout(MEMBERSHIP_CHANGE_WAIT, lock).await else {
            return Err(ReplicaFailure::Unavailable(
                "a membership change is in progress; move the leader once it has finished".into(),
            ));
        };
        let me = replica.view().id();
        if !replica.is_leader() {
            return Err(ReplicaFailure::NotLeader {
                leader: replica.view().leader(),
            });
        }
        if to == Some(me) || (to.is_none() && away_from.is_some_and(|from| from != me)) {
            return Ok(me);
        }
        if let Some(id) = to {
            if !other_voters(&*replica).contains(&id) {
                return Err(NotReady::NotAVoter(id).into());
            }
        }
        let _paused = replica.writes().pause_and_drain().await;
        let target = ready_target(&*replica, to).await?;
        let leader = move_to(&*replica, target)
            .await
            .map_err(ReplicaFailure::Unavailable)?;
        match to {
            Some(id) if id != leader => Err(ReplicaFailure::Unavailable(format!(
                "node {leader} took over, not node {id}: an election overtook the transfer; \
                 ask again"
            ))),
            _ => Ok(leader),
        }
    })
    .await
    .unwrap_or_else(|e| {
        Err(ReplicaFailure::Unavailable(format!(
            "the leader transfer task failed: {e}"
        )))
    })
}

/// Why no voter can be the target of a transfer (nothing was started).
#[derive(Debug, thiserror::Error)]
enum NotReady {
    #[error("node {0} is not a voter of this cluster: only a voter can lead")]
    NotAVoter(u64),
    #[error("there is no other voter to hand leadership to")]
    NoOtherVoter,
    #[error(
        "{0} answered the leader within the last {1:?}: a voter that is down cannot take over"
    )]
    NotAnswering(String, Duration),
    #[error("{0} did not hold the leader's last entry within {CATCH_UP_WAIT:?}; try again")]
    Behind(String),
}

impl From<NotReady> for ReplicaFailure {
    fn from(why: NotReady) -> ReplicaFailure {
        match why {
            NotReady::Behind(_) => ReplicaFailure::Unavailable(why.to_string()),
            _ => ReplicaFailure::InvalidArgument(why.to_string()),
        }
    }
}

/// The voters other than this replica.
fn other_voters<H: MembershipHost>(replica: &H) -> BTreeSet<u64> {
    let me = replica.view().id();
    let metrics = replica.view().raft().metrics().borrow_watched().clone();
    metrics
        .membership_config
        .membership()
        .voter_ids()
        .filter(|id| *id != me)
        .collect()
}

/// The target of a transfer, once there is one: `requested` (another
/// voter), or any other voter, that answered this leader within five
/// heartbeat intervals (at least 500 ms) and whose matched log index is the leader's
/// last; of several, the one that answered last. Waits up to
/// [`CATCH_UP_WAIT`] (writes are paused, so the log does not grow).
async fn ready_target<H: MembershipHost>(
    replica: &H,
    requested: Option<u64>,
) -> Result<u64, NotReady> {
    let raft = replica.view().raft();
    let recent = Duration::from_millis(raft.config().heartbeat_interval.saturating_mul(5))
        .max(Duration::from_millis(500));
    let started = Instant::now();
    let mut watch = raft.metrics();
    loop {
        let voters = other_voters(replica);
        let candidates: BTreeSet<u64> = match requested {
            Some(id) if voters.contains(&id) => BTreeSet::from([id]),
            Some(id) => return Err(NotReady::NotAVoter(id)),
            None if voters.is_empty() => return Err(NotReady::NoOtherVoter),
            None => voters,
        };
        let metrics = watch.borrow_watched().clone();
        let last = metrics.last_log_index;
        let acked = metrics.heartbeat.unwrap_or_default();
        let matched = metrics.replication.unwrap_or_default();
        // (time since it answered, id) of each candidate that answered lately.
        let answering: Vec<(Duration, u64)> = candidates
            .iter()
            .filter_map(|id| {
                let since = acked.get(id)?.as_ref()?.elapsed();
                (since <= recent).then_some((since, *id))
            })
            .collect();
        let ready = answering
            .iter()
            .filter(|(_, id)| matched.get(id).is_some_and(|m| m.map(|m| m.index) == last))
            .min();
        if let Some((_, id)) = ready {
            return Ok(*id);
        }
        if started.elapsed() >= CATCH_UP_WAIT {
            let who = match requested {
                Some(id) => format!("node {id}"),
                None => "no other voter".to_string(),
            };
            return Err(if answering.is_empty() {
                let who = match requested {
                    Some(id) => format!("node {id} has not"),
                    None => "no other voter has".to_string(),
                };
                NotReady::NotAnswering(who, recent)
            } else {
                NotReady::Behind(who)
            });
        }
        let changed = watch.changed();
        let _ = tokio::time::timeout(Duration::from_millis(20), changed).await;
    }
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
