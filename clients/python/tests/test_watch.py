"""Watch: every change in revision order, from a start revision, with
previous values; bad selections refused."""

import logging
import os
import signal
import threading
import time

import pytest

import latchkey
from conftest import endpoints, pids


def test_a_prefix_watch_sees_every_change_in_order(client, ns):
    first = client.put(ns + "w/a", "0")
    with client.watch(prefix=ns + "w/", start_revision=first, prev_value=True) as watch:
        second = client.put(ns + "w/b", "1")
        client.put(ns + "other", "not watched")
        client.delete(ns + "w/a")
        got = [next(watch) for _ in range(3)]
    assert [c.revision for c in got][:2] == [first, second]
    assert [(e.kind, e.key) for c in got for e in c.events] == [
        ("put", (ns + "w/a").encode()),
        ("put", (ns + "w/b").encode()),
        ("delete", (ns + "w/a").encode()),
    ]
    deleted = got[2].events[0]
    assert deleted.kv is None and deleted.prev.value == b"0"
    assert got[0].revision < got[1].revision < got[2].revision


def test_a_key_watch_from_now_and_close_from_another_thread(client, ns):
    key = ns + "k"
    watch = client.watch(key=key)
    seen = []

    def follow():
        for changes in watch:
            seen.append(changes)

    t = threading.Thread(target=follow)
    t.start()
    # The watch is in place once its first (progress) reply came; writing
    # repeatedly until one is seen covers that without a sleep.
    for i in range(200):
        client.put(key, str(i))
        if seen:
            break
    watch.close()
    t.join(timeout=10)
    assert not t.is_alive()
    assert seen and seen[0].events[0].key == key.encode()


def test_a_batch_is_one_revision(client, ns):
    from latchkey import Put

    start = client.put(ns + "b/0", "x") + 1
    with client.watch(prefix=ns + "b/", start_revision=start) as watch:
        client.batch([Put(ns + "b/1", "1"), Put(ns + "b/2", "2")])
        changes = next(watch)
    assert [e.key for e in changes.events] == [(ns + "b/1").encode(), (ns + "b/2").encode()]


def test_bad_selections_are_refused(client, ns):
    with pytest.raises(ValueError):
        client.watch()
    with pytest.raises(ValueError):
        client.watch(key="a", prefix="b")
    with pytest.raises(ValueError):
        client.watch(end="z")


def test_watches_not_read_hold_up_no_other_call(client, ns):
    # HTTP/2 shares a connection's flow-control window among its streams;
    # watches whose caller stopped reading must not take it from the
    # client's other calls.
    first = client.put(ns + "unread/0", "0")
    watches = []
    try:
        for _ in range(4):
            watch = client.watch(prefix=ns + "unread/", start_revision=first)
            watches.append(watch)
            assert next(watch).revision == first  # open; never read again
        value = b"v" * (64 * 1024)
        with latchkey.Client(endpoints(), patience=30.0) as writer:
            for i in range(384):  # 24 MiB: more than any window holds
                writer.put(ns + "unread/" + str(i % 32), value)
        # Held up, this would raise Unavailable after the client's patience.
        for _ in range(3):
            assert client.get(ns + "unread/0") == value
    finally:
        for watch in watches:
            watch.close()


def test_a_watch_at_a_paused_replica_moves_to_another(client, ns, caplog):
    # The watch sits at a follower (its client's first endpoint), which is
    # then paused: it sends nothing, not even progress notices, and keeps
    # its connection open. The watch moves on after three progress
    # intervals, before HTTP/2 keepalive would give up (the log says why
    # it moved), and misses nothing. Its caller had waited quietly for
    # longer than the client's patience before: that wait is no failure.
    by_addr = pids()
    assert by_addr, "LATCHKEY_PIDS is not set (run through `cargo xtask test`)"
    first = client.put(ns + "paused/0", "0")
    leader = client._router.leader  # where that write was answered
    follower = next(a for a in endpoints() if a != leader)
    order = [follower] + [a for a in endpoints() if a != follower]
    got = []
    with latchkey.Client(order, patience=2.0) as watcher:
        with watcher.watch(prefix=ns + "paused/", start_revision=first) as watch:
            assert next(watch).revision == first
            with caplog.at_level(logging.INFO, logger="latchkey"):
                waiter = threading.Thread(target=lambda: got.append(next(watch)))
                waiter.start()
                time.sleep(2.5)  # longer than the watcher's patience
                os.kill(by_addr[follower], signal.SIGSTOP)
                try:
                    second = client.put(ns + "paused/1", "1")
                    waiter.join(timeout=30)
                finally:
                    os.kill(by_addr[follower], signal.SIGCONT)
            assert not waiter.is_alive()
    assert len(got) == 1, "the waiting next() raised (see the captured output)"
    got = got[0]
    assert got.revision == second
    assert [e.key for e in got.events] == [(ns + "paused/1").encode()]
    moves = [r.getMessage() for r in caplog.records if "watch moves" in r.getMessage()]
    assert any("sent nothing" in m for m in moves), moves
