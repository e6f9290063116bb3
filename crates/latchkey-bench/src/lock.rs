//! The lock workloads. Every task opens its own session (ttl 10 s, renewed
//! by the client's watchdog) before the clock starts, then loops
//! acquire → release until the duration is over:
//!
//! * `lock-cycle`: each task on a lock of its own (`bench/cycle/<task>`), so
//!   nothing waits on anything but the cluster; the latency is the whole
//!   cycle (acquire + release, two replicated, fsynced writes).
//! * `contended`: every task on one lock (`bench/contended`), queueing in
//!   its FIFO queue; the latency is the acquire's, from sending it to
//!   holding the lock, and the throughput is grants per second.
//! * `semaphore`: every task on one semaphore of [`SEMAPHORE_PERMITS`]
//!   permits (`bench/semaphore`); latency and throughput as `contended`.
//! * `multi-lock`: each task takes its own lock and its neighbour's at once
//!   (`bench/multi/<task>` and `bench/multi/<task + 1>`, a ring), so each
//!   lock is wanted by two tasks; the latency is the whole cycle (one
//!   acquire of both, one release of both).
//!
//! Each checks, cheaply, what it promises: a [`Witness`] per lock notes a
//! grant that finds more tasks inside than it admits (one, or the
//! semaphore's permits), and, for locks, a fencing token not above the
//! previous grant's of the same lock. Per-task grant counts show
//! the FIFO queue's fairness (round robin: near-equal counts).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use latchkey::{Client, Error, Lock, LockGuard, MultiLock, MultiLockGuard, Semaphore, Session};
use serde::Serialize;

use crate::args::Options;
use crate::fsync::micros;
use crate::measure::{
    join_all, merge_into, new_histogram, progress, summarize, Clients, Latency, RunResult,
    TaskStats, REQUEST_TIMEOUT,
};
use crate::report::{self, ms, Params};
use crate::testbed::{setup_budget, Testbed};

/// TTL of every task's session.
pub const SESSION_TTL: Duration = Duration::from_secs(10);
/// How long one acquire may wait in the queue before it counts as an error
/// (`acquire_timeout`, i.e. `acquire` with a bounded wait, so that a stuck
/// cluster cannot stall the benchmark).
pub const ACQUIRE_WAIT: Duration = Duration::from_secs(10);
/// Permits of the semaphore run's semaphore.
pub const SEMAPHORE_PERMITS: u32 = 4;
/// Pause after a failed iteration, so that an error that comes back at once
/// does not become a busy loop stealing the servers' CPU.
const ERROR_PAUSE: Duration = Duration::from_millis(10);

/// The lock benchmark: a testbed, lock-cycle per client count, contended
/// per client count, the report.
pub async fn bench(opts: &Options) -> Result<(), String> {
    let cycle_counts = opts.lock_cycle_clients();
    let contended_counts = opts.contended_clients();
    let mut bed = Testbed::start("lock", opts).await?;
    let max_tasks = cycle_counts
        .iter()
        .chain(&contended_counts)
        .copied()
        .max()
        .unwrap_or(1);
    let clients = bed.clients(opts, max_tasks).await?;
    let mut settled_s = None;
    if opts.aged {
        age(&clients, opts).await?;
        bed.check_alive()?;
        settled_s = Some(settle(&bed).await?.as_secs_f64());
    }

    let runs = cycle_counts
        .iter()
        .map(|&c| (Kind::Cycle, c))
        .chain(contended_counts.iter().map(|&c| (Kind::Contended, c)))
        .chain(contended_counts.iter().map(|&c| (Kind::Semaphore, c)))
        .chain(contended_counts.iter().map(|&c| (Kind::MultiLock, c)));
    let mut results = Vec::with_capacity(cycle_counts.len() + 3 * contended_counts.len());
    for (kind, c) in runs {
        eprintln!(
            "latchkey-bench: {}, {c} clients, {:.1}s...",
            kind.name(),
            opts.duration.as_secs_f64()
        );
        let result = run(&clients, kind, c, opts.duration).await?;
        progress(&result);
        if let Some(alarm) = result.lock.as_ref().and_then(|d| d.alarm(&result)) {
            eprintln!("latchkey-bench:   {alarm}");
        }
        results.push(result);
        bed.check_alive()?;
    }
    drop(clients);

    let params = LockParams {
        lock_cycle_clients: cycle_counts,
        contended_clients: contended_counts,
        session_ttl_s: SESSION_TTL.as_secs_f64(),
        acquire_wait_s: ACQUIRE_WAIT.as_secs_f64(),
        aged: settled_s.map(|settled_s| Aged {
            keys: opts.age_keys,
            sessions: opts.age_sessions,
            settled_s,
        }),
    };
    let report = bed.finish("lock", opts, params, results);
    report::publish(&report, &opts.out)
}

