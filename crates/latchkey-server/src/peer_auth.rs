//! Peers prove they belong: the cluster secret on every call to the peer
//! listener.
//!
//! The peer listener serves only the `Raft` service (AppendEntries, Vote,
//! InstallSnapshot, Identify) and `Membership` (membership changes); client
//! services are on another listener and never reach either. Every call there
//! carries the cluster's shared secret in the [`PEER_SECRET_HEADER`]
//! metadata, and a replica configured with a secret refuses
//! (UNAUTHENTICATED, before reading the message) a call without it or with
//! another one. So a stranger who can reach the port cannot forge a
//! vote (which would make the leader step down and the term jump) or an
//! AppendEntries (which carries log entries). On top of that, the Raft
//! service refuses messages from node ids its membership does not hold
//! (`services::RaftService`).
//!
//! The secret travels as a header, so on a network that others can read it
//! protects only as much as the network does. With TLS ([`ServerTls`]) the
//! header is encrypted, and peers authenticate each other with
//! certificates as well: a replica presents its own certificate when it
//! calls a peer, and its peer listener refuses calls that come without a
//! client certificate signed by the cluster's CA (UNAUTHENTICATED, with a
//! message that says so: refusing in the TLS handshake would leave the
//! caller with only "connection closed"). The certificate also names the node: a Raft call
//! that says it comes from node N must present a certificate valid for the
//! DNS name [`peer_certificate_name`]`(N)` (`latchkey-node-N`), or it is
//! refused (PERMISSION_DENIED), so a replica cannot speak for another even
//! with a valid certificate of the cluster's CA. `latchkey certs` puts that
//! name in node certificates; with another CA, add it as a DNS subject
//! alternative name. A replica started without a secret
//! accepts unauthenticated peer calls and says so in a warning at start.
//!
//! The comparison takes the same time wherever the secrets differ, so the
//! secret cannot be guessed byte by byte from response times.

use std::sync::Arc;

use latchkey_proto::v1::raft_client::RaftClient;
use latchkey_proto::{ChannelError, Identity, TlsError, TlsOptions};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::transport::Channel;
use tonic::{Request, Status};

use crate::log_limit::LogLimit;
use crate::{NodeError, MAX_MESSAGE_BYTES};

/// The metadata key that carries the cluster secret on peer calls (and on
/// membership changes).
pub const PEER_SECRET_HEADER: &str = latchkey_proto::CLUSTER_SECRET_HEADER;

/// Shortest secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// Longest secret accepted, in bytes.
pub const MAX_SECRET_LEN: usize = 256;

/// The secret every replica of a cluster shares (see the module docs).
///
/// 16 to 256 visible ASCII characters (no spaces). Generate one with, for
/// example, `head -c 32 /dev/urandom | base64`. Its `Debug` form does not
/// show it.
///
/// ```
/// use latchkey_server::ClusterSecret;
/// let secret = ClusterSecret::new("9f1c2a7e4b6d8c0e1f3a5b7c9d2e4f60").expect("a valid secret");
/// assert!(ClusterSecret::new("short").is_err());
/// # let _ = secret;
/// ```
#[derive(Clone)]
pub struct ClusterSecret {
    value: MetadataValue<Ascii>,
}

impl std::fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterSecret(..)")
    }
}

impl ClusterSecret {
    /// A secret from its text; surrounding whitespace (a file's final
    /// newline) is ignored.
    pub fn new(text: &str) -> Result<ClusterSecret, NodeError> {
        let text = text.trim();
        if !(MIN_SECRET_LEN..=MAX_SECRET_LEN).contains(&text.len()) {
            return Err(NodeError::Config(format!(
                "the cluster secret is {} bytes; it must be {MIN_SECRET_LEN} to \
                 {MAX_SECRET_LEN} (generate one with `head -c 32 /dev/urandom | base64`)",
                text.len()
            )));
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(NodeError::Config(
                "the cluster secret must be visible ASCII characters, without spaces".into(),
            ));
        }
        let value = MetadataValue::try_from(text).map_err(|e| {
            NodeError::Config(format!(
                "the cluster secret is not a valid header value: {e}"
            ))
        })?;
        Ok(ClusterSecret { value })
    }

    /// The secret in the file at `path` (its whole content, trimmed).
    pub fn from_file(path: &std::path::Path) -> Result<ClusterSecret, NodeError> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            NodeError::Config(format!(
                "cannot read the cluster secret file {}: {e}",
                path.display()
            ))
        })?;
        ClusterSecret::new(&text)
    }

    /// The secret's text, to hand to a client that changes membership
    /// (`ClientOptions::with_cluster_secret`).
    pub fn as_str(&self) -> &str {
        // Built from a `&str` of visible ASCII, so this cannot fail.
        self.value.to_str().unwrap_or_default()
    }

    pub(crate) fn matches(&self, offered: &[u8]) -> bool {
        constant_time_eq(self.value.as_bytes(), offered)
    }
}

