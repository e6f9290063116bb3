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
//! ## What `failover` measures
//!
//! Under a write load, the leader is SIGKILLed `--kills` times; each time,
//! the time from the kill to the first acknowledged write, the elections
//! it took, and the spurious elections (term changes in quiet load between
//! kills). See the `failover` module.
//!
//! ## What `rolling` measures
//!
//! Under a put and lock load, every replica in turn is stopped with
//! SIGTERM and started again (the leader last), `--rounds` times: the
//! longest call each round, failed calls and lost writes. See the
//! `rolling` module.
//!
//! ## What `churn` measures
//!
//! A holder cut off from the cluster (dead to it) holds a lock another
//! client waits for; the leader is SIGKILLed `--kills` times, `--lead`
//! after each takes over: the time until the waiter holds the lock, beside
//! the earliest a leader restarting every countdown at full length could
//! have freed it. See the `churn` module.
//!
//! ## What `elect` measures
//!
//! A leader (a `latchkey elect` process) is SIGKILLed while a standby
//! campaigns: the time until the standby leads, over ten rounds. See the
//! `elect` module.
//!
//! ## What `lock` measures
//!
//! The same disk probe, on a fresh cluster; then every task opens its own
//! session (TTL 10 s, kept alive by the client's watchdog every ttl/3)
//! before the clock starts, and loops acquire → release for `--duration`:
//!
//! 1. `lock-cycle`, for each client count C (default 1 and 32): each task on
//!    a lock of its own, `bench/cycle/<task>`, so nothing waits but the
//!    cluster. One cycle is two replicated, fsynced writes (the acquire's
//!    grant, the release); the latency is the whole cycle: the cost of an
//!    uncontended lock, the number to set beside etcd's `concurrency.Mutex`
//!    Lock + Unlock or a ZooKeeper (Curator `InterProcessMutex`) acquire +
//!    release measured on the same machine.
//! 2. `contended`, for each C in `--contended` (default 32): every task on
//!    one lock, `bench/contended`, waiting in its FIFO queue (woken by the
//!    replica, no polling). The throughput is grants per second, i.e. how
//!    fast the lock passes from holder to holder (one release committed and
//!    the next waiter told, per grant); the latency is the acquire's, from
//!    sending it to holding the lock, so about C-1 hand-offs of queueing.
//!    When the duration is over, the tasks still queued are granted in turn
//!    (the queue drains); OPS/S and the latencies include that tail, and the
//!    notes give the grants/s within the duration alone, the steady state.
//!
//! Each run also reports the acquire and release latencies separately, the
//! least and most cycles of one task (FIFO: tasks take turns, so the two
//! stay close), and two cheap safety checks per lock: a grant that finds
//! another task still inside (an `AtomicBool` set on holding, cleared before
//! releasing), and a fencing token not above the previous grant's. Either
//! is printed as a loud `SAFETY VIOLATION` line and counted in the JSON; the
//! benchmark does not stop for it. An acquire waits at most 10 s
//! (`acquire_timeout`, so a stuck cluster cannot stall the run); not being
//! granted by then, or any failed call, counts as an error; a lost session,
//! or a failed release (which may leave the lock held), makes the task close
//! it and open another (`sessions_reopened`).
//!
//! ## What `watch` measures
//!
//! What watchers cost the writes, and how soon a watcher hears of one (see
//! the `watch` module): put x64 with no watcher and with `--watchers`
//! (default 1,000) watchers on the prefix it writes, twice each,
//! interleaved; the delay from each put's acknowledgement to each
//! watcher's receipt of the change; then one writer and one watcher.
//!
//! ## How to run
//!
//! ```text
//! cargo xtask bench kv                          # 5 s per run, clients 1,8,64
//! cargo xtask bench kv --duration 3s --clients 1,16 --value-size 1024
//! cargo xtask bench kv --client-mode per-task   # one Client per task
//! cargo xtask bench lock                        # lock-cycle x1, x32; contended x32
//! cargo xtask bench lock --clients 1,8 --contended 8,64
//! cargo xtask bench all --duration 3s           # kv, then lock, each on a fresh cluster
//! ```
//!
//! `--clients` sets kv's counts and lock-cycle's; `--client-mode` applies to
//! both benchmarks (shared: every task, and every lock session, goes through
//! clones of one `Client`, i.e. one HTTP/2 connection per replica).
//!
//! `cargo xtask bench` builds the `latchkey` binary (dev profile, like every
//! other command: dependencies and the request-path crates at opt-level 3,
//! debug assertions on) and passes it as `--server-bin`. Results: a table
//! on stdout; `bench-results/<kv|lock>-<unix time>.json` plus
//! `bench-results/<kv|lock>-latest.json` with every number, the
//! configuration and the machine (cores, CPU, file system, fsync rate, git
//! commit); and the same runs as a small SVG chart,
//! `bench-results/<kv|lock>-<unix time>.svg` and `-latest.svg`: throughput
//! bars, and p50 / p99 / p999 latency on a log scale. Servers are always killed (by pid) and the temporary directory
//! removed, also on errors and Ctrl-C. The total time is bounded: for kv
//! about 2 × duration per client count, for lock about one duration per
//! run, plus start-up; a hard budget stops anything that hangs.
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
//!   over 1 client, lock-cycle x32 over x1) rather than absolute ops/s across
//!   runs or machines: both sides of a ratio saw the same disk and the same
//!   neighbours;
//! * a contended acquire's latency is mostly queueing (C-1 hand-offs): judge
//!   the lock by grants/s, and the queue's fairness by the per-task counts;
//! * p99.9 from a few-second run rests on a few dozen samples: read it as
//!   "the tail exists", not as a number to optimise;
//! * repeat a run before believing a change of less than ~20 %.

