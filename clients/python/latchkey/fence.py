"""Fencing your own PostgreSQL database: the storage refuses a stale writer.

The same check as the Rust crate ``latchkey-fence``'s ``PgFence``, for the
psycopg 3. The token is checked and raised *as the first statement of the
write's own transaction*: it locks the resource's row of the fence table
until the transaction ends, so a newer holder's write cannot run in between,
and a writer whose token is lower than one already committed is refused with
:class:`~latchkey.StaleFence`::

    import psycopg
    from latchkey.fence import PgFence

    fence = PgFence()
    with psycopg.connect(dsn) as db:
        fence.install(db)                                  # once: CREATE TABLE IF NOT EXISTS
        with fence.transaction(db, "orders", guard.token) as cur:   # StaleFence once superseded
            cur.execute("UPDATE orders SET status = 'shipped' WHERE id = %s", (7,))
        # the check and the write commit together (or roll back together)

The steps, first in the transaction: (1) ``INSERT INTO t AS fence ... VALUES
(resource, 0) ON CONFLICT (resource) DO UPDATE SET token = fence.token
RETURNING token`` locks (or creates) the row and reads the highest token
admitted (0: none); (2) a lower token is refused, an equal one accepted, a
higher one (3) written. A check in a separate transaction would let the
stale write land last; one inside a savepoint (a nested ``transaction()``)
would be undone by rolling the savepoint back, which is why
:meth:`PgFence.transaction` opens the transaction itself and refuses a
connection already inside one. Under REPEATABLE READ or SERIALIZABLE a writer
that would have to wait gets a serialization error instead: run the
transaction again.

The fence table is shared with Rust services using ``PgFence`` on the same
database: both read and write it the same way.
"""

import re
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from latchkey.errors import InvalidArgument, LatchkeyError, StaleFence

#: The fence table's name when none is given (the same as the Rust crate's).
DEFAULT_TABLE = "latchkey_fence"

_PART = r"[a-z_][a-z0-9_]{0,62}"
_TABLE_NAME = re.compile(rf"(?:{_PART}\.)?{_PART}\Z")
_MAX_TOKEN = 2**63 - 1
# libpq's PQTRANS_IDLE: not inside a transaction block (psycopg 3's
# TransactionStatus.IDLE).
_IDLE = 0


class PgFence:
    """Makes a PostgreSQL database refuse writes from superseded lock holders.

    ``table`` names the fence table: ``name`` or ``schema.name``, each part
    lower-case letters, digits and underscores (at most 63, not starting
    with a digit). Names are quoted, so reserved words are fine. Several
    gates, one per table, can guard one database. Give the schema when
    services with different search paths share the table.
    """

    def __init__(self, table: str = DEFAULT_TABLE):
        if not isinstance(table, str) or not _TABLE_NAME.match(table):
            raise InvalidArgument(
                f"fence table name {table!r} is not allowed: use 1 to 63 lower-case ASCII "
                "letters, digits or underscores, not starting with a digit, optionally after "
                "a schema name of the same kind and a dot (app.latchkey_fence)"
            )
        self.table = table
        t = ".".join(f'"{part}"' for part in table.split("."))
        self._install = (
            f"SELECT pg_advisory_xact_lock(hashtext('latchkey-fence:{table}')); "
            f"CREATE TABLE IF NOT EXISTS {t} ("
            "resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token >= 0))"
        )
        self._lock_and_read = (
            f"INSERT INTO {t} AS fence (resource, token) VALUES (%s, 0) "
            "ON CONFLICT (resource) DO UPDATE SET token = fence.token RETURNING token"
        )
        self._raise = f"UPDATE {t} SET token = %s WHERE resource = %s"
        self._read = f"SELECT token FROM {t} WHERE resource = %s"

    def install(self, connection: Any) -> None:
        """Creates the fence table if it does not exist, and commits. Call it
        at start-up; services starting together may all call it (they take
        turns on an advisory lock named after the table, as the Rust gate
        does)."""
        with connection.transaction():
            for statement in self._install.split("; "):
                connection.execute(statement)

    @contextmanager
    def transaction(self, connection: Any, resource: str, token: int) -> Iterator[Any]:
        """Opens a transaction on ``connection`` (psycopg 3), admits a write
        to ``resource`` carrying the fencing ``token`` as its first
        statement, and yields a cursor of that transaction for the write.
        Leaving the block commits (an exception rolls back).

        Raises :class:`~latchkey.StaleFence` (``name`` the resource,
        ``token`` the refused token, ``current`` the highest admitted) for a
        lower token; :class:`~latchkey.InvalidArgument` for a token that is
        not an integer from 1 to 2**63-1, or a connection already inside a
        transaction; the driver's own exceptions for database failures. On
        any of them nothing was admitted or written.
        """
        if not isinstance(token, int) or isinstance(token, bool) or token < 1:
            raise InvalidArgument(
                f"token {token!r} for resource {resource!r} was never issued by latchkey "
                "(tokens start at 1): pass the fencing token of the writer's lock guard"
            )
        if token > _MAX_TOKEN:
            raise InvalidArgument(
                f"token {token} for resource {resource!r} is larger than a database fence "
                f"can store (at most {_MAX_TOKEN}): it was not issued by latchkey"
            )
        if int(connection.info.transaction_status) != _IDLE:
            raise InvalidArgument(
                f"fence table {self.table}: the connection is already inside a transaction; "
                "the gate opens the transaction itself (so that no savepoint can undo the "
                "check): commit or roll back the open one first"
            )
        with connection.transaction(), connection.cursor() as cur:
            self._admit(cur, resource, token)
            yield cur

    def _admit(self, cur: Any, resource: str, token: int) -> bool:
        cur.execute(self._lock_and_read, (resource,))
        row = cur.fetchone()
        current = row[0] if row else None
        if not isinstance(current, int) or current < 0:
            raise LatchkeyError(
                f"the fence table {self.table} holds {current!r} for resource {resource!r}, "
                "which no gate writes: it was changed by hand; restore it from a backup"
            )
        if token < current:
            raise StaleFence(
                f"token {token} is older than {current} already seen for resource "
                f"{resource!r}: a newer lock holder has written; this writer must stop",
                name=resource,
                token=token,
                current=current,
            )
        if token == current:
            return False
        cur.execute(self._raise, (token, resource))
        return True

    def highest(self, connection: Any, resource: str) -> Optional[int]:
        """The highest token admitted for ``resource`` and committed (or
        written earlier in the connection's own transaction), None if none
        was."""
        idle = int(connection.info.transaction_status) == _IDLE
        row = connection.execute(self._read, (resource,)).fetchone()
        if idle and not connection.autocommit:
            connection.commit()  # end the transaction the read began
        if row is None or row[0] == 0:
            return None
        return int(row[0])
