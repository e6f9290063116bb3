//! The `latchkey` tool's subcommands, one room per group, and [`run`],
//! which sends a parsed command to its room.
//!
//! Imports point one way, from here down: `run` (this file) uses the
//! subcommand rooms (`serve`, `certs`, `kv`, `status`, `members`,
//! `access`, `lock`, `locks`, `session`, `snapshot`); they use only the shared rooms
//! (`args`, the grammar; `connect`, the client; `failure`, the failure
//! type; `fencing`, sequencers and session secrets; `output`, stdout), never
//! one another nor this file; the shared rooms use only `failure` and
//! `args`.

mod access;
mod args;
mod certs;
mod connect;
mod failure;
mod fencing;
mod force_release;
mod kv;
pub mod lock;
mod locks;
mod members;
mod output;
mod serve;
mod sessions;
mod snapshot;
mod status;
mod watch;

use std::process::ExitCode;

use args::{Cmd, WriteOut};

pub use args::Args;
pub use failure::Failure;

/// Run one parsed command.
pub async fn run(args: Args) -> Result<ExitCode, Failure> {
    let json = args.write_out == WriteOut::Json;
    match &args.command {
        Cmd::Serve(s) => serve::run(&args, s).await,
        Cmd::Certs {
            out,
            nodes,
            hosts,
            users,
        } => certs::run(out, *nodes, hosts, users),
        Cmd::Put {
            key,
            value,
            file,
            ephemeral: true,
            ttl,
            ..
        } => {
            kv::put_ephemeral(
                &args,
                key,
                value.as_deref(),
                file.as_deref(),
                ttl.unwrap_or(kv::EPHEMERAL_TTL),
            )
            .await
        }
        Cmd::Put {
            key,
            value,
            file,
            fence,
            session_secret,
            ..
        } => {
            kv::put(
                &args,
                key,
                value.as_deref(),
                file.as_deref(),
                fence.as_deref(),
                session_secret.as_deref(),
            )
            .await
        }
        Cmd::Get { key, stale } => kv::get(&args, key, *stale).await,
        Cmd::Del {
            key,
            fence,
            session_secret,
        } => kv::del(&args, key, fence.as_deref(), session_secret.as_deref()).await,
        Cmd::Scan {
            prefix,
            start,
            end,
            limit,
            reverse,
        } => kv::scan(&args, prefix, start, end.as_deref(), *limit, *reverse).await,
        Cmd::Watch {
            key,
            prefix,
            rev,
            prev,
        } => watch::run(&args, key.as_deref(), prefix.as_deref(), *rev, *prev).await,
        Cmd::Seq { key, step } => kv::seq(&args, key, *step).await,
        Cmd::Status => status::run(&args, json).await,
        Cmd::Members(m) => members::run(&args, m, json).await,
        Cmd::Auth(a) => access::auth(&args, a).await,
        Cmd::User(u) => access::user(&args, u).await,
        Cmd::Role(r) => access::role(&args, r).await,
        Cmd::Lock(l) => lock::run(&args, l).await,
        Cmd::Elect(e) => lock::elect::run(&args, e).await,
        Cmd::Sem(s) => lock::run_semaphore(&args, s).await,
        Cmd::LockGuard { fd, command } => Ok(lock::guard::run(*fd, command)),
        Cmd::CheckSequencer { sequencer } => locks::check_sequencer(&args, sequencer).await,
        Cmd::Locks { prefix, cmd: None } => locks::list(&args, prefix, json).await,
        Cmd::Locks { cmd: Some(cmd), .. } => force_release::run(&args, cmd, json).await,
        Cmd::Sessions { cmd } => sessions::run(&args, cmd.as_ref(), json).await,
        Cmd::Snapshot(cmd) => snapshot::run(cmd, || connect::client(&args), json).await,
    }
}
