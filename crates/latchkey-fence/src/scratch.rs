//! [`ScratchPostgres`]: a throwaway PostgreSQL server for tests and demos.
//!
//! Not a way to run PostgreSQL for data you keep: the server runs with
//! `fsync=off`. It listens on 127.0.0.1 and a Unix socket in a directory
//! only its owner can enter, and asks for a password made up at start
//! (other local users cannot use it).

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
/// database `postgres`, with the password in
/// [`connection_string`](Self::connection_string).
///
/// If the process that started it dies without unwinding (SIGKILL, an
/// abort), its server is left running; the next `start` on the machine
/// stops such orphans (by the pid in their data directory, after checking
/// that process is their postgres) and deletes their directories.
#[derive(Debug)]
pub struct ScratchPostgres {
    child: Child,
    port: u16,
    password: String,
    log: PathBuf,
    // Dropped last: the server must be stopped before its directory goes.
    dir: TempDir,
}

impl ScratchPostgres {
    /// Initialises a new database cluster and starts its server; returns
    /// once it accepts connections (at most a minute).
    pub fn start() -> Result<ScratchPostgres, ScratchError> {
        reap_orphans();
        let bindir = find_bindir()?;
        let owner = server_user()?;
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io_error("create a temporary directory"))?;
        fs::write(dir.path().join(OWNER_FILE), std::process::id().to_string())
            .map_err(io_error("record the owner of the temporary directory"))?;
        // The top directory stays ours (the logs are written here, by us);
        // the server may only pass through it, into the two directories it
        // owns: its data and its socket.
        set_mode(dir.path(), if owner.is_some() { 0o711 } else { 0o700 })?;
        let (data, run) = (dir.path().join("data"), dir.path().join("run"));
        for sub in [&data, &run] {
            fs::create_dir(sub).map_err(io_error(format!("create {}", sub.display())))?;
            set_mode(sub, 0o700)?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(sub, Some(uid), Some(gid))
                    .map_err(io_error("give a directory to the postgres user"))?;
            }
        }
        let password = random_password()?;
        let pwfile = run.join("pwfile");
        fs::write(&pwfile, format!("{password}\n")).map_err(io_error("write the password file"))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))
                .map_err(io_error("give the password file to the postgres user"))?;
        }
        let initdb_log = dir.path().join("initdb.log");
        let mut initdb = server_command(&bindir.join("initdb"), owner, &run);
        initdb
            .arg("--pgdata")
            .arg(&data)
            .arg("--pwfile")
            .arg(&pwfile)
            .args(["--username", USER, "--auth", "scram-sha-256", "--no-sync"])
            .args(["--encoding", "UTF8", "--locale", "C"]);
        let status = initdb
            .stdout(output_file(&initdb_log)?)
            .stderr(output_file(&initdb_log)?)
            .status()
            .map_err(io_error("run initdb"))?;
        let _ = fs::remove_file(&pwfile);
        if !status.success() {
            return Err(ScratchError::Failed {
                what: "initdb",
                log: tail(&initdb_log),
            });
        }
        // The port is free when chosen but could be taken before the server
        // binds it: try another one then.
        let mut attempt = 0;
        loop {
            attempt += 1;
            let log = dir.path().join(format!("server-{attempt}.log"));
            let port = free_port()?;
            let mut server = server_command(&bindir.join("postgres"), owner, &run);
            server
                .arg("-D")
                .arg(&data)
                .arg("-k")
                .arg(&run)
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
            let mut child = child;
            match wait_ready(&mut child, &log) {
                Ok(()) => {
                    tracing::info!(port, pid = child.id(), "scratch PostgreSQL server ready");
                    return Ok(ScratchPostgres {
                        child,
                        port,
                        password,
                        log,
                        dir,
                    });
                }
                Err(e) => {
                    stop_child(&mut child);
                    if attempt >= 3 || !tail(&log).contains("could not bind") {
                        return Err(e);
                    }
                    tracing::warn!(port, "scratch PostgreSQL: port taken, trying another: {e}");
                }
            }
        }
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
            "host=127.0.0.1 port={} user={USER} password={} dbname=postgres",
            self.port, self.password
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
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        stop_child(&mut self.child);
    }
}

