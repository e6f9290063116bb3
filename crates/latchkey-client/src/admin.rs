//! Cluster status and backups (the client listener's `Admin`) and
//! membership changes (the leader's peer listener, `Membership`).

use std::collections::BTreeSet;

use latchkey_proto::v1::{
    self, admin_client::AdminClient, membership_client::MembershipClient, AddMemberRequest,
    BackupRequest, ChangeVotersRequest, StatusRequest,
};
use latchkey_proto::{NodeStatus, ReplicaFailure, MAX_MESSAGE_BYTES};
use tonic::transport::Channel;

use crate::error::Error;
use crate::kv::Client;
use crate::options::ClientOptions;
use crate::router::Target;
use crate::transport::{as_user, channel, classify_status, refused, Attempt, Credentials};

/// Longest a `members add` waits: the leader gives a new member two
/// minutes to catch up before promoting it.
const ADD_MEMBER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// Longest a change of the voters waits: a leader removing itself first
/// lets the writes it took commit (up to the replica's write timeout) and
/// then waits to step down.
const CHANGE_VOTERS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Longest a backup may take, from asking to the last byte.
const BACKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// A backup of a cluster's state, as [`Client::backup`] received it.
#[derive(Clone, PartialEq, Eq)]
pub struct Backup {
    /// The last log index whose effects it holds.
    pub last_index: u64,
    /// Its checksum, as the leader announced it (the file's last 8 bytes,
    /// FNV-1a 64 of everything before them; `latchkey snapshot status`
    /// checks it).
    pub checksum: u64,
    /// The backup file's bytes.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for Backup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backup")
            .field("last_index", &self.last_index)
            .field("checksum", &format_args!("{:016x}", self.checksum))
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

fn admin_client(channel: Channel) -> AdminClient<Channel> {
    AdminClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// `message` as a membership-change request: the cluster secret when the
/// client has one (the peer listener's credential) and the client's user
/// (who makes the change; while access control is on, an admin).
fn membership_request<T>(
    message: T,
    options: &ClientOptions,
) -> Result<tonic::Request<T>, Attempt> {
    let user = Credentials::new(options).map_err(Attempt::not_usable)?;
    let mut request = as_user(&user, message);
    if let Some(secret) = &options.cluster_secret {
        let value = secret.parse().map_err(|_| {
            Attempt::Refused(ReplicaFailure::InvalidArgument(
                "the cluster secret is not a valid header value (visible ASCII only)".into(),
            ))
        })?;
        request
            .metadata_mut()
            .insert(latchkey_proto::CLUSTER_SECRET_HEADER, value);
    }
    Ok(request)
}

/// The leader a `transfer_leader` call without a target may already have
/// moved leadership away from. An attempt names the leader it reaches
/// (`away_from`); from the moment it is sent until a definite answer says
/// nothing started, leadership may have moved, so later attempts name that
/// same leader, and a leader other than it answers without moving. Pinned
/// only while the outcome is unknown: a stale status naming an old leader
/// that answers `NotLeader` must not turn the real leader's attempt into a
/// no-op.
#[derive(Default)]
struct MovedFrom(std::sync::Mutex<Option<u64>>);

impl MovedFrom {
    /// The leader an attempt that reaches `leader` names, and what was
    /// pinned before it (for [`MovedFrom::undo`]).
    fn attempt(&self, leader: u64) -> (Option<u64>, Option<u64>) {
        let mut pinned = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let before = *pinned;
        let away_from = *pinned.get_or_insert(leader);
        (Some(away_from), before)
    }

    /// The attempt moved nothing: back to what was pinned before it.
    fn undo(&self, before: Option<u64>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = before;
    }
}

impl Client {
    /// Status of the replica at `addr` (which need not be the leader).
    pub async fn status_of(&self, addr: &str) -> Result<NodeStatus, Error> {
        let target = self.router().target_for(addr)?;
        let Target::Remote { channel, .. } = target else {
            return Err(Error::Protocol("status_of needs a remote endpoint".into()));
        };
        let budget = self.router().options().attempt_timeout;
        match tokio::time::timeout(budget, admin_client(channel).status(StatusRequest {})).await {
            Ok(Ok(reply)) => Ok(reply.into_inner().into()),
            Ok(Err(status)) => Err(Error::Unavailable {
                attempts: 1,
                elapsed: budget,
                last: format!("{addr}: {}", status.message()),
            }),
            Err(_) => Err(Error::Unavailable {
                attempts: 1,
                elapsed: budget,
                last: format!("{addr}: no answer"),
            }),
        }
    }

    /// Status of the cluster as the first answering replica sees it; if that
    /// replica knows a leader, the leader's own status.
    pub async fn status(&self) -> Result<NodeStatus, Error> {
        let mut last = None;
        for addr in self.router().endpoints() {
            match self.status_of(&addr).await {
                Ok(s) => {
                    if let Some(leader) = s.leader_addr.clone() {
                        if leader != addr {
                            if let Ok(ls) = self.status_of(&leader).await {
                                return Ok(ls);
                            }
                        }
                    }
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(Error::BadEndpoint {
            endpoint: String::new(),
            reason: "no endpoints".into(),
        }))
    }

    /// Add the replica whose peer listener answers at `peer_addr` as node
    /// `id`: as a learner, and with `voter`, promoted once it has caught up.
    /// If the cluster knows `id` with another data-directory incarnation
    /// (its disk was wiped or replaced), that member is removed first: this
    /// is how a failed node is replaced (README: "Replacing a failed disk or
    /// node"). Returns once the change is committed.
    ///
    /// Membership changes are served on the leader's peer listener only, so
    /// this needs the peers' credentials: the cluster secret
    /// ([`ClientOptions::with_cluster_secret`](crate::ClientOptions::with_cluster_secret))
    /// and, with TLS, a client certificate of the cluster's CA
    /// ([`ClientOptions::with_tls`](crate::ClientOptions::with_tls) with an
    /// identity). While access control is enabled it also needs the client's
    /// user ([`ClientOptions::with_user`](crate::ClientOptions::with_user),
    /// or a client certificate naming it) to have the admin permission:
    /// [`CommandError::AuthRequired`](crate::CommandError::AuthRequired) or
    /// [`CommandError::PermissionDenied`](crate::CommandError::PermissionDenied)
    /// otherwise. The client asks its endpoints for the leader's peer
    /// address.
    ///
    /// Replacing a voter is refused (`ReplicaFailure::InvalidArgument`,
    /// naming the nodes that do not answer) when a majority of the voters
    /// without it would not answer; see [`Client::change_voters`].
    /// [`Client::add_member_forced`] skips that check.
    pub async fn add_member(&self, id: u64, peer_addr: &str, voter: bool) -> Result<(), Error> {
        self.add_member_with(id, peer_addr, voter, false).await
    }

    /// [`Client::add_member`] without the live-majority check.
    pub async fn add_member_forced(
        &self,
        id: u64,
        peer_addr: &str,
        voter: bool,
    ) -> Result<(), Error> {
        self.add_member_with(id, peer_addr, voter, true).await
    }

    async fn add_member_with(
        &self,
        id: u64,
        peer_addr: &str,
        voter: bool,
        force: bool,
    ) -> Result<(), Error> {
        channel(peer_addr, self.router().options())?;
        let peer_addr = peer_addr.to_string();
        // The replica waits (up to two minutes) for the new member to catch
        // up before it promotes it.
        self.router()
            .call_with(true, ADD_MEMBER_TIMEOUT, ADD_MEMBER_TIMEOUT, |target, _| {
                let request = AddMemberRequest {
                    id,
                    peer_addr: peer_addr.clone(),
                    voter,
                    force,
                };
                async move {
                    let (_, mut leader) = self.leader_membership(target).await?;
                    let request = membership_request(request, self.router().options())?;
                    match leader.add_member(request).await {
                        Ok(r) => refused(r.into_inner().error),
                        Err(s) => Err(classify_status(&s)),
                    }
                }
            })
            .await?
            .map_err(Error::Refused)
    }

    /// Make exactly `voters` the voting members (joint consensus). Every id
    /// must already be a member (add new nodes with [`Client::add_member`]).
    /// Needs the peers' credentials, as [`Client::add_member`] does.
    ///
    /// The leader refuses (`ReplicaFailure::InvalidArgument`, naming the
    /// nodes that do not answer) a change when a majority of the current
    /// voters or of `voters` does not answer it: such a change could not
    /// commit (joint consensus needs both majorities), or would leave a
    /// cluster that cannot serve. [`Client::change_voters_forced`] skips the
    /// check.
    pub async fn change_voters(&self, voters: impl IntoIterator<Item = u64>) -> Result<(), Error> {
        self.change_voters_with(voters, false).await
    }

    /// [`Client::change_voters`] without the live-majority check.
    pub async fn change_voters_forced(
        &self,
        voters: impl IntoIterator<Item = u64>,
    ) -> Result<(), Error> {
        self.change_voters_with(voters, true).await
    }

    async fn change_voters_with(
        &self,
        voters: impl IntoIterator<Item = u64>,
        force: bool,
    ) -> Result<(), Error> {
        let voters: Vec<u64> = voters
            .into_iter()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if voters.is_empty() {
            return Err(Error::InvalidArgument(
                "the voter set must not be empty".into(),
            ));
        }
        self.router()
            .call_with(
                true,
                CHANGE_VOTERS_TIMEOUT,
                CHANGE_VOTERS_TIMEOUT,
                |target, _| {
                    let request = ChangeVotersRequest {
                        voters: voters.clone(),
                        force,
                    };
                    async move {
                        let (_, mut leader) = self.leader_membership(target).await?;
                        let request = membership_request(request, self.router().options())?;
                        match leader.change_voters(request).await {
                            Ok(r) => refused(r.into_inner().error),
                            Err(s) => Err(classify_status(&s)),
                        }
                    }
                },
            )
            .await?
            .map_err(Error::Refused)
    }

    /// Move leadership to voter `to` (`None`: a voter that answers the
    /// leader and holds its last entry) and return the id of the voter that
    /// leads afterwards. Needs the peers' credentials, as
    /// [`Client::add_member`] does.
    ///
    /// The leader pauses writes (other clients see retryable refusals and
    /// follow the new leader), lets those in flight finish, and hands over;
    /// this takes a few milliseconds on a healthy cluster. Use it before
    /// stopping or removing the leader's machine (a replica stopped
    /// gracefully hands over by itself).
    ///
    /// Errors: [`Error::InvalidArgument`] when `to` is not a voter, there is
    /// no other voter, or the target has not answered the leader lately
    /// (nothing started; the leader carries on). A target still catching
    /// up, a membership change in progress, or an election that overtook
    /// the transfer are retried within the call's time; what is left at
    /// its end is [`Error::Unavailable`]. Within the call, a lost reply is
    /// asked again without moving leadership twice: an attempt without a
    /// target names the leader it asks to move away from, and once an
    /// attempt may have moved it (no definite answer came back, or the
    /// hand-over started and did not finish in time) every later attempt
    /// names that same leader, and a leader other than it answers its own
    /// id. A new call without a target moves leadership again.
    ///
    /// ```no_run
    /// # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
    /// let leader = client.transfer_leader(Some(2)).await?;
    /// assert_eq!(leader, 2);
    /// # Ok(()) }
    /// ```
    pub async fn transfer_leader(&self, to: Option<u64>) -> Result<u64, Error> {
        // Not a write: a lost reply is asked again, which is safe. With a
        // named target, on the target itself it changes nothing; without
        // one, see `MovedFrom`.
        let moved_from = MovedFrom::default();
        let moved_from = &moved_from;
        self.router()
            .call_with(
                false,
                CHANGE_VOTERS_TIMEOUT,
                CHANGE_VOTERS_TIMEOUT,
                |target, _| async move {
                    let (leader_id, mut leader) = self.leader_membership(target).await?;
                    let (away_from, before) = match to {
                        Some(_) => (None, None),
                        None => moved_from.attempt(leader_id),
                    };
                    let request = membership_request(
                        v1::MoveLeaderRequest { to, away_from },
                        self.router().options(),
                    )?;
                    let answer = match leader.move_leader(request).await {
                        Ok(r) => {
                            let reply = r.into_inner();
                            refused(reply.error).map(|r| r.map(|()| reply.leader_id))
                        }
                        Err(s) => Err(classify_status(&s)),
                    };
                    if matches!(
                        answer,
                        Err(Attempt::NotSent(_)
                            | Attempt::Refused(
                                ReplicaFailure::NotLeader { .. }
                                    | ReplicaFailure::InvalidArgument(_)
                            ))
                    ) {
                        // Nothing started: this attempt moved nothing.
                        moved_from.undo(before);
                    }
                    answer
                },
            )
            .await?
            .map_err(Error::Refused)
    }

    /// The leader's id and a `Membership` client on its peer listener, as
    /// the replica at `target` knows it (its status names the leader and
    /// the membership records every member's peer address).
    async fn leader_membership(
        &self,
        target: Target,
    ) -> Result<(u64, MembershipClient<Channel>), Attempt> {
        let status: NodeStatus = match target {
            Target::Local(replica) => replica.status(),
            Target::Remote { channel, .. } => admin_client(channel)
                .status(StatusRequest {})
                .await
                .map_err(|s| classify_status(&s))?
                .into_inner()
                .into(),
        };
        let leader = status
            .members
            .iter()
            .find(|m| Some(m.id) == status.leader_id)
            .ok_or_else(|| {
                Attempt::Refused(ReplicaFailure::Unavailable(format!(
                    "node {} knows no leader yet",
                    status.id
                )))
            })?;
        let channel =
            channel(&leader.peer_addr, self.router().options()).map_err(Attempt::not_usable)?;
        Ok((
            leader.id,
            MembershipClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
        ))
    }

    /// Make learner `id` a voter. It must be a member already
    /// ([`Client::add_member`] with `voter` false adds one). The leader
    /// does it as [`Client::add_member`] does for the same member: it
    /// checks the replica is still the one the membership records, waits
    /// until it has caught up, and adds it to the voters (one joint
    /// consensus change that adds this voter only, so a concurrent change
    /// of other members is not undone). Needs the peers' credentials, as
    /// [`Client::add_member`] does.
    pub async fn promote(&self, id: u64) -> Result<(), Error> {
        let status = self.status().await?;
        let Some(member) = status.members.iter().find(|m| m.id == id) else {
            return Err(Error::InvalidArgument(format!(
                "node {id} is not a member: add it first (`members add {id} PEER_ADDR --learner`)"
            )));
        };
        if member.voter {
            return Ok(());
        }
        self.add_member(id, &member.peer_addr.clone(), true).await
    }

    /// A backup of the whole cluster state: every key, session, lock,
    /// sequence, counter and access-control record, as of one log index at
    /// or after every write acknowledged before the call (the leader takes
    /// it after a linearizable read's barrier, from one consistent view).
    /// The backup holds session secrets and password hashes, so the caller
    /// needs the cluster secret
    /// ([`ClientOptions::with_cluster_secret`](crate::ClientOptions::with_cluster_secret))
    /// or, while access control is on, a user with the admin permission
    /// ([`CommandError::PermissionDenied`](crate::CommandError::PermissionDenied)
    /// otherwise). A replica takes one backup at a time; the whole backup is
    /// held in memory on the leader and here.
    ///
    /// `latchkey snapshot save FILE` writes it to a file; `latchkey
    /// snapshot restore` seeds a new cluster from one.
    pub async fn backup(&self) -> Result<Backup, Error> {
        self.router()
            .call_with(
                false,
                BACKUP_TIMEOUT,
                BACKUP_TIMEOUT,
                |target, _| async move {
                    let Target::Remote { channel, .. } = target else {
                        return Err(Attempt::Refused(ReplicaFailure::InvalidArgument(
                            "a backup is taken over gRPC: use a client that names the \
                             replicas' endpoints (Client::connect), not a Node's in-process \
                             client"
                                .into(),
                        )));
                    };
                    let user =
                        Credentials::new(self.router().options()).map_err(Attempt::not_usable)?;
                    let request = as_user(&user, BackupRequest {});
                    let mut stream = admin_client(channel)
                        .backup(request)
                        .await
                        .map_err(|s| classify_status(&s))?
                        .into_inner();
                    let cut = |what: String| {
                        Attempt::Refused(ReplicaFailure::Unavailable(format!(
                            "the backup stream {what}"
                        )))
                    };
                    let first = stream
                        .message()
                        .await
                        .map_err(|s| classify_status(&s))?
                        .ok_or_else(|| cut("was empty".into()))?;
                    if let Err(refused) = refused(first.error)? {
                        return Ok(Err(refused));
                    }
                    let total = usize::try_from(first.total_bytes)
                        .map_err(|_| cut(format!("announced {} bytes", first.total_bytes)))?;
                    let mut bytes = Vec::with_capacity(total.min(1 << 30));
                    bytes.extend_from_slice(&first.data);
                    while let Some(chunk) =
                        stream.message().await.map_err(|s| classify_status(&s))?
                    {
                        bytes.extend_from_slice(&chunk.data);
                        if bytes.len() > total {
                            return Err(cut(format!("sent more than the {total} bytes announced")));
                        }
                    }
                    if bytes.len() != total {
                        return Err(cut(format!("ended after {} of {total} bytes", bytes.len())));
                    }
                    Ok(Ok(Backup {
                        last_index: first.last_index,
                        checksum: first.checksum,
                        bytes,
                    }))
                },
            )
            .await?
            .map_err(Error::Refused)
    }

    /// Remove node `id` from the voters (and from the cluster), if the
    /// others keep a live majority (see [`Client::change_voters`]).
    pub async fn remove_voter(&self, id: u64) -> Result<(), Error> {
        self.remove_voter_with(id, false).await
    }

    /// [`Client::remove_voter`] without the live-majority check.
    pub async fn remove_voter_forced(&self, id: u64) -> Result<(), Error> {
        self.remove_voter_with(id, true).await
    }

    async fn remove_voter_with(&self, id: u64, force: bool) -> Result<(), Error> {
        let status = self.status().await?;
        let voters: BTreeSet<u64> = status
            .members
            .iter()
            .filter(|m| m.voter && m.id != id)
            .map(|m| m.id)
            .collect();
        if !status.members.iter().any(|m| m.id == id) {
            return Err(Error::InvalidArgument(format!("node {id} is not a member")));
        }
        self.change_voters_with(voters, force).await
    }
}

#[cfg(test)]
mod tests {
    use super::MovedFrom;

    /// An attempt names the leader it reaches unless an earlier one may
    /// have moved leadership; one that moved nothing leaves no trace.
    #[test]
    fn a_transfer_names_the_leader_it_may_have_moved_away_from() {
        let moved = MovedFrom::default();
        // A stale status: node 1 answers NotLeader, nothing started.
        let (away, before) = moved.attempt(1);
        assert_eq!((away, before), (Some(1), None));
        moved.undo(before);
        // The real leader, node 2: its reply is lost (outcome unknown).
        assert_eq!(moved.attempt(2), (Some(2), None));
        // Asked again at the new leader, node 3: still away from node 2.
        assert_eq!(moved.attempt(3), (Some(2), Some(2)));
        // An attempt that moved nothing restores what was pinned.
        let (_, before) = moved.attempt(3);
        moved.undo(before);
        assert_eq!(moved.attempt(4), (Some(2), Some(2)));
    }
}
