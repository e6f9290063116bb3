//! [`PgFence`]: the fence check inside the caller's PostgreSQL transaction.

use tokio_postgres::{GenericClient, Transaction};

use crate::error::FenceError;
use crate::rule::{decide, Admission};
use crate::sql::{checked_table_name, highest_from_row, stored_token, Statements, DEFAULT_TABLE};

/// Makes a PostgreSQL database refuse writes from superseded lock holders:
/// the fencing token is checked and raised inside the same transaction as
/// the write it guards, so the database itself refuses a stale writer.
///
/// The gate keeps one row per resource in a fence table (by default
/// `latchkey_fence`: `resource TEXT PRIMARY KEY, token BIGINT`) in the
/// guarded database. [`admit`](Self::admit) takes the caller's
/// [`Transaction`], so it cannot be called in autocommit mode. Its first
/// statement locks the resource's row until the transaction ends: another
/// writer of the same resource waits there, and then sees the token this
/// one committed. Writers of other resources do not wait. How the steps
/// work, and why a check in another transaction would not do, is told in
/// the crate's documentation.
///
/// Any isolation level works. Under READ COMMITTED (PostgreSQL's default)
/// the second writer waits and then decides on the committed token; under
/// REPEATABLE READ or SERIALIZABLE it fails with a serialization error
/// ([`FenceError::Database`]) instead: roll back and retry the whole
/// transaction, which then sees the new token.
///
/// The rules are those of [`FenceGate`](crate::FenceGate) (per resource,
/// zero refused, lower refused, equal accepted, higher raised, atomic,
/// nothing admitted on error, never forgets), with the database's limits:
/// tokens above `i64::MAX` are refused ([`FenceError::TokenTooLarge`]) and
/// resource names cannot hold the NUL character (PostgreSQL's text type
/// refuses it: [`FenceError::Database`]).
///
/// Each admission costs two statements (three when the token rises); the
/// driver prepares them on first use per connection.
///
/// ```no_run
/// use latchkey_fence::PgFence;
///
/// # async fn demo(db: &mut tokio_postgres::Client, token: u64) -> Result<(), Box<dyn std::error::Error>> {
/// let fence = PgFence::new();
/// fence.install(&*db).await?; // once, at start-up
///
/// // `token` is the writer's lock guard's fencing token (`guard.token()`).
/// let tx = db.transaction().await?;
/// fence.admit(&tx, "orders", token).await?; // stale? `?` drops tx: rolled back
/// tx.execute("UPDATE orders SET status = 'shipped' WHERE id = 7", &[]).await?;
/// tx.commit().await?;
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
    /// The gate on the table `latchkey_fence` (in the connection's search
    /// path, usually the `public` schema).
    pub fn new() -> PgFence {
        PgFence {
            sql: Statements::new(DEFAULT_TABLE.to_owned(), '$'),
        }
    }

    /// The gate on another table (several gates, one per table, can guard
    /// one database). The name must be a plain identifier:
    /// [`FenceError::BadTableName`] otherwise.
    pub fn with_table(name: &str) -> Result<PgFence, FenceError> {
        Ok(PgFence {
            sql: Statements::new(checked_table_name(name)?, '$'),
        })
    }

    /// The fence table's name.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// Creates the fence table if it does not exist. Call it once at
    /// start-up, outside the writers' transactions.
    pub async fn install(&self, db: &impl GenericClient) -> Result<(), FenceError> {
        db.execute(self.sql.create.as_str(), &[])
            .await
            .map(drop)
            .map_err(self.sql.failed("create the fence table"))
    }

    /// Admits a write to `resource` carrying the fencing `token`, inside
    /// the transaction `tx`.
    ///
    /// On `Ok`, do the guarded write in `tx` and commit. On any error
    /// nothing was admitted: do not write, and roll back (a dropped
    /// `Transaction` does).
    pub async fn admit(
        &self,
        tx: &Transaction<'_>,
        resource: &str,
        token: u64,
    ) -> Result<Admission, FenceError> {
        let stored = stored_token(resource, token)?;
        let current: i64 = tx
            .query_one(self.sql.lock_and_read.as_str(), &[&resource])
            .await
            .and_then(|row| row.try_get(0))
            .map_err(self.sql.failed("lock and read the resource's row"))?;
        let highest = highest_from_row(&self.sql.table, resource, current)?;
        let admission = decide(resource, token, highest)?;
        if let Admission::Raised { .. } = admission {
            tx.execute(self.sql.raise.as_str(), &[&resource, &stored])
                .await
                .map_err(self.sql.failed("raise the resource's token"))?;
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
            .map_err(self.sql.failed("read the resource's row"))?;
        match row {
            Some(row) => {
                let stored: i64 = row
                    .try_get(0)
                    .map_err(self.sql.failed("read the resource's row"))?;
                highest_from_row(&self.sql.table, resource, stored)
            }
            None => Ok(None),
        }
    }
}
