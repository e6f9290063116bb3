//! The disk's durable-write rate: how many `write(4 KiB) + fdatasync` a second
//! one thread gets, appending to a file in the benchmark's data directory.
//! That is the ceiling of a store that fsyncs once per write; group commit
//! (one fsync for every write queued meanwhile) is how latchkey gets past it.

use std::fs::{self, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Bytes written before each fdatasync (one page, like a small log append).
pub const BLOCK: usize = 4096;
/// The probe file wraps around to its start past this size.
const MAX_FILE: u64 = 256 * 1024 * 1024;

/// What the fsync probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct FsyncRate {
    pub syncs: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub block_bytes: usize,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// Append `BLOCK` bytes and `File::sync_data` (fdatasync) in a loop for
/// about `duration`, in `dir`; the probe file is removed afterwards.
pub fn measure(dir: &Path, duration: Duration) -> Result<FsyncRate, String> {
    let path = dir.join("fsync-probe");
    let result = probe(&path, duration);
    let _ = fs::remove_file(&path);
    result
}

fn probe(path: &Path, duration: Duration) -> Result<FsyncRate, String> {
    let err =
        |what: &str, e: std::io::Error| format!("fsync probe: {what} {}: {e}", path.display());
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .map_err(|e| err("cannot create", e))?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| format!("fsync probe: histogram: {e}"))?;
    let block = vec![0xA5u8; BLOCK];
    let mut written: u64 = 0;
    let mut syncs: u64 = 0;
    let started = Instant::now();
    while started.elapsed() < duration {
        if written >= MAX_FILE {
            file.seek(SeekFrom::Start(0))
                .map_err(|e| err("cannot rewind", e))?;
            written = 0;
        }
        let t0 = Instant::now();
        file.write_all(&block).map_err(|e| err("cannot write", e))?;
        file.sync_data().map_err(|e| err("cannot fdatasync", e))?;
        hist.saturating_record(micros(t0.elapsed()));
        written += BLOCK as u64;
        syncs += 1;
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(FsyncRate {
        syncs,
        seconds,
        per_second: syncs as f64 / seconds.max(1e-9),
        block_bytes: BLOCK,
        p50_us: hist.value_at_quantile(0.50),
        p99_us: hist.value_at_quantile(0.99),
        max_us: hist.max(),
    })
}

/// Whole microseconds, at least 1 (the histograms' lowest value).
pub fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}
