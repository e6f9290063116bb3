//! The key-value commands: `put`, `get`, `del`, `scan` and `seq`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use latchkey::{Client, Consistency, ScanRange};

use super::args::{Args, WriteOut};
use super::connect::client;
use super::failure::Failure;
use super::fencing::{parse_sequencer, parse_session_secret};
use super::output::{hex, json_entry, out};

/// `put KEY VALUE`: write the value (from the argument, stdin or a file),
/// fenced by `fence` (with the session's secret) if given.
pub async fn put(
    args: &Args,
    key: &str,
    value: Option<&str>,
    file: Option<&Path>,
    fence: Option<&str>,
    session_secret: Option<&str>,
) -> Result<ExitCode, Failure> {
    let value = put_value(value, file)?;
    let c = client(args)?;
    let revision = match fence {
        Some(seq) => {
            let secret = parse_session_secret(session_secret)?;
            c.put_fenced(&parse_sequencer(seq)?, &secret, key, value)
                .await
        }
        None => c.put(key, value).await,
    };
    let printed = revision
        .map_err(Failure::from)
        .and_then(|r| written(args, r));
    done_writing(&c).await;
    printed
}

/// The session TTL of `put --ephemeral` without `--ttl`.
pub const EPHEMERAL_TTL: std::time::Duration = std::time::Duration::from_secs(10);

/// `put KEY VALUE --ephemeral`: open a session, bind the key to it, print
/// the revision, and keep the session alive until SIGINT or SIGTERM, then
/// close it (the key goes at once). The session is closed on every way out
/// once opened, a signal during the open or the put included. A killed
/// process stops keeping it alive: the session expires after `ttl` and the
/// key goes then. Ends with exit code 6 if the session is lost meanwhile.
pub async fn put_ephemeral(
    args: &Args,
    key: &str,
    value: Option<&str>,
    file: Option<&Path>,
    ttl: std::time::Duration,
) -> Result<ExitCode, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let value = put_value(value, file)?;
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let stopped = || Failure::Other(format!("stopped by a signal before {key:?} was written"));
    let c = client(args)?;
    let session = tokio::select! {
        s = c.session(ttl) => s?,
        _ = term.recv() => return Err(stopped()),
        _ = int.recv() => return Err(stopped()),
    };
    let held = async {
        let revision = tokio::select! {
            r = session.put(key, &value) => r?,
            _ = term.recv() => return Err(stopped()),
            _ = int.recv() => return Err(stopped()),
        };
        match args.write_out {
            WriteOut::Json => out(&[format!(
                "{}\n",
                serde_json::json!({ "revision": revision, "session": session.id().0 })
            )
            .as_bytes()])?,
            WriteOut::Simple | WriteOut::Table | WriteOut::Hex => {
                out(&[format!("{revision}\n").as_bytes()])?
            }
        }
        tokio::select! {
            _ = term.recv() => Ok(()),
            _ = int.recv() => Ok(()),
            _ = session.lost() => Err(Failure::LockLost(format!(
                "session {} was lost (ended by an operator, or no keep-alive acknowledged \
                 in time): the cluster deletes {key:?} when it ends the session, if it has \
                 not already",
                session.id().0
            ))),
        }
    }
    .await;
    // Closed on every way out: a signal or a failure leaves no key behind
    // for a TTL.
    let closed = session.close().await;
    done_writing(&c).await;
    held?;
    closed?;
    Ok(ExitCode::SUCCESS)
}

/// A write's answer: `OK`, or with `-w json` the revision it made.
fn written(args: &Args, revision: u64) -> Result<ExitCode, Failure> {
    match args.write_out {
        WriteOut::Json => {
            out(&[format!("{}\n", serde_json::json!({ "revision": revision })).as_bytes()])?
        }
        WriteOut::Simple | WriteOut::Table | WriteOut::Hex => out(&[b"OK\n"])?,
    }
    Ok(ExitCode::SUCCESS)
}

/// `get KEY`: print its value as `--write-out` asks (exit 1 if absent).
pub async fn get(args: &Args, key: &str, stale: bool) -> Result<ExitCode, Failure> {
    let consistency = if stale {
        Consistency::Stale
    } else {
        Consistency::Linearizable
    };
    let read = client(args)?.get_versioned(key, consistency).await?;
    match read.value {
        Some(v) => {
            let line = match args.write_out {
                WriteOut::Simple | WriteOut::Table => [v.value.as_slice(), b"\n"].concat(),
                WriteOut::Hex => format!("{}\n", hex(&v.value)).into_bytes(),
                WriteOut::Json => format!("{}\n", json_entry(key.as_bytes(), &v)).into_bytes(),
            };
            out(&[&line])?;
            Ok(ExitCode::SUCCESS)
        }
        None => Err(Failure::NotFound(format!("key {key:?} not found"))),
    }
}

