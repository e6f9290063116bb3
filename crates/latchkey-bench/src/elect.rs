//! The election hand-over workload: how long after the leader's process
//! dies the next candidate leads.
//!
//! On a fresh three-replica cluster, `--rounds` times (default 10), each
//! round with an election of its own: a leader, a `latchkey elect NAME
//! VALUE --ttl TTL` process (TTL `--ttl`, default 5 s), leads; a standby (a
//! campaign of the benchmark's client, session TTL 10 s) waits behind it.
//! Then, at a point of the leader's keep-alive cycle that differs from
//! round to round (0 to 0.9 of the TTL after it was seen leading, in
//! tenths), the cluster is asked how long the leader's session has left
//! and the leader is SIGKILLed at once. The figures of a round: from the
//! kill to the standby's campaign returning (with a term checked to be
//! above the dead leader's), and how much of that came after the dead
//! leader's session ran out (the hand-over minus the time it had left: the
//! cost of ending the session and granting the next candidate, plus the
//! few milliseconds between the question and the kill). Nothing else runs
//! meanwhile, and no replica is killed: this is the hand-over a standby
//! sees when its active process dies. Results on stdout and in
//! `elect.json` in `--out`: every round, and the medians.

use std::time::{Duration, Instant};

use latchkey::core::lock::election_lock_name;
use latchkey::{Client, Token};
use serde::Serialize;

use crate::args::Options;
use crate::cli_process::CliProcess;
use crate::measure::median;
use crate::testbed::{setup_budget, Testbed, LEADER_WAIT};

/// Rounds unless `--rounds` says otherwise.
const DEFAULT_ROUNDS: usize = 10;
/// The standby's session TTL.
const STANDBY_TTL: Duration = Duration::from_secs(10);
/// How long the standby may wait to lead before the round fails.
const WAIT_LIMIT: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize)]
struct ElectReport {
    benchmark: &'static str,
    serve_args: Vec<String>,
    ttl_s: f64,
    rounds: Vec<Round>,
    median_handover_s: f64,
    min_handover_s: f64,
    max_handover_s: f64,
    median_after_expiry_ms: f64,
    max_after_expiry_ms: f64,
}

/// One hand-over.
#[derive(Debug, Clone, Copy, Serialize)]
struct Round {
    /// From the leader's kill to the standby leading, in seconds.
    handover_s: f64,
    /// What the leader's session had left just before the kill, in ms.
    left_ms: u64,
    /// The hand-over minus `left_ms`, in ms.
    after_expiry_ms: f64,
}

fn round_count(opts: &Options) -> usize {
    opts.rounds.unwrap_or(DEFAULT_ROUNDS)
}

/// The election hand-over benchmark (see the module docs).
pub async fn bench(opts: &Options) -> Result<(), String> {
    if opts.tls {
        return Err("elect runs without --tls (its leader is a `latchkey elect` process)".into());
    }
    let bed = Testbed::start("elect", opts).await?;
    let mut rounds = Vec::with_capacity(round_count(opts));
    let result = async {
        for round in 0..round_count(opts) {
            let r = one_round(&bed, opts, round).await?;
            eprintln!(
                "latchkey-bench: elect round {}/{}: the standby led {:.3} s after the leader \
                 died, {:.0} ms after its session ({} ms left) ran out",
                round + 1,
                round_count(opts),
                r.handover_s,
                r.after_expiry_ms,
                r.left_ms
            );
            rounds.push(r);
        }
        Ok::<(), String>(())
    }
    .await;
    result.map_err(|e| format!("{e}\n{}", bed.logs_tail()))?;
    drop(bed);

    let handover: Vec<f64> = rounds.iter().map(|r| r.handover_s).collect();
    let after: Vec<f64> = rounds.iter().map(|r| r.after_expiry_ms).collect();
    let report = ElectReport {
        benchmark: "elect",
        serve_args: opts.serve_args.clone(),
        ttl_s: opts.ttl.as_secs_f64(),
        median_handover_s: median(handover.clone()),
        min_handover_s: handover.iter().copied().fold(f64::INFINITY, f64::min),
        max_handover_s: handover.iter().copied().fold(0.0, f64::max),
        median_after_expiry_ms: median(after.clone()),
        max_after_expiry_ms: after.iter().copied().fold(f64::MIN, f64::max),
        rounds,
    };
    println!(
        "elect ({} rounds, leader TTL {:.1} s, serve args {:?}): the standby led a median \
         {:.3} s after the leader's process was killed (lowest {:.3} s, highest {:.3} s); \
         a median {:.0} ms (highest {:.0} ms) after the dead leader's session ran out",
        report.rounds.len(),
        report.ttl_s,
        report.serve_args,
        report.median_handover_s,
        report.min_handover_s,
        report.max_handover_s,
        report.median_after_expiry_ms,
        report.max_after_expiry_ms
    );
    crate::report::write_json(&report, &opts.out, "elect")?;
    Ok(())
}