/// An upper bound of a healthy lock benchmark: start-up, the aging, and
/// per run its duration, the sessions' opening and closing, and a last
/// iteration that waits its longest; plus slack.
pub fn budget(opts: &Options) -> Duration {
    let per_run = opts.duration + ACQUIRE_WAIT + REQUEST_TIMEOUT * 4 + Duration::from_secs(5);
    let runs = opts.lock_cycle_clients().len() + 3 * opts.contended_clients().len();
    // Aging at a pessimistic 200 sessions or 5,000 keys a second, and the
    // longest wait for the stores to settle.
    let aging = if opts.aged {
        Duration::from_secs(opts.age_sessions / 200 + opts.age_keys / 5_000 + 60) + SETTLE_WITHIN
    } else {
        Duration::ZERO
    };
    setup_budget() + aging + per_run.saturating_mul(u32::try_from(runs).unwrap_or(u32::MAX))
}

/// Tasks aging the cluster, and keys per batch of its puts.
const AGE_TASKS: usize = 32;
const AGE_BATCH: u64 = 500;

/// Make the cluster one that has run for a while before the runs (the
/// long-lived row): `--age-keys` keys of `--value-size` bytes written in
/// batches, and `--age-sessions` sessions opened and closed, by
/// [`AGE_TASKS`] tasks; what is left is what a long-lived cluster keeps
/// (the keys, the counters, and RocksDB's tombstones of the ended
/// sessions' rows).
async fn age(clients: &Clients, opts: &Options) -> Result<(), String> {
    let started = Instant::now();
    eprintln!(
        "latchkey-bench: aging the cluster: {} keys, then {} sessions opened and closed...",
        opts.age_keys, opts.age_sessions
    );
    let value = Arc::new(crate::kv::make_value(opts.value_size));
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(AGE_TASKS);
    for t in 0..AGE_TASKS {
        let (client, next, value) = (clients.for_task(t), Arc::clone(&next), Arc::clone(&value));
        let keys = opts.age_keys;
        tasks.push(tokio::spawn(async move {
            loop {
                let first = next.fetch_add(AGE_BATCH, Ordering::Relaxed);
                if first >= keys {
                    return Ok(());
                }
                let mut batch = latchkey::Batch::new();
                for k in first..(first + AGE_BATCH).min(keys) {
                    batch = batch.put(format!("bench/aged/{k:08}"), value.as_slice());
                }
                client
                    .batch(batch)
                    .await
                    .map_err(|e| format!("aging: a batch of puts failed: {e}"))?
                    .map_err(|i| {
                        format!("aging: condition {i} of an unconditional batch failed")
                    })?;
            }
        }));
    }
    join_aging(tasks).await?;
    let keys_took = started.elapsed();
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::with_capacity(AGE_TASKS);
    for t in 0..AGE_TASKS {
        let (client, next) = (clients.for_task(t), Arc::clone(&next));
        let sessions = opts.age_sessions;
        tasks.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < sessions {
                let session = client
                    .session(SESSION_TTL)
                    .await
                    .map_err(|e| format!("aging: opening a session failed: {e}"))?;
                session
                    .close()
                    .await
                    .map_err(|e| format!("aging: closing a session failed: {e}"))?;
            }
            Ok(())
        }));
    }
    join_aging(tasks).await?;
    eprintln!(
        "latchkey-bench: aged in {:.0}s (keys {:.0}s, sessions {:.0}s)",
        started.elapsed().as_secs_f64(),
        keys_took.as_secs_f64(),
        (started.elapsed() - keys_took).as_secs_f64()
    );
    Ok(())
}

