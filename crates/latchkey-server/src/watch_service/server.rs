//! [`WatchServer`]: the route of the `latchkey.v1.Watch` service, as the
//! generated server would answer it (the same path and message limits;
//! `UNIMPLEMENTED` for any other method), with [`WatchCodec`].

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use latchkey_proto::v1;
use tonic::body::Body;
use tonic::codegen::{http, Body as HttpBody, Service, StdError};
use tonic::server::{Grpc, NamedService, ServerStreamingService};
use tonic::{Request, Response, Status};

use super::codec::WatchCodec;
use super::{WatchReplies, WatchService};

/// The path of the one method.
const WATCH: &str = "/latchkey.v1.Watch/Watch";

/// The `Watch` service as the client listener serves it.
#[derive(Clone)]
pub(crate) struct WatchServer {
    service: Arc<WatchService>,
    max_decoding: usize,
    max_encoding: usize,
}

impl WatchServer {
    /// Serve `service`, refusing requests over `max_decoding` bytes and
    /// replies over `max_encoding`.
    pub(crate) fn new(service: WatchService, max_decoding: usize, max_encoding: usize) -> Self {
        WatchServer {
            service: Arc::new(service),
            max_decoding,
            max_encoding,
        }
    }
}

impl NamedService for WatchServer {
    const NAME: &'static str = "latchkey.v1.Watch";
}

/// The one method, as tonic calls it.
struct Method(Arc<WatchService>);

impl ServerStreamingService<v1::WatchRequest> for Method {
    type Response = bytes::Bytes;
    type ResponseStream = WatchReplies;
    type Future = Pin<Box<dyn Future<Output = Result<Response<WatchReplies>, Status>> + Send>>;

    fn call(&mut self, request: Request<v1::WatchRequest>) -> Self::Future {
        let service = Arc::clone(&self.0);
        Box::pin(async move { service.watch(request).await })
    }
}

impl<B> Service<http::Request<B>> for WatchServer
where
    B: HttpBody + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != WATCH {
            return Box::pin(async {
                Ok(Status::unimplemented("latchkey.v1.Watch has one method: Watch").into_http())
            });
        }
        let method = Method(Arc::clone(&self.service));
        let limits = (Some(self.max_decoding), Some(self.max_encoding));
        Box::pin(async move {
            let mut grpc = Grpc::new(WatchCodec).apply_max_message_size_config(limits.0, limits.1);
            Ok(grpc.server_streaming(method, request).await)
        })
    }
}
