//! Proptest strategies shared by the core's test files and the storage
//! crate's model test (`apply_model.rs`, by path).

use latchkey_core::{Compare, RevisionField, Test};
use proptest::prelude::*;

/// Every kind of key test: a value drawn from `values`, existence, or any
/// revision field compared any way to a number drawn from `numbers`.
pub fn key_test(
    values: impl Strategy<Value = Vec<u8>> + 'static,
    numbers: impl Strategy<Value = u64> + 'static,
) -> impl Strategy<Value = Test> {
    let field = prop_oneof![
        Just(RevisionField::Create),
        Just(RevisionField::Mod),
        Just(RevisionField::Version),
    ];
    let compare = prop_oneof![
        Just(Compare::Equal),
        Just(Compare::NotEqual),
        Just(Compare::Less),
        Just(Compare::Greater),
    ];
    prop_oneof![
        2 => prop::option::of(values).prop_map(Test::ValueIs),
        1 => any::<bool>().prop_map(Test::Exists),
        2 => (field, compare, numbers).prop_map(|(field, compare, value)| Test::Revision {
            field,
            compare,
            value,
        }),
    ]
}
