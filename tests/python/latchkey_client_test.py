#!/usr/bin/env python3
"""latchkey from Python: its gRPC API, used with nothing but grpcio.

Run against a running three-replica cluster, with stubs generated from
proto/latchkey.proto:

    python -m grpc_tools.protoc -I proto --python_out=STUBS \\
        --grpc_python_out=STUBS proto/latchkey.proto
    python tests/python/latchkey_client_test.py --stubs STUBS \\
        127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103

(or set LATCHKEY_ENDPOINTS and LATCHKEY_PY_STUBS). Needs grpcio and, for the
reflection check, grpcio-reflection. `cargo xtask test` runs it (through
tests/python.rs) against a fresh cluster; it also runs against a cluster in
use, since everything it writes is under a prefix of its own.

It doubles as documentation of how a Python program uses latchkey:
- `Router` sends each call to the leader (following NOT_LEADER's
  `leader_addr`, retrying UNAVAILABLE with a bounded backoff);
- every reply carries its error in its `error` field (`HasField("error")`),
  never only in the gRPC status;
- `Session` keeps a lease alive from a background thread (KeepAlive every
  ttl/3) and `Session.acquire` waits in a lock's FIFO queue by calling
  Acquire again with the same request_id while it is answered `queued`.

Every RPC has a timeout and every wait a bound. Each section prints
`ok <section>` or `FAIL <section>: why`; the exit code is 1 if any failed.
"""

import argparse
import itertools
import os
import queue
import sys
import threading
import time
import traceback

import grpc

RPC_TIMEOUT = 10.0  # seconds, for any one call
PATIENCE = 30.0  # seconds of retrying a call (elections, a busy machine)


class Failure(Exception):
    """A check that did not hold: the message says what was expected."""


def check(condition, message):
    if not condition:
        raise Failure(message)


def kind_name(kind):
    return pb.ErrorKind.Name(kind) if kind in pb.ErrorKind.values() else str(kind)


def describe(error):
    """One line for an `Error` message."""
    return f"{kind_name(error.kind)}: {error.message!r} (retryable={error.retryable})"


def error_of(reply):
    """The reply's error, or None: every latchkey reply has an `error` field."""
    return reply.error if reply.HasField("error") else None


def expect_ok(what, reply):
    error = error_of(reply)
    check(error is None, f"{what}: expected success, got {describe(error) if error else ''}")
    return reply


def expect_error(what, reply, kind):
    error = error_of(reply)
    check(
        error is not None,
        f"{what}: expected {kind_name(kind)}, but it succeeded: {reply}",
    )
    check(error.kind == kind, f"{what}: expected {kind_name(kind)}, got {describe(error)}")
    return error


# ---------------------------------------------------------------------------
# Reaching the leader.


