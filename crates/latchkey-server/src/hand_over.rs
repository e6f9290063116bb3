//! Handing leadership over before a leader stops ([`hand_over`]), so a
//! graceful stop (a deploy, a rolling restart) costs clients a redirect,
//! not an election timeout without a leader.
//!
//! The leader pauses its write queue and waits until every write it already
//! proposed is answered (the same pause a leader removing itself uses), so
//! nothing is in flight when leadership moves: clients see retryable
//! refusals, never unknown outcomes. Then it asks openraft to transfer
//! leadership to the voter whose log matches its own furthest; openraft
//! tells every member, the target stands for election as soon as its log
//! holds the leader's last entry (voters grant such a vote even while the
//! leader's lease holds), and the leader steps down when it sees the higher
//! term. The wait is bounded ([`HAND_OVER_WAIT`]); a transfer that does not
//! finish leaves the leader without proposals or heartbeats, and the
//! others elect a leader after an election timeout, as after a crash.

use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use openraft::ServerState;

use crate::membership::MembershipHost;

/// How long a stopping leader waits for another voter to take over.
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

/// Hand leadership to another voter if this replica leads; see the module
/// docs. Writes stay paused until the returned guard is dropped (the
/// caller stops the replica).
pub(crate) async fn hand_over<H: MembershipHost>(
    replica: &H,
) -> (HandOver, Option<crate::write_queue::Paused>) {
    if !replica.is_leader() {
        return (HandOver::NotLeader, None);
    }
    let started = Instant::now();
    let paused = replica.writes().pause_and_drain().await;
    let raft = replica.view().raft();
    let me = replica.view().id();
    let Some(target) = pick_target(replica) else {
        let why = "no other voter has matched this leader's log".to_string();
        tracing::info!(node = me, "not handing leadership over: {why}");
        return (HandOver::NotDone(why), Some(paused));
    };
    if let Err(e) = raft.trigger().transfer_leader(target).await {
        return (
            HandOver::NotDone(format!("the Raft core has stopped: {e}")),
            Some(paused),
        );
    }
    // openraft names the target as the leader as soon as the transfer
    // starts; only a leader that stepped down and hears from another leader
    // has handed over.
    let mut metrics = raft.metrics();
    let moved = metrics.wait_until(|m| {
        m.state != ServerState::Leader && m.current_leader.is_some_and(|l| l != me)
    });
    let outcome = match tokio::time::timeout(HAND_OVER_WAIT, moved).await {
        Ok(Ok(m)) => {
            let to = m.current_leader.unwrap_or(target);
            tracing::info!(
                node = me,
                to,
                ms = started.elapsed().as_millis() as u64,
                "handed leadership over"
            );
            HandOver::To(to)
        }
        Ok(Err(_)) => HandOver::NotDone("the Raft core stopped during the hand-over".into()),
        Err(_) => {
            let why = format!("node {target} did not take over within {HAND_OVER_WAIT:?}");
            tracing::warn!(node = me, "{why}");
            HandOver::NotDone(why)
        }
    };
    (outcome, Some(paused))
}

/// The voter other than this one whose matched log id is the highest.
fn pick_target<H: MembershipHost>(replica: &H) -> Option<u64> {
    let me = replica.view().id();
    let metrics = replica.view().raft().metrics().borrow_watched().clone();
    let voters: std::collections::BTreeSet<u64> =
        metrics.membership_config.membership().voter_ids().collect();
    metrics
        .replication
        .as_ref()?
        .iter()
        .filter(|(id, matched)| **id != me && voters.contains(id) && matched.is_some())
        .max_by_key(|(_, matched)| matched.map(|m| m.index))
        .map(|(id, _)| *id)
}
