//! What an operator does to and sees of other clients' sessions:
//! [`Client::end_session`], [`Client::force_release`] and
//! [`Client::sessions`].

use latchkey_core::limits::MAX_SESSION_LIST_LIMIT;
use latchkey_core::lock::{
    HolderInfo, LockCommand, LockOutcome, LockQuery, SessionId, SessionListing, Token,
};
use latchkey_core::{Command, CommandError, Outcome, Query};

use crate::error::Error;
use crate::kv::{unexpected, Client, Consistency};

/// What an operator's [`Client::end_session`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndedSession {
    /// Holds released (each into its lock-delay, if it had one).
    pub released: u32,
    /// Waits cancelled.
    pub cancelled: u32,
}

impl Client {
    /// End someone else's session now, without its secret, as if its TTL
    /// had run out (etcd's `lease revoke`): its locks are released as
    /// forced releases (a grant's lock-delay applies, since the holder may
    /// still be working), its waits are cancelled and the keys bound to it
    /// are deleted, all in one revision that watchers see. Its owner's
    /// [`Session`](crate::Session) learns of it on its next keep-alive and
    /// reports its locks lost.
    ///
    /// For an operator unsticking a hung process: needs the admin
    /// permission while access control is enabled. `Ok(None)`: the session
    /// had already ended (possibly by an earlier attempt of this very call,
    /// whose answer was lost); a session id never issued is
    /// [`CommandError::UnknownSession`].
    ///
    /// ```no_run
    /// # async fn f(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
    /// use latchkey_client::SessionId;
    /// if let Some(ended) = client.end_session(SessionId(42)).await? {
    ///     println!("released {} locks", ended.released);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn end_session(&self, session: SessionId) -> Result<Option<EndedSession>, Error> {
        // Safe to resend: a second attempt finds the session ended.
        match self
            .execute_with(Command::Lock(LockCommand::EndSession { session }), true)
            .await
        {
            Ok(Outcome::Lock(LockOutcome::SessionEnded {
                released,
                cancelled,
                ..
            })) => Ok(Some(EndedSession {
                released,
                cancelled,
            })),
            Ok(other) => Err(unexpected("SessionEnded", &other)),
            Err(Error::Refused(CommandError::SessionEnded { .. })) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Release the grant `token` of lock `name` from whoever holds it,
    /// without their secret (Hazelcast's `forceUnlock`, made safe).
    /// Returns the grant released; `None` if no grant of the lock has that
    /// token (it was released, or an earlier attempt of this very call
    /// released it and its answer was lost: a resend never touches the next
    /// holder).
    ///
    /// The grant ends with a lock-delay of at least its session's TTL,
    /// started even while other holders remain (nobody new is granted
    /// meanwhile), then the queue moves on and the next grant takes a
    /// higher token, so the old holder's fenced writes are refused. Its
    /// session lives on; its client learns at its next keep-alive (within
    /// a third of the TTL while the cluster is reachable): its
    /// [`LockGuard`](crate::LockGuard) reports `is_held` false and `lost`
    /// resolves.
    ///
    /// For an operator unsticking a hung holder: needs the admin
    /// permission while access control is enabled, and the cluster secret
    /// (or the embedded application's own client) while it is not.
    ///
    /// ```no_run
    /// # async fn f(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
    /// for lock in client.locks("reports/daily").await? {
    ///     for holder in &lock.holders {
    ///         client.force_release(&lock.name, holder.token).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn force_release(
        &self,
        name: &str,
        token: Token,
    ) -> Result<Option<HolderInfo>, Error> {
        // Safe to resend: a second attempt finds the grant gone.
        match self
            .execute_with(
                Command::Lock(LockCommand::ForceRelease {
                    name: name.to_string(),
                    token,
                }),
                true,
            )
            .await?
        {
            Outcome::Lock(LockOutcome::ForceReleased { mut released }) => Ok(released.pop()),
            other => Err(unexpected("ForceReleased", &other)),
        }
    }

    /// Every live session, in id order: the name it was opened under
    /// ([`ClientOptions::with_session_name`](crate::ClientOptions::with_session_name)),
    /// its TTL and how long it has left on the leader's countdown, what it
    /// holds and waits for, and the keys bound to it. Pages through them
    /// all (each page a linearizable read, so the list is not one
    /// snapshot). Needs the admin permission while access control is
    /// enabled.
    pub async fn sessions(&self) -> Result<Vec<SessionListing>, Error> {
        let mut all = Vec::new();
        let mut start_after = None;
        loop {
            let outcome = self
                .query(
                    Query::Lock(LockQuery::Sessions {
                        start_after,
                        limit: MAX_SESSION_LIST_LIMIT,
                    }),
                    Consistency::Linearizable,
                )
                .await?;
            let Outcome::Lock(LockOutcome::Sessions { sessions, more }) = outcome else {
                return Err(unexpected("Sessions", &outcome));
            };
            start_after = sessions.last().map(|s| s.session);
            all.extend(sessions);
            if !more || start_after.is_none() {
                return Ok(all);
            }
        }
    }
}
