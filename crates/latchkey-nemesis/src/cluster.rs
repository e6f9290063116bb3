//! The cluster under test: three `latchkey serve` processes, each in its
//! own network namespace (or, without root, on loopback), that the nemesis
//! kills, restarts, pauses, partitions and whose data directories it
//! damages (disk faults), then repairs.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions};

use crate::error::{Error, Result};
use crate::net::Netns;

/// The port every replica listens on for clients inside its namespace.
const NETNS_PORT: u16 = 7400;
/// The port every replica listens on for peers inside its namespace.
const NETNS_PEER_PORT: u16 = 7401;

/// `latchkey serve`'s exit code when the replica could not start or failed
/// while running (lost acknowledged state, data directory gone, Raft core
/// stopped).
pub const EXIT_REPLICA_FAILED: i32 = 8;

/// One replica.
#[derive(Debug)]
struct Replica {
    id: u64,
    /// What clients dial.
    addr: String,
    listen: String,
    /// What peers dial (the initial members; `members add`).
    peer_addr: String,
    peer_listen: String,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
    /// A disk fault is being carried out on it: the fault watches its exit,
    /// which is not an error of the run.
    exempt: bool,
    /// Its disk was damaged and it started anyway (a flipped byte nobody
    /// read yet): why. If it exits later with [`EXIT_REPLICA_FAILED`],
    /// that is the damage found, not an error; it gets repaired.
    suspect: Option<String>,
    /// Such a late exit, waiting for its repair: when, and how.
    late_exit: Option<(u64, ExitStatus)>,
    /// Damaged data directories moved aside so far.
    discarded: u32,
    /// The length of its log file when its current process started.
    log_at_spawn: u64,
}

/// A replica that exited on its own because of earlier damage to its disk.
#[derive(Debug)]
pub struct LateExit {
    /// The replica's index.
    pub index: usize,
    /// When the harness saw it gone (CLOCK_MONOTONIC, ns).
    pub time_ns: u64,
    pub status: ExitStatus,
    /// What the replica damaged earlier, and when.
    pub cause: String,
}

/// Three replicas and the hosts they run on.
pub struct Cluster {
    server_bin: PathBuf,
    members: String,
    /// The cluster secret file every replica is started with.
    secret: PathBuf,
    replicas: Vec<Replica>,
    status: Client,
    /// With TLS: the directory `latchkey certs` wrote.
    certs: Option<PathBuf>,
    /// Declared last: dropped after the replicas are killed.
    net: Option<Netns>,
}

/// Server settings of the run: Raft timeouts as shipped, but snapshots
/// every 200 entries so that restarts and lagging replicas exercise
/// snapshot installation, not only log replay.
const SNAPSHOT_EVERY: &str = "200";
/// The secret the run's replicas share; admin clients (repairs) send it.
pub const CLUSTER_SECRET: &str = "latchkey-nemesis-cluster-secret";
const KEEP_AFTER_SNAPSHOT: &str = "50";

