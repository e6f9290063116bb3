//! Watches: telling clients of every change to the keys they watch, in
//! revision order, from this replica's applied state.
//!
//! The state machine writes each revision's record into the watch history
//! ([`latchkey_core::history`]) in the batch that applies it, and publishes
//! the revision once the batch is committed
//! (`latchkey_storage::StateMachine::revisions`). One task per replica
//! ([`feed::run`]) reads each new record once and hands it to every open
//! watch through a bounded broadcast ring ([`FEED_RING`] records). A watch
//! ([`one::start`]) first sends what the history holds from its start
//! revision up to the revision the feed had published when the watch
//! subscribed, then follows the feed, skipping what it already sent. So a
//! watch misses nothing and repeats nothing, whatever it starts from.
//!
//! A follower serves watches from its own applied state: it never sends a
//! change it has not applied, and its progress notices say `behind` while
//! it holds log entries it has not applied or knows no leader.
//!
//! Nothing here stalls the replica: applying never waits for the feed (it
//! only sets a `watch` value), the feed never waits for a watch (a watch
//! that falls [`FEED_RING`] records behind the feed is ended), and a watch
//! whose caller does not take its messages ([`one::BUFFER`] are queued) for
//! [`one::SLOW_AFTER`] is ended with `TooSlow`, naming the revision to
//! resume from. So one watch holds at most [`one::BUFFER`] messages, and
//! the ring is shared by all. A record the ring holds keeps, once a gRPC
//! watch sent it whole, its encodings too (`delivery::Published`: with and
//! without previous values, at most about twice the record's bytes again),
//! and a message queued whole is that shared record, not a copy.
//!
//! Rooms: `places` (the counts of open watches against their limits),
//! `hub` (what the feed and the watches share: the ring, the revision
//! published, the places), `feed` (the task), `one` (a watch). `hub`
//! imports `places`; `feed` and `one` import `hub`. Nothing here imports the
//! replica: the replica owns the hub, and `crate::watch_service` (the gRPC
//! `Watch` service) checks the caller with the replica before it opens a
//! watch here.

mod delivery;
mod feed;
mod hub;
mod one;
mod places;

pub(crate) use delivery::{Deliveries, Delivery};
pub(crate) use feed::run as run_feed;
pub(crate) use hub::{SharedReader, WatchHub};
pub(crate) use one::start;
pub(crate) use places::WatchLimits;

/// Records the feed's ring holds: a watch that falls further behind the
/// feed than this is ended (`TooSlow`) and resumes from the history.
pub(crate) const FEED_RING: usize = 1024;
