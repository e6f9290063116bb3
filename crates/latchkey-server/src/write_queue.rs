//! [`WriteQueue`]: the leader's write path into Raft, packing concurrent
//! writes into one log entry.
//!
//! openraft's core appends each proposal as its own entry, and every
//! entry costs the core, the replication tasks and the state machine a
//! fixed amount of work (before the log store acknowledged a leader's own
//! appends ahead of their sync, it also cost one serial fsync: put at 64
//! clients ran at the disk's serial fsync rate). Here
//! every write goes through one queue; a task takes everything queued, and
//! proposes it as one entry — a single command as itself, several as a
//! [`Command::Group`] that the state machine applies command by command with
//! a result each. At most [`MAX_IN_FLIGHT`] entries are in flight, so writes
//! that arrive meanwhile wait in the queue (where they can be packed) rather
//! than in openraft's (where they cannot).
//!
//! Safety is unchanged: an entry is answered only once openraft has
//! committed (fsynced on a majority) and applied it, and a group is applied
//! exactly as its commands would be as consecutive entries with the same
//! timestamp. Proposals are handed to openraft in queue order.
//!
//! The queue is bounded: client writes waiting to be proposed may hold at
//! most [`MAX_QUEUED_BYTES`] between them, each charged its payload plus
//! [`QUEUED_WRITE_OVERHEAD`] (so about 14,500 writes of 128 bytes, 1–2 s of
//! work at the measured peak). A write that finds no room is refused at once
//! with [`ReplicaFailure::Unavailable`] ("overloaded"): nothing was queued,
//! so nothing is applied, and the client retries it with backoff like any
//! other unavailable replica. The leader's own expiry commands are never
//! refused (they end sessions and waits, which frees the store).
//!
//! A leader that is removing itself from the voters, handing leadership
//! over or stopping first pauses the queue ([`WriteQueue::pause_and_drain`]):
//! every entry already proposed is answered, and every write not yet
//! proposed (queued or new) is refused with [`ReplicaFailure::Unavailable`]
//! (nothing proposed, so the client retries it on the next leader). Without
//! it, writes still in flight when the leader steps down end as unknown
//! outcomes. Pauses nest: the queue takes writes again once every
//! [`Paused`] guard is dropped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use latchkey_core::limits::MAX_GROUP_COMMANDS;
use latchkey_core::{Command, CommandResult, Outcome, Request};
use latchkey_proto::ReplicaFailure;
use latchkey_storage::types::Raft;
use latchkey_storage::TypeConfig;
use openraft::error::{ClientWriteError, ForwardToLeader};
use openraft::impls::ProgressResponder;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

/// Most entries proposed and not yet answered. More than one lets an
/// entry's leader fsync overlap the previous entries' replication, while
/// everything else queues here to be packed. Measured (docs/performance-log.md):
/// behind the client's packing lanes 2 beat 1 and 4; once clients sent every
/// request at once on a call stream (change 10), 3 beat 2 (lock cycle x32
/// 1.21x, in each of 4 interleaved rounds; put x64 1.06x; the rest even).
pub(crate) const MAX_IN_FLIGHT: usize = 3;

/// Largest total payload (keys + values) packed into one group. A command
/// above it is proposed alone.
pub(crate) const MAX_GROUP_BYTES: usize = 1024 * 1024;

/// Room for client writes waiting to be proposed, in bytes as charged by
/// [`charge`]: four of the largest commands
/// ([`latchkey_core::limits::MAX_COMMAND_BYTES`]), or about 14,500 writes
/// of 128 bytes.
pub(crate) const MAX_QUEUED_BYTES: usize =
    4 * (latchkey_core::limits::MAX_COMMAND_BYTES + QUEUED_WRITE_OVERHEAD);

/// What a queued write costs beyond its payload: the command's allocations,
/// its reply channel and the caller's future, rounded up.
pub(crate) const QUEUED_WRITE_OVERHEAD: usize = 1024;

/// The room a write of `payload` bytes takes in the queue.
fn charge(payload: usize) -> u32 {
    u32::try_from(payload.saturating_add(QUEUED_WRITE_OVERHEAD)).unwrap_or(u32::MAX)
}

