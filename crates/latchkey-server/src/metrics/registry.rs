//! One replica's metric registry: plain data that any room may count into
//! (requests, lock hand-offs, expiries, storage events) and that a scrape
//! brings up to date from a [`Figures`] reading (see `super::scrape`).
//!
//! It knows nothing of the replica, the listener or the status page: rooms
//! above it hand it numbers.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use latchkey_core::lock::LockCensus;
use latchkey_core::CommandResult;
use latchkey_proto::{v1, wire, ReplicaFailure};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    rpc: &'static str,
    outcome: std::borrow::Cow<'static, str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabel {
    rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConditionLabel {
    condition: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberLabel {
    member: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabel {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndLabel {
    end: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

type OpFamily = Family<OpLabel, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 50 µs to ~105 s, doubling.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
}

fn long_seconds_histogram() -> Histogram {
    // 1 ms to ~37 h, doubling: holds and waits may last a day, session
    // TTLs ten minutes.
    Histogram::new(exponential_buckets(0.001, 2.0, 28))
}

fn bytes_histogram() -> Histogram {
    // 1 KiB to 16 GiB, by fours.
    Histogram::new(exponential_buckets(1024.0, 4.0, 13))
}

/// The storage layer's figures, fed by `latchkey_storage` as it works
/// (see [`latchkey_storage::StorageObserver`]).
#[derive(Clone)]
struct StorageFigures {
    wal_sync: Histogram,
    batch: Histogram,
    snapshot_seconds: OpFamily,
    snapshot_bytes: OpFamily,
}

impl latchkey_storage::StorageObserver for StorageFigures {
    fn wal_synced(&self, took: Duration, appends: usize) {
        self.wal_sync.observe(took.as_secs_f64());
        self.batch.observe(appends as f64);
    }

    fn snapshot_built(&self, took: Duration, bytes: u64) {
        self.snapshot("build", took, bytes);
    }

    fn snapshot_installed(&self, took: Duration, bytes: u64) {
        self.snapshot("install", took, bytes);
    }
}

impl StorageFigures {
    fn snapshot(&self, op: &'static str, took: Duration, bytes: u64) {
        self.snapshot_seconds
            .get_or_create(&OpLabel { op })
            .observe(took.as_secs_f64());
        self.snapshot_bytes
            .get_or_create(&OpLabel { op })
            .observe(bytes as f64);
    }
}

/// The gauges of the replica's lock census (`LockQuery::Census`).
#[derive(Default)]
struct CensusGauges {
    sessions: Gauge,
    locks: Gauge,
    held: Gauge,
    grants: Gauge,
    waiters: Gauge,
    delayed: Gauge,
}

type LatencyFamily = Family<RpcLabel, Histogram, fn() -> Histogram>;

/// One replica's metrics (see the module docs for the table).
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: LatencyFamily,
    expiries: Family<KindLabel, Counter>,
    term: Gauge,
    leader_id: Gauge,
    is_leader: Gauge,
    state: Family<StateLabel, Gauge>,
    last_log: Gauge,
    applied: Gauge,
    snapshot: Gauge,
    voters: Gauge,
    members: Gauge,
    matched: Family<MemberLabel, Gauge>,
    census: CensusGauges,
    waiting: Gauge,
    acquire_wait: Family<OutcomeLabel, Histogram, fn() -> Histogram>,
    hold: Family<EndLabel, Histogram, fn() -> Histogram>,
    keepalive_margin: Histogram,
    leader_changes: Counter,
    checkpoints: Counter,
    condition: Family<ConditionLabel, Gauge>,
    tls_failures: Counter,
    refused: Counter,
    storage: StorageFigures,
    sst_bytes: Gauge,
    background_jobs: Gauge,
    rooms_bytes: Gauge,
    watches_open: Gauge,
    /// What the process-wide counters were at the last scrape (so each
    /// scrape adds only what is new).
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    tls_failures: u64,
    refused: u64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// A registry whose process-wide counters count from `process` on (what
    /// they were when this replica started).
    pub(crate) fn new(process: ProcessCounts) -> Metrics {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency: LatencyFamily = Family::new_with_constructor(seconds_histogram);
        let expiries = Family::<KindLabel, Counter>::default();
        let state = Family::<StateLabel, Gauge>::default();
        let matched = Family::<MemberLabel, Gauge>::default();
        let condition = Family::<ConditionLabel, Gauge>::default();
        let mut m = Metrics {
            requests,
            latency,
            expiries,
            term: Gauge::default(),
            leader_id: Gauge::default(),
            is_leader: Gauge::default(),
            state,
            last_log: Gauge::default(),
            applied: Gauge::default(),
            snapshot: Gauge::default(),
            voters: Gauge::default(),
            members: Gauge::default(),
            matched,
            census: CensusGauges::default(),
            waiting: Gauge::default(),
            acquire_wait: Family::new_with_constructor(long_seconds_histogram),
            hold: Family::new_with_constructor(long_seconds_histogram),
            keepalive_margin: long_seconds_histogram(),
            leader_changes: Counter::default(),
            checkpoints: Counter::default(),
            condition,
            tls_failures: Counter::default(),
            refused: Counter::default(),
            storage: StorageFigures {
                wal_sync: seconds_histogram(),
                // 1 to 4096 appends, doubling.
                batch: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
                snapshot_seconds: Family::new_with_constructor(seconds_histogram),
                snapshot_bytes: Family::new_with_constructor(bytes_histogram),
            },
            sst_bytes: Gauge::default(),
            background_jobs: Gauge::default(),
            rooms_bytes: Gauge::default(),
            watches_open: Gauge::default(),
            // Counted from this replica's start on, not the process's.
            seen: Mutex::new(Seen {
                tls_failures: process.tls_failures,
                refused: process.connections_refused,
            }),
            registry: Registry::default(),
        };
        let r = &mut m.registry;
        r.register(
            "latchkey_raft_term",
            "The replica's current Raft term",
            m.term.clone(),
        );
        r.register(
            "latchkey_raft_leader_id",
            "The leader this replica knows (0: none)",
            m.leader_id.clone(),
        );
        r.register(
            "latchkey_raft_is_leader",
            "1 on the leader",
            m.is_leader.clone(),
        );
        r.register(
            "latchkey_raft_state",
            "1 for the replica's Raft state",
            m.state.clone(),
        );
        r.register(
            "latchkey_raft_last_log_index",
            "Last index in the replica's log",
            m.last_log.clone(),
        );
        r.register(
            "latchkey_raft_applied_index",
            "Last index applied to the replica's state machine",
            m.applied.clone(),
        );
        r.register(
            "latchkey_raft_snapshot_index",
            "Last index the replica's snapshot covers",
            m.snapshot.clone(),
        );
        r.register("latchkey_raft_voters", "Voting members", m.voters.clone());
        r.register(
            "latchkey_raft_members",
            "Members, voters and learners",
            m.members.clone(),
        );
        r.register(
            "latchkey_raft_matched_index",
            "On the leader: the last index known replicated to each member",
            m.matched.clone(),
        );
        let c = &m.census;
        for (name, help, gauge) in [
            ("latchkey_lock_sessions", "Live sessions", &c.sessions),
            ("latchkey_lock_locks", "Locks in use", &c.locks),
            ("latchkey_lock_held", "Locks with a holder", &c.held),
            ("latchkey_lock_grants", "Grants held", &c.grants),
            (
                "latchkey_lock_waiters",
                "Acquires waiting in a queue",
                &c.waiters,
            ),
            ("latchkey_lock_delayed", "Locks in lock-delay", &c.delayed),
        ] {
            r.register(name, help, gauge.clone());
        }
        r.register(
            "latchkey_lock_acquire_wait_seconds",
            "On the leader: how long each acquire waited, by how the wait ended",
            m.acquire_wait.clone(),
        );
        r.register(
            "latchkey_lock_hold_seconds",
            "On the leader: how long each grant was held, by how it ended",
            m.hold.clone(),
        );
        r.register(
            "latchkey_lock_keepalive_margin_seconds",
            "On the leader: the session TTL left when a keep-alive arrived",
            m.keepalive_margin.clone(),
        );
        r.register(
            "latchkey_lock_waiting_calls",
            "Acquire calls waiting for their grant on this replica",
            m.waiting.clone(),
        );
        r.register(
            "latchkey_storage_wal_sync_seconds",
            "Each write-ahead-log sync for appended entries",
            m.storage.wal_sync.clone(),
        );
        r.register(
            "latchkey_storage_group_commit_batch",
            "Appends each write-ahead-log sync made durable",
            m.storage.batch.clone(),
        );
        r.register(
            "latchkey_raft_snapshot_seconds",
            "Snapshots built or installed, by time taken",
            m.storage.snapshot_seconds.clone(),
        );
        r.register(
            "latchkey_raft_snapshot_bytes",
            "Snapshots built or installed, by size",
            m.storage.snapshot_bytes.clone(),
        );
        r.register(
            "latchkey_storage_sst_bytes",
            "Bytes of RocksDB's live SST files",
            m.sst_bytes.clone(),
        );
        r.register(
            "latchkey_storage_lock_rooms_bytes",
            "Bytes of keys and values the state machine keeps in memory for the lock rooms",
            m.rooms_bytes.clone(),
        );
        r.register(
            "latchkey_watches_open",
            "Watches open on this replica",
            m.watches_open.clone(),
        );
        r.register(
            "latchkey_storage_background_jobs",
            "RocksDB flushes and compactions running or pending",
            m.background_jobs.clone(),
        );
        r.register(
            "latchkey_raft_leader_changes",
            "Times the leader this replica knows changed",
            m.leader_changes.clone(),
        );
        r.register(
            "latchkey_replica_condition",
            "1 for the replica's condition: serving, waiting or failed",
            m.condition.clone(),
        );
        r.register(
            "latchkey_requests",
            "gRPC calls answered, by RPC and outcome",
            m.requests.clone(),
        );
        r.register(
            "latchkey_request_duration_seconds",
            "Time to answer a gRPC call",
            m.latency.clone(),
        );
        r.register(
            "latchkey_lock_expiries",
            "Sessions, waits, lock leases and lock delays the leader expired",
            m.expiries.clone(),
        );
        r.register(
            "latchkey_lock_checkpoints",
            "Entries in which the leader recorded how long sessions and leases have left",
            m.checkpoints.clone(),
        );
        r.register(
            "latchkey_tls_handshake_failures",
            "TLS handshakes refused or timed out (whole process)",
            m.tls_failures.clone(),
        );
        r.register(
            "latchkey_connections_refused",
            "Connections closed on accept by the connection caps (whole process)",
            m.refused.clone(),
        );
        m
    }

    /// Count one answered call of `rpc` (snake case) that took `elapsed`
    /// and ended with `outcome` (`ok` or an error kind).
    pub(crate) fn request(
        &self,
        rpc: &'static str,
        outcome: std::borrow::Cow<'static, str>,
        elapsed: Duration,
    ) {
        self.requests
            .get_or_create(&RequestLabels { rpc, outcome })
            .inc();
        self.latency
            .get_or_create(&RpcLabel { rpc })
            .observe(elapsed.as_secs_f64());
    }

    /// What `latchkey_storage` reports to (see [`StorageFigures`]).
    pub(crate) fn storage_observer(&self) -> Arc<dyn latchkey_storage::StorageObserver> {
        Arc::new(self.storage.clone())
    }

    /// An acquire's wait the leader saw end (`outcome`: see the module
    /// docs) after `waited`.
    pub(crate) fn wait_ended(&self, outcome: &'static str, waited: Duration) {
        self.acquire_wait
            .get_or_create(&OutcomeLabel { outcome })
            .observe(waited.as_secs_f64());
    }

    /// A hold the leader saw end (`end`: see the module docs) after `held`.
    pub(crate) fn hold_ended(&self, end: &'static str, held: Duration) {
        self.hold
            .get_or_create(&EndLabel { end })
            .observe(held.as_secs_f64());
    }

    /// A keep-alive reached the leader with `margin` of its session's TTL
    /// left.
    pub(crate) fn keep_alive_margin(&self, margin: Duration) {
        self.keepalive_margin.observe(margin.as_secs_f64());
    }

    /// Count one expiry command the leader proposed.
    pub(crate) fn expiry(&self, kind: &str) {
        self.expiries
            .get_or_create(&KindLabel {
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Count one countdown checkpoint the leader committed.
    pub(crate) fn checkpoint(&self) {
        self.checkpoints.inc();
    }

    /// Count one change of the leader this replica knows.
    pub(crate) fn leader_changed(&self) {
        self.leader_changes.inc();
    }

    /// Every metric in the OpenMetrics text format, after setting the
    /// scraped gauges from `figures` (under one lock, so concurrent scrapes
    /// never see a half-updated set).
    pub(crate) fn render(&self, figures: &Figures) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        self.refresh(figures, &mut seen);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        drop(seen);
        text
    }

    fn refresh(&self, f: &Figures, seen: &mut Seen) {
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&self.term, f.term);
        gauge(&self.leader_id, f.leader_id);
        self.is_leader.set(i64::from(f.is_leader));
        for state in ["leader", "follower", "candidate", "learner", "shutdown"] {
            self.state
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(i64::from(state == f.state));
        }
        gauge(&self.last_log, f.last_log);
        gauge(&self.applied, f.applied);
        gauge(&self.snapshot, f.snapshot);
        gauge(&self.voters, f.voters);
        gauge(&self.members, f.members);
        // Left as they were if the state cannot be read (shut down).
        match &f.census {
            Ok(c) => {
                let g = &self.census;
                gauge(&g.sessions, c.sessions);
                gauge(&g.locks, c.locks);
                gauge(&g.held, c.held);
                gauge(&g.grants, c.holds);
                gauge(&g.waiters, c.waiters);
                gauge(&g.delayed, c.delayed);
            }
            Err(e) => tracing::warn!(error = %e, "the lock gauges could not be counted"),
        }
        gauge(&self.waiting, f.waiting);
        self.matched.clear();
        for (member, matched) in &f.matched {
            gauge(
                &self.matched.get_or_create(&MemberLabel {
                    member: member.to_string(),
                }),
                *matched,
            );
        }
        for c in ["serving", "waiting", "failed"] {
            self.condition
                .get_or_create(&ConditionLabel {
                    condition: c.to_string(),
                })
                .set(i64::from(c == f.condition));
        }
        gauge(&self.sst_bytes, f.sst_bytes);
        gauge(&self.background_jobs, f.background_jobs);
        gauge(&self.rooms_bytes, f.rooms_bytes);
        gauge(&self.watches_open, f.watches_open);
        let process = f.process;
        self.tls_failures
            .inc_by(process.tls_failures.saturating_sub(seen.tls_failures));
        seen.tls_failures = process.tls_failures;
        self.refused
            .inc_by(process.connections_refused.saturating_sub(seen.refused));
        seen.refused = process.connections_refused;
    }
}

/// The process-wide counters every listener of the process adds to.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProcessCounts {
    /// TLS handshakes refused or timed out.
    pub(crate) tls_failures: u64,
    /// Connections closed on accept by the caps.
    pub(crate) connections_refused: u64,
}

/// What one scrape reads off the replica, as plain numbers and names
/// (`super::scrape` takes the reading).
pub(crate) struct Figures {
    pub(crate) term: u64,
    /// The leader this replica knows, 0 for none.
    pub(crate) leader_id: u64,
    pub(crate) is_leader: bool,
    /// The Raft state in lower case: `leader`, `follower`, `candidate`,
    /// `learner` or `shutdown`.
    pub(crate) state: String,
    pub(crate) last_log: u64,
    pub(crate) applied: u64,
    pub(crate) snapshot: u64,
    pub(crate) voters: u64,
    pub(crate) members: u64,
    /// On the leader: (member, last index replicated to it); empty elsewhere.
    pub(crate) matched: Vec<(u64, u64)>,
    /// The lock census, or why it could not be taken.
    pub(crate) census: Result<LockCensus, ReplicaFailure>,
    /// Acquire calls waiting on this replica.
    pub(crate) waiting: u64,
    /// `serving`, `waiting` or `failed`.
    pub(crate) condition: &'static str,
    pub(crate) sst_bytes: u64,
    pub(crate) background_jobs: u64,
    pub(crate) rooms_bytes: u64,
    /// Watches open on the replica.
    pub(crate) watches_open: u64,
    /// The process-wide counters so far.
    pub(crate) process: ProcessCounts,
}

/// A call's outcome as a metric label: `ok` or the typed error's kind
/// (`stale_fence`, `not_leader`, ...), as the wire names it.
pub(crate) fn outcome(
    result: &Result<CommandResult, ReplicaFailure>,
) -> std::borrow::Cow<'static, str> {
    match result {
        Ok(Ok(_)) => std::borrow::Cow::Borrowed("ok"),
        Ok(Err(refused)) => error_kind(wire::command_error_to_wire(refused).kind).into(),
        Err(failure) => error_kind(v1::Error::from(failure.clone()).kind).into(),
    }
}

/// A typed error's kind as a metric label: `stale_fence`, `not_leader`...
fn error_kind(kind: i32) -> String {
    v1::ErrorKind::try_from(kind).map_or_else(
        |_| "unknown".to_string(),
        |k| {
            k.as_str_name()
                .trim_start_matches("ERROR_KIND_")
                .to_ascii_lowercase()
        },
    )
}
