//! Harness for the multi-process tests: a cluster of real `latchkey serve`
//! processes on loopback, each with its own data directory and log file in a
//! per-test temporary directory.
//!
//! The harness never asserts on timing: every wait is a poll with a generous
//! deadline, and every test bounds its total time with [`Cluster::finish`].
//! On failure it prints the tail of every node's log and keeps the temporary
//! directory for inspection; set `LATCHKEY_KEEP_TEST_DIRS=1` to keep it on
//! success too.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use latchkey::{Client, ClientOptions, Consistency, Error, NodeStatus, ScanRange};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Default bound on one test's body.
pub const TEST_LIMIT: Duration = Duration::from_secs(120);
/// How long to wait for an election (generous: a noisy 2-core machine).
pub const LEADER_WAIT: Duration = Duration::from_secs(45);
/// How long to wait for a replica to converge.
pub const CONVERGE_WAIT: Duration = Duration::from_secs(60);

/// Lines of each node's log printed when a test fails.
const TAIL_LINES: usize = 60;

/// One cluster at a time per test binary: three RocksDB replicas per test on
/// a 2-core machine is plenty; several at once would only cause spurious
/// elections and make failures harder to read.
static ONE_CLUSTER_AT_A_TIME: Semaphore = Semaphore::const_new(1);

/// The `latchkey` binary built by cargo for this test run, unless
/// `LATCHKEY_TEST_BIN` names another one (e.g. a copy of an experimental
/// build, kept aside so that other builds in the shared target directory
/// do not replace it while the tests run).
pub fn bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("LATCHKEY_TEST_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_latchkey").to_string())
    })
}

/// Client options for the tests: long enough to ride out an election on a
/// slow machine; an attempt outlives the server's 5 s write timeout.
/// A spawned CLI command's standard output, line by line.
pub type CliLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// The secret every process test cluster's replicas share.
pub const CLUSTER_SECRET: &str = "latchkey-process-test-secret-0001";

pub fn client_options() -> ClientOptions {
    ClientOptions::default()
        .with_request_timeout(Duration::from_secs(30))
        .with_attempt_timeout(Duration::from_secs(8))
        .with_connect_timeout(Duration::from_secs(1))
        .with_initial_backoff(Duration::from_millis(20))
        .with_max_backoff(Duration::from_millis(500))
        .with_cluster_secret(CLUSTER_SECRET)
}

struct NodeSpec {
    /// Client listener.
    addr: String,
    /// Peer listener (what the initial members and `members add` name).
    peer_addr: String,
    data_dir: PathBuf,
    log: PathBuf,
}

