//! One active scheduler, two standbys: fenced leader election.
//!
//! A three-replica cluster runs in this process. Three schedulers campaign
//! in the election `scheduler`, each with its address as its value; an
//! observer follows who leads. The leader writes its schedule fenced by its
//! term. Then:
//!
//! 1. The leader proclaims a new address (observers see it, the term stays).
//! 2. The leader resigns: the next candidate in FIFO order leads, in the
//!    same log entry, with a higher term.
//! 3. The new leader's session is closed from outside (as if it died): the
//!    last candidate leads, and the deposed leader's fenced write under its
//!    old term is refused.
//!
//! Run it with `cargo xtask demo election` (or `cargo run -p latchkey
//! --example leader_election`). It exits non-zero if any step does not
//! behave as described.

use std::time::Duration;

use futures::StreamExt;
use latchkey::{Client, LeaderChange, Leadership, Session};

#[path = "support/mod.rs"]
mod support;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ELECTION: &str = "scheduler";

fn say(who: &str, msg: impl AsRef<str>) {
    println!("[{who:<9}] {}", msg.as_ref());
}

fn describe(change: &LeaderChange) -> String {
    match &change.leader {
        Some(l) => format!(
            "revision {}: term {} led by session {} at {}",
            change.revision,
            l.term,
            l.session,
            String::from_utf8_lossy(&l.value)
        ),
        None => format!("revision {}: nobody leads", change.revision),
    }
}

/// A scheduler: its own client and session, campaigning with its address.
async fn candidate(
    endpoints: &[String],
    addr: &'static str,
) -> Result<tokio::task::JoinHandle<Result<(Session, Leadership)>>> {
    let client = Client::connect(endpoints)?;
    let session = client.session(Duration::from_secs(5)).await?;
    Ok(tokio::spawn(async move {
        let leadership = session.election(ELECTION).campaign(addr).await?;
        say(addr, format!("leads in term {}", leadership.term()));
        Ok((session, leadership))
    }))
}

async fn wait_for_waiters(client: &Client, n: u32) -> Result<()> {
    let name = latchkey::core::lock::election_lock_name(ELECTION);
    for _ in 0..200 {
        let waiting = client
            .locks(&name)
            .await?
            .into_iter()
            .find(|l| l.name == name)
            .map_or(0, |l| l.waiters);
        if waiting == n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("{n} candidates never queued").into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (nodes, _members) = support::start_three(dir.path()).await?;
    let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
    say("cluster", format!("three replicas up, node {leader} leads"));
    let endpoints: Vec<String> = nodes
        .values()
        .map(|n| n.advertise_addr().to_string())
        .collect();
    let client = Client::connect(&endpoints)?;

    let mut observer = client.observe_leader(ELECTION);
    let first = observer.next().await.ok_or("the observer ended")??;
    say("observer", describe(&first));

    let a = candidate(&endpoints, "10.0.0.1").await?;
    let (_a_session, mut a_lead) = a.await??;
    let b = candidate(&endpoints, "10.0.0.2").await?;
    wait_for_waiters(&client, 1).await?;
    let c = candidate(&endpoints, "10.0.0.3").await?;
    wait_for_waiters(&client, 2).await?;
    a_lead.put("schedule/owner", "10.0.0.1").await?;
    say("10.0.0.1", "wrote the schedule, fenced by its term");

    a_lead.proclaim("10.0.0.11").await?;
    say("10.0.0.1", "proclaimed a new address, 10.0.0.11");
    let a_term = a_lead.term();
    a_lead.resign().await?;
    say("10.0.0.1", "resigned");
    let (b_session, b_lead) = b.await??;
    if b_lead.term() <= a_term {
        return Err("the next term is not higher".into());
    }
    b_lead.put("schedule/owner", "10.0.0.2").await?;

    say("operator", "closes 10.0.0.2's session, as if it had died");
    let b_sequencer = b_lead.sequencer().clone();
    let b_secret = b_session.secret();
    b_session.close().await?;
    let (_c_session, c_lead) = c.await??;
    match client
        .put_fenced(&b_sequencer, &b_secret, "schedule/owner", "10.0.0.2 again")
        .await
    {
        Err(e) if e.is_stale_fence() => say("10.0.0.2", format!("its old term is refused: {e}")),
        Ok(_) => return Err("a deposed leader's fenced write was accepted".into()),
        Err(e) => return Err(e.into()),
    }
    c_lead.put("schedule/owner", "10.0.0.3").await?;

    // The observer saw every term in order, the proclamation included.
    let mut terms = Vec::new();
    while terms.len() < 4 {
        let change = tokio::time::timeout(Duration::from_secs(10), observer.next())
            .await
            .map_err(|_| "the observer fell silent")?
            .ok_or("the observer ended")??;
        say("observer", describe(&change));
        if let Some(l) = change.leader {
            terms.push(l.term);
        }
    }
    if terms.windows(2).any(|w| w[1] < w[0]) {
        return Err(format!("terms out of order: {terms:?}").into());
    }
    let owner = client.get("schedule/owner").await?;
    if owner.as_deref() != Some(b"10.0.0.3".as_slice()) {
        return Err(format!("schedule/owner is {owner:?}").into());
    }
    c_lead.resign().await?;
    for node in nodes.into_values() {
        node.shutdown().await;
    }
    say(
        "cluster",
        "done: one leader per term, terms only grew, the deposed leader was fenced",
    );
    Ok(())
}
