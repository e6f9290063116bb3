//! The optional HTTP listener of a replica's metrics (`ServerBuilder::
//! metrics_listen`, `latchkey serve --metrics-listen`): `/metrics`,
//! `/healthz`, `/readyz` and the read-only status page at `/`
//! ([`crate::status_page`]), within connection caps (see the module docs
//! of [`crate::metrics`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::health::Condition;
use crate::replica::Replica;

use super::scrape::MetricsHandle;

/// Most connections the metrics listener holds open at once.
pub const MAX_CONNECTIONS: usize = 64;

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
    let page = Arc::new(crate::status_page::StatusPage::new(Arc::clone(&replica)));
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
                let page = Arc::clone(&page);
                async move {
                    (
                        [
                            (header::CONTENT_TYPE, "application/json"),
                            (header::CACHE_CONTROL, "no-store"),
                            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                            (header::CONTENT_SECURITY_POLICY, "default-src 'none'"),
                        ],
                        page.cached_json().await,
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
                    match crate::health_watch::readiness(replica.view(), replica.health()) {
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
