//! Disk faults, and the repair of a replica whose data directory is gone
//! or cannot be trusted.
//!
//! A disk fault damages one replica's data directory ([`DiskFault`]), then
//! watches what the replica makes of it: it refuses to start (exit code 8,
//! "lost state this replica had acknowledged"), exits while running, waits
//! to be added again (state `Waiting`: a new, empty data directory), or
//! runs on (a truncation that cut only records this replica never
//! acknowledged, a flipped byte nobody has read yet). The harness records
//! which; it is the checkers, not this module, that judge whether anything
//! acknowledged was lost.
//!
//! A replica that refused, exited or waits is repaired the documented way:
//! stopped, its data directory moved aside, started again with the same
//! command line (it waits as a new member), then added by the leader with
//! `members add` (`Client::add_member(id, addr, true)`, retried until it
//! succeeds, for at most [`ADD_MEMBER_FOR`]), until the leader lists it as
//! a voter with its new incarnation and it has caught up. A repair needs
//! both other replicas: the nemesis never runs another fault meanwhile.
//!
//! A replica that ran on after a flipped byte is *suspect*: if it exits
//! later with code 8 (the damage found), that is not an error of the run;
//! it is recorded (`late-exit`) and repaired before the next fault.
//!
//! Two outcomes fail the run (an `UNEXPECTED` detail, and the run stops):
//! a disk-faulted replica that *panics* (damaged bytes must be refused with
//! a reason, never crash the replica), and one that serves on a log shorter
//! than it had made durable before the fault. For the second the harness
//! takes, before damaging the directory, the last index the replica
//! reported applied (it applies only entries on its own disk) and the log
//! index its acknowledgement mark records (`acknowledged.mark`, read by the
//! harness itself: the format is documented in latchkey-storage's
//! `ack_mark`; an unreadable mark just leaves the applied index), and
//! compares the higher with the log end the replica first reports after the
//! restart (polled every 20 ms, before the leader can refill it; a refill
//! first would hide a loss, never invent one).

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use latchkey::{Client, ClientOptions, Error as ClientError, NodeStatus};

use crate::clock::now_ns;
use crate::cluster::{shorten, Cluster, LateExit};
use crate::error::{Error, Result};
use crate::nemesis::{DiskFault, FaultWindow, DELETE_RUNNING_EXIT};

/// How long a restarted replica is watched before the harness decides it
/// runs normally: it must keep serving this long.
const SERVING_FOR: Duration = Duration::from_secs(3);
/// Longest wait for a restarted replica to exit, wait or serve.
const OBSERVE_FOR: Duration = Duration::from_secs(20);
/// Longest wait for a repaired replica to answer as `Waiting`.
const WAITING_WITHIN: Duration = Duration::from_secs(30);
/// How long `members add` is retried (on unavailable leaders, elections,
/// a new member still catching up).
pub const ADD_MEMBER_FOR: Duration = Duration::from_secs(180);
/// Longest wait, after `members add` succeeded, for the leader to list the
/// new incarnation as a voter and for the replica to catch up.
const CAUGHT_UP_WITHIN: Duration = Duration::from_secs(60);
/// A newest WAL shorter than this holds too little to lose: the largest
/// one is cut instead.
const TINY_WAL: u64 = 4096;

/// What a disk fault and its repair work with.
pub struct Ctx<'a> {
    pub cluster: &'a mut Cluster,
    /// Checks that nothing died that should not have (the other replicas,
    /// the workers); an error stops the run.
    pub alive: &'a mut dyn FnMut(&mut Cluster) -> Result<()>,
    /// The fault windows of the report.
    pub windows: &'a mut Vec<FaultWindow>,
    /// The start of the run (CLOCK_MONOTONIC, ns), for times in details.
    pub run_start: u64,
}

