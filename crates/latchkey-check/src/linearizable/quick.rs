//! Violations that need no search: each is shown by one or two operations.
//!
//! The search can drown in long histories full of unknown operations (each
//! may or may not have taken effect, so their subsets multiply), yet the
//! most common bugs are visible locally. Before searching a key, look for:
//!
//! - **a value nobody wrote**: an ok read (or a successful CAS's expected
//!   value) that no write or CAS that did not fail ever wrote;
//! - **a future read**: an ok read of a value whose every writer was
//!   invoked after the read completed;
//! - **a lost first write**: an ok read of "absent" (or a successful CAS
//!   expecting absence) after a write definitely completed (nothing deletes
//!   a register, so once written a key is never absent again).
//!
//! Each finding is a true violation, so it can fail the verdict at once.

use std::collections::BTreeMap;

use super::register::{KeyHistory, KeyOp, RegStep, ABSENT};

/// A violation: what it is and which ops (indices into the key's ops) show
/// it.
pub(crate) struct Finding {
    pub message: String,
    pub ops: Vec<usize>,
}

/// The value an operation may leave in the register, if it may write.
fn written(op: &KeyOp) -> Option<u32> {
    match op.step {
        RegStep::Write(v) => Some(v),
        RegStep::Cas {
            new,
            result: Some(true) | None,
            ..
        } => Some(new),
        _ => None,
    }
}

/// The value an ok operation observed in the register, if any.
fn observed(op: &KeyOp) -> Option<u32> {
    match op.step {
        RegStep::Read(v) => Some(v),
        RegStep::Cas {
            expected,
            result: Some(true),
            ..
        } => Some(expected),
        _ => None,
    }
}

/// The first local violation, in invocation order, if any.
pub(crate) fn find(key: &KeyHistory) -> Option<Finding> {
    // The first definitely completed write: its ok completion rank.
    let first_write = key
        .ops
        .iter()
        .enumerate()
        .filter(|(_, op)| {
            matches!(
                op.step,
                RegStep::Write(_)
                    | RegStep::Cas {
                        result: Some(true),
                        ..
                    }
            )
        })
        .filter_map(|(i, op)| op.done.map(|d| (d, i)))
        .min();
    let mut writers: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (j, w) in key.ops.iter().enumerate() {
        if let Some(v) = written(w) {
            writers.entry(v).or_default().push(j);
        }
    }
    let mut order: Vec<usize> = (0..key.ops.len()).collect();
    order.sort_by_key(|&i| key.ops[i].call);
    for i in order {
        let op = &key.ops[i];
        let (Some(seen), Some(_)) = (observed(op), op.done) else {
            continue;
        };
        if seen == ABSENT {
            if let Some((done, w)) = first_write {
                if done < op.call {
                    return Some(Finding {
                        message: "the key is absent after a write to it completed".to_owned(),
                        ops: vec![w, i],
                    });
                }
            }
            continue;
        }
        let writers = writers.get(&seen).map_or(&[][..], Vec::as_slice);
        if writers.is_empty() {
            return Some(Finding {
                message: "it observed a value that no operation wrote".to_owned(),
                ops: vec![i],
            });
        }
        let read_done = op.done.unwrap_or(usize::MAX);
        if writers.iter().all(|&j| key.ops[j].call > read_done) {
            let mut ops = vec![i];
            ops.extend(writers.iter().copied());
            return Some(Finding {
                message: "it observed a value before any write of it was invoked".to_owned(),
                ops,
            });
        }
    }
    None
}