type Reply = oneshot::Sender<Result<CommandResult, ReplicaFailure>>;

/// A write waiting to be proposed.
struct Pending {
    command: Command,
    reply: Reply,
    /// The client write's room in the queue, given back once the write is
    /// taken out to be proposed (`None` for the leader's own commands).
    _room: Option<OwnedSemaphorePermit>,
}

/// What the proposal task takes from the queue.
enum Queued {
    Write(Pending),
    /// Answer once everything queued before it has been proposed and
    /// answered.
    Drain(oneshot::Sender<()>),
}

/// The sending half of the proposal queue. Dropping it (with the replica)
/// ends the task once the queue is drained.
pub(crate) struct WriteQueue {
    queue: mpsc::UnboundedSender<Queued>,
    room: Arc<Semaphore>,
    /// How many pauses hold the queue (see the module docs).
    paused: Arc<AtomicUsize>,
}

/// One pause of the queue ([`WriteQueue::pause_and_drain`]); dropping the
/// last one lets writes in again.
pub(crate) struct Paused(Arc<AtomicUsize>);

impl Drop for Paused {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Whether any pause holds the queue.
fn is_paused(paused: &AtomicUsize) -> bool {
    paused.load(Ordering::SeqCst) > 0
}

/// Who proposes a write: clients are subject to the queue's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    Client,
    Leader,
}

impl WriteQueue {
    /// Start the proposal task of `raft`; a proposal not answered within
    /// `write_timeout` is reported as of unknown outcome.
    pub(crate) fn start(raft: Raft, write_timeout: Duration) -> WriteQueue {
        let (queue, rx) = mpsc::unbounded_channel();
        let paused = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(raft, write_timeout, rx, Arc::clone(&paused)));
        WriteQueue {
            queue,
            room: Arc::new(Semaphore::new(MAX_QUEUED_BYTES)),
            paused,
        }
    }

    /// Refuse every write not yet proposed until the returned guard is
    /// dropped, and wait until every entry already proposed has been
    /// answered (committed and applied, refused, or timed out after the
    /// write timeout). Pauses nest: writes come back once every guard is
    /// dropped.
    pub(crate) async fn pause_and_drain(&self) -> Paused {
        self.paused.fetch_add(1, Ordering::SeqCst);
        let paused = Paused(Arc::clone(&self.paused));
        let (done, drained) = oneshot::channel();
        if self.queue.send(Queued::Drain(done)).is_ok() {
            // An error: the task stopped, so nothing is in flight.
            let _ = drained.await;
        }
        paused
    }

    /// Propose `command` (already validated) and wait for its result. A
    /// client write that finds the queue full is refused at once with
    /// [`ReplicaFailure::Unavailable`], having queued nothing.
    pub(crate) async fn propose(
        &self,
        command: Command,
        origin: Origin,
    ) -> Result<CommandResult, ReplicaFailure> {
        if is_paused(&self.paused) {
            return Err(leaving());
        }
        let room = match origin {
            Origin::Leader => None,
            Origin::Client => Some(admit(&self.room, command.payload_len())?),
        };
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Queued::Write(Pending {
                command,
                reply,
                _room: room,
            }))
            .map_err(|_| ReplicaFailure::Unavailable("this replica is shutting down".into()))?;
        match answer.await {
            Ok(result) => result,
            // The task dropped the write: it stopped while the write was
            // queued or in flight.
            Err(_) => Err(ReplicaFailure::UnknownOutcome(
                "replica stopped while the write was pending".into(),
            )),
        }
    }
}

/// The refusal of a write while the queue is paused.
fn leaving() -> ReplicaFailure {
    ReplicaFailure::Unavailable(
        "this leader is handing leadership over (a transfer, a stop or its removal): nothing \
         was proposed; retry, the next leader takes it"
            .into(),
    )
}

