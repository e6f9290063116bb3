//! The client's call stream (`Pipeline.Calls`) against a scripted replica
//! (an in-process gRPC server on loopback), for the failures a real cluster
//! cannot be made to produce on cue: replies out of order, a stream that
//! breaks with calls in flight, a replica that never accepts the stream, and
//! a stream so busy that a keep-alive must not queue behind it; a
//! retry-safe write resent under its request id after its stream broke,
//! and its retry refused (an unknown outcome, not a refusal). And, with the
//! call stream off, one unary RPC per request.
//!
//! The tests that race requests collect every task's call before the
//! replica answers any.

mod fake;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::Stream;
use latchkey_client::{Client, ClientOptions, Error};
use latchkey_core::lock::LockCommand;
use latchkey_core::lock::{LockOutcome, SessionId, SessionInfo, SessionSecret};
use latchkey_core::{Command, CommandError, Outcome, Query};
use latchkey_proto::v1::kv_server::Kv;
use latchkey_proto::v1::lock_server::Lock;
use latchkey_proto::v1::pipeline_server::Pipeline;
use latchkey_proto::v1::{
    call::Request as Req, call_reply::Reply as Rep, Call, CallFrame, CallReplies, CallReply,
    GetReply, GetRequest, KeepAliveRequest, PutReply, PutRequest, SessionReply,
};
use latchkey_proto::{wire, Operation};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

const LIMIT: Duration = Duration::from_secs(30);
const TASKS: usize = 8;

/// What the replica does with `Pipeline.Calls`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum StreamMode {
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
    /// Like `BreakFirst`, but only puts are collected (a session opens
    /// first); later streams answer at once.
    BreakFirstPuts,
    /// Like `BreakFirstPuts`, but later streams refuse every retry-safe
    /// put (as a replica would a retry whose condition no longer holds).
    BreakFirstPutsThenRefuse,
}

struct Script {
    stream: StreamMode,
    streams_opened: AtomicUsize,
    /// Every write command the replica received, by how it came.
    stream_writes: Mutex<Vec<Command>>,
    unary_writes: Mutex<Vec<Command>>,
    /// Keep-alives received, on the stream and unary.
    keep_alives_on_stream: AtomicUsize,
    unary_keep_alives: AtomicUsize,
}

impl Script {
    fn new(stream: StreamMode) -> Arc<Script> {
        Arc::new(Script {
            stream,
            streams_opened: AtomicUsize::new(0),
            stream_writes: Mutex::new(Vec::new()),
            unary_writes: Mutex::new(Vec::new()),
            keep_alives_on_stream: AtomicUsize::new(0),
            unary_keep_alives: AtomicUsize::new(0),
        })
    }
}

/// The session every `OpenSession` gets.
const SESSION: SessionId = SessionId(7);
/// The secret the fake replica gives `SESSION`: the client must send it back.
const SECRET: SessionSecret = SessionSecret([0x42; 16]);

/// How a request reached the replica.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    Stream,
    Unary,
}

/// The reply to one typed request: a read answers the key it was asked for
/// as the value; writes and keep-alives are recorded by how they came.
fn answer(script: &Script, request: Req, via: Via) -> Result<Rep, Status> {
    let (op, rpc) =
        wire::request_from_wire(request).map_err(|e| Status::invalid_argument(e.to_string()))?;
    let outcome = match op {
        Operation::Write(command) => {
            let outcome = match &command {
                Command::Lock(LockCommand::OpenSession { ttl_ms, .. }) => {
                    Outcome::Lock(LockOutcome::SessionOpened {
                        session: SESSION,
                        ttl_ms: *ttl_ms,
                        secret: SECRET,
                    })
                }
                Command::Lock(LockCommand::CloseSession { session, secret }) => {
                    if *secret != SECRET {
                        return Err(Status::internal("close without the session's secret"));
                    }
                    Outcome::Lock(LockOutcome::SessionEnded {
                        session: *session,
                        released: 0,
                        cancelled: 0,
                    })
                }
                Command::Put { .. } => Outcome::Written { revision: 1 },
                Command::Once { command: put, .. } if matches!(**put, Command::Put { .. }) => {
                    let retry = script.streams_opened.load(Ordering::SeqCst) > 1;
                    if retry && script.stream == StreamMode::BreakFirstPutsThenRefuse {
                        script
                            .stream_writes
                            .lock()
                            .map_err(|_| Status::internal("poisoned"))?
                            .push(command);
                        let refused = CommandError::KeyAbsent { key: "k".into() };
                        return Ok(wire::reply_to_wire(rpc, Ok(Err(refused))));
                    }
                    Outcome::Written { revision: 1 }
                }
                _ => return Err(Status::internal("unexpected write")),
            };
            let seen = match via {
                Via::Stream => &script.stream_writes,
                Via::Unary => &script.unary_writes,
            };
            seen.lock()
                .map_err(|_| Status::internal("poisoned"))?
                .push(command);
            outcome
        }
        Operation::Read {
            query: Query::Get { key },
            ..
        } => Outcome::Value {
            value: Some(latchkey_core::Versioned {
                value: key,
                create_revision: 1,
                mod_revision: 1,
                version: 1,
            }),
            revision: 1,
        },
        Operation::KeepAlive { session, secret } => {
            let count = match via {
                Via::Stream => &script.keep_alives_on_stream,
                Via::Unary => &script.unary_keep_alives,
            };
            count.fetch_add(1, Ordering::SeqCst);
            if session != SESSION || secret != SECRET {
                return Err(Status::internal(
                    "keep-alive of an unknown session, or without its secret",
                ));
            }
            Outcome::Lock(LockOutcome::Session(Some(SessionInfo {
                session,
                ttl_ms: 3000,
                forced: Default::default(),
            })))
        }
        _ => return Err(Status::internal("unexpected call")),
    };
    Ok(wire::reply_to_wire(rpc, Ok(Ok(outcome))))
}

