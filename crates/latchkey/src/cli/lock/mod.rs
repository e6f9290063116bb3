//! `latchkey lock NAME -- CMD`: hold a lock while a command runs; the same
//! for several locks taken at once (`lock A B C -- CMD`, a multi-lock), a
//! semaphore's permit (`sem`), and (`elect`) for leading an election.
//!
//! The command gets `LATCHKEY_LOCK`, `LATCHKEY_TOKEN`, `LATCHKEY_SEQUENCER`
//! (the first lock's), `LATCHKEY_LOCKS`, `LATCHKEY_TOKENS`,
//! `LATCHKEY_SEQUENCERS` (every lock's, space-separated, in the order
//! named; sequencers never contain a space, lock names may) and
//! `LATCHKEY_SESSION_SECRET` in its environment, so it can fence its own
//! writes (`latchkey put --fence "$LATCHKEY_SEQUENCER" ...`, which reads the
//! secret from the environment; only the holder's session may write fenced),
//! or pass the token to its storage. The secret gives the command the
//! session's whole authority (it could also release the lock or close the
//! session): run only commands you trust with the lock.
//!
//! The command never runs while the lock may be another's:
//! - If the session is lost while the command runs (cut off from the
//!   cluster past the TTL), the command's whole process group is killed at
//!   once and `latchkey` exits 206.
//! - The command runs under a guard process (`guard`) in its
//!   own process group, which `latchkey` keeps telling when the lease ends;
//!   if `latchkey` cannot (stopped by SIGSTOP, hung, starved), the guard
//!   kills the group when that time comes. If `latchkey` dies, the guard
//!   sees its pipe close and kills the group at once.
//! - Job control works as with a shell's job: when `latchkey` runs in the
//!   foreground of a terminal, the command's group gets the terminal (it
//!   can read it; Ctrl-C and Ctrl-Z reach it). When the command is stopped
//!   (Ctrl-Z, or reading the terminal from the background), `latchkey`
//!   stops too, so the shell takes over; a stop sent to `latchkey` itself
//!   (SIGTSTP) stops the command first. Once continued (`fg`, `bg`,
//!   SIGCONT), `latchkey` continues the command only if the lock is still
//!   held, else kills it and exits 206.
//! - SIGINT and SIGTERM sent to `latchkey` are passed on to the command
//!   (and, while waiting for the lock, give up the wait).
//! - When the session is at risk (keep-alives unacknowledged for a third
//!   of the TTL: the cluster is failing over or out of reach), the command
//!   gets `--at-risk-signal` (SIGTERM unless set; `none` sends nothing)
//!   once, about a quarter of the TTL before the hard kill at loss, so it
//!   can stop cleanly. The lock is still held then: a command that carries
//!   on keeps it if a keep-alive gets through.
//!
//! Exit codes: the command's own (128 + N if a signal N ended it); so that
//! they are not mistaken for latchkey's, latchkey's own failures here are
//! 200 + its usual code (205 not acquired, also when SIGINT or SIGTERM ends
//! the wait; 206 lock lost; 203 cluster unavailable, ...), a range
//! commands rarely use (one that does exit 200 to 209 itself is
//! ambiguous), and a command that cannot be started exits 127 if it was not
//! found, else 126 (as a shell does), after the lock is released. Argument
//! errors found before anything runs are clap's usual 2.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use latchkey::{Client, Error, Leadership, Session};
use tokio::process::Command;

use super::args::{Args, ElectArgs, LockArgs, SemArgs};
use super::connect::client;
use super::failure::Failure;
use held::Held;

pub mod elect;
pub mod guard;
mod held;

/// What to lock (or campaign for) and what to run.
pub(super) struct LockRequest {
    /// The lock's name (or the locks' of a multi-lock, in order), or the
    /// election's.
    names: Vec<String>,
    /// `Some`: campaign in election `name` with this value.
    campaign: Option<Vec<u8>>,
    /// `Some`: take a permit of semaphore `name` of this many permits.
    permits: Option<u32>,
    ttl: Duration,
    /// `None`: try once. `Some(None)`: wait as long as it takes.
    wait: Option<Option<Duration>>,
    shared: bool,
    lease: Option<Duration>,
    lock_delay: Option<Duration>,
    /// Sent to the command once when the session is at risk.
    at_risk_signal: Option<i32>,
    command: Vec<String>,
}

