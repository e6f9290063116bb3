//! The middle layer: finding the leader and retrying, the one loop every
//! client call goes through.
//!
//! A call is a closure that makes one attempt against a [`Target`]: the
//! in-process replica, or a remote replica's [`Endpoint`] (the transport
//! layer below). The router picks the target (the last known leader first),
//! follows `NotLeader` hints, rotates through endpoints on transport errors,
//! backs off, and gives up with [`Error::Unavailable`] at the request
//! deadline. Writes are never retried once they may have reached a leader
//! (see [`Attempt::Sent`]). It imports the transport layer below, never an
//! API room above.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use latchkey_core::CommandResult;
use latchkey_proto::wire::{WatchError, WatchSpec};
use latchkey_proto::{LocalReplica, Operation, ReplicaFailure, WatchStream};
use tonic::transport::Channel;

use crate::error::Error;
use crate::options::{ClientOptions, MAX_CLIENT_DURATION};
use crate::transport::{channel, Answer, Attempt, Credentials, Endpoint, TransportStats};

/// Where one attempt goes.
#[derive(Clone)]
pub(crate) enum Target {
    /// The replica in this process.
    Local(Arc<dyn LocalReplica>),
    /// A replica over gRPC; the channel is shared and reconnects by itself,
    /// and requests to it go through its [`Endpoint`].
    Remote {
        addr: String,
        channel: Channel,
        endpoint: Arc<Endpoint>,
    },
}

impl Target {
    /// Open a watch at this target.
    pub(crate) async fn watch(&self, spec: &WatchSpec) -> Result<WatchStream, WatchError> {
        match self {
            Target::Local(local) => local.watch(spec.clone()).await,
            Target::Remote { endpoint, .. } => endpoint.watch(spec).await,
        }
    }

    /// One attempt of `op` at this target. `budget` bounds the attempt.
    pub(crate) async fn send(&self, op: Operation, budget: Duration) -> Answer {
        match self {
            Target::Local(local) => local.call(op).await.map_err(Attempt::Refused),
            Target::Remote { endpoint, .. } => endpoint.send(&op, budget).await,
        }
    }
}

struct Peer {
    addr: String,
    channel: Channel,
    endpoint: Arc<Endpoint>,
}

impl Peer {
    fn new(addr: String, options: &ClientOptions) -> Result<Peer, Error> {
        // Lazy, as every channel: it connects when the first watch opens.
        let watch_channel = channel(&addr, options)?;
        let channel = channel(&addr, options)?;
        let user = Credentials::new(options)?;
        let endpoint = Arc::new(Endpoint::new(
            channel.clone(),
            watch_channel,
            options.call_stream,
            user,
        ));
        Ok(Peer {
            addr,
            channel,
            endpoint,
        })
    }

    fn target(&self) -> Target {
        Target::Remote {
            addr: self.addr.clone(),
            channel: self.channel.clone(),
            endpoint: self.endpoint.clone(),
        }
    }
}

struct State {
    peers: Vec<Peer>,
    /// Index into `peers` of the believed leader.
    leader: Option<usize>,
    /// The local replica said it is not the leader: go remote.
    local_is_follower: bool,
    /// Next peer to try when the leader is unknown.
    cursor: usize,
}

/// Leader discovery and retries over a set of endpoints.
pub(crate) struct Router {
    state: Mutex<State>,
    local: Option<Arc<dyn LocalReplica>>,
    options: ClientOptions,
}