/// Take room for a client write of `payload` bytes, or refuse it.
fn admit(room: &Arc<Semaphore>, payload: usize) -> Result<OwnedSemaphorePermit, ReplicaFailure> {
    Arc::clone(room)
        .try_acquire_many_owned(charge(payload))
        .map_err(|_| {
            ReplicaFailure::Unavailable(format!(
                "overloaded: the leader's write queue is full ({} MiB of writes waiting); \
                 nothing was applied, retry later",
                MAX_QUEUED_BYTES / (1024 * 1024)
            ))
        })
}

/// Wall-clock milliseconds: the `now` a leader stamps on each entry. The core
/// keeps the largest value seen, so a clock stepping back is harmless.
fn wall_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

pub(crate) fn hint(f: &ForwardToLeader<TypeConfig>) -> Option<(u64, String)> {
    match (f.leader_id, &f.leader_node) {
        (Some(id), Some(node)) => Some((id, node.client_addr.clone())),
        _ => None,
    }
}

async fn run(
    raft: Raft,
    write_timeout: Duration,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    paused: Arc<AtomicUsize>,
) {
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut carry: Option<Queued> = None;
    loop {
        let first = match carry.take() {
            Some(q) => q,
            None => match rx.recv().await {
                Some(q) => q,
                None => break,
            },
        };
        let first = match first {
            Queued::Write(p) => p,
            Queued::Drain(done) => {
                // Every earlier write is proposed; holding every permit
                // means each has been answered.
                if let Ok(all) = permits.acquire_many(MAX_IN_FLIGHT as u32).await {
                    drop(all);
                }
                let _ = done.send(());
                continue;
            }
        };
        // Wait for room before packing: whatever queues meanwhile joins.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let mut bytes = first.command.payload_len();
        let mut group = vec![first];
        while group.len() < MAX_GROUP_COMMANDS {
            let Ok(next) = rx.try_recv() else { break };
            let next = match next {
                Queued::Write(p) => p,
                drain @ Queued::Drain(_) => {
                    carry = Some(drain);
                    break;
                }
            };
            let len = next.command.payload_len();
            if bytes + len > MAX_GROUP_BYTES {
                carry = Some(Queued::Write(next));
                break;
            }
            bytes += len;
            group.push(next);
        }
        // Paused (the flag is set before the drain marker is queued, so
        // every write behind the marker sees it): refuse, proposing nothing.
        if is_paused(&paused) {
            for p in group {
                let _ = p.reply.send(Err(leaving()));
            }
            continue;
        }
        // A caller that gave up (its own timeout) has already been told the
        // outcome is unknown: nothing needs proposing for it.
        group.retain(|p| !p.reply.is_closed());
        if group.is_empty() {
            continue;
        }
        propose(&raft, write_timeout, group, permit).await;
    }
    tracing::debug!("proposal task stopped");
}

/// Hand `group` to openraft as one entry (in queue order), then answer its
/// writes from a task of their own once the entry is applied.
async fn propose(
    raft: &Raft,
    write_timeout: Duration,
    mut group: Vec<Pending>,
    permit: OwnedSemaphorePermit,
) {
    // Each write's room in the queue is given back here, as it is taken out
    // to be proposed; entries in flight are bounded by `MAX_IN_FLIGHT`.
    let (command, replies) = if group.len() == 1 {
        let Pending { command, reply, .. } = group.remove(0);
        (command, vec![reply])
    } else {
        let (commands, replies) = group.into_iter().map(|p| (p.command, p.reply)).unzip();
        (Command::Group { commands }, replies)
    };
    let grouped = matches!(command, Command::Group { .. });
    let request = Request {
        now: wall_millis(),
        command,
    };
    let (responder, answer) = ProgressResponder::complete_only();
    let answer = match raft.client_write_ff(request, Some(responder)).await {
        Ok(()) => answer,
        // `client_write_ff` fails only when it could not hand the entry to
        // the Raft core (the core has stopped): nothing was proposed, so
        // the write may safely be retried on another replica.
        Err(e) => {
            let failure = ReplicaFailure::Unavailable(format!(
                "this replica's Raft core has stopped ({e}); nothing was proposed"
            ));
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
            return;
        }
    };
    tokio::spawn(async move {
        let result = match tokio::time::timeout(write_timeout, answer).await {
            Ok(Ok(Ok(response))) => Ok(response.data),
            // Refused before it was appended: it was never committed.
            Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
                Err(ReplicaFailure::NotLeader { leader: hint(&f) })
            }
            // Appended, then dropped when this replica took another
            // leader's log (a truncation, or a snapshot installed over
            // it): it may still have committed through another leader.
            Ok(Ok(Err(ClientWriteError::LogEntryDiscarded(f)))) => Err(ReplicaFailure::UnknownOutcome(
                format!("the write's log entry was discarded at a leader change ({f}); it may or may not have committed"),
            )),
            Ok(Ok(Err(ClientWriteError::ChangeMembershipError(e)))) => {
                Err(ReplicaFailure::InvalidArgument(e.to_string()))
            }
            // latchkey attaches no precondition to its proposals.
            Ok(Ok(Err(ClientWriteError::PreconditionFailed(e)))) => {
                Err(ReplicaFailure::InvalidArgument(e.to_string()))
            }
            Ok(Err(_)) => Err(ReplicaFailure::UnknownOutcome(
                "replica stopped while the write was pending".into(),
            )),
            Err(_) => Err(ReplicaFailure::UnknownOutcome(format!(
                "the write did not commit within {write_timeout:?}"
            ))),
        };
        drop(permit);
        answer_all(grouped, replies, result);
    });
}

