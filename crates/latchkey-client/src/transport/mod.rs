//! The bottom layer: how one attempt of a request reaches one remote
//! replica, and what it came to.
//!
//! - `attempt`: [`Attempt`] and [`Answer`], the words an attempt ends in,
//!   and the classification of a gRPC status, a typed reply or a reply's
//!   typed error into them;
//! - `credentials`: the call metadata naming who calls ([`Credentials`]);
//! - `call_stream`: a replica's long-lived `Pipeline.Calls` stream;
//! - `endpoint`: one remote replica ([`Endpoint`]: its channel, its call
//!   stream, unary RPCs when the stream is off) and how a client dials one
//!   ([`channel`]).
//!
//! Inside, `attempt` and `credentials` import no sibling, `call_stream`
//! imports those two, `endpoint` those three. Nothing here imports the
//! router or an API room: the router above picks which endpoint an attempt
//! goes to and decides what to do with its [`Answer`].

mod attempt;
mod call_stream;
mod credentials;
mod endpoint;

pub(crate) use attempt::{classify_status, refused, Answer, Attempt};
pub(crate) use credentials::{as_user, Credentials};
pub(crate) use endpoint::Endpoint;
pub use endpoint::{channel, TransportStats};
