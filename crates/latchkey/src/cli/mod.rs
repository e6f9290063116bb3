//! Argument parsing and the subcommands of the `latchkey` tool.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use latchkey::{
    Client, ClientOptions, ClusterSecret, ClusterState, Consistency, Error, LockMode, Node,
    RaftSettings, ScanRange, Sequencer, ServerTls, SessionSecret, TlsOptions,
};

pub mod lock;
mod snapshot;

/// latchkey: an embedded replicated KV store with a lock service.
#[derive(Debug, Parser)]
#[command(name = "latchkey", version, about)]
pub struct Args {
    /// How to print what `get`, `scan`, `status`, `locks` and `members
    /// list` answer: simple (get: the value; scan: key<TAB>value lines),
    /// json (etcdctl's convention: keys and values in base64; scan prints
    /// one JSON object a line), table (status, locks, members: the
    /// default; get and scan: as simple), hex (get and scan: keys and
    /// values in hex, unambiguous for any bytes).
    #[arg(short = 'w', long, global = true, value_enum, default_value_t = WriteOut::Simple)]
    write_out: WriteOut,
    /// Cluster endpoints, host:port separated by commas.
    #[arg(long, env = "LATCHKEY_ENDPOINTS", global = true, value_delimiter = ',')]
    endpoints: Vec<String>,
    /// Give up on a request after this long (e.g. 500ms, 10s, 1m).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// A file holding the secret every replica of the cluster shares (16 to
    /// 256 visible ASCII characters, e.g. `head -c 32 /dev/urandom |
    /// base64`). `serve`: Raft calls without it are refused (without it,
    /// anyone who can reach the port can send Raft calls; a warning says
    /// so). `members`: membership changes send it.
    #[arg(long, env = "LATCHKEY_CLUSTER_SECRET_FILE", global = true)]
    cluster_secret_file: Option<PathBuf>,
    /// TLS: the CA certificate (PEM) that signs the replicas' certificates.
    /// Clients then talk TLS and verify the replicas against it; `serve`
    /// verifies peers (and clients that present a certificate) against it.
    #[arg(long, env = "LATCHKEY_CACERT", global = true, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// TLS: this side's certificate (PEM). `serve`: the replica's own, served
    /// to clients and presented to peers (needs --cacert and --key). Other
    /// commands: a client certificate, for replicas that require one and
    /// for membership changes.
    #[arg(
        long = "cert",
        id = "tls_cert",
        env = "LATCHKEY_CERT",
        global = true,
        value_name = "FILE"
    )]
    cert: Option<PathBuf>,
    /// TLS: the private key (PEM) of --cert.
    // Its own id: `put` and `get` have a KEY argument.
    #[arg(
        long = "key",
        id = "tls_key",
        env = "LATCHKEY_KEY",
        global = true,
        value_name = "FILE"
    )]
    key: Option<PathBuf>,
    /// Make every call as this user (access control): NAME, or NAME:PASSWORD
    /// as etcdctl takes it. Prefer LATCHKEY_PASSWORD for the password:
    /// arguments are visible in `ps`.
    // Its own id: `user grant-role` has a USER argument.
    #[arg(
        long = "user",
        id = "auth_user",
        env = "LATCHKEY_USER",
        global = true,
        value_name = "NAME[:PASSWORD]"
    )]
    user: Option<String>,
    /// The password of --user.
    #[arg(
        long = "password",
        id = "auth_password",
        env = "LATCHKEY_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    password: Option<String>,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run one replica in the foreground until SIGINT or SIGTERM.
    Serve(Serve),
    /// Write a development CA and TLS certificates for a local cluster:
    /// ca.pem, node-N.pem, client.pem and user-NAME.pem, each with its
    /// -key.pem.
    Certs {
        /// Directory to write them to (created if missing; an existing
        /// ca.pem is never replaced).
        #[arg(long)]
        out: PathBuf,
        /// How many node certificates.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Host names or addresses the node certificates are valid for,
        /// besides localhost, 127.0.0.1 and ::1 (comma-separated).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// Users to make client certificates for (comma-separated): each
        /// certificate's common name is the user, so a replica with TLS takes
        /// a call carrying it (and no --user) as that user, without a
        /// password.
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
    },
    /// Set KEY to VALUE.
    Put {
        key: String,
        /// The value; `-` reads it from stdin (its bytes as they are, up to
        /// 1 MiB). Or give --file.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        value: Option<String>,
        /// Read the value from this file (its bytes as they are, up to
        /// 1 MiB).
        #[arg(long, value_name = "PATH")]
        file: Option<PathBuf>,
        /// Write only while this sequencer holds its lock (exit 7 if stale).
        #[arg(long, value_name = "SEQUENCER")]
        fence: Option<String>,
        /// The secret of the sequencer's session (32 hex digits), which a
        /// fenced write needs; `latchkey lock` gives its command both. Prefer
        /// the environment variable: arguments are visible in `ps`.
        #[arg(
            long,
            env = "LATCHKEY_SESSION_SECRET",
            value_name = "HEX",
            hide_env_values = true
        )]
        session_secret: Option<String>,
    },
    /// Print the value of KEY (exit code 1 if absent).
    Get {
        key: String,
        /// Read this replica's local state without confirming leadership.
        #[arg(long)]
        stale: bool,
    },
    /// Delete KEY.
    Del {
        key: String,
        /// Delete only while this sequencer holds its lock (exit 7 if stale).
        #[arg(long, value_name = "SEQUENCER")]
        fence: Option<String>,
        /// The secret of the sequencer's session, as for `put`.
        #[arg(
            long,
            env = "LATCHKEY_SESSION_SECRET",
            value_name = "HEX",
            hide_env_values = true
        )]
        session_secret: Option<String>,
    },
    /// Print keys and values, one `key<TAB>value` a line.
    Scan {
        /// Only keys starting with this prefix.
        #[arg(long, default_value = "")]
        prefix: String,
        /// Only keys at or above this one.
        #[arg(long, default_value = "")]
        start: String,
        /// Only keys below this one.
        #[arg(long)]
        end: Option<String>,
        /// At most this many entries (0, the default: every matching key,
        /// fetched page by page; each page is a linearizable read, so a scan
        /// of several pages is not one snapshot). When the limit cuts the
        /// scan, a note on stderr says so.
        #[arg(long, default_value_t = 0)]
        limit: u32,
        /// Highest key first.
        #[arg(long)]
        reverse: bool,
    },
    /// Allocate STEP numbers from the sequence KEY; prints the first.
    Seq {
        key: String,
        #[arg(long, default_value_t = 1)]
        step: u64,
    },
    /// Show leader, term, applied index and members of each endpoint (exit
    /// 3 after printing if any endpoint does not answer, has failed, waits
    /// to be added or knows no leader).
    Status,
    /// Change cluster membership.
    #[command(subcommand)]
    Members(Members),
    /// Access control: enable, disable, status.
    #[command(subcommand)]
    Auth(AuthCmd),
    /// Access control: users.
    #[command(subcommand)]
    User(UserCmd),
    /// Access control: roles and their grants.
    #[command(subcommand)]
    Role(RoleCmd),
    /// Hold lock NAME while CMD runs; CMD gets LATCHKEY_TOKEN,
    /// LATCHKEY_SEQUENCER and LATCHKEY_SESSION_SECRET. Exits with CMD's
    /// code; latchkey's own failures are 200 + its usual code (205 not
    /// acquired in time, 206 lost while CMD ran: CMD is killed); 127/126 if
    /// CMD cannot be found/run (the lock is released at once).
    Lock(LockArgs),
    /// Internal: the watcher `lock -- CMD` runs the command under
    /// (`crate::lock_guard`).
    #[command(name = "__lock-guard", hide = true)]
    LockGuard {
        /// The read end of the deadline pipe.
        #[arg(long)]
        fd: i32,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Exit 0 if SEQUENCER still holds its lock, 1 if it is stale.
    CheckSequencer { sequencer: String },
    /// Back a cluster up to a file, inspect a backup, restore one into a
    /// new cluster.
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCmd),
    /// List locks in use: holders with their tokens, and queue lengths.
    Locks {
        /// Only locks whose names start with this.
        #[arg(long, default_value = "")]
        prefix: String,
    },
}

