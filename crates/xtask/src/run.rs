//! Running child processes: the workspace's cargo, exit-code mapping, timing.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

/// Why xtask stops: the process exit code and, optionally, one line for stderr.
#[derive(Debug)]
pub struct Exit {
    pub code: u8,
    pub message: Option<String>,
}

impl Exit {
    /// Exit with `code`, printing `message` (prefixed with "xtask: ") on stderr.
    pub fn with(code: u8, message: impl Into<String>) -> Self {
        Exit {
            code,
            message: Some(message.into()),
        }
    }

    /// Exit with `code` and nothing more to say (the child already said it).
    pub fn silent(code: u8) -> Self {
        Exit {
            code,
            message: None,
        }
    }
}

pub type Result<T = ()> = std::result::Result<T, Exit>;

/// The workspace root: two levels above this crate's manifest directory.
/// `cargo run` sets CARGO_MANIFEST_DIR at run time; the compile-time value is
/// the fallback, and the current directory the last resort.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    match manifest_dir.parent().and_then(Path::parent) {
        Some(root) if root.join("Cargo.toml").is_file() => root.to_path_buf(),
        _ => env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    }
}

/// A `cargo` command using the same cargo that runs xtask (env CARGO), run from
/// the workspace root. CARGO_TARGET_DIR and everything else is inherited.
pub fn cargo<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(program);
    cmd.current_dir(workspace_root());
    cmd.args(args.into_iter().map(Into::into));
    cmd
}

/// `cargo a b c` as it would be typed (the program shown as plain "cargo").
pub fn display(cmd: &Command) -> String {
    let program = Path::new(cmd.get_program());
    let program = if program.file_stem().is_some_and(|s| s == "cargo") {
        "cargo".to_string()
    } else {
        program.to_string_lossy().into_owned()
    };
    let mut line = program;
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Run `cmd` with inherited stdio and wait. Ok(()) on success; otherwise an
/// `Exit` carrying the child's exit code (1 if it could not be started).
pub fn run(cmd: &mut Command) -> Result {
    match cmd.status() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(Exit::silent(exit_code(status))),
        Err(e) => Err(Exit::with(
            1,
            format!("could not start `{}`: {e}", display(cmd)),
        )),
    }
}

/// Whether `program args...` can be started and exits 0; its output is discarded.
pub fn succeeds(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The exit code to pass on for a finished child: its own code (clamped to
/// 1..=255), or 128 + signal number when it was killed by a signal.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code).ok().filter(|&c| c != 0).unwrap_or(1);
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return u8::try_from(128 + signal).unwrap_or(1);
        }
    }
    1
}

/// "0.4s", "12.3s", "3m07s", "1h02m".
pub fn fmt_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(fmt_duration(Duration::from_millis(400)), "0.4s");
        assert_eq!(fmt_duration(Duration::from_secs(187)), "3m07s");
        assert_eq!(fmt_duration(Duration::from_secs(3720)), "1h02m");
    }
}
