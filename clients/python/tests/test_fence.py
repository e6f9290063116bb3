"""latchkey.fence.PgFence against a real PostgreSQL server: ``cargo xtask
test`` starts a throwaway one and sets LATCHKEY_POSTGRES (a libpq connection
string). ``test_a_newer_writer_waits_for_the_open_check`` fails when the
check leaves the write's transaction (the stale write then lands last)."""

import os
import threading
import time
import uuid

import pytest

from latchkey import InvalidArgument, StaleFence
from latchkey.fence import PgFence

psycopg = pytest.importorskip("psycopg")


def dsn():
    value = os.environ.get("LATCHKEY_POSTGRES", "")
    if not value:
        pytest.exit(
            "LATCHKEY_POSTGRES is not set: run these tests through `cargo xtask test`",
            returncode=2,
        )
    return value


@pytest.fixture
def db():
    """A connection, and tables of the test's own: a fence, a document and
    a log of writes in the order they ran."""
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(dsn()) as conn:
        fence = PgFence(f"fence_{suffix}")
        fence.install(conn)
        conn.execute(f"CREATE TABLE doc_{suffix} (id INT PRIMARY KEY, owner TEXT NOT NULL)")
        conn.execute(f"CREATE TABLE log_{suffix} (seq BIGSERIAL PRIMARY KEY, owner TEXT NOT NULL)")
        conn.commit()
        yield conn, fence, suffix


def write(cur, suffix, owner):
    cur.execute(
        f"INSERT INTO doc_{suffix} (id, owner) VALUES (1, %s) "
        "ON CONFLICT (id) DO UPDATE SET owner = EXCLUDED.owner",
        (owner,),
    )
    cur.execute(f"INSERT INTO log_{suffix} (owner) VALUES (%s)", (owner,))


def log(conn, suffix):
    return [r[0] for r in conn.execute(f"SELECT owner FROM log_{suffix} ORDER BY seq")]


def test_a_stale_writer_is_refused_after_the_newer_commit(db):
    conn, fence, suffix = db
    for token, who in ((33, "A"), (34, "B")):
        with conn.transaction(), conn.cursor() as cur:
            assert fence.admit(cur, "orders", token) is True
            write(cur, suffix, who)
    with pytest.raises(StaleFence) as refused:
        with conn.transaction(), conn.cursor() as cur:
            fence.admit(cur, "orders", 33)
            write(cur, suffix, "A late")
    assert (refused.value.name, refused.value.token, refused.value.current) == ("orders", 33, 34)
    assert log(conn, suffix) == ["A", "B"]
    with conn.transaction(), conn.cursor() as cur:
        assert fence.admit(cur, "orders", 34) is False  # the same holder again
        assert fence.highest(cur, "orders") == 34
        assert fence.highest(cur, "other") is None


def test_a_newer_writer_waits_for_the_open_check(db):
    conn, fence, suffix = db
    with psycopg.connect(dsn()) as a, psycopg.connect(dsn()) as b:
        b_pid = b.info.backend_pid
        tx_a = a.cursor()
        fence.admit(tx_a, "orders", 33)  # A's transaction is open

        result = {}

        def writer_b():
            try:
                with b.transaction(), b.cursor() as cur:
                    result["admitted"] = fence.admit(cur, "orders", 34)
                    write(cur, suffix, "B")
            except Exception as e:  # reported below
                result["error"] = e

        thread = threading.Thread(target=writer_b)
        thread.start()
        # Go on once B waits for a lock or is done (with the check out of
        # the transaction, B does not wait and is done first).
        deadline = time.monotonic() + 20
        while thread.is_alive():
            row = conn.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (b_pid,)
            ).fetchone()
            conn.commit()
            if row and row[0] == "Lock":
                break
            assert time.monotonic() < deadline, "writer B neither waited nor finished"
            time.sleep(0.005)
        write(tx_a, suffix, "A")
        a.commit()
        thread.join(20)
        assert not thread.is_alive()
        assert "error" not in result, result.get("error")
        assert result["admitted"] is True
    assert log(conn, suffix) == ["A", "B"], "the newer writer's write must land last"


def test_outside_a_transaction_the_check_is_refused(db):
    conn, fence, suffix = db
    with psycopg.connect(dsn(), autocommit=True) as auto:
        with pytest.raises(InvalidArgument, match="outside a transaction"):
            fence.admit(auto.cursor(), "orders", 5)
        assert fence.highest(auto.cursor(), "orders") is None
        # An explicit transaction on an autocommit connection is one.
        with auto.transaction():
            assert fence.admit(auto.cursor(), "orders", 5) is True
        assert fence.highest(auto.cursor(), "orders") == 5


@pytest.mark.parametrize("token", [0, -1, 2**63, "7", 1.0, True, None])
def test_tokens_latchkey_never_issues_are_refused(db, token):
    conn, fence, _ = db
    with pytest.raises(InvalidArgument):
        with conn.transaction(), conn.cursor() as cur:
            fence.admit(cur, "orders", token)
    with conn.cursor() as cur:
        assert fence.highest(cur, "orders") is None


@pytest.mark.parametrize("name", ["", "1x", "a-b", "x; DROP TABLE doc", "a" * 64, None])
def test_bad_table_names_are_refused(name):
    with pytest.raises(InvalidArgument):
        PgFence(name)
