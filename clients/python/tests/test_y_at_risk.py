"""Jeopardy: with every replica paused, a session turns at risk before it
is lost, and recovers when they resume (SIGSTOP/SIGCONT by pid)."""

import os
import signal
import time

from conftest import pids


def wait_until(what, predicate, within):
    end = time.monotonic() + within
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"not {what} within {within} s")


def test_a_session_is_at_risk_while_no_replica_answers(client, ns):
    replicas = list(pids().values())
    assert replicas, "LATCHKEY_PIDS is not set (run through `cargo xtask test`)"
    with client.session(ttl=9) as s:
        guard = s.lock(ns + "jeopardy").acquire()
        assert not s.at_risk
        for pid in replicas:
            os.kill(pid, signal.SIGSTOP)
        try:
            # Keep-alives go every 3 s: at risk 6 s after the last one
            # acknowledged, so within 6 s of the pause; lost only at 9 s.
            wait_until("at risk", lambda: s.at_risk, 7.0)
            assert not s.lost and guard.held
        finally:
            for pid in replicas:
                os.kill(pid, signal.SIGCONT)
        wait_until("no longer at risk", lambda: not s.at_risk, 10.0)
        assert not s.lost and guard.held
        guard.put(ns + "jeopardy/data", "still mine")
