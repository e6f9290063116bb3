//! One watch: its history first, then the feed, into a bounded queue that
//! its caller drains.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use latchkey_proto::wire::{WatchError, WatchMessage, WatchSpec};
use latchkey_proto::ReplicaFailure;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;

use super::delivery::{changes_message, Deliveries, Delivery, Published};
use super::hub::{Feed, Registration, WatchHub};

/// Messages queued for one watch's caller.
pub(crate) const BUFFER: usize = 64;
/// How long a watch waits for its caller to make room in a full queue
/// before it ends with `TooSlow`.
pub(crate) const SLOW_AFTER: Duration = Duration::from_secs(5);
/// How long a watch from a revision this replica has not reached yet
/// waits for it (a follower a little behind the replica the caller saw it
/// at) before it is refused as in the future.
const FUTURE_WAIT: Duration = Duration::from_secs(5);
/// Records read from the history at once while catching up.
const CHUNK: usize = 128;
/// Bytes of records read from the history at once (at least one record).
const CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// How a watch stops.
enum Stop {
    /// Its caller went away.
    Gone,
    /// It ends with this error.
    End(WatchError),
}

impl From<WatchError> for Stop {
    fn from(e: WatchError) -> Self {
        Stop::End(e)
    }
}

/// Open a watch for a caller on `connection` (`None`: in-process). Refused
/// at once when too many are open. The watch ends when `stopping` turns
/// true or is dropped (the gRPC server stops), when the feed stops (the
/// replica shuts down), when its caller drops the stream, or with an
/// error.
pub(crate) fn start(
    hub: &Arc<WatchHub>,
    spec: WatchSpec,
    connection: Option<SocketAddr>,
    stopping: Option<watch::Receiver<bool>>,
) -> Result<Deliveries, WatchError> {
    let registration = hub.register(connection)?;
    let (feed, published) = hub.subscribe()?;
    let (out, messages) = mpsc::channel(BUFFER);
    let (end, ended) = oneshot::channel();
    let task = Watch {
        hub: Arc::clone(hub),
        spec,
        out,
        feed,
        stopping,
        _registration: registration,
    };
    tokio::spawn(async move {
        if let Err(Stop::End(e)) = task.run(published).await {
            let _ = end.send(e);
        }
    });
    let messages = tokio_stream::wrappers::ReceiverStream::new(messages).map(Ok);
    let end = futures::stream::once(ended).filter_map(|e| async move { e.ok().map(Err) });
    Ok(Box::pin(messages.chain(end)))
}

struct Watch {
    hub: Arc<WatchHub>,
    spec: WatchSpec,
    out: mpsc::Sender<Delivery>,
    feed: broadcast::Receiver<Feed>,
    stopping: Option<watch::Receiver<bool>>,
    _registration: Registration,
}

/// Wait until `stopping` turns true or its sender is gone; never without
/// one.
async fn stopped(stopping: &mut Option<watch::Receiver<bool>>) {
    match stopping {
        Some(rx) => {
            let _ = rx.wait_for(|stop| *stop).await;
        }
        None => std::future::pending().await,
    }
}

