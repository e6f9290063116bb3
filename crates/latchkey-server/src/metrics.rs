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
//! `services::answer`).
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
//! | `latchkey_requests` | counter | `rpc`, `outcome` | gRPC calls answered, by RPC and outcome (`ok` or the typed error's kind, such as `stale_fence`, `not_leader`, `permission_denied`) |
//! | `latchkey_request_duration_seconds` | histogram | `rpc` | time to answer a call, from decoding to the reply |
//! | `latchkey_lock_expiries` | counter | `kind` | on the leader: sessions, waits, lock leases and lock delays it expired |
//! | `latchkey_lock_sessions` | gauge | | on the leader: live sessions it counts down (0 elsewhere) |
//! | `latchkey_storage_wal_syncs` | counter | | write-ahead-log syncs the group-commit flusher did for appended entries |
//! | `latchkey_storage_wal_sync_seconds` | counter | | time spent in those syncs (divide by the syncs for the mean fsync latency) |
//! | `latchkey_storage_group_commit_appends` | counter | | appends those syncs made durable (divide by the syncs for the mean group-commit batch) |
//! | `latchkey_storage_sst_bytes` | gauge | | bytes of RocksDB's live SST files (log and state; not the WAL or memtables) |
//! | `latchkey_lock_waiting_calls` | gauge | | acquire calls waiting for their grant on this replica |
//! | `latchkey_tls_handshake_failures` | counter | | TLS handshakes refused or timed out since this replica started (whole process) |
//! | `latchkey_connections_refused` | counter | | connections closed on accept by the connection caps since this replica started (whole process) |
//!
//! Counters carry the `_total` suffix in the output, as OpenMetrics wants.
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

type LatencyFamily = Family<RpcLabel, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs to ~105 s, doubling (an acquire may wait in its queue).
    Histogram::new(exponential_buckets(0.000_05, 2.0, 22))
}

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
    sessions: Gauge,
    waiting: Gauge,
    leader_changes: Counter,
    condition: Family<ConditionLabel, Gauge>,
    tls_failures: Counter,
    refused: Counter,
    wal_syncs: Counter,
    wal_sync_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    appends: Counter,
    sst_bytes: Gauge,
    /// What the process-wide counters were at the last scrape (so each
    /// scrape adds only what is new).
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    wal_syncs: u64,
    wal_sync_seconds: f64,
    appends: u64,
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
        let latency: LatencyFamily = Family::new_with_constructor(latency_histogram);
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
            sessions: Gauge::default(),
            waiting: Gauge::default(),
            leader_changes: Counter::default(),
            condition,
            tls_failures: Counter::default(),
            refused: Counter::default(),
            wal_syncs: Counter::default(),
            wal_sync_seconds: Counter::default(),
            appends: Counter::default(),
            sst_bytes: Gauge::default(),
            // Counted from this replica's start on, not the process's.
            seen: Mutex::new(Seen {
                wal_syncs: 0,
                wal_sync_seconds: 0.0,
                appends: 0,
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
        r.register(
            "latchkey_lock_sessions",
            "On the leader: live sessions it counts down (0 elsewhere)",
            m.sessions.clone(),
        );
        r.register(
            "latchkey_lock_waiting_calls",
            "Acquire calls waiting for their grant on this replica",
            m.waiting.clone(),
        );
        r.register(
            "latchkey_storage_wal_syncs",
            "Write-ahead-log syncs for appended entries",
            m.wal_syncs.clone(),
        );
        r.register(
            "latchkey_storage_wal_sync_seconds",
            "Time spent in write-ahead-log syncs",
            m.wal_sync_seconds.clone(),
        );
        r.register(
            "latchkey_storage_group_commit_appends",
            "Appends made durable by write-ahead-log syncs",
            m.appends.clone(),
        );
        r.register(
            "latchkey_storage_sst_bytes",
            "Bytes of RocksDB's live SST files",
            m.sst_bytes.clone(),
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
    fn refresh(&self, replica: &Replica, seen: &mut Seen) {
        let m = replica.raft().metrics().borrow().clone();
        let gauge = |g: &Gauge, v: u64| {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        };
        gauge(&self.term, m.current_term);
        gauge(&self.leader_id, m.current_leader.unwrap_or(0));
        let leading = m.current_leader == Some(replica.id());
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
        gauge(
            &self.sessions,
            replica.locks().counted_sessions().unwrap_or(0),
        );
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
        let sync = replica.sync_stats();
        self.wal_syncs
            .inc_by(sync.syncs().saturating_sub(seen.wal_syncs));
        seen.wal_syncs = sync.syncs();
        let seconds = sync.sync_seconds();
        if seconds > seen.wal_sync_seconds {
            self.wal_sync_seconds
                .inc_by(seconds - seen.wal_sync_seconds);
            seen.wal_sync_seconds = seconds;
        }
        self.appends
            .inc_by(sync.appends().saturating_sub(seen.appends));
        seen.appends = sync.appends();
        gauge(&self.sst_bytes, replica.disk_bytes());
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
    /// Every metric in the OpenMetrics text format, up to date.
    ///
    /// ```no_run
    /// # async fn demo(server: latchkey_server::Server) {
    /// let text = server.metrics().render();
    /// assert!(text.contains("latchkey_raft_term"));
    /// # }
    /// ```
    pub fn render(&self) -> String {
        let metrics = self.replica.metrics();
        let mut seen = metrics.seen.lock().unwrap_or_else(|p| p.into_inner());
        metrics.refresh(&self.replica, &mut seen);
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
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], handle.render()) }
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
