"""Locks, shared locks and semaphore permits of a session, and the guard
that proves a grant and fences writes with it.

Waiting is FIFO and without polling: an acquire that waits is held by the
replica until it is granted (up to 30 s a call, then asked again with the
same request id, which never grants twice). A grant's fencing token is
higher than every earlier grant's of the lock; fenced writes through the
guard are applied only while the grant is current, so a holder that lost
its lock (a pause, a partition) cannot overwrite its successor's work.
"""

import threading
import time
from typing import TYPE_CHECKING, Any, List, Optional, Sequence

from latchkey._proto import latchkey_pb2 as pb
from latchkey.errors import LatchkeyError
from latchkey.kv import Bytes, Delete, Put, put_op

if TYPE_CHECKING:
    from latchkey.session import Session

#: How long one Acquire call may be held by the replica while it waits.
HOLD = 30.0
#: ``wait_ms`` of an acquire that waits as long as it takes (one day, the
#: most the server allows; the client asks again after it).
FOREVER_MS = 86_400_000


class _Acquirable:
    """What a lock and a multi-lock share: FIFO waits held by the replica,
    asked again with the same request id while queued, withdrawn at the
    timeout (keeping a grant that came first). Subclasses say how to ask
    (``_method``, ``_request``), what a grant is (``_grant``), and under
    which name a wait is cancelled (``_wait_name``)."""

    _method = "Acquire"

    def __init__(self, session: "Session"):
        self.session = session
        self._held: Optional[object] = None

    def _request(self, wait_ms: Optional[int]) -> Any:
        raise NotImplementedError

    def _grant(self, reply: Any) -> Any:
        raise NotImplementedError

    def _wait_name(self) -> str:
        raise NotImplementedError

    def try_acquire(self) -> Optional[Any]:
        """The grant if it is free for this session now, else ``None``
        (never waits, never overtakes a waiter)."""
        self.session.check()
        try:
            reply = self._call(self._method, self._request(None), HOLD)
        except LatchkeyError as e:
            if e.kind == "ERROR_KIND_BUSY":
                return None
            raise
        return self._keep(self._grant(reply.granted))

    def acquire(
        self, timeout: Optional[float] = None, *, cancel: Optional[threading.Event] = None
    ) -> Optional[Any]:
        """Wait in FIFO order for the grant; with ``timeout`` (seconds), at
        most that long: ``None`` if not granted by then (the wait is
        withdrawn). ``cancel``, set from another thread, withdraws the wait
        within about a second (``None`` then, unless the grant came first).
        Raises :class:`SessionEnded` if the session is lost."""
        if timeout is not None and timeout < 0:
            raise ValueError("latchkey: a timeout is not negative")
        self.session.check()
        deadline = None if timeout is None else time.monotonic() + timeout
        wait_ms = FOREVER_MS if timeout is None else max(1, min(FOREVER_MS, int(timeout * 1000)))
        request = self._request(wait_ms)
        # With a cancel event, the replica answers `queued` every second so
        # that the event is looked at; the same request id keeps the place.
        hold = HOLD if cancel is None else 1.0
        while True:
            left = hold if deadline is None else max(0.0, deadline - time.monotonic())
            request.hold_ms = max(1, int(min(hold, left) * 1000))
            try:
                reply = self._call(self._method, request, min(hold, left))
            except LatchkeyError as e:
                if e.kind in ("ERROR_KIND_WAIT_CANCELLED", "ERROR_KIND_BUSY"):
                    return None  # the server's wait ran out
                raise
            if reply.WhichOneof("result") == "granted":
                return self._keep(self._grant(reply.granted))
            self.session.check()
            timed_out = deadline is not None and time.monotonic() >= deadline
            if timed_out or (cancel is not None and cancel.is_set()):
                return self._withdraw(request.request_id)

    def _withdraw(self, request_id: int) -> Optional[Any]:
        """Cancel the wait ``request_id``; the grant if it came first."""
        s = self.session
        request = pb.CancelWaitRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            name=self._wait_name(),
            request_id=request_id,
        )
        reply = self._call("CancelWait", request, HOLD)
        result = reply.WhichOneof("result")
        if result == "already_granted":
            return self._keep(self._grant(pb.Granted(sequencer=reply.already_granted)))
        if result == "already_granted_all":
            return self._keep(self._grant(reply.already_granted_all))
        return None

    def _call(self, method: str, request: object, hold: float) -> Any:
        router = self.session._router
        return router.call("Lock", method, request, idempotent=True, timeout=hold + router.timeout)

    def _keep(self, grant: Any) -> Any:
        self._held = grant
        return grant

    def __enter__(self) -> Any:
        grant = self.acquire()
        if grant is None:  # only with a timeout, which `with` never gives
            raise LatchkeyError(f"{self._wait_name()!r}: not granted")
        return grant

    def __exit__(self, *exc: object) -> None:
        grant, self._held = self._held, None
        if grant is not None:
            grant._exit(exc[0] is not None)


