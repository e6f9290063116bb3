//! What a leader's message (AppendEntries, a snapshot, a hand-over) must
//! look like before openraft sees it (see the module docs of `peer_input`):
//! - [`check_sender`]: the message carries its sender's own *committed* vote
//!   (openraft's following handler asserts a committed vote, and a vote
//!   naming this replica would make it a leader taking a leader's message);
//! - [`check_entries`]: the entries follow on from the previous log id, one
//!   index at a time, with rising log ids none of a later leadership than
//!   the vote (openraft asserts the first two when it appends), and each
//!   membership they carry is whole;
//! - [`check_leader_commit`]: the commit index is a log id of the log the
//!   message describes (openraft takes the lesser of it and what it
//!   accepted, so a made-up one would commit entries no majority holds);
//! - [`check_append_against`]: every log id the message names agrees with
//!   the entry this replica committed last;
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
use openraft::raft::AppendEntriesRequest;
use openraft::EntryPayload;

use super::bounds;
use super::membership::check_membership;
use super::sender::check_own_vote;

/// Whether AppendEntries `rpc`, sent by node `from` to replica `me`, is one
/// a leader sends: [`check_sender`], [`check_entries`] and
/// [`check_leader_commit`], every term and index within [`bounds`].
pub(crate) fn check_append(
    rpc: &AppendEntriesRequest<latchkey_storage::TypeConfig>,
    from: u64,
    me: u64,
) -> Result<(), String> {
    bounds::check_vote(&rpc.vote)?;
    bounds::check_log_ids(
        [rpc.prev_log_id.as_ref(), rpc.leader_commit.as_ref()]
            .into_iter()
            .chain(rpc.entries.iter().map(|e| Some(&e.log_id))),
    )?;
    check_sender(&rpc.vote, from, me)?;
    check_entries(rpc.prev_log_id, &rpc.entries, &rpc.vote)?;
    check_leader_commit(rpc.leader_commit, rpc.prev_log_id, &rpc.entries, &rpc.vote)
}

/// Whether a leader's message sent by node `from` under `vote` may reach
/// openraft on replica `me`.
pub(crate) fn check_sender(vote: &Vote, from: u64, me: u64) -> Result<(), String> {
    if !vote.committed {
        return Err(format!(
            "a leader sends its committed vote; this message's vote {vote} is not committed"
        ));
    }
    check_own_vote(vote, from, me)
}

/// Whether `entries`, sent after `prev` under `vote`, are a piece of a log
/// a leader could hold: consecutive indexes from `prev`'s next, rising log
/// ids, none of a later leadership than `vote`.
pub(crate) fn check_entries(
    prev: Option<LogId>,
    entries: &[Entry],
    vote: &Vote,
) -> Result<(), String> {
    if let Some(prev) = prev.filter(|p| p.leader_id > vote.leader_id) {
        return Err(format!(
            "the previous entry {prev} is of a later leadership than its sender's vote {vote}"
        ));
    }
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
        if let EntryPayload::Membership(membership) = &entry.payload {
            check_membership(membership).map_err(|e| format!("entry {id}: {e}"))?;
        }
        before = Some(id);
    }
    Ok(())
}

/// Whether `commit`, the commit index of an AppendEntries sent under `vote`
/// with `entries` after `prev`, is a log id of the sender's log: the sent
/// entry at its index, or an entry before `prev` (no later leadership than
/// `prev`'s), or one after the last sent (no earlier leadership than it), and
/// never of a later leadership than `vote`. A leader's log ids rise with
/// the index, so its own commit index always passes.
pub(crate) fn check_leader_commit(
    commit: Option<LogId>,
    prev: Option<LogId>,
    entries: &[Entry],
    vote: &Vote,
) -> Result<(), String> {
    let Some(commit) = commit else {
        return Ok(());
    };
    let contradicts = |known: LogId| {
        Err(format!(
            "the commit index {commit} contradicts entry {known} of the same message"
        ))
    };
    if commit.leader_id > vote.leader_id {
        return Err(format!(
            "the commit index {commit} is of a later leadership than its sender's vote {vote}"
        ));
    }
    if let Some(prev) = prev {
        if commit.index == prev.index && commit != prev
            || commit.index < prev.index && commit.leader_id > prev.leader_id
        {
            return contradicts(prev);
        }
    }
    if let Some(sent) = entries.iter().find(|e| e.log_id.index == commit.index) {
        if sent.log_id != commit {
            return contradicts(sent.log_id);
        }
    }
    if let Some(last) = entries.last().map(|e| e.log_id).or(prev) {
        if commit.index > last.index && commit.leader_id < last.leader_id {
            return contradicts(last);
        }
    }
    Ok(())
}

