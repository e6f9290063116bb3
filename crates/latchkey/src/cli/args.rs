//! The `latchkey` command line's grammar: the global options, every
//! subcommand and its flags as clap parses them (their doc comments are the
//! `--help` text), and the parsers of flag values.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use latchkey::core::backup::DEFAULT_BUMP;

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
    pub write_out: WriteOut,
    /// Cluster endpoints, host:port separated by commas.
    #[arg(long, env = "LATCHKEY_ENDPOINTS", global = true, value_delimiter = ',')]
    pub endpoints: Vec<String>,
    /// Give up on a request after this long (e.g. 500ms, 10s, 1m).
    #[arg(long, global = true, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// A file holding the secret every replica of the cluster shares (16 to
    /// 256 visible ASCII characters, e.g. `head -c 32 /dev/urandom |
    /// base64`). `serve`: Raft calls without it are refused (without it,
    /// anyone who can reach the port can send Raft calls; a warning says
    /// so). `members`: membership changes send it.
    #[arg(long, env = "LATCHKEY_CLUSTER_SECRET_FILE", global = true)]
    pub cluster_secret_file: Option<PathBuf>,
    /// TLS: the CA certificate (PEM) that signs the replicas' certificates.
    /// Clients then talk TLS and verify the replicas against it; `serve`
    /// verifies peers (and clients that present a certificate) against it.
    #[arg(long, env = "LATCHKEY_CACERT", global = true, value_name = "FILE")]
    pub cacert: Option<PathBuf>,
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
    pub cert: Option<PathBuf>,
    /// TLS: the private key (PEM) of --cert.
    // Its own id: `put` and `get` have a KEY argument.
    #[arg(
        long = "key",
        id = "tls_key",
        env = "LATCHKEY_KEY",
        global = true,
        value_name = "FILE"
    )]
    pub key: Option<PathBuf>,
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
    pub user: Option<String>,
    /// The password of --user.
    #[arg(
        long = "password",
        id = "auth_password",
        env = "LATCHKEY_PASSWORD",
        global = true,
        hide_env_values = true
    )]
    pub password: Option<String>,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
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
        /// Bind the key to a session this process opens and keeps alive:
        /// the key lives as long as the process. Prints the revision, then
        /// waits: Ctrl-C or SIGTERM close the session (the key goes at
        /// once); if the process is killed, the session expires after
        /// --ttl and the key goes then.
        #[arg(long, conflicts_with = "fence")]
        ephemeral: bool,
        /// With --ephemeral: the session's TTL.
        #[arg(long, value_parser = parse_duration, requires = "ephemeral")]
        ttl: Option<Duration>,
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
    /// Print every change of KEY (or of the keys under --prefix), one a
    /// line, as they happen, until Ctrl-C: `PUT<TAB>key<TAB>value` or
    /// `DELETE<TAB>key`; `-w json` adds each change's revisions. Resumes by
    /// itself at another replica when one goes away. Exit 2 if the start
    /// revision is compacted or in the future.
    Watch {
        /// The key to watch (or use --prefix).
        #[arg(required_unless_present = "prefix", conflicts_with = "prefix")]
        key: Option<String>,
        /// Watch every key starting with this prefix.
        #[arg(long)]
        prefix: Option<String>,
        /// Start at this revision (its changes are printed first) instead of
        /// the next one.
        #[arg(long = "rev", value_name = "N")]
        rev: Option<u64>,
        /// Print each change's previous value too.
        #[arg(long)]
        prev: bool,
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
    /// Hold lock NAME (or every lock named, taken at once) while CMD runs;
    /// CMD gets LATCHKEY_LOCK, LATCHKEY_TOKEN, LATCHKEY_SEQUENCER (the
    /// first lock's), LATCHKEY_LOCKS, LATCHKEY_TOKENS, LATCHKEY_SEQUENCERS
    /// (every lock's, space-separated; names may contain spaces,
    /// sequencers never do) and LATCHKEY_SESSION_SECRET. Exits with CMD's
    /// code; latchkey's own failures are 200 + its usual code (205 not
    /// acquired in time, 206 lost while CMD ran: CMD is killed); 127/126 if
    /// CMD cannot be found/run (the lock is released at once).
    Lock(LockArgs),
    /// Fenced leader election. `elect NAME VALUE`: campaign (FIFO, no
    /// polling), print the term once leading, hold until Ctrl-C or SIGTERM
    /// (then resign; exit 6 if leadership is lost). `elect NAME VALUE --
    /// CMD`: run CMD only while leading, exactly as `lock -- CMD` does
    /// (LATCHKEY_TOKEN is the term; LATCHKEY_LOCK the election's lock,
    /// latchkey.election/NAME). `elect NAME --observe`: print the leader
    /// now and at every change, one a line (TERM SESSION VALUE, or `none`).
    /// `elect NAME`: print the leader now (exit 1 if nobody leads).
    Elect(ElectArgs),
    /// Hold one permit of semaphore NAME (at most --permits holders at
    /// once, FIFO) while CMD runs, exactly as `lock -- CMD` holds a lock:
    /// LATCHKEY_TOKEN is the permit's own token, LATCHKEY_SEQUENCER fences
    /// writes while the permit is held; same exit codes.
    Sem(SemArgs),
    /// Internal: the watcher `lock -- CMD` runs the command under
    /// (`cli::lock::guard`).
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
    Snapshot(SnapshotCmd),
    /// List locks in use: holders with their tokens, and queue lengths.
    /// `locks release NAME --force`: an operator's forced release.
    Locks {
        /// Only locks whose names start with this.
        #[arg(long, default_value = "")]
        prefix: String,
        #[command(subcommand)]
        cmd: Option<LocksCmd>,
    },
    /// List live sessions: id, the name each was opened under, TTL, time
    /// left on the leader's countdown, what each holds and waits for, and
    /// the keys bound to it. `sessions end ID`: an operator ends one. Needs
    /// the admin permission under access control.
    Sessions {
        #[command(subcommand)]
        cmd: Option<SessionsCmd>,
    },
}

