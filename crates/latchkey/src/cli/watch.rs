//! `latchkey watch`: print every change of a key or a prefix as it
//! happens, until Ctrl-C or SIGTERM.

use std::process::ExitCode;

use futures::StreamExt;
use latchkey::{KeyChange, Selection, WatchMessage};

use super::args::{Args, WriteOut};
use super::connect::client;
use super::failure::Failure;
use super::output::{hex, json_entry, out};

/// One change as a line in the output format asked for.
fn line(write_out: WriteOut, revision: u64, change: &KeyChange, prev: bool) -> Vec<u8> {
    let kind = if change.current.is_some() {
        "PUT"
    } else {
        "DELETE"
    };
    match write_out {
        WriteOut::Json => {
            use base64::Engine;
            let b64 = base64::engine::general_purpose::STANDARD;
            let mut event = serde_json::json!({
                "type": kind,
                "revision": revision,
                "key": b64.encode(&change.key),
            });
            if let Some(v) = &change.current {
                event["kv"] = json_entry(&change.key, v);
            }
            if let Some(p) = change.previous.as_ref().filter(|_| prev) {
                event["prev_kv"] = json_entry(&change.key, p);
            }
            format!("{event}\n").into_bytes()
        }
        WriteOut::Hex => {
            let value = change.current.as_ref().map(|v| hex(&v.value));
            let previous = change
                .previous
                .as_ref()
                .filter(|_| prev)
                .map(|p| format!("\t{}", hex(&p.value)));
            let mut text = format!("{kind}\t{}", hex(&change.key));
            if let Some(value) = value {
                text.push('\t');
                text.push_str(&value);
            }
            text.push_str(&previous.unwrap_or_default());
            text.push('\n');
            text.into_bytes()
        }
        WriteOut::Simple | WriteOut::Table => {
            let mut parts: Vec<&[u8]> = vec![kind.as_bytes(), b"\t", &change.key];
            if let Some(v) = &change.current {
                parts.extend([&b"\t"[..], &v.value]);
            }
            if let Some(p) = change.previous.as_ref().filter(|_| prev) {
                parts.extend([&b"\t"[..], &p.value]);
            }
            parts.push(b"\n");
            parts.concat()
        }
    }
}

pub async fn run(
    args: &Args,
    key: Option<&str>,
    prefix: Option<&str>,
    rev: Option<u64>,
    prev: bool,
) -> Result<ExitCode, Failure> {
    use tokio::signal::unix::{signal, SignalKind};
    let keys = match (key, prefix) {
        (_, Some(p)) => Selection::prefix(p),
        (Some(k), None) => Selection::key(k),
        (None, None) => return Err(Failure::Usage("name a KEY or a --prefix".into())),
    };
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let c = client(args)?;
    let mut watch = c.watch(keys);
    if let Some(rev) = rev {
        watch = watch.from_revision(rev);
    }
    if prev {
        watch = watch.with_prev_value();
    }
    loop {
        let message = tokio::select! {
            _ = term.recv() => return Ok(ExitCode::SUCCESS),
            _ = int.recv() => return Ok(ExitCode::SUCCESS),
            message = watch.next() => message,
        };
        match message {
            None => return Ok(ExitCode::SUCCESS),
            Some(Ok(WatchMessage::Changes {
                revision, changes, ..
            })) => {
                let lines: Vec<Vec<u8>> = changes
                    .iter()
                    .map(|c| line(args.write_out, revision, c, prev))
                    .collect();
                let parts: Vec<&[u8]> = lines.iter().map(Vec::as_slice).collect();
                out(&parts)?;
            }
            Some(Ok(WatchMessage::Progress { .. })) => {}
            // Unreachable replicas: say so and keep trying.
            Some(Err(e @ latchkey::Error::Unavailable { .. })) => {
                tracing::warn!("{e}; still trying");
            }
            Some(Err(e)) => return Err(e.into()),
        }
    }
}
