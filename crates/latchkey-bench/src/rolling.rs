//! The rolling-restart workload: how long client calls pause when every
//! replica in turn is stopped gracefully (SIGTERM, as a deploy or a kernel
//! update does it) and started again.
//!
//! On a fresh three-replica cluster, `--writers` tasks put keys without
//! pause and two tasks cycle locks of their own (acquire + release, each
//! in a session of its own). After `--settle` of quiet load, each round
//! restarts every replica in turn, followers first and the leader last:
//! SIGTERM, wait for it to exit, start it again, wait until it has caught
//! up. `--rounds` rounds (default 3), `--settle` of load after each.
//!
//! Results (stdout and `rolling.json` in `--out`): per round, the longest
//! put and the longest lock cycle that overlapped the round (the pause a
//! client saw), their p99; the calls that failed (any error, an unknown
//! outcome included: none should); and, after the load stops, the
//! acknowledged writes read back (lost ones: none should be). The client
//! is the one an application would use: it follows the leader and resends
//! a write under the same request id, so a stopped leader costs time, not
//! errors.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey::Client;
use serde::Serialize;

use crate::args::Options;
use crate::failover::{caught_up, client_with, leader_and_term, quantile};
use crate::testbed::{setup_budget, Testbed, LEADER_WAIT};

/// Rounds when `--rounds` is not given.
const DEFAULT_ROUNDS: usize = 3;
/// How long a stopped replica may take to exit.
const EXIT_WAIT: Duration = Duration::from_secs(20);
/// Lock-cycling tasks beside the writers.
const LOCK_TASKS: usize = 2;
/// Keys read back per request at the end.
const READ_BACK_CHUNK: usize = 500;

/// One call: when it began and how long it took.
type Timed = (Instant, Duration);

/// One restart of every replica.
#[derive(Debug, Clone, Serialize)]
struct Round {
    /// The replicas in the order they were restarted (the leader last).
    order: Vec<String>,
    /// From the first SIGTERM to the last replica caught up, in seconds.
    took_s: f64,
    /// The longest put that overlapped the round, in milliseconds.
    max_put_ms: f64,
    /// The 99th percentile of the puts that overlapped the round.
    p99_put_ms: f64,
    /// The longest lock cycle that overlapped the round, in milliseconds.
    max_cycle_ms: f64,
    /// Term increments over the round.
    elections: u64,
}

#[derive(Debug, Serialize)]
struct RollingReport {
    benchmark: &'static str,
    serve_args: Vec<String>,
    writers: usize,
    lock_tasks: usize,
    rounds: Vec<Round>,
    /// The median over rounds of the longest put.
    median_max_put_ms: f64,
    /// The longest put of all.
    max_put_ms: f64,
    /// Puts acknowledged, and lock cycles completed.
    puts: u64,
    cycles: u64,
    /// Calls that ended in an error (an unknown outcome included).
    failed_calls: u64,
    /// The first few failures, verbatim.
    failures: Vec<String>,
    /// Acknowledged writes not found when read back.
    lost_writes: u64,
}

