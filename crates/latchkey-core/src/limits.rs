//! Size limits enforced on every command and query, by the client, by the
//! replica before proposing, and again by the state machine.

/// Longest key, in bytes. Keys must also be non-empty.
pub const MAX_KEY_LEN: usize = 4 * 1024;
/// Largest value, in bytes.
pub const MAX_VALUE_LEN: usize = 1024 * 1024;
/// Most operations (puts and deletes) in one batch.
pub const MAX_BATCH_OPS: usize = 1024;
/// Most conditions in one batch.
pub const MAX_BATCH_CONDITIONS: usize = 128;
/// Most keys in one multi-get.
pub const MAX_MULTI_GET: usize = 1024;
/// Most entries one scan returns; also the default when a scan asks for 0.
pub const MAX_SCAN_LIMIT: u32 = 10_000;
/// Largest total payload (keys + values) of one command, in bytes.
pub const MAX_COMMAND_BYTES: usize = 4 * 1024 * 1024;
