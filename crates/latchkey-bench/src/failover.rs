//! The failover workload: how long writes stop when the leader dies.
//!
//! On a fresh three-replica cluster, writer tasks put keys without pause
//! (the load). Then, `--kills` times: the leader is SIGKILLed, and a probe
//! put started at once is timed until it is acknowledged (the client finds
//! the new leader by itself, retrying with its usual backoff); that is the
//! row's figure, "leader killed to the first write acknowledged". The
//! killed replica is started again and, once it has caught up, the cluster
//! runs the load for `--settle` with nothing killed: every term change then
//! is a spurious election (a follower that missed heartbeats under load),
//! counted separately from the one election each kill needs.
//!
//! Results (stdout and `failover.json` in `--out`): the median, p90 and
//! worst of the probe times, the elections per kill, the spurious
//! elections, and the writes the load had acknowledged and lost to unknown
//! outcomes (a write in flight at the killed leader ends so; never an
//! error of the measurement).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions, Error};
use serde::Serialize;

use crate::args::Options;
use crate::testbed::{setup_budget, Testbed, LEADER_WAIT};

/// How long a probe put may take before the round counts as failed.
const PROBE_LIMIT: Duration = Duration::from_secs(30);

/// One kill.
#[derive(Debug, Clone, Serialize)]
struct Round {
    /// The killed leader's address.
    killed: String,
    /// SIGKILL to the probe put's acknowledgement, in milliseconds.
    to_first_write_ms: f64,
    /// Term increments from before the kill to the new leader's term.
    elections: u64,
    /// Term increments during the settle period after the round.
    spurious_elections: u64,
}

#[derive(Debug, Serialize)]
struct FailoverReport {
    benchmark: &'static str,
    serve_args: Vec<String>,
    writers: usize,
    settle_s: f64,
    rounds: Vec<Round>,
    p50_ms: f64,
    p90_ms: f64,
    max_ms: f64,
    spurious_elections: u64,
    load_acknowledged: u64,
    load_unknown_outcomes: u64,
    load_errors: u64,
}

