//! Fenced leader election: [`Election`] (campaigning in a session),
//! [`Leadership`] (a won term), and reading or following who leads
//! ([`Client::leader`], [`Client::observe_leader`]).
//!
//! An election is a lock with a leader key (the core's
//! `latchkey_core::lock::election` module has the rules): campaigning
//! queues in FIFO order without polling, the term is the grant's fencing
//! token (strictly increasing over the election's whole life), and the
//! leader's writes fenced with its sequencer are refused once a newer term
//! exists: a deposed leader that wakes from a pause cannot write. The
//! leader key `latchkey.election/NAME` changes in the same log entry as
//! the lock, so observers see each term, in order, with its latest value.
//! When a leader's session is closed, or expires without a lock-delay, the
//! next candidate leads in that same entry; with a lock-delay (and always
//! after an operator's `session end`, which imposes one of at least the
//! TTL), nobody leads until it is over.
//!
//! Imports `session`, `guard`, `handle` (this file is after them).
//!
//! ```no_run
//! # async fn demo(client: latchkey_client::Client) -> Result<(), latchkey_client::Error> {
//! use std::time::Duration;
//!
//! let session = client.session(Duration::from_secs(10)).await?;
//! let leadership = session.election("scheduler").campaign("10.0.0.7:8080").await?;
//! println!("leading in term {}", leadership.term());
//! // Work only while leading; storage writes fenced by the term.
//! leadership
//!     .while_held(async {
//!         leadership.put("schedule/owner", "10.0.0.7").await
//!     })
//!     .await??;
//! leadership.resign().await?;
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Stream, StreamExt};
use latchkey_core::lock::{election_lock_name, Leader, LockCommand, LockOutcome, Token};
use latchkey_core::watch::Selection;
use latchkey_core::{Command, Outcome};
use latchkey_proto::wire::WatchMessage;

use super::guard::LockGuard;
use super::handle::Lock;
use super::session::Session;
use crate::error::Error;
use crate::kv::{unexpected, Client, Consistency};
use crate::watch::Watch;

/// One session's candidacy in the election `name`: one owner, so
/// campaigning again while leading re-enters the same term instead of
/// queueing behind itself.
#[derive(Debug)]
pub struct Election {
    name: String,
    session: Session,
    lock: Lock,
}

impl Session {
    /// A candidacy in the election `name` (1 to 238 bytes of UTF-8: the
    /// election's lock, `latchkey.election/` + `name`, obeys the lock-name
    /// limit). Campaigning needs the lock permission on that lock's name;
    /// reading or observing the leader needs the read permission on the
    /// key of the same name.
    pub fn election(&self, name: impl Into<String>) -> Election {
        let name = name.into();
        Election {
            lock: self.lock(election_lock_name(&name)),
            session: self.clone(),
            name,
        }
    }
}

impl Election {
    /// After a leader's session expires or its lease ends, keep the
    /// election without a leader for `delay` (up to 1 min), so a deposed
    /// leader that was cut off has time to notice before the next one acts.
    pub fn lock_delay(mut self, delay: Duration) -> Self {
        self.lock = self.lock.lock_delay(delay);
        self
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaign with `value` (at most 1,024 bytes: what observers are told,
    /// an address or an id) and wait in FIFO order, as long as it takes,
    /// until leading. Dropping the future withdraws the candidacy. Refused
    /// (`InvalidArgument`) while this candidacy leads. Takes `&mut self`:
    /// one candidacy campaigns once at a time.
    pub async fn campaign(&mut self, value: impl AsRef<[u8]>) -> Result<Leadership, Error> {
        self.not_leading()?;
        let guard = self
            .lock
            .with_value(value.as_ref().to_vec())
            .acquire()
            .await?;
        Ok(self.leadership(guard))
    }

    /// Campaign once: `None` if another candidate leads or waits (no
    /// overtaking) or the election is in lock-delay.
    pub async fn try_campaign(
        &mut self,
        value: impl AsRef<[u8]>,
    ) -> Result<Option<Leadership>, Error> {
        self.not_leading()?;
        let lock = self.lock.with_value(value.as_ref().to_vec());
        Ok(lock
            .try_acquire()
            .await?
            .map(|guard| self.leadership(guard)))
    }

    /// Campaign, waiting at most `wait`: `None` if another candidate still
    /// leads then (the candidacy is withdrawn).
    pub async fn campaign_timeout(
        &mut self,
        value: impl AsRef<[u8]>,
        wait: Duration,
    ) -> Result<Option<Leadership>, Error> {
        self.not_leading()?;
        let lock = self.lock.with_value(value.as_ref().to_vec());
        Ok(lock
            .acquire_timeout(wait)
            .await?
            .map(|guard| self.leadership(guard)))
    }

    /// Who leads now (a linearizable read of the leader key).
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        self.session.client().leader(&self.name).await
    }

    /// Refuse a campaign while this candidacy leads (or its resignation is
    /// still in flight): it would re-enter the same term, keep the old
    /// value and need two resignations.
    fn not_leading(&self) -> Result<(), Error> {
        if self.lock.holds_any() {
            return Err(Error::InvalidArgument(format!(
                "this candidacy in election {:?} leads already (or its resignation is still \
                 in flight): proclaim to change the value, resign before campaigning again",
                self.name
            )));
        }
        Ok(())
    }

    fn leadership(&self, guard: LockGuard) -> Leadership {
        Leadership {
            election: self.name.clone(),
            guard,
        }
    }
}

/// A won term. Dereferences to its [`LockGuard`]: [`LockGuard::token`] is
/// the term, [`LockGuard::put`] and the other fenced writes are refused
/// once a newer term exists, [`LockGuard::lost`], [`LockGuard::at_risk`]
/// and [`LockGuard::while_held`] work as for a lock. Dropping it resigns
/// in the background, as dropping a guard releases.
#[derive(Debug)]
pub struct Leadership {
    election: String,
    guard: LockGuard,
}

impl std::ops::Deref for Leadership {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl Leadership {
    /// The term: the grant's fencing token, greater than every earlier
    /// term of this election (and every token granted before it).
    pub fn term(&self) -> Token {
        self.guard.token()
    }

