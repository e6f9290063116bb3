//! The replica's read path: linearizable reads behind a leadership round
//! (ReadIndex), stale reads, and the replica's own reads of its applied
//! state (timers, sessions, the lock census, access control).

use std::time::Duration;

use latchkey_core::auth::{AuthOutcome, AuthQuery};
use latchkey_core::lock::{
    LockInfo, LockOutcome, LockQuery, SessionId, SessionListing, SessionTimer, TimerState,
};
use latchkey_core::{validate_query, CommandError, CommandResult, Outcome, Query};
use latchkey_proto::ReplicaFailure;
use latchkey_storage::StateReader;

use crate::auth::Caller;

use super::Replica;

/// How long one lock census answers (`/metrics` and the status page).
const CENSUS_FRESH_FOR: Duration = Duration::from_secs(1);

impl Replica {
    /// Serve `query`: linearizable (leader only, after a ReadIndex round)
    /// unless `stale`, in which case from this replica's applied state.
    pub(crate) async fn read(
        &self,
        query: Query,
        stale: bool,
        caller: &Caller,
    ) -> Result<CommandResult, ReplicaFailure> {
        validate_query(&query).map_err(ReplicaFailure::invalid)?;
        // The leader's own reads: they carry session secrets (and password
        // hashes). The replica reads them with `local_query`; no caller,
        // in-process or remote, may.
        if let Query::Lock(
            LockQuery::TimerState | LockQuery::SessionTimer { .. } | LockQuery::Census,
        )
        | Query::Auth(AuthQuery::Credentials { .. })
        | Query::As { .. } = &query
        {
            return Err(ReplicaFailure::InvalidArgument(
                "the timer state, the lock census and stored credentials are read by the replica \
                 itself, not by clients"
                    .into(),
            ));
        }
        self.check_serving()?;
        let anonymous_status_only = matches!(caller, Caller::Anonymous)
            && !matches!(query, Query::Auth(AuthQuery::Status))
            && self.auth_enabled()?;
        if anonymous_status_only {
            // Refused before the leadership round: no work for strangers.
            return Ok(Err(CommandError::AuthRequired));
        }
        if !stale {
            self.confirm(true).await?;
        } else if self.has_membership() && !self.is_member() {
            // Removed from the cluster: its state no longer moves on.
            return Err(ReplicaFailure::Unavailable(
                "this replica is not a member of the cluster (it was removed, or waits to be \
                 added): ask another replica"
                    .into(),
            ));
        }
        let lists_sessions = matches!(query, Query::Lock(LockQuery::Sessions { .. }));
        let result = match caller {
            Caller::User(user) => self.local_query(&Query::As {
                user: user.clone(),
                query: Box::new(query),
            }),
            Caller::Internal => self.local_query(&query),
            Caller::Anonymous => {
                // Enabled meanwhile (during the round): still refused.
                if !matches!(query, Query::Auth(AuthQuery::Status)) && self.auth_enabled()? {
                    return Ok(Err(CommandError::AuthRequired));
                }
                self.local_query(&query)
            }
        };
        match result {
            Ok(Ok(Outcome::Lock(LockOutcome::Sessions { sessions, more }))) if lists_sessions => {
                Ok(Ok(Outcome::Lock(LockOutcome::Sessions {
                    sessions: self.with_time_left(sessions).await,
                    more,
                })))
            }
            other => other,
        }
    }

