//! [`SqliteFence`]: the fence check as the first statement of an SQLite
//! transaction the write then uses.

use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior,
};

use crate::error::FenceError;
use crate::rule::{decide, Admission};
use crate::sql::{checked_table_name, highest_from_row, stored_token, Statements, DEFAULT_TABLE};

/// Makes an SQLite database refuse writes from superseded lock holders:
/// the fencing token is checked and raised in the same transaction as the
/// write it guards.
///
/// The gate keeps one row per resource in a fence table (by default
/// `latchkey_fence`: `resource TEXT PRIMARY KEY, token BIGINT`), which must
/// live in the same database file as the guarded data (a commit across
/// attached databases is not atomic in WAL mode). [`begin`](Self::begin)
/// opens an IMMEDIATE transaction, which takes SQLite's write lock at once
/// (every other writer of the database waits, up to its busy timeout), and
/// makes the check its first statement: the check, the raise and the write
/// are one step. The gate opens the transaction itself so that the check
/// cannot end up inside a savepoint whose rollback would undo it.
///
/// The rules are those of [`FenceGate`](crate::FenceGate) (per resource,
/// zero refused, lower refused, equal accepted, higher raised, atomic,
/// nothing admitted on error, never forgets), with the database's limits:
/// tokens above `i64::MAX` are refused ([`FenceError::TokenTooLarge`]).
/// A busy database (the busy timeout ran out) is a [`FenceError::Database`]
/// with [`retry`](FenceError::retry) true.
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
///     let (tx, _) = fence.begin(db, "orders", token)?; // refused: nothing was written
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

    /// The gate on another table, `name` or `schema.name` (several gates,
    /// one per table, can guard one database): lower-case letters, digits
    /// and underscores; [`FenceError::BadTableName`] otherwise.
    pub fn with_table(name: &str) -> Result<SqliteFence, FenceError> {
        Ok(SqliteFence {
            sql: Statements::new(checked_table_name(name)?, '?'),
        })
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the fence table if it does not exist (call it at start-up).
    pub fn install(&self, db: &Connection) -> Result<(), FenceError> {
        db.execute(&self.sql.create, [])
            .map(drop)
            .map_err(|e| self.failed("create the fence table", e))
    }

    /// Opens an IMMEDIATE transaction on `db` and admits a write to
    /// `resource` carrying the fencing `token` as its first statement.
    ///
    /// On `Ok`, do the guarded write in the returned transaction and commit.
    /// On any error nothing was admitted and the transaction is rolled back.
    /// A connection already inside a transaction is refused
    /// ([`FenceError::NestedTransaction`]).
    pub fn begin<'a>(
        &self,
        db: &'a mut Connection,
        resource: &str,
        token: u64,
    ) -> Result<(Transaction<'a>, Admission), FenceError> {
        let stored = stored_token(resource, token)?;
        if !db.is_autocommit() {
            return Err(FenceError::NestedTransaction {
                table: self.sql.table.clone(),
            });
        }
        let tx = db
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| self.failed("begin the transaction", e))?;
        let current: i64 = tx
            .prepare_cached(&self.sql.lock_and_read)
            .and_then(|mut st| st.query_row(params![resource], |row| row.get(0)))
            .map_err(|e| self.failed("lock and read the resource's row", e))?;
        let highest = highest_from_row(&self.sql.table, resource, current)?;
        let admission = decide(resource, token, highest)?;
        if let Admission::Raised { .. } = admission {
            tx.prepare_cached(&self.sql.raise)
                .and_then(|mut st| st.execute(params![resource, stored]))
                .map_err(|e| self.failed("raise the resource's token", e))?;
        }
        Ok((tx, admission))
    }

    /// The highest token admitted for `resource` and committed (or written
    /// earlier in `db`'s own open transaction), `None` if none was.
    pub fn highest(&self, db: &Connection, resource: &str) -> Result<Option<u64>, FenceError> {
        let stored: Option<i64> = db
            .prepare_cached(&self.sql.read)
            .and_then(|mut st| st.query_row(params![resource], |row| row.get(0)).optional())
            .map_err(|e| self.failed("read the resource's row", e))?;
        match stored {
            Some(stored) => highest_from_row(&self.sql.table, resource, stored),
            None => Ok(None),
        }
    }

    /// A driver error as a [`FenceError::Database`]; a busy or locked
    /// database is worth a retry.
    fn failed(&self, action: &'static str, e: rusqlite::Error) -> FenceError {
        let retry = matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
        );
        self.sql.failed(action, e.to_string(), retry, Box::new(e))
    }
}
