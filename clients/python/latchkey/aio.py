"""The asyncio flavour: the same client, its calls awaitable.

Each call runs the blocking client (:mod:`latchkey`) in a worker thread
(``asyncio.to_thread``), so the event loop never blocks; a session's
keep-alives stay on their own thread. Cancelling a task that waits for a
lock withdraws the wait (within about a second) and releases a grant that
came first, so a cancelled acquire never leaves a lock held.

This is a thin layer, not a second client: every rule of the blocking
client (what is retried, what raises) holds here unchanged. Why threads
and not grpc.aio: one implementation of the retry, keep-alive and resume
logic, tested once; a waiting acquire costs a thread, which is fine for
the tens of locks a process waits for, not for thousands.

::

    import asyncio
    from latchkey import aio

    async def main():
        async with aio.Client(["127.0.0.1:7001", "127.0.0.1:7002", "127.0.0.1:7003"]) as c:
            async with await c.session(ttl=10) as s:
                async with s.lock("reports/nightly") as guard:
                    await guard.put("reports/nightly/owner", "host-a")

    asyncio.run(main())
"""

import asyncio
import threading
from typing import Any, AsyncIterator, Optional, Sequence

import latchkey
from latchkey.election import ELECTION_PREFIX, Leader, LeaderChange
from latchkey.kv import Bytes, KeyValue, as_bytes
from latchkey.watch import Changes


