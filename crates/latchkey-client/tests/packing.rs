//! The client's request packing against a scripted replica (an in-process
//! gRPC server on loopback), for the failures a real cluster cannot be made
//! to produce on cue: a call stream or a batch call that fails in transit,
//! replies out of order, and a replica that predates the call stream, the
//! batch calls or keep-alives on the stream.
//!
//! The lane tests (call stream off) hold the first (unary) call in the
//! server until every other task has queued behind it (one call slot), so
//! the rest go out as one batch. The runtime is single-threaded: the
//! spawned tasks all run up to their queueing point before the server can
//! see the first call. The stream tests collect every task's call before
//! the replica answers any.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use latchkey_client::{Client, ClientOptions, Error};
use latchkey_core::lock::{LockCommand, LockOutcome, SessionId};
use latchkey_core::{codec, Command, CommandResult, Outcome, Query};
use latchkey_proto::v1::kv_server::{Kv, KvServer};
use latchkey_proto::v1::lock_server::{Lock, LockServer};
use latchkey_proto::v1::{
    call::Body, AcquireRequest, Call, CallFrame, CallReplies, CallReply, KeepAliveRequest,
    ReadBatch, ReadRequest, Replies, Reply, WriteBatch, WriteRequest,
};
use tokio::sync::{mpsc, Notify};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

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

/// What the replica does with `Kv.Calls`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamMode {
    /// Unknown to this replica.
    Unimplemented,
    /// Collect `TASKS` calls, then answer them in one frame, in reverse
    /// order.
    Reversed,
    /// The first stream collects `TASKS` calls and then breaks as a
    /// connection reset would; later streams answer each call at once.
    BreakFirst,
    /// The replica never accepts the stream (a paused process would not).
    NeverAccept,
    /// Every call is answered at once except puts, which are never
    /// answered (a busy stream).
    HoldPuts,
}

struct Script {
    mode: BatchMode,
    stream: StreamMode,
    streams_opened: AtomicUsize,
    stream_writes: Mutex<Vec<Command>>,
    /// Hold the first unary call until `release`.
    hold_first: AtomicBool,
    arrived: Notify,
    release: Notify,
    /// Every write command the replica received, by call kind.
    unary_writes: Mutex<Vec<Command>>,
    batched_writes: Mutex<Vec<Command>>,
    read_batches: AtomicUsize,
    /// Keep-alives received, on the stream (known or not) and unary.
    keep_alives_on_stream: AtomicUsize,
    unary_keep_alives: AtomicUsize,
}

impl Script {
    fn new(mode: BatchMode) -> Arc<Script> {
        Script::with_stream(mode, StreamMode::Unimplemented)
    }

