"""The client: a cluster's keys and values, and the sessions that hold
locks. See the package's README for a tour."""

from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence, Tuple, Union

from latchkey._proto import latchkey_pb2 as pb
from latchkey._router import Router
from latchkey.election import Leader, LeaderStream, read_leader
from latchkey.kv import Bytes, Delete, KeyValue, Put, as_bytes, conditions, put_op
from latchkey.session import Session
from latchkey.tls import Tls
from latchkey.watch import Watch
from latchkey.writer import Writer

#: Entries per scan page unless told otherwise (the server allows 10,000).
SCAN_PAGE = 1000


@dataclass(frozen=True)
class SessionListing:
    """A live session as operators see it: who opened it (``name``), its
    TTL and the time it has left on the leader's countdown (``None`` when a
    follower answered), the grants it holds (``(lock, token)``), the locks
    it waits for, its bound keys, and how many grants operators forced."""

    session: int
    name: str
    ttl_ms: int
    left_ms: Optional[int]
    held: "list[tuple[str, int]]"
    waiting: "list[str]"
    keys: int
    forced: int

    @staticmethod
    def of(s: "pb.SessionListing") -> "SessionListing":
        return SessionListing(
            session=s.session,
            name=s.name,
            ttl_ms=s.ttl_ms,
            left_ms=s.left_ms if s.HasField("left_ms") else None,
            held=[(h.name, h.token) for h in s.held],
            waiting=list(s.waiting),
            keys=s.keys,
            forced=s.forced,
        )


