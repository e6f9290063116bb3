//! Watches: what a watch asks for ([`WatchSpec`]), what it is told
//! ([`WatchMessage`]), why it ends ([`WatchError`]), each to the typed
//! `latchkey.v1` messages and back.

use std::time::Duration;

use latchkey_core::history::KeyChange;
use latchkey_core::watch::Selection;
use latchkey_core::CommandError;

use super::batch::{key_value_from_wire, key_value_to_wire};
use super::error::{command_error_to_wire, error_from_wire};
use super::fault::invalid;
use crate::v1::{self, watch_request::Keys, ErrorKind, EventType};
use crate::ReplicaFailure;

/// How often a watch with nothing to send says how fresh it is, unless it
/// asks otherwise.
pub const DEFAULT_PROGRESS: Duration = Duration::from_millis(1_000);
/// The shortest progress interval a watch may ask for.
pub const MIN_PROGRESS: Duration = Duration::from_millis(100);
/// The longest progress interval a watch may ask for.
pub const MAX_PROGRESS: Duration = Duration::from_millis(60_000);

/// What a watch asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSpec {
    /// The keys watched.
    pub keys: Selection,
    /// The first revision to send; `None`: the next one.
    pub start_revision: Option<u64>,
    /// Send each changed key's previous value.
    pub prev_value: bool,
    /// Send a progress notice after this long without a change to send
    /// ([`MIN_PROGRESS`] to [`MAX_PROGRESS`]).
    pub progress: Duration,
}

impl WatchSpec {
    /// A watch of `keys` from the next revision, without previous values,
    /// with progress notices every [`DEFAULT_PROGRESS`].
    pub fn new(keys: Selection) -> Self {
        WatchSpec {
            keys,
            start_revision: None,
            prev_value: false,
            progress: DEFAULT_PROGRESS,
        }
    }
}

/// One message of a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// What one revision changed among the watched keys, in order.
    Changes {
        /// The revision.
        revision: u64,
        /// The changes (previous values only if the watch asked for them).
        changes: Vec<KeyChange>,
        /// The write's previous values were too large to keep.
        previous_dropped: bool,
    },
    /// Every change up to `revision` has been sent.
    Progress {
        /// The revision the replica has applied.
        revision: u64,
        /// The replica may be behind the cluster: it holds log entries it
        /// has not applied, or knows no leader.
        behind: bool,
    },
}

/// Why a watch ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WatchError {
    /// The start revision is older than the history kept.
    #[error(
        "revision {requested} is compacted: the history starts at {oldest}; read the keys \
         again and watch from the revision the read saw plus one"
    )]
    Compacted {
        /// The start revision asked for.
        requested: u64,
        /// The oldest revision the history keeps.
        oldest: u64,
    },
    /// The start revision has not happened yet.
    #[error("revision {requested} is in the future: the next revision is {next}")]
    FutureRevision {
        /// The start revision asked for.
        requested: u64,
        /// The next revision.
        next: u64,
    },
    /// The caller did not take changes as fast as they came.
    #[error("the watch fell behind its caller; watch again from revision {resume_from}")]
    TooSlow {
        /// The revision to watch from.
        resume_from: u64,
    },
    /// Too many watches are open.
    #[error("{max} watches are open on this {scope}, the limit")]
    TooManyWatches {
        /// The limit.
        max: u64,
        /// "connection" or "replica".
        scope: String,
    },
    /// Refused by the state: access control.
    #[error("refused: {0}")]
    Refused(CommandError),
    /// Refused by the replica: invalid, unavailable, stopping.
    #[error(transparent)]
    Replica(#[from] ReplicaFailure),
}

/// A watch request in its typed form.
pub fn watch_request_to_wire(spec: &WatchSpec) -> v1::WatchRequest {
    let keys = match &spec.keys {
        Selection::Key(k) => Keys::Key(k.clone()),
        Selection::Prefix(p) => Keys::Prefix(p.clone()),
        Selection::Range { start, end } => Keys::Range(v1::KeyRange {
            start: start.clone(),
            end: end.clone(),
        }),
    };
    v1::WatchRequest {
        keys: Some(keys),
        start_revision: spec.start_revision.unwrap_or(0),
        prev_value: spec.prev_value,
        progress_ms: u32::try_from(spec.progress.as_millis()).unwrap_or(u32::MAX),
    }
}