#[derive(Debug, clap::Args)]
struct LockArgs {
    /// The lock's name.
    name: String,
    /// Session TTL: how long the lock outlives this process if it dies.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    ttl: Duration,
    /// Wait at most this long for the lock (default: as long as it takes).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 205 at once if the lock is busy.
    #[arg(long)]
    no_wait: bool,
    /// Take the lock shared (with other shared holders).
    #[arg(long)]
    shared: bool,
    /// Maximum hold time: the cluster releases the lock after this.
    #[arg(long, value_parser = parse_duration)]
    lease: Option<Duration>,
    /// Keep the lock unavailable this long after a forced release.
    #[arg(long, value_parser = parse_duration)]
    lock_delay: Option<Duration>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Subcommand)]
enum AuthCmd {
    /// Turn access control on (a user named root must exist; it keeps
    /// every permission). From then on every call must name a user.
    Enable,
    /// Turn access control off (needs the admin permission).
    Disable,
    /// Print whether access control is on, and which user this CLI is.
    Status,
}

#[derive(Debug, Subcommand)]
enum UserCmd {
    /// Add user NAME; its password is read from stdin (one line) unless
    /// --no-password (then it cannot log in until `user passwd` sets one).
    Add {
        name: String,
        #[arg(long)]
        no_password: bool,
    },
    /// Set user NAME's password, read from stdin (one line).
    Passwd { name: String },
    /// Remove user NAME.
    Delete { name: String },
    /// Give USER the role ROLE.
    GrantRole { user: String, role: String },
    /// Take the role ROLE from USER.
    RevokeRole { user: String, role: String },
    /// Print every user, one a line.
    List,
    /// Print user NAME's roles (exit code 1 if there is no such user).
    Get { name: String },
}

