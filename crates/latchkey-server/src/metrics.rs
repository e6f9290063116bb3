//! What a replica measures, in the Prometheus/OpenMetrics text format
//! (`prometheus-client`), and the optional HTTP listener that serves it
//! with `/healthz`, `/readyz` and a read-only status page at `/`
//! ([`crate::status_page`]) (`ServerBuilder::metrics_listen`,
//! `latchkey serve --metrics-listen`).
//!
//! Each replica has its own registry ([`Metrics`], from
//! [`crate::Server::metrics`]): an embedding application can serve
//! [`Metrics::render`] itself, or run the listener. The Raft figures are
//! read from openraft's metrics when scraped, so they cost nothing between
//! scrapes; request counts and latencies are counted as calls are answered
//! (every gRPC call, unary or pipelined, passes one place:
//! `services::answer`; an embedding application's in-process calls,
//! `Client::with_local`, pass `LocalReplica::call`, and are counted under
//! the same RPC names).
//!
//! | metric | type | labels | meaning |
//! |---|---|---|---|
//! | `latchkey_raft_term` | gauge | | the replica's current Raft term |
//! | `latchkey_raft_leader_id` | gauge | | the leader it knows (0: none) |
//! | `latchkey_raft_is_leader` | gauge | | 1 on the leader |
//! | `latchkey_raft_state` | gauge | `state` | 1 for the replica's Raft state (leader, follower, candidate, learner, shutdown) |
//! | `latchkey_raft_last_log_index` | gauge | | last index in its log |
//! | `latchkey_raft_applied_index` | gauge | | last index applied to its state machine |
//! | `latchkey_raft_snapshot_index` | gauge | | last index its snapshot covers |
//! | `latchkey_raft_voters` | gauge | | voting members of the membership it knows |
//! | `latchkey_raft_members` | gauge | | members (voters and learners) |
//! | `latchkey_raft_matched_index` | gauge | `member` | on the leader: the last index known replicated to each member |
//! | `latchkey_raft_leader_changes` | counter | | times the leader this replica knows changed |
//! | `latchkey_replica_condition` | gauge | `condition` | 1 for serving, waiting (to be added) or failed |
//! | `latchkey_requests` | counter | `rpc`, `outcome` | calls answered (gRPC and in-process), by RPC and outcome (`ok` or the typed error's kind, such as `stale_fence`, `not_leader`, `permission_denied`) |
//! | `latchkey_request_duration_seconds` | histogram | `rpc` | time to answer a call, from decoding to the reply |
//! | `latchkey_lock_expiries` | counter | `kind` | on the leader: sessions, waits, lock leases and lock delays it expired |
//! | `latchkey_lock_sessions` | gauge | | live sessions in the replica's state (every replica; counted when scraped) |
//! | `latchkey_lock_locks` | gauge | | locks in use in the replica's state: held, waited for or in lock-delay |
//! | `latchkey_lock_held` | gauge | | locks with at least one holder |
//! | `latchkey_lock_grants` | gauge | | grants held (a shared lock may have several) |
//! | `latchkey_lock_waiters` | gauge | | acquires waiting in a lock's queue, cluster-wide (as this replica has applied them) |
//! | `latchkey_lock_delayed` | gauge | | locks in lock-delay |
//! | `latchkey_lock_waiting_calls` | gauge | | acquire calls waiting for their grant on this replica |
//! | `latchkey_lock_acquire_wait_seconds` | histogram | `outcome` | on the leader: how long each acquire waited, by how the wait ended: `granted` (0 for a grant without waiting), `cancelled` (given up or timed out), `session_ended` |
//! | `latchkey_lock_hold_seconds` | histogram | `end` | on the leader: from a grant to its end, by how it ended (`released`, `session_closed`, `session_expired`, `lease_expired`) |
//! | `latchkey_lock_keepalive_margin_seconds` | histogram | | on the leader: how much of its session's TTL (by the leader's countdown) was left when a keep-alive arrived (near 0: clients about to lose their sessions) |
//! | `latchkey_storage_wal_sync_seconds` | histogram | | each write-ahead-log sync (RocksDB `FlushWAL` with sync) of the group-commit flusher, failed ones included: the fsync latency |
//! | `latchkey_storage_group_commit_batch` | histogram | | appends each of those syncs made durable (the group-commit batch size) |
//! | `latchkey_storage_sst_bytes` | gauge | | bytes of RocksDB's live SST files (log and state; not the WAL or memtables) |
//! | `latchkey_storage_lock_rooms_bytes` | gauge | | bytes of keys and values the state machine keeps in memory for the lock rooms (sessions, locks, request memory, access control) |
//! | `latchkey_storage_background_jobs` | gauge | | RocksDB flushes and compactions running, plus column families with one pending (0: settled) |
//! | `latchkey_raft_snapshot_seconds` | histogram | `op` | snapshots built (`build`) or installed from the leader (`install`), by time taken |
//! | `latchkey_raft_snapshot_bytes` | histogram | `op` | the same snapshots, by size |
//! | `latchkey_tls_handshake_failures` | counter | | TLS handshakes refused or timed out since this replica started (whole process) |
//! | `latchkey_connections_refused` | counter | | connections closed on accept by the connection caps since this replica started (whole process) |
//!
//! Counters carry the `_total` suffix in the output, as OpenMetrics wants.
//! The lock gauges (`latchkey_lock_sessions` to `latchkey_lock_delayed`)
//! count the replica's own state (a scan of its sessions and locks, off the
//! async workers, taken at most once a second): every replica reports the
//! cluster's figures once it has applied the same entries, so take the
//! `max` across replicas (or the leader's), never the `sum`; a lagging
//! follower's are older. The three lock histograms are the
//! leader's: it times grants, holds and keep-alives on its own monotonic
//! clock from when it became leader, so a hold or wait that began under an
//! earlier leader is not observed, and each new leader starts them afresh.
//! The two "whole process" counters count every listener of the process:
//! with several replicas in one process, each reports the same events, so
//! do not sum them across replicas of one process. `acquire`'s duration
//! includes the time the call waited in the lock's queue (up to its wait),
//! so its histogram measures hand-off waits, not service time. Leader
//! changes are counted as the replica sees them; a change and its reversal
//! between two updates of openraft's metrics can count once or not at all.
//!
//! The listener is plain HTTP without authentication (like etcd's
//! `/metrics`), capped like the gRPC listeners so it cannot take the
//! process's file descriptors: at most [`MAX_CONNECTIONS`] connections, 8
//! from one address, each sending its first bytes within 10 s.
//! `/readyz` needs a known leader, so during an election every replica is
//! briefly not ready; on Kubernetes, start the pods in parallel
//! (`podManagementPolicy: Parallel`, `publishNotReadyAddresses: true` on the
//! peers' headless service) or the first pod waits for the others forever.
//! `/healthz` turns 503 only when the replica has failed for good, which a
//! restart is the cure for (`latchkey serve` exits then anyway).
//! `/healthz` answers 200 while the process runs and the replica has not
//! failed, else 503 with the cause; `/readyz` answers 200 only while it
//! serves, is a member and knows a leader (as grpc.health.v1 does), and,
//! on the leader, while a majority has acknowledged it within the longest
//! election timeout (a leader cut off from the others is not ready), else
//! 503 with the reason.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::health::Condition;
use crate::replica::Replica;

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