/// An upper bound of a healthy election benchmark.
pub fn budget(opts: &Options) -> Duration {
    let per_round = LEADER_WAIT * 2 + WAIT_LIMIT + Duration::from_secs(10);
    setup_budget() + per_round.saturating_mul(u32::try_from(round_count(opts)).unwrap_or(u32::MAX))
}

/// One hand-over.
async fn one_round(bed: &Testbed, opts: &Options, round: usize) -> Result<Round, String> {
    let name = format!("bench/elect/{round}");
    let value = format!("leader-{round}");
    let ttl = format!("{}ms", opts.ttl.as_millis());
    let mut leader = CliProcess::spawn(
        bed.server_bin(),
        &bed.endpoints(),
        &["elect", &name, &value, "--ttl", &ttl],
    )?;
    let client = bed.patient_client()?;
    let old = leading(&client, &name, value.as_bytes()).await?;
    let seen = Instant::now();
    let standby = client
        .session(STANDBY_TTL)
        .await
        .map_err(|e| format!("the standby cannot open a session: {e}"))?;
    let mut election = standby.election(&name);
    let campaign = tokio::spawn(async move {
        let won = election.campaign_timeout("standby", WAIT_LIMIT).await;
        let at = Instant::now();
        let term = match won {
            Ok(Some(leadership)) => {
                let term = leadership.term();
                let _ = leadership.resign().await;
                Ok(term)
            }
            Ok(None) => Err(format!("the standby did not lead within {WAIT_LIMIT:?}")),
            Err(e) => Err(format!("the standby's campaign failed: {e}")),
        };
        let _ = standby.close().await;
        (at, term)
    });
    waiting(&client, &name).await?;

    // Tenths of the TTL, visited in a scattered order over the rounds.
    let tenths = u32::try_from(round * 7 % 10).unwrap_or(0);
    tokio::time::sleep_until((seen + opts.ttl * tenths / 10).into()).await;
    let left_ms = time_left(&client, old).await?;
    leader.kill();
    let killed = Instant::now();
    let (led_at, term) = campaign
        .await
        .map_err(|e| format!("the standby's task failed: {e}"))?;
    let term = term?;
    if term <= old {
        return Err(format!(
            "the standby's term {term} is not above the dead leader's {old}"
        ));
    }
    let handover_s = led_at.saturating_duration_since(killed).as_secs_f64();
    Ok(Round {
        handover_s,
        left_ms,
        after_expiry_ms: handover_s * 1000.0 - left_ms as f64,
    })
}

/// How long the session that holds term `term` has left on the leader's
/// countdown.
async fn time_left(client: &Client, term: Token) -> Result<u64, String> {
    let sessions = client
        .sessions()
        .await
        .map_err(|e| format!("cannot list the sessions: {e}"))?;
    sessions
        .iter()
        .find(|s| s.held.iter().any(|h| h.token == term))
        .and_then(|s| s.left_ms)
        .ok_or_else(|| format!("no session with time left holds term {term}"))
}

/// Wait until the election `name` is led with `value`; the term.
async fn leading(client: &Client, name: &str, value: &[u8]) -> Result<Token, String> {
    let started = Instant::now();
    loop {
        let leader = client
            .leader(name)
            .await
            .map_err(|e| format!("cannot read the leader of {name}: {e}"))?;
        if let Some(l) = leader.filter(|l| l.value == value) {
            return Ok(l.term);
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("the `latchkey elect` process did not lead {name}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until one candidate waits in the election `name`.
async fn waiting(client: &Client, name: &str) -> Result<(), String> {
    let lock = election_lock_name(name);
    let started = Instant::now();
    loop {
        let locks = client
            .locks(&lock)
            .await
            .map_err(|e| format!("cannot list the locks: {e}"))?;
        if locks.iter().any(|l| l.name == lock && l.waiters == 1) {
            return Ok(());
        }
        if started.elapsed() > LEADER_WAIT {
            return Err(format!("the standby did not queue in {name}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
