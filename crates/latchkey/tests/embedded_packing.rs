//! Packed requests: the `WriteMany` / `ReadMany` calls answer each item as
//! its unary call would, and a client packs concurrent requests into them.
//! In-process clusters on loopback; no assertion depends on timing.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use latchkey::Node;
use latchkey_client::{Client, ClientOptions, Consistency, MAX_BATCH_ITEMS};
use latchkey_core::lock::{LockCommand, SessionId};
use latchkey_core::{codec, Command, CommandResult, Query, ScanRange};
use latchkey_proto::v1::kv_client::KvClient;
use latchkey_proto::v1::{FailureKind, ReadBatch, ReadRequest, Reply, WriteBatch, WriteRequest};
use tonic::transport::Channel;

mod common;

use common::start_cluster;

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(90);

/// A started cluster with its leader's and a follower's address.
struct Cluster {
    nodes: BTreeMap<u64, Node>,
    members: Vec<(u64, String)>,
    leader: u64,
    follower: u64,
}

impl Cluster {
    async fn start(dir: &std::path::Path) -> Result<Cluster, Box<dyn std::error::Error>> {
        let (nodes, members) = start_cluster(dir, 3).await?;
        let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
        let follower = nodes
            .keys()
            .copied()
            .find(|i| *i != leader)
            .ok_or("no follower")?;
        Ok(Cluster {
            nodes,
            members,
            leader,
            follower,
        })
    }

    fn addr(&self, id: u64) -> String {
        self.members
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, a)| a.clone())
            .unwrap_or_default()
    }

    async fn kv(&self, id: u64) -> Result<KvClient<Channel>, Box<dyn std::error::Error>> {
        let channel = latchkey_client::channel(&self.addr(id), &ClientOptions::default())?;
        Ok(KvClient::new(channel))
    }

    async fn shutdown(self) {
        for node in self.nodes.into_values() {
            node.shutdown().await;
        }
    }
}

fn write(command: &Command) -> Result<WriteRequest, codec::CodecError> {
    Ok(WriteRequest {
        command: codec::encode(command)?,
    })
}

fn read(query: &Query) -> Result<ReadRequest, codec::CodecError> {
    Ok(ReadRequest {
        query: codec::encode(query)?,
        stale: false,
    })
}

