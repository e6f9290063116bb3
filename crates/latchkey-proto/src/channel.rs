//! The one way either side opens a gRPC channel to a replica, with the
//! settings both use (TCP_NODELAY, HTTP/2 keep-alives).

use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

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
}

/// Parse `host:port` (an optional `http://` prefix is accepted) into a lazy
/// channel that connects within `connect_timeout`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// assert!(latchkey_proto::channel("127.0.0.1:7101", Duration::from_secs(1)).is_ok());
/// assert!(latchkey_proto::channel("no-port", Duration::from_secs(1)).is_err());
/// # }
/// ```
pub fn channel(addr: &str, connect_timeout: Duration) -> Result<Channel, ChannelError> {
    let bad = |reason: String| ChannelError::BadEndpoint {
        endpoint: addr.to_string(),
        reason,
    };
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(ChannelError::NoRuntime);
    }
    let trimmed = addr.trim();
    let host_port = trimmed.strip_prefix("http://").unwrap_or(trimmed);
    if host_port.is_empty() {
        return Err(bad("empty address".into()));
    }
    let Some((host, port)) = host_port.rsplit_once(':') else {
        return Err(bad("expected host:port".into()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad("expected host:port with a port from 1 to 65535".into()));
    }
    let endpoint = Endpoint::from_shared(format!("http://{host_port}"))
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    Ok(endpoint.connect_lazy())
}