/// How long [`settle`] waits at most.
const SETTLE_WITHIN: Duration = Duration::from_secs(300);
/// How many polls in a row, [`SETTLE_POLL`] apart, must find no RocksDB
/// background job before the stores count as settled.
const SETTLE_QUIET_POLLS: u32 = 3;
const SETTLE_POLL: Duration = Duration::from_millis(500);

/// Wait until every replica has applied all the aging wrote (the same
/// last applied index on each, unchanged between polls) and its RocksDB
/// has flushed and compacted it (`latchkey_storage_background_jobs` at 0),
/// for [`SETTLE_QUIET_POLLS`] polls in a row, so the lock runs measure a
/// cluster that has run for a while, not one still digesting a million
/// keys written in seconds (docs/performance-log.md, change 18: whichever run came
/// first after the aging lost, whatever it was). How long it took.
async fn settle(bed: &Testbed) -> Result<Duration, String> {
    let started = Instant::now();
    let mut quiet = 0;
    let mut before = Vec::new();
    loop {
        let jobs = bed.cluster().background_jobs().await?;
        let applied = bed.cluster().last_applied().await?;
        let caught_up = applied.windows(2).all(|w| w[0] == w[1]) && applied == before;
        before = applied;
        if caught_up && jobs.iter().all(|&j| j == 0) {
            quiet += 1;
            if quiet >= SETTLE_QUIET_POLLS {
                eprintln!(
                    "latchkey-bench: the stores settled in {:.1}s",
                    started.elapsed().as_secs_f64()
                );
                return Ok(started.elapsed());
            }
        } else {
            quiet = 0;
        }
        if started.elapsed() > SETTLE_WITHIN {
            return Err(format!(
                "the replicas' stores did not settle within {SETTLE_WITHIN:?} after the aging \
                 (background jobs: {jobs:?})"
            ));
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}

async fn join_aging(tasks: Vec<tokio::task::JoinHandle<Result<(), String>>>) -> Result<(), String> {
    for task in tasks {
        task.await
            .map_err(|e| format!("an aging task panicked: {e}"))??;
    }
    Ok(())
}

/// What `--aged` put in the cluster before the runs.
#[derive(Debug, Clone, Serialize)]
pub struct Aged {
    pub keys: u64,
    pub sessions: u64,
    /// Seconds the replicas' RocksDB took to settle after the aging.
    pub settled_s: f64,
}

/// The lock benchmark's own parameters.
#[derive(Debug, Clone, Serialize)]
pub struct LockParams {
    pub lock_cycle_clients: Vec<usize>,
    pub contended_clients: Vec<usize>,
    pub session_ttl_s: f64,
    pub acquire_wait_s: f64,
    /// `--aged`: the cluster had run for a while first.
    pub aged: Option<Aged>,
}

impl Params for LockParams {
    fn describe(&self) -> String {
        match &self.aged {
            Some(a) => format!(
                "one session per task (ttl {}s), on a cluster aged by {} keys and {} sessions \
                 opened and closed, measured once its stores settled ({:.0}s)",
                self.session_ttl_s, a.keys, a.sessions, a.settled_s
            ),
            None => format!("one session per task (ttl {}s)", self.session_ttl_s),
        }
    }

    fn notes(&self, results: &[RunResult]) -> String {
        let mut t = String::new();
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "lock-cycle: OPS = acquire + release cycles, each task on a lock of its own; latency = the cycle"
        );
        let _ = writeln!(
            t,
            "contended:  OPS = grants of one lock shared by all tasks; latency = acquire, from send to holding"
        );
        let _ = writeln!(
            t,
            "semaphore:  OPS = grants of one {SEMAPHORE_PERMITS}-permit semaphore shared by all tasks; latency = acquire"
        );
        let _ = writeln!(
            t,
            "multi-lock: OPS = cycles taking two locks at once, each shared with a neighbour in a ring; latency = the cycle"
        );
        for r in results {
            let Some(d) = &r.lock else { continue };
            let _ = writeln!(
                t,
                "{} x{}: acquire p50 {} ms p99 {} ms, release p50 {} ms p99 {} ms; \
                 cycles per task min {} max {}; sessions reopened {}",
                r.workload,
                r.clients,
                ms(d.acquire_latency_us.p50_us),
                ms(d.acquire_latency_us.p99_us),
                ms(d.release_latency_us.p50_us),
                ms(d.release_latency_us.p99_us),
                d.min_task_ops,
                d.max_task_ops,
                d.sessions_reopened,
            );
            if (r.workload == Kind::Contended.name() || r.workload == Kind::Semaphore.name())
                && d.ops_per_s_within_duration > 0.0
            {
                let _ = writeln!(
                    t,
                    "{} x{}: {:.0} grants/s within the duration, i.e. a hand-off (release committed, \
                     next waiter woken) every {:.2} ms; each acquire queues behind ~{} of them",
                    r.workload,
                    r.clients,
                    d.ops_per_s_within_duration,
                    1000.0 / d.ops_per_s_within_duration,
                    // Every other task is ahead of it, less the ones
                    // holding with it (a semaphore's other permits).
                    if r.workload == Kind::Semaphore.name() {
                        r.clients.saturating_sub(SEMAPHORE_PERMITS as usize)
                    } else {
                        r.clients.saturating_sub(1)
                    }
                );
                let _ = writeln!(
                    t,
                    "{} x{}: then {:.2} s for the queue to drain (counted in OPS/S and the latencies)",
                    r.workload, r.clients, d.seconds_past_duration
                );
            }
            match d.alarm(r) {
                Some(alarm) => {
                    let _ = writeln!(t, "{alarm}");
                }
                None => {
                    let _ = writeln!(
                        t,
                        "{} x{}: safety ok: no grant found more holders inside than admitted, tokens strictly increasing per lock",
                        r.workload, r.clients
                    );
                }
            }
        }
        t
    }
}

/// What a lock run adds to its [`RunResult`].
#[derive(Debug, Clone, Serialize)]
pub struct LockDetail {
    /// What the run's `latency_us` measures.
    pub latency_of: &'static str,
    /// Send of the acquire to holding the lock, of completed cycles.
    pub acquire_latency_us: Latency,
    /// The release call, of completed cycles.
    pub release_latency_us: Latency,
    /// Grants that found as many tasks of the benchmark inside as the lock
    /// admits (one; a semaphore's permits). Must be 0.
    pub overlapping_grants: u64,
    /// Grants whose fencing token was not above every earlier token seen
    /// on the same lock. Must be 0.
    pub token_regressions: u64,
    /// Completed cycles of the least and of the most served task (under a
    /// FIFO queue, contended tasks take turns: the two stay close).
    pub min_task_ops: u64,
    pub max_task_ops: u64,
    /// Cycles completed before the duration was over, per second of the
    /// duration: the steady state, without the tail of the run (for
    /// contended, the queue draining once tasks stop queueing again).
    pub ops_per_s_within_duration: f64,
    /// How long the run went on past its duration (the last cycles
    /// finishing; for contended, the queue draining).
    pub seconds_past_duration: f64,
    /// Sessions opened again during the run, after one was lost or a
    /// release failed (which may leave the lock held until its session
    /// ends, so the benchmark closes that session).
    pub sessions_reopened: u64,
}

impl LockDetail {
    /// A loud line if the run broke mutual exclusion or fencing order.
    fn alarm(&self, r: &RunResult) -> Option<String> {
        (self.overlapping_grants > 0 || self.token_regressions > 0).then(|| {
            format!(
                "!!! SAFETY VIOLATION in {} x{}: {} grants found another holder inside, \
                 {} fencing tokens did not increase !!!",
                r.workload, r.clients, self.overlapping_grants, self.token_regressions
            )
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Each task on its own lock; latency of acquire + release.
    Cycle,
    /// All tasks on one lock; latency of the acquire.
    Contended,
    /// All tasks on one semaphore; latency of the acquire.
    Semaphore,
    /// Each task on its lock and its neighbour's at once; latency of
    /// acquire + release.
    MultiLock,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Cycle => "lock-cycle",
            Kind::Contended => "contended",
            Kind::Semaphore => "semaphore",
            Kind::MultiLock => "multi-lock",
        }
    }

    /// The locks task `task` of `tasks` takes, as indexes into the run's
    /// witnesses, and their names.
    fn locks(self, task: usize, tasks: usize) -> Vec<(usize, String)> {
        match self {
            Kind::Cycle => vec![(task, format!("bench/cycle/{task}"))],
            Kind::Contended => vec![(0, "bench/contended".to_string())],
            Kind::Semaphore => vec![(0, "bench/semaphore".to_string())],
            Kind::MultiLock => {
                let ring = tasks.max(2);
                let next = (task + 1) % ring;
                vec![
                    (task, format!("bench/multi/{task}")),
                    (next, format!("bench/multi/{next}")),
                ]
            }
        }
    }

    /// The witnesses of a run of `tasks` tasks.
    fn witnesses(self, tasks: usize) -> Vec<Witness> {
        let (n, witness): (usize, fn() -> Witness) = match self {
            Kind::Cycle => (tasks, Witness::lock),
            Kind::MultiLock => (tasks.max(2), Witness::lock),
            Kind::Contended => (1, Witness::lock),
            Kind::Semaphore => (1, || Witness::new(SEMAPHORE_PERMITS, false)),
        };
        (0..n).map(|_| witness()).collect()
    }

    fn latency_of(self) -> &'static str {
        match self {
            Kind::Cycle => "acquire + release",
            Kind::Contended | Kind::Semaphore => "acquire (send to holding)",
            Kind::MultiLock => "acquire of both + release of both",
        }
    }

    /// Whether the run's latency is the acquire's alone.
    fn times_acquire(self) -> bool {
        matches!(self, Kind::Contended | Kind::Semaphore)
    }

    /// What task `task` of `tasks` acquires in `session`.
    fn handle(self, session: &Session, task: usize, tasks: usize) -> Handle {
        let names: Vec<String> = self
            .locks(task, tasks)
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        match self {
            Kind::Cycle | Kind::Contended => Handle::Lock(session.lock(names.concat().as_str())),
            Kind::Semaphore => {
                Handle::Semaphore(session.semaphore(names.concat(), SEMAPHORE_PERMITS))
            }
            Kind::MultiLock => Handle::Multi(session.lock_all(names)),
        }
    }
}

/// What one task acquires and releases.
enum Handle {
    Lock(Lock),
    Semaphore(Semaphore),
    Multi(MultiLock),
}

/// What one task holds.
enum Held {
    One(LockGuard),
    All(MultiLockGuard),
}

impl Handle {
    async fn acquire_timeout(&self, wait: Duration) -> Result<Option<Held>, Error> {
        Ok(match self {
            Handle::Lock(l) => l.acquire_timeout(wait).await?.map(Held::One),
            Handle::Semaphore(s) => s.acquire_timeout(wait).await?.map(Held::One),
            Handle::Multi(m) => m.acquire_timeout(wait).await?.map(Held::All),
        })
    }
}

impl Held {
    /// The grants' tokens, in the order of [`Kind::locks`].
    fn tokens(&self) -> Vec<u64> {
        match self {
            Held::One(g) => vec![g.token().into()],
            Held::All(g) => g.tokens().into_iter().map(u64::from).collect(),
        }
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            Held::One(g) => g.release().await,
            Held::All(g) => g.release().await,
        }
    }
}

