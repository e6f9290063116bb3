//! The controller: sets up the hosts and the cluster, starts the workload
//! processes, carries out the nemesis schedule (repairing replicas whose
//! disk faults left them unable to serve, see [`crate::disk`]), then
//! restores the cluster, checks durability after a full restart, merges the
//! histories, runs the checkers and writes the report.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions, ScanRange};
use latchkey_check::history::ops;
use latchkey_check::EventKind;
use tokio::sync::watch;

use crate::churn;
use crate::clock::now_ns;
use crate::cluster::{detach, leader_of, log_file, signal, Cluster};
use crate::disk;
use crate::error::{Error, Result};
use crate::gate;
use crate::nemesis::{self, Fault, FaultWindow, Kind, PlanInput, Target};
use crate::net::{netns_available, Netns};
use crate::record::{self, Recorder};
use crate::report::{self, LeaderSample, RunInfo};
use crate::rng::Rng;
use crate::worker::{Role, BOUND_PREFIX, DURABLE_PREFIX, SEQUENCE, TASK_SLOTS};

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The `latchkey` binary the replicas run.
    pub server_bin: PathBuf,
    /// The report folder (created; must not exist yet or be empty).
    pub out: PathBuf,
    /// The seed of the schedule and the workloads.
    pub seed: u64,
    /// How long the fault phase lasts.
    pub duration: Duration,
    /// The enabled fault kinds.
    pub kinds: Vec<Kind>,
    /// Run on loopback even when namespaces are available.
    pub loopback: bool,
    /// Lock client processes (each with 2 tasks).
    pub lock_workers: usize,
    /// The lock clients' session TTL.
    pub ttl: Duration,
    /// Everything over TLS (`--tls`).
    pub tls: bool,
    /// The command line that replays this run, for the report.
    pub replay: String,
}

/// A workload process.
struct Worker {
    index: usize,
    role: Role,
    child: Option<Child>,
    stdin: Option<ChildStdin>,
    history: PathBuf,
}

impl Worker {
    fn pid(&self) -> Option<i32> {
        self.child.as_ref().and_then(|c| i32::try_from(c.id()).ok())
    }
}

/// The workload processes; dropping them kills any still running.
struct Workers(Vec<Worker>);

