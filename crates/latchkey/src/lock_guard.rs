//! The watcher that `latchkey lock -- CMD` puts between itself and the
//! command: a dead man's switch, so the command never runs past the lease
//! that `latchkey` last vouched for, even while `latchkey` cannot watch the
//! lock (stopped by SIGSTOP, hung, starved).
//!
//! `latchkey lock` starts `latchkey __lock-guard --fd N -- CMD...` in a new
//! process group; the guard starts CMD in the same group and waits. Over
//! the pipe N, `latchkey` sends deadlines: 8 bytes, big-endian nanoseconds
//! on `CLOCK_BOOTTIME` (which counts suspend, as the lease clock does),
//! each at most the session's lease end. The guard kills the whole group
//! (the command, its children, itself) with SIGKILL when the clock passes
//! the last deadline it received, or when the pipe closes (`latchkey`
//! died); when the command exits, the guard exits with its code (128 + N
//! for a signal N). It needs no async runtime: `poll(2)` on the pipe and on
//! a pidfd of the command.
//!
//! Why a process and not a thread: SIGSTOP stops every thread of
//! `latchkey`; the guard runs on in the command's group. The guard is
//! stopped only with the command (Ctrl-Z on the command's terminal, or a
//! stop of the group), and then nothing of the command runs either; when
//! the group is continued, the guard first checks the clock.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;

/// Nanoseconds on `CLOCK_BOOTTIME`.
pub fn boottime_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass; CLOCK_BOOTTIME
    // exists on every Linux latchkey supports.
    unsafe {
        libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts);
    }
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// Kill the guard's process group (the command, its children, the guard).
fn kill_group() -> ! {
    // SAFETY: kill(2) of our own process group, which we lead.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
    // SIGKILL of our own group includes us; should it not arrive at once:
    std::process::exit(137)
}

/// Run the guard: read deadlines from `fd`, run `command`; see the module
/// docs. Never returns while the command runs past a deadline.
pub fn run(fd: RawFd, command: &[String]) -> ExitCode {
    // SAFETY: `latchkey lock` passes the read end of a pipe it made for us
    // and nothing else in this process uses that descriptor.
    let pipe = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut deadline = match read_deadline(&pipe) {
        Ok(Some(d)) => d,
        // No first deadline: latchkey is gone or broken; run nothing.
        _ => return ExitCode::from(206),
    };
    if boottime_nanos() >= deadline {
        return ExitCode::from(206);
    }
    let Some((program, args)) = command.split_first() else {
        return ExitCode::from(202);
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    let mut child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("latchkey: cannot run {program:?}: {e}");
            return ExitCode::from(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            });
        }
    };
    let pidfd = pidfd_open(child.id());
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return exit_code_of(status);
        }
        let now = boottime_nanos();
        if now >= deadline {
            kill_group();
        }
        let wait_ms = ((deadline - now) / 1_000_000 + 1).min(1000);
        let mut fds = vec![libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        if let Some(p) = &pidfd {
            fds.push(libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(p),
                events: libc::POLLIN,
                revents: 0,
            });
        } else {
            // No pidfd (an old kernel): notice the command's exit within 50 ms.
        }
        let timeout = if pidfd.is_some() {
            i32::try_from(wait_ms).unwrap_or(1000)
        } else {
            i32::try_from(wait_ms.min(50)).unwrap_or(50)
        };
        // SAFETY: poll(2) over the pollfd array we own, of its length.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready < 0 {
            continue; // EINTR (a stop and continue, say): look again
        }
        if fds[0].revents != 0 {
            match read_deadline(&pipe) {
                Ok(Some(d)) => deadline = d,
                // latchkey closed the pipe (it died or gave the lock up):
                // nothing vouches for the lease any more.
                Ok(None) | Err(_) => kill_group(),
            }
        }
    }
}

/// The next deadline on the pipe; `None` at end of file.
fn read_deadline(pipe: &OwnedFd) -> std::io::Result<Option<u64>> {
    use std::io::Read;
    let mut buf = [0u8; 8];
    let mut file = std::fs::File::from(pipe.try_clone()?);
    match file.read_exact(&mut buf) {
        Ok(()) => Ok(Some(u64::from_be_bytes(buf))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// A pidfd of `pid` (readable once it exits), if the kernel has them.
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open(2) on our own child; it returns a new descriptor
    // or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = RawFd::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: the descriptor was just created for us.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The command's status as an exit code (128 + N for a signal N).
pub fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(255)),
        (None, None) => ExitCode::from(1),
    }
}
