//! [`ClientOptions`]: how a client reaches the replicas (endpoints' TLS,
//! credentials, call streams) and how long it tries (timeouts, backoff).
//! Every layer reads them, so this module sits at the bottom with `error`:
//! it imports no other module of the client.

use std::time::Duration;

use latchkey_proto::TlsOptions;

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
    /// Make key-value writes retry-safe (default true): each is sent under
    /// a session the client opens on its first write and a request id, and
    /// resent until answered, so a leader change mid-write does not end in
    /// [`Error::UnknownOutcome`](crate::Error::UnknownOutcome) (see
    /// [`Client::execute`](crate::Client::execute)). Off, a write is sent
    /// once past the point where it may have been applied, and costs no
    /// session.
    pub retry_safe_writes: bool,
    /// The name every session this client opens carries, shown to
    /// operators by `latchkey sessions` ([`Client::sessions`](crate::Client::sessions)):
    /// control characters are dropped and it is cut to 256 bytes. Default: the program's name, its pid and the host
    /// name, as in `worker (pid 4242 on db-3)`.
    pub session_name: String,
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
            retry_safe_writes: true,
            session_name: default_session_name(),
        }
    }
}

/// `program (pid N on host)`, from what this process knows of itself
/// (the host name from Linux's `/proc`, left out elsewhere).
fn default_session_name() -> String {
    let program = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "latchkey client".to_string());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    let pid = std::process::id();
    fit_session_name(&match host {
        Some(host) => format!("{program} (pid {pid} on {host})"),
        None => format!("{program} (pid {pid})"),
    })
}

/// `name` as the cluster takes it: control characters dropped, cut to
/// [`MAX_SESSION_NAME_BYTES`](latchkey_core::limits::MAX_SESSION_NAME_BYTES)
/// on a character boundary.
pub(crate) fn fit_session_name(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars().filter(|c| !c.is_control()) {
        if out.len() + c.len_utf8() > latchkey_core::limits::MAX_SESSION_NAME_BYTES {
            break;
        }
        out.push(c);
    }
    out
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

    /// Set [`ClientOptions::session_name`].
    pub fn with_session_name(mut self, name: impl Into<String>) -> Self {
        self.session_name = name.into();
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

    /// Make key-value writes retry-safe or not
    /// ([`ClientOptions::retry_safe_writes`]).
    pub fn with_retry_safe_writes(mut self, retry_safe_writes: bool) -> Self {
        self.retry_safe_writes = retry_safe_writes;
        self
    }
}
