//! Workload processes: `latchkey-nemesis worker --role ROLE ...`.
//!
//! Each worker is a process of its own (so the nemesis can pause a client
//! with SIGSTOP, and a paused client is paused whole, watchdog included),
//! running a few tasks; each task is one history process and has at most
//! one operation in flight. Every operation is recorded as an invocation
//! and one completion:
//!
//! - `ok` when the cluster answered and the operation took effect (with its
//!   result);
//! - `fail` only when it certainly did not take effect: a refused command
//!   (`Error::Refused`), or a read (reads change nothing);
//! - `unknown` otherwise: a timeout, a lost connection, an unavailable
//!   cluster may all hide a write that was applied.
//!
//! The worker stops when its standard input closes (the controller drops
//! it at the end of the run, or dies): the tasks finish the operation in
//! flight and return.

mod churn_holder;
mod watch_load;

pub use churn_holder::CHURN_LOCK;
pub use watch_load::BOUND_PREFIX;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use latchkey::{Client, ClientOptions, Error as ClientError, LockGuard, MultiLockGuard, Session};
use latchkey_check::history::ops;
use latchkey_check::EventKind;
use tokio::sync::watch;

use crate::gate::{GateClient, Verdict};
use crate::outcome::write_failure;
use crate::record::Recorder;
use crate::rng::Rng;

/// The workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Take a lock, write through the fence gate and to a fenced KV key,
    /// release. [`ELECTION_RESOURCE`] is an election instead: candidates
    /// campaign, the term is the token, resigning is the release, so the
    /// lock-safety rules hold the elected leader's writes to account too.
    /// Some holds are multi-locks of two resources ([`LOCK_PLANS`]), taken
    /// and released in one step, each lock's writes fenced by its own
    /// grant, so the same rules judge multi-lock grants lock by lock.
    Lock,
    /// Read, write and compare-and-put a few keys (linearizability).
    Register,
    /// `next_sequence` allocations.
    Sequence,
    /// Puts of unique keys, read back after a full restart.
    Durability,
    /// Writers change keys under one prefix, a binder binds keys to
    /// sessions it closes or abandons, watchers list and watch it (tasks 0
    /// and 1 write, task 2 binds, the others watch).
    Watch,
    /// Take a permit of [`SEMAPHORE`] (of [`SEMAPHORE_PERMITS`]), make
    /// fenced KV writes with it, release: more tasks than permits, so they
    /// queue, and a paused worker's permits return to the others while it
    /// still believes it holds them.
    Semaphore,
    /// The leader-churn phase's holder (one task): take [`CHURN_LOCK`] in
    /// a session of `--ttl-ms`, record the grant and every lease the
    /// client vouches for, and hold it until SIGKILLed.
    Holder,
}

/// The resource the lock workers campaign for as an election.
pub const ELECTION_RESOURCE: &str = "res1";
/// What one hold of a lock worker takes: one resource (a lock, or the
/// election), or two at once (a multi-lock, named in either order, so
/// multi-locks in opposite orders meet, and single holds of the same
/// resources queue with them).
pub const LOCK_PLANS: [&[&str]; 5] = [
    &["res0"],
    &[ELECTION_RESOURCE],
    &["res2"],
    &["res0", "res2"],
    &["res2", "res0"],
];
/// The semaphore of the semaphore workers.
pub const SEMAPHORE: &str = "sem0";
/// Its permits: fewer than the semaphore worker's tasks.
pub const SEMAPHORE_PERMITS: u32 = 2;
/// The register keys of one generation: `reg/<generation>/<i>`.
pub const REGISTERS: usize = 3;
/// How long the register workload stays on one generation of keys. The
/// linearizability search is exponential in the worst case, so each key's
/// history is kept to some hundreds of operations (latchkey-check's advice):
/// every 20 s the tasks move to fresh keys.
pub const KEY_GENERATION_NS: u64 = 20_000_000_000;
/// The sequence key.
pub const SEQUENCE: &str = "seq/main";
/// The prefix of the durability workload's keys.
pub const DURABLE_PREFIX: &str = "dur/";
/// How many history processes one worker may have (process ids are
/// `1 + worker * TASK_SLOTS + task`; 0 is the controller).
pub const TASK_SLOTS: u64 = 16;
/// A lock task's multi-lock acquires its k-th resource (k >= 1) as history
/// process `process + k * MULTI_LOCK_PROCESSES`: each history process has
/// one operation in flight, and the acquires of a multi-lock are in flight
/// together, over the same real-time interval.
pub const MULTI_LOCK_PROCESSES: u64 = 1_000_000;

