"""Operator calls: list sessions, force a release that the holder's client
hears of, end a session; refused without the cluster secret."""

import os
import time

import pytest

import latchkey

from conftest import endpoints


def operator():
    secret = os.environ.get("LATCHKEY_CLUSTER_SECRET", "")
    assert secret, "LATCHKEY_CLUSTER_SECRET is not set (run through `cargo xtask test`)"
    return latchkey.Client(endpoints(), cluster_secret=secret)


def test_list_force_release_and_end(client, ns):
    name = ns + "op"
    with operator() as op, client.session(ttl=3, name="pytest holder") as holder:
        guard = holder.lock(name).acquire()
        listed = {s.session: s for s in op.sessions()}
        mine = listed[holder.id]
        assert mine.name == "pytest holder" and mine.ttl_ms == 3000
        assert (name, guard.token) in mine.held
        # Without the cluster secret, operator calls are refused.
        with pytest.raises(latchkey.PermissionDenied):
            client.force_release(name, guard.token)
        assert op.force_release(name, guard.token) is True
        assert op.force_release(name, guard.token) is False  # already gone
        # The holder hears of it at a keep-alive (every TTL/3), and its
        # fenced writes are refused at once.
        with pytest.raises(latchkey.StaleFence):
            guard.put(ns + "op/data", "x")
        for _ in range(50):
            if not guard.held:
                break
            time.sleep(0.1)
        assert not guard.held and not holder.lost
        # Ending the session: its keep-alives are told so, and it is lost.
        op.end_session(holder.id)
        for _ in range(50):
            if holder.lost:
                break
            time.sleep(0.1)
        assert holder.lost
