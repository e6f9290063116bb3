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
    """An autocommit connection, and tables of the test's own: a fence, a
    document and a log of writes in the order they ran."""
    suffix = uuid.uuid4().hex[:8]
    with psycopg.connect(dsn(), autocommit=True) as conn:
        fence = PgFence(f"fence_{suffix}")
        fence.install(conn)
        fence.install(conn)  # idempotent
        conn.execute(f"CREATE TABLE doc_{suffix} (id INT PRIMARY KEY, owner TEXT NOT NULL)")
        conn.execute(f"CREATE TABLE log_{suffix} (seq BIGSERIAL PRIMARY KEY, owner TEXT NOT NULL)")
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


def wait_for_lock(observer, pid, thread):
    """Returns once backend ``pid`` waits for a lock or ``thread`` ended."""
    deadline = time.monotonic() + 20
    while thread.is_alive():
        row = observer.execute(
            "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone()
        if row and row[0] == "Lock":
            return
        assert time.monotonic() < deadline, f"backend {pid} neither waited nor finished"
        time.sleep(0.005)


def writer(fence, conn, token, suffix, who, result):
    """A thread: fence, write, commit; what happened goes into ``result``."""

    def run():
        try:
            with fence.transaction(conn, "orders", token) as cur:
                write(cur, suffix, who)
            result["ok"] = True
        except Exception as e:  # reported by the test
            result["error"] = e

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_stale_writer_is_refused_after_the_newer_commit(db):
    conn, fence, suffix = db
    for token, who in ((33, "A"), (34, "B")):
        with fence.transaction(conn, "orders", token) as cur:
            write(cur, suffix, who)
    with pytest.raises(StaleFence) as refused:
        with fence.transaction(conn, "orders", 33) as cur:
            write(cur, suffix, "A late")
    assert (refused.value.name, refused.value.token, refused.value.current) == ("orders", 33, 34)
    assert log(conn, suffix) == ["A", "B"]
    with fence.transaction(conn, "orders", 34):  # the same holder again
        pass
    assert fence.highest(conn, "orders") == 34
    assert fence.highest(conn, "other") is None


def test_a_newer_writer_waits_for_the_open_check(db):
    conn, fence, suffix = db
    with psycopg.connect(dsn()) as a, psycopg.connect(dsn()) as b:
        result = {}
        with fence.transaction(a, "orders", 33) as cur_a:  # A's transaction is open
            thread = writer(fence, b, 34, suffix, "B", result)
            # With the check out of the transaction, B does not wait and is
            # done first.
            wait_for_lock(conn, b.info.backend_pid, thread)
            write(cur_a, suffix, "A")
        thread.join(20)
        assert not thread.is_alive()
        assert "error" not in result, result.get("error")
    assert log(conn, suffix) == ["A", "B"], "the newer writer's write must land last"


def test_a_stale_writer_waiting_behind_the_newer_is_refused(db):
    conn, fence, suffix = db
    with psycopg.connect(dsn()) as newer, psycopg.connect(dsn()) as stale:
        result = {}
        with fence.transaction(newer, "orders", 34) as cur:
            thread = writer(fence, stale, 33, suffix, "stale", result)
            wait_for_lock(conn, stale.info.backend_pid, thread)
            assert thread.is_alive(), "the stale writer did not wait"
            write(cur, suffix, "newer")
        thread.join(20)
        assert isinstance(result.get("error"), StaleFence), result
    assert log(conn, suffix) == ["newer"]


def test_a_connection_already_in_a_transaction_is_refused(db):
    conn, fence, suffix = db
    with psycopg.connect(dsn()) as other:
        with other.transaction():
            with pytest.raises(InvalidArgument, match="already inside a transaction"):
                with fence.transaction(other, "orders", 5):
                    pass
    assert fence.highest(conn, "orders") is None


@pytest.mark.parametrize("token", [0, -1, 2**63, "7", 1.0, True, None])
def test_tokens_latchkey_never_issues_are_refused(db, token):
    conn, fence, _ = db
    with pytest.raises(InvalidArgument):
        with fence.transaction(conn, "orders", token):
            pass
    assert fence.highest(conn, "orders") is None


@pytest.mark.parametrize(
    "name", ["", "1x", "a-b", "Orders", "x; DROP TABLE doc", "a.b.c", "a" * 64, None]
)
def test_bad_table_names_are_refused(name):
    with pytest.raises(InvalidArgument):
        PgFence(name)


def test_reserved_words_and_schemas_are_fine(db):
    conn, _, suffix = db
    conn.execute(f"CREATE SCHEMA app_{suffix}")
    fence = PgFence(f"app_{suffix}.order")
    fence.install(conn)
    with fence.transaction(conn, "orders", 9):
        pass
    assert fence.highest(conn, "orders") == 9
