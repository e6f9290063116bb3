//! What the database gates share: the fence table's name, its statements
//! (the three steps are described in the crate's documentation), and the
//! checks made before and after the database is asked.

use crate::error::FenceError;

/// The fence table's name when none is given.
pub const DEFAULT_TABLE: &str = "latchkey_fence";

/// A fence table name checked to be `name` or `schema.name`, each part 1
/// to 63 lower-case ASCII letters, digits or underscores, not starting with
/// a digit; the table part not starting with `sqlite_` (SQLite's own). The
/// gates write each part in double quotes, so reserved words (`order`,
/// `user`) are fine, and lower case means the quoted name is the one an
/// unquoted query finds.
pub(crate) fn checked_table_name(name: &str) -> Result<String, FenceError> {
    let part_ok = |part: &str| {
        let mut chars = part.chars();
        matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && part.len() <= 63
    };
    let table = name.rsplit('.').next().unwrap_or(name);
    let ok = match name.split_once('.') {
        Some((schema, table)) => part_ok(schema) && part_ok(table),
        None => part_ok(name),
    } && !table.starts_with("sqlite_");
    if ok {
        Ok(name.to_owned())
    } else {
        Err(FenceError::BadTableName {
            name: name.to_owned(),
        })
    }
}

/// A checked table name as SQL: each part in double quotes.
fn quoted(name: &str) -> String {
    name.split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// The token as the database stores it (a signed 64-bit integer), after
/// the checks that need no database: zero and too large are refused.
pub(crate) fn stored_token(resource: &str, token: u64) -> Result<i64, FenceError> {
    if token == 0 {
        return Err(FenceError::ZeroToken {
            resource: resource.to_owned(),
        });
    }
    i64::try_from(token).map_err(|_| FenceError::TokenTooLarge {
        resource: resource.to_owned(),
        token,
    })
}

/// The highest token admitted, from what the resource's row holds: 0 (a
/// row created by a check that admitted nothing) is none; a negative value
/// was not written by a gate.
pub(crate) fn highest_from_row(
    table: &str,
    resource: &str,
    stored: i64,
) -> Result<Option<u64>, FenceError> {
    match u64::try_from(stored) {
        Ok(0) => Ok(None),
        Ok(token) => Ok(Some(token)),
        Err(_) => Err(FenceError::CorruptRow {
            table: table.to_owned(),
            resource: resource.to_owned(),
            stored,
        }),
    }
}

/// The statements of a fence table, with the placeholder style of the
/// database (`$1` or `?1`).
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// The table's name, as given.
    pub table: String,
    /// Creates the table if it does not exist.
    pub create: String,
    /// Step 1: lock the resource's row (creating it with 0) and read it.
    pub lock_and_read: String,
    /// Step 3: raise the row to a higher token.
    pub raise: String,
    /// Read the row without locking it.
    pub read: String,
}

impl Statements {
    /// The statements for `table` (already checked), placeholders written
    /// as `{mark}1`, `{mark}2`.
    pub fn new(table: String, mark: char) -> Statements {
        let t = quoted(&table);
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                 resource TEXT PRIMARY KEY, \
                 token BIGINT NOT NULL CHECK (token >= 0))"
            ),
            lock_and_read: format!(
                "INSERT INTO {t} AS fence (resource, token) VALUES ({mark}1, 0) \
                 ON CONFLICT (resource) DO UPDATE SET token = fence.token \
                 RETURNING token"
            ),
            raise: format!("UPDATE {t} SET token = {mark}2 WHERE resource = {mark}1"),
            read: format!("SELECT token FROM {t} WHERE resource = {mark}1"),
            table,
        }
    }

    /// A database error during `action`, as a [`FenceError`]: `detail` is
    /// what the database said, `retry` whether the transaction may be run
    /// again.
    pub fn failed(
        &self,
        action: &'static str,
        detail: String,
        retry: bool,
        source: Box<dyn std::error::Error + Send + Sync>,
    ) -> FenceError {
        FenceError::Database {
            table: self.table.clone(),
            action,
            detail,
            retry,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for good in [
            "latchkey_fence",
            "_x",
            "orders2",
            "order",
            "app.fence",
            &"a".repeat(63),
        ] {
            assert_eq!(checked_table_name(good).ok().as_deref(), Some(good));
        }
        for bad in [
            "",
            "2x",
            "a-b",
            "a b",
            "fence;drop",
            "\"q\"",
            "é",
            "Orders",
            "a.b.c",
            ".x",
            "x.",
            "sqlite_master",
            "main.sqlite_x",
            &"a".repeat(64),
        ] {
            assert!(
                matches!(
                    checked_table_name(bad),
                    Err(FenceError::BadTableName { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(quoted("app.order"), "\"app\".\"order\"");
    }

    #[test]
    fn tokens_the_database_can_hold() {
        assert!(matches!(
            stored_token("r", 0),
            Err(FenceError::ZeroToken { .. })
        ));
        assert_eq!(stored_token("r", 7).ok(), Some(7));
        assert_eq!(stored_token("r", i64::MAX as u64).ok(), Some(i64::MAX));
        assert!(matches!(
            stored_token("r", i64::MAX as u64 + 1),
            Err(FenceError::TokenTooLarge { .. })
        ));
        assert_eq!(highest_from_row("t", "r", 0).ok(), Some(None));
        assert_eq!(highest_from_row("t", "r", 9).ok(), Some(Some(9)));
        assert!(matches!(
            highest_from_row("t", "r", -1),
            Err(FenceError::CorruptRow { stored: -1, .. })
        ));
    }
}