/// Equal contents, compared in time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// TLS for a replica: its certificate (served to clients and peers, and
/// presented to peers when it calls them), the CA whose certificates it
/// trusts (its peers', and clients' when they present one), and whether
/// clients must present one.
///
/// ```no_run
/// use std::path::Path;
/// use latchkey_server::ServerTls;
///
/// # fn demo() -> Result<(), latchkey_proto::TlsError> {
/// let tls = ServerTls::from_files(
///     Path::new("certs/node-1.pem"),
///     Path::new("certs/node-1-key.pem"),
///     Path::new("certs/ca.pem"),
/// )?
/// .require_client_certificate(true);
/// # let _ = tls; Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ServerTls {
    identity: Identity,
    trust: TlsOptions,
    require_client_certificate: bool,
    certificate_users: bool,
}

impl ServerTls {
    /// Serve `identity`; trust the CA of `trust` for peers and clients.
    pub fn new(identity: Identity, trust: TlsOptions) -> ServerTls {
        ServerTls {
            identity,
            trust,
            require_client_certificate: false,
            certificate_users: false,
        }
    }

    /// Read and check the replica's certificate, its key and the CA.
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        ca: &std::path::Path,
    ) -> Result<ServerTls, TlsError> {
        Ok(ServerTls::new(
            Identity::from_files(cert, key)?,
            TlsOptions::from_files(ca, None)?,
        ))
    }

    /// Refuse the TLS handshake of clients without a certificate signed by
    /// the CA (default: a client certificate is optional for clients, and
    /// always required for peer calls).
    pub fn require_client_certificate(mut self, required: bool) -> ServerTls {
        self.require_client_certificate = required;
        self
    }

    /// Take a call that names no user and carries no cluster secret as
    /// made by the user its client certificate's common name names, if
    /// that user exists (default: off; such calls are anonymous). See
    /// `latchkey_server::auth`. Every certificate the CA signs then logs
    /// its CN's user in, root included, whatever that user's password: use
    /// a CA that signs for this cluster only, and revoke a certificate by
    /// deleting its user (or by replacing the CA), since changing the
    /// password does not.
    pub fn certificate_users(mut self, enabled: bool) -> ServerTls {
        self.certificate_users = enabled;
        self
    }

    /// Whether client certificates name users
    /// ([`ServerTls::certificate_users`]).
    pub fn names_certificate_users(&self) -> bool {
        self.certificate_users
    }

    /// The replica's certificate and key.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The CA trusted for clients' and peers' certificates.
    pub fn trust(&self) -> &TlsOptions {
        &self.trust
    }

    /// Whether clients without a certificate are refused at the handshake.
    pub fn requires_client_certificate(&self) -> bool {
        self.require_client_certificate
    }

    /// What this replica uses to call its peers, and what its in-process
    /// client uses: the same CA, and its own certificate.
    pub fn client_options(&self) -> TlsOptions {
        self.trust.clone().with_identity(self.identity.clone())
    }
}

/// The DNS name node `id`'s certificate must hold for the node to make Raft
/// calls to a replica with TLS (see the module docs).
///
/// ```
/// assert_eq!(latchkey_server::peer_certificate_name(3), "latchkey-node-3");
/// ```
pub fn peer_certificate_name(id: u64) -> String {
    format!("latchkey-node-{id}")
}

/// Refuse a Raft call that says it comes from node `from_id` unless its
/// client certificate (the first of `certs`, verified against the CA during
/// the handshake) is valid for [`peer_certificate_name`]`(from_id)`.
pub(crate) fn check_certificate_names(
    certs: Option<&[tonic::transport::CertificateDer<'static>]>,
    from_id: u64,
) -> Result<(), Status> {
    let name = peer_certificate_name(from_id);
    let Some(leaf) = certs.and_then(<[_]>::first) else {
        return Err(Status::unauthenticated(
            "Raft calls need a client certificate signed by the cluster's CA",
        ));
    };
    let refused = || {
        Status::permission_denied(format!(
            "the caller's certificate does not name {name}: a Raft call from node {from_id} \
             must present node {from_id}'s certificate"
        ))
    };
    let server_name = rustls_pki_types::ServerName::try_from(name.as_str())
        .map_err(|_| refused())?
        .to_owned();
    let cert = webpki::EndEntityCert::try_from(leaf).map_err(|_| refused())?;
    cert.verify_is_valid_for_subject_name(&server_name)
        .map_err(|_| refused())
}

/// What a replica proves itself with when it calls a peer: the cluster
/// secret, and with TLS its certificate. Every peer channel is made here.
#[derive(Clone, Debug, Default)]
pub(crate) struct PeerCredentials {
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) tls: Option<TlsOptions>,
}

impl PeerCredentials {
    /// A lazy channel to the peer at `addr`.
    pub(crate) fn channel(&self, addr: &str) -> Result<Channel, ChannelError> {
        latchkey_proto::channel(addr, crate::PEER_CONNECT_TIMEOUT, self.tls.as_ref())
    }

    /// A Raft client on `channel` whose calls carry the secret.
    pub(crate) fn client(&self, channel: Channel) -> PeerClient {
        peer_client(channel, self.secret.clone())
    }
}

