//! Finding the leader and retrying: the one loop every client call goes through.
//!
//! A call is a closure that makes one attempt against a [`Target`]. The router
//! picks the target (the last known leader first), follows `NotLeader` hints,
//! rotates through endpoints on transport errors, backs off, and gives up with
//! [`Error::Unavailable`] at the request deadline. Writes are never retried
//! once they may have reached a leader (see [`Attempt::Sent`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::transport::Channel;

use latchkey_proto::{Operation, TlsOptions};

use crate::transport::{Answer, Endpoint, TransportStats};
use crate::{Error, LocalReplica, ReplicaFailure};

/// Timeouts and backoff of a client.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    /// Give up on a call after this long in total (default 10 s).
    pub request_timeout: Duration,
    /// Give up on one attempt after this long (default 3 s).
    pub attempt_timeout: Duration,
    /// TCP connect timeout per endpoint (default 1 s).
    pub connect_timeout: Duration,
    /// First pause between attempts; doubles up to `max_backoff` (default 20 ms).
    pub initial_backoff: Duration,
    /// Longest pause between attempts (default 500 ms).
    pub max_backoff: Duration,
    /// Send requests on one long-lived `Pipeline.Calls` stream per replica
    /// (default true): every request goes out at once, and requests at hand
    /// together share a frame. Off, every request is its own unary RPC.
    pub call_stream: bool,
    /// The cluster secret, sent with membership changes
    /// ([`crate::Client::add_member`], [`crate::Client::change_voters`]),
    /// which replicas started with a cluster secret refuse without it.
    /// Default: none.
    pub cluster_secret: Option<String>,
    /// Talk to the replicas over TLS: trust the CA these options name, and
    /// present their certificate if the replicas ask for one. Default:
    /// plaintext. A client with TLS never falls back to plaintext.
    pub tls: Option<TlsOptions>,
    /// The user every call is made as, when the replicas run access
    /// control (see [`ClientOptions::with_user`]). Default: none.
    pub user: Option<UserCredentials>,
}

/// A user's name and password (its `Debug` form does not show the
/// password).
#[derive(Clone, PartialEq, Eq)]
pub struct UserCredentials {
    /// The user's name.
    pub name: String,
    password: String,
}

impl UserCredentials {
    /// `name` with `password`.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> UserCredentials {
        UserCredentials {
            name: name.into(),
            password: password.into(),
        }
    }

    /// The password.
    pub fn password(&self) -> &str {
        &self.password
    }
}

impl std::fmt::Debug for UserCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserCredentials({:?}, ..)", self.name)
    }
}

/// The longest any of [`ClientOptions`]' durations is taken to be: a
/// longer one (up to `Duration::MAX`) means "as long as it takes" and is cut
/// to this, so that deadlines computed from it (now + timeout, sums of
/// timeouts) cannot overflow.
pub const MAX_CLIENT_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

impl ClientOptions {
    /// These options with every duration at most [`MAX_CLIENT_DURATION`]
    /// (a client applies this to the options it is made with).
    pub fn bounded(mut self) -> ClientOptions {
        for d in [
            &mut self.request_timeout,
            &mut self.attempt_timeout,
            &mut self.connect_timeout,
            &mut self.initial_backoff,
            &mut self.max_backoff,
        ] {
            *d = (*d).min(MAX_CLIENT_DURATION);
        }
        self
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(1),
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(500),
            call_stream: true,
            cluster_secret: None,
            tls: None,
            user: None,
        }
    }
}

/// Setters, for callers outside this crate (the struct is
/// `#[non_exhaustive]`, so new options can be added without breaking
/// them): `ClientOptions::default().with_...(..)`.
impl ClientOptions {
    /// Set [`ClientOptions::request_timeout`].
    pub fn with_request_timeout(mut self, request_timeout: Duration) -> Self {
        self.request_timeout = request_timeout;
        self
    }

    /// Set [`ClientOptions::attempt_timeout`].
    pub fn with_attempt_timeout(mut self, attempt_timeout: Duration) -> Self {
        self.attempt_timeout = attempt_timeout;
        self
    }

    /// Set [`ClientOptions::connect_timeout`].
    pub fn with_connect_timeout(mut self, connect_timeout: Duration) -> Self {
        self.connect_timeout = connect_timeout;
        self
    }

    /// Set [`ClientOptions::initial_backoff`].
    pub fn with_initial_backoff(mut self, initial_backoff: Duration) -> Self {
        self.initial_backoff = initial_backoff;
        self
    }

    /// Set [`ClientOptions::max_backoff`].
    pub fn with_max_backoff(mut self, max_backoff: Duration) -> Self {
        self.max_backoff = max_backoff;
        self
    }

