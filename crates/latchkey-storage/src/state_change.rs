//! [`StateChange`]: what the state machine tells the shell after committing,
//! so it can wake waiters and run countdowns without polling.

use latchkey_core::Event;

use crate::types::LogId;

/// One committed change of the state machine, in log order.
///
/// Published (see [`crate::StateMachine::subscribe`]) only after the write
/// batch holding the change is committed, so a reader that sees the change
/// announced also sees its effects through a [`crate::StateReader`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateChange {
    /// The entry `log_id` was applied and the core reported `events` for it
    /// (entries without events are not announced).
    Applied {
        /// The applied entry.
        log_id: LogId,
        /// What the core reported, in the order it happened.
        events: Vec<Event>,
    },
    /// The whole state was replaced by a snapshot up to `last_log_id`. The
    /// events of the entries it covers are not reported: whoever tracks
    /// waiters or countdowns must rebuild them from the state.
    SnapshotInstalled {
        /// The last entry the snapshot covers.
        last_log_id: Option<LogId>,
    },
}