    /// The election's name.
    pub fn election(&self) -> &str {
        &self.election
    }

    /// Tell observers a new value (etcd's `Proclaim`): the leader key
    /// changes, the term stays. Refused with `NotHolder` or `StaleToken`
    /// once this term is over. Takes `&mut self`, so one leadership's
    /// proclamations are sent one after another; but a proclamation that
    /// answered `Unavailable` or `UnknownOutcome` (or whose future was
    /// dropped) may still apply after a later one: proclaim again after
    /// such an error to be sure of the value shown.
    pub async fn proclaim(&mut self, value: impl AsRef<[u8]>) -> Result<(), Error> {
        let session = self.guard.session();
        let command = Command::Lock(LockCommand::Proclaim {
            session: session.id(),
            secret: session.secret(),
            owner: self.guard.owner(),
            name: self.guard.sequencer().name.clone(),
            token: self.term(),
            value: value.as_ref().to_vec(),
        });
        latchkey_core::validate_command(&command)?;
        // Setting the same value twice leaves the same state: safe to resend.
        match session.client().execute_with(command, true).await? {
            Outcome::Lock(LockOutcome::Proclaimed { .. }) => Ok(()),
            other => Err(unexpected("Proclaimed", &other)),
        }
    }

    /// Give up leading: the next candidate leads in the same log entry.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }

    /// The grant behind this term, for code written for locks (releasing
    /// it resigns).
    pub fn into_guard(self) -> LockGuard {
        self.guard
    }
}

/// Who leads an election after a revision, as [`Client::observe_leader`]
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderChange {
    /// The cluster revision of the change (for the first item: the
    /// revision the initial read saw).
    pub revision: u64,
    /// The leader from then on; `None`: nobody leads.
    pub leader: Option<Leader>,
    /// True when changes before this one may have been missed: the
    /// cluster's history no longer held the revisions after the last item
    /// (the observer fell too far behind), so the leader was read again and
    /// terms in between are not reported. False on the first item.
    pub skipped: bool,
}

/// The stream of [`Client::observe_leader`].
pub struct LeaderStream {
    inner: Pin<Box<dyn Stream<Item = Result<LeaderChange, Error>> + Send>>,
}

impl std::fmt::Debug for LeaderStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaderStream")
    }
}

impl Stream for LeaderStream {
    type Item = Result<LeaderChange, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

/// The leader a leader key's value names; an undecodable value is a
/// protocol error (only the cluster writes leader keys).
fn decode(election: &str, bytes: &[u8]) -> Result<Leader, Error> {
    Leader::decode(bytes).ok_or_else(|| {
        Error::Protocol(format!(
            "the leader key of election {election:?} holds {} bytes that are not a leader",
            bytes.len()
        ))
    })
}

impl Client {
    /// Who leads the election `name` now: a linearizable read of its
    /// leader key. `None` while nobody leads.
    pub async fn leader(&self, name: &str) -> Result<Option<Leader>, Error> {
        let key = election_lock_name(name);
        let read = self.get_versioned(&key, Consistency::Linearizable).await?;
        read.value.map(|v| decode(name, &v.value)).transpose()
    }

