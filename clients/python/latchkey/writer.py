"""Retry-safe writes: a key-value write tagged with a session and a
request id (the API's ``Once``), resent with the same tag until it is
answered, so a lost answer (a leader killed mid-write, a timed-out attempt)
is not an unknown outcome: the replicas answer a request they applied
already with its first outcome, revision included, and change nothing.

The client opens a session of its own for this on its first write (TTL
30 s, kept alive by its thread) and opens another when it is lost. The
outcome can still be unknown (:class:`OutcomeUnknown`) when no replica
answered within the client's patience after an attempt that may have been
applied, when the session ended before a resend arrived, or when a resend
was refused. (A resend is never forgotten: see :class:`RequestWindow`.)
"""

import threading
from typing import Any, Optional

from latchkey._proto import latchkey_pb2 as pb
from latchkey._router import Router
from latchkey.errors import LatchkeyError, OutcomeUnknown, SessionEnded
from latchkey.session import Session

#: The writer session's TTL: how long the replicas remember its writes'
#: outcomes after the client last reached them.
WRITER_TTL = 30.0
# Answers to a resent write that do not say what an earlier attempt did.
_FORGOTTEN = ("ERROR_KIND_REQUEST_TOO_OLD", "ERROR_KIND_SESSION_ENDED")


#: How far past the oldest write in flight a new request id may be: half of
#: the 256 requests a session remembers.
WINDOW = 128


class RequestWindow:
    """The request ids of one session's writes, handed out in order and
    never :data:`WINDOW` or more past the oldest one still in flight.

    Bounding only how many writes run at once would not keep a resend
    inside the session's memory of its last 256 requests: one write held up
    on a leader that is stopping can lag hundreds that other threads send
    meanwhile through the new leader, and its resend would then be refused
    as forgotten, its outcome unknown. So a new id waits (at most as long
    as the held-up write takes) instead of pushing that write out.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._next = 1
        self._open: "set[int]" = set()

    def _room(self) -> bool:
        return not self._open or self._next - min(self._open) < WINDOW

    def take(self) -> int:
        """The next request id, once it is inside the window."""
        with self._cond:
            self._cond.wait_for(self._room)
            rid = self._next
            self._next += 1
            self._open.add(rid)
            return rid

    def done(self, rid: int) -> None:
        """The write ``rid`` is answered or given up."""
        with self._cond:
            self._open.discard(rid)
            self._cond.notify_all()


class Writer:
    """The session a client tags its key-value writes with."""

    def __init__(self, router: Router):
        self._router = router
        self._session: Optional[Session] = None
        self._window = RequestWindow()
        self._lock = threading.Lock()

    def _live(self) -> "tuple[Session, RequestWindow]":
        with self._lock:
            if self._session is None or self._session.lost:
                self._session = Session(self._router, WRITER_TTL, "latchkey python writes")
                self._window = RequestWindow()
            return self._session, self._window

    def call(self, method: str, request: Any) -> Any:
        """``Kv.method(request)``, tagged and resent until answered."""
        session, window = self._live()
        rid = window.take()
        request.once.CopyFrom(
            pb.Once(
                session=session.id,
                session_secret=session.secret,
                request_id=rid,
            )
        )
        try:
            return self._router.call("Kv", method, request, idempotent=True, write=True)
        except LatchkeyError as e:
            if e.kind in _FORGOTTEN:
                if isinstance(e, SessionEnded):
                    with self._lock:
                        self._session = None
                raise OutcomeUnknown(
                    f"Kv.{method}: the write's session ended or forgot it before a resend "
                    f"arrived; it may or may not have been applied ({e})",
                    e.kind,
                ) from None
            raise
        finally:
            window.done(rid)

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except LatchkeyError:
                pass  # it expires by itself
