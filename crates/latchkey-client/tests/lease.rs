//! The client's lease deadline against a scripted replica (an in-process
//! gRPC server on loopback) that holds its replies for a set delay.
//!
//! The rule under test (`lock.rs`, "The lease, as the client sees it"): a
//! session is vouched for until the *send* time of the last acknowledged
//! keep-alive (or of the `OpenSession` call) `+ ttl - ttl/10`. The leader
//! counts the same lease from its *receipt* of that call, which comes after
//! the send, so the client stops vouching before the cluster can expire the
//! session and grant its locks to someone else.
//!
//! Two planted bugs must fail here: counting the deadline from the reply's
//! arrival instead of the send (a held reply then makes the deadline as much
//! later as the reply was held), and dropping the `ttl/10` margin. The
//! scripted replica records when it *received* each call; the client sent it
//! no later than that, so `received + ttl - ttl/10` is an upper bound of the
//! correct deadline that needs no knowledge of the client's clock. The
//! timing assertions are in that safe direction only (the lease must end no
//! later than the bound); nothing asserts that the lease lasts long enough.
//! The one thing required the other way, so that a test cannot pass without
//! exercising its path, is that the held keep-alive is counted at all: its
//! reply arrives more than a second before the lease would run out.
//!
//! The numbers: TTL 5 s (margin 500 ms, keep-alive every 1.67 s), replies
//! held 1.5 s. A deadline counted from the reply misses the bound by about
//! 1.5 s; one without the margin by about 500 ms (less the time from the
//! client's send to the replica's receipt, a few milliseconds on loopback
//! once the connection is up, which each test makes sure of first).

mod fake;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::Stream;
use latchkey_client::{Client, ClientOptions, Error, LockGuard, Session};
use latchkey_core::lock::{
    LockCommand, LockMode, LockOutcome, Sequencer, SessionId, SessionInfo, SessionSecret, Token,
};
use latchkey_core::{Command, Outcome};
use latchkey_proto::v1::kv_server::Kv;
use latchkey_proto::v1::lock_server::Lock;
use latchkey_proto::v1::pipeline_server::Pipeline;
use latchkey_proto::v1::{
    call::Request as Req, call_reply::Reply as Rep, AcquireReply, AcquireRequest, CallFrame,
    CallReplies, CallReply, CloseSessionReply, CloseSessionRequest, EndSessionRequest,
    KeepAliveRequest, OpenSessionRequest, PutReply, PutRequest, ReleaseReply, ReleaseRequest,
    SessionReply,
};
use latchkey_proto::{wire, Operation};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

/// The session's TTL.
const TTL: Duration = Duration::from_secs(5);
/// How long the replica holds a delayed reply.
const HELD: Duration = Duration::from_millis(1500);
/// The lease clock (`Instant` plus any time suspended, measured as
/// CLOCK_BOOTTIME - CLOCK_MONOTONIC) may read a little ahead of `Instant`
/// when a reading of the two clocks is preempted; no suspend happens in a
/// test. Slack for that only: the comparison itself is exact.
const CLOCK_SLACK: Duration = Duration::from_millis(50);
/// How late a timer may fire on a loaded machine before `Session::lost`
/// counts as late.
const TIMER_SLACK: Duration = Duration::from_millis(500);
/// Bound on each whole test.
const LIMIT: Duration = Duration::from_secs(60);

/// The session every `OpenSession` gets.
const SESSION: SessionId = SessionId(7);
/// The lock the tests take.
const LOCK: &str = "lease/l";

/// When the replica received one call, and when it sent the reply (`None`
/// while held, or if never answered).
#[derive(Debug, Clone, Copy)]
struct Seen {
    received: Instant,
    replied: Option<Instant>,
}

/// What the replica does, and what it saw.
struct Script {
    /// How long the `OpenSession` reply is held.
    open_delay: Duration,
    /// How long the n-th keep-alive reply (from 0) is held; keep-alives past
    /// the end of the list are never answered, as by a replica that stopped.
    keep_alive_delays: Vec<Duration>,
    opens: Mutex<Vec<Seen>>,
    keep_alives: Mutex<Vec<Seen>>,
    keep_alive_count: AtomicUsize,
}

impl Script {
    fn new(open_delay: Duration, keep_alive_delays: Vec<Duration>) -> Arc<Script> {
        Arc::new(Script {
            open_delay,
            keep_alive_delays,
            opens: Mutex::new(Vec::new()),
            keep_alives: Mutex::new(Vec::new()),
            keep_alive_count: AtomicUsize::new(0),
        })
    }

