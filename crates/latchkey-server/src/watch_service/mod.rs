//! The gRPC `Watch` service: reads the request and the caller, opens the
//! watch on the replica, and sends its deliveries as encoded `WatchReply`s.
//!
//! Served by hand ([`server::WatchServer`]), not by the generated server:
//! a record that goes whole to many watches is encoded once for all of
//! them (`crate::watch::Delivery`), and the generated server would encode
//! each watch's copy again. [`codec`] sends the bytes it is given.
//!
//! Rooms: `codec` and `server` (the route); `server` imports `codec` and
//! this file.

mod codec;
mod server;

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use latchkey_proto::v1;
use latchkey_proto::wire::{watch_error_to_wire, watch_request_from_wire, WatchError};
use prost::Message;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::replica::Replica;

pub(crate) use server::WatchServer;

/// The replies of a watch, each an encoded `WatchReply`.
type WatchReplies = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send + 'static>>;

/// The `Watch` service (client listener).
pub(crate) struct WatchService {
    pub(crate) replica: Arc<Replica>,
    /// Turns true when the node stops: open watches end then (with
    /// `UNAVAILABLE`), so they do not hold up the graceful shutdown.
    pub(crate) stopping: watch::Receiver<bool>,
}

/// The reply that ends a watch with `e`.
fn ending(e: WatchError) -> Bytes {
    let reply = v1::WatchReply {
        error: Some(watch_error_to_wire(e)),
        ..Default::default()
    };
    Bytes::from(reply.encode_to_vec())
}

fn ended(e: WatchError) -> WatchReplies {
    Box::pin(futures::stream::iter([Ok(ending(e))]))
}

impl WatchService {
    /// `latchkey.v1.Watch/Watch`.
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
        let deliveries = match self
            .replica
            .open_watch(spec, &caller, connection, Some(self.stopping.clone()))
            .await
        {
            Ok(deliveries) => deliveries,
            Err(e) => return Ok(Response::new(ended(e))),
        };
        Ok(Response::new(Box::pin(deliveries.map(|item| {
            Ok(match item {
                Ok(delivery) => delivery.into_wire(),
                Err(e) => ending(e),
            })
        }))))
    }
}
