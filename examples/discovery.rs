//! Service discovery with keys bound to sessions: each member of a service
//! puts `members/<name>` bound to its own session; an observer lists
//! `members/` and watches it from the list's revision plus one. A member
//! that leaves closes its session and its key goes at once; a member that
//! dies stops keeping its session alive, and its key goes when the session
//! expires, after its TTL. Three `latchkey serve` processes run on
//! loopback.
//!
//! Run it with `cargo xtask demo discovery` (or `cargo run -p latchkey
//! --example discovery -- [LATCHKEY_BIN]`).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use latchkey::{Client, ScanRange, Selection, Session, WatchMessage};

#[path = "process_cluster.rs"]
mod process_cluster;
use process_cluster::ProcessCluster;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The session TTL of each member: how long a dead member stays listed.
const TTL: Duration = Duration::from_secs(4);

fn say(msg: impl AsRef<str>) {
    println!("[discovery] {}", msg.as_ref());
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A member joins: a session of its own, and its address bound to it.
async fn join(addrs: &[String], name: &str, addr: &str) -> Result<Session> {
    let client = Client::connect(addrs)?;
    let session = client.session(TTL).await?;
    let revision = session.put(format!("members/{name}"), addr).await?;
    say(format!(
        "{name} joined at revision {revision} (session {})",
        session.id().0
    ));
    Ok(session)
}

/// The members as the observer sees them, updated by `watch` until the
/// membership equals `want` (or the deadline passes).
async fn observe_until(
    watch: &mut latchkey::Watch,
    members: &mut BTreeMap<String, String>,
    want: &[&str],
    deadline: Duration,
) -> Result<()> {
    let started = Instant::now();
    let want: Vec<String> = want.iter().map(|n| format!("members/{n}")).collect();
    while members.keys().cloned().collect::<Vec<_>>() != want {
        let left = deadline
            .checked_sub(started.elapsed())
            .ok_or_else(|| format!("the members are still {members:?}, not {want:?}"))?;
        let Ok(message) = tokio::time::timeout(left, watch.next()).await else {
            return Err(format!("the members are still {members:?}, not {want:?}").into());
        };
        match message.ok_or("the watch ended")? {
            Ok(WatchMessage::Changes {
                revision, changes, ..
            }) => {
                for change in changes {
                    let key = text(&change.key);
                    match change.current {
                        Some(v) => {
                            say(format!("  revision {revision}: {key} = {}", text(&v.value)));
                            members.insert(key, text(&v.value));
                        }
                        None => {
                            say(format!("  revision {revision}: {key} is gone"));
                            members.remove(&key);
                        }
                    }
                }
            }
            Ok(WatchMessage::Progress { .. }) => {}
            Err(latchkey::Error::Unavailable { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let bin = match std::env::args().nth(1) {
        Some(bin) => bin,
        None => process_cluster::sibling_server_bin()
            .ok_or("no latchkey binary next to this example: run `cargo xtask demo discovery`")?
            .to_string_lossy()
            .into_owned(),
    };
    let cluster = ProcessCluster::start(&bin, Vec::new())?;
    let addrs = cluster.addrs.clone();
    say(format!(
        "started three `latchkey serve` processes: {addrs:?}"
    ));

    let api = join(&addrs, "api-1", "10.0.0.1:8080").await?;
    let worker = join(&addrs, "worker-1", "10.0.0.2:9090").await?;

    // The observer: list, then watch from the list's revision plus one.
    let observer = Client::connect(&addrs)?;
    let page = observer.scan(ScanRange::prefix("members/", 0)).await?;
    let mut members: BTreeMap<String, String> = page
        .entries
        .iter()
        .map(|(k, v)| (text(k), text(&v.value)))
        .collect();
    say(format!(
        "the observer lists {:?} at revision {}",
        members.keys().collect::<Vec<_>>(),
        page.revision
    ));
    let mut watch = observer
        .watch(Selection::prefix("members/"))
        .from_revision(page.revision + 1);

    let late = join(&addrs, "api-2", "10.0.0.3:8080").await?;
    observe_until(
        &mut watch,
        &mut members,
        &["api-1", "api-2", "worker-1"],
        Duration::from_secs(10),
    )
    .await?;

    say("worker-1 leaves: it closes its session");
    worker.close().await?;
    observe_until(
        &mut watch,
        &mut members,
        &["api-1", "api-2"],
        Duration::from_secs(10),
    )
    .await?;

    say(format!(
        "api-2 dies without a word: its session expires after its TTL ({TTL:?})"
    ));
    let died = Instant::now();
    late.abandon();
    observe_until(
        &mut watch,
        &mut members,
        &["api-1"],
        TTL * 3 + Duration::from_secs(10),
    )
    .await?;
    say(format!(
        "api-2 was dropped {:.1} s after it died",
        died.elapsed().as_secs_f64()
    ));
    api.close().await?;
    observe_until(&mut watch, &mut members, &[], Duration::from_secs(10)).await?;
    say("every member is gone with its session");
    Ok(())
}
