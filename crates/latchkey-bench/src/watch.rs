//! The watch workload: what watchers cost the writes, and how soon a
//! watcher hears of a write.
//!
//! 1. `put-unwatched`: `--clients` tasks (default 64) putting distinct keys under
//!    [`PREFIX`] for the duration, nobody watching; `put-watched`: the same
//!    while `--watchers` watchers (default 1,000) follow the prefix. Run
//!    twice, interleaved (unwatched, watched, unwatched, watched), so that
//!    the ratio of the medians compares runs that saw the same disk.
//! 2. `event-delay`: for every change every watcher received during the
//!    watched runs, the time from the put's acknowledgement to the watcher
//!    receiving it. A change that arrives before the writer hears back
//!    counts as 0: the replica serving the watch may apply the write before
//!    the leader's answer reaches the writer.
//! 3. `put-1w` and `event-delay-1w`: one writer, one watcher.
//!
//! Watchers are spread over clients of [`WATCHERS_PER_CLIENT`] each (a
//! client has one connection per replica), each client trying the replicas
//! in a different order, so that the leader and both followers serve
//! watches.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use latchkey::{Client, ClientOptions, Selection, WatchMessage};
use serde::Serialize;
use tokio::sync::watch;

use crate::args::Options;
use crate::kv::make_value;
use crate::measure::{
    join_all, progress, summarize, Clients, RunResult, TaskStats, REQUEST_TIMEOUT,
};
use crate::report::{self, Params};
use crate::testbed::{setup_budget, Testbed};

/// The watched prefix.
const PREFIX: &str = "bench/watch/";
/// Watches per client (one connection per replica each).
const WATCHERS_PER_CLIENT: usize = 250;
/// Acknowledgement slots per writer task and run: puts past it are not
/// matched (a writer on this machine does well under 1,000 puts a second).
const SLOTS: usize = 1 << 15;
/// How long watchers may take to open, and to drain after a run.
const SETTLE: Duration = Duration::from_secs(30);

/// The watch benchmark's own parameters.
#[derive(Debug, Clone, Serialize)]
pub struct WatchParams {
    pub watchers: usize,
    pub writers: usize,
    pub value_size: usize,
    /// put/s with the watchers over put/s without, median of each.
    pub put_ratio: Option<f64>,
}

impl Params for WatchParams {
    fn describe(&self) -> String {
        format!(
            "{} watchers on one prefix, {} writers, {}-byte values",
            self.watchers, self.writers, self.value_size
        )
    }

    fn notes(&self, _results: &[RunResult]) -> String {
        let mut t = String::new();
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "event-delay: OPS = changes received by all watchers; latency = put acknowledged -> \
             change received (0 if it came first)"
        );
        if let Some(r) = self.put_ratio {
            let _ = writeln!(
                t,
                "put/s with {} watchers over put/s with none (median of two runs each): {r:.2}",
                self.watchers
            );
        }
        t
    }
}

/// When each put was acknowledged: nanoseconds since `epoch` plus one (0:
/// not yet), by writer task and sequence number.
struct Acks {
    epoch: Instant,
    run: u64,
    slots: Vec<AtomicU64>,
}

