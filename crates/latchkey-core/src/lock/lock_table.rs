//! The lock table: one record per lock in use, holding its holders, its FIFO
//! queue and its lock-delay, and every change a command makes to them.
//!
//! Rules (see also the [module docs](crate::lock)):
//!
//! - A lock's record exists only while the lock has a holder, a waiter or a
//!   lock-delay; a free lock has no record (no creation step, no garbage).
//! - Holders are all exclusive (then exactly one) or all shared (at most
//!   [`MAX_LOCK_HOLDERS`]). A (session, owner) appears at most once per lock,
//!   as a holder or as a waiter.
//! - A request can be granted at once only if nobody is queued (no
//!   overtaking), there is no lock-delay, and it is compatible: the lock is
//!   free, or it is shared, shared is asked, and there is room for another
//!   holder.
//! - Whenever something leaves the lock (a release, a forced release, a
//!   cancelled wait, a lock-delay ending) the queue moves on in the same
//!   entry: while the head is compatible it is granted, so one exclusive
//!   waiter, or the run of shared waiters at the head, gets the lock.
//! - A lock-delay starts only when a forced release leaves the lock with no
//!   holder and one of the released grants asked for a delay; it lasts the
//!   longest such delay, is guarded by the newest such token, and no grant
//!   happens until [`crate::lock::LockCommand::EndLockDelay`] with that token.
//!   An operator's forced release or end of a session starts one even while
//!   other holders remain (see `start_operator_delay`): the remaining
//!   holders keep their grants, but nobody new is granted until it ends.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::applied::Applied;
use super::dedup::{self, Answer, Asked};
use super::event::{Event, HoldEnd, SessionEnd, WaitEnd};
use super::token::next_token;
use super::{
    record, session, HolderInfo, LockCommand, LockMode, LockOutcome, Sequencer, SessionId, Token,
    WaitCancel,
};
use crate::keyspace;
use crate::limits::{MAX_LOCK_HOLDERS, MAX_LOCK_WAITERS};
use crate::{CommandError, Store, StoreError};

/// One grant currently holding a lock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Holder {
    pub session: SessionId,
    pub owner: u64,
    pub mode: LockMode,
    pub token: Token,
    /// Re-entrant holds: at least 1.
    pub count: u32,
    /// The acquire that made the grant.
    pub request_id: u64,
    pub lease_ms: Option<u64>,
    pub lock_delay_ms: Option<u64>,
    /// An election candidate's value (see `election.rs`); empty for a lock.
    #[serde(with = "crate::codec::bytes")]
    pub value: Vec<u8>,
    /// What the leader last recorded of the lease's countdown
    /// ([`LockCommand::Checkpoint`]): `None`, the whole `lease_ms` from
    /// whenever a new leader takes over.
    pub lease_left_ms: Option<u64>,
}

/// One queued acquire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Waiter {
    pub session: SessionId,
    pub owner: u64,
    pub request_id: u64,
    pub mode: LockMode,
    pub wait_ms: u64,
    pub lease_ms: Option<u64>,
    pub lock_delay_ms: Option<u64>,
    /// An election candidate's value; empty for a lock.
    #[serde(with = "crate::codec::bytes")]
    pub value: Vec<u8>,
    /// A multi-lock's waiter ([`LockCommand::AcquireAll`]): every lock it
    /// asked for, in its order, this one included. It waits in each of
    /// their queues and is granted all of them in one step, once it heads
    /// every queue and every lock is free for it (see `settle`). Empty for
    /// a single acquire.
    pub group: Vec<String>,
}

impl Waiter {
    /// Is this the queued acquire `request_id` of (`session`, `owner`)?
    pub(crate) fn is(&self, session: SessionId, owner: u64, request_id: u64) -> bool {
        self.session == session && self.owner == owner && self.request_id == request_id
    }

    /// The lock a multi-lock's wait is reported under (its first), or
    /// `name` for a single acquire's.
    pub(crate) fn reported_name<'a>(&'a self, name: &'a str) -> &'a str {
        self.group.first().map_or(name, String::as_str)
    }
}

/// A lock-delay in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LockDelay {
    /// Guard: the token of the force-released grant that started it.
    pub token: Token,
    pub delay_ms: u64,
}

