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
//! for a signal N), and `latchkey` kills whatever the command left in the
//! group. It needs no async runtime: `poll(2)` on the pipe and on a pidfd
//! of the command. It survives SIGINT, SIGTERM, SIGQUIT, SIGHUP, SIGUSR1
//! and SIGUSR2 (sent to the whole group by a terminal or by `latchkey`,
//! which sends one when the session is at risk; `latchkey` starts it with
//! them ignored, so one sent before its handlers are in place does not kill
//! it either), so the command decides what they do; the command gets `PR_SET_PDEATHSIG`, so it dies with the
//! guard.
//!
//! What the guard cannot see: processes that leave the group (`setsid`,
//! `setpgid`, e.g. `timeout(1)`) escape its kill, as they escape a shell's
//! job control.
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

/// The signals the guard outlives (a terminal's, and the at-risk signals
/// `latchkey lock` may send the group); the command gets them as usual.
pub const SURVIVED: [libc::c_int; 6] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGQUIT,
    libc::SIGHUP,
    libc::SIGUSR1,
    libc::SIGUSR2,
];

/// A handler that does nothing: the guard outlives the signals a terminal
/// or `latchkey` sends the command's group (the command, after `exec`,
/// gets its default handling back).
extern "C" fn ignore(_: libc::c_int) {}

/// Run the guard: read deadlines from `fd`, run `command`; see the module
/// docs. Never returns while the command runs past a deadline.
pub fn run(fd: RawFd, command: &[String]) -> ExitCode {
    // SAFETY: fcntl(2) and sigaction(2) on this process's own descriptor and
    // dispositions, before any other thread exists.
    unsafe {
        // The pipe is ours, not the command's.
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        for sig in SURVIVED {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
    // SAFETY: `latchkey lock` passes the read end of a pipe it made for us
    // and nothing else in this process uses that descriptor.
    let pipe = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut deadline = None;
    // The first deadline is written before the guard starts.
    match drain(&pipe, &mut deadline) {
        Ok(true) => {}
        _ => return ExitCode::from(206),
    }
    let Some(mut deadline) = deadline.filter(|d| boottime_nanos() < *d) else {
        return ExitCode::from(206);
    };
    let Some((program, args)) = command.split_first() else {
        return ExitCode::from(202);
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args);
    // SAFETY: prctl(2) is async-signal-safe: the kernel kills the command if
    // the guard dies (even by SIGKILL) before it could kill the group.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
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
        // The newest deadline first: after a stop, the pipe holds later
        // ones than the one the guard last read.
        let mut newest = None;
        match drain(&pipe, &mut newest) {
            Ok(true) => {}
            // latchkey closed the pipe (it died or gave the lock up):
            // nothing vouches for the lease any more.
            Ok(false) | Err(_) => kill_group(),
        }
        if let Some(d) = newest {
            deadline = d;
        }
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
        // Without a pidfd (an old kernel), the command's exit is noticed
        // within 50 ms.
        let timeout = match &pidfd {
            Some(p) => {
                fds.push(libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(p),
                    events: libc::POLLIN,
                    revents: 0,
                });
                i32::try_from(wait_ms).unwrap_or(1000)
            }
            None => i32::try_from(wait_ms.min(50)).unwrap_or(50),
        };
        // SAFETY: poll(2) over the pollfd array we own, of its length.
        // EINTR (a signal, a stop and continue) just means looking again.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
    }
}

/// Read every deadline waiting on the (non-blocking) pipe into `newest`
/// (the last one wins). `Ok(false)` at end of file: the writer is gone.
fn drain(pipe: &OwnedFd, newest: &mut Option<u64>) -> std::io::Result<bool> {
    use std::io::Read;
    let mut file = std::fs::File::from(pipe.try_clone()?);
    // A multiple of 8: writes of 8 bytes are atomic, so reads never split one.
    let mut buf = [0u8; 8 * 64];
    loop {
        match file.read(&mut buf) {
            Ok(0) => return Ok(false),
            Ok(n) => {
                for chunk in buf[..n].chunks_exact(8) {
                    let mut bytes = [0u8; 8];
                    bytes.copy_from_slice(chunk);
                    *newest = Some(u64::from_be_bytes(bytes));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
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
