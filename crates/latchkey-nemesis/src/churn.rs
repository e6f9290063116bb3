//! The leader-churn phase: a dead holder's lock while the leader keeps
//! moving.
//!
//! After the fault phase, once the cluster is restored and the workloads
//! have stopped, a holder process (worker role `holder`) takes
//! [`CHURN_LOCK`] in a session of [`CHURN_TTL`] and records the lease its
//! client vouches for, again at each keep-alive; a waiter (a client of the
//! controller) queues for the lock with a blocking acquire; after the
//! holder's first keep-alive, the holder is SIGKILLed. While the
//! lock waits for the dead holder's session to end, the leader is
//! SIGKILLed up to [`LEADER_KILLS`] times, [`KILL_EVERY`] apart (and at
//! least [`AFTER_READY`] after the previous new leader served reads), and
//! restarted on its data once the next leader serves reads. Each kill and
//! each ready leader is recorded ([`ChurnOp`](latchkey_check::history::ChurnOp)),
//! with the harness's clock like every event, for `latchkey-check`'s
//! `abandoned` checker: was the lock freed neither before the holder's
//! lease ran out nor long after the documented failover bound?
//!
//! The waiter waits as long as the checker needs to call the lock leaked
//! ([`abandoned::leak_after_ns`] past the TTL, for the kills and the
//! leaderless time seen), at most [`WAIT_AT_MOST`] after the holder's
//! kill. Usually the whole phase takes 12 to 20 s.

use std::path::PathBuf;
use std::process::{Child, ChildStdin};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions};
use latchkey_check::abandoned;
use latchkey_check::history::{ops, ChurnOp, ChurnRole};
use latchkey_check::{EventKind, Op};

use crate::clock::now_ns;
use crate::cluster::{leader_of, Cluster};
use crate::error::{Error, Result};
use crate::nemesis::FaultWindow;
use crate::record::{read_events, Recorder};
pub use crate::worker::CHURN_LOCK;

/// The holder's session TTL: short, so the phase is, and above the
/// 3 s floor.
pub const CHURN_TTL: Duration = Duration::from_secs(5);
/// The waiter's session TTL: long enough to ride out the churn.
const WAITER_TTL: Duration = Duration::from_secs(10);
/// How many times the leader is killed while the holder is dead (fewer
/// when the lock is freed first).
pub const LEADER_KILLS: usize = 4;
/// The first leader kill, after the holder's.
const FIRST_KILL_AFTER: Duration = Duration::from_secs(1);
/// From one leader kill to the next.
pub const KILL_EVERY: Duration = Duration::from_millis(2_500);
/// At least this long after a new leader served reads before it is
/// killed in turn (so each leader leads, and records, for a while).
pub const AFTER_READY: Duration = Duration::from_secs(1);
/// How long the cluster may go without a leader serving reads before the
/// run stops.
const READY_WITHIN: Duration = Duration::from_secs(60);
/// How long the holder may take to be granted the lock.
const HOLDER_WITHIN: Duration = Duration::from_secs(30);
/// How long the waiter may take to queue.
const QUEUED_WITHIN: Duration = Duration::from_secs(15);
/// The longest the waiter waits after the holder's kill.
pub const WAIT_AT_MOST: Duration = Duration::from_secs(90);
/// The kind of the fault windows of the phase's leader kills.
pub const CHURN_KILL: &str = "churn-kill";
/// The waiter's history process is the holder worker's second task slot.
const WAITER_TASK: u64 = 1;

/// The holder's process; killed (if still running) when dropped.
pub struct Holder {
    child: Option<Child>,
    /// Kept open: the worker stops when its standard input closes.
    _stdin: Option<ChildStdin>,
    /// Its history process (task 0).
    process: u64,
    /// Where it records.
    pub history: PathBuf,
}

impl Holder {
    /// The holder worker `child` (started with `--tasks 1`), its stdin,
    /// its history process and file.
    pub fn new(
        child: Option<Child>,
        stdin: Option<ChildStdin>,
        process: u64,
        history: PathBuf,
    ) -> Holder {
        Holder {
            child,
            _stdin: stdin,
            process,
            history,
        }
    }

