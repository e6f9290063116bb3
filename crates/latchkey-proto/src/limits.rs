//! Limits both sides of the wire enforce.

/// Largest gRPC message a replica or a client accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Most items in one `WriteMany`/`ReadMany` call or one `Calls` frame; a
/// replica refuses a larger one whole (nothing executed).
pub const MAX_BATCH_ITEMS: usize = 1024;

/// The message of the `INVALID_ARGUMENT` failure a replica answers to a
/// `Calls` call with no body (or a body it does not know); it ran nothing.
pub const UNKNOWN_CALL: &str = "a call without a body";

/// Trailer metadata key a replica sets when it ends a `Kv.Calls` stream
/// because it is stopping, after answering every call it had read: a call
/// of that stream with no reply was never read, so never executed, and is
/// safe to send to another replica. A stream that ends any other way leaves
/// unanswered calls "may have been executed".
pub const STOPPED_AFTER_ANSWERING: &str = "latchkey-stopped-after-answering";