/// Sees every grant of one lock within the benchmark: how many are
/// inside, and the highest fencing token so far.
struct Witness {
    inside: AtomicU32,
    /// How many may be inside at once.
    admits: u32,
    /// Whether tokens must grow grant by grant (an exclusive lock's do; a
    /// semaphore's concurrent permits are seen in any order).
    ordered: bool,
    /// The highest token seen, plus one (0: none yet).
    highest: AtomicU64,
}

impl Witness {
    fn new(admits: u32, ordered: bool) -> Witness {
        Witness {
            inside: AtomicU32::new(0),
            admits,
            ordered,
            highest: AtomicU64::new(0),
        }
    }

    /// An exclusive lock's.
    fn lock() -> Witness {
        Witness::new(1, true)
    }

    /// A grant of token `token` begins: (more were inside than the lock
    /// admits, the token is not above every earlier one).
    fn enter(&self, token: u64) -> (bool, bool) {
        let before_inside = self.inside.fetch_add(1, Ordering::SeqCst);
        let before = self
            .highest
            .fetch_max(token.saturating_add(1), Ordering::SeqCst);
        (before_inside >= self.admits, self.ordered && before > token)
    }

    /// The holder is about to release: from here on another may enter.
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What one lock task measured.
struct LockTask {
    /// The run's latency (cycle or acquire) and its counts.
    stats: TaskStats,
    acquire: Histogram<u64>,
    release: Histogram<u64>,
    overlaps: u64,
    regressions: u64,
    reopened: u64,
    /// Cycles completed before the deadline.
    in_window: u64,
    /// The task's session at the end, closed after the clock stops.
    session: Option<Session>,
}

/// One run: `tasks` tasks of `kind` for `duration`.
async fn run(
    clients: &Clients,
    kind: Kind,
    tasks: usize,
    duration: Duration,
) -> Result<RunResult, String> {
    // Sessions first, concurrently, before the clock starts.
    let mut opening = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let client = clients.for_task(task);
        opening.push(tokio::spawn(
            async move { client.session(SESSION_TTL).await },
        ));
    }
    let mut sessions = Vec::with_capacity(tasks);
    for (task, opened) in join_all(kind.name(), opening)
        .await?
        .into_iter()
        .enumerate()
    {
        sessions.push(
            opened.map_err(|e| {
                format!("{}: task {task} cannot open its session: {e}", kind.name())
            })?,
        );
    }

