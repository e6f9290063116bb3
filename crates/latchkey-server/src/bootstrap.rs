//! Forming a new cluster from its initial members, without ever
//! re-initialising a member whose data directory was wiped.
//!
//! A replica that starts with an empty data directory and a list of initial
//! members cannot tell by itself whether it is forming a new cluster or is
//! a member that lost its disk (static bootstrap sees an empty log either
//! way). Initialising in the second case would make it vote as a fresh
//! member and help lose committed writes. So it asks the other initial
//! members (`Raft.Identify`) first:
//!
//! - if any of them already holds Raft state, the cluster exists: this
//!   replica never initialises. If that peer's membership already lists this
//!   replica's incarnation (a member of a cluster just formed), it simply
//!   waits for the leader's entries; otherwise it waits as a new data
//!   directory, [`Condition::Waiting`](crate::health::Condition::Waiting),
//!   until an operator adds it (`latchkey members add`);
//! - if every other initial member answers and none holds state, it
//!   initialises with the membership of every member's id, peer address (from
//!   the initial members), client address (from its answer) and
//!   incarnation. Every member computes the same set, so the initialisations
//!   agree (openraft's static bootstrap is safe when they do). The member
//!   with the lowest id initialises at once; the others wait `stagger` (the
//!   longest election timeout) first and usually find they were initialised
//!   by its first entries meanwhile. Each initialisation starts an election
//!   at once, so initialising everywhere together would make the first
//!   elections collide. After the wait they ask everyone again and
//!   initialise only if every answer is the same as before (a member wiped
//!   meanwhile would otherwise be recorded with a stale incarnation).
//!
//! Members restored from a backup (`latchkey snapshot restore`) hold state
//! before any log entry; each reports its restore seed (a digest of the
//! backup, the bump and the member list) and a member initialises only if
//! every initial member reports its own seed, so a cluster never forms from
//! members whose states differ (one restored from another backup, or not
//! restored at all).
//!
//! A new cluster therefore forms once **every** initial member is up (etcd
//! forms with a majority, because its member ids are derived from the
//! configuration; ours must be learned from each member). With
//! [`ClusterState::Existing`] a replica never asks and never initialises.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_proto::v1::{IdentifyReply, IdentifyRequest};
use latchkey_storage::Member;
use openraft::error::{InitializeError, RaftError};

use crate::replica::Replica;

/// Between rounds of asking the other initial members.
const ROUND_EVERY: Duration = Duration::from_millis(300);
/// Longest wait for one member's answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(1);
/// How often "still waiting for members" is logged.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether a replica with an empty data directory may form a new cluster
/// (etcd's `--initial-cluster-state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClusterState {
    /// Form the cluster with the other initial members if none of them
    /// belongs to one yet (the default).
    #[default]
    New,
    /// The cluster exists: never initialise; wait to be added.
    Existing,
}

/// What one other initial member said.
enum Answer {
    /// Not part of a cluster yet, with this incarnation, client address
    /// and restore seed.
    Fresh(u64, String, u64),
    /// Already a member of a cluster; whether it knows this replica.
    Member { knows_me: bool },
    /// No answer, or an answer that does not fit.
    Nothing,
}

async fn ask(replica: &Replica, id: u64, addr: &str, warn: bool) -> Answer {
    let Ok(mut client) = replica.peer_client(addr) else {
        return Answer::Nothing;
    };
    let request = IdentifyRequest {
        from_id: replica.id(),
        from_incarnation: replica.incarnation(),
    };
    let reply = tokio::time::timeout(ASK_TIMEOUT, client.identify(request)).await;
    let Ok(Ok(reply)) = reply else {
        return Answer::Nothing;
    };
    let IdentifyReply {
        node_id,
        incarnation,
        initialized,
        knows_you,
        client_addr,
        restore_seed,
    } = reply.into_inner();
    if node_id != id {
        if warn {
            tracing::error!(
                expected = id,
                found = node_id,
                %addr,
                "an initial member's address answers as another node: check --initial-members"
            );
        }
        return Answer::Nothing;
    }
    if initialized {
        Answer::Member {
            knows_me: knows_you,
        }
    } else if client_addr.is_empty() {
        Answer::Nothing
    } else {
        Answer::Fresh(incarnation, client_addr, restore_seed)
    }
}