/// `sem NAME --permits N -- CMD`: as `lock -- CMD`, with a permit.
pub async fn run_semaphore(args: &Args, s: &SemArgs) -> Result<ExitCode, Failure> {
    let c = client(args).map_err(|f| Failure::AroundCommand(Box::new(f)))?;
    hold_while_running(c, LockRequest::semaphore(s))
        .await
        .map_err(|f| Failure::AroundCommand(Box::new(f)))
}

/// `lock NAME -- CMD`; latchkey's own failures, connecting included, are
/// reported around the command (200 + the usual code).
pub async fn run(args: &Args, l: &LockArgs) -> Result<ExitCode, Failure> {
    let c = client(args).map_err(|f| Failure::AroundCommand(Box::new(f)))?;
    hold_while_running(c, l.into())
        .await
        .map_err(|f| Failure::AroundCommand(Box::new(f)))
}

impl From<&LockArgs> for LockRequest {
    fn from(l: &LockArgs) -> Self {
        LockRequest {
            names: l.names.clone(),
            campaign: None,
            permits: None,
            ttl: l.hold.ttl,
            wait: l.hold.wait_plan(),
            shared: l.shared,
            lease: l.lease,
            lock_delay: l.lock_delay,
            at_risk_signal: l.hold.at_risk_signal.0,
            command: l.command.clone(),
        }
    }
}

impl LockRequest {
    /// A campaign in election `e.name` with `value`, running `e.command`.
    pub(super) fn campaign(e: &ElectArgs, value: &str) -> LockRequest {
        LockRequest {
            names: vec![e.name.clone()],
            campaign: Some(value.as_bytes().to_vec()),
            permits: None,
            ttl: e.hold.ttl,
            wait: e.hold.wait_plan(),
            shared: false,
            lease: None,
            lock_delay: e.lock_delay,
            at_risk_signal: e.hold.at_risk_signal.0,
            command: e.command.clone(),
        }
    }

    /// One permit of semaphore `s.name`, running `s.command`.
    fn semaphore(s: &SemArgs) -> LockRequest {
        LockRequest {
            names: vec![s.name.clone()],
            campaign: None,
            permits: Some(s.permits),
            ttl: s.hold.ttl,
            wait: s.hold.wait_plan(),
            shared: true,
            lease: None,
            lock_delay: None,
            at_risk_signal: s.hold.at_risk_signal.0,
            command: s.command.clone(),
        }
    }

    /// The name: the lock's, the election's or the semaphore's (a
    /// multi-lock's first).
    fn name(&self) -> &str {
        self.names.first().map_or("", String::as_str)
    }

    /// "lock NAME", "locks A, B", "election NAME" or "semaphore NAME", for
    /// messages.
    fn what(&self) -> String {
        match (&self.campaign, self.permits) {
            (Some(_), _) => format!("election {:?}", self.name()),
            (None, Some(_)) => format!("semaphore {:?}", self.name()),
            (None, None) if self.names.len() > 1 => format!("locks {:?}", self.names),
            (None, None) => format!("lock {:?}", self.name()),
        }
    }

    /// Acquire the lock (every lock at once, for several), or campaign;
    /// `None` if not granted (busy, or the wait ran out).
    async fn acquire(&self, session: &Session) -> Result<Option<Held>, Error> {
        if self.names.len() > 1 {
            return self.acquire_all(session).await;
        }
        let one = self.acquire_one(session).await?;
        Ok(one.map(Held::One))
    }

    /// Every lock of a multi-lock at once.
    async fn acquire_all(&self, session: &Session) -> Result<Option<Held>, Error> {
        let mut all = session.lock_all(self.names.iter().cloned());
        if self.shared {
            all = all.shared();
        }
        if let Some(l) = self.lease {
            all = all.lease(l);
        }
        if let Some(d) = self.lock_delay {
            all = all.lock_delay(d);
        }
        let held = match self.wait {
            None => all.try_acquire().await?,
            Some(None) => Some(all.acquire().await?),
            Some(Some(w)) => all.acquire_timeout(w).await?,
        };
        Ok(held.map(Held::All))
    }

