"""latchkey: the Python client of a latchkey cluster.

A linearizable key-value store, and on it sessions with leases, locks with
fencing tokens, shared locks and semaphores, waited for in FIFO order
without polling::

    import latchkey

    with latchkey.Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as c:
        with c.session(ttl=10) as s, s.lock("reports/nightly") as guard:
            guard.put("reports/nightly/owner", "host-a")   # refused once the lock is lost

What it must not do: hold state beyond what its sessions need, or resend a
write that could apply twice (an untagged write whose outcome is unknown
raises :class:`OutcomeUnknown`; key-value writes are tagged, see
:mod:`latchkey.writer`).
"""

from latchkey.client import Client, SessionListing
from latchkey.election import Election, Leader, LeaderChange, LeaderStream, Leadership
from latchkey.errors import (
    Compacted,
    InvalidArgument,
    LatchkeyError,
    LockError,
    NotFound,
    OutcomeUnknown,
    PermissionDenied,
    SessionEnded,
    StaleFence,
    Unavailable,
)
from latchkey.kv import Delete, KeyValue, Put
from latchkey.lock import Guard, Lock, MultiGuard, MultiLock
from latchkey.session import Session
from latchkey.tls import Tls
from latchkey.watch import Changes, Event, Watch

__all__ = [
    "Changes",
    "Client",
    "Compacted",
    "Delete",
    "Election",
    "Event",
    "Guard",
    "InvalidArgument",
    "KeyValue",
    "Leader",
    "LeaderChange",
    "LeaderStream",
    "Leadership",
    "LatchkeyError",
    "Lock",
    "LockError",
    "MultiGuard",
    "MultiLock",
    "NotFound",
    "OutcomeUnknown",
    "PermissionDenied",
    "Put",
    "Session",
    "SessionEnded",
    "SessionListing",
    "StaleFence",
    "Tls",
    "Unavailable",
    "Watch",
]
