//! Clients waiting on this replica for a queued acquire to end.
//!
//! Every replica keeps one, fed by the events of the entries it applies, so
//! a waiting client is woken by the replica it waits on when its grant (or
//! the cancel of its wait) is applied there: no polling, and only that
//! client is woken. A caller registers *before* proposing its acquire, so
//! the grant cannot be applied in between unseen.

use std::collections::BTreeMap;
use std::sync::Mutex;

use latchkey_core::lock::{Sequencer, SessionId, WaitEnd};
use latchkey_core::Event;
use tokio::sync::oneshot;

/// How a wait ended, as this replica saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WaitOutcome {
    /// The acquire was granted under these sequencers: one for a lock, one
    /// per lock for a multi-lock (all in one entry, in the order asked).
    Granted(Vec<Sequencer>),
    /// The acquire left the queue without a grant.
    Cancelled(WaitEnd),
    /// This replica's state was replaced by a snapshot, so it cannot tell:
    /// ask again (a retried acquire answers from the session's memory).
    Unknown,
}

type Key = (SessionId, u64, u64);

/// Registered waits by (session, owner, request id).
#[derive(Default)]
pub(crate) struct Waiters {
    waiting: Mutex<BTreeMap<Key, Vec<oneshot::Sender<WaitOutcome>>>>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Vec<oneshot::Sender<WaitOutcome>>>> {
        // Every update is a single insert or remove: a poisoned map is intact.
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait for the end of the acquire `request_id` of (`session`, `owner`).
    /// Dropping the receiver withdraws interest; its slot is reclaimed when
    /// the wait ends or the next registration for the same key.
    pub(crate) fn register(
        &self,
        session: SessionId,
        owner: u64,
        request_id: u64,
    ) -> oneshot::Receiver<WaitOutcome> {
        let (tx, rx) = oneshot::channel();
        let mut map = self.lock();
        let slot = map.entry((session, owner, request_id)).or_default();
        slot.retain(|s| !s.is_closed());
        slot.push(tx);
        rx
    }

    /// Drop the slots of callers that stopped waiting for this acquire
    /// (their receivers are gone), so a wait that never queued, or whose
    /// caller left, leaves nothing behind.
    pub(crate) fn forget(&self, session: SessionId, owner: u64, request_id: u64) {
        let mut map = self.lock();
        let key = (session, owner, request_id);
        if let Some(slot) = map.get_mut(&key) {
            slot.retain(|s| !s.is_closed());
            if slot.is_empty() {
                map.remove(&key);
            }
        }
    }

    fn wake(&self, key: Key, outcome: WaitOutcome) {
        if let Some(senders) = self.lock().remove(&key) {
            for s in senders {
                let _ = s.send(outcome.clone());
            }
        }
    }

    /// Wake whoever waits for what the `events` of one applied entry end.
    /// A multi-lock's grants are all in one entry: its waiter is woken
    /// once, with every grant.
    pub(crate) fn on_entry(&self, events: &[Event]) {
        let mut granted: BTreeMap<Key, Vec<Sequencer>> = BTreeMap::new();
        for event in events {
            match event {
                Event::Granted {
                    session,
                    owner,
                    request_id,
                    name,
                    mode,
                    token,
                    ..
                } => granted
                    .entry((*session, *owner, *request_id))
                    .or_default()
                    .push(Sequencer {
                        name: name.clone(),
                        mode: *mode,
                        token: *token,
                        session: *session,
                    }),
                Event::WaitCancelled {
                    session,
                    owner,
                    request_id,
                    why,
                    ..
                } => self.wake(
                    (*session, *owner, *request_id),
                    WaitOutcome::Cancelled(*why),
                ),
                _ => {}
            }
        }
        for (key, sequencers) in granted {
            self.wake(key, WaitOutcome::Granted(sequencers));
        }
    }

    /// The state was replaced wholesale: wake everyone to ask again.
    pub(crate) fn wake_all_unknown(&self) {
        let all = std::mem::take(&mut *self.lock());
        for (_, senders) in all {
            for s in senders {
                let _ = s.send(WaitOutcome::Unknown);
            }
        }
    }

    /// Registered waits.
    pub(crate) fn len(&self) -> usize {
        self.lock().values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::lock::{LockMode, Token};

    #[test]
    fn a_grant_wakes_exactly_its_waiter() {
        let w = Waiters::default();
        let mut mine = w.register(SessionId(1), 1, 5);
        let mut other = w.register(SessionId(1), 2, 5);
        w.on_entry(&[Event::Granted {
            session: SessionId(1),
            owner: 1,
            request_id: 5,
            name: "l".into(),
            mode: LockMode::Exclusive,
            token: Token(8),
            lease_ms: None,
            waited: true,
        }]);
        match mine.try_recv() {
            Ok(WaitOutcome::Granted(s)) => assert_eq!(s[0].to_string(), "lk1.8.1.x.l"),
            other => panic!("{other:?}"),
        }
        assert!(other.try_recv().is_err());
        assert_eq!(w.len(), 1);
        w.wake_all_unknown();
        assert_eq!(other.try_recv(), Ok(WaitOutcome::Unknown));
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn a_multi_lock_is_woken_once_with_every_grant() {
        let w = Waiters::default();
        let mut mine = w.register(SessionId(1), 1, 5);
        let grant = |name: &str, token| Event::Granted {
            session: SessionId(1),
            owner: 1,
            request_id: 5,
            name: name.into(),
            mode: LockMode::Exclusive,
            token: Token(token),
            lease_ms: None,
            waited: true,
        };
        w.on_entry(&[grant("b", 8), grant("a", 9)]);
        match mine.try_recv() {
            Ok(WaitOutcome::Granted(s)) => {
                let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
                assert_eq!(names, ["b", "a"], "in the order granted");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn dropped_receivers_are_reclaimed() {
        let w = Waiters::default();
        drop(w.register(SessionId(1), 1, 1));
        let kept = w.register(SessionId(1), 1, 1);
        assert_eq!(w.len(), 1);
        w.forget(SessionId(1), 1, 1);
        assert_eq!(w.len(), 1, "a live waiter is kept");
        drop(kept);
        w.forget(SessionId(1), 1, 1);
        assert_eq!(w.len(), 0);
    }
}