impl Ctx<'_> {
    fn check(&mut self) -> Result<()> {
        (self.alive)(self.cluster)
    }

    /// Waits `d`, checking every 100 ms.
    async fn sleep(&mut self, d: Duration) -> Result<()> {
        let end = Instant::now() + d;
        loop {
            self.check()?;
            let now = Instant::now();
            if now >= end {
                return Ok(());
            }
            tokio::time::sleep((end - now).min(Duration::from_millis(100))).await;
        }
    }

    fn at(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.run_start) as f64 / 1e9
    }

    /// Records a window; says what happened (a repair says it itself).
    fn window(&mut self, kind: &str, i: usize, start_ns: u64, detail: String) {
        if kind != "repair" {
            eprintln!("nemesis: {kind} {}: {detail}", node(i));
        }
        self.windows.push(FaultWindow {
            kind: kind.to_owned(),
            target: node(i),
            start_ns,
            end_ns: now_ns(),
            detail: Some(detail),
        });
    }
}

fn node(i: usize) -> String {
    format!("n{}", i + 1)
}

/// How a process ended, in words.
pub fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("with code {code}"),
        (None, Some(sig)) => format!("on signal {sig}"),
        _ => format!("({status})"),
    }
}

/// What a restarted replica did with its damaged data directory.
#[derive(Debug)]
enum Observed {
    /// It exited (refused to start, or failed soon after).
    Exited {
        status: ExitStatus,
        after: Duration,
        message: Option<String>,
    },
    /// It waits to be added to the cluster as a new data directory.
    Waiting {
        after: Duration,
        detail: Option<String>,
    },
    /// It serves (leader, follower, candidate or learner) and kept doing so;
    /// `first_log` is the last log index of its first status answer.
    Running { state: String, first_log: u64 },
    /// Neither an answer nor an exit within [`OBSERVE_FOR`].
    Silent,
}

impl Observed {
    fn needs_repair(&self) -> bool {
        !matches!(self, Observed::Running { .. })
    }

    fn text(&self) -> String {
        match self {
            Observed::Exited {
                status,
                after,
                message,
            } => format!(
                "it exited {} after {:.1} s: {}",
                describe(*status),
                after.as_secs_f64(),
                message.as_deref().unwrap_or("(no message)")
            ),
            Observed::Waiting { after, detail } => format!(
                "it stayed up in state Waiting (after {:.1} s): {}",
                after.as_secs_f64(),
                detail.as_deref().unwrap_or("(no detail)")
            ),
            Observed::Running { state, first_log } => format!(
                "it started and ran normally ({state} for {} s; its log ended at {first_log} \
                 when it first answered)",
                SERVING_FOR.as_secs()
            ),
            Observed::Silent => format!(
                "it neither answered nor exited within {} s",
                OBSERVE_FOR.as_secs()
            ),
        }
    }
}

/// Carries out disk fault `what` on replica `i`, restarting it after
/// `down`, then repairs it if it needs it. Records a window for the fault
/// (until its outcome was seen) and one for the repair.
/// `pick` chooses the flipped byte of a flip-sst (drawn from the run's
/// seed, so that a second flip of the same file does not undo the first).
///
/// A replica that started on a flipped SST keeps running, so that the run
/// sees whether it finds the damage when it reads the block. But before a
/// disk fault strikes another replica, the damaged one is repaired first,
/// as an operator would: two damaged disks out of three are a double
/// fault, and a three-replica cluster promises nothing under one (the
/// damaged replica may fail while the other's repair needs its vote).
pub async fn carry_out(
    ctx: &mut Ctx<'_>,
    i: usize,
    what: DiskFault,
    down: Duration,
    pick: u64,
) -> Result<()> {
    for j in (0..3).filter(|&j| j != i) {
        if ctx.cluster.suspect(j).is_some() && ctx.cluster.running(j) {
            repair(
                ctx,
                j,
                "a damaged disk, before a disk fault on another replica",
            )
            .await?;
        }
    }
    ctx.cluster.set_exempt(i, true);
    let result = damage_and_watch(ctx, i, what, down, pick).await;
    ctx.cluster.set_exempt(i, false);
    let why = result?;
    match why {
        Some(why) => repair(ctx, i, &why).await,
        None => Ok(()),
    }
}