    fn with_stream(mode: BatchMode, stream: StreamMode) -> Arc<Script> {
        Arc::new(Script {
            mode,
            stream,
            streams_opened: AtomicUsize::new(0),
            stream_writes: Mutex::new(Vec::new()),
            hold_first: AtomicBool::new(true),
            arrived: Notify::new(),
            release: Notify::new(),
            unary_writes: Mutex::new(Vec::new()),
            batched_writes: Mutex::new(Vec::new()),
            read_batches: AtomicUsize::new(0),
            keep_alives_on_stream: AtomicUsize::new(0),
            unary_keep_alives: AtomicUsize::new(0),
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

/// The session every `OpenSession` gets.
const SESSION: SessionId = SessionId(7);

/// The reply to one call on the stream; writes are recorded.
fn answer_call(script: &Script, call: Call) -> Result<CallReply, Status> {
    let reply = match call.body {
        Some(Body::Write(w)) => {
            let command = codec::decode(&w.command).map_err(|e| Status::internal(e.to_string()))?;
            let outcome = match &command {
                Command::Lock(LockCommand::OpenSession { ttl_ms }) => {
                    Outcome::Lock(LockOutcome::SessionOpened {
                        session: SESSION,
                        ttl_ms: *ttl_ms,
                    })
                }
                _ => Outcome::Done,
            };
            script
                .stream_writes
                .lock()
                .map_err(|_| Status::internal("poisoned"))?
                .push(command);
            ok(&Ok(outcome))
        }
        Some(Body::Read(r)) => answer_read(&r),
        Some(Body::KeepAlive(k)) => {
            script.keep_alives_on_stream.fetch_add(1, Ordering::SeqCst);
            if k.session != SESSION.0 {
                return Err(Status::internal("keep-alive of an unknown session"));
            }
            ok(&Ok(Outcome::Done))
        }
        _ => return Err(Status::internal("unexpected call")),
    };
    Ok(CallReply {
        id: call.id,
        reply: Some(reply),
    })
}

fn is_put(call: &Call) -> bool {
    match &call.body {
        Some(Body::Write(w)) => matches!(codec::decode(&w.command), Ok(Command::Put { .. })),
        _ => false,
    }
}

/// Play `script`'s stream mode on one stream, sending its replies to `out`.
async fn play_stream(
    script: Arc<Script>,
    mut incoming: Streaming<CallFrame>,
    out: mpsc::UnboundedSender<Result<CallReplies, Status>>,
) -> Result<(), Status> {
    let first = script.streams_opened.fetch_add(1, Ordering::SeqCst) == 0;
    let breaks = script.stream == StreamMode::BreakFirst && first;
    let collect = script.stream == StreamMode::Reversed || breaks;
    let mut collected = Vec::new();
    while let Some(frame) = incoming.message().await? {
        for call in frame.calls {
            if script.stream == StreamMode::HoldPuts && is_put(&call) {
                continue;
            }
            let reply = answer_call(&script, call)?;
            if collect {
                collected.push(reply);
            } else {
                let _ = out.send(Ok(CallReplies {
                    replies: vec![reply],
                }));
            }
        }
        if collect && collected.len() >= TASKS {
            if breaks {
                let _ = out.send(Err(Status::unavailable(
                    "error reading a body from connection: connection reset",
                )));
                return Ok(());
            }
            collected.reverse();
            let replies = std::mem::take(&mut collected);
            let _ = out.send(Ok(CallReplies { replies }));
        }
    }
    Ok(())
}

type Replying = std::pin::Pin<Box<dyn Stream<Item = Result<CallReplies, Status>> + Send>>;

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

    type CallsStream = Replying;

    async fn calls(
        &self,
        request: Request<Streaming<CallFrame>>,
    ) -> Result<Response<Replying>, Status> {
        match self.0.stream {
            StreamMode::Unimplemented => return Err(Status::unimplemented("unknown method")),
            StreamMode::NeverAccept => std::future::pending::<()>().await,
            _ => {}
        }
        let (out, replies) = mpsc::unbounded_channel();
        let script = self.0.clone();
        let incoming = request.into_inner();
        tokio::spawn(async move {
            if let Err(status) = play_stream(script, incoming, out.clone()).await {
                let _ = out.send(Err(status));
            }
        });
        let replies =
            futures::stream::unfold(
                replies,
                |mut rx| async move { rx.recv().await.map(|r| (r, rx)) },
            );
        Ok(Response::new(Box::pin(replies)))
    }
}

struct FakeLock(Arc<Script>);

#[tonic::async_trait]
impl Lock for FakeLock {
    async fn acquire(&self, _request: Request<AcquireRequest>) -> Result<Response<Reply>, Status> {
        Err(Status::unimplemented("not in this script"))
    }

    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<Reply>, Status> {
        if request.into_inner().session != SESSION.0 {
            return Err(Status::internal("keep-alive of an unknown session"));
        }
        self.0.unary_keep_alives.fetch_add(1, Ordering::SeqCst);
        Ok(Response::new(ok(&Ok(Outcome::Done))))
    }
}

async fn serve(
    script: Arc<Script>,
) -> Result<(String, tokio::task::JoinHandle<()>), std::io::Error> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = tonic::transport::Server::builder()
        .add_service(KvServer::new(FakeKv(script.clone())))
        .add_service(LockServer::new(FakeLock(script)))
        .serve_with_incoming(incoming);
    let handle = tokio::spawn(async move {
        let _ = server.await;
    });
    Ok((addr, handle))
}

/// A client with one call slot per lane and the call stream off (the lane
/// tests).
fn client(addr: &str) -> Result<Client, Error> {
    Client::with_options(
        [addr],
        ClientOptions {
            call_stream: false,
            ..stream_options()
        },
    )
}

fn stream_options() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(5),
        max_batch_in_flight: 1,
        ..ClientOptions::default()
    }
}

