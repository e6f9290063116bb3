"""The asyncio flavour: the same semantics from the event loop, and a
cancelled acquire that never leaves a lock held."""

import asyncio

from latchkey import aio

from conftest import endpoints


def test_kv_locks_and_watch_from_asyncio(ns):
    async def main():
        async with aio.Client(endpoints()) as c:
            first = await c.put(ns + "aio/a", "1")
            assert await c.get(ns + "aio/a") == b"1"
            assert await c.compare_and_put(ns + "aio/a", "1", "2")
            assert [kv.key async for kv in c.scan(ns + "aio/")] == [(ns + "aio/a").encode()]
            async with c.watch(prefix=ns + "aio/", start_revision=first) as watch:
                changes = await watch.__anext__()
                assert changes.revision == first
            async with await c.session(ttl=5) as s1, await c.session(ttl=5) as s2:
                async with s1.lock(ns + "aio/lock") as guard:
                    await guard.put(ns + "aio/owner", "s1")
                    assert await s2.lock(ns + "aio/lock").try_acquire() is None
                    assert await s2.lock(ns + "aio/lock").acquire(timeout=0.3) is None
                granted = await s2.lock(ns + "aio/lock").acquire(timeout=10)
                assert granted is not None and granted.token > guard.token
                await granted.release()
                leading = await s1.campaign(ns + "aio-election", "host-a")
                assert (await c.leader(ns + "aio-election")).term == leading.term
                await leading.proclaim("host-a:1")
                await leading.resign()

    asyncio.run(main())


def test_a_cancelled_acquire_withdraws_its_wait(ns):
    name = ns + "aio/cancel"

    async def main():
        async with aio.Client(endpoints()) as c:
            async with await c.session(ttl=5) as holder, await c.session(ttl=5) as waiter:
                held = await holder.lock(name).acquire()
                task = asyncio.ensure_future(waiter.lock(name).acquire())
                await asyncio.sleep(0.5)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                await asyncio.sleep(2.5)  # the wait is withdrawn within a second
                await held.release()
                # Nobody waits any more: a third session gets it at once.
                async with await c.session(ttl=5) as third:
                    assert await third.lock(name).try_acquire() is not None

    asyncio.run(main())
