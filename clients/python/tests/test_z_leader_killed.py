"""The last test (it leaves a replica dead): the leader is SIGKILLed while
a lock is held and a watch is open; the session survives the election,
the grant stays current and fences writes at the new leader, nobody else
gets it, and the watch goes on (at another replica if it was on the dead
one) without a gap or a repeat."""

import os
import signal
import threading
import time

import latchkey

from conftest import pids


def test_a_held_lock_survives_the_leaders_death(client, ns):
    by_addr = pids()
    assert by_addr, "LATCHKEY_PIDS is not set (run through `cargo xtask test`)"
    name = ns + "failover"
    with client.session(ttl=8) as holder, client.session(ttl=8) as rival:
        guard = holder.lock(name).acquire()
        before = guard.put(ns + "failover/data", "before")
        watch = client.watch(prefix=ns + "failover/", start_revision=before)
        # The watch is open (at the leader, where the client's calls go).
        assert next(watch).events[0].kv.value == b"before"
        leader = client._router.leader  # where the last write was answered
        # Retry-safe writes go on through the kill: each sequence number
        # is handed out once, none lost to a resend applied twice.
        seq = ns + "failover/seq"
        numbers = []
        stop = threading.Event()

        def allocate():
            while not stop.is_set():
                numbers.extend(client.next_sequence(seq))

        writer = threading.Thread(target=allocate)
        writer.start()
        time.sleep(0.3)
        os.kill(by_addr[leader], signal.SIGKILL)
        at_kill = len(numbers)
        # A write sent to the dead leader would raise OutcomeUnknown (it may
        # have been applied); a read is retried until the next leader
        # answers. Then writes go on there, fenced by the same grant.
        assert client.get(ns + "failover/data") == b"before"
        guard.put(ns + "failover/data", "after")
        assert client.get(ns + "failover/data") == b"after"
        assert rival.lock(name).try_acquire() is None
        # Keep-alives reach the new leader: past the TTL, still held.
        time.sleep(9)
        assert not holder.lost and guard.held
        guard.put(ns + "failover/data", "still mine")
        guard.release()
        assert rival.lock(name).acquire(timeout=10) is not None
        with watch:
            values = [next(watch).events[0].kv.value for _ in range(2)]
        assert values == [b"after", b"still mine"]
        stop.set()
        writer.join(timeout=30)
        assert not writer.is_alive()
        assert 0 < at_kill < len(numbers), (at_kill, len(numbers))
        # Contiguous from the first: no number skipped by a double apply.
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
        assert client.next_sequence(seq, 0).start == numbers[-1] + 1