impl Cluster {
    /// Starts three replicas with data under `dir`; in `net`'s namespaces
    /// when given, else on loopback.
    ///
    /// With `tls`, `latchkey certs` first writes a CA and a certificate per
    /// replica (naming its address) to `dir/certs`; the replicas then serve
    /// TLS and talk mutual TLS to each other, and every client of the run
    /// trusts the CA.
    pub fn start(server_bin: &Path, dir: &Path, net: Option<Netns>, tls: bool) -> Result<Cluster> {
        let (addrs, listens, peer_addrs, peer_listens) = match &net {
            Some(n) => {
                let on = |port: u16| {
                    (0..3)
                        .map(|i| format!("{}:{port}", n.node_ip(i)))
                        .collect::<Vec<_>>()
                };
                let any = |port: u16| vec![format!("0.0.0.0:{port}"); 3];
                (
                    on(NETNS_PORT),
                    any(NETNS_PORT),
                    on(NETNS_PEER_PORT),
                    any(NETNS_PEER_PORT),
                )
            }
            None => {
                let mut addrs = latchkey::free_loopback_addrs(6)
                    .map_err(Error::io("find free loopback ports"))?;
                let peers = addrs.split_off(3);
                (addrs.clone(), addrs, peers.clone(), peers)
            }
        };
        let members = latchkey::initial_members_arg(&peer_addrs);
        let certs = if tls {
            let certs = dir.join("certs");
            let hosts: Vec<String> = addrs
                .iter()
                .filter_map(|a| a.rsplit_once(':').map(|(host, _)| host.to_string()))
                .collect();
            latchkey::certs::write_cluster(&certs, 3, &hosts, &[])
                .map_err(|e| Error::Cluster(format!("cannot make TLS certificates: {e}")))?;
            Some(certs)
        } else {
            None
        };
        let options = tls_options(
            certs.as_deref(),
            ClientOptions::default()
                .with_request_timeout(Duration::from_millis(400))
                .with_attempt_timeout(Duration::from_millis(300))
                .with_connect_timeout(Duration::from_millis(300)),
        )?;
        let status = Client::with_options(&addrs, options)
            .map_err(|e| Error::Cluster(format!("cannot build a status client: {e}")))?;
        let replicas = (0..3)
            .map(|i| Replica {
                id: i as u64 + 1,
                addr: addrs[i].clone(),
                listen: listens[i].clone(),
                peer_addr: peer_addrs[i].clone(),
                peer_listen: peer_listens[i].clone(),
                data: dir.join(format!("data/n{}", i + 1)),
                log: dir.join(format!("logs/n{}.log", i + 1)),
                child: None,
                paused: false,
                exempt: false,
                suspect: None,
                late_exit: None,
                discarded: 0,
                log_at_spawn: 0,
            })
            .collect();
        std::fs::create_dir_all(dir.join("logs")).map_err(Error::io("create logs/"))?;
        // The replicas authenticate each other (README, "Securing a
        // cluster"): the soak runs as a deployment should.
        let secret = dir.join("cluster.secret");
        std::fs::write(&secret, format!("{CLUSTER_SECRET}\n"))
            .map_err(Error::io("write the cluster secret"))?;
        let mut cluster = Cluster {
            server_bin: server_bin.to_path_buf(),
            members,
            secret,
            replicas,
            status,
            certs,
            net,
        };
        for i in 0..3 {
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    /// The replicas' addresses, in id order.
    pub fn endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(|r| r.addr.clone()).collect()
    }

    /// The directory of the run's certificates, when it runs TLS.
    pub fn certs(&self) -> Option<&Path> {
        self.certs.as_deref()
    }

    /// `base` with the run's TLS (trust the CA, present the client
    /// certificate, which membership changes need), when it runs TLS.
    pub fn client_options(&self, base: ClientOptions) -> Result<ClientOptions> {
        tls_options(self.certs.as_deref(), base)
    }

    /// A client for status polls (short timeouts).
    pub fn status_client(&self) -> Client {
        self.status.clone()
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let r = &self.replicas[i];
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&r.log)
            .map_err(Error::io(format!("open {}", r.log.display())))?;
        let _ = writeln!(log, "==== harness: starting replica {}", r.id);
        let log_at_spawn = log.metadata().map_or(0, |m| m.len());
        let log_err = log.try_clone().map_err(Error::io("clone a log handle"))?;
        let mut cmd = match &self.net {
            Some(n) => n.command(i, &self.server_bin),
            None => Command::new(&self.server_bin),
        };
        if let Some(certs) = &self.certs {
            cmd.arg("--cacert")
                .arg(certs.join("ca.pem"))
                .arg("--cert")
                .arg(certs.join(format!("node-{}.pem", r.id)))
                .arg("--key")
                .arg(certs.join(format!("node-{}-key.pem", r.id)));
        }
        cmd.arg("serve")
            .arg("--id")
            .arg(r.id.to_string())
            .arg("--listen")
            .arg(&r.listen)
            .arg("--peer-listen")
            .arg(&r.peer_listen)
            .arg("--advertise")
            .arg(&r.addr)
            .arg("--data-dir")
            .arg(&r.data)
            .arg("--initial-members")
            .arg(&self.members)
            .arg("--snapshot-every")
            .arg(SNAPSHOT_EVERY)
            .arg("--keep-after-snapshot")
            .arg(KEEP_AFTER_SNAPSHOT)
            .arg("--cluster-secret-file")
            .arg(&self.secret)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err);
        detach(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(Error::io(format!("start replica {}", r.id)))?;
        let r = &mut self.replicas[i];
        r.child = Some(child);
        r.paused = false;
        r.late_exit = None;
        r.log_at_spawn = log_at_spawn;
        Ok(())
    }

