"""Reaching the leader: one channel per replica, calls sent to the replica
believed to lead, redirected on ``NOT_LEADER``, retried elsewhere while
nothing was executed.

Writes and linearizable reads are answered by the leader only; any other
replica answers ``ERROR_KIND_NOT_LEADER`` with the leader's address (empty
while it knows none: try another replica). ``ERROR_KIND_UNAVAILABLE`` and a
failed connection are retried, elsewhere, with a growing pause (50 ms
doubling to 1 s), for at most the client's patience.
"""

import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc

from latchkey._proto import latchkey_pb2 as pb
from latchkey._proto import latchkey_pb2_grpc as rpc
from latchkey.errors import OutcomeUnknown, Unavailable, from_error

# gRPC status codes after which a call may or may not have been executed.
_TRANSPORT_RETRY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


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
        self._lock = threading.Lock()

    def channel(self, addr: str) -> grpc.Channel:
        with self._lock:
            if addr not in self._channels:
                # Values go up to 1 MiB and scan pages further: lift grpcio's
                # 4 MiB receive limit to the server's 64 MiB.
                options = [
                    ("grpc.max_send_message_length", 64 << 20),
                    ("grpc.max_receive_message_length", 64 << 20),
                ]
                if self.credentials is not None:
                    channel = grpc.secure_channel(addr, self.credentials, options)
                else:
                    channel = grpc.insecure_channel(addr, options=options)
                self._channels[addr] = channel
            return self._channels[addr]

    def close(self) -> None:
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for c in channels:
            c.close()

    def _next(self, addr: str) -> str:
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
    ) -> Any:
        """The leader's successful reply to ``service.method(request)``.

        Retries ``NOT_LEADER`` and ``UNAVAILABLE`` (nothing was executed).
        A transport failure or ``UNKNOWN_OUTCOME`` leaves a write's outcome
        unknown: retried only when ``idempotent`` (reads, and lock calls,
        which are idempotent by request id), else raised as
        :class:`OutcomeUnknown`. Any other error is raised as its
        exception (see :mod:`latchkey.errors`).
        """
        what = f"{service}.{method}"
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + (self.patience if patience is None else patience)
        pause = 0.05
        while True:
            addr = self.leader
            redirected = False
            stub = getattr(rpc, service + "Stub")(self.channel(addr))
            try:
                reply = getattr(stub, method)(request, timeout=timeout, metadata=self.metadata)
            except grpc.RpcError as e:
                code = e.code()
                last = f"{addr}: gRPC status {code.name}: {e.details()}"
                if code not in _TRANSPORT_RETRY:
                    raise Unavailable(f"{what}: {last}") from None
                if not idempotent:
                    raise OutcomeUnknown(f"{what}: {last}") from None
                self.leader = self._next(addr)
            else:
                error = error_of(reply)
                if error is None:
                    return reply
                last = f"{addr}: {error.message}"
                if error.kind == pb.ERROR_KIND_NOT_LEADER:
                    redirected = bool(error.leader_addr) and error.leader_addr != addr
                    self.leader = error.leader_addr if redirected else self._next(addr)
                elif error.kind == pb.ERROR_KIND_UNAVAILABLE:
                    self.leader = self._next(addr)
                elif error.kind == pb.ERROR_KIND_UNKNOWN_OUTCOME and idempotent:
                    self.leader = self._next(addr)
                else:
                    raise from_error(error, what)
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"{what}: gave up retrying; last answer from {last}")
            if not redirected:  # straight to a named leader; else pause first
                time.sleep(pause)
                pause = min(pause * 2, 1.0)