mod args;
mod chart;
mod churn;
mod cli_process;
mod cluster;
mod elect;
mod failover;
mod fsync;
mod kv;
mod lock;
mod measure;
mod report;
mod rolling;
mod testbed;
mod watch;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use args::{Options, Parsed, Workload, USAGE};

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
        Ok(Parsed::Run(w, o)) => (w, *o),
        Err(message) => return fail(Failure::Usage(message)),
    };
    match run_in_runtime(workload, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => fail(f),
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

fn run_in_runtime(workload: Workload, opts: Options) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Failed(format!("cannot start the async runtime: {e}")))?;
    // block_on runs the benchmark on this (main) thread: the servers are
    // spawned from it, which their parent-death signal relies on.
    let result = runtime.block_on(guarded(workload, opts));
    runtime.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The benchmark raced against SIGINT, SIGTERM and an overall deadline.
/// Whichever ends first drops the benchmark's future, and with it the guards
/// that kill the servers and remove the temporary directory.
async fn guarded(workload: Workload, opts: Options) -> Result<(), Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Failed(format!("cannot handle SIGINT: {e}")))?;
    let mut terminate = signal(SignalKind::terminate())
        .map_err(|e| Failure::Failed(format!("cannot handle SIGTERM: {e}")))?;
    let budget = time_budget(workload, &opts);
    tokio::select! {
        r = tokio::time::timeout(budget, run(workload, &opts)) => match r {
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

/// An upper bound of a healthy run of `workload`'s benchmarks.
fn time_budget(workload: Workload, opts: &Options) -> Duration {
    match workload {
        Workload::Kv => kv::budget(opts),
        Workload::Lock => lock::budget(opts),
        Workload::All => kv::budget(opts) + lock::budget(opts),
        Workload::Failover => failover::budget(opts),
        Workload::Rolling => rolling::budget(opts),
        Workload::Churn => churn::budget(opts),
        Workload::Elect => elect::budget(opts),
        Workload::Watch => watch::budget(opts),
    }
}

/// Each benchmark on a cluster of its own; for `all`, lock runs even when
/// kv failed, and the run fails if either did.
async fn run(workload: Workload, opts: &Options) -> Result<(), String> {
    match workload {
        Workload::Kv => kv::bench(opts).await,
        Workload::Lock => lock::bench(opts).await,
        Workload::Failover => failover::bench(opts).await,
        Workload::Rolling => rolling::bench(opts).await,
        Workload::Churn => churn::bench(opts).await,
        Workload::Elect => elect::bench(opts).await,
        Workload::Watch => watch::bench(opts).await,
        Workload::All => {
            let kv = kv::bench(opts).await;
            if let Err(e) = &kv {
                eprintln!("latchkey-bench: kv failed: {e}\nlatchkey-bench: running lock anyway");
            }
            println!();
            let lock = lock::bench(opts).await;
            match (kv, lock) {
                (Ok(()), Ok(())) => Ok(()),
                (Err(_), Ok(())) => Err("kv failed (see above); lock ran".into()),
                (Ok(()), Err(e)) => Err(format!("lock failed: {e}")),
                (Err(_), Err(e)) => Err(format!("kv failed (see above), and lock failed: {e}")),
            }
        }
    }
}
