//! The clock a client judges its leases on.
//!
//! `Instant` is CLOCK_MONOTONIC on Linux, which stops while the machine is
//! suspended (a laptop lid, a VM paused for a snapshot or a migration);
//! the cluster's clocks do not. A client that judged its lease on
//! CLOCK_MONOTONIC alone would wake from a 30-second suspend still believing
//! in a 10-second lease, and `is_held()` would say true about a lock that
//! another process holds by now. [`now`] is `Instant::now()` moved forward
//! by the time the machine spent suspended since the first call (measured as
//! the growth of CLOCK_BOOTTIME - CLOCK_MONOTONIC), so leases run out across
//! a suspend as they do on the cluster.
//!
//! Where CLOCK_BOOTTIME is missing (not Linux), `now` is `Instant::now()`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// CLOCK_BOOTTIME - CLOCK_MONOTONIC, in nanoseconds: the time spent
/// suspended since boot. The two clocks cannot be read at once: BOOTTIME is
/// read between two MONOTONIC reads, and a reading whose window is wider
/// than 50 µs (the thread was preempted) is taken again, a few times. The
/// difference uses the earlier MONOTONIC read, so an error can only make
/// the suspended time look longer, and leases shorter.
#[cfg(target_os = "linux")]
fn suspended_since_boot() -> Option<u64> {
    fn read(clock: libc::clockid_t) -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            return None;
        }
        let secs = u64::try_from(ts.tv_sec).ok()?;
        let nanos = u64::try_from(ts.tv_nsec).ok()?;
        Some(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
    }
    const TIGHT_NS: u64 = 50_000;
    let mut best: Option<(u64, u64)> = None; // (window, boot - mono)
    for _ in 0..5 {
        let before = read(libc::CLOCK_MONOTONIC)?;
        let boot = read(libc::CLOCK_BOOTTIME)?;
        let after = read(libc::CLOCK_MONOTONIC)?;
        let window = after.saturating_sub(before);
        let offset = boot.saturating_sub(before);
        if best.is_none_or(|(w, _)| window < w) {
            best = Some((window, offset));
        }
        if window <= TIGHT_NS {
            break;
        }
    }
    best.map(|(_, offset)| offset)
}

#[cfg(not(target_os = "linux"))]
fn suspended_since_boot() -> Option<u64> {
    None
}

/// The suspended time at the first call.
fn base() -> Option<u64> {
    static BASE: OnceLock<Option<u64>> = OnceLock::new();
    *BASE.get_or_init(suspended_since_boot)
}

/// Time spent suspended since the first call of this function (or of
/// [`now`]). Suspended time only grows, so this never goes back: it is the
/// largest reading so far, which keeps [`now`] monotonic too.
pub(super) fn suspended() -> Duration {
    static MAX: AtomicU64 = AtomicU64::new(0);
    let reading = match (base(), suspended_since_boot()) {
        (Some(base), Some(now)) => now.saturating_sub(base),
        _ => 0,
    };
    let max = MAX.fetch_max(reading, Ordering::Relaxed).max(reading);
    Duration::from_nanos(max)
}

/// Now on the lease clock: `Instant::now()` plus the time spent suspended
/// since the first call. Compare it only with other instants from this
/// function.
pub(super) fn now() -> Instant {
    // Read the suspended time first: the instant taken after it can only be
    // later, so a lease never looks longer than it is.
    let suspended = suspended();
    Instant::now() + suspended
}

/// A Tokio timer deadline for the lease-clock instant `at`. Tokio's timers
/// run on the monotonic clock, so the time already spent suspended is taken
/// off; a suspend while the timer waits makes it fire late, which is why
/// lease checks compare [`now`] again when a timer fires.
pub(super) fn timer(at: Instant) -> tokio::time::Instant {
    let monotonic = at.checked_sub(suspended()).unwrap_or(at);
    tokio::time::Instant::from_std(monotonic)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_suspend_it_is_the_monotonic_clock() {
        let _ = now();
        let before = Instant::now();
        let n = now();
        let after = Instant::now();
        // No suspend happens during a test run; a preempted reading can
        // only move the clock forward, and by little.
        assert!(n >= before);
        assert!(n <= after + Duration::from_millis(100));
        assert!(suspended() < Duration::from_millis(100));
    }

    #[test]
    fn timers_are_on_the_monotonic_clock() {
        let at = now() + Duration::from_secs(5);
        let t = timer(at).into_std();
        let d = t.saturating_duration_since(Instant::now());
        assert!(d <= Duration::from_secs(5) && d > Duration::from_secs(4));
    }

    #[test]
    fn never_goes_back() {
        let mut last = now();
        for _ in 0..10_000 {
            let n = now();
            assert!(n >= last);
            last = n;
        }
    }
}
