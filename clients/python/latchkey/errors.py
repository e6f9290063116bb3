"""The exceptions of the client, one per kind of answer a caller acts on.

Every reply of latchkey's API carries an ``Error`` message when a call
failed; :func:`from_reply` turns it into the matching exception, keeping
what the server said (``kind``, ``message``) and the fields that kind sets.
"""

from typing import Optional

from latchkey._proto import latchkey_pb2 as pb


class LatchkeyError(Exception):
    """Base class: every error this package raises.

    ``kind`` is the server's ``ErrorKind`` name (``"ERROR_KIND_BUSY"``...),
    or ``None`` for an error of the client itself (a transport failure).
    """

    def __init__(self, message: str, kind: Optional[str] = None):
        super().__init__(message)
        self.kind = kind


class Unavailable(LatchkeyError):
    """No replica could serve the call within the client's patience (no
    leader, no quorum, unreachable): nothing was executed. Try again later."""


class OutcomeUnknown(LatchkeyError):
    """A write was sent but its fate is unknown (the connection or the
    leader was lost before it was known to be committed). It may have been
    applied, now or later: read before writing again."""


class InvalidArgument(LatchkeyError):
    """The request is malformed or breaks a limit (key, value or name size,
    TTL range, a permit count...). Do not retry it as it is."""


class NotFound(LatchkeyError):
    """What the call names does not exist: an unknown session, a revision
    test on an absent key."""


class SessionEnded(LatchkeyError):
    """The session was closed or expired: its locks are gone. Open a new
    session."""

    def __init__(self, message: str, kind: Optional[str] = None, session: int = 0):
        super().__init__(message, kind)
        self.session = session


class StaleFence(LatchkeyError):
    """A fenced write whose token is no longer the lock's current grant:
    nothing was written, and the writer has lost the lock. ``current`` is
    the current holder's token (``None``: nobody holds it)."""

    def __init__(
        self,
        message: str,
        kind: Optional[str] = None,
        name: str = "",
        token: int = 0,
        current: Optional[int] = None,
    ):
        super().__init__(message, kind)
        self.name = name
        self.token = token
        self.current = current


class LockError(LatchkeyError):
    """A lock call was refused: not the holder, a stale token, the queue is
    full, the permit count differs from the semaphore's... ``name`` is the
    lock."""

    def __init__(self, message: str, kind: Optional[str] = None, name: str = ""):
        super().__init__(message, kind)
        self.name = name


class Compacted(LatchkeyError):
    """A watch (or an observation) asked for revisions the cluster's
    history no longer holds (``oldest`` is the oldest it keeps): read the
    keys again and watch from the revision that read saw plus one."""

    def __init__(self, message: str, kind: Optional[str] = None, oldest: int = 0):
        super().__init__(message, kind)
        self.oldest = oldest


class PermissionDenied(LatchkeyError):
    """Access control refused the call (no user, a wrong password, or a
    role that does not grant it). Nothing was done."""


def kind_name(kind: int) -> str:
    """The ``ErrorKind`` name of a number (the number itself if unknown)."""
    try:
        return pb.ErrorKind.Name(kind)
    except ValueError:
        return str(kind)


_NOT_FOUND = {"ERROR_KIND_UNKNOWN_SESSION", "ERROR_KIND_KEY_ABSENT"}
_INVALID = {
    "ERROR_KIND_INVALID_ARGUMENT",
    "ERROR_KIND_INVALID_LOCK_NAME",
    "ERROR_KIND_TTL_OUT_OF_RANGE",
    "ERROR_KIND_DURATION_OUT_OF_RANGE",
}
_DENIED = {
    "ERROR_KIND_PERMISSION_DENIED",
    "ERROR_KIND_AUTH_REQUIRED",
    "ERROR_KIND_WRONG_SESSION_SECRET",
}


def from_error(error: "pb.Error", what: str) -> LatchkeyError:
    """The exception for the ``Error`` message of a reply to ``what``."""
    kind = kind_name(error.kind)
    message = f"{what}: {error.message or kind}"
    if kind == "ERROR_KIND_STALE_FENCE":
        current = error.current_token if error.HasField("current_token") else None
        return StaleFence(message, kind, error.name, error.token, current)
    if kind == "ERROR_KIND_COMPACTED":
        return Compacted(message, kind, error.min)
    if kind == "ERROR_KIND_SESSION_ENDED":
        return SessionEnded(message, kind, error.session)
    if kind in _NOT_FOUND:
        return NotFound(message, kind)
    if kind in _INVALID:
        return InvalidArgument(message, kind)
    if kind in _DENIED:
        return PermissionDenied(message, kind)
    if kind in ("ERROR_KIND_UNAVAILABLE", "ERROR_KIND_NOT_LEADER"):
        return Unavailable(message, kind)
    if kind == "ERROR_KIND_UNKNOWN_OUTCOME":
        return OutcomeUnknown(message, kind)
    if error.name:
        return LockError(message, kind, error.name)
    return LatchkeyError(message, kind)