    /// SIGKILL (by pid) and reap.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// An error if it exited.
    fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = self.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return Err(Error::Worker(format!(
                    "the churn holder exited before it was killed, with {status}; see its log \
                     next to {}",
                    self.history.display()
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Why the phase cannot run on `cluster` now, if it cannot: every replica
/// must be up (killing the leader of two leaves no quorum).
pub fn unready(cluster: &Cluster) -> Option<String> {
    (0..3)
        .find(|&i| !cluster.running(i))
        .map(|i| format!("replica n{} is down (its disk awaits repair)", i + 1))
}

/// What the phase did, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTimes {
    /// When it began (CLOCK_MONOTONIC, ns).
    pub start_ns: u64,
    /// When it ended, the cluster restored.
    pub end_ns: u64,
}

/// Carries out the phase (see the module docs), recording on `rec` (as
/// process 0, and the waiter as the holder's second task) and adding each
/// leader kill to `windows`. A phase that cannot start is recorded as
/// skipped; a cluster that stops serving is an error.
pub async fn run(
    cluster: &mut Cluster,
    mut holder: Holder,
    rec: &Arc<Recorder>,
    windows: &mut Vec<FaultWindow>,
) -> Result<PhaseTimes> {
    let start_ns = now_ns();
    eprintln!(
        "nemesis: leader churn: a holder takes {CHURN_LOCK:?} (TTL {CHURN_TTL:?}), is killed, \
         and the leader is killed up to {LEADER_KILLS} times"
    );
    let Some(name) = holder_kept_alive(cluster, &mut holder).await? else {
        holder.kill();
        let why = format!(
            "the holder was not granted {CHURN_LOCK:?} and a keep-alive within {HOLDER_WITHIN:?}"
        );
        rec.record(0, EventKind::Ok, ops::churn_skipped(&why));
        eprintln!("nemesis: leader churn: skipped: {why}");
        return Ok(PhaseTimes {
            start_ns,
            end_ns: now_ns(),
        });
    };
    let options = cluster.client_options(
        ClientOptions::default()
            .with_request_timeout(Duration::from_secs(60))
            .with_attempt_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_millis(300))
            .with_initial_backoff(Duration::from_millis(5))
            .with_max_backoff(Duration::from_millis(50)),
    )?;
    let client = Client::with_options(cluster.endpoints(), options)
        .map_err(|e| Error::Cluster(format!("cannot build the churn waiter's client: {e}")))?;
    let waiter_process = holder.process + WAITER_TASK;
    let in_flight = Arc::new(Mutex::new(None));
    let waiter = tokio::spawn(wait_for_lock(
        client.clone(),
        rec.clone(),
        waiter_process,
        in_flight.clone(),
        Instant::now() + WAIT_AT_MOST + QUEUED_WITHIN,
    ));
    let mut waiter = AbortOnDrop(waiter);
    queued(cluster, &client).await?;

    holder.kill();
    let killed_ns = rec.record(
        0,
        EventKind::Ok,
        ops::churn_holder_killed(CHURN_LOCK, &name),
    );
    let killed = Instant::now();
    eprintln!("nemesis: leader churn: holder {name} killed holding {CHURN_LOCK:?}");

    let mut kills = 0u64;
    let mut terms = std::collections::BTreeSet::new();
    let mut leaderless_ns = 0u64;
    let mut next = killed + FIRST_KILL_AFTER;
    while kills < LEADER_KILLS as u64 {
        if !still_waiting(cluster, &waiter, next).await? {
            break;
        }
        let kill_at = Instant::now();
        let (i, term) = wait_leader(cluster, 0).await?;
        cluster.kill(i);
        let kill_ns = rec.record(
            0,
            EventKind::Ok,
            ops::churn_leader_killed(cluster.id(i), term),
        );
        cluster.log_note(i, "leader churn: killed (SIGKILL) as the leader");
        let (j, new_term) = wait_leader(cluster, term).await?;
        let ready_ns = rec.record(
            0,
            EventKind::Ok,
            ops::churn_leader_ready(cluster.id(j), new_term),
        );
        cluster.restart(i)?;
        kills += 1;
        terms.extend([term, new_term]);
        leaderless_ns += ready_ns.saturating_sub(kill_ns);
        windows.push(FaultWindow {
            kind: CHURN_KILL.into(),
            target: format!("n{}", i + 1),
            start_ns: kill_ns,
            end_ns: now_ns(),
            detail: Some(format!(
                "the leader (term {term}) while a dead holder's lock waited; n{} led in term \
                 {new_term} {:.2} s later",
                j + 1,
                (ready_ns.saturating_sub(kill_ns)) as f64 / 1e9
            )),
        });
        eprintln!(
            "nemesis: leader churn: [{:>5.1}s] killed leader n{} (term {term}); n{} ready in \
             term {new_term} after {:.2} s",
            killed.elapsed().as_secs_f64(),
            i + 1,
            j + 1,
            (ready_ns.saturating_sub(kill_ns)) as f64 / 1e9
        );
        next = (kill_at + KILL_EVERY).max(Instant::now() + AFTER_READY);
    }

    // Wait as long as the checker needs to call the lock leaked, for the
    // leader changes (as it counts them) and the leaderless time seen (one
    // more second, so that the waiter's last attempt ends past that point).
    let ttl_ns = nanos(CHURN_TTL);
    let changes = kills.max((terms.len() as u64).saturating_sub(1));
    let bound = abandoned::bound_ns(millis(CHURN_TTL), changes, leaderless_ns);
    let leak_ns = killed_ns
        .saturating_add(ttl_ns)
        .saturating_add(abandoned::leak_after_ns(bound))
        .saturating_add(1_000_000_000);
    let give_up = (killed + WAIT_AT_MOST)
        .min(Instant::now() + Duration::from_nanos(leak_ns.saturating_sub(now_ns())));
    if still_waiting(cluster, &waiter, give_up).await? {
        waiter.0.abort();
    }
    let granted = (&mut waiter.0).await.unwrap_or(false);
    if let Some(op) = in_flight.lock().unwrap_or_else(|p| p.into_inner()).take() {
        rec.record(waiter_process, EventKind::Unknown, op);
    }
    if granted {
        eprintln!(
            "nemesis: leader churn: the waiter was granted {CHURN_LOCK:?} {:.2} s after the \
             holder's kill, {kills} leader kill(s) later",
            (now_ns().saturating_sub(killed_ns)) as f64 / 1e9
        );
    } else {
        eprintln!(
            "nemesis: leader churn: the waiter was NOT granted {CHURN_LOCK:?} within {:.1} s \
             of the holder's kill; gave up",
            killed.elapsed().as_secs_f64()
        );
    }
    for i in 0..3 {
        cluster.restart(i)?;
    }
    let leader = cluster.wait_ready(READY_WITHIN).await?;
    let end_ns = now_ns();
    eprintln!(
        "nemesis: leader churn: done in {:.1} s; leader n{}",
        (end_ns.saturating_sub(start_ns)) as f64 / 1e9,
        leader + 1
    );
    Ok(PhaseTimes { start_ns, end_ns })
}

/// Aborts the task when dropped (an error mid-phase).
struct AbortOnDrop(tokio::task::JoinHandle<bool>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Waits until `at`, watching the replicas; `Ok(false)` as soon as the
/// waiter is done (granted or given up), `Ok(true)` at `at`, the waiter
/// still waiting.
async fn still_waiting(cluster: &mut Cluster, waiter: &AbortOnDrop, at: Instant) -> Result<bool> {
    loop {
        cluster.check_alive()?;
        if waiter.0.is_finished() {
            return Ok(false);
        }
        let now = Instant::now();
        if now >= at {
            return Ok(true);
        }
        tokio::time::sleep((at - now).min(Duration::from_millis(20))).await;
    }
}

/// Waits until the holder's history shows a second vouched-for lease:
/// it was granted the lock (its first record follows the grant) and then
/// a keep-alive was acknowledged, so it dies holding a lock it kept alive.
/// The holder's name, or `None` when that did not happen within
/// [`HOLDER_WITHIN`].
async fn holder_kept_alive(cluster: &mut Cluster, holder: &mut Holder) -> Result<Option<String>> {
    let started = Instant::now();
    while started.elapsed() < HOLDER_WITHIN {
        cluster.check_alive()?;
        holder.check_alive()?;
        // A torn last line (being written) is dropped by the reader.
        if let Ok(events) = read_events(&holder.history) {
            let vouched: Vec<&str> = events
                .iter()
                .filter_map(|e| match &e.op {
                    Op::Churn(ChurnOp::Vouched { holder, .. }) => Some(holder.as_str()),
                    _ => None,
                })
                .collect();
            if let [_, second, ..] = vouched.as_slice() {
                return Ok(Some((*second).to_owned()));
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// Waits until the waiter is queued for [`CHURN_LOCK`].
async fn queued(cluster: &mut Cluster, client: &Client) -> Result<()> {
    let started = Instant::now();
    loop {
        cluster.check_alive()?;
        if let Ok(locks) = client.locks(CHURN_LOCK).await {
            if locks.iter().any(|l| l.name == CHURN_LOCK && l.waiters >= 1) {
                return Ok(());
            }
        }
        if started.elapsed() > QUEUED_WITHIN {
            return Err(Error::Cluster(format!(
                "the churn waiter did not queue for {CHURN_LOCK:?} within {QUEUED_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a replica that leads in a term above `above` and serves a
/// linearizable read: its index and term.
async fn wait_leader(cluster: &mut Cluster, above: u64) -> Result<(usize, u64)> {
    let started = Instant::now();
    let status = cluster.status_client();
    let endpoints = cluster.endpoints();
    loop {
        cluster.check_alive()?;
        if let Some((i, term)) = leader_of(&status, &endpoints).await {
            if term > above && status.get("harness/ready").await.is_ok() {
                return Ok((i, term));
            }
        }
        if started.elapsed() > READY_WITHIN {
            return Err(Error::Cluster(format!(
                "leader churn: no leader serving reads within {READY_WITHIN:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The waiter: a session of [`WAITER_TTL`] and one blocking acquire of
/// [`CHURN_LOCK`] (again, in a fresh session, after an error), until
/// granted (`true`) or `until`. The acquire in flight is kept in
/// `in_flight`, so that the controller can record it as unknown when it
/// stops waiting.
async fn wait_for_lock(
    client: Client,
    rec: Arc<Recorder>,
    process: u64,
    in_flight: Arc<Mutex<Option<Op>>>,
    until: Instant,
) -> bool {
    let ttl_ms = millis(WAITER_TTL);
    while Instant::now() < until {
        let session = match client.session(WAITER_TTL).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(%e, "the churn waiter cannot open a session yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let holder = format!("p{process}/s{}", session.id());
        let op = |token| ops::churn_acquire(CHURN_LOCK, &holder, ChurnRole::Waiter, ttl_ms, token);
        {
            let mut slot = in_flight.lock().unwrap_or_else(|p| p.into_inner());
            rec.invoke(process, op(None));
            *slot = Some(op(None));
        }
        let got = session
            .lock(CHURN_LOCK)
            .acquire_timeout(until.saturating_duration_since(Instant::now()))
            .await;
        let guard = {
            let mut slot = in_flight.lock().unwrap_or_else(|p| p.into_inner());
            *slot = None;
            match got {
                Ok(Some(g)) => {
                    rec.record(process, EventKind::Ok, op(Some(u64::from(g.token()))));
                    Some(g)
                }
                Ok(None) => {
                    rec.record(process, EventKind::Unknown, op(None));
                    None
                }
                Err(e) => {
                    tracing::debug!(%e, "the churn waiter's acquire failed");
                    rec.record(process, EventKind::Unknown, op(None));
                    None
                }
            }
        };
        if let Some(g) = guard {
            let _ = g.release().await;
            let _ = session.close().await;
            return true;
        }
        let _ = session.close().await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
