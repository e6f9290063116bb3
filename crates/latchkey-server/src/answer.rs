//! [`answer`]: the one path of every typed client request that arrives over
//! gRPC, unary or on a `Pipeline.Calls` stream: decode, run on the replica,
//! count, encode.

use latchkey_proto::v1::{call::Request as Req, call_reply::Reply as Rep};
use latchkey_proto::{wire, Rpc};

use crate::auth::Caller;
use crate::replica::Replica;

/// Answer one typed client request: the one path of every unary client RPC
/// and of every call on a `Pipeline.Calls` stream. A request the schema
/// cannot express as an operation (a required field missing, an unknown
/// enum value) is answered with its INVALID_ARGUMENT error, having run
/// nothing.
pub(crate) async fn answer(replica: &Replica, caller: &Caller, request: Req) -> (Rpc, Rep) {
    let started = std::time::Instant::now();
    let rpc = Rpc::of(&request);
    let result = match wire::request_from_wire(request) {
        Ok((op, _)) => replica.call_as(op, caller).await,
        Err(refused) => Err(refused),
    };
    replica.metrics().request(
        rpc.name(),
        crate::metrics::outcome(&result),
        started.elapsed(),
    );
    (rpc, wire::reply_to_wire(rpc, result))
}
