//! [`Applied`]: the result of one step of applying a lock command, and
//! [`ApplyError`], why it stopped. Every file that applies a part of a
//! command imports it; it imports no sibling.

use crate::{CommandError, StoreError};

/// Why applying a lock command stopped: the store failed (fatal for the
/// replica) or the command was refused (the client's answer).
#[derive(Debug)]
pub(crate) enum ApplyError {
    Store(StoreError),
    Refused(CommandError),
}

impl From<StoreError> for ApplyError {
    fn from(e: StoreError) -> Self {
        ApplyError::Store(e)
    }
}

impl From<CommandError> for ApplyError {
    fn from(e: CommandError) -> Self {
        ApplyError::Refused(e)
    }
}

/// The result of a step of a lock command.
pub(crate) type Applied<T> = Result<T, ApplyError>;
