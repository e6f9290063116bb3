//! Retry-safe writes across a leader kill, with real processes: writers
//! allocate from one sequence while the leader is SIGKILLed; every call
//! must be answered (no `UnknownOutcome`), and the sequence must have moved
//! exactly once per answered call: a write resent after the kill was not
//! applied twice.

#[path = "support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use latchkey::Client;
use support::{eventually, Cluster, LEADER_WAIT, TEST_LIMIT};

const TASKS: usize = 4;
const PER_TASK: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_resent_across_a_leader_kill_apply_once_and_are_all_answered() {
    let mut c = Cluster::start("retry-safe", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, leader_killed(&mut c)).await;
    c.finish(outcome, TEST_LIMIT);
}

/// Allocate `PER_TASK` ids one at a time; every call must be answered.
async fn allocate(client: Client, task: usize, done: Arc<AtomicUsize>) -> Result<Vec<u64>> {
    let mut ids = Vec::with_capacity(PER_TASK);
    for i in 0..PER_TASK {
        match client.next_sequence("ids", 1).await {
            Ok(range) => {
                ensure!(range.end == range.start + 1, "task {task}: got {range:?}");
                ids.push(range.start);
                done.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => bail!("task {task}: allocation {i} was not answered: {e}"),
        }
    }
    Ok(ids)
}

async fn leader_killed(c: &mut Cluster) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| tokio::spawn(allocate(client.clone(), t, Arc::clone(&done))))
        .collect();
    eventually(
        Duration::from_secs(60),
        "a quarter of the allocations answered",
        async || {
            let n = done.load(Ordering::SeqCst);
            ensure!(n >= TASKS * PER_TASK / 4, "{n} answered so far");
            Ok(())
        },
    )
    .await?;
    let old = c.wait_for_leader(LEADER_WAIT).await?;
    c.kill(old)?;
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await.context("an allocating task panicked")??);
    }
    ids.sort_unstable();
    let answered = ids.len();
    ids.dedup();
    ensure!(
        ids.len() == answered,
        "{} ids were handed out twice",
        answered - ids.len()
    );
    // Step 0 reads the next start: one step per answered call, none more.
    let next = c.client()?.next_sequence("ids", 0).await?.start;
    ensure!(
        next == answered as u64,
        "the sequence moved {next} times for {answered} answered calls: a resent write was \
         applied twice"
    );
    ensure!(
        ids.first() == Some(&0) && ids.last() == Some(&(next - 1)),
        "the ids are not 0..{next}"
    );
    Ok(())
}