/// The stored state of one lock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LockRecord {
    /// In grant order.
    pub holders: Vec<Holder>,
    /// In arrival order; the head is next.
    pub queue: Vec<Waiter>,
    pub delay: Option<LockDelay>,
    /// A semaphore's permit count, set by the acquire that put the record
    /// in use and kept while it exists; `None`: a lock.
    pub permits: Option<u32>,
}

impl LockRecord {
    /// The waits this record, lock `name`'s, counts: a multi-lock waits in
    /// every one of its locks' queues but counts once, in its first lock,
    /// so that every census (metrics, `locks`, backups) counts it once.
    pub(crate) fn waits_counted(&self, name: &str) -> u64 {
        self.queue
            .iter()
            .filter(|w| w.reported_name(name) == name)
            .count() as u64
    }

    /// The mode of the current holders, if any.
    pub(crate) fn mode(&self) -> Option<LockMode> {
        self.holders.first().map(|h| h.mode)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty() && self.delay.is_none()
    }

    /// Held or in lock-delay: unavailable to an exclusive request.
    fn is_taken(&self) -> bool {
        !self.holders.is_empty() || self.delay.is_some()
    }

    /// How many grants may hold the lock at once in shared mode: a
    /// semaphore's permits, else [`MAX_LOCK_HOLDERS`].
    fn holder_limit(&self) -> usize {
        self.permits.map_or(MAX_LOCK_HOLDERS, |p| {
            usize::try_from(p).map_or(MAX_LOCK_HOLDERS, |p| p.min(MAX_LOCK_HOLDERS))
        })
    }

    /// Could a request in `mode` join the current holders now (ignoring the
    /// queue)?
    pub(crate) fn compatible(&self, mode: LockMode) -> bool {
        if self.delay.is_some() {
            return false;
        }
        match self.mode() {
            None => true,
            Some(LockMode::Shared) => {
                mode == LockMode::Shared && self.holders.len() < self.holder_limit()
            }
            Some(LockMode::Exclusive) => false,
        }
    }

    fn sessions(&self) -> BTreeSet<SessionId> {
        self.holders
            .iter()
            .map(|h| h.session)
            .chain(self.queue.iter().map(|w| w.session))
            .collect()
    }

    /// The first broken invariant, if any. Checked before every save in
    /// debug builds; the property tests check the same through queries.
    pub(crate) fn broken_invariant(&self) -> Option<&'static str> {
        let mut parties = BTreeSet::new();
        let all_parties = self
            .holders
            .iter()
            .map(|h| (h.session, h.owner))
            .chain(self.queue.iter().map(|w| (w.session, w.owner)));
        for p in all_parties {
            if !parties.insert(p) {
                return Some("a (session, owner) appears twice");
            }
        }
        if self.holders.iter().any(|h| h.count == 0) {
            return Some("a holder with hold count 0");
        }
        match self.mode() {
            Some(LockMode::Exclusive) if self.holders.len() > 1 => {
                return Some("more than one holder of an exclusive lock")
            }
            Some(m) if self.holders.iter().any(|h| h.mode != m) => {
                return Some("holders in different modes")
            }
            _ => {}
        }
        if self.holders.len() > MAX_LOCK_HOLDERS || self.queue.len() > MAX_LOCK_WAITERS {
            return Some("too many holders or waiters");
        }
        if self.holders.len() > self.holder_limit() {
            return Some("more holders than a semaphore's permits");
        }
        if self.permits.is_some()
            && (self.holders.iter().any(|h| h.mode != LockMode::Shared)
                || self.queue.iter().any(|w| w.mode != LockMode::Shared))
        {
            return Some("a semaphore with an exclusive holder or waiter");
        }
        if let Some(head) = self.queue.first() {
            // A multi-lock's waiter may head this queue while another of its
            // locks is not free for it: it then holds this queue up.
            if head.group.is_empty() && self.compatible(head.mode) {
                return Some("the queue's head could be granted but waits");
            }
        }
        None
    }
}

impl Holder {
    fn sequencer(&self, name: &str) -> Sequencer {
        Sequencer {
            name: name.to_string(),
            mode: self.mode,
            token: self.token,
            session: self.session,
        }
    }

    pub(crate) fn info(&self) -> HolderInfo {
        HolderInfo {
            session: self.session,
            owner: self.owner,
            mode: self.mode,
            token: self.token,
            hold_count: self.count,
            lease_ms: self.lease_ms,
        }
    }
}