    /// `sessions` with how long each has left on this replica's
    /// countdowns, if it leads (the core has no clock to say).
    async fn with_time_left(&self, mut sessions: Vec<SessionListing>) -> Vec<SessionListing> {
        let ids = sessions.iter().map(|s| s.session).collect();
        let left = self.locks.countdowns(ids).await;
        for (s, left) in sessions.iter_mut().zip(left) {
            s.left_ms = left.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
        sessions
    }

    /// Confirm leadership with a quorum round begun after this call (shared
    /// with concurrent reads, see [`ReadGate`]); with `wait_applied`, also
    /// wait until everything committed before the round is applied here
    /// (ReadIndex).
    async fn confirm(&self, wait_applied: bool) -> Result<(), ReplicaFailure> {
        self.check_serving()?;
        if !self.is_leader() {
            return Err(self.not_leader());
        }
        let confirmed = async {
            let read_index = self.reads.confirm().await?;
            if wait_applied {
                self.wait_applied(read_index).await?;
            }
            Ok(())
        };
        match tokio::time::timeout(self.read_timeout, confirmed).await {
            Ok(result) => result,
            Err(_) => Err(ReplicaFailure::Unavailable(format!(
                "could not confirm leadership within {:?}",
                self.read_timeout
            ))),
        }
    }

    /// Wait until the entry at `read_index` is applied and visible to reads.
    async fn wait_applied(&self, read_index: Option<u64>) -> Result<(), ReplicaFailure> {
        let Some(index) = read_index else {
            return Ok(());
        };
        let visible = {
            let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
            reader.as_ref().and_then(StateReader::last_applied_index)
        };
        if visible.is_some_and(|applied| applied >= index) {
            return Ok(());
        }
        // openraft publishes the applied index after the state machine has
        // committed it, so this is never earlier than the reader's index.
        self.view
            .raft()
            .wait(None)
            .applied_index_at_least(Some(index), "linearizable read")
            .await
            .map(|_| ())
            .map_err(|e| ReplicaFailure::Unavailable(format!("replica stopped: {e}")))
    }

    /// One leadership confirmation round (for keep-alives).
    pub(crate) async fn confirm_leadership(&self) -> Result<(), ReplicaFailure> {
        self.confirm(false).await
    }

    /// The countdowns a new leader restarts, read once everything committed
    /// before now is applied here.
    pub(crate) async fn timer_state(&self) -> Result<TimerState, String> {
        self.confirm(true).await.map_err(|f| f.to_string())?;
        match self.local_query(&crate::locks::timer_query()) {
            Ok(Ok(Outcome::Lock(LockOutcome::Timers(state)))) => Ok(state),
            other => Err(format!("unexpected timer state answer: {other:?}")),
        }
    }

    /// A session's TTL from this replica's applied state, `None` if it is
    /// not live.
    pub(crate) fn local_session(
        &self,
        session: SessionId,
    ) -> Result<Option<SessionTimer>, ReplicaFailure> {
        match self.local_query(&Query::Lock(LockQuery::SessionTimer { session }))? {
            Ok(Outcome::Lock(LockOutcome::SessionTimer(info))) => Ok(info),
            other => Err(ReplicaFailure::Unavailable(format!(
                "unexpected session answer: {other:?}"
            ))),
        }
    }

    /// The first `limit` locks in use, from this replica's applied state
    /// (not linearizable), and whether there are more.
    pub(crate) fn local_locks(&self, limit: u32) -> Result<(Vec<LockInfo>, bool), ReplicaFailure> {
        let query = Query::Lock(LockQuery::Locks {
            prefix: String::new(),
            start_after: None,
            limit,
        });
        match self.local_query(&query)? {
            Ok(Outcome::Lock(LockOutcome::Locks { locks, more })) => Ok((locks, more)),
            other => Err(ReplicaFailure::Unavailable(format!(
                "unexpected lock list answer: {other:?}"
            ))),
        }
    }

    /// The counts of sessions, locks, grants and waiters in this replica's
    /// applied state, at most [`CENSUS_FRESH_FOR`] old. Taking one scans
    /// every session and lock (call it off the async workers); one caller
    /// takes it while the others wait for its answer.
    pub(crate) fn lock_census(&self) -> Result<latchkey_core::lock::LockCensus, ReplicaFailure> {
        let mut cached = self.census.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, census)) = *cached {
            if at.elapsed() < CENSUS_FRESH_FOR {
                return Ok(census);
            }
        }
        let census = match self.local_query(&Query::Lock(LockQuery::Census))? {
            Ok(Outcome::Lock(LockOutcome::Census(census))) => census,
            other => {
                return Err(ReplicaFailure::Unavailable(format!(
                    "unexpected lock census answer: {other:?}"
                )))
            }
        };
        *cached = Some((std::time::Instant::now(), census));
        Ok(census)
    }

    /// Whether access control is enabled, as this replica has applied it.
    pub(crate) fn auth_enabled(&self) -> Result<bool, ReplicaFailure> {
        match self.local_query(&Query::Auth(AuthQuery::Status))? {
            Ok(Outcome::Auth(AuthOutcome::Status(enabled))) => Ok(enabled),
            other => Err(ReplicaFailure::Unavailable(format!(
                "cannot read whether access control is enabled: {other:?}"
            ))),
        }
    }

    pub(super) fn local_query(&self, query: &Query) -> Result<CommandResult, ReplicaFailure> {
        let reader = self.reader.read().unwrap_or_else(|p| p.into_inner());
        match reader.as_ref() {
            Some(r) => r
                .query(query)
                .map_err(|e| ReplicaFailure::Unavailable(e.to_string())),
            None => Err(ReplicaFailure::Unavailable(
                "this replica has shut down".into(),
            )),
        }
    }
}
