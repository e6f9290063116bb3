//! What a replica measures, in the Prometheus/OpenMetrics text format
//! (`prometheus-client`), and the optional HTTP listener that serves it
//! with `/healthz`, `/readyz` and a read-only status page at `/`
//! ([`crate::status_page`]) (`ServerBuilder::metrics_listen`,
//! `latchkey serve --metrics-listen`).
//!
//! Three rooms, each importing only those below it: `registry` ([`Metrics`],
//! plain data: the metric families any room of the server counts into,
//! knowing nothing of the replica), `scrape` ([`MetricsHandle`]: reads a
//! running replica's figures into its registry) and `listener` (the HTTP
//! listener). Each replica has its own registry: an embedding application
//! can serve [`MetricsHandle::render`] (from [`crate::Server::metrics`])
//! itself, or run the listener. The Raft figures are
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
//! | `latchkey_lock_checkpoints` | counter | | on the leader: entries recording how long lagging sessions and leases have left (see `locks`) |
//! | `latchkey_lock_sessions` | gauge | | live sessions in the replica's state (every replica; counted when scraped) |
//! | `latchkey_lock_locks` | gauge | | locks in use in the replica's state: held, waited for or in lock-delay |
//! | `latchkey_lock_held` | gauge | | locks with at least one holder |
//! | `latchkey_lock_grants` | gauge | | grants held (a shared lock may have several) |
//! | `latchkey_lock_waiters` | gauge | | acquires waiting in a lock's queue, cluster-wide (as this replica has applied them) |
//! | `latchkey_lock_delayed` | gauge | | locks in lock-delay |
//! | `latchkey_lock_waiting_calls` | gauge | | acquire calls waiting for their grant on this replica |
//! | `latchkey_lock_acquire_wait_seconds` | histogram | `outcome` | on the leader: how long each acquire waited, by how the wait ended: `granted` (0 for a grant without waiting), `cancelled` (given up or timed out), `session_ended` |
//! | `latchkey_lock_hold_seconds` | histogram | `end` | on the leader: from a grant to its end, by how it ended (`released`, `session_closed`, `session_expired`, `session_ended_by_operator`, `lease_expired`, `forced_by_operator`) |
//! | `latchkey_lock_keepalive_margin_seconds` | histogram | | on the leader: how much of its session's TTL (by the leader's countdown) was left when a keep-alive arrived (near 0: clients about to lose their sessions) |
//! | `latchkey_storage_wal_sync_seconds` | histogram | | each write-ahead-log sync (RocksDB `FlushWAL` with sync) of the group-commit flusher, failed ones included: the fsync latency |
//! | `latchkey_storage_group_commit_batch` | histogram | | appends each of those syncs made durable (the group-commit batch size) |
//! | `latchkey_storage_sst_bytes` | gauge | | bytes of RocksDB's live SST files (log and state; not the WAL or memtables) |
//! | `latchkey_watches_open` | gauge | | watches open on this replica (see `Server` builder's `max_watches`) |
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
mod listener;
mod registry;
mod scrape;

pub(crate) use listener::serve;
pub use listener::{CONTENT_TYPE, MAX_CONNECTIONS};
pub(crate) use registry::outcome;
pub use registry::Metrics;
pub use scrape::MetricsHandle;
pub(crate) use scrape::{process_counts, watch_leader};