/// A lock record as loaded, with what [`save`] needs to keep the session
/// index and the [`Event::LockFreed`] event right.
pub(crate) struct LockState {
    pub name: String,
    pub rec: LockRecord,
    sessions_before: BTreeSet<SessionId>,
    taken_before: bool,
}

/// Load `name`'s record (empty if the lock is free).
pub(crate) fn load<S: Store>(store: &S, name: &str) -> Result<LockState, StoreError> {
    let rec: LockRecord = record::load(store, &keyspace::lock_key(name))?.unwrap_or_default();
    Ok(LockState {
        name: name.to_string(),
        sessions_before: rec.sessions(),
        taken_before: rec.is_taken(),
        rec,
    })
}

/// Write `lock` back: its record (deleted when empty), the session index
/// rows that changed, and [`Event::LockFreed`] if it became free.
pub(crate) fn save<S: Store>(
    store: &mut S,
    lock: LockState,
    events: &mut Vec<Event>,
) -> Result<(), StoreError> {
    debug_assert_eq!(
        lock.rec.broken_invariant(),
        None,
        "lock {:?}: {:?}",
        lock.name,
        lock.rec
    );
    let key = keyspace::lock_key(&lock.name);
    if lock.rec.is_empty() {
        store.delete(&key)?;
    } else {
        record::save(store, &key, &lock.rec)?;
    }
    let after = lock.rec.sessions();
    for gone in lock.sessions_before.difference(&after) {
        store.delete(&keyspace::session_lock_key(gone.0, &lock.name))?;
    }
    for new in after.difference(&lock.sessions_before) {
        store.put(&keyspace::session_lock_key(new.0, &lock.name), &[])?;
    }
    if lock.taken_before && !lock.rec.is_taken() {
        events.push(Event::LockFreed { name: lock.name });
    }
    Ok(())
}

/// What a new grant is made of.
pub(crate) struct NewHold {
    pub session: SessionId,
    pub owner: u64,
    pub request_id: u64,
    pub mode: LockMode,
    pub lease_ms: Option<u64>,
    pub lock_delay_ms: Option<u64>,
    pub value: Vec<u8>,
}

impl From<Waiter> for NewHold {
    fn from(w: Waiter) -> Self {
        NewHold {
            session: w.session,
            owner: w.owner,
            request_id: w.request_id,
            mode: w.mode,
            lease_ms: w.lease_ms,
            lock_delay_ms: w.lock_delay_ms,
            value: w.value,
        }
    }
}

/// Make a new grant with the next token.
pub(crate) fn grant<S: Store>(
    store: &mut S,
    lock: &mut LockState,
    hold: NewHold,
    waited: bool,
    events: &mut Vec<Event>,
) -> Applied<Sequencer> {
    let token = next_token(store)?;
    let holder = Holder {
        session: hold.session,
        owner: hold.owner,
        mode: hold.mode,
        token,
        count: 1,
        request_id: hold.request_id,
        lease_ms: hold.lease_ms,
        lock_delay_ms: hold.lock_delay_ms,
        value: hold.value,
        lease_left_ms: None,
    };
    events.push(Event::Granted {
        session: hold.session,
        owner: hold.owner,
        request_id: hold.request_id,
        name: lock.name.clone(),
        mode: hold.mode,
        token,
        lease_ms: hold.lease_ms,
        waited,
    });
    let sequencer = holder.sequencer(&lock.name);
    lock.rec.holders.push(holder);
    Ok(sequencer)
}

/// The locks one command works on, each loaded once and written back
/// together by [`Locks::save`], so that moving one queue on can look at
/// (and grant) the other locks of a multi-lock's waiter without reading a
/// record this command has already changed in memory.
#[derive(Default)]
pub(crate) struct Locks {
    loaded: std::collections::BTreeMap<String, LockState>,
}

impl Locks {
    /// `name`'s state, loaded on first use.
    pub(crate) fn get<S: Store>(
        &mut self,
        store: &S,
        name: &str,
    ) -> Result<&mut LockState, StoreError> {
        use std::collections::btree_map::Entry;
        match self.loaded.entry(name.to_string()) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(load(store, name)?)),
        }
    }

    /// Write every loaded lock back, in name order (see [`save`]).
    pub(crate) fn save<S: Store>(
        mut self,
        store: &mut S,
        events: &mut Vec<Event>,
    ) -> Result<(), StoreError> {
        if cfg!(debug_assertions) {
            let broken = self.broken_multi_lock_wait(store)?;
            debug_assert_eq!(broken, None, "multi-lock waits");
        }
        for lock in self.loaded.into_values() {
            save(store, lock, events)?;
        }
        Ok(())
    }
}