class Router:
    """Sends calls to the leader of a cluster, given all of its endpoints.

    Writes and linearizable reads are answered by the leader only; any other
    replica answers ERROR_KIND_NOT_LEADER with the leader's address (empty
    while it knows none: try another replica). ERROR_KIND_UNAVAILABLE and a
    failed connection are retried, elsewhere, with a growing pause, for at
    most `patience` seconds.
    """

    def __init__(self, endpoints, patience=PATIENCE, credentials=None, user=None):
        self.endpoints = list(endpoints)
        self.credentials = credentials  # grpc.ssl_channel_credentials, or plaintext
        # (name, password): sent as call metadata (access control).
        self.metadata = (
            [("latchkey-user", user[0]), ("latchkey-password", user[1])] if user else None
        )
        self.leader = self.endpoints[0]  # a guess, corrected by NOT_LEADER
        self.patience = patience
        self._channels = {}
        self._lock = threading.Lock()

    def channel(self, addr):
        with self._lock:
            if addr not in self._channels:
                # Values go up to 1 MiB, Scan pages further: lift grpcio's
                # 4 MiB receive limit to the server's 64 MiB.
                options = [
                    ("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20),
                ]
                if self.credentials:
                    self._channels[addr] = grpc.secure_channel(addr, self.credentials, options)
                else:
                    self._channels[addr] = grpc.insecure_channel(addr, options=options)
            return self._channels[addr]

    def stub(self, service, addr=None):
        """`service` is "Kv", "Watch", "Lock", "Pipeline", "Admin" or "Auth"."""
        return getattr(rpc, service + "Stub")(self.channel(addr or self.leader))

    def _next_endpoint(self, addr):
        i = self.endpoints.index(addr) if addr in self.endpoints else -1
        return self.endpoints[(i + 1) % len(self.endpoints)]

    def call(
        self, service, method, request, *, idempotent=True, timeout=RPC_TIMEOUT, patience=None
    ):
        """The leader's reply to `service.method(request)`.

        Retries NOT_LEADER and UNAVAILABLE (nothing was executed). A
        transport failure (gRPC status) or ERROR_KIND_UNKNOWN_OUTCOME leaves
        a write's outcome unknown: retried only if `idempotent` (a put of a
        fixed value, any read, any lock call: those are idempotent by
        request_id).
        """
        deadline = time.monotonic() + (self.patience if patience is None else patience)
        pause = 0.05
        while True:
            addr = self.leader
            redirected = False
            try:
                reply = getattr(self.stub(service, addr), method)(
                    request, timeout=timeout, metadata=self.metadata
                )
            except grpc.RpcError as e:
                last = f"{addr}: gRPC status {e.code().name}: {e.details()}"
                retry = idempotent and e.code() in (
                    grpc.StatusCode.UNAVAILABLE,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
                if not retry:
                    raise Failure(f"{service}.{method}: {last}") from None
                self.leader = self._next_endpoint(addr)
            else:
                error = error_of(reply)
                if error is None:
                    return reply
                last = f"{addr}: {describe(error)}"
                if error.kind == pb.ERROR_KIND_NOT_LEADER:
                    redirected = bool(error.leader_addr) and error.leader_addr != addr
                    self.leader = error.leader_addr if redirected else self._next_endpoint(addr)
                elif error.kind == pb.ERROR_KIND_UNAVAILABLE or (
                    idempotent and error.kind == pb.ERROR_KIND_UNKNOWN_OUTCOME
                ):
                    self.leader = self._next_endpoint(addr)
                else:
                    return reply  # the caller decides what this error means
            if time.monotonic() + pause > deadline:
                raise Failure(f"{service}.{method}: gave up retrying; last answer from {last}")
            if not redirected:  # straight to a named leader; else pause first
                time.sleep(pause)
                pause = min(pause * 2, 1.0)


# ---------------------------------------------------------------------------
# Sessions and locks.


class Session:
    """A lock session and the thread that keeps it alive.

    The lease is extended by KeepAlive at least every ttl/3. The thread
    stops when the session ends (SESSION_ENDED) or `close()` is called;
    `failures` lists any keep-alive that did not succeed.
    """

    def __init__(self, router, ttl_ms, keep_alive=True):
        self.router = router
        self.ttl_ms = ttl_ms
        reply = router.call("Lock", "OpenSession", pb.OpenSessionRequest(ttl_ms=ttl_ms))
        opened = expect_ok("OpenSession", reply)
        self.id = opened.session
        # Every later request for the session carries this secret.
        self.secret = opened.secret
        check(len(self.secret) == 16, f"a session secret of {len(self.secret)} bytes")
        self.opened = time.monotonic()
        self._request_ids = itertools.count(1)  # unique and increasing per session
        self._stop = threading.Event()
        self.keep_alives = 0
        self.failures = []
        self._thread = None
        if keep_alive:
            self._thread = threading.Thread(
                target=self._keep_alive, name=f"keep-alive-{self.id}", daemon=True
            )
            self._thread.start()

    def _keep_alive(self):
        every = self.ttl_ms / 3 / 1000
        while not self._stop.wait(every):
            try:
                reply = self.router.call(
                    "Lock",
                    "KeepAlive",
                    pb.KeepAliveRequest(session=self.id, session_secret=self.secret),
                    timeout=every,
                    patience=every,
                )
            except Failure as e:
                self.failures.append(str(e))
                continue
            error = error_of(reply)
            if error is None:
                self.keep_alives += 1
            else:
                self.failures.append(describe(error))
                if error.kind == pb.ERROR_KIND_SESSION_ENDED:
                    return

    def next_request_id(self):
        return next(self._request_ids)

    def acquire(
        self, name, *, wait_ms=None, hold_ms=5000, on_queued=None, value=b"", permits=None
    ):
        """Acquire `name` exclusively; the final AcquireReply (granted or an error).

        Without `wait_ms` a held lock is refused at once (ERROR_KIND_BUSY).
        With it, the replica holds the call up to `hold_ms` and answers
        `queued` if the lock is not granted by then: call again with the
        same request_id (safe: it is answered as the first was, and never
        granted twice). `on_queued(Queued)` is called for each such answer.
        """
        request = pb.AcquireRequest(
            session=self.id,
            session_secret=self.secret,
            owner=0,
            request_id=self.next_request_id(),
            name=name,
            mode=pb.LOCK_MODE_EXCLUSIVE,
            hold_ms=hold_ms,
            value=value,  # a campaign's (an election's lock); empty for a lock
        )
        if permits is not None:  # a semaphore's permit: shared, with the count
            request.mode = pb.LOCK_MODE_SHARED
            request.permits = permits
        if wait_ms is not None:
            request.wait_ms = wait_ms  # an optional field: set it only to wait
        give_up = time.monotonic() + (wait_ms or 0) / 1000 + RPC_TIMEOUT
        while True:
            reply = self.router.call(
                "Lock", "Acquire", request, timeout=hold_ms / 1000 + RPC_TIMEOUT
            )
            if reply.WhichOneof("result") != "queued":
                return reply
            if on_queued:
                on_queued(reply.queued)
            check(
                time.monotonic() < give_up,
                f"acquire of {name}: still queued {wait_ms} ms after asking",
            )

    def release(self, sequencer):
        reply = self.router.call(
            "Lock",
            "Release",
            pb.ReleaseRequest(
                session=self.id,
                session_secret=self.secret,
                owner=0,
                request_id=self.next_request_id(),
                name=sequencer.name,
                token=sequencer.token,
            ),
        )
        return expect_ok(f"release of {sequencer.name}", reply)

    def close(self):
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=RPC_TIMEOUT)
        reply = self.router.call(
            "Lock",
            "CloseSession",
            pb.CloseSessionRequest(session=self.id, session_secret=self.secret),
        )
        return expect_ok(f"CloseSession {self.id}", reply)


def close_all(*sessions):
    """Close sessions at the end of a section, even a failed one (a failure
    to close is printed, not raised: it must not hide the section's own)."""
    for s in sessions:
        try:
            s.close()
        except Exception as e:
            print(f"   (closing session {s.id}: {e})")


def granted(what, reply):
    """The Sequencer of a granted AcquireReply."""
    expect_ok(what, reply)
    check(
        reply.WhichOneof("result") == "granted",
        f"{what}: expected a grant, got {reply}",
    )
    return reply.granted.sequencer


def fenced_put(sequencer, secret, key, value):
    return pb.FencedWriteRequest(
        sequencer=sequencer,
        session_secret=secret,
        ops=[pb.BatchOp(put=pb.PutRequest(key=key, value=value))],
    )


class Waiter:
    """An Acquire with wait in a thread of its own; what happened, in order,
    on `events`: ("queued", Queued), then ("granted", Sequencer) or
    ("error", text)."""

    def __init__(self, session, name, wait_ms=30000, hold_ms=500, value=b"", permits=None):
        self.events = queue.Queue()
        self.queued = 0

        def run():
            try:
                reply = session.acquire(
                    name,
                    wait_ms=wait_ms,
                    hold_ms=hold_ms,
                    on_queued=self._on_queued,
                    value=value,
                    permits=permits,
                )
                self.events.put(("granted", granted(f"session {session.id}'s acquire", reply)))
            except Exception as e:  # reported through events, checked by the test
                self.events.put(("error", f"{type(e).__name__}: {e}"))

        self.thread = threading.Thread(target=run, name=f"waiter-{session.id}", daemon=True)
        self.thread.start()

    def _on_queued(self, queued):
        self.queued += 1
        if self.queued == 1:
            self.events.put(("queued", queued))

    def next_event(self, expected, within=RPC_TIMEOUT):
        try:
            kind, value = self.events.get(timeout=within)
        except queue.Empty:
            raise Failure(f"waiter: no {expected} within {within} s") from None
        check(kind == expected, f"waiter: expected {expected}, got {kind}: {value}")
        return value


# ---------------------------------------------------------------------------
# The sections of the test.


def section_leader(router, ns):
    """Find the leader: a follower answers NOT_LEADER naming it."""
    # A linearizable read, from whichever replica is tried first.
    expect_ok("first get", router.call("Kv", "Get", pb.GetRequest(key=ns + b"probe")))
    leader = router.leader
    check(leader in router.endpoints, f"the leader {leader!r} is none of {router.endpoints}")
    # A put sent to a follower (the first that answers) is refused.
    reply = None
    for follower in (e for e in router.endpoints if e != leader):
        try:
            reply = router.stub("Kv", follower).Put(
                pb.PutRequest(key=ns + b"to-follower", value=b"x"), timeout=RPC_TIMEOUT
            )
            break
        except grpc.RpcError as e:
            print(f"   follower {follower} does not answer: {e.code().name}")
    check(reply is not None, "no follower answers")
    error = expect_error(f"put to follower {follower}", reply, pb.ERROR_KIND_NOT_LEADER)
    check(
        error.leader_addr in router.endpoints,
        f"NOT_LEADER names {error.leader_addr!r}, none of {router.endpoints}",
    )
    check(error.retryable, f"NOT_LEADER is not marked retryable: {describe(error)}")
    reply = router.call("Kv", "Get", pb.GetRequest(key=ns + b"to-follower"))
    check(not expect_ok("get", reply).HasField("kv"), "the refused put was applied")
    status = router.stub("Admin", leader).Status(pb.StatusRequest(), timeout=RPC_TIMEOUT)
    print(f"   leader is node {status.leader_id} at {leader} (term {status.term})")


def section_kv(router, ns):
    """put, get (present and absent) with revisions, compare_and_put by value
    and by revision, scan with a prefix."""
    key = ns + b"kv/a"
    put = expect_ok("put", router.call("Kv", "Put", pb.PutRequest(key=key, value=b"1")))
    check(put.revision > 0, f"a put made no revision: {put}")
    reply = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=key)))
    check(reply.HasField("kv") and reply.kv.value == b"1", f"get {key!r}: {reply}")
    check(
        reply.kv.create_revision == put.revision
        and reply.kv.mod_revision == put.revision
        and reply.kv.version == 1
        and reply.revision >= put.revision,
        f"get after the put at {put.revision}: {reply}",
    )
    reply = expect_ok("get absent", router.call("Kv", "Get", pb.GetRequest(key=ns + b"kv/none")))
    check(not reply.HasField("kv"), f"an absent key has a value: {reply}")

    def cas(test, value):
        request = pb.CompareAndPutRequest(key=key, test=test, value=value)
        reply = router.call("Kv", "CompareAndPut", request, idempotent=False)
        return expect_ok("compare_and_put", reply)

    reply = cas(pb.Test(value=b"1"), b"2")
    check(reply.succeeded, f"compare_and_put 1 -> 2 failed: {reply}")
    check(
        reply.revision > put.revision and reply.current.mod_revision == reply.revision,
        f"compare_and_put 1 -> 2 made no new revision: {reply}",
    )
    swapped_at = reply.revision
    reply = cas(pb.Test(value=b"1"), b"3")
    check(not reply.succeeded, f"compare_and_put with a stale expected value succeeded: {reply}")
    check(
        reply.HasField("current") and reply.current.value == b"2",
        f"a failed compare_and_put shows current {reply.current!r}, expected b'2'",
    )
    reply = cas(pb.Test(absent=pb.Absent()), b"4")
    check(
        not reply.succeeded and reply.current.value == b"2",
        f"put-if-absent on a present key: {reply}",
    )
    stale = pb.RevisionTest(
        field=pb.REVISION_FIELD_MOD, comparison=pb.COMPARISON_EQUAL, value=put.revision
    )
    reply = cas(pb.Test(revision=stale), b"5")
    check(not reply.succeeded, f"compare_and_put by a stale mod_revision succeeded: {reply}")
    current = pb.RevisionTest(
        field=pb.REVISION_FIELD_MOD, comparison=pb.COMPARISON_EQUAL, value=swapped_at
    )
    reply = cas(pb.Test(revision=current), b"5")
    check(
        reply.succeeded and reply.current.version == 3,
        f"compare_and_put by the current mod_revision: {reply}",
    )
    absent = pb.CompareAndPutRequest(
        key=ns + b"kv/none", test=pb.Test(revision=current), value=b"x"
    )
    expect_error(
        "a revision test on an absent key",
        router.call("Kv", "CompareAndPut", absent, idempotent=False),
        pb.ERROR_KIND_KEY_ABSENT,
    )

    prefix = ns + b"scan/"
    names = [b"c", b"a", b"e", b"b", b"d"]
    for name in names:
        expect_ok("put", router.call("Kv", "Put", pb.PutRequest(key=prefix + name, value=name * 2)))
    # Just past the prefix's keys: the scan must stop before it.
    expect_ok("put", router.call("Kv", "Put", pb.PutRequest(key=ns + b"scan0", value=b"outside")))
    page = expect_ok("scan", router.call("Kv", "Scan", pb.ScanRequest(prefix=prefix, limit=3)))
    got = [(e.key, e.value) for e in page.entries]
    check(
        got == [(prefix + n, n * 2) for n in (b"a", b"b", b"c")] and page.more,
        f"scan page 1: {got}, more={page.more}",
    )
    check(
        all(0 < e.mod_revision <= page.revision for e in page.entries),
        f"scan page 1's revisions: {page}",
    )
    # The next page starts just after the last key.
    start = page.entries[-1].key + b"\x00"
    page = expect_ok(
        "scan", router.call("Kv", "Scan", pb.ScanRequest(start=start, prefix=prefix, limit=3))
    )
    got = [(e.key, e.value) for e in page.entries]
    check(
        got == [(prefix + n, n * 2) for n in (b"d", b"e")] and not page.more,
        f"scan page 2: {got}, more={page.more}",
    )


