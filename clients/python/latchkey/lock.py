"""Locks, shared locks and semaphore permits of a session, and the guard
that proves a grant and fences writes with it.

Waiting is FIFO and without polling: an acquire that waits is held by the
replica until it is granted (up to 30 s a call, then asked again with the
same request id, which never grants twice). A grant's fencing token is
higher than every earlier grant's of the lock; fenced writes through the
guard are applied only while the grant is current, so a holder that lost
its lock (a pause, a partition) cannot overwrite its successor's work.
"""

import time
from typing import TYPE_CHECKING, Optional

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


class Lock:
    """A lock (or a semaphore) as seen from one session; acquire it with
    :meth:`acquire`, :meth:`try_acquire`, or ``with``."""

    def __init__(
        self,
        session: "Session",
        name: str,
        *,
        shared: bool = False,
        permits: Optional[int] = None,
        value: bytes = b"",
    ):
        self.session = session
        self.name = name
        self.shared = shared
        self.permits = permits
        self.value = value
        self._held: Optional[Guard] = None

    def _request(self, wait_ms: Optional[int], hold: float) -> "pb.AcquireRequest":
        s = self.session
        request = pb.AcquireRequest(
            session=s.id,
            session_secret=s.secret,
            owner=0,
            request_id=s.next_request_id(),
            name=self.name,
            mode=pb.LOCK_MODE_SHARED if self.shared else pb.LOCK_MODE_EXCLUSIVE,
            hold_ms=max(1, int(hold * 1000)),
            value=self.value,
        )
        if self.permits is not None:
            request.permits = self.permits
        if wait_ms is not None:
            request.wait_ms = wait_ms
        return request

    def try_acquire(self) -> Optional["Guard"]:
        """The grant if the lock is free for this session now, else
        ``None`` (never waits, never overtakes a waiter)."""
        self.session.check()
        request = self._request(None, HOLD)
        try:
            reply = self._call("Acquire", request, HOLD)
        except LatchkeyError as e:
            if e.kind == "ERROR_KIND_BUSY":
                return None
            raise
        return self._granted(reply.granted)

    def acquire(self, timeout: Optional[float] = None) -> Optional["Guard"]:
        """Wait in FIFO order for the grant; with ``timeout`` (seconds), at
        most that long: ``None`` if not granted by then (the wait is
        withdrawn). Raises :class:`SessionEnded` if the session is lost."""
        self.session.check()
        deadline = None if timeout is None else time.monotonic() + timeout
        wait_ms = FOREVER_MS if timeout is None else max(1, min(FOREVER_MS, int(timeout * 1000)))
        request = self._request(wait_ms, HOLD)
        while True:
            left = HOLD if deadline is None else max(0.0, deadline - time.monotonic())
            request.hold_ms = max(1, int(min(HOLD, left) * 1000))
            try:
                reply = self._call("Acquire", request, min(HOLD, left))
            except LatchkeyError as e:
                if e.kind in ("ERROR_KIND_WAIT_CANCELLED", "ERROR_KIND_BUSY"):
                    return None  # the server's wait ran out
                raise
            if reply.WhichOneof("result") == "granted":
                return self._granted(reply.granted)
            self.session.check()
            if deadline is not None and time.monotonic() >= deadline:
                return self._withdraw(request.request_id)
            if deadline is None and reply.WhichOneof("result") == "queued":
                continue

    def _withdraw(self, request_id: int) -> Optional["Guard"]:
        """Cancel the wait `request_id`; the grant if it came first."""
        s = self.session
        reply = self._call(
            "CancelWait",
            pb.CancelWaitRequest(
                session=s.id, session_secret=s.secret, owner=0, name=self.name, request_id=request_id
            ),
            HOLD,
        )
        if reply.WhichOneof("result") == "already_granted":
            return self._granted_sequencer(reply.already_granted)
        return None

    def _call(self, method: str, request: object, hold: float) -> object:
        router = self.session._router
        return router.call("Lock", method, request, idempotent=True, timeout=hold + router.timeout)

    def _granted(self, granted: "pb.Granted") -> "Guard":
        return self._granted_sequencer(granted.sequencer)

    def _granted_sequencer(self, sequencer: "pb.Sequencer") -> "Guard":
        self._held = Guard(self.session, sequencer)
        return self._held

    def __enter__(self) -> "Guard":
        guard = self.acquire()
        if guard is None:  # only with a timeout, which `with` never gives
            raise LatchkeyError(f"lock {self.name!r}: not granted")
        return guard

    def __exit__(self, *exc: object) -> None:
        guard, self._held = self._held, None
        if guard is not None:
            guard._exit(exc[0] is not None)


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
        """False once released or once the session is lost (then the lock
        may be someone else's: stop acting on it)."""
        return not self._released and not self.session.lost

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
