//! `sessions`: the live sessions, as an operator sees them, and `sessions
//! end ID`, an operator ending someone else's session.

use std::process::ExitCode;
use std::time::Duration;

use latchkey::core::lock::election_of;
use latchkey::{HeldLock, SessionId, SessionListing};

use super::args::{Args, SessionsCmd};
use super::connect::client;
use super::failure::Failure;
use super::output::out;

/// Run `sessions` (list) or one of its subcommands.
pub async fn run(args: &Args, cmd: Option<&SessionsCmd>, json: bool) -> Result<ExitCode, Failure> {
    match cmd {
        None => list(args, json).await,
        Some(SessionsCmd::End { id }) => end(args, *id, json).await,
    }
}

/// `sessions`: one line each (or JSON with every grant and wait).
async fn list(args: &Args, json: bool) -> Result<ExitCode, Failure> {
    let sessions = client(args)?.sessions().await?;
    let text = if json {
        let rows: Vec<serde_json::Value> = sessions.iter().map(listing_json).collect();
        let mut text = serde_json::to_string_pretty(&rows)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?;
        text.push('\n');
        text
    } else {
        table(&sessions)
    };
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}

fn listing_json(s: &SessionListing) -> serde_json::Value {
    serde_json::json!({
        "session": s.session.0,
        "name": s.name,
        "ttl_ms": s.ttl_ms,
        "left_ms": s.left_ms,
        "held": s.held.iter().map(|h| serde_json::json!({
            "name": h.name,
            "kind": kind(h),
            "owner": h.owner,
            "mode": h.mode.to_string(),
            "token": h.token.0,
            "permits": h.permits,
        })).collect::<Vec<_>>(),
        "holds": s.holds,
        "waiting": s.waiting,
        "waits": s.waits,
        "keys": s.keys,
        "forced": s.forced,
    })
}

/// What a grant is: a leadership, a permit or a lock.
fn kind(h: &HeldLock) -> &'static str {
    if election_of(&h.name).is_some() {
        "leadership"
    } else if h.permits.is_some() {
        "permit"
    } else {
        "lock"
    }
}

/// A grant as the table shows it: `name#token`, an election as
/// `elect:NAME#term`, a permit as `sem:NAME#token`.
fn held_text(h: &HeldLock) -> String {
    match (election_of(&h.name), h.permits) {
        (Some(election), _) => format!("elect:{election}#{}", h.token),
        (None, Some(_)) => format!("sem:{}#{}", h.name, h.token),
        (None, None) => format!("{}#{}", h.name, h.token),
    }
}

fn seconds(ms: u64) -> String {
    format!("{:.1}s", Duration::from_millis(ms).as_secs_f64())
}

fn table(sessions: &[SessionListing]) -> String {
    let mut text = format!(
        "{:>8} {:>7} {:>7} {:>5} {:>5} {:>5}  {:<32} {}\n",
        "SESSION", "TTL", "LEFT", "HOLDS", "WAITS", "KEYS", "HOLDING", "NAME"
    );
    for s in sessions {
        let mut holding: Vec<String> = s.held.iter().map(held_text).collect();
        let unlisted = s.holds as usize - s.held.len().min(s.holds as usize);
        if unlisted > 0 {
            holding.push(format!("+{unlisted}"));
        }
        let holding = if holding.is_empty() {
            "-".to_string()
        } else {
            holding.join(",")
        };
        // The leader's countdown, if the replica that answered leads.
        let left = s.left_ms.map_or_else(|| "-".to_string(), seconds);
        text.push_str(&format!(
            "{:>8} {:>7} {:>7} {:>5} {:>5} {:>5}  {:<32} {}\n",
            s.session.0,
            seconds(s.ttl_ms),
            left,
            s.holds,
            s.waits,
            s.keys,
            holding,
            if s.name.is_empty() { "-" } else { &s.name },
        ));
    }
    text
}

/// `session end ID`: prints what the end released; exit 1 if the session
/// is not live.
async fn end(args: &Args, id: u64, json: bool) -> Result<ExitCode, Failure> {
    let Some(ended) = client(args)?.end_session(SessionId(id)).await? else {
        // A resend after a lost answer finds the session ended by the
        // first attempt: say what is known.
        return Err(Failure::NotFound(format!(
            "session {id} is not live: it had ended, or this command's own first attempt \
             ended it and its answer was lost"
        )));
    };
    let text = if json {
        serde_json::json!({
            "session": id,
            "released": ended.released,
            "cancelled": ended.cancelled,
        })
        .to_string()
    } else {
        format!(
            "session {id} ended: {} holds released, {} waits cancelled",
            ended.released, ended.cancelled
        )
    };
    out(&[text.as_bytes(), b"\n"])?;
    Ok(ExitCode::SUCCESS)
}
