//! The `latchkey` command-line tool: run a replica (`serve`) or talk to a
//! cluster, etcdctl-style. Every failure ends with one line on stderr and a
//! non-zero exit code: 1 for "not found" (or a stale sequencer), 2 for bad
//! usage or input, 3 when the cluster could not answer (or, for `status`,
//! any replica is down, failed or without a leader), 4 when a write's
//! outcome is unknown, 7 when a fenced write was refused, 8 when
//! `serve`'s replica could not start or failed while running (its Raft core
//! stopped, its data directory vanished or lost acknowledged state), 9 when
//! `serve`'s configuration cannot be used. Around a command (`lock -- CMD`)
//! the command's own code passes through, and latchkey's are 200 + the
//! above (127/126 when the command cannot be found/run).

mod cli;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    if let Some((fd, command)) = args.lock_guard() {
        return cli::lock::guard::run(fd, command);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            return fail(cli::Failure::Other(format!(
                "cannot start the runtime: {e}"
            )))
        }
    };
    match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(f) => fail(f),
    }
}

fn fail(f: cli::Failure) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "latchkey: {f}");
    ExitCode::from(f.exit_code())
}
