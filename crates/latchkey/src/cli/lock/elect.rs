//! `latchkey elect`: campaign in an election and hold it (or run a command
//! while leading, through the lock room's `lock -- CMD` machinery), print
//! who leads, or follow every change of leader.
//!
//! Output, one line per leader: `TERM SESSION VALUE` (the value as text,
//! lossily), `none` while nobody leads; with `-w json` an object
//! `{"revision", "leader": {"term", "session", "value"}}` (the value in
//! base64, etcdctl's convention) or `"leader": null`.

use std::process::ExitCode;

use futures::StreamExt;
use latchkey::{Client, Leader};

use super::super::args::{Args, ElectArgs, WriteOut};
use super::super::connect::client;
use super::super::failure::Failure;
use super::super::output::out;
use super::{hold_while_running, LockRequest};

pub async fn run(args: &Args, e: &ElectArgs) -> Result<ExitCode, Failure> {
    match (&e.value, e.observe) {
        (Some(value), _) if !e.command.is_empty() => {
            let c = client(args).map_err(|f| Failure::AroundCommand(Box::new(f)))?;
            hold_while_running(c, LockRequest::campaign(e, value))
                .await
                .map_err(|f| Failure::AroundCommand(Box::new(f)))
        }
        (Some(value), _) => lead_until_stopped(args, e, value).await,
        (None, _) if !e.command.is_empty() => Err(Failure::Usage(
            "running a command while leading needs a VALUE to campaign with".into(),
        )),
        (None, true) => observe(args, e).await,
        (None, false) => {
            let c = client(args)?;
            let leader = c.leader(&e.name).await?;
            print(args.write_out, None, leader.as_ref())?;
            match leader {
                Some(_) => Ok(ExitCode::SUCCESS),
                None => Err(Failure::NotFound(format!(
                    "election {:?} has no leader",
                    e.name
                ))),
            }
        }
    }
}

/// Campaign, print the term once leading, hold until Ctrl-C or SIGTERM
/// (then resign), or fail with exit 6 if leadership is lost.
async fn lead_until_stopped(args: &Args, e: &ElectArgs, value: &str) -> Result<ExitCode, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let watch = |kind: SignalKind| {
        signal(kind).map_err(|err| Failure::Other(format!("cannot watch signals: {err}")))
    };
    // A hang-up (the terminal closed) resigns too, rather than leave the
    // election led by nobody alive until the TTL runs out.
    let (mut term, mut int, mut hup) = (
        watch(SignalKind::terminate())?,
        watch(SignalKind::interrupt())?,
        watch(SignalKind::hangup())?,
    );
    let c: Client = client(args)?;
    let req = LockRequest::campaign(e, value);
    let session = c.session(e.hold.ttl).await?;
    let won = tokio::select! {
        won = req.acquire(&session) => won,
        _ = term.recv() => Ok(None),
        _ = int.recv() => Ok(None),
        _ = hup.recv() => Ok(None),
    };
    let guard = match won {
        Ok(Some(super::Held::One(guard))) if guard.is_held() => guard,
        Ok(_) => {
            let _ = session.close().await;
            return Err(req.not_acquired());
        }
        Err(err) => {
            let _ = session.close().await;
            return Err(err.into());
        }
    };
    let leader = Leader {
        term: guard.token(),
        session: session.id(),
        value: value.as_bytes().to_vec(),
    };
    print(args.write_out, None, Some(&leader))?;
    tokio::select! {
        _ = guard.lost() => {
            return Err(Failure::LockLost(format!(
                "lost the leadership of election {:?} (term {})",
                e.name,
                guard.token()
            )));
        }
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = hup.recv() => {}
    }
    if let Err(err) = guard.release().await {
        tracing::warn!(error = %err, "resigning");
    }
    let _ = session.close().await;
    Ok(ExitCode::SUCCESS)
}

/// Print the leader now and at every change, until Ctrl-C or SIGTERM.
async fn observe(args: &Args, e: &ElectArgs) -> Result<ExitCode, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())
        .map_err(|err| Failure::Other(format!("cannot watch signals: {err}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|err| Failure::Other(format!("cannot watch signals: {err}")))?;
    let c = client(args)?;
    let mut changes = c.observe_leader(&e.name);
    loop {
        tokio::select! {
            next = changes.next() => match next {
                Some(Ok(change)) => {
                    if change.skipped {
                        tracing::warn!(
                            revision = change.revision,
                            "the cluster's history no longer held every change since the last \
                             line: leaders in between may be missing"
                        );
                    }
                    print(args.write_out, Some(change.revision), change.leader.as_ref())?;
                }
                // Transient: the stream goes on trying by itself.
                Some(Err(latchkey::Error::Unavailable { .. })) => {}
                Some(Err(err)) => return Err(err.into()),
                None => return Err(Failure::Other("the observation of the election ended".into())),
            },
            _ = term.recv() => return Ok(ExitCode::SUCCESS),
            _ = int.recv() => return Ok(ExitCode::SUCCESS),
        }
    }
}

/// One leader as a line.
fn print(
    write_out: WriteOut,
    revision: Option<u64>,
    leader: Option<&Leader>,
) -> Result<(), Failure> {
    let line = match write_out {
        WriteOut::Json => {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD;
            let leader = leader.map(|l| {
                serde_json::json!({
                    "term": l.term.0,
                    "session": l.session.0,
                    "value": b64.encode(&l.value),
                })
            });
            let mut object = serde_json::json!({ "leader": leader });
            if let Some(r) = revision {
                object["revision"] = r.into();
            }
            format!("{object}\n")
        }
        _ => match leader {
            Some(l) => format!(
                "{} {} {}\n",
                l.term.0,
                l.session.0,
                String::from_utf8_lossy(&l.value)
            ),
            None => "none\n".to_string(),
        },
    };
    out(&[line.as_bytes()])
}