def section_locks(router, ns):
    """Sessions kept alive, a FIFO queue of waiters, fencing tokens."""
    name = ns.decode() + "fifo"
    a = Session(router, ttl_ms=6000)
    b = Session(router, ttl_ms=6000)
    c = Session(router, ttl_ms=6000)
    try:
        first = granted("A's acquire", a.acquire(name))
        print(f"   A (session {a.id}) holds {name} with token {first.token}")

        # B, then C, queue behind A; B is called again while it waits.
        wait_b = Waiter(b, name)
        queued_b = wait_b.next_event("queued")
        wait_c = Waiter(c, name)
        queued_c = wait_c.next_event("queued")
        check(
            queued_c.position > queued_b.position,
            f"C queued at position {queued_c.position}, not behind B's {queued_b.position}",
        )
        time.sleep(1.2)  # B's call is held 0.5 s at a time: it asks again
        check(wait_b.queued >= 2, f"B was answered queued {wait_b.queued} times, expected >= 2")
        check(wait_b.events.empty(), "B's wait ended while A held the lock")

        a.release(first)
        second = wait_b.next_event("granted")
        check(
            second.token > first.token,
            f"B's token {second.token} is not above A's {first.token}",
        )
        check(wait_c.events.empty(), "C got the lock although B queued first")
        print(f"   B (session {b.id}) got it after A released, token {second.token}")

        # A's old sequencer fences nothing any more.
        key = ns + b"fenced"
        reply = router.call("Lock", "FencedWrite", fenced_put(first, a.secret, key, b"from A"))
        error = expect_error("fenced put with A's old sequencer", reply, pb.ERROR_KIND_STALE_FENCE)
        check(error.name == name, f"STALE_FENCE names lock {error.name!r}, not {name!r}")
        check(error.token == first.token, f"STALE_FENCE token {error.token}, sent {first.token}")
        check(
            error.HasField("current_token") and error.current_token == second.token,
            f"STALE_FENCE current_token {error.current_token}, expected B's {second.token}",
        )
        # Nobody but B acts for B's session, even knowing its id and
        # sequencer (both are in every lock list): not A, not C.
        for who, secret in (("A", a.secret), ("C", c.secret)):
            reply = router.call("Lock", "FencedWrite", fenced_put(second, secret, key, b"forged"))
            error = expect_error(
                f"fenced put with B's sequencer and {who}'s secret",
                reply,
                pb.ERROR_KIND_WRONG_SESSION_SECRET,
            )
            check(error.session == b.id, f"WRONG_SESSION_SECRET names session {error.session}")
            for method, request in (
                (
                    "Release",
                    pb.ReleaseRequest(
                        session=b.id,
                        session_secret=secret,
                        request_id=10_000,
                        name=name,
                        token=second.token,
                    ),
                ),
                ("CloseSession", pb.CloseSessionRequest(session=b.id, session_secret=secret)),
                ("KeepAlive", pb.KeepAliveRequest(session=b.id, session_secret=secret)),
            ):
                expect_error(
                    f"{method} of B's session with {who}'s secret",
                    router.call("Lock", method, request),
                    pb.ERROR_KIND_WRONG_SESSION_SECRET,
                )
        reply = router.call("Lock", "FencedWrite", fenced_put(second, b.secret, key, b"from B"))
        expect_ok("fenced put with B's sequencer", reply)
        check(not reply.HasField("failed_condition"), f"fenced put: {reply}")
        reply = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=key)))
        check(reply.kv.value == b"from B", f"the fenced key reads {reply.kv.value!r}")

        b.release(second)
        third = wait_c.next_event("granted")
        check(third.token > second.token, f"C's token {third.token} is not above {second.token}")
        c.release(third)

        for s in (a, b, c):
            check(not s.failures, f"session {s.id}'s keep-alives failed: {s.failures}")
    finally:
        close_all(a, b, c)


