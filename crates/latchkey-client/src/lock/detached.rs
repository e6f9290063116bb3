//! Finishing a call the cluster must see through even when its caller
//! stops waiting: a release or a close marks its guard or session done
//! before it sends, so a caller that drops the future half-way (a timeout
//! around it, a `select!` that took another branch) would otherwise leave
//! the lock held, or the session open, until the session's TTL ran out.
//! Imports no sibling.

use std::future::Future;

use crate::error::Error;

/// Run `work` in a task of its own and wait for it: dropping the returned
/// future stops the waiting, not the work. Outside a Tokio runtime `work`
/// runs inline (there is nowhere to hand it to).
pub(super) async fn finish<T, F>(work: F) -> Result<T, Error>
where
    F: Future<Output = Result<T, Error>> + Send + 'static,
    T: Send + 'static,
{
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return work.await;
    };
    match runtime.spawn(work).await {
        Ok(result) => result,
        // The runtime is shutting down, or the task panicked: whether the
        // cluster applied the call is not known.
        Err(e) => Err(Error::UnknownOutcome(format!(
            "the task finishing the call stopped: {e}"
        ))),
    }
}
