//! Semaphores: [`Semaphore`], at most N holders of one name at once, each
//! permit with its own fencing token.
//!
//! A semaphore is a lock whose grants are shared permits and whose record
//! says how many may be held at once (the core's `lock_table` has the
//! rules): waiting is FIFO without polling, a permit is bound to its
//! session (a dead holder's permit returns when its session ends, it never
//! leaks), and the permit count is fixed while the semaphore is in use (an
//! acquire with another count, or a plain lock acquire of the name, is
//! refused with `PermitsMismatch`). A write fenced with a permit's
//! sequencer applies only while that permit is held.
//!
//! Imports `session`, `guard`, `handle` (this file is after them).
//!
//! ```no_run
//! # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
//! use std::time::Duration;
//!
//! let session = client.session(Duration::from_secs(10)).await?;
//! let pool = session.semaphore("db-connections", 4);
//! let permit = pool.acquire().await?; // one of 4, FIFO
//! permit.put("db/last-user", "me").await?; // fenced by this permit's token
//! permit.release().await?;
//! # Ok(()) }
//! ```

use std::time::Duration;

use super::guard::LockGuard;
use super::handle::Lock;
use super::session::Session;
use crate::error::Error;

/// A semaphore of `permits` permits named `name`, used from one session.
/// Each acquire is a new holder (its own permit, its own token), so one
/// handle can hold several permits.
#[derive(Debug, Clone)]
pub struct Semaphore {
    session: Session,
    name: String,
    permits: u32,
    lock_delay: Option<Duration>,
}

impl Session {
    /// The semaphore `name` with `permits` permits (1 to 1,024; any lock
    /// name's rules). Every user of the name must give the same count
    /// while it is in use.
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore {
            session: self.clone(),
            name: name.into(),
            permits,
            lock_delay: None,
        }
    }
}

impl Semaphore {
    /// After a permit's session expires, keep that permit unavailable for
    /// `delay` (up to 1 min), so a holder that was cut off has time to
    /// notice before another takes its place.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = Some(delay);
        self
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// A new holder's lock handle for one permit.
    fn holder(&self) -> Lock {
        let lock = self
            .session
            .lock(self.name.clone())
            .shared()
            .with_permits(self.permits);
        match self.lock_delay {
            Some(d) => lock.lock_delay(d),
            None => lock,
        }
    }

    /// Wait in FIFO order, as long as it takes, for a permit.
    pub async fn acquire(&self) -> Result<LockGuard, Error> {
        self.holder().acquire().await
    }

    /// A permit if one is free now and nobody waits: `None` otherwise.
    pub async fn try_acquire(&self) -> Result<Option<LockGuard>, Error> {
        self.holder().try_acquire().await
    }

    /// Wait at most `wait` for a permit: `None` if none came by then.
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<Option<LockGuard>, Error> {
        self.holder().acquire_timeout(wait).await
    }
}