async def _run(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


class Client:
    """:class:`latchkey.Client`, awaitable; same arguments."""

    def __init__(self, endpoints: Sequence[str], **kwargs: Any):
        self.sync = latchkey.Client(endpoints, **kwargs)

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def get(self, key: Bytes, *, stale: bool = False) -> Optional[bytes]:
        return await _run(self.sync.get, key, stale=stale)

    async def get_kv(self, key: Bytes, *, stale: bool = False) -> Optional[KeyValue]:
        return await _run(self.sync.get_kv, key, stale=stale)

    async def scan(self, prefix: Bytes = b"", **kwargs: Any) -> AsyncIterator[KeyValue]:
        """Every key under ``prefix``, a page fetched at a time."""
        pages = self.sync.scan(prefix, **kwargs)
        done = object()
        while True:
            kv = await _run(next, pages, done)
            if kv is done:
                return
            yield kv

    async def put(self, key: Bytes, value: Bytes) -> int:
        return await _run(self.sync.put, key, value)

    async def compare_and_put(self, key: Bytes, expected: Optional[Bytes], value: Bytes) -> bool:
        return await _run(self.sync.compare_and_put, key, expected, value)

    async def delete(self, key: Bytes) -> bool:
        return await _run(self.sync.delete, key)

    async def batch(self, ops: Sequence[Any], **kwargs: Any) -> bool:
        return await _run(self.sync.batch, ops, **kwargs)

    async def next_sequence(self, key: Bytes, step: int = 1) -> range:
        return await _run(self.sync.next_sequence, key, step)

    async def leader(self, election: str) -> Optional[Leader]:
        return await _run(self.sync.leader, election)

    def watch(self, **kwargs: Any) -> "_Stream":
        """:meth:`latchkey.Client.watch` as an async iterator of
        :class:`Changes` (``async with`` closes it)."""
        return _Stream(self.sync.watch(**kwargs))

    def observe(self, election: str) -> "_Stream":
        """:meth:`latchkey.Client.observe` as an async iterator of
        :class:`LeaderChange`."""
        return _Stream(self.sync.observe(election))

    async def session(self, ttl: float = 10.0, *, name: str = "") -> "Session":
        return Session(await _run(self.sync.session, ttl, name=name))


class _Stream:
    """A blocking iterator with a ``close()`` (a watch, an observation),
    iterated from the event loop; cancelling the iterating task closes it."""

    def __init__(self, inner: Any):
        self.sync = inner

    def __aiter__(self) -> "_Stream":
        return self

    async def __anext__(self) -> Any:
        done = object()
        try:
            item = await _run(next, self.sync, done)
        except asyncio.CancelledError:
            self.sync.close()  # the thread's next() ends with the stream
            raise
        if item is done:
            raise StopAsyncIteration
        return item

    async def close(self) -> None:
        self.sync.close()

    async def __aenter__(self) -> "_Stream":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Session:
    """:class:`latchkey.Session`, awaitable; ``async with`` closes it."""

    def __init__(self, sync: latchkey.Session):
        self.sync = sync

    @property
    def id(self) -> int:
        return self.sync.id

    @property
    def lost(self) -> bool:
        return self.sync.lost

    @property
    def at_risk(self) -> bool:
        return self.sync.at_risk

    def lock(self, name: str, *, shared: bool = False) -> "Lock":
        return Lock(self.sync.lock(name, shared=shared))

    def semaphore(self, name: str, permits: int) -> "Lock":
        return Lock(self.sync.semaphore(name, permits))

    def lock_all(self, names: "list[str]", *, shared: bool = False) -> "Lock":
        return Lock(self.sync.lock_all(names, shared=shared))

    async def campaign(
        self, election: str, value: Bytes, timeout: Optional[float] = None
    ) -> Optional["Leadership"]:
        """:meth:`latchkey.Election.campaign`; cancelling withdraws it."""
        lock = latchkey.Lock(self.sync, ELECTION_PREFIX + election, value=as_bytes(value))
        guard = await Lock(lock).acquire(timeout)
        if guard is None:
            return None
        return Leadership(latchkey.Leadership(election, guard.sync))

    async def close(self) -> None:
        await _run(self.sync.close)

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Lock:
    """A lock, semaphore or multi-lock of a session, awaitable; ``async
    with`` acquires (waiting as long as it takes) and releases."""

    def __init__(self, sync: Any):
        self.sync = sync
        self._held: "list[Guard]" = []  # taken by `async with`, innermost last

    async def try_acquire(self) -> Optional["Guard"]:
        grant = await _run(self.sync.try_acquire)
        return Guard(grant) if grant is not None else None

    async def acquire(self, timeout: Optional[float] = None) -> Optional["Guard"]:
        """Wait in FIFO order; ``None`` if not granted within ``timeout``.
        Cancelling the awaiting task withdraws the wait, and a grant that
        came first is released."""
        cancel = threading.Event()
        job = asyncio.ensure_future(_run(self.sync.acquire, timeout, cancel=cancel))
        try:
            grant = await asyncio.shield(job)
        except asyncio.CancelledError:
            cancel.set()
            job.add_done_callback(_release_late_grant)
            raise
        return Guard(grant) if grant is not None else None

    async def __aenter__(self) -> "Guard":
        guard = await self.acquire()
        if guard is None:  # no timeout: granted or raised
            raise latchkey.LatchkeyError("not granted")
        self._held.append(guard)
        return guard

    async def __aexit__(self, *exc: object) -> None:
        if self._held:
            await _run(self._held.pop().sync._exit, exc[0] is not None)


def _release_late_grant(job: "asyncio.Future[Any]") -> None:
    """After a cancelled acquire: release what the thread still got."""
    if job.cancelled() or job.exception() is not None:
        return
    grant = job.result()
    if grant is not None:
        threading.Thread(target=grant._exit, args=(True,), daemon=True).start()


class Guard:
    """A grant (:class:`latchkey.Guard` or :class:`latchkey.MultiGuard`),
    awaitable."""

    def __init__(self, sync: Any):
        self.sync = sync

    def __getattr__(self, name: str) -> Any:
        # name, token, tokens, sequencer, guards, held: read as they are.
        return getattr(self.sync, name)

    async def put(self, key: Bytes, value: Bytes) -> int:
        return await _run(self.sync.put, key, value)

    async def delete(self, key: Bytes) -> int:
        return await _run(self.sync.delete, key)

    async def release(self) -> None:
        await _run(self.sync.release)


class Leadership(Guard):
    """A won campaign (:class:`latchkey.Leadership`), awaitable: ``term``,
    fenced ``put``/``delete``, ``proclaim``, ``resign``."""

    async def proclaim(self, value: Bytes) -> None:
        await _run(self.sync.proclaim, value)

    async def resign(self) -> None:
        await _run(self.sync.resign)


__all__ = ["Changes", "Client", "Guard", "LeaderChange", "Leadership", "Lock", "Session"]
