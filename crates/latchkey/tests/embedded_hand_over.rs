//! A leader that stops gracefully hands leadership to another voter first:
//! `Node::shutdown` says to whom, that voter leads, and writes running
//! through the stop all succeed (none ends with an unknown outcome).
//! `Client::transfer_leader` moves leadership on request, and so does the
//! removal of the leader from the voters; with election
//! timeouts far longer than the test's waits, only a transfer (not an
//! election) can move it in time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::HandOver;
use latchkey_client::{Client, Error};

mod common;

use common::{addrs, client_addrs, reserve, start_cluster};

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
        let writer = Writer::start(&client).await;

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
        writer.finish(&client).await?;

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

/// A task putting `k/00000`, `k/00001`, ... one after another until told
/// to stop, keeping every result.
struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Result<u64, Error>>>,
}

impl Writer {
    /// Start writing through `client`, and let it run 300 ms.
    async fn start(client: &Client) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let task = {
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
        Writer { stop, task }
    }

    /// After 300 ms more, stop; every write succeeded (none ended with an
    /// unknown outcome) and the last one reads back through `client`.
    async fn finish(self, client: &Client) -> TestResult {
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop.store(true, Ordering::SeqCst);
        let results = self.task.await?;
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
        let last = results.len() - 1;
        assert_eq!(
            client.get(format!("k/{last:05}")).await?,
            Some(b"v".to_vec())
        );
        Ok(())
    }
}

/// Election timeouts no test wait comes near: leadership that moves within
/// seconds was transferred, not won in an election.
fn no_elections() -> latchkey::RaftSettings {
    common::settings()
        .with_election_min(Duration::from_secs(60))
        .with_election_max(Duration::from_secs(70))
}

