//! # latchkey-bench
//!
//! Benchmarks of a real latchkey cluster: three `latchkey serve` processes on
//! loopback, durable, with default settings, in a temporary directory, driven
//! through the public [`latchkey::Client`] over gRPC. Nothing is mocked: each
//! put is replicated to a quorum and fsynced before it is acknowledged, and
//! each get is linearizable (the leader confirms its leadership first).
//!
//! ## What `kv` measures
//!
//! 1. The disk: `write(4 KiB) + fdatasync` in a loop for about 2 s in the
//!    data directory, reported as fsyncs per second. A store that fsyncs once
//!    per write cannot go faster than that.
//! 2. For each client count C (default 1, 8, 64): C concurrent tasks putting
//!    distinct keys (values of `--value-size` bytes) for `--duration`; then C
//!    tasks doing linearizable gets of keys written before. Every operation's
//!    latency goes into an HDR histogram; the report gives throughput
//!    (successful ops per second of wall time), p50, p99 and p99.9 latency,
//!    and the error count, per (workload, clients).
//! 3. The group-commit ratio: put/s at 64 clients (or the largest count) over
//!    the disk's fsync/s. Above 1 means writes share fsyncs, as the
//!    architecture intends ("Performance shape" in ARCHITECTURE.md); at or
//!    below 1 means each write waits for its own fsync. All three replicas
//!    share one disk here, so a commit costs at least two fsyncs on it
//!    (leader and one follower), which makes a ratio above 1 a strong signal.
//!
//! ## How to run
//!
//! ```text
//! cargo xtask bench kv                          # 5 s per run, clients 1,8,64
//! cargo xtask bench kv --duration 3s --clients 1,16 --value-size 1024
//! cargo xtask bench kv --client-mode per-task   # one Client per task
//! ```
//!
//! `cargo xtask bench` builds the `latchkey` binary (dev profile, like every
//! other command: dependencies optimised, our crates at opt-level 1) and
//! passes it as `--server-bin`. Results: a table on stdout, and
//! `bench-results/kv-<unix time>.json` plus `bench-results/kv-latest.json`
//! with every number, the configuration and the machine (cores, CPU, file
//! system, fsync rate, git commit). Servers are always killed (by pid) and the
//! temporary directory removed, also on errors and Ctrl-C. The total time is
//! bounded: about 2 × duration per client count, plus start-up.
//!
//! ## Reading the numbers
//!
//! This is a measurement, never a test: nothing here asserts a time. On a
//! small, shared machine (two cores running three servers and the clients,
//! a virtual disk whose fsync latency drifts with the neighbours) two runs
//! of the same code can differ by tens of percent. So:
//!
//! * compare medians (p50), not means or maxima: a handful of slow fsyncs or a
//!   RocksDB flush move the mean and the tail a lot and the median little;
//! * compare ratios measured in the same run (put/s over fsync/s, 64 clients
//!   over 1 client) rather than absolute ops/s across runs or machines: both
//!   sides of a ratio saw the same disk and the same neighbours;
//! * p99.9 from a few-second run rests on a few dozen samples: read it as
//!   "the tail exists", not as a number to optimise;
//! * repeat a run before believing a change of less than ~20 %.

mod args;
mod cluster;
mod fsync;
mod kv;
mod report;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use args::{KvOptions, Parsed, Workload, USAGE};
use cluster::{Cluster, TempDir};
use report::{GroupCommit, KvConfig, KvReport, Machine};

/// How long the fsync probe runs.
const FSYNC_PROBE: Duration = Duration::from_secs(2);
/// How long the servers get to elect a leader.
const LEADER_WAIT: Duration = Duration::from_secs(30);

const LOCK_NOT_YET: &str =
    "lock benchmarks come with the lock service (issue 3/5); nothing to measure yet";

