//! KV semantics and the dispatch of every command: [`apply`] /
//! [`apply_with_events`] for writes, [`query`] for reads. Lock commands and
//! queries are handed to [`crate::lock`].

use std::ops::Bound;

use crate::command::{BatchOp, Command, Condition, Outcome, Query, Request, ScanRange};
use crate::data::{self, data_key, Change};
use crate::keyspace::{self, DATA, META_NOW, SEQUENCE};
use crate::limits::MAX_SCAN_LIMIT;
use crate::lock::{self, Event};
use crate::store::read_counter;
use crate::validate::{validate_command, validate_query};
use crate::{CommandError, CommandResult, Store, StoreError};

/// How many keys a delete-range removes per scan of the store.
const DELETE_CHUNK: usize = 1024;

/// Apply one log entry to `store`.
///
/// The outer `Result` is the store's own failure (the shell must stop
/// applying); the inner [`CommandResult`] is the deterministic answer for the
/// client. A refused command writes nothing, not even the clock: every check
/// happens before the first write.
///
/// The same as [`apply_with_events`] without the events.
pub fn apply<S: Store>(store: &mut S, request: &Request) -> Result<CommandResult, StoreError> {
    apply_with_events(store, request).map(|(result, _)| result)
}

/// Apply one log entry to `store`, and report what the shell must act on:
/// waiters to wake, countdowns to start or drop (see [`Event`]). Events come
/// in the order they happened and are identical on every replica; a refused
/// command has none, and KV commands have none.
pub fn apply_with_events<S: Store>(
    store: &mut S,
    request: &Request,
) -> Result<(CommandResult, Vec<Event>), StoreError> {
    let mut events = Vec::new();
    let result = match &request.command {
        Command::Group { commands } => {
            if let Err(e) = validate_command(&request.command) {
                return Ok((Err(e), Vec::new()));
            }
            let mut results = Vec::with_capacity(commands.len());
            for command in commands {
                results.push(apply_one(store, request.now, command, &mut events)?);
            }
            Ok(Outcome::Group(results))
        }
        command => apply_one(store, request.now, command, &mut events)?,
    };
    Ok((result, events))
}

/// Apply one (non-group) command stamped `now`: validate it, run it, and
/// raise the stored clock if it succeeded. A refused command writes nothing
/// and reports no events.
fn apply_one<S: Store>(
    store: &mut S,
    now: u64,
    command: &Command,
    events: &mut Vec<Event>,
) -> Result<CommandResult, StoreError> {
    if let Err(e) = validate_command(command) {
        return Ok(Err(e));
    }
    if let Command::As {
        user,
        command: inner,
    } = command
    {
        if crate::auth::enabled(store)? {
            if let Err(e) = crate::auth::check_command(store, user, inner)? {
                return Ok(Err(e));
            }
        }
        let result = run_one(store, now, inner, events)?;
        if let Ok(outcome) = &result {
            crate::auth::record_owner(store, user, outcome)?;
        }
        return Ok(result);
    }
    // With access control on, a client's command runs only as a user; the
    // leader's own expiry commands name nobody.
    let leaders_own = matches!(command, Command::Lock(l) if l.proposer() == lock::Proposer::Leader);
    if !leaders_own && crate::auth::enabled(store)? {
        return Ok(Err(CommandError::AuthRequired));
    }
    run_one(store, now, command, events)
}

/// Run one validated, permitted command stamped `now`, and raise the
/// stored clock if it succeeded.
fn run_one<S: Store>(
    store: &mut S,
    now: u64,
    command: &Command,
    events: &mut Vec<Event>,
) -> Result<CommandResult, StoreError> {
    let clock = stored_clock(store)?;
    // Commands that depend on time use `max(clock, now)`.
    let result = execute(store, command, events)?;
    if result.is_ok() && now > clock {
        store.put(META_NOW, &now.to_be_bytes())?;
    }
    Ok(result)
}

/// Whether `key` may be bound to `session` with `secret`: the session is
/// live, the secret is its own, and it has room for the key (a key bound
/// to it already takes no more room).
fn check_binding<S: Store>(
    store: &S,
    key: &[u8],
    session: crate::lock::SessionId,
    secret: &crate::lock::SessionSecret,
) -> Result<Result<(), CommandError>, StoreError> {
    if let Err(refused) = lock::check_live(store, session, secret)? {
        return Ok(Err(refused));
    }
    let max = crate::limits::MAX_KEYS_PER_SESSION;
    let room = usize::try_from(max).unwrap_or(usize::MAX);
    if !data::is_bound_to(store, key, session.0)?
        && data::session_key_count(store, session.0, room)? >= room
    {
        return Ok(Err(CommandError::TooManySessionKeys { session, max }));
    }
    Ok(Ok(()))
}

