//! A `latchkey` CLI process that holds something (a lock, a leadership)
//! for a benchmark, in a process group of its own, SIGKILLed to die: the
//! dead holder of the churn and election hand-over benchmarks.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// `latchkey --endpoints E ARGS...`, killed with its process group when
/// dropped.
pub struct CliProcess {
    child: Child,
    killed: bool,
}

impl CliProcess {
    /// Start `bin --endpoints E args...`, its output discarded.
    pub fn spawn(bin: &Path, endpoints: &[String], args: &[&str]) -> Result<CliProcess, String> {
        let child = Command::new(bin)
            .args(["--endpoints", &endpoints.join(",")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| {
                let what = args.first().copied().unwrap_or_default();
                format!("cannot start `{} {what}`: {e}", bin.display())
            })?;
        Ok(CliProcess {
            child,
            killed: false,
        })
    }

    /// SIGKILL the process group (the CLI and any command it runs, which
    /// shares the group) and reap the CLI, once.
    pub fn kill(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) on the process's own process group, by id.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.child.wait();
    }
}

impl Drop for CliProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