/// Fan an entry's result out to the writes it carried.
fn answer_all(grouped: bool, replies: Vec<Reply>, result: Result<CommandResult, ReplicaFailure>) {
    if !grouped {
        for reply in replies {
            let _ = reply.send(result.clone());
        }
        return;
    }
    match result {
        Ok(Ok(Outcome::Group(results))) if results.len() == replies.len() => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(Ok(result));
            }
        }
        // The group as a whole was refused: none of its commands applied.
        Ok(Err(e)) => {
            for reply in replies {
                let _ = reply.send(Ok(Err(e.clone())));
            }
        }
        Ok(Ok(other)) => {
            tracing::error!(
                ?other,
                "a group entry was answered with a non-group outcome"
            );
            let failure = ReplicaFailure::UnknownOutcome(
                "the replica could not match the group's results to its writes".into(),
            );
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
        }
        Err(failure) => {
            for reply in replies {
                let _ = reply.send(Err(failure.clone()));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_core::limits::MAX_COMMAND_BYTES;

    #[test]
    fn a_full_queue_refuses_client_writes_until_room_is_given_back() {
        let room = Arc::new(Semaphore::new(MAX_QUEUED_BYTES));
        let small = 128;
        let fits = MAX_QUEUED_BYTES / (small + QUEUED_WRITE_OVERHEAD);
        assert!((14_000..15_000).contains(&fits), "{fits}");
        let mut held: Vec<OwnedSemaphorePermit> = (0..fits)
            .map(|_| admit(&room, small).expect("room for it"))
            .collect();
        match admit(&room, small) {
            Err(ReplicaFailure::Unavailable(msg)) => {
                assert!(msg.contains("overloaded"), "{msg}");
                assert!(msg.contains("nothing was applied"), "{msg}");
            }
            other => panic!("expected an overloaded refusal, got {other:?}"),
        }
        // A write taken out of the queue gives its room back.
        held.pop();
        assert!(admit(&room, small).is_ok());
    }

    #[tokio::test]
    async fn client_writes_meet_the_bound_and_the_leaders_own_do_not() {
        // A queue with no room left and no proposal task behind it.
        let (queue, mut rx) = mpsc::unbounded_channel();
        let writes = WriteQueue {
            queue,
            room: Arc::new(Semaphore::new(0)),
            paused: Arc::new(AtomicUsize::new(0)),
        };
        let put = Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        // Bounded: a write that were queued would wait for an answer forever.
        let refused = tokio::time::timeout(
            Duration::from_secs(5),
            writes.propose(put.clone(), Origin::Client),
        )
        .await;
        match refused {
            Ok(Err(ReplicaFailure::Unavailable(msg))) => {
                assert!(msg.contains("overloaded"), "{msg}")
            }
            other => panic!("expected an overloaded refusal at once, got {other:?}"),
        }
        assert!(rx.try_recv().is_err(), "a refused write was queued");
        // The leader's command is queued regardless; answered here as if
        // proposed and applied.
        let (answered, ()) = tokio::join!(writes.propose(put.clone(), Origin::Leader), async {
            let Some(Queued::Write(pending)) = rx.recv().await else {
                panic!("the leader's write is not queued");
            };
            assert_eq!(pending.command, put);
            let _ = pending.reply.send(Ok(Ok(Outcome::Deleted {
                count: 0,
                revision: 0,
            })));
        });
        assert_eq!(
            answered,
            Ok(Ok(Outcome::Deleted {
                count: 0,
                revision: 0
            }))
        );
    }

    #[tokio::test]
    async fn a_paused_queue_answers_what_it_holds_and_refuses_the_rest_until_every_pause_ends() {
        // A proposal task whose Raft core never answers is not needed: the
        // drain marker is answered by whoever takes it from the queue.
        let (queue, mut rx) = mpsc::unbounded_channel();
        let writes = WriteQueue {
            queue,
            room: Arc::new(Semaphore::new(MAX_QUEUED_BYTES)),
            paused: Arc::new(AtomicUsize::new(0)),
        };
        let put = Command::Put {
            key: b"k".to_vec(),
            value: b"v".to_vec(),
        };
        // One write queued before the pause: the drain comes after it.
        let (before, paused) = tokio::join!(writes.propose(put.clone(), Origin::Client), async {
            let (paused, ()) = tokio::join!(writes.pause_and_drain(), async {
                let Some(Queued::Write(pending)) = rx.recv().await else {
                    panic!("the write is not first");
                };
                let _ = pending.reply.send(Ok(Ok(Outcome::Deleted {
                    count: 1,
                    revision: 1,
                })));
                let Some(Queued::Drain(done)) = rx.recv().await else {
                    panic!("the drain is not second");
                };
                let _ = done.send(());
            });
            paused
        });
        assert_eq!(
            before,
            Ok(Ok(Outcome::Deleted {
                count: 1,
                revision: 1
            }))
        );
        for origin in [Origin::Client, Origin::Leader] {
            match writes.propose(put.clone(), origin).await {
                Err(ReplicaFailure::Unavailable(msg)) => {
                    assert!(msg.contains("handing leadership over"), "{msg}")
                }
                other => panic!("expected a refusal while paused, got {other:?}"),
            }
        }
        assert!(rx.try_recv().is_err(), "a refused write was queued");
        // Pauses nest: the first one ending leaves the second in force.
        let (second, ()) = tokio::join!(writes.pause_and_drain(), async {
            let Some(Queued::Drain(done)) = rx.recv().await else {
                panic!("the second drain is not queued");
            };
            let _ = done.send(());
        });
        drop(paused);
        assert!(
            matches!(
                writes.propose(put.clone(), Origin::Client).await,
                Err(ReplicaFailure::Unavailable(_))
            ),
            "a write got in while the second pause held"
        );
        drop(second);
        let (after, ()) = tokio::join!(writes.propose(put.clone(), Origin::Client), async {
            let Some(Queued::Write(pending)) = rx.recv().await else {
                panic!("the write after the pause is not queued");
            };
            let _ = pending.reply.send(Ok(Ok(Outcome::Deleted {
                count: 2,
                revision: 2,
            })));
        });
        assert_eq!(
            after,
            Ok(Ok(Outcome::Deleted {
                count: 2,
                revision: 2
            }))
        );
    }

    #[test]
    fn the_largest_command_fits_an_empty_queue() {
        let room = Arc::new(Semaphore::new(MAX_QUEUED_BYTES));
        let held: Vec<_> = (0..4)
            .map(|_| admit(&room, MAX_COMMAND_BYTES).expect("four fit"))
            .collect();
        assert!(admit(&room, MAX_COMMAND_BYTES).is_err());
        drop(held);
        assert!(admit(&room, usize::MAX).is_err(), "no overflow, no panic");
    }
}
