//! What every benchmark starts from: a temporary directory, the disk's fsync
//! rate measured in it, a three-process cluster with a leader, and what the
//! machine is; and what every benchmark ends with, a [`Report`].

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::args::Options;
use crate::cluster::{Cluster, TempDir};
use crate::fsync::{self, FsyncRate};
use crate::measure::{ClientShape, Clients, RunResult, REQUEST_TIMEOUT};
use crate::report::{Config, GroupCommit, Machine, Report};

/// How long the fsync probe runs.
pub const FSYNC_PROBE: Duration = Duration::from_secs(2);
/// How long the servers get to elect a leader.
pub const LEADER_WAIT: Duration = Duration::from_secs(30);

/// An upper bound of a healthy start-up and tear-down of one testbed.
pub fn setup_budget() -> Duration {
    FSYNC_PROBE + LEADER_WAIT + Duration::from_secs(30)
}

const SERVER_SETTINGS: &str = "latchkey serve defaults (durable; heartbeat 40ms, election 200ms..400ms, snapshot every 10000 entries), plus any --serve-arg";

/// A running cluster in its temporary directory, with the fsync rate of
/// that directory's disk. Dropping it kills the servers, then removes the
/// directory, however the benchmark ends.
pub struct Testbed {
    // Declared before `dir` so it is dropped first: servers die, then their
    // directory goes.
    cluster: Cluster,
    dir: TempDir,
    machine: Machine,
    fsync: FsyncRate,
    server_bin: PathBuf,
    unix_time: u64,
    started: Instant,
}

impl Testbed {
    /// Probe the disk, start three servers and wait for a leader; `name`
    /// (the benchmark) prefixes the progress lines.
    pub async fn start(name: &str, opts: &Options) -> Result<Testbed, String> {
        let started = Instant::now();
        let unix_time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let server_bin = server_bin(opts)?;
        let parent = opts.tmp_dir.clone().unwrap_or_else(std::env::temp_dir);

        let dir = TempDir::new(&parent)?;
        let machine = Machine::read(dir.path());
        warn_about_fs(&machine, dir.path());

        eprintln!(
            "latchkey-bench: {name}: measuring fsync rate in {} for {}s...",
            dir.path().display(),
            FSYNC_PROBE.as_secs()
        );
        // Blocking on purpose: nothing else runs yet, and a Ctrl-C meanwhile
        // is seen as soon as the probe returns.
        let fsync = fsync::measure(dir.path(), FSYNC_PROBE)?;
        eprintln!(
            "latchkey-bench: {:.0} fsync/s (p50 {} us)",
            fsync.per_second, fsync.p50_us
        );

        let mut cluster = Cluster::start(&server_bin, dir.path(), opts.tls, &opts.serve_args)?;
        eprintln!(
            "latchkey-bench: started 3 servers (pids {:?}) at {}; waiting for a leader...",
            cluster.pids(),
            cluster.endpoints().join(", ")
        );
        let leader = cluster.wait_for_leader(LEADER_WAIT).await?;
        eprintln!("latchkey-bench: leader at {leader}");
        Ok(Testbed {
            cluster,
            dir,
            machine,
            fsync,
            server_bin,
            unix_time,
            started,
        })
    }

    /// Warmed-up clients for up to `max_tasks` tasks.
    pub async fn clients(&self, opts: &Options, max_tasks: usize) -> Result<Clients, String> {
        Clients::connect(
            &self.cluster.endpoints(),
            opts.client_mode,
            ClientShape {
                unary: opts.unary,
                plain_writes: opts.plain_writes,
            },
            self.cluster.tls().cloned(),
            max_tasks,
        )
        .await
        .map_err(|e| format!("{e}\n{}", self.cluster.logs_tail()))
    }

    /// An error if a server has exited, with the end of its log.
    pub fn check_alive(&mut self) -> Result<(), String> {
        self.cluster.check_alive()
    }

    /// The servers.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The servers, to kill and restart them.
    pub fn cluster_mut(&mut self) -> &mut Cluster {
        &mut self.cluster
    }

    /// The `latchkey` binary the servers run (its CLI too).
    pub fn server_bin(&self) -> &std::path::Path {
        &self.server_bin
    }

    /// The servers' client addresses.
    pub fn endpoints(&self) -> Vec<String> {
        self.cluster.endpoints()
    }

    /// The TLS settings clients need, when the servers run TLS.
    pub fn tls(&self) -> Option<&latchkey::TlsOptions> {
        self.cluster.tls()
    }

    /// A client for the one-off calls of the churn and election benchmarks:
    /// it retries through elections (attempts of 2 s, backoff 5 to 50 ms)
    /// for up to a minute per request.
    pub fn patient_client(&self) -> Result<latchkey::Client, String> {
        let mut options = latchkey::ClientOptions::default()
            .with_request_timeout(Duration::from_secs(60))
            .with_attempt_timeout(Duration::from_secs(2))
            .with_connect_timeout(Duration::from_millis(200))
            .with_initial_backoff(Duration::from_millis(5))
            .with_max_backoff(Duration::from_millis(50));
        if let Some(tls) = self.tls() {
            options = options.with_tls(tls.clone());
        }
        latchkey::Client::with_options(self.endpoints(), options)
            .map_err(|e| format!("cannot build a client: {e}"))
    }

    /// The end of every server's log.
    pub fn logs_tail(&self) -> String {
        self.cluster.logs_tail()
    }

    /// Stop the servers, remove the directory, and put the results in a
    /// report of `benchmark` with the workload's parameters `params`.
    pub fn finish<W>(
        self,
        benchmark: &'static str,
        opts: &Options,
        params: W,
        results: Vec<RunResult>,
    ) -> Report<W> {
        let Testbed {
            cluster,
            dir,
            machine,
            fsync,
            server_bin,
            unix_time,
            started,
        } = self;
        drop(cluster);
        drop(dir);
        let group_commit = GroupCommit::from_results(&results, &fsync);
        Report {
            benchmark,
            schema_version: 1,
            unix_time,
            config: Config {
                duration_s: opts.duration.as_secs_f64(),
                workload: params,
                client_mode: opts.client_mode.name(),
                tls: opts.tls,
                plain_writes: opts.plain_writes,
                replicas: 3,
                server_bin: server_bin.display().to_string(),
                server_settings: SERVER_SETTINGS,
                request_timeout_s: REQUEST_TIMEOUT.as_secs_f64(),
            },
            machine,
            fsync,
            results,
            group_commit,
            total_seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// The `latchkey` binary: --server-bin, else `latchkey` beside this program.
fn server_bin(opts: &Options) -> Result<PathBuf, String> {
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
             and pass --server-bin, or run `cargo xtask bench`, which does both",
            path.display()
        ));
    }
    std::path::absolute(&path).map_err(|e| format!("cannot make {} absolute: {e}", path.display()))
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