impl Watch {
    async fn run(mut self, published: u64) -> Result<(), Stop> {
        let (window, _) = self.hub.history(u64::MAX, 0, 0)?;
        let start = self.spec.start_revision.unwrap_or(published + 1);
        if start < window.oldest {
            return Err(WatchError::Compacted {
                requested: start,
                oldest: window.oldest,
            }
            .into());
        }
        if start > published + 1 {
            self.wait_for(start - 1).await?;
        }
        let mut next = start;
        self.send(WatchMessage::Progress {
            revision: next - 1,
            behind: self.hub.behind(),
        })
        .await?;
        let mut quiet_until = Instant::now() + self.spec.progress;
        // What the ring holds starts after `published`.
        next = self.catch_up(next, published, &mut quiet_until).await?;
        loop {
            tokio::select! {
                biased;
                _ = stopped(&mut self.stopping) => return Err(stopping(next).into()),
                _ = self.out.closed() => return Err(Stop::Gone),
                feed = self.feed.recv() => match feed {
                    Ok(Feed::Record(published)) => {
                        let revision = published.record().revision;
                        if revision < next {
                            continue;
                        }
                        if revision > next {
                            self.catch_up(next, revision - 1, &mut quiet_until).await?;
                        }
                        let delivered = self.deliver(&published).await?;
                        next = revision + 1;
                        if delivered {
                            quiet_until = Instant::now() + self.spec.progress;
                        } else {
                            // A feed that is never empty (this watch behind
                            // a busy replica, taking little of it) would
                            // otherwise keep the timer below from firing.
                            self.progress_if_due(next, &mut quiet_until).await?;
                        }
                    }
                    Ok(Feed::Gap { oldest }) => {
                        if next < oldest {
                            return Err(WatchError::Compacted { requested: next, oldest }.into());
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        return Err(WatchError::TooSlow { resume_from: next }.into())
                    }
                    Err(RecvError::Closed) => return Err(stopping(next).into()),
                },
                _ = tokio::time::sleep_until(quiet_until) => {
                    self.send(WatchMessage::Progress {
                        revision: next - 1,
                        behind: self.hub.behind(),
                    })
                    .await?;
                    quiet_until = Instant::now() + self.spec.progress;
                }
            }
        }
    }

    /// Wait until the feed has reached `revision`; refuse it as in the
    /// future if it does not within [`FUTURE_WAIT`].
    async fn wait_for(&self, revision: u64) -> Result<(), Stop> {
        let mut published = self.hub.published();
        let reached = tokio::time::timeout(FUTURE_WAIT, async {
            published.wait_for(|p| *p >= revision).await.map(|_| ())
        })
        .await;
        match reached {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(stopping(revision + 1).into()),
            Err(_) => {
                let (window, _) = self.hub.history(u64::MAX, 0, 0)?;
                Err(WatchError::FutureRevision {
                    requested: revision + 1,
                    next: window.current + 1,
                }
                .into())
            }
        }
    }

    /// Send a progress notice for everything before `next` if nothing was
    /// sent since `quiet_until` came due. A watch that takes little of
    /// what the replica applies (or of the history it catches up through)
    /// still tells its caller once per progress interval, give or take one
    /// history chunk, that it is alive and how far it is: its client gives
    /// up on a replica that sends nothing for three intervals, and a watch
    /// cut meanwhile resumes after what was scanned, not before it.
    async fn progress_if_due(&self, next: u64, quiet_until: &mut Instant) -> Result<(), Stop> {
        if Instant::now() >= *quiet_until {
            self.send(WatchMessage::Progress {
                revision: next - 1,
                behind: self.hub.behind(),
            })
            .await?;
            *quiet_until = Instant::now() + self.spec.progress;
        }
        Ok(())
    }

    /// Send the history's records from `next` to `until`; the revision
    /// after the last one sent. Progress notices go on meanwhile (see
    /// [`Watch::progress_if_due`]).
    async fn catch_up(
        &mut self,
        mut next: u64,
        until: u64,
        quiet_until: &mut Instant,
    ) -> Result<u64, Stop> {
        while next <= until {
            let (window, records) = self.hub.history(next, CHUNK, CHUNK_BYTES)?;
            if records.first().map(|r| r.revision) != Some(next) {
                return Err(WatchError::Compacted {
                    requested: next,
                    oldest: window.oldest,
                }
                .into());
            }
            for record in records.into_iter().take_while(|r| r.revision <= until) {
                next = record.revision + 1;
                if self.deliver(&Published::new(record)).await? {
                    *quiet_until = Instant::now() + self.spec.progress;
                }
            }
            if next <= until {
                self.progress_if_due(next, quiet_until).await?;
            }
        }
        Ok(next)
    }

    /// Send what `record` changed among the watched keys, if anything;
    /// whether something was sent.
    /// A record whose every change is watched goes whole: shared with
    /// every other watch that takes it whole, not copied for this one.
    async fn deliver(&mut self, published: &Arc<Published>) -> Result<bool, Stop> {
        let record = published.record();
        let prev_value = self.spec.prev_value;
        let picked = self.spec.keys.pick(record).count();
        let delivery = if picked == 0 {
            return Ok(false);
        } else if picked == record.changes.len() {
            Delivery::Whole {
                record: Arc::clone(published),
                prev_value,
            }
        } else {
            Delivery::Message(changes_message(
                record,
                self.spec.keys.pick(record),
                prev_value,
            ))
        };
        self.send(delivery).await?;
        Ok(true)
    }

    /// Queue `message`, waiting at most [`SLOW_AFTER`] for room.
    async fn send(&self, message: impl Into<Delivery>) -> Result<(), Stop> {
        let delivery = message.into();
        let resume_from = delivery.resume_from();
        match tokio::time::timeout(SLOW_AFTER, self.out.reserve()).await {
            Ok(Ok(permit)) => {
                permit.send(delivery);
                Ok(())
            }
            Ok(Err(_)) => Err(Stop::Gone),
            Err(_) => Err(WatchError::TooSlow { resume_from }.into()),
        }
    }
}

fn stopping(next: u64) -> WatchError {
    WatchError::Replica(ReplicaFailure::Unavailable(format!(
        "this replica is shutting down: watch again from revision {next} at another replica"
    )))
}