    /// Make every call as user `name` with `password` (the
    /// `latchkey-user` and `latchkey-password` call metadata): replicas
    /// with access control enabled refuse calls without a user, and every
    /// replica refuses a wrong password (UNAUTHENTICATED, as
    /// [`crate::Error::InvalidArgument`]). Use TLS: the password travels
    /// with every call.
    ///
    /// ```
    /// let options = latchkey_client::ClientOptions::default().with_user("app", "s3cret");
    /// assert_eq!(options.user.map(|u| u.name), Some("app".to_string()));
    /// ```
    pub fn with_user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(UserCredentials::new(name, password));
        self
    }

    /// Set [`ClientOptions::cluster_secret`] (surrounding whitespace, such
    /// as a file's final newline, is ignored).
    pub fn with_cluster_secret(mut self, secret: impl Into<String>) -> Self {
        self.cluster_secret = Some(secret.into().trim().to_string());
        self
    }

    /// Set [`ClientOptions::tls`].
    ///
    /// ```no_run
    /// use std::path::Path;
    /// use latchkey_client::{ClientOptions, TlsOptions};
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let tls = TlsOptions::from_files(Path::new("certs/ca.pem"), None)?;
    /// let options = ClientOptions::default().with_tls(tls);
    /// # let _ = options; Ok(()) }
    /// ```
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Set [`ClientOptions::call_stream`].
    pub fn with_call_stream(mut self, call_stream: bool) -> Self {
        self.call_stream = call_stream;
        self
    }
}

/// Where one attempt goes.
#[derive(Clone)]
pub enum Target {
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
    /// One attempt of `op` at this target. `budget` bounds the attempt.
    pub(crate) async fn send(&self, op: Operation, budget: Duration) -> Answer {
        match self {
            Target::Local(local) => local.call(op).await.map_err(Attempt::Refused),
            Target::Remote { endpoint, .. } => endpoint.send(&op, budget).await,
        }
    }
}

/// How one attempt failed.
#[derive(Debug, Clone)]
pub enum Attempt {
    /// The replica refused before or instead of executing.
    Refused(ReplicaFailure),
    /// The request never reached a replica (connect failed): safe to retry.
    NotSent(String),
    /// The request may have reached the replica and then the connection or
    /// the attempt timed out: a write's fate is unknown, a read can retry.
    Sent(String),
    /// The reply could not be decoded.
    Protocol(String),
}

impl Attempt {
    /// What this client could not use (its options, an address) as an
    /// invalid argument whose message says so once.
    pub(crate) fn not_usable(e: Error) -> Attempt {
        Attempt::Refused(ReplicaFailure::InvalidArgument(match e {
            Error::InvalidArgument(why) => why,
            other => other.to_string(),
        }))
    }
}

struct Peer {
    addr: String,
    channel: Channel,
    endpoint: Arc<Endpoint>,
}

impl Peer {
    fn new(addr: String, options: &ClientOptions) -> Result<Peer, Error> {
        let channel = channel(&addr, options)?;
        let user = crate::transport::Credentials::new(options)?;
        let endpoint = Arc::new(Endpoint::new(channel.clone(), options.call_stream, user));
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
pub struct Router {
    state: Mutex<State>,
    local: Option<Arc<dyn LocalReplica>>,
    options: ClientOptions,
}

/// Parse `host:port` (an optional `http://` or `https://` prefix is
/// accepted) into a lazy channel with `options`' connect timeout and TLS
/// (see [`latchkey_proto::channel`]).
pub fn channel(addr: &str, options: &ClientOptions) -> Result<Channel, Error> {
    latchkey_proto::channel(addr, options.connect_timeout, options.tls.as_ref()).map_err(
        |e| match e {
            latchkey_proto::ChannelError::BadEndpoint { endpoint, reason } => {
                Error::BadEndpoint { endpoint, reason }
            }
            latchkey_proto::ChannelError::NoRuntime => Error::NoRuntime,
            e @ latchkey_proto::ChannelError::Tls { .. } => Error::InvalidArgument(e.to_string()),
        },
    )
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

/// Classify a gRPC status from one attempt.
pub fn classify_status(status: &tonic::Status) -> Attempt {
    // With its causes: a TLS or connection failure names its reason only
    // in the error's sources.
    let text = format!("{}: {}", status.code(), latchkey_proto::error_chain(status));
    // Refused before anything ran: a request over the size limit, or one
    // without the credentials it needs. Resending it changes nothing.
    if matches!(
        status.code(),
        tonic::Code::OutOfRange | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    ) {
        return Attempt::Refused(ReplicaFailure::InvalidArgument(text));
    }
    if never_sent(status) {
        Attempt::NotSent(text)
    } else {
        Attempt::Sent(text)
    }
}

/// True when the error chain shows the connection was never established, so
/// the request cannot have reached the server.
fn never_sent(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    let mut chain = status.message().to_ascii_lowercase();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NotFound
            ) {
                return true;
            }
        }
        chain.push_str(&e.to_string().to_ascii_lowercase());
        source = e.source();
    }
    chain.contains("connect error") || chain.contains("connection refused")
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

    #[test]
    fn a_client_outside_a_runtime_is_an_error_not_a_panic() {
        assert!(matches!(
            channel("127.0.0.1:7101", &ClientOptions::default()),
            Err(Error::NoRuntime)
        ));
    }

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
        let client = crate::Client::with_options(["127.0.0.1:1"], forever);
        let client = match client {
            Ok(c) => c,
            Err(e) => panic!("a client with the longest timeouts: {e}"),
        };
        let call = tokio::time::timeout(Duration::from_millis(300), client.get("k")).await;
        assert!(call.is_err(), "still retrying: {call:?}");
    }

    #[tokio::test]
    async fn endpoints_are_validated() {
        let o = ClientOptions::default();
        assert!(matches!(channel("", &o), Err(Error::BadEndpoint { .. })));
        assert!(matches!(
            channel("localhost", &o),
            Err(Error::BadEndpoint { .. })
        ));
        assert!(matches!(
            channel("localhost:99999", &o),
            Err(Error::BadEndpoint { .. })
        ));
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