    /// Replica `i`'s client address.
    pub fn addr(&self, i: usize) -> &str {
        &self.replicas[i].addr
    }

    /// Replica `i`'s peer address (what `members add` names).
    pub fn peer_addr(&self, i: usize) -> &str {
        &self.replicas[i].peer_addr
    }

    /// Replica `i`'s node id.
    pub fn id(&self, i: usize) -> u64 {
        self.replicas[i].id
    }

    /// Replica `i`'s data directory: always the same path, on every
    /// restart (a repair moves the damaged one aside first).
    pub fn data_dir(&self, i: usize) -> &Path {
        &self.replicas[i].data
    }

    /// Whether replica `i` has a process (running or paused).
    pub fn running(&self, i: usize) -> bool {
        self.replicas[i].child.is_some()
    }

    /// A disk fault on replica `i` starts (`true`) or ends: while it runs,
    /// [`Cluster::check_alive`] leaves the replica to the fault.
    pub fn set_exempt(&mut self, i: usize, exempt: bool) {
        self.replicas[i].exempt = exempt;
    }

    /// Replica `i` runs on a damaged disk (`Some(why)`), or on a sound one.
    pub fn set_suspect(&mut self, i: usize, why: Option<String>) {
        self.replicas[i].suspect = why;
    }

    /// Why replica `i` is known to run on a damaged disk, if it is.
    pub fn suspect(&self, i: usize) -> Option<&str> {
        self.replicas[i].suspect.as_deref()
    }

    /// The status of replica `i` if it has exited (it is then reaped and
    /// counts as down).
    pub fn try_exit(&mut self, i: usize) -> Option<ExitStatus> {
        let r = &mut self.replicas[i];
        let status = r.child.as_mut().and_then(|c| c.try_wait().ok().flatten())?;
        r.child = None;
        r.paused = false;
        Some(status)
    }

    /// The replicas that exited because of earlier damage to their disk
    /// and wait for a repair (each reported once).
    pub fn take_late_exits(&mut self) -> Vec<LateExit> {
        let mut out = Vec::new();
        for (index, r) in self.replicas.iter_mut().enumerate() {
            if let Some((time_ns, status)) = r.late_exit.take() {
                out.push(LateExit {
                    index,
                    time_ns,
                    status,
                    cause: r.suspect.clone().unwrap_or_default(),
                });
            }
        }
        out
    }