impl Drop for Workers {
    fn drop(&mut self) {
        for w in &mut self.0 {
            if let Some(mut c) = w.child.take() {
                if let Ok(pid) = i32::try_from(c.id()) {
                    signal(pid, libc::SIGCONT);
                }
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Runs the whole thing. `Ok(true)` when every verdict passed.
pub async fn run(cfg: RunConfig) -> Result<bool> {
    std::fs::create_dir_all(cfg.out.join("workers"))
        .map_err(Error::io(format!("create {}", cfg.out.display())))?;
    let use_netns = !cfg.loopback && netns_available();
    let mut kinds = cfg.kinds.clone();
    if !use_netns && kinds.contains(&Kind::Partition) {
        eprintln!(
            "nemesis: WARNING: no network namespaces (needs root and iproute2{}): \
             running on loopback WITHOUT partitions",
            if cfg.loopback {
                "; --loopback given"
            } else {
                ""
            }
        );
        kinds.retain(|k| *k != Kind::Partition);
    }
    let net = if use_netns {
        Some(Netns::create(3)?)
    } else {
        None
    };
    let host = net.as_ref().map(|n| n.host_ip());
    let mut cluster = Cluster::start(&cfg.server_bin, &cfg.out, net, cfg.tls)?;
    let started = Instant::now();
    let leader = cluster.wait_ready(Duration::from_secs(60)).await?;
    eprintln!(
        "nemesis: cluster up in {:.1}s ({}), leader n{}; endpoints {}",
        started.elapsed().as_secs_f64(),
        match &host {
            Some(h) => format!("network namespaces, harness at {h}"),
            None => "loopback".to_owned(),
        },
        leader + 1,
        cluster.endpoints().join(",")
    );

    gate::serve(&cfg.out.join("gate.state"), &cfg.out.join("gate.sock"))?;
    let mut workers = Workers(start_workers(&cfg, &cluster.endpoints(), cluster.certs())?);
    let lock_workers: Vec<usize> = workers
        .0
        .iter()
        .filter(|w| matches!(w.role, Role::Lock | Role::Semaphore))
        .map(|w| w.index)
        .collect();

    let steps = nemesis::plan(&PlanInput {
        seed: cfg.seed,
        kinds: kinds.clone(),
        duration: cfg.duration,
        ttl: cfg.ttl,
        lock_workers,
    });
    let mut schedule = String::new();
    for (n, s) in steps.iter().enumerate() {
        schedule.push_str(&format!(
            "{:3}. after {:>6.1}s quiet: {}\n",
            n + 1,
            s.quiet.as_secs_f64(),
            s.fault
        ));
    }
    eprintln!(
        "nemesis: seed {}; {} faults planned over {:?}:\n{schedule}",
        cfg.seed,
        steps.len(),
        cfg.duration
    );
    std::fs::write(cfg.out.join("schedule.txt"), &schedule)
        .map_err(Error::io("write schedule.txt"))?;

    // Leader samples for the timeline, every 250 ms.
    let samples = Arc::new(Mutex::new(Vec::<LeaderSample>::new()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let sampler = tokio::spawn(sample_leaders(
        cluster.status_client(),
        cluster.endpoints(),
        samples.clone(),
        stop_rx,
    ));

    let run_start = now_ns();
    let mut windows: Vec<FaultWindow> = Vec::new();
    let mut rng = Rng::new(cfg.seed).fork(0x7461);
    let mut failure: Option<Error> = None;
    for (n, step) in steps.iter().enumerate() {
        if let Err(e) = quiet(&mut cluster, &mut workers, step.quiet).await {
            failure = Some(e);
            break;
        }
        // A replica that found earlier damage to its disk is repaired
        // before the next fault, which could take down a second replica.
        if let Err(e) = repair_late(&mut cluster, &mut workers, &mut windows, run_start).await {
            failure = Some(e);
            break;
        }
        eprintln!(
            "nemesis: [{:>6.1}s] {}. {}",
            now_ns().saturating_sub(run_start) as f64 / 1e9,
            n + 1,
            step.fault
        );
        if let Err(e) = execute(
            &step.fault,
            &mut cluster,
            &mut workers,
            &mut rng,
            &mut windows,
            run_start,
        )
        .await
        {
            failure = Some(e);
            break;
        }
        if let Err(e) = repair_late(&mut cluster, &mut workers, &mut windows, run_start).await {
            failure = Some(e);
            break;
        }
    }
    let fault_end = now_ns();

    // Restore: every replica up and connected, every client running.
    for w in &workers.0 {
        if let Some(pid) = w.pid() {
            signal(pid, libc::SIGCONT);
        }
    }
    let mut notes = Vec::new();
    if failure.is_none() {
        if let Err(e) = cluster.restore_all() {
            failure = Some(e);
        }
    }
    if failure.is_none() {
        if let Err(e) = repair_late(&mut cluster, &mut workers, &mut windows, run_start).await {
            failure = Some(e);
        }
    }
    if failure.is_none() {
        match cluster.wait_ready(Duration::from_secs(60)).await {
            Ok(l) => eprintln!("nemesis: every fault healed; leader n{}", l + 1),
            Err(e) => failure = Some(e),
        }
    }
    // Let the clients work a few seconds on the healed cluster.
    if failure.is_none() {
        if let Err(e) = quiet(&mut cluster, &mut workers, Duration::from_secs(3)).await {
            failure = Some(e);
        }
    }
    if failure.is_none() {
        if let Err(e) = repair_late(&mut cluster, &mut workers, &mut windows, run_start).await {
            failure = Some(e);
        }
    }
    notes.extend(stop_workers(&mut workers, Duration::from_secs(20)).await);
    let controller = Arc::new(Recorder::create(&cfg.out.join("workers/controller.jsonl"))?);

    // The leader-churn phase, on the restored cluster, the workloads
    // stopped: a dead holder's lock while the leader keeps moving.
    let mut churn_times = None;
    let mut holder_history = None;
    if failure.is_none() {
        let index = workers.0.len();
        let phase = churn_phase(
            &cfg,
            &mut cluster,
            &controller,
            &mut windows,
            index,
            &mut holder_history,
        )
        .await;
        match phase {
            Ok(times) => churn_times = times,
            Err(e) => failure = Some(e),
        }
    } else {
        controller.record(
            0,
            EventKind::Ok,
            ops::churn_skipped("the run stopped before the leader-churn phase"),
        );
    }
    let clients_end = now_ns();
    let _ = stop_tx.send(true);
    let _ = sampler.await;

    // Durability: kill every replica at once, restart, read everything.
    if failure.is_none() {
        if let Err(e) = check_durability(&mut cluster, &controller, &mut windows, run_start).await {
            failure = Some(e);
        }
    }
    if failure.is_none() {
        if let Err(e) = check_sessions_end(&cluster, &controller, cfg.ttl).await {
            failure = Some(e);
        }
    }
    for late in cluster.take_late_exits() {
        notes.push(format!(
            "n{} exited {} at {:.1} s, after the last repair: {}; its disk was damaged \
             earlier: {}",
            late.index + 1,
            disk::describe(late.status),
            late.time_ns.saturating_sub(run_start) as f64 / 1e9,
            cluster
                .exit_message(late.index)
                .unwrap_or_else(|| "(no message)".into()),
            late.cause
        ));
    }
    notes.extend(cluster.stop(Duration::from_secs(10)));
    // Nothing here forges Raft messages, so a replica that refused one as
    // no leader or candidate would send it refused a real member's message:
    // a check that is wrong (it stalls replication or elections), or a
    // member that broke.
    let refusals = cluster.log_lines_containing(latchkey::REFUSED_PEER_MESSAGE, 3);
    if !refusals.is_empty() && failure.is_none() {
        failure = Some(Error::Cluster(format!(
            "a replica refused a member's Raft message: {}",
            refusals.join(" | ")
        )));
    }
    drop(cluster);

    let mut files = Vec::new();
    for w in &workers.0 {
        files.push(record::read_events(&w.history)?);
    }
    if let Some(h) = holder_history.as_ref().filter(|h| h.exists()) {
        files.push(record::read_events(h)?);
    }
    files.push(record::read_events(
        &cfg.out.join("workers/controller.jsonl"),
    )?);
    let history = record::merge(files)?;
    let info = RunInfo {
        seed: cfg.seed,
        replay: cfg.replay.clone(),
        network: if use_netns {
            "network namespaces".into()
        } else {
            "loopback".into()
        },
        kinds: kinds.clone(),
        planned: steps.len(),
        schedule,
        start_ns: run_start,
        fault_end_ns: fault_end,
        end_ns: clients_end,
        churn: churn_times,
        failure: failure.as_ref().map(|e| e.to_string()),
        notes,
    };
    let leaders = samples
        .lock()
        .map(|s| s.clone())
        .unwrap_or_else(|e| e.into_inner().clone());
    let passed = report::write(&cfg.out, &info, &history, &windows, &leaders)?;
    let _ = std::fs::remove_file(cfg.out.join("gate.sock"));
    if passed && failure.is_none() {
        // The replicas' data, and the per-process histories now merged into
        // history.jsonl, are only worth keeping to debug a failure.
        let _ = std::fs::remove_dir_all(cfg.out.join("data"));
        for w in &workers.0 {
            let _ = std::fs::remove_file(&w.history);
        }
        if let Some(h) = &holder_history {
            let _ = std::fs::remove_file(h);
        }
        let _ = std::fs::remove_file(cfg.out.join("workers/controller.jsonl"));
    }
    Ok(passed && failure.is_none())
}

/// The leader-churn phase (see [`churn`]), its holder worker number
/// `index`; `None` when it was skipped (recorded, with why). The holder's
/// history file goes to `holder_history` as soon as it exists.
async fn churn_phase(
    cfg: &RunConfig,
    cluster: &mut Cluster,
    rec: &Arc<Recorder>,
    windows: &mut Vec<FaultWindow>,
    index: usize,
    holder_history: &mut Option<PathBuf>,
) -> Result<Option<churn::PhaseTimes>> {
    if let Some(why) = churn::unready(cluster) {
        eprintln!("nemesis: leader churn: skipped: {why}");
        rec.record(0, EventKind::Ok, ops::churn_skipped(&why));
        return Ok(None);
    }
    let spec = WorkerSpec {
        role: Role::Holder,
        index,
        tasks: 1,
        pace_ms: 20,
        ttl: churn::CHURN_TTL,
    };
    let mut w = spawn_worker(cfg, &cluster.endpoints(), cluster.certs(), &spec)?;
    *holder_history = Some(w.history.clone());
    let holder = churn::Holder::new(
        w.child.take(),
        w.stdin.take(),
        1 + index as u64 * TASK_SLOTS,
        w.history.clone(),
    );
    churn::run(cluster, holder, rec, windows).await.map(Some)
}

/// Starts the workload processes: the lock clients first (w0..), then one
/// register, one sequence, one durability, one watch and one semaphore
/// worker.
/// With `certs`, they talk TLS, trusting its CA.
fn start_workers(
    cfg: &RunConfig,
    endpoints: &[String],
    certs: Option<&Path>,
) -> Result<Vec<Worker>> {
    let mut roles: Vec<(Role, u64, u64)> = Vec::new();
    for _ in 0..cfg.lock_workers {
        roles.push((Role::Lock, 2, 5));
    }
    roles.push((Role::Register, 4, 20));
    roles.push((Role::Sequence, 2, 20));
    roles.push((Role::Durability, 2, 20));
    roles.push((Role::Watch, 6, 20));
    roles.push((Role::Semaphore, 4, 5));
    let mut workers = Vec::new();
    for (index, (role, tasks, pace)) in roles.into_iter().enumerate() {
        let spec = WorkerSpec {
            role,
            index,
            tasks,
            pace_ms: pace,
            ttl: cfg.ttl,
        };
        workers.push(spawn_worker(cfg, endpoints, certs, &spec)?);
    }
    Ok(workers)
}

/// One workload process to start.
struct WorkerSpec {
    role: Role,
    index: usize,
    tasks: u64,
    pace_ms: u64,
    /// Its sessions' TTL.
    ttl: Duration,
}

/// Starts one workload process, recording to `workers/w<index>.jsonl`.
fn spawn_worker(
    cfg: &RunConfig,
    endpoints: &[String],
    certs: Option<&Path>,
    spec: &WorkerSpec,
) -> Result<Worker> {
    let exe = std::env::current_exe().map_err(Error::io("find the harness's own binary"))?;
    let WorkerSpec {
        role,
        index,
        tasks,
        pace_ms,
        ttl,
    } = *spec;
    let history = cfg.out.join(format!("workers/w{index}.jsonl"));
    let (log, log_err) = log_file(&cfg.out.join(format!("workers/w{index}.log")))?;
    let mut cmd = Command::new(&exe);
    cmd.arg("worker")
        .arg("--role")
        .arg(format!("{role:?}").to_lowercase())
        .arg("--index")
        .arg(index.to_string())
        .arg("--tasks")
        .arg(tasks.to_string())
        .arg("--endpoints")
        .arg(endpoints.join(","))
        .arg("--seed")
        .arg(cfg.seed.to_string())
        .arg("--out")
        .arg(&history)
        .arg("--gate")
        .arg(cfg.out.join("gate.sock"))
        .arg("--ttl-ms")
        .arg(ttl.as_millis().to_string())
        .arg("--pace-ms")
        .arg(pace_ms.to_string())
        .args(
            certs
                .map(|dir| vec![OsString::from("--tls-dir"), dir.as_os_str().to_owned()])
                .unwrap_or_default(),
        )
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log_err);
    detach(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::Worker(format!("cannot start worker {index}: {e}")))?;
    let stdin = child.stdin.take();
    Ok(Worker {
        index,
        role,
        child: Some(child),
        stdin,
        history,
    })
}

/// Closes every worker's stdin and waits for them to finish; kills the
/// ones still running after `grace`. Returns notes for the report.
async fn stop_workers(workers: &mut Workers, grace: Duration) -> Vec<String> {
    let mut notes = Vec::new();
    for w in &mut workers.0 {
        if let Some(pid) = w.pid() {
            signal(pid, libc::SIGCONT);
        }
        w.stdin = None;
    }
    let deadline = Instant::now() + grace;
    for w in &mut workers.0 {
        let Some(mut child) = w.child.take() else {
            continue;
        };
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        notes.push(format!("worker w{} exited with {status}", w.index));
                    }
                    break;
                }
                // The gate lives on this thread: wait without blocking it.
                Ok(None) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                _ => {
                    notes.push(format!(
                        "worker w{} did not stop within {grace:?}; killed (its open operations \
                         count as unknown)",
                        w.index
                    ));
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
    notes
}

/// An error if a worker exited during the run.
fn workers_alive(workers: &mut Workers) -> Result<()> {
    for w in &mut workers.0 {
        if let Some(c) = w.child.as_mut() {
            if let Ok(Some(status)) = c.try_wait() {
                return Err(Error::Worker(format!(
                    "worker w{} ({:?}) exited during the run with {status}",
                    w.index, w.role
                )));
            }
        }
    }
    Ok(())
}

/// Repairs the replicas that exited because of earlier damage to their
/// disk (see [`disk::repair_late_exits`]), watching the rest meanwhile.
async fn repair_late(
    cluster: &mut Cluster,
    workers: &mut Workers,
    windows: &mut Vec<FaultWindow>,
    run_start: u64,
) -> Result<()> {
    let mut alive = |c: &mut Cluster| -> Result<()> {
        c.check_alive()?;
        workers_alive(workers)
    };
    let mut ctx = disk::Ctx {
        cluster,
        alive: &mut alive,
        windows,
        run_start,
    };
    disk::repair_late_exits(&mut ctx).await
}

/// Waits `d`, checking every 100 ms that no replica and no worker died on
/// its own (a replica that found earlier damage to its disk is left for
/// [`repair_late`]).
async fn quiet(cluster: &mut Cluster, workers: &mut Workers, d: Duration) -> Result<()> {
    let end = Instant::now() + d;
    loop {
        cluster.check_alive()?;
        workers_alive(workers)?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(100))).await;
    }
}

/// An action that starts or ends a fault.
enum Action {
    Kill(usize),
    Restart(usize),
    Stop(usize),
    Cont(usize),
    StopWorker(usize),
    ContWorker(usize),
    Isolate(usize),
    Heal,
}

/// Resolves a target to a replica index.
async fn resolve(cluster: &Cluster, target: Target, rng: &mut Rng) -> usize {
    match target {
        Target::Node(i) => i,
        Target::Leader => match cluster.leader().await {
            Some((i, _)) => i,
            None => rng.below(3),
        },
    }
}

/// The (start, end, length, kind, target name) of each part of a fault.
async fn parts(
    fault: &Fault,
    cluster: &Cluster,
    rng: &mut Rng,
    out: &mut Vec<(Action, Action, Duration, &'static str, String)>,
) {
    match fault {
        Fault::Kill { target, down } => {
            let i = resolve(cluster, *target, rng).await;
            out.push((Action::Kill(i), Action::Restart(i), *down, "kill", node(i)));
        }
        Fault::PauseReplica { target, pause } => {
            let i = resolve(cluster, *target, rng).await;
            out.push((Action::Stop(i), Action::Cont(i), *pause, "pause", node(i)));
        }
        Fault::PauseClient { worker, pause } => out.push((
            Action::StopWorker(*worker),
            Action::ContWorker(*worker),
            *pause,
            "pause-client",
            format!("w{worker}"),
        )),
        Fault::Partition { target, cut } => {
            let i = resolve(cluster, *target, rng).await;
            out.push((Action::Isolate(i), Action::Heal, *cut, "partition", node(i)));
        }
        Fault::Both(a, b) => {
            Box::pin(parts(a, cluster, rng, out)).await;
            Box::pin(parts(b, cluster, rng, out)).await;
        }
        // Never part of a pair (see `nemesis::plan`): `execute` carries a
        // disk fault out on its own.
        Fault::Disk { .. } => {}
    }
}

fn node(i: usize) -> String {
    format!("n{}", i + 1)
}

/// Carries out one fault: starts every part, ends each after its length.
/// A disk fault runs on its own, with its repair.
async fn execute(
    fault: &Fault,
    cluster: &mut Cluster,
    workers: &mut Workers,
    rng: &mut Rng,
    windows: &mut Vec<FaultWindow>,
    run_start: u64,
) -> Result<()> {
    if let Fault::Disk { target, what, down } = fault {
        let i = resolve(cluster, *target, rng).await;
        let mut alive = |c: &mut Cluster| -> Result<()> {
            c.check_alive()?;
            workers_alive(workers)
        };
        let mut ctx = disk::Ctx {
            cluster,
            alive: &mut alive,
            windows,
            run_start,
        };
        let pick = rng.next_u64();
        return disk::carry_out(&mut ctx, i, *what, *down, pick).await;
    }
    if fault.has_disk() {
        return Err(Error::Usage(format!(
            "a disk fault cannot be paired with another fault: {fault}"
        )));
    }
    let mut list = Vec::new();
    parts(fault, cluster, rng, &mut list).await;
    let begin = Instant::now();
    let mut pending = Vec::new();
    for (start, end, len, kind, target) in list {
        apply(&start, cluster, workers)?;
        pending.push((len, end, kind, target, now_ns()));
    }
    pending.sort_by_key(|p| p.0);
    for (len, end, kind, target, start_ns) in pending {
        let elapsed = begin.elapsed();
        if len > elapsed {
            quiet(cluster, workers, len - elapsed).await?;
        }
        apply(&end, cluster, workers)?;
        windows.push(FaultWindow {
            kind: kind.to_owned(),
            target,
            start_ns,
            end_ns: now_ns(),
            detail: None,
        });
    }
    Ok(())
}

fn apply(action: &Action, cluster: &mut Cluster, workers: &mut Workers) -> Result<()> {
    match *action {
        Action::Kill(i) => cluster.kill(i),
        Action::Restart(i) => cluster.restart(i)?,
        Action::Stop(i) => cluster.pause(i),
        Action::Cont(i) => cluster.resume(i),
        Action::Isolate(i) => cluster.isolate(i)?,
        Action::Heal => cluster.heal()?,
        Action::StopWorker(w) | Action::ContWorker(w) => {
            let sig = if matches!(action, Action::StopWorker(_)) {
                libc::SIGSTOP
            } else {
                libc::SIGCONT
            };
            if let Some(pid) = workers
                .0
                .iter()
                .find(|x| x.index == w)
                .and_then(Worker::pid)
            {
                signal(pid, sig);
            }
        }
    }
    Ok(())
}

async fn sample_leaders(
    status: Client,
    endpoints: Vec<String>,
    samples: Arc<Mutex<Vec<LeaderSample>>>,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let leader = leader_of(&status, &endpoints).await;
        let sample = LeaderSample {
            time_ns: now_ns(),
            leader: leader.map(|(i, _)| i as u64 + 1),
            term: leader.map(|(_, t)| t),
        };
        if let Ok(mut s) = samples.lock() {
            s.push(sample);
        }
        let _ = tokio::time::timeout(Duration::from_millis(250), stop.changed()).await;
    }
}

/// Kills every replica at once, restarts them (each on its current data
/// directory), and reads back every key of the durability workload,
/// recorded as the controller's `read_all`. A replica whose disk was
/// damaged earlier may refuse to restart: it is repaired first.
async fn check_durability(
    cluster: &mut Cluster,
    rec: &Recorder,
    windows: &mut Vec<FaultWindow>,
    run_start: u64,
) -> Result<()> {
    eprintln!("nemesis: durability: kill -9 every replica, restart, read back");
    cluster.kill_all_and_restart()?;
    cluster.wait_ready(Duration::from_secs(60)).await?;
    {
        let mut alive = |c: &mut Cluster| -> Result<()> { c.check_alive() };
        let mut ctx = disk::Ctx {
            cluster: &mut *cluster,
            alive: &mut alive,
            windows,
            run_start,
        };
        disk::repair_late_exits(&mut ctx).await?;
    }
    let client = final_client(cluster)?;
    rec.invoke(0, ops::read_all(None));
    let values = scan_prefix(&client, DURABLE_PREFIX)
        .await
        .map_err(|e| Error::Cluster(format!("reading back after a full restart: {e}")))?;
    let pairs: Vec<(&str, &str)> = values
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    rec.record(0, EventKind::Ok, ops::read_all(Some(&pairs)));
    eprintln!("nemesis: durability: {} keys read back", values.len());
    // The sequence's counter as the run left it: a step-0 allocation reads
    // it, so the sequences checker's rule 4 sees up to the last number any
    // allocation took.
    rec.invoke(0, ops::alloc(SEQUENCE, 0, None));
    match client.next_sequence(SEQUENCE, 0).await {
        Ok(r) => {
            rec.record(
                0,
                EventKind::Ok,
                ops::alloc(SEQUENCE, 0, Some((r.start, r.end))),
            );
            eprintln!("nemesis: sequences: the counter ends at {}", r.start);
        }
        Err(e) => {
            rec.record(0, EventKind::Fail, ops::alloc(SEQUENCE, 0, None));
            return Err(Error::Cluster(format!(
                "reading the sequence after a full restart: {e}"
            )));
        }
    }
    Ok(())
}

/// Once no client is left and the replicas restarted (so the leader
/// counts every session's TTL afresh), every session can only expire:
/// read the bound keys' prefix until it is empty or three TTLs and 10 s
/// have passed, and record what the last read found (the watch checker's
/// rule 9 wants nothing).
async fn check_sessions_end(cluster: &Cluster, rec: &Recorder, ttl: Duration) -> Result<()> {
    eprintln!("nemesis: sessions: waiting for the bound keys to go");
    let client = final_client(cluster)?;
    let deadline = Instant::now() + ttl * 3 + Duration::from_secs(10);
    rec.invoke(0, ops::watch_leftover(BOUND_PREFIX, None));
    loop {
        let read = scan_prefix(&client, BOUND_PREFIX).await;
        let done = Instant::now() >= deadline;
        match read {
            Ok(left) if left.is_empty() || done => {
                let keys: Vec<&str> = left.iter().map(|(k, _)| k.as_str()).collect();
                rec.record(
                    0,
                    EventKind::Ok,
                    ops::watch_leftover(BOUND_PREFIX, Some(&keys)),
                );
                eprintln!("nemesis: sessions: {} bound key(s) left", keys.len());
                return Ok(());
            }
            Err(e) if done => {
                rec.record(0, EventKind::Fail, ops::watch_leftover(BOUND_PREFIX, None));
                return Err(Error::Cluster(format!(
                    "reading the bound keys after a full restart: {e}"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// A client of every replica for the checks after the run.
fn final_client(cluster: &Cluster) -> Result<Client> {
    let options = cluster
        .client_options(ClientOptions::default().with_request_timeout(Duration::from_secs(20)))?;
    Client::with_options(cluster.endpoints(), options)
        .map_err(|e| Error::Cluster(format!("cannot build a client: {e}")))
}

/// Every key under `prefix` and its value, page by page.
async fn scan_prefix(
    client: &Client,
    prefix: &str,
) -> std::result::Result<Vec<(String, String)>, latchkey::Error> {
    let mut values = Vec::new();
    let mut range = ScanRange::prefix(prefix, 1000);
    loop {
        let page = client.scan(range.clone()).await?;
        let last = page.entries.last().map(|(k, _)| k.clone());
        for (k, v) in page.entries {
            values.push((
                String::from_utf8_lossy(&k).into_owned(),
                String::from_utf8_lossy(&v.value).into_owned(),
            ));
        }
        match (page.more, last) {
            (true, Some(mut last)) => {
                last.push(0);
                range.start = last;
            }
            _ => return Ok(values),
        }
    }
}

/// A fresh report folder name under `root`: `<unix seconds>-seed<S>`.
pub fn default_out(root: &Path, seed: u64) -> PathBuf {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    root.join(format!("{secs}-seed{seed}"))
}
