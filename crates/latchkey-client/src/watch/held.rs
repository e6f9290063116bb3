//! A watch's open stream, and the timer task that closes it when it is of
//! no use: its caller stays away, or its replica says nothing.
//!
//! **The caller stays away.** hyper, under tonic, hands a connection's
//! HTTP/2 flow-control window back only as the application reads each
//! stream. A watch whose caller stops reading (a stuck consumer, a slow
//! reload) keeps what the replica sent it in that window, and a few such
//! watches fill it: the client's other watches at that replica then stall
//! too, and the replica's own `WATCH_TOO_SLOW` ending waits behind the
//! unread bytes. So when the caller has taken a message and not come back
//! for the next one for [`UNREAD_LIMIT`] (rounded up to whole progress
//! intervals, plus up to one more), the task drops the stream, which resets
//! it and returns its share of the window; the watch opens it again, at the
//! same replica, from the revision after the last message it delivered,
//! when its caller polls.
//!
//! **The replica says nothing.** A paused or stuck replica keeps its
//! connection open (its kernel still acknowledges; HTTP/2 keep-alive pings
//! take about 15 s to give up), so a watch there would hear nothing until
//! then, or for good if only the replica's watch feed is stuck. When the
//! caller waits and nothing (no change, no progress notice) has come for
//! [`SILENT_PROGRESSES`] progress intervals (or [`FIRST_REPLY_LIMIT`] for a
//! stream that has sent nothing yet, counted from its opening), the task
//! drops the stream and wakes the watch, which opens it again at the next
//! replica. The replica sends a progress notice about once per interval
//! (give or take one history chunk) even while it catches a watch up from
//! its history or applies records the watch takes none of.
//!
//! What the task can see is whether the caller's last poll of the watch got
//! a message. A caller that polled, got nothing yet, and then stopped
//! polling (a `select!` whose other branch runs long) looks like one that
//! waits: its watch is moved to the next replica after three intervals
//! rather than kept where it was. Nothing is missed either way.
//!
//! The hot path stays cheap: each poll costs the caller two plain atomic
//! stores and one uncontended lock, and no clock read or timer. The
//! task samples the caller's state once per progress interval. A task that
//! read ahead for the caller (a queue per watch) and a timeout per message
//! were both tried, and both cost the 1,000-watcher benchmark too much
//! (docs/PERFORMANCE.md, "Unread and silent watches").

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures::StreamExt;
use latchkey_proto::wire::{
    WatchError, WatchMessage, DEFAULT_PROGRESS, MAX_PROGRESS, MIN_PROGRESS,
};
use latchkey_proto::WatchStream;

/// How long a watch's caller may stay away (its last message taken, not
/// polling again) before the watch's stream to the replica is closed. The
/// replica's own patience with a watch whose 64-message queue is full is
/// the same.
pub(crate) const UNREAD_LIMIT: Duration = Duration::from_secs(5);

/// Progress intervals an open stream may send nothing while the caller
/// waits, before the watch gives up on its replica.
pub(crate) const SILENT_PROGRESSES: u32 = 3;

/// How long opening a watch and its first reply may take: longer than a
/// replica waits (5 s) for a start revision it has not reached yet.
pub(crate) const FIRST_REPLY_LIMIT: Duration = Duration::from_secs(10);

/// What the stream of a watch yields when polled through a [`Held`].
pub(crate) type Polled = Option<Result<WatchMessage, WatchError>>;

/// Why a [`Held`] has no stream open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Closed {
    /// Never opened, or closed by the watch itself.
    ByWatch,
    /// Closed while the caller was away: open again where it was.
    CallerAway,
    /// Closed after the replica sent nothing for too long: open again at
    /// the next replica.
    ReplicaSilent,
}

const BY_WATCH: u8 = 0;
const CALLER_AWAY: u8 = 1;
const REPLICA_SILENT: u8 = 2;

