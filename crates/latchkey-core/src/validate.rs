//! Limits checks, run before a command is proposed and again when applied.

use crate::command::{BatchOp, Command, Condition, Query, ScanRange, Test};
use crate::limits::*;
use crate::lock::{
    election_of, is_election_key, LockCommand, LockMode, LockQuery, Sequencer, TimerKind, Token,
    ELECTION_PREFIX, MAX_ELECTION_VALUE_LEN,
};
use crate::CommandError;

/// A key a client writes: a valid key, and not an election's leader key
/// (only the elections write those, see `crate::lock::election`).
fn check_written_key(key: &[u8]) -> Result<usize, CommandError> {
    let n = check_key("key", key)?;
    if is_election_key(key) {
        return Err(CommandError::invalid(format!(
            "keys starting with {ELECTION_PREFIX:?} are the elections' leader keys: \
             only campaigning, resigning and proclaiming change them"
        )));
    }
    Ok(n)
}

/// An election candidate's value: at most [`MAX_ELECTION_VALUE_LEN`] bytes.
fn check_election_value(value: &[u8]) -> Result<usize, CommandError> {
    if value.len() > MAX_ELECTION_VALUE_LEN {
        return Err(CommandError::invalid(format!(
            "an election value is {} bytes, the limit is {MAX_ELECTION_VALUE_LEN}",
            value.len()
        )));
    }
    Ok(value.len())
}

/// An election's lock name fits the lock-name limit: the election's own
/// name is at most [`MAX_LOCK_NAME_LEN`] minus the prefix, said in those
/// terms.
fn check_election_name_len(name: &str) -> Result<(), CommandError> {
    match election_of(name) {
        Some(election) if name.len() > MAX_LOCK_NAME_LEN => Err(CommandError::invalid(format!(
            "an election name is at most {} bytes, this one is {}",
            MAX_LOCK_NAME_LEN - ELECTION_PREFIX.len(),
            election.len()
        ))),
        _ => Ok(()),
    }
}

/// An election's lock: [`ELECTION_PREFIX`] and a non-empty election name.
fn check_election_lock(name: &str) -> Result<(), CommandError> {
    match election_of(name) {
        Some(election) if !election.is_empty() => Ok(()),
        Some(_) => Err(CommandError::invalid("an election name must not be empty")),
        None => Err(CommandError::invalid(format!(
            "lock {name:?} is not an election's (their names start with {ELECTION_PREFIX:?})"
        ))),
    }
}

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

/// Bytes a test carries; an expected value obeys the value limit.
fn check_test(test: &Test) -> Result<usize, CommandError> {
    match test {
        Test::ValueIs(Some(expected)) => check_value(expected),
        Test::ValueIs(None) | Test::Exists(_) | Test::Revision { .. } => Ok(0),
    }
}

fn check_batch(conditions: &[Condition], ops: &[BatchOp]) -> Result<usize, CommandError> {
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
        n += check_key("condition key", &c.key)? + check_test(&c.test)?;
    }
    for op in ops {
        n += match op {
            BatchOp::Put { key, value } => check_written_key(key)? + check_value(value)?,
            BatchOp::Delete { key } => check_written_key(key)?,
        };
    }
    Ok(n)
}

/// A lock name: non-empty, at most [`MAX_LOCK_NAME_LEN`] bytes.
fn check_lock_name(name: &str) -> Result<usize, CommandError> {
    if name.is_empty() || name.len() > MAX_LOCK_NAME_LEN {
        return Err(CommandError::InvalidLockName {
            len: name.len(),
            max: MAX_LOCK_NAME_LEN,
        });
    }
    Ok(name.len())
}

/// A fencing token: 0 is never issued.
fn check_token(token: Token) -> Result<(), CommandError> {
    if token.0 == 0 {
        return Err(CommandError::invalid("fencing token 0 is never issued"));
    }
    Ok(())
}

/// An optional duration: `None`, or within `[min, max]`.
fn check_duration(
    what: TimerKind,
    value: Option<u64>,
    min: u64,
    max: u64,
) -> Result<(), CommandError> {
    match value {
        Some(value) if value < min || value > max => Err(CommandError::DurationOutOfRange {
            what,
            value,
            min,
            max,
        }),
        _ => Ok(()),
    }
}

