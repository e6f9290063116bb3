//! `latchkey lock NAME -- CMD`: hold a lock while a command runs.
//!
//! The command gets `LATCHKEY_LOCK`, `LATCHKEY_TOKEN`, `LATCHKEY_SEQUENCER`
//! and `LATCHKEY_SESSION_SECRET` in its environment, so it can fence its own
//! writes (`latchkey put --fence "$LATCHKEY_SEQUENCER" ...`, which reads the
//! secret from the environment; only the holder's session may write fenced),
//! or pass the token to its storage. The secret gives the command the
//! session's whole authority (it could also release the lock or close the
//! session): run only commands you trust with the lock. If the session is lost while the command runs (this process
//! was paused, or cut off from the cluster past the TTL), the command's
//! whole process group is killed at once and `latchkey` exits 206: past that
//! point another process may hold the lock. If `latchkey` itself dies, the
//! kernel kills the command (`PR_SET_PDEATHSIG`). SIGINT and SIGTERM are
//! passed on to the command (and, while waiting for the lock, give up the
//! wait).
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

use latchkey::Client;
use tokio::process::Command;

use crate::cli::Failure;

/// What to lock and what to run.
pub struct LockRequest {
    pub name: String,
    pub ttl: Duration,
    /// `None`: try once. `Some(None)`: wait as long as it takes.
    pub wait: Option<Option<Duration>>,
    pub shared: bool,
    pub lease: Option<Duration>,
    pub lock_delay: Option<Duration>,
    pub command: Vec<String>,
}

/// Acquire, run, release; the exit code is the command's.
pub async fn run(client: Client, req: LockRequest) -> Result<ExitCode, Failure> {
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
    let mut lock = session.lock(req.name.clone());
    if req.shared {
        lock = lock.shared();
    }
    if let Some(l) = req.lease {
        lock = lock.lease(l);
    }
    if let Some(d) = req.lock_delay {
        lock = lock.lock_delay(d);
    }
    let acquire = async {
        match req.wait {
            None => lock.try_acquire().await,
            Some(None) => lock.acquire().await.map(Some),
            Some(Some(w)) => lock.acquire_timeout(w).await,
        }
    };
    let guard = tokio::select! {
        g = acquire => g?,
        _ = term.recv() => None,
        _ = int.recv() => None,
    };
    let Some(guard) = guard.filter(|g| g.is_held()) else {
        let _ = session.close().await;
        return Err(Failure::NotAcquired(match req.wait {
            None => format!("lock {:?} is busy", req.name),
            Some(_) => format!("lock {:?} was not acquired", req.name),
        }));
    };
    tracing::debug!(sequencer = %guard.sequencer(), "lock acquired");
    let mut command = Command::new(program);
    command
        .args(args)
        .env("LATCHKEY_LOCK", &req.name)
        .env("LATCHKEY_TOKEN", guard.token().to_string())
        .env("LATCHKEY_SEQUENCER", guard.sequencer().to_string())
        .env("LATCHKEY_SESSION_SECRET", session.secret().to_hex())
        .stdin(Stdio::inherit())
        .kill_on_drop(true)
        // Its own process group, so losing the lock stops the whole command
        // (a shell's children too), not just its first process.
        .process_group(0);
    // SAFETY: prctl(2) is async-signal-safe; it only asks the kernel to
    // SIGKILL the command if this process dies (even by SIGKILL), so the
    // command never outlives the process that holds its lock.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            // Nothing ran: give the lock back at once rather than leave it
            // held until the session's TTL ends.
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "release after a failed start");
            }
            let _ = session.close().await;
            return Err(Failure::CannotRun {
                not_found: e.kind() == std::io::ErrorKind::NotFound,
                message: format!("cannot run {program:?}: {e}"),
            });
        }
    };
    let pgid = child.id().and_then(|p| i32::try_from(p).ok());

    let status = loop {
        tokio::select! {
            biased;
            _ = guard.lost() => {
                kill_group(pgid);
                let _ = child.wait().await;
                return Err(lost(&req.name, &guard, program));
            }
            status = child.wait() => break status,
            _ = term.recv() => forward(pgid, libc::SIGTERM),
            _ = int.recv() => forward(pgid, libc::SIGINT),
        }
    };
    let status = status.map_err(|e| Failure::Other(format!("waiting for {program:?}: {e}")))?;
    kill_group(pgid); // anything the command left running in its group
    if !guard.is_held() {
        // The command finished, but maybe only after the lock was lost
        // (this process was paused): its work may have overlapped another
        // holder's.
        return Err(lost(&req.name, &guard, program));
    }
    if let Err(e) = guard.release().await {
        tracing::warn!(error = %e, "release after the command failed");
    }
    let _ = session.close().await;
    Ok(exit_code_of(status))
}

fn lost(name: &str, guard: &latchkey::LockGuard, program: &str) -> Failure {
    Failure::LockLost(format!(
        "lost lock {name:?} (token {}) while {program:?} ran: it was killed",
        guard.token()
    ))
}

fn kill_group(pgid: Option<i32>) {
    forward(pgid, libc::SIGKILL);
}

/// Send `signal` to the command's process group.
fn forward(pgid: Option<i32>, signal: i32) {
    if let Some(pgid) = pgid {
        // SAFETY: kill(2) on the process group we created for the command.
        unsafe {
            libc::kill(-pgid, signal);
        }
    }
}

fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(255)),
        (None, None) => ExitCode::from(1),
    }
}
