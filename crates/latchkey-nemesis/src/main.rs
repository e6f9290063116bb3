//! # latchkey-nemesis
//!
//! The fault-injection harness: three `latchkey serve` replicas, each in a
//! network namespace of its own joined to a bridge the harness creates
//! (root; on loopback without partitions otherwise), client processes
//! running the workloads and recording histories, a seeded nemesis that
//! kills, pauses, partitions and damages data directories (disk faults:
//! wipe, truncate-wal, flip-sst, delete-running; see [`disk`]), repairing
//! a replica that lost its disk the documented way (a new data directory,
//! `members add`), and the `latchkey-check` checkers run over the merged
//! history at the end. Each run writes a report folder with the verdicts,
//! counts, histories, fault outcomes and repairs, and an SVG timeline.
//!
//! Run it through `cargo xtask soak [--minutes N] [--seed S] [--nemesis
//! kill,pause,partition,disk]`; `cargo xtask test` runs a 100-second
//! version with every kind.
//!
//! The workloads (see [`worker`]): lock clients that take a lock (or two at
//! once, or campaign in an election that one task per client observes),
//! write through a fence gate and to a fenced KV key, and release;
//! semaphore clients that take a permit and make fenced writes with it
//! (both kinds of clients are what a pause targets); a register
//! workload (read, write, compare-and-put) for linearizability;
//! `next_sequence` allocations; puts read back after every replica was
//! killed and restarted at once; watchers of a prefix, with writers
//! changing its keys. After the faults, with the cluster restored and
//! those clients stopped, a leader-churn phase ([`churn`], 12 to 20 s): a
//! holder process takes a lock in a 5 s session, keeps it alive once and
//! is SIGKILLed, a waiter queues for the lock, and the leader is SIGKILLed
//! (then restarted) up to four times, 2.5 s apart, while the lock waits
//! for the dead holder's session to end; `latchkey-check`'s `abandoned`
//! checker judges when the waiter got it, and the report gives the
//! measured extension beside the documented failover bound.
//!
//! What this crate must not do: touch any namespace, link or process it did
//! not create (every name carries the harness's pid; processes are signalled
//! by pid), or judge safety itself: verdicts come from `latchkey-check`.

mod churn;
mod clock;
mod cluster;
mod disk;
mod error;
mod gate;
mod nemesis;
mod net;
mod outcome;
mod record;
mod report;
mod rng;
mod run;
mod timeline;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::nemesis::Kind;

#[derive(Debug, Parser)]
#[command(
    name = "latchkey-nemesis",
    about = "latchkey's fault-injection harness"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One run: cluster, workloads, faults, checkers, report. Exits 0 when
    /// every checker passed, 1 when one failed, 2 when the run could not
    /// be carried out.
    Run {
        /// The `latchkey` binary the replicas run.
        #[arg(long)]
        server_bin: PathBuf,
        /// Length of the fault phase (e.g. 120s, 30m).
        #[arg(long, default_value = "120s", value_parser = parse_duration)]
        duration: Duration,
        /// Seed of the schedule and the workloads (default: from the clock;
        /// printed, to replay the run).
        #[arg(long)]
        seed: Option<u64>,
        /// Fault kinds, separated by commas: kill, pause, partition, disk
        /// (wipe, truncate-wal, flip-sst or delete-running on one replica,
        /// then its repair).
        #[arg(long, default_value = "kill,pause,partition,disk", value_delimiter = ',', value_parser = parse_kinds)]
        nemesis: Vec<Kind>,
        /// The report folder (default: `soak-results/<time>-seed<S>`).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Run on loopback (no partitions) even as root.
        #[arg(long)]
        loopback: bool,
        /// Lock client processes (2 tasks each, and an election observer).
        #[arg(long, default_value_t = 3)]
        lock_workers: usize,
        /// Session TTL of the lock clients (pauses outlast it).
        #[arg(long, default_value = "3s", value_parser = parse_duration)]
        ttl: Duration,
        /// Run everything over TLS: certificates from `latchkey certs`,
        /// mutual TLS between the replicas, clients over TLS.
        #[arg(long)]
        tls: bool,
    },
    /// A workload process (started by `run`).
    Worker(worker::WorkerArgs),
    /// Re-runs the checkers on a report folder's history.jsonl.
    Check {
        /// The report folder.
        folder: PathBuf,
    },
    /// Redraws a report folder's timeline for a window of the run (long
    /// runs make wide pictures).
    Timeline {
        /// The report folder.
        folder: PathBuf,
        /// Start of the window, in seconds since the start of the run.
        #[arg(long, default_value_t = 0.0)]
        from: f64,
        /// End of the window (default: the end of the run).
        #[arg(long)]
        to: Option<f64>,
        /// The SVG file to write.
        #[arg(long)]
        out: PathBuf,
    },
}

