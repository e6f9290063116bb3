//! The read-only status page the metrics listener serves at `/`: this
//! replica's view of the cluster (state, leader, term, log and apply
//! progress, members with their roles and, on the leader, how far each has
//! replicated), the live sessions in its state, and the locks in use
//! with holders, tokens and queue lengths, refreshed every second from
//! `/status.json`.
//!
//! The page is three static files compiled into the binary (no external
//! resources, served with a `default-src 'self'` content security policy);
//! its script puts every value into the page as text, never as markup
//! (lock names come from clients). The listener has no authentication, so
//! while access control is on the page does not list locks (their names
//! and holders could tell a stranger what the cluster guards): it says so
//! instead, and `latchkey locks` with a user's permissions lists them.
//! The lock list is this replica's applied state, not a linearizable read,
//! and stops at [`LOCKS_SHOWN`] locks (20 holders each); one answer serves
//! every caller for half a second. The page names members' addresses and
//! incarnations even while access control is on, as `/metrics` and
//! `latchkey status` do.

use serde::Serialize;

use crate::replica::Replica;

/// The page.
pub(crate) const PAGE: &str = include_str!("page.html");
/// Its script.
pub(crate) const SCRIPT: &str = include_str!("status.js");
/// Its style sheet.
pub(crate) const STYLE: &str = include_str!("status.css");
/// Most locks the page lists.
pub const LOCKS_SHOWN: u32 = 100;

/// What `/status.json` holds.
#[derive(Debug, Serialize)]
struct Status {
    /// What `latchkey status` shows of this replica.
    node: latchkey_proto::NodeStatus,
    /// Whether `/readyz` answers 200, and if not why.
    ready: bool,
    not_ready: Option<String>,
    /// The live sessions in the replica's state (`None`: it could not be
    /// read).
    sessions: Option<u64>,
    /// Acquire calls waiting for their grant on this replica.
    waiting_calls: usize,
    /// The first locks in use (`None` while hidden, see the module docs).
    locks: Option<Vec<latchkey_core::lock::LockInfo>>,
    /// More locks are in use than listed.
    locks_more: bool,
    /// Why no lock is listed.
    locks_hidden: Option<String>,
}

/// Most holders listed per lock (a shared lock may have many).
const HOLDERS_SHOWN: usize = 20;
/// How long one `/status.json` answers every caller.
const FRESH_FOR: std::time::Duration = std::time::Duration::from_millis(500);

/// One replica's status page: the replica, and the page's last answer
/// with when it was made.
pub(crate) struct StatusPage {
    replica: std::sync::Arc<Replica>,
    cache: tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
}

impl StatusPage {
    /// The status page of `replica`.
    pub(crate) fn new(replica: std::sync::Arc<Replica>) -> Self {
        StatusPage {
            replica,
            cache: tokio::sync::Mutex::default(),
        }
    }

    /// `/status.json`, made at most every [`FRESH_FOR`] however many pages
    /// poll (the lock list is a scan of the state), off the async workers.
    pub(crate) async fn cached_json(&self) -> String {
        cached_json(&self.replica, &self.cache).await
    }
}

async fn cached_json(
    replica: &std::sync::Arc<Replica>,
    cache: &tokio::sync::Mutex<Option<(std::time::Instant, String)>>,
) -> String {
    let mut cached = cache.lock().await;
    if let Some((made, json)) = cached.as_ref() {
        if made.elapsed() < FRESH_FOR {
            return json.clone();
        }
    }
    let for_task = std::sync::Arc::clone(replica);
    let json = tokio::task::spawn_blocking(move || status_json(&for_task))
        .await
        .unwrap_or_else(|e| serde_json::json!({ "error": e.to_string() }).to_string());
    *cached = Some((std::time::Instant::now(), json.clone()));
    json
}

/// `/status.json` for `replica`.
fn status_json(replica: &Replica) -> String {
    let readiness = crate::health_watch::readiness(replica.view(), replica.health());
    let (locks, locks_more, locks_hidden) = match replica.auth_enabled() {
        Ok(false) => match replica.local_locks(LOCKS_SHOWN) {
            Ok((mut locks, more)) => {
                for lock in &mut locks {
                    lock.holders.truncate(HOLDERS_SHOWN);
                }
                (Some(locks), more, None)
            }
            Err(e) => (None, false, Some(format!("Cannot list the locks: {e}"))),
        },
        Ok(true) => (
            None,
            false,
            Some(
                "Access control is on: locks are not listed on this unauthenticated page (use \
                 `latchkey locks` as a user who may read them)."
                    .to_string(),
            ),
        ),
        Err(e) => (None, false, Some(format!("Cannot list the locks: {e}"))),
    };
    let status = Status {
        node: replica.status(),
        ready: readiness.is_ok(),
        not_ready: readiness.err(),
        sessions: replica.lock_census().ok().map(|c| c.sessions),
        waiting_calls: replica.locks().waiters.len(),
        locks,
        locks_more,
        locks_hidden,
    };
    match serde_json::to_value(&status) {
        Ok(mut value) => {
            big_numbers_as_strings(&mut value);
            value.to_string()
        }
        // Plain data always serializes; say so if it ever does not.
        Err(e) => serde_json::json!({ "error": e.to_string() }).to_string(),
    }
}

/// JavaScript's numbers hold integers exactly up to 2^53 only: larger ones
/// (incarnations are random 64-bit numbers) become strings, so the page
/// shows them digit for digit.
fn big_numbers_as_strings(value: &mut serde_json::Value) {
    use serde_json::Value;
    const EXACT: u64 = (1 << 53) - 1;
    match value {
        Value::Number(n) if n.as_u64().is_some_and(|n| n > EXACT) => {
            *value = Value::String(n.to_string());
        }
        Value::Array(items) => items.iter_mut().for_each(big_numbers_as_strings),
        Value::Object(fields) => fields.values_mut().for_each(big_numbers_as_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::big_numbers_as_strings;

    #[test]
    fn numbers_past_2_53_become_strings() {
        let mut v = serde_json::json!({"a": [1, 9007199254740991u64, 9007199254740992u64], "b": {"c": u64::MAX}});
        big_numbers_as_strings(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"a": [1, 9007199254740991u64, "9007199254740992"], "b": {"c": "18446744073709551615"}})
        );
    }
}