#[derive(Debug, Subcommand)]
enum RoleCmd {
    /// Add role NAME, without grants.
    Add { name: String },
    /// Remove role NAME (and take it from every user).
    Delete { name: String },
    /// Let ROLE do PERMISSION (read, write, lock or admin) on keys (or lock
    /// names) starting with PREFIX (default: all of them).
    Grant {
        role: String,
        permission: String,
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Take a grant from ROLE.
    Revoke {
        role: String,
        permission: String,
        #[arg(default_value = "")]
        prefix: String,
    },
    /// Print every role, one a line.
    List,
    /// Print role NAME's grants, `PERMISSION<TAB>PREFIX` a line (exit code 1
    /// if there is no such role).
    Get { name: String },
}

#[derive(Debug, Subcommand)]
enum Members {
    /// Add node ID, the replica whose peer listener (its --peer-listen)
    /// answers at PEER_ADDR: it catches up as a learner, then becomes a
    /// voter. Also replaces a member whose data directory was wiped or
    /// replaced (the cluster knows it by another incarnation): the old
    /// member is removed first. Membership changes go to the leader's peer
    /// listener, so they need --cluster-secret-file (and with TLS, --cert
    /// and --key of the cluster's CA); while access control is enabled,
    /// also an admin user (--user, or a client certificate naming one).
    Add {
        id: u64,
        peer_addr: String,
        /// Add as a non-voting learner only.
        #[arg(long)]
        learner: bool,
        /// Replace the old member even if that leaves fewer live voters
        /// than a majority.
        #[arg(long)]
        force: bool,
    },
    /// Remove node ID from the cluster. Refused when the remaining voters
    /// (or the current ones) would not have a live majority: such a change
    /// cannot commit, or leaves a cluster that cannot serve.
    Remove {
        id: u64,
        /// Remove it even so, when the remaining voters would not have a
        /// live majority (e.g. to drop a node that will not come back while
        /// another is briefly down). The change itself still commits only
        /// with a live majority of the current voters.
        #[arg(long)]
        force: bool,
    },
    /// Make learner ID a voter (it must have caught up: `members add
    /// --learner` waits for that).
    Promote { id: u64 },
    /// List the members as the leader knows them (else the first replica
    /// that answers): id, leader/voter/learner, peer and client address,
    /// incarnation.
    List,
}

#[derive(Debug, clap::Args)]
struct Serve {
    /// This replica's id (1 or more, unique in the cluster).
    #[arg(long)]
    id: u64,
    /// Address to listen on for clients.
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// Address to listen on for peers (Raft and membership changes; other
    /// members and operators with the cluster's credentials only). Default:
    /// this node's entry in --initial-members.
    #[arg(long)]
    peer_listen: Option<std::net::SocketAddr>,
    /// Directory for this replica's RocksDB data.
    #[arg(long)]
    data_dir: PathBuf,
    /// The cluster's first voters: ID=HOST:PORT of each one's peer listener,
    /// separated by commas. The same list on every initial member; omit on
    /// a node to be added later.
    #[arg(long, value_delimiter = ',', value_parser = parse_member)]
    initial_members: Vec<(u64, String)>,
    /// Address clients use to reach this node (default: --listen; needed
    /// when that is a wildcard such as 0.0.0.0). The membership records it
    /// and clients are sent there to find the leader.
    #[arg(long)]
    advertise: Option<String>,
    /// Build a snapshot (and purge the log) after at least this many entries, once the
    /// log written since the last snapshot is as large as that snapshot.
    #[arg(long, default_value_t = 10_000)]
    snapshot_every: u64,
    /// Entries kept in the log behind a snapshot.
    #[arg(long, default_value_t = 1_000)]
    keep_after_snapshot: u64,
    /// Leader heartbeat period.
    #[arg(long, default_value = "40ms", value_parser = parse_duration)]
    heartbeat: Duration,
    /// Shortest election timeout; the longest is twice this (a dead leader
    /// is replaced after about three to four times this).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    election_timeout: Duration,
    /// With an empty data directory: `new` forms a new cluster with the
    /// other initial members once all of them answer and none belongs to a
    /// cluster yet (a node whose disk was wiped finds its cluster this way
    /// and waits to be re-added); `existing` never forms one and waits to
    /// be added with `latchkey members add`.
    #[arg(long, value_enum, default_value = "new")]
    initial_cluster_state: InitialClusterState,
    /// Most connections held open at once on each listener (clients,
    /// peers); more are closed on accept and logged.
    #[arg(long, default_value_t = latchkey::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Most connections held open at once from one IP address; more from
    /// it are closed on accept and logged.
    #[arg(long, default_value_t = latchkey::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    max_connections_per_address: usize,
    /// With TLS (--cert): refuse clients that present no certificate
    /// signed by --cacert (peers always need one).
    #[arg(long)]
    client_cert_auth: bool,
    /// With TLS (--cert): a call that names no --user and carries no
    /// cluster secret is made as the user its client certificate's common
    /// name names (if that user exists). Every certificate --cacert signs
    /// then logs its CN's user in: use a CA for this cluster only; revoke
    /// by deleting the user.
    #[arg(long)]
    client_cert_users: bool,
    /// Serve /metrics (Prometheus), /healthz and /readyz over HTTP on this
    /// address (no authentication: keep it where only monitoring reaches).
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Log lines as text (default) or JSON objects, one per line. Which
    /// lines: RUST_LOG (default `info,openraft=warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum InitialClusterState {
    New,
    Existing,
}

/// Why a command failed, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Unknown(String),
    #[error("{0}")]
    Other(String),
    #[error("{0}")]
    NotAcquired(String),
    #[error("{0}")]
    LockLost(String),
    #[error("{0}")]
    StaleFence(String),
    /// `serve`: the replica could not start or failed while running.
    #[error("{0}")]
    ReplicaFailed(String),
    /// `serve`: its configuration (flags, files) cannot be used.
    #[error("{0}")]
    Config(String),
    /// `lock -- CMD`: the command could not be started (the lock was
    /// released).
    #[error("{message}")]
    CannotRun { not_found: bool, message: String },
    /// `lock -- CMD`: latchkey's own failure, in the range that cannot be
    /// mistaken for the command's exit code (200 + the usual code).
    #[error("{0}")]
    AroundCommand(Box<Failure>),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::NotFound(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unavailable(_) => 3,
            Failure::Unknown(_) => 4,
            Failure::Other(_) => 3,
            Failure::NotAcquired(_) => 5,
            Failure::LockLost(_) => 6,
            Failure::StaleFence(_) => 7,
            Failure::ReplicaFailed(_) => 8,
            Failure::Config(_) => 9,
            Failure::CannotRun {
                not_found: true, ..
            } => 127,
            Failure::CannotRun { .. } => 126,
            Failure::AroundCommand(inner) => match **inner {
                Failure::CannotRun { .. } => inner.exit_code(),
                _ => 200 + inner.exit_code(),
            },
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        if e.is_stale_fence() {
            return Failure::StaleFence(e.to_string());
        }
        match e {
            Error::SessionLost { .. } => Failure::LockLost(e.to_string()),
            // A capacity refusal: it may succeed later, not bad input.
            Error::Refused(latchkey_client::CommandError::TooManySessions { .. }) => {
                Failure::Unavailable(e.to_string())
            }
            Error::InvalidArgument(_) | Error::BadEndpoint { .. } | Error::Refused(_) => {
                Failure::Usage(e.to_string())
            }
            Error::Unavailable { .. } => Failure::Unavailable(e.to_string()),
            Error::UnknownOutcome(_) => Failure::Unknown(e.to_string()),
            // `Error` is non-exhaustive: a kind this CLI does not know yet
            // is reported as a generic failure.
            _ => Failure::Other(e.to_string()),
        }
    }
}

