//! Whether a vote a peer's message carries is its sender's own: a leader's
//! and a candidate's messages both carry the vote naming the node that
//! sends them, and a replica never sends itself a message.

use latchkey_storage::types::Vote;

/// Whether `vote`, in a message sent by node `from` to replica `me`, names
/// its sender, and the sender is not `me`.
pub(crate) fn check_own_vote(vote: &Vote, from: u64, me: u64) -> Result<(), String> {
    if vote.leader_id.node_id != from {
        return Err(format!(
            "the message's vote {vote} names node {}, but node {from} sent it",
            vote.leader_id.node_id
        ));
    }
    if from == me {
        return Err(format!(
            "the message claims to come from this replica's own id {me}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_senders_own_vote_passes() {
        assert_eq!(check_own_vote(&Vote::new(7, 2), 2, 1), Ok(()));
        assert_eq!(check_own_vote(&Vote::new_committed(7, 2), 2, 1), Ok(()));
        let other = check_own_vote(&Vote::new(7, 3), 2, 1);
        assert!(other.is_err_and(|e| e.contains("but node 2 sent it")));
        let myself = check_own_vote(&Vote::new(7, 1), 1, 1);
        assert!(myself.is_err_and(|e| e.contains("own id")));
    }
}
