"""Fenced leader election: campaign, lead with a term that is a fencing
token, proclaim, resign; read and observe who leads.

An election ``NAME`` is the lock ``latchkey.election/NAME``: a campaign is
an exclusive acquire carrying the candidate's value, FIFO, without
polling; the leader's term is its grant's token, so writes fenced with it
are refused once a newer term began (no double-leader damage). The
cluster keeps the leader key ``latchkey.election/NAME`` in step with the
lock in the same log entry: its value is the term and session (u64
big-endian each), then the leader's value.
"""

import struct
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Optional, Tuple

from latchkey._proto import latchkey_pb2 as pb
from latchkey._router import Router
from latchkey.errors import Compacted, LatchkeyError, Unavailable
from latchkey.kv import Bytes, as_bytes
from latchkey.lock import Guard, Lock
from latchkey.watch import Watch

if TYPE_CHECKING:
    from latchkey.session import Session

#: What an election's lock (and leader key) is named after.
ELECTION_PREFIX = "latchkey.election/"


@dataclass(frozen=True)
class Leader:
    """Who leads: the ``term`` (its grant's fencing token), its
    ``session``, and the ``value`` it campaigned or last proclaimed with."""

    term: int
    session: int
    value: bytes

    @staticmethod
    def decode(election: str, data: bytes) -> "Leader":
        if len(data) < 16:
            raise LatchkeyError(
                f"the leader key of election {election!r} holds {len(data)} bytes, not a leader"
            )
        term, session = struct.unpack(">QQ", data[:16])
        return Leader(term, session, bytes(data[16:]))


def read_leader(router: Router, election: str) -> Tuple[Optional[Leader], int]:
    """Who leads ``election`` now (a linearizable read), and the revision
    the read saw."""
    key = (ELECTION_PREFIX + election).encode()
    reply = router.call("Kv", "Get", pb.GetRequest(key=key), idempotent=True)
    leader = Leader.decode(election, reply.kv.value) if reply.HasField("kv") else None
    return leader, reply.revision


class Leadership:
    """A won campaign: the ``term`` and the grant behind it. Fenced writes
    through it (``put``, ``delete``) are refused once the term is over."""

    def __init__(self, election: str, guard: Guard):
        self.election = election
        self.guard = guard

    @property
    def term(self) -> int:
        """The term: higher than every earlier term of this election."""
        return self.guard.token

    @property
    def held(self) -> bool:
        """False once resigned or once the session is lost."""
        return self.guard.held

    def put(self, key: Bytes, value: Bytes) -> int:
        """Put ``key`` only while this term lasts; the revision."""
        return self.guard.put(key, value)

    def delete(self, key: Bytes) -> int:
        """Delete ``key`` only while this term lasts; the revision."""
        return self.guard.delete(key)

    def proclaim(self, value: Bytes) -> None:
        """Tell observers a new value; the term stays. Refused
        (:class:`LockError`) once the term is over."""
        s = self.guard.session
        request = pb.ProclaimRequest(
            session=s.id,
            session_secret=s.secret,
            owner=self.guard.owner,
            name=self.guard.name,
            term=self.term,
            value=as_bytes(value),
        )
        # The same value twice leaves the same state: safe to resend.
        s._router.call("Lock", "Proclaim", request, idempotent=True)

    def resign(self) -> None:
        """Stop leading: the next candidate leads in the same log entry."""
        self.guard.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: object) -> None:
        self.guard._exit(exc[0] is not None)

    def __repr__(self) -> str:
        return f"Leadership(election={self.election!r}, term={self.term})"


class Election:
    """A candidacy in an election, from one session; see
    :meth:`Session.election`."""

    def __init__(self, session: "Session", name: str):
        self.session = session
        self.name = name

    def campaign(self, value: Bytes, timeout: Optional[float] = None) -> Optional[Leadership]:
        """Wait in FIFO order to lead, with ``value`` (at most 1,024 bytes:
        what observers are told); with ``timeout``, at most that long
        (``None`` if another still leads then; the candidacy is withdrawn)."""
        lock = Lock(self.session, ELECTION_PREFIX + self.name, value=as_bytes(value))
        guard = lock.acquire(timeout)
        return Leadership(self.name, guard) if guard is not None else None

    def leader(self) -> Optional[Leader]:
        """Who leads now (a linearizable read)."""
        return read_leader(self.session._router, self.name)[0]


@dataclass(frozen=True)
class LeaderChange:
    """Who leads from ``revision`` on (``None``: nobody). ``skipped``: the
    observer fell behind the cluster's history and read the leader again,
    so terms in between may be missing."""

    revision: int
    leader: Optional[Leader]
    skipped: bool = False


class LeaderStream:
    """Who leads an election now, then every change, each term once with
    its latest value; see :meth:`Client.observe`. Resumes across replica
    failures like a :class:`Watch`; :meth:`close` ends it."""

    def __init__(self, router: Router, election: str):
        self._router = router
        self._election = election
        self._watch: Optional[Watch] = None
        self._last: Optional[Tuple[Optional[Leader]]] = None
        self._gap = False
        self._pending: "list[LeaderChange]" = []
        self._closed = False

    def __iter__(self) -> Iterator[LeaderChange]:
        return self

    def close(self) -> None:
        self._closed = True
        if self._watch is not None:
            self._watch.close()

    def __enter__(self) -> "LeaderStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _note(self, revision: int, leader: Optional[Leader]) -> None:
        if self._last == (leader,):
            # The same grant (terms only grow): no term can be missing.
            self._gap = False
        else:
            self._last = (leader,)
            skipped, self._gap = self._gap, False
            self._pending.append(LeaderChange(revision, leader, skipped))

    def __next__(self) -> LeaderChange:
        key = (ELECTION_PREFIX + self._election).encode()
        while True:
            if self._pending:
                return self._pending.pop(0)
            if self._closed:
                raise StopIteration
            if self._watch is None:
                leader, revision = read_leader(self._router, self._election)
                self._note(revision, leader)
                self._watch = Watch(
                    self._router, pb.WatchRequest(key=key, start_revision=revision + 1)
                )
                continue
            try:
                changes = next(self._watch)
            except Compacted:
                self._watch = None
                self._gap = True
                continue
            except Unavailable:
                time.sleep(0.05)
                raise
            except LatchkeyError:
                self.close()  # reported once; the stream is over
                raise
            for e in changes.events:
                if e.key == key:
                    leader = Leader.decode(self._election, e.kv.value) if e.kv else None
                    self._note(changes.revision, leader)
