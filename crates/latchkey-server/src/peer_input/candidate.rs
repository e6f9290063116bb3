//! What a vote or pre-vote request must look like before openraft sees it
//! (see the module docs of `peer_input`).

use latchkey_storage::types::{LogId, Vote};

use super::bounds;
use super::sender::check_own_vote;

/// Whether a vote or pre-vote request sent by node `from` to replica `me`,
/// standing with `vote` on a log ending at `last_log_id`, is one a
/// candidate sends: its own vote, not committed (a committed vote names a
/// leader already elected: openraft would make this replica follow, or
/// lead, without an election), and no log entry of a later leadership than
/// the one it stands for.
///
/// ```ignore
/// // Node 2 asks node 1 to vote for node 3.
/// assert!(check_candidate_vote(&Vote::new(7, 3), None, 2, 1).is_err());
/// ```
pub(crate) fn check_candidate_vote(
    vote: &Vote,
    last_log_id: Option<&LogId>,
    from: u64,
    me: u64,
) -> Result<(), String> {
    bounds::check_vote(vote)?;
    bounds::check_log_ids([last_log_id])?;
    if vote.committed {
        return Err(format!(
            "a candidate asks with a vote not yet granted; this request's vote {vote} is \
             committed"
        ));
    }
    check_own_vote(vote, from, me)?;
    if let Some(last) = last_log_id {
        if last.leader_id > vote.leader_id {
            return Err(format!(
                "the candidate's last entry {last} is of a later leadership than the vote \
                 {vote} it stands with"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use latchkey_storage::types::log_id;

    use super::*;

    #[test]
    fn a_candidates_own_request_passes() {
        let vote = Vote::new(7, 2);
        assert_eq!(check_candidate_vote(&vote, None, 2, 1), Ok(()));
        assert_eq!(
            check_candidate_vote(&vote, Some(&log_id(6, 3, 90)), 2, 1),
            Ok(())
        );
        assert_eq!(
            check_candidate_vote(&vote, Some(&log_id(7, 2, 90)), 2, 1),
            Ok(())
        );
    }

    #[test]
    fn requests_no_candidate_sends_are_refused() {
        let committed = check_candidate_vote(&Vote::new_committed(7, 2), None, 2, 1);
        assert!(committed.is_err_and(|e| e.contains("committed")));
        let other = check_candidate_vote(&Vote::new(7, 3), None, 2, 1);
        assert!(other.is_err_and(|e| e.contains("node 2 sent it")));
        let myself = check_candidate_vote(&Vote::new(7, 1), None, 1, 1);
        assert!(myself.is_err_and(|e| e.contains("own id")));
        let later = check_candidate_vote(&Vote::new(7, 2), Some(&log_id(8, 1, 3)), 2, 1);
        assert!(later.is_err_and(|e| e.contains("later leadership")));
        assert!(check_candidate_vote(&Vote::new(u64::MAX, 2), None, 2, 1).is_err());
        assert!(
            check_candidate_vote(&Vote::new(7, 2), Some(&log_id(7, 2, u64::MAX)), 2, 1).is_err()
        );
    }
}
