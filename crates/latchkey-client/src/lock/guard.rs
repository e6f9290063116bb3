//! [`LockGuard`]: the proof of holding a lock (its sequencer and fencing
//! token), how long it can be vouched for, and releasing it (in the
//! background when dropped, or retried there when the cluster did not
//! answer). A guard's fenced writes are [`Client`](crate::Client)'s (`fenced.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey_core::lock::{LockCommand, LockOutcome, Sequencer, Token};
use latchkey_core::{Command, CommandError, Outcome};

use super::detached;
use super::lease_clock;
use super::session::Session;
use crate::error::Error;
use crate::kv::{unexpected, Batch};

/// The local lease deadline of each live grant of one [`Lock`](crate::Lock)
/// handle, by token, so a re-entrant acquire inherits the first grant's
/// deadline (the cluster keeps the first grant's lease).
pub(super) type Grants = Arc<Mutex<BTreeMap<Token, Option<Instant>>>>;

/// Release one hold of `sequencer` by `owner`: the holds it still has.
/// `grants`, if given, forgets the grant once the cluster says it is over
/// (released to 0 holds, or not held any more), here or in the background
/// retry.
pub(super) async fn release(
    session: &Session,
    owner: u64,
    sequencer: &Sequencer,
    grants: Option<&Grants>,
) -> Result<u32, Error> {
    let command = Command::Lock(LockCommand::Release {
        session: session.id(),
        secret: session.secret(),
        owner,
        request_id: session.next_request(),
        name: sequencer.name.clone(),
        token: sequencer.token,
    });
    let tokens = [sequencer.token];
    let result = send_release(session, command, grants, &tokens).await;
    match result {
        Ok(Outcome::Lock(LockOutcome::Released { remaining, .. })) => Ok(remaining),
        Ok(other) => Err(unexpected("Released", &other)),
        Err(e) => Err(e),
    }
}

/// End each of a multi-lock's grants, `sequencers`, by `owner`, in one
/// step: (the locks released, the locks whose grant no longer held).
/// `grants`, if given, forgets them all once the cluster answers (the
/// cluster ends each grant whole).
pub(super) async fn release_all(
    session: &Session,
    owner: u64,
    sequencers: &[Sequencer],
    grants: Option<&Grants>,
) -> Result<(Vec<String>, Vec<String>), Error> {
    let command = Command::Lock(LockCommand::ReleaseAll {
        session: session.id(),
        secret: session.secret(),
        owner,
        request_id: session.next_request(),
        grants: sequencers
            .iter()
            .map(|s| (s.name.clone(), s.token))
            .collect(),
    });
    let tokens: Vec<Token> = sequencers.iter().map(|s| s.token).collect();
    match send_release(session, command, grants, &tokens).await? {
        Outcome::Lock(LockOutcome::ReleasedAll { released, gone }) => Ok((released, gone)),
        other => Err(unexpected("ReleasedAll", &other)),
    }
}

/// Send a release (`Release` or `ReleaseAll`) of the grants `tokens`,
/// forgetting them in `grants` once over. If the cluster does not answer in
/// time, the error is returned and the release is retried in the
/// background.
async fn send_release(
    session: &Session,
    command: Command,
    grants: Option<&Grants>,
    tokens: &[Token],
) -> Result<Outcome, Error> {
    let result = session.client().execute_with(command.clone(), true).await;
    if let Some(grants) = grants {
        forget_if_over(grants, tokens, &result);
    }
    match result {
        Err(Error::Refused(CommandError::SessionEnded { .. })) => Err(session.lost_error()),
        Err(e @ (Error::Unavailable { .. } | Error::UnknownOutcome(_))) => {
            // The cluster did not answer in time. The release carries its
            // request id, so repeating it is safe: keep trying in the
            // background so the lock is not left held until the session ends.
            retry_release_in_background(
                session.clone(),
                command,
                grants.cloned().map(|g| (g, tokens.to_vec())),
            );
            Err(e)
        }
        other => other,
    }
}

/// Forget the grants `tokens` if `result` (of a release of them) says they
/// are over: released to 0 holds, or not held by this owner any more.
fn forget_if_over(grants: &Grants, tokens: &[Token], result: &Result<Outcome, Error>) {
    let remaining = match result {
        Ok(Outcome::Lock(LockOutcome::Released { remaining, .. })) => *remaining,
        Ok(Outcome::Lock(LockOutcome::ReleasedAll { .. })) => 0,
        Err(Error::Refused(
            CommandError::NotHolder { .. }
            | CommandError::StaleToken { .. }
            | CommandError::SessionEnded { .. },
        )) => 0,
        _ => return,
    };
    for token in tokens {
        forget_grant(grants, *token, remaining);
    }
}

fn retry_release_in_background(
    session: Session,
    command: Command,
    grant: Option<(Grants, Vec<Token>)>,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    handle.spawn(async move {
        let mut pause = Duration::from_millis(200);
        while session.is_live() {
            tokio::time::sleep(pause).await;
            let result = session.client().execute_with(command.clone(), true).await;
            if let Some((grants, tokens)) = &grant {
                forget_if_over(grants, tokens, &result);
            }
            match result {
                Err(Error::Unavailable { .. } | Error::UnknownOutcome(_)) => {
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                // Released, or a definite refusal (e.g. already released).
                _ => return,
            }
        }
    });
}

/// One hold of a lock. Its [`token`](LockGuard::token) is the fencing token
/// to hand to any storage the holder writes to.
///
/// Dropping a guard inside a Tokio runtime releases it in the background
/// (outside one, the lock is freed when its session ends);
/// [`LockGuard::release`] releases it and reports the outcome.
pub struct LockGuard {
    session: Session,
    owner: u64,
    sequencer: Sequencer,
    lease_until: Option<Instant>,
    released: AtomicBool,
    /// The handle's grant table, emptied of this grant once fully released.
    grants: Grants,
}

fn forget_grant(grants: &Mutex<BTreeMap<Token, Option<Instant>>>, token: Token, remaining: u32) {
    if remaining == 0 {
        grants
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&token);
    }
}

