"""Locks, shared locks, semaphore permits and multi-locks of a session, and
the guards that prove a grant and fence writes with it.

Waiting is FIFO and without polling: an acquire that waits is held by the
replica until it is granted (up to 30 s a call, then asked again with the
same request id, which never grants twice). A grant's fencing token is
higher than every earlier grant's of the lock; fenced writes through the
guard are applied only while the grant is current, so a holder that lost
its lock (a pause, a partition) cannot overwrite its successor's work.

Every acquire is a holder of its own (an owner id of its own within the
session), like ``threading.Lock``: two threads sharing a session exclude
each other, each permit of a semaphore is a separate grant, and a lock is
not re-entrant (acquiring it again from the same thread waits for itself).
An acquire that fails or is interrupted after its wait was queued withdraws
the wait, and releases a grant that came first: no lock is left held by an
acquire that did not return it.
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
# Answers that mean the server's wait ran out without a grant.
_WAIT_OVER = ("ERROR_KIND_WAIT_CANCELLED", "ERROR_KIND_BUSY")


class _Acquirable:
    """What a lock and a multi-lock share: FIFO waits held by the replica,
    asked again with the same request id while queued, withdrawn at the
    timeout or on failure (keeping a grant that came first only when it is
    returned). Subclasses say how to ask (``_method``, ``_request``), what
    a grant is (``_grant``), and under which name a wait is cancelled
    (``_wait_name``)."""

    _method = "Acquire"

    def __init__(self, session: "Session"):
        self.session = session
        # Grants taken by `with`, per thread, innermost last.
        self._with = threading.local()

    def _request(self, owner: int, wait_ms: Optional[int]) -> Any:
        raise NotImplementedError

    def _grant(self, owner: int, reply: Any) -> Any:
        raise NotImplementedError

    def _wait_name(self) -> str:
        raise NotImplementedError

    def try_acquire(self) -> Optional[Any]:
        """The grant if it is free for this session now, else ``None``
        (never waits, never overtakes a waiter)."""
        self.session.check()
        owner = self.session.next_owner()
        try:
            reply = self._call(self._method, self._request(owner, None), HOLD, None)
        except LatchkeyError as e:
            if e.kind == "ERROR_KIND_BUSY":
                return None
            raise
        return self._grant(owner, _granted(reply))

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
        owner = self.session.next_owner()
        deadline = None if timeout is None else time.monotonic() + timeout
        wait_ms = FOREVER_MS if timeout is None else max(1, min(FOREVER_MS, int(timeout * 1000)))
        # With a cancel event, the replica answers `queued` every second so
        # that the event is looked at; the same request id keeps the place.
        hold = HOLD if cancel is None else 1.0
        request = self._request(owner, wait_ms)
        try:
            while True:
                left = hold if deadline is None else max(0.0, deadline - time.monotonic())
                request.hold_ms = max(1, int(min(hold, left) * 1000))
                try:
                    reply = self._call(self._method, request, min(hold, left), deadline)
                except LatchkeyError as e:
                    if e.kind not in _WAIT_OVER:
                        raise
                    if deadline is not None:
                        return None  # the server's wait ran out with ours
                    # A day passed without a grant: queue again (at the back).
                    request = self._request(owner, wait_ms)
                    continue
                result = reply.WhichOneof("result")
                if result == "granted":
                    return self._grant(owner, _granted(reply))
                if result != "queued":
                    raise LatchkeyError(f"{self._method}: neither granted nor queued: {reply}")
                self.session.check()
                timed_out = deadline is not None and time.monotonic() >= deadline
                if timed_out or (cancel is not None and cancel.is_set()):
                    return self._withdraw(owner, request.request_id)
        except BaseException:
            # Failed or interrupted with a wait possibly queued: withdraw it
            # and release a grant that came first, so nothing stays held.
            self._abandon(owner, request.request_id)
            raise

    def _withdraw(self, owner: int, request_id: int) -> Optional[Any]:
        """Cancel the wait ``request_id``; the grant if it came first."""
        s = self.session
        request = pb.CancelWaitRequest(
            session=s.id,
            session_secret=s.secret,
            owner=owner,
            name=self._wait_name(),
            request_id=request_id,
        )
        reply = self._call("CancelWait", request, HOLD, None)
        result = reply.WhichOneof("result")
        if result == "already_granted":
            return self._grant(owner, pb.Sequencers(sequencers=[reply.already_granted]))
        if result == "already_granted_all":
            return self._grant(owner, reply.already_granted_all)
        return None

    def _abandon(self, owner: int, request_id: int) -> None:
        """Best effort, after a failed acquire: withdraw, release."""
        try:
            grant = self._withdraw(owner, request_id)
            if grant is not None:
                grant.release()
        except Exception:  # the session may be gone: then so is the wait
            pass

    def _call(self, method: str, request: object, hold: float, deadline: Optional[float]) -> Any:
        router = self.session._router
        # An acquire with a timeout retries only until its deadline.
        patience = None if deadline is None else max(1.0, deadline - time.monotonic())
        return router.call(
            "Lock",
            method,
            request,
            idempotent=True,
            timeout=hold + router.timeout,
            patience=patience,
        )

    def __enter__(self) -> Any:
        grant = self.acquire()
        if grant is None:  # only with a timeout or cancel, which `with` never gives
            raise LatchkeyError(f"{self._wait_name()!r}: not granted")
        stack = getattr(self._with, "grants", None)
        if stack is None:
            stack = self._with.grants = []
        stack.append(grant)
        return grant

    def __exit__(self, *exc: object) -> None:
        stack = getattr(self._with, "grants", None)
        if stack:
            stack.pop()._exit(exc[0] is not None)


def _granted(reply: Any) -> "pb.Sequencers":
    """The grants of a granted Acquire or AcquireAll reply, as a list."""
    granted = reply.granted
    if isinstance(granted, pb.Granted):
        return pb.Sequencers(sequencers=[granted.sequencer])
    return granted


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

    def _request(self, owner: int, wait_ms: Optional[int]) -> "pb.AcquireRequest":
        s = self.session
        request = pb.AcquireRequest(
            session=s.id,
            session_secret=s.secret,
            owner=owner,
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

    def _grant(self, owner: int, granted: "pb.Sequencers") -> "Guard":
        return Guard(self.session, owner, granted.sequencers[0])

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

    def _request(self, owner: int, wait_ms: Optional[int]) -> "pb.AcquireAllRequest":
        s = self.session
        request = pb.AcquireAllRequest(
            session=s.id,
            session_secret=s.secret,
            owner=owner,
            request_id=s.next_request_id(),
            names=self.names,
            mode=pb.LOCK_MODE_SHARED if self.shared else pb.LOCK_MODE_EXCLUSIVE,
        )
        if wait_ms is not None:
            request.wait_ms = wait_ms
        return request

    def _grant(self, owner: int, granted: "pb.Sequencers") -> "MultiGuard":
        guards = [Guard(self.session, owner, q) for q in granted.sequencers]
        return MultiGuard(self.session, owner, guards)

    def _wait_name(self) -> str:
        return self.names[0]


class Guard:
    """Proof of a grant: the lock's ``name``, its fencing ``token`` and the
    ``sequencer`` to hand to whoever checks it; fenced writes through it
    apply only while the grant is current."""

    def __init__(self, session: "Session", owner: int, sequencer: "pb.Sequencer"):
        self.session = session
        self.owner = owner
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
            owner=self.owner,
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

    def __init__(self, session: "Session", owner: int, guards: List[Guard]):
        self.session = session
        self.owner = owner
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
            owner=self.owner,
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
