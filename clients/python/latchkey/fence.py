"""Fencing your own PostgreSQL database: the storage refuses a stale writer.

The same check as the Rust crate ``latchkey-fence``'s ``PgFence``, for the
DB-API drivers with ``%s`` placeholders (psycopg 3, psycopg2). The token is
checked and raised *inside the write's own transaction*: the first statement
locks the resource's row of the fence table until the transaction ends, so a
newer holder's write cannot run in between, and a writer whose token is lower
than one already committed is refused with :class:`~latchkey.StaleFence`::

    import psycopg
    from latchkey.fence import PgFence

    fence = PgFence()
    with psycopg.connect(dsn) as db:
        fence.install(db)                                  # once: CREATE TABLE IF NOT EXISTS
        with db.transaction(), db.cursor() as cur:
            fence.admit(cur, "orders", guard.token)        # StaleFence once superseded
            cur.execute("UPDATE orders SET status = 'shipped' WHERE id = %s", (7,))
        # the check and the write commit together (or roll back together)

The steps, in the caller's transaction: (1) ``INSERT ... VALUES (resource,
0) ON CONFLICT (resource) DO UPDATE SET token = token RETURNING token`` locks
(or creates) the row and reads the highest token admitted (0: none); (2) a
lower token is refused, an equal one accepted, a higher one (3) written. A
check in a separate transaction would let the stale write land last. Under
REPEATABLE READ or SERIALIZABLE a writer that would have to wait gets a
serialization error instead: roll back and retry the transaction.

The fence table is shared with Rust services using ``PgFence`` on the same
database: both read and write it the same way.
"""

import re
from typing import Any, Optional

from latchkey.errors import InvalidArgument, LatchkeyError, StaleFence

#: The fence table's name when none is given (the same as the Rust crate's).
DEFAULT_TABLE = "latchkey_fence"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_MAX_TOKEN = 2**63 - 1
# libpq's PQTRANS_INTRANS: idle inside a transaction block (psycopg 3's
# TransactionStatus.INTRANS, psycopg2's TRANSACTION_STATUS_INTRANS).
_IN_TRANSACTION = 2


class PgFence:
    """Makes a PostgreSQL database refuse writes from superseded lock holders.

    ``table`` names the fence table (a plain identifier: letters, digits and
    underscores, at most 63, not starting with a digit). Several gates, one
    per table, can guard one database.
    """

    def __init__(self, table: str = DEFAULT_TABLE):
        if not isinstance(table, str) or not _IDENTIFIER.match(table):
            raise InvalidArgument(
                f"fence table name {table!r} is not allowed: use 1 to 63 ASCII letters, "
                "digits or underscores, not starting with a digit"
            )
        self.table = table
        self._create = (
            f"CREATE TABLE IF NOT EXISTS {table} ("
            "resource TEXT PRIMARY KEY, token BIGINT NOT NULL CHECK (token >= 0))"
        )
        self._lock_and_read = (
            f"INSERT INTO {table} (resource, token) VALUES (%s, 0) "
            f"ON CONFLICT (resource) DO UPDATE SET token = {table}.token RETURNING token"
        )
        self._raise = f"UPDATE {table} SET token = %s WHERE resource = %s"
        self._read = f"SELECT token FROM {table} WHERE resource = %s"

    def install(self, connection: Any) -> None:
        """Creates the fence table if it does not exist, and commits. Call it
        once at start-up, outside the writers' transactions."""
        with connection.cursor() as cur:
            cur.execute(self._create)
        connection.commit()

    def admit(self, cursor: Any, resource: str, token: int) -> bool:
        """Admits a write to ``resource`` carrying the fencing ``token``, in
        the transaction ``cursor`` runs in. Returns True when the token rose
        (or is the first), False when it equals the highest (the same holder
        writing again).

        Then do the guarded write with the same transaction and commit. On
        any exception nothing was admitted: do not write, roll back.

        Raises :class:`~latchkey.StaleFence` (``name`` the resource,
        ``token`` the refused token, ``current`` the highest admitted) for a
        lower token; :class:`~latchkey.InvalidArgument` for a token that is
        not an integer from 1 to 2**63-1, or when the cursor's connection is
        not inside a transaction (autocommit: the check would commit on its
        own); the driver's own exceptions for database failures.
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
        cursor.execute(self._lock_and_read, (resource,))
        if not _in_transaction(cursor.connection):
            raise InvalidArgument(
                f"the fence check on table {self.table!r} was called outside a transaction: "
                "open one (psycopg 3: `with conn.transaction():`, or autocommit off), admit "
                "the token in it, write in it, then commit"
            )
        row = cursor.fetchone()
        current = row[0] if row else None
        if not isinstance(current, int) or current < 0:
            raise LatchkeyError(
                f"the fence table {self.table!r} holds {current!r} for resource {resource!r}, "
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
        cursor.execute(self._raise, (token, resource))
        return True

    def highest(self, cursor: Any, resource: str) -> Optional[int]:
        """The highest token admitted for ``resource`` and committed (or
        written earlier in the cursor's own transaction), None if none was."""
        cursor.execute(self._read, (resource,))
        row = cursor.fetchone()
        if row is None or row[0] == 0:
            return None
        return int(row[0])


def _in_transaction(connection: Any) -> bool:
    """Whether the connection is inside a transaction block, as libpq tells
    (psycopg 3 or psycopg2); without a way to ask, whether autocommit is off."""
    info = getattr(connection, "info", None)
    status = getattr(info, "transaction_status", None)
    if status is None and hasattr(connection, "get_transaction_status"):
        status = connection.get_transaction_status()
    if status is not None:
        return int(status) == _IN_TRANSACTION
    return not getattr(connection, "autocommit", False)
