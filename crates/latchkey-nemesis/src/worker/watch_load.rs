//! The watch workload: writers change a few keys under [`WATCH_PREFIX`],
//! a binder puts keys bound to short sessions that it closes or abandons,
//! and watchers list the prefix and watch it, each from its own replica
//! first, now and then stopping to read for longer than the client's
//! limit. `latchkey-check`'s `watch` checker reads what they record.

use std::time::Duration;

use futures::StreamExt;
use latchkey::{Batch, Client, Error as ClientError, ScanRange, Selection, WatchMessage};
use latchkey_check::history::ops;
use latchkey_check::EventKind;
use tokio::sync::watch;

use crate::outcome::write_failure;
use crate::record::Recorder;
use crate::rng::Rng;

/// The watched prefix.
pub const WATCH_PREFIX: &str = "wat/";
/// Where the binder puts the keys it binds to sessions (under
/// [`WATCH_PREFIX`]).
pub const BOUND_PREFIX: &str = "wat/e/";
/// How many keys the writers share.
const WATCH_KEYS: usize = 6;
/// A watcher drops its watch and opens it again from the revision after
/// its last, as a restarted client would, after one message in this many.
const REOPEN_ONE_IN: usize = 40;
/// How often an idle watch sends a progress notice.
const PROGRESS_EVERY: Duration = Duration::from_millis(300);
/// Now and then a watcher stops reading for this long, past the client's
/// 5 s limit for a caller away (plus one progress interval): the client
/// closes the watch's stream and opens it again from the next revision when
/// the watcher reads again, and the checker sees whether anything went
/// missing or came twice.
const STALL: Duration = Duration::from_millis(6_500);
/// At most one stall per watcher in this long.
const STALL_EVERY: Duration = Duration::from_secs(20);

/// What a task of the watch workload works with.
pub struct Load<'a> {
    /// The worker's client (writers) or the task's own (watchers).
    pub client: &'a Client,
    /// The worker's history.
    pub rec: &'a Recorder,
    /// Becomes true when the worker must stop.
    pub stop: watch::Receiver<bool>,
    /// The pause between a writer's writes.
    pub pace: Duration,
}

impl Load<'_> {
    fn stopping(&self) -> bool {
        *self.stop.borrow()
    }

    async fn pause(&self, d: Duration) {
        let mut stop = self.stop.clone();
        let _ = tokio::time::timeout(d, stop.wait_for(|s| *s)).await;
    }
}

/// Writes until told to stop: each write is one batch holding a put of a
/// unique value, and sometimes a second put or a delete of another key.
pub async fn writer(load: Load<'_>, process: u64, mut rng: Rng) {
    let mut n = 0u64;
    while !load.stopping() {
        n += 1;
        let k = rng.below(WATCH_KEYS);
        let other = (k + 1 + rng.below(WATCH_KEYS - 1)) % WATCH_KEYS;
        let mut changes: Vec<(String, Option<String>)> = vec![(
            format!("{WATCH_PREFIX}{k}"),
            Some(format!("p{process}-{n}")),
        )];
        match rng.below(10) {
            0 | 1 => changes.push((format!("{WATCH_PREFIX}{other}"), None)),
            2 => changes.push((
                format!("{WATCH_PREFIX}{other}"),
                Some(format!("p{process}-{n}b")),
            )),
            _ => {}
        }
        let view: Vec<(&str, Option<&str>)> = changes
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_deref()))
            .collect();
        let mut batch = Batch::new();
        for (key, value) in &view {
            batch = match value {
                Some(v) => batch.put(key, v),
                None => batch.delete(key),
            };
        }
        load.rec.invoke(process, ops::watch_write(&view, None));
        match load.client.batch(batch).await {
            Ok(Ok(revision)) => {
                load.rec.record(
                    process,
                    EventKind::Ok,
                    ops::watch_write(&view, Some(revision)),
                );
            }
            Ok(Err(_)) => {
                // A batch without conditions cannot fail one; say so loudly
                // and count it as not applied.
                tracing::error!("a batch without conditions failed a condition");
                load.rec
                    .record(process, EventKind::Fail, ops::watch_write(&view, None));
            }
            Err(e) => {
                load.rec
                    .record(process, write_failure(&e), ops::watch_write(&view, None));
            }
        }
        load.pause(load.pace).await;
    }
}