/// The effects of one validated command.
fn execute<S: Store>(
    store: &mut S,
    command: &Command,
    events: &mut Vec<Event>,
) -> Result<CommandResult, StoreError> {
    match command {
        Command::Put { key, value } => {
            let mut change = Change::begin(store)?;
            change.put(store, key, value)?;
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Written { revision }))
        }
        Command::PutBound {
            key,
            value,
            session,
            secret,
        } => {
            if let Err(refused) = check_binding(store, key, *session, secret)? {
                return Ok(Err(refused));
            }
            let mut change = Change::begin(store)?;
            change.put_bound(store, key, value, session.0)?;
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Written { revision }))
        }
        Command::PutIfAbsent { key, value } => {
            let mut change = Change::begin(store)?;
            let existing = data::get(store, key)?;
            if existing.is_none() {
                change.put(store, key, value)?;
            }
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Previous {
                previous: existing.map(|v| v.value),
                revision,
            }))
        }
        Command::CompareAndPut { key, test, value } => {
            let mut change = Change::begin(store)?;
            let current = data::get(store, key)?;
            let holds = match data::test_holds(key, test, current.as_ref()) {
                Ok(holds) => holds,
                Err(e) => return Ok(Err(e)),
            };
            let current = if holds {
                Some(change.put(store, key, value)?)
            } else {
                current
            };
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Swapped {
                succeeded: holds,
                current,
                revision,
            }))
        }
        Command::GetAndPut { key, value } => {
            let mut change = Change::begin(store)?;
            let previous = data::get(store, key)?.map(|v| v.value);
            change.put(store, key, value)?;
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Previous { previous, revision }))
        }
        Command::Delete { key } => {
            let mut change = Change::begin(store)?;
            let existed = change.delete(store, key)?;
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Deleted {
                count: u64::from(existed),
                revision,
            }))
        }
        Command::DeleteRange { start, end } => {
            let mut change = Change::begin(store)?;
            let count = delete_range(store, &mut change, start, end)?;
            let revision = change.finish(store)?;
            Ok(Ok(Outcome::Deleted { count, revision }))
        }
        Command::Batch { conditions, ops } => batch(store, conditions, ops),
        Command::NextSequence { key, step } => next_sequence(store, key, *step),
        Command::Lock(command) => lock::apply(store, command, events),
        Command::Once {
            session,
            secret,
            request_id,
            command,
        } => once(store, *session, secret, *request_id, command, events),
        // Only reached for a group nested in a group, which validation refuses.
        Command::Group { .. } => Ok(Err(CommandError::invalid(
            "a group must not contain a group",
        ))),
        Command::Auth(command) => crate::auth::execute(store, command),
        // `apply_one` runs the command inside; never reached.
        Command::As { .. } => Ok(Err(CommandError::invalid("`As` never nests"))),
    }
}

/// [`Command::Once`]: the first outcome of (`session`, `request_id`) if it
/// was applied before (writing nothing), else `command`'s, remembered when
/// it succeeds. Validation has checked that `command` is a key-value write.
fn once<S: Store>(
    store: &mut S,
    session: lock::SessionId,
    secret: &lock::SessionSecret,
    request_id: u64,
    command: &Command,
    events: &mut Vec<Event>,
) -> Result<CommandResult, StoreError> {
    if let Err(refused) = lock::check_live(store, session, secret)? {
        return Ok(Err(refused));
    }
    let digest = match lock::WriteDigest::of(command) {
        Ok(digest) => digest,
        Err(refused) => return Ok(Err(refused)),
    };
    match lock::recall_write(store, session, request_id, digest)? {
        Ok(Some(first)) => return Ok(Ok(first)),
        Ok(None) => {}
        Err(refused) => return Ok(Err(refused)),
    }
    let result = execute(store, command, events)?;
    if let Ok(outcome) = &result {
        lock::remember_write(store, session, request_id, digest, outcome)?;
    }
    Ok(result)
}

/// Check every condition, then apply every op: [`Command::Batch`], also used
/// by fenced writes once their fence holds. A failed condition writes
/// nothing; a revision test on an absent key refuses the command. The ops
/// share one revision.
pub(crate) fn batch<S: Store>(
    store: &mut S,
    conditions: &[Condition],
    ops: &[BatchOp],
) -> Result<CommandResult, StoreError> {
    let mut change = Change::begin(store)?;
    for (i, condition) in conditions.iter().enumerate() {
        let current = data::get(store, &condition.key)?;
        match data::test_holds(&condition.key, &condition.test, current.as_ref()) {
            Ok(true) => {}
            Ok(false) => {
                let index = u32::try_from(i).unwrap_or(u32::MAX);
                return Ok(Ok(Outcome::Batch {
                    failed_condition: Some(index),
                    revision: change.finish(store)?,
                }));
            }
            Err(e) => return Ok(Err(e)),
        }
    }
    for op in ops {
        match op {
            BatchOp::Put { key, value } => {
                change.put(store, key, value)?;
            }
            BatchOp::Delete { key } => {
                change.delete(store, key)?;
            }
        }
    }
    Ok(Ok(Outcome::Batch {
        failed_condition: None,
        revision: change.finish(store)?,
    }))
}