impl Locks {
    /// The first broken rule of the multi-lock waits heading the loaded
    /// queues, if any (checked before every save in debug builds; a
    /// record alone cannot tell): the waiter asked for the lock it heads,
    /// waits in every queue of its group, and cannot be granted yet.
    fn broken_multi_lock_wait<S: Store>(
        &mut self,
        store: &S,
    ) -> Result<Option<String>, StoreError> {
        let names: Vec<String> = self.loaded.keys().cloned().collect();
        for name in names {
            let Some(head) = self.loaded.get(&name).and_then(|l| l.rec.queue.first()) else {
                continue;
            };
            if head.group.is_empty() {
                continue;
            }
            let (session, owner, request_id) = (head.session, head.owner, head.request_id);
            let group = head.group.clone();
            if !group.contains(&name) {
                return Ok(Some(format!(
                    "{name:?} is headed by a multi-lock of {group:?}"
                )));
            }
            for member in &group {
                let lock = self.get(store, member)?;
                if !lock
                    .rec
                    .queue
                    .iter()
                    .any(|w| w.is(session, owner, request_id))
                {
                    return Ok(Some(format!(
                        "a multi-lock of {group:?} heading {name:?} is not queued for {member:?}"
                    )));
                }
            }
            if heads_all(store, self, &group, session, owner, request_id)? {
                return Ok(Some(format!(
                    "a multi-lock of {group:?} could be granted but waits"
                )));
            }
        }
        Ok(None)
    }
}

/// Move the queues on, starting at `name`: while a queue's head is
/// compatible it is granted. A multi-lock's waiter at a head is granted
/// only together with every other lock it waits for, and only once it
/// heads each of their queues and each is free for it; until then it holds
/// this queue up (strict FIFO: nobody overtakes it). A grant of a
/// multi-lock moves its other locks' queues on too.
///
/// No multi-lock waiter waits forever for another: a command enqueues a
/// waiter in all its queues at once, so every queue is in log order, and
/// the oldest waiter of all heads each of its queues.
pub(crate) fn settle<S: Store>(
    store: &mut S,
    locks: &mut Locks,
    name: &str,
    events: &mut Vec<Event>,
) -> Applied<()> {
    let mut todo = BTreeSet::from([name.to_string()]);
    while let Some(name) = todo.pop_first() {
        loop {
            let lock = locks.get(store, &name)?;
            let Some(head) = lock.rec.queue.first() else {
                break;
            };
            if !lock.rec.compatible(head.mode) {
                break;
            }
            if head.group.is_empty() {
                let waiter = lock.rec.queue.remove(0);
                let (session, request_id) = (waiter.session, waiter.request_id);
                let sequencer = grant(store, lock, NewHold::from(waiter), true, events)?;
                dedup::update(
                    store,
                    session,
                    request_id,
                    Answer::Outcome(LockOutcome::Granted {
                        sequencer,
                        hold_count: 1,
                    }),
                )?;
                continue;
            }
            let (session, owner, request_id) = (head.session, head.owner, head.request_id);
            let group = head.group.clone();
            if !heads_all(store, locks, &group, session, owner, request_id)? {
                break;
            }
            let mut sequencers = Vec::with_capacity(group.len());
            for member in &group {
                let lock = locks.get(store, member)?;
                let waiter = lock.rec.queue.remove(0);
                sequencers.push(grant(store, lock, NewHold::from(waiter), true, events)?);
                if *member != name {
                    todo.insert(member.clone());
                }
            }
            dedup::update(
                store,
                session,
                request_id,
                Answer::Outcome(LockOutcome::GrantedAll { sequencers }),
            )?;
        }
    }
    Ok(())
}