/// The fault itself: `Some(why)` when the replica must be repaired.
async fn damage_and_watch(
    ctx: &mut Ctx<'_>,
    i: usize,
    what: DiskFault,
    down: Duration,
    pick: u64,
) -> Result<Option<String>> {
    let start_ns = now_ns();
    let dir = ctx.cluster.data_dir(i).to_path_buf();
    let name = what.name();
    if what == DiskFault::DeleteRunning {
        return delete_running(ctx, i, start_ns).await;
    }
    // What the replica had made durable, hence acknowledged: at least what
    // it had applied (it applies only entries on its disk), and what its
    // mark says. Not needed for a wipe.
    let applied = ctx
        .cluster
        .status_client()
        .status_of(ctx.cluster.addr(i))
        .await
        .ok()
        .map(|s| s.last_applied);
    ctx.cluster.kill(i);
    let mark = read_mark(&dir);
    let acked = Acked { applied, mark };
    let damage = match what {
        DiskFault::DeleteRunning | DiskFault::Wipe => {
            ctx.cluster.remove_data(i)?;
            "deleted the data directory".to_owned()
        }
        DiskFault::TruncateWal => truncate_wal(&dir)?,
        DiskFault::FlipSst => match flip_sst(&dir, pick)? {
            Some(done) => done,
            None => format!(
                "no .sst file: fell back to truncate-wal: {}",
                truncate_wal(&dir)?
            ),
        },
    };
    ctx.cluster
        .log_note(i, &format!("{name} after kill -9: {damage}"));
    ctx.sleep(down).await?;
    ctx.cluster.restart(i)?;
    let seen = observe(ctx, i).await?;
    let mut detail = format!("{damage}; restarted: {}", seen.text());
    if what != DiskFault::Wipe {
        detail.push_str(&format!(" ({})", acked.text()));
    }
    let mut surprise = panicked(ctx, i);
    if let (Observed::Running { first_log, .. }, Some(bound), false) =
        (&seen, acked.bound(), what == DiskFault::Wipe)
    {
        if *first_log < bound {
            surprise = Some(format!(
                "it served on a log ending at index {first_log} although it had made index \
                 {bound} durable before the fault ({}): it lost acknowledged state and rejoined",
                acked.text()
            ));
        }
    }
    if let Some(surprise) = surprise {
        detail.push_str(&format!("; UNEXPECTED: {surprise}"));
        ctx.window(name, i, start_ns, detail);
        return Err(Error::Cluster(format!(
            "n{} after {name}: {surprise}",
            i + 1
        )));
    }
    ctx.window(name, i, start_ns, detail);
    if seen.needs_repair() {
        return Ok(Some(name.to_owned()));
    }
    if what == DiskFault::FlipSst {
        let why = format!(
            "{name} at {:.1} s ({damage}), on which it started",
            ctx.at(start_ns)
        );
        ctx.cluster.set_suspect(i, Some(why));
    }
    Ok(None)
}

