//! Staging for lock commands: they run against an [`Overlay`](crate::overlay::Overlay) of the store,
//! and only if the command fully succeeds are the overlay's writes handed to
//! the real store, in key order. A refused command therefore writes nothing
//! by construction, whatever point it was refused at.

use std::collections::BTreeMap;

pub(crate) use crate::overlay::Overlay as Staged;
use crate::{Store, StoreError};

/// Apply staged writes to `store`, in key order.
pub(crate) fn commit<S: Store>(
    store: &mut S,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
) -> Result<(), StoreError> {
    for (k, v) in writes {
        match v {
            Some(v) => store.put(&k, &v)?,
            None => store.delete(&k)?,
        }
    }
    Ok(())
}
