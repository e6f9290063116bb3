"""Retry-safe writes: a key-value write tagged with a session and a
request id (the API's ``Once``), resent with the same tag until it is
answered, so a lost answer (a leader killed mid-write, a timed-out attempt)
is not an unknown outcome: the replicas answer a request they applied
already with its first outcome, revision included, and change nothing.

The client opens a session of its own for this on its first write (TTL
30 s, kept alive by its thread) and opens another when it is lost. The
outcome can still be unknown (:class:`OutcomeUnknown`) when no replica
answered within the client's patience after an attempt that may have been
applied, when the session ended or forgot the request before a resend
arrived, or when a resend was refused.
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


class Writer:
    """The session a client tags its key-value writes with."""

    def __init__(self, router: Router):
        self._router = router
        self._session: Optional[Session] = None
        self._lock = threading.Lock()

    def _live(self) -> Session:
        with self._lock:
            if self._session is None or self._session.lost:
                self._session = Session(self._router, WRITER_TTL, "latchkey python writes")
            return self._session

    def call(self, method: str, request: Any) -> Any:
        """``Kv.method(request)``, tagged and resent until answered."""
        session = self._live()
        request.once.CopyFrom(
            pb.Once(
                session=session.id,
                session_secret=session.secret,
                request_id=session.next_request_id(),
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

    def close(self) -> None:
        with self._lock:
            session, self._session = self._session, None
        if session is not None:
            try:
                session.close()
            except LatchkeyError:
                pass  # it expires by itself
