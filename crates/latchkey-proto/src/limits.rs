//! Limits both sides of the wire enforce.

/// Largest gRPC message a replica or a client accepts or sends.
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Most calls in one `Pipeline.Calls` frame; a replica refuses a larger
/// frame whole (nothing executed, every call answered INVALID_ARGUMENT).
pub const MAX_FRAME_CALLS: usize = 1024;

/// Trailer metadata key a replica sets when it ends a `Pipeline.Calls`
/// stream because it is stopping, after answering every call it had read: a
/// call of that stream with no reply was never read, so never executed, and
/// is safe to send to another replica. A stream that ends any other way
/// leaves unanswered calls "may have been executed".
pub const STOPPED_AFTER_ANSWERING: &str = "latchkey-stopped-after-answering";
