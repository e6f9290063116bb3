"""Fenced election: FIFO campaigns, terms that fence writes, proclaim,
resign, and observers told of every term in order."""

import threading

import pytest

import latchkey


def test_campaign_proclaim_resign_and_observe(client, ns):
    name = ns + "sched"
    observed = []
    stream = client.observe(name)
    follower = threading.Thread(target=lambda: observed.extend(stream))
    follower.start()
    with client.session(ttl=5) as a, client.session(ttl=5) as b:
        assert client.leader(name) is None
        lead_a = a.election(name).campaign("host-a")
        assert client.leader(name) == latchkey.Leader(lead_a.term, a.id, b"host-a")
        # B waits (FIFO, no polling) and does not lead meanwhile.
        assert b.election(name).campaign("host-b", timeout=0.5) is None
        won = []
        waiter = threading.Thread(target=lambda: won.append(b.election(name).campaign("host-b")))
        waiter.start()
        lead_a.proclaim("host-a:8080")
        assert client.leader(name).value == b"host-a:8080"
        lead_a.put(ns + "sched/state", "written by A")
        lead_a.resign()
        waiter.join(timeout=20)
        (lead_b,) = won
        assert lead_b.term > lead_a.term
        # A's term is over: its fenced writes and proclamations are refused.
        with pytest.raises(latchkey.StaleFence):
            lead_a.put(ns + "sched/state", "A again")
        lead_b.put(ns + "sched/state", "written by B")
        lead_b.resign()
        with pytest.raises(latchkey.LockError):
            lead_b.proclaim("too late")
    # Observers saw nobody, A (twice: its proclamation), nobody, B, nobody.
    for _ in range(100):
        if len(observed) >= 5:
            break
        threading.Event().wait(0.1)
    stream.close()
    follower.join(timeout=10)
    terms = [c.leader.term if c.leader else None for c in observed]
    assert terms[:5] == [None, lead_a.term, lead_a.term, lead_b.term, None], observed
    assert [c.leader.value for c in observed[1:3]] == [b"host-a", b"host-a:8080"]
    assert not any(c.skipped for c in observed)
