"""Watching keys: every change of a key, a range or a prefix, in revision
order, resumed across replica failures without a gap or a repeat.

Any replica serves a watch from its own applied state. When the stream
breaks (the replica died, stopped, or found the watcher too slow), the
watch is opened again at the next replica from the revision after the
last one it reported, so no revision is skipped or sent twice. Only
``Compacted`` (the cluster's history no longer holds the next revision)
and errors that retrying cannot cure end it.
"""

import threading
import time
from dataclasses import dataclass
from typing import Iterator, List, Optional

import grpc

from latchkey._proto import latchkey_pb2 as pb
from latchkey._proto import latchkey_pb2_grpc as rpc
from latchkey._router import Router
from latchkey.errors import Unavailable, from_error
from latchkey.kv import KeyValue

# Errors after which the watch is opened again elsewhere.
_RESUMABLE = {
    pb.ERROR_KIND_UNAVAILABLE,
    pb.ERROR_KIND_WATCH_TOO_SLOW,
    pb.ERROR_KIND_TOO_MANY_WATCHES,
    # A replica behind the revision the watch resumes from: another one
    # (or this one, a moment later) has it.
    pb.ERROR_KIND_FUTURE_REVISION,
}


@dataclass(frozen=True)
class Event:
    """One key's change: ``kind`` is ``"put"`` or ``"delete"``; ``kv`` the
    key after a put; ``prev`` before the change (with ``prev_value=True``,
    when it existed)."""

    kind: str
    key: bytes
    kv: Optional[KeyValue]
    prev: Optional[KeyValue]


@dataclass(frozen=True)
class Changes:
    """One revision's changes to the watched keys, all of one write."""

    revision: int
    events: List[Event]


def _event(e: "pb.WatchEvent") -> Event:
    return Event(
        kind="put" if e.type == pb.EVENT_TYPE_PUT else "delete",
        key=e.key,
        kv=KeyValue.of(e.kv) if e.HasField("kv") else None,
        prev=KeyValue.of(e.prev_kv) if e.HasField("prev_kv") else None,
    )


class Watch:
    """An iterator of :class:`Changes`; see :meth:`Client.watch`.

    ``next()`` blocks until the next revision that changed a watched key.
    While no replica can be reached for the client's patience it raises
    :class:`Unavailable`; iterating again goes on trying from where it was.
    :meth:`close` (from any thread) ends it.
    """

    def __init__(self, router: Router, request: "pb.WatchRequest"):
        self._router = router
        self._request = request
        #: The next revision to report (0: whatever comes after the watch
        #: is in place; fixed by the first reply).
        self.next_revision: int = request.start_revision
        self._stream = None
        self._addr = router.leader
        self._closed = False
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[Changes]:
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()

    def __enter__(self) -> "Watch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        request = pb.WatchRequest()
        request.CopyFrom(self._request)
        request.start_revision = self.next_revision
        self._router.enter()  # the channel stays open while the call starts
        try:
            stub = rpc.WatchStub(self._router.channel(self._addr))
            stream = stub.Watch(request, metadata=self._router.metadata)
        finally:
            self._router.leave()
        with self._lock:
            if self._closed:
                stream.cancel()
                raise StopIteration
            self._stream = stream

    def _drop(self) -> None:
        """Forget the stream and move to the next replica."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        self._addr = self._router.next_endpoint(self._addr)

    def __next__(self) -> Changes:
        deadline = time.monotonic() + self._router.patience
        pause = 0.05
        last = "no replica tried"
        while True:
            if self._closed:
                raise StopIteration
            if self._router.closed:
                self.close()
                raise StopIteration
            try:
                if self._stream is None:
                    self._open()
                reply = next(self._stream)
            except StopIteration:
                if self._closed:
                    raise
                last = f"{self._addr}: the watch stream ended"
                self._drop()
            except grpc.RpcError as e:
                if self._closed or e.code() == grpc.StatusCode.CANCELLED:
                    raise StopIteration from None
                last = f"{self._addr}: gRPC status {e.code().name}: {e.details()}"
                self._drop()
            else:
                if reply.HasField("error"):
                    error = reply.error
                    if error.kind not in _RESUMABLE:
                        self.close()
                        raise from_error(error, "Watch")
                    if error.kind == pb.ERROR_KIND_WATCH_TOO_SLOW and error.value:
                        self.next_revision = max(self.next_revision, error.value)
                    last = f"{self._addr}: {error.message}"
                    self._drop()
                elif reply.events:
                    self.next_revision = reply.revision + 1
                    return Changes(reply.revision, [_event(e) for e in reply.events])
                else:
                    # A progress notice: every change up to it was sent.
                    self.next_revision = max(self.next_revision, reply.revision + 1)
                    continue
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"Watch: no replica serves it; last: {last}")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


