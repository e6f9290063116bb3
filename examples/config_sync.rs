//! Keep a local copy of a configuration in sync with the cluster: list the
//! keys under `config/`, then watch them from the revision the list saw, so
//! no change is missed and none is applied twice. Three `latchkey serve`
//! processes run on loopback; an operator changes the configuration while
//! the replica the watcher reads from is killed (SIGKILL) and comes back.
//! The watch moves to another replica and resumes by itself; at the end the
//! local copy equals what the cluster holds.
//!
//! Run it with `cargo xtask demo config` (or `cargo run -p latchkey
//! --example config_sync -- [LATCHKEY_BIN]`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use latchkey::{Client, ScanRange, Selection, WatchMessage};

#[path = "process_cluster.rs"]
mod process_cluster;
use process_cluster::ProcessCluster;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The local copy: key -> value, and the revision it is current at.
#[derive(Debug, Default)]
struct Config {
    values: BTreeMap<String, String>,
    revision: u64,
}

fn say(msg: impl AsRef<str>) {
    println!("[config_sync] {}", msg.as_ref());
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// List `config/`, then apply every change after the list to `config`,
/// for as long as the watch runs.
async fn sync(client: Client, config: Arc<Mutex<Config>>) -> Result<()> {
    let page = client.scan(ScanRange::prefix("config/", 0)).await?;
    {
        let mut c = config.lock().unwrap_or_else(|p| p.into_inner());
        c.values = page
            .entries
            .iter()
            .map(|(k, v)| (text(k), text(&v.value)))
            .collect();
        c.revision = page.revision;
    }
    let mut watch = client
        .watch(Selection::prefix("config/"))
        .from_revision(page.revision + 1);
    while let Some(message) = watch.next().await {
        match message {
            Ok(WatchMessage::Changes {
                revision, changes, ..
            }) => {
                let mut c = config.lock().unwrap_or_else(|p| p.into_inner());
                for change in changes {
                    let key = text(&change.key);
                    match change.current {
                        Some(v) => {
                            say(format!("  {revision}: {key} = {}", text(&v.value)));
                            c.values.insert(key, text(&v.value));
                        }
                        None => {
                            say(format!("  {revision}: {key} deleted"));
                            c.values.remove(&key);
                        }
                    }
                }
                c.revision = revision;
            }
            Ok(WatchMessage::Progress { revision, .. }) => {
                let mut c = config.lock().unwrap_or_else(|p| p.into_inner());
                c.revision = c.revision.max(revision);
            }
            // No replica reachable for a while: the watch keeps trying.
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
            .ok_or("no latchkey binary next to this example: run `cargo xtask demo config`")?
            .to_string_lossy()
            .into_owned(),
    };
    let mut cluster = ProcessCluster::start(&bin, Vec::new())?;
    let addrs = cluster.addrs.clone();
    say(format!(
        "started three `latchkey serve` processes: {addrs:?}"
    ));
    let operator = Client::connect(&addrs)?;
    operator.put("config/timeout", "5s").await?;
    operator.put("config/replicas", "3").await?;

    // The watcher reads from the first replica until it is killed.
    let config = Arc::new(Mutex::new(Config::default()));
    let watcher = Client::connect(&addrs)?;
    let syncing = tokio::spawn(sync(watcher, Arc::clone(&config)));
    tokio::time::sleep(Duration::from_millis(500)).await;

    say("the operator changes the configuration");
    operator.put("config/timeout", "10s").await?;
    operator.put("config/feature-x", "on").await?;
    say("SIGKILL the first replica (the watch moves to another one)");
    cluster.kill(0);
    operator.delete("config/replicas").await?;
    operator.put("config/feature-x", "off").await?;
    cluster.restart(0)?;
    let last = operator.put("config/mode", "blue").await?;

    // Wait until the copy has caught up with the last change.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while config.lock().unwrap_or_else(|p| p.into_inner()).revision < last {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the local copy did not reach revision {last}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    syncing.abort();
    let local = config
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .values
        .clone();
    let page = operator.scan(ScanRange::prefix("config/", 0)).await?;
    let stored: BTreeMap<String, String> = page
        .entries
        .iter()
        .map(|(k, v)| (text(k), text(&v.value)))
        .collect();
    say(format!("local copy at revision {last}: {local:?}"));
    if local != stored {
        return Err(
            format!("the local copy {local:?} differs from the cluster's {stored:?}").into(),
        );
    }
    say("the local copy equals the cluster's configuration");
    Ok(())
}
