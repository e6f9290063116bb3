//! Multi-locks: [`MultiLock`] takes several locks in one step or none
//! (Curator's `InterProcessMultiLock`, Redisson's `MultiLock`), and
//! [`MultiLockGuard`] holds them and gives them back together.
//!
//! The cluster grants every lock in one log entry or none, and a waiting
//! multi-lock is granted none of its locks, so multi-lock users cannot
//! deadlock each other whatever order they name their locks in. Waiting is
//! FIFO per lock and strict: a multi-lock at the head of one lock's queue
//! holds that queue up until its other locks come free (so it is never
//! starved by a stream of single acquires), and single acquires queue
//! behind it even while that lock is free. So do not mix multi-locks with
//! nested locking over the same locks: a session holding A that waits for
//! B queues behind a multi-lock of A and B that heads B's queue and waits
//! for A, and both wait until one gives up (give nested acquires a
//! timeout). The core's `multi_lock.rs` has every rule.
//!
//! Settled here:
//! - Each acquire is a new owner: a multi-lock never re-enters a lock its
//!   owner holds (the cluster refuses a set that overlaps what the owner
//!   holds or waits for).
//! - Each lock gets its own grant and fencing token; fence each resource
//!   with its own lock's guard ([`MultiLockGuard::get`]).
//! - A lease or a lock-delay applies to each grant on its own.
//!
//! Imports `detached`, `session`, `guard`, `handle` (this file is after
//! them).
//!
//! ```no_run
//! # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
//! use std::time::Duration;
//!
//! let session = client.session(Duration::from_secs(10)).await?;
//! let both = session.lock_all(["accounts/alice", "accounts/bob"]);
//! let held = both.acquire().await?; // both at once, or wait holding neither
//! if let Some(alice) = held.get("accounts/alice") {
//!     alice.put("accounts/alice/balance", "90").await?; // fenced by alice's token
//! }
//! held.release().await?; // both, in one step
//! # Ok(()) }
//! ```

use std::time::Duration;

use futures::future::select_all;
use futures::FutureExt;
use latchkey_core::lock::{Sequencer, Token};

use super::detached;
use super::guard::{release_all, LockGuard};
use super::handle::{clamp_wait, Lock};
use super::session::Session;
use crate::error::Error;

/// Several locks taken together from one session: all at once or none.
/// Each acquire is a new owner; configure it like a [`Lock`].
#[derive(Debug, Clone)]
pub struct MultiLock {
    session: Session,
    names: Vec<String>,
    shared: bool,
    lease: Option<Duration>,
    lock_delay: Option<Duration>,
}

impl Session {
    /// The locks `names` (2 to 32 distinct lock names), to take together.
    /// Grants are made and listed in this order.
    pub fn lock_all<I, S>(&self, names: I) -> MultiLock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLock {
            session: self.clone(),
            names: names.into_iter().map(Into::into).collect(),
            shared: false,
            lease: None,
            lock_delay: None,
        }
    }
}

impl MultiLock {
    /// The locks, in the order given.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Take every lock in shared mode.
    pub fn shared(mut self) -> Self {
        self.shared = true;
        self
    }

    /// A maximum hold time for each grant (see [`Lock::lease`]).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// A lock-delay for each grant (see [`Lock::lock_delay`]).
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// A new owner's handle on the first lock, carrying the others.
    fn holder(&self) -> Lock {
        let (first, also) = match self.names.split_first() {
            Some((first, also)) => (first.clone(), also.to_vec()),
            None => (String::new(), Vec::new()),
        };
        let mut lock = self.session.lock(first).with_also(also);
        if self.shared {
            lock = lock.shared();
        }
        if let Some(lease) = self.lease {
            lock = lock.lease(lease);
        }
        if let Some(delay) = self.lock_delay {
            lock = lock.lock_delay(delay);
        }
        lock
    }

    /// Wait, as long as it takes, for every lock at once.
    pub async fn acquire(&self) -> Result<MultiLockGuard, Error> {
        loop {
            if let Some(g) = self.acquire_timeout(Duration::MAX).await? {
                return Ok(g);
            }
            // The longest wait (a day) passed: queue again, at the tail.
        }
    }

    /// Every lock at once if all are free now and nobody waits for any of
    /// them: `None` otherwise.
    pub async fn try_acquire(&self) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire_inner(None).await
    }

    /// Wait at most `wait` (held to 1 ms .. 1 day) for every lock at once:
    /// `None` if they were not all granted by then (then none is held).
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<MultiLockGuard>, Error> {
        self.acquire_inner(Some(wait)).await
    }

    async fn acquire_inner(&self, wait: Option<Duration>) -> Result<Option<MultiLockGuard>, Error> {
        let holder = self.holder();
        let got = holder.acquire_grants(wait.map(clamp_wait)).await?;
        Ok(got.map(|got| MultiLockGuard {
            session: self.session.clone(),
            guards: holder.guards(got),
        }))
    }
}

/// Every lock of a [`MultiLock`], held: one [`LockGuard`] per lock, in the
/// order asked. Dropping it inside a Tokio runtime releases them all in the
/// background; [`MultiLockGuard::release`] releases them and reports.
pub struct MultiLockGuard {
    session: Session,
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The guards, in the order the locks were asked for.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// The guard of lock `name`.
    pub fn get(&self, name: &str) -> Option<&LockGuard> {
        self.guards.iter().find(|g| g.sequencer().name == name)
    }

    /// Each lock's fencing token, in the order asked.
    pub fn tokens(&self) -> Vec<Token> {
        self.guards.iter().map(LockGuard::token).collect()
    }

    /// Each lock's sequencer, in the order asked.
    pub fn sequencers(&self) -> Vec<&Sequencer> {
        self.guards.iter().map(LockGuard::sequencer).collect()
    }

    /// True while this client can vouch that it holds every lock (see
    /// [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves once any of the locks can no longer be relied on.
    pub async fn lost(&self) {
        if self.guards.is_empty() {
            return;
        }
        select_all(self.guards.iter().map(|g| g.lost().boxed())).await;
    }

    /// Release every lock in one step. A lock whose grant no longer held
    /// (its lease ran out) is not an error. If the cluster does not answer
    /// in time, the error is returned and the release is retried in the
    /// background. Cancel-safe, like [`LockGuard::release`].
    pub async fn release(self) -> Result<(), Error> {
        let Some((owner, grants, sequencers)) = self.take_release() else {
            return Ok(());
        };
        let session = self.session.clone();
        detached::finish(async move {
            release_all(&session, owner, &sequencers, Some(&grants)).await?;
            Ok(())
        })
        .await
    }

    /// Take the release over from the guards: (owner, grant table, the
    /// grants not released yet), or `None` if there is nothing to release.
    fn take_release(&self) -> Option<(u64, super::guard::Grants, Vec<Sequencer>)> {
        let first = self.guards.first()?;
        let sequencers: Vec<Sequencer> = self
            .guards
            .iter()
            .filter(|g| g.take_release())
            .map(|g| g.sequencer().clone())
            .collect();
        if sequencers.is_empty() {
            return None;
        }
        Some((first.owner(), first.grants().clone(), sequencers))
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        if !self.session.is_live() {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let Some((owner, grants, sequencers)) = self.take_release() else {
            return;
        };
        let session = self.session.clone();
        handle.spawn(async move {
            if let Err(e) = release_all(&session, owner, &sequencers, Some(&grants)).await {
                tracing::warn!(error = %e, "background release of a multi-lock failed");
            }
        });
    }
}

impl std::fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("guards", &self.guards)
            .finish()
    }
}