def section_expiry(router, ns):
    """A session that is not kept alive expires and loses its lock."""
    name = ns.decode() + "expiring"
    keeper = Session(router, ttl_ms=6000)
    lapsing = Session(router, ttl_ms=3000, keep_alive=False)
    try:
        lost = granted("acquire", lapsing.acquire(name))
        started = time.monotonic()
        while True:
            reply = router.call("Lock", "CheckSequencer", pb.CheckSequencerRequest(sequencer=lost))
            if not expect_ok("CheckSequencer", reply).current:
                break
            check(time.monotonic() - started < 20, "the grant is still current after 20 s")
            time.sleep(0.2)
        took = time.monotonic() - started
        print(f"   session {lapsing.id} expired: its grant ended {took:.1f} s after the acquire")

        reply = router.call(
            "Lock",
            "KeepAlive",
            pb.KeepAliveRequest(session=lapsing.id, session_secret=lapsing.secret),
        )
        error = expect_error("KeepAlive of an expired session", reply, pb.ERROR_KIND_SESSION_ENDED)
        check(error.session == lapsing.id, f"SESSION_ENDED names session {error.session}")

        taken = granted("acquire after expiry", keeper.acquire(name, wait_ms=10000))
        check(taken.token > lost.token, f"new token {taken.token} is not above {lost.token}")
        keeper.release(taken)

        # The keeper outlived a lease that was not kept alive.
        reply = router.call("Lock", "GetSession", pb.GetSessionRequest(session=keeper.id))
        check(expect_ok("GetSession", reply).live, f"session {keeper.id} is not live")
        check(not keeper.failures, f"keep-alives failed: {keeper.failures}")
        check(keeper.keep_alives >= 1, "no keep-alive was answered")
    finally:
        close_all(keeper)


