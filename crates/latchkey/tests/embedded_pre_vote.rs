//! A replica cut off from its peers for ten seconds and then let back in
//! causes no election: with pre-vote it never raises its term while it is
//! alone (the others, who still follow a leader, would not grant it a
//! vote), so when it hears from the leader again it follows, and the
//! leader and term stay as they were.
//!
//! The cut: the others reach node 3's peer listener through a loopback
//! relay that this test owns; cutting the relay drops every connection
//! through it and every new one, so node 3 hears nothing from the leader
//! (no heartbeats, no entries) while its own vote requests still go out.
//! That is the harder case: a replica that only hears silence, stands for
//! election over and over, and could reach the others with a higher term.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey_client::Client;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

mod common;

use common::{client_addrs, reserve};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(90);

/// How long node 3 stays cut off.
const CUT_FOR: Duration = Duration::from_secs(10);

/// Timers slow enough that a loaded machine's pauses do not cost the
/// leader its followers (an election then would not be node 3's doing),
/// fast enough that node 3 stands for election several times while cut
/// off: heartbeats every 100 ms, election timeouts of 1-2 s.
fn timers() -> latchkey::RaftSettings {
    common::settings()
        .with_heartbeat(Duration::from_millis(100))
        .with_election_min(Duration::from_secs(1))
        .with_election_max(Duration::from_secs(2))
}

/// A TCP relay on loopback to `target` that can be cut (every relayed
/// connection dropped, new ones closed at once) and healed.
struct Relay {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(target: SocketAddr) -> std::io::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (cut, cut_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                if *cut_rx.borrow() {
                    drop(inbound);
                    continue;
                }
                let mut cut_rx = cut_rx.clone();
                conns.spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let mut inbound = inbound;
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        _ = cut_rx.wait_for(|cut| *cut) => {}
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Relay { addr, cut, task })
    }

    fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every node's (term, leader) as it reports them.
fn views(nodes: &BTreeMap<u64, latchkey::Node>) -> BTreeMap<u64, (u64, Option<u64>)> {
    nodes
        .iter()
        .map(|(id, n)| {
            let s = n.status();
            (*id, (s.term, s.leader_id))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_for_ten_seconds_causes_no_election() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let listeners = reserve(3)?;
        let relay = Arc::new(Relay::start(listeners[&3].peer.local_addr()?).await?);
        let mut members = common::addrs(&listeners)?;
        for (id, addr) in &mut members {
            if *id == 3 {
                *addr = relay.addr.to_string();
            }
        }
        let mut nodes = BTreeMap::new();
        for (id, ports) in listeners {
            let node = common::start_with(id, ports, dir.path(), &members, timers()).await?;
            nodes.insert(id, node);
        }
        let first = nodes[&1].wait_for_leader(Duration::from_secs(20)).await?;
        let admin = Client::with_options(
            client_addrs(&nodes),
            latchkey::ClientOptions::default().with_cluster_secret(common::SECRET),
        )?;
        // Node 3 is the one cut off; it must not be the leader.
        if first == 3 {
            admin.transfer_leader(Some(1)).await?;
        }
        admin.put("before", "1").await?;
        let settled = Instant::now();
        let leader = loop {
            let v = views(&nodes);
            let (term, leader) = v[&1];
            if leader.is_some_and(|l| l != 3) && v.values().all(|x| *x == (term, leader)) {
                break leader.ok_or("no leader")?;
            }
            if settled.elapsed() > Duration::from_secs(10) {
                return Err(format!("the nodes do not agree on a leader: {v:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let before = views(&nodes);
        let term = before[&leader].0;

        // The first half of the cut without writes (node 3's log is as long
        // as the others': only their leader's lease makes them refuse), the
        // second with (its log falls behind too).
        relay.set_cut(true);
        let cut_at = Instant::now();
        tokio::time::sleep(CUT_FOR / 2).await;
        let mut written = 0u64;
        while cut_at.elapsed() < CUT_FOR {
            admin.put(format!("during/{written:04}"), "v").await?;
            written += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let alone = nodes[&3].status();
        relay.set_cut(false);

        // Node 3 catches up from the leader it kept.
        let healed = Instant::now();
        loop {
            let lead = nodes[&leader].status();
            let three = nodes[&3].status();
            if three.last_applied >= lead.last_applied && three.leader_id == Some(leader) {
                break;
            }
            if healed.elapsed() > Duration::from_secs(15) {
                return Err(format!(
                    "node 3 did not catch up after the cut: {three:?}, leader {lead:?}"
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A few election timeouts more, then a write through the leader.
        tokio::time::sleep(Duration::from_secs(4)).await;
        admin.put("after", "1").await?;
        let after = views(&nodes);
        assert!(written > 10, "writes stopped during the cut: {written}");
        assert_eq!(
            alone.term, term,
            "node 3 raised its term while it was cut off: {alone:?}"
        );
        assert_eq!(
            after, before,
            "an election happened: (term, leader) per node before {before:?}, after {after:?}"
        );
        assert_eq!(admin.get("after").await?, Some(b"1".to_vec()));
        for (_, node) in std::mem::take(&mut nodes) {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
