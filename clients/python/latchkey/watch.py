"""Watching keys: every change of a key, a range or a prefix, in revision
order, resumed across replica failures without a gap or a repeat.

Any replica serves a watch from its own applied state. When the stream
breaks (the replica died, stopped, or found the watcher too slow), the
watch is opened again at the next replica from the revision after the
last one it reported, so no revision is skipped or sent twice. Only
``Compacted`` (the cluster's history no longer holds the next revision)
and errors that retrying cannot cure end it.

A replica sends a progress notice when nothing matched for a progress
interval (1 s), so a replica that sends nothing for three intervals while
the caller waits (10 s for the first reply, which may wait for the
replica to catch up) is paused, stuck or cut off: the watch moves to the
next replica then, as the Rust client does, rather than waiting for HTTP/2
keepalive to give up on the connection (about 10 s). One daemon thread
per process (``latchkey-watchdog``, running while any watch is open)
keeps that time for every watch. Each move is logged (logger
``latchkey``, level INFO) with its reason.
"""

import logging
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Iterator, List, Optional

import grpc

from latchkey._proto import latchkey_pb2 as pb
from latchkey._proto import latchkey_pb2_grpc as rpc
from latchkey._router import Router
from latchkey.errors import Unavailable, from_error
from latchkey.kv import KeyValue

_log = logging.getLogger("latchkey")

# The replica's progress interval when the request names none (the
# protocol's default for progress_ms = 0).
_DEFAULT_PROGRESS_MS = 1000
# Progress intervals without a reply, while the caller waits, after which
# the replica counts as silent.
_SILENT_PROGRESSES = 3
# How long a watch's first reply may take (the replica may first catch it
# up from its history).
_FIRST_REPLY_LIMIT = 10.0
# How often the watchdog looks.
_WATCHDOG_TICK = 0.1

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


class _Watchdog:
    """One daemon thread that cancels the stream of every watch whose
    replica was silent too long while its caller waited (a thread per
    process, not per watch: a service may hold many watches)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: "weakref.WeakSet[Watch]" = weakref.WeakSet()
        self._running = False

    def add(self, watch: "Watch") -> None:
        with self._lock:
            self._watches.add(watch)
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="latchkey-watchdog", daemon=True).start()

    def remove(self, watch: "Watch") -> None:
        with self._lock:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            time.sleep(_WATCHDOG_TICK)
            with self._lock:
                watches = list(self._watches)
                if not watches:
                    self._running = False
                    return
            now = time.monotonic()
            for watch in watches:
                try:
                    watch._cancel_if_silent(now)
                except Exception:  # never let one watch stop the watchdog
                    _log.exception("latchkey watchdog: checking a watch failed")


_WATCHDOG = _Watchdog()


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
        progress_ms = request.progress_ms or _DEFAULT_PROGRESS_MS
        self._silent_after = _SILENT_PROGRESSES * progress_ms / 1000.0
        # Kept under _lock: when the stream last answered (or opened), if it
        # has answered yet, since when the caller waits on it (None while
        # it does not), and the stream the watchdog cancelled.
        self._heard = 0.0
        self._answered = False
        self._waiting_since: Optional[float] = None
        self._silenced = None

    def __iter__(self) -> Iterator[Changes]:
        return self

    def close(self) -> None:
        with self._lock:
            self._closed = True
            stream, self._stream = self._stream, None
        _WATCHDOG.remove(self)
        if stream is not None:
            stream.cancel()

    def _cancel_if_silent(self, now: float) -> None:
        """Cancel the stream if its replica sent nothing for too long while
        the caller waited (the watchdog's check)."""
        with self._lock:
            stream = self._stream
            if stream is None or self._closed or self._waiting_since is None:
                return
            limit = self._silent_after if self._answered else _FIRST_REPLY_LIMIT
            if now - max(self._heard, self._waiting_since) <= limit:
                return
            self._silenced = stream
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
            self._heard = time.monotonic()
            self._answered = False
        _WATCHDOG.add(self)

    def _drop(self, why: str) -> None:
        """Forget the stream and move to the next replica."""
        with self._lock:
            stream, self._stream = self._stream, None
        if stream is not None:
            stream.cancel()
        moved_from = self._addr
        self._addr = self._router.next_endpoint(self._addr)
        _log.info("watch moves from %s to %s: %s", moved_from, self._addr, why)

    def _receive(self) -> "pb.WatchReply":
        """The stream's next reply, the watchdog timing the wait."""
        with self._lock:
            stream = self._stream
            self._waiting_since = time.monotonic()
        try:
            reply = next(stream)
        finally:
            with self._lock:
                self._waiting_since = None
        with self._lock:
            self._heard = time.monotonic()
            self._answered = True
        return reply

    def _silenced_by_watchdog(self) -> bool:
        """Whether the stream was cancelled for its replica's silence (and
        forget that it was)."""
        with self._lock:
            silenced = self._silenced is not None and self._silenced is self._stream
            self._silenced = None
        return silenced

    def __next__(self) -> Changes:
        # The client's patience counts from the first failure in a row:
        # time spent waiting on a healthy, quiet stream is not a failure.
        deadline: Optional[float] = None
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
                reply = self._receive()
            except StopIteration:
                if self._closed:
                    raise
                last = f"{self._addr}: the watch stream ended"
                self._drop(last)
            except grpc.RpcError as e:
                if self._closed:
                    raise StopIteration from None
                if e.code() == grpc.StatusCode.CANCELLED:
                    if not self._silenced_by_watchdog():
                        # Cancelled by the caller (close) or the client.
                        self.close()
                        raise StopIteration from None
                    limit = self._silent_after if self._answered else _FIRST_REPLY_LIMIT
                    last = f"{self._addr}: the replica sent nothing for {limit:g} s"
                else:
                    last = f"{self._addr}: gRPC status {e.code().name}: {e.details()}"
                self._drop(last)
            else:
                if reply.HasField("error"):
                    error = reply.error
                    if error.kind not in _RESUMABLE:
                        self.close()
                        raise from_error(error, "Watch")
                    if error.kind == pb.ERROR_KIND_WATCH_TOO_SLOW and error.value:
                        self.next_revision = max(self.next_revision, error.value)
                    last = f"{self._addr}: {error.message}"
                    self._drop(last)
                elif reply.events:
                    self.next_revision = reply.revision + 1
                    return Changes(reply.revision, [_event(e) for e in reply.events])
                else:
                    # A progress notice: every change up to it was sent.
                    self.next_revision = max(self.next_revision, reply.revision + 1)
                    continue
            if deadline is None:
                deadline = time.monotonic() + self._router.patience
            if time.monotonic() + pause > deadline:
                raise Unavailable(f"Watch: no replica serves it; last: {last}")
            time.sleep(pause)
            pause = min(pause * 2, 1.0)


