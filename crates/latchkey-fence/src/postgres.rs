//! [`PgFence`]: the fence check as the first statement of a PostgreSQL
//! transaction the write then uses.

use tokio_postgres::types::Type;
use tokio_postgres::{Client, GenericClient, Transaction, TransactionBuilder};

use crate::error::FenceError;
use crate::rule::{decide, Admission};
use crate::sql::{checked_table_name, highest_from_row, stored_token, Statements, DEFAULT_TABLE};

/// Makes a PostgreSQL database refuse writes from superseded lock holders:
/// the fencing token is checked and raised in the same transaction as the
/// write it guards, so the database itself refuses a stale writer.
///
/// The gate keeps one row per resource in a fence table (by default
/// `latchkey_fence`: `resource TEXT PRIMARY KEY, token BIGINT`) in the
/// guarded database. [`begin`](Self::begin) opens the transaction and makes
/// the check its first statement, which locks the resource's row until the
/// transaction ends: another writer of the same resource waits there, and
/// then sees the token this one committed. Writers of other resources do
/// not wait. The caller does its write in the returned transaction and
/// commits.
///
/// The gate opens the transaction itself so that the check cannot end up
/// inside a savepoint: rolling a savepoint back would undo the raise and
/// release the row's lock while the write still commits. Savepoints taken
/// after `begin` are harmless. Do not also send a raw `BEGIN` or `COMMIT` on
/// the connection.
///
/// Any isolation level works ([`begin_with`](Self::begin_with) takes a
/// [`TransactionBuilder`]). Under READ COMMITTED (PostgreSQL's default) the
/// second writer waits and then decides on the committed token; under
/// REPEATABLE READ or SERIALIZABLE it fails with a serialization error
/// instead ([`FenceError::Database`] with [`retry`](FenceError::retry)
/// true): run the transaction again, which then sees the new token.
///
/// The rules are those of [`FenceGate`](crate::FenceGate) (per resource,
/// zero refused, lower refused, equal accepted, higher raised, atomic,
/// nothing admitted on error, never forgets), with the database's limits:
/// tokens above `i64::MAX` are refused ([`FenceError::TokenTooLarge`]);
/// resource names cannot hold the NUL character, and a name longer than
/// about 2,700 bytes does not fit PostgreSQL's index (both
/// [`FenceError::Database`]).
///
/// The table is found through the connection's `search_path` unless the
/// name says its schema (`PgFence::with_table("app.latchkey_fence")`): give
/// the schema when services with different search paths must share it.
///
/// Each admission costs two round trips (three when the token rises): the
/// `BEGIN`, the check, and the raise.
///
/// ```no_run
/// use latchkey_fence::PgFence;
///
/// # async fn demo(db: &mut tokio_postgres::Client, token: u64) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = PgFence::new();
/// fence.install(&*db).await?; // once, at start-up
///
/// // `token` is the writer's lock guard's fencing token (`guard.token()`).
/// let (tx, _) = fence.begin(db, "orders", token).await?; // Err(Stale) once superseded
/// tx.execute("UPDATE orders SET status = 'shipped' WHERE id = 7", &[]).await?;
/// tx.commit().await?; // the check and the write commit together
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct PgFence {
    sql: Statements,
}

impl Default for PgFence {
    fn default() -> Self {
        PgFence::new()
    }
}

impl PgFence {
    /// The gate on the table `latchkey_fence` (found through the
    /// connection's search path, usually in the `public` schema).
    pub fn new() -> PgFence {
        PgFence {
            sql: Statements::new(DEFAULT_TABLE.to_owned(), '$'),
        }
    }

