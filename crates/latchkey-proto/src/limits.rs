//! Limits both sides of the wire enforce.

/// Largest gRPC message a replica or a client accepts or sends, except a
/// client's request (see [`MAX_REQUEST_BYTES`]): replies, and the replicas'
/// own Raft messages (log batches, snapshot chunks).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Largest client request a replica accepts: one unary call of `Kv` or
/// `Lock`, or one `Pipeline.Calls` frame. Every valid command or query fits
/// (commands are at most [`latchkey_core::limits::MAX_COMMAND_BYTES`] of
/// keys and values; the rest is field tags and lengths). A larger message is
/// refused from its gRPC length prefix, before it is read or decoded, with
/// `OUT_OF_RANGE` ("decoded message length too large"), so a stranger cannot
/// make a replica buffer and decode 64 MiB to find out it is too big.
pub const MAX_REQUEST_BYTES: usize = latchkey_core::limits::MAX_COMMAND_BYTES + 64 * 1024;

/// Most calls in one `Pipeline.Calls` frame; a replica refuses a larger
/// frame whole (nothing executed, every call answered INVALID_ARGUMENT).
pub const MAX_FRAME_CALLS: usize = 1024;

/// Trailer metadata key a replica sets when it ends a `Pipeline.Calls`
/// stream because it is stopping, after answering every call it had read: a
/// call of that stream with no reply was never read, so never executed, and
/// is safe to send to another replica. A stream that ends any other way
/// leaves unanswered calls "may have been executed".
pub const STOPPED_AFTER_ANSWERING: &str = "latchkey-stopped-after-answering";

/// Metadata key carrying the cluster secret: on every call to a replica's
/// peer listener (Raft, and the `Membership` service), which a replica with
/// a cluster secret refuses without it.
pub const CLUSTER_SECRET_HEADER: &str = "latchkey-cluster-secret";

/// Metadata key naming the user a client call is made as (access control,
/// see the `Auth` service).
pub const USER_HEADER: &str = "latchkey-user";

/// Metadata key carrying the password of [`USER_HEADER`]'s user.
pub const PASSWORD_HEADER: &str = "latchkey-password";
