//! # latchkey-proto
//!
//! The contract between latchkey's clients and replicas, in one place: the
//! gRPC services and messages generated at build time from
//! `proto/latchkey.proto` (module [`v1`]), the one conversion between those
//! typed messages and the core's commands, queries and results ([`wire`]),
//! the limits both sides enforce ([`MAX_MESSAGE_BYTES`],
//! [`MAX_FRAME_CALLS`]), how a refusal is classified ([`ReplicaFailure`],
//! with its wire form), how either side opens a channel
//! ([`channel`]), what a replica reports about itself ([`NodeStatus`]), and
//! the trait by which a client reaches a replica in its own process
//! ([`LocalReplica`]).
//!
//! Both latchkey-server and latchkey-client depend on this crate; neither
//! depends on the other. It must not hold request handling, retry policy or
//! anything else one side decides alone, and it performs no I/O beyond
//! making a lazy channel.

#![warn(missing_docs)]

mod channel;
mod failure;
mod limits;
mod local;
mod status;
mod tls;
pub mod wire;

pub use channel::{channel, error_chain, ChannelError};
pub use failure::ReplicaFailure;
pub use limits::{
    CLUSTER_SECRET_HEADER, MAX_FRAME_CALLS, MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES, PASSWORD_HEADER,
    STOPPED_AFTER_ANSWERING, USER_HEADER,
};
pub use local::{BoxFuture, LocalReplica, WatchStream};
pub use status::{MemberInfo, NodeStatus};
pub use tls::{Identity, TlsError, TlsOptions};
pub use wire::{Operation, Rpc};

/// The encoded protobuf descriptors of `proto/latchkey.proto`, which a
/// replica serves through gRPC server reflection (so `grpcurl list` and
/// similar tools see every service and message).
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("latchkey_descriptor");

/// Version 1 of the latchkey protocol (generated code).
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("latchkey.v1");
}
