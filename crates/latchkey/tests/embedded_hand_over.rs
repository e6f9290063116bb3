//! A leader that stops gracefully hands leadership to another voter first:
//! `Node::shutdown` says to whom, that voter leads, and writes running
//! through the stop all succeed (none ends with an unknown outcome).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::HandOver;
use latchkey_client::{Client, Error};

mod common;

use common::{client_addrs, start_cluster};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_leader_hands_over_and_no_write_is_lost() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, _members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let client = Client::connect(client_addrs(&nodes))?;
        client.put("warm", "up").await?;

        // A writer runs through the stop.
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (client, stop) = (client.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut results = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    results.push(client.put(format!("k/{i:05}"), "v").await);
                    i += 1;
                }
                results
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;

        // A follower's stop has nothing to hand over.
        let follower = *nodes
            .keys()
            .find(|id| **id != leader)
            .ok_or("no follower")?;
        let others: Vec<u64> = nodes.keys().copied().filter(|id| *id != leader).collect();
        let handed = nodes.remove(&leader).ok_or("leader")?.shutdown().await;
        let HandOver::To(next) = handed else {
            return Err(format!("the leader did not hand over: {handed:?}").into());
        };
        assert!(
            others.contains(&next),
            "handed to {next}, not a remaining voter"
        );
        let started = Instant::now();
        while !nodes[&next].is_leader() {
            if started.elapsed() > Duration::from_secs(30) {
                return Err(format!("node {next} was handed leadership but does not lead").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::SeqCst);
        let results = writer.await?;
        assert!(
            results.len() > 2,
            "the writer barely ran: {}",
            results.len()
        );
        for (i, result) in results.iter().enumerate() {
            match result {
                Ok(_) => {}
                Err(Error::UnknownOutcome(why)) => {
                    return Err(format!("write {i} ended with an unknown outcome: {why}").into())
                }
                Err(e) => return Err(format!("write {i} failed: {e}").into()),
            }
        }
        // Every acknowledged write is there.
        let last = results.len() - 1;
        assert_eq!(
            client.get(format!("k/{last:05}")).await?,
            Some(b"v".to_vec())
        );

        let remaining: Vec<u64> = nodes.keys().copied().collect();
        for id in remaining {
            let node = nodes.remove(&id).ok_or("node")?;
            let handed = node.shutdown().await;
            if id == follower && id != next {
                assert_eq!(handed, HandOver::NotLeader);
            }
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
