//! The two gRPC listeners of a replica: the routers of the client and peer
//! services (with grpc.health.v1 and reflection on the client listener),
//! and serving each within its connection limits and TLS.

use std::sync::Arc;
use std::time::Duration;

use latchkey_proto::v1::{
    admin_server::AdminServer, auth_server::AuthServer, kv_server::KvServer,
    lock_server::LockServer, membership_server::MembershipServer, pipeline_server::PipelineServer,
    raft_server::RaftServer,
};
use latchkey_proto::MAX_REQUEST_BYTES;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::server::{Router, TcpIncoming};
use tonic_health::server::HealthReporter;

use crate::replica::Replica;
use crate::services::{
    AdminService, AuthService, KvService, LockService, MembershipService, PipelineService,
    RaftService,
};
use crate::watch_service::{WatchServer, WatchService};
use crate::{ClusterSecret, NodeError, MAX_MESSAGE_BYTES};

/// The client listener's services: `Kv`, `Pipeline`, `Lock`, `Admin`,
/// `Auth`, grpc.health.v1 (NOT_SERVING until the health watch says
/// otherwise; its reporter is returned) and reflection.
pub(super) async fn client_router(
    replica: &Arc<Replica>,
    streams_stopped: &watch::Receiver<bool>,
) -> Result<(Router, HealthReporter), NodeError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    crate::health_watch::report(&health_reporter, false).await;
    // Reflection in both protocol versions: grpc.reflection.v1 (grpcurl,
    // current tools) and v1alpha (what grpcio-reflection's Python
    // client and older tools speak).
    // Only the services of the client listener are advertised (the
    // descriptor set holds the peer ones too).
    let reflection_builder = || {
        [
            "latchkey.v1.Kv",
            "latchkey.v1.Watch",
            "latchkey.v1.Lock",
            "latchkey.v1.Pipeline",
            "latchkey.v1.Admin",
            "latchkey.v1.Auth",
            "grpc.health.v1.Health",
        ]
        .into_iter()
        .fold(
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(latchkey_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET),
            |builder, name| builder.with_service_name(name),
        )
    };
    let reflection = reflection_builder()
        .build_v1()
        .map_err(|e| NodeError::Config(format!("gRPC reflection: {e}")))?;
    let reflection_v1alpha = reflection_builder()
        .build_v1alpha()
        .map_err(|e| NodeError::Config(format!("gRPC reflection: {e}")))?;
    let router = base_server()
        .add_service(
            KvServer::new(KvService {
                replica: replica.clone(),
            })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(
            PipelineServer::new(PipelineService {
                replica: replica.clone(),
                stopping: streams_stopped.clone(),
            })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(WatchServer::new(
            WatchService {
                replica: replica.clone(),
                stopping: streams_stopped.clone(),
            },
            MAX_REQUEST_BYTES,
            MAX_MESSAGE_BYTES,
        ))
        .add_service(
            LockServer::new(LockService {
                replica: replica.clone(),
            })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(AdminServer::new(AdminService {
            replica: replica.clone(),
        }))
        .add_service(
            AuthServer::new(AuthService {
                replica: replica.clone(),
            })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
        )
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha);
    Ok((router, health_reporter))
}

/// The peer listener's services, `Raft` and `Membership`, every call
/// checked for the cluster's credentials (`crate::peer_auth::Check`).
pub(super) fn peer_router(
    replica: &Arc<Replica>,
    streams_stopped: &watch::Receiver<bool>,
    secret: Option<ClusterSecret>,
    tls: bool,
) -> Router {
    let check = crate::peer_auth::Check { secret, tls };
    base_server()
        .add_service(InterceptedService::new(
            RaftServer::new(RaftService {
                replica: replica.clone(),
                stopping: streams_stopped.clone(),
                tls,
            })
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
            check.clone(),
        ))
        .add_service(InterceptedService::new(
            MembershipServer::new(MembershipService {
                replica: replica.clone(),
            })
            .max_decoding_message_size(MAX_REQUEST_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES),
            check,
        ))
}

/// The connection limits each listener enforces (see `crate::conn_limit`),
/// and its TLS (see `crate::tls_accept`).
pub(super) struct Limits {
    pub(super) max_connections: usize,
    pub(super) max_connections_per_address: usize,
    pub(super) handshake_timeout: Duration,
    pub(super) tls: Option<Arc<rustls::ServerConfig>>,
}

/// The HTTP/2 settings both listeners share. (TLS is accepted before
/// tonic sees a connection, `crate::tls_accept`; on the peer listener,
/// calls without a client certificate are refused by `peer_auth::Check`.)
fn base_server() -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        // A connection whose peer stopped answering pings is closed.
        .http2_keepalive_timeout(Some(Duration::from_secs(20)))
        .max_concurrent_streams(crate::MAX_STREAMS_PER_CONNECTION)
}

/// Serve `router` on `listener` (within `limits`) in a task, until the
/// returned sender fires.
pub(super) fn spawn_serving(
    what: &'static str,
    router: Router,
    listener: std::net::TcpListener,
    limits: &Limits,
) -> Result<(oneshot::Sender<()>, JoinHandle<()>), NodeError> {
    let listener =
        tokio::net::TcpListener::from_std(listener).map_err(|e| NodeError::Io(e.to_string()))?;
    // With an incoming stream, tonic ignores the builder's tcp_nodelay:
    // set it on the stream, or Nagle + delayed ACKs add ~40 ms stalls to
    // replies (reads, lock hand-offs).
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let incoming = crate::conn_limit::limit(
        incoming,
        limits.max_connections,
        limits.max_connections_per_address,
        limits.handshake_timeout,
    );
    let (stop, stop_rx) = oneshot::channel::<()>();
    let stopped = async {
        let _ = stop_rx.await;
    };
    let report = move |result: Result<(), tonic::transport::Error>| {
        if let Err(e) = result {
            tracing::error!(listener = what, error = %e, "gRPC server stopped");
        }
    };
    let task = match &limits.tls {
        None => {
            let serving = router.serve_with_incoming_shutdown(incoming, stopped);
            tokio::spawn(async move { report(serving.await) })
        }
        Some(config) => {
            let incoming = crate::tls_accept::accept(
                incoming,
                Arc::clone(config),
                limits.handshake_timeout,
                limits.max_connections,
            );
            let serving = router.serve_with_incoming_shutdown(incoming, stopped);
            tokio::spawn(async move { report(serving.await) })
        }
    };
    Ok((stop, task))
}
