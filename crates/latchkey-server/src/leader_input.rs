//! What a leader's message (AppendEntries, a snapshot) must look like before
//! openraft sees it.
//!
//! openraft 0.10 checks much of a leader's message with `assert!` and
//! `debug_assert!` (a panic in its core, which stops the replica), on the
//! grounds that a protocol-following cluster never breaks them; latchkey's
//! builds keep debug assertions on. A message comes from the network, so a
//! member that is broken, or whose data came from another incarnation of the
//! cluster, could send any of it. Each function here refuses such a message
//! for that one call (`INVALID_ARGUMENT`), and the replica runs on:
//! - [`check_sender`]: the message carries its sender's own *committed* vote
//!   (openraft's following handler asserts a committed vote, and a vote
//!   naming this replica would make it a leader taking a leader's message);
//! - [`check_entries`]: the entries follow on from the previous log id, one
//!   index at a time, with rising log ids none of a later leadership than
//!   the vote (openraft asserts the first two when it appends);
//! - [`check_snapshot`]: the snapshot's last log id is not of a later
//!   leadership than the vote, is not newer than an entry this replica
//!   committed while at no higher index, and covers the membership it
//!   carries (openraft asserts the first two when it installs).
//!
//! The committed log id [`check_snapshot`] compares with is read before
//! openraft installs; committed ids only grow, and for any snapshot a real
//! leader sends the check passes at every later commit as well (its last
//! entry is committed, so the entry this replica commits at that index is the
//! same one). A forged snapshot racing the real leader's commits can still
//! slip through that window.

use latchkey_storage::types::{Entry, LogId, StoredMembership, Vote};

