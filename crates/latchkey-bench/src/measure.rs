//! What every workload shares: the benchmark's clients, per-task statistics
//! (an HDR histogram, success and error counts), and one run's result.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use latchkey::{Client, ClientOptions, TlsOptions};
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::args::ClientMode;
use crate::fsync::micros;
use crate::lock::LockDetail;

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

impl Latency {
    pub fn of(h: &Histogram<u64>) -> Latency {
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
}

/// One (workload, clients) run.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    /// "put", "get", "lock-cycle" or "contended".
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
    /// The lock workloads' breakdown and safety checks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock: Option<LockDetail>,
}

/// The clients the tasks use: one shared, or one per task.
pub struct Clients {
    mode: ClientMode,
    list: Vec<Client>,
}

/// How the clients send: on call streams or unary, writes retry-safe or
/// plain.
#[derive(Debug, Clone, Copy)]
pub struct ClientShape {
    pub unary: bool,
    pub plain_writes: bool,
}

fn options(shape: ClientShape, tls: Option<TlsOptions>) -> ClientOptions {
    let options = ClientOptions::default()
        .with_request_timeout(REQUEST_TIMEOUT)
        .with_attempt_timeout(Duration::from_secs(3))
        .with_connect_timeout(Duration::from_secs(1))
        .with_call_stream(!shape.unary)
        .with_retry_safe_writes(!shape.plain_writes);
    match tls {
        Some(tls) => options.with_tls(tls),
        None => options,
    }
}

impl Clients {
    /// Build the clients for up to `max_tasks` tasks and warm them up: one
    /// put through the first, then a linearizable get through every one, so
    /// connections are open and the leader known before anything is timed.
    pub async fn connect(
        endpoints: &[String],
        mode: ClientMode,
        shape: ClientShape,
        tls: Option<TlsOptions>,
        max_tasks: usize,
    ) -> Result<Clients, String> {
        let count = match mode {
            ClientMode::Shared => 1,
            ClientMode::PerTask => max_tasks.max(1),
        };
        let mut list = Vec::with_capacity(count);
        for _ in 0..count {
            list.push(
                Client::with_options(endpoints, options(shape, tls.clone()))
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

    pub fn for_task(&self, task: usize) -> Client {
        match self.mode {
            ClientMode::Shared => self.list[0].clone(),
            ClientMode::PerTask => self.list[task % self.list.len()].clone(),
        }
    }
}

/// What one task measured: the latency of each successful operation, and
/// the failures.
pub struct TaskStats {
    pub hist: Histogram<u64>,
    pub ok: u64,
    pub errors: u64,
    pub first_error: Option<String>,
}

impl TaskStats {
    pub fn new() -> Result<TaskStats, String> {
        Ok(TaskStats {
            hist: new_histogram()?,
            ok: 0,
            errors: 0,
            first_error: None,
        })
    }

    pub fn success(&mut self, latency: Duration) {
        self.hist.saturating_record(micros(latency));
        self.ok += 1;
    }

    pub fn failure(&mut self, message: impl FnOnce() -> String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message());
        }
    }
}

/// 1 µs to 60 s at 3 significant digits.
pub fn new_histogram() -> Result<Histogram<u64>, String> {
    Histogram::new_with_bounds(1, 60_000_000, 3).map_err(|e| format!("histogram: {e}"))
}

/// `a` plus everything recorded in `b`.
pub fn merge_into(a: &mut Histogram<u64>, b: &Histogram<u64>) -> Result<(), String> {
    a.add(b)
        .map_err(|e| format!("cannot merge histograms: {e:?}"))
}

/// Wait for every task of a run; what each returned, in task order.
pub async fn join_all<T>(workload: &str, handles: Vec<JoinHandle<T>>) -> Result<Vec<T>, String> {
    let mut all = Vec::with_capacity(handles.len());
    for h in handles {
        all.push(
            h.await
                .map_err(|e| format!("a {workload} task failed: {e}"))?,
        );
    }
    Ok(all)
}

/// Merge what the tasks of a run measured, `started` being when the first
/// task started; call it as soon as the last task ended.
pub fn summarize<'a>(
    workload: &'static str,
    tasks: usize,
    started: Instant,
    stats: impl IntoIterator<Item = &'a TaskStats>,
) -> Result<RunResult, String> {
    let seconds = started.elapsed().as_secs_f64();
    let mut hist = new_histogram()?;
    let (mut ops, mut errors, mut first_error) = (0, 0, None);
    for s in stats {
        merge_into(&mut hist, &s.hist)?;
        ops += s.ok;
        errors += s.errors;
        if first_error.is_none() {
            first_error.clone_from(&s.first_error);
        }
    }
    Ok(RunResult {
        workload,
        clients: tasks,
        ops,
        errors,
        seconds,
        ops_per_s: ops as f64 / seconds.max(1e-9),
        latency_us: Latency::of(&hist),
        first_error,
        lock: None,
    })
}

/// One line on stderr about a finished run.
pub fn progress(r: &RunResult) {
    eprintln!(
        "latchkey-bench:   {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
        r.ops_per_s,
        r.latency_us.p50_us as f64 / 1000.0,
        r.latency_us.p99_us as f64 / 1000.0,
        r.errors
    );
}

/// The median of `values` (the lower middle one of an even count; 0 for
/// none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n => values[(n - 1) / 2],
    }
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_is_the_lower_middle() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
