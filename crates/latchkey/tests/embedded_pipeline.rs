//! The `Pipeline.Calls` stream against real replicas: each call of a frame
//! is answered as its unary RPC answers it (the replica serves both through
//! one path), bad calls are refused one by one and apply nothing, a frame
//! over the limit runs nothing, and a client's concurrent requests share
//! frames. In-process clusters on loopback; no assertion depends on timing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use latchkey::Node;
use latchkey_client::{Client, ClientOptions, Consistency};
use latchkey_proto::v1::call::Request as Req;
use latchkey_proto::v1::call_reply::Reply as Rep;
use latchkey_proto::v1::kv_client::KvClient;
use latchkey_proto::v1::lock_client::LockClient;
use latchkey_proto::v1::pipeline_client::PipelineClient;
use latchkey_proto::v1::{self as v1, Call, CallFrame, ErrorKind};
use latchkey_proto::MAX_FRAME_CALLS;
use tonic::transport::Channel;

mod common;

use common::start_cluster;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(90);

/// A started cluster with its leader's and a follower's address.
struct Cluster {
    nodes: BTreeMap<u64, Node>,
    leader: u64,
    follower: u64,
}

impl Cluster {
    async fn start(dir: &std::path::Path) -> Result<Cluster, Box<dyn std::error::Error>> {
        let (nodes, _members) = start_cluster(dir, 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let follower = nodes
            .keys()
            .copied()
            .find(|i| *i != leader)
            .ok_or("no follower")?;
        Ok(Cluster {
            nodes,
            leader,
            follower,
        })
    }

    /// Node `id`'s client address.
    fn addr(&self, id: u64) -> String {
        self.nodes
            .get(&id)
            .map(|n| n.advertise_addr().to_string())
            .unwrap_or_default()
    }

    fn channel(&self, id: u64) -> Result<Channel, Box<dyn std::error::Error>> {
        Ok(latchkey_client::channel(
            &self.addr(id),
            &ClientOptions::default(),
        )?)
    }

    /// Send `requests` as one frame to replica `id`; the replies by call id
    /// (the call's index in `requests`).
    async fn frame(
        &self,
        id: u64,
        requests: Vec<Option<Req>>,
    ) -> Result<BTreeMap<u64, Rep>, Box<dyn std::error::Error>> {
        let calls = (0..)
            .zip(requests)
            .map(|(id, request)| Call { id, request });
        let frame = CallFrame {
            calls: calls.collect(),
        };
        let mut replies = PipelineClient::new(self.channel(id)?)
            .calls(futures::stream::iter([frame]))
            .await?
            .into_inner();
        let mut out = BTreeMap::new();
        while let Some(frame) = replies.message().await? {
            for r in frame.replies {
                let reply = r.reply.ok_or("a call reply without a reply")?;
                assert!(
                    out.insert(r.id, reply).is_none(),
                    "call {} answered twice",
                    r.id
                );
            }
        }
        Ok(out)
    }

    /// The same request as its unary RPC.
    async fn unary(&self, id: u64, request: Req) -> Result<Rep, Box<dyn std::error::Error>> {
        let mut kv = KvClient::new(self.channel(id)?);
        let mut lock = LockClient::new(self.channel(id)?);
        Ok(match request {
            Req::Put(r) => Rep::Put(kv.put(r).await?.into_inner()),
            Req::Get(r) => Rep::Get(kv.get(r).await?.into_inner()),
            Req::NextSequence(r) => Rep::NextSequence(kv.next_sequence(r).await?.into_inner()),
            Req::CloseSession(r) => Rep::CloseSession(lock.close_session(r).await?.into_inner()),
            Req::Acquire(r) => Rep::Acquire(lock.acquire(r).await?.into_inner()),
            other => return Err(format!("not used in this test: {other:?}").into()),
        })
    }

    async fn shutdown(self) {
        for node in self.nodes.into_values() {
            node.shutdown().await;
        }
    }
}

fn put(key: &str, value: &str) -> Req {
    Req::Put(v1::PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    })
}

