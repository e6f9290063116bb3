//! The one clock every process of a run stamps its events with.

/// CLOCK_MONOTONIC in nanoseconds. The controller and every worker process
/// read the same system-wide clock, so their events merge into one real-time
/// order; it never goes back, and it keeps counting while a process is
/// stopped (SIGSTOP), which is what a pause must look like in the history.
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn never_goes_back() {
        let mut last = super::now_ns();
        for _ in 0..1000 {
            let now = super::now_ns();
            assert!(now >= last);
            last = now;
        }
        assert!(last > 0);
    }
}
