//! [`SqliteFence`]: the fence check inside the caller's SQLite transaction.

use rusqlite::{params, Connection, OptionalExtension};

use crate::error::FenceError;
use crate::rule::{decide, Admission};
use crate::sql::{checked_table_name, highest_from_row, stored_token, Statements, DEFAULT_TABLE};

/// Makes an SQLite database refuse writes from superseded lock holders:
/// the fencing token is checked and raised inside the same transaction as
/// the write it guards.
///
/// The gate keeps one row per resource in a fence table (by default
/// `latchkey_fence`: `resource TEXT PRIMARY KEY, token BIGINT`) in the
/// guarded database itself. [`admit`](Self::admit) must run in the
/// transaction that then does the write; it refuses a connection in
/// autocommit mode ([`FenceError::NotInTransaction`]). Its first statement
/// takes SQLite's write lock, so every other writer of the database waits
/// (up to the connection's busy timeout) until this transaction ends: the
/// check, the raise and the write are one step. How the three steps work,
/// and why a check in another transaction would not do, is told in the
/// crate's documentation.
///
/// The rules are those of [`FenceGate`](crate::FenceGate) (per resource,
/// zero refused, lower refused, equal accepted, higher raised, atomic,
/// nothing admitted on error, never forgets), with the database's limits:
/// tokens above `i64::MAX` are refused ([`FenceError::TokenTooLarge`]).
///
/// ```
/// use latchkey_fence::{FenceError, SqliteFence};
/// use rusqlite::{params, Connection};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut db = Connection::open_in_memory()?;
/// db.execute_batch("CREATE TABLE orders (id INTEGER PRIMARY KEY, status TEXT)")?;
/// let fence = SqliteFence::new();
/// fence.install(&db)?;
///
/// // `token` is the writer's lock guard's fencing token (`guard.token()`).
/// let write = |db: &mut Connection, token: u64, status: &str| -> Result<(), Box<dyn std::error::Error>> {
///     let tx = db.transaction()?;
///     fence.admit(&tx, "orders", token)?; // refused? the transaction rolls back on drop
///     tx.execute("INSERT OR REPLACE INTO orders VALUES (1, ?1)", params![status])?;
///     tx.commit()?;
///     Ok(())
/// };
/// write(&mut db, 33, "draft")?;   // holder 1, token 33
/// write(&mut db, 34, "final")?;   // holder 1's lease ran out; holder 2 has 34
/// let late = write(&mut db, 33, "late draft").unwrap_err(); // holder 1 wakes up
/// assert!(matches!(
///     late.downcast_ref::<FenceError>(),
///     Some(FenceError::Stale { token: 33, highest: 34, .. })
/// ));
/// let status: String = db.query_row("SELECT status FROM orders", [], |r| r.get(0))?;
/// assert_eq!(status, "final");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteFence {
    sql: Statements,
}

impl Default for SqliteFence {
    fn default() -> Self {
        SqliteFence::new()
    }
}

impl SqliteFence {
    /// The gate on the table `latchkey_fence`.
    pub fn new() -> SqliteFence {
        SqliteFence {
            sql: Statements::new(DEFAULT_TABLE.to_owned(), '?'),
        }
    }

    /// The gate on another table (several gates, one per table, can guard
    /// one database). The name must be a plain identifier:
    /// [`FenceError::BadTableName`] otherwise.
    pub fn with_table(name: &str) -> Result<SqliteFence, FenceError> {
        Ok(SqliteFence {
            sql: Statements::new(checked_table_name(name)?, '?'),
        })
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the fence table if it does not exist (in its own statement:
    /// call it once at start-up, outside the writers' transactions).
    pub fn install(&self, db: &Connection) -> Result<(), FenceError> {
        db.execute(&self.sql.create, [])
            .map(drop)
            .map_err(self.sql.failed("create the fence table"))
    }

    /// Admits a write to `resource` carrying the fencing `token`, inside
    /// the transaction open on `tx` (a [`rusqlite::Transaction`] or
    /// [`rusqlite::Savepoint`], which dereference to a connection, or a
    /// connection after `BEGIN`).
    ///
    /// On `Ok`, do the guarded write in the same transaction and commit. On
    /// any error nothing was admitted: do not write, and roll back (a
    /// dropped `Transaction` does).
    pub fn admit(
        &self,
        tx: &Connection,
        resource: &str,
        token: u64,
    ) -> Result<Admission, FenceError> {
        let stored = stored_token(resource, token)?;
        if tx.is_autocommit() {
            return Err(FenceError::NotInTransaction {
                table: self.sql.table.clone(),
            });
        }
        let current: i64 = tx
            .prepare_cached(&self.sql.lock_and_read)
            .and_then(|mut st| st.query_row(params![resource], |row| row.get(0)))
            .map_err(self.sql.failed("lock and read the resource's row"))?;
        let highest = highest_from_row(&self.sql.table, resource, current)?;
        let admission = decide(resource, token, highest)?;
        if let Admission::Raised { .. } = admission {
            tx.prepare_cached(&self.sql.raise)
                .and_then(|mut st| st.execute(params![resource, stored]))
                .map_err(self.sql.failed("raise the resource's token"))?;
        }
        Ok(admission)
    }

    /// The highest token admitted for `resource` and committed (or written
    /// earlier in `db`'s own open transaction), `None` if none was.
    pub fn highest(&self, db: &Connection, resource: &str) -> Result<Option<u64>, FenceError> {
        let stored: Option<i64> = db
            .prepare_cached(&self.sql.read)
            .and_then(|mut st| st.query_row(params![resource], |row| row.get(0)).optional())
            .map_err(self.sql.failed("read the resource's row"))?;
        match stored {
            Some(stored) => highest_from_row(&self.sql.table, resource, stored),
            None => Ok(None),
        }
    }
}