/// The failover benchmark (see the module docs).
pub async fn bench(opts: &Options) -> Result<(), String> {
    let mut bed = Testbed::start("failover", opts).await?;
    let endpoints = bed.endpoints();
    let client = client(&endpoints, bed.tls())?;
    let status = client_with(&endpoints, bed.tls(), Duration::from_millis(500))?;

    // The load: writers putting distinct keys until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let unknown = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let writers = opts.failover_writers;
    let mut load = Vec::with_capacity(writers);
    for task in 0..writers {
        let (client, stop) = (client.clone(), Arc::clone(&stop));
        let (acked, unknown, errors) = (
            Arc::clone(&acked),
            Arc::clone(&unknown),
            Arc::clone(&errors),
        );
        load.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match client.put(format!("load/{task}/{i}"), "v").await {
                    Ok(_) => acked.fetch_add(1, Ordering::Relaxed),
                    Err(Error::UnknownOutcome(_)) => unknown.fetch_add(1, Ordering::Relaxed),
                    Err(_) => errors.fetch_add(1, Ordering::Relaxed),
                };
                i += 1;
            }
        }));
    }

    let mut rounds = Vec::with_capacity(opts.kills);
    let result = async {
        settle(&status, &endpoints, opts.settle).await?;
        for round in 0..opts.kills {
            let (leader, term) = leader_and_term(&status, &endpoints).await?;
            bed.cluster_mut().kill(&leader)?;
            let killed_at = Instant::now();
            let took = probe(&client, round, killed_at).await?;
            let (_, new_term) = leader_and_term(&status, &endpoints).await?;
            bed.cluster_mut().restart(&leader)?;
            caught_up(&status, &leader).await?;
            let spurious = settle(&status, &endpoints, opts.settle).await?;
            eprintln!(
                "latchkey-bench: kill {}/{}: {leader} killed, first write after {:.0} ms, \
                 {} election(s); {spurious} spurious while settling",
                round + 1,
                opts.kills,
                took.as_secs_f64() * 1000.0,
                new_term.saturating_sub(term)
            );
            rounds.push(Round {
                killed: leader,
                to_first_write_ms: took.as_secs_f64() * 1000.0,
                elections: new_term.saturating_sub(term),
                spurious_elections: spurious,
            });
        }
        Ok::<(), String>(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    result.map_err(|e| format!("{e}\n{}", bed.logs_tail()))?;
    drop(bed);

    let mut times: Vec<f64> = rounds.iter().map(|r| r.to_first_write_ms).collect();
    times.sort_by(f64::total_cmp);
    let report = FailoverReport {
        benchmark: "failover",
        serve_args: opts.serve_args.clone(),
        writers,
        settle_s: opts.settle.as_secs_f64(),
        p50_ms: quantile(&times, 0.5),
        p90_ms: quantile(&times, 0.9),
        max_ms: times.last().copied().unwrap_or(0.0),
        spurious_elections: rounds.iter().map(|r| r.spurious_elections).sum(),
        rounds,
        load_acknowledged: acked.load(Ordering::Relaxed),
        load_unknown_outcomes: unknown.load(Ordering::Relaxed),
        load_errors: errors.load(Ordering::Relaxed),
    };
    println!(
        "failover ({} kills, {writers} writers, serve args {:?}): leader SIGKILLed to the first \
         write acknowledged p50 {:.0} ms, p90 {:.0} ms, max {:.0} ms; {} spurious elections in \
         {:.0} s of settled load; load: {} acknowledged, {} unknown outcomes, {} errors",
        report.rounds.len(),
        report.serve_args,
        report.p50_ms,
        report.p90_ms,
        report.max_ms,
        report.spurious_elections,
        opts.settle.as_secs_f64() * (report.rounds.len() + 1) as f64,
        report.load_acknowledged,
        report.load_unknown_outcomes,
        report.load_errors
    );
    crate::report::write_json(&report, &opts.out, "failover")?;
    Ok(())
}

/// An upper bound of a healthy failover benchmark.
pub fn budget(opts: &Options) -> Duration {
    let per_kill = PROBE_LIMIT + LEADER_WAIT + opts.settle + Duration::from_secs(10);
    setup_budget()
        + opts.settle
        + per_kill.saturating_mul(u32::try_from(opts.kills).unwrap_or(u32::MAX))
}

/// The `q` quantile of sorted `values` (nearest rank).
pub(crate) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// The load's and the probe's client: quick to give up on a dead replica,
/// patient for an election.
fn client(endpoints: &[String], tls: Option<&latchkey::TlsOptions>) -> Result<Client, String> {
    client_with(endpoints, tls, Duration::from_secs(2))
}

pub(crate) fn client_with(
    endpoints: &[String],
    tls: Option<&latchkey::TlsOptions>,
    attempt: Duration,
) -> Result<Client, String> {
    let mut options = ClientOptions::default()
        .with_request_timeout(PROBE_LIMIT)
        .with_attempt_timeout(attempt)
        .with_connect_timeout(Duration::from_millis(200))
        .with_initial_backoff(Duration::from_millis(5))
        .with_max_backoff(Duration::from_millis(50));
    if let Some(tls) = tls {
        options = options.with_tls(tls.clone());
    }
    Client::with_options(endpoints, options).map_err(|e| format!("cannot build a client: {e}"))
}

/// Put a probe key until one put started after `killed_at` is
/// acknowledged; the time from `killed_at`. A put that reached the dead
/// leader ends with an unknown outcome: the next one is timed on.
async fn probe(client: &Client, round: usize, killed_at: Instant) -> Result<Duration, String> {
    let mut attempt = 0u64;
    loop {
        match client.put(format!("probe/{round}/{attempt}"), "p").await {
            Ok(_) => return Ok(killed_at.elapsed()),
            Err(Error::UnknownOutcome(_)) if killed_at.elapsed() < PROBE_LIMIT => attempt += 1,
            Err(e) => return Err(format!("the probe write after kill {round} failed: {e}")),
        }
    }
}

/// The leader's address and the highest term any replica reports, once a
/// replica says it leads.
pub(crate) async fn leader_and_term(
    status: &Client,
    endpoints: &[String],
) -> Result<(String, u64), String> {
    let started = Instant::now();
    loop {
        let mut leader = None;
        let mut term = 0;
        for addr in endpoints {
            if let Ok(s) = status.status_of(addr).await {
                term = term.max(s.term);
                if s.state == "Leader" {
                    leader = Some(addr.clone());
                }
            }
        }
        if let Some(leader) = leader {
            return Ok((leader, term));
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("no leader within {LEADER_WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the replica at `addr` answers and has applied what the
/// leader had when it was asked.
pub(crate) async fn caught_up(status: &Client, addr: &str) -> Result<(), String> {
    let started = Instant::now();
    let target = status
        .status()
        .await
        .map_err(|e| format!("cannot read the leader's status: {e}"))?
        .last_log_index;
    loop {
        if let Ok(s) = status.status_of(addr).await {
            if s.last_applied >= target {
                return Ok(());
            }
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("{addr} did not catch up within {LEADER_WAIT:?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Let the load run for `settle` with nothing killed; the term changes seen
/// meanwhile (spurious elections).
async fn settle(status: &Client, endpoints: &[String], settle: Duration) -> Result<u64, String> {
    let (_, before) = leader_and_term(status, endpoints).await?;
    tokio::time::sleep(settle).await;
    let (_, after) = leader_and_term(status, endpoints).await?;
    Ok(after.saturating_sub(before))
}
