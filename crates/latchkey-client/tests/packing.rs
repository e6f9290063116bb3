//! The client's request packing against a scripted replica (an in-process
//! gRPC server on loopback), for the failures a real cluster cannot be made
//! to produce on cue: a batch call that fails in transit, and a replica that
//! predates batch calls.
//!
//! Each test holds the first (unary) call in the server until every other
//! task has queued behind it (one call slot), so the rest go out as one
//! batch. The runtime is single-threaded: the spawned tasks all run up to
//! their queueing point before the server can see the first call.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use latchkey_client::{Client, ClientOptions, Error};
use latchkey_core::{codec, Command, CommandResult, Outcome, Query};
use latchkey_proto::v1::kv_server::{Kv, KvServer};
use latchkey_proto::v1::{ReadBatch, ReadRequest, Replies, Reply, WriteBatch, WriteRequest};
use tokio::sync::Notify;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

const LIMIT: Duration = Duration::from_secs(30);
const TASKS: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum BatchMode {
    /// Batch calls fail as a connection reset would (the first one only,
    /// for reads).
    FailInTransit,
    /// Batch calls are unknown to this replica.
    Unimplemented,
}

struct Script {
    mode: BatchMode,
    /// Hold the first unary call until `release`.
    hold_first: AtomicBool,
    arrived: Notify,
    release: Notify,
    /// Every write command the replica received, by call kind.
    unary_writes: Mutex<Vec<Command>>,
    batched_writes: Mutex<Vec<Command>>,
    read_batches: AtomicUsize,
}

impl Script {
    fn new(mode: BatchMode) -> Arc<Script> {
        Arc::new(Script {
            mode,
            hold_first: AtomicBool::new(true),
            arrived: Notify::new(),
            release: Notify::new(),
            unary_writes: Mutex::new(Vec::new()),
            batched_writes: Mutex::new(Vec::new()),
            read_batches: AtomicUsize::new(0),
        })
    }

    async fn maybe_hold(&self) {
        if self.hold_first.swap(false, Ordering::SeqCst) {
            self.arrived.notify_one();
            self.release.notified().await;
        }
    }

    fn batch_failure(&self) -> Status {
        match self.mode {
            BatchMode::FailInTransit => {
                Status::unavailable("error reading a body from connection: connection reset")
            }
            BatchMode::Unimplemented => Status::unimplemented("unknown method"),
        }
    }
}

fn ok(result: &CommandResult) -> Reply {
    Reply {
        payload: codec::encode(result).unwrap_or_default(),
        failure: None,
    }
}

/// A read answers the key it was asked for as the value.
fn answer_read(r: &ReadRequest) -> Reply {
    match codec::decode::<Query>(&r.query) {
        Ok(Query::Get { key }) => ok(&Ok(Outcome::Value(Some(key)))),
        _ => Reply::default(),
    }
}

struct FakeKv(Arc<Script>);

#[tonic::async_trait]
impl Kv for FakeKv {
    async fn write(&self, request: Request<WriteRequest>) -> Result<Response<Reply>, Status> {
        let command = codec::decode(&request.into_inner().command)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.0
            .unary_writes
            .lock()
            .map_err(|_| Status::internal("poisoned"))?
            .push(command);
        self.0.maybe_hold().await;
        Ok(Response::new(ok(&Ok(Outcome::Done))))
    }

    async fn read(&self, request: Request<ReadRequest>) -> Result<Response<Reply>, Status> {
        self.0.maybe_hold().await;
        Ok(Response::new(answer_read(&request.into_inner())))
    }

    async fn write_many(&self, request: Request<WriteBatch>) -> Result<Response<Replies>, Status> {
        if self.0.mode == BatchMode::Unimplemented {
            return Err(self.0.batch_failure());
        }
        let mut seen = self
            .0
            .batched_writes
            .lock()
            .map_err(|_| Status::internal("poisoned"))?;
        for item in request.into_inner().items {
            seen.push(codec::decode(&item.command).map_err(|e| Status::internal(e.to_string()))?);
        }
        Err(self.0.batch_failure())
    }

