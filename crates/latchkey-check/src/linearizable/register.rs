//! The register model and a key's operations in the form the search needs.

use std::collections::{BTreeMap, BTreeSet};

use super::search::Model;
use crate::history::{History, Op, Operation, Outcome, RegisterOp};

/// Model state of an absent key.
pub(crate) const ABSENT: u32 = 0;
/// Model state "some value, unknown which": the start of a window cut out
/// of the middle of a history. Reads and successful CAS pin it down.
pub(crate) const ANY: u32 = u32::MAX;

/// A register operation with interned values (`ABSENT` or an id >= 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RegStep {
    /// A read that returned this value.
    Read(u32),
    /// A write of this value.
    Write(u32),
    /// A compare-and-put; `result` is `None` when unknown.
    Cas {
        expected: u32,
        new: u32,
        result: Option<bool>,
    },
}

/// The sequential register: the state after `s` takes effect in `state`,
/// or `None` if `s` could not have returned what it returned.
pub(crate) fn step(state: u32, s: &RegStep) -> Option<u32> {
    match *s {
        RegStep::Read(v) => (state == ANY || state == v).then_some(v),
        RegStep::Write(v) => Some(v),
        RegStep::Cas {
            expected,
            new,
            result: Some(true),
        } => (state == ANY || state == expected).then_some(new),
        RegStep::Cas {
            expected,
            result: Some(false),
            ..
        } => (state != expected).then_some(state),
        RegStep::Cas {
            expected,
            new,
            result: None,
        } => Some(if state == expected {
            new
        } else {
            // A mismatch changes nothing; from ANY either outcome is
            // possible, and ANY covers both.
            state
        }),
    }
}

/// The register as a [`Model`] for the search.
pub(crate) struct Register;

/// What a blocked operation needs the register to hold.
enum Need {
    /// One of these values.
    OneOf(BTreeSet<u32>),
    /// Anything but this value.
    Not(u32),
}

impl Model for Register {
    type State = u32;
    type Step = RegStep;

    fn step(&self, state: u32, s: &RegStep) -> Option<u32> {
        step(state, s)
    }

    /// Unknown writes and CAS that write what `blocked` needs, and, for a
    /// value needed, the unknown CAS that could produce it and what they
    /// in turn need (the chains), to a fixpoint.
    fn enablers(
        &self,
        _state: u32,
        blocked: &RegStep,
        available: &[(usize, &RegStep)],
    ) -> Vec<usize> {
        let writes = |s: &RegStep| match *s {
            RegStep::Write(v) => Some(v),
            RegStep::Cas { new, .. } => Some(new),
            RegStep::Read(_) => None,
        };
        let need = match *blocked {
            RegStep::Read(v)
            | RegStep::Cas {
                expected: v,
                result: Some(true),
                ..
            } => Need::OneOf(BTreeSet::from([v])),
            RegStep::Cas {
                expected,
                result: Some(false),
                ..
            } => Need::Not(expected),
            // Never blocked.
            RegStep::Write(_) | RegStep::Cas { result: None, .. } => return Vec::new(),
        };
        match need {
            Need::Not(f) => available
                .iter()
                .filter(|(_, s)| writes(s).is_some_and(|v| v != f))
                .map(|(i, _)| *i)
                .collect(),
            Need::OneOf(mut values) => {
                loop {
                    let before = values.len();
                    for (_, s) in available {
                        if let RegStep::Cas { expected, new, .. } = **s {
                            if values.contains(&new) {
                                values.insert(expected);
                            }
                        }
                    }
                    if values.len() == before {
                        break;
                    }
                }
                available
                    .iter()
                    .filter(|(_, s)| writes(s).is_some_and(|v| values.contains(&v)))
                    .map(|(i, _)| *i)
                    .collect()
            }
        }
    }
}

/// One operation on one key.
#[derive(Debug, Clone)]
pub(crate) struct KeyOp<'h> {
    /// The operation in the history.
    pub operation: &'h Operation,
    /// Rank of the invocation in the key's real-time order.
    pub call: usize,
    /// Rank of the ok completion; `None` when the outcome is unknown.
    pub done: Option<usize>,
    /// Rank of the completion event of any kind, for witnesses.
    pub end_event: Option<usize>,
    /// What the model is given.
    pub step: RegStep,
}

/// The operations of one key, and how many event ranks they span.
#[derive(Debug, Clone)]
pub(crate) struct KeyHistory<'h> {
    pub ops: Vec<KeyOp<'h>>,
    pub ranks: usize,
}

/// Interned values: `ABSENT` is 0, [`UNSEEN`] stands for every value no
/// operation ever compares with (never read, never a CAS's expected value:
/// such values behave alike in every state, so merging them lets the memo
/// recognise more equal states), the others count from 2.
#[derive(Default)]
struct Values<'h> {
    observed: BTreeSet<&'h str>,
    ids: BTreeMap<&'h str, u32>,
}

/// The id of all values nothing ever compares with.
const UNSEEN: u32 = 1;