/// Adds the secret (if any) to every outgoing peer call.
#[derive(Clone, Debug)]
pub(crate) struct Attach(Option<ClusterSecret>);

impl Interceptor for Attach {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(secret) = &self.0 {
            request
                .metadata_mut()
                .insert(PEER_SECRET_HEADER, secret.value.clone());
        }
        Ok(request)
    }
}

/// A Raft client to a peer whose calls carry `secret`.
pub(crate) type PeerClient = RaftClient<InterceptedService<Channel, Attach>>;

/// A Raft client on `channel` whose calls carry `secret`.
pub(crate) fn peer_client(channel: Channel, secret: Option<ClusterSecret>) -> PeerClient {
    RaftClient::with_interceptor(channel, Attach(secret))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES)
}

/// Refuses incoming peer calls without the secret (when one is set), and
/// with TLS on, without a client certificate.
#[derive(Clone, Debug)]
pub(crate) struct Check {
    pub(crate) secret: Option<ClusterSecret>,
    pub(crate) tls: bool,
}

/// Whether the call came over TLS with a verified client certificate
/// (rustls checked it against the CA during the handshake).
fn has_client_certificate<T>(request: &Request<T>) -> bool {
    request.peer_certs().is_some_and(|certs| !certs.is_empty())
}

impl Interceptor for Check {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.tls && !has_client_certificate(&request) {
            let from = request
                .remote_addr()
                .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
            log_refusal("a peer call without a client certificate", &from);
            return Err(Status::unauthenticated(
                "peer calls (Raft, membership changes) need a client certificate signed by the \
                 cluster's CA: a replica's --cert and --key, or the CLI's",
            ));
        }
        let Some(secret) = &self.secret else {
            return Ok(request);
        };
        let why = match request.metadata().get(PEER_SECRET_HEADER) {
            Some(offered) if secret.matches(offered.as_bytes()) => return Ok(request),
            Some(_) => "a peer call with the wrong cluster secret",
            None => "a peer call without the cluster secret",
        };
        let from = request
            .remote_addr()
            .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
        log_refusal(why, &from);
        Err(Status::unauthenticated(format!(
            "{why}: this replica's peer listener accepts calls only from members of its \
             cluster and operators who hold its --cluster-secret-file (the CLI's \
             --cluster-secret-file, ClientOptions::with_cluster_secret)"
        )))
    }
}

/// Refusals are logged at most every 10 s.
static LAST_LOGGED: LogLimit = LogLimit::new();

/// Log a refused peer call, at most one line every 10 seconds (a flood of
/// forged calls must not become a flood of log lines).
fn log_refusal(why: &str, from: &str) {
    if LAST_LOGGED.allow() {
        tracing::warn!(%from, "refused {why} (further refusals are logged at most every 10 s)");
    }
}

/// Shared peer credentials, for the places that make peer clients.
pub(crate) type SharedCredentials = Arc<PeerCredentials>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked_for_length_and_characters() {
        assert!(ClusterSecret::new("0123456789abcdef").is_ok());
        assert!(ClusterSecret::new("  0123456789abcdef\n").is_ok());
        assert!(ClusterSecret::new("0123456789abcde").is_err());
        assert!(ClusterSecret::new(&"x".repeat(MAX_SECRET_LEN + 1)).is_err());
        assert!(ClusterSecret::new("0123456789 abcdef").is_err());
        assert!(ClusterSecret::new("0123456789abcdéf").is_err());
    }

    #[test]
    fn only_the_same_secret_passes() {
        let secret = ClusterSecret::new("0123456789abcdef").expect("valid");
        let mut check = Check {
            secret: Some(secret.clone()),
            tls: false,
        };
        let mut attach = Attach(Some(secret));
        let signed = attach.call(Request::new(())).expect("attached");
        assert!(check.call(signed).is_ok());
        assert_eq!(
            check
                .call(Request::new(()))
                .map(|_| ())
                .map_err(|s| s.code()),
            Err(tonic::Code::Unauthenticated)
        );
        let other = ClusterSecret::new("0123456789abcdeX").expect("valid");
        let forged = Attach(Some(other))
            .call(Request::new(()))
            .expect("attached");
        assert_eq!(
            check.call(forged).map(|_| ()).map_err(|s| s.code()),
            Err(tonic::Code::Unauthenticated)
        );
        // Without a secret configured, nothing is checked.
        let mut open = Check {
            secret: None,
            tls: false,
        };
        assert!(open.call(Request::new(())).is_ok());
        // With TLS on, a call without a verified client certificate is
        // refused whatever its secret.
        let mut tls = Check {
            secret: None,
            tls: true,
        };
        assert_eq!(
            tls.call(Request::new(())).map(|_| ()).map_err(|s| s.code()),
            Err(tonic::Code::Unauthenticated)
        );
    }

    #[test]
    fn comparison_needs_equal_length_and_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn debug_does_not_show_the_secret() {
        let secret = ClusterSecret::new("0123456789abcdef").expect("valid");
        assert!(!format!("{secret:?}").contains("0123"));
    }
}
