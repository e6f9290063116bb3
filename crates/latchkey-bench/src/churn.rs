//! The churn workload: how long a dead holder keeps its lock while the
//! leader keeps failing.
//!
//! On a fresh three-replica cluster, `--rounds` times: a holder, a `latchkey
//! lock NAME --ttl TTL -- sleep 600` process (TTL `--ttl`, default 5 s),
//! takes a lock, and a waiter (a client of the benchmark, TTL 10 s) queues
//! for it. Then the holder is SIGKILLed (with its command). From then,
//! `--kills` times, the leader is SIGKILLed `--lead` after it was first
//! seen leading (the first one `--lead` after the holder's kill), and
//! started again once the next leader is seen.
//!
//! The figure of a round: from the holder's kill to the waiter's grant.
//! Beside it, the time before which a leader that restarts every countdown
//! at full length could not have freed the lock: the TTL after the kill,
//! pushed to a TTL after each takeover seen before it ran out (takeovers
//! are seen by polling, up to 100 ms late). Results on stdout and in
//! `churn.json` in `--out`: every round, and the medians.

use std::time::{Duration, Instant};

use latchkey::Client;
use serde::Serialize;

use crate::args::Options;
use crate::cli_process::CliProcess;
use crate::measure::median;
use crate::testbed::{setup_budget, Testbed, LEADER_WAIT};

/// Rounds unless `--rounds` says otherwise.
const DEFAULT_ROUNDS: usize = 3;

/// The waiter's session TTL: longer than the holder's, so that its own
/// session survives the churn comfortably.
const WAITER_TTL: Duration = Duration::from_secs(10);
/// How long the waiter may wait for the lock before the round fails.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// One round.
#[derive(Debug, Clone, Serialize)]
struct Round {
    /// From the holder's kill to the waiter's grant, in seconds.
    freed_after_s: f64,
    /// When each new leader was first seen, in seconds after the kill.
    takeovers_s: Vec<f64>,
    /// The last takeover seen plus the TTL: the earliest a full-length
    /// restart at every takeover could have freed the lock, in seconds.
    full_length_floor_s: f64,
}

#[derive(Debug, Serialize)]
struct ChurnReport {
    benchmark: &'static str,
    serve_args: Vec<String>,
    ttl_s: f64,
    lead_s: f64,
    kills: usize,
    rounds: Vec<Round>,
    median_freed_after_s: f64,
    median_full_length_floor_s: f64,
}

/// The churn benchmark (see the module docs).
pub async fn bench(opts: &Options) -> Result<(), String> {
    let mut bed = Testbed::start("churn", opts).await?;
    let mut rounds = Vec::with_capacity(round_count(opts));
    let result = async {
        for round in 0..round_count(opts) {
            let r = one_round(&mut bed, opts, round).await?;
            eprintln!(
                "latchkey-bench: churn round {}/{}: freed {:.2} s after the holder died, {} \
                 takeovers; full-length restarts could not have freed it before {:.2} s",
                round + 1,
                round_count(opts),
                r.freed_after_s,
                r.takeovers_s.len(),
                r.full_length_floor_s
            );
            rounds.push(r);
        }
        Ok::<(), String>(())
    }
    .await;
    result.map_err(|e| format!("{e}\n{}", bed.logs_tail()))?;
    drop(bed);

    let report = ChurnReport {
        benchmark: "churn",
        serve_args: opts.serve_args.clone(),
        ttl_s: opts.ttl.as_secs_f64(),
        lead_s: opts.churn_lead.as_secs_f64(),
        kills: opts.kills,
        median_freed_after_s: median(rounds.iter().map(|r| r.freed_after_s).collect()),
        median_full_length_floor_s: median(rounds.iter().map(|r| r.full_length_floor_s).collect()),
        rounds,
    };
    println!(
        "churn ({} rounds, TTL {:.1} s, {} leaders killed {:.1} s after each was seen leading, \
         serve args {:?}): a dead holder's lock freed after median {:.2} s; restarting every \
         countdown at full length could not have freed it before median {:.2} s",
        report.rounds.len(),
        report.ttl_s,
        report.kills,
        report.lead_s,
        report.serve_args,
        report.median_freed_after_s,
        report.median_full_length_floor_s
    );
    crate::report::write_json(&report, &opts.out, "churn")?;
    Ok(())
}

fn round_count(opts: &Options) -> usize {
    opts.rounds.unwrap_or(DEFAULT_ROUNDS)
}

