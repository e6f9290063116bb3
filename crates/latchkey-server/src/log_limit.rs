//! [`LogLimit`]: at most one log line per interval for a kind of refusal, so
//! that a flood of bad connections or forged calls does not become a flood
//! of log lines.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds between two lines of one kind.
pub(crate) const EVERY_SECS: u64 = 10;

/// When a line of this kind was last allowed (seconds since the epoch).
pub(crate) struct LogLimit(AtomicU64);

impl LogLimit {
    pub(crate) const fn new() -> LogLimit {
        LogLimit(AtomicU64::new(0))
    }

    /// Whether a line may be logged now: true at most once every
    /// [`EVERY_SECS`], also across threads.
    pub(crate) fn allow(&self) -> bool {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last = self.0.load(Ordering::Relaxed);
        now >= last + EVERY_SECS
            && self
                .0
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval() {
        let limit = LogLimit::new();
        assert!(limit.allow());
        assert!(!limit.allow());
        assert!(!limit.allow());
    }
}