/// Everything a worker needs, from its command line.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The workload.
    #[arg(long, value_enum)]
    pub role: Role,
    /// This worker's number (unique in the run).
    #[arg(long)]
    pub index: u64,
    /// Concurrent tasks (history processes).
    #[arg(long, default_value_t = 2)]
    pub tasks: u64,
    /// The replicas, host:port separated by commas.
    #[arg(long, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Seed of the workload's choices.
    #[arg(long)]
    pub seed: u64,
    /// Where to write the history (JSON lines).
    #[arg(long)]
    pub out: PathBuf,
    /// The fence gate's socket (lock role).
    #[arg(long)]
    pub gate: Option<PathBuf>,
    /// Session TTL in milliseconds (lock role).
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// Pause between operations of a task, in milliseconds.
    #[arg(long, default_value_t = 20)]
    pub pace_ms: u64,
    /// Talk TLS, trusting `DIR/ca.pem` (what `latchkey certs` wrote).
    #[arg(long)]
    pub tls_dir: Option<PathBuf>,
}

/// Shared by a worker's tasks.
struct Ctx {
    args: WorkerArgs,
    /// How `client` was built: the watchers build their own from it.
    options: ClientOptions,
    client: Client,
    rec: Recorder,
    stop: watch::Receiver<bool>,
}

impl Ctx {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn pace(&self) {
        let mut stop = self.stop.clone();
        let _ = tokio::time::timeout(
            Duration::from_millis(self.args.pace_ms),
            stop.wait_for(|s| *s),
        )
        .await;
    }
}