/// An upper bound of a healthy churn benchmark.
pub fn budget(opts: &Options) -> Duration {
    let per_kill = LEADER_WAIT * 2 + opts.churn_lead;
    let per_round = WAIT_LIMIT
        + per_kill.saturating_mul(u32::try_from(opts.kills).unwrap_or(u32::MAX))
        + Duration::from_secs(30);
    setup_budget() + per_round.saturating_mul(u32::try_from(round_count(opts)).unwrap_or(u32::MAX))
}

async fn one_round(bed: &mut Testbed, opts: &Options, round: usize) -> Result<Round, String> {
    if opts.tls {
        return Err("churn runs without --tls (its holder is a `latchkey lock` process)".into());
    }
    let name = format!("bench/churn/{round}");
    let endpoints = bed.endpoints();
    let ttl = format!("{}ms", opts.ttl.as_millis());
    let mut holder = CliProcess::spawn(
        bed.server_bin(),
        &endpoints,
        &["lock", &name, "--ttl", &ttl, "--", "sleep", "600"],
    )?;
    let waiter_client = bed.patient_client()?;
    let held = held_by(&waiter_client, &name).await?;
    let waiter = waiter_client
        .session(WAITER_TTL)
        .await
        .map_err(|e| format!("the waiter cannot open a session: {e}"))?;
    let wanted = name.clone();
    let wait = tokio::spawn(async move {
        let got = waiter.lock(&wanted).acquire_timeout(WAIT_LIMIT).await;
        let at = Instant::now();
        let token = match got {
            Ok(Some(g)) => {
                let token = g.token();
                let _ = g.release().await;
                Ok(token)
            }
            Ok(None) => Err(format!("the waiter was not granted within {WAIT_LIMIT:?}")),
            Err(e) => Err(format!("the waiter failed: {e}")),
        };
        (at, token)
    });
    queued(&waiter_client, &name).await?;

    holder.kill();
    let killed = Instant::now();
    let mut takeovers = Vec::with_capacity(opts.kills);
    for _ in 0..opts.kills {
        let leader = bed.cluster_mut().wait_for_leader(LEADER_WAIT).await?;
        tokio::time::sleep(opts.churn_lead).await;
        bed.cluster_mut().kill(&leader)?;
        bed.cluster_mut().wait_for_leader(LEADER_WAIT).await?;
        takeovers.push(killed.elapsed().as_secs_f64());
        bed.cluster_mut().restart(&leader)?;
    }
    let (granted_at, token) = wait
        .await
        .map_err(|e| format!("the waiter's task failed: {e}"))?;
    let token = token?;
    if token <= held {
        return Err(format!(
            "the waiter's token {token} is not above the dead holder's {held}"
        ));
    }
    let full_length_floor_s = full_length_floor(&takeovers, opts.ttl.as_secs_f64());
    Ok(Round {
        freed_after_s: granted_at.saturating_duration_since(killed).as_secs_f64(),
        takeovers_s: takeovers,
        full_length_floor_s,
    })
}

/// When a leader restarting every countdown at full length at each of
/// `takeovers` (seconds after the holder's kill) would first have let a
/// `ttl` countdown run out: each takeover before the countdown ran out
/// restarts it.
fn full_length_floor(takeovers: &[f64], ttl: f64) -> f64 {
    let mut ends = ttl;
    for t in takeovers {
        if *t < ends {
            ends = t + ttl;
        }
    }
    ends
}

/// Wait until `name` is held; its holder's token.
async fn held_by(client: &Client, name: &str) -> Result<latchkey::Token, String> {
    let started = Instant::now();
    loop {
        let locks = client
            .locks(name)
            .await
            .map_err(|e| format!("cannot list the locks: {e}"))?;
        if let Some(h) = locks
            .iter()
            .find(|l| l.name == name)
            .and_then(|l| l.holders.first())
        {
            return Ok(h.token);
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("the holder did not take {name}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until the waiter is queued for `name`.
async fn queued(client: &Client, name: &str) -> Result<(), String> {
    let started = Instant::now();
    loop {
        let locks = client
            .locks(name)
            .await
            .map_err(|e| format!("cannot list the locks: {e}"))?;
        if locks.iter().any(|l| l.name == name && l.waiters == 1) {
            return Ok(());
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("the waiter did not queue for {name}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_full_length_floor_follows_takeovers_before_the_countdown_ends() {
        assert_eq!(full_length_floor(&[], 5.0), 5.0);
        assert_eq!(full_length_floor(&[2.0, 4.0], 5.0), 9.0);
        // A takeover after the countdown ran out restarts nothing.
        assert_eq!(full_length_floor(&[2.0, 8.0], 5.0), 7.0);
    }
}
