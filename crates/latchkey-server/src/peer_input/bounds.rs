//! The largest term and log index a peer's message may carry.
//!
//! openraft adds one to a term when it stands for election and to an index
//! when it looks past a log id, without checking for overflow. A term or an
//! index near `u64::MAX` could only come from a broken or hostile member (a
//! cluster electing a leader every millisecond reaches 2^62 terms after
//! 146 million years), so anything above [`MAX_TERM`] or [`MAX_INDEX`] is
//! refused.

use latchkey_storage::types::{LogId, Vote};

/// The largest term a peer's vote or log id may carry.
pub(crate) const MAX_TERM: u64 = 1 << 62;

/// The largest log index a peer's message may carry.
pub(crate) const MAX_INDEX: u64 = 1 << 62;

/// Whether `vote`'s term is within [`MAX_TERM`].
pub(crate) fn check_vote(vote: &Vote) -> Result<(), String> {
    if vote.leader_id.term > MAX_TERM {
        return Err(format!(
            "vote {vote} is of term {}, beyond the largest a cluster reaches ({MAX_TERM})",
            vote.leader_id.term
        ));
    }
    Ok(())
}

/// Whether `log_id`'s term and index are within [`MAX_TERM`] and
/// [`MAX_INDEX`].
pub(crate) fn check_log_id(log_id: &LogId) -> Result<(), String> {
    if log_id.leader_id.term > MAX_TERM {
        return Err(format!(
            "log id {log_id} is of term {}, beyond the largest a cluster reaches ({MAX_TERM})",
            log_id.leader_id.term
        ));
    }
    if log_id.index > MAX_INDEX {
        return Err(format!(
            "log id {log_id} is at index {}, beyond the largest a log reaches ({MAX_INDEX})",
            log_id.index
        ));
    }
    Ok(())
}

/// [`check_log_id`] on each of `ids` that is there.
pub(crate) fn check_log_ids<'a>(
    ids: impl IntoIterator<Item = Option<&'a LogId>>,
) -> Result<(), String> {
    ids.into_iter().flatten().try_for_each(check_log_id)
}

#[cfg(test)]
mod tests {
    use latchkey_storage::types::log_id;

    use super::*;

    #[test]
    fn terms_and_indexes_up_to_the_bounds_pass() {
        assert_eq!(check_vote(&Vote::new(MAX_TERM, 1)), Ok(()));
        assert_eq!(check_log_id(&log_id(MAX_TERM, 1, MAX_INDEX)), Ok(()));
        assert_eq!(check_log_ids([None, Some(&log_id(3, 1, 9))]), Ok(()));
    }

    #[test]
    fn terms_and_indexes_beyond_the_bounds_are_refused() {
        let term = check_vote(&Vote::new_committed(u64::MAX, 1));
        assert!(term.is_err_and(|e| e.contains("term")));
        assert!(check_log_id(&log_id(MAX_TERM + 1, 1, 0)).is_err());
        let index = check_log_id(&log_id(1, 1, u64::MAX));
        assert!(index.is_err_and(|e| e.contains("index")));
        assert!(check_log_ids([Some(&log_id(1, 1, 1)), Some(&log_id(1, 1, u64::MAX))]).is_err());
    }
}