impl From<&LockArgs> for lock::LockRequest {
    fn from(l: &LockArgs) -> Self {
        lock::LockRequest {
            name: l.name.clone(),
            ttl: l.ttl,
            wait: if l.no_wait { None } else { Some(l.wait) },
            shared: l.shared,
            lease: l.lease,
            lock_delay: l.lock_delay,
            command: l.command.clone(),
        }
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{s:?} needs a unit: ms, s, m or h (e.g. 10s)"))?;
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 500ms, 10s or 2m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    if d.is_zero() {
        return Err("a duration must be above zero".into());
    }
    Ok(d)
}

pub(crate) fn parse_member(s: &str) -> Result<(u64, String), String> {
    let (id, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not ID=HOST:PORT"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("{id:?} in {s:?} is not a node id"))?;
    if id == 0 {
        return Err("node id 0 is reserved".into());
    }
    let addr = addr.trim();
    if !addr.contains(':') {
        return Err(format!("{addr:?} is not HOST:PORT"));
    }
    Ok((id, addr.to_string()))
}

/// One line of stdin, without its line ending: a password, which must not
/// travel as an argument (`ps` shows those).
fn read_password() -> Result<String, Failure> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| Failure::Usage(format!("cannot read the password from stdin: {e}")))?;
    let password = line.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Failure::Usage(
            "an empty password: give one on stdin (or --no-password)".into(),
        ));
    }
    Ok(password)
}

/// Print `lines`, one a line.
fn print_lines(lines: &[String]) -> Result<ExitCode, Failure> {
    let mut text = String::new();
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}

fn client(args: &Args) -> Result<Client, Failure> {
    if args.endpoints.iter().all(|e| e.trim().is_empty()) {
        return Err(Failure::Usage(
            "no endpoints: pass --endpoints host:port,... or set LATCHKEY_ENDPOINTS".into(),
        ));
    }
    let mut options = ClientOptions::default()
        .with_request_timeout(args.timeout)
        .with_attempt_timeout(args.timeout.min(Duration::from_secs(3)));
    if let Some(path) = &args.cluster_secret_file {
        let secret = ClusterSecret::from_file(path).map_err(|e| Failure::Usage(e.to_string()))?;
        options = options.with_cluster_secret(secret.as_str());
    }
    if let Some(tls) = client_tls(args)? {
        options = options.with_tls(tls);
    }
    if let Some(user) = &args.user {
        let (name, password) = match (user.split_once(':'), &args.password) {
            (Some((name, password)), None) => (name.to_string(), password.to_string()),
            (None, Some(password)) => (user.clone(), password.clone()),
            (Some(_), Some(_)) => {
                return Err(Failure::Usage(
                    "give the password once: --user NAME:PASSWORD or --password, not both".into(),
                ))
            }
            (None, None) => {
                return Err(Failure::Usage(format!(
                    "--user {user} needs a password: --password, LATCHKEY_PASSWORD or \
                     --user {user}:PASSWORD"
                )))
            }
        };
        options = options.with_user(name, password);
    }
    let endpoints = args.endpoints.iter().filter(|e| !e.trim().is_empty());
    Ok(Client::with_options(endpoints, options)?)
}

/// `--cert` and `--key` go together.
fn identity_paths(args: &Args) -> Result<Option<(&std::path::Path, &std::path::Path)>, Failure> {
    match (&args.cert, &args.key) {
        (Some(cert), Some(key)) => Ok(Some((cert.as_path(), key.as_path()))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Failure::Usage(
            "--cert needs --key (its private key)".into(),
        )),
        (None, Some(_)) => Err(Failure::Usage("--key needs --cert".into())),
    }
}

/// The client's TLS settings: with --cacert, TLS; with --cert and --key
/// too, a client certificate.
fn client_tls(args: &Args) -> Result<Option<TlsOptions>, Failure> {
    let identity = identity_paths(args)?;
    match &args.cacert {
        Some(ca) => TlsOptions::from_files(ca, identity)
            .map(Some)
            .map_err(|e| Failure::Usage(e.to_string())),
        None if identity.is_some() => Err(Failure::Usage(
            "--cert and --key need --cacert (the CA that signs the replicas' certificates)".into(),
        )),
        None => Ok(None),
    }
}

/// The replica's TLS settings: --cert, --key and --cacert together, or none.
fn server_tls(args: &Args, serve: &Serve) -> Result<Option<ServerTls>, Failure> {
    match (identity_paths(args)?, &args.cacert) {
        (Some((cert, key)), Some(ca)) => ServerTls::from_files(cert, key, ca)
            .map(|tls| {
                Some(
                    tls.require_client_certificate(serve.client_cert_auth)
                        .certificate_users(serve.client_cert_users),
                )
            })
            .map_err(|e| Failure::Usage(e.to_string())),
        (None, None) if serve.client_cert_auth || serve.client_cert_users => Err(Failure::Usage(
            "--client-cert-auth and --client-cert-users need TLS: --cert, --key and --cacert"
                .into(),
        )),
        (None, None) => Ok(None),
        (Some(_), None) => Err(Failure::Usage(
            "serve with --cert needs --cacert (the CA that signs every replica's certificate)"
                .into(),
        )),
        (None, Some(_)) => Err(Failure::Usage(
            "serve with --cacert needs --cert and --key (this replica's certificate)".into(),
        )),
    }
}

pub(crate) fn out(bytes: &[&[u8]]) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    for b in bytes {
        stdout
            .write_all(b)
            .map_err(|e| Failure::Other(format!("cannot write output: {e}")))?;
    }
    Ok(())
}

/// How the CLI prints answers (see `Args::write_out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WriteOut {
    Simple,
    Json,
    Table,
    Hex,
}

/// `bytes` in lowercase hex.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A key and its value as JSON, in base64 (etcdctl's convention).
fn json_entry(key: &[u8], value: &[u8]) -> serde_json::Value {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    serde_json::json!({"key": b64.encode(key), "value": b64.encode(value)})
}