def section_bad_input(router, ns):
    """Refusals, with nothing half-applied; the replica serves on."""
    bad = ns + b"bad/"

    def invalid(what, reply):
        error = expect_error(what, reply, pb.ERROR_KIND_INVALID_ARGUMENT)
        check(not error.retryable, f"{what}: INVALID_ARGUMENT marked retryable")
        check(error.message, f"{what}: an error without a message")

    invalid("empty key", router.call("Kv", "Put", pb.PutRequest(key=b"", value=b"v")))
    big = b"v" * (1024 * 1024 + 1)
    invalid("1 MiB + 1 value", router.call("Kv", "Put", pb.PutRequest(key=bad + b"big", value=big)))

    session = Session(router, ttl_ms=6000)
    try:
        for mode in (0, 99):
            request = pb.AcquireRequest(
                session=session.id,
                session_secret=session.secret,
                request_id=session.next_request_id(),
                name=ns.decode() + "bad-mode",
                mode=mode,
            )
            invalid(f"acquire with mode {mode}", router.call("Lock", "Acquire", request))
    finally:
        close_all(session)
    put = pb.BatchOp(put=pb.PutRequest(key=bad + b"fenced", value=b"v"))
    request = pb.FencedWriteRequest(ops=[put])
    invalid("fenced write without a sequencer", router.call("Lock", "FencedWrite", request))

    # A call stream: 1,000 puts in 10 frames, cancelled before any reply is read.
    leader = router.leader
    sent = threading.Event()
    cancelled = threading.Event()

    def frames():
        for f in range(10):
            ids = range(f * 100, f * 100 + 100)
            yield pb.CallFrame(
                calls=[
                    pb.Call(id=i, put=pb.PutRequest(key=ns + b"pipe/%04d" % i, value=b"p"))
                    for i in ids
                ]
            )
        sent.set()  # asked for more: the last frame was handed to gRPC
        cancelled.wait(RPC_TIMEOUT)

    call = router.stub("Pipeline", leader).Calls(frames(), timeout=RPC_TIMEOUT * 3)
    check(sent.wait(RPC_TIMEOUT), "the call stream did not take 10 frames")
    call.cancel()
    cancelled.set()
    code = call.code()
    check(code == grpc.StatusCode.CANCELLED, f"the cancelled stream ended with {code}")
    reply = router.stub("Kv", leader).Get(
        pb.GetRequest(key=ns + b"pipe/0000", stale=True), timeout=RPC_TIMEOUT
    )
    expect_ok(f"get from {leader} after the cancelled stream", reply)
    # Calls of a cancelled stream may or may not have run: counted, not checked.
    page = expect_ok("scan", router.call("Kv", "Scan", pb.ScanRequest(prefix=ns + b"pipe/")))
    print(f"   {len(page.entries)} of the cancelled stream's 1,000 puts had been applied by then")

    # A call without a request: only `error`, INVALID_ARGUMENT; its frame's
    # other call runs.
    frame = pb.CallFrame(calls=[pb.Call(id=7), pb.Call(id=8, get=pb.GetRequest(key=ns + b"kv/a"))])
    replies = {}
    for out in router.stub("Pipeline", leader).Calls(iter([frame]), timeout=RPC_TIMEOUT):
        for r in out.replies:
            replies[r.id] = r
    check(sorted(replies) == [7, 8], f"the stream answered calls {sorted(replies)}, not 7 and 8")
    check(replies[7].WhichOneof("reply") == "error", f"call without a request: {replies[7]}")
    invalid("call without a request", replies[7])  # a CallReply: `error` in its oneof
    check(replies[8].WhichOneof("reply") == "get", f"the get beside it: {replies[8]}")
    error = error_of(replies[8].get)
    check(
        error is None or error.kind == pb.ERROR_KIND_NOT_LEADER,
        f"the get beside it failed: {describe(error) if error else ''}",
    )

    # Nothing half-applied.
    page = expect_ok("scan", router.call("Kv", "Scan", pb.ScanRequest(prefix=bad)))
    check(not page.entries, f"refused writes left keys: {[e.key for e in page.entries]}")
    page = expect_ok("scan", router.call("Kv", "Scan", pb.ScanRequest(limit=1)))
    check(not page.entries or page.entries[0].key != b"", "the empty key was written")
    reply = router.call("Lock", "ListLocks", pb.ListLocksRequest(prefix=ns.decode() + "bad-mode"))
    check(not expect_ok("ListLocks", reply).locks, f"refused acquires left locks: {reply.locks}")

    # And the cluster serves on.
    expect_ok("put", router.call("Kv", "Put", pb.PutRequest(key=ns + b"after", value=b"ok")))
    reply = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=ns + b"after")))
    check(reply.kv.value == b"ok", f"read back {reply.kv.value!r}")


class DefaultTimeout(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Gives calls without a timeout one (grpcio-reflection's client sets none)."""

    def __init__(self, seconds):
        self.seconds = seconds

    def _bounded(self, details):
        if details.timeout is not None:
            return details
        return details._replace(timeout=self.seconds)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._bounded(details), request)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._bounded(details), requests)


def section_reflection(router, ns):
    """Server reflection lists the services and describes typed messages."""
    from google.protobuf import descriptor_pool, message_factory
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
        ProtoReflectionDescriptorDatabase,
    )

    channel = grpc.intercept_channel(router.channel(router.leader), DefaultTimeout(RPC_TIMEOUT))
    database = ProtoReflectionDescriptorDatabase(channel)
    try:
        services = set(database.get_services())
    except grpc.RpcError as e:
        raise Failure(
            f"reflection (grpc.reflection.v1alpha, the protocol grpcio-reflection speaks): "
            f"{e.code().name}: {e.details()}"
        ) from None
    wanted = {
        "latchkey.v1.Kv",
        "latchkey.v1.Lock",
        "latchkey.v1.Pipeline",
        "latchkey.v1.Admin",
        "grpc.health.v1.Health",
    }
    check(
        wanted <= services,
        f"reflection lists {sorted(services)}; missing {sorted(wanted - services)}",
    )

    pool = descriptor_pool.DescriptorPool(database)
    put = pool.FindMessageTypeByName("latchkey.v1.PutRequest")
    fields = {f.name: f.type for f in put.fields}
    bytes_type = put.fields[0].TYPE_BYTES
    uint64_type = put.fields[0].TYPE_UINT64
    message_type = put.fields[0].TYPE_MESSAGE
    expected = {
        "key": bytes_type,
        "value": bytes_type,
        "session": uint64_type,
        "session_secret": bytes_type,
        "once": message_type,
    }
    check(
        fields == expected,
        f"latchkey.v1.PutRequest has fields {fields}, expected {expected}",
    )
    method = pool.FindServiceByName("latchkey.v1.Kv").FindMethodByName("Put")
    check(
        method.input_type.full_name == "latchkey.v1.PutRequest"
        and method.output_type.full_name == "latchkey.v1.PutReply",
        f"Kv.Put takes {method.input_type.full_name}, answers {method.output_type.full_name}",
    )

    # Descriptors found by reflection are enough to call a service: the
    # standard health check, with no stubs for it.
    def message_class(name):
        return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))

    request_type = message_class("grpc.health.v1.HealthCheckRequest")
    reply_type = message_class("grpc.health.v1.HealthCheckResponse")
    check_health = router.channel(router.leader).unary_unary(
        "/grpc.health.v1.Health/Check",
        request_serializer=request_type.SerializeToString,
        response_deserializer=reply_type.FromString,
    )
    health = check_health(request_type(service="latchkey.v1.Kv"), timeout=RPC_TIMEOUT)
    status_enum = reply_type.DESCRIPTOR.fields_by_name["status"].enum_type
    serving = status_enum.values_by_name["SERVING"].number
    check(health.status == serving, f"latchkey.v1.Kv's health is {health.status}, not SERVING")