impl LockGuard {
    /// A guard for `sequencer`, granted to `owner` and vouched for until
    /// `lease_until` (on the lease clock) if the grant has a lease.
    pub(super) fn new(
        session: Session,
        owner: u64,
        sequencer: Sequencer,
        lease_until: Option<Instant>,
        grants: Grants,
    ) -> LockGuard {
        LockGuard {
            session,
            owner,
            sequencer,
            lease_until,
            released: AtomicBool::new(false),
            grants,
        }
    }

    /// The fencing token of this grant: strictly greater than every token
    /// of every grant made before it, cluster-wide. A re-entrant acquire
    /// (same handle, lock already held) shares the token of the grant it
    /// re-enters.
    pub fn token(&self) -> Token {
        self.sequencer.token
    }

    /// The grant's sequencer (lock name, mode, token, session); its
    /// `to_string()` is safe in an HTTP header or environment variable and
    /// parses back with `str::parse`.
    pub fn sequencer(&self) -> &Sequencer {
        &self.sequencer
    }

    /// The session holding this guard.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The party within the session that holds the grant.
    pub(super) fn owner(&self) -> u64 {
        self.owner
    }

    /// Take over releasing this grant (a multi-lock releases its grants
    /// together): the guard will not release it, on drop or otherwise.
    /// False if it was released already.
    pub(super) fn take_release(&self) -> bool {
        !self.released.swap(true, Ordering::SeqCst)
    }

    /// The handle's grant table this guard's grant is in.
    pub(super) fn grants(&self) -> &Grants {
        &self.grants
    }

    /// True while this client can vouch that it holds the lock: not
    /// released, not force-released by an operator (the cluster says so
    /// in the first keep-alive answer after it), the session's lease
    /// valid, and the lock lease (if any) not run out on the local clock. Even so, a paused process can act after
    /// this turns false: only fencing protects storage.
    pub fn is_held(&self) -> bool {
        !self.released.load(Ordering::SeqCst)
            && self.session.is_live()
            && !self.session.is_revoked(self.sequencer.token)
            && self.lease_until.is_none_or(|t| lease_clock::now() < t)
    }

    /// How long this client can still vouch that it holds the lock (zero
    /// once [`LockGuard::is_held`] is false): the earlier of the session's
    /// lease end and the lock lease's, on the lease clock. A process that
    /// must stop work when the lock may pass on (`latchkey lock -- CMD`
    /// hands it to a watcher process) can add it to `CLOCK_BOOTTIME` read
    /// just before.
    pub fn remaining(&self) -> std::time::Duration {
        if !self.is_held() {
            return std::time::Duration::ZERO;
        }
        let session = self.session.remaining();
        match self.lease_until {
            Some(t) => session.min(t.saturating_duration_since(lease_clock::now())),
            None => session,
        }
    }

    /// Resolves once the lock can no longer be relied on: the session is
    /// lost, an operator force-released the grant, or the lock lease ran
    /// out on the local clock.
    pub async fn lost(&self) {
        let lease_end = async {
            match self.lease_until {
                Some(t) => tokio::time::sleep_until(lease_clock::timer(t)).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.session.lost() => {}
            _ = self.session.revoked(self.sequencer.token) => {}
            _ = lease_end => {}
        }
    }

    /// Release this hold (for a re-entrant grant, one hold of it). If the
    /// cluster does not answer in time the error is returned and the
    /// release keeps being retried in the background (same request id, so
    /// it applies at most once) while the session lives. Cancel-safe: the
    /// release runs in a task of its own, so dropping this future (a
    /// timeout around it) stops only the waiting.
    pub async fn release(self) -> Result<(), Error> {
        if self.released.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let (session, owner) = (self.session.clone(), self.owner);
        let (sequencer, grants) = (self.sequencer.clone(), self.grants.clone());
        detached::finish(async move {
            release(&session, owner, &sequencer, Some(&grants)).await?;
            Ok(())
        })
        .await
    }

    /// [`Client::put_fenced`](crate::Client::put_fenced) with this guard's sequencer.
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<u64, Error> {
        self.session
            .client()
            .put_fenced(&self.sequencer, &self.session.secret(), key, value)
            .await
    }

    /// [`Client::delete_fenced`](crate::Client::delete_fenced) with this guard's sequencer.
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<u64, Error> {
        self.session
            .client()
            .delete_fenced(&self.sequencer, &self.session.secret(), key)
            .await
    }

    /// [`Client::batch_fenced`](crate::Client::batch_fenced) with this guard's sequencer.
    pub async fn batch(&self, batch: Batch) -> Result<Result<u64, u32>, Error> {
        self.session
            .client()
            .batch_fenced(&self.sequencer, &self.session.secret(), batch)
            .await
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released.swap(true, Ordering::SeqCst) || !self.session.is_live() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let session = self.session.clone();
        let owner = self.owner;
        let sequencer = self.sequencer.clone();
        let grants = self.grants.clone();
        handle.spawn(async move {
            match release(&session, owner, &sequencer, Some(&grants)).await {
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(lock = %sequencer.name, error = %e, "background release failed")
                }
            }
        });
    }
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("sequencer", &self.sequencer.to_string())
            .field("held", &self.is_held())
            .finish()
    }
}