/// `del KEY`: delete it, fenced by `fence` if given; unfenced, print
/// whether it existed.
pub async fn del(
    args: &Args,
    key: &str,
    fence: Option<&str>,
    session_secret: Option<&str>,
) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    match fence {
        Some(seq) => {
            let secret = parse_session_secret(session_secret)?;
            let revision = c
                .delete_fenced(&parse_sequencer(seq)?, &secret, key)
                .await?;
            return written(args, revision);
        }
        None => {
            let printed = c
                .delete(key)
                .await
                .map_err(Failure::from)
                .and_then(|existed| out(&[if existed { b"1\n" } else { b"0\n" }]));
            done_writing(&c).await;
            printed?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `scan`: print the matching keys and values page by page, at most
/// `limit` of them (0: all).
pub async fn scan(
    args: &Args,
    prefix: &str,
    start: &str,
    end: Option<&str>,
    limit: u32,
    reverse: bool,
) -> Result<ExitCode, Failure> {
    let mut range = ScanRange {
        start: start.as_bytes().to_vec(),
        end: end.map(|e| e.as_bytes().to_vec()),
        prefix: prefix.as_bytes().to_vec(),
        limit: 0,
        reverse,
    };
    let c = client(args)?;
    let mut printed: u64 = 0;
    loop {
        if limit != 0 {
            // One more than is left, to tell whether the limit cut
            // the scan.
            let left = u64::from(limit).saturating_sub(printed) + 1;
            range.limit = u32::try_from(left)
                .unwrap_or(u32::MAX)
                .min(latchkey_core::limits::MAX_SCAN_LIMIT);
        }
        let page = c.scan(range.clone()).await?;
        for (k, v) in &page.entries {
            if limit != 0 && printed == u64::from(limit) {
                let _ = writeln!(
                    std::io::stderr(),
                    "latchkey: stopped at --limit {limit}: more keys match"
                );
                return Ok(ExitCode::SUCCESS);
            }
            let line = match args.write_out {
                WriteOut::Simple | WriteOut::Table => [&k[..], b"\t", &v.value, b"\n"].concat(),
                WriteOut::Hex => format!("{}\t{}\n", hex(k), hex(&v.value)).into_bytes(),
                WriteOut::Json => format!("{}\n", json_entry(k, v)).into_bytes(),
            };
            out(&[&line])?;
            printed += 1;
        }
        let Some((last, _)) = page.entries.last() else {
            break;
        };
        if !page.more {
            break;
        }
        // The next page starts right after the last key printed
        // (below it, in reverse).
        if reverse {
            range.end = Some(last.clone());
        } else {
            let mut next = last.clone();
            next.push(0);
            range.start = next;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `seq KEY`: allocate `step` numbers from the sequence; print the first.
pub async fn seq(args: &Args, key: &str, step: u64) -> Result<ExitCode, Failure> {
    let c = client(args)?;
    let printed = c
        .next_sequence(key, step)
        .await
        .map_err(Failure::from)
        .and_then(|range| out(&[format!("{}\n", range.start).as_bytes()]));
    done_writing(&c).await;
    printed?;
    Ok(ExitCode::SUCCESS)
}

/// How long a one-shot write waits to close its write session.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// After a one-shot write, answered or not (its answer already printed):
/// close the session the write went under, so it does not outlive this
/// process by its TTL; give up after [`CLOSE_WAIT`] and let it expire.
async fn done_writing(c: &Client) {
    let note = match tokio::time::timeout(CLOSE_WAIT, c.close()).await {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {CLOSE_WAIT:?}"),
    };
    let _ = writeln!(
        std::io::stderr(),
        "latchkey: note: the write session was not closed ({note}); it expires by itself"
    );
}

/// The value `put` writes: its argument, stdin for `-`, or `--file`'s
/// bytes; more than the value limit is refused before anything is sent.
fn put_value(value: Option<&str>, file: Option<&Path>) -> Result<Vec<u8>, Failure> {
    use std::io::Read;
    let (reader, source): (Box<dyn Read>, String) = match (value, file) {
        (Some("-"), None) if std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            return Err(Failure::Usage(
                "`put KEY -` reads the value from stdin, which is a terminal: pipe the value \
                 in, or give it as an argument or with --file"
                    .into(),
            ))
        }
        (Some("-"), None) => (Box::new(std::io::stdin().lock()), "stdin".to_string()),
        (Some(v), None) => return Ok(v.as_bytes().to_vec()),
        (None, Some(path)) => (
            Box::new(std::fs::File::open(path).map_err(|e| {
                Failure::Usage(format!(
                    "cannot read the value file {}: {e}",
                    path.display()
                ))
            })?),
            path.display().to_string(),
        ),
        _ => return Err(Failure::Usage("give a value, `-` (stdin) or --file".into())),
    };
    let limit = latchkey_core::limits::MAX_VALUE_LEN;
    let mut bytes = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Failure::Usage(format!("cannot read the value from {source}: {e}")))?;
    if bytes.len() > limit {
        return Err(Failure::Usage(format!(
            "the value from {source} is over the {limit}-byte limit"
        )));
    }
    Ok(bytes)
}