/// Stops a server by its pid: SIGINT (PostgreSQL's fast shutdown), then
/// SIGKILL if it has not exited within 15 s; reaps it.
fn stop_child(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) on the pid of our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if let Ok(None) = child.try_wait() {
            tracing::warn!(
                pid = child.id(),
                "scratch PostgreSQL did not stop; killing it"
            );
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Waits until the server's log says it accepts connections, or it exits,
/// or the time is up.
fn wait_ready(child: &mut Child, log: &Path) -> Result<(), ScratchError> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.contains("database system is ready to accept connections") {
            return Ok(());
        }
        let exited = child
            .try_wait()
            .map_err(io_error("check on the postgres server"))?;
        if exited.is_some() || Instant::now() > deadline {
            return Err(ScratchError::Failed {
                what: if exited.is_some() {
                    "the postgres server"
                } else {
                    "waiting for the postgres server (60 s)"
                },
                log: tail(log),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The prefix of every scratch server's temporary directory.
const DIR_PREFIX: &str = "latchkey-scratch-pg-";
/// The file, in that directory, holding the pid of the process that
/// started the server.
const OWNER_FILE: &str = "owner.pid";

/// Stops the servers of scratch directories whose owner process is gone,
/// and deletes those directories (best effort: what fails is logged).
fn reap_orphans() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let is_scratch = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(DIR_PREFIX));
        let owner = fs::read_to_string(dir.join(OWNER_FILE))
            .ok()
            .and_then(|t| t.trim().parse::<libc::pid_t>().ok());
        let Some(owner) = owner.filter(|_| is_scratch) else {
            continue;
        };
        if process_alive(owner) {
            continue;
        }
        let postmaster = fs::read_to_string(dir.join("data").join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<libc::pid_t>().ok());
        if let Some(pid) = postmaster {
            // Only if that pid is still a postgres of this directory (pids
            // are reused).
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let ours = String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy());
            if ours {
                tracing::warn!(pid, dir = %dir.display(), "stopping an orphaned scratch PostgreSQL");
                // SAFETY: kill(2); the pid was just checked to be that server.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                let deadline = Instant::now() + STOP_TIMEOUT;
                while process_alive(pid) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        if let Err(e) = fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), %e, "could not delete an orphaned scratch directory");
        }
    }
}

/// Whether a process with this pid exists (and is not a zombie of ours
/// that only waits to be reaped).
fn process_alive(pid: libc::pid_t) -> bool {
    // SAFETY: kill(2) with signal 0 only checks.
    let exists = unsafe { libc::kill(pid, 0) } == 0
        || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    let zombie = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit(')')
                .next()
                .map(|rest| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false);
    exists && !zombie
}

/// A password for the scratch server: 16 random bytes from the kernel, in
/// hex.
fn random_password() -> Result<String, ScratchError> {
    let mut bytes = [0u8; 16];
    File::open("/dev/urandom")
        .and_then(|mut f| io::Read::read_exact(&mut f, &mut bytes))
        .map_err(io_error("read /dev/urandom"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Sets a directory's permission bits.
fn set_mode(path: &Path, mode: u32) -> Result<(), ScratchError> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_error(format!(
        "set the permissions of {}",
        path.display()
    )))
}

/// The directory holding `initdb` and `postgres`.
fn find_bindir() -> Result<PathBuf, ScratchError> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("postgres").is_file();
    if let Some(dir) = std::env::var_os(BINDIR_ENV) {
        let dir = PathBuf::from(dir);
        if has_both(&dir) {
            return Ok(dir);
        }
        // Named but wrong: say so rather than use another installation.
        return Err(ScratchError::NotInstalled {
            searched: format!("{BINDIR_ENV}={}", dir.display()),
        });
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
    let mut searched = vec![format!("{}/<version>/bin", debian.display())];
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
