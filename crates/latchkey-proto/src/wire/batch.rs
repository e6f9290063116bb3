//! The parts of a conditional write (its conditions and its puts and
//! deletes), as `Batch` and `FencedWrite` requests both carry them, to their
//! typed messages and back.

use latchkey_core::{BatchOp, Compare, Condition, RevisionField, Test, Versioned};

use super::fault::invalid;
use crate::v1;
use crate::ReplicaFailure;

/// A put's typed message: a `Put`-shaped request, or a batch's put.
pub(super) fn put(key: &[u8], value: &[u8]) -> v1::PutRequest {
    v1::PutRequest {
        key: key.to_vec(),
        value: value.to_vec(),
        ..Default::default()
    }
}

/// A write's conditions in their typed form.
pub(super) fn conditions_to_wire(conditions: &[Condition]) -> Vec<v1::Condition> {
    conditions
        .iter()
        .map(|c| v1::Condition {
            key: c.key.clone(),
            test: Some(test_to_wire(&c.test)),
        })
        .collect()
}

/// A request's typed conditions; one without a test is an invalid argument
/// naming its index.
pub(super) fn conditions_from_wire(
    conditions: Vec<v1::Condition>,
) -> Result<Vec<Condition>, ReplicaFailure> {
    conditions
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let test =
                test_from_wire(c.test).map_err(|why| invalid(format!("conditions[{i}]: {why}")))?;
            Ok(Condition::new(c.key, test))
        })
        .collect()
}

/// A key test in its typed form.
pub(super) fn test_to_wire(test: &Test) -> v1::Test {
    use v1::test::Test as T;
    let test = match test {
        Test::ValueIs(Some(value)) => T::Value(value.clone()),
        Test::ValueIs(None) => T::Absent(v1::Absent {}),
        Test::Exists(exists) => T::Exists(*exists),
        Test::Revision {
            field,
            compare,
            value,
        } => T::Revision(v1::RevisionTest {
            field: match field {
                RevisionField::Create => v1::RevisionField::Create,
                RevisionField::Mod => v1::RevisionField::Mod,
                RevisionField::Version => v1::RevisionField::Version,
            } as i32,
            comparison: match compare {
                Compare::Equal => v1::Comparison::Equal,
                Compare::NotEqual => v1::Comparison::NotEqual,
                Compare::Less => v1::Comparison::Less,
                Compare::Greater => v1::Comparison::Greater,
            } as i32,
            value: *value,
        }),
    };
    v1::Test { test: Some(test) }
}

/// A request's key test; a missing test, field or comparison is refused
/// with what is wrong.
pub(super) fn test_from_wire(test: Option<v1::Test>) -> Result<Test, String> {
    use v1::test::Test as T;
    let Some(test) = test.and_then(|t| t.test) else {
        return Err("no test: set one of `value`, `absent`, `exists` or `revision`".into());
    };
    Ok(match test {
        T::Value(value) => Test::ValueIs(Some(value)),
        T::Absent(_) => Test::ValueIs(None),
        T::Exists(exists) => Test::Exists(exists),
        T::Revision(r) => Test::Revision {
            field: match v1::RevisionField::try_from(r.field) {
                Ok(v1::RevisionField::Create) => RevisionField::Create,
                Ok(v1::RevisionField::Mod) => RevisionField::Mod,
                Ok(v1::RevisionField::Version) => RevisionField::Version,
                Ok(v1::RevisionField::Unspecified) | Err(_) => {
                    return Err(format!(
                        "revision test has no known `field` ({}): use CREATE, MOD or VERSION",
                        r.field
                    ))
                }
            },
            compare: match v1::Comparison::try_from(r.comparison) {
                Ok(v1::Comparison::Equal) => Compare::Equal,
                Ok(v1::Comparison::NotEqual) => Compare::NotEqual,
                Ok(v1::Comparison::Less) => Compare::Less,
                Ok(v1::Comparison::Greater) => Compare::Greater,
                Ok(v1::Comparison::Unspecified) | Err(_) => {
                    return Err(format!(
                        "revision test has no known `comparison` ({}): use EQUAL, NOT_EQUAL, \
                         LESS or GREATER",
                        r.comparison
                    ))
                }
            },
            value: r.value,
        },
    })
}

/// A key's value and revisions in their typed form.
pub(super) fn key_value_to_wire(key: Vec<u8>, v: Versioned) -> v1::KeyValue {
    v1::KeyValue {
        key,
        value: v.value,
        create_revision: v.create_revision,
        mod_revision: v.mod_revision,
        version: v.version,
    }
}

/// A reply's key and value with its revisions.
pub(super) fn key_value_from_wire(kv: v1::KeyValue) -> (Vec<u8>, Versioned) {
    (
        kv.key,
        Versioned {
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
        },
    )
}

/// A write's puts and deletes in their typed form.
pub(super) fn ops_to_wire(ops: &[BatchOp]) -> Vec<v1::BatchOp> {
    ops.iter()
        .map(|op| v1::BatchOp {
            op: Some(match op {
                BatchOp::Put { key, value } => v1::batch_op::Op::Put(put(key, value)),
                BatchOp::Delete { key } => v1::batch_op::Op::Delete(v1::DeleteRequest {
                    key: key.clone(),
                    once: None,
                }),
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
            Some(v1::batch_op::Op::Put(p)) if p.session != 0 || !p.session_secret.is_empty() => {
                Err(invalid(format!(
                    "ops[{i}]: a batch's put cannot bind a key to a session (use put)"
                )))
            }
            Some(v1::batch_op::Op::Put(v1::PutRequest { once: Some(_), .. }))
            | Some(v1::batch_op::Op::Delete(v1::DeleteRequest { once: Some(_), .. })) => {
                Err(invalid(format!(
                    "ops[{i}]: a batch's op cannot be made retry-safe on its own (set the \
                     batch's `once`)"
                )))
            }
            Some(v1::batch_op::Op::Put(p)) => Ok(BatchOp::Put {
                key: p.key,
                value: p.value,
            }),
            Some(v1::batch_op::Op::Delete(d)) => Ok(BatchOp::Delete { key: d.key }),
            None => Err(invalid(format!("ops[{i}] has neither `put` nor `delete`"))),
        })
        .collect()
}