    /// Follow who leads the election `name` (etcd's `Observe`): first the
    /// leader now (from a linearizable read), then every change, in order,
    /// each term once with its latest value and `None` while nobody leads.
    /// Resumes across reconnects and replica changes like a
    /// [`Watch`](crate::Watch), from the revision after the last it
    /// reported. While no replica can be reached it yields
    /// [`Error::Unavailable`] and goes on trying (also for its first read);
    /// if the history no longer holds the next revision it reads the leader
    /// again and goes on from there (the terms in between are not
    /// reported; the next change says so with [`LeaderChange::skipped`]).
    /// It ends only after reporting an error that trying again cannot cure
    /// (access refused, an invalid name).
    pub fn observe_leader(&self, name: &str) -> LeaderStream {
        let start = Observing {
            client: self.clone(),
            election: name.to_string(),
            key: election_lock_name(name),
            watch: None,
            last: None,
            gap: false,
            pending: VecDeque::new(),
            done: false,
        };
        LeaderStream {
            inner: futures::stream::unfold(start, Observing::step).boxed(),
        }
    }
}

/// Where an observation of an election is: read the leader key, then watch
/// it from the read's revision plus one; read again after a compaction.
struct Observing {
    client: Client,
    election: String,
    key: String,
    /// Open once a read succeeded; `None`: read (again) first.
    watch: Option<Watch>,
    /// The leader last reported, once anything was.
    last: Option<Option<Leader>>,
    /// The history lost revisions since the last item reported.
    gap: bool,
    /// Changes decoded and not yet reported.
    pending: VecDeque<LeaderChange>,
    /// A permanent error was reported: the stream is over.
    done: bool,
}

impl Observing {
    /// Record `leader` at `revision` unless it is what was last reported.
    fn note(&mut self, revision: u64, leader: Option<Leader>) {
        if self.last.as_ref() == Some(&leader) {
            // The same grant as last reported (terms only grow): whatever
            // the history lost, no term is missing.
            self.gap = false;
        } else {
            self.last = Some(leader.clone());
            let skipped = std::mem::take(&mut self.gap);
            self.pending.push_back(LeaderChange {
                revision,
                leader,
                skipped,
            });
        }
    }

    /// The next item of the stream, and the state after it; `None`: over.
    async fn step(mut self) -> Option<(Result<LeaderChange, Error>, Observing)> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Some((Ok(change), self));
            }
            if self.done {
                return None;
            }
            let Some(watch) = self.watch.as_mut() else {
                let read = self
                    .client
                    .get_versioned(&self.key, Consistency::Linearizable)
                    .await;
                let read = match read {
                    Ok(read) => read,
                    // Like a watch: report it, and try again when polled.
                    Err(e @ Error::Unavailable { .. }) => return Some((Err(e), self)),
                    Err(e) => return self.fail(e),
                };
                let leader = read.value.map(|v| decode(&self.election, &v.value));
                match leader.transpose() {
                    Ok(leader) => self.note(read.revision, leader),
                    Err(e) => return self.fail(e),
                }
                self.watch = Some(
                    self.client
                        .watch(Selection::key(self.key.as_bytes()))
                        .from_revision(read.revision + 1),
                );
                continue;
            };
            match watch.next().await {
                Some(Ok(WatchMessage::Changes {
                    revision, changes, ..
                })) => {
                    let key = self.key.clone().into_bytes();
                    for change in changes.into_iter().filter(|c| c.key == key) {
                        let leader = change.current.map(|v| decode(&self.election, &v.value));
                        match leader.transpose() {
                            Ok(leader) => self.note(revision, leader),
                            Err(e) => return self.fail(e),
                        }
                    }
                }
                Some(Ok(WatchMessage::Progress { .. })) => {}
                // The history no longer holds the next revision: read who
                // leads now (terms in between are not reported).
                Some(Err(Error::Compacted { .. })) => {
                    self.watch = None;
                    self.gap = true;
                }
                Some(Err(e @ Error::Unavailable { .. })) => return Some((Err(e), self)),
                Some(Err(e)) => return self.fail(e),
                None => {
                    return self.fail(Error::Protocol(
                        "the watch of a leader key ended without an error".into(),
                    ))
                }
            }
        }
    }

    /// Report `e` and end the stream.
    fn fail(mut self, e: Error) -> Option<(Result<LeaderChange, Error>, Observing)> {
        self.done = true;
        Some((Err(e), self))
    }
}
