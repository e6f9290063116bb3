//! In-process tests of the lock service on a real three-node cluster:
//! sessions, keep-alives, expiry by the leader's countdowns, waiting without
//! polling, FIFO hand-off, fenced writes, sequencer checks, and the refusal
//! of leader-only commands from clients. Multi-process kill tests live in the
//! top-level `tests/locks.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use latchkey::Node;
use latchkey_client::{Client, CommandError, Error, LockInfo, Outcome, SessionId};
use latchkey_core::lock::{LockCommand, LockOutcome, SessionSecret, Token};
use latchkey_core::Command;
use tokio::sync::Mutex;

mod common;

use common::start_cluster;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);
const TTL: Duration = Duration::from_secs(3);

struct Cluster {
    nodes: BTreeMap<u64, Node>,
    addrs: Vec<String>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    async fn start() -> Result<Cluster, Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let (nodes, _members) = start_cluster(dir.path(), 3).await?;
        nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        Ok(Cluster {
            addrs: common::client_addrs(&nodes),
            nodes,
            _dir: dir,
        })
    }

    /// A remote client of the whole cluster.
    fn client(&self) -> Result<Client, Error> {
        Client::connect(&self.addrs)
    }

    async fn leader(&self) -> Result<u64, Box<dyn std::error::Error>> {
        Ok(self.nodes[&1]
            .wait_for_leader(Duration::from_secs(30))
            .await?)
    }

    async fn lock_info(&self, name: &str) -> Result<Option<LockInfo>, Error> {
        let locks = self.client()?.locks(name).await?;
        Ok(locks.into_iter().find(|l| l.name == name))
    }
}

/// A session opened by hand: nothing keeps it alive.
async fn bare_session(
    client: &Client,
) -> Result<(SessionId, SessionSecret), Box<dyn std::error::Error>> {
    match client
        .execute(Command::Lock(LockCommand::OpenSession {
            ttl_ms: TTL.as_millis() as u64,
            secret: SessionSecret::default(),
            name: String::new(),
        }))
        .await?
    {
        Outcome::Lock(LockOutcome::SessionOpened {
            session, secret, ..
        }) => Ok((session, secret)),
        other => Err(format!("unexpected {other:?}").into()),
    }
}

async fn bare_acquire(
    client: &Client,
    (session, secret): (SessionId, SessionSecret),
    name: &str,
) -> Result<Token, Box<dyn std::error::Error>> {
    match client
        .execute(Command::Lock(LockCommand::Acquire {
            session,
            secret,
            owner: 1,
            request_id: 1,
            name: name.into(),
            mode: latchkey_client::LockMode::Exclusive,
            wait_ms: None,
            lease_ms: None,
            lock_delay_ms: None,
            value: Vec::new(),
            permits: None,
        }))
        .await?
    {
        Outcome::Lock(LockOutcome::Granted { sequencer, .. }) => Ok(sequencer.token),
        other => Err(format!("unexpected {other:?}").into()),
    }
}