    /// Deletes replica `i`'s data directory (running or not).
    pub fn remove_data(&mut self, i: usize) -> Result<()> {
        let dir = &self.replicas[i].data;
        match std::fs::remove_dir_all(dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::Io {
                context: format!("delete {}", dir.display()),
                source: e,
            }),
        }
    }

    /// Moves replica `i`'s (stopped) data directory aside, to
    /// `<dir>.discarded-<n>`, kept for a failed run's post-mortem; returns
    /// where it went, or `None` when there was none.
    pub fn discard_data(&mut self, i: usize) -> Result<Option<PathBuf>> {
        let r = &mut self.replicas[i];
        if !r.data.exists() {
            return Ok(None);
        }
        r.discarded += 1;
        let mut name = r.data.as_os_str().to_owned();
        name.push(format!(".discarded-{}", r.discarded));
        let to = PathBuf::from(name);
        std::fs::rename(&r.data, &to).map_err(Error::io(format!(
            "move {} to {}",
            r.data.display(),
            to.display()
        )))?;
        Ok(Some(to))
    }

    /// The line replica `i`'s last process said why it stopped with:
    /// `latchkey serve`'s last line (`latchkey: ...`), else the last line
    /// naming the problem.
    pub fn exit_message(&self, i: usize) -> Option<String> {
        let r = &self.replicas[i];
        let text = std::fs::read(&r.log).ok()?;
        let start = usize::try_from(r.log_at_spawn).unwrap_or(0).min(text.len());
        let text = String::from_utf8_lossy(&text[start..]);
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        let pick = lines
            .iter()
            .rev()
            .find(|l| l.starts_with("latchkey: "))
            .or_else(|| {
                lines.iter().rev().find(|l| {
                    l.contains("lost state") || l.contains("ERROR") || l.contains("failed")
                })
            })?;
        Some(shorten(pick, 400))
    }

    /// Up to `max` lines of every replica's whole log (all its processes)
    /// that contain `needle`, each prefixed with the replica's name.
    pub fn log_lines_containing(&self, needle: &str, max: usize) -> Vec<String> {
        let mut found = Vec::new();
        for (i, r) in self.replicas.iter().enumerate() {
            let Ok(text) = std::fs::read(&r.log) else {
                continue;
            };
            let text = String::from_utf8_lossy(&text);
            for line in text.lines().filter(|l| l.contains(needle)) {
                if found.len() >= max {
                    return found;
                }
                found.push(format!("n{}: {}", i + 1, shorten(line.trim(), 400)));
            }
        }
        found
    }

    /// The first panic replica `i`'s last process logged (`panicked at`,
    /// with the message line after it), if it panicked.
    pub fn panic_message(&self, i: usize) -> Option<String> {
        let r = &self.replicas[i];
        let text = std::fs::read(&r.log).ok()?;
        let start = usize::try_from(r.log_at_spawn).unwrap_or(0).min(text.len());
        let text = String::from_utf8_lossy(&text[start..]);
        let mut lines = text.lines();
        let at = lines.by_ref().find(|l| l.contains("panicked at"))?;
        let what = lines.next().unwrap_or("");
        Some(shorten(&format!("{} {}", at.trim(), what.trim()), 500))
    }

    /// Appends a line to replica `i`'s log: what the harness did to it.
    pub fn log_note(&self, i: usize, note: &str) {
        if let Ok(mut log) = OpenOptions::new().append(true).open(&self.replicas[i].log) {
            let _ = writeln!(log, "==== harness: {note}");
        }
    }

    fn pid(&self, i: usize) -> Option<i32> {
        self.replicas[i]
            .child
            .as_ref()
            .and_then(|c| i32::try_from(c.id()).ok())
    }

    /// SIGKILL replica `i` (by pid) and reap it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.replicas[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.replicas[i].paused = false;
    }

    /// Restarts replica `i` on its data, if it is down.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        if self.replicas[i].child.is_none() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// SIGSTOP replica `i`.
    pub fn pause(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            signal(pid, libc::SIGSTOP);
            self.replicas[i].paused = true;
        }
    }

    /// SIGCONT replica `i`.
    pub fn resume(&mut self, i: usize) {
        if let Some(pid) = self.pid(i) {
            signal(pid, libc::SIGCONT);
        }
        self.replicas[i].paused = false;
    }

    /// Cuts replica `i` off from the other replicas.
    pub fn isolate(&mut self, i: usize) -> Result<()> {
        match self.net.as_mut() {
            Some(n) => n.isolate(i),
            None => Err(Error::Usage(
                "partitions need network namespaces (run as root)".into(),
            )),
        }
    }

    /// Removes every partition.
    pub fn heal(&mut self) -> Result<()> {
        match self.net.as_mut() {
            Some(n) => n.heal(),
            None => Ok(()),
        }
    }

    /// An error if a replica exited although the harness did not kill it:
    /// replicas must survive every fault. Two exceptions: a replica under a
    /// disk fault (the fault watches it), and a replica that runs on a disk
    /// damaged earlier and exits with [`EXIT_REPLICA_FAILED`] (it found the
    /// damage: [`Cluster::take_late_exits`] hands it over for repair).
    pub fn check_alive(&mut self) -> Result<()> {
        for r in &mut self.replicas {
            if r.exempt {
                continue;
            }
            let Some(child) = r.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                r.child = None;
                r.paused = false;
                if r.suspect.is_some() && status.code() == Some(EXIT_REPLICA_FAILED) {
                    r.late_exit = Some((crate::clock::now_ns(), status));
                    continue;
                }
                return Err(Error::Cluster(format!(
                    "replica {} exited on its own ({status}); see {}",
                    r.id,
                    r.log.display()
                )));
            }
        }
        Ok(())
    }

    /// The index of the replica that says it leads (the latest ballot, term then id, wins
    /// when two do), asking all three at once.
    pub async fn leader(&self) -> Option<(usize, u64)> {
        leader_of(&self.status, &self.endpoints()).await
    }

    /// Waits until some replica leads and a linearizable read succeeds.
    pub async fn wait_ready(&mut self, within: Duration) -> Result<usize> {
        let started = Instant::now();
        loop {
            self.check_alive()?;
            if let Some((i, _)) = self.leader().await {
                if self.status.get("harness/ready").await.is_ok() {
                    return Ok(i);
                }
            }
            if started.elapsed() > within {
                return Err(Error::Cluster(format!(
                    "no leader serving reads within {within:?}; see the logs in {}",
                    self.replicas[0]
                        .log
                        .parent()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Every replica up, running and connected: heal, resume, restart;
    /// except a replica waiting for the repair of its disk (see
    /// [`Cluster::take_late_exits`]), which restarting would not mend.
    pub fn restore_all(&mut self) -> Result<()> {
        self.heal()?;
        for i in 0..self.replicas.len() {
            if self.replicas[i].paused {
                self.resume(i);
            }
            if self.replicas[i].late_exit.is_none() {
                self.restart(i)?;
            }
        }
        Ok(())
    }

    /// Kill every replica at once (SIGKILL), then start them all again, each
    /// on its current data directory.
    pub fn kill_all_and_restart(&mut self) -> Result<()> {
        for i in 0..self.replicas.len() {
            self.kill(i);
        }
        for i in 0..self.replicas.len() {
            self.spawn(i)?;
        }
        Ok(())
    }

    /// SIGTERM every replica and wait (up to `grace`) for a clean exit;
    /// the ones still running after that are killed.
    pub fn stop(&mut self, grace: Duration) -> Vec<String> {
        let mut notes = Vec::new();
        for i in 0..self.replicas.len() {
            if self.replicas[i].paused {
                self.resume(i);
            }
            if let Some(pid) = self.pid(i) {
                signal(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        for r in &mut self.replicas {
            let Some(mut child) = r.child.take() else {
                continue;
            };
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(20))
                    }
                    _ => {
                        notes.push(format!(
                            "replica {} did not exit within {grace:?} of SIGTERM; killed",
                            r.id
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
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.replicas.len() {
            if self.replicas[i].paused {
                self.resume(i);
            }
            self.kill(i);
        }
        // `net` is dropped after this, deleting the namespaces.
    }
}

/// The index and term of the replica that says it leads, asking every
/// endpoint at once (the latest ballot when two say so).
pub async fn leader_of(status: &Client, endpoints: &[String]) -> Option<(usize, u64)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, addr) in endpoints.iter().enumerate() {
        let c = status.clone();
        let addr = addr.clone();
        set.spawn(async move { (i, c.status_of(&addr).await) });
    }
    // Ballots are (term, node id): two replicas may say they lead in one
    // term, and the higher id's ballot is the later one.
    let mut best: Option<(usize, u64, u64)> = None;
    while let Some(joined) = set.join_next().await {
        if let Ok((i, Ok(s))) = joined {
            if s.state == "Leader" && best.is_none_or(|(_, t, id)| (s.term, s.id) > (t, id)) {
                best = Some((i, s.term, s.id));
            }
        }
    }
    best.map(|(i, term, _)| (i, term))
}

/// `s`, cut to at most `max` characters.
pub fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

/// Sends `sig` to `pid`.
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill has no memory-safety preconditions; the pid is one of
    // our own children, not yet reaped.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Each child in its own process group (a terminal's Ctrl-C reaches only
/// the harness, whose guards then clean up), and killed by the kernel if
/// the harness dies without running its guards. Children are spawned from
/// the controller's single runtime thread, which lives as long as the
/// process, so the parent-death signal fires only when the harness is gone.
pub fn detach(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of the
    // parent; it runs in the child between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Opens (truncating) a log file for a child's output.
pub fn log_file(path: &Path) -> Result<(File, File)> {
    let f = File::create(path).map_err(Error::io(format!("create {}", path.display())))?;
    let g = f.try_clone().map_err(Error::io("clone a log handle"))?;
    Ok((f, g))
}

/// `base` trusting `certs/ca.pem` and presenting `certs/client.pem`, when
/// the run has certificates.
fn tls_options(certs: Option<&Path>, base: ClientOptions) -> Result<ClientOptions> {
    let Some(certs) = certs else {
        return Ok(base);
    };
    let tls = latchkey::TlsOptions::from_files(
        &certs.join("ca.pem"),
        Some((&certs.join("client.pem"), &certs.join("client-key.pem"))),
    )
    .map_err(|e| Error::Cluster(format!("TLS: {e}")))?;
    Ok(base.with_tls(tls))
}
