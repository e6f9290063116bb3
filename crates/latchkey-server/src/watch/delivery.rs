//! What the feed hands every watch ([`Published`]: a record, encoded for
//! the wire at most once however many watches send it) and what a watch
//! hands its caller ([`Delivery`]).
//!
//! With many watches on one prefix every record goes whole to each of them.
//! Each watch cloning the record's changes and encoding its own copy was
//! the larger part of a replica's work with 1,000 watchers (allocation,
//! copying and protobuf encoding, once per watch per record); a record sent
//! whole is now encoded once, on first need, and every gRPC watch sends the
//! same bytes. A watch that takes only part of a record, and every progress
//! notice, is still its own message.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use latchkey_core::history::{KeyChange, Record};
use latchkey_proto::wire::{watch_message_to_wire, WatchError, WatchMessage};
use prost::Message;

/// A record as the feed publishes it.
#[derive(Debug)]
pub(crate) struct Published {
    record: Record,
    /// The whole record's `WatchReply` encoding: without, then with the
    /// previous values.
    wire: [OnceLock<Bytes>; 2],
}

impl Published {
    pub(crate) fn new(record: Record) -> Arc<Self> {
        Arc::new(Published {
            record,
            wire: [OnceLock::new(), OnceLock::new()],
        })
    }

    pub(crate) fn record(&self) -> &Record {
        &self.record
    }

    /// Every change of the record, as one watch message; previous values
    /// only when `prev_value`.
    fn message(&self, prev_value: bool) -> WatchMessage {
        changes_message(&self.record, self.record.changes.iter(), prev_value)
    }

    /// [`Self::message`] encoded as a `WatchReply`, computed once.
    fn encoded(&self, prev_value: bool) -> Bytes {
        self.wire[usize::from(prev_value)]
            .get_or_init(|| encode(self.message(prev_value)))
            .clone()
    }
}

/// `changes` of `record` as one watch message; previous values only when
/// `prev_value`.
pub(crate) fn changes_message<'a>(
    record: &Record,
    changes: impl Iterator<Item = &'a KeyChange>,
    prev_value: bool,
) -> WatchMessage {
    WatchMessage::Changes {
        revision: record.revision,
        changes: changes
            .map(|c| KeyChange {
                key: c.key.clone(),
                current: c.current.clone(),
                previous: if prev_value { c.previous.clone() } else { None },
            })
            .collect(),
        previous_dropped: record.previous_dropped && prev_value,
    }
}

/// A message as the `Watch` RPC sends it: an encoded `WatchReply`.
pub(crate) fn encode(message: WatchMessage) -> Bytes {
    Bytes::from(watch_message_to_wire(message).encode_to_vec())
}

/// What a watch hands its caller.
#[derive(Debug)]
pub(crate) enum Delivery {
    /// A message of this watch's own.
    Message(WatchMessage),
    /// Every change of a published record, shared with the other watches
    /// that take it whole.
    Whole {
        record: Arc<Published>,
        prev_value: bool,
    },
}

impl From<WatchMessage> for Delivery {
    fn from(message: WatchMessage) -> Self {
        Delivery::Message(message)
    }
}

impl Delivery {
    /// The revision a watch ended at this delivery resumes from.
    pub(crate) fn resume_from(&self) -> u64 {
        match self {
            Delivery::Message(WatchMessage::Changes { revision, .. }) => *revision,
            Delivery::Message(WatchMessage::Progress { revision, .. }) => revision + 1,
            Delivery::Whole { record, .. } => record.record.revision,
        }
    }

    /// As a message, for a caller in this process.
    pub(crate) fn into_message(self) -> WatchMessage {
        match self {
            Delivery::Message(m) => m,
            Delivery::Whole { record, prev_value } => record.message(prev_value),
        }
    }

    /// As the `Watch` RPC sends it: an encoded `WatchReply`.
    pub(crate) fn into_wire(self) -> Bytes {
        match self {
            Delivery::Message(m) => encode(m),
            Delivery::Whole { record, prev_value } => record.encoded(prev_value),
        }
    }
}

/// A watch's deliveries, then, if it ended with one, why it ended.
pub(crate) type Deliveries =
    Pin<Box<dyn futures::Stream<Item = Result<Delivery, WatchError>> + Send + 'static>>;

#[cfg(test)]
mod tests {
    use latchkey_core::command::Versioned;
    use latchkey_proto::v1;
    use latchkey_proto::wire::watch_reply_from_wire;

    use super::*;

    fn versioned(value: &[u8], revision: u64) -> Versioned {
        Versioned {
            value: value.to_vec(),
            create_revision: 1,
            mod_revision: revision,
            version: revision,
        }
    }

    fn record() -> Record {
        Record {
            revision: 7,
            changes: vec![
                KeyChange {
                    key: b"a".to_vec(),
                    current: Some(versioned(b"new", 7)),
                    previous: Some(versioned(b"old", 6)),
                },
                KeyChange {
                    key: b"b".to_vec(),
                    current: None,
                    previous: Some(versioned(b"gone", 5)),
                },
            ],
            previous_dropped: false,
        }
    }

    /// The shared encoding says exactly what the watch's own message says,
    /// with and without previous values, each time it is asked.
    #[test]
    fn a_whole_record_encodes_as_its_own_message_does() {
        let published = Published::new(record());
        for prev_value in [false, true] {
            let own = changes_message(&record(), record().changes.iter(), prev_value);
            for _ in 0..2 {
                let whole = Delivery::Whole {
                    record: Arc::clone(&published),
                    prev_value,
                };
                assert_eq!(whole.resume_from(), 7);
                let reply = v1::WatchReply::decode(whole.into_wire()).unwrap();
                assert_eq!(watch_reply_from_wire(reply), Ok(own.clone()));
                let whole = Delivery::Whole {
                    record: Arc::clone(&published),
                    prev_value,
                };
                assert_eq!(whole.into_message(), own);
            }
        }
        let WatchMessage::Changes { changes, .. } =
            changes_message(&record(), record().changes.iter(), false)
        else {
            panic!("changes expected");
        };
        assert!(changes.iter().all(|c| c.previous.is_none()));
    }
}