/// Opens sessions of `ttl` and binds one or two keys to each (unique keys
/// under `WATCH_PREFIX` + `e/`), then, after a while, closes the session
/// and reads each key (it must be gone), or abandons it to expire. Until
/// told to stop.
pub async fn binder(load: Load<'_>, process: u64, ttl: Duration, mut rng: Rng) {
    let mut n = 0u64;
    while !load.stopping() {
        let session = match load.client.session(ttl).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(%e, "cannot open a session yet");
                load.pause(Duration::from_millis(100)).await;
                continue;
            }
        };
        let id = session.id().0;
        let mut keys = Vec::new();
        for _ in 0..1 + rng.below(2) {
            n += 1;
            let key = format!("{BOUND_PREFIX}p{process}-{n}");
            let value = format!("p{process}-{n}");
            load.rec
                .invoke(process, ops::watch_bound_put(&key, &value, id, None));
            match session.put(&key, &value).await {
                Ok(revision) => {
                    load.rec.record(
                        process,
                        EventKind::Ok,
                        ops::watch_bound_put(&key, &value, id, Some(revision)),
                    );
                    keys.push(key);
                }
                Err(e) => {
                    let kind = write_failure(&e);
                    load.rec
                        .record(process, kind, ops::watch_bound_put(&key, &value, id, None));
                    if kind == EventKind::Unknown {
                        keys.push(key);
                    }
                }
            }
        }
        load.pause(Duration::from_millis(rng.between(100, 1_500)))
            .await;
        if !rng.chance(70) {
            // Abandoned: its keep-alives stop, it expires after its TTL.
            session.abandon();
            continue;
        }
        if let Err(e) = session.close().await {
            tracing::debug!(%e, "close failed");
            continue;
        }
        for key in keys {
            load.rec.invoke(process, ops::watch_gone(&key, id, None));
            match load.client.get(&key).await {
                Ok(v) => load.rec.record(
                    process,
                    EventKind::Ok,
                    ops::watch_gone(&key, id, Some(v.is_some())),
                ),
                Err(_) => {
                    load.rec
                        .record(process, EventKind::Fail, ops::watch_gone(&key, id, None))
                }
            };
        }
    }
}

/// Lists the prefix, watches it from the list's revision plus one, and
/// records every message, until told to stop. Opens the watch again from
/// the revision after the last it had now and then, and after an error the
/// stream does not cure; lists again after `Compacted`.
pub async fn watcher(load: Load<'_>, process: u64, mut rng: Rng) {
    let mut stop = load.stop.clone();
    // The revision to open the next watch at; `None`: list first.
    let mut next: Option<u64> = None;
    let mut stalled = tokio::time::Instant::now();
    while !load.stopping() {
        let from = match next {
            Some(from) => from,
            None => match list(&load, process).await {
                Some(revision) => revision + 1,
                None => {
                    load.pause(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        next = Some(from);
        load.rec
            .record(process, EventKind::Ok, ops::watch_open(from));
        let mut stream = load
            .client
            .watch(Selection::prefix(WATCH_PREFIX))
            .from_revision(from)
            .progress_every(PROGRESS_EVERY);
        loop {
            let message = tokio::select! {
                m = stream.next() => m,
                _ = stop.wait_for(|s| *s) => return,
            };
            match message {
                Some(Ok(WatchMessage::Changes {
                    revision, changes, ..
                })) => {
                    let changes: Vec<(String, Option<String>)> = changes
                        .into_iter()
                        .map(|c| {
                            (
                                String::from_utf8_lossy(&c.key).into_owned(),
                                c.current
                                    .map(|v| String::from_utf8_lossy(&v.value).into_owned()),
                            )
                        })
                        .collect();
                    let view: Vec<(&str, Option<&str>)> = changes
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_deref()))
                        .collect();
                    load.rec
                        .record(process, EventKind::Ok, ops::watch_changes(revision, &view));
                    next = Some(revision + 1);
                    if rng.below(REOPEN_ONE_IN) == 0 {
                        break;
                    }
                    if stalled.elapsed() >= STALL_EVERY && rng.below(20) == 0 {
                        tracing::debug!("a watcher stops reading for {STALL:?}");
                        load.pause(STALL).await;
                        stalled = tokio::time::Instant::now();
                    }
                }
                Some(Ok(WatchMessage::Progress { revision, .. })) => {
                    load.rec
                        .record(process, EventKind::Ok, ops::watch_progress(revision));
                    next = next.max(Some(revision + 1));
                }
                Some(Err(ClientError::Compacted { .. })) => {
                    next = None;
                    break;
                }
                // The stream goes on trying by itself.
                Some(Err(ClientError::Unavailable { .. })) => {}
                Some(Err(e)) => {
                    tracing::debug!(%e, "the watch ended; opening it again");
                    load.pause(Duration::from_millis(100)).await;
                    break;
                }
                None => break,
            }
        }
    }
}

/// A linearizable scan of the prefix, recorded; its revision.
async fn list(load: &Load<'_>, process: u64) -> Option<u64> {
    load.rec.invoke(process, ops::watch_list(None));
    match load
        .client
        .scan(ScanRange::prefix(WATCH_PREFIX.as_bytes().to_vec(), 0))
        .await
    {
        Ok(page) => {
            let values: Vec<(String, String)> = page
                .entries
                .iter()
                .map(|(k, v)| {
                    (
                        String::from_utf8_lossy(k).into_owned(),
                        String::from_utf8_lossy(&v.value).into_owned(),
                    )
                })
                .collect();
            let view: Vec<(&str, &str)> = values
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            load.rec.record(
                process,
                EventKind::Ok,
                ops::watch_list(Some((page.revision, &view))),
            );
            Some(page.revision)
        }
        Err(e) => {
            tracing::debug!(%e, "list failed");
            load.rec
                .record(process, EventKind::Fail, ops::watch_list(None));
            None
        }
    }
}
