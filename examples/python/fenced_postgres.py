"""PostgreSQL refuses a paused lock holder's write (latchkey package + psycopg).

    pip install ./clients/python "psycopg[binary]"
    python examples/python/fenced_postgres.py ENDPOINTS --postgres "host=... dbname=..."

Starts two worker processes (this script with --worker) that take the lock
"orders" and write rows to PostgreSQL, each write's transaction opened by
``latchkey.fence.PgFence``, the token checked first. Worker A is frozen
(SIGSTOP) while it holds the lock, as a long GC pause would; once its
session's TTL has run out, worker B is granted the lock with a higher token
and writes. Worker A is woken up and writes with its old token: PostgreSQL
refuses it (StaleFence) and A exits with code 3. The script then checks
that no write of A landed after B's first, and exits non-zero if anything
went otherwise. `cargo xtask test` runs it against a throwaway PostgreSQL.

The workers trust only the fence, to show the database's refusal; a real
worker also stops when ``guard.held`` turns false.
"""

import argparse
import os
import signal
import subprocess
import sys
import time

import psycopg

import latchkey
from latchkey.fence import PgFence

LOCK = "orders"
REFUSED = 3


def worker(args):
    """Take the lock and write a row every 200 ms, printing each commit."""
    fence = PgFence()
    with psycopg.connect(args.postgres, application_name=f"fenced_postgres {args.who}") as db:
        with latchkey.Client(args.endpoints.split(",")) as client:
            with client.session(ttl=args.ttl) as session, session.lock(LOCK) as guard:
                print(f"holding {LOCK} with token {guard.token}", flush=True)
                for n in range(1, 1000):
                    try:
                        with fence.transaction(db, LOCK, guard.token) as cur:
                            cur.execute(
                                "INSERT INTO fenced_writes (who, token, n) VALUES (%s, %s, %s)",
                                (args.who, guard.token, n),
                            )
                    except latchkey.StaleFence as refused:
                        print(f"refused by PostgreSQL: {refused}", flush=True)
                        os._exit(REFUSED)  # no clean release: this holder lost the lock
                    print(f"wrote {n} with token {guard.token}", flush=True)
                    time.sleep(0.2)


def start_worker(args, who):
    return subprocess.Popen(
        [sys.executable, "-u", __file__, args.endpoints, "--postgres", args.postgres,
         "--worker", who, "--ttl", str(args.ttl)],
        stdout=subprocess.PIPE,
        text=True,
    )


def read_until(proc, prefix, who):
    """Lines of a worker until one starts with ``prefix``; counts writes."""
    wrote = 0
    while True:
        line = proc.stdout.readline()
        if not line:
            sys.exit(f"worker {who} ended before printing {prefix!r}")
        line = line.strip()
        print(f"[worker {who}] {line}")
        wrote += line.startswith("wrote ")
        if line.startswith(prefix):
            return line, wrote


def main(args):
    with psycopg.connect(args.postgres, autocommit=True) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS fenced_writes ("
            "seq BIGSERIAL PRIMARY KEY, who TEXT NOT NULL, token BIGINT NOT NULL, n INT NOT NULL)"
        )
        db.execute("TRUNCATE fenced_writes")
        PgFence().install(db)
        a = start_worker(args, "A")
        b = None
        try:
            line, a_wrote = read_until(a, "holding ", "A")
            a_token = int(line.rsplit(" ", 1)[1])
            # Freeze A between two transactions (frozen inside one, it would
            # hold the fence row and B would wait for it).
            for _ in range(20):
                a_wrote += read_until(a, "wrote ", "A")[1]
                a.send_signal(signal.SIGSTOP)
                state = db.execute(
                    "SELECT state FROM pg_stat_activity WHERE application_name = 'fenced_postgres A'"
                ).fetchone()
                if state and state[0] == "idle":
                    break
                a.send_signal(signal.SIGCONT)
            else:
                sys.exit("worker A was never caught between two transactions")
            print(f"[main    ] worker A (token {a_token}) frozen; worker B waits for the lock")

            b = start_worker(args, "B")
            line, _ = read_until(b, "holding ", "B")
            b_token = int(line.rsplit(" ", 1)[1])
            read_until(b, "wrote 3 ", "B")
            print("[main    ] worker A wakes up")
            a.send_signal(signal.SIGCONT)
            line, more = read_until(a, "refused by PostgreSQL", "A")
            a_wrote += more
            if a.wait(30) != REFUSED:
                sys.exit(f"worker A exited {a.returncode}, not {REFUSED} (refused)")
        finally:
            for proc in (a, b):
                if proc and proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                    proc.wait()

        rows = db.execute("SELECT who, token FROM fenced_writes ORDER BY seq").fetchall()
        first_b = next(i for i, (who, _) in enumerate(rows) if who == "B")
        if rows[:first_b] != [("A", a_token)] * a_wrote or any(
            r != ("B", b_token) for r in rows[first_b:]
        ):
            sys.exit(f"the table does not show A's writes, then only B's: {rows}")
        print(
            f"[main    ] PostgreSQL holds {a_wrote} writes of A (token {a_token}), then "
            f"{len(rows) - first_b} of B (token {b_token}); A's late write was refused"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("endpoints", help="host:port of every replica, comma-separated")
    parser.add_argument("--postgres", required=True, help="libpq connection string")
    parser.add_argument("--ttl", type=float, default=3.0, help="the workers' session TTL (s)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.worker:
        parsed.who = parsed.worker
        worker(parsed)
    else:
        main(parsed)
