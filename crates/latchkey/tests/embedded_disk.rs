//! In-process tests of what an embedded replica (`Node`) does when its
//! storage or its Raft core fails, and of a member whose data directory was
//! wiped: it waits, and `add_member` replaces it. The multi-process versions
//! (SIGKILL, a cut write-ahead log, `latchkey serve`'s exit code) are in
//! `tests/disk_faults.rs`.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions, Consistency, Error};
use tonic_health::pb::health_check_response::ServingStatus;

mod common;

use common::{start, start_cluster};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);

async fn wait_until<F: FnMut() -> bool>(what: &str, mut f: F) -> TestResult {
    let start = Instant::now();
    while !f() {
        if start.elapsed() > Duration::from_secs(45) {
            return Err(format!("timed out waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// What grpc.health.v1 answers for the whole replica (service `""`).
async fn health_of(addr: &str) -> Result<i32, Box<dyn std::error::Error>> {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    let channel = latchkey_proto::channel(addr, Duration::from_secs(1), None)?;
    let reply = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(reply.into_inner().status)
}

/// Poll until the replica at `addr` reports `status` on grpc.health.v1.
async fn wait_health(
    addr: &str,
    status: tonic_health::pb::health_check_response::ServingStatus,
) -> TestResult {
    let start = Instant::now();
    loop {
        let now = health_of(addr).await.ok();
        if now == Some(status as i32) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(45) {
            return Err(format!("{addr}: health {now:?}, expected {status:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client of `addr` alone that gives up after two seconds.
fn only(addr: &str) -> Result<Client, Error> {
    Client::with_options(
        [addr.to_string()],
        ClientOptions::default().with_request_timeout(Duration::from_secs(2)),
    )
}

/// When the leader's Raft core stops (here: a storage error, its snapshot
/// folder gone when it builds a snapshot), the replica fails: `Node::failed`
/// resolves with the cause, its status says `Failed` and names no leader,
/// and a write sent to it is refused as unavailable (nothing proposed, safe
/// to retry elsewhere), never "outcome unknown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_raft_core_stops_fails_and_answers_unavailable() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        nodes[&1].client().put("before", "ok").await?;
        let node = &nodes[&leader];
        std::fs::remove_dir_all(dir.path().join(format!("node-{leader}")).join("snapshots"))?;
        // The test settings build a snapshot every 50 entries.
        let writes = async {
            for i in 0..200 {
                let _ = node.client().put(format!("fill/{i}"), "x").await;
            }
        };
        let cause = tokio::time::timeout(Duration::from_secs(30), async {
            tokio::select! {
                cause = node.failed() => Some(cause),
                () = writes => None,
            }
        })
        .await?;
        let cause = match cause {
            Some(cause) => cause,
            None => tokio::time::timeout(Duration::from_secs(10), node.failed()).await?,
        };
        assert!(cause.contains("Raft core stopped"), "{cause}");
        let status = node.status();
        assert_eq!(status.state, "Failed");
        assert_eq!(status.leader_id, None, "a failed replica names no leader");
        assert!(!node.is_leader());
        let addr = nodes[&leader].advertise_addr();
        match only(addr)?.put("after", "x").await {
            Err(Error::Unavailable { last, .. }) => {
                assert!(last.contains("failed"), "{last}")
            }
            other => return Err(format!("expected Unavailable, got {other:?}").into()),
        }
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A data directory deleted under a running replica is noticed (its
/// sentinel is checked every second): the replica fails and stops its Raft
/// core, and the others carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_data_directory_fails_the_replica() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let victim = if leader == 3 { 2 } else { 3 };
        nodes[&leader].client().put("before", "ok").await?;
        std::fs::remove_dir_all(dir.path().join(format!("node-{victim}")))?;
        let cause = tokio::time::timeout(Duration::from_secs(15), nodes[&victim].failed()).await?;
        assert!(cause.contains("vanished"), "{cause}");
        assert_eq!(nodes[&victim].status().state, "Failed");
        // A failed replica tells load balancers it serves nothing.
        let addr = nodes[&victim].local_addr().to_string();
        wait_health(&addr, ServingStatus::NotServing).await?;
        nodes[&leader].client().put("after", "ok").await?;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// A member restarted on a wiped data directory never initialises or
/// votes: it finds the cluster through its peers and waits. `add_member`
/// replaces the member the cluster knew (another incarnation) with it; it
/// catches up and becomes a voter, and everything acknowledged is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_member_waits_and_is_replaced() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, members) = start_cluster(dir.path(), 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let victim = if leader == 3 { 2 } else { 3 };
        let kv = nodes[&leader].client();
        for i in 0..120 {
            kv.put(format!("k{i:03}"), "v").await?;
        }
        let old = nodes.remove(&victim).ok_or("no victim node")?;
        let old_incarnation = old.incarnation();
        old.shutdown().await;
        std::fs::remove_dir_all(dir.path().join(format!("node-{victim}")))?;
        let addr = members[(victim - 1) as usize].1.clone();
        let ports = common::Ports {
            client: TcpListener::bind("127.0.0.1:0")?,
            peer: TcpListener::bind(&addr)?,
        };
        let fresh = start(victim, ports, dir.path(), &members).await?;
        assert_ne!(fresh.incarnation(), old_incarnation);
        wait_until("the wiped member to wait", || fresh.waiting().is_some()).await?;
        let why = fresh.waiting().unwrap_or_default();
        assert!(why.contains("members add"), "{why}");
        assert_eq!(fresh.status().state, "Waiting");
        wait_health(fresh.advertise_addr(), ServingStatus::NotServing).await?;
        // The leader refuses to count it as the member it knew.
        kv.put("while-waiting", "v").await?;
        assert!(
            fresh.status().last_applied == 0,
            "a waiting replica applies nothing"
        );

        let admin = Client::with_options(
            [nodes[&leader].advertise_addr()],
            latchkey::ClientOptions::default().with_cluster_secret(common::SECRET),
        )?;
        admin.add_member(victim, &addr, true).await?;
        let status = nodes[&leader].status();
        let member = status
            .members
            .iter()
            .find(|m| m.id == victim)
            .ok_or("victim not a member")?;
        assert!(member.voter);
        assert_eq!(member.incarnation, fresh.incarnation());
        wait_until("the new member to catch up", || {
            fresh.status().last_applied >= status.last_applied
        })
        .await?;
        assert_eq!(fresh.status().state, "Follower");
        assert_eq!(fresh.waiting(), None);
        wait_health(fresh.advertise_addr(), ServingStatus::Serving).await?;
        let direct = Client::connect([fresh.advertise_addr()])?;
        for key in ["k000", "k119", "while-waiting"] {
            assert_eq!(
                direct.get_with(key, Consistency::Stale).await?,
                Some(b"v".to_vec()),
                "{key}"
            );
        }
        // Running it again changes nothing.
        admin.add_member(victim, &addr, true).await?;
        kv.put("after", "v").await?;
        fresh.shutdown().await;
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