/// The value `put` writes: its argument, stdin for `-`, or `--file`'s
/// bytes; more than the value limit is refused before anything is sent.
fn put_value(value: Option<&str>, file: Option<&std::path::Path>) -> Result<Vec<u8>, Failure> {
    use std::io::Read;
    let (reader, source): (Box<dyn Read>, String) = match (value, file) {
        (Some("-"), None) if std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            return Err(Failure::Usage(
                "`put KEY -` reads the value from stdin, which is a terminal: pipe the value \
                 in, or give it as an argument or with --file"
                    .into(),
            ))
        }
        (Some("-"), None) => (Box::new(std::io::stdin().lock()), "stdin".to_string()),
        (Some(v), None) => return Ok(v.as_bytes().to_vec()),
        (None, Some(path)) => (
            Box::new(std::fs::File::open(path).map_err(|e| {
                Failure::Usage(format!(
                    "cannot read the value file {}: {e}",
                    path.display()
                ))
            })?),
            path.display().to_string(),
        ),
        _ => return Err(Failure::Usage("give a value, `-` (stdin) or --file".into())),
    };
    let limit = latchkey_core::limits::MAX_VALUE_LEN;
    let mut bytes = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::Usage(format!("cannot read the value from {source}: {e}")))?;
    if bytes.len() > limit {
        return Err(Failure::Usage(format!(
            "the value from {source} is over the {limit}-byte limit"
        )));
    }
    Ok(bytes)
}

impl Args {
    /// `__lock-guard`'s pipe and command, if that is what was asked (it
    /// runs without an async runtime).
    pub fn lock_guard(&self) -> Option<(i32, &[String])> {
        match &self.command {
            Cmd::LockGuard { fd, command } => Some((*fd, command)),
            _ => None,
        }
    }
}

