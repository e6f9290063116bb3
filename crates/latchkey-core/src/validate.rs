//! Limits checks, run before a command is proposed and again when applied.

use crate::command::{BatchOp, Command, Condition, Query, ScanRange};
use crate::limits::*;
use crate::CommandError;

fn check_key(what: &str, key: &[u8]) -> Result<usize, CommandError> {
    if key.is_empty() {
        return Err(CommandError::invalid(format!("{what} must not be empty")));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(CommandError::invalid(format!(
            "{what} is {} bytes, the limit is {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(key.len())
}

fn check_value(value: &[u8]) -> Result<usize, CommandError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(CommandError::invalid(format!(
            "value is {} bytes, the limit is {MAX_VALUE_LEN}",
            value.len()
        )));
    }
    Ok(value.len())
}

fn check_bound(what: &str, key: &[u8]) -> Result<usize, CommandError> {
    if key.len() > MAX_KEY_LEN {
        return Err(CommandError::invalid(format!(
            "{what} is {} bytes, the limit is {MAX_KEY_LEN}",
            key.len()
        )));
    }
    Ok(key.len())
}

/// Check a command against the [`crate::limits`]. Pure and cheap.
pub fn validate_command(command: &Command) -> Result<(), CommandError> {
    let total = match command {
        Command::Put { key, value }
        | Command::PutIfAbsent { key, value }
        | Command::GetAndPut { key, value } => check_key("key", key)? + check_value(value)?,
        Command::CompareAndPut {
            key,
            expected,
            value,
        } => {
            check_key("key", key)?
                + check_value(value)?
                + expected
                    .as_deref()
                    .map(check_value)
                    .transpose()?
                    .unwrap_or(0)
        }
        Command::Delete { key } => check_key("key", key)?,
        Command::DeleteRange { start, end } => {
            let n = check_bound("range start", start)? + check_key("range end", end)?;
            if start >= end {
                return Err(CommandError::invalid("range start must be below range end"));
            }
            n
        }
        Command::Batch { conditions, ops } => {
            if ops.len() > MAX_BATCH_OPS {
                return Err(CommandError::invalid(format!(
                    "batch has {} operations, the limit is {MAX_BATCH_OPS}",
                    ops.len()
                )));
            }
            if conditions.len() > MAX_BATCH_CONDITIONS {
                return Err(CommandError::invalid(format!(
                    "batch has {} conditions, the limit is {MAX_BATCH_CONDITIONS}",
                    conditions.len()
                )));
            }
            let mut n = 0;
            for c in conditions {
                let Condition::ValueIs { key, expected } = c;
                n += check_key("condition key", key)?;
                n += expected
                    .as_deref()
                    .map(check_value)
                    .transpose()?
                    .unwrap_or(0);
            }
            for op in ops {
                n += match op {
                    BatchOp::Put { key, value } => check_key("key", key)? + check_value(value)?,
                    BatchOp::Delete { key } => check_key("key", key)?,
                };
            }
            n
        }
        Command::NextSequence { key, .. } => check_key("sequence key", key)?,
    };
    if total > MAX_COMMAND_BYTES {
        return Err(CommandError::invalid(format!(
            "command carries {total} bytes, the limit is {MAX_COMMAND_BYTES}"
        )));
    }
    Ok(())
}

/// Check a query against the [`crate::limits`].
pub fn validate_query(query: &Query) -> Result<(), CommandError> {
    match query {
        Query::Get { key } => {
            check_key("key", key)?;
        }
        Query::MultiGet { keys } => {
            if keys.len() > MAX_MULTI_GET {
                return Err(CommandError::invalid(format!(
                    "multi-get asks for {} keys, the limit is {MAX_MULTI_GET}",
                    keys.len()
                )));
            }
            for k in keys {
                check_key("key", k)?;
            }
        }
        Query::Scan(ScanRange {
            start,
            end,
            prefix,
            limit,
            ..
        }) => {
            check_bound("scan start", start)?;
            check_bound("scan prefix", prefix)?;
            if let Some(end) = end {
                check_bound("scan end", end)?;
            }
            if *limit > MAX_SCAN_LIMIT {
                return Err(CommandError::invalid(format!(
                    "scan limit {limit} is above the maximum {MAX_SCAN_LIMIT}"
                )));
            }
        }
    }
    Ok(())
}
