//! `members add|remove|promote|transfer-leader|list`: change the cluster's
//! membership or its leader, or list it as the leader knows it.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use latchkey::{Client, Error};

use super::args::{Args, Members};
use super::connect::client;
use super::failure::Failure;
use super::output::out;

/// One `members` subcommand; `json` prints `list` as JSON.
pub async fn run(args: &Args, m: &Members, json: bool) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    match m {
        Members::Add {
            id,
            peer_addr,
            learner,
            force,
        } => {
            let call = async {
                if *force {
                    c.add_member_forced(*id, peer_addr, !*learner).await
                } else {
                    c.add_member(*id, peer_addr, !*learner).await
                }
            };
            with_progress(&c, *id, call).await?
        }
        Members::Remove { id, force: false } => c.remove_voter(*id).await?,
        Members::Remove { id, force: true } => c.remove_voter_forced(*id).await?,
        Members::Promote { id } => c.promote(*id).await?,
        Members::TransferLeader { id } => {
            let leader = c.transfer_leader(*id).await?;
            let text = if json {
                format!("{}\n", serde_json::json!({ "leader": leader }))
            } else {
                format!("node {leader} leads\n")
            };
            out(&[text.as_bytes()])?;
            return Ok(ExitCode::SUCCESS);
        }
        Members::List => {
            let status = c.status().await?;
            let text = if json {
                let value = serde_json::json!({
                    "leader": status.leader_id,
                    "members": status.members,
                });
                serde_json::to_string_pretty(&value)
                    .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?
                    + "\n"
            } else {
                let mut text = format!(
                    "{:>4} {:<8} {:<22} {:<22} {:>20} {}\n",
                    "ID", "ROLE", "PEER", "CLIENT", "INCARNATION", "MATCHED"
                );
                for m in &status.members {
                    let role = match (m.voter, Some(m.id) == status.leader_id) {
                        (true, true) => "leader",
                        (true, false) => "voter",
                        (false, _) => "learner",
                    };
                    text.push_str(&format!(
                        "{:>4} {:<8} {:<22} {:<22} {:>20} {}\n",
                        m.id,
                        role,
                        m.peer_addr,
                        m.client_addr,
                        m.incarnation,
                        m.matched_index.map_or("-".to_string(), |i| i.to_string())
                    ));
                }
                text
            };
            out(&[text.as_bytes()])?;
            return Ok(ExitCode::SUCCESS);
        }
    }
    out(&[b"OK\n"])?;
    Ok(ExitCode::SUCCESS)
}

/// Run `call` (a `members add` of node `id`), printing on stderr every
/// 2 s how far the new member has caught up, as the leader sees it.
async fn with_progress(
    c: &Client,
    id: u64,
    call: impl std::future::Future<Output = Result<(), Error>>,
) -> Result<(), Error> {
    let mut call = std::pin::pin!(call);
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    tick.tick().await;
    loop {
        tokio::select! {
            done = &mut call => return done,
            _ = tick.tick() => {
                let Ok(status) = c.status().await else { continue };
                let line = match status.members.iter().find(|m| m.id == id) {
                    None => format!("node {id}: not a member yet"),
                    Some(m) => format!(
                        "node {id}: {}, replicated up to index {} of {}",
                        if m.voter { "voter" } else { "learner, catching up" },
                        m.matched_index.map_or("-".to_string(), |i| i.to_string()),
                        status.last_log_index
                    ),
                };
                let _ = writeln!(std::io::stderr(), "{line}");
            }
        }
    }
}
