//! The replica's write path: a client's write, a lock acquire that waits
//! for its grant, a keep-alive, and the leader's own expiries, each
//! proposed through the write queue once this replica leads.

use std::time::Duration;

use latchkey_core::lock::LockQuery;
use latchkey_core::lock::{LockCommand, LockOutcome, Proposer, SessionId, SessionSecret, WaitEnd};
use latchkey_core::{validate_command, Command, CommandError, CommandResult, Outcome, Query};
use latchkey_proto::ReplicaFailure;

use crate::auth::Caller;
use crate::locks::{KeepAlive, WaitOutcome};
use crate::write_queue::Origin;

use super::Replica;

impl Replica {
    /// Propose a client's `command` if this replica leads; otherwise refuse
    /// without proposing. Answers once the entry is applied here. The
    /// leader's own lock commands (expiries) are refused: only its timers
    /// propose them.
    pub(crate) async fn write(
        &self,
        command: Command,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        if let Command::Group { .. } | Command::As { .. } = &command {
            return Err(ReplicaFailure::InvalidArgument(
                "command groups and `As` are formed by the replica only; send the commands one \
                 by one"
                    .into(),
            ));
        }
        let mut command = command;
        if let Command::Lock(lock) = &mut command {
            if lock.proposer() == Proposer::Leader {
                return Err(ReplicaFailure::InvalidArgument(
                    "expiry commands are proposed by the leader's timers only".into(),
                ));
            }
            if let LockCommand::OpenSession { secret, .. } = lock {
                *secret = draw_session_secret()?;
            }
        }
        if let Command::Lock(
            op @ (LockCommand::EndSession { .. } | LockCommand::ForceRelease { .. }),
        ) = &command
        {
            // Session ids are small and listed by `locks`; a session's
            // secret guards it even while access control is off, so an
            // operator's act without the secret (ending a session, forcing
            // a lock's release) is for the trusted only then: the
            // application in this process or a caller with the cluster
            // secret. With access control on, the admin permission decides
            // where the command is applied.
            let what = match op {
                LockCommand::EndSession { session } => format!("session {}", session.0),
                LockCommand::ForceRelease { name, .. } => format!("lock {name:?}"),
                _ => String::new(),
            };
            let trusted = matches!(caller, Caller::Internal) || self.auth_enabled()?;
            if !trusted {
                return Ok(Err(CommandError::PermissionDenied {
                    user: match caller {
                        Caller::User(user) => user.clone(),
                        _ => String::new(),
                    },
                    permission: latchkey_core::auth::Permission::Admin,
                    on: format!(
                        "{what} (while access control is off, only a caller with the cluster \
                         secret ends another's session or forces a lock's release)"
                    ),
                }));
            }
            tracing::info!(target_of = %what, caller = ?caller, command = ?op, "an operator's act");
        }
        let command = match caller {
            Caller::User(user) => Command::As {
                user: user.clone(),
                command: Box::new(command),
            },
            // The application in this process acts as root while access
            // control is on (root exists then: it cannot be deleted).
            Caller::Internal if self.auth_enabled()? => Command::As {
                user: latchkey_core::auth::ROOT.to_string(),
                command: Box::new(command),
            },
            // Refused here if access control is on as this replica knows
            // it (no log entry for it), and where it is applied if it was
            // turned on meanwhile.
            Caller::Anonymous if self.auth_enabled()? => {
                return Ok(Err(CommandError::AuthRequired))
            }
            Caller::Internal | Caller::Anonymous => command,
        };
        self.propose(command, Origin::Client).await
    }

    /// Propose one of the leader's own commands: an expiry or a countdown
    /// checkpoint.
    pub(crate) async fn propose_own(
        &self,
        command: LockCommand,
    ) -> Result<CommandResult, ReplicaFailure> {
        let kind = match &command {
            LockCommand::ExpireSession { .. } => Some("session"),
            LockCommand::ExpireWait { .. } => Some("wait"),
            LockCommand::ExpireLockLease { .. } => Some("lock_lease"),
            LockCommand::EndLockDelay { .. } => Some("lock_delay"),
            _ => None,
        };
        let result = self.propose(Command::Lock(command), Origin::Leader).await;
        if matches!(result, Ok(Ok(_))) {
            match kind {
                Some(kind) => self.metrics.expiry(kind),
                None => self.metrics.checkpoint(),
            }
        }
        result
    }

    async fn propose(
        &self,
        command: Command,
        origin: Origin,
    ) -> Result<CommandResult, ReplicaFailure> {
        validate_command(&command).map_err(ReplicaFailure::invalid)?;
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        // Bounded here as a whole, including the wait in the queue.
        match tokio::time::timeout(self.write_timeout, self.writes.propose(command, origin)).await {
            Ok(result) => result,
            Err(_) => Err(ReplicaFailure::UnknownOutcome(format!(
                "the write did not commit within {:?}",
                self.write_timeout
            ))),
        }
    }