/// Run one parsed command.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    match &args.command {
        Cmd::Serve(s) => {
            // Flags and files `serve` cannot use: a configuration error
            // (its own exit code, 9), not "cluster unavailable".
            let tls = server_tls(&args, s).map_err(|f| Failure::Config(f.to_string()))?;
            serve(s, args.cluster_secret_file.as_deref(), tls).await
        }
        Cmd::Certs {
            out: dir,
            nodes,
            hosts,
            users,
        } => {
            let written = latchkey::certs::write_cluster(dir, *nodes, hosts, users)
                .map_err(|e| Failure::Usage(e.to_string()))?;
            for path in written {
                out(&[path.display().to_string().as_bytes(), b"\n"])?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Put {
            key,
            value,
            file,
            fence,
            session_secret,
        } => {
            let value = put_value(value.as_deref(), file.as_deref())?;
            let c = client(&args)?;
            match fence {
                Some(seq) => {
                    let secret = parse_session_secret(session_secret.as_deref())?;
                    c.put_fenced(&parse_sequencer(seq)?, &secret, key, value)
                        .await?
                }
                None => c.put(key, value).await?,
            }
            out(&[b"OK\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Get { key, stale } => {
            let consistency = if *stale {
                Consistency::Stale
            } else {
                Consistency::Linearizable
            };
            match client(&args)?.get_with(key, consistency).await? {
                Some(v) => {
                    let line = match args.write_out {
                        WriteOut::Simple | WriteOut::Table => [v, b"\n".to_vec()].concat(),
                        WriteOut::Hex => format!("{}\n", hex(&v)).into_bytes(),
                        WriteOut::Json => {
                            format!("{}\n", json_entry(key.as_bytes(), &v)).into_bytes()
                        }
                    };
                    out(&[&line])?;
                    Ok(ExitCode::SUCCESS)
                }
                None => Err(Failure::NotFound(format!("key {key:?} not found"))),
            }
        }
        Cmd::Del {
            key,
            fence,
            session_secret,
        } => {
            let c = client(&args)?;
            match fence {
                Some(seq) => {
                    let secret = parse_session_secret(session_secret.as_deref())?;
                    c.delete_fenced(&parse_sequencer(seq)?, &secret, key)
                        .await?;
                    out(&[b"OK\n"])?;
                }
                None => {
                    let existed = c.delete(key).await?;
                    out(&[if existed { b"1\n" } else { b"0\n" }])?;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Scan {
            prefix,
            start,
            end,
            limit,
            reverse,
        } => {
            let mut range = ScanRange {
                start: start.as_bytes().to_vec(),
                end: end.as_ref().map(|e| e.as_bytes().to_vec()),
                prefix: prefix.as_bytes().to_vec(),
                limit: 0,
                reverse: *reverse,
            };
            let c = client(&args)?;
            let mut printed: u64 = 0;
            loop {
                if *limit != 0 {
                    // One more than is left, to tell whether the limit cut
                    // the scan.
                    let left = u64::from(*limit).saturating_sub(printed) + 1;
                    range.limit = u32::try_from(left)
                        .unwrap_or(u32::MAX)
                        .min(latchkey_core::limits::MAX_SCAN_LIMIT);
                }
                let page = c.scan(range.clone()).await?;
                for (k, v) in &page.entries {
                    if *limit != 0 && printed == u64::from(*limit) {
                        let _ = writeln!(
                            std::io::stderr(),
                            "latchkey: stopped at --limit {limit}: more keys match"
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                    let line = match args.write_out {
                        WriteOut::Simple | WriteOut::Table => [&k[..], b"\t", v, b"\n"].concat(),
                        WriteOut::Hex => format!("{}\t{}\n", hex(k), hex(v)).into_bytes(),
                        WriteOut::Json => format!("{}\n", json_entry(k, v)).into_bytes(),
                    };
                    out(&[&line])?;
                    printed += 1;
                }
                let Some((last, _)) = page.entries.last() else {
                    break;
                };
                if !page.more {
                    break;
                }
                // The next page starts right after the last key printed
                // (below it, in reverse).
                if *reverse {
                    range.end = Some(last.clone());
                } else {
                    let mut next = last.clone();
                    next.push(0);
                    range.start = next;
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Seq { key, step } => {
            let range = client(&args)?.next_sequence(key, *step).await?;
            out(&[format!("{}\n", range.start).as_bytes()])?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Status => status(&args, args.write_out == WriteOut::Json).await,
        Cmd::Lock(l) => {
            let c = client(&args).map_err(|f| Failure::AroundCommand(Box::new(f)))?;
            lock::run(c, l.into())
                .await
                .map_err(|f| Failure::AroundCommand(Box::new(f)))
        }
        Cmd::CheckSequencer { sequencer } => {
            let seq = parse_sequencer(sequencer)?;
            if client(&args)?.check_sequencer(&seq).await? {
                out(&[b"current\n"])?;
                Ok(ExitCode::SUCCESS)
            } else {
                Err(Failure::NotFound(format!(
                    "stale: {seq} no longer holds lock {:?}",
                    seq.name
                )))
            }
        }
        Cmd::LockGuard { fd, command } => Ok(lock::guard::run(*fd, command)),
        Cmd::Snapshot(cmd) => {
            snapshot::run(cmd, || client(&args), args.write_out == WriteOut::Json).await
        }
        Cmd::Locks { prefix } => locks(&args, prefix, args.write_out == WriteOut::Json).await,
        Cmd::Auth(a) => {
            let c = client(&args)?;
            match a {
                AuthCmd::Enable => c.auth_enable().await?,
                AuthCmd::Disable => c.auth_disable().await?,
                AuthCmd::Status => {
                    let (enabled, user) = c.auth_status().await?;
                    let text = format!(
                        "access control: {}\nuser: {}\n",
                        if enabled { "enabled" } else { "disabled" },
                        user.as_deref().unwrap_or("(none)")
                    );
                    out(&[text.as_bytes()])?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
            out(&[b"OK\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::User(u) => {
            let c = client(&args)?;
            match u {
                UserCmd::Add { name, no_password } => {
                    let password = if *no_password {
                        None
                    } else {
                        Some(read_password()?)
                    };
                    c.add_user(name, password.as_deref()).await?
                }
                UserCmd::Passwd { name } => {
                    c.change_password(name, Some(&read_password()?)).await?
                }
                UserCmd::Delete { name } => c.delete_user(name).await?,
                UserCmd::GrantRole { user, role } => c.grant_role(user, role).await?,
                UserCmd::RevokeRole { user, role } => c.revoke_role(user, role).await?,
                UserCmd::List => {
                    let (users, _) = c.list_users_and_roles().await?;
                    return print_lines(&users);
                }
                UserCmd::Get { name } => {
                    let Some(user) = c.get_user(name).await? else {
                        return Err(Failure::NotFound(format!("no user {name:?}")));
                    };
                    let text = format!(
                        "roles: {}\npassword: {}\n",
                        user.roles.join(","),
                        if user.has_password { "yes" } else { "no" }
                    );
                    out(&[text.as_bytes()])?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
            out(&[b"OK\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Role(r) => {
            let c = client(&args)?;
            let permission = |p: &str| {
                p.parse::<latchkey::Permission>()
                    .map_err(|e| Failure::Usage(e.to_string()))
            };
            match r {
                RoleCmd::Add { name } => c.add_role(name).await?,
                RoleCmd::Delete { name } => c.delete_role(name).await?,
                RoleCmd::Grant {
                    role,
                    permission: p,
                    prefix,
                } => c.grant_permission(role, permission(p)?, prefix).await?,
                RoleCmd::Revoke {
                    role,
                    permission: p,
                    prefix,
                } => c.revoke_permission(role, permission(p)?, prefix).await?,
                RoleCmd::List => {
                    let (_, roles) = c.list_users_and_roles().await?;
                    return print_lines(&roles);
                }
                RoleCmd::Get { name } => {
                    let Some(grants) = c.get_role(name).await? else {
                        return Err(Failure::NotFound(format!("no role {name:?}")));
                    };
                    let lines: Vec<String> = grants
                        .iter()
                        .map(|(p, prefix)| format!("{p}\t{}", String::from_utf8_lossy(prefix)))
                        .collect();
                    return print_lines(&lines);
                }
            }
            out(&[b"OK\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Members(m) => {
            let c = client(&args)?;
            match m {
                Members::Add {
                    id,
                    peer_addr,
                    learner,
                    force,
                } => {
                    let call = async {
                        if *force {
                            c.add_member_forced(*id, peer_addr, !*learner).await
                        } else {
                            c.add_member(*id, peer_addr, !*learner).await
                        }
                    };
                    with_progress(&c, *id, call).await?
                }
                Members::Remove { id, force: false } => c.remove_voter(*id).await?,
                Members::Remove { id, force: true } => c.remove_voter_forced(*id).await?,
                Members::Promote { id } => c.promote(*id).await?,
                Members::List => {
                    let status = c.status().await?;
                    let text = if args.write_out == WriteOut::Json {
                        let value = serde_json::json!({
                            "leader": status.leader_id,
                            "members": status.members,
                        });
                        serde_json::to_string_pretty(&value)
                            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?
                            + "\n"
                    } else {
                        let mut text = format!(
                            "{:>4} {:<8} {:<22} {:<22} {:>20} {}\n",
                            "ID", "ROLE", "PEER", "CLIENT", "INCARNATION", "MATCHED"
                        );
                        for m in &status.members {
                            let role = match (m.voter, Some(m.id) == status.leader_id) {
                                (true, true) => "leader",
                                (true, false) => "voter",
                                (false, _) => "learner",
                            };
                            text.push_str(&format!(
                                "{:>4} {:<8} {:<22} {:<22} {:>20} {}\n",
                                m.id,
                                role,
                                m.peer_addr,
                                m.client_addr,
                                m.incarnation,
                                m.matched_index.map_or("-".to_string(), |i| i.to_string())
                            ));
                        }
                        text
                    };
                    out(&[text.as_bytes()])?;
                    return Ok(ExitCode::SUCCESS);
                }
            }
            out(&[b"OK\n"])?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Run `call` (a `members add` of node `id`), printing on stderr every
/// 2 s how far the new member has caught up, as the leader sees it.
async fn with_progress(
    c: &Client,
    id: u64,
    call: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    let mut call = std::pin::pin!(call);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    loop {
        tokio::select! {
            done = &mut call => return done,
            _ = tick.tick() => {
                let Ok(status) = c.status().await else { continue };
                let line = match status.members.iter().find(|m| m.id == id) {
                    None => format!("node {id}: not a member yet"),
                    Some(m) => format!(
                        "node {id}: {}, replicated up to index {} of {}",
                        if m.voter { "voter" } else { "learner, catching up" },
                        m.matched_index.map_or("-".to_string(), |i| i.to_string()),
                        status.last_log_index
                    ),
                };
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }
}

async fn status(args: &Args, json: bool) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    let mut rows = BTreeMap::new();
    let mut errors = Vec::new();
    for addr in c_endpoints(args) {
        match c.status_of(&addr).await {
            Ok(s) => {
                rows.insert(addr, s);
            }
            Err(e) => errors.push((addr, e.to_string())),
        }
    }
    if json {
        let value = serde_json::json!({
            "nodes": rows,
            "unreachable": errors.iter().map(|(a, e)| serde_json::json!({"endpoint": a, "error": e})).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?;
        out(&[text.as_bytes(), b"\n"])?;
    } else {
        let mut text = format!(
            "{:<22} {:>4} {:<10} {:>6} {:>6} {:>10}\n",
            "ENDPOINT", "ID", "STATE", "LEADER", "TERM", "APPLIED"
        );
        for (addr, s) in &rows {
            text.push_str(&format!(
                "{:<22} {:>4} {:<10} {:>6} {:>6} {:>10}\n",
                addr,
                s.id,
                s.state,
                s.leader_id.map_or("-".to_string(), |l| l.to_string()),
                s.term,
                s.last_applied
            ));
        }
        for (addr, e) in &errors {
            text.push_str(&format!("{addr:<22} unreachable: {e}\n"));
        }
        // Why a replica waits or failed, and peers it refuses or that
        // refuse it: what an operator must act on.
        for (addr, s) in &rows {
            if let Some(detail) = &s.detail {
                text.push_str(&format!("{addr} ({}): {detail}\n", s.state));
            }
            for problem in &s.peer_problems {
                text.push_str(&format!("{addr}: {problem}\n"));
            }
        }
        // The membership as the leader (else the first answer) knows it.
        let view = rows
            .values()
            .find(|s| s.leader_id == Some(s.id))
            .or_else(|| rows.values().next());
        if let Some(s) = view {
            let members: Vec<String> = s
                .members
                .iter()
                .map(|m| {
                    format!(
                        "{}={}#{} (clients {}){}",
                        m.id,
                        m.peer_addr,
                        m.incarnation,
                        m.client_addr,
                        if m.voter { "" } else { " (learner)" }
                    )
                })
                .collect();
            text.push_str(&format!(
                "members (id=peer address#incarnation): {}\n",
                members.join(", ")
            ));
        }
        out(&[text.as_bytes()])?;
    }
    if rows.is_empty() {
        return Err(Failure::Unavailable("no endpoint answered".into()));
    }
    // Something to alert on: a replica down, failed, or without a leader
    // is not a healthy status.
    if !errors.is_empty() {
        return Err(Failure::Unavailable(format!(
            "{} of {} endpoints did not answer",
            errors.len(),
            errors.len() + rows.len()
        )));
    }
    let unwell: Vec<String> = rows
        .iter()
        .filter(|(_, s)| s.state == "Failed" || s.state == "Waiting" || s.leader_id.is_none())
        .map(|(addr, s)| match s.leader_id {
            None if s.state != "Failed" && s.state != "Waiting" => format!("{addr}: no leader"),
            _ => format!("{addr}: {}", s.state),
        })
        .collect();
    if !unwell.is_empty() {
        return Err(Failure::Unavailable(format!(
            "not every replica is serving with a leader ({})",
            unwell.join(", ")
        )));
    }
    Ok(ExitCode::SUCCESS)
}

/// The session secret a fenced write needs, from `--session-secret` or
/// `LATCHKEY_SESSION_SECRET`.
fn parse_session_secret(hex: Option<&str>) -> Result<SessionSecret, Failure> {
    let hex = hex.ok_or_else(|| {
        Failure::Usage(
            "a fenced write needs the secret of the sequencer's session: run it under `latchkey \
             lock`, which sets LATCHKEY_SESSION_SECRET, or pass --session-secret"
                .into(),
        )
    })?;
    SessionSecret::from_hex(hex.trim()).ok_or_else(|| {
        Failure::Usage(format!(
            "bad session secret: {} characters, it must be {} hex digits",
            hex.trim().chars().count(),
            2 * SessionSecret::LEN
        ))
    })
}

fn parse_sequencer(s: &str) -> Result<Sequencer, Failure> {
    s.trim()
        .parse()
        .map_err(|e| Failure::Usage(format!("bad sequencer {s:?}: {e}")))
}

async fn locks(args: &Args, prefix: &str, json: bool) -> Result<ExitCode, Failure> {
    let locks = client(args)?.locks(prefix).await?;
    if json {
        let rows: Vec<serde_json::Value> = locks
            .iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name,
                    "mode": l.mode.map(|m| m.to_string()),
                    "holders": l.holders.iter().map(|h| serde_json::json!({
                        "session": h.session.0,
                        "owner": h.owner,
                        "token": h.token.0,
                        "hold_count": h.hold_count,
                        "lease_ms": h.lease_ms,
                    })).collect::<Vec<_>>(),
                    "waiters": l.waiters,
                    "lock_delay_ms": l.lock_delay.as_ref().map(|d| d.delay_ms),
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&rows)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?;
        out(&[text.as_bytes(), b"\n"])?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "{:<32} {:<9} {:>8} {:<16} {:>7}\n",
        "NAME", "MODE", "TOKEN", "HOLDER", "WAITING"
    );
    for l in &locks {
        let mode = match (l.mode, &l.lock_delay) {
            (Some(LockMode::Exclusive), _) => "exclusive",
            (Some(LockMode::Shared), _) => "shared",
            (None, Some(_)) => "delay",
            (None, None) => "-",
        };
        let (token, holder) = match l.holders.first() {
            Some(h) => (h.token.to_string(), format!("{}/{}", h.session, h.owner)),
            None => ("-".to_string(), "-".to_string()),
        };
        let more = if l.holders.len() > 1 {
            format!(" +{}", l.holders.len() - 1)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{:<32} {:<9} {:>8} {:<16} {:>7}\n",
            l.name,
            mode,
            token,
            format!("{holder}{more}"),
            l.waiters
        ));
    }
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}

fn c_endpoints(args: &Args) -> Vec<String> {
    args.endpoints
        .iter()
        .map(|e| e.trim().to_string())
        .filter(|e| !e.is_empty())
        .collect()
}

async fn serve(
    s: &Serve,
    secret_file: Option<&std::path::Path>,
    tls: Option<ServerTls>,
) -> Result<ExitCode, Failure> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match s.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .try_init(),
        LogFormat::Json => logs.json().try_init(),
    };
    let settings = RaftSettings::default()
        .with_heartbeat(s.heartbeat)
        .with_election_min(s.election_timeout)
        .with_election_max(s.election_timeout * 2)
        .with_snapshot_every(s.snapshot_every)
        .with_keep_after_snapshot(s.keep_after_snapshot);
    let state = match s.initial_cluster_state {
        InitialClusterState::New => ClusterState::New,
        InitialClusterState::Existing => ClusterState::Existing,
    };
    let mut builder = Node::builder(s.id)
        .listen(s.listen)
        .data_dir(&s.data_dir)
        .initial_members(s.initial_members.iter().cloned())
        .initial_cluster_state(state)
        .max_connections(s.max_connections)
        .max_connections_per_address(s.max_connections_per_address)
        .raft_settings(settings);
    if let Some(a) = &s.advertise {
        builder = builder.advertise(a.clone());
    }
    if let Some(a) = s.peer_listen {
        builder = builder.peer_listen(a);
    }
    if let Some(a) = s.metrics_listen {
        builder = builder.metrics_listen(a);
    }
    if let Some(path) = secret_file {
        let secret = ClusterSecret::from_file(path).map_err(|e| Failure::Config(e.to_string()))?;
        builder = builder.cluster_secret(secret);
    }
    if let Some(tls) = tls {
        builder = builder.tls(tls);
    }
    let node = builder.start().await.map_err(|e| match e {
        latchkey::NodeError::Config(why) => {
            Failure::Config(format!("cannot start node {}: {why}", s.id))
        }
        e => Failure::ReplicaFailed(format!("cannot start node {}: {e}", s.id)),
    })?;
    tracing::info!(
        id = s.id,
        listen = %node.local_addr(),
        peer_listen = %node.peer_addr(),
        metrics_listen = ?node.metrics_addr(),
        incarnation = node.incarnation(),
        "serving"
    );
    // A failed replica exits (non-zero) so that its supervisor restarts it;
    // it never stays up holding its port while serving nothing.
    let failed = tokio::select! {
        _ = wait_for_signal() => None,
        cause = node.failed() => Some(cause),
    };
    tracing::info!("shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(5), node.shutdown()).await;
    match failed {
        None => Ok(ExitCode::SUCCESS),
        Some(cause) => Err(Failure::ReplicaFailed(format!(
            "node {} failed: {cause}",
            s.id
        ))),
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_garbage() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("10").is_err());
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("5days").is_err());
    }

    #[test]
    fn members_parse_and_refuse_garbage() {
        assert_eq!(
            parse_member("1=127.0.0.1:7101"),
            Ok((1, "127.0.0.1:7101".into()))
        );
        assert!(parse_member("127.0.0.1:7101").is_err());
        assert!(parse_member("0=127.0.0.1:7101").is_err());
        assert!(parse_member("a=127.0.0.1:7101").is_err());
        assert!(parse_member("1=localhost").is_err());
    }

    #[test]
    fn the_members_arg_tools_build_parses_back() {
        let addrs = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"];
        let parsed: Result<Vec<_>, _> = latchkey::initial_members_arg(&addrs)
            .split(',')
            .map(parse_member)
            .collect();
        assert_eq!(
            parsed,
            Ok(vec![
                (1, addrs[0].to_string()),
                (2, addrs[1].to_string()),
                (3, addrs[2].to_string())
            ])
        );
    }
}

#[cfg(test)]
mod tls_args_tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    /// The global TLS options do not collide with the KEY of `put` and
    /// `get` (they once did, and clap panicked at parse time).
    #[test]
    fn tls_options_and_a_key_argument_parse_together() -> Result<(), clap::Error> {
        let args = Args::try_parse_from([
            "latchkey", "--cacert", "ca.pem", "--cert", "c.pem", "--key", "k.pem", "put", "mykey",
            "v",
        ])?;
        assert_eq!(args.key.as_deref(), Some(std::path::Path::new("k.pem")));
        assert!(matches!(&args.command, Cmd::Put { key, .. } if key == "mykey"));
        let args = Args::try_parse_from(["latchkey", "get", "mykey", "--key", "k.pem"])?;
        assert!(matches!(&args.command, Cmd::Get { key, .. } if key == "mykey"));
        assert_eq!(args.key.as_deref(), Some(std::path::Path::new("k.pem")));
        Ok(())
    }

    /// The global --user does not collide with the USER of `user
    /// grant-role` (it did: the positional filled the global option).
    #[test]
    fn the_global_user_and_a_user_argument_parse_together() -> Result<(), clap::Error> {
        let args = Args::try_parse_from([
            "latchkey",
            "--user",
            "root:pw",
            "user",
            "grant-role",
            "app",
            "jobs",
        ])?;
        assert_eq!(args.user.as_deref(), Some("root:pw"));
        assert!(matches!(
            &args.command,
            Cmd::User(UserCmd::GrantRole { user, role }) if user == "app" && role == "jobs"
        ));
        let args = Args::try_parse_from(["latchkey", "user", "grant-role", "app", "jobs"])?;
        assert_eq!(args.user, None);
        Ok(())
    }
}
