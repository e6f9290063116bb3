//! Peers prove they belong: the cluster secret on every replica-to-replica
//! call.
//!
//! Every call of the `Raft` service (AppendEntries, Vote, InstallSnapshot,
//! Identify) carries the cluster's shared secret in the
//! [`PEER_SECRET_HEADER`] metadata, and a replica configured with a secret
//! refuses (UNAUTHENTICATED, before reading the message) a call without it
//! or with another one. So a stranger who can reach the port cannot forge a
//! vote (which would make the leader step down and the term jump) or an
//! AppendEntries (which carries log entries). On top of that, the Raft
//! service refuses messages from node ids its membership does not hold
//! (`services::RaftService`).
//!
//! The secret travels as a header, so on a network that others can read it
//! protects only as much as the network does: it is meant for loopback and
//! trusted networks; mutual TLS between peers replaces it elsewhere (issue
//! 17, not done yet). A replica started without a secret accepts
//! unauthenticated peer calls and says so in a warning at start.
//!
//! The comparison takes the same time wherever the secrets differ, so the
//! secret cannot be guessed byte by byte from response times.

use std::sync::Arc;

use latchkey_proto::v1::raft_client::RaftClient;
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

    fn matches(&self, offered: &[u8]) -> bool {
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

/// Refuses incoming peer calls without the secret (when one is set).
#[derive(Clone, Debug)]
pub(crate) struct Check(pub(crate) Option<ClusterSecret>);

impl Interceptor for Check {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(secret) = &self.0 else {
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
            "{why}: this replica accepts Raft calls only from members of its cluster, \
             which share its --cluster-secret-file"
        )))
    }
}

/// Refuse a membership change (`Admin.AddMember`, `Admin.ChangeVoters`)
/// that does not carry the cluster secret, when this replica has one: until
/// access control exists, changing who is in the cluster takes what a peer
/// takes.
pub(crate) fn require_for_admin(
    secret: &Option<ClusterSecret>,
    metadata: &tonic::metadata::MetadataMap,
) -> Result<(), Status> {
    let Some(secret) = secret else {
        return Ok(());
    };
    match metadata.get(PEER_SECRET_HEADER) {
        Some(offered) if secret.matches(offered.as_bytes()) => Ok(()),
        _ => Err(Status::unauthenticated(
            "membership changes need the cluster secret: pass the replicas' \
             --cluster-secret-file to the CLI (or ClientOptions::with_cluster_secret)",
        )),
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

/// A shared, optional secret, for the places that make peer clients.
pub(crate) type SharedSecret = Arc<Option<ClusterSecret>>;

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
        let mut check = Check(Some(secret.clone()));
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
        assert!(Check(None).call(Request::new(())).is_ok());
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