    let mut states = Vec::with_capacity(tasks);
    for _ in 0..tasks {
        states.push(LockTask {
            stats: TaskStats::new()?,
            acquire: new_histogram()?,
            release: new_histogram()?,
            overlaps: 0,
            regressions: 0,
            reopened: 0,
            in_window: 0,
            session: None,
        });
    }

    let witnesses = Arc::new(kind.witnesses(tasks));
    let started = Instant::now();
    let deadline = started + duration;
    let mut handles = Vec::with_capacity(tasks);
    for (task, (session, state)) in sessions.into_iter().zip(states).enumerate() {
        let client = clients.for_task(task);
        let job = Job {
            kind,
            task,
            tasks,
            witnesses: Arc::clone(&witnesses),
        };
        handles.push(tokio::spawn(cycle(job, client, session, deadline, state)));
    }
    let done = join_all(kind.name(), handles).await?;
    let mut result = summarize(kind.name(), tasks, started, done.iter().map(|t| &t.stats))?;

    let mut acquire = new_histogram()?;
    let mut release = new_histogram()?;
    let (mut overlaps, mut regressions, mut reopened, mut in_window) = (0, 0, 0, 0);
    for t in &done {
        merge_into(&mut acquire, &t.acquire)?;
        merge_into(&mut release, &t.release)?;
        overlaps += t.overlaps;
        regressions += t.regressions;
        reopened += t.reopened;
        in_window += t.in_window;
    }
    result.lock = Some(LockDetail {
        latency_of: kind.latency_of(),
        acquire_latency_us: Latency::of(&acquire),
        release_latency_us: Latency::of(&release),
        overlapping_grants: overlaps,
        token_regressions: regressions,
        min_task_ops: done.iter().map(|t| t.stats.ok).min().unwrap_or(0),
        max_task_ops: done.iter().map(|t| t.stats.ok).max().unwrap_or(0),
        ops_per_s_within_duration: in_window as f64 / duration.as_secs_f64().max(1e-9),
        seconds_past_duration: (result.seconds - duration.as_secs_f64()).max(0.0),
        sessions_reopened: reopened,
    });