impl Router {
    /// A router over `endpoints` (`host:port`), with an optional in-process replica.
    pub fn new<I, S>(
        endpoints: I,
        local: Option<Arc<dyn LocalReplica>>,
        options: ClientOptions,
    ) -> Result<Router, Error>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let options = options.bounded();
        let mut peers: Vec<Peer> = Vec::new();
        for e in endpoints {
            let addr = normalise(e.as_ref());
            if peers.iter().any(|p| p.addr == addr) {
                continue;
            }
            peers.push(Peer::new(addr, &options)?);
        }
        if peers.is_empty() && local.is_none() {
            return Err(Error::BadEndpoint {
                endpoint: String::new(),
                reason: "no endpoints given".into(),
            });
        }
        Ok(Router {
            state: Mutex::new(State {
                peers,
                leader: None,
                local_is_follower: false,
                cursor: 0,
            }),
            local,
            options,
        })
    }

    /// The options this router runs with.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// Addresses of every endpoint known, including ones learnt from leader hints.
    pub fn endpoints(&self) -> Vec<String> {
        self.lock().peers.iter().map(|p| p.addr.clone()).collect()
    }

    /// Where a watch may go, in the order to try them: the in-process
    /// replica first, then every endpoint in the order given (any replica
    /// serves watches).
    pub(crate) fn watch_targets(&self) -> Vec<Target> {
        let st = self.lock();
        let mut targets: Vec<Target> = self.local.iter().cloned().map(Target::Local).collect();
        targets.extend(st.peers.iter().map(Peer::target));
        targets
    }

    /// A target for one specific endpoint (for per-node admin calls).
    pub fn target_for(&self, addr: &str) -> Result<Target, Error> {
        let addr = normalise(addr);
        let mut st = self.lock();
        let idx = self.peer_index(&mut st, &addr)?;
        Ok(st.peers[idx].target())
    }

    /// Requests sent over gRPC and what carried them, summed over every
    /// endpoint.
    pub fn transport_stats(&self) -> TransportStats {
        let mut stats = TransportStats::default();
        for p in &self.lock().peers {
            stats.add(p.endpoint.stats());
        }
        stats
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave State inconsistent
        // (every update is a single assignment), so poisoning is ignored.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn peer_index(&self, st: &mut State, addr: &str) -> Result<usize, Error> {
        if let Some(i) = st.peers.iter().position(|p| p.addr == addr) {
            return Ok(i);
        }
        st.peers.push(Peer::new(addr.to_string(), &self.options)?);
        Ok(st.peers.len() - 1)
    }

    fn pick(&self) -> Option<Target> {
        let mut st = self.lock();
        if let Some(local) = &self.local {
            if !st.local_is_follower {
                return Some(Target::Local(local.clone()));
            }
        }
        if st.peers.is_empty() {
            // Only a local replica, which says it is not the leader and gave
            // no usable hint: ask it again after the backoff.
            st.local_is_follower = false;
            return self.local.clone().map(Target::Local);
        }
        let idx = match st.leader {
            Some(i) if i < st.peers.len() => i,
            _ => {
                let i = st.cursor % st.peers.len();
                st.cursor = st.cursor.wrapping_add(1);
                i
            }
        };
        Some(st.peers[idx].target())
    }

    fn note_not_leader(&self, target: &Target, leader: Option<(u64, String)>) -> bool {
        let mut st = self.lock();
        if matches!(target, Target::Local(_)) {
            st.local_is_follower = true;
        }
        match leader {
            Some((_, addr)) => {
                let addr = normalise(&addr);
                match self.peer_index(&mut st, &addr) {
                    Ok(i) => {
                        let moved = st.leader != Some(i);
                        st.leader = Some(i);
                        moved
                    }
                    Err(_) => {
                        st.leader = None;
                        false
                    }
                }
            }
            None => {
                st.leader = None;
                false
            }
        }
    }

    fn note_unreachable(&self, target: &Target) {
        let mut st = self.lock();
        match target {
            Target::Local(_) => st.local_is_follower = true,
            Target::Remote { addr, .. } => {
                if let Some(i) = st.leader {
                    if st.peers.get(i).map(|p| &p.addr) == Some(addr) {
                        st.leader = None;
                    }
                }
                // Let the local replica answer again: it may know the new leader.
                st.local_is_follower = false;
            }
        }
    }

    fn note_success(&self, target: &Target) {
        let mut st = self.lock();
        match target {
            Target::Local(_) => st.local_is_follower = false,
            Target::Remote { addr, .. } => {
                st.leader = st.peers.iter().position(|p| &p.addr == addr);
                if self.local.is_some() {
                    st.local_is_follower = true;
                }
            }
        }
    }

    /// Run `attempt` until it succeeds, fails for good, or the deadline passes.
    ///
    /// `is_write`: after an attempt that may have reached a leader
    /// ([`Attempt::Sent`]) a write ends with [`Error::UnknownOutcome`] instead
    /// of retrying, so it is never applied twice.
    pub async fn call<T, F, Fut>(&self, is_write: bool, attempt: F) -> Result<T, Error>
    where
        F: FnMut(Target, Duration) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        self.call_with(
            is_write,
            self.options.request_timeout,
            self.options.attempt_timeout,
            attempt,
        )
        .await
    }

    /// Send `op` through [`Router::call`]: its answer from whichever target
    /// gives one.
    pub async fn send(&self, is_write: bool, op: Operation) -> Result<CommandResult, Error> {
        self.call(is_write, |target, budget| {
            let op = op.clone();
            async move { target.send(op, budget).await }
        })
        .await
    }

    /// [`Router::call`] with an explicit total and per-attempt budget (for
    /// calls that wait on purpose, like an acquire, or that must end by a
    /// deadline, like a keep-alive).
    pub async fn call_with<T, F, Fut>(
        &self,
        is_write: bool,
        request_timeout: Duration,
        attempt_timeout: Duration,
        mut attempt: F,
    ) -> Result<T, Error>
    where
        F: FnMut(Target, Duration) -> Fut,
        Fut: Future<Output = Result<T, Attempt>>,
    {
        let started = Instant::now();
        let deadline = started
            .checked_add(request_timeout.min(MAX_CLIENT_DURATION))
            .unwrap_or(started);
        let mut backoff = self.options.initial_backoff;
        let mut attempts = 0u32;
        let mut last = String::from("no attempt made");
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Unavailable {
                    attempts,
                    elapsed: started.elapsed(),
                    last: with_tls_hint(last, self.options.tls.is_some()),
                });
            }
            let Some(target) = self.pick() else {
                return Err(Error::BadEndpoint {
                    endpoint: String::new(),
                    reason: "no endpoints".into(),
                });
            };
            attempts += 1;
            let budget = attempt_timeout.min(deadline - now);
            let result = match tokio::time::timeout(budget, attempt(target.clone(), budget)).await {
                Ok(r) => r,
                Err(_) => Err(Attempt::Sent(format!("attempt timed out after {budget:?}"))),
            };
            let retry_now = match result {
                Ok(value) => {
                    self.note_success(&target);
                    return Ok(value);
                }
                Err(Attempt::Refused(ReplicaFailure::NotLeader { leader })) => {
                    last = format!("{} is not the leader", describe(&target));
                    self.note_not_leader(&target, leader)
                }
                Err(Attempt::Refused(ReplicaFailure::Unavailable(msg))) => {
                    last = format!("{}: {msg}", describe(&target));
                    self.note_unreachable(&target);
                    false
                }
                Err(Attempt::Refused(ReplicaFailure::InvalidArgument(msg))) => {
                    return Err(Error::InvalidArgument(msg));
                }
                Err(Attempt::Refused(ReplicaFailure::UnknownOutcome(msg))) => {
                    if is_write {
                        return Err(Error::UnknownOutcome(msg));
                    }
                    last = msg;
                    self.note_unreachable(&target);
                    false
                }
                Err(Attempt::NotSent(msg)) => {
                    last = format!("{}: {msg}", describe(&target));
                    self.note_unreachable(&target);
                    false
                }
                Err(Attempt::Sent(msg)) => {
                    let msg = format!("{}: {msg}", describe(&target));
                    if is_write {
                        return Err(Error::UnknownOutcome(msg));
                    }
                    last = msg;
                    self.note_unreachable(&target);
                    false
                }
                Err(Attempt::Protocol(msg)) => return Err(Error::Protocol(msg)),
            };
            tracing::debug!(attempts, %last, "retrying");
            if !retry_now {
                let pause = backoff.min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                backoff = (backoff * 2).min(self.options.max_backoff);
            }
        }
    }
}

