//! The trait of the gates that keep their own state: [`FenceGate`].

use crate::error::FenceError;
use crate::rule::Admission;
#[cfg(doc)]
use crate::{FileFenceGate, MemoryFenceGate};

/// What a storage service asks before performing a fenced write.
///
/// A lease-based lock cannot stop a paused holder (GC pause, SIGSTOP,
/// partition) from acting after its lease ran out; only the resource can.
/// Every exclusive grant of a latchkey lock carries a fencing token, strictly
/// increasing across the cluster. A storage service that puts a
/// [`FenceGate`] in front of its writes remembers the highest token it has
/// seen per resource and refuses anything older: client 1 gets token 33 and
/// pauses, its lease expires, client 2 gets token 34 and writes; when client
/// 1 wakes and writes with 33, the gate has seen 34 and refuses.
///
/// A gate knows nothing of the network or of the lock API: a token is a
/// plain `u64`, a resource is any `&str` the storage service chooses (a
/// bucket, a file, a table row, usually the lock's name).
///
/// Implementations are shared between the threads serving writes, hence
/// `Send + Sync`.
///
/// # Rules
///
/// Every implementation of [`FenceGate`] follows these (the conformance
/// suite in `tests/conformance.rs` checks them, on the database gates too):
///
/// 1. **Per resource.** Each resource has its own highest token. Resource
///    names are compared byte for byte, without normalisation; any string,
///    including the empty one, is a valid name.
/// 2. **Zero is refused.** latchkey never issues token 0, so a 0 is a bug in
///    the caller (an unset default): [`FenceError::ZeroToken`].
/// 3. **Lower is refused.** A token lower than the highest seen for the
///    resource is refused with [`FenceError::Stale`]: a newer holder has
///    written and the caller must stop.
/// 4. **Equal is accepted.** The same holder writing again:
///    [`Admission::Repeated`]. Nothing changes and nothing is written.
/// 5. **Higher (or first) is accepted and recorded** before `admit`
///    returns: [`Admission::Raised`]. For a durable gate, recorded means
///    on disk.
/// 6. **Atomic per resource.** The comparison and the update happen as one
///    step: of concurrent admissions, every accepted token is at least every
///    token accepted before it, and the final highest is the largest
///    accepted token.
/// 7. **An error admits nothing.** Whatever the error, the gate's state is
///    unchanged and the caller must not perform the write.
/// 8. **Never forgets.** The highest token only grows; there is no expiry.
///    Forgetting a resource would readmit its stale writers.
///
/// The gate only enforces order: a writer whose token is the highest seen is
/// admitted even if its lock has since expired, until a newer holder writes.
/// That is what fencing promises; for a linearizable "is this grant still
/// current?" ask the cluster
/// (`Client::check_sequencer` in the client).
///
/// # Guarding a storage service
///
/// Admission and the write it guards must be one step per resource:
/// otherwise writer 33 could be admitted, writer 34 admitted and written,
/// and writer 33's write land last. Hold the resource's write lock across
/// both:
///
/// ```
/// use std::collections::HashMap;
/// use std::sync::Mutex;
///
/// use latchkey_fence::{FenceError, FenceGate, MemoryFenceGate};
///
/// /// A blob store that refuses writes from superseded lock holders.
/// struct BlobStore<G> {
///     gate: G,
///     blobs: Mutex<HashMap<String, Vec<u8>>>,
/// }
///
/// impl<G: FenceGate> BlobStore<G> {
///     /// `guard_token` is the fencing token of the writer's lock guard,
///     /// sent along with the request.
///     fn write(&self, resource: &str, guard_token: u64, data: &[u8]) -> Result<(), FenceError> {
///         // Admission and write under the same lock: no writer slips between.
///         let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
///         self.gate.admit(resource, guard_token)?;
///         blobs.insert(resource.to_owned(), data.to_vec());
///         Ok(())
///     }
/// }
///
/// # fn main() -> Result<(), FenceError> {
/// let store = BlobStore { gate: MemoryFenceGate::new(), blobs: Mutex::default() };
/// store.write("reports/q3", 33, b"draft by client 1")?; // client 1 holds token 33
/// // Client 1 pauses, its lease expires; client 2 acquires the lock (token 34).
/// store.write("reports/q3", 34, b"final by client 2")?;
/// // Client 1 wakes up and writes with its old token: refused.
/// let err = store.write("reports/q3", 33, b"late draft").unwrap_err();
/// assert!(matches!(err, FenceError::Stale { token: 33, highest: 34, .. }));
/// assert_eq!(
///     err.to_string(),
///     "token 33 is older than 34 already seen for resource \"reports/q3\": \
///      a newer lock holder has written; this writer must stop"
/// );
/// # Ok(()) }
/// ```
///
/// For a gate that remembers across restarts use [`FileFenceGate`]; a
/// storage service that restarts with an empty [`MemoryFenceGate`] would
/// readmit every stale writer. When the guarded storage is a SQL database,
/// do not put a [`FenceGate`] in front of it: use the database gates
/// (`PgFence`, `SqliteFence`), which check the token inside the write's own
/// transaction.
pub trait FenceGate: Send + Sync {
    /// Admit a write to `resource` carrying the fencing `token`.
    ///
    /// Accepts a token not lower than the highest seen for `resource` and
    /// records it as the new highest; refuses a lower one with
    /// [`FenceError::Stale`] and token 0 with [`FenceError::ZeroToken`].
    /// On any error nothing is recorded and the write must not happen.
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError>;

    /// The highest token admitted for `resource`, or `None` if none was.
    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError>;
}