/// A watch's open stream (if any) and where its caller is, shared with the
/// timer task that closes the stream.
pub(crate) struct Held {
    slot: Mutex<Slot>,
    /// Messages the caller has taken, times two, plus one while it waits
    /// for the next. Written only by the caller's task.
    caller: AtomicU64,
    /// The open stream has not sent anything yet.
    fresh: AtomicBool,
    /// Streams opened so far (a new one restarts the task's count).
    opens: AtomicU64,
    /// Why no stream is open (one of the `Closed` codes).
    closed: AtomicU8,
}

/// What the lock of a [`Held`] guards.
#[derive(Default)]
struct Slot {
    stream: Option<WatchStream>,
    /// The watch's task, as of its last poll that found nothing: woken
    /// when the stream is closed under it. Kept here, under the lock the
    /// poll takes anyway, so that a poll costs no atomic operation more.
    waker: Option<Waker>,
}

impl Held {
    /// No stream yet, and a timer task that samples once per progress
    /// interval (`progress` as the replica reads it) and ends once the
    /// returned `Arc` and its clones are dropped. `None` outside a tokio
    /// runtime.
    pub(crate) fn start(progress: Duration) -> Option<Arc<Self>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let held = Arc::new(Held {
            slot: Mutex::new(Slot::default()),
            caller: AtomicU64::new(0),
            fresh: AtomicBool::new(false),
            opens: AtomicU64::new(0),
            closed: AtomicU8::new(BY_WATCH),
        });
        runtime.spawn(close_when_useless(Arc::downgrade(&held), tick(progress)));
        Some(held)
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        // A panic while the lock was held left at worst a stream or none:
        // either is a state the watch handles.
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hold `stream` as the open one.
    pub(crate) fn open(&self, stream: WatchStream) {
        let mut slot = self.slot();
        self.fresh.store(true, Ordering::Relaxed);
        self.opens.fetch_add(1, Ordering::Relaxed);
        self.closed.store(BY_WATCH, Ordering::Relaxed);
        let old = slot.stream.replace(stream);
        drop(slot);
        drop(old);
    }

    /// Close the open stream, if any. The watch closes it on its own
    /// account (a failure, a resume elsewhere), which overrides a reason
    /// the timer task may have left just before.
    pub(crate) fn close(&self) {
        self.close_for(BY_WATCH, None);
    }

    /// Close the open stream for `why`, and wake the watch if it waits
    /// on it; whether one was closed. With `opened`, only if no stream was
    /// opened since the task counted that many (a stream opened after the
    /// task decided is not the one it judged).
    fn close_for(&self, why: u8, opened: Option<u64>) -> bool {
        let mut slot = self.slot();
        if opened.is_some_and(|n| n != self.opens.load(Ordering::Relaxed)) {
            return false;
        }
        let old = slot.stream.take();
        if why == BY_WATCH || old.is_some() {
            self.closed.store(why, Ordering::Relaxed);
        }
        let waker = if old.is_some() {
            slot.waker.take()
        } else {
            None
        };
        drop(slot);
        let closed = old.is_some();
        drop(old);
        if let Some(waker) = waker {
            waker.wake();
        }
        closed
    }

    /// Why no stream is open; asked once per close (the answer goes back
    /// to [`Closed::ByWatch`]).
    pub(crate) fn take_closed(&self) -> Closed {
        match self.closed.swap(BY_WATCH, Ordering::Relaxed) {
            CALLER_AWAY => Closed::CallerAway,
            REPLICA_SILENT => Closed::ReplicaSilent,
            _ => Closed::ByWatch,
        }
    }