    /// Propose a client's acquire; if it queues, wait here until its grant
    /// or cancel is applied on this replica, or `hold` passes (then answer
    /// the `Queued` outcome: the client asks again with the same request id,
    /// which the session's memory answers without a second grant).
    ///
    /// The waiter is registered before the acquire is proposed, so a grant
    /// applied at any moment after the proposal is seen.
    pub(crate) async fn acquire(
        &self,
        command: Command,
        hold: Duration,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        let (session, owner, id, multi) = match &command {
            Command::Lock(LockCommand::Acquire {
                session,
                owner,
                request_id,
                wait_ms: Some(_),
                ..
            }) => (*session, *owner, *request_id, false),
            Command::Lock(LockCommand::AcquireAll {
                session,
                owner,
                request_id,
                wait_ms: Some(_),
                ..
            }) => (*session, *owner, *request_id, true),
            _ => return self.write(command, caller).await,
        };
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let waiting = self.locks.waiters.register(session, owner, id);
        let result = self.write(command.clone(), caller).await;
        let Ok(Ok(Outcome::Lock(LockOutcome::Queued {
            name, request_id, ..
        }))) = &result
        else {
            // Not queued (granted, refused, not leader): nobody waits.
            drop(waiting);
            self.locks.waiters.forget(session, owner, id);
            return result;
        };
        let waited = tokio::time::timeout(hold, waiting).await;
        self.locks.waiters.forget(session, owner, id);
        match waited {
            Ok(Ok(WaitOutcome::Granted(sequencers))) if multi => {
                Ok(Ok(Outcome::Lock(LockOutcome::GrantedAll { sequencers })))
            }
            Ok(Ok(WaitOutcome::Granted(mut sequencers))) if sequencers.len() == 1 => {
                Ok(Ok(Outcome::Lock(LockOutcome::Granted {
                    sequencer: sequencers.remove(0),
                    hold_count: 1,
                })))
            }
            Ok(Ok(WaitOutcome::Cancelled(WaitEnd::SessionEnded(_)))) => {
                Ok(Err(CommandError::SessionEnded { session }))
            }
            Ok(Ok(WaitOutcome::Cancelled(_))) => Ok(Err(CommandError::WaitCancelled {
                name: name.clone(),
                request_id: *request_id,
            })),
            // Timed out, lost track (snapshot), or shutting down: still
            // queued as far as this call knows.
            // (A single acquire woken with other than one grant cannot
            // happen; asking again gets the session's memory of it.)
            Ok(Ok(WaitOutcome::Unknown | WaitOutcome::Granted(_))) | Ok(Err(_)) | Err(_) => result,
        }
    }

    /// Extend `session`'s lease (leader only). Acknowledged after a
    /// leadership confirmation round begun after this call; writes nothing.
    pub(crate) async fn keep_alive(
        &self,
        session: SessionId,
        secret: SessionSecret,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        // While access control is on, only the session's owner (who must
        // still exist) keeps it alive: a deleted user's sessions expire and
        // free their locks. The leader checks its own applied state; a
        // keep-alive is not in the log.
        let may = match caller {
            Caller::Internal => Ok(()),
            Caller::Anonymous if self.auth_enabled()? => Err(CommandError::AuthRequired),
            Caller::Anonymous => Ok(()),
            Caller::User(user) => {
                let check = Query::As {
                    user: user.clone(),
                    query: Box::new(Query::Lock(LockQuery::Session { session })),
                };
                self.local_query(&check)?.map(|_| ())
            }
        };
        if let Err(refused) = may {
            return Ok(Err(refused));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let ka = KeepAlive {
            session,
            secret,
            received: std::time::Instant::now(),
            reply,
        };
        if !self.locks.keep_alive(ka) {
            return Err(ReplicaFailure::Unavailable(
                "this replica is shutting down".into(),
            ));
        }
        match tokio::time::timeout(self.read_timeout * 2, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ReplicaFailure::Unavailable(
                "this replica is shutting down".into(),
            )),
            Err(_) => Err(ReplicaFailure::Unavailable(format!(
                "keep-alive not confirmed within {:?}",
                self.read_timeout * 2
            ))),
        }
    }
}

/// A new session's secret: 128 bits from the operating system's generator.
/// The replica that proposes the open draws it, so a client cannot choose a
/// weak one, and the log carries it to every replica.
fn draw_session_secret() -> Result<SessionSecret, ReplicaFailure> {
    let mut bytes = [0u8; SessionSecret::LEN];
    getrandom::fill(&mut bytes).map_err(|e| {
        ReplicaFailure::Unavailable(format!(
            "cannot draw a session secret from the operating system: {e}"
        ))
    })?;
    Ok(SessionSecret(bytes))
}