/// Whether a leader's message sent by node `from` under `vote` may reach
/// openraft on replica `me`.
pub(crate) fn check_sender(vote: &Vote, from: u64, me: u64) -> Result<(), String> {
    if !vote.committed {
        return Err(format!(
            "a leader sends its committed vote; this message's vote {vote} is not committed"
        ));
    }
    if vote.leader_id.node_id != from {
        return Err(format!(
            "the message's vote {vote} names node {} as leader, but node {from} sent it",
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

/// Whether `entries`, sent after `prev` under `vote`, are a piece of a log
/// a leader could hold: consecutive indexes from `prev`'s next, rising log
/// ids, none of a later leadership than `vote`.
pub(crate) fn check_entries(
    prev: Option<LogId>,
    entries: &[Entry],
    vote: &Vote,
) -> Result<(), String> {
    let mut before = prev;
    for entry in entries {
        let id = entry.log_id;
        let expected = match before {
            Some(b) => b.index.checked_add(1),
            None => Some(0),
        };
        if Some(id.index) != expected {
            return Err(format!(
                "entry {id} does not follow on from {}",
                before.map_or_else(|| "the start of the log".to_string(), |b| b.to_string())
            ));
        }
        if before.is_some_and(|b| id.leader_id < b.leader_id) {
            return Err(format!(
                "entry {id} is of an earlier leadership than the entry before it"
            ));
        }
        if id.leader_id > vote.leader_id {
            return Err(format!(
                "entry {id} is of a later leadership than its sender's vote {vote}"
            ));
        }
        before = Some(id);
    }
    Ok(())
}

/// Whether a snapshot whose last entry is `last` and whose membership is
/// `membership`, sent under `vote`, may be handed to openraft on a replica
/// that has committed up to `committed`.
///
/// ```ignore
/// // A snapshot whose last entry is of term 9, sent by a leader of term 7.
/// assert!(check_snapshot(Some(log_id(9, 2, 50)), &membership, &Vote::new_committed(7, 2), None).is_err());
/// ```
pub(crate) fn check_snapshot(
    last: Option<LogId>,
    membership: &StoredMembership,
    vote: &Vote,
    committed: Option<LogId>,
) -> Result<(), String> {
    if membership.log_id().as_ref() > last.as_ref() {
        return Err(format!(
            "the snapshot's membership is of entry {}, beyond the snapshot's last entry",
            membership
                .log_id()
                .map_or_else(|| "none".to_string(), |l| l.to_string())
        ));
    }
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
    use openraft::EntryPayload;

    use super::*;

    fn none() -> StoredMembership {
        StoredMembership::default()
    }

    fn blank(term: u64, node: u64, index: u64) -> Entry {
        Entry {
            log_id: log_id(term, node, index),
            payload: EntryPayload::Blank,
        }
    }

    #[test]
    fn only_the_sender_with_its_committed_vote_passes() {
        assert_eq!(check_sender(&Vote::new_committed(7, 2), 2, 1), Ok(()));
        let uncommitted = check_sender(&Vote::new(8, 2), 2, 1);
        assert!(uncommitted.is_err_and(|e| e.contains("not committed")));
        let someone_else = check_sender(&Vote::new_committed(7, 3), 2, 1);
        assert!(someone_else.is_err_and(|e| e.contains("but node 2 sent it")));
        let myself = check_sender(&Vote::new_committed(7, 1), 1, 1);
        assert!(myself.is_err_and(|e| e.contains("own id")));
    }

    #[test]
    fn entries_must_follow_on_and_rise() {
        let vote = Vote::new_committed(7, 2);
        let prev = Some(log_id(5, 1, 9));
        assert_eq!(check_entries(prev, &[], &vote), Ok(()));
        assert_eq!(
            check_entries(None, &[blank(1, 1, 0), blank(1, 1, 1)], &vote),
            Ok(())
        );
        let run = [blank(5, 1, 10), blank(7, 2, 11), blank(7, 2, 12)];
        assert_eq!(check_entries(prev, &run, &vote), Ok(()));
        // A gap, a repeat, a step back in leadership, a later leadership.
        assert!(check_entries(prev, &[blank(5, 1, 11)], &vote).is_err());
        assert!(check_entries(prev, &[blank(5, 1, 10), blank(5, 1, 10)], &vote).is_err());
        assert!(check_entries(prev, &[blank(4, 1, 10)], &vote).is_err());
        assert!(check_entries(prev, &[blank(7, 2, 10), blank(6, 1, 11)], &vote).is_err());
        let later = check_entries(prev, &[blank(8, 2, 10)], &vote);
        assert!(later.is_err_and(|e| e.contains("later leadership")));
        assert!(check_entries(None, &[blank(1, 1, 1)], &vote).is_err());
        assert!(check_entries(Some(log_id(1, 1, u64::MAX)), &[blank(1, 1, 0)], &vote).is_err());
    }

    #[test]
    fn a_leaders_snapshot_passes() {
        let vote = Vote::new_committed(7, 2);
        assert_eq!(check_snapshot(None, &none(), &vote, None), Ok(()));
        assert_eq!(
            check_snapshot(Some(log_id(7, 2, 50)), &none(), &vote, None),
            Ok(())
        );
        // Entries of earlier leaderships, and one behind what is committed
        // here (openraft ignores it).
        let committed = Some(log_id(5, 1, 40));
        let at = |t, n, i| check_snapshot(Some(log_id(t, n, i)), &none(), &vote, committed);
        assert_eq!(at(5, 1, 60), Ok(()));
        assert_eq!(at(4, 3, 30), Ok(()));
        assert_eq!(at(5, 1, 40), Ok(()));
        let membership = StoredMembership::new(Some(log_id(5, 1, 20)), Default::default());
        assert_eq!(
            check_snapshot(Some(log_id(5, 1, 60)), &membership, &vote, committed),
            Ok(())
        );
    }

    #[test]
    fn a_snapshot_beyond_its_senders_vote_is_refused() {
        let vote = Vote::new_committed(7, 2);
        let refused = check_snapshot(Some(log_id(9, 2, 50)), &none(), &vote, None);
        assert!(refused.is_err_and(|e| e.contains("later leadership")));
        // Same term, a leader with a higher node id: a different leadership.
        assert!(check_snapshot(Some(log_id(7, 3, 50)), &none(), &vote, None).is_err());
    }

    #[test]
    fn a_snapshot_contradicting_a_committed_entry_is_refused() {
        let vote = Vote::new_committed(9, 2);
        let committed = Some(log_id(5, 1, 40));
        // Newer than the committed entry but not beyond its index.
        let refused = check_snapshot(Some(log_id(9, 2, 40)), &none(), &vote, committed);
        assert!(refused.is_err_and(|e| e.contains("contradicts")));
        assert!(check_snapshot(Some(log_id(6, 1, 12)), &none(), &vote, committed).is_err());
    }

    #[test]
    fn a_snapshot_whose_membership_is_beyond_it_is_refused() {
        let vote = Vote::new_committed(7, 2);
        let membership = StoredMembership::new(Some(log_id(7, 2, 60)), Default::default());
        let refused = check_snapshot(Some(log_id(7, 2, 50)), &membership, &vote, None);
        assert!(refused.is_err_and(|e| e.contains("membership")));
        assert!(check_snapshot(None, &membership, &vote, None).is_err());
    }
}