    /// The gate on another table, `name` or `schema.name` (several gates,
    /// one per table, can guard one database): lower-case letters, digits
    /// and underscores; [`FenceError::BadTableName`] otherwise.
    pub fn with_table(name: &str) -> Result<PgFence, FenceError> {
        Ok(PgFence {
            sql: Statements::new(checked_table_name(name)?, '$'),
        })
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the fence table if it does not exist. Call it at start-up;
    /// services starting together may all call it (they take turns on an
    /// advisory lock named after the table).
    pub async fn install(&self, db: &impl GenericClient) -> Result<(), FenceError> {
        // One simple query: its statements run as one transaction, which
        // holds the advisory lock until the table exists.
        let script = format!(
            "SELECT pg_advisory_xact_lock(hashtext('latchkey-fence:{}')); {}",
            self.sql.table, self.sql.create
        );
        db.batch_execute(&script)
            .await
            .map_err(|e| self.failed("create the fence table", e))
    }

    /// Opens a transaction on `db` and admits a write to `resource` carrying
    /// the fencing `token` as its first statement.
    ///
    /// On `Ok`, do the guarded write in the returned transaction and commit.
    /// On any error nothing was admitted and the transaction is rolled back.
    pub async fn begin<'a>(
        &self,
        db: &'a mut Client,
        resource: &str,
        token: u64,
    ) -> Result<(Transaction<'a>, Admission), FenceError> {
        self.begin_with(db.build_transaction(), resource, token)
            .await
    }

    /// [`begin`](Self::begin) with a transaction built as `builder` says
    /// (isolation level, read-only is refused by the database at the raise,
    /// deferrable).
    pub async fn begin_with<'a>(
        &self,
        builder: TransactionBuilder<'a>,
        resource: &str,
        token: u64,
    ) -> Result<(Transaction<'a>, Admission), FenceError> {
        let stored = stored_token(resource, token)?;
        let tx = builder
            .start()
            .await
            .map_err(|e| self.failed("begin the transaction", e))?;
        let admission = self.admit(&tx, resource, token, stored).await?;
        Ok((tx, admission))
    }

    /// The three steps, in `tx`. On error the caller drops `tx` (rolled
    /// back).
    async fn admit(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        token: u64,
        stored: i64,
    ) -> Result<Admission, FenceError> {
        let current: i64 = tx
            .query_typed_one(&self.sql.lock_and_read, &[(&resource, Type::TEXT)])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| self.failed("lock and read the resource's row", e))?;
        let highest = highest_from_row(&self.sql.table, resource, current)?;
        let admission = decide(resource, token, highest)?;
        if let Admission::Raised { .. } = admission {
            tx.query_typed(
                &self.sql.raise,
                &[(&resource, Type::TEXT), (&stored, Type::INT8)],
            )
            .await
            .map_err(|e| self.failed("raise the resource's token", e))?;
        }
        Ok(admission)
    }

    /// The highest token admitted for `resource` and committed (or written
    /// earlier in `db`'s own transaction), `None` if none was.
    pub async fn highest(
        &self,
        db: &impl GenericClient,
        resource: &str,
    ) -> Result<Option<u64>, FenceError> {
        let row = db
            .query_opt(self.sql.read.as_str(), &[&resource])
            .await
            .map_err(|e| self.failed("read the resource's row", e))?;
        match row {
            Some(row) => {
                let stored: i64 = row
                    .try_get(0)
                    .map_err(|e| self.failed("read the resource's row", e))?;
                highest_from_row(&self.sql.table, resource, stored)
            }
            None => Ok(None),
        }
    }

    /// A driver error as a [`FenceError::Database`], with the server's
    /// message and SQLSTATE (tokio-postgres's own text is only "db error").
    fn failed(&self, action: &'static str, e: tokio_postgres::Error) -> FenceError {
        let (detail, retry) = match e.as_db_error() {
            Some(db) => {
                let code = db.code().code();
                // 40001 serialization_failure, 40P01 deadlock_detected.
                let retry = code == "40001" || code == "40P01";
                (format!("{} (SQLSTATE {code})", db.message()), retry)
            }
            None => (e.to_string(), false),
        };
        self.sql.failed(action, detail, retry, Box::new(e))
    }
}
