//! [`ScratchPostgres`]: a throwaway PostgreSQL server for tests and demos.
//!
//! Not a way to run PostgreSQL for data you keep: the server runs with
//! `fsync=off` and trusts every local connection.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// The environment variable naming the directory of PostgreSQL's programs
/// (`initdb`, `postgres`), searched before the usual places.
pub const BINDIR_ENV: &str = "LATCHKEY_POSTGRES_BINDIR";

/// When set (to anything), [`ScratchPostgres::start_unless_missing`]
/// treats a missing PostgreSQL as an error: `cargo xtask test`, which
/// installs PostgreSQL first, sets it.
pub const REQUIRE_ENV: &str = "LATCHKEY_REQUIRE_POSTGRES";

/// How long the server may take to initialise and start.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a fast shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// The role the scratch server's clients connect as (a superuser).
pub const USER: &str = "latchkey";

/// Why a scratch PostgreSQL server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScratchError {
    /// PostgreSQL's server programs are not installed where they were
    /// looked for.
    #[error(
        "PostgreSQL's server programs (initdb, postgres) were not found in {searched}: \
         install them (on Debian or Ubuntu: apt-get install postgresql; `cargo xtask test` \
         does this itself), or set {BINDIR_ENV} to the directory that holds them"
    )]
    NotInstalled {
        /// Where they were looked for.
        searched: String,
    },
    /// Running as root, and there is no `postgres` user to run the server
    /// as (PostgreSQL refuses to run as root).
    #[error(
        "running as root, but there is no user `postgres` to run the server as (PostgreSQL \
         refuses to run as root): install Debian's postgresql package, which creates it, or \
         run as another user"
    )]
    NoServerUser,
    /// A file or process operation failed.
    #[error("scratch PostgreSQL: could not {action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// `initdb` or the server failed; `log` is the end of its output.
    #[error("scratch PostgreSQL: {what} failed; its output ends with:\n{log}")]
    Failed {
        /// Which step failed.
        what: &'static str,
        /// The last lines of its output.
        log: String,
    },
}

/// A PostgreSQL server of its own, in a temporary directory, listening on
/// 127.0.0.1 only, stopped (by its pid) and deleted when dropped.
///
/// Its programs are found in `$LATCHKEY_POSTGRES_BINDIR`, else in the
/// newest `/usr/lib/postgresql/<version>/bin` (Debian's layout), else on
/// the `PATH`. Running as root, the server runs as the user `postgres`, as
/// PostgreSQL requires. Clients connect as the superuser [`USER`] to the
/// database `postgres`, without a password.
#[derive(Debug)]
pub struct ScratchPostgres {
    child: Child,
    port: u16,
    log: PathBuf,
    // Dropped last: the server must be stopped before its directory goes.
    dir: TempDir,
}

