//! The in-process token table shared by the memory and file gates.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Lock a gate's table. A panic while holding the lock cannot leave the
/// table half-updated (each admission changes it with one `insert`, after
/// any I/O), so a poisoned lock is simply taken over.
pub(crate) fn lock_table<T>(table: &Mutex<T>) -> MutexGuard<'_, T> {
    table.lock().unwrap_or_else(PoisonError::into_inner)
}