    /// Poll the open stream. `Ready(None)` when none is open (see
    /// [`Held::take_closed`]).
    pub(crate) fn poll_next(&self, cx: &mut Context<'_>) -> Poll<Option<Polled>> {
        let mut slot = self.slot();
        let Some(stream) = slot.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = stream.poll_next_unpin(cx);
        match polled {
            Poll::Ready(polled) => {
                if self.fresh.load(Ordering::Relaxed) {
                    self.fresh.store(false, Ordering::Relaxed);
                }
                Poll::Ready(Some(polled))
            }
            Poll::Pending => {
                // Under the lock: a close after it sees this waker.
                if !slot.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    slot.waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
        }
    }

    /// The caller is waiting for a message.
    pub(crate) fn caller_waits(&self) {
        let state = self.caller.load(Ordering::Relaxed);
        if state & 1 == 0 {
            self.caller.store(state | 1, Ordering::Relaxed);
        }
    }

    /// The caller got a message and went away with it.
    pub(crate) fn caller_took(&self) {
        let state = self.caller.load(Ordering::Relaxed);
        self.caller
            .store((state | 1).wrapping_add(1), Ordering::Relaxed);
    }
}

/// The progress interval a replica uses for a watch that asks for
/// `progress`: whole milliseconds, 0 for its default over gRPC (a value
/// out of range, and 0 at an in-process replica, is refused, and the watch
/// ends).
fn tick(progress: Duration) -> Duration {
    match progress.as_millis() {
        0 => DEFAULT_PROGRESS,
        ms => Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
            .clamp(MIN_PROGRESS, MAX_PROGRESS),
    }
}

/// The timer task: sample `held` every `tick`; close its stream when its
/// caller has been away for [`UNREAD_LIMIT`], or has waited while the
/// stream sent nothing for [`SILENT_PROGRESSES`] ticks (or
/// [`FIRST_REPLY_LIMIT`] for a stream that has sent nothing yet, counted
/// from its opening). Ends when the watch is dropped.
async fn close_when_useless(held: Weak<Held>, tick: Duration) {
    let ticks_for =
        |d: Duration| u32::try_from(d.as_millis().div_ceil(tick.as_millis())).unwrap_or(u32::MAX);
    let (away_ticks, first_ticks) = (ticks_for(UNREAD_LIMIT), ticks_for(FIRST_REPLY_LIMIT));
    let mut last = None;
    let mut same = 0u32;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(held) = held.upgrade() else {
            return;
        };
        let caller = held.caller.load(Ordering::Relaxed);
        let opens = held.opens.load(Ordering::Relaxed);
        let state = (caller, opens);
        if last == Some(state) {
            same = same.saturating_add(1);
        } else {
            (last, same) = (Some(state), 0);
        }
        let waiting = caller & 1 == 1;
        if !waiting && same >= away_ticks {
            if held.close_for(CALLER_AWAY, Some(opens)) {
                tracing::debug!(
                    "a watch's caller took nothing for {UNREAD_LIMIT:?}: closing its stream until \
                     it polls again"
                );
            }
            continue;
        }
        let limit = if held.fresh.load(Ordering::Relaxed) {
            first_ticks
        } else {
            SILENT_PROGRESSES
        };
        if waiting && same >= limit && held.close_for(REPLICA_SILENT, Some(opens)) {
            tracing::debug!(
                "a watch's replica sent nothing for {same} progress intervals: opening it at the \
                 next replica"
            );
            same = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    /// The interval the replica uses: its default for 0 (and for less than
    /// a millisecond, which the wire rounds to 0), clamped otherwise.
    #[test]
    fn the_tick_is_the_replicas_progress_interval() {
        assert_eq!(tick(Duration::ZERO), DEFAULT_PROGRESS);
        assert_eq!(tick(Duration::from_micros(500)), DEFAULT_PROGRESS);
        assert_eq!(tick(Duration::from_millis(1)), MIN_PROGRESS);
        assert_eq!(tick(Duration::from_millis(250)), Duration::from_millis(250));
        assert_eq!(tick(Duration::MAX), MAX_PROGRESS);
    }

    use super::*;

    /// The caller's state: odd while it waits, one more message taken each
    /// time it gets one.
    #[tokio::test]
    async fn the_callers_state_counts_messages_and_waits() {
        let Some(held) = Held::start(Duration::from_secs(1)) else {
            panic!("in a runtime");
        };
        held.caller_waits();
        held.caller_waits();
        assert_eq!(held.caller.load(Ordering::Relaxed), 1);
        held.caller_took();
        assert_eq!(held.caller.load(Ordering::Relaxed), 2);
        held.caller_took();
        assert_eq!(held.caller.load(Ordering::Relaxed), 4);
        held.caller_waits();
        assert_eq!(held.caller.load(Ordering::Relaxed), 5);
        assert_eq!(held.take_closed(), Closed::ByWatch);
    }
}