class Lock(_Acquirable):
    """A lock (or a semaphore) as seen from one session; acquire it with
    :meth:`acquire`, :meth:`try_acquire`, or ``with``. A grant is a
    :class:`Guard`."""

    def __init__(
        self,
        session: "Session",
        name: str,
        *,
        shared: bool = False,
        permits: Optional[int] = None,
        value: bytes = b"",
    ):
        super().__init__(session)
        self.name = name
        self.shared = shared
        self.permits = permits
        self.value = value

    def _request(self, wait_ms: Optional[int]) -> "pb.AcquireRequest":
        s = self.session
        request = pb.AcquireRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            request_id=s.next_request_id(),
            name=self.name,
            mode=pb.LOCK_MODE_SHARED if self.shared else pb.LOCK_MODE_EXCLUSIVE,
            value=self.value,
        )
        if self.permits is not None:
            request.permits = self.permits
        if wait_ms is not None:
            request.wait_ms = wait_ms
        return request

    def _grant(self, granted: "pb.Granted") -> "Guard":
        return Guard(self.session, granted.sequencer)

    def _wait_name(self) -> str:
        return self.name


class MultiLock(_Acquirable):
    """Several locks taken in one step or not at all; see
    :meth:`Session.lock_all`. A grant is a :class:`MultiGuard`."""

    _method = "AcquireAll"

    def __init__(self, session: "Session", names: Sequence[str], *, shared: bool = False):
        if not 2 <= len(names) <= 32 or len(set(names)) != len(names):
            raise ValueError("latchkey: a multi-lock takes 2 to 32 distinct lock names")
        super().__init__(session)
        self.names = list(names)
        self.shared = shared

    def _request(self, wait_ms: Optional[int]) -> "pb.AcquireAllRequest":
        s = self.session
        request = pb.AcquireAllRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            request_id=s.next_request_id(),
            names=self.names,
            mode=pb.LOCK_MODE_SHARED if self.shared else pb.LOCK_MODE_EXCLUSIVE,
        )
        if wait_ms is not None:
            request.wait_ms = wait_ms
        return request

    def _grant(self, granted: "pb.Sequencers") -> "MultiGuard":
        return MultiGuard(self.session, [Guard(self.session, q) for q in granted.sequencers])

    def _wait_name(self) -> str:
        return self.names[0]


class Guard:
    """Proof of a grant: the lock's ``name``, its fencing ``token`` and the
    ``sequencer`` to hand to whoever checks it; fenced writes through it
    apply only while the grant is current."""

    def __init__(self, session: "Session", sequencer: "pb.Sequencer"):
        self.session = session
        self.sequencer = sequencer
        self._released = False

    @property
    def name(self) -> str:
        return self.sequencer.name

    @property
    def token(self) -> int:
        """The fencing token: higher than every earlier grant's of the lock."""
        return self.sequencer.token

    @property
    def held(self) -> bool:
        """False once released, once the session is lost, or once an
        operator force-released this grant (then the lock may be someone
        else's: stop acting on it)."""
        return (
            not self._released
            and not self.session.lost
            and not self.session.is_revoked(self.token)
        )

    def _fenced(self, ops: "list[pb.BatchOp]") -> int:
        request = pb.FencedWriteRequest(
            sequencer=self.sequencer, session_secret=self.session.secret, ops=ops
        )
        # Not retried on an unknown outcome: a fenced write is a write.
        reply = self.session._router.call("Lock", "FencedWrite", request, idempotent=False)
        return reply.revision

    def put(self, key: Bytes, value: Bytes) -> int:
        """Put ``key`` only while this grant is current (else
        :class:`StaleFence`, writing nothing); the revision."""
        return self._fenced([put_op(Put(key, value))])

    def delete(self, key: Bytes) -> int:
        """Delete ``key`` only while this grant is current; the revision."""
        return self._fenced([put_op(Delete(key))])

    def release(self) -> None:
        """Give the lock up (the next waiter is granted in the same step).
        Releasing twice does nothing."""
        if self._released:
            return
        s = self.session
        request = pb.ReleaseRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            request_id=s.next_request_id(),
            name=self.name,
            token=self.token,
        )
        s._router.call("Lock", "Release", request, idempotent=True)
        self._released = True

    def _exit(self, failing: bool) -> None:
        """Release at the end of a ``with`` block; a lock already lost with
        its session is not an error then, unless nothing else failed."""
        try:
            self.release()
        except LatchkeyError:
            if not failing and not self.session.lost:
                raise

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit(exc[0] is not None)

    def __repr__(self) -> str:
        return f"Guard(name={self.name!r}, token={self.token})"


class MultiGuard:
    """The grants of a multi-lock, one :class:`Guard` per lock in the order
    named (each fences writes with its own token), released together."""

    def __init__(self, session: "Session", guards: List[Guard]):
        self.session = session
        self.guards = guards

    @property
    def tokens(self) -> List[int]:
        return [g.token for g in self.guards]

    @property
    def held(self) -> bool:
        return all(g.held for g in self.guards)

    def release(self) -> None:
        """Give every lock up in one step. Releasing twice does nothing."""
        live = [g for g in self.guards if not g._released]
        if not live:
            return
        s = self.session
        request = pb.ReleaseAllRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            request_id=s.next_request_id(),
            grants=[pb.HeldGrant(name=g.name, token=g.token) for g in live],
        )
        s._router.call("Lock", "ReleaseAll", request, idempotent=True)
        for g in live:
            g._released = True

    def _exit(self, failing: bool) -> None:
        try:
            self.release()
        except LatchkeyError:
            if not failing and not self.session.lost:
                raise

    def __enter__(self) -> "MultiGuard":
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit(exc[0] is not None)

    def __repr__(self) -> str:
        return f"MultiGuard({[(g.name, g.token) for g in self.guards]})"
