//! Serving a scripted fake replica on loopback, shared by the client tests
//! that script a replica's answers (`call_stream.rs`, `lease.rs`).

use latchkey_proto::v1::kv_server::{Kv, KvServer};
use latchkey_proto::v1::lock_server::{Lock, LockServer};
use latchkey_proto::v1::pipeline_server::{Pipeline, PipelineServer};
use tonic::transport::server::TcpIncoming;

/// Serve `pipeline`, `kv` and `lock` on a fresh loopback port: its
/// address, and the server's task (abort it to stop).
pub async fn serve(
    pipeline: impl Pipeline,
    kv: impl Kv,
    lock: impl Lock,
) -> Result<(String, tokio::task::JoinHandle<()>), std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(PipelineServer::new(pipeline))
        .add_service(KvServer::new(kv))
        .add_service(LockServer::new(lock))
        .serve_with_incoming(incoming);
    let handle = tokio::spawn(async move {
        let _ = server.await;
    });
    Ok((addr, handle))
}