/// A typed watch request, checked: which keys (validated), from where, how
/// often to report progress.
pub fn watch_request_from_wire(r: v1::WatchRequest) -> Result<WatchSpec, ReplicaFailure> {
    let keys = match r.keys {
        None => return Err(invalid("a watch must name a key, a range or a prefix")),
        Some(Keys::Key(k)) => Selection::Key(k),
        Some(Keys::Prefix(p)) => Selection::Prefix(p),
        Some(Keys::Range(range)) => Selection::Range {
            start: range.start,
            end: range.end,
        },
    };
    keys.validate().map_err(ReplicaFailure::invalid)?;
    let progress = match r.progress_ms {
        0 => DEFAULT_PROGRESS,
        ms => Duration::from_millis(u64::from(ms)),
    };
    if !(MIN_PROGRESS..=MAX_PROGRESS).contains(&progress) {
        return Err(invalid(format!(
            "progress_ms is {}, it must be {} to {} (or 0 for {})",
            r.progress_ms,
            MIN_PROGRESS.as_millis(),
            MAX_PROGRESS.as_millis(),
            DEFAULT_PROGRESS.as_millis()
        )));
    }
    Ok(WatchSpec {
        keys,
        start_revision: (r.start_revision != 0).then_some(r.start_revision),
        prev_value: r.prev_value,
        progress,
    })
}

/// A watch message in its typed form.
pub fn watch_message_to_wire(m: WatchMessage) -> v1::WatchReply {
    match m {
        WatchMessage::Progress { revision, behind } => v1::WatchReply {
            revision,
            behind,
            ..Default::default()
        },
        WatchMessage::Changes {
            revision,
            changes,
            previous_dropped,
        } => v1::WatchReply {
            revision,
            events: changes
                .into_iter()
                .map(|c| {
                    let kind = if c.current.is_some() {
                        EventType::Put
                    } else {
                        EventType::Delete
                    };
                    v1::WatchEvent {
                        r#type: kind as i32,
                        kv: c.current.map(|v| key_value_to_wire(c.key.clone(), v)),
                        prev_kv: c.previous.map(|v| key_value_to_wire(c.key.clone(), v)),
                        key: c.key,
                        prev_dropped: previous_dropped,
                    }
                })
                .collect(),
            ..Default::default()
        },
    }
}

/// Why a watch ended, in its typed form.
pub fn watch_error_to_wire(e: WatchError) -> v1::Error {
    let message = e.to_string();
    let base = |kind: ErrorKind| v1::Error {
        kind: kind as i32,
        message: message.clone(),
        retryable: matches!(kind, ErrorKind::WatchTooSlow | ErrorKind::TooManyWatches),
        ..Default::default()
    };
    match e {
        WatchError::Compacted { requested, oldest } => v1::Error {
            value: requested,
            min: oldest,
            ..base(ErrorKind::Compacted)
        },
        WatchError::FutureRevision { requested, next } => v1::Error {
            value: requested,
            max: next,
            ..base(ErrorKind::FutureRevision)
        },
        WatchError::TooSlow { resume_from } => v1::Error {
            value: resume_from,
            ..base(ErrorKind::WatchTooSlow)
        },
        WatchError::TooManyWatches { max, scope } => v1::Error {
            max,
            name: scope,
            ..base(ErrorKind::TooManyWatches)
        },
        WatchError::Refused(e) => command_error_to_wire(&e),
        WatchError::Replica(f) => f.into(),
    }
}

/// A typed watch reply: a message, or why the watch ended. An event that
/// breaks the schema ends it as a protocol fault.
pub fn watch_reply_from_wire(r: v1::WatchReply) -> Result<WatchMessage, WatchError> {
    if let Some(e) = r.error {
        return Err(watch_error_from_wire(e));
    }
    if r.events.is_empty() {
        return Ok(WatchMessage::Progress {
            revision: r.revision,
            behind: r.behind,
        });
    }
    let previous_dropped = r.events.iter().any(|e| e.prev_dropped);
    let mut changes = Vec::with_capacity(r.events.len());
    for e in r.events {
        let current = match EventType::try_from(e.r#type) {
            Ok(EventType::Put) => match e.kv {
                Some(kv) => Some(key_value_from_wire(kv).1),
                None => return Err(malformed_event("a put without its value")),
            },
            Ok(EventType::Delete) => None,
            _ => return Err(malformed_event("an event of an unknown type")),
        };
        changes.push(KeyChange {
            key: e.key,
            current,
            previous: e.prev_kv.map(|kv| key_value_from_wire(kv).1),
        });
    }
    Ok(WatchMessage::Changes {
        revision: r.revision,
        changes,
        previous_dropped,
    })
}

