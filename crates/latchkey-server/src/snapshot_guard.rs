//! [`check_snapshot`]: refuse a snapshot description that no leader of this
//! cluster could send, before openraft sees it.
//!
//! openraft 0.10 *asserts* two things about a snapshot it installs (a panic
//! in its core, which stops the replica), on the grounds that a
//! protocol-following cluster never breaks them:
//! - the snapshot's last log id is not newer than the sender's vote (a
//!   leader cannot hold entries of a later leadership than its own);
//! - a snapshot newer than what this replica has committed ends at a higher
//!   index than that (two committed entries cannot share an index).
//!
//! A snapshot comes from the network, so a member that is broken, or built
//! from a previous incarnation of the cluster, could send either. Here both
//! are an `InvalidArgument` for that one call, and the replica runs on.
//!
//! The second check reads the committed log id before openraft installs;
//! committed ids only grow, and for any snapshot a real leader sends the
//! check passes at every later commit as well (its last entry is committed,
//! so the entry this replica commits at that index is the same one).

use latchkey_storage::types::{LogId, Vote};

/// Whether a snapshot whose last entry is `last`, sent under `vote`, may be
/// handed to openraft on a replica that has committed up to `committed`.
///
/// ```ignore
/// // A snapshot whose last entry is of term 9, sent by a leader of term 7.
/// assert!(check_snapshot(Some(log_id(9, 2, 50)), &Vote::new_committed(7, 2), None).is_err());
/// ```
pub(crate) fn check_snapshot(
    last: Option<LogId>,
    vote: &Vote,
    committed: Option<LogId>,
) -> Result<(), String> {
    let Some(last) = last else {
        return Ok(());
    };
    if last.leader_id > vote.leader_id {
        return Err(format!(
            "the snapshot ends at entry {last}, of a later leadership than its sender's vote \
             {vote}: no leader of this cluster sends that (is the sender's data from another \
             incarnation of the cluster?)"
        ));
    }
    if let Some(committed) = committed {
        if last > committed && last.index <= committed.index {
            return Err(format!(
                "the snapshot ends at entry {last}, which contradicts entry {committed} that \
                 this replica has committed"
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
    fn a_leaders_snapshot_passes() {
        let vote = Vote::new_committed(7, 2);
        assert_eq!(check_snapshot(None, &vote, None), Ok(()));
        assert_eq!(check_snapshot(Some(log_id(7, 2, 50)), &vote, None), Ok(()));
        // Entries of earlier leaderships, and one behind what is committed
        // here (openraft ignores it).
        let committed = Some(log_id(5, 1, 40));
        assert_eq!(
            check_snapshot(Some(log_id(5, 1, 60)), &vote, committed),
            Ok(())
        );
        assert_eq!(
            check_snapshot(Some(log_id(4, 3, 30)), &vote, committed),
            Ok(())
        );
        assert_eq!(
            check_snapshot(Some(log_id(5, 1, 40)), &vote, committed),
            Ok(())
        );
    }

    #[test]
    fn a_snapshot_beyond_its_senders_vote_is_refused() {
        let vote = Vote::new_committed(7, 2);
        let refused = check_snapshot(Some(log_id(9, 2, 50)), &vote, None);
        assert!(refused.is_err_and(|e| e.contains("later leadership")));
        // Same term, a leader with a higher node id: a different leadership.
        assert!(check_snapshot(Some(log_id(7, 3, 50)), &vote, None).is_err());
    }

    #[test]
    fn a_snapshot_contradicting_a_committed_entry_is_refused() {
        let vote = Vote::new_committed(9, 2);
        let committed = Some(log_id(5, 1, 40));
        // Newer than the committed entry but not beyond its index.
        let refused = check_snapshot(Some(log_id(9, 2, 40)), &vote, committed);
        assert!(refused.is_err_and(|e| e.contains("contradicts")));
        assert!(check_snapshot(Some(log_id(6, 1, 12)), &vote, committed).is_err());
    }
}
