//! Running blocking RocksDB work (fsyncs, snapshot builds) off the async
//! executor, so a slow disk stalls one blocking thread, not Raft's tasks.

use crate::error::RaftStorageError;

/// Run `work` on tokio's blocking pool and wait for it.
pub(crate) async fn run<T, F>(work: F) -> Result<T, RaftStorageError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, RaftStorageError> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result,
        Err(join) => Err(std::io::Error::other(format!(
            "a blocking storage task failed: {join}"
        ))),
    }
}