def section_auth(router, ns):
    """Access control over the typed API: users and roles set with
    Auth.Change; once enabled, a call without a user is refused
    (AUTH_REQUIRED), a user whose roles lack the permission is refused
    (PERMISSION_DENIED naming user, permission and key), a wrong password is
    UNAUTHENTICATED; root turns it off again. Runs last: it changes the
    cluster's rules while it runs."""
    app = "py-app-%d" % time.time_ns()
    role = app + "-role"

    def change(r, what, **change):
        return expect_ok(what, r.call("Auth", "Change", pb.AuthChangeRequest(**change)))

    root_router = Router(router.endpoints, credentials=router.credentials, user=("root", "root-pw"))
    added = router.call(
        "Auth", "Change", pb.AuthChangeRequest(add_user=pb.AuthUser(name="root", password="root-pw"))
    )
    if error_of(added) is not None:  # a second run against the same cluster
        check("exists" in error_of(added).message, f"add root: {describe(error_of(added))}")
    change(router, "add app", add_user=pb.AuthUser(name=app, password="app-pw"))
    change(router, "add role", add_role=role)
    for permission in (pb.PERMISSION_READ, pb.PERMISSION_WRITE):
        grant = pb.AuthRoleGrant(role=role, grant=pb.Grant(permission=permission, prefix=ns))
        change(router, "grant", grant_permission=grant)
    change(router, "grant role", grant_role=pb.AuthUserRole(user=app, role=role))
    change(router, "enable", enable=pb.AuthEmpty())
    try:
        status = router.call("Auth", "Status", pb.AuthStatusRequest())
        check(status.enabled and status.user == "", f"status {status}")
        put = pb.PutRequest(key=ns + b"auth", value=b"v")
        expect_error("anonymous put", router.call("Kv", "Put", put), pb.ERROR_KIND_AUTH_REQUIRED)
        app_router = Router(router.endpoints, credentials=router.credentials, user=(app, "app-pw"))
        expect_ok("put under the granted prefix", app_router.call("Kv", "Put", put))
        outside = pb.PutRequest(key=b"py-outside/" + ns, value=b"v")
        error = expect_error(
            "put outside the prefix",
            app_router.call("Kv", "Put", outside),
            pb.ERROR_KIND_PERMISSION_DENIED,
        )
        check(
            error.user == app and error.permission == "write" and "py-outside" in error.resource,
            f"PERMISSION_DENIED names user, permission and key: {describe(error)}",
        )
        wrong = Router(router.endpoints, credentials=router.credentials, user=(app, "wrong"))
        try:
            wrong.call("Kv", "Put", put)
        except Failure as e:
            check("UNAUTHENTICATED" in str(e), f"a wrong password: {e}")
        else:
            raise Failure("a wrong password was accepted")
    finally:
        change(root_router, "disable", disable=pb.AuthEmpty())
    expect_ok("anonymous put once disabled", router.call("Kv", "Put", put))


def section_watch(router, ns):
    """a watch of a prefix: the first reply is a progress notice, then each
    write's changes in revision order (a batch's together), deletes included;
    bad watches end at once with a typed error."""
    prefix = ns + b"watch/"
    first = expect_ok("put", router.call("Kv", "Put", pb.PutRequest(key=prefix + b"a", value=b"1")))
    request = pb.WatchRequest(prefix=prefix, start_revision=first.revision, progress_ms=200)
    replies = queue.Queue()

    def follow():
        try:
            for reply in router.stub("Watch").Watch(request, timeout=60):
                replies.put(reply)
        except grpc.RpcError as e:
            replies.put(e)

    threading.Thread(target=follow, daemon=True).start()
    batch = pb.BatchRequest(
        ops=[
            pb.BatchOp(put=pb.PutRequest(key=prefix + b"b", value=b"2")),
            pb.BatchOp(delete=pb.DeleteRequest(key=prefix + b"a")),
        ]
    )
    made = expect_ok("batch", router.call("Kv", "Batch", batch, idempotent=False))
    expect_ok("put elsewhere", router.call("Kv", "Put", pb.PutRequest(key=ns + b"other", value=b"x")))
    changes = []
    while len(changes) < 2:
        reply = replies.get(timeout=RPC_TIMEOUT)
        check(not isinstance(reply, Exception), f"the watch failed: {reply}")
        check(not reply.HasField("error"), f"the watch ended: {describe(reply.error)}")
        if reply.events:
            changes.append(reply)
    check(
        changes[0].revision == first.revision
        and [e.type for e in changes[0].events] == [pb.EVENT_TYPE_PUT]
        and changes[0].events[0].kv.value == b"1",
        f"the first change is not the put at {first.revision}: {changes[0]}",
    )
    check(
        changes[1].revision == made.revision
        and [(e.type, e.key) for e in changes[1].events]
        == [(pb.EVENT_TYPE_PUT, prefix + b"b"), (pb.EVENT_TYPE_DELETE, prefix + b"a")],
        f"the batch at {made.revision} did not arrive as one message: {changes[1]}",
    )
    # Idle: progress notices say how far everything was sent.
    while True:
        reply = replies.get(timeout=RPC_TIMEOUT)
        check(not isinstance(reply, Exception), f"the watch failed: {reply}")
        if not reply.events:
            check(reply.revision >= made.revision, f"progress behind the batch: {reply}")
            break

    def ends_with(what, request, kind):
        reply = next(iter(router.stub("Watch").Watch(request, timeout=RPC_TIMEOUT)))
        check(
            reply.HasField("error") and reply.error.kind == kind,
            f"{what}: expected {kind_name(kind)}, got {reply}",
        )

    ends_with("an empty prefix", pb.WatchRequest(prefix=b""), pb.ERROR_KIND_INVALID_ARGUMENT)
    ends_with(
        "a range ending before its start",
        pb.WatchRequest(range=pb.KeyRange(start=b"b", end=b"a")),
        pb.ERROR_KIND_INVALID_ARGUMENT,
    )
    ends_with(
        "a start revision far in the future",
        pb.WatchRequest(key=prefix + b"b", start_revision=made.revision + 1_000_000),
        pb.ERROR_KIND_FUTURE_REVISION,
    )


