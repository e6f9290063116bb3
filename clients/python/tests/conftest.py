"""The package's tests run against a real cluster: ``cargo xtask test``
starts three replicas and sets LATCHKEY_ENDPOINTS (``host:port`` list,
comma-separated) and LATCHKEY_PIDS (``host:port=pid`` list) for them."""

import os
import uuid

import pytest

import latchkey


def endpoints():
    value = os.environ.get("LATCHKEY_ENDPOINTS", "")
    if not value:
        pytest.exit(
            "LATCHKEY_ENDPOINTS is not set: run these tests through `cargo xtask test` "
            "(or set it to a running cluster's replicas, host:port,...)",
            returncode=2,
        )
    return value.split(",")


def pids():
    """The replicas' pids by their endpoint (LATCHKEY_PIDS)."""
    pairs = (p.split("=") for p in os.environ.get("LATCHKEY_PIDS", "").split(",") if p)
    return {addr: int(pid) for addr, pid in pairs}


@pytest.fixture
def client():
    with latchkey.Client(endpoints(), patience=30.0) as c:
        yield c


@pytest.fixture
def ns():
    """A key and lock name prefix of the test's own."""
    return f"pytest/{uuid.uuid4().hex[:8]}/"