    let closing: Vec<_> = done
        .into_iter()
        .filter_map(|t| t.session)
        .map(|s| tokio::spawn(async move { s.close().await }))
        .collect();
    // Untimed: end the sessions now rather than leave them to expire.
    for closed in join_all(kind.name(), closing).await? {
        if let Err(e) = closed {
            eprintln!("latchkey-bench: warning: closing a session failed: {e}");
        }
    }
    Ok(result)
}

/// What one task does, and the witnesses of its run.
struct Job {
    kind: Kind,
    task: usize,
    tasks: usize,
    witnesses: Arc<Vec<Witness>>,
}

/// One task: acquire → release of its locks until `deadline`.
async fn cycle(
    job: Job,
    client: Client,
    session: Session,
    deadline: Instant,
    mut t: LockTask,
) -> LockTask {
    let kind = job.kind;
    let witnesses: Vec<usize> = kind
        .locks(job.task, job.tasks)
        .into_iter()
        .map(|(w, _)| w)
        .collect();
    let mut current: Option<(Session, Handle)> = {
        let handle = kind.handle(&session, job.task, job.tasks);
        Some((session, handle))
    };
    while Instant::now() < deadline {
        let Some((_, lock)) = &current else {
            match client.session(SESSION_TTL).await {
                Ok(s) => {
                    t.reopened += 1;
                    let handle = kind.handle(&s, job.task, job.tasks);
                    current = Some((s, handle));
                }
                Err(e) => {
                    t.stats
                        .failure(|| format!("cannot open a new session: {e}"));
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
            continue;
        };

        let t0 = Instant::now();
        let guard = match lock.acquire_timeout(ACQUIRE_WAIT).await {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                t.stats
                    .failure(|| format!("acquire: not granted within {}s", ACQUIRE_WAIT.as_secs()));
                continue;
            }
            Err(e) => {
                if matches!(e, Error::SessionLost { .. }) {
                    // Lost for good: open another one.
                    current = None;
                }
                t.stats.failure(|| format!("acquire: {e}"));
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let t1 = Instant::now();
        let tokens = guard.tokens();
        if tokens.len() != witnesses.len() {
            t.stats.failure(|| {
                format!(
                    "acquire: {} grants for {} locks",
                    tokens.len(),
                    witnesses.len()
                )
            });
        }
        for (w, token) in witnesses.iter().zip(&tokens) {
            if let Some(witness) = job.witnesses.get(*w) {
                let (overlap, regression) = witness.enter(*token);
                t.overlaps += u64::from(overlap);
                t.regressions += u64::from(regression);
            }
        }
        // Inside for a moment: another task scheduled meanwhile that was
        // granted too would find this one there.
        tokio::task::yield_now().await;
        for w in &witnesses {
            if let Some(witness) = job.witnesses.get(*w) {
                witness.leave();
            }
        }

        let released = guard.release().await;
        let t2 = Instant::now();
        match released {
            Ok(()) => {
                t.acquire.saturating_record(micros(t1 - t0));
                t.release.saturating_record(micros(t2 - t1));
                t.stats.success(if kind.times_acquire() {
                    t1 - t0
                } else {
                    t2 - t0
                });
                t.in_window += u64::from(t2 <= deadline);
            }
            Err(e) => {
                t.stats.failure(|| format!("release: {e}"));
                // The lock may still be held: ending the session frees it.
                if let Some((s, _)) = current.take() {
                    let _ = s.close().await;
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    t.session = current.map(|(s, _)| s);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn witness_sees_overlaps_and_token_regressions() {
        let w = Witness::lock();
        assert_eq!(w.enter(0), (false, false));
        w.leave();
        assert_eq!(w.enter(5), (false, false));
        // A second grant while the first holder is inside, with a lower token.
        assert_eq!(w.enter(4), (true, true));
        w.leave();
        w.leave();
        assert_eq!(w.enter(5), (false, true));
        w.leave();
        assert_eq!(w.enter(6), (false, false));
    }

    #[test]
    fn a_semaphore_witness_admits_its_permits() {
        let w = Witness::new(2, false);
        assert_eq!(w.enter(7), (false, false));
        assert_eq!(w.enter(5), (false, false));
        assert_eq!(w.enter(9), (true, false));
        w.leave();
        w.leave();
        w.leave();
        assert_eq!(w.enter(1), (false, false));
    }

    #[test]
    fn lock_names() {
        let names = |kind: Kind, task, tasks| -> Vec<String> {
            kind.locks(task, tasks)
                .into_iter()
                .map(|(_, n)| n)
                .collect()
        };
        assert_eq!(names(Kind::Cycle, 3, 8), ["bench/cycle/3"]);
        assert_eq!(names(Kind::Contended, 3, 8), ["bench/contended"]);
        assert_eq!(names(Kind::Contended, 0, 8), names(Kind::Contended, 9, 8));
        assert_eq!(names(Kind::Semaphore, 2, 8), ["bench/semaphore"]);
        assert_eq!(
            names(Kind::MultiLock, 7, 8),
            ["bench/multi/7", "bench/multi/0"]
        );
        assert_eq!(
            names(Kind::MultiLock, 0, 1),
            ["bench/multi/0", "bench/multi/1"]
        );
        assert_eq!(Kind::MultiLock.locks(7, 8)[1].0, 0);
    }
}