def section_ephemeral(router, ns):
    """A key bound to a session (PutRequest.session and session_secret) is
    deleted when the session is closed; a bind to a closed session or with
    another session's secret is refused and writes nothing."""
    key = ns + b"members/py"
    owner = Session(router, ttl_ms=6000)
    other = Session(router, ttl_ms=6000)
    try:
        put = pb.PutRequest(key=key, value=b"10.0.0.9:80", session=owner.id, session_secret=owner.secret)
        made = expect_ok("bound put", router.call("Kv", "Put", put, idempotent=False))
        got = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=key)))
        check(got.HasField("kv") and got.kv.mod_revision == made.revision, f"the bound key: {got}")

        foreign = pb.PutRequest(key=ns + b"members/x", value=b"v", session=owner.id, session_secret=other.secret)
        reply = router.call("Kv", "Put", foreign, idempotent=False)
        expect_error("a bind with another session's secret", reply, pb.ERROR_KIND_WRONG_SESSION_SECRET)
        reply = router.call(
            "Kv",
            "PutIfAbsent",
            pb.PutRequest(key=ns + b"members/y", value=b"v", session=owner.id, session_secret=owner.secret),
            idempotent=False,
        )
        expect_error("put-if-absent bound to a session", reply, pb.ERROR_KIND_INVALID_ARGUMENT)
    finally:
        close_all(owner)
    got = expect_ok("get after the close", router.call("Kv", "Get", pb.GetRequest(key=key)))
    check(not got.HasField("kv"), f"the key outlived its closed session: {got}")
    late = pb.PutRequest(key=key, value=b"late", session=owner.id, session_secret=owner.secret)
    reply = router.call("Kv", "Put", late, idempotent=False)
    expect_error("a bind to a closed session", reply, pb.ERROR_KIND_SESSION_ENDED)
    got = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=key)))
    check(not got.HasField("kv"), f"a refused bind wrote: {got}")
    close_all(other)


def section_retry_safe(router, ns):
    """A write carrying `once` (session, secret, request id) applies once:
    sent again it returns its first outcome, revision included; the same id
    with another body is refused; a batch's op cannot carry its own."""
    key = ns + b"once/k"
    session = Session(router, ttl_ms=6000)
    try:
        rid = session.next_request_id()
        tag = pb.Once(session=session.id, session_secret=session.secret, request_id=rid)
        put = pb.PutRequest(key=key, value=b"v1", once=tag)
        first = expect_ok("retry-safe put", router.call("Kv", "Put", put, idempotent=True))
        again = expect_ok("the same put again", router.call("Kv", "Put", put, idempotent=True))
        check(again.revision == first.revision, f"a resent put made revision {again.revision}, not {first.revision}")
        got = expect_ok("get", router.call("Kv", "Get", pb.GetRequest(key=key)))
        check(got.kv.version == 1 and got.kv.mod_revision == first.revision, f"the put applied twice: {got}")

        other = pb.PutRequest(key=key, value=b"v2", once=tag)
        reply = router.call("Kv", "Put", other, idempotent=False)
        expect_error("another put under the same request id", reply, pb.ERROR_KIND_REQUEST_ID_REUSED)

        seq_tag = pb.Once(session=session.id, session_secret=session.secret, request_id=session.next_request_id())
        take = pb.NextSequenceRequest(key=ns + b"once/ids", step=5, once=seq_tag)
        a = expect_ok("retry-safe allocation", router.call("Kv", "NextSequence", take, idempotent=True))
        b = expect_ok("the same allocation again", router.call("Kv", "NextSequence", take, idempotent=True))
        check((a.start, a.end) == (b.start, b.end), f"a resent allocation moved the sequence: {a} then {b}")

        bad = pb.BatchRequest(ops=[pb.BatchOp(delete=pb.DeleteRequest(key=key, once=tag))])
        reply = router.call("Kv", "Batch", bad, idempotent=False)
        expect_error("a batch op with its own once", reply, pb.ERROR_KIND_INVALID_ARGUMENT)
    finally:
        close_all(session)
    # The memory ends with the session: the same request is refused now.
    reply = router.call("Kv", "Put", put, idempotent=False)
    expect_error("a retry after the session closed", reply, pb.ERROR_KIND_SESSION_ENDED)



ELECTION_PREFIX = "latchkey.election/"


def leader_of(value):
    """(term, session, value) from a leader key's value: 8 bytes big-endian
    each, then the leader's value."""
    check(len(value) >= 16, f"a leader key of {len(value)} bytes")
    return (
        int.from_bytes(value[0:8], "big"),
        int.from_bytes(value[8:16], "big"),
        value[16:],
    )


def section_election(router, ns):
    """Fenced leader election over the typed API: a campaign is an exclusive
    Acquire of "latchkey.election/NAME" carrying a value; the leader key of
    the same name says who leads (term, session, value) and changes in the
    same revision as the lock; Proclaim changes the value; Release resigns;
    clients cannot write the leader key."""
    name = ELECTION_PREFIX + ns.decode() + "sched"
    key = name.encode()
    a = Session(router, ttl_ms=6000)
    b = Session(router, ttl_ms=6000)
    try:
        first = granted("A's campaign", a.acquire(name, value=b"10.0.0.1"))
        read = expect_ok("get the leader key", router.call("Kv", "Get", pb.GetRequest(key=key)))
        check(
            leader_of(read.kv.value) == (first.token, a.id, b"10.0.0.1"),
            f"the leader key says {leader_of(read.kv.value)}, A leads in term {first.token}",
        )
        replies = queue.Queue()
        request = pb.WatchRequest(key=key, start_revision=read.revision + 1)

        def follow():
            try:
                for reply in router.stub("Watch").Watch(request, timeout=60):
                    replies.put(reply)
            except grpc.RpcError as e:
                replies.put(e)

        threading.Thread(target=follow, daemon=True).start()
        wait_b = Waiter(b, name, value=b"10.0.0.2")
        wait_b.next_event("queued")

        proclaim = pb.ProclaimRequest(
            session=a.id, session_secret=a.secret, name=name, term=first.token, value=b"10.0.0.9"
        )
        reply = expect_ok("A's proclamation", router.call("Lock", "Proclaim", proclaim))
        check(reply.term == first.token, f"Proclaim answered term {reply.term}")
        forged = router.call("Kv", "Put", pb.PutRequest(key=key, value=b"forged"))
        expect_error("a put of the leader key", forged, pb.ERROR_KIND_INVALID_ARGUMENT)

        a.release(first)
        second = wait_b.next_event("granted")
        check(second.token > first.token, f"B's term {second.token} is not above {first.token}")
        late = pb.ProclaimRequest(
            session=a.id, session_secret=a.secret, name=name, term=first.token, value=b"x"
        )
        expect_error(
            "a proclamation by the resigned leader",
            router.call("Lock", "Proclaim", late),
            pb.ERROR_KIND_NOT_HOLDER,
        )
        # The watch saw the proclamation, then B's term: each in one revision.
        seen = []
        while len(seen) < 2:
            reply = replies.get(timeout=RPC_TIMEOUT)
            check(not isinstance(reply, Exception), f"the watch failed: {reply}")
            check(not reply.HasField("error"), f"the watch ended: {describe(reply.error)}")
            for event in reply.events:
                seen.append(leader_of(event.kv.value))
        check(
            seen == [(first.token, a.id, b"10.0.0.9"), (second.token, b.id, b"10.0.0.2")],
            f"the watch saw {seen}",
        )
        b.release(second)
        read = expect_ok("get the leader key", router.call("Kv", "Get", pb.GetRequest(key=key)))
        check(not read.HasField("kv"), f"nobody campaigns, yet the leader key holds {read.kv}")
        print(f"   terms {first.token} then {second.token}; observers saw both in order")
    finally:
        close_all(a, b)