/// What the load tasks share.
#[derive(Default)]
struct Load {
    puts: Mutex<Vec<Timed>>,
    cycles: Mutex<Vec<Timed>>,
    acked: Mutex<Vec<String>>,
    failures: Mutex<Vec<String>>,
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The rolling-restart benchmark (see the module docs).
pub async fn bench(opts: &Options) -> Result<(), String> {
    let mut bed = Testbed::start("rolling", opts).await?;
    let endpoints = bed.endpoints();
    let client = bed.patient_client()?;
    let status = client_with(&endpoints, bed.tls(), Duration::from_millis(500))?;
    let load = Arc::new(Load::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for task in 0..opts.failover_writers {
        tasks.push(tokio::spawn(put_loop(
            client.clone(),
            task,
            Arc::clone(&load),
            Arc::clone(&stop),
        )));
    }
    for task in 0..LOCK_TASKS {
        tasks.push(tokio::spawn(lock_loop(
            client.clone(),
            task,
            Arc::clone(&load),
            Arc::clone(&stop),
        )));
    }

    let mut rounds = Vec::new();
    let result = async {
        tokio::time::sleep(opts.settle).await;
        for round in 0..round_count(opts) {
            let (leader, term) = leader_and_term(&status, &endpoints).await?;
            let mut order: Vec<String> = endpoints
                .iter()
                .filter(|e| **e != leader)
                .cloned()
                .collect();
            order.push(leader);
            let started = Instant::now();
            for addr in &order {
                bed.cluster_mut().terminate(addr, EXIT_WAIT).await?;
                bed.cluster_mut().restart(addr)?;
                caught_up(&status, addr).await?;
            }
            let ended = Instant::now();
            let (_, new_term) = leader_and_term(&status, &endpoints).await?;
            tokio::time::sleep(opts.settle).await;
            let r = summarize(&load, &order, started, ended, new_term.saturating_sub(term));
            eprintln!(
                "latchkey-bench: round {}/{}: {:.1} s, longest put {:.0} ms (p99 {:.0} ms), \
                 longest lock cycle {:.0} ms, {} election(s)",
                round + 1,
                round_count(opts),
                r.took_s,
                r.max_put_ms,
                r.p99_put_ms,
                r.max_cycle_ms,
                r.elections
            );
            rounds.push(r);
        }
        Ok::<(), String>(())
    }
    .await;
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        let _ = task.await;
    }
    result.map_err(|e| format!("{e}\n{}", bed.logs_tail()))?;
    let acked = guard(&load.acked).clone();
    let lost = read_back(&client, &acked).await?;
    drop(bed);

    let mut maxima: Vec<f64> = rounds.iter().map(|r| r.max_put_ms).collect();
    maxima.sort_by(f64::total_cmp);
    let failures = guard(&load.failures).clone();
    let report = RollingReport {
        benchmark: "rolling",
        serve_args: opts.serve_args.clone(),
        writers: opts.failover_writers,
        lock_tasks: LOCK_TASKS,
        median_max_put_ms: quantile(&maxima, 0.5),
        max_put_ms: maxima.last().copied().unwrap_or(0.0),
        rounds,
        puts: acked.len() as u64,
        cycles: guard(&load.cycles).len() as u64,
        failed_calls: failures.len() as u64,
        failures: failures.into_iter().take(5).collect(),
        lost_writes: lost,
    };
    println!(
        "rolling ({} rounds of SIGTERM + restart of each replica, {} writers and {} lock \
         tasks, serve args {:?}): longest put median {:.0} ms, worst {:.0} ms; {} puts and {} \
         lock cycles, {} failed calls, {} acknowledged writes lost",
        report.rounds.len(),
        report.writers,
        report.lock_tasks,
        report.serve_args,
        report.median_max_put_ms,
        report.max_put_ms,
        report.puts,
        report.cycles,
        report.failed_calls,
        report.lost_writes
    );
    if report.failed_calls > 0 || report.lost_writes > 0 {
        eprintln!(
            "latchkey-bench: WARNING: {} failed calls, {} lost writes: {:?}",
            report.failed_calls, report.lost_writes, report.failures
        );
    }
    crate::report::write_json(&report, &opts.out, "rolling")?;
    Ok(())
}

/// Put distinct keys until `stop`.
async fn put_loop(client: Client, task: usize, load: Arc<Load>, stop: Arc<AtomicBool>) {
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("rolling/{task}/{i}");
        let began = Instant::now();
        match client.put(&key, "v").await {
            Ok(_) => {
                guard(&load.puts).push((began, began.elapsed()));
                guard(&load.acked).push(key);
            }
            Err(e) => guard(&load.failures).push(format!("put {key}: {e}")),
        }
        i += 1;
    }
}

/// Acquire and release a lock of this task's own until `stop`.
async fn lock_loop(client: Client, task: usize, load: Arc<Load>, stop: Arc<AtomicBool>) {
    let session = match client.session(Duration::from_secs(10)).await {
        Ok(s) => s,
        Err(e) => {
            guard(&load.failures).push(format!("open lock session {task}: {e}"));
            return;
        }
    };
    let lock = session.lock(format!("rolling/lock/{task}"));
    while !stop.load(Ordering::SeqCst) {
        let began = Instant::now();
        let cycle = async {
            lock.acquire().await?.release().await?;
            Ok::<(), latchkey::Error>(())
        };
        match cycle.await {
            Ok(()) => guard(&load.cycles).push((began, began.elapsed())),
            Err(e) => guard(&load.failures).push(format!("lock cycle {task}: {e}")),
        }
    }
    let _ = session.close().await;
}

/// The round's figures from the calls that overlapped `[started, ended]`.
fn summarize(
    load: &Load,
    order: &[String],
    started: Instant,
    ended: Instant,
    elections: u64,
) -> Round {
    let overlapping = |calls: &[Timed]| -> Vec<f64> {
        let mut ms: Vec<f64> = calls
            .iter()
            .filter(|(began, took)| *began <= ended && *began + *took >= started)
            .map(|(_, took)| took.as_secs_f64() * 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    };
    let puts = overlapping(&guard(&load.puts));
    let cycles = overlapping(&guard(&load.cycles));
    Round {
        order: order.to_vec(),
        took_s: ended.saturating_duration_since(started).as_secs_f64(),
        max_put_ms: puts.last().copied().unwrap_or(0.0),
        p99_put_ms: quantile(&puts, 0.99),
        max_cycle_ms: cycles.last().copied().unwrap_or(0.0),
        elections,
    }
}

/// How many of `keys` a linearizable read does not find.
async fn read_back(client: &Client, keys: &[String]) -> Result<u64, String> {
    let mut lost = 0u64;
    for chunk in keys.chunks(READ_BACK_CHUNK) {
        let values = client
            .multi_get(chunk)
            .await
            .map_err(|e| format!("cannot read the acknowledged writes back: {e}"))?;
        lost += values.iter().filter(|v| v.is_none()).count() as u64;
    }
    Ok(lost)
}

fn round_count(opts: &Options) -> usize {
    opts.rounds.unwrap_or(DEFAULT_ROUNDS)
}

/// An upper bound of a healthy rolling-restart benchmark.
pub fn budget(opts: &Options) -> Duration {
    let per_replica = EXIT_WAIT + LEADER_WAIT * 2;
    let per_round = per_replica * 3 + opts.settle + Duration::from_secs(10);
    setup_budget()
        + opts.settle
        + per_round.saturating_mul(u32::try_from(round_count(opts)).unwrap_or(u32::MAX))
        + Duration::from_secs(60)
}
