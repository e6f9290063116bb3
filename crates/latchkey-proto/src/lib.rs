//! # latchkey-proto
//!
//! The gRPC services and messages of latchkey, generated at build time from
//! `proto/latchkey.proto`. It holds no logic: conversion to and from the
//! core's types lives with the server and client.

#![allow(clippy::all, missing_docs)]

/// Version 1 of the latchkey protocol.
pub mod v1 {
    tonic::include_proto!("latchkey.v1");
}