/// Most connections the metrics listener holds open at once.
pub const MAX_CONNECTIONS: usize = 64;

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
    condition: Family<ConditionLabel, Gauge>,
    tls_failures: Counter,
    refused: Counter,
    storage: StorageFigures,
    sst_bytes: Gauge,
    background_jobs: Gauge,
    rooms_bytes: Gauge,
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

/// Connections closed on accept by the caps, process-wide
/// (`crate::conn_limit` counts them).
pub(crate) static CONNECTIONS_REFUSED: AtomicU64 = AtomicU64::new(0);

impl Metrics {
    pub(crate) fn new() -> Metrics {
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
            // Counted from this replica's start on, not the process's.
            seen: Mutex::new(Seen {
                tls_failures: crate::tls_accept::tls_handshake_failures(),
                refused: CONNECTIONS_REFUSED.load(Ordering::Relaxed),
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

    /// Bring the scraped figures up to date from `replica` (under `seen`'s
    /// lock, so concurrent scrapes never see a half-updated set).
    fn refresh(
        &self,
        replica: &Replica,
        census: Result<latchkey_core::lock::LockCensus, latchkey_proto::ReplicaFailure>,
        seen: &mut Seen,
    ) {
        let m = replica.raft().metrics().borrow().clone();
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&self.term, m.current_term);
        gauge(&self.leader_id, replica.leader().map_or(0, |(id, _)| id));
        let leading =
            m.state == openraft::ServerState::Leader && m.current_leader == Some(replica.id());
        self.is_leader.set(i64::from(leading));
        let current = format!("{:?}", m.state).to_lowercase();
        for state in ["leader", "follower", "candidate", "learner", "shutdown"] {
            self.state
                .get_or_create(&StateLabel {
                    state: state.to_string(),
                })
                .set(i64::from(state == current));
        }
        gauge(&self.last_log, m.last_log_index.unwrap_or(0));
        gauge(&self.applied, m.last_applied.map_or(0, |l| l.index));
        gauge(&self.snapshot, m.snapshot.map_or(0, |l| l.index));
        let membership = m.membership_config.membership();
        gauge(&self.voters, membership.voter_ids().count() as u64);
        gauge(&self.members, membership.nodes().count() as u64);
        // Left as they were if the state cannot be read (shut down).
        match census {
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
        gauge(&self.waiting, replica.locks().waiters.len() as u64);
        self.matched.clear();
        if let Some(replication) = &m.replication {
            for (member, matched) in replication {
                gauge(
                    &self.matched.get_or_create(&MemberLabel {
                        member: member.to_string(),
                    }),
                    matched.map_or(0, |l| l.index),
                );
            }
        }
        let condition = match replica.health().condition() {
            Condition::Serving => "serving",
            Condition::Waiting(_) => "waiting",
            Condition::Failed(_) => "failed",
        };
        for c in ["serving", "waiting", "failed"] {
            self.condition
                .get_or_create(&ConditionLabel {
                    condition: c.to_string(),
                })
                .set(i64::from(c == condition));
        }
        gauge(&self.sst_bytes, replica.disk_bytes());
        gauge(&self.background_jobs, replica.storage_background_jobs());
        gauge(&self.rooms_bytes, replica.lock_rooms_bytes());
        let tls = crate::tls_accept::tls_handshake_failures();
        self.tls_failures
            .inc_by(tls.saturating_sub(seen.tls_failures));
        seen.tls_failures = tls;
        let refused = CONNECTIONS_REFUSED.load(Ordering::Relaxed);
        self.refused.inc_by(refused.saturating_sub(seen.refused));
        seen.refused = refused;
    }
}

/// Count the changes of the leader `replica` knows, as they happen, until
/// its Raft core stops.
pub(crate) fn watch_leader(replica: Arc<Replica>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut watch = replica.raft().metrics();
        let mut last = watch.borrow_and_update().current_leader;
        while watch.changed().await.is_ok() {
            let now = watch.borrow_and_update().current_leader;
            if now.is_some() && now != last {
                if last.is_some() {
                    replica.metrics().leader_changes.inc();
                }
                last = now;
            }
        }
    })
}

/// A replica's metrics, read for scraping (see [`Metrics`]).
#[derive(Clone)]
pub struct MetricsHandle {
    pub(crate) replica: Arc<Replica>,
}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsHandle").finish_non_exhaustive()
    }
}