/// Does the multi-lock waiter (`session`, `owner`, `request_id`) head the
/// queue of every lock in `group`, each free for it?
fn heads_all<S: Store>(
    store: &S,
    locks: &mut Locks,
    group: &[String],
    session: SessionId,
    owner: u64,
    request_id: u64,
) -> Result<bool, StoreError> {
    for member in group {
        let lock = locks.get(store, member)?;
        match lock.rec.queue.first() {
            Some(w) if w.is(session, owner, request_id) && lock.rec.compatible(w.mode) => {}
            _ => return Ok(false),
        }
    }
    Ok(true)
}

/// After holders were removed by force: start a lock-delay if the lock is
/// now without holders and a removed grant asked for one. The caller then
/// moves the queue on ([`settle`]).
///
/// `min_delay_ms`: a lock-delay every removed grant gets at least (an
/// operator's end of a session: the session's TTL, see
/// [`LockCommand::EndSession`]); 0 for none beyond the grants' own.
pub(crate) fn start_lock_delay(
    lock: &mut LockState,
    removed: &[Holder],
    min_delay_ms: u64,
    events: &mut Vec<Event>,
) {
    if !lock.rec.holders.is_empty() {
        return;
    }
    let delay_of = |h: &Holder| match (h.lock_delay_ms, min_delay_ms) {
        (None, 0) => None,
        (own, floor) => Some(own.unwrap_or(0).max(floor)),
    };
    let token = removed
        .iter()
        .filter(|h| delay_of(h).is_some())
        .map(|h| h.token)
        .max();
    let delay_ms = removed.iter().filter_map(delay_of).max();
    if let (Some(token), Some(delay_ms)) = (token, delay_ms) {
        lock.rec.delay = Some(LockDelay { token, delay_ms });
        events.push(Event::LockDelayStarted {
            name: lock.name.clone(),
            token,
            delay_ms,
        });
    }
}

/// An operator's forced end of the grants `removed` of `lock`
/// ([`LockCommand::ForceRelease`], [`LockCommand::EndSession`]): a
/// lock-delay of at least `min_delay_ms` (the holder's TTL: its client
/// counts itself a holder until it hears) or the grants' own, longer
/// delay, even while other holders remain: nothing new is granted
/// meanwhile, so a freed place (a shared hold, a permit) is not taken
/// while its old holder may still believe it holds it. A delay already
/// running is replaced by one of at least its length from now, under the
/// newer token.
pub(crate) fn start_operator_delay(
    lock: &mut LockState,
    removed: &[Holder],
    min_delay_ms: u64,
    events: &mut Vec<Event>,
) {
    let Some(mut token) = removed.iter().map(|h| h.token).max() else {
        return;
    };
    let mut delay_ms = removed
        .iter()
        .map(|h| h.lock_delay_ms.unwrap_or(0).max(min_delay_ms))
        .max()
        .unwrap_or(0);
    if let Some(running) = lock.rec.delay {
        delay_ms = delay_ms.max(running.delay_ms);
        token = token.max(running.token);
    }
    if delay_ms == 0 {
        return;
    }
    lock.rec.delay = Some(LockDelay { token, delay_ms });
    events.push(Event::LockDelayStarted {
        name: lock.name.clone(),
        token,
        delay_ms,
    });
}

/// The [`CommandError::Busy`] for a try-once acquire of `lock`.
pub(crate) fn busy(lock: &LockState) -> CommandError {
    CommandError::Busy {
        name: lock.name.clone(),
        holder: lock.rec.holders.first().map(Holder::info),
        holders: u32::try_from(lock.rec.holders.len()).unwrap_or(u32::MAX),
        waiters: u32::try_from(lock.rec.queue.len()).unwrap_or(u32::MAX),
        lock_delay: lock.rec.delay.is_some(),
    }
}

