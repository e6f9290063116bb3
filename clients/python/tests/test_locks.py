"""Sessions and locks: mutual exclusion, FIFO hand-over, fencing, shared
locks, semaphores, and what a lost session means."""

import threading
import time

import pytest

import latchkey


def test_a_lock_excludes_and_hands_over_with_a_higher_token(client, ns):
    name = ns + "lock"
    with client.session(ttl=6) as s1, client.session(ttl=6) as s2:
        g1 = s1.lock(name).acquire()
        assert g1.held and g1.token > 0 and g1.name == name
        assert s2.lock(name).try_acquire() is None
        assert s2.lock(name).acquire(timeout=0.5) is None
        # A waiter queues without polling and is granted at the release.
        got = []
        waiter = threading.Thread(target=lambda: got.append(s2.lock(name).acquire(timeout=20)))
        waiter.start()
        time.sleep(0.5)
        assert not got
        g1.put(ns + "owner", "s1")
        g1.release()
        waiter.join(timeout=25)
        (g2,) = got
        assert g2 is not None and g2.token > g1.token
        # The old grant's fenced write is refused, naming the current token.
        with pytest.raises(latchkey.StaleFence) as refused:
            g1.put(ns + "owner", "s1 again")
        assert refused.value.token == g1.token and refused.value.current == g2.token
        g2.put(ns + "owner", "s2")
        assert client.get(ns + "owner") == b"s2"
        g2.release()
        assert not g2.held


def test_with_blocks_release_and_close(client, ns):
    name = ns + "with"
    with client.session(ttl=5) as s:
        with s.lock(name) as guard:
            assert guard.held
            token = guard.token
        assert not guard.held
    with client.session(ttl=5) as other, other.lock(name) as again:
        assert again.token > token
    assert s.lost  # closed


def test_shared_holders_coexist_and_exclude_a_writer(client, ns):
    name = ns + "rw"
    with client.session(ttl=5) as a, client.session(ttl=5) as b, client.session(ttl=5) as w:
        r1 = a.lock(name, shared=True).acquire()
        r2 = b.lock(name, shared=True).acquire(timeout=5)
        assert r2 is not None and r2.token != r1.token
        assert w.lock(name).try_acquire() is None
        r1.release()
        r2.release()
        assert w.lock(name).acquire(timeout=10) is not None


def test_a_semaphore_admits_its_permits_and_checks_the_count(client, ns):
    name = ns + "sem"
    with client.session(ttl=5) as a, client.session(ttl=5) as b, client.session(ttl=5) as c:
        p1 = a.semaphore(name, 2).acquire()
        p2 = b.semaphore(name, 2).acquire(timeout=5)
        assert p2 is not None and p2.token > p1.token
        assert c.semaphore(name, 2).try_acquire() is None
        with pytest.raises(latchkey.LockError) as mismatch:
            c.semaphore(name, 3).try_acquire()
        assert mismatch.value.kind == "ERROR_KIND_PERMITS_MISMATCH"
        # Each permit fences with its own token while it is held.
        p1.put(ns + "sem/a", "1")
        p1.release()
        with pytest.raises(latchkey.StaleFence):
            p1.put(ns + "sem/a", "2")
        assert c.semaphore(name, 2).acquire(timeout=10) is not None
    with pytest.raises(ValueError):
        a.semaphore(name, 0)


def test_a_closed_sessions_locks_are_free_and_its_calls_refused(client, ns):
    name = ns + "closed"
    s = client.session(ttl=5)
    guard = s.lock(name).acquire()
    s.close()
    assert s.lost and not guard.held
    with pytest.raises(latchkey.SessionEnded):
        s.lock(name).acquire(timeout=1)
    with client.session(ttl=5) as other:
        assert other.lock(name).try_acquire() is not None


def test_an_abandoned_session_expires_and_frees_its_lock(client, ns):
    name = ns + "expire"
    s = client.session(ttl=3)
    s.lock(name).acquire()
    # Stop the keep-alives without closing: the session expires on the
    # cluster after its TTL, and a waiter gets the lock.
    with s._state:
        s._closed = True
        s._state.notify_all()
    with client.session(ttl=10) as other:
        started = time.monotonic()
        guard = other.lock(name).acquire(timeout=30)
        assert guard is not None
        assert time.monotonic() - started >= 1.0  # not before the TTL ran down
    assert s.lost


def test_bad_lock_names_are_refused(client):
    with client.session(ttl=5) as s:
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("").try_acquire()
        with pytest.raises(latchkey.InvalidArgument):
            s.lock("x" * 300).try_acquire()


def test_multi_locks_are_all_or_nothing_in_any_order(client, ns):
    a, b = ns + "ma", ns + "mb"
    with client.session(ttl=5) as s1, client.session(ttl=5) as s2, client.session(ttl=5) as s3:
        both = s1.lock_all([a, b]).acquire()
        assert both.held and len(both.tokens) == 2 and [g.name for g in both.guards] == [a, b]
        # Named in the other order, it waits and holds neither meanwhile.
        got = []
        waiter = threading.Thread(target=lambda: got.append(s2.lock_all([b, a]).acquire(timeout=20)))
        waiter.start()
        time.sleep(0.5)
        assert not got
        assert s3.lock(a).try_acquire() is None
        both.guards[0].put(ns + "m/data", "s1")  # each lock fences with its own token
        both.release()
        waiter.join(timeout=25)
        (other,) = got
        assert other is not None and [g.name for g in other.guards] == [b, a]
        assert min(other.tokens) > max(both.tokens)
        with pytest.raises(latchkey.StaleFence):
            both.guards[1].put(ns + "m/data", "s1 again")
        with other:
            pass
        assert not other.held
        with s3.lock_all([a, b]) as again:
            assert again.held
    with pytest.raises(ValueError):
        s1.lock_all([a])
    with pytest.raises(ValueError):
        s1.lock_all([a, a])


def test_each_acquire_is_a_holder_of_its_own(client, ns):
    name = ns + "owners"
    with client.session(ttl=5) as s:
        lock = s.lock(name)
        first = lock.acquire()
        # Another thread of the same session waits for it, like threading.Lock.
        got = []
        t = threading.Thread(target=lambda: got.append(lock.acquire(timeout=0.5)))
        t.start()
        t.join(timeout=10)
        assert got == [None]
        first.release()
        # Two permits from one session are two grants with their own tokens.
        p1 = s.semaphore(name + "/sem", 2).acquire()
        p2 = s.semaphore(name + "/sem", 2).acquire(timeout=5)
        assert p2 is not None and p2.token != p1.token
        assert s.semaphore(name + "/sem", 2).try_acquire() is None
        # Nested `with` blocks on one Lock object release what they took.
        outer = s.lock(name + "/a")
        with outer as g1, s.lock(name + "/b") as g2:
            assert g1.held and g2.held
        assert not g1.held and not g2.held