fn signal(pid: u32, sig: libc::c_int) -> std::io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::other(format!("pid {pid} out of range")))?;
    // SAFETY: kill(2) with a pid of a child this harness spawned and still owns.
    let rc = unsafe { libc::kill(pid, sig) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The last `n` lines of a file, or a note why it cannot be read.
pub fn tail(path: &std::path::Path, n: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// A cluster of `latchkey serve` processes.
pub struct Cluster {
    name: String,
    dir: Option<tempfile::TempDir>,
    specs: BTreeMap<u64, NodeSpec>,
    members_arg: String,
    extra_args: Vec<String>,
    children: BTreeMap<u64, Child>,
    stopped: BTreeSet<u64>,
    admin: Client,
    passed: bool,
    _permit: SemaphorePermit<'static>,
}

impl Cluster {
    /// Start `n` replicas (ids 1..=n) forming one cluster; `extra_args` are
    /// appended to every `latchkey serve` command line, `{id}` in them
    /// replaced by the node's id (for per-node certificate files).
    pub async fn start(name: &str, n: u64, extra_args: &[&str]) -> Result<Cluster> {
        let mut cluster = Cluster::create(name, n, extra_args).await?;
        for id in cluster.ids() {
            cluster.spawn(id)?;
        }
        Ok(cluster)
    }

    /// As [`Cluster::start`], but start no node yet: their addresses and
    /// data directories are chosen, and each starts with
    /// [`Cluster::restart`] (e.g. after seeding its data directory).
    pub async fn create(name: &str, n: u64, extra_args: &[&str]) -> Result<Cluster> {
        Cluster::create_with_spares(name, n, 0, extra_args).await
    }

    /// As [`Cluster::create`], plus `spares` nodes (ids n+1..=n+spares)
    /// outside the initial members, to add later: each starts with
    /// [`Cluster::restart_with`] and `--initial-cluster-state existing`
    /// (its `--initial-members` names the initial members and itself).
    pub async fn create_with_spares(
        name: &str,
        n: u64,
        spares: u64,
        extra_args: &[&str],
    ) -> Result<Cluster> {
        let permit = ONE_CLUSTER_AT_A_TIME
            .acquire()
            .await
            .context("the cluster semaphore was closed")?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("latchkey-{name}-"))
            .tempdir()
            .context("create the test's temporary directory")?;
        let all = n + spares;
        let addrs = latchkey::free_loopback_addrs(2 * usize::try_from(all).context("node count")?)
            .context("find free loopback ports")?;
        let mut specs = BTreeMap::new();
        for (id, pair) in (1..=all).zip(addrs.chunks(2)) {
            specs.insert(
                id,
                NodeSpec {
                    addr: pair[0].clone(),
                    peer_addr: pair[1].clone(),
                    data_dir: dir.path().join(format!("node-{id}")),
                    log: dir.path().join(format!("node-{id}.log")),
                },
            );
        }
        let members_arg = specs
            .iter()
            .filter(|(id, _)| **id <= n)
            .map(|(id, s)| format!("{id}={}", s.peer_addr))
            .collect::<Vec<_>>()
            .join(",");
        // Every process cluster authenticates its peers, as a deployment
        // should.
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, format!("{CLUSTER_SECRET}\n"))
            .context("write the cluster secret")?;
        let admin = Client::with_options(
            specs.values().map(|s| s.addr.clone()),
            client_options()
                .with_request_timeout(Duration::from_secs(5))
                .with_attempt_timeout(Duration::from_secs(2)),
        )
        .context("build the status client")?;
        let cluster = Cluster {
            name: name.to_string(),
            dir: Some(dir),
            specs,
            members_arg,
            extra_args: [
                "--cluster-secret-file".to_string(),
                secret.display().to_string(),
            ]
            .into_iter()
            .chain(extra_args.iter().map(|a| a.to_string()))
            .collect(),
            children: BTreeMap::new(),
            stopped: BTreeSet::new(),
            admin,
            passed: false,
            _permit: permit,
        };
        Ok(cluster)
    }

    /// The `--initial-members` every node starts with.
    pub fn members_arg(&self) -> &str {
        &self.members_arg
    }

    /// Run the test body under `limit`, then report: on failure (error,
    /// panic or time-out) print every node's log tail and panic.
    pub fn finish(
        mut self,
        outcome: Result<Result<()>, tokio::time::error::Elapsed>,
        limit: Duration,
    ) {
        let verdict = match outcome {
            Ok(Ok(())) => self.check_no_panics(),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(anyhow!("the test did not finish within {limit:?}")),
        };
        match verdict {
            Ok(()) => self.passed = true,
            Err(e) => {
                let name = self.name.clone();
                drop(self); // kills the nodes and prints the log tails
                panic!("test {name} failed: {e:#}");
            }
        }
    }

    /// Every node id, running or not.
    pub fn ids(&self) -> Vec<u64> {
        self.specs.keys().copied().collect()
    }

    /// Votes needed for a majority of the configured members.
    pub fn majority(&self) -> usize {
        self.specs.len() / 2 + 1
    }

    /// `127.0.0.1:PORT` of node `id`'s client listener.
    pub fn addr(&self, id: u64) -> String {
        self.specs
            .get(&id)
            .map(|s| s.addr.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// `127.0.0.1:PORT` of node `id`'s peer listener.
    pub fn peer_addr(&self, id: u64) -> String {
        self.specs
            .get(&id)
            .map(|s| s.peer_addr.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Every node's address.
    pub fn endpoints(&self) -> Vec<String> {
        self.specs.values().map(|s| s.addr.clone()).collect()
    }

    /// Nodes started and neither killed nor stopped.
    pub fn live_ids(&self) -> Vec<u64> {
        self.children
            .keys()
            .copied()
            .filter(|id| !self.stopped.contains(id))
            .collect()
    }

    /// Addresses of the live nodes.
    pub fn live_endpoints(&self) -> Vec<String> {
        self.live_ids()
            .into_iter()
            .map(|id| self.addr(id))
            .collect()
    }

    /// The `--endpoints` value naming every node.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// A client over every node's endpoint.
    pub fn client(&self) -> Result<Client> {
        Client::with_options(self.endpoints(), client_options()).context("build a client")
    }

    /// A client over the given nodes only, in that order.
    pub fn client_for(&self, ids: &[u64]) -> Result<Client> {
        Client::with_options(ids.iter().map(|id| self.addr(*id)), client_options())
            .context("build a client")
    }

    /// Everything node `id` has logged so far (all its runs).
    pub fn log_text(&self, id: u64) -> String {
        self.specs
            .get(&id)
            .and_then(|s| std::fs::read(&s.log).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// Process id of node `id`, when running.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.children.get(&id).map(Child::id)
    }

    fn note(&self, id: u64, text: &str) {
        if let Some(spec) = self.specs.get(&id) {
            if let Ok(mut f) = OpenOptions::new().create(true).append(true).open(&spec.log) {
                let _ = writeln!(f, "==== harness: {text} ====");
            }
        }
    }

    fn spawn(&mut self, id: u64) -> Result<()> {
        self.spawn_with(id, &[])
    }

    /// Start node `id` with its usual command line plus `more` at the end.
    fn spawn_with(&mut self, id: u64, more: &[&str]) -> Result<()> {
        ensure!(
            !self.children.contains_key(&id),
            "node {id} is already running"
        );
        let spec = self
            .specs
            .get(&id)
            .with_context(|| format!("no node {id}"))?;
        self.note(
            id,
            &format!(
                "starting node {id} on {} (peers {})",
                spec.addr, spec.peer_addr
            ),
        );
        let stdout = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log)
            .with_context(|| format!("open {}", spec.log.display()))?;
        let stderr = stdout.try_clone().context("clone the log file handle")?;
        // A spare (not an initial member) names itself too.
        let initial = self
            .members_arg
            .split(',')
            .any(|m| m.split('=').next() == Some(id.to_string().as_str()));
        let members = if initial {
            self.members_arg.clone()
        } else {
            format!("{},{id}={}", self.members_arg, spec.peer_addr)
        };
        let child = Command::new(bin())
            .arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(&spec.addr)
            .arg("--peer-listen")
            .arg(&spec.peer_addr)
            .arg("--data-dir")
            .arg(&spec.data_dir)
            .arg("--initial-members")
            .arg(&members)
            .args(
                self.extra_args
                    .iter()
                    .map(|a| a.replace("{id}", &id.to_string())),
            )
            .args(more)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .env("RUST_BACKTRACE", "1")
            .env("NO_COLOR", "1")
            .spawn()
            .with_context(|| format!("spawn {} serve for node {id}", bin()))?;
        self.children.insert(id, child);
        Ok(())
    }

    /// SIGKILL node `id` and reap it. Fails if it had already exited on its
    /// own (a crash is a bug, not something to paper over).
    pub fn kill(&mut self, id: u64) -> Result<()> {
        let mut child = self
            .children
            .remove(&id)
            .with_context(|| format!("node {id} is not running"))?;
        self.stopped.remove(&id);
        let early = child.try_wait().context("try_wait")?;
        if early.is_none() {
            signal(child.id(), libc::SIGKILL).with_context(|| format!("SIGKILL node {id}"))?;
        }
        let status = child.wait().with_context(|| format!("reap node {id}"))?;
        self.note(id, &format!("node {id} killed by the harness ({status})"));
        match early {
            Some(s) => bail!("node {id} had already exited on its own before being killed: {s}"),
            None => Ok(()),
        }
    }

    /// Stop node `id` gracefully (SIGTERM, as a deploy or `systemctl stop`
    /// does) and wait up to `timeout` for it to exit; fails unless it
    /// exits with success.
    pub async fn terminate(&mut self, id: u64, timeout: Duration) -> Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal(pid, libc::SIGTERM).with_context(|| format!("SIGTERM node {id}"))?;
        self.note(id, &format!("node {id} sent SIGTERM by the harness"));
        let status = self.wait_exit(id, timeout).await?;
        ensure!(status.success(), "node {id} exited {status} after SIGTERM");
        Ok(())
    }

    /// Freeze node `id` (SIGSTOP): it stays a member but answers nothing.
    pub fn stop(&mut self, id: u64) -> Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal(pid, libc::SIGSTOP).with_context(|| format!("SIGSTOP node {id}"))?;
        self.stopped.insert(id);
        self.note(id, &format!("node {id} SIGSTOPped"));
        Ok(())
    }

    /// Resume node `id` (SIGCONT).
    pub fn cont(&mut self, id: u64) -> Result<()> {
        let pid = self
            .pid(id)
            .with_context(|| format!("node {id} is not running"))?;
        signal(pid, libc::SIGCONT).with_context(|| format!("SIGCONT node {id}"))?;
        self.stopped.remove(&id);
        self.note(id, &format!("node {id} SIGCONTinued"));
        Ok(())
    }

    /// Start node `id` again on its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.spawn(id)
    }

    /// Start node `id` again on its data directory, with `more` appended to
    /// its usual command line (e.g. `--initial-cluster-state existing`).
    pub fn restart_with(&mut self, id: u64, more: &[&str]) -> Result<()> {
        self.spawn_with(id, more)
    }

    /// Data directory of node `id` (`--data-dir`).
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.specs
            .get(&id)
            .map(|s| s.data_dir.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Log file of node `id` (its stdout and stderr, all runs).
    pub fn log_path(&self, id: u64) -> PathBuf {
        self.specs
            .get(&id)
            .map(|s| s.log.clone())
            .unwrap_or_else(|| panic!("no node {id} in this cluster"))
    }

    /// Move node `id`'s data directory aside (to `<data-dir>.<suffix>`, in
    /// the test's temporary directory, kept for inspection) so that its next
    /// start finds none: the operator's "delete the data directory". The
    /// node must not be running. Returns where the directory went.
    pub fn move_data_dir_aside(&mut self, id: u64, suffix: &str) -> Result<PathBuf> {
        ensure!(
            !self.children.contains_key(&id),
            "node {id} is running: stop it before moving its data directory"
        );
        let dir = self.data_dir(id);
        let aside = dir.with_extension(suffix);
        ensure!(!aside.exists(), "{} already exists", aside.display());
        std::fs::rename(&dir, &aside)
            .with_context(|| format!("move {} to {}", dir.display(), aside.display()))?;
        self.note(
            id,
            &format!("node {id}'s data directory moved to {}", aside.display()),
        );
        Ok(aside)
    }

    /// Wait (polling, up to `timeout`) until node `id` exits on its own;
    /// reap it and return how it exited. Fails if it still runs then (it is
    /// left running, and killed when the cluster is dropped).
    pub async fn wait_exit(
        &mut self,
        id: u64,
        timeout: Duration,
    ) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self
                .children
                .get_mut(&id)
                .with_context(|| format!("node {id} is not running"))?;
            if let Some(status) = child.try_wait().context("try_wait")? {
                self.children.remove(&id);
                self.stopped.remove(&id);
                self.note(id, &format!("node {id} exited on its own ({status})"));
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("node {id} still runs after {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// True when node `id` runs: not reaped, and signal 0 reaches it.
    pub fn is_alive(&mut self, id: u64) -> bool {
        let Some(child) = self.children.get_mut(&id) else {
            return false;
        };
        matches!(child.try_wait(), Ok(None)) && signal(child.id(), 0).is_ok()
    }

    /// Fail unless every node the harness started (and did not kill) runs.
    pub fn assert_all_alive(&mut self) -> Result<()> {
        for (id, child) in &mut self.children {
            if let Some(status) = child.try_wait().context("try_wait")? {
                bail!("node {id} exited on its own: {status}");
            }
            signal(child.id(), 0).with_context(|| format!("node {id} does not answer signal 0"))?;
        }
        Ok(())
    }

    /// Status of node `id`.
    pub async fn status(&self, id: u64) -> Result<NodeStatus> {
        self.admin
            .status_of(&self.addr(id))
            .await
            .with_context(|| format!("status of node {id}"))
    }

    /// Statuses of every live node that answers.
    pub async fn statuses(&self) -> BTreeMap<u64, NodeStatus> {
        let mut out = BTreeMap::new();
        for id in self.live_ids() {
            if let Ok(s) = self.admin.status_of(&self.addr(id)).await {
                out.insert(id, s);
            }
        }
        out
    }

    /// The leader a majority agrees on right now: a live node that reports
    /// itself leader, and enough nodes naming it in the same term.
    pub async fn leader_id(&self) -> Option<u64> {
        agreed_leader(&self.statuses().await, self.majority())
    }

    /// Poll every live node until a majority agrees on a live leader.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            let statuses = self.statuses().await;
            if let Some(leader) = agreed_leader(&statuses, self.majority()) {
                return Ok(leader);
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = statuses
                    .values()
                    .map(|s| {
                        format!(
                            "node {} {} term {} leader {:?}",
                            s.id, s.state, s.term, s.leader_id
                        )
                    })
                    .collect();
                bail!(
                    "no leader agreed by a majority within {timeout:?} (live: {:?}; seen: {})",
                    self.live_ids(),
                    seen.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// A live node other than `leader`.
    pub fn follower_of(&self, leader: u64) -> Result<u64> {
        self.live_ids()
            .into_iter()
            .find(|id| *id != leader)
            .context("no live follower")
    }

    /// The cluster secret file the replicas run with.
    pub fn secret_file(&self) -> String {
        self.dir
            .as_ref()
            .map(|d| d.path().join("cluster.secret").display().to_string())
            .unwrap_or_default()
    }

    /// Run the CLI with `--endpoints` naming every node and the cluster
    /// secret (membership changes need it; on the client port it makes the
    /// calls root's), then `args`.
    pub async fn cli(&self, args: &[&str]) -> Result<CliOutput> {
        self.cli_with(true, args, None).await
    }

    /// Run the CLI with `--endpoints` naming every node, the cluster secret
    /// if `secret`, then `args`, with `stdin` as its input.
    pub async fn cli_with(
        &self,
        secret: bool,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<CliOutput> {
        let endpoints = self.endpoints_arg();
        let secret_file = self.secret_file();
        let mut all = vec!["--endpoints", endpoints.as_str()];
        if secret {
            all.extend(["--cluster-secret-file", secret_file.as_str()]);
        }
        all.extend_from_slice(args);
        run_cli_with_stdin(&all, stdin).await
    }

    /// Start a long-running CLI command (`watch`, `put --ephemeral`) with
    /// `args` and `--endpoints` naming every node; its stdout is read line
    /// by line. The process is killed when the child is dropped.
    pub fn spawn_cli(&self, args: &[&str]) -> Result<(tokio::process::Child, CliLines)> {
        let mut child = tokio::process::Command::new(bin())
            .args(args)
            .args(["--endpoints", &self.endpoints_arg()])
            .env_remove("LATCHKEY_ENDPOINTS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start `latchkey {}`", args.join(" ")))?;
        let stdout = child.stdout.take().context("stdout")?;
        Ok((
            child,
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout)),
        ))
    }

    /// What every replica has logged so far, one text.
    pub fn logs(&self) -> String {
        self.specs
            .values()
            .map(|spec| {
                std::fs::read(&spec.log)
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            })
            .collect()
    }

    fn check_no_panics(&self) -> Result<()> {
        for (id, spec) in &self.specs {
            let text = std::fs::read(&spec.log)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            if let Some(at) = text.find("panicked") {
                let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let excerpt: String = text[start..]
                    .lines()
                    .take(15)
                    .collect::<Vec<_>>()
                    .join("\n");
                bail!("node {id} panicked:\n{excerpt}");
            }
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let ids: Vec<u64> = self.children.keys().copied().collect();
        for id in ids {
            if let Some(mut child) = self.children.remove(&id) {
                let _ = signal(child.id(), libc::SIGKILL);
                let _ = child.wait();
            }
        }
        if self.passed {
            if std::env::var_os("LATCHKEY_KEEP_TEST_DIRS").is_some() {
                if let Some(mut dir) = self.dir.take() {
                    dir.disable_cleanup(true);
                    eprintln!("----- {}: kept {} -----", self.name, dir.path().display());
                }
            }
            return;
        }
        for (id, spec) in &self.specs {
            eprintln!(
                "----- {}: last {TAIL_LINES} lines of node {id}'s log ({}) -----\n{}",
                self.name,
                spec.log.display(),
                tail(&spec.log, TAIL_LINES)
            );
        }
        if let Some(mut dir) = self.dir.take() {
            dir.disable_cleanup(true);
            eprintln!(
                "----- {}: data and logs kept in {} -----",
                self.name,
                dir.path().display()
            );
        }
    }
}

/// The leader a majority of `statuses` agrees on, if any.
pub fn agreed_leader(statuses: &BTreeMap<u64, NodeStatus>, majority: usize) -> Option<u64> {
    statuses.values().find_map(|s| {
        let leads = s.state == "Leader" && s.leader_id == Some(s.id);
        let agreeing = statuses
            .values()
            .filter(|t| t.leader_id == Some(s.id) && t.term == s.term)
            .count();
        (leads && agreeing >= majority).then_some(s.id)
    })
}

/// Copy the directory tree `from` to `to` (which must not exist): regular
/// files and directories only, as a data directory holds. For copying a
/// stopped node's data directory (a "backup").
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) -> Result<()> {
    std::fs::create_dir(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("list {}", from.display()))? {
        let entry = entry.with_context(|| format!("list {}", from.display()))?;
        let kind = entry.file_type().context("file type")?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target).with_context(|| {
                format!("copy {} to {}", entry.path().display(), target.display())
            })?;
        } else {
            bail!(
                "{} is neither a file nor a directory",
                entry.path().display()
            );
        }
    }
    Ok(())
}

/// Poll `probe` until it returns `Ok`, or fail after `timeout` with the last
/// reason it gave.
pub async fn eventually<T>(
    timeout: Duration,
    what: &str,
    mut probe: impl AsyncFnMut() -> Result<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(50);
    loop {
        match probe().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() >= deadline => {
                return Err(e.context(format!("{what}: still not true after {timeout:?}")))
            }
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}

/// What one CLI run printed and how it exited.
#[derive(Debug)]
pub struct CliOutput {
    /// Exit code; `None` if killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl CliOutput {
    /// Fail unless the command exited 0; returns its stdout.
    pub fn ok(&self) -> Result<&str> {
        ensure!(
            self.code == Some(0),
            "CLI failed with {:?}: stdout {:?}, stderr {:?}",
            self.code,
            self.stdout,
            self.stderr
        );
        Ok(&self.stdout)
    }

    /// Fail unless the command exited with `code` and printed exactly one
    /// non-empty line on stderr and no panic anywhere.
    pub fn refused_with(&self, code: i32) -> Result<()> {
        ensure!(
            self.code == Some(code),
            "expected exit code {code}, got {:?}: stdout {:?}, stderr {:?}",
            self.code,
            self.stdout,
            self.stderr
        );
        self.one_line_error()
    }

    /// Fail unless stderr is exactly one non-empty line and nothing panicked.
    pub fn one_line_error(&self) -> Result<()> {
        let lines: Vec<&str> = self.stderr.lines().collect();
        ensure!(
            lines.len() == 1 && !lines[0].trim().is_empty(),
            "expected one line on stderr, got {:?}",
            self.stderr
        );
        ensure!(
            !self.stderr.contains("panicked") && !self.stdout.contains("panicked"),
            "the CLI panicked: stdout {:?}, stderr {:?}",
            self.stdout,
            self.stderr
        );
        Ok(())
    }
}

/// Run the `latchkey` binary with `args` (bounded by 60 s).
pub async fn run_cli(args: &[&str]) -> Result<CliOutput> {
    run_cli_with_stdin(args, None).await
}

/// [`run_cli`] with `input` on its stdin (e.g. a password).
pub async fn run_cli_with_stdin(args: &[&str], input: Option<&str>) -> Result<CliOutput> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(bin())
        .args(args)
        .env_remove("LATCHKEY_ENDPOINTS")
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("run `latchkey {}`", args.join(" ")))?;
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(text.as_bytes())
            .await
            .context("write stdin")?;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .map_err(|_| anyhow!("`latchkey {}` did not finish within 60 s", args.join(" ")))?
        .with_context(|| format!("run `latchkey {}`", args.join(" ")))?;
    Ok(CliOutput {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

// ----------------------------------------------------- shared write/read checks

/// Run one write, retrying it while its outcome is unknown or the cluster
/// unavailable (a spurious election on a loaded machine). Only for
/// idempotent writes, or where a skipped outcome is harmless.
pub async fn retrying<T>(
    what: &str,
    mut write: impl AsyncFnMut() -> Result<T, Error>,
) -> Result<T> {
    let mut last = None;
    for _ in 0..5 {
        match write().await {
            Ok(v) => return Ok(v),
            Err(e @ (Error::UnknownOutcome(_) | Error::Unavailable { .. })) => last = Some(e),
            Err(e) => return Err(e).with_context(|| what.to_string()),
        }
    }
    Err(anyhow::anyhow!(
        "{what}: gave up after 5 attempts, last: {last:?}"
    ))
}

/// Write `count` keys `{prefix}{i}` sequentially; every one must end up
/// acknowledged (used when no fault is being injected, or around one).
pub async fn write_all(
    client: &Client,
    prefix: &str,
    count: usize,
) -> Result<BTreeMap<String, String>> {
    let mut written = BTreeMap::new();
    for i in 0..count {
        let key = format!("{prefix}{i:04}");
        let value = format!("value-{prefix}{i}");
        retrying(&format!("put {key}"), async || {
            client.put(&key, &value).await
        })
        .await?;
        written.insert(key, value);
    }
    Ok(written)
}

/// Every acknowledged write reads back (linearizable get and scan).
pub async fn verify_linearizable(
    client: &Client,
    prefix: &str,
    acked: &BTreeMap<String, String>,
) -> Result<()> {
    for (k, v) in acked {
        let got = client
            .get(k)
            .await
            .with_context(|| format!("linearizable get {k}"))?;
        ensure!(
            got.as_deref() == Some(v.as_bytes()),
            "acknowledged write {k}={v} lost: read {:?}",
            got.map(|g| String::from_utf8_lossy(&g).into_owned())
        );
    }
    let page = client
        .scan(ScanRange::prefix(prefix, 0))
        .await
        .context("linearizable scan")?;
    ensure!(!page.more, "scan of {prefix:?} unexpectedly truncated");
    let scanned: BTreeMap<String, String> = page
        .entries
        .iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(&v.value).into_owned(),
            )
        })
        .collect();
    for (k, v) in acked {
        ensure!(
            scanned.get(k) == Some(v),
            "scan lost acknowledged write {k}={v}: scanned {:?}",
            scanned.get(k)
        );
    }
    ensure!(
        scanned.keys().all(|k| k.starts_with(prefix)),
        "scan returned keys outside {prefix:?}"
    );
    Ok(())
}

/// Poll `node` alone (stale reads) until it holds every entry of `expected`.
pub async fn wait_node_has(
    c: &Cluster,
    node: u64,
    expected: &BTreeMap<String, String>,
) -> Result<()> {
    let local = c.client_for(&[node])?;
    eventually(
        CONVERGE_WAIT,
        &format!("node {node} holds every acknowledged write"),
        async || {
            for (k, v) in expected {
                let got = local.get_with(k, Consistency::Stale).await?;
                ensure!(
                    got.as_deref() == Some(v.as_bytes()),
                    "node {node}: {k} reads {:?}, expected {v}",
                    got.map(|g| String::from_utf8_lossy(&g).into_owned())
                );
            }
            Ok(())
        },
    )
    .await
}

/// A process group this test started; killed (by group) when dropped.
pub struct Group {
    /// The group leader.
    pub child: Child,
}

impl Group {
    /// Start `command` as the leader of a new process group.
    pub fn spawn(mut command: Command) -> Result<Group> {
        use std::os::unix::process::CommandExt;
        let child = command
            .process_group(0)
            .spawn()
            .context("spawn a test process")?;
        Ok(Group { child })
    }

    /// The group leader's pid (the group's id).
    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap_or(i32::MAX)
    }

    /// Send `sig` to the whole group.
    pub fn signal(&self, sig: libc::c_int) -> Result<()> {
        // SAFETY: kill(2) on the process group this test created.
        let rc = unsafe { libc::kill(-self.pid(), sig) };
        ensure!(rc == 0, "kill({}, {sig}) failed", -self.pid());
        Ok(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = self.signal(libc::SIGCONT);
        let _ = self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}