/// [`LockCommand::Acquire`], validated already.
pub(crate) fn acquire<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let LockCommand::Acquire {
        session,
        secret: _,
        owner,
        request_id,
        name,
        mode,
        wait_ms,
        lease_ms,
        lock_delay_ms,
        value,
        permits,
    } = command
    else {
        return Err(CommandError::invalid("not an acquire").into());
    };
    let (session, owner, request_id, mode) = (*session, *owner, *request_id, *mode);
    let session_rec = session::load_live(store, session)?;
    if let Some(first) = dedup::recall(store, session, &session_rec, request_id, command)? {
        return Ok(first);
    }
    let mut lock = load(store, name)?;
    // The first acquire of a lock not in use says what it is (a lock, or a
    // semaphore of so many permits); every later one must agree.
    if lock.rec.is_empty() {
        lock.rec.permits = *permits;
    } else if lock.rec.permits != *permits {
        return Err(CommandError::PermitsMismatch {
            name: name.clone(),
            permits: lock.rec.permits,
            asked: *permits,
        }
        .into());
    }
    let party = |s: SessionId, o: u64| s == session && o == owner;
    let outcome = if let Some(h) = lock
        .rec
        .holders
        .iter_mut()
        .find(|h| party(h.session, h.owner))
    {
        match (h.mode, mode) {
            (LockMode::Shared, LockMode::Exclusive) => {
                return Err(CommandError::UpgradeNotAllowed { name: name.clone() }.into())
            }
            (LockMode::Exclusive, LockMode::Shared) => {
                return Err(CommandError::DowngradeNotAllowed { name: name.clone() }.into())
            }
            _ => {}
        }
        h.count = h
            .count
            .checked_add(1)
            .ok_or_else(|| CommandError::CounterExhausted {
                counter: format!("hold count of lock {name:?}"),
            })?;
        LockOutcome::Granted {
            sequencer: h.sequencer(name),
            hold_count: h.count,
        }
    } else if let Some(w) = lock.rec.queue.iter().find(|w| party(w.session, w.owner)) {
        return Err(CommandError::AlreadyWaiting {
            name: name.clone(),
            request_id: w.request_id,
        }
        .into());
    } else if lock.rec.queue.is_empty() && lock.rec.compatible(mode) {
        let hold = NewHold {
            session,
            owner,
            request_id,
            mode,
            lease_ms: *lease_ms,
            lock_delay_ms: *lock_delay_ms,
            value: value.clone(),
        };
        let sequencer = grant(store, &mut lock, hold, false, events)?;
        LockOutcome::Granted {
            sequencer,
            hold_count: 1,
        }
    } else if let Some(wait_ms) = *wait_ms {
        if lock.rec.queue.len() >= MAX_LOCK_WAITERS {
            return Err(CommandError::QueueFull {
                name: name.clone(),
                max: u32::try_from(MAX_LOCK_WAITERS).unwrap_or(u32::MAX),
            }
            .into());
        }
        let position = u32::try_from(lock.rec.queue.len()).unwrap_or(u32::MAX);
        lock.rec.queue.push(Waiter {
            session,
            owner,
            request_id,
            mode,
            wait_ms,
            lease_ms: *lease_ms,
            lock_delay_ms: *lock_delay_ms,
            value: value.clone(),
            group: Vec::new(),
        });
        events.push(Event::Queued {
            session,
            owner,
            request_id,
            name: name.clone(),
            mode,
            wait_ms,
        });
        LockOutcome::Queued {
            name: name.clone(),
            request_id,
            position,
        }
    } else {
        return Err(busy(&lock).into());
    };
    dedup::remember(store, session, session_rec, request_id, command, &outcome)?;
    save(store, lock, events)?;
    Ok(outcome)
}

/// [`LockCommand::Release`], validated already.
pub(crate) fn release<S: Store>(
    store: &mut S,
    command: &LockCommand,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let LockCommand::Release {
        session,
        secret: _,
        owner,
        request_id,
        name,
        token,
    } = command
    else {
        return Err(CommandError::invalid("not a release").into());
    };
    let (session, owner, request_id, token) = (*session, *owner, *request_id, *token);
    let session_rec = session::load_live(store, session)?;
    if let Some(first) = dedup::recall(store, session, &session_rec, request_id, command)? {
        return Ok(first);
    }
    let mut locks = Locks::default();
    let lock = locks.get(store, name)?;
    let remaining = release_hold(lock, session, owner, token, events)?;
    settle(store, &mut locks, name, events)?;
    let outcome = LockOutcome::Released {
        name: name.clone(),
        token,
        remaining,
    };
    dedup::remember(store, session, session_rec, request_id, command, &outcome)?;
    locks.save(store, events)?;
    Ok(outcome)
}

/// End (`session`, `owner`)'s grant `token` of `lock` whole, however many
/// re-entrant holds it has (a multi-lock's grant given back): as
/// [`release_hold`] otherwise, so a grant that no longer holds is refused
/// the same way.
pub(crate) fn end_grant(
    lock: &mut LockState,
    session: SessionId,
    owner: u64,
    token: Token,
    events: &mut Vec<Event>,
) -> Result<(), CommandError> {
    if let Some(holder) = lock
        .rec
        .holders
        .iter_mut()
        .find(|h| h.session == session && h.owner == owner && h.token == token)
    {
        holder.count = 1;
    }
    release_hold(lock, session, owner, token, events).map(|_| ())
}

