//! The gRPC `Watch` service: reads the request and the caller, opens the
//! watch on the replica, and sends its messages in their typed form.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use latchkey_proto::v1::{self, watch_server::Watch};
use latchkey_proto::wire::{
    watch_error_to_wire, watch_message_to_wire, watch_request_from_wire, WatchError,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::replica::Replica;

/// The replies of a watch.
type WatchReplies = Pin<Box<dyn Stream<Item = Result<v1::WatchReply, Status>> + Send + 'static>>;

/// The `Watch` service (client listener).
pub struct WatchService {
    pub(crate) replica: Arc<Replica>,
    /// Turns true when the node stops: open watches end then (with
    /// `UNAVAILABLE`), so they do not hold up the graceful shutdown.
    pub(crate) stopping: watch::Receiver<bool>,
}

fn ended(e: WatchError) -> WatchReplies {
    let reply = v1::WatchReply {
        error: Some(watch_error_to_wire(e)),
        ..Default::default()
    };
    Box::pin(futures::stream::iter([Ok(reply)]))
}

#[tonic::async_trait]
impl Watch for WatchService {
    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<WatchReplies>, Status> {
        let caller = self
            .replica
            .authenticate(request.metadata(), request.peer_certs())
            .await?;
        let connection = request.remote_addr();
        let spec = match watch_request_from_wire(request.into_inner()) {
            Ok(spec) => spec,
            Err(invalid) => return Ok(Response::new(ended(invalid.into()))),
        };
        let stream = match self
            .replica
            .open_watch(spec, &caller, connection, Some(self.stopping.clone()))
            .await
        {
            Ok(stream) => stream,
            Err(e) => return Ok(Response::new(ended(e))),
        };
        Ok(Response::new(Box::pin(stream.map(|item| {
            Ok(match item {
                Ok(message) => watch_message_to_wire(message),
                Err(e) => v1::WatchReply {
                    error: Some(watch_error_to_wire(e)),
                    ..Default::default()
                },
            })
        }))))
    }
}