impl ScratchPostgres {
    /// Initialises a new database cluster and starts its server; returns
    /// once it accepts connections (at most a minute).
    pub fn start() -> Result<ScratchPostgres, ScratchError> {
        let bindir = find_bindir()?;
        let owner = server_user()?;
        let dir = tempfile::Builder::new()
            .prefix("latchkey-scratch-pg-")
            .tempdir()
            .map_err(io_error("create a temporary directory"))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(io_error(
                "give the temporary directory to the postgres user",
            ))?;
        }
        let data = dir.path().join("data");
        let log = dir.path().join("server.log");
        let initdb_log = dir.path().join("initdb.log");
        let mut initdb = server_command(&bindir.join("initdb"), owner, dir.path());
        initdb
            .arg("--pgdata")
            .arg(&data)
            .args(["--username", USER, "--auth", "trust", "--no-sync"])
            .args(["--encoding", "UTF8", "--locale", "C"]);
        let status = initdb
            .stdout(output_file(&initdb_log)?)
            .stderr(output_file(&initdb_log)?)
            .status()
            .map_err(io_error("run initdb"))?;
        if !status.success() {
            return Err(ScratchError::Failed {
                what: "initdb",
                log: tail(&initdb_log),
            });
        }
        let port = free_port()?;
        let mut server = server_command(&bindir.join("postgres"), owner, dir.path());
        server
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(dir.path())
            .args(["-p", &port.to_string()])
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=60"]);
        let child = server
            .stdin(Stdio::null())
            .stdout(output_file(&log)?)
            .stderr(output_file(&log)?)
            .spawn()
            .map_err(io_error("start the postgres server"))?;
        let mut scratch = ScratchPostgres {
            child,
            port,
            log,
            dir,
        };
        scratch.wait_ready()?;
        tracing::info!(port, pid = scratch.pid(), "scratch PostgreSQL server ready");
        Ok(scratch)
    }

    /// For tests that can run only with PostgreSQL: [`start`](Self::start),
    /// but `Ok(None)` when PostgreSQL's programs are not installed and
    /// `LATCHKEY_REQUIRE_POSTGRES` is not set (the caller says it skipped).
    pub fn start_unless_missing() -> Result<Option<ScratchPostgres>, ScratchError> {
        match ScratchPostgres::start() {
            Ok(server) => Ok(Some(server)),
            Err(ScratchError::NotInstalled { .. }) if std::env::var_os(REQUIRE_ENV).is_none() => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A libpq-style connection string for the database `postgres`, as
    /// `tokio_postgres::connect` and psycopg take it.
    pub fn connection_string(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user={USER} dbname=postgres",
            self.port
        )
    }

    /// The server's own log (for a test's failure message).
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }

    /// The temporary directory that holds the cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Waits until the server's log says it accepts connections, or it
    /// exits, or the time is up.
    fn wait_ready(&mut self) -> Result<(), ScratchError> {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            let text = fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains("database system is ready to accept connections") {
                return Ok(());
            }
            let exited = self
                .child
                .try_wait()
                .map_err(io_error("check on the postgres server"))?;
            if exited.is_some() || Instant::now() > deadline {
                return Err(ScratchError::Failed {
                    what: if exited.is_some() {
                        "the postgres server"
                    } else {
                        "waiting for the postgres server (60 s)"
                    },
                    log: tail(&self.log),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ScratchPostgres {
    /// Stops the server by its pid: SIGINT (PostgreSQL's fast shutdown),
    /// then SIGKILL if it has not exited within 15 s.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
                // SAFETY: kill(2) on the pid of our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGINT) };
            }
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Ok(None) = self.child.try_wait() {
                tracing::warn!(
                    pid = self.child.id(),
                    "scratch PostgreSQL did not stop; killing it"
                );
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// The directory holding `initdb` and `postgres`.
fn find_bindir() -> Result<PathBuf, ScratchError> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    let mut searched = Vec::new();
    if let Some(dir) = std::env::var_os(BINDIR_ENV) {
        let dir = PathBuf::from(dir);
        if has_both(&dir) {
            return Ok(dir);
        }
        searched.push(format!("{BINDIR_ENV}={}", dir.display()));
    }
    let debian = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir(debian)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Ok(bin);
    }
    searched.push(format!("{}/<version>/bin", debian.display()));
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_both(&dir) {
                return Ok(dir);
            }
        }
    }
    searched.push("the PATH".to_owned());
    Err(ScratchError::NotInstalled {
        searched: searched.join(", "),
    })
}

/// As whom the server runs: `None` for the current user, the `postgres`
/// user's ids when running as root.
fn server_user() -> Result<Option<(u32, u32)>, ScratchError> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = fs::read_to_string("/etc/passwd").map_err(io_error("read /etc/passwd"))?;
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            match fields.as_slice() {
                ["postgres", _, uid, gid, ..] => Some((uid.parse().ok()?, gid.parse().ok()?)),
                _ => None,
            }
        })
        .map(Some)
        .ok_or(ScratchError::NoServerUser)
}

/// A command for one of PostgreSQL's programs, run as `owner` when given.
fn server_command(program: &Path, owner: Option<(u32, u32)>, cwd: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(cwd).env_remove("PGDATA");
    if let Some((uid, gid)) = owner {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    cmd
}

/// A file to send a program's output to.
fn output_file(path: &Path) -> Result<File, ScratchError> {
    File::options()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io_error(format!("open {}", path.display())))
}

/// A port free on 127.0.0.1 right now (the kernel's choice).
fn free_port() -> Result<u16, ScratchError> {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(io_error("find a free port"))
}

/// The last 30 lines of a log file.
fn tail(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

fn io_error(action: impl Into<String>) -> impl FnOnce(io::Error) -> ScratchError {
    let action = action.into();
    move |source| ScratchError::Io { action, source }
}