fn describe(target: &Target) -> String {
    match target {
        Target::Local(_) => "local replica".to_string(),
        Target::Remote { addr, .. } => addr.clone(),
    }
}

fn normalise(addr: &str) -> String {
    let t = addr.trim();
    t.strip_prefix("http://")
        .or_else(|| t.strip_prefix("https://"))
        .unwrap_or(t)
        .to_string()
}

/// `last` (the last attempt's failure) with what a TLS mismatch usually
/// means, when its text looks like one: the transport's own words ("h2
/// protocol error", "corrupt message") do not say that one side talks TLS
/// and the other does not.
fn with_tls_hint(last: String, tls: bool) -> String {
    let lower = last.to_ascii_lowercase();
    let hint = if !tls && (lower.contains("h2 protocol error") || lower.contains("http2 error")) {
        "this client talks plaintext: the replica may serve TLS (give the client its CA: \
         --cacert, ClientOptions::with_tls)"
    } else if tls && lower.contains("corrupt message") {
        "this client talks TLS: the replica may serve plaintext (drop --cacert, or give the \
         replica a certificate)"
    } else if tls && lower.contains("invalid peer certificate") {
        "the replica's certificate is not signed by the CA given to this client, has expired, \
         or does not name the address dialled"
    } else if tls && (lower.contains("operation was canceled") || lower.contains("alert")) {
        "the TLS handshake failed: the replica may require a client certificate signed by its \
         CA (--cert and --key), or refused the one given (another CA, or expired)"
    } else {
        return last;
    };
    format!("{last} ({hint})")
}