/// Session ids are small and visible (lock lists, sequencers): a second
/// client that knows them but not the session's secret can neither release
/// its locks, close it, keep it alive, cancel its waits nor write fenced with
/// its grant. Every attempt is refused as a wrong secret; the holder holds
/// on and its own fenced write goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_client_cannot_act_for_a_session() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let owner = cluster.client()?.session(TTL).await?;
        let held = owner.lock("vault").acquire().await?;
        let waiter = owner.clone();
        let stranger = cluster.client()?;
        let own = stranger.session(TTL).await?;
        let seq = held.sequencer().clone();
        // What a stranger learns from the lock list.
        let listed = cluster.lock_info("vault").await?.ok_or("lock not listed")?;
        assert_eq!(listed.holders[0].session, owner.id());
        let forged = [own.secret(), SessionSecret([0; 16])];
        for secret in forged {
            let attempts = [
                Command::Lock(LockCommand::Release {
                    session: owner.id(),
                    secret,
                    owner: 1,
                    request_id: 1_000,
                    name: "vault".into(),
                    token: seq.token,
                }),
                Command::Lock(LockCommand::CloseSession {
                    session: owner.id(),
                    secret,
                }),
                Command::Lock(LockCommand::Acquire {
                    session: owner.id(),
                    secret,
                    owner: 99,
                    request_id: 1_001,
                    name: "other".into(),
                    mode: latchkey_client::LockMode::Exclusive,
                    wait_ms: None,
                    lease_ms: None,
                    lock_delay_ms: None,
                    value: Vec::new(),
                    permits: None,
                }),
                Command::Lock(LockCommand::CancelWait {
                    session: owner.id(),
                    secret,
                    owner: 1,
                    name: "vault".into(),
                    request_id: 1,
                }),
            ];
            for command in attempts {
                let refused = stranger.execute(command.clone()).await;
                assert!(
                    matches!(
                        refused,
                        Err(Error::Refused(CommandError::WrongSessionSecret { session }))
                            if session == owner.id()
                    ),
                    "{command:?} answered {refused:?}"
                );
            }
            let write = stranger
                .put_fenced(&seq, &secret, "vault/k", "forged")
                .await;
            assert!(
                matches!(
                    write,
                    Err(Error::Refused(CommandError::WrongSessionSecret { .. }))
                ),
                "forged fenced write answered {write:?}"
            );
        }
        // A keep-alive with another secret is refused too (sent in its wire
        // form: the Rust client only sends its own secret).
        let leader = cluster
            .nodes
            .values()
            .find(|n| n.is_leader())
            .ok_or("no leader")?;
        let mut lock_api = latchkey_proto::v1::lock_client::LockClient::new(
            latchkey_client::channel(&leader.local_addr().to_string(), &Default::default())?,
        );
        let ka = lock_api
            .keep_alive(latchkey_proto::v1::KeepAliveRequest {
                session: owner.id().0,
                session_secret: own.secret().0.to_vec(),
            })
            .await?
            .into_inner();
        let error = ka.error.ok_or("a forged keep-alive was accepted")?;
        assert!(
            error.kind == latchkey_proto::v1::ErrorKind::WrongSessionSecret as i32
                || error.kind == latchkey_proto::v1::ErrorKind::NotLeader as i32,
            "{error:?}"
        );
        // The leader's timer state (it holds every session's secret) is
        // not for clients, in-process ones included.
        for query in [
            latchkey_core::lock::LockQuery::TimerState,
            latchkey_core::lock::LockQuery::SessionTimer {
                session: owner.id(),
            },
            latchkey_core::lock::LockQuery::Census,
        ] {
            let read = leader
                .client()
                .query(
                    latchkey_core::Query::Lock(query.clone()),
                    latchkey_client::Consistency::Stale,
                )
                .await;
            assert!(
                matches!(read, Err(Error::InvalidArgument(_))),
                "{query:?} answered {read:?}"
            );
        }
        // Nothing moved: the holder holds, and writes.
        assert!(stranger.check_sequencer(&seq).await?);
        assert_eq!(stranger.get("vault/k").await?, None);
        held.put("vault/k", "mine").await?;
        assert_eq!(stranger.get("vault/k").await?, Some(b"mine".to_vec()));
        assert!(waiter.is_live());
        held.release().await?;
        owner.close().await?;
        own.close().await?;
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_tokens_sequencers_and_fenced_writes() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let a = cluster.client()?.session(TTL).await?;
        let b = cluster.client()?.session(TTL).await?;
        assert_ne!(a.id(), b.id());

        let first = a.lock("orders").acquire().await?;
        assert!(first.is_held());
        assert!(first.token().0 >= 1);
        assert_eq!(
            first
                .sequencer()
                .to_string()
                .parse::<latchkey_client::Sequencer>()?,
            *first.sequencer()
        );
        // Another session is refused at once without waiting.
        assert!(b.lock("orders").try_acquire().await?.is_none());
        // Fenced writes go through while the grant holds.
        first.put("orders/1", "paid").await?;
        let client = cluster.client()?;
        assert!(client.check_sequencer(first.sequencer()).await?);
        let old = first.sequencer().clone();
        first.release().await?;
        assert!(!client.check_sequencer(&old).await?);

        let second = b
            .lock("orders")
            .try_acquire()
            .await?
            .ok_or("free lock refused")?;
        assert!(second.token() > old.token, "tokens strictly increase");
        // The old holder's fenced write is refused and writes nothing.
        let stale = client
            .put_fenced(&old, &a.secret(), "orders/1", "refunded")
            .await;
        assert!(
            matches!(&stale, Err(e) if e.is_stale_fence()),
            "stale write answered {stale:?}"
        );
        assert_eq!(client.get("orders/1").await?, Some(b"paid".to_vec()));
        second.put("orders/1", "shipped").await?;
        assert_eq!(client.get("orders/1").await?, Some(b"shipped".to_vec()));

        // Re-entrant through the same handle: same token.
        let handle = a.lock("reentrant");
        let g1 = handle.acquire().await?;
        let g2 = handle.acquire().await?;
        assert_eq!(g1.token(), g2.token());
        let info = cluster
            .lock_info("reentrant")
            .await?
            .ok_or("lock not listed")?;
        assert_eq!(info.holders[0].hold_count, 2);
        g2.release().await?;
        g1.release().await?;
        assert!(cluster.lock_info("reentrant").await?.is_none());

        // Shared holders together; an exclusive request is then busy.
        let s1 = a.lock("cfg").shared().acquire().await?;
        let s2 = b.lock("cfg").shared().acquire().await?;
        assert_ne!(s1.token(), s2.token());
        assert!(b.lock("cfg").try_acquire().await?.is_none());
        drop(s1);
        drop(s2);
        // Dropped guards are released in the background.
        let c = cluster.client()?;
        let start = Instant::now();
        while cluster.lock_info("cfg").await?.is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "drop did not release"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        drop(c);
        a.close().await?;
        assert!(!a.is_live());
        assert!(matches!(
            a.lock("x").try_acquire().await,
            Err(Error::SessionLost { .. })
        ));
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_in_fifo_order_and_time_out() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let holder = cluster.client()?.session(TTL).await?;
        let guard = holder.lock("queue").acquire().await?;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..4u32 {
            let session = cluster.client()?.session(TTL).await?;
            let order = order.clone();
            tasks.push(tokio::spawn(async move {
                let g = session.lock("queue").acquire().await?;
                order.lock().await.push((i, g.token()));
                tokio::time::sleep(Duration::from_millis(50)).await;
                g.release().await?;
                Ok::<_, Error>(())
            }));
            // Queue them one after another.
            let start = Instant::now();
            loop {
                let waiting = cluster.lock_info("queue").await?.map_or(0, |l| l.waiters);
                if waiting == i + 1 {
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "waiter {i} not queued"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // A timed wait behind them gives up and leaves the queue.
        let late = cluster.client()?.session(TTL).await?;
        let timed = late
            .lock("queue")
            .acquire_timeout(Duration::from_millis(300))
            .await?;
        assert!(timed.is_none());
        assert_eq!(
            cluster.lock_info("queue").await?.map(|l| l.waiters),
            Some(4)
        );

        let first_token = guard.token();
        let released = Instant::now();
        guard.release().await?;
        for t in tasks {
            t.await??;
        }
        // Each grant wakes its waiter where it waits (the replica's lock
        // task, `Waiters::on_event`). A waiter nobody woke would sit out the
        // client's 30 s hold before asking again, so four hand-offs would
        // take minutes; a bound of half that hold tells the two apart on
        // any machine.
        assert!(
            released.elapsed() < Duration::from_secs(15),
            "waiters were not woken by their grants: {:?}",
            released.elapsed()
        );
        let order = order.lock().await.clone();
        assert_eq!(
            order.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            vec![0, 1, 2, 3],
            "grants in FIFO order"
        );
        let mut last = first_token;
        for (_, t) in order {
            assert!(t > last, "tokens increase over hand-offs");
            last = t;
        }
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_hold_a_session_and_the_leader_expires_a_silent_one() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let client = cluster.client()?;
        // A session with a watchdog outlives its TTL several times over.
        let kept = client.session(TTL).await?;
        let kept_guard = kept.lock("kept").acquire().await?;
        // A session nobody keeps alive, holding a lock someone waits for.
        let silent = bare_session(&client).await?;
        let silent_token = bare_acquire(&client, silent, "silent").await?;
        let waiter = client.session(TTL).await?;
        let started = Instant::now();
        let granted = waiter
            .lock("silent")
            .acquire_timeout(Duration::from_secs(30))
            .await?
            .ok_or("waiter never granted after the silent session expired")?;
        // Never sooner than the TTL: the countdown started at the open.
        assert!(
            started.elapsed() >= TTL - Duration::from_millis(500),
            "granted after {:?}, before the TTL",
            started.elapsed()
        );
        assert!(granted.token() > silent_token);
        // The silent session is gone.
        let refused = client
            .execute(Command::Lock(LockCommand::CloseSession {
                session: silent.0,
                secret: silent.1,
            }))
            .await;
        assert!(
            matches!(
                refused,
                Err(Error::Refused(CommandError::SessionEnded { .. }))
            ),
            "{refused:?}"
        );
        tokio::time::sleep(TTL).await;
        assert!(kept.is_live(), "watchdog let a live session lapse");
        assert!(kept_guard.is_held());
        assert!(client.check_sequencer(kept_guard.sequencer()).await?);
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_cannot_propose_expiries_and_new_leader_restarts_countdowns() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let mut cluster = Cluster::start().await?;
        let client = cluster.client()?;
        // Long enough to ride out the failover below on a loaded machine:
        // the watchdog must reach the new leader within ttl - ttl/3 - margin.
        let session = client.session(Duration::from_secs(10)).await?;
        let refused = client
            .execute(Command::Lock(LockCommand::ExpireSession {
                session: session.id(),
            }))
            .await;
        assert!(
            matches!(refused, Err(Error::InvalidArgument(_))),
            "{refused:?}"
        );
        assert!(session.is_live());

        // A silent holder's session must still expire after the leader is
        // replaced: the new leader restarts its countdown.
        let silent = bare_session(&client).await?;
        bare_acquire(&client, silent, "failover").await?;
        let leader = cluster.leader().await?;
        let node = cluster.nodes.remove(&leader).ok_or("no leader node")?;
        node.shutdown().await;
        let survivor = *cluster.nodes.keys().next().ok_or("no survivor")?;
        cluster.nodes[&survivor]
            .wait_for_leader(Duration::from_secs(30))
            .await?;
        let survivors: Vec<String> = cluster
            .nodes
            .values()
            .map(|n| n.advertise_addr().to_string())
            .collect();
        let client = Client::connect(&survivors)?;
        let waiter = client.session(TTL).await?;
        let got = waiter
            .lock("failover")
            .acquire_timeout(Duration::from_secs(40))
            .await?;
        assert!(
            got.is_some(),
            "the new leader never expired the silent session"
        );
        // The kept session survived the failover, on the cluster's side too.
        assert!(
            session.is_live(),
            "the watchdog lost its session over the failover"
        );
        match client
            .query(
                latchkey_client::Query::Lock(latchkey_core::lock::LockQuery::Session {
                    session: session.id(),
                }),
                latchkey_client::Consistency::Linearizable,
            )
            .await?
        {
            Outcome::Lock(LockOutcome::Session(Some(_))) => {}
            other => panic!("the new leader expired a kept-alive session: {other:?}"),
        }
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_lock_api_works_through_embedded_nodes() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let leader = cluster.leader().await?;
        let follower = *cluster
            .nodes
            .keys()
            .find(|id| **id != leader)
            .ok_or("no follower")?;
        // One session through the leader's own replica (the local fast path),
        // one through a follower's in-process client (forwarded).
        let on_leader = cluster.nodes[&leader].client().session(TTL).await?;
        let on_follower = cluster.nodes[&follower].client().session(TTL).await?;
        let held = on_leader.lock("embedded").acquire().await?;
        let waiting = tokio::spawn(async move {
            let g = on_follower
                .lock("embedded")
                .acquire_timeout(Duration::from_secs(30))
                .await?;
            Ok::<_, Error>((g.map(|g| g.token()), on_follower))
        });
        let start = Instant::now();
        while cluster
            .lock_info("embedded")
            .await?
            .map_or(0, |l| l.waiters)
            == 0
        {
            assert!(start.elapsed() < Duration::from_secs(20), "never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // Keep-alives through the local path hold the session past its TTL.
        tokio::time::sleep(TTL + Duration::from_millis(500)).await;
        assert!(on_leader.is_live() && held.is_held());
        let first = held.token();
        held.release().await?;
        let (granted, on_follower) = waiting.await??;
        assert!(granted.ok_or("not granted")? > first);
        assert!(on_follower.is_live());
        Ok(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_cancellation_and_reentrant_leases_leave_nothing_behind() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let cluster = Cluster::start().await?;
        let a = cluster.client()?.session(Duration::from_secs(10)).await?;
        let b = cluster.client()?.session(Duration::from_secs(10)).await?;

        // A cloned handle is another owner: it does not re-enter.
        let handle = a.lock("clone");
        let held = handle.acquire().await?;
        assert!(handle.clone().try_acquire().await?.is_none());
        held.release().await?;

        // A dropped acquire future withdraws its wait: when the holder
        // releases, the lock is not granted to nobody.
        let holder = a.lock("dropped").acquire().await?;
        let gave_up =
            tokio::time::timeout(Duration::from_millis(500), b.lock("dropped").acquire()).await;
        assert!(gave_up.is_err(), "acquire should still be waiting");
        holder.release().await?;
        let start = Instant::now();
        while let Some(info) = cluster.lock_info("dropped").await? {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "an abandoned acquire kept the lock: {info:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }

        // A re-entrant guard keeps the first grant's lease deadline.
        let leased = a.lock("leased").lease(Duration::from_millis(1500));
        let first = leased.acquire().await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        let second = leased.acquire().await?;
        assert_eq!(first.token(), second.token());
        while first.is_held() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            !second.is_held(),
            "a re-entrant guard outlived the grant's lease on the client"
        );
        Ok(())
    })
    .await?
}
