//! `latchkey lock NAME -- CMD`: hold a lock while a command runs.
//!
//! The command gets `LATCHKEY_LOCK`, `LATCHKEY_TOKEN` and
//! `LATCHKEY_SEQUENCER` in its environment, so it can fence its own writes
//! (`latchkey put --fence "$LATCHKEY_SEQUENCER" ...`, or pass the token to
//! its storage). If the session is lost while the command runs (this process
//! was paused, or cut off from the cluster past the TTL), the command is
//! killed at once and `latchkey` exits 6: past that point another process
//! may hold the lock. SIGINT and SIGTERM are passed on to the command.

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
    let guard = match req.wait {
        None => lock.try_acquire().await?,
        Some(None) => Some(lock.acquire().await?),
        Some(Some(w)) => lock.acquire_timeout(w).await?,
    };
    let Some(guard) = guard else {
        let _ = session.close().await;
        return Err(Failure::NotAcquired(match req.wait {
            None => format!("lock {:?} is busy", req.name),
            Some(_) => format!("lock {:?} was not acquired in time", req.name),
        }));
    };
    tracing::debug!(sequencer = %guard.sequencer(), "lock acquired");
    let mut child = Command::new(program)
        .args(args)
        .env("LATCHKEY_LOCK", &req.name)
        .env("LATCHKEY_TOKEN", guard.token().to_string())
        .env("LATCHKEY_SEQUENCER", guard.sequencer().to_string())
        .stdin(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Failure::Usage(format!("cannot run {program:?}: {e}")))?;

    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Other(format!("cannot watch signals: {e}")))?;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = guard.lost() => {
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Err(Failure::LockLost(format!(
                    "lost lock {:?} (token {}) while {program:?} ran: it was killed",
                    req.name,
                    guard.token()
                )));
            }
            _ = term.recv() => forward(&child, libc::SIGTERM),
            _ = int.recv() => forward(&child, libc::SIGINT),
        }
    };
    let status = status.map_err(|e| Failure::Other(format!("waiting for {program:?}: {e}")))?;
    if let Err(e) = guard.release().await {
        tracing::warn!(error = %e, "release after the command failed");
    }
    let _ = session.close().await;
    Ok(exit_code_of(status))
}

fn forward(child: &tokio::process::Child, signal: i32) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        unsafe {
            libc::kill(pid, signal);
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