/// Whether AppendEntries `rpc` agrees with `committed`, the last entry this
/// replica has committed: every log id the message names (the previous
/// one, the entries, the commit index) is `committed` itself at its index,
/// of no later leadership below it and of no earlier leadership beyond it.
/// A committed entry is in the log of every later leader, whose log ids
/// rise with the index, so any current leader's message agrees with it (and
/// with any earlier committed entry: a stale reading never refuses one).
/// openraft takes whatever a message names at or below the committed index
/// as matching, and asserts on the rest.
///
/// Only for a message whose vote is not below this replica's: a deposed
/// leader's log may well disagree, and openraft answers its messages with
/// the higher vote, which is how it learns that it was deposed.
pub(crate) fn check_append_against(
    rpc: &AppendEntriesRequest<latchkey_storage::TypeConfig>,
    committed: Option<LogId>,
) -> Result<(), String> {
    let Some(committed) = committed else {
        return Ok(());
    };
    let named = [rpc.prev_log_id, rpc.leader_commit]
        .into_iter()
        .flatten()
        .chain(rpc.entries.iter().map(|e| e.log_id));
    for id in named {
        let agrees = match id.index.cmp(&committed.index) {
            std::cmp::Ordering::Less => id.leader_id <= committed.leader_id,
            std::cmp::Ordering::Equal => id == committed,
            std::cmp::Ordering::Greater => id.leader_id >= committed.leader_id,
        };
        if !agrees {
            return Err(format!(
                "the message names entry {id}, which contradicts entry {committed} that this \
                 replica has committed"
            ));
        }
    }
    Ok(())
}