/// `500ms`, `10s`, `2m`, `1h`, or bare seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (try 500ms, 90s, 30m, 1h)"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "" | "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => {
            return Err(format!(
                "unknown unit {unit:?} in {s:?} (use ms, s, m or h)"
            ))
        }
    };
    Ok(d)
}

fn parse_kinds(s: &str) -> Result<Kind, String> {
    Kind::parse(s)
        .ok_or_else(|| format!("unknown fault kind {s:?}: use kill, pause, partition or disk"))
}

/// Resolves on SIGINT or SIGTERM, with the signal's name.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers the default actions apply; wait forever.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Cmd::Worker(args) => {
            let rt = match tokio::runtime::Runtime::new() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("worker: cannot start a runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            match rt.block_on(worker::run(args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("worker: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Cmd::Timeline {
            folder,
            from,
            to,
            out,
        } => match report::redraw(&folder, from, to, &out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("timeline: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Check { folder } => match report::recheck(&folder) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(1),
            Err(e) => {
                eprintln!("check: {e}");
                ExitCode::from(2)
            }
        },
        Cmd::Run {
            server_bin,
            duration,
            seed,
            mut nemesis,
            out,
            loopback,
            lock_workers,
            ttl,
            tls,
        } => {
            nemesis.sort();
            nemesis.dedup();
            let seed = seed.unwrap_or_else(|| clock::now_ns() ^ u64::from(std::process::id()));
            let kinds: Vec<String> = nemesis
                .iter()
                .map(|k| format!("{k:?}").to_lowercase())
                .collect();
            let replay = format!(
                "cargo xtask soak --seconds {} --seed {seed} --nemesis {} --lock-workers \
                 {lock_workers} --ttl {}ms{}",
                duration.as_secs(),
                kinds.join(","),
                ttl.as_millis(),
                if tls { " --tls" } else { "" }
            );
            let out = out.unwrap_or_else(|| run::default_out(&PathBuf::from("soak-results"), seed));
            eprintln!(
                "nemesis: seed {seed} (replay: {replay}); report in {}",
                out.display()
            );
            let cfg = run::RunConfig {
                server_bin,
                out,
                seed,
                duration,
                kinds: nemesis,
                loopback,
                lock_workers,
                ttl,
                tls,
                replay,
            };
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("nemesis: cannot start a runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            // Everything after the fault phase (healing, stopping the
            // clients, the full restart, the checkers) is bounded too: a run
            // never hangs its caller (CI) for longer than this.
            let limit = duration + Duration::from_secs(300);
            let outcome = rt.block_on(async {
                tokio::select! {
                    r = tokio::time::timeout(limit, run::run(cfg)) => r.unwrap_or_else(|_| {
                        Err(error::Error::Cluster(format!(
                            "the run did not finish within {limit:?}; replicas and workers \
                             were killed"
                        )))
                    }),
                    // Dropping the run kills the replicas and workers and
                    // removes the namespaces.
                    name = interrupted() => Err(error::Error::Usage(format!(
                        "{name}: replicas and workers were killed, namespaces removed"
                    ))),
                }
            });
            match outcome {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("nemesis: {e}");
                    ExitCode::from(2)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn kinds() {
        assert_eq!(parse_kinds("kill"), Ok(Kind::Kill));
        assert_eq!(parse_kinds("disk"), Ok(Kind::Disk));
        assert!(parse_kinds("flood").is_err());
    }
}
