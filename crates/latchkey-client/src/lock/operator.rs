//! What an operator does to other clients' sessions:
//! [`Client::end_session`].

use latchkey_core::lock::{LockCommand, LockOutcome, SessionId};
use latchkey_core::{Command, CommandError, Outcome};

use crate::error::Error;
use crate::kv::{unexpected, Client};

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
}