/// The wait, lease and lock-delay of an acquire, each optional.
fn check_acquire_durations(
    wait_ms: Option<u64>,
    lease_ms: Option<u64>,
    lock_delay_ms: Option<u64>,
) -> Result<(), CommandError> {
    check_duration(TimerKind::Wait, wait_ms, MIN_LOCK_WAIT_MS, MAX_LOCK_WAIT_MS)?;
    check_duration(
        TimerKind::Lease,
        lease_ms,
        MIN_LOCK_LEASE_MS,
        MAX_LOCK_LEASE_MS,
    )?;
    check_duration(
        TimerKind::LockDelay,
        lock_delay_ms,
        MIN_LOCK_DELAY_MS,
        MAX_LOCK_DELAY_MS,
    )
}

/// The lock names of a multi-lock: at most [`MAX_MULTI_LOCK_NAMES`], each
/// valid, none twice. Returns their bytes.
fn check_multi_lock_names<'a>(
    names: impl ExactSizeIterator<Item = &'a String>,
) -> Result<usize, CommandError> {
    if names.len() > MAX_MULTI_LOCK_NAMES {
        return Err(CommandError::invalid(format!(
            "a multi-lock takes at most {MAX_MULTI_LOCK_NAMES} locks, not {}",
            names.len()
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    let mut total = 0;
    for name in names {
        total += check_lock_name(name)?;
        if !seen.insert(name) {
            return Err(CommandError::invalid(format!(
                "a multi-lock names {name:?} twice"
            )));
        }
    }
    Ok(total)
}

/// A session's name: at most [`MAX_SESSION_NAME_BYTES`], no control
/// characters (it is printed in operators' terminals).
fn check_session_name(name: &str) -> Result<usize, CommandError> {
    if name.len() > MAX_SESSION_NAME_BYTES {
        return Err(CommandError::invalid(format!(
            "session name is {} bytes, more than the maximum {MAX_SESSION_NAME_BYTES}",
            name.len()
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(CommandError::invalid(
            "session name contains a control character",
        ));
    }
    Ok(name.len())
}

fn check_sequencer(sequencer: &Sequencer) -> Result<usize, CommandError> {
    check_token(sequencer.token)?;
    check_lock_name(&sequencer.name)
}

fn check_lock_command(command: &LockCommand) -> Result<usize, CommandError> {
    match command {
        LockCommand::OpenSession { ttl_ms, name, .. } => {
            if !(MIN_SESSION_TTL_MS..=MAX_SESSION_TTL_MS).contains(ttl_ms) {
                return Err(CommandError::TtlOutOfRange {
                    ttl_ms: *ttl_ms,
                    min: MIN_SESSION_TTL_MS,
                    max: MAX_SESSION_TTL_MS,
                });
            }
            check_session_name(name)
        }
        LockCommand::ForceRelease { name, token } => {
            check_token(*token)?;
            check_lock_name(name)
        }
        LockCommand::CloseSession { .. }
        | LockCommand::ExpireSession { .. }
        | LockCommand::EndSession { .. } => Ok(0),
        LockCommand::Acquire {
            name,
            mode,
            wait_ms,
            lease_ms,
            lock_delay_ms,
            value,
            permits,
            ..
        } => {
            let mut n = check_election_name_len(name).and_then(|()| check_lock_name(name))?;
            if election_of(name).is_some() {
                check_election_lock(name)?;
                if *mode != LockMode::Exclusive {
                    return Err(CommandError::invalid(
                        "a campaign is exclusive: an election has one leader",
                    ));
                }
                n += check_election_value(value)?;
            } else if !value.is_empty() {
                return Err(CommandError::invalid(
                    "only a campaign (an election's lock) carries a value",
                ));
            }
            if let Some(permits) = permits {
                let most = u32::try_from(MAX_LOCK_HOLDERS).unwrap_or(u32::MAX);
                if !(1..=most).contains(permits) {
                    return Err(CommandError::invalid(format!(
                        "a semaphore has 1 to {most} permits, not {permits}"
                    )));
                }
                if *mode != LockMode::Shared {
                    return Err(CommandError::invalid(
                        "a semaphore's permit is taken in shared mode",
                    ));
                }
                if election_of(name).is_some() {
                    return Err(CommandError::invalid("an election is not a semaphore"));
                }
                // A permit shares the lock with other holders: a delay could
                // only hold up every permit or none (see `lock_table.rs`).
                if lock_delay_ms.is_some() {
                    return Err(CommandError::invalid(
                        "a semaphore's permit has no lock-delay",
                    ));
                }
            }
            check_acquire_durations(*wait_ms, *lease_ms, *lock_delay_ms)?;
            Ok(n)
        }
        LockCommand::AcquireAll {
            names,
            wait_ms,
            lease_ms,
            lock_delay_ms,
            ..
        } => {
            if names.len() < 2 {
                return Err(CommandError::invalid(format!(
                    "a multi-lock takes 2 to {MAX_MULTI_LOCK_NAMES} locks, not {} (take one \
                     lock with a plain acquire)",
                    names.len()
                )));
            }
            let n = check_multi_lock_names(names.iter())?;
            if let Some(name) = names.iter().find(|n| election_of(n).is_some()) {
                return Err(CommandError::invalid(format!(
                    "{name:?} is an election: a multi-lock takes locks, not leaderships"
                )));
            }
            check_acquire_durations(*wait_ms, *lease_ms, *lock_delay_ms)?;
            Ok(n)
        }
        LockCommand::ReleaseAll { grants, .. } => {
            if grants.is_empty() {
                return Err(CommandError::invalid("a multi-lock release names no lock"));
            }
            let n = check_multi_lock_names(grants.iter().map(|(name, _)| name))?;
            for (_, token) in grants {
                check_token(*token)?;
            }
            Ok(n)
        }
        LockCommand::Release { name, token, .. }
        | LockCommand::ExpireLockLease { name, token }
        | LockCommand::EndLockDelay { name, token } => {
            let n = check_lock_name(name)?;
            check_token(*token)?;
            Ok(n)
        }
        LockCommand::CancelWait { name, .. } | LockCommand::ExpireWait { name, .. } => {
            check_lock_name(name)
        }
        LockCommand::Checkpoint { sessions, leases } => {
            let items = sessions.len().saturating_add(leases.len());
            if items > MAX_CHECKPOINT_ITEMS {
                return Err(CommandError::invalid(format!(
                    "a checkpoint records at most {MAX_CHECKPOINT_ITEMS} sessions and leases, \
                     not {items}"
                )));
            }
            let mut n = 0usize;
            for lease in leases {
                n = n.saturating_add(check_lock_name(&lease.name)?);
                check_token(lease.token)?;
            }
            Ok(n)
        }
        LockCommand::Proclaim {
            name, token, value, ..
        } => {
            let n = check_election_name_len(name).and_then(|()| check_lock_name(name))?;
            check_election_lock(name)?;
            check_token(*token)?;
            Ok(n + check_election_value(value)?)
        }
        LockCommand::Fenced {
            sequencer,
            conditions,
            ops,
            ..
        } => {
            // A shared sequencer fences only as a semaphore's permit,
            // which only the lock's record can tell (`fence::check_fence`).
            let n = check_sequencer(sequencer)?;
            Ok(n + check_batch(conditions, ops)?)
        }
    }
}

fn check_lock_query(query: &LockQuery) -> Result<(), CommandError> {
    match query {
        LockQuery::CheckSequencer(sequencer) => {
            check_sequencer(sequencer)?;
        }
        LockQuery::Locks {
            prefix,
            start_after,
            limit,
        } => {
            if prefix.len() > MAX_LOCK_NAME_LEN {
                return Err(CommandError::InvalidLockName {
                    len: prefix.len(),
                    max: MAX_LOCK_NAME_LEN,
                });
            }
            if let Some(after) = start_after {
                check_lock_name(after)?;
            }
            if *limit > MAX_LOCK_LIST_LIMIT {
                return Err(CommandError::invalid(format!(
                    "lock list limit {limit} is above the maximum {MAX_LOCK_LIST_LIMIT}"
                )));
            }
        }
        LockQuery::Sessions { limit, .. } => {
            if *limit > MAX_SESSION_LIST_LIMIT {
                return Err(CommandError::invalid(format!(
                    "session list limit {limit} is above the maximum {MAX_SESSION_LIST_LIMIT}"
                )));
            }
        }
        LockQuery::Session { .. }
        | LockQuery::TimerState
        | LockQuery::SessionTimer { .. }
        | LockQuery::Census => {}
    }
    Ok(())
}

/// Check a command against the [`crate::limits`]. Pure and cheap.
pub fn validate_command(command: &Command) -> Result<(), CommandError> {
    let total = match command {
        Command::Put { key, value }
        | Command::PutIfAbsent { key, value }
        | Command::GetAndPut { key, value } => check_written_key(key)? + check_value(value)?,
        Command::PutBound {
            key,
            value,
            session,
            ..
        } => {
            if session.0 == 0 {
                return Err(CommandError::invalid(
                    "a key can be bound to a session, not to session 0",
                ));
            }
            check_written_key(key)? + check_value(value)?
        }
        Command::CompareAndPut { key, test, value } => {
            check_written_key(key)? + check_value(value)? + check_test(test)?
        }
        Command::Delete { key } => check_written_key(key)?,
        Command::DeleteRange { start, end } => {
            let n = check_bound("range start", start)? + check_key("range end", end)?;
            if start >= end {
                return Err(CommandError::invalid("range start must be below range end"));
            }
            n
        }
        Command::Batch { conditions, ops } => check_batch(conditions, ops)?,
        Command::NextSequence { key, .. } => check_key("sequence key", key)?,
        Command::Lock(lock) => check_lock_command(lock)?,
        Command::Group { commands } => check_group(commands)?,
        Command::Auth(auth) => crate::auth::validate(auth)?,
        Command::Once {
            session, command, ..
        } => {
            if session.0 == 0 {
                return Err(CommandError::invalid(
                    "a retry-safe write names a session, not session 0",
                ));
            }
            if !command.is_key_value_write() {
                return Err(CommandError::invalid(
                    "only a key-value write can be made retry-safe (lock commands carry \
                     their own request ids)",
                ));
            }
            validate_command(command)?;
            command.payload_len()
        }
        Command::As { user, command } => {
            if matches!(**command, Command::Group { .. } | Command::As { .. }) {
                return Err(CommandError::invalid(
                    "`As` holds one plain command, never a group or another `As`",
                ));
            }
            crate::auth::validate(&crate::auth::AuthCommand::DeleteUser { name: user.clone() })?;
            validate_command(command)?;
            user.len() + command.payload_len()
        }
    };
    if total > MAX_COMMAND_BYTES {
        return Err(CommandError::invalid(format!(
            "command carries {total} bytes, the limit is {MAX_COMMAND_BYTES}"
        )));
    }
    Ok(())
}

/// The shape of a group: not too many commands, none of them a group. Each
/// command's own limits are checked when it is applied, so that a command
/// that breaks one is refused alone.
fn check_group(commands: &[Command]) -> Result<usize, CommandError> {
    if commands.len() > MAX_GROUP_COMMANDS {
        return Err(CommandError::invalid(format!(
            "group has {} commands, the limit is {MAX_GROUP_COMMANDS}",
            commands.len()
        )));
    }
    if commands.iter().any(|c| matches!(c, Command::Group { .. })) {
        return Err(CommandError::invalid("a group must not contain a group"));
    }
    Ok(commands.iter().map(Command::payload_len).sum())
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
        Query::Lock(q) => check_lock_query(q)?,
        Query::Auth(
            crate::auth::AuthQuery::User { name }
            | crate::auth::AuthQuery::Role { name }
            | crate::auth::AuthQuery::Credentials { name },
        ) => {
            if name.is_empty() || name.len() > crate::auth::MAX_NAME_LEN {
                return Err(CommandError::invalid(format!(
                    "a name of 1 to {} bytes",
                    crate::auth::MAX_NAME_LEN
                )));
            }
        }
        Query::Auth(crate::auth::AuthQuery::Status | crate::auth::AuthQuery::List) => {}
        Query::As { user, query } => {
            if matches!(**query, Query::As { .. }) {
                return Err(CommandError::invalid("`As` never nests"));
            }
            crate::auth::validate(&crate::auth::AuthCommand::DeleteUser { name: user.clone() })?;
            validate_query(query)?;
        }
    }
    Ok(())
}