/// Runs a worker until its standard input closes.
pub async fn run(args: WorkerArgs) -> crate::error::Result<()> {
    let mut options = ClientOptions::default()
        .with_request_timeout(Duration::from_secs(5))
        .with_attempt_timeout(Duration::from_secs(1))
        .with_connect_timeout(Duration::from_millis(500));
    if let Some(dir) = &args.tls_dir {
        let tls = latchkey::TlsOptions::from_files(&dir.join("ca.pem"), None)
            .map_err(|e| crate::error::Error::Worker(format!("TLS: {e}")))?;
        options = options.with_tls(tls);
    }
    let client = Client::with_options(&args.endpoints, options.clone())
        .map_err(|e| crate::error::Error::Worker(format!("cannot build a client: {e}")))?;
    let rec = Recorder::create(&args.out)?;
    let (stop_tx, stop) = watch::channel(false);
    // Standard input closing is the signal to stop.
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        let _ = stop_tx.send(true);
    });
    let ctx = Arc::new(Ctx {
        args: args.clone(),
        options,
        client,
        rec,
        stop,
    });
    let base = Rng::new(args.seed).fork(args.index);
    let mut tasks = tokio::task::JoinSet::new();
    // A lock worker has one more task: an observer of the election its
    // other tasks campaign in.
    let tasks_of_role = match args.role {
        Role::Lock => args.tasks + 1,
        _ => args.tasks,
    };
    for t in 0..tasks_of_role.min(TASK_SLOTS) {
        let process = 1 + args.index * TASK_SLOTS + t;
        let rng = base.fork(t);
        let ctx = ctx.clone();
        tasks.spawn(async move {
            match ctx.args.role {
                Role::Lock if t == ctx.args.tasks => observer_task(&ctx, process).await,
                Role::Lock => lock_task(&ctx, process, rng).await,
                Role::Register => register_task(&ctx, process, rng).await,
                Role::Sequence => sequence_task(&ctx, process, rng).await,
                Role::Durability => durability_task(&ctx, process).await,
                Role::Watch => watch_task(&ctx, process, t, rng).await,
                Role::Semaphore => semaphore_task(&ctx, process, rng).await,
                Role::Holder if t == 0 => churn_holder::holder_task(&ctx, process).await,
                Role::Holder => {}
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Tasks 0 and 1 of a watch worker write, task 2 binds keys to sessions;
/// the others watch, each with a client of its own that tries the replicas
/// in a different order, so that followers and the leader both serve
/// watches.
async fn watch_task(ctx: &Ctx, process: u64, task: u64, rng: Rng) {
    let load = |client| watch_load::Load {
        client,
        rec: &ctx.rec,
        stop: ctx.stop.clone(),
        pace: Duration::from_millis(ctx.args.pace_ms),
    };
    if task < 2 {
        return watch_load::writer(load(&ctx.client), process, rng).await;
    }
    if task == 2 {
        let ttl = Duration::from_millis(ctx.args.ttl_ms);
        return watch_load::binder(load(&ctx.client), process, ttl, rng).await;
    }
    let mut endpoints = ctx.args.endpoints.clone();
    let turn = usize::try_from(task).unwrap_or(0) % endpoints.len().max(1);
    endpoints.rotate_left(turn);
    match Client::with_options(&endpoints, ctx.options.clone()) {
        Ok(client) => watch_load::watcher(load(&client), process, rng).await,
        Err(e) => tracing::error!(%e, "cannot build a watcher's client"),
    }
}

async fn register_task(ctx: &Ctx, process: u64, mut rng: Rng) {
    let mut n = 0u64;
    // The last value this task saw per key: what a compare-and-put expects.
    let mut seen: [Option<String>; REGISTERS] = Default::default();
    let start = crate::clock::now_ns();
    let mut generation = 0;
    while !ctx.stopping() {
        let now_generation = crate::clock::now_ns().saturating_sub(start) / KEY_GENERATION_NS;
        if now_generation != generation {
            generation = now_generation;
            seen = Default::default();
        }
        let k = rng.below(REGISTERS);
        let key = format!("reg/{generation}/{k}");
        let key = key.as_str();
        n += 1;
        let value = format!("p{process}-{n}");
        match rng.below(10) {
            0..=3 => {
                ctx.rec.invoke(process, ops::read(key, None));
                match ctx.client.get(key).await {
                    Ok(v) => {
                        let v = v.map(|v| String::from_utf8_lossy(&v).into_owned());
                        ctx.rec
                            .record(process, EventKind::Ok, ops::read(key, v.as_deref()));
                        seen[k] = v;
                    }
                    Err(_) => {
                        ctx.rec
                            .record(process, EventKind::Fail, ops::read(key, None));
                    }
                }
            }
            4..=6 => {
                let op = ops::write(key, &value);
                ctx.rec.invoke(process, op.clone());
                match ctx.client.put(key, &value).await {
                    Ok(_) => {
                        ctx.rec.record(process, EventKind::Ok, op);
                        seen[k] = Some(value);
                    }
                    Err(e) => {
                        ctx.rec.record(process, write_failure(&e), op);
                    }
                }
            }
            _ => {
                let expected = seen[k].clone();
                ctx.rec
                    .invoke(process, ops::cas(key, expected.as_deref(), &value, None));
                match ctx
                    .client
                    .compare_and_put(key, expected.as_deref(), &value)
                    .await
                {
                    Ok((succeeded, current)) => {
                        ctx.rec.record(
                            process,
                            EventKind::Ok,
                            ops::cas(key, expected.as_deref(), &value, Some(succeeded)),
                        );
                        seen[k] = if succeeded {
                            Some(value)
                        } else {
                            current.map(|v| String::from_utf8_lossy(&v).into_owned())
                        };
                    }
                    Err(e) => {
                        ctx.rec.record(
                            process,
                            write_failure(&e),
                            ops::cas(key, expected.as_deref(), &value, None),
                        );
                    }
                }
            }
        }
        ctx.pace().await;
    }
}

async fn sequence_task(ctx: &Ctx, process: u64, mut rng: Rng) {
    while !ctx.stopping() {
        let step = rng.between(1, 3);
        ctx.rec.invoke(process, ops::alloc(SEQUENCE, step, None));
        match ctx.client.next_sequence(SEQUENCE, step).await {
            Ok(r) => {
                ctx.rec.record(
                    process,
                    EventKind::Ok,
                    ops::alloc(SEQUENCE, step, Some((r.start, r.end))),
                );
            }
            Err(e) => {
                ctx.rec
                    .record(process, write_failure(&e), ops::alloc(SEQUENCE, step, None));
            }
        }
        ctx.pace().await;
    }
}

async fn durability_task(ctx: &Ctx, process: u64) {
    let mut n = 0u64;
    while !ctx.stopping() {
        n += 1;
        let key = format!("{DURABLE_PREFIX}p{process}/{n:08}");
        let value = format!("v{process}-{n}");
        let op = ops::put(&key, &value);
        ctx.rec.invoke(process, op.clone());
        let kind = match ctx.client.put(&key, &value).await {
            Ok(_) => EventKind::Ok,
            Err(e) => write_failure(&e),
        };
        ctx.rec.record(process, kind, op);
        ctx.pace().await;
    }
}

/// Fenced writes a holder makes per grant.
const WRITES_PER_HOLD: u64 = 3;

async fn lock_task(ctx: &Ctx, process: u64, mut rng: Rng) {
    let Some(socket) = ctx.args.gate.clone() else {
        tracing::error!("the lock role needs --gate");
        return;
    };
    let mut gate = GateClient::new(socket);
    let mut session: Option<Session> = None;
    let mut n = 0u64;
    while !ctx.stopping() {
        let Some(s) = live_session(ctx, &mut session).await else {
            continue;
        };
        let plan = LOCK_PLANS[rng.below(LOCK_PLANS.len())];
        let holder = format!("p{process}/s{}", s.id());
        // A multi-lock's acquire of each resource after the first is
        // recorded by a process of its own (see MULTI_LOCK_PROCESSES), over
        // the same interval as the first's.
        let acquirer = |i: usize| process + MULTI_LOCK_PROCESSES * i as u64;
        for (i, resource) in plan.iter().enumerate() {
            ctx.rec
                .invoke(acquirer(i), ops::acquire(resource, &holder, None));
        }
        let complete = |i: usize, kind: EventKind, token: Option<u64>| {
            ctx.rec
                .record(acquirer(i), kind, ops::acquire(plan[i], &holder, token));
        };
        let wait = Duration::from_secs(3);
        let acquired = match plan {
            [resource] if *resource == ELECTION_RESOURCE => s
                .election(*resource)
                .campaign_timeout(&holder, wait)
                .await
                .map(|won| won.map(|l| Held::One(l.into_guard()))),
            [resource] => s
                .lock(*resource)
                .acquire_timeout(wait)
                .await
                .map(|g| g.map(Held::One)),
            many => s
                .lock_all(many.iter().copied())
                .acquire_timeout(wait)
                .await
                .map(|g| g.map(Held::All)),
        };
        let held = match acquired {
            Ok(Some(held)) => held,
            Ok(None) => {
                // Not granted in time; a late grant is withdrawn in the
                // background, so the outcome is unknown.
                for i in 0..plan.len() {
                    complete(i, EventKind::Unknown, None);
                }
                continue;
            }
            Err(e) => {
                let kind = match e {
                    ClientError::Refused(_) => EventKind::Fail,
                    _ => EventKind::Unknown,
                };
                for i in 0..plan.len() {
                    complete(i, kind, None);
                }
                if !s.is_live() {
                    session = None;
                }
                ctx.pace().await;
                continue;
            }
        };
        // A multi-lock's guards are in the order of the plan.
        for (i, guard) in held.guards().iter().enumerate() {
            complete(i, EventKind::Ok, Some(u64::from(guard.token())));
        }
        // Recorded under the plan's resource names: an election's grant is
        // of its lock, "latchkey.election/res1", but stands for "res1".
        for (resource, guard) in plan.iter().zip(held.guards()) {
            ctx.rec.record(
                process,
                EventKind::Ok,
                ops::hold_start(resource, &holder, u64::from(guard.token())),
            );
        }
        // A client that checked its lock once and then writes: a pause (or a
        // partition) in between makes these writes stale, and the stores
        // must refuse them.
        for _ in 0..WRITES_PER_HOLD {
            for (resource, guard) in plan.iter().zip(held.guards()) {
                tokio::time::sleep(Duration::from_millis(rng.between(2, 10))).await;
                n += 1;
                fenced_writes(ctx, process, &mut gate, (resource, guard), &holder, n).await;
            }
        }
        for (resource, guard) in plan.iter().zip(held.guards()) {
            ctx.rec.record(
                process,
                EventKind::Ok,
                ops::hold_end(resource, &holder, u64::from(guard.token())),
            );
        }
        let released = match held {
            Held::One(guard) => guard.release().await,
            Held::All(all) => all.release().await,
        };
        if let Err(e) = released {
            tracing::debug!(%e, "release failed");
        }
        if !s.is_live() {
            session = None;
        }
        ctx.pace().await;
    }
    if let Some(s) = session {
        let _ = s.close().await;
    }
}

/// The task's session, opened again once it is no longer live; `None`
/// (after a pause) while the cluster cannot open one. A refusal is a bad
/// setting, not a fault of the run: the worker stops loudly.
async fn live_session(ctx: &Ctx, session: &mut Option<Session>) -> Option<Session> {
    if let Some(s) = session.as_ref().filter(|s| s.is_live()) {
        return Some(s.clone());
    }
    match ctx
        .client
        .session(Duration::from_millis(ctx.args.ttl_ms))
        .await
    {
        Ok(s) => {
            *session = Some(s.clone());
            Some(s)
        }
        Err(e @ (ClientError::InvalidArgument(_) | ClientError::Refused(_))) => {
            tracing::error!(%e, "the cluster refuses to open a session");
            std::process::exit(3);
        }
        Err(e) => {
            tracing::debug!(%e, "cannot open a session yet");
            *session = None;
            ctx.pace().await;
            None
        }
    }
}

/// Follows who leads [`ELECTION_RESOURCE`], recording every leader it is
/// told of. A stream that ends (an error trying again cannot cure) is
/// opened again; its first report may follow missed changes, so it is
/// recorded as after a gap.
async fn observer_task(ctx: &Ctx, process: u64) {
    let mut fresh = false;
    while !ctx.stopping() {
        let mut changes = ctx.client.observe_leader(ELECTION_RESOURCE);
        let mut stop = ctx.stop.clone();
        loop {
            let next = tokio::select! {
                next = changes.next() => next,
                _ = stop.wait_for(|s| *s) => return,
            };
            match next {
                Some(Ok(change)) => {
                    let term = change.leader.map(|l| u64::from(l.term));
                    let skipped = change.skipped || std::mem::take(&mut fresh);
                    ctx.rec.record(
                        process,
                        EventKind::Ok,
                        ops::observed(ELECTION_RESOURCE, term, skipped),
                    );
                }
                Some(Err(ClientError::Unavailable { .. })) => {}
                Some(Err(e)) => {
                    tracing::debug!(%e, "observing the election");
                    break;
                }
                None => break,
            }
        }
        fresh = true;
        ctx.pace().await;
    }
}

/// Takes a permit of [`SEMAPHORE`], makes fenced writes with it (each to
/// this task's own key: several permits are current at once), releases.
async fn semaphore_task(ctx: &Ctx, process: u64, mut rng: Rng) {
    let mut session: Option<Session> = None;
    let mut n = 0u64;
    while !ctx.stopping() {
        let Some(s) = live_session(ctx, &mut session).await else {
            continue;
        };
        let holder = format!("p{process}/s{}", s.id());
        let acquire = |token| ops::permit(SEMAPHORE, SEMAPHORE_PERMITS, &holder, token);
        ctx.rec.invoke(process, acquire(None));
        let granted = s
            .semaphore(SEMAPHORE, SEMAPHORE_PERMITS)
            .acquire_timeout(Duration::from_secs(3))
            .await;
        let guard = match granted {
            Ok(Some(guard)) => guard,
            Ok(None) => {
                // A late grant is withdrawn in the background.
                ctx.rec.record(process, EventKind::Unknown, acquire(None));
                continue;
            }
            Err(e) => {
                let kind = match e {
                    ClientError::Refused(_) => EventKind::Fail,
                    _ => EventKind::Unknown,
                };
                ctx.rec.record(process, kind, acquire(None));
                ctx.pace().await;
                continue;
            }
        };
        let token = u64::from(guard.token());
        ctx.rec.record(process, EventKind::Ok, acquire(Some(token)));
        let key = format!("semfenced/p{process}");
        for _ in 0..WRITES_PER_HOLD {
            tokio::time::sleep(Duration::from_millis(rng.between(2, 10))).await;
            n += 1;
            let write = |accepted| ops::permit_write(SEMAPHORE, &key, &holder, token, accepted);
            ctx.rec.invoke(process, write(None));
            let (kind, accepted) = match guard.put(&key, format!("p{process}-{n}")).await {
                Ok(_) => (EventKind::Ok, Some(true)),
                Err(e) if e.is_stale_fence() => (EventKind::Ok, Some(false)),
                Err(e) => (write_failure(&e), None),
            };
            ctx.rec.record(process, kind, write(accepted));
        }
        if let Err(e) = guard.release().await {
            tracing::debug!(%e, "release failed");
        }
        ctx.pace().await;
    }
    if let Some(s) = session {
        let _ = s.close().await;
    }
}

/// A lock worker's hold: one grant, or a multi-lock's grants.
enum Held {
    One(LockGuard),
    All(MultiLockGuard),
}

impl Held {
    fn guards(&self) -> &[LockGuard] {
        match self {
            Held::One(g) => std::slice::from_ref(g),
            Held::All(all) => all.guards(),
        }
    }
}

/// One write through the fence gate and one fenced KV write, each
/// recorded, with the token of `guard`, the grant of `resource`.
async fn fenced_writes(
    ctx: &Ctx,
    process: u64,
    gate: &mut GateClient,
    (resource, guard): (&str, &LockGuard),
    holder: &str,
    n: u64,
) {
    let token = u64::from(guard.token());
    ctx.rec
        .invoke(process, ops::gate_write(resource, holder, token, None));
    let kind_op = match gate.admit(resource, token).await {
        Ok(v) => (
            EventKind::Ok,
            ops::gate_write(resource, holder, token, Some(v == Verdict::Accepted)),
        ),
        Err(e) => {
            tracing::debug!(%e, "gate write outcome unknown");
            (
                EventKind::Unknown,
                ops::gate_write(resource, holder, token, None),
            )
        }
    };
    ctx.rec.record(process, kind_op.0, kind_op.1);

    let key = format!("fenced/{resource}");
    let value = format!("p{process}-{n}");
    ctx.rec
        .invoke(process, ops::kv_write(resource, &key, holder, token, None));
    let (kind, accepted) = match guard.put(&key, &value).await {
        Ok(_) => (EventKind::Ok, Some(true)),
        Err(e) if e.is_stale_fence() => (EventKind::Ok, Some(false)),
        Err(e) => (write_failure(&e), None),
    };
    let accepted = if kind == EventKind::Ok {
        accepted
    } else {
        None
    };
    ctx.rec.record(
        process,
        kind,
        ops::kv_write(resource, &key, holder, token, accepted),
    );
}