/// Wait (at most 5 s) until node `id` leads and every node names it.
async fn wait_leads(nodes: &BTreeMap<u64, latchkey::Node>, id: u64) -> TestResult {
    let started = Instant::now();
    loop {
        if nodes[&id].is_leader() && nodes.values().all(|n| n.status().leader_id == Some(id)) {
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(5) {
            return Err(format!("node {id} does not lead after 5 s").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_moves_on_request_and_on_stop_without_an_election() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let listeners = reserve(3)?;
        let members = addrs(&listeners)?;
        let mut nodes = BTreeMap::new();
        for (id, ports) in listeners {
            let node = common::start_with(id, ports, dir.path(), &members, no_elections()).await?;
            nodes.insert(id, node);
        }
        // Initialising elects at once; no other election can happen in
        // this test's time.
        let first = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let admin = Client::with_options(
            client_addrs(&nodes),
            latchkey::ClientOptions::default().with_cluster_secret(common::SECRET),
        )?;
        admin.put("k", "0").await?;

        // To a named voter.
        let named = *nodes.keys().find(|id| **id != first).ok_or("voter")?;
        assert_eq!(admin.transfer_leader(Some(named)).await?, named);
        wait_leads(&nodes, named).await?;
        admin.put("k", "1").await?;

        // To the leader itself: nothing moves.
        assert_eq!(admin.transfer_leader(Some(named)).await?, named);
        assert!(nodes[&named].is_leader());

        // Not a voter: refused, nothing moves.
        match admin.transfer_leader(Some(99)).await {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("99"), "{why}"),
            other => return Err(format!("expected InvalidArgument, got {other:?}").into()),
        }
        assert!(nodes[&named].is_leader());

        // To whichever voter is most caught up.
        let chosen = admin.transfer_leader(None).await?;
        assert_ne!(chosen, named);
        wait_leads(&nodes, chosen).await?;
        admin.put("k", "2").await?;

        // That call asked again after a lost reply names the leader it
        // moved away from: the new leader answers and stays.
        let channel = tonic::transport::Channel::from_shared(format!(
            "http://{}",
            nodes[&chosen].peer_addr()
        ))?
        .connect()
        .await?;
        let repeat = latchkey_proto::v1::membership_client::MembershipClient::with_interceptor(
            channel,
            common::SecretHeader(Some(common::SECRET)),
        )
        .move_leader(latchkey_proto::v1::MoveLeaderRequest {
            to: None,
            away_from: Some(named),
        })
        .await?
        .into_inner();
        assert_eq!((repeat.error, repeat.leader_id), (None, chosen));
        assert!(nodes[&chosen].is_leader());

        // A graceful stop of the leader hands over too.
        let handed = nodes.remove(&chosen).ok_or("leader")?.shutdown().await;
        let HandOver::To(next) = handed else {
            return Err(format!("the stopping leader did not hand over: {handed:?}").into());
        };
        wait_leads(&nodes, next).await?;
        assert_eq!(admin.get("k").await?, Some(b"2".to_vec()));
        admin.put("k", "3").await?;

        // To a voter that is down: refused before anything starts (openraft
        // cannot call a transfer off), and the leader carries on.
        match admin.transfer_leader(Some(chosen)).await {
            Err(Error::InvalidArgument(why)) => assert!(why.contains("answered"), "{why}"),
            other => return Err(format!("a transfer to a stopped voter: {other:?}").into()),
        }
        assert!(nodes[&next].is_leader());
        admin.put("k", "4").await?;
        assert_eq!(admin.get("k").await?, Some(b"4".to_vec()));
        for (_, node) in std::mem::take(&mut nodes) {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A leader removed from the voters hands leadership to a remaining voter
/// once the removal is committed (openraft's step-down of a removed
/// leader): with elections far off, another voter leads within seconds.
/// Writes running through the removal all succeed: the leader paused its
/// queue, so none ends with an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_removed_from_the_voters_hands_over_without_an_election() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let listeners = reserve(3)?;
        let members = addrs(&listeners)?;
        let mut nodes = BTreeMap::new();
        for (id, ports) in listeners {
            let node = common::start_with(id, ports, dir.path(), &members, no_elections()).await?;
            nodes.insert(id, node);
        }
        let first = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let admin = Client::with_options(
            client_addrs(&nodes),
            latchkey::ClientOptions::default().with_cluster_secret(common::SECRET),
        )?;
        admin.put("warm", "up").await?;
        let writer = Writer::start(&admin).await;

        admin.remove_voter(first).await?;
        let removed = nodes.remove(&first).ok_or("no leader node")?;
        let next = {
            let started = Instant::now();
            loop {
                if let Some(id) = nodes.values().find(|n| n.is_leader()).map(|n| n.id()) {
                    break id;
                }
                if started.elapsed() > Duration::from_secs(5) {
                    return Err("no remaining voter leads 5 s after the leader's removal".into());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        wait_leads(&nodes, next).await?;
        assert!(!removed.is_leader(), "the removed node still leads");
        writer.finish(&admin).await?;
        assert_eq!(removed.shutdown().await, HandOver::NotLeader);
        for (_, node) in std::mem::take(&mut nodes) {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A leader with no voter to hand over to still answers every write it
/// proposed before it stops: none ends with an unknown outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_leader_answers_its_writes_before_it_stops() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, _members) = start_cluster(dir.path(), 1).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let client = nodes[&1].client();
        client.put("warm", "up").await?;
        let mut writers = tokio::task::JoinSet::new();
        for task in 0..8 {
            let client = client.clone();
            writers.spawn(async move {
                let mut results = Vec::new();
                for i in 0..10_000u64 {
                    let result = client.put(format!("k/{task}/{i:05}"), "v").await;
                    let failed = result.is_err();
                    results.push(result);
                    if failed {
                        break;
                    }
                }
                results
            });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let handed = nodes.remove(&1).ok_or("node")?.shutdown().await;
        assert!(matches!(handed, HandOver::NotDone(_)), "{handed:?}");
        let mut answered = 0;
        while let Some(results) = writers.join_next().await {
            for result in results? {
                match result {
                    Ok(_) => answered += 1,
                    Err(Error::UnknownOutcome(why)) => {
                        return Err(format!("a write ended with an unknown outcome: {why}").into())
                    }
                    // Refused or unreachable once the replica paused or
                    // stopped: nothing was proposed.
                    Err(_) => {}
                }
            }
        }
        assert!(answered > 8, "the writers barely ran: {answered}");
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
