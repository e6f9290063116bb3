//! The kv workload: for each client count C, C tasks doing puts of distinct
//! keys for the duration, then C tasks doing linearizable gets of keys that
//! exist, every operation's latency recorded in an HDR histogram.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::args::Options;
use crate::measure::{
    join_all, new_histogram, progress, summarize, Clients, Latency, RunResult, TaskStats,
    REQUEST_TIMEOUT,
};
use crate::report::{self, KvParams};
use crate::testbed::{setup_budget, Testbed};

/// The kv benchmark: a testbed, puts then gets per client count, the report.
pub async fn bench(opts: &Options) -> Result<(), String> {
    let counts = opts.kv_clients();
    let mut bed = Testbed::start("kv", opts).await?;
    let max_tasks = counts.iter().copied().max().unwrap_or(1);
    let clients = bed.clients(opts, max_tasks).await?;

    let value = Arc::new(make_value(opts.value_size));
    // Every acknowledged key so far: the gets read among them.
    let mut keys: Arc<Vec<Vec<u8>>> = Arc::new(Vec::new());
    let mut results = Vec::with_capacity(counts.len() * 2);
    for &c in &counts {
        eprintln!(
            "latchkey-bench: put, {c} clients, {:.1}s...",
            opts.duration.as_secs_f64()
        );
        let (put, written) = run_puts(&clients, c, opts.duration, Arc::clone(&value)).await?;
        progress(&put);
        results.push(put);
        bed.check_alive()?;
        Arc::make_mut(&mut keys).extend(written);

        eprintln!(
            "latchkey-bench: get, {c} clients, {:.1}s...",
            opts.duration.as_secs_f64()
        );
        let get = run_gets(
            &clients,
            c,
            opts.duration,
            Arc::clone(&keys),
            opts.value_size,
        )
        .await?;
        progress(&get);
        results.push(get);
        bed.check_alive()?;
    }
    drop(clients);

    let params = KvParams {
        clients: counts,
        value_size: opts.value_size,
    };
    let report = bed.finish("kv", opts, params, results);
    report::publish(&report, &opts.out)
}

/// An upper bound of a healthy kv benchmark: start-up, and per client count
/// two runs that may each overrun by one request timeout; plus slack.
pub fn budget(opts: &Options) -> Duration {
    let per_run = opts.duration + REQUEST_TIMEOUT + Duration::from_secs(5);
    let runs = u32::try_from(opts.kv_clients().len() * 2).unwrap_or(u32::MAX);
    setup_budget() + per_run.saturating_mul(runs)
}

/// What one put or get task measured, and the keys it wrote.
struct KvTask {
    stats: TaskStats,
    written: Vec<Vec<u8>>,
}

/// `value_size` printable pseudo-random bytes (not one repeated byte, which
/// RocksDB's compression would shrink to nothing).
pub fn make_value(value_size: usize) -> Vec<u8> {
    let mut rng = XorShift::new(0x5eed);
    (0..value_size)
        .map(|_| b'a' + (rng.next_u64() % 26) as u8)
        .collect()
}

/// C tasks putting distinct keys for `duration`. Returns the run and the
/// keys that were written (acknowledged).
pub async fn run_puts(
    clients: &Clients,
    tasks: usize,
    duration: Duration,
    value: Arc<Vec<u8>>,
) -> Result<(RunResult, Vec<Vec<u8>>), String> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let client = clients.for_task(task);
        let value = Arc::clone(&value);
        let mut task_stats = KvTask {
            stats: TaskStats::new()?,
            written: Vec::new(),
        };
        handles.push(tokio::spawn(async move {
            let KvTask { stats, written } = &mut task_stats;
            let mut seq: u64 = 0;
            while Instant::now() < deadline {
                let key = format!("bench/kv/c{tasks:04}/t{task:04}/{seq:010}").into_bytes();
                seq += 1;
                let t0 = Instant::now();
                match client.put(&key, value.as_slice()).await {
                    Ok(_) => {
                        stats.success(t0.elapsed());
                        written.push(key);
                    }
                    Err(e) => stats.failure(|| e.to_string()),
                }
            }
            task_stats
        }));
    }
    let done = join_all("put", handles).await?;
    let result = summarize("put", tasks, started, done.iter().map(|t| &t.stats))?;
    let written = done.into_iter().flat_map(|t| t.written).collect();
    Ok((result, written))
}

/// C tasks reading random existing keys (linearizable) for `duration`; a
/// missing key or a value of the wrong size counts as an error.
pub async fn run_gets(
    clients: &Clients,
    tasks: usize,
    duration: Duration,
    keys: Arc<Vec<Vec<u8>>>,
    value_size: usize,
) -> Result<RunResult, String> {
    let started = Instant::now();
    if keys.is_empty() {
        return Ok(RunResult {
            workload: "get",
            clients: tasks,
            ops: 0,
            errors: 0,
            seconds: 0.0,
            ops_per_s: 0.0,
            latency_us: Latency::of(&new_histogram()?),
            first_error: Some("no key was written, so there is nothing to read".into()),
            lock: None,
        });
    }
    let deadline = started + duration;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let client = clients.for_task(task);
        let keys = Arc::clone(&keys);
        let mut stats = TaskStats::new()?;
        handles.push(tokio::spawn(async move {
            let mut rng = XorShift::new(task as u64 + 1);
            while Instant::now() < deadline {
                let key = &keys[(rng.next_u64() % keys.len() as u64) as usize];
                let t0 = Instant::now();
                match client.get(key).await {
                    Ok(Some(v)) if v.len() == value_size => stats.success(t0.elapsed()),
                    Ok(Some(v)) => stats.failure(|| {
                        format!(
                            "key {} holds {} bytes, {value_size} were written",
                            String::from_utf8_lossy(key),
                            v.len()
                        )
                    }),
                    Ok(None) => stats.failure(|| {
                        format!(
                            "acknowledged key {} is missing",
                            String::from_utf8_lossy(key)
                        )
                    }),
                    Err(e) => stats.failure(|| e.to_string()),
                }
            }
            stats
        }));
    }
    let done = join_all("get", handles).await?;
    summarize("get", tasks, started, &done)
}

/// xorshift64*: fast, deterministic, good enough to pick keys.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> XorShift {
        XorShift(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_have_the_asked_size_and_are_not_constant() {
        let v = make_value(128);
        assert_eq!(v.len(), 128);
        assert!(v.iter().any(|&b| b != v[0]));
        assert!(make_value(0).is_empty());
    }
}