    async fn read_many(&self, request: Request<ReadBatch>) -> Result<Response<Replies>, Status> {
        if self.0.mode == BatchMode::Unimplemented
            || self.0.read_batches.fetch_add(1, Ordering::SeqCst) == 0
        {
            return Err(self.0.batch_failure());
        }
        let replies = request.into_inner().items.iter().map(answer_read).collect();
        Ok(Response::new(Replies { replies }))
    }
}

async fn serve(
    script: Arc<Script>,
) -> Result<(String, tokio::task::JoinHandle<()>), std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(KvServer::new(FakeKv(script)))
        .serve_with_incoming(incoming);
    let handle = tokio::spawn(async move {
        let _ = server.await;
    });
    Ok((addr, handle))
}

fn client(addr: &str) -> Result<Client, Error> {
    Client::with_options(
        [addr],
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(5),
            max_batch_in_flight: 1,
            ..ClientOptions::default()
        },
    )
}

/// Spawn one put per task, hold the first until the rest have queued, and
/// collect every task's result.
async fn racing_puts(
    client: &Client,
    script: &Script,
    prefix: &str,
) -> Result<Vec<Result<(), Error>>, Box<dyn std::error::Error>> {
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let c = client.clone();
            let key = format!("{prefix}{t}");
            tokio::spawn(async move { c.put(key, "v").await })
        })
        .collect();
    script.arrived.notified().await;
    script.release.notify_one();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    Ok(results)
}

fn keys(commands: &[Command]) -> Vec<Vec<u8>> {
    commands
        .iter()
        .filter_map(|c| match c {
            Command::Put { key, .. } => Some(key.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_batch_that_fails_in_transit_never_resends_its_writes(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(BatchMode::FailInTransit);
        let (addr, server) = serve(script.clone()).await?;
        let client = client(&addr)?;
        let results = racing_puts(&client, &script, "w/").await?;

        // The held call succeeded; every packed write may have been applied
        // and is reported so, not retried.
        assert!(results[0].is_ok(), "{:?}", results[0]);
        for r in &results[1..] {
            assert!(matches!(r, Err(Error::UnknownOutcome(_))), "{r:?}");
        }
        let unary = keys(&script.unary_writes.lock().map_err(|_| "poisoned")?);
        let batched = keys(&script.batched_writes.lock().map_err(|_| "poisoned")?);
        assert_eq!(unary.len(), 1);
        assert_eq!(
            batched.len(),
            TASKS - 1,
            "the batch carried the queued writes once"
        );
        let distinct: BTreeSet<_> = unary.iter().chain(&batched).collect();
        assert_eq!(distinct.len(), TASKS, "a write was sent twice");
        let stats = client.packing_stats();
        assert_eq!((stats.writes, stats.write_calls), (TASKS as u64, 2));
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn reads_of_a_batch_that_fails_in_transit_are_retried(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(BatchMode::FailInTransit);
        let (addr, server) = serve(script.clone()).await?;
        let client = client(&addr)?;
        let handles: Vec<_> = (0..TASKS)
            .map(|t| {
                let c = client.clone();
                tokio::spawn(async move { (t, c.get(format!("r/{t}")).await) })
            })
            .collect();
        script.arrived.notified().await;
        script.release.notify_one();
        for h in handles {
            let (t, got) = h.await?;
            assert_eq!(got?, Some(format!("r/{t}").into_bytes()), "task {t}");
        }
        assert!(script.read_batches.load(Ordering::SeqCst) >= 1);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn a_replica_without_batch_calls_gets_unary_calls() -> Result<(), Box<dyn std::error::Error>>
{
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(BatchMode::Unimplemented);
        let (addr, server) = serve(script.clone()).await?;
        let client = client(&addr)?;
        let results = racing_puts(&client, &script, "u/").await?;
        for r in &results {
            assert!(r.is_ok(), "{r:?}");
        }
        let unary = keys(&script.unary_writes.lock().map_err(|_| "poisoned")?);
        assert_eq!(unary.len(), TASKS);
        let distinct: BTreeSet<_> = unary.iter().collect();
        assert_eq!(distinct.len(), TASKS, "a write was sent twice");
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