/// A client that uses the call stream.
fn stream_client(addr: &str) -> Result<Client, Error> {
    Client::with_options([addr], stream_options())
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

/// The keys of the puts recorded in `seen`.
fn recorded(seen: &Mutex<Vec<Command>>) -> Result<Vec<Vec<u8>>, &'static str> {
    Ok(keys(&seen.lock().map_err(|_| "poisoned")?))
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
        let unary = recorded(&script.unary_writes)?;
        let batched = recorded(&script.batched_writes)?;
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
        let unary = recorded(&script.unary_writes)?;
        assert_eq!(unary.len(), TASKS);
        let distinct: BTreeSet<_> = unary.iter().collect();
        assert_eq!(distinct.len(), TASKS, "a write was sent twice");
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// Run `TASKS` requests at once, task `t` putting `{prefix}{t}` when
/// `is_put(t)` and getting it otherwise, and collect what each got.
async fn racing_calls(
    client: &Client,
    prefix: &str,
    is_put: fn(usize) -> bool,
) -> Result<Vec<Result<Option<Vec<u8>>, Error>>, Box<dyn std::error::Error>> {
    let handles: Vec<_> = (0..TASKS)
        .map(|t| {
            let c = client.clone();
            let key = format!("{prefix}{t}");
            tokio::spawn(async move {
                if is_put(t) {
                    c.put(key, "v").await.map(|()| None)
                } else {
                    c.get(key).await
                }
            })
        })
        .collect();
    let mut results = Vec::new();
    for h in handles {
        results.push(h.await?);
    }
    Ok(results)
}

#[tokio::test]
async fn stream_replies_are_matched_by_id_not_by_order() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::Reversed);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        let results = racing_calls(&client, "m/", |t| t % 2 == 0).await?;
        for (t, r) in results.into_iter().enumerate() {
            let want = (t % 2 == 1).then(|| format!("m/{t}").into_bytes());
            assert_eq!(r?, want, "task {t} got another call's reply");
        }
        let streamed = recorded(&script.stream_writes)?;
        assert_eq!(streamed.len(), TASKS / 2);
        assert!(recorded(&script.unary_writes)?.is_empty());
        let stats = client.packing_stats();
        assert_eq!((stats.writes, stats.reads), (4, 4), "{stats:?}");
        assert_eq!((stats.write_calls, stats.read_calls), (0, 0), "{stats:?}");
        assert!(stats.stream_frames >= 1, "{stats:?}");
        assert_eq!(script.streams_opened.load(Ordering::SeqCst), 1);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn writes_on_a_stream_that_breaks_are_unknown_and_never_resent(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::BreakFirst);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        let results = racing_calls(&client, "b/", |_| true).await?;
        for r in &results {
            assert!(matches!(r, Err(Error::UnknownOutcome(_))), "{r:?}");
        }
        let streamed = recorded(&script.stream_writes)?;
        let distinct: BTreeSet<_> = streamed.iter().collect();
        assert_eq!(streamed.len(), TASKS, "a write was sent twice");
        assert_eq!(distinct.len(), TASKS);
        assert!(recorded(&script.unary_writes)?.is_empty());
        assert!(recorded(&script.batched_writes)?.is_empty());

        // The next request opens a new stream.
        client.put("b/after", "v").await?;
        assert_eq!(script.streams_opened.load(Ordering::SeqCst), 2);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn reads_on_a_stream_that_breaks_are_retried() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::BreakFirst);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        let results = racing_calls(&client, "g/", |_| false).await?;
        for (t, r) in results.into_iter().enumerate() {
            assert_eq!(r?, Some(format!("g/{t}").into_bytes()), "task {t}");
        }
        assert!(script.streams_opened.load(Ordering::SeqCst) >= 2);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn a_replica_without_the_call_stream_gets_unary_and_batch_calls(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::Unimplemented);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        script.hold_first.store(false, Ordering::SeqCst);
        for t in 0..3 {
            client.put(format!("o/{t}"), "v").await?;
            assert_eq!(
                client.get(format!("o/{t}")).await?,
                Some(format!("o/{t}").into_bytes())
            );
        }
        let unary = recorded(&script.unary_writes)?;
        assert_eq!(unary.len(), 3, "each write sent once, as a unary call");
        let stats = client.packing_stats();
        assert_eq!(stats.stream_frames, 0, "{stats:?}");
        assert_eq!((stats.write_calls, stats.read_calls), (3, 3), "{stats:?}");
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn a_write_whose_stream_is_never_accepted_was_not_sent(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::NeverAccept);
        let (addr, server) = serve(script.clone()).await?;
        let client = Client::with_options(
            [addr.as_str()],
            ClientOptions {
                request_timeout: Duration::from_secs(3),
                ..stream_options()
            },
        )?;
        // Not UnknownOutcome: no call is handed to a stream before the
        // replica accepted it, so the write is known not to be applied.
        let result = client.put("n/1", "v").await;
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "{result:?}"
        );
        assert!(recorded(&script.stream_writes)?.is_empty());
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// Wait (bounded by the test's limit) until `count` reaches `n`.
async fn until_at_least(count: &AtomicUsize, n: usize) {
    while count.load(Ordering::SeqCst) < n {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn keep_alives_travel_on_the_call_stream() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::BreakFirst);
        // Not the first stream: it would break after TASKS calls.
        script.streams_opened.store(1, Ordering::SeqCst);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        let session = client.session(Duration::from_secs(3)).await?;
        assert_eq!(session.id(), SESSION);
        until_at_least(&script.keep_alives_on_stream, 2).await;
        assert!(session.is_live());
        assert_eq!(script.unary_keep_alives.load(Ordering::SeqCst), 0);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn keep_alives_do_not_queue_behind_a_busy_stream() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::with_stream(BatchMode::Unimplemented, StreamMode::HoldPuts);
        let (addr, server) = serve(script.clone()).await?;
        let client = stream_client(&addr)?;
        let session = client.session(Duration::from_secs(3)).await?;
        // More calls waiting on the stream than a keep-alive queues behind.
        let mut held = Vec::new();
        for i in 0..1100 {
            let client = client.clone();
            held.push(tokio::spawn(async move {
                client.put(format!("held/{i}"), "v").await
            }));
        }
        until_at_least(&script.unary_keep_alives, 2).await;
        assert!(session.is_live());
        assert_eq!(script.keep_alives_on_stream.load(Ordering::SeqCst), 0);
        for h in held {
            h.abort();
        }
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