/// Release one hold of (`session`, `owner`)'s grant `token` of `lock`:
/// the holds left (0: the grant is over, and reported). The caller moves
/// the queue on.
pub(crate) fn release_hold(
    lock: &mut LockState,
    session: SessionId,
    owner: u64,
    token: Token,
    events: &mut Vec<Event>,
) -> Result<u32, CommandError> {
    let name = &lock.name;
    let Some(i) = lock
        .rec
        .holders
        .iter()
        .position(|h| h.session == session && h.owner == owner)
    else {
        return Err(CommandError::NotHolder { name: name.clone() });
    };
    let holder = &mut lock.rec.holders[i];
    if holder.token != token {
        return Err(CommandError::StaleToken {
            name: name.clone(),
            token,
            current: holder.token,
        });
    }
    holder.count = holder.count.saturating_sub(1);
    let remaining = holder.count;
    if remaining == 0 {
        let gone = lock.rec.holders.remove(i);
        events.push(Event::Released {
            session,
            owner,
            name: name.clone(),
            token: gone.token,
            why: HoldEnd::Released,
        });
    }
    Ok(remaining)
}

/// [`LockCommand::Proclaim`], validated already: the leader (session,
/// owner, token) replaces its value. Not remembered per request: doing it
/// twice leaves the same state.
pub(crate) fn proclaim<S: Store>(
    store: &mut S,
    session: SessionId,
    owner: u64,
    name: &str,
    token: Token,
    value: &[u8],
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    session::load_live(store, session)?;
    let mut lock = load(store, name)?;
    let Some(holder) = lock
        .rec
        .holders
        .iter_mut()
        .find(|h| h.session == session && h.owner == owner)
    else {
        return Err(CommandError::NotHolder {
            name: name.to_string(),
        }
        .into());
    };
    if holder.token != token {
        return Err(CommandError::StaleToken {
            name: name.to_string(),
            token,
            current: holder.token,
        }
        .into());
    }
    holder.value = value.to_vec();
    save(store, lock, events)?;
    Ok(LockOutcome::Proclaimed { term: token })
}

/// [`LockCommand::CancelWait`], validated already.
pub(crate) fn cancel_wait<S: Store>(
    store: &mut S,
    session: SessionId,
    owner: u64,
    name: &str,
    request_id: u64,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    session::load_live(store, session)?;
    let mut locks = Locks::default();
    let lock = locks.get(store, name)?;
    let queued = lock
        .rec
        .queue
        .iter()
        .find(|w| w.is(session, owner, request_id));
    if let Some(waiter) = queued {
        // A multi-lock's wait leaves every queue it is in.
        let members = match waiter.group.as_slice() {
            [] => vec![name.to_string()],
            group => group.to_vec(),
        };
        events.push(Event::WaitCancelled {
            session,
            owner,
            request_id,
            name: waiter.reported_name(name).to_string(),
            why: WaitEnd::Cancelled,
        });
        for member in &members {
            locks
                .get(store, member)?
                .rec
                .queue
                .retain(|w| !w.is(session, owner, request_id));
        }
        dedup::update(store, session, request_id, Answer::WaitCancelled)?;
        for member in &members {
            settle(store, &mut locks, member, events)?;
        }
        locks.save(store, events)?;
        return Ok(LockOutcome::WaitCancel(WaitCancel::Cancelled));
    }
    let found = match dedup::lookup(store, session, request_id)? {
        Some(first) => match (&first.request, first.answer) {
            (
                Asked::Lock(LockCommand::Acquire {
                    owner: o, name: n, ..
                }),
                answer,
            ) if *o == owner && n == name => match answer {
                Answer::Outcome(LockOutcome::Granted { sequencer, .. }) => {
                    WaitCancel::AlreadyGranted(sequencer)
                }
                Answer::WaitCancelled => WaitCancel::Cancelled,
                Answer::Outcome(_) | Answer::Written(_) => WaitCancel::NotWaiting,
            },
            (
                Asked::Lock(LockCommand::AcquireAll {
                    owner: o, names, ..
                }),
                answer,
            ) if *o == owner && names.iter().any(|n| n == name) => match answer {
                Answer::Outcome(LockOutcome::GrantedAll { sequencers }) => {
                    WaitCancel::AlreadyGrantedAll(sequencers)
                }
                Answer::WaitCancelled => WaitCancel::Cancelled,
                Answer::Outcome(_) | Answer::Written(_) => WaitCancel::NotWaiting,
            },
            _ => WaitCancel::NotWaiting,
        },
        None => WaitCancel::NotWaiting,
    };
    Ok(LockOutcome::WaitCancel(found))
}