    /// One lock or permit, or a campaign.
    async fn acquire_one(&self, session: &Session) -> Result<Option<latchkey::LockGuard>, Error> {
        let name = self.name().to_string();
        if let Some(value) = &self.campaign {
            let mut election = session.election(name);
            if let Some(d) = self.lock_delay {
                election = election.lock_delay(d);
            }
            let won = match self.wait {
                None => election.try_campaign(value).await?,
                Some(None) => Some(election.campaign(value).await?),
                Some(Some(w)) => election.campaign_timeout(value, w).await?,
            };
            return Ok(won.map(Leadership::into_guard));
        }
        if let Some(permits) = self.permits {
            let semaphore = session.semaphore(name, permits);
            return match self.wait {
                None => semaphore.try_acquire().await,
                Some(None) => semaphore.acquire().await.map(Some),
                Some(Some(w)) => semaphore.acquire_timeout(w).await,
            };
        }
        let mut lock = session.lock(name);
        if self.shared {
            lock = lock.shared();
        }
        if let Some(l) = self.lease {
            lock = lock.lease(l);
        }
        if let Some(d) = self.lock_delay {
            lock = lock.lock_delay(d);
        }
        match self.wait {
            None => lock.try_acquire().await,
            Some(None) => lock.acquire().await.map(Some),
            Some(Some(w)) => lock.acquire_timeout(w).await,
        }
    }

    /// The failure for "not granted".
    pub(super) fn not_acquired(&self) -> Failure {
        Failure::NotAcquired(match (self.wait, &self.campaign, self.permits) {
            (None, Some(_), _) => format!("{} has another leader", self.what()),
            (None, None, Some(_)) => format!("{}: no permit is free", self.what()),
            (None, None, None) if self.names.len() > 1 => {
                format!("{}: not all free", self.what())
            }
            (None, None, None) => format!("{} is busy", self.what()),
            (Some(_), Some(_), _) => format!("{}: not leading in time", self.what()),
            (Some(_), None, _) => format!("{} was not acquired", self.what()),
        })
    }
}

/// Acquire (or campaign), run, release; the exit code is the command's.
pub(super) async fn hold_while_running(
    client: Client,
    req: LockRequest,
) -> Result<ExitCode, Failure> {
    let Some((program, args)) = req.command.split_first() else {
        return Err(Failure::Usage("no command given after --".into()));
    };
    use tokio::signal::unix::{signal, SignalKind};
    // Watch the signals before waiting for the lock: a Ctrl-C while queued
    // closes the session (withdrawing the wait) instead of leaving it queued.
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;

    let session = client.session(req.ttl).await?;
    let guard = tokio::select! {
        g = req.acquire(&session) => g?,
        _ = term.recv() => None,
        _ = int.recv() => None,
    };
    let Some(guard) = guard.filter(|g| g.is_held()) else {
        let _ = session.close().await;
        return Err(req.not_acquired());
    };
    tracing::debug!(first_token = %guard.token(), "lock acquired");
    let mut tstp = signal(SignalKind::from_raw(libc::SIGTSTP))
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let watch = Watcher::start(program, args, &guard);
    let (mut watcher, mut child) = match watch {
        Ok(w) => w,
        Err(e) => {
            // Nothing ran: give the lock back at once rather than leave it
            // held until the session's TTL ends.
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "release after a failed start");
            }
            let _ = session.close().await;
            return Err(Failure::CannotRun {
                not_found: false,
                message: format!("cannot start the watcher of {program:?}: {e}"),
            });
        }
    };
    let mut tick = tokio::time::interval(FEED_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut warned = req.at_risk_signal.is_none();

    let status = loop {
        tokio::select! {
            biased;
            _ = guard.lost() => {
                watcher.kill();
                let _ = child.wait().await;
                return Err(lost(&req.what(), &guard, program));
            }
            status = child.wait() => break status,
            // Sent to the group: if it comes before the guard has started
            // the command (at risk already when granted), only the guard
            // gets it and the warning is lost; the hard kill still holds.
            _ = guard.at_risk(), if !warned => {
                warned = true;
                if let (Some(signal), true) = (req.at_risk_signal, guard.is_held()) {
                    eprintln!(
                        "latchkey: {}: the session is at risk (keep-alives unacknowledged); \
                         sent signal {signal} to the command, which is killed if the lease runs \
                         out ({:?} from now)",
                        req.what(),
                        guard.remaining(),
                    );
                    watcher.signal(signal);
                }
            }
            _ = term.recv() => watcher.signal(libc::SIGTERM),
            _ = int.recv() => watcher.signal(libc::SIGINT),
            _ = tstp.recv() => {
                // Stopped (Ctrl-Z without the terminal, `kill -TSTP`): stop
                // the command first, then this process.
                watcher.signal(libc::SIGSTOP);
                if !watcher.suspend(&guard) {
                    let _ = child.wait().await;
                    return Err(lost(&req.what(), &guard, program));
                }
            }
            _ = tick.tick() => {
                watcher.feed(&guard);
                if watcher.stopped() {
                    // The command was stopped (Ctrl-Z on its terminal, or it
                    // read the terminal from the background): stop with it,
                    // as a shell's job would, so the shell takes over.
                    if !watcher.suspend(&guard) {
                        let _ = child.wait().await;
                        return Err(lost(&req.what(), &guard, program));
                    }
                }
            }
        }
    };
    let status = status.map_err(|e| Failure::Other(format!("waiting for {program:?}: {e}")))?;
    watcher.finish();
    if !guard.is_held() {
        // The command finished, but maybe only after the lock was lost
        // (this process was paused): its work may have overlapped another
        // holder's.
        return Err(lost(&req.what(), &guard, program));
    }
    if let Err(e) = guard.release().await {
        tracing::warn!(error = %e, "release after the command failed");
    }
    let _ = session.close().await;
    Ok(guard::exit_code_of(status))
}