class Client:
    """A client of one latchkey cluster.

    ``endpoints`` are its replicas (``host:port``); calls go to the leader
    and follow it across elections. ``tls`` trusts a CA (and presents a
    client certificate), ``credentials`` is a ``(user, password)`` pair
    when access control is on; ``cluster_secret`` (the content of the
    replicas' ``--cluster-secret-file``) lets an operator end sessions and
    force releases while access control is off. A call retries what is safe to retry for
    at most ``patience`` seconds, each attempt bounded by ``timeout``.

    Key-value writes are retry-safe (``retry_safe=True``, the default):
    each is tagged with a request id under a session the client opens for
    its writes, and resent until answered, so a leader killed mid-write
    does not leave it unknown and a resend never applies twice (see
    :mod:`latchkey.writer`). With ``retry_safe=False`` writes are sent
    without the session and raise :class:`OutcomeUnknown` when their
    outcome is unknown. Reads and lock calls are always retried.

    >>> with Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as c:
    ...     c.put("config/mode", "active")
    ...     c.get("config/mode")
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        tls: Optional[Tls] = None,
        credentials: Optional[Tuple[str, str]] = None,
        cluster_secret: Optional[str] = None,
        patience: float = 30.0,
        timeout: float = 10.0,
        retry_safe: bool = True,
    ):
        self._router = Router(
            endpoints,
            tls.credentials() if tls is not None else None,
            credentials,
            patience,
            timeout,
            cluster_secret,
        )
        self._writer = Writer(self._router) if retry_safe else None

    def close(self) -> None:
        """Close the connections (sessions opened from it stop renewing)."""
        if self._writer is not None:
            self._writer.close()
        self._router.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, method: str, request: object) -> object:
        return self._router.call("Kv", method, request, idempotent=True)

    def _write(self, method: str, request: object) -> object:
        if self._writer is not None:
            return self._writer.call(method, request)
        return self._router.call("Kv", method, request, idempotent=False)

    # -- reads ---------------------------------------------------------------

    def get(self, key: Bytes, *, stale: bool = False) -> Optional[bytes]:
        """The value of ``key``, or ``None``. Linearizable unless ``stale``
        (any replica answers from its own state, possibly behind)."""
        kv = self.get_kv(key, stale=stale)
        return kv.value if kv is not None else None

    def get_kv(self, key: Bytes, *, stale: bool = False) -> Optional[KeyValue]:
        """``key`` with its revisions, or ``None``."""
        reply = self._read("Get", pb.GetRequest(key=as_bytes(key), stale=stale))
        return KeyValue.of(reply.kv) if reply.HasField("kv") else None

    def scan(
        self,
        prefix: Bytes = b"",
        *,
        start: Optional[Bytes] = None,
        end: Optional[Bytes] = None,
        page: int = SCAN_PAGE,
        stale: bool = False,
    ) -> Iterator[KeyValue]:
        """Every key under ``prefix`` (and from ``start``, before ``end``),
        in key order, fetched ``page`` entries at a time. Each page is a
        linearizable read of its own: the whole is not one snapshot."""
        if not 1 <= page <= 10_000:
            raise ValueError("latchkey: a scan page holds 1 to 10,000 entries")
        after = as_bytes(start) if start is not None else b""
        while True:
            request = pb.ScanRequest(start=after, prefix=as_bytes(prefix), limit=page, stale=stale)
            if end is not None:
                request.end = as_bytes(end)
            reply = self._read("Scan", request)
            for kv in reply.entries:
                yield KeyValue.of(kv)
            if not reply.more or not reply.entries:
                return
            # The smallest key after the last one.
            after = reply.entries[-1].key + b"\x00"

    # -- writes --------------------------------------------------------------

    def put(self, key: Bytes, value: Bytes) -> int:
        """Set ``key`` to ``value``; the revision of the write."""
        reply = self._write("Put", pb.PutRequest(key=as_bytes(key), value=as_bytes(value)))
        return reply.revision

    def compare_and_put(self, key: Bytes, expected: Optional[Bytes], value: Bytes) -> bool:
        """Set ``key`` to ``value`` only if it holds ``expected`` (``None``:
        only if it is absent). True if it was written."""
        (condition,) = conditions({key: expected})
        request = pb.CompareAndPutRequest(key=condition.key, test=condition.test, value=as_bytes(value))
        return self._write("CompareAndPut", request).succeeded

    def delete(self, key: Bytes) -> bool:
        """Remove ``key``; True if it existed."""
        return self._write("Delete", pb.DeleteRequest(key=as_bytes(key))).deleted > 0

    def batch(
        self,
        ops: Sequence[Union[Put, Delete]],
        *,
        expect: Mapping[Bytes, Optional[Bytes]] = {},
    ) -> bool:
        """Apply every one of ``ops`` in one step, if every key of
        ``expect`` holds its value (``None``: is absent). False, writing
        nothing, when a condition fails."""
        request = pb.BatchRequest(conditions=conditions(expect), ops=[put_op(o) for o in ops])
        reply = self._write("Batch", request)
        return not reply.HasField("failed_condition")

    def next_sequence(self, key: Bytes, step: int = 1) -> range:
        """The next ``step`` numbers of the sequence ``key``: never handed
        out twice, increasing."""
        reply = self._write("NextSequence", pb.NextSequenceRequest(key=as_bytes(key), step=step))
        return range(reply.start, reply.end)

    # -- watch and elections -------------------------------------------------

    def watch(
        self,
        *,
        key: Optional[Bytes] = None,
        prefix: Optional[Bytes] = None,
        start: Optional[Bytes] = None,
        end: Optional[Bytes] = None,
        start_revision: int = 0,
        prev_value: bool = False,
    ) -> Watch:
        """Every change of ``key``, of the keys under ``prefix``, or of the
        keys in [``start``, ``end``) (exactly one of the three), from
        ``start_revision`` on (0: changes after the watch is in place), as
        an iterator of :class:`Changes` that resumes at another replica
        when one fails. With ``prev_value``, each event has the key before
        the change."""
        chosen = [x is not None for x in (key, prefix, start)]
        if sum(chosen) != 1 or (end is not None and start is None):
            raise ValueError("latchkey: watch one key=, prefix= or start= (with an optional end=)")
        request = pb.WatchRequest(start_revision=start_revision, prev_value=prev_value)
        if key is not None:
            request.key = as_bytes(key)
        elif prefix is not None:
            request.prefix = as_bytes(prefix)
        else:
            request.range.start = as_bytes(start)
            if end is not None:
                request.range.end = as_bytes(end)
        return Watch(self._router, request)

    def leader(self, election: str) -> Optional[Leader]:
        """Who leads ``election`` now (a linearizable read)."""
        return read_leader(self._router, election)[0]

    def observe(self, election: str) -> LeaderStream:
        """Who leads ``election`` now, then every change (etcd's Observe)."""
        return LeaderStream(self._router, election)

    # -- operators -----------------------------------------------------------

    def sessions(self) -> "list[SessionListing]":
        """Every live session, in id order, with what it holds and waits for
        (``latchkey sessions``); pages through them all. Needs the admin
        permission while access control is on."""
        out: "list[SessionListing]" = []
        after: Optional[int] = None
        while True:
            request = pb.ListSessionsRequest(limit=100)
            if after is not None:
                request.start_after = after
            reply = self._router.call("Lock", "ListSessions", request, idempotent=True)
            out.extend(SessionListing.of(s) for s in reply.sessions)
            if not reply.more or not reply.sessions:
                return out
            after = reply.sessions[-1].session

    def end_session(self, session: int) -> None:
        """End a session as an operator (its grants are released, each lock
        kept in lock-delay for at least the session's TTL). Admin only."""
        request = pb.EndSessionRequest(session=session)
        self._router.call("Lock", "EndSession", request, idempotent=False)

    def force_release(self, name: str, token: int) -> bool:
        """Release the grant ``token`` of lock ``name`` as an operator; its
        holder's client learns it lost the grant at its next keep-alive,
        and the next grant takes a higher token. True if it was still held
        (resending is safe: by token). Admin only."""
        request = pb.ForceReleaseRequest(name=name, token=token)
        reply = self._router.call("Lock", "ForceRelease", request, idempotent=True)
        return len(reply.released) > 0

    # -- sessions ------------------------------------------------------------

    def session(self, ttl: float = 10.0, *, name: str = "") -> Session:
        """Open a session that lives ``ttl`` seconds (3 to 600) past the last
        keep-alive the cluster received; a background thread keeps it
        alive. ``name`` is shown to operators (``latchkey sessions``)."""
        return Session(self._router, ttl, name)
