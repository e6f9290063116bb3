//! [`RequestWindow`]: the request ids of one session's retry-safe writes,
//! handed out in order and never more than [`WINDOW`] past the oldest id
//! still in flight.
//!
//! A session remembers the outcomes of its last
//! [`MAX_REMEMBERED_REQUESTS`] requests, and a retry of an older one is
//! refused as forgotten, its outcome unknown. Bounding only how many
//! writes are in flight does not keep a retry inside that memory: one
//! write held up on a leader that is stopping (its attempt waits for the
//! attempt timeout) can lag hundreds of writes that other tasks send
//! meanwhile through the new leader. So an id is handed out only while
//! it is less than [`WINDOW`] past the oldest unanswered one; the others
//! wait for that write (seconds at most, the attempt timeout) instead of
//! pushing it out of the memory. Imports nothing of the crate.

use std::collections::BTreeSet;
use std::sync::Mutex;

use latchkey_core::limits::MAX_REMEMBERED_REQUESTS;
use tokio::sync::Notify;

/// How far past the oldest write in flight a new request id may be: half
/// of what a session remembers, so that every id in flight stays
/// remembered with room to spare.
pub(crate) const WINDOW: u64 = MAX_REMEMBERED_REQUESTS as u64 / 2;

/// The request ids of one session (see the module docs).
#[derive(Debug)]
pub(crate) struct RequestWindow {
    state: Mutex<State>,
    freed: Notify,
}

#[derive(Debug)]
struct State {
    /// The next id to hand out.
    next: u64,
    /// The ids handed out and not answered yet.
    open: BTreeSet<u64>,
}

/// One request id in flight; dropping it (answered, given up, or the
/// caller's future dropped) frees its place in the window.
#[derive(Debug)]
pub(crate) struct Ticket<'w> {
    window: &'w RequestWindow,
    id: u64,
}

impl RequestWindow {
    /// A window whose first id is `first`.
    pub(crate) fn new(first: u64) -> RequestWindow {
        RequestWindow {
            state: Mutex::new(State {
                next: first,
                open: BTreeSet::new(),
            }),
            freed: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next request id, once it is inside the window.
    pub(crate) async fn take(&self) -> Ticket<'_> {
        loop {
            // Registered before the check, so a ticket dropped between the
            // check and the wait still wakes this one.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.state();
                let oldest = state.open.first().copied().unwrap_or(state.next);
                if state.next.saturating_sub(oldest) < WINDOW {
                    let id = state.next;
                    state.next = state.next.saturating_add(1);
                    state.open.insert(id);
                    return Ticket { window: self, id };
                }
            }
            freed.await;
        }
    }
}

impl Ticket<'_> {
    /// The request id.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let oldest = {
            let mut state = self.window.state();
            let oldest = state.open.first().copied();
            state.open.remove(&self.id);
            oldest
        };
        // Only the oldest id holds the window back.
        if oldest == Some(self.id) {
            self.window.freed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// One write held up keeps every new id within the window of it; the
    /// window moves on once it is answered.
    #[tokio::test]
    async fn a_held_up_request_holds_the_window_not_the_others() {
        let window = RequestWindow::new(1);
        let stuck = window.take().await;
        assert_eq!(stuck.id(), 1);
        for _ in 1..WINDOW {
            let t = window.take().await;
            assert!(t.id() - stuck.id() < WINDOW, "{}", t.id());
        }
        let blocked = tokio::time::timeout(Duration::from_millis(50), window.take()).await;
        assert!(blocked.is_err(), "an id {WINDOW} past a write in flight");
        drop(stuck);
        let next = tokio::time::timeout(Duration::from_secs(5), window.take())
            .await
            .expect("the window moved on");
        assert_eq!(next.id(), WINDOW + 1);
    }
}