impl<'h> Values<'h> {
    /// Records a value that some operation compares the register with.
    fn observe(&mut self, v: Option<&'h String>) {
        if let Some(v) = v {
            self.observed.insert(v.as_str());
        }
    }

    fn id(&mut self, v: Option<&'h String>) -> u32 {
        let Some(v) = v else { return ABSENT };
        if !self.observed.contains(v.as_str()) {
            return UNSEEN;
        }
        let next = self.ids.len() as u32 + 2;
        *self.ids.entry(v.as_str()).or_insert(next)
    }
}

fn key_of(reg: &RegisterOp) -> &str {
    match reg {
        RegisterOp::Read { key, .. }
        | RegisterOp::Write { key, .. }
        | RegisterOp::Cas { key, .. } => key.as_str(),
    }
}

/// Splits the register operations by key (keys are independent registers)
/// and drops those that carry no information: failed operations did not
/// take effect; reads of unknown outcome returned nothing.
pub(crate) fn per_key(history: &History) -> BTreeMap<&str, KeyHistory<'_>> {
    let register_ops = || {
        history.operations().iter().filter_map(|op| match op.op() {
            Op::Register(reg) if op.outcome() != Outcome::Fail => Some((op, reg)),
            _ => None,
        })
    };
    let mut values: BTreeMap<&str, Values> = BTreeMap::new();
    for (op, reg) in register_ops() {
        let ids = values.entry(key_of(reg)).or_default();
        match reg {
            RegisterOp::Read { value, .. } if op.outcome() == Outcome::Ok => {
                ids.observe(value.as_ref())
            }
            RegisterOp::Cas { expected, .. } => ids.observe(expected.as_ref()),
            _ => {}
        }
    }
    let mut chosen: BTreeMap<&str, Vec<(&Operation, RegStep)>> = BTreeMap::new();
    for (op, reg) in register_ops() {
        let outcome = op.outcome();
        let key = key_of(reg);
        let ids = values.entry(key).or_default();
        let s = match reg {
            RegisterOp::Read { value, .. } => {
                if outcome != Outcome::Ok {
                    continue;
                }
                RegStep::Read(ids.id(value.as_ref()))
            }
            RegisterOp::Write { value, .. } => RegStep::Write(ids.id(Some(value))),
            RegisterOp::Cas {
                expected,
                new,
                succeeded,
                ..
            } => RegStep::Cas {
                expected: ids.id(expected.as_ref()),
                new: ids.id(Some(new)),
                result: if outcome == Outcome::Ok {
                    *succeeded
                } else {
                    None
                },
            },
        };
        chosen.entry(key).or_default().push((op, s));
    }
    chosen
        .into_iter()
        .map(|(key, ops)| (key, ranked(ops)))
        .collect()
}

/// Ranks the events of a key's operations in real-time order: by time,
/// invocations before completions at equal times (equal times count as
/// concurrent), then by index.
fn ranked<'h>(ops: Vec<(&'h Operation, RegStep)>) -> KeyHistory<'h> {
    // (time, phase, index, op, is completion)
    let mut events: Vec<(u64, u8, u64, usize)> = Vec::with_capacity(ops.len() * 2);
    for (i, (op, _)) in ops.iter().enumerate() {
        events.push((op.invoke.time_ns, 0, op.invoke.index, i));
        if let Some(c) = &op.completion {
            events.push((c.time_ns, 1, c.index, i));
        }
    }
    events.sort_unstable();
    let mut call = vec![0; ops.len()];
    let mut end_event = vec![None; ops.len()];
    for (rank, &(_, phase, _, i)) in events.iter().enumerate() {
        if phase == 0 {
            call[i] = rank;
        } else {
            end_event[i] = Some(rank);
        }
    }
    let ranks = events.len();
    let ops = ops
        .into_iter()
        .enumerate()
        .map(|(i, (operation, step))| KeyOp {
            operation,
            call: call[i],
            done: if operation.outcome() == Outcome::Ok {
                end_event[i]
            } else {
                None
            },
            end_event: end_event[i],
            step,
        })
        .collect();
    KeyHistory { ops, ranks }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_steps() {
        let (a, b) = (2, 3);
        assert_eq!(step(ABSENT, &RegStep::Read(ABSENT)), Some(ABSENT));
        assert_eq!(step(a, &RegStep::Read(b)), None);
        assert_eq!(step(ANY, &RegStep::Read(b)), Some(b));
        assert_eq!(step(a, &RegStep::Write(b)), Some(b));
        let cas = |result| RegStep::Cas {
            expected: a,
            new: b,
            result,
        };
        assert_eq!(step(a, &cas(Some(true))), Some(b));
        assert_eq!(step(ABSENT, &cas(Some(true))), None);
        assert_eq!(step(ANY, &cas(Some(true))), Some(b));
        assert_eq!(step(a, &cas(Some(false))), None);
        assert_eq!(step(ABSENT, &cas(Some(false))), Some(ABSENT));
        assert_eq!(step(ANY, &cas(Some(false))), Some(ANY));
        assert_eq!(step(a, &cas(None)), Some(b));
        assert_eq!(step(ABSENT, &cas(None)), Some(ABSENT));
    }
}
