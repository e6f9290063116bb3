//! The parts of a conditional write (its conditions and its puts and
//! deletes), as `Batch` and `FencedWrite` requests both carry them, to their
//! typed messages and back.

use latchkey_core::{BatchOp, Condition};

use super::fault::invalid;
use crate::v1;
use crate::ReplicaFailure;

/// A put's typed message: a `Put`-shaped request, or a batch's put.
pub(super) fn put(key: &[u8], value: &[u8]) -> v1::PutRequest {
    v1::PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

/// A write's conditions in their typed form.
pub(super) fn conditions_to_wire(conditions: &[Condition]) -> Vec<v1::Condition> {
    conditions
        .iter()
        .map(|Condition::ValueIs { key, expected }| v1::Condition {
            key: key.clone(),
            expected: expected.clone(),
        })
        .collect()
}

/// A request's typed conditions.
pub(super) fn conditions_from_wire(conditions: Vec<v1::Condition>) -> Vec<Condition> {
    conditions
        .into_iter()
        .map(|c| Condition::ValueIs {
            key: c.key,
            expected: c.expected,
        })
        .collect()
}

/// A write's puts and deletes in their typed form.
pub(super) fn ops_to_wire(ops: &[BatchOp]) -> Vec<v1::BatchOp> {
    ops.iter()
        .map(|op| v1::BatchOp {
            op: Some(match op {
                BatchOp::Put { key, value } => v1::batch_op::Op::Put(put(key, value)),
                BatchOp::Delete { key } => {
                    v1::batch_op::Op::Delete(v1::DeleteRequest { key: key.clone() })
                }
            }),
        })
        .collect()
}

/// A request's typed puts and deletes; an op that is neither is an invalid
/// argument naming its index.
pub(super) fn ops_from_wire(ops: Vec<v1::BatchOp>) -> Result<Vec<BatchOp>, ReplicaFailure> {
    ops.into_iter()
        .enumerate()
        .map(|(i, op)| match op.op {
            Some(v1::batch_op::Op::Put(p)) => Ok(BatchOp::Put {
                key: p.key,
                value: p.value,
            }),
            Some(v1::batch_op::Op::Delete(d)) => Ok(BatchOp::Delete { key: d.key }),
            None => Err(invalid(format!("ops[{i}] has neither `put` nor `delete`"))),
        })
        .collect()
}
