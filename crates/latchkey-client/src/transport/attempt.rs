//! [`Attempt`] and [`Answer`]: what one attempt of a request came to, in
//! the words the router decides on (retry, follow a hint, give up, or end
//! with an unknown outcome). Both targets, the in-process replica and a
//! remote endpoint, answer in them; this module turns a gRPC status, a typed
//! reply or a reply's typed error into them.

use latchkey_core::{CommandError, CommandResult};
use latchkey_proto::v1::{self, call_reply::Reply as Rep};
use latchkey_proto::{wire, ReplicaFailure};

use crate::error::Error;

/// What one attempt answered.
pub(crate) type Answer = Result<CommandResult, Attempt>;

/// How one attempt failed.
#[derive(Debug, Clone)]
pub(crate) enum Attempt {
    /// The replica refused before or instead of executing.
    Refused(ReplicaFailure),
    /// The request never reached a replica (connect failed): safe to retry.
    NotSent(String),
    /// The request may have reached the replica and then the connection or
    /// the attempt timed out: a write's fate is unknown, a read can retry.
    Sent(String),
    /// The reply could not be decoded.
    Protocol(String),
}

impl Attempt {
    /// What this client could not use (its options, an address) as an
    /// invalid argument whose message says so once.
    pub(crate) fn not_usable(e: Error) -> Attempt {
        Attempt::Refused(ReplicaFailure::InvalidArgument(match e {
            Error::InvalidArgument(why) => why,
            other => other.to_string(),
        }))
    }
}

/// A typed reply as an attempt's answer.
pub(crate) fn decode(reply: Rep) -> Answer {
    wire::reply_from_wire(reply).map_err(Attempt::Refused)
}

/// The typed error of a reply: the replica's refusal to run it (the
/// attempt's outcome, which the router may retry), or the command's own
/// refusal (a permission denied, a missing user).
pub(crate) fn refused(error: Option<v1::Error>) -> Result<Result<(), CommandError>, Attempt> {
    match error.map(wire::error_from_wire) {
        None => Ok(Ok(())),
        Some(Err(failure)) => Err(Attempt::Refused(failure)),
        Some(Ok(command_error)) => Ok(Err(command_error)),
    }
}

/// Classify a gRPC status from one attempt.
pub(crate) fn classify_status(status: &tonic::Status) -> Attempt {
    // With its causes: a TLS or connection failure names its reason only
    // in the error's sources.
    let text = format!("{}: {}", status.code(), latchkey_proto::error_chain(status));
    // Refused before anything ran: a request over the size limit, or one
    // without the credentials it needs. Resending it changes nothing.
    if matches!(
        status.code(),
        tonic::Code::OutOfRange | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
    ) {
        return Attempt::Refused(ReplicaFailure::InvalidArgument(text));
    }
    if never_sent(status) {
        Attempt::NotSent(text)
    } else {
        Attempt::Sent(text)
    }
}

/// True when the error chain shows the connection was never established, so
/// the request cannot have reached the server.
fn never_sent(status: &tonic::Status) -> bool {
    if status.code() != tonic::Code::Unavailable {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    let mut chain = status.message().to_ascii_lowercase();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::NotFound
            ) {
                return true;
            }
        }
        chain.push_str(&e.to_string().to_ascii_lowercase());
        source = e.source();
    }
    chain.contains("connect error") || chain.contains("connection refused")
}
