//! What the database gates share: the fence table's name, its statements
//! (the three steps are described in the crate's documentation), and the
//! checks made before and after the database is asked.

use crate::error::FenceError;

/// The fence table's name when none is given.
pub const DEFAULT_TABLE: &str = "latchkey_fence";

/// A fence table name checked to be a plain identifier (so it can be put in
/// SQL text without quoting): 1 to 63 ASCII letters, digits or underscores,
/// not starting with a digit.
pub(crate) fn checked_table_name(name: &str) -> Result<String, FenceError> {
    let mut chars = name.chars();
    let plain = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63;
    if plain {
        Ok(name.to_owned())
    } else {
        Err(FenceError::BadTableName {
            name: name.to_owned(),
        })
    }
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
    /// The table's name.
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
        Statements {
            create: format!(
                "CREATE TABLE IF NOT EXISTS {table} (\
                 resource TEXT PRIMARY KEY, \
                 token BIGINT NOT NULL CHECK (token >= 0))"
            ),
            lock_and_read: format!(
                "INSERT INTO {table} (resource, token) VALUES ({mark}1, 0) \
                 ON CONFLICT (resource) DO UPDATE SET token = {table}.token \
                 RETURNING token"
            ),
            raise: format!("UPDATE {table} SET token = {mark}2 WHERE resource = {mark}1"),
            read: format!("SELECT token FROM {table} WHERE resource = {mark}1"),
            table,
        }
    }

    /// A database error during `action`, as a [`FenceError`].
    pub fn failed<E>(&self, action: &'static str) -> impl FnOnce(E) -> FenceError + '_
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        move |source| FenceError::Database {
            table: self.table.clone(),
            action,
            source: Box::new(source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        for good in ["latchkey_fence", "_x", "Orders2", &"a".repeat(63)] {
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
