"""Sessions: a lease the cluster keeps while keep-alives arrive, and the
thread that sends them.

A session lives ``ttl`` seconds past the last keep-alive the leader
received. The thread sends one every ``ttl/3``. Two states follow from the
last keep-alive acknowledged (counted from when it was *sent*, so the
client's view is never later than the cluster's):

- **at risk** (Chubby's jeopardy, Curator's SUSPENDED): two thirds of the
  TTL passed since then, i.e. keep-alives have failed for a third of the
  TTL. Cleared when one succeeds again.
- **lost**: the whole TTL passed, or the cluster said the session ended.
  Final: its locks may already be someone else's.
"""

import itertools
import threading
import time
from typing import Optional

from latchkey._proto import latchkey_pb2 as pb
from latchkey._router import Router
from latchkey.errors import LatchkeyError, SessionEnded
from latchkey.election import Election
from latchkey.lock import Lock, MultiLock


class Session:
    """A session of the cluster; open it with :meth:`Client.session`.

    Use it as a context manager to close it (releasing its locks) at the
    end of the block::

        with client.session(ttl=10) as s:
            with s.lock("jobs/nightly") as guard:
                guard.put("jobs/nightly/owner", "host-a")
    """

    def __init__(self, router: Router, ttl: float, name: str = ""):
        if not 3 <= ttl <= 600:
            raise ValueError("latchkey: a session's TTL is 3 to 600 seconds")
        self._router = router
        self.ttl = ttl
        sent = time.monotonic()
        request = pb.OpenSessionRequest(ttl_ms=int(ttl * 1000), name=name)
        # Not retried on an unknown outcome: a lost answer leaves at most a
        # session nobody keeps alive, which expires by itself.
        reply = router.call("Lock", "OpenSession", request, idempotent=False)
        self.id: int = reply.session
        self.secret: bytes = reply.secret
        self._request_ids = itertools.count(1)
        self._owners = itertools.count(1)
        self._ids_lock = threading.Lock()
        self._state = threading.Condition()
        self._last_ack = sent
        self._ended: Optional[str] = None
        self._closed = False
        # Grants an operator force-released, as keep-alive answers tell:
        # how many were counted, their tokens, or every grant when more
        # were forced than an answer lists.
        self._forced_seen = 0
        self._revoked: "set[int]" = set()
        self._all_revoked = False
        self._thread = threading.Thread(
            target=self._keep_alive, name=f"latchkey-keepalive-{self.id}", daemon=True
        )
        self._thread.start()

    # -- state ---------------------------------------------------------------

    @property
    def lost(self) -> bool:
        """True once the session may have ended: the cluster said so, or a
        whole TTL passed without an acknowledged keep-alive. Final."""
        with self._state:
            return self._lost_locked()

    def _lost_locked(self) -> bool:
        if self._ended is None and time.monotonic() - self._last_ack >= self.ttl:
            self._ended = f"no keep-alive acknowledged for the whole TTL ({self.ttl} s)"
        return self._ended is not None

    @property
    def at_risk(self) -> bool:
        """True while keep-alives have failed for a third of the TTL (two
        thirds of it passed since the last acknowledged one), and not lost."""
        with self._state:
            if self._lost_locked():
                return False
            return time.monotonic() - self._last_ack >= self.ttl * 2 / 3

    def check(self) -> None:
        """Raise :class:`SessionEnded` if the session is lost."""
        with self._state:
            if self._lost_locked():
                raise SessionEnded(f"session {self.id}: {self._ended}", None, self.id)

    def is_revoked(self, token: int) -> bool:
        """True if an operator force-released the grant ``token`` of this
        session (``latchkey locks release --force``), as the last
        keep-alive answer said: the grant is lost though the session lives."""
        with self._state:
            return self._all_revoked or token in self._revoked

    def _note_forced(self, total: int, recent: "list[int]") -> None:
        with self._state:
            new = total - self._forced_seen
            if new <= 0:
                return
            if new > len(recent):
                self._all_revoked = True  # cannot tell which: all are lost
            self._revoked.update(recent[len(recent) - min(new, len(recent)) :])
            self._forced_seen = total

    def next_request_id(self) -> int:
        """Unique and increasing within the session (lock calls use them)."""
        with self._ids_lock:
            return next(self._request_ids)

    def next_owner(self) -> int:
        """A holder id of its own within the session: each acquire is one."""
        with self._ids_lock:
            return next(self._owners)

    # -- keep-alive ----------------------------------------------------------

    def _keep_alive(self) -> None:
        every = self.ttl / 3
        request = pb.KeepAliveRequest(session=self.id, session_secret=self.secret)
        pause = every
        while True:
            with self._state:
                self._state.wait_for(lambda: self._closed, timeout=pause)
                if self._closed or self._lost_locked():
                    return
            # After a failure, try again soon (the router paces its own
            # retries): every moment without an acknowledgement counts.
            pause = min(0.2, every)
            sent = time.monotonic()
            try:
                reply = self._router.call(
                    "Lock", "KeepAlive", request, idempotent=True, timeout=every, patience=every
                )
            except SessionEnded as e:
                with self._state:
                    self._ended = str(e)
                return
            except LatchkeyError:
                if self._router.closed:
                    return  # the client was closed: nobody renews any more
                continue  # at risk, then lost, as time passes
            self._note_forced(reply.forced_total, list(reply.forced))
            with self._state:
                self._last_ack = max(self._last_ack, sent)
            pause = every

    # -- locks ---------------------------------------------------------------

    def lock(self, name: str, *, shared: bool = False) -> Lock:
        """The lock ``name`` (1 to 256 bytes of UTF-8) from this session:
        exclusive, or ``shared`` with other shared holders."""
        return Lock(self, name, shared=shared)

    def lock_all(self, names: "list[str]", *, shared: bool = False) -> MultiLock:
        """The locks ``names`` (2 to 32, distinct), granted all in one step
        or none: a waiting multi-lock holds none of them, so multi-locks
        naming the same locks in any order cannot deadlock each other."""
        return MultiLock(self, names, shared=shared)

    def semaphore(self, name: str, permits: int) -> Lock:
        """A semaphore of ``permits`` permits (1 to 1,024) named ``name``:
        each acquire takes one permit, with a fencing token of its own. Every
        user of the name must give the same count."""
        if not 1 <= permits <= 1024:
            raise ValueError("latchkey: a semaphore has 1 to 1,024 permits")
        return Lock(self, name, shared=True, permits=permits)

    def election(self, name: str) -> Election:
        """A candidacy in the election ``name`` from this session."""
        return Election(self, name)

    # -- closing -------------------------------------------------------------

    def close(self) -> None:
        """End the session now: its locks are released and its waits
        cancelled. Closing a lost session does nothing."""
        with self._state:
            already = self._closed
            self._closed = True
            self._state.notify_all()
        if already:
            return
        self._thread.join(timeout=self.ttl)
        if self.lost:
            return
        request = pb.CloseSessionRequest(session=self.id, session_secret=self.secret)
        try:
            self._router.call("Lock", "CloseSession", request, idempotent=True)
        except SessionEnded:
            pass
        with self._state:
            self._ended = "closed"

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self.id}, ttl={self.ttl})"