#[derive(Debug, Subcommand)]
pub enum LocksCmd {
    /// Release lock NAME from whoever holds it, without their secret (a
    /// hung holder): every grant it has now (each by its token), or the
    /// one of --token. Each ends with a lock-delay of at least its
    /// session's TTL (even if other holders remain), then the next
    /// waiter gets it under a higher token, so the old holder's fenced
    /// writes are refused; the holder's client hears at its next
    /// keep-alive (`lock -- CMD` then stops CMD). Its session lives on.
    /// Needs the admin permission under access control; without access
    /// control, only a caller with the cluster secret may. Prints what it
    /// released; exit 1 if nothing held the lock.
    Release {
        /// The lock (an election's is `latchkey.election/NAME`).
        name: String,
        /// Required: releasing someone else's lock is an operator's act.
        #[arg(long, required = true)]
        force: bool,
        /// Only the grant with this token (default: every grant).
        #[arg(long)]
        token: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionsCmd {
    /// End session ID now, as if its TTL ran out: its locks are released
    /// (their lock-delay applies), its waits cancelled and its keys
    /// deleted. For a hung holder; `locks` shows holders' sessions as
    /// SESSION/OWNER. Needs the admin permission under access control.
    /// Without access control, only a caller with the cluster secret may.
    /// Exit 1 if the session is not live.
    End {
        /// The session's id.
        id: u64,
    },
}

/// What `lock`, `sem` and `elect` share: how long the hold outlives this
/// process, how long to wait for it, and the at-risk signal of `-- CMD`.
#[derive(Debug, clap::Args)]
pub struct HoldArgs {
    /// Session TTL: how long the lock, permit or leadership outlives this
    /// process if it dies.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// Wait at most this long (default: as long as it takes).
    #[arg(long, value_parser = parse_duration, conflicts_with = "no_wait")]
    pub wait: Option<Duration>,
    /// Do not wait: give up at once (exit 205 with CMD, else 5) if the
    /// lock is busy, no permit is free or another leads.
    #[arg(long)]
    pub no_wait: bool,
    /// The signal sent to the command once when the session is at risk
    /// (keep-alives unacknowledged for a third of the TTL), before the hard
    /// kill at loss: TERM, INT, HUP, QUIT, USR1 or USR2 (or SIGTERM, ...),
    /// or `none`. A failover slower than a third of the TTL also puts the
    /// session at risk, though the lock usually survives it: a command
    /// that should finish its work then can trap the signal, or choose
    /// `none`.
    #[arg(long, default_value = "TERM", value_parser = parse_at_risk_signal)]
    pub at_risk_signal: AtRiskSignal,
}

impl HoldArgs {
    /// `None`: try once; `Some(None)`: wait as long as it takes;
    /// `Some(Some(d))`: wait at most `d`.
    pub fn wait_plan(&self) -> Option<Option<Duration>> {
        if self.no_wait {
            None
        } else {
            Some(self.wait)
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct SemArgs {
    /// The semaphore's name.
    pub name: String,
    /// How many holders at once (1 to 1,024); every user of the name must
    /// give the same count while it is in use.
    #[arg(long)]
    pub permits: u32,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct ElectArgs {
    /// The election's name.
    pub name: String,
    /// What observers are told while this candidate leads (an address, an
    /// id; at most 1,024 bytes). Without it: print who leads.
    #[arg(conflicts_with = "observe")]
    pub value: Option<String>,
    /// Print the leader now and at every change until Ctrl-C.
    #[arg(long)]
    pub observe: bool,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Keep the election without a leader this long after a leader's
    /// session expired (so a deposed leader has time to notice).
    #[arg(long, value_parser = parse_duration)]
    pub lock_delay: Option<Duration>,
    /// The command to run while leading, after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, clap::Args)]
pub struct LockArgs {
    /// The lock's name; several names take every lock at once, or none
    /// (a multi-lock: while it waits it holds none of them).
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,
    #[command(flatten)]
    pub hold: HoldArgs,
    /// Take the lock shared (with other shared holders).
    #[arg(long)]
    pub shared: bool,
    /// Maximum hold time: the cluster releases the lock after this.
    #[arg(long, value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Keep the lock unavailable this long after a forced release.
    #[arg(long, value_parser = parse_duration)]
    pub lock_delay: Option<Duration>,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Subcommand)]
pub enum AuthCmd {
    /// Turn access control on (a user named root must exist; it keeps
    /// every permission). From then on every call must name a user.
    Enable,
    /// Turn access control off (needs the admin permission).
    Disable,
    /// Print whether access control is on, and which user this CLI is.
    Status,
}

#[derive(Debug, Subcommand)]
pub enum UserCmd {
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
pub enum RoleCmd {
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
pub enum Members {
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
    /// Move leadership to voter ID (default: a voter that answers the
    /// leader and holds its last entry) and print the id of the voter that
    /// leads afterwards. Refused, with nothing changed, for a voter that is
    /// down. Writes pause for the few milliseconds the hand-over takes;
    /// clients follow the new leader. Use it before removing the leader (`members remove` of the
    /// leader costs an election timeout); a replica stopped with SIGTERM
    /// or Ctrl-C hands over by itself. Needs what `members add` needs.
    TransferLeader { id: Option<u64> },
    /// List the members as the leader knows them (else the first replica
    /// that answers): id, leader/voter/learner, peer and client address,
    /// incarnation.
    List,
}

#[derive(Debug, clap::Args)]
pub struct Serve {
    /// This replica's id (1 or more, unique in the cluster).
    #[arg(long)]
    pub id: u64,
    /// Address to listen on for clients.
    #[arg(long)]
    pub listen: std::net::SocketAddr,
    /// Address to listen on for peers (Raft and membership changes; other
    /// members and operators with the cluster's credentials only). Default:
    /// this node's entry in --initial-members.
    #[arg(long)]
    pub peer_listen: Option<std::net::SocketAddr>,
    /// Directory for this replica's RocksDB data.
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The cluster's first voters: ID=HOST:PORT of each one's peer listener,
    /// separated by commas. The same list on every initial member; omit on
    /// a node to be added later.
    #[arg(long, value_delimiter = ',', value_parser = parse_member)]
    pub initial_members: Vec<(u64, String)>,
    /// Address clients use to reach this node (default: --listen; needed
    /// when that is a wildcard such as 0.0.0.0). The membership records it
    /// and clients are sent there to find the leader.
    #[arg(long)]
    pub advertise: Option<String>,
    /// Build a snapshot (and purge the log) after at least this many entries, once the
    /// log written since the last snapshot is as large as that snapshot.
    #[arg(long, default_value_t = 10_000)]
    pub snapshot_every: u64,
    /// Entries kept in the log behind a snapshot.
    #[arg(long, default_value_t = 1_000)]
    pub keep_after_snapshot: u64,
    /// Leader heartbeat period.
    #[arg(long, default_value = "40ms", value_parser = parse_duration)]
    pub heartbeat: Duration,
    /// Shortest election timeout; the longest is twice this (a dead leader
    /// is replaced after about three to four times this).
    #[arg(long, default_value = "200ms", value_parser = parse_duration)]
    pub election_timeout: Duration,
    /// With an empty data directory: `new` forms a new cluster with the
    /// other initial members once all of them answer and none belongs to a
    /// cluster yet (a node whose disk was wiped finds its cluster this way
    /// and waits to be re-added); `existing` never forms one and waits to
    /// be added with `latchkey members add`.
    #[arg(long, value_enum, default_value = "new")]
    pub initial_cluster_state: InitialClusterState,
    /// Most connections held open at once on each listener (clients,
    /// peers); more are closed on accept and logged.
    #[arg(long, default_value_t = latchkey::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Most connections held open at once from one IP address; more from
    /// it are closed on accept and logged.
    #[arg(long, default_value_t = latchkey::DEFAULT_MAX_CONNECTIONS_PER_ADDRESS)]
    pub max_connections_per_address: usize,
    /// With TLS (--cert): refuse clients that present no certificate
    /// signed by --cacert (peers always need one).
    #[arg(long)]
    pub client_cert_auth: bool,
    /// With TLS (--cert): a call that names no --user and carries no
    /// cluster secret is made as the user its client certificate's common
    /// name names (if that user exists). Every certificate --cacert signs
    /// then logs its CN's user in: use a CA for this cluster only; revoke
    /// by deleting the user.
    #[arg(long)]
    pub client_cert_users: bool,
    /// Serve /metrics (Prometheus), /healthz and /readyz over HTTP on this
    /// address (no authentication: keep it where only monitoring reaches).
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Log lines as text (default) or JSON objects, one per line. Which
    /// lines: RUST_LOG (default `info,openraft=warn`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum InitialClusterState {
    New,
    Existing,
}

/// The `snapshot` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Save a backup of the whole cluster (keys, sessions, locks, sequences,
    /// counters, access control) to FILE, as the leader sees it after every
    /// write acknowledged before the call. Needs the cluster secret
    /// (--cluster-secret-file) or, while access control is on, an admin
    /// user. FILE (mode 0600: it holds session secrets and password hashes)
    /// is written beside itself and renamed into place once synced, so it is
    /// never half written.
    Save { file: PathBuf },
    /// Check FILE whole (checksum, frames, row count) and print what it
    /// holds (exit 2 if it is damaged).
    Status { file: PathBuf },
    /// Seed the new data directory of one member of a new cluster from FILE.
    /// Run it for every initial member, with the same FILE, --bump and
    /// --initial-members, then start each with `latchkey serve` and those
    /// --initial-members: the members form a cluster only if all were
    /// restored alike. The last fencing token, the last session id and every
    /// sequence move on by --bump, so nothing the old cluster issued after
    /// the backup is issued again (if it issued fewer than --bump).
    Restore {
        file: PathBuf,
        /// The new member's data directory (must not exist, or be empty).
        #[arg(long)]
        data_dir: PathBuf,
        /// The new member's id: one of --initial-members.
        #[arg(long)]
        id: u64,
        /// The new cluster's members, ID=HOST:PORT of each one's peer
        /// listener, as `serve --initial-members` takes them.
        #[arg(long, value_delimiter = ',', value_parser = parse_member, required = true)]
        initial_members: Vec<(u64, String)>,
        /// Add this to every counter (at least 1000000).
        #[arg(long, default_value_t = DEFAULT_BUMP)]
        bump: u64,
    },
}

/// How the CLI prints answers (see `Args::write_out`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteOut {
    Simple,
    Json,
    Table,
    Hex,
}

/// What `lock -- CMD` sends the command when its session is at risk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtRiskSignal(pub Option<libc::c_int>);

/// The signals a command may be sent at risk: those its guard process
/// outlives (`lock::guard`). Parsed by hand: six names do not call for a
/// signal crate.
const AT_RISK_SIGNALS: [(&str, libc::c_int); 6] = [
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("HUP", libc::SIGHUP),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
];

fn parse_at_risk_signal(s: &str) -> Result<AtRiskSignal, String> {
    let name = s.trim().to_ascii_uppercase();
    if name == "NONE" {
        return Ok(AtRiskSignal(None));
    }
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    AT_RISK_SIGNALS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, sig)| AtRiskSignal(Some(*sig)))
        .ok_or_else(|| format!("{s:?} is not one of TERM, INT, HUP, QUIT, USR1, USR2 or none"))
}

/// A duration with its unit (`500ms`, `10s`, `2m`, `1h`), above zero.
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

/// A member as `ID=HOST:PORT` (`--initial-members`): its id and address.
fn parse_member(s: &str) -> Result<(u64, String), String> {
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
    fn at_risk_signals_are_the_ones_the_guard_outlives() {
        let parse = |s| parse_at_risk_signal(s).map(|a| a.0);
        assert_eq!(parse("TERM"), Ok(Some(libc::SIGTERM)));
        assert_eq!(parse("sigusr1"), Ok(Some(libc::SIGUSR1)));
        assert_eq!(parse(" none "), Ok(None));
        for refused in ["KILL", "STOP", "9", "", "SIG"] {
            assert!(parse(refused).is_err(), "{refused:?} was accepted");
        }
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
