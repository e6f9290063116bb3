//! Whether a membership a peer sends (in a log entry or a snapshot) is one
//! openraft can work with.
//!
//! openraft's own constructor checks this, but a membership decoded from a
//! message is built without it; a voter with no node makes openraft's core
//! panic (`get_node(..).unwrap()`) at its next election, in release builds
//! too.

use latchkey_storage::types::Membership;

/// Whether `membership` has one voter set (or two, while a change is under
/// way), none empty, and a node for every voter.
pub(crate) fn check_membership(membership: &Membership) -> Result<(), String> {
    let configs = membership.get_joint_config();
    if configs.is_empty() || configs.len() > 2 {
        return Err(format!(
            "a membership has one voter set, or two during a change; this one has {}",
            configs.len()
        ));
    }
    if configs.iter().any(|voters| voters.is_empty()) {
        return Err("a membership's voter set is empty".to_string());
    }
    if let Some(voter) = membership
        .voter_ids()
        .find(|id| membership.get_node(id).is_none())
    {
        return Err(format!(
            "the membership names node {voter} as a voter but gives no address for it"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use latchkey_storage::types::Member;

    use super::*;

    fn set(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    fn nodes(ids: &[u64]) -> BTreeMap<u64, Member> {
        ids.iter().map(|id| (*id, Member::default())).collect()
    }

    /// A membership as a message decodes it: without openraft's checks.
    fn decoded(configs: Vec<BTreeSet<u64>>, with_nodes: &[u64]) -> Membership {
        let mut value = serde_json::to_value(Membership::new_with_defaults(configs, [])).unwrap();
        value["nodes"] = serde_json::to_value(nodes(with_nodes)).unwrap();
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn memberships_openraft_builds_pass() {
        let one = Membership::new(vec![set(&[1, 2, 3])], nodes(&[1, 2, 3, 4])).unwrap();
        assert_eq!(check_membership(&one), Ok(()));
        let joint =
            Membership::new(vec![set(&[1, 2, 3]), set(&[2, 3, 4])], nodes(&[1, 2, 3, 4])).unwrap();
        assert_eq!(check_membership(&joint), Ok(()));
        assert_eq!(check_membership(&decoded(vec![set(&[1])], &[1, 5])), Ok(()));
    }

    #[test]
    fn a_voter_without_a_node_is_refused() {
        let refused = check_membership(&decoded(vec![set(&[1, 2, 99])], &[1, 2]));
        assert!(refused.is_err_and(|e| e.contains("node 99")));
    }

    #[test]
    fn no_voter_set_an_empty_one_or_three_are_refused() {
        assert!(check_membership(&decoded(Vec::new(), &[1])).is_err());
        assert!(check_membership(&decoded(vec![set(&[1]), set(&[])], &[1])).is_err());
        let three = decoded(vec![set(&[1]), set(&[1]), set(&[1])], &[1]);
        assert!(check_membership(&three).is_err_and(|e| e.contains("has 3")));
    }
}