fn get(key: &str) -> Req {
    Req::Get(v1::GetRequest {
        key: key.as_bytes().to_vec(),
        stale: false,
    })
}

/// The error a reply carries, whichever call it answers.
fn error_of(reply: &Rep) -> Option<&v1::Error> {
    match reply {
        Rep::Error(e) => Some(e),
        Rep::Put(r) => r.error.as_ref(),
        Rep::Get(r) => r.error.as_ref(),
        Rep::NextSequence(r) => r.error.as_ref(),
        Rep::CloseSession(r) => r.error.as_ref(),
        Rep::Acquire(r) => r.error.as_ref(),
        other => panic!("not used in this test: {other:?}"),
    }
}

fn kind(reply: &Rep) -> Option<ErrorKind> {
    error_of(reply).map(|e| ErrorKind::try_from(e.kind).unwrap_or(ErrorKind::Unspecified))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_answers_each_call_as_its_unary_rpc_and_bad_calls_apply_nothing() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        let client = cluster.nodes[&cluster.leader].client();
        // A sequence with nothing left: allocating from it is a
        // deterministic refusal by the state machine.
        client.next_sequence("mix/seq", u64::MAX).await?;
        let exhausted = Req::NextSequence(v1::NextSequenceRequest {
            key: b"mix/seq".to_vec(),
            step: 1,
            once: None,
        });
        let requests = vec![
            Some(put("mix/a", "1")),
            // Breaks a limit: refused before proposing.
            Some(put("", "empty key")),
            Some(exhausted.clone()),
            // A session this cluster never issued: refused by the state
            // machine.
            Some(Req::CloseSession(v1::CloseSessionRequest {
                session: 999_999,
                session_secret: vec![0; 16],
            })),
            // No lock mode: refused before it becomes a command.
            Some(Req::Acquire(v1::AcquireRequest {
                session: 1,
                session_secret: vec![0; 16],
                name: "l".into(),
                ..Default::default()
            })),
            // No request at all.
            None,
            Some(put("mix/b", "2")),
        ];
        let replies = cluster.frame(cluster.leader, requests.clone()).await?;
        assert_eq!(replies.len(), requests.len(), "{replies:?}");
        let kinds: Vec<Option<ErrorKind>> = replies.values().map(kind).collect();
        assert_eq!(
            kinds,
            [
                None,
                Some(ErrorKind::InvalidArgument),
                Some(ErrorKind::SequenceExhausted),
                Some(ErrorKind::UnknownSession),
                Some(ErrorKind::InvalidArgument),
                Some(ErrorKind::InvalidArgument),
                None,
            ]
        );
        assert!(matches!(replies[&5], Rep::Error(_)), "{:?}", replies[&5]);
        // The good calls applied, and nothing else did.
        assert_eq!(client.get("mix/a").await?, Some(b"1".to_vec()));
        assert_eq!(client.get("mix/b").await?, Some(b"2".to_vec()));
        assert_eq!(client.get("").await.ok().flatten(), None);

        // The same calls as unary RPCs answer the same errors.
        for (i, request) in requests.iter().enumerate().skip(1).take(4) {
            let request = request.clone().ok_or("a request")?;
            let unary = cluster.unary(cluster.leader, request).await?;
            assert_eq!(kind(&unary), kinds[i], "call {i}: {unary:?}");
        }

        // A follower refuses every write and linearizable read with the
        // leader's address, running none of them.
        let replies = cluster
            .frame(
                cluster.follower,
                vec![Some(put("mix/f", "x")), Some(get("mix/a"))],
            )
            .await?;
        for reply in replies.values() {
            let e = error_of(reply).ok_or("a follower answered a write or read")?;
            assert_eq!(e.kind, ErrorKind::NotLeader as i32, "{e:?}");
            assert!(e.retryable, "{e:?}");
            assert_eq!(e.leader_id, cluster.leader);
            assert_eq!(e.leader_addr, cluster.addr(cluster.leader));
        }
        assert_eq!(client.get("mix/f").await?, None);
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_limit_runs_none_of_its_calls() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        let requests = (0..=MAX_FRAME_CALLS)
            .map(|i| Some(put(&format!("over/{i}"), "v")))
            .collect::<Vec<_>>();
        let replies = cluster.frame(cluster.leader, requests).await?;
        assert_eq!(replies.len(), MAX_FRAME_CALLS + 1);
        for reply in replies.values() {
            assert_eq!(kind(reply), Some(ErrorKind::InvalidArgument), "{reply:?}");
        }
        let client = cluster.nodes[&cluster.leader].client();
        let page = client
            .scan(latchkey_client::ScanRange::prefix("over/", 10))
            .await?;
        assert!(page.entries.is_empty(), "{page:?}");
        // Exactly at the limit, every call runs.
        let requests = (0..MAX_FRAME_CALLS)
            .map(|i| Some(put(&format!("at/{i}"), "v")))
            .collect::<Vec<_>>();
        let replies = cluster.frame(cluster.leader, requests).await?;
        assert!(replies.values().all(|r| kind(r).is_none()));
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

async fn race<F, Fut>(tasks: usize, f: F) -> TestResult
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = TestResult> + Send + 'static,
{
    let start = Arc::new(tokio::sync::Barrier::new(tasks));
    let mut handles = Vec::new();
    for t in 0..tasks {
        let start = start.clone();
        let body = f(t);
        handles.push(tokio::spawn(async move {
            start.wait().await;
            body.await.map_err(|e| e.to_string())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_shares_frames_between_concurrent_requests_and_answers_each_caller() -> TestResult
{
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        // Only a follower's address: the first calls (and the batches queued
        // behind them) are redirected to the leader, item by item.
        let client =
            Client::with_options([cluster.addr(cluster.follower)], ClientOptions::default())?;
        const TASKS: usize = 64;
        const ROUNDS: usize = 8;
        let c = client.clone();
        race(TASKS, move |t| {
            let c = c.clone();
            async move {
                for r in 0..ROUNDS {
                    // get_and_put answers the caller's own key's old value.
                    let old = c.get_and_put(format!("p/{t}"), format!("{t}.{r}")).await?;
                    let want = (r > 0).then(|| format!("{t}.{}", r - 1).into_bytes());
                    assert_eq!(old, want, "task {t} got another caller's answer");
                }
                Ok(())
            }
        })
        .await?;
        let c = client.clone();
        race(TASKS, move |t| {
            let c = c.clone();
            async move {
                for _ in 0..ROUNDS {
                    let v = c
                        .get_with(format!("p/{t}"), Consistency::Linearizable)
                        .await?;
                    assert_eq!(v, Some(format!("{t}.{}", ROUNDS - 1).into_bytes()));
                }
                Ok(())
            }
        })
        .await?;
        let stats = client.transport_stats();
        let requests = (TASKS * ROUNDS * 2) as u64;
        // Every request went out at least once (redirected ones twice) on
        // the call stream, in fewer frames than requests.
        assert!(stats.stream_calls >= requests, "{stats:?}");
        assert_eq!(stats.unary_calls, 0, "{stats:?}");
        assert!(stats.stream_frames < stats.stream_calls, "{stats:?}");

        // Call stream off: one unary RPC per request.
        let unary = Client::with_options(
            [cluster.addr(cluster.leader)],
            ClientOptions::default().with_call_stream(false),
        )?;
        let c = unary.clone();
        race(8, move |t| {
            let c = c.clone();
            async move {
                c.put(format!("u/{t}"), "v").await?;
                assert_eq!(c.get(format!("u/{t}")).await?, Some(b"v".to_vec()));
                Ok(())
            }
        })
        .await?;
        let stats = unary.transport_stats();
        // One more: the client opens its session for retry-safe writes.
        assert_eq!(stats.unary_calls, 17, "{stats:?}");
        assert_eq!(
            (stats.stream_calls, stats.stream_frames),
            (0, 0),
            "{stats:?}"
        );
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
