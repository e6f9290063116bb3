//! A throw-away three-process cluster: a temporary directory, three free
//! loopback ports, three `latchkey serve` children, and guards that kill the
//! children and remove the directory however the benchmark ends.

use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use latchkey::{Client, ClientOptions, TlsOptions};

/// A directory removed (recursively) when dropped.
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    /// A new, empty directory `latchkey-bench-<pid>-<nanos>` under `parent`.
    pub fn new(parent: &Path) -> Result<TempDir, String> {
        fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = parent.join(format!("latchkey-bench-{}-{nanos}", std::process::id()));
        fs::create_dir(&path)
            .map_err(|e| format!("cannot create the data directory {}: {e}", path.display()))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.path) {
            eprintln!(
                "latchkey-bench: warning: could not remove {}: {e}",
                self.path.display()
            );
        }
    }
}

/// One `latchkey serve` child.
struct Server {
    id: u64,
    addr: String,
    /// Its metrics listener (`--metrics-listen`).
    metrics: String,
    log: PathBuf,
    /// Its command line after the binary, to start it again.
    args: Vec<std::ffi::OsString>,
    child: Option<Child>,
}

/// Three running replicas. Dropping it kills them (SIGKILL by pid) and reaps them.
pub struct Cluster {
    servers: Vec<Server>,
    tls: Option<TlsOptions>,
    server_bin: PathBuf,
}

impl Cluster {
    /// Start three durable replicas with default settings (plus
    /// `serve_args` after `latchkey serve`'s own) under `dir`, stdout and
    /// stderr of each to `dir/node-<id>.log`.
    ///
    /// With `tls`, `latchkey certs` first writes a CA and certificates to
    /// `dir/certs`; each server then serves TLS with its own certificate
    /// (mutual TLS between them), and [`Cluster::tls`] is what clients use.
    pub fn start(
        server_bin: &Path,
        dir: &Path,
        tls: bool,
        serve_args: &[String],
    ) -> Result<Cluster, String> {
        let mut addrs = latchkey::free_loopback_addrs(9)
            .map_err(|e| format!("cannot find free loopback ports: {e}"))?;
        let metrics_addrs = addrs.split_off(6);
        let peer_addrs = addrs.split_off(3);
        let members = latchkey::initial_members_arg(&peer_addrs);
        let certs = dir.join("certs");
        let tls = if tls {
            latchkey::certs::write_cluster(&certs, 3, &[], &[])
                .map_err(|e| format!("cannot make TLS certificates: {e}"))?;
            Some(
                TlsOptions::from_files(&certs.join("ca.pem"), None)
                    .map_err(|e| format!("the certificates `latchkey certs` wrote: {e}"))?,
            )
        } else {
            None
        };

        let mut cluster = Cluster {
            servers: Vec::with_capacity(3),
            tls,
            server_bin: server_bin.to_path_buf(),
        };
        let listens = addrs.iter().zip(&peer_addrs).zip(&metrics_addrs);
        for (i, ((addr, peer_addr), metrics)) in listens.enumerate() {
            let id = (i + 1) as u64;
            let data = dir.join(format!("node-{id}"));
            let log = dir.join(format!("node-{id}.log"));
            let mut args: Vec<std::ffi::OsString> = Vec::new();
            if cluster.tls.is_some() {
                args.extend([
                    "--cacert".into(),
                    certs.join("ca.pem").into(),
                    "--cert".into(),
                    certs.join(format!("node-{id}.pem")).into(),
                    "--key".into(),
                    certs.join(format!("node-{id}-key.pem")).into(),
                ]);
            }
            args.extend([
                "serve".into(),
                "--id".into(),
                id.to_string().into(),
                "--listen".into(),
                addr.into(),
                "--peer-listen".into(),
                peer_addr.into(),
                "--data-dir".into(),
                data.into(),
                "--initial-members".into(),
                members.clone().into(),
                "--metrics-listen".into(),
                metrics.into(),
            ]);
            args.extend(serve_args.iter().map(Into::into));
            // Pushed before it starts: from then on the Drop guard owns it.
            cluster.servers.push(Server {
                id,
                addr: addr.clone(),
                metrics: metrics.clone(),
                log,
                args,
                child: None,
            });
            cluster.spawn(i)?;
        }
        Ok(cluster)
    }