/// Why the benchmark stopped early.
enum Failure {
    Usage(String),
    Failed(String),
    Interrupted,
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let (workload, opts) = match args::parse(&args) {
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(w, o)) => (w, o),
        Err(message) => return fail(Failure::Usage(message)),
    };
    match workload {
        Workload::Lock => {
            eprintln!("latchkey-bench: {LOCK_NOT_YET}");
            ExitCode::from(2)
        }
        Workload::Kv | Workload::All => {
            let result = run_in_runtime(opts);
            if workload == Workload::All {
                eprintln!("latchkey-bench: lock: skipped: {LOCK_NOT_YET}");
            }
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(f) => fail(f),
            }
        }
    }
}

fn fail(failure: Failure) -> ExitCode {
    match failure {
        Failure::Usage(m) => {
            eprint!("{USAGE}");
            eprintln!("latchkey-bench: {m}");
            ExitCode::from(2)
        }
        Failure::Failed(m) => {
            eprintln!("latchkey-bench: {m}");
            ExitCode::from(1)
        }
        Failure::Interrupted => {
            eprintln!("latchkey-bench: interrupted; servers stopped, temporary files removed");
            ExitCode::from(130)
        }
    }
}

fn run_in_runtime(opts: KvOptions) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the async runtime: {e}")))?;
    // block_on runs the benchmark on this (main) thread: the servers are
    // spawned from it, which their parent-death signal relies on.
    let result = runtime.block_on(guarded(opts));
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The kv benchmark raced against SIGINT, SIGTERM and an overall deadline.
/// Whichever ends first drops the benchmark's future, and with it the guards
/// that kill the servers and remove the temporary directory.
async fn guarded(opts: KvOptions) -> Result<(), Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Failed(format!("cannot handle SIGINT: {e}")))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| Failure::Failed(format!("cannot handle SIGTERM: {e}")))?;
    let budget = time_budget(&opts);
    tokio::select! {
        r = tokio::time::timeout(budget, run_kv(opts)) => match r {
            Ok(r) => r.map_err(Failure::Failed),
            Err(_) => Err(Failure::Failed(format!(
                "the benchmark went past its time budget of {}s and was stopped",
                budget.as_secs()
            ))),
        },
        _ = interrupt.recv() => Err(Failure::Interrupted),
        _ = terminate.recv() => Err(Failure::Interrupted),
    }
}

/// An upper bound of a healthy run: start-up, and per client count two runs
/// that may each overrun by one request timeout; plus slack.
fn time_budget(opts: &KvOptions) -> Duration {
    let per_run = opts.duration + kv::REQUEST_TIMEOUT + Duration::from_secs(5);
    let runs = u32::try_from(opts.clients.len() * 2).unwrap_or(u32::MAX);
    FSYNC_PROBE + LEADER_WAIT + Duration::from_secs(30) + per_run.saturating_mul(runs)
}

/// The `latchkey` binary: --server-bin, else `latchkey` beside this program.
fn server_bin(opts: &KvOptions) -> Result<PathBuf, String> {
    let path = match &opts.server_bin {
        Some(p) => p.clone(),
        None => {
            let exe =
                std::env::current_exe().map_err(|e| format!("cannot locate this program: {e}"))?;
            exe.with_file_name(format!("latchkey{}", std::env::consts::EXE_SUFFIX))
        }
    };
    if !path.is_file() {
        return Err(format!(
            "the server binary {} does not exist: build it with `cargo build -p latchkey --bin latchkey` \
             and pass --server-bin, or run `cargo xtask bench kv`, which does both",
            path.display()
        ));
    }
    std::path::absolute(&path).map_err(|e| format!("cannot make {} absolute: {e}", path.display()))
}

