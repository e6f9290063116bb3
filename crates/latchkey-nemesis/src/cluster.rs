//! The cluster under test: three `latchkey serve` processes, each in its
//! own network namespace (or, without root, on loopback), that the nemesis
//! kills, restarts, pauses and partitions.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions};

use crate::error::{Error, Result};
use crate::net::Netns;

/// The port every replica listens on inside its namespace.
const NETNS_PORT: u16 = 7400;

/// One replica.
#[derive(Debug)]
struct Replica {
    id: u64,
    addr: String,
    listen: String,
    data: PathBuf,
    log: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// Three replicas and the hosts they run on.
pub struct Cluster {
    server_bin: PathBuf,
    members: String,
    replicas: Vec<Replica>,
    status: Client,
    /// Declared last: dropped after the replicas are killed.
    net: Option<Netns>,
}

/// Server settings of the run: Raft timeouts as shipped, but snapshots
/// every 200 entries so that restarts and lagging replicas exercise
/// snapshot installation, not only log replay.
const SNAPSHOT_EVERY: &str = "200";
const KEEP_AFTER_SNAPSHOT: &str = "50";

impl Cluster {
    /// Starts three replicas with data under `dir`; in `net`'s namespaces
    /// when given, else on loopback.
    pub fn start(server_bin: &Path, dir: &Path, net: Option<Netns>) -> Result<Cluster> {
        let mut addrs = Vec::new();
        let mut listens = Vec::new();
        match &net {
            Some(n) => {
                for i in 0..3 {
                    addrs.push(format!("{}:{NETNS_PORT}", n.node_ip(i)));
                    listens.push(format!("0.0.0.0:{NETNS_PORT}"));
                }
            }
            None => {
                let mut held = Vec::new();
                for _ in 0..3 {
                    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                        .map_err(Error::io("find a free loopback port"))?;
                    let port = l.local_addr().map_err(Error::io("read a port"))?.port();
                    addrs.push(format!("127.0.0.1:{port}"));
                    listens.push(format!("127.0.0.1:{port}"));
                    held.push(l);
                }
            }
        }
        let members = latchkey::initial_members_arg(&addrs);
        let options = ClientOptions {
            request_timeout: Duration::from_millis(400),
            attempt_timeout: Duration::from_millis(300),
            connect_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        };
        let status = Client::with_options(&addrs, options)
            .map_err(|e| Error::Cluster(format!("cannot build a status client: {e}")))?;
        let replicas = (0..3)
            .map(|i| Replica {
                id: i as u64 + 1,
                addr: addrs[i].clone(),
                listen: listens[i].clone(),
                data: dir.join(format!("data/n{}", i + 1)),
                log: dir.join(format!("logs/n{}.log", i + 1)),
                child: None,
                paused: false,
            })
            .collect();
        std::fs::create_dir_all(dir.join("logs")).map_err(Error::io("create logs/"))?;
        let mut cluster = Cluster {
            server_bin: server_bin.to_path_buf(),
            members,
            replicas,
            status,
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
        let log_err = log.try_clone().map_err(Error::io("clone a log handle"))?;
        let mut cmd = match &self.net {
            Some(n) => n.command(i, &self.server_bin),
            None => Command::new(&self.server_bin),
        };
        cmd.arg("serve")
            .arg("--id")
            .arg(r.id.to_string())
            .arg("--listen")
            .arg(&r.listen)
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
        Ok(())
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
    /// replicas must survive every fault.
    pub fn check_alive(&mut self) -> Result<()> {
        for r in &mut self.replicas {
            let Some(child) = r.child.as_mut() else {
                continue;
            };
            if let Ok(Some(status)) = child.try_wait() {
                r.child = None;
                return Err(Error::Cluster(format!(
                    "replica {} exited on its own ({status}); see {}",
                    r.id,
                    r.log.display()
                )));
            }
        }
        Ok(())
    }

    /// The index of the replica that says it leads (the highest term wins
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

    /// Every replica up, running and connected: heal, resume, restart.
    pub fn restore_all(&mut self) -> Result<()> {
        self.heal()?;
        for i in 0..self.replicas.len() {
            if self.replicas[i].paused {
                self.resume(i);
            }
            self.restart(i)?;
        }
        Ok(())
    }

    /// Kill every replica at once (SIGKILL), then start them all again.
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
/// endpoint at once.
pub async fn leader_of(status: &Client, endpoints: &[String]) -> Option<(usize, u64)> {
    let mut set = tokio::task::JoinSet::new();
    for (i, addr) in endpoints.iter().enumerate() {
        let c = status.clone();
        let addr = addr.clone();
        set.spawn(async move { (i, c.status_of(&addr).await) });
    }
    let mut best: Option<(usize, u64)> = None;
    while let Some(joined) = set.join_next().await {
        if let Ok((i, Ok(s))) = joined {
            if s.state == "Leader" && best.is_none_or(|(_, t)| s.term > t) {
                best = Some((i, s.term));
            }
        }
    }
    best
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