    /// Start server `i` (an index into `servers`), its output appended to
    /// its log.
    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let Some(s) = self.servers.get_mut(i) else {
            return Err(format!("no server {i}"));
        };
        let log_file = File::options()
            .create(true)
            .append(true)
            .open(&s.log)
            .map_err(|e| format!("cannot open {}: {e}", s.log.display()))?;
        let log_err = log_file
            .try_clone()
            .map_err(|e| format!("cannot open {}: {e}", s.log.display()))?;
        let mut cmd = Command::new(&self.server_bin);
        cmd.args(&s.args)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        detach(&mut cmd);
        let child = cmd.spawn().map_err(|e| {
            format!(
                "cannot start server {} ({} serve): {e}",
                s.id,
                self.server_bin.display()
            )
        })?;
        s.child = Some(child);
        Ok(())
    }

    /// SIGKILL the server at `addr` and reap it.
    pub fn kill(&mut self, addr: &str) -> Result<(), String> {
        let i = self.index_of(addr)?;
        let s = &mut self.servers[i];
        let mut child = s
            .child
            .take()
            .ok_or_else(|| format!("server {} is not running", s.id))?;
        child
            .kill()
            .map_err(|e| format!("cannot kill server {}: {e}", s.id))?;
        let _ = child.wait();
        Ok(())
    }

    /// SIGTERM the server at `addr` (a graceful stop, as a deploy does it)
    /// and wait up to `within` for it to exit: an error if it does not, or
    /// exits with a failure (it is then killed and reaped).
    pub async fn terminate(&mut self, addr: &str, within: Duration) -> Result<(), String> {
        let i = self.index_of(addr)?;
        let s = &mut self.servers[i];
        let mut child = s
            .child
            .take()
            .ok_or_else(|| format!("server {} is not running", s.id))?;
        let pid = libc::pid_t::try_from(child.id())
            .map_err(|_| format!("server {}'s pid is out of range", s.id))?;
        // SAFETY: kill(2) on the pid of a child this cluster spawned and has
        // not reaped (`child` is still held), so the pid is not reused.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            return Err(format!(
                "cannot SIGTERM server {}: {}",
                s.id,
                std::io::Error::last_os_error()
            ));
        }
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    return Err(format!("server {} exited {status} after SIGTERM", s.id))
                }
                Ok(None) if started.elapsed() < within => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(format!(
                        "server {} still ran {within:?} after SIGTERM",
                        s.id
                    ));
                }
                Err(e) => return Err(format!("cannot wait for server {}: {e}", s.id)),
            }
        }
    }

    /// Start the server at `addr` again (after [`Cluster::kill`]).
    pub fn restart(&mut self, addr: &str) -> Result<(), String> {
        let i = self.index_of(addr)?;
        self.spawn(i)
    }

    /// The index of the server at `addr`.
    fn index_of(&self, addr: &str) -> Result<usize, String> {
        self.servers
            .iter()
            .position(|s| s.addr == addr)
            .ok_or_else(|| format!("no server at {addr}"))
    }

    /// The TLS settings clients need, when the servers run TLS.
    pub fn tls(&self) -> Option<&TlsOptions> {
        self.tls.as_ref()
    }

    /// The replicas' `host:port`, in id order.
    pub fn endpoints(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.addr.clone()).collect()
    }

    /// Process ids of the running replicas (for the report).
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .filter_map(|s| s.child.as_ref().map(Child::id))
            .collect()
    }

    /// An error if a replica has exited, with the end of its log.
    pub fn check_alive(&mut self) -> Result<(), String> {
        for s in &mut self.servers {
            let Some(child) = s.child.as_mut() else {
                continue;
            };
            match child.try_wait() {
                Ok(None) => {}
                Ok(Some(status)) => {
                    s.child = None;
                    return Err(format!(
                        "server {} ({}) exited with {status}; end of {}:\n{}",
                        s.id,
                        s.addr,
                        s.log.display(),
                        log_tail(&s.log, 4096)
                    ));
                }
                Err(e) => return Err(format!("cannot check server {}: {e}", s.id)),
            }
        }
        Ok(())
    }

    /// The last lines of every replica's log, for error messages.
    pub fn logs_tail(&self) -> String {
        let mut text = String::new();
        for s in &self.servers {
            text.push_str(&format!(
                "--- end of {} (server {}, {}):\n{}\n",
                s.log.display(),
                s.id,
                s.addr,
                log_tail(&s.log, 2048)
            ));
        }
        text
    }

    /// Every running replica's RocksDB background jobs (flushes and
    /// compactions running or pending: `latchkey_storage_background_jobs`),
    /// read from its metrics listener.
    pub async fn background_jobs(&self) -> Result<Vec<u64>, String> {
        let mut jobs = Vec::with_capacity(self.servers.len());
        for s in self.servers.iter().filter(|s| s.child.is_some()) {
            let text = http_get(&s.metrics, "/metrics")
                .await
                .map_err(|e| format!("server {}'s metrics at {}: {e}", s.id, s.metrics))?;
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix("latchkey_storage_background_jobs "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    format!(
                        "server {} reports no latchkey_storage_background_jobs (an older server?)",
                        s.id
                    )
                })?;
            jobs.push(value);
        }
        Ok(jobs)
    }

    /// Every running replica's last applied log index, from its status.
    pub async fn last_applied(&self) -> Result<Vec<u64>, String> {
        let client = self.status_client()?;
        let mut applied = Vec::with_capacity(self.servers.len());
        for s in self.servers.iter().filter(|s| s.child.is_some()) {
            let status = client
                .status_of(&s.addr)
                .await
                .map_err(|e| format!("server {}'s status: {e}", s.id))?;
            applied.push(status.last_applied);
        }
        Ok(applied)
    }

    /// A client for status calls only (short timeouts).
    fn status_client(&self) -> Result<Client, String> {
        let mut options = ClientOptions::default()
            .with_request_timeout(Duration::from_secs(2))
            .with_attempt_timeout(Duration::from_millis(500))
            .with_connect_timeout(Duration::from_millis(500));
        if let Some(tls) = &self.tls {
            options = options.with_tls(tls.clone());
        }
        Client::with_options(self.endpoints(), options)
            .map_err(|e| format!("cannot build a status client: {e}"))
    }

    /// Poll every replica's status until one says it leads; its address.
    pub async fn wait_for_leader(&mut self, within: Duration) -> Result<String, String> {
        let endpoints = self.endpoints();
        let client = self.status_client()?;
        let started = Instant::now();
        let mut last = String::from("no replica answered yet");
        loop {
            self.check_alive()?;
            for addr in &endpoints {
                match client.status_of(addr).await {
                    Ok(s) if s.state == "Leader" => return Ok(addr.clone()),
                    Ok(s) => {
                        last = format!(
                            "{addr}: state {}, leader {:?}, term {}",
                            s.state, s.leader_id, s.term
                        )
                    }
                    Err(e) => last = e.to_string(),
                }
            }
            if started.elapsed() > within {
                return Err(format!(
                    "no leader elected within {within:?} (last: {last})\n{}",
                    self.logs_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            if let Some(mut child) = s.child.take() {
                // SIGKILL by pid (never by name); then reap it.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// Each server in its own process group (a terminal's Ctrl-C reaches only the
/// benchmark, whose guard then kills the servers), and killed by the kernel if
/// the benchmark dies without running its guards (SIGKILL, abort).
fn detach(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        // SAFETY: prctl is async-signal-safe and touches no memory of the
        // parent; it runs in the child between fork and exec. The servers are
        // spawned from the main thread, which lives as long as the process, so
        // the "parent died" signal fires only when the benchmark is gone.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

/// The last `max` bytes of a log file, or a note saying why not.
fn log_tail(path: &Path, max: u64) -> String {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) => return format!("(cannot read: {e})"),
    };
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > max {
        let _ = file.seek(SeekFrom::Start(len - max));
    }
    let mut buf = Vec::new();
    if let Err(e) = file.read_to_end(&mut buf) {
        return format!("(cannot read: {e})");
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    if text.trim().is_empty() {
        "(empty)".into()
    } else {
        text
    }
}

/// The body of `GET path` from the HTTP server at `addr` (the replicas'
/// metrics listener), within 10 s. A plain HTTP/1.1 request over TCP: one
/// scrape does not justify an HTTP client dependency.
async fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .map_err(|_| "no answer within 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(format!(
            "unexpected answer: {}",
            response.lines().next().unwrap_or("(empty)")
        )),
    }
}
