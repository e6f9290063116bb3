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
//! Settled here:
//! - The first user of a free name sets the count: a user with a wrong
//!   count that comes first makes everyone else's acquires fail with
//!   `PermitsMismatch` until it is done. Configure the count in one place.
//! - No lock-delay: a permit is shared with other holders, so a delay
//!   could only block the whole semaphore or none of it. A dead holder's
//!   permit is free again as soon as its session ends; fence what the
//!   holders write.
//! - Permits' tokens grow with each grant, but several permits are current
//!   at once: a store that keeps only the highest token seen (a
//!   `FenceGate`) would refuse an older permit still held. Fence with the
//!   cluster (`LockGuard::put` and friends, which check the permit itself)
//!   or keep one gate resource per permit holder.
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
        }
    }
}

impl Semaphore {
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
        self.session
            .lock(self.name.clone())
            .shared()
            .with_permits(self.permits)
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
