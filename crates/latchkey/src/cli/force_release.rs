//! `locks release NAME --force`: an operator releases a lock someone else
//! holds.

use std::process::ExitCode;

use latchkey::Token;

use super::args::{Args, LocksCmd};
use super::connect::client;
use super::failure::Failure;
use super::output::out;

/// Run a `locks` subcommand.
pub async fn run(args: &Args, cmd: &LocksCmd, json: bool) -> Result<ExitCode, Failure> {
    match cmd {
        LocksCmd::Release { name, token, .. } => release(args, name, token.map(Token), json).await,
    }
}

/// Print each grant released; exit 1 if none matched. Without `token`,
/// every grant the lock has now, each forced by its token (so a resend
/// never releases a holder that came after).
async fn release(
    args: &Args,
    name: &str,
    token: Option<Token>,
    json: bool,
) -> Result<ExitCode, Failure> {
    let client = client(args)?;
    let tokens = match token {
        Some(t) => vec![t],
        None => client
            .locks(name)
            .await?
            .into_iter()
            .filter(|l| l.name == name)
            .flat_map(|l| l.holders.into_iter().map(|h| h.token))
            .collect(),
    };
    let mut released = Vec::new();
    for t in tokens {
        released.extend(client.force_release(name, t).await?);
    }
    if released.is_empty() {
        // A resend after a lost answer finds its own work done: say what
        // is known.
        let which = token.map_or_else(String::new, |t| format!(" with token {t}"));
        return Err(Failure::NotFound(format!(
            "lock {name:?} has no grant{which}: it was free, or this command's own first \
             attempt released it and its answer was lost"
        )));
    }
    let text = if json {
        let rows: Vec<serde_json::Value> = released
            .iter()
            .map(|h| {
                serde_json::json!({
                    "name": name,
                    "session": h.session.0,
                    "owner": h.owner,
                    "mode": h.mode.to_string(),
                    "token": h.token.0,
                })
            })
            .collect();
        serde_json::to_string(&rows)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?
            + "\n"
    } else {
        released
            .iter()
            .map(|h| {
                format!(
                    "released {name:?}: token {} of session {}/{} (the next holder gets a \
                     higher token after the lock-delay)\n",
                    h.token, h.session, h.owner
                )
            })
            .collect()
    };
    out(&[text.as_bytes()])?;
    Ok(ExitCode::SUCCESS)
}