#[cfg(test)]
mod tests {
    #[test]
    fn tls_mismatches_get_a_hint_and_other_failures_do_not() {
        let plain = with_tls_hint("h2 protocol error: http2 error".into(), false);
        assert!(plain.contains("may serve TLS"), "{plain}");
        let tls = with_tls_hint(
            "received corrupt message of type InvalidContentType".into(),
            true,
        );
        assert!(tls.contains("may serve plaintext"), "{tls}");
        let ca = with_tls_hint("invalid peer certificate: UnknownIssuer".into(), true);
        assert!(ca.contains("not signed by the CA"), "{ca}");
        let refused = with_tls_hint("operation was canceled".into(), true);
        assert!(refused.contains("client certificate"), "{refused}");
        assert_eq!(
            with_tls_hint("connection refused".into(), true),
            "connection refused"
        );
        assert_eq!(
            with_tls_hint("connection refused".into(), false),
            "connection refused"
        );
    }

    use super::*;

    /// Timeouts up to `Duration::MAX` mean "as long as it takes": no
    /// overflow adding them to now, whatever the options hold.
    #[tokio::test]
    async fn the_longest_timeouts_do_not_overflow() {
        let forever = ClientOptions {
            request_timeout: Duration::MAX,
            attempt_timeout: Duration::MAX,
            connect_timeout: Duration::MAX,
            initial_backoff: Duration::MAX,
            max_backoff: Duration::MAX,
            ..ClientOptions::default()
        };
        let bounded = forever.clone().bounded();
        assert_eq!(bounded.request_timeout, MAX_CLIENT_DURATION);
        assert_eq!(bounded.max_backoff, MAX_CLIENT_DURATION);
        // Nothing listens on port 1: the call retries until cut off here.
        let r = match Router::new(["127.0.0.1:1"], None, forever) {
            Ok(r) => r,
            Err(e) => panic!("a router with the longest timeouts: {e}"),
        };
        let read = Operation::Read {
            query: latchkey_core::Query::Get { key: b"k".to_vec() },
            stale: false,
        };
        let call = r.call(false, |target, budget| {
            let op = read.clone();
            async move { target.send(op, budget).await }
        });
        let call = tokio::time::timeout(Duration::from_millis(300), call).await;
        assert!(call.is_err(), "still retrying: {call:?}");
    }

    #[tokio::test]
    async fn valid_endpoints_make_lazy_channels() {
        let o = ClientOptions::default();
        assert!(channel("127.0.0.1:7101", &o).is_ok());
        assert!(channel("http://localhost:7101", &o).is_ok());
        let r = Router::new(["127.0.0.1:1", "http://127.0.0.1:1"], None, o);
        assert_eq!(r.map(|r| r.endpoints().len()).ok(), Some(1));
    }

    #[tokio::test]
    async fn unreachable_cluster_ends_with_unavailable() {
        let o = ClientOptions {
            request_timeout: Duration::from_millis(300),
            ..ClientOptions::default()
        };
        // Port 1 on loopback: connection refused at once.
        let r = match Router::new(["127.0.0.1:1"], None, o) {
            Ok(r) => r,
            Err(e) => panic!("router: {e}"),
        };
        let res: Result<(), Error> = r
            .call(true, |_t, _b| async {
                Err(Attempt::NotSent("connection refused".into()))
            })
            .await;
        match res {
            Err(Error::Unavailable { attempts, .. }) => assert!(attempts >= 2),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_write_that_may_have_been_sent_is_not_retried() {
        let r = match Router::new(["127.0.0.1:1"], None, ClientOptions::default()) {
            Ok(r) => r,
            Err(e) => panic!("router: {e}"),
        };
        let mut calls = 0;
        let res: Result<(), Error> = r
            .call(true, |_t, _b| {
                calls += 1;
                async { Err(Attempt::Sent("connection reset".into())) }
            })
            .await;
        assert!(matches!(res, Err(Error::UnknownOutcome(_))));
        assert_eq!(calls, 1);
    }
}