/// [`LockCommand::ExpireLockLease`], validated already.
pub(crate) fn expire_lease<S: Store>(
    store: &mut S,
    name: &str,
    token: Token,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let mut locks = Locks::default();
    let lock = locks.get(store, name)?;
    let Some(i) = lock
        .rec
        .holders
        .iter()
        .position(|h| h.token == token && h.lease_ms.is_some())
    else {
        return Ok(LockOutcome::LeaseExpired { released: false });
    };
    let gone = lock.rec.holders.remove(i);
    events.push(Event::Released {
        session: gone.session,
        owner: gone.owner,
        name: name.to_string(),
        token,
        why: HoldEnd::LeaseExpired,
    });
    start_lock_delay(lock, &[gone], 0, events);
    settle(store, &mut locks, name, events)?;
    locks.save(store, events)?;
    Ok(LockOutcome::LeaseExpired { released: true })
}

/// [`LockCommand::EndLockDelay`], validated already.
pub(crate) fn end_lock_delay<S: Store>(
    store: &mut S,
    name: &str,
    token: Token,
    events: &mut Vec<Event>,
) -> Applied<LockOutcome> {
    let mut locks = Locks::default();
    let lock = locks.get(store, name)?;
    if lock.rec.delay.map(|d| d.token) != Some(token) {
        return Ok(LockOutcome::LockDelayEnded { ended: false });
    }
    lock.rec.delay = None;
    events.push(Event::LockDelayEnded {
        name: name.to_string(),
        token,
    });
    settle(store, &mut locks, name, events)?;
    locks.save(store, events)?;
    Ok(LockOutcome::LockDelayEnded { ended: true })
}

/// Remove every hold and wait of an ending `session` from lock `name` in
/// `locks`, starting its lock-delay if due. The caller moves the queue on
/// ([`settle`]) once the session is gone from all its locks. Returns
/// (holds released, waits cancelled).
pub(crate) fn drop_session<S: Store>(
    store: &mut S,
    locks: &mut Locks,
    name: &str,
    session: SessionId,
    how: SessionEnd,
    ttl_ms: u64,
    events: &mut Vec<Event>,
) -> Applied<(u32, u32)> {
    let lock = locks.get(store, name)?;
    let (gone, kept): (Vec<Holder>, Vec<Holder>) = std::mem::take(&mut lock.rec.holders)
        .into_iter()
        .partition(|h| h.session == session);
    lock.rec.holders = kept;
    let (cancelled, waiting): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut lock.rec.queue)
        .into_iter()
        .partition(|w| w.session == session);
    lock.rec.queue = waiting;
    for h in &gone {
        events.push(Event::Released {
            session,
            owner: h.owner,
            name: name.to_string(),
            token: h.token,
            why: HoldEnd::SessionEnded(how),
        });
    }
    // A multi-lock's wait is in several queues and is reported (and
    // counted) once, by its first lock; the session's end reaches the
    // other queues in the same entry.
    let reported: Vec<&Waiter> = cancelled
        .iter()
        .filter(|w| w.reported_name(name) == name)
        .collect();
    for w in &reported {
        events.push(Event::WaitCancelled {
            session,
            owner: w.owner,
            request_id: w.request_id,
            name: name.to_string(),
            why: WaitEnd::SessionEnded(how),
        });
    }
    match how {
        SessionEnd::Expired => start_lock_delay(lock, &gone, 0, events),
        // The holder's client may count its lease valid for up to a TTL
        // after its last keep-alive: nobody gets the lock before that.
        SessionEnd::Ended => start_operator_delay(lock, &gone, ttl_ms, events),
        SessionEnd::Closed => {}
    }
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    Ok((count(gone.len()), count(reported.len())))
}