/// Whether a hand-over (openraft's transfer-leader request) sent by node
/// `from` to replica `me` comes from a leader: [`check_sender`] on its
/// vote, its terms and indexes within [`bounds`].
pub(crate) fn check_transfer(
    from_leader: &Vote,
    last_log_id: Option<&LogId>,
    from: u64,
    me: u64,
) -> Result<(), String> {
    bounds::check_vote(from_leader)?;
    bounds::check_log_ids([last_log_id])?;
    check_sender(from_leader, from, me)
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
    bounds::check_vote(vote)?;
    bounds::check_log_ids([last.as_ref(), membership.log_id().as_ref()])?;
    if membership.log_id().is_some() {
        check_membership(membership.membership())
            .map_err(|e| format!("the snapshot's membership: {e}"))?;
    }
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

    /// Nodes 1 and 2 as voters, as of entry `at`.
    fn voters_at(at: LogId) -> StoredMembership {
        let membership = latchkey_storage::types::Membership::new_with_defaults(
            vec![[1u64, 2].into_iter().collect()],
            [],
        );
        StoredMembership::new(Some(at), membership)
    }

    fn append(
        vote: Vote,
        prev: Option<LogId>,
        entries: Vec<Entry>,
        commit: Option<LogId>,
    ) -> AppendEntriesRequest<latchkey_storage::TypeConfig> {
        AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries,
            leader_commit: commit,
        }
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
        let prev_later = check_entries(Some(log_id(8, 1, 9)), &[], &vote);
        assert!(prev_later.is_err_and(|e| e.contains("previous entry")));
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
        let membership = voters_at(log_id(5, 1, 20));
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
        let membership = voters_at(log_id(7, 2, 60));
        let refused = check_snapshot(Some(log_id(7, 2, 50)), &membership, &vote, None);
        assert!(refused.is_err_and(|e| e.contains("beyond the snapshot's last entry")));
        assert!(check_snapshot(None, &membership, &vote, None).is_err());
    }

    #[test]
    fn a_leaders_commit_index_passes() {
        let vote = Vote::new_committed(7, 2);
        let prev = Some(log_id(5, 1, 9));
        let run = [blank(5, 1, 10), blank(7, 2, 11)];
        for commit in [
            None,
            Some(log_id(3, 1, 4)),
            Some(log_id(5, 1, 9)),
            Some(log_id(5, 1, 10)),
            Some(log_id(7, 2, 11)),
            Some(log_id(7, 2, 30)),
        ] {
            assert_eq!(
                check_leader_commit(commit, prev, &run, &vote),
                Ok(()),
                "{commit:?}"
            );
        }
        // A heartbeat to a follower far behind the leader's commit.
        assert_eq!(
            check_leader_commit(Some(log_id(7, 2, 500)), prev, &[], &vote),
            Ok(())
        );
        assert_eq!(
            check_leader_commit(Some(log_id(7, 2, 5)), None, &[], &vote),
            Ok(())
        );
    }

    #[test]
    fn a_commit_index_off_the_senders_log_is_refused() {
        let vote = Vote::new_committed(7, 2);
        let prev = Some(log_id(5, 1, 9));
        let run = [blank(5, 1, 10), blank(7, 2, 11)];
        let at = |commit| check_leader_commit(Some(commit), prev, &run, &vote);
        let later = at(log_id(8, 1, 40));
        assert!(later.is_err_and(|e| e.contains("later leadership")));
        // Not the sent entry at its index; not prev at prev's index; newer
        // than prev below it; older than the last sent beyond it.
        assert!(at(log_id(7, 2, 10)).is_err_and(|e| e.contains("contradicts")));
        assert!(at(log_id(6, 1, 9)).is_err());
        assert!(at(log_id(6, 1, 3)).is_err());
        assert!(at(log_id(5, 1, 30)).is_err());
    }

    #[test]
    fn appends_are_checked_whole() {
        let vote = Vote::new_committed(7, 2);
        let ok = append(
            vote,
            Some(log_id(5, 1, 9)),
            vec![blank(7, 2, 10)],
            Some(log_id(7, 2, 10)),
        );
        assert_eq!(check_append(&ok, 2, 1), Ok(()));
        let huge = append(Vote::new_committed(u64::MAX, 2), None, Vec::new(), None);
        assert!(check_append(&huge, 2, 1).is_err_and(|e| e.contains("term")));
        let far = append(vote, Some(log_id(5, 1, u64::MAX)), Vec::new(), None);
        assert!(check_append(&far, 2, 1).is_err_and(|e| e.contains("index")));
        let bad_commit = append(vote, None, Vec::new(), Some(log_id(9, 2, 1)));
        assert!(check_append(&bad_commit, 2, 1).is_err());
        // A membership entry naming a voter it gives no node for.
        let mut membership =
            serde_json::to_value(latchkey_storage::types::Membership::new_with_defaults(
                vec![[1u64, 2].into_iter().collect()],
                [],
            ))
            .unwrap();
        membership["nodes"] = serde_json::json!({});
        let entry = Entry {
            log_id: log_id(7, 2, 10),
            payload: EntryPayload::Membership(serde_json::from_value(membership).unwrap()),
        };
        let whole = append(vote, Some(log_id(5, 1, 9)), vec![entry], None);
        assert!(check_append(&whole, 2, 1).is_err_and(|e| e.contains("node 1")));
    }

    #[test]
    fn a_hand_over_comes_from_a_leader() {
        let vote = Vote::new_committed(7, 2);
        assert_eq!(check_transfer(&vote, Some(&log_id(7, 2, 3)), 2, 1), Ok(()));
        assert!(check_transfer(&Vote::new(7, 2), None, 2, 1).is_err());
        assert!(check_transfer(&vote, None, 3, 1).is_err());
        assert!(check_transfer(&Vote::new_committed(u64::MAX, 2), None, 2, 1).is_err());
    }

    #[test]
    fn an_append_agreeing_with_what_is_committed_passes() {
        let committed = Some(log_id(5, 1, 40));
        let append =
            |prev, entries, commit| append(Vote::new_committed(7, 2), prev, entries, commit);
        for rpc in [
            append(None, Vec::new(), None),
            append(
                Some(log_id(3, 1, 30)),
                vec![blank(5, 1, 31)],
                Some(log_id(3, 1, 30)),
            ),
            append(
                Some(log_id(5, 1, 40)),
                vec![blank(7, 2, 41)],
                Some(log_id(7, 2, 41)),
            ),
            append(
                Some(log_id(6, 3, 45)),
                vec![blank(7, 2, 46)],
                Some(log_id(5, 1, 40)),
            ),
        ] {
            assert_eq!(check_append_against(&rpc, committed), Ok(()), "{rpc}");
            assert_eq!(check_append_against(&rpc, None), Ok(()));
        }
        // A stale reading of what is committed never refuses a leader's
        // message either.
        let rpc = append(Some(log_id(5, 1, 40)), vec![blank(7, 2, 41)], None);
        assert_eq!(check_append_against(&rpc, Some(log_id(3, 1, 20))), Ok(()));
    }

    #[test]
    fn an_append_contradicting_what_is_committed_is_refused() {
        let committed = Some(log_id(5, 1, 40));
        let append =
            |prev, entries, commit| append(Vote::new_committed(7, 2), prev, entries, commit);
        for rpc in [
            // A later leadership below the committed entry.
            append(Some(log_id(7, 2, 30)), Vec::new(), None),
            append(Some(log_id(5, 1, 29)), vec![blank(7, 2, 30)], None),
            // Another entry at its index.
            append(Some(log_id(3, 1, 40)), vec![blank(3, 1, 41)], None),
            // An earlier leadership beyond it.
            append(Some(log_id(3, 1, 41)), Vec::new(), None),
            append(None, Vec::new(), Some(log_id(4, 1, 50))),
        ] {
            let refused = check_append_against(&rpc, committed);
            assert!(refused.is_err_and(|e| e.contains("contradicts")), "{rpc}");
        }
    }

    #[test]
    fn a_snapshot_with_a_broken_membership_is_refused() {
        let vote = Vote::new_committed(7, 2);
        let empty = StoredMembership::new(Some(log_id(7, 2, 5)), Default::default());
        let refused = check_snapshot(Some(log_id(7, 2, 50)), &empty, &vote, None);
        assert!(refused.is_err_and(|e| e.contains("voter set")));
        let far = check_snapshot(Some(log_id(7, 2, u64::MAX)), &none(), &vote, None);
        assert!(far.is_err_and(|e| e.contains("index")));
    }
}