async fn run_kv(opts: KvOptions) -> Result<(), String> {
    let started = Instant::now();
    let unix_time = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let server_bin = server_bin(&opts)?;
    let parent = opts.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);

    // Declared before the cluster so it is dropped after it: servers die
    // first, then their directory goes.
    let dir = TempDir::new(&parent)?;
    let machine = Machine::read(dir.path());
    warn_about_fs(&machine, dir.path());

    eprintln!(
        "latchkey-bench: measuring fsync rate in {} for {}s...",
        dir.path().display(),
        FSYNC_PROBE.as_secs()
    );
    // Blocking on purpose: nothing else runs yet, and a Ctrl-C meanwhile is
    // seen as soon as the probe returns.
    let fsync = fsync::measure(dir.path(), FSYNC_PROBE)?;
    eprintln!(
        "latchkey-bench: {:.0} fsync/s (p50 {} us)",
        fsync.per_second, fsync.p50_us
    );

    let mut cluster = Cluster::start(&server_bin, dir.path())?;
    eprintln!(
        "latchkey-bench: started 3 servers (pids {:?}) at {}; waiting for a leader...",
        cluster.pids(),
        cluster.endpoints().join(", ")
    );
    let leader = cluster.wait_for_leader(LEADER_WAIT).await?;
    eprintln!("latchkey-bench: leader at {leader}");

    let endpoints = cluster.endpoints();
    let max_tasks = opts.clients.iter().copied().max().unwrap_or(1);
    let clients = kv::Clients::connect(&endpoints, opts.client_mode, max_tasks)
        .await
        .map_err(|e| format!("{e}\n{}", cluster.logs_tail()))?;

    let value = Arc::new(kv::make_value(opts.value_size));
    // Every acknowledged key so far: the gets read among them.
    let mut keys: Arc<Vec<Vec<u8>>> = Arc::new(Vec::new());
    let mut results = Vec::with_capacity(opts.clients.len() * 2);
    for &c in &opts.clients {
        eprintln!(
            "latchkey-bench: put, {c} clients, {:.1}s...",
            opts.duration.as_secs_f64()
        );
        let (put, written) = kv::run_puts(&clients, c, opts.duration, Arc::clone(&value)).await?;
        progress(&put);
        results.push(put);
        cluster.check_alive()?;
        Arc::make_mut(&mut keys).extend(written);

        eprintln!(
            "latchkey-bench: get, {c} clients, {:.1}s...",
            opts.duration.as_secs_f64()
        );
        let get = kv::run_gets(
            &clients,
            c,
            opts.duration,
            Arc::clone(&keys),
            opts.value_size,
        )
        .await?;
        progress(&get);
        results.push(get);
        cluster.check_alive()?;
    }
    drop(clients);
    drop(cluster);

    let group_commit = GroupCommit::from_results(&results, &fsync);
    let report = KvReport {
        benchmark: "kv",
        schema_version: 1,
        unix_time,
        config: KvConfig {
            duration_s: opts.duration.as_secs_f64(),
            clients: opts.clients.clone(),
            value_size: opts.value_size,
            client_mode: opts.client_mode.name(),
            replicas: 3,
            server_bin: server_bin.display().to_string(),
            server_settings: "latchkey serve defaults (durable; heartbeat 100ms, election 500ms..1s, snapshot every 10000 entries)",
            request_timeout_s: kv::REQUEST_TIMEOUT.as_secs_f64(),
        },
        machine,
        fsync,
        results,
        group_commit,
        total_seconds: started.elapsed().as_secs_f64(),
    };
    print!("{}", report::table(&report));
    let (stamped, latest) = report::write_json(&report, &opts.out)?;
    println!(
        "\nresults: {} (and {})",
        stamped.display(),
        latest.display()
    );
    Ok(())
}

fn progress(r: &kv::RunResult) {
    eprintln!(
        "latchkey-bench:   {:.0} ops/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
        r.ops_per_s,
        r.latency_us.p50_us as f64 / 1000.0,
        r.latency_us.p99_us as f64 / 1000.0,
        r.errors
    );
}

fn warn_about_fs(machine: &Machine, dir: &Path) {
    if let Some(fs) = machine.data_fs.as_deref() {
        if matches!(fs, "tmpfs" | "ramfs") {
            eprintln!(
                "latchkey-bench: warning: {} is on {fs}, where fsync costs nothing; \
                 the fsync rate and write latencies will not reflect a disk (use --tmp-dir)",
                dir.display()
            );
        }
    }
}
