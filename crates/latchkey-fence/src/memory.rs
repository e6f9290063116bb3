//! [`MemoryFenceGate`]: the gate that forgets when the process ends.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::error::FenceError;
use crate::gate::FenceGate;
use crate::rule::{decide, Admission};
use crate::table::lock_table;
#[cfg(doc)]
use crate::FileFenceGate;

/// A fence gate held in memory: fast, and forgets everything when the
/// process ends. Fit for tests and for storage whose own contents do not
/// outlive the process; otherwise use [`FileFenceGate`].
#[derive(Debug, Default)]
pub struct MemoryFenceGate {
    highest: Mutex<BTreeMap<String, u64>>,
}

impl MemoryFenceGate {
    /// An empty gate: no token seen for any resource.
    pub fn new() -> Self {
        Self::default()
    }
}

impl FenceGate for MemoryFenceGate {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let mut table = lock_table(&self.highest);
        let admission = decide(resource, token, table.get(resource).copied())?;
        if let Admission::Raised { .. } = admission {
            table.insert(resource.to_owned(), token);
        }
        Ok(admission)
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        Ok(lock_table(&self.highest).get(resource).copied())
    }
}