def section_semaphore(router, ns):
    """A semaphore over the typed API: an Acquire with `permits` (shared
    mode) takes one of N permits, each with its own token; the N+1st waits
    in FIFO order and gets a released permit; another count is refused with
    PERMITS_MISMATCH; a permit's sequencer fences writes while it is held."""
    name = ns.decode() + "pool"
    sessions = [Session(router, ttl_ms=6000) for _ in range(3)]
    a, b, c = sessions
    try:
        first = granted("A's permit", a.acquire(name, permits=2))
        second = granted("B's permit", b.acquire(name, permits=2))
        check(first.token != second.token, "two permits share a token")
        check(first.mode == pb.LOCK_MODE_SHARED, f"a permit in mode {first.mode}")
        error = expect_error(
            "a permit with another count",
            c.acquire(name, permits=3),
            pb.ERROR_KIND_PERMITS_MISMATCH,
        )
        check(error.max == 2 and error.value == 3, f"PERMITS_MISMATCH says {error}")
        listed = expect_ok(
            "list", router.call("Lock", "ListLocks", pb.ListLocksRequest(prefix=name))
        )
        check(
            len(listed.locks) == 1 and listed.locks[0].permits == 2,
            f"the semaphore is listed as {listed.locks}",
        )
        wait_c = Waiter(c, name, permits=2)
        wait_c.next_event("queued")
        key = ns + b"sem-fenced"
        expect_ok(
            "a fenced put with a held permit",
            router.call("Lock", "FencedWrite", fenced_put(first, a.secret, key, b"a")),
        )
        a.release(first)
        third = wait_c.next_event("granted")
        check(third.token > second.token, f"C's permit {third.token} is not the newest")
        expect_error(
            "a fenced put with a released permit",
            router.call("Lock", "FencedWrite", fenced_put(first, a.secret, key, b"stale")),
            pb.ERROR_KIND_STALE_FENCE,
        )
        b.release(second)
        c.release(third)
        print(f"   permits {first.token}, {second.token}, then {third.token} after a release")
    finally:
        close_all(*sessions)


SECTIONS = [
    ("leader", section_leader),
    ("kv", section_kv),
    ("watch", section_watch),
    ("ephemeral", section_ephemeral),
    ("retry-safe", section_retry_safe),
    ("locks", section_locks),
    ("election", section_election),
    ("semaphore", section_semaphore),
    ("expiry", section_expiry),
    ("bad-input", section_bad_input),
    ("reflection", section_reflection),
    ("auth", section_auth),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "endpoints",
        nargs="*",
        help="host:port of every replica (or one comma-separated list); "
        "default: $LATCHKEY_ENDPOINTS",
    )
    parser.add_argument(
        "--stubs",
        default=os.environ.get("LATCHKEY_PY_STUBS"),
        help="directory holding latchkey_pb2.py and latchkey_pb2_grpc.py; "
        "default: $LATCHKEY_PY_STUBS, else sys.path",
    )
    parser.add_argument("--only", help="run only these sections (comma-separated)")
    parser.add_argument("--cacert", help="talk TLS, trusting this CA certificate (PEM)")
    parser.add_argument("--cert", help="with --cacert: present this client certificate")
    parser.add_argument("--key", help="the private key of --cert")
    args = parser.parse_args()
    given = args.endpoints or [os.environ.get("LATCHKEY_ENDPOINTS", "")]
    endpoints = [e for arg in given for e in arg.split(",") if e]
    if len(endpoints) < 2:
        parser.error(f"expected the endpoints of a cluster (at least two), got {endpoints}")
    if args.stubs:
        sys.path.insert(0, args.stubs)

    global pb, rpc
    try:
        import latchkey_pb2 as pb
        import latchkey_pb2_grpc as rpc
    except ImportError as e:
        sys.exit(f"cannot import the stubs ({e}): generate them (grpc_tools.protoc), pass --stubs")

    credentials = None
    if args.cacert:

        def read(path):
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()

        credentials = grpc.ssl_channel_credentials(
            root_certificates=read(args.cacert),
            private_key=read(args.key),
            certificate_chain=read(args.cert),
        )
    router = Router(endpoints, credentials=credentials)
    ns = b"py-test/%d/" % time.time_ns()  # this run's keys and lock names
    print(f"latchkey Python client test: endpoints {endpoints}, keys under {ns.decode()}")
    only = set(args.only.split(",")) if args.only else None
    failed = []
    for name, section in SECTIONS:
        if only and name not in only:
            continue
        started = time.monotonic()
        try:
            section(router, ns)
        except Failure as e:
            failed.append(name)
            print(f"FAIL {name}: {e}")
        except grpc.RpcError as e:  # a call made without the Router
            failed.append(name)
            print(f"FAIL {name}: gRPC status {e.code().name}: {e.details()}")
        except Exception:
            failed.append(name)
            print(f"FAIL {name}: unexpected exception:\n{traceback.format_exc()}")
        else:
            print(f"ok   {name} ({time.monotonic() - started:.1f} s)")
    ran = len(SECTIONS) if not only else len(only)
    print(f"{ran - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