fn put(key: &str, value: &str) -> Command {
    Command::Put {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

/// A reply as something comparable: the decoded result, or the failure's
/// kind and message.
fn decoded(reply: &Reply) -> Result<CommandResult, (i32, String)> {
    match &reply.failure {
        Some(f) => Err((f.kind, f.message.clone())),
        None => codec::decode(&reply.payload).map_err(|e| (-1, e.to_string())),
    }
}

fn kind(reply: &Reply) -> Option<FailureKind> {
    reply
        .failure
        .as_ref()
        .and_then(|f| FailureKind::try_from(f.kind).ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_each_item_as_its_unary_call_and_bad_items_apply_nothing() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        let mut kv = cluster.kv(cluster.leader).await?;

        // A sequence with nothing left: allocating from it is a
        // deterministic refusal by the state machine.
        let client = cluster.nodes[&cluster.leader].client();
        client.next_sequence("mix/seq", u64::MAX).await?;
        let exhausted = Command::NextSequence {
            key: b"mix/seq".to_vec(),
            step: 1,
        };
        let items = vec![
            write(&put("mix/a", "1"))?,
            WriteRequest {
                command: vec![0xff, 0x13, 0x37],
            },
            // Breaks a limit: refused before proposing.
            write(&put("", "empty key"))?,
            write(&exhausted)?,
            // Only the leader forms groups.
            write(&Command::Group {
                commands: vec![put("mix/group", "x")],
            })?,
            // A session this cluster never issued: refused by the state machine.
            write(&Command::Lock(LockCommand::CloseSession {
                session: SessionId(999_999),
            }))?,
            write(&put("mix/b", "2"))?,
        ];
        let batch = kv
            .write_many(WriteBatch {
                items: items.clone(),
            })
            .await?
            .into_inner()
            .replies;
        assert_eq!(batch.len(), items.len());

        // The store holds exactly what the good items wrote.
        let page = client.scan(ScanRange::prefix("mix/", 0)).await?;
        let keys: Vec<&[u8]> = page.entries.iter().map(|(k, _)| k.as_slice()).collect();
        assert_eq!(keys, vec![&b"mix/a"[..], b"mix/b"]);

        // The same items as unary calls, in the same order, answer the same.
        for (i, item) in items.into_iter().enumerate() {
            let unary = kv.write(item).await?.into_inner();
            assert_eq!(
                decoded(&batch[i]),
                decoded(&unary),
                "item {i} answered differently in a batch"
            );
        }
        assert_eq!(kind(&batch[0]), None);
        assert_eq!(kind(&batch[1]), Some(FailureKind::InvalidArgument));
        assert_eq!(kind(&batch[2]), Some(FailureKind::InvalidArgument));
        assert!(matches!(decoded(&batch[3]), Ok(Err(_))));
        assert_eq!(kind(&batch[4]), Some(FailureKind::InvalidArgument));
        assert!(matches!(decoded(&batch[5]), Ok(Err(_))));
        assert_eq!(kind(&batch[6]), None);

        // Reads: the same rule.
        let too_many = Query::MultiGet {
            keys: vec![b"k".to_vec(); latchkey_core::limits::MAX_MULTI_GET + 1],
        };
        let reads = vec![
            read(&Query::Get {
                key: b"mix/a".to_vec(),
            })?,
            ReadRequest {
                query: vec![0xee],
                stale: false,
            },
            read(&too_many)?,
            ReadRequest {
                stale: true,
                ..read(&Query::Get {
                    key: b"mix/b".to_vec(),
                })?
            },
        ];
        let batch = kv
            .read_many(ReadBatch {
                items: reads.clone(),
            })
            .await?
            .into_inner()
            .replies;
        assert_eq!(batch.len(), reads.len());
        for (i, item) in reads.into_iter().enumerate() {
            let unary = kv.read(item).await?.into_inner();
            assert_eq!(decoded(&batch[i]), decoded(&unary), "read {i} differs");
        }
        assert_eq!(kind(&batch[1]), Some(FailureKind::InvalidArgument));
        assert_eq!(kind(&batch[2]), Some(FailureKind::InvalidArgument));

        // An empty batch is a valid, empty answer.
        let empty = kv.write_many(WriteBatch { items: vec![] }).await?;
        assert!(empty.into_inner().replies.is_empty());
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_batch_is_rejected_whole_and_a_follower_redirects_every_item() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        let mut kv = cluster.kv(cluster.leader).await?;

        let items = (0..=MAX_BATCH_ITEMS)
            .map(|i| write(&put(&format!("big/{i}"), "v")))
            .collect::<Result<Vec<_>, _>>()?;
        let status = match kv.write_many(WriteBatch { items }).await {
            Ok(_) => return Err("an oversized batch was accepted".into()),
            Err(status) => status,
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("limit"), "{}", status.message());
        let reads = (0..=MAX_BATCH_ITEMS)
            .map(|i| {
                read(&Query::Get {
                    key: format!("big/{i}").into_bytes(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let status = match kv.read_many(ReadBatch { items: reads }).await {
            Ok(_) => return Err("an oversized read batch was accepted".into()),
            Err(status) => status,
        };
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        let client = cluster.nodes[&cluster.leader].client();
        let page = client.scan(ScanRange::prefix("big/", 0)).await?;
        assert!(page.entries.is_empty(), "a rejected batch wrote something");

        // Exactly at the limit is fine.
        let items = (0..MAX_BATCH_ITEMS)
            .map(|i| write(&put(&format!("big/{i}"), "v")))
            .collect::<Result<Vec<_>, _>>()?;
        let replies = kv.write_many(WriteBatch { items }).await?.into_inner();
        assert_eq!(replies.replies.len(), MAX_BATCH_ITEMS);
        assert!(replies.replies.iter().all(|r| r.failure.is_none()));

        // A follower proposes nothing and points every item at the leader.
        let mut follower = cluster.kv(cluster.follower).await?;
        let items = (0..5)
            .map(|i| write(&put(&format!("redirect/{i}"), "v")))
            .collect::<Result<Vec<_>, _>>()?;
        let replies = follower
            .write_many(WriteBatch { items })
            .await?
            .into_inner()
            .replies;
        assert_eq!(replies.len(), 5);
        for r in &replies {
            assert_eq!(kind(r), Some(FailureKind::NotLeader));
            let f = r.failure.as_ref().ok_or("no failure")?;
            assert_eq!(f.leader_id, cluster.leader);
            assert_eq!(f.leader_addr, cluster.addr(cluster.leader));
        }
        let page = client.scan(ScanRange::prefix("redirect/", 0)).await?;
        assert!(page.entries.is_empty());
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// 64 tasks released at once, each with its own keys.
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
async fn a_client_packs_concurrent_requests_and_answers_each_caller() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let cluster = Cluster::start(dir.path()).await?;
        // Only a follower's address: the first calls (and the batches queued
        // behind them) are redirected to the leader, item by item.
        let client = Client::with_options(
            [cluster.addr(cluster.follower)],
            ClientOptions {
                max_batch_in_flight: 1,
                ..ClientOptions::default()
            },
        )?;
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
        let stats = client.packing_stats();
        let requests = (TASKS * ROUNDS) as u64;
        // Every request went out at least once (redirected ones twice).
        assert!(stats.writes >= requests, "{stats:?}");
        assert!(stats.reads >= requests, "{stats:?}");
        // ... on the call stream, in fewer frames than requests.
        assert_eq!((stats.write_calls, stats.read_calls), (0, 0), "{stats:?}");
        assert!(
            stats.stream_frames < stats.writes + stats.reads,
            "{stats:?}"
        );

        // Call stream off: the packing lanes, in fewer calls than requests.
        let lanes = Client::with_options(
            [cluster.addr(cluster.leader)],
            ClientOptions {
                call_stream: false,
                ..ClientOptions::default()
            },
        )?;
        let c = lanes.clone();
        race(TASKS, move |t| {
            let c = c.clone();
            async move {
                for r in 0..ROUNDS {
                    c.put(format!("l/{t}"), format!("{r}")).await?;
                    c.get_with(format!("l/{t}"), Consistency::Linearizable)
                        .await?;
                }
                Ok(())
            }
        })
        .await?;
        let stats = lanes.packing_stats();
        assert_eq!(stats.stream_frames, 0, "{stats:?}");
        assert!(stats.write_calls < stats.writes, "{stats:?}");
        assert!(stats.read_calls < stats.reads, "{stats:?}");

        // Packing off: one call per request.
        let unpacked = Client::with_options(
            [cluster.addr(cluster.leader)],
            ClientOptions {
                max_batch_in_flight: 0,
                ..ClientOptions::default()
            },
        )?;
        let c = unpacked.clone();
        race(8, move |t| {
            let c = c.clone();
            async move {
                c.put(format!("u/{t}"), "v").await?;
                Ok(())
            }
        })
        .await?;
        let stats = unpacked.packing_stats();
        assert_eq!(stats.writes, 8);
        assert_eq!(stats.write_calls, 8);
        cluster.shutdown().await;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