fn malformed_event(what: &str) -> WatchError {
    WatchError::Replica(ReplicaFailure::UnknownOutcome(format!(
        "the replica sent {what} in a watch"
    )))
}

fn watch_error_from_wire(e: v1::Error) -> WatchError {
    match ErrorKind::try_from(e.kind).unwrap_or(ErrorKind::Unspecified) {
        ErrorKind::Compacted => WatchError::Compacted {
            requested: e.value,
            oldest: e.min,
        },
        ErrorKind::FutureRevision => WatchError::FutureRevision {
            requested: e.value,
            next: e.max,
        },
        ErrorKind::WatchTooSlow => WatchError::TooSlow {
            resume_from: e.value,
        },
        ErrorKind::TooManyWatches => WatchError::TooManyWatches {
            max: e.max,
            scope: e.name,
        },
        _ => match error_from_wire(e) {
            Ok(refused) => WatchError::Refused(refused),
            Err(failure) => WatchError::Replica(failure),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::Versioned;

    fn v(value: &[u8], rev: u64) -> Versioned {
        Versioned {
            value: value.to_vec(),
            create_revision: 1,
            mod_revision: rev,
            version: rev,
        }
    }

    #[test]
    fn specs_go_to_the_wire_and_back() {
        for keys in [
            Selection::Key(b"k".to_vec()),
            Selection::Prefix(b"p/".to_vec()),
            Selection::Range {
                start: Vec::new(),
                end: None,
            },
            Selection::Range {
                start: b"a".to_vec(),
                end: Some(b"b".to_vec()),
            },
        ] {
            let spec = WatchSpec {
                keys,
                start_revision: Some(7),
                prev_value: true,
                progress: Duration::from_millis(250),
            };
            assert_eq!(
                watch_request_from_wire(watch_request_to_wire(&spec)),
                Ok(spec)
            );
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let ok = watch_request_to_wire(&WatchSpec::new(Selection::Key(b"k".to_vec())));
        for bad in [
            v1::WatchRequest {
                keys: None,
                ..ok.clone()
            },
            v1::WatchRequest {
                keys: Some(Keys::Prefix(Vec::new())),
                ..ok.clone()
            },
            v1::WatchRequest {
                keys: Some(Keys::Range(v1::KeyRange {
                    start: b"b".to_vec(),
                    end: Some(b"a".to_vec()),
                })),
                ..ok.clone()
            },
            v1::WatchRequest {
                progress_ms: 5,
                ..ok.clone()
            },
        ] {
            assert!(matches!(
                watch_request_from_wire(bad),
                Err(ReplicaFailure::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn messages_and_errors_go_to_the_wire_and_back() {
        let messages = [
            WatchMessage::Progress {
                revision: 9,
                behind: true,
            },
            WatchMessage::Changes {
                revision: 3,
                changes: vec![
                    KeyChange {
                        key: b"a".to_vec(),
                        current: Some(v(b"x", 3)),
                        previous: Some(v(b"w", 2)),
                    },
                    KeyChange {
                        key: b"b".to_vec(),
                        current: None,
                        previous: None,
                    },
                ],
                previous_dropped: false,
            },
        ];
        for m in messages {
            assert_eq!(
                watch_reply_from_wire(watch_message_to_wire(m.clone())),
                Ok(m)
            );
        }
        let errors = [
            WatchError::Compacted {
                requested: 1,
                oldest: 5,
            },
            WatchError::FutureRevision {
                requested: 10,
                next: 4,
            },
            WatchError::TooSlow { resume_from: 8 },
            WatchError::TooManyWatches {
                max: 3,
                scope: "connection".into(),
            },
            WatchError::Refused(CommandError::AuthRequired),
            WatchError::Replica(ReplicaFailure::Unavailable("stopping".into())),
        ];
        for e in errors {
            let reply = v1::WatchReply {
                error: Some(watch_error_to_wire(e.clone())),
                ..Default::default()
            };
            assert_eq!(watch_reply_from_wire(reply), Err(e));
        }
    }
}