impl Acks {
    fn new(run: u64, writers: usize) -> Acks {
        Acks {
            epoch: Instant::now(),
            run,
            slots: (0..writers * SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn key(&self, task: usize, seq: usize) -> String {
        format!("{PREFIX}r{}/t{task:03}/{seq:08}", self.run)
    }

    /// The slot of a key of this run, if it is one.
    fn slot(&self, key: &[u8]) -> Option<usize> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(PREFIX)?.strip_prefix('r')?;
        let (run, rest) = rest.split_once("/t")?;
        if run.parse::<u64>().ok()? != self.run {
            return None;
        }
        let (task, seq) = rest.split_once('/')?;
        let (task, seq): (usize, usize) = (task.parse().ok()?, seq.parse().ok()?);
        (seq < SLOTS).then_some(task * SLOTS + seq)
    }

    fn acked(&self, slot: usize) {
        if let Some(s) = self.slots.get(slot) {
            s.store(self.now().saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Acknowledgement to now, or zero if not acknowledged yet.
    fn delay(&self, slot: usize, now: u64) -> Duration {
        let acked = self
            .slots
            .get(slot)
            .map_or(0, |s| s.load(Ordering::Relaxed));
        if acked == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(now.saturating_sub(acked - 1))
    }
}

/// The watch benchmark: a testbed, the interleaved put runs, the one-writer
/// run, the report.
pub async fn bench(opts: &Options) -> Result<(), String> {
    let mut bed = Testbed::start("watch", opts).await?;
    let writers = opts.watch_writers();
    let clients = bed.clients(opts, writers).await?;
    let value = Arc::new(make_value(opts.value_size));
    let watchers = opts.watchers;
    let mut results = Vec::new();
    let (mut unwatched, mut watched) = (Vec::new(), Vec::new());
    let mut delays = Vec::new();
    for round in 0..2u64 {
        eprintln!("latchkey-bench: put, {writers} writers, no watchers");
        let plain = puts(&clients, writers, opts.duration, &value, 2 * round).await?;
        progress(&plain);
        unwatched.push(plain.ops_per_s);
        results.push(plain);
        bed.check_alive()?;

        eprintln!("latchkey-bench: put, {writers} writers, {watchers} watchers");
        let (put, delay) = watched_puts(
            &bed,
            &clients,
            watchers,
            writers,
            opts.duration,
            &value,
            2 * round + 1,
        )
        .await?;
        progress(&put);
        progress(&delay);
        watched.push(put.ops_per_s);
        results.push(put);
        delays.push(delay);
        bed.check_alive()?;
    }
    results.extend(delays);

    eprintln!("latchkey-bench: one writer, one watcher");
    let (put, delay) = watched_puts(&bed, &clients, 1, 1, opts.duration, &value, 4).await?;
    progress(&put);
    progress(&delay);
    results.push(RunResult {
        workload: "put-1w",
        ..put
    });
    results.push(RunResult {
        workload: "event-delay-1w",
        ..delay
    });
    bed.check_alive()?;
    drop(clients);

    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        v.get(v.len() / 2).copied()
    };
    let put_ratio = match (median(&watched), median(&unwatched)) {
        (Some(w), Some(u)) if u > 0.0 => Some(w / u),
        _ => None,
    };
    let params = WatchParams {
        watchers,
        writers,
        value_size: opts.value_size,
        put_ratio,
    };
    let report = bed.finish("watch", opts, params, results);
    report::publish(&report, &opts.out)
}

/// An upper bound of a healthy watch benchmark.
pub fn budget(opts: &Options) -> Duration {
    let per_run = opts.duration + REQUEST_TIMEOUT + Duration::from_secs(5);
    setup_budget() + (per_run + SETTLE * 2).saturating_mul(5)
}

/// `writers` tasks putting distinct keys of run `run` for `duration`,
/// nobody watching.
async fn puts(
    clients: &Clients,
    writers: usize,
    duration: Duration,
    value: &Arc<Vec<u8>>,
    run: u64,
) -> Result<RunResult, String> {
    let acks = Arc::new(Acks::new(run, writers));
    let put = puts_with(clients, writers, duration, value, &acks).await?;
    Ok(RunResult {
        workload: "put-unwatched",
        ..put
    })
}

/// `watchers` watchers on [`PREFIX`] from the current revision, then the
/// puts of run `run`; the puts' result and the event delays.
async fn watched_puts(
    bed: &Testbed,
    clients: &Clients,
    watchers: usize,
    writers: usize,
    duration: Duration,
    value: &Arc<Vec<u8>>,
    run: u64,
) -> Result<(RunResult, RunResult), String> {
    let endpoints = bed.endpoints();
    let from = clients
        .for_task(0)
        .put(format!("{PREFIX}mark/{run}"), "open")
        .await
        .map_err(|e| format!("marker put failed: {e}"))?;
    let acks = Arc::new(Acks::new(run, writers));
    let ready = Arc::new(AtomicUsize::new(0));
    let (stop_tx, stop) = watch::channel(false);
    let mut handles = Vec::with_capacity(watchers);
    let mut watch_clients = Vec::new();
    for w in 0..watchers {
        if w % WATCHERS_PER_CLIENT == 0 {
            let mut order = endpoints.clone();
            let turn = (w / WATCHERS_PER_CLIENT) % order.len().max(1);
            order.rotate_left(turn);
            let mut options = ClientOptions::default().with_request_timeout(REQUEST_TIMEOUT);
            if let Some(tls) = bed.tls() {
                options = options.with_tls(tls.clone());
            }
            watch_clients.push(
                Client::with_options(&order, options)
                    .map_err(|e| format!("cannot build a watch client: {e}"))?,
            );
        }
        let client = watch_clients
            .last()
            .cloned()
            .ok_or("no watch client was built")?;
        handles.push(tokio::spawn(follow(
            client,
            from,
            Arc::clone(&acks),
            Arc::clone(&ready),
            stop.clone(),
            TaskStats::new()?,
        )));
    }
    // Every watcher has its stream open once it has seen the marker.
    let opened = Instant::now();
    while ready.load(Ordering::Relaxed) < watchers {
        if opened.elapsed() > SETTLE {
            let _ = stop_tx.send(true);
            return Err(format!(
                "only {} of {watchers} watches opened within {SETTLE:?}",
                ready.load(Ordering::Relaxed)
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let put = puts_with(clients, writers, duration, value, &acks).await?;
    // Let the watchers take what is still on its way, then stop them.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = stop_tx.send(true);
    let started = Instant::now();
    let done = join_all("watch", handles).await?;
    let mut delay = summarize("event-delay", watchers, started, &done)?;
    delay.seconds = put.seconds;
    delay.ops_per_s = delay.ops as f64 / put.seconds.max(1e-9);
    Ok((
        RunResult {
            workload: "put-watched",
            ..put
        },
        delay,
    ))
}

/// `writers` tasks putting distinct keys for `duration`, each
/// acknowledgement noted in `acks` (the watchers read it).
async fn puts_with(
    clients: &Clients,
    writers: usize,
    duration: Duration,
    value: &Arc<Vec<u8>>,
    acks: &Arc<Acks>,
) -> Result<RunResult, String> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::with_capacity(writers);
    for task in 0..writers {
        let client = clients.for_task(task);
        let value = Arc::clone(value);
        let acks = Arc::clone(acks);
        let mut stats = TaskStats::new()?;
        handles.push(tokio::spawn(async move {
            let mut seq = 0usize;
            while Instant::now() < deadline {
                let key = acks.key(task, seq);
                let t0 = Instant::now();
                match client.put(&key, value.as_slice()).await {
                    Ok(_) => {
                        acks.acked(task * SLOTS + seq);
                        stats.success(t0.elapsed());
                    }
                    Err(e) => stats.failure(|| e.to_string()),
                }
                seq += 1;
            }
            stats
        }));
    }
    let done = join_all("put", handles).await?;
    summarize("put", writers, started, &done)
}

/// One watcher: each change of the current run it receives is an event,
/// its delay from the put's acknowledgement recorded.
async fn follow(
    client: Client,
    from: u64,
    acks: Arc<Acks>,
    ready: Arc<AtomicUsize>,
    mut stop: watch::Receiver<bool>,
    mut stats: TaskStats,
) -> TaskStats {
    let mut stream = client.watch(Selection::prefix(PREFIX)).from_revision(from);
    let mut opened = false;
    loop {
        let message = tokio::select! {
            m = stream.next() => m,
            _ = stop.wait_for(|s| *s) => break,
        };
        match message {
            Some(Ok(WatchMessage::Changes { changes, .. })) => {
                let now = acks.now();
                if !opened {
                    opened = true;
                    ready.fetch_add(1, Ordering::Relaxed);
                }
                for change in changes {
                    if let Some(slot) = acks.slot(&change.key) {
                        stats.success(acks.delay(slot, now));
                    }
                }
            }
            Some(Ok(WatchMessage::Progress { .. })) => {}
            Some(Err(e)) => stats.failure(|| e.to_string()),
            None => break,
        }
    }
    stats
}
