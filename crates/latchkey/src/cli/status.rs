//! `status`: each endpoint's leader, term, applied index and members, and
//! whether every replica is serving with a leader.

use std::collections::BTreeMap;
use std::process::ExitCode;

use super::args::Args;
use super::connect::{client, endpoints};
use super::failure::Failure;
use super::output::out;

/// `status`: print every endpoint's view (`json`: as JSON); exit 3 after
/// printing if any endpoint does not answer, has failed, waits or knows no
/// leader.
pub async fn run(args: &Args, json: bool) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    let mut rows = BTreeMap::new();
    let mut errors = Vec::new();
    for addr in endpoints(args) {
        match c.status_of(&addr).await {
            Ok(s) => {
                rows.insert(addr, s);
            }
            Err(e) => errors.push((addr, e.to_string())),
        }
    }
    if json {
        let value = serde_json::json!({
            "nodes": rows,
            "unreachable": errors.iter().map(|(a, e)| serde_json::json!({"endpoint": a, "error": e})).collect::<Vec<_>>(),
        });
        let text = serde_json::to_string_pretty(&value)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?;
        out(&[text.as_bytes(), b"\n"])?;
    } else {
        let mut text = format!(
            "{:<22} {:>4} {:<10} {:>6} {:>6} {:>10}\n",
            "ENDPOINT", "ID", "STATE", "LEADER", "TERM", "APPLIED"
        );
        for (addr, s) in &rows {
            text.push_str(&format!(
                "{:<22} {:>4} {:<10} {:>6} {:>6} {:>10}\n",
                addr,
                s.id,
                s.state,
                s.leader_id.map_or("-".to_string(), |l| l.to_string()),
                s.term,
                s.last_applied
            ));
        }
        for (addr, e) in &errors {
            text.push_str(&format!("{addr:<22} unreachable: {e}\n"));
        }
        // Why a replica waits or failed, and peers it refuses or that
        // refuse it: what an operator must act on.
        for (addr, s) in &rows {
            if let Some(detail) = &s.detail {
                text.push_str(&format!("{addr} ({}): {detail}\n", s.state));
            }
            for problem in &s.peer_problems {
                text.push_str(&format!("{addr}: {problem}\n"));
            }
        }
        // The membership as the leader (else the first answer) knows it.
        let view = rows
            .values()
            .find(|s| s.leader_id == Some(s.id))
            .or_else(|| rows.values().next());
        if let Some(s) = view {
            let members: Vec<String> = s
                .members
                .iter()
                .map(|m| {
                    format!(
                        "{}={}#{} (clients {}){}",
                        m.id,
                        m.peer_addr,
                        m.incarnation,
                        m.client_addr,
                        if m.voter { "" } else { " (learner)" }
                    )
                })
                .collect();
            text.push_str(&format!(
                "members (id=peer address#incarnation): {}\n",
                members.join(", ")
            ));
        }
        out(&[text.as_bytes()])?;
    }
    if rows.is_empty() {
        return Err(Failure::Unavailable("no endpoint answered".into()));
    }
    // Something to alert on: a replica down, failed, or without a leader
    // is not a healthy status.
    if !errors.is_empty() {
        return Err(Failure::Unavailable(format!(
            "{} of {} endpoints did not answer",
            errors.len(),
            errors.len() + rows.len()
        )));
    }
    let unwell: Vec<String> = rows
        .iter()
        .filter(|(_, s)| s.state == "Failed" || s.state == "Waiting" || s.leader_id.is_none())
        .map(|(addr, s)| match s.leader_id {
            None if s.state != "Failed" && s.state != "Waiting" => format!("{addr}: no leader"),
            _ => format!("{addr}: {}", s.state),
        })
        .collect();
    if !unwell.is_empty() {
        return Err(Failure::Unavailable(format!(
            "not every replica is serving with a leader ({})",
            unwell.join(", ")
        )));
    }
    Ok(ExitCode::SUCCESS)
}
