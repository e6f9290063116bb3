//! What the cluster says about locks: `locks` (the locks in use, their
//! holders and queues) and `check-sequencer` (whether a holder is current).

use std::process::ExitCode;

use latchkey::LockMode;

use super::args::Args;
use super::connect::client;
use super::failure::Failure;
use super::fencing::parse_sequencer;
use super::output::out;

/// `check-sequencer`: exit 0 if `sequencer` still holds its lock, 1 if it
/// is stale.
pub async fn check_sequencer(args: &Args, sequencer: &str) -> Result<ExitCode, Failure> {
    let seq = parse_sequencer(sequencer)?;
    if client(args)?.check_sequencer(&seq).await? {
        out(&[b"current\n"])?;
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Failure::NotFound(format!(
            "stale: {seq} no longer holds lock {:?}",
            seq.name
        )))
    }
}

/// `locks`: the locks whose names start with `prefix`, as a table or
/// (`json`) JSON.
pub async fn list(args: &Args, prefix: &str, json: bool) -> Result<ExitCode, Failure> {
    let locks = client(args)?.locks(prefix).await?;
    if json {
        let rows: Vec<serde_json::Value> = locks
            .iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name,
                    "mode": l.mode.map(|m| m.to_string()),
                    "holders": l.holders.iter().map(|h| serde_json::json!({
                        "session": h.session.0,
                        "owner": h.owner,
                        "token": h.token.0,
                        "hold_count": h.hold_count,
                        "lease_ms": h.lease_ms,
                    })).collect::<Vec<_>>(),
                    "waiters": l.waiters,
                    "lock_delay_ms": l.lock_delay.as_ref().map(|d| d.delay_ms),
                    "permits": l.permits,
                })
            })
            .collect();
        let text = serde_json::to_string_pretty(&rows)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?;
        out(&[text.as_bytes(), b"\n"])?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut text = format!(
        "{:<32} {:<9} {:>8} {:<16} {:>7}\n",
        "NAME", "MODE", "TOKEN", "HOLDER", "WAITING"
    );
    for l in &locks {
        let mode = match (l.mode, &l.lock_delay, l.permits) {
            (Some(LockMode::Exclusive), _, _) => "exclusive".to_string(),
            (Some(LockMode::Shared), _, Some(p)) => format!("sem/{p}"),
            (Some(LockMode::Shared), _, None) => "shared".to_string(),
            (None, Some(_), _) => "delay".to_string(),
            (None, None, _) => "-".to_string(),
        };
        let (token, holder) = match l.holders.first() {
            Some(h) => (h.token.to_string(), format!("{}/{}", h.session, h.owner)),
            None => ("-".to_string(), "-".to_string()),
        };
        let more = if l.holders.len() > 1 {
            format!(" +{}", l.holders.len() - 1)
        } else {
            String::new()
        };
        text.push_str(&format!(
            "{:<32} {:<9} {:>8} {:<16} {:>7}\n",
            l.name,
            mode,
            token,
            format!("{holder}{more}"),
            l.waiters
        ));
    }
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}