/// Deletes the data directory under running replica `i`, which must exit
/// within [`DELETE_RUNNING_EXIT`]; a zombie fails the run.
async fn delete_running(ctx: &mut Ctx<'_>, i: usize, start_ns: u64) -> Result<Option<String>> {
    let name = DiskFault::DeleteRunning.name();
    if !ctx.cluster.running(i) {
        ctx.window(
            name,
            i,
            start_ns,
            "the replica was not running: nothing done".into(),
        );
        return Ok(None);
    }
    ctx.cluster
        .log_note(i, "deleting the data directory under the running replica");
    ctx.cluster.remove_data(i)?;
    let deleted = Instant::now();
    let status = loop {
        if let Some(status) = ctx.cluster.try_exit(i) {
            break Some(status);
        }
        if deleted.elapsed() > DELETE_RUNNING_EXIT {
            break None;
        }
        ctx.check()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let Some(status) = status else {
        ctx.cluster.kill(i);
        let detail = format!(
            "ZOMBIE REPLICA: still running {} s after its data directory was deleted under it; \
             killed",
            DELETE_RUNNING_EXIT.as_secs()
        );
        ctx.window(name, i, start_ns, detail);
        return Err(Error::Cluster(format!(
            "zombie replica: n{} kept running for {DELETE_RUNNING_EXIT:?} after its data \
             directory {} was deleted under it (it must fail and exit)",
            i + 1,
            ctx.cluster.data_dir(i).display()
        )));
    };
    let mut detail = format!(
        "deleted the data directory under the running replica; it exited {} after {:.1} s: {}",
        describe(status),
        deleted.elapsed().as_secs_f64(),
        ctx.cluster
            .exit_message(i)
            .unwrap_or_else(|| "(no message)".into())
    );
    if let Some(surprise) = panicked(ctx, i) {
        detail.push_str(&format!("; UNEXPECTED: {surprise}"));
        ctx.window(name, i, start_ns, detail);
        return Err(Error::Cluster(format!(
            "n{} after {name}: {surprise}",
            i + 1
        )));
    }
    ctx.window(name, i, start_ns, detail);
    Ok(Some(name.to_owned()))
}

/// Watches a just restarted replica until it exits, waits or has served
/// for [`SERVING_FOR`].
async fn observe(ctx: &mut Ctx<'_>, i: usize) -> Result<Observed> {
    let started = Instant::now();
    let status = ctx.cluster.status_client();
    let addr = ctx.cluster.addr(i).to_owned();
    let mut serving_since: Option<Instant> = None;
    let mut first_log: Option<u64> = None;
    loop {
        if let Some(exit) = ctx.cluster.try_exit(i) {
            return Ok(Observed::Exited {
                status: exit,
                after: started.elapsed(),
                message: ctx.cluster.exit_message(i),
            });
        }
        if started.elapsed() > OBSERVE_FOR {
            return Ok(Observed::Silent);
        }
        ctx.check()?;
        if let Ok(s) = status.status_of(&addr).await {
            let first = *first_log.get_or_insert(s.last_log_index);
            match s.state.as_str() {
                "Waiting" => {
                    return Ok(Observed::Waiting {
                        after: started.elapsed(),
                        detail: s.detail,
                    })
                }
                "Leader" | "Follower" | "Candidate" | "Learner" => {
                    let since = *serving_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= SERVING_FOR {
                        return Ok(Observed::Running {
                            state: s.state,
                            first_log: first,
                        });
                    }
                }
                // Failed (about to exit), Shutdown: keep watching.
                _ => serving_since = None,
            }
        }
        // Fast until the first answer: it must show the log as recovered.
        let pause = if first_log.is_none() { 20 } else { 100 };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Why a disk-faulted replica's last process surprised: it panicked.
fn panicked(ctx: &Ctx<'_>, i: usize) -> Option<String> {
    ctx.cluster.panic_message(i).map(|p| {
        format!("the replica panicked instead of refusing its damaged data directory: {p}")
    })
}

/// Repairs the late exits of replicas whose disk was damaged earlier.
pub async fn repair_late_exits(ctx: &mut Ctx<'_>) -> Result<()> {
    let exits: Vec<LateExit> = ctx.cluster.take_late_exits();
    for exit in exits {
        let i = exit.index;
        let mut detail = format!(
            "exited {} at {:.1} s: {}; its disk was damaged earlier: {}",
            describe(exit.status),
            ctx.at(exit.time_ns),
            ctx.cluster
                .exit_message(i)
                .unwrap_or_else(|| "(no message)".into()),
            exit.cause
        );
        let surprise = panicked(ctx, i);
        if let Some(surprise) = &surprise {
            detail.push_str(&format!("; UNEXPECTED: {surprise}"));
        }
        ctx.windows.push(FaultWindow {
            kind: "late-exit".into(),
            target: node(i),
            start_ns: exit.time_ns,
            end_ns: exit.time_ns,
            detail: Some(detail.clone()),
        });
        if let Some(surprise) = surprise {
            return Err(Error::Cluster(format!(
                "n{} on a damaged disk: {surprise}",
                i + 1
            )));
        }
        eprintln!("nemesis: n{} {detail}; repairing it", i + 1);
        repair(ctx, i, "late-exit").await?;
    }
    Ok(())
}

/// The incarnation of replica `i` in the membership the other replicas
/// report (the first that answers).
async fn known_incarnation(cluster: &Cluster, i: usize) -> Option<u64> {
    let id = cluster.id(i);
    let status = cluster.status_client();
    for addr in cluster
        .endpoints()
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .map(|(_, a)| a)
    {
        if let Ok(s) = status.status_of(addr).await {
            if let Some(m) = s.members.iter().find(|m| m.id == id) {
                return Some(m.incarnation);
            }
        }
    }
    None
}

/// The incarnation and voter flag of node `id` in the membership the
/// leader reports, with the leader's last applied index.
async fn leader_view(cluster: &Cluster, id: u64) -> Option<(Option<(u64, bool)>, u64)> {
    let (l, _) = cluster.leader().await?;
    let s: NodeStatus = cluster
        .status_client()
        .status_of(cluster.addr(l))
        .await
        .ok()?;
    if s.state != "Leader" {
        return None;
    }
    let member = s
        .members
        .iter()
        .find(|m| m.id == id)
        .map(|m| (m.incarnation, m.voter));
    Some((member, s.last_applied))
}

/// The documented repair of replica `i`: stop it, move its data directory
/// aside, start it again (it waits as a new member), `members add` it,
/// wait until the leader lists its new incarnation as a voter and it has
/// caught up. Records a `repair` window (`after` names the fault that made
/// it necessary); an error stops the run.
pub async fn repair(ctx: &mut Ctx<'_>, i: usize, after: &str) -> Result<()> {
    let start_ns = now_ns();
    let started = Instant::now();
    eprintln!(
        "nemesis: [{:>6.1}s] repair n{}: new data directory, members add",
        ctx.at(start_ns),
        i + 1
    );
    let mut steps: Vec<String> = Vec::new();
    let outcome = repair_steps(ctx, i, &mut steps).await;
    let total = started.elapsed().as_secs_f64();
    match outcome {
        Ok(()) => {
            let detail = format!("after {after}, ok in {total:.1} s: {}", steps.join("; "));
            eprintln!("nemesis: repair n{}: {detail}", i + 1);
            ctx.window("repair", i, start_ns, detail);
            Ok(())
        }
        Err(e) => {
            let detail = format!(
                "after {after}, FAILED in {total:.1} s: {e}; done so far: {}",
                steps.join("; ")
            );
            ctx.window("repair", i, start_ns, detail);
            Err(Error::Cluster(format!("repair of n{} failed: {e}", i + 1)))
        }
    }
}

async fn repair_steps(ctx: &mut Ctx<'_>, i: usize, steps: &mut Vec<String>) -> Result<()> {
    let id = ctx.cluster.id(i);
    let addr = ctx.cluster.addr(i).to_owned();
    let peer_addr = ctx.cluster.peer_addr(i).to_owned();
    let old = known_incarnation(ctx.cluster, i).await;
    ctx.cluster.set_suspect(i, None);
    ctx.cluster.kill(i);
    match ctx.cluster.discard_data(i)? {
        Some(to) => steps.push(format!(
            "moved the data directory aside to {}",
            to.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        )),
        None => steps.push("no data directory left to move aside".into()),
    }
    ctx.cluster.log_note(
        i,
        "repair: data directory moved aside; starting on a new one",
    );
    ctx.cluster.restart(i)?;

    // 1. It comes up as a new data directory, waiting to be added.
    let status = ctx.cluster.status_client();
    let t = Instant::now();
    let incarnation = loop {
        if let Some(exit) = ctx.cluster.try_exit(i) {
            return Err(Error::Cluster(format!(
                "n{} exited {} instead of waiting to be added: {}",
                i + 1,
                describe(exit),
                ctx.cluster
                    .exit_message(i)
                    .unwrap_or_else(|| "(no message)".into())
            )));
        }
        ctx.check()?;
        if let Ok(s) = status.status_of(&addr).await {
            if s.state == "Waiting" {
                break s.incarnation;
            }
        }
        if t.elapsed() > WAITING_WITHIN {
            return Err(Error::Cluster(format!(
                "n{} on a new data directory did not report state Waiting within {WAITING_WITHIN:?}",
                i + 1
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    steps.push(format!(
        "Waiting after {:.1} s, incarnation {} -> {incarnation}",
        t.elapsed().as_secs_f64(),
        old.map_or("unknown".to_owned(), |inc| inc.to_string())
    ));

    // 2. members add, retried until it succeeds.
    let options = ctx.cluster.client_options(
        ClientOptions::default().with_cluster_secret(crate::cluster::CLUSTER_SECRET),
    )?;
    let client = Client::with_options(ctx.cluster.endpoints(), options)
        .map_err(|e| Error::Cluster(format!("cannot build an admin client: {e}")))?;
    let t = Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let call = client.add_member(id, &peer_addr, true);
        tokio::pin!(call);
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                _ = tokio::time::sleep(Duration::from_millis(100)) => {
                    if let Some(exit) = ctx.cluster.try_exit(i) {
                        return Err(Error::Cluster(format!(
                            "n{} exited {} while being added: {}",
                            i + 1,
                            describe(exit),
                            ctx.cluster.exit_message(i).unwrap_or_else(|| "(no message)".into())
                        )));
                    }
                    ctx.check()?;
                }
            }
        };
        match result {
            Ok(()) => break,
            Err(e @ (ClientError::InvalidArgument(_) | ClientError::BadEndpoint { .. })) => {
                return Err(Error::Cluster(format!(
                    "members add {id} {addr} refused: {e}"
                )))
            }
            Err(e) if t.elapsed() < ADD_MEMBER_FOR => {
                eprintln!(
                    "nemesis: repair n{}: members add attempt {attempts} failed ({}); retrying",
                    i + 1,
                    shorten(&e.to_string(), 200)
                );
                ctx.sleep(Duration::from_secs(1)).await?;
            }
            Err(e) => {
                return Err(Error::Cluster(format!(
                    "members add {id} {addr} did not succeed in {ADD_MEMBER_FOR:?} \
                     ({attempts} attempts); last error: {e}"
                )))
            }
        }
    }
    steps.push(format!(
        "members add ok after {attempts} attempt(s) in {:.1} s",
        t.elapsed().as_secs_f64()
    ));

    // 3. The leader lists it as a voter with the new incarnation, and it
    // has applied what the leader had applied by then.
    let t = Instant::now();
    let mut target: Option<u64> = None;
    loop {
        if let Some(exit) = ctx.cluster.try_exit(i) {
            return Err(Error::Cluster(format!(
                "n{} exited {} after it was added: {}",
                i + 1,
                describe(exit),
                ctx.cluster
                    .exit_message(i)
                    .unwrap_or_else(|| "(no message)".into())
            )));
        }
        ctx.check()?;
        if target.is_none() {
            if let Some((Some((inc, true)), applied)) = leader_view(ctx.cluster, id).await {
                if inc == incarnation {
                    target = Some(applied);
                }
            }
        }
        if let Some(want) = target {
            if let Ok(s) = status.status_of(&addr).await {
                if s.incarnation == incarnation
                    && matches!(s.state.as_str(), "Follower" | "Leader")
                    && s.last_applied >= want
                {
                    steps.push(format!(
                        "voter with incarnation {incarnation}, {} and caught up (applied {} >= \
                         {want}) {:.1} s later",
                        s.state,
                        s.last_applied,
                        t.elapsed().as_secs_f64()
                    ));
                    return Ok(());
                }
            }
        }
        if t.elapsed() > CAUGHT_UP_WITHIN {
            return Err(Error::Cluster(format!(
                "n{} was added but {} within {CAUGHT_UP_WITHIN:?}",
                i + 1,
                if target.is_none() {
                    format!("the leader does not list incarnation {incarnation} as a voter")
                } else {
                    "it did not catch up".to_owned()
                }
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What a replica had acknowledged before a disk fault, as the harness saw
/// it: the last index it reported applied, and its mark.
#[derive(Debug)]
struct Acked {
    applied: Option<u64>,
    mark: Option<MarkSeen>,
}

impl Acked {
    /// The highest index it had certainly made durable.
    fn bound(&self) -> Option<u64> {
        self.applied.max(self.mark.as_ref().map(|m| m.log_index))
    }

    fn text(&self) -> String {
        format!(
            "before the fault it had applied {}; its acknowledgement mark said {}",
            self.applied
                .map_or("(no answer)".to_owned(), |a| a.to_string()),
            self.mark
                .as_ref()
                .map_or("(unreadable)".to_owned(), |m| m.log_index.to_string())
        )
    }
}

/// What a replica's acknowledgement mark says it acknowledged.
pub type MarkSeen = latchkey_storage::MarkRecord;

/// Reads `dir/acknowledged.mark` as it is on disk (with latchkey-storage's
/// own reader: the valid slot with the highest sequence). `None` when there
/// is no mark or no valid slot.
pub fn read_mark(dir: &Path) -> Option<MarkSeen> {
    latchkey_storage::ack_mark::read(dir).ok().flatten()
}

/// The RocksDB files of `dir/db` ending in `.ext`, with their lengths, in
/// name order (RocksDB numbers files in creation order, zero-padded).
fn db_files(dir: &Path, ext: &str) -> Result<Vec<(PathBuf, u64)>> {
    let db = dir.join("db");
    let mut files = Vec::new();
    let entries = match std::fs::read_dir(&db) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(files),
        Err(e) => {
            return Err(Error::Io {
                context: format!("list {}", db.display()),
                source: e,
            })
        }
    };
    for entry in entries {
        let entry = entry.map_err(Error::io(format!("list {}", db.display())))?;
        let path = entry.path();
        if path.extension().is_some_and(|x| x == ext) {
            let len = entry
                .metadata()
                .map_err(Error::io(format!("stat {}", path.display())))?
                .len();
            files.push((path, len));
        }
    }
    files.sort_by(|a, b| a.0.file_name().cmp(&b.0.file_name()));
    Ok(files)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Cuts the newest write-ahead log of a stopped replica's `dir` to half its
/// length; when it is nearly empty (under 4 KiB), the largest one instead.
/// Says what it did.
pub fn truncate_wal(dir: &Path) -> Result<String> {
    let logs = db_files(dir, "log")?;
    let Some((newest, newest_len)) = logs.last().cloned() else {
        return Ok("no WAL file (db/*.log) to truncate: the data directory was left intact".into());
    };
    let (path, len, which) = if newest_len >= TINY_WAL {
        (newest, newest_len, "newest")
    } else {
        match logs.iter().max_by_key(|(_, len)| *len) {
            Some((p, l)) if *l > newest_len => {
                (p.clone(), *l, "largest (the newest is nearly empty)")
            }
            _ => (newest, newest_len, "newest"),
        }
    };
    if len == 0 {
        return Ok(format!(
            "every WAL file is empty ({} files): nothing truncated",
            logs.len()
        ));
    }
    let cut = len / 2;
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(Error::io(format!("open {}", path.display())))?;
    f.set_len(cut)
        .map_err(Error::io(format!("truncate {}", path.display())))?;
    f.sync_all()
        .map_err(Error::io(format!("sync {}", path.display())))?;
    Ok(format!(
        "truncated the {which} WAL db/{} from {len} to {cut} bytes ({} WAL files)",
        file_name(&path),
        logs.len()
    ))
}

/// Flips (inverts) a byte in the middle half of the largest table file of
/// a stopped replica's `dir` (which one: `pick`); `None` when there is no
/// non-empty `.sst`.
pub fn flip_sst(dir: &Path, pick: u64) -> Result<Option<String>> {
    let ssts = db_files(dir, "sst")?;
    let Some((path, len)) = ssts
        .iter()
        .filter(|(_, len)| *len > 0)
        .max_by_key(|(_, len)| *len)
        .cloned()
    else {
        return Ok(None);
    };
    let at = len / 4 + pick % (len / 2).max(1);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(Error::io(format!("open {}", path.display())))?;
    let mut byte = [0u8; 1];
    f.seek(SeekFrom::Start(at))
        .and_then(|_| f.read_exact(&mut byte))
        .map_err(Error::io(format!("read {}", path.display())))?;
    let flipped = [!byte[0]];
    f.seek(SeekFrom::Start(at))
        .and_then(|_| f.write_all(&flipped))
        .and_then(|_| f.sync_all())
        .map_err(Error::io(format!("write {}", path.display())))?;
    Ok(Some(format!(
        "flipped byte {at} of db/{} ({len} bytes, the largest of {} SST files) from {:#04x} to {:#04x}",
        file_name(&path),
        ssts.len(),
        byte[0],
        flipped[0]
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> Vec<u8> {
        std::fs::read(p).unwrap()
    }

    fn db(dir: &Path, files: &[(&str, usize)]) {
        std::fs::create_dir_all(dir.join("db")).unwrap();
        for (name, len) in files {
            let bytes: Vec<u8> = (0..*len).map(|i| (i % 251) as u8).collect();
            std::fs::write(dir.join("db").join(name), bytes).unwrap();
        }
    }

    #[test]
    fn truncates_the_newest_wal_or_the_largest_when_it_is_tiny() {
        let t = tempfile::tempdir().unwrap();
        db(
            t.path(),
            &[
                ("000007.log", 10_000),
                ("000009.log", 8_000),
                ("CURRENT", 16),
            ],
        );
        let said = truncate_wal(t.path()).unwrap();
        assert!(said.contains("000009.log from 8000 to 4000"), "{said}");
        assert_eq!(read(&t.path().join("db/000009.log")).len(), 4000);
        assert_eq!(read(&t.path().join("db/000007.log")).len(), 10_000);

        let t = tempfile::tempdir().unwrap();
        db(t.path(), &[("000007.log", 10_000), ("000009.log", 10)]);
        let said = truncate_wal(t.path()).unwrap();
        assert!(said.contains("largest"), "{said}");
        assert_eq!(read(&t.path().join("db/000007.log")).len(), 5000);

        let t = tempfile::tempdir().unwrap();
        db(t.path(), &[("000003.log", 0)]);
        assert!(truncate_wal(t.path())
            .unwrap()
            .contains("nothing truncated"));
        let t = tempfile::tempdir().unwrap();
        assert!(truncate_wal(t.path()).unwrap().contains("no WAL"));
    }

    #[test]
    fn flips_a_middle_byte_of_the_largest_sst() {
        let t = tempfile::tempdir().unwrap();
        db(t.path(), &[("000011.sst", 1000), ("000012.sst", 3000)]);
        let before = read(&t.path().join("db/000012.sst"));
        let said = flip_sst(t.path(), 1500 - 750).unwrap().unwrap();
        assert!(said.contains("byte 1500 of db/000012.sst"), "{said}");
        let after = read(&t.path().join("db/000012.sst"));
        assert_eq!(after.len(), before.len());
        let diff: Vec<usize> = (0..after.len())
            .filter(|&k| after[k] != before[k])
            .collect();
        assert_eq!(diff, vec![1500]);
        assert_eq!(after[1500], !before[1500]);

        let t = tempfile::tempdir().unwrap();
        db(t.path(), &[("000003.log", 100)]);
        assert_eq!(flip_sst(t.path(), 1).unwrap(), None);
        // Any pick lands in the middle half.
        let t = tempfile::tempdir().unwrap();
        db(t.path(), &[("000011.sst", 1000)]);
        for pick in [0, 1, 499, 500, 12345, u64::MAX] {
            let said = flip_sst(t.path(), pick).unwrap().unwrap();
            let at: u64 = said["flipped byte ".len()..]
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap();
            assert!((250..750).contains(&at), "{pick}: {said}");
        }
    }
}