impl MetricsHandle {
    /// Every metric in the OpenMetrics text format, up to date. It scans
    /// the replica's sessions and locks (the lock gauges): call it off the
    /// async workers (`spawn_blocking`) when there may be many.
    ///
    /// ```no_run
    /// # async fn demo(server: latchkey_server::Server) -> Result<(), tokio::task::JoinError> {
    /// let metrics = server.metrics();
    /// let text = tokio::task::spawn_blocking(move || metrics.render()).await?;
    /// assert!(text.contains("latchkey_raft_term"));
    /// # Ok(()) }
    /// ```
    pub fn render(&self) -> String {
        let metrics = self.replica.metrics();
        let census = self.replica.lock_census();
        let mut seen = metrics.seen.lock().unwrap_or_else(|p| p.into_inner());
        metrics.refresh(&self.replica, census, &mut seen);
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &metrics.registry);
        drop(seen);
        text
    }
}

/// The metrics listener's connections, within the caps (see the module
/// docs).
struct Capped {
    incoming: std::pin::Pin<
        Box<dyn futures::Stream<Item = std::io::Result<crate::conn_limit::Limited>> + Send>,
    >,
    addr: SocketAddr,
}

impl axum::serve::Listener for Capped {
    type Io = crate::conn_limit::Limited;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        use futures::StreamExt;
        use tonic::transport::server::Connected;
        loop {
            match self.incoming.next().await {
                Some(Ok(connection)) => {
                    let from = connection.connect_info().remote_addr().unwrap_or(self.addr);
                    return (connection, from);
                }
                Some(Err(e)) => {
                    // Out of descriptors, say: wait instead of spinning.
                    tracing::debug!(error = %e, "the metrics listener could not accept");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

/// The content type of [`MetricsHandle::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serve `/metrics`, `/healthz`, `/readyz` and the status page
/// (`crate::status_page`) for `replica` on `listener` until `stop` fires.
pub(crate) fn serve(
    replica: Arc<Replica>,
    listener: std::net::TcpListener,
    stop: tokio::sync::oneshot::Receiver<()>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), crate::NodeError> {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let addr = listener
        .local_addr()
        .map_err(|e| crate::NodeError::Io(e.to_string()))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| crate::NodeError::Io(e.to_string()))?;
    let listener = tokio::net::TcpListener::from_std(listener)
        .map_err(|e| crate::NodeError::Io(e.to_string()))?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let listener = Capped {
        incoming: Box::pin(crate::conn_limit::limit(
            incoming,
            MAX_CONNECTIONS,
            8,
            crate::DEFAULT_HANDSHAKE_TIMEOUT,
        )),
        addr,
    };
    let handle = MetricsHandle {
        replica: Arc::clone(&replica),
    };
    let health = Arc::clone(&replica);
    let page = Arc::clone(&replica);
    let ready = replica;
    // The status page's files: static, from this origin only.
    let file = |content_type: &'static str, body: &'static str| {
        get(move || async move {
            (
                [
                    (header::CONTENT_TYPE, content_type),
                    (header::CONTENT_SECURITY_POLICY, "default-src 'self'"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                ],
                body,
            )
        })
    };
    let app = axum::Router::new()
        .route(
            "/",
            file("text/html; charset=utf-8", crate::status_page::PAGE),
        )
        .route(
            "/status.js",
            file("text/javascript; charset=utf-8", crate::status_page::SCRIPT),
        )
        .route(
            "/status.css",
            file("text/css; charset=utf-8", crate::status_page::STYLE),
        )
        .route(
            "/status.json",
            get(move || {
                let replica = Arc::clone(&page);
                async move {
                    (
                        [
                            (header::CONTENT_TYPE, "application/json"),
                            (header::CACHE_CONTROL, "no-store"),
                            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                            (header::CONTENT_SECURITY_POLICY, "default-src 'none'"),
                        ],
                        crate::status_page::cached_json(replica).await,
                    )
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let handle = handle.clone();
                async move {
                    match tokio::task::spawn_blocking(move || handle.render()).await {
                        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], text),
                        Err(e) => (
                            StatusCode::INTERNAL_SERVER_ERROR,
                            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                            format!("the metrics could not be gathered: {e}\n"),
                        ),
                    }
                }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let replica = Arc::clone(&health);
                async move {
                    match replica.health().condition() {
                        Condition::Failed(cause) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("failed: {cause}\n"),
                        ),
                        _ => (StatusCode::OK, "ok\n".to_string()),
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let replica = Arc::clone(&ready);
                async move {
                    match crate::health::readiness(&replica) {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    }
                }
            }),
        );
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async {
            let _ = stop.await;
        });
        if let Err(e) = served.await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok((addr, task))
}