/// Form the cluster or find it; see the module docs. Returns when this
/// replica initialised, learned the cluster exists, or was stopped.
pub(crate) async fn run(
    replica: Arc<Replica>,
    members: BTreeMap<u64, String>,
    state: ClusterState,
    stagger: Duration,
) {
    let me = replica.id();
    let add_me = |why: &str| {
        format!(
            "{why}: this data directory is new (incarnation {inc}), so node {me} must not \
             rejoin as the member it was. It waits as a non-voter until it is added: run \
             `latchkey members add {me} ADDR` against the cluster (README: \"Replacing a \
             failed disk or node\")",
            inc = replica.incarnation()
        )
    };
    if state == ClusterState::Existing {
        if !replica.is_member() {
            replica
                .health()
                .wait_to_be_added(add_me("started with --initial-cluster-state existing"));
        }
        return;
    }
    let mut last_log: Option<Instant> = None;
    // The answers of the previous round, when everyone answered "fresh".
    let mut agreed: Option<BTreeMap<u64, Member>> = None;
    loop {
        if replica.is_member() || replica.health().failure().is_some() {
            return;
        }
        let warn = last_log.is_none_or(|t| t.elapsed() >= LOG_EVERY);
        let mut incarnations = BTreeMap::new();
        let mut missing = Vec::new();
        let mut other_seed = Vec::new();
        for (&id, addr) in &members {
            if id == me {
                incarnations.insert(
                    id,
                    Member::new(
                        addr.clone(),
                        replica.client_addr().to_string(),
                        replica.incarnation(),
                    ),
                );
                continue;
            }
            match ask(&replica, id, addr, warn).await {
                Answer::Fresh(inc, client_addr, seed) => {
                    if seed != replica.restore_seed() {
                        other_seed.push(id);
                    }
                    incarnations.insert(id, Member::new(addr.clone(), client_addr, inc));
                }
                Answer::Member { knows_me: true } => {
                    tracing::info!(
                        node = me,
                        peer = id,
                        "the cluster was formed with this replica: waiting for the leader"
                    );
                    return;
                }
                Answer::Member { knows_me: false } => {
                    replica.health().wait_to_be_added(add_me(&format!(
                        "node {id} already belongs to a cluster that does not know this replica"
                    )));
                    return;
                }
                Answer::Nothing => missing.push(id),
            }
        }
        if !other_seed.is_empty() {
            // Their states would differ: never form a cluster from them.
            if warn {
                tracing::error!(
                    node = me,
                    nodes = ?other_seed,
                    "forming a new cluster: these initial members were restored from another \
                     backup, with another bump or member list, or not restored at all (or this \
                     one was not): restore every initial member from the same file with the \
                     same `latchkey snapshot restore` options, or none of them"
                );
                last_log = Some(Instant::now());
            }
            agreed = None;
            tokio::time::sleep(ROUND_EVERY).await;
            continue;
        }
        if !missing.is_empty() {
            agreed = None;
        } else if members.keys().next() != Some(&me) && agreed.as_ref() != Some(&incarnations) {
            // Not the first to initialise: wait, then ask again.
            agreed = Some(incarnations);
            tokio::time::sleep(stagger).await;
            continue;
        } else {
            match replica.raft().initialize(incarnations).await {
                Ok(()) => tracing::info!(node = me, "initialised the cluster membership"),
                Err(RaftError::APIError(InitializeError::NotAllowed(e))) => {
                    tracing::info!(node = me, reason = %e, "already initialised by a peer")
                }
                Err(e) => {
                    replica
                        .health()
                        .fail(format!("initialising the cluster failed: {e}"));
                }
            }
            return;
        }
        if warn {
            tracing::info!(
                node = me,
                ?missing,
                "forming a new cluster: waiting for every initial member to answer"
            );
            last_log = Some(Instant::now());
        }
        tokio::time::sleep(ROUND_EVERY).await;
    }
}
