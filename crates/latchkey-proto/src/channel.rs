//! The one way either side opens a gRPC channel to a replica, with the
//! settings both use (TCP_NODELAY, HTTP/2 keep-alives, and TLS when given).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use crate::TlsOptions;

/// Why a channel could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The address is not `host:port`.
    #[error("bad endpoint {endpoint:?}: {reason}")]
    BadEndpoint {
        /// The address given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Called outside a Tokio runtime (tonic spawns the connection task at
    /// once).
    #[error("no Tokio runtime: call this from inside a Tokio runtime")]
    NoRuntime,
    /// The TLS settings could not be applied (a certificate or key rustls
    /// refuses).
    #[error("TLS settings for {endpoint}: {reason}")]
    Tls {
        /// The address given.
        endpoint: String,
        /// rustls's reason.
        reason: String,
    },
}

/// Parse `host:port` (an optional `http://` or `https://` prefix is
/// accepted) into a lazy channel that connects within `connect_timeout`,
/// over TLS when `tls` is given (the prefix does not decide: the options
/// do, so a configured client never falls back to plaintext).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// let second = Duration::from_secs(1);
/// assert!(latchkey_proto::channel("127.0.0.1:7101", second, None).is_ok());
/// assert!(latchkey_proto::channel("no-port", second, None).is_err());
/// # }
/// ```
pub fn channel(
    addr: &str,
    connect_timeout: Duration,
    tls: Option<&TlsOptions>,
) -> Result<Channel, ChannelError> {
    let bad = |reason: String| ChannelError::BadEndpoint {
        endpoint: addr.to_string(),
        reason,
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ChannelError::NoRuntime);
    }
    let trimmed = addr.trim();
    let host_port = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .unwrap_or(trimmed);
    if host_port.is_empty() {
        return Err(bad("empty address".into()));
    }
    let Some((host, port)) = host_port.rsplit_once(':') else {
        return Err(bad("expected host:port".into()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad("expected host:port with a port from 1 to 65535".into()));
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint =
        Endpoint::from_shared(format!("{scheme}://{host_port}")).map_err(|e| bad(e.to_string()))?;
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.client_config())
            .map_err(|e| ChannelError::Tls {
                endpoint: addr.to_string(),
                reason: error_chain(&e),
            })?;
    }
    let endpoint = endpoint
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    Ok(endpoint.connect_lazy())
}

/// `e` and its sources, joined: tonic's top-level messages ("transport
/// error") name no cause.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}