    /// Record a call received now; answers its slot in `seen`.
    fn arrived(seen: &Mutex<Vec<Seen>>) -> usize {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.push(Seen {
            received: Instant::now(),
            replied: None,
        });
        seen.len() - 1
    }

    fn replied(seen: &Mutex<Vec<Seen>>, slot: usize) {
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        seen[slot].replied = Some(Instant::now());
    }

    fn opens(&self) -> Vec<Seen> {
        self.opens.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn keep_alives(&self) -> Vec<Seen> {
        self.keep_alives
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The outcome of a write: `OpenSession` after `open_delay`, everything
    /// else at once.
    async fn write(&self, command: Command) -> Result<Outcome, Status> {
        Ok(match command {
            Command::Lock(LockCommand::OpenSession { ttl_ms, .. }) => {
                let slot = Script::arrived(&self.opens);
                tokio::time::sleep(self.open_delay).await;
                Script::replied(&self.opens, slot);
                Outcome::Lock(LockOutcome::SessionOpened {
                    session: SESSION,
                    ttl_ms,
                    secret: SessionSecret([0x17; 16]),
                })
            }
            Command::Lock(LockCommand::Release { name, token, .. }) => {
                Outcome::Lock(LockOutcome::Released {
                    name,
                    token,
                    remaining: 0,
                })
            }
            Command::Lock(LockCommand::CloseSession { session, .. }) => {
                Outcome::Lock(LockOutcome::SessionEnded {
                    session,
                    released: 0,
                    cancelled: 0,
                })
            }
            // The warm-up.
            Command::Put { .. } => Outcome::Written { revision: 1 },
            _ => return Err(Status::internal("unexpected write")),
        })
    }

    /// The outcome of the n-th keep-alive after its delay, or never.
    async fn keep_alive(&self, session: SessionId) -> Result<Outcome, Status> {
        if session != SESSION {
            return Err(Status::internal("keep-alive of an unknown session"));
        }
        let n = self.keep_alive_count.fetch_add(1, Ordering::SeqCst);
        let slot = Script::arrived(&self.keep_alives);
        match self.keep_alive_delays.get(n) {
            Some(delay) => tokio::time::sleep(*delay).await,
            None => std::future::pending::<()>().await,
        }
        Script::replied(&self.keep_alives, slot);
        Ok(Outcome::Lock(LockOutcome::Session(Some(SessionInfo {
            session,
            ttl_ms: TTL.as_millis() as u64,
            forced: Default::default(),
        }))))
    }

    /// Every acquire is granted at once, token 1.
    fn acquire(&self, command: Command) -> Result<Outcome, Status> {
        match command {
            Command::Lock(LockCommand::Acquire { name, session, .. }) => {
                Ok(Outcome::Lock(LockOutcome::Granted {
                    sequencer: Sequencer {
                        name,
                        mode: LockMode::Exclusive,
                        token: Token(1),
                        session,
                    },
                    hold_count: 1,
                }))
            }
            _ => Err(Status::invalid_argument("not an acquire")),
        }
    }

    /// The reply to one typed request, the same on the stream and unary.
    async fn call(&self, request: Req) -> Result<Rep, Status> {
        let (op, rpc) = wire::request_from_wire(request)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let outcome = match op {
            Operation::Write(command) => self.write(command).await?,
            Operation::KeepAlive { session, .. } => self.keep_alive(session).await?,
            Operation::Acquire { command, .. } => self.acquire(command)?,
            Operation::Read { .. } => return Err(Status::internal("unexpected call")),
        };
        Ok(wire::reply_to_wire(rpc, Ok(Ok(outcome))))
    }

    /// A unary call: `request` answered as on the stream, its reply taken
    /// out by `pick` (the variant of the call's RPC).
    async fn unary<T>(
        &self,
        request: Req,
        pick: fn(Rep) -> Option<T>,
    ) -> Result<Response<T>, Status> {
        let reply = self.call(request).await?;
        pick(reply)
            .map(Response::new)
            .ok_or_else(|| Status::internal("the reply of another RPC"))
    }
}

type Replying = std::pin::Pin<Box<dyn Stream<Item = Result<CallReplies, Status>> + Send>>;

struct FakePipeline(Arc<Script>);

#[tonic::async_trait]
impl Pipeline for FakePipeline {
    /// Each call is answered on its own, by id, when its reply is ready
    /// (a held keep-alive does not hold up the calls behind it).
    async fn calls(
        &self,
        request: Request<Streaming<CallFrame>>,
    ) -> Result<Response<Replying>, Status> {
        let (out, replies) = mpsc::unbounded_channel();
        let script = self.0.clone();
        let mut incoming = request.into_inner();
        tokio::spawn(async move {
            while let Ok(Some(frame)) = incoming.message().await {
                for call in frame.calls {
                    let script = script.clone();
                    let out = out.clone();
                    tokio::spawn(async move {
                        let reply = match call.request {
                            Some(request) => script.call(request).await,
                            None => Err(Status::internal("a call without a request")),
                        };
                        let reply = reply.map(|reply| CallReplies {
                            replies: vec![CallReply {
                                id: call.id,
                                reply: Some(reply),
                            }],
                        });
                        let _ = out.send(reply);
                    });
                }
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

struct FakeKv(Arc<Script>);

#[tonic::async_trait]
impl Kv for FakeKv {
    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutReply>, Status> {
        self.0
            .unary(Req::Put(request.into_inner()), |r| match r {
                Rep::Put(r) => Some(r),
                _ => None,
            })
            .await
    }
}

struct FakeLock(Arc<Script>);

#[tonic::async_trait]
impl Lock for FakeLock {
    async fn open_session(
        &self,
        request: Request<OpenSessionRequest>,
    ) -> Result<Response<SessionReply>, Status> {
        self.0
            .unary(Req::OpenSession(request.into_inner()), |r| match r {
                Rep::OpenSession(r) => Some(r),
                _ => None,
            })
            .await
    }

    async fn keep_alive(
        &self,
        request: Request<KeepAliveRequest>,
    ) -> Result<Response<SessionReply>, Status> {
        self.0
            .unary(Req::KeepAlive(request.into_inner()), |r| match r {
                Rep::KeepAlive(r) => Some(r),
                _ => None,
            })
            .await
    }

    async fn close_session(
        &self,
        request: Request<CloseSessionRequest>,
    ) -> Result<Response<CloseSessionReply>, Status> {
        self.0
            .unary(Req::CloseSession(request.into_inner()), |r| match r {
                Rep::CloseSession(r) => Some(r),
                _ => None,
            })
            .await
    }

    async fn end_session(
        &self,
        request: Request<EndSessionRequest>,
    ) -> Result<Response<CloseSessionReply>, Status> {
        self.0
            .unary(Req::EndSession(request.into_inner()), |r| match r {
                Rep::EndSession(r) => Some(r),
                _ => None,
            })
            .await
    }

    async fn acquire(
        &self,
        request: Request<AcquireRequest>,
    ) -> Result<Response<AcquireReply>, Status> {
        self.0
            .unary(Req::Acquire(request.into_inner()), |r| match r {
                Rep::Acquire(r) => Some(r),
                _ => None,
            })
            .await
    }

    async fn release(
        &self,
        request: Request<ReleaseRequest>,
    ) -> Result<Response<ReleaseReply>, Status> {
        self.0
            .unary(Req::Release(request.into_inner()), |r| match r {
                Rep::Release(r) => Some(r),
                _ => None,
            })
            .await
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

/// How the client reaches the replica.
#[derive(Debug, Clone, Copy)]
enum Transport {
    /// Every request (the open, acquires, keep-alives) on the
    /// `Pipeline.Calls` stream (`ClientOptions::call_stream`, the default).
    Stream,
    /// Every request as its own unary RPC (`call_stream` off):
    /// `Lock.OpenSession`, `Lock.Acquire`, `Lock.KeepAlive`, ...
    Unary,
}

/// A client of the replica at `addr`, its connection (and call stream) up,
/// so the time from a send to its receipt is only loopback latency.
async fn connected_client(addr: &str, transport: Transport) -> Result<Client, Error> {
    let client = Client::with_options(
        [addr],
        // The fake replica does not remember requests: writes go plain.
        ClientOptions::default()
            .with_call_stream(matches!(transport, Transport::Stream))
            .with_retry_safe_writes(false),
    )?;
    client.put("warm-up", "v").await?;
    Ok(client)
}

/// Every request went the way `transport` says (else a test would not
/// cover the path it names).
fn assert_carried_by(client: &Client, transport: Transport) {
    let stats = client.transport_stats();
    let carried = match transport {
        Transport::Stream => stats.stream_calls > 0 && stats.unary_calls == 0,
        Transport::Unary => stats.unary_calls > 0 && stats.stream_calls == 0,
    };
    assert!(carried, "{transport:?}: {stats:?}");
}

/// The latest instant the lease may be vouched for, given that the call
/// it was counted from was received by the replica at `received`.
fn bound(received: Instant) -> Instant {
    received + TTL - TTL / 10
}

/// The session and the guard report the lease lost no later than `bound`
/// (the session's deadline, `Session::valid_until`, is checked by the
/// caller): once it has passed, `is_live` and `is_held` say false, and
/// `Session::lost` and `LockGuard::lost` have resolved by then (give or take
/// a loaded machine's timer lateness).
async fn lost_by(session: &Session, guard: &LockGuard, bound: Instant, what: &str) {
    // Sleeping late only makes these more certain.
    tokio::time::sleep_until(tokio::time::Instant::from_std(bound + CLOCK_SLACK)).await;
    assert!(
        !session.is_live(),
        "{what}: the session is still live after send + ttl - ttl/10 (valid until {:?} after it)",
        session.valid_until().saturating_duration_since(bound)
    );
    assert!(
        !guard.is_held(),
        "{what}: the guard is still held after send + ttl - ttl/10"
    );
    let late = tokio::time::Instant::from_std(bound + TIMER_SLACK);
    assert!(
        tokio::time::timeout_at(late, session.lost()).await.is_ok(),
        "{what}: Session::lost had not resolved {TIMER_SLACK:?} after send + ttl - ttl/10"
    );
    assert!(
        tokio::time::timeout_at(late, guard.lost()).await.is_ok(),
        "{what}: LockGuard::lost had not resolved {TIMER_SLACK:?} after send + ttl - ttl/10"
    );
}

/// Right after a session opens, its deadline counts from the send of the
/// `OpenSession` call, not from its (held) reply, and keeps the margin.
async fn open_counts_from_the_send(transport: Transport) -> Result<(), Box<dyn std::error::Error>> {
    // Keep-alives are never answered: the open's deadline is the only one.
    let script = Script::new(HELD, Vec::new());
    let (addr, server) = serve(script.clone()).await?;
    let client = connected_client(&addr, transport).await?;

    let session = client.session(TTL).await?;
    let until = session.valid_until();
    let opens = script.opens();
    assert_eq!(opens.len(), 1, "{opens:?}");
    let open = opens[0];
    let replied = open.replied.ok_or("the open was answered")?;
    assert!(replied >= open.received + HELD, "{open:?}");
    let bound = bound(open.received);
    assert!(
        until <= bound + CLOCK_SLACK,
        "{transport:?}: right after open the lease runs {:?} past the open's receipt + ttl - ttl/10 \
         (counted from the reply, or without the margin)",
        until.saturating_duration_since(bound)
    );

    let guard = session.lock(LOCK).acquire().await?;
    lost_by(&session, &guard, bound, "after a held open").await;
    // The watchdog kept trying: the deadline came from the open alone.
    assert!(!script.keep_alives().is_empty());
    assert!(script.keep_alives().iter().all(|k| k.replied.is_none()));
    assert_carried_by(&client, transport);
    drop(guard);
    server.abort();
    Ok(())
}

/// After a keep-alive whose reply was held, the deadline counts from the
/// keep-alive's send, not from its reply, and keeps the margin.
async fn keep_alive_counts_from_the_send(
    transport: Transport,
) -> Result<(), Box<dyn std::error::Error>> {
    // The open is answered at once; the first keep-alive after HELD; the
    // rest never, so the first keep-alive's deadline is the last one.
    let script = Script::new(Duration::ZERO, vec![HELD]);
    let (addr, server) = serve(script.clone()).await?;
    let client = connected_client(&addr, transport).await?;

    let session = client.session(TTL).await?;
    let opened_until = session.valid_until();
    let guard = session.lock(LOCK).acquire().await?;

    // Wait for the held reply to be sent (the first keep-alive goes out
    // ttl/3 after the open) ...
    let keep_alive = loop {
        if let Some(first) = script.keep_alives().first() {
            if first.replied.is_some() {
                break *first;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let replied = keep_alive.replied.ok_or("answered")?;
    assert!(replied >= keep_alive.received + HELD, "{keep_alive:?}");
    // ... and for the client to count it (else this test would prove
    // nothing): the deadline moves on from the open's. The reply arrives
    // over a second before the open's deadline, so this takes milliseconds
    // unless the machine stalls that long; the wait ends at that deadline
    // at the latest (the session is no longer live then).
    while session.valid_until() == opened_until && session.is_live() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let until = session.valid_until();
    assert!(
        until > opened_until,
        "{transport:?}: the held keep-alive was never counted (live: {})",
        session.is_live()
    );
    let bound = bound(keep_alive.received);
    assert!(
        until <= bound + CLOCK_SLACK,
        "{transport:?}: after a held keep-alive the lease runs {:?} past its receipt + ttl - ttl/10 \
         (counted from the reply, or without the margin)",
        until.saturating_duration_since(bound)
    );

    lost_by(&session, &guard, bound, "after a held keep-alive").await;
    assert_carried_by(&client, transport);
    drop(guard);
    server.abort();
    Ok(())
}

#[tokio::test]
async fn open_on_the_call_stream_counts_from_the_send() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, open_counts_from_the_send(Transport::Stream)).await?
}

#[tokio::test]
async fn unary_open_session_counts_from_the_send() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, open_counts_from_the_send(Transport::Unary)).await?
}

#[tokio::test]
async fn keep_alive_on_the_call_stream_counts_from_the_send(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, keep_alive_counts_from_the_send(Transport::Stream)).await?
}

#[tokio::test]
async fn unary_keep_alive_counts_from_the_send() -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, keep_alive_counts_from_the_send(Transport::Unary)).await?
}

/// Jeopardy: a session whose keep-alive goes unanswered for a third of the
/// TTL is at risk while still live; the late answer clears it; a keep-alive
/// never answered puts it at risk again before it is lost, and work run
/// under the lock is cancelled at the loss.
///
/// The numbers (TTL 5 s): the first keep-alive goes out at ~1.67 s and is
/// answered 2.5 s later (~4.17 s); the session is at risk from ~3.33 s
/// (the open's send + 2/3 TTL) and would be lost at ~4.5 s. The next
/// keep-alive is never answered: at risk again from ~5.0 s, lost at
/// ~6.17 s. The assertions on order need the test's timers to fire within
/// ~0.8 s of their time.
#[tokio::test]
async fn a_session_is_at_risk_before_it_is_lost_and_a_keep_alive_clears_it(
) -> Result<(), Box<dyn std::error::Error>> {
    tokio::time::timeout(LIMIT, async {
        let script = Script::new(Duration::ZERO, vec![Duration::from_millis(2500)]);
        let (addr, server) = serve(script.clone()).await?;
        let client = connected_client(&addr, Transport::Stream).await?;
        let session = client.session(TTL).await?;
        let guard = session.lock(LOCK).acquire().await?;
        assert!(!session.is_at_risk() && !guard.is_at_risk());

        session.at_risk().await;
        let first = *script
            .keep_alives()
            .first()
            .ok_or("no keep-alive was sent")?;
        assert!(
            Instant::now() + CLOCK_SLACK >= first.received + TTL / 3,
            "at risk {:?} after the first keep-alive went out, before a third of the TTL",
            first.received.elapsed()
        );
        assert!(session.is_live() && guard.is_held(), "lost, not at risk");
        assert!(session.is_at_risk() && guard.is_at_risk());
        assert!(
            script.keep_alives()[0].replied.is_none(),
            "the keep-alive was answered before the session was found at risk"
        );

        assert!(
            session.recovered().await,
            "the late answer did not clear the risk"
        );
        assert!(script.keep_alives()[0].replied.is_some());
        assert!(!session.is_at_risk() && session.is_live());

        // The next keep-alive is never answered.
        guard.at_risk().await;
        assert!(guard.is_held(), "lost without a warning first");
        let work = guard.while_held(std::future::pending::<()>()).await;
        match work {
            Err(Error::LockLost { lock, token, .. }) => {
                assert_eq!((lock.as_str(), token), (LOCK, guard.token().0));
            }
            other => panic!("work under the lost lock ended with {other:?}"),
        }
        assert!(!guard.is_held() && !session.is_at_risk());
        assert!(!session.recovered().await, "a lost session recovered");
        assert!(matches!(
            guard.while_held(async { 1 }).await,
            Err(Error::LockLost { .. })
        ));
        drop(guard);
        server.abort();
        Ok(())
    })
    .await?
}