/// The reply to one call on the stream.
fn answer_call(script: &Script, call: Call) -> Result<CallReply, Status> {
    let request = call
        .request
        .ok_or_else(|| Status::internal("a call without a request"))?;
    Ok(CallReply {
        id: call.id,
        reply: Some(answer(script, request, Via::Stream)?),
    })
}

fn is_put(call: &Call) -> bool {
    matches!(call.request, Some(Req::Put(_)))
}

/// Play `script`'s stream mode on one stream, sending its replies to `out`.
async fn play_stream(
    script: Arc<Script>,
    mut incoming: Streaming<CallFrame>,
    out: mpsc::UnboundedSender<Result<CallReplies, Status>>,
) -> Result<(), Status> {
    let first = script.streams_opened.fetch_add(1, Ordering::SeqCst) == 0;
    let puts_only = matches!(
        script.stream,
        StreamMode::BreakFirstPuts | StreamMode::BreakFirstPutsThenRefuse
    );
    let breaks = (script.stream == StreamMode::BreakFirst || puts_only) && first;
    let collect = script.stream == StreamMode::Reversed || breaks;
    let mut collected = Vec::new();
    while let Some(frame) = incoming.message().await? {
        for call in frame.calls {
            if script.stream == StreamMode::HoldPuts && is_put(&call) {
                continue;
            }
            let collect_this = collect && (!puts_only || is_put(&call));
            let reply = answer_call(&script, call)?;
            if collect_this {
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

struct FakePipeline(Arc<Script>);

#[tonic::async_trait]
impl Pipeline for FakePipeline {
    async fn calls(
        &self,
        request: Request<Streaming<CallFrame>>,
    ) -> Result<Response<Replying>, Status> {
        if self.0.stream == StreamMode::NeverAccept {
            std::future::pending::<()>().await;
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

/// A unary call: `request` answered as on the stream, its reply taken out
/// by `pick` (the variant of the call's RPC).
fn unary<T>(
    script: &Script,
    request: Req,
    pick: fn(Rep) -> Option<T>,
) -> Result<Response<T>, Status> {
    pick(answer(script, request, Via::Unary)?)
        .map(Response::new)
        .ok_or_else(|| Status::internal("the reply of another RPC"))
}

struct FakeKv(Arc<Script>);

#[tonic::async_trait]
impl Kv for FakeKv {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetReply>, Status> {
        unary(&self.0, Req::Get(request.into_inner()), |r| match r {
            Rep::Get(r) => Some(r),
            _ => None,
        })
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutReply>, Status> {
        unary(&self.0, Req::Put(request.into_inner()), |r| match r {
            Rep::Put(r) => Some(r),
            _ => None,
        })
    }
}

struct FakeLock(Arc<Script>);

#[tonic::async_trait]
impl Lock for FakeLock {
    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<SessionReply>, Status> {
        unary(&self.0, Req::KeepAlive(request.into_inner()), |r| match r {
            Rep::KeepAlive(r) => Some(r),
            _ => None,
        })
    }
}

async fn serve(
    script: Arc<Script>,
) -> Result<(String, tokio::task::JoinHandle<()>), std::io::Error> {
    fake::serve(
        FakePipeline(script.clone()),
        FakeKv(script.clone()),
        FakeLock(script),
    )
    .await
}

/// The fake replicas here do not remember requests: writes go plain (the
/// subject is the stream, not retry-safe writes).
fn stream_options() -> ClientOptions {
    ClientOptions::default()
        .with_request_timeout(Duration::from_secs(10))
        .with_attempt_timeout(Duration::from_secs(5))
        .with_retry_safe_writes(false)
}

/// A client that uses the call stream.
fn stream_client(addr: &str) -> Result<Client, Error> {
    Client::with_options([addr], stream_options())
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
                    c.put(key, "v").await.map(|_| None)
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
        let script = Script::new(StreamMode::Reversed);
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
        let stats = client.transport_stats();
        assert_eq!(stats.stream_calls, TASKS as u64, "{stats:?}");
        assert_eq!(stats.unary_calls, 0, "{stats:?}");
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
        let script = Script::new(StreamMode::BreakFirst);
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

        // The next request opens a new stream.
        client.put("b/after", "v").await?;
        assert_eq!(script.streams_opened.load(Ordering::SeqCst), 2);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// The retry-safe puts the replica received: (request id, the put), in
/// arrival order.
fn once_puts(seen: &Mutex<Vec<Command>>) -> Result<Vec<(u64, Command)>, &'static str> {
    Ok(seen
        .lock()
        .map_err(|_| "poisoned")?
        .iter()
        .filter_map(|c| match c {
            Command::Once {
                session,
                secret,
                request_id,
                command,
            } if *session == SESSION && *secret == SECRET => {
                Some((*request_id, (**command).clone()))
            }
            _ => None,
        })
        .collect())
}

/// A client whose writes are retry-safe (the default).
fn retry_safe_client(addr: &str) -> Result<Client, Error> {
    Client::with_options([addr], stream_options().with_retry_safe_writes(true))
}

#[tokio::test]
async fn retry_safe_writes_on_a_stream_that_breaks_are_resent_under_their_ids(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(StreamMode::BreakFirstPuts);
        let (addr, server) = serve(script.clone()).await?;
        let client = retry_safe_client(&addr)?;
        let results = racing_calls(&client, "r/", |_| true).await?;
        for r in &results {
            assert!(r.is_ok(), "{r:?}");
        }
        // Each put came twice (the broken stream, then the next one), both
        // times under the same request id with the same body.
        let seen = once_puts(&script.stream_writes)?;
        assert_eq!(seen.len(), 2 * TASKS, "{seen:?}");
        let mut by_id: std::collections::BTreeMap<u64, Vec<Command>> = Default::default();
        for (id, put) in seen {
            by_id.entry(id).or_default().push(put);
        }
        assert_eq!(by_id.len(), TASKS);
        for (id, puts) in &by_id {
            assert_eq!(puts.len(), 2, "request {id}");
            assert_eq!(
                puts[0], puts[1],
                "request {id} was resent with another body"
            );
        }
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn a_refused_retry_after_an_attempt_that_may_have_applied_is_unknown(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(StreamMode::BreakFirstPutsThenRefuse);
        let (addr, server) = serve(script.clone()).await?;
        let client = retry_safe_client(&addr)?;
        let results = racing_calls(&client, "u/", |_| true).await?;
        // The first attempts may have been applied; a refusal of the retry
        // does not say they were not.
        for r in &results {
            assert!(matches!(r, Err(Error::UnknownOutcome(_))), "{r:?}");
        }
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn reads_on_a_stream_that_breaks_are_retried() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(StreamMode::BreakFirst);
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
async fn a_write_whose_stream_is_never_accepted_was_not_sent(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(StreamMode::NeverAccept);
        let (addr, server) = serve(script.clone()).await?;
        let client = Client::with_options(
            [addr.as_str()],
            stream_options().with_request_timeout(Duration::from_secs(3)),
        )?;
        // Not UnknownOutcome: no call is handed to a stream before the
        // replica accepted it, so the write is known not to be applied.
        let result = client.put("n/1", "v").await;
        assert!(
            matches!(result, Err(Error::Unavailable { .. })),
            "{result:?}"
        );
        assert!(recorded(&script.stream_writes)?.is_empty());
        assert!(recorded(&script.unary_writes)?.is_empty());
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
        let script = Script::new(StreamMode::BreakFirst);
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
        let script = Script::new(StreamMode::HoldPuts);
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
        let stats = client.transport_stats();
        assert!(stats.unary_calls >= 2, "{stats:?}");
        for h in held {
            h.abort();
        }
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

#[tokio::test]
async fn without_the_call_stream_each_request_is_its_own_unary_call(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(StreamMode::Reversed);
        let (addr, server) = serve(script.clone()).await?;
        let client =
            Client::with_options([addr.as_str()], stream_options().with_call_stream(false))?;
        for t in 0..3 {
            client.put(format!("o/{t}"), "v").await?;
            assert_eq!(
                client.get(format!("o/{t}")).await?,
                Some(format!("o/{t}").into_bytes())
            );
        }
        let unary = recorded(&script.unary_writes)?;
        assert_eq!(unary.len(), 3, "each write sent once, as a unary call");
        assert!(recorded(&script.stream_writes)?.is_empty());
        let stats = client.transport_stats();
        assert_eq!(stats.unary_calls, 6, "{stats:?}");
        assert_eq!(
            (stats.stream_calls, stats.stream_frames),
            (0, 0),
            "{stats:?}"
        );
        assert_eq!(script.streams_opened.load(Ordering::SeqCst), 0);
        server.abort();
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