/// How often the guard is sent the lease's end, and the command checked
/// for a stop.
const FEED_EVERY: Duration = Duration::from_millis(100);

/// The guard process (`guard`) running the command in its own
/// process group, the pipe that feeds it deadlines, and whether the
/// terminal was handed to it.
struct Watcher {
    pgid: Option<i32>,
    /// The write end of the deadline pipe (non-blocking).
    feed: std::fs::File,
    /// The terminal (stdin) is the command group's while it runs.
    terminal: bool,
}

impl Watcher {
    /// Start the guard with the first deadline already in its pipe.
    fn start(
        program: &str,
        args: &[String],
        guard: &Held,
    ) -> std::io::Result<(Watcher, tokio::process::Child)> {
        use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills the two descriptors we pass.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created for us.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let mut feed = std::fs::File::from(write);
        let first = deadline(guard);
        std::io::Write::write_all(&mut feed, &first.to_be_bytes())?;
        // SAFETY: fcntl(2) on our own descriptor.
        unsafe {
            let flags = libc::fcntl(feed.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(feed.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        let read_fd = read.as_raw_fd();
        // This very binary (still there if the file was replaced since).
        let exe = std::path::PathBuf::from("/proc/self/exe");
        let foreground = in_foreground();
        let mut command = Command::new(exe);
        command
            .arg("__lock-guard")
            .arg("--fd")
            .arg(read_fd.to_string())
            .arg("--")
            .arg(program)
            .args(args)
            .envs(guard.environment())
            .stdin(Stdio::inherit())
            // Its own process group, so losing the lock stops the whole
            // command (a shell's children too), not just its first process.
            .process_group(0);
        // SAFETY: between fork and exec only async-signal-safe calls: the
        // pipe's read end is kept open across exec; in the foreground, the
        // new group takes the terminal before the command can read it (as a
        // shell does; SIGTTOU ignored meanwhile), and SIGTTOU is restored.
        unsafe {
            command.pre_exec(move || {
                if libc::fcntl(read_fd, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::signal(libc::SIGTTOU, libc::SIG_IGN);
                if foreground {
                    libc::setpgid(0, 0);
                    libc::tcsetpgrp(0, libc::getpid());
                }
                libc::signal(libc::SIGTTOU, libc::SIG_DFL);
                // Until the guard's own handlers are in place (it sets
                // them first thing; the command gets the defaults back at
                // its exec), a signal sent to the group must not kill it.
                for sig in guard::SURVIVED {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let child = command.spawn()?;
        drop(read);
        let pgid = child.id().and_then(|p| i32::try_from(p).ok());
        let mut watcher = Watcher {
            pgid,
            feed,
            terminal: false,
        };
        watcher.take_terminal(foreground);
        Ok((watcher, child))
    }

    /// Send the guard the lock's current end.
    fn feed(&mut self, guard: &Held) {
        let bytes = deadline(guard).to_be_bytes();
        // Non-blocking: if the guard is stopped and its pipe full (after
        // minutes), this deadline is dropped; when continued, it reads
        // those waiting and the next ones, and the newest wins.
        let _ = std::io::Write::write_all(&mut self.feed, &bytes);
    }

    /// Whether the guard (and so the command's group) is stopped.
    fn stopped(&self) -> bool {
        let Some(pid) = self.pgid else { return false };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| {
                let after = stat.rfind(')')?;
                stat[after + 1..]
                    .split_whitespace()
                    .next()
                    .map(|s| s == "T")
            })
            .unwrap_or(false)
    }

    /// Send `signal` to the command's process group.
    fn signal(&self, signal: i32) {
        if let Some(pgid) = self.pgid {
            // SAFETY: kill(2) on the process group we created for the command.
            unsafe {
                libc::kill(-pgid, signal);
            }
        }
    }

    fn kill(&mut self) {
        self.give_back_terminal();
        self.signal(libc::SIGKILL);
    }

    /// The command runs no more: anything it left in its group goes, and
    /// the terminal comes back.
    fn finish(&mut self) {
        self.kill();
    }

    /// With the command stopped: stop this process too (the shell sees the
    /// job stop); once continued, go on only if the lock is still held,
    /// else kill the command (`false`). The command is continued only after
    /// that check.
    fn suspend(&mut self, guard: &Held) -> bool {
        // All of the group, whatever stopped part of it: a command that
        // ignores SIGTSTP must not run on while nobody watches.
        self.signal(libc::SIGSTOP);
        self.give_back_terminal();
        // SAFETY: raise(3) stops this process until a SIGCONT.
        unsafe {
            libc::raise(libc::SIGSTOP);
        }
        if !guard.is_held() {
            self.kill();
            return false;
        }
        self.feed(guard);
        self.take_terminal(in_foreground());
        self.signal(libc::SIGCONT);
        true
    }

    /// If this process owns the terminal on its stdin (it runs in the
    /// foreground), hand it to the command's group, so the command can read
    /// it and Ctrl-Z stops the command.
    fn take_terminal(&mut self, foreground: bool) {
        let Some(pgid) = self.pgid else { return };
        if !foreground {
            return;
        }
        // SAFETY: tcsetpgrp/signal on stdin and this process; SIGTTOU is
        // ignored while the terminal changes hands (the command's group may
        // hold it already: the guard took it before its exec).
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            self.terminal = libc::tcsetpgrp(0, pgid) == 0;
            libc::signal(libc::SIGTTOU, old);
        }
    }

    /// Take the terminal back from the command's group, if it was given.
    fn give_back_terminal(&mut self) {
        if !self.terminal {
            return;
        }
        // SAFETY: as in take_terminal.
        unsafe {
            let old = libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::tcsetpgrp(0, libc::getpgrp());
            libc::signal(libc::SIGTTOU, old);
        }
        self.terminal = false;
    }
}

/// Whether this process runs in the foreground of the terminal on its
/// stdin.
fn in_foreground() -> bool {
    // SAFETY: isatty/tcgetpgrp/getpgrp only read.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

impl Drop for Watcher {
    /// However `latchkey` leaves (an error, a panic), the command does not
    /// outlive it unwatched.
    fn drop(&mut self) {
        self.kill();
    }
}

/// The lock's end (session lease or lock lease, whichever comes first) on
/// `CLOCK_BOOTTIME`, never later than the true end: the clock is read
/// before the remaining time.
fn deadline(guard: &Held) -> u64 {
    let now = guard::boottime_nanos();
    let remaining = u64::try_from(guard.remaining().as_nanos()).unwrap_or(u64::MAX);
    now.saturating_add(remaining)
}

fn lost(what: &str, guard: &Held, program: &str) -> Failure {
    Failure::LockLost(format!(
        "lost {what} (token {}) while {program:?} ran: it was killed",
        guard.token()
    ))
}
