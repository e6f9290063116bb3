//! The kv workload: for each client count C, C tasks doing puts of distinct
//! keys for the duration, then C tasks doing linearizable gets of keys that
//! exist, every operation's latency recorded in an HDR histogram.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use latchkey::{Client, ClientOptions};
use serde::Serialize;

use crate::args::ClientMode;
use crate::fsync::micros;

/// Per-request deadline of the benchmark's clients. It bounds how far past
/// its duration a run can go when the cluster stops answering.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Latency percentiles of one run, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

/// One (workload, clients) run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// "put" or "get".
    pub workload: &'static str,
    pub clients: usize,
    /// Operations that succeeded (only these are in the latency histogram).
    pub ops: u64,
    pub errors: u64,
    /// Wall time from the first task's start to the last task's end.
    pub seconds: f64,
    /// Successful operations per second of wall time.
    pub ops_per_s: f64,
    pub latency_us: Latency,
    /// The first error seen, to tell what went wrong.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// The clients the tasks use: one shared, or one per task.
pub struct Clients {
    mode: ClientMode,
    list: Vec<Client>,
}

fn options() -> ClientOptions {
    ClientOptions {
        request_timeout: REQUEST_TIMEOUT,
        attempt_timeout: Duration::from_secs(3),
        connect_timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    }
}

impl Clients {
    /// Build the clients for up to `max_tasks` tasks and warm them up: one
    /// put through the first, then a linearizable get through every one, so
    /// connections are open and the leader known before anything is timed.
    pub async fn connect(
        endpoints: &[String],
        mode: ClientMode,
        max_tasks: usize,
    ) -> Result<Clients, String> {
        let count = match mode {
            ClientMode::Shared => 1,
            ClientMode::PerTask => max_tasks.max(1),
        };
        let mut list = Vec::with_capacity(count);
        for _ in 0..count {
            list.push(
                Client::with_options(endpoints, options())
                    .map_err(|e| format!("cannot build a client: {e}"))?,
            );
        }
        let first = list
            .first()
            .ok_or_else(|| "no client was built".to_string())?;
        first
            .put("bench/warmup", "ready")
            .await
            .map_err(|e| format!("warm-up put failed: {e}"))?;
        let mut warmups = Vec::with_capacity(list.len());
        for c in &list {
            let c = c.clone();
            warmups.push(tokio::spawn(async move { c.get("bench/warmup").await }));
        }
        for w in warmups {
            match w.await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return Err("warm-up get did not see the warm-up put".into()),
                Ok(Err(e)) => return Err(format!("warm-up get failed: {e}")),
                Err(e) => return Err(format!("warm-up task failed: {e}")),
            }
        }
        Ok(Clients { mode, list })
    }

    fn for_task(&self, task: usize) -> Client {
        match self.mode {
            ClientMode::Shared => self.list[0].clone(),
            ClientMode::PerTask => self.list[task % self.list.len()].clone(),
        }
    }
}

/// What one task measured.
struct TaskStats {
    hist: Histogram<u64>,
    ok: u64,
    errors: u64,
    first_error: Option<String>,
    written: Vec<Vec<u8>>,
}

impl TaskStats {
    fn new() -> Result<TaskStats, String> {
        Ok(TaskStats {
            hist: new_histogram()?,
            ok: 0,
            errors: 0,
            first_error: None,
            written: Vec::new(),
        })
    }

    fn success(&mut self, latency: Duration) {
        self.hist.saturating_record(micros(latency));
        self.ok += 1;
    }

    fn failure(&mut self, message: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }
}

/// 1 µs to 60 s at 3 significant digits.
fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| format!("histogram: {e}"))
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
        let mut stats = TaskStats::new()?;
        handles.push(tokio::spawn(async move {
            let mut seq: u64 = 0;
            while Instant::now() < deadline {
                let key = format!("bench/kv/c{tasks:04}/t{task:04}/{seq:010}").into_bytes();
                seq += 1;
                let t0 = Instant::now();
                match client.put(&key, value.as_slice()).await {
                    Ok(()) => {
                        stats.success(t0.elapsed());
                        stats.written.push(key);
                    }
                    Err(e) => stats.failure(|| e.to_string()),
                }
            }
            stats
        }));
    }
    let (result, mut stats) = collect("put", tasks, started, handles).await?;
    let written = stats.iter_mut().flat_map(|s| s.written.drain(..)).collect();
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
            latency_us: latency(&new_histogram()?),
            first_error: Some("no key was written, so there is nothing to read".into()),
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
    Ok(collect("get", tasks, started, handles).await?.0)
}

/// Wait for every task and merge what they measured.
async fn collect(
    workload: &'static str,
    tasks: usize,
    started: Instant,
    handles: Vec<tokio::task::JoinHandle<TaskStats>>,
) -> Result<(RunResult, Vec<TaskStats>), String> {
    let mut all = Vec::with_capacity(handles.len());
    for h in handles {
        all.push(
            h.await
                .map_err(|e| format!("a {workload} task failed: {e}"))?,
        );
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut hist = new_histogram()?;
    let (mut ops, mut errors, mut first_error) = (0, 0, None);
    for s in &all {
        hist.add(&s.hist)
            .map_err(|e| format!("cannot merge histograms: {e:?}"))?;
        ops += s.ok;
        errors += s.errors;
        if first_error.is_none() {
            first_error.clone_from(&s.first_error);
        }
    }
    let result = RunResult {
        workload,
        clients: tasks,
        ops,
        errors,
        seconds,
        ops_per_s: ops as f64 / seconds.max(1e-9),
        latency_us: latency(&hist),
        first_error,
    };
    Ok((result, all))
}

fn latency(h: &Histogram<u64>) -> Latency {
    if h.is_empty() {
        return Latency {
            p50_us: 0,
            p90_us: 0,
            p99_us: 0,
            p999_us: 0,
            max_us: 0,
            mean_us: 0.0,
        };
    }
    Latency {
        p50_us: h.value_at_quantile(0.50),
        p90_us: h.value_at_quantile(0.90),
        p99_us: h.value_at_quantile(0.99),
        p999_us: h.value_at_quantile(0.999),
        max_us: h.max(),
        mean_us: h.mean(),
    }
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
