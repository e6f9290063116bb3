"""Reaching the leader: one channel per replica, calls sent to the replica
believed to lead, redirected on ``NOT_LEADER``, retried elsewhere while
nothing was executed.

Writes and linearizable reads are answered by the leader only; any other
replica answers ``ERROR_KIND_NOT_LEADER`` with the leader's address (empty
while it knows none: try another replica). ``ERROR_KIND_UNAVAILABLE`` and a
replica that cannot be connected to are retried, elsewhere, with a growing
pause (50 ms doubling to 1 s), for at most the client's patience: a write
that gRPC failed before sending it (no connection) is retried like a read;
a write whose connection broke after it was sent raises
:class:`OutcomeUnknown`.

Channels send HTTP/2 keepalive pings every 5 s, so a replica that stopped
answering (paused, cut off) is noticed within about 10 s even by a watch
that waits quietly.
"""

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc

from latchkey._proto import latchkey_pb2 as pb
from latchkey._proto import latchkey_pb2_grpc as rpc
from latchkey.errors import OutcomeUnknown, PermissionDenied, Unavailable, from_error

# gRPC status codes after which a call may or may not have been executed,
# and that another replica may well answer.
_TRANSPORT_RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
# Refusals of the caller by the transport: nothing was executed.
_REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
# Redirects followed without a pause before pausing anyway (two replicas
# naming each other while an election settles).
_FREE_REDIRECTS = 3


def _never_sent(e: grpc.RpcError) -> bool:
    """True when gRPC failed the call before sending it: the channel could
    not connect (its status details say so; grpc-core words them
    "failed to connect to all addresses")."""
    return e.code() == grpc.StatusCode.UNAVAILABLE and "failed to connect" in (e.details() or "")


def error_of(reply: Any) -> Optional["pb.Error"]:
    """The reply's error, or None: every latchkey reply has an ``error``."""
    return reply.error if reply.HasField("error") else None


class Router:
    """Sends calls to the leader of a cluster, given its replicas."""

    def __init__(
        self,
        endpoints: Sequence[str],
        credentials: Optional[grpc.ChannelCredentials],
        user: Optional[Tuple[str, str]],
        patience: float,
        timeout: float,
        cluster_secret: Optional[str] = None,
    ):
        if not endpoints:
            raise ValueError("latchkey: a client needs at least one endpoint (host:port)")
        self.endpoints: List[str] = list(endpoints)
        self.credentials = credentials
        metadata = []
        if user:
            metadata += [("latchkey-user", user[0]), ("latchkey-password", user[1])]
        if cluster_secret:
            metadata.append(("latchkey-cluster-secret", cluster_secret.strip()))
        self.metadata = metadata or None
        self.patience = patience
        self.timeout = timeout
        self.leader = self.endpoints[0]  # a guess, corrected by NOT_LEADER
        self._channels: Dict[str, grpc.Channel] = {}
        # Calls in flight, and whether the router is closed: channels are
        # closed only once no call uses them (grpcio must never be handed a
        # closed channel).
        self._state = threading.Condition()
        self._in_flight = 0
        self.closed = False

    def channel(self, addr: str) -> grpc.Channel:
        """The channel to ``addr`` (made on first use). Raises
        :class:`Unavailable` once the router is closed."""
        with self._state:
            if self.closed:
                raise Unavailable("latchkey: the client is closed")
            if addr not in self._channels:
                options = [
                    # Values go up to 1 MiB and scan pages further: lift
                    # grpcio's 4 MiB receive limit to the server's 64 MiB.
                    ("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.keepalive_time_ms", 5000),
                    ("grpc.keepalive_timeout_ms", 5000),
                    ("grpc.keepalive_permit_without_calls", 1),
                ]
                if self.credentials is not None:
                    channel = grpc.secure_channel(addr, self.credentials, options)
                else:
                    channel = grpc.insecure_channel(addr, options=options)
                self._channels[addr] = channel
            return self._channels[addr]

    def enter(self) -> None:
        """Count a call (or stream) in flight; refused once closed."""
        with self._state:
            if self.closed:
                raise Unavailable("latchkey: the client is closed")
            self._in_flight += 1

    def leave(self) -> None:
        with self._state:
            self._in_flight -= 1
            self._state.notify_all()

    def close(self) -> None:
        """Refuse new calls, wait (up to the call timeout) for those in
        flight, then close every channel."""
        with self._state:
            self.closed = True
            self._state.wait_for(lambda: self._in_flight == 0, timeout=self.timeout + 1)
            channels, self._channels = list(self._channels.values()), {}
        for c in channels:
            c.close()

    def next_endpoint(self, addr: str) -> str:
        i = self.endpoints.index(addr) if addr in self.endpoints else -1
        return self.endpoints[(i + 1) % len(self.endpoints)]

    def call(
        self,
        service: str,
        method: str,
        request: Any,
        *,
        idempotent: bool,
        timeout: Optional[float] = None,
        patience: Optional[float] = None,
        write: bool = False,
    ) -> Any:
        """The leader's successful reply to ``service.method(request)``.

        Retries ``NOT_LEADER``, ``UNAVAILABLE`` and unreachable replicas
        (nothing was executed). A broken connection after sending, a gRPC
        failure, or ``UNKNOWN_OUTCOME`` leave a write's outcome unknown:
        retried only when ``idempotent`` (reads, and lock calls, which are
        idempotent by request id), else raised as :class:`OutcomeUnknown`.
        Any other error is raised as its exception (see
        :mod:`latchkey.errors`). A ``write`` resent as idempotent (tagged
        with a request id) that gives up after an attempt that may have
        been applied raises :class:`OutcomeUnknown`, not
        :class:`Unavailable`.
        """
        what = f"{service}.{method}"
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + (self.patience if patience is None else patience)
        pause = 0.05
        redirects = 0
        maybe_applied = False  # an attempt failed after it may have been sent
        while True:
            addr = self.leader
            redirected = False
            self.enter()
            try:
                stub = getattr(rpc, service + "Stub")(self.channel(addr))
                reply = getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
            except grpc.RpcError as e:
                code = e.code()
                last = f"{addr}: gRPC status {code.name}: {e.details()}"
                self.leader = self.next_endpoint(addr)
                if code in _REFUSED:
                    raise PermissionDenied(f"{what}: {last}") from None
                if not _never_sent(e):
                    maybe_applied = True
                    if not idempotent:
                        raise OutcomeUnknown(f"{what}: {last}") from None
                if code not in _TRANSPORT_RETRY:
                    raise Unavailable(f"{what}: {last}") from None
            else:
                error = error_of(reply)
                if error is None:
                    return reply
                last = f"{addr}: {error.message}"
                if error.kind == pb.ERROR_KIND_NOT_LEADER:
                    redirected = bool(error.leader_addr) and error.leader_addr != addr
                    self.leader = error.leader_addr if redirected else self.next_endpoint(addr)
                elif error.kind == pb.ERROR_KIND_UNAVAILABLE:
                    self.leader = self.next_endpoint(addr)
                elif error.kind == pb.ERROR_KIND_UNKNOWN_OUTCOME and idempotent:
                    maybe_applied = True
                    self.leader = self.next_endpoint(addr)
                else:
                    raise from_error(error, what)
            finally:
                self.leave()
            if time.monotonic() + pause > deadline:
                message = f"{what}: gave up retrying; last answer from {last}"
                if write and maybe_applied:
                    raise OutcomeUnknown(message)
                raise Unavailable(message)
            redirects = redirects + 1 if redirected else 0
            if redirects == 0 or redirects > _FREE_REDIRECTS:
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
