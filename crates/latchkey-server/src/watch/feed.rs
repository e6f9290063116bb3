//! The feed task: reads each record the state machine commits, once, and
//! hands it to every watch of the replica.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::delivery::Published;
use super::hub::{Feed, WatchHub};

/// Records read from the history at once.
const CHUNK: usize = 256;
/// Bytes of records read from the history at once (at least one record).
const CHUNK_BYTES: usize = 8 * 1024 * 1024;
/// How long to wait before reading again after a failed read.
const RETRY: Duration = Duration::from_millis(100);

/// Follow `revisions` (the state machine's committed revision) from where
/// [`WatchHub::start_at`] put the hub until it ends or the replica's reader
/// is gone, then end every watch.
pub(crate) async fn run(hub: Arc<WatchHub>, mut revisions: watch::Receiver<u64>) {
    let mut published = *hub.published().borrow();
    loop {
        let target = *revisions.borrow_and_update();
        while published < target {
            let from = published + 1;
            let (window, records) = match hub.history(from, CHUNK, CHUNK_BYTES) {
                Ok(read) => read,
                Err(e) => {
                    if hub.is_stopped() {
                        tracing::debug!("watch feed stops: {e}");
                        hub.close();
                        return;
                    }
                    tracing::warn!("watch feed cannot read the history: {e}");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if records.is_empty() && window.current < from {
                // Not readable yet: wait for the next change.
                break;
            }
            if window.oldest <= from && records.first().map(|r| r.revision) != Some(from) {
                // A record missing inside the window: the store is damaged.
                tracing::error!(
                    from,
                    ?window,
                    "the watch history lacks a record it should hold"
                );
                tokio::time::sleep(RETRY).await;
                continue;
            }
            if records.first().map(|r| r.revision) != Some(from) {
                // The history starts later than the feed got to (a snapshot
                // replaced the state, or a burst of writes compacted past
                // the feed): those revisions will never come.
                let oldest = window.oldest.max(from);
                tracing::info!(from, oldest, "the watch history starts after the feed");
                hub.publish(Feed::Gap { oldest }, oldest - 1);
                published = oldest - 1;
                continue;
            }
            for record in records {
                let revision = record.revision;
                hub.publish(Feed::Record(Published::new(record)), revision);
                published = revision;
            }
        }
        if revisions.changed().await.is_err() {
            break;
        }
    }
    tracing::debug!("watch feed stops: the state machine is gone");
    hub.close();
}