/// Serve a read query from `store`'s applied state.
pub fn query<S: Store>(store: &S, q: &Query) -> Result<CommandResult, StoreError> {
    if let Err(e) = validate_query(q) {
        return Ok(Err(e));
    }
    match q {
        Query::Get { key } => Ok(Ok(Outcome::Value {
            value: data::get(store, key)?,
            revision: data::revision(store)?,
        })),
        Query::MultiGet { keys } => {
            let mut values = Vec::with_capacity(keys.len());
            for key in keys {
                values.push(data::get(store, key)?);
            }
            Ok(Ok(Outcome::Values {
                values,
                revision: data::revision(store)?,
            }))
        }
        Query::Scan(range) => scan(store, range),
        Query::Lock(q) => lock::query(store, q),
        Query::Auth(q) => crate::auth::query(store, q),
        Query::As { user, query: inner } => {
            if crate::auth::enabled(store)? {
                if let Err(e) = crate::auth::check_query(store, user, inner)? {
                    return Ok(Err(e));
                }
            }
            query(store, inner)
        }
    }
}

/// The largest leader time applied so far (0 before the first). [`apply`]
/// raises it after each successful command, so it never runs backwards
/// across leaders.
fn stored_clock<S: Store>(store: &S) -> Result<u64, StoreError> {
    read_counter(store, META_NOW)
}

fn next_sequence<S: Store>(
    store: &mut S,
    key: &[u8],
    step: u64,
) -> Result<CommandResult, StoreError> {
    let k = keyspace::tagged(SEQUENCE, key);
    // A sequence with no row yet starts at the floor a restore may have set.
    let start = match store.get(&k)? {
        Some(_) => read_counter(store, &k)?,
        None => read_counter(store, keyspace::META_SEQUENCE_FLOOR)?,
    };
    let Some(end) = start.checked_add(step) else {
        return Ok(Err(CommandError::SequenceExhausted {
            key: String::from_utf8_lossy(key).into_owned(),
            step,
        }));
    };
    if step > 0 {
        store.put(&k, &end.to_be_bytes())?;
    }
    Ok(Ok(Outcome::Sequence { start, end }))
}

fn delete_range<S: Store>(
    store: &mut S,
    change: &mut Change,
    start: &[u8],
    end: &[u8],
) -> Result<u64, StoreError> {
    let upper = data_key(end);
    // Each chunk starts after the last key deleted, never at `start` again:
    // a deleted key stays behind as a tombstone (in the apply overlay and in
    // RocksDB) that a scan from the start would step over every time.
    let mut lower = data_key(start);
    let mut included = true;
    let mut deleted = 0u64;
    loop {
        let from = if included {
            Bound::Included(lower.as_slice())
        } else {
            Bound::Excluded(lower.as_slice())
        };
        let chunk = store.scan(from, Bound::Excluded(&upper), false, DELETE_CHUNK)?;
        let Some((last, _)) = chunk.last() else {
            return Ok(deleted);
        };
        let last = last.clone();
        for (k, row) in &chunk {
            // An election's leader key is the election's to change.
            if crate::lock::is_election_key(k.get(1..).unwrap_or_default()) {
                continue;
            }
            change.remove_row(store, k, row)?;
            deleted += 1;
        }
        lower = last;
        included = false;
    }
}

/// The store-level bounds of a scan: `[max(start, prefix), min(end, prefix_end))`
/// inside the data room.
fn scan_bounds(range: &ScanRange) -> (Vec<u8>, Vec<u8>) {
    let from = if range.start.as_slice() > range.prefix.as_slice() {
        &range.start
    } else {
        &range.prefix
    };
    let lower = data_key(from);
    let prefix_end = keyspace::prefix_end(&range.prefix);
    let user_end = match (&range.end, prefix_end) {
        (Some(e), Some(p)) => Some(if *e < p { e.clone() } else { p }),
        (Some(e), None) => Some(e.clone()),
        (None, p) => p,
    };
    let upper = match user_end {
        Some(e) => data_key(&e),
        // End of the data room: the next tag byte.
        None => vec![DATA + 1],
    };
    (lower, upper)
}

fn scan<S: Store>(store: &S, range: &ScanRange) -> Result<CommandResult, StoreError> {
    let limit = if range.limit == 0 {
        MAX_SCAN_LIMIT
    } else {
        range.limit
    } as usize;
    let (lower, upper) = scan_bounds(range);
    let mut rows = store.scan(
        Bound::Included(&lower),
        Bound::Excluded(&upper),
        range.reverse,
        limit + 1,
    )?;
    let more = rows.len() > limit;
    rows.truncate(limit);
    let mut entries = Vec::with_capacity(rows.len());
    for (mut k, row) in rows {
        k.remove(0);
        let value = data::decode(&k, &row)?;
        entries.push((k, value));
    }
    Ok(Ok(Outcome::Entries {
        entries,
        more,
        revision: data::revision(store)?,
    }))
}
