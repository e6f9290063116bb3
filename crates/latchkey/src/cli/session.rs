//! `session end`: an operator ends someone else's session.

use std::process::ExitCode;

use latchkey::SessionId;

use super::args::{Args, SessionCmd};
use super::connect::client;
use super::failure::Failure;
use super::output::out;

/// Run a `session` subcommand.
pub async fn run(args: &Args, cmd: &SessionCmd, json: bool) -> Result<ExitCode, Failure> {
    match cmd {
        SessionCmd::End { id } => end(args, *id, json).await,
    }
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
