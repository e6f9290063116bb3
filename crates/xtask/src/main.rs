//! `cargo xtask`: latchkey's set-up and task runner (std only).
//!
//! See `cargo xtask help`. Every command that builds something first runs
//! `setup`, which is silent when the native prerequisites are present.

mod imports;
mod run;
mod setup;

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

use run::{cargo, display, fmt_duration, Exit, Result};

const USAGE: &str = "\
latchkey's task runner

USAGE:
    cargo xtask <COMMAND> [ARGS...]

COMMANDS:
    setup           check for (and install when missing) libclang and a C++ compiler
    demo [NAME]     run a demo: three_replicas (default), fenced, config,
                    discovery, election or semaphore
    test [--quick]  cargo fmt --check, cargo clippy -D warnings, cargo test --workspace,
                    the Python client test, then a two-minute nemesis run
    bench [WORKLOAD] [ARGS...]
                    run benchmarks: kv (default), lock or all
    soak [ARGS...]  fault-injection run: kill, pause, partition; checkers; report
    imports [--check] [CRATE_DIR...]
                    the import graph between a crate's files: floors and circles
    help [COMMAND]  print this text or a command's help

demo, test, bench and soak run `setup` first (silently when everything is present).
All cargo invocations use the cargo that runs xtask and honour CARGO_TARGET_DIR.
The first build compiles RocksDB's C++ and takes about 15 minutes.
";

const SETUP_HELP: &str = "\
cargo xtask setup [--check]

Makes sure the native build prerequisites of librocksdb-sys exist:
  - libclang, for bindgen: LIBCLANG_PATH set, or listed by `ldconfig -p`, or a
    libclang*.so under /usr/lib/llvm-*/lib or /usr/lib/*-linux-gnu (on
    Debian/Ubuntu clang's builtin headers must be present too);
  - a C++ compiler: CXX, c++, g++ or clang++.
When something is missing on Debian/Ubuntu it runs `apt-get update` and
`apt-get install -y libclang-dev g++` (DEBIAN_FRONTEND=noninteractive), as
root or through passwordless `sudo -n`; otherwise it prints the package to
install and exits 1.

OPTIONS:
    --check    only report; never install; exit 1 if something is missing

LATCHKEY_SKIP_SETUP=1 skips the checks (here and before every command).
";

const DEMO_HELP: &str = "\
cargo xtask demo [NAME] [--tls] [-- ARGS...]

Runs a demo example of the latchkey package (`cargo run -p latchkey --example ...`),
passing ARGS to it.

OPTIONS:
    --tls   three_replicas only: make a development CA and certificates
            (`latchkey certs`), run the replicas with TLS and mutual TLS
            between peers, and talk to them over TLS

DEMOS:
    three_replicas  (default) three `latchkey serve` processes: crashes the
                    leader with SIGKILL, shows that nothing acknowledged is
                    lost, restarts it (builds the `latchkey` binary first and
                    passes its path as the demo's first argument)
    fenced          (fenced_storage) a paused lock holder's stale fencing token
                    is refused by PostgreSQL itself (a throwaway server;
                    on Debian a missing postgresql package is installed
                    with apt-get first, else the demo says how to get it)
    config          (config_sync) a local copy of `config/` kept in sync by
                    list-then-watch while the replica it watches is killed
    discovery       (service discovery) members register keys bound to their
                    sessions; an observer lists and watches them come and go
    election        (leader_election) three schedulers campaign; the leader
                    proclaims, resigns, dies; an observer sees every term in
                    order and the deposed leader's fenced write is refused
    semaphore       (semaphore_pool) five workers share two permits, each
                    fenced by its own token; a wrong count is refused
    multilock       (transfer) transfers between accounts lock both accounts
                    at once, named in either order: no deadlock, no lost
                    money, each balance written fenced by its own lock
";

const TEST_HELP: &str = "\
cargo xtask test [--quick] [-- CARGO_TEST_ARGS...]

Runs, in order, stopping at the first failure (exit code = that step's):
    1. cargo fmt --all -- --check, then `cargo xtask imports --check
       crates/latchkey-server crates/latchkey-client`: no circle of files
       in the server or the client
    2. cargo clippy --workspace --all-targets -- -D warnings   (skipped with --quick)
    3. cargo test --workspace [CARGO_TEST_ARGS...], with PostgreSQL's server
       programs for the fencing tests (each starts a throwaway server in a
       temporary directory, on loopback, stopped by pid): on Debian a missing
       postgresql package is installed with apt-get (one-time), and
       LATCHKEY_REQUIRE_POSTGRES=1 makes those tests fail, not skip, without it
    4. python: the gRPC API from Python (grpcio) against a three-process
       cluster, tests/python/latchkey_client_test.py and
       examples/python/lock_example.py; and the Python package (clients/python,
       built from the checkout) with its pytest suite on a cluster of its own, as
       `cargo test --workspace --test python -- --ignored --nocapture` with
       LATCHKEY_PYTHON=<TARGET_DIR>/python-venv/bin/python. That virtualenv is
       made with `python3 -m venv` when missing, and grpcio, grpcio-tools,
       grpcio-reflection, pytest, setuptools and psycopg[binary] are installed into it with its
       pip (from PyPI, no versions pinned) when they do not import; the package's PostgreSQL
       fence and examples/python/fenced_postgres.py run against a throwaway PostgreSQL, as in
       step 3; on Debian/Ubuntu a missing
       python3 or python3-venv is installed with apt-get, as `setup` does.
       Runs with --quick too: about 10 s once the virtualenv exists (10 s
       more to make it). CARGO_TEST_ARGS do not apply to it.
    5. browser: the status page in a headless Chromium against a three-node
       cluster, as `cargo test --workspace --test embedded_metrics --
       --ignored --nocapture` with LATCHKEY_CHROMIUM set to `chromium` on the
       PATH (or LATCHKEY_CHROMIUM as given); on Debian a missing one is
       installed with apt-get (package chromium, one-time). Runs with --quick
       too.
    6. cargo build --workspace --bin latchkey --bin latchkey-nemesis
       (skipped with --quick)
    7. a nemesis run of 100 s of faults (kill, pause, partition, disk; fixed
       seed; at least one disk fault, with its repair) over TLS, as `cargo
       xtask soak --seconds 100 --seed 20261121 --nemesis
       kill,pause,partition,disk --tls` would run it; its report goes to
       soak-results/ci-<unix time>-seed20261121/ (skipped with --quick)
TARGET_DIR is CARGO_TARGET_DIR, else cargo metadata's target_directory.
Example: cargo xtask test --quick -- -p latchkey-core -- --nocapture

OPTIONS:
    --quick    skip clippy and the nemesis run
";

const BENCH_HELP: &str = "\
cargo xtask bench [kv|lock|all|failover|rolling|churn|elect|watch] [ARGS...]

First builds the server (`cargo build --workspace --bin latchkey`, the dev
profile like every other command, with openraft's and validit's debug
assertions off as in a release build: `--config
profile.dev.package.openraft.debug-assertions=false`, the same for validit),
then runs, with the same settings,
`cargo run -p latchkey-bench --bin latchkey-bench -- WORKLOAD --server-bin <TARGET_DIR>/debug/latchkey ARGS...`
(WORKLOAD defaults to kv; ARGS go to the benchmark binary, and may override
--server-bin). TARGET_DIR is CARGO_TARGET_DIR, else cargo metadata's
target_directory. Exits 2 when the workspace has no latchkey-bench package yet.

WORKLOADS (each starts its own three-process cluster on loopback):
    kv      puts, then linearizable gets, at 1, 8 and 64 clients
    lock    lock-cycle (acquire + release, each task on its own lock) at 1 and
            32 clients, then contended (32 tasks on one lock: grants/s and
            acquire latency, with mutual-exclusion and token-order checks);
            every task has its own session (ttl 10s)
    all     kv, then lock
    failover  under a write load, SIGKILL the leader 10 times (--kills): time
            to the first acknowledged write (p50, p90, max) and elections,
            spurious ones (in --settle of quiet load) counted apart
    rolling under a put and lock load, SIGTERM and restart each replica in
            turn (the leader last), 3 times (--rounds): the longest put and
            lock cycle per round, failed calls, lost writes
    churn   a holder cut off from the cluster holds a lock another client
            waits for (TTL 5s, --ttl); the leader is SIGKILLed 10 times
            (--kills), 1s (--lead) after each takes over: time until the
            waiter holds the lock, 3 rounds (--rounds)
    elect   election hand-over: a `latchkey elect` leader (TTL 5s, --ttl) is
            SIGKILLed while a standby campaigns: time until the standby
            leads, 10 rounds (--rounds), median, lowest and highest
    watch   put x64 with no watcher and with 1,000 (--watchers) on its prefix,
            interleaved; the delay from each put's acknowledgement to each
            watcher; then one writer and one watcher

ARGS (see `cargo run -p latchkey-bench -- --help`):
    --duration 5s        length of each (workload, clients) run
    --clients LIST       client tasks per run of kv (1,8,64) and lock-cycle (1,32)
    --contended LIST     client tasks per contended run (32)
    --value-size 128     bytes per kv value
    --out bench-results  where <kv|lock>-<unix time>.json / .svg and -latest.json / .svg go
    --client-mode shared|per-task
Examples: cargo xtask bench kv --duration 3s
          cargo xtask bench lock --duration 5s
Prints a table per benchmark (ops/s, p50/p99/p99.9 latency, errors per workload
and client count, the disk's fsync/s; for kv put/s over fsync/s, for lock the
acquire/release split and the safety checks). Timing is never asserted.
";

const SOAK_HELP: &str = "\
cargo xtask soak [--minutes N | --seconds N] [--seed S] [--nemesis KINDS] [ARGS...]

Runs the fault-injection harness (package latchkey-nemesis): three `latchkey
serve` replicas, each in a network namespace of its own on a bridge the
harness creates (needs root; without it, loopback and no partitions), lock,
register, sequence and durability workloads in client processes, and a
seeded nemesis; then every replica is killed and restarted at once (each on
its current data directory) and the acknowledged puts are read back, and the
checkers of latchkey-check judge the merged history. Between the faults and
the full restart, a leader-churn phase (12-20 s): a holder with a 5 s session
is killed holding a lock a waiter queues for, and the leader is killed up to
four times meanwhile; the report gives when the lock was freed against the
documented failover bound. Builds the `latchkey`
server and the harness first (`cargo build --workspace --bin ...`).

FAULT KINDS (one at a time, some pairs; the schedule is printed first):
    kill       kill -9 a replica (the leader or a random one), restart it
    pause      SIGSTOP a replica or a lock client for longer than the TTL
    partition  isolate a replica from its peers (needs root)
    disk       on one replica, never paired with another fault: wipe (kill
               -9, delete its data directory, restart), truncate-wal (kill
               -9, cut the newest db/*.log to half, restart), flip-sst (kill
               -9, flip a byte of an SST, restart) or delete-running (delete
               the data directory under the running replica, which must exit
               within 10 s, else the run fails: a zombie replica). What the
               replica did (exit code 8, Waiting, ran on) is recorded; one
               that refused, exited or waits is repaired the documented way
               (new data directory, restart, `members add`) until it is a
               voter with its new incarnation and caught up. The run fails if
               a damaged replica panics, or serves on a log shorter than what
               it had made durable before the fault.

OPTIONS:
    --minutes N        length of the fault phase in minutes (default: 2)
    --seconds N        ... or in seconds
    --seed S           seed of the schedule and workloads (default: random,
                       printed; the same seed replays the same faults)
    --nemesis KINDS    fault kinds, comma-separated: kill,pause,partition,disk
                       (all)
    --out DIR          report folder (default: soak-results/<time>-seed<S>)
    --loopback         run on loopback even as root (no partitions)
    --lock-workers N   lock client processes (3, two tasks each)
    --ttl D            lock sessions' TTL (3s; pauses outlast it)
    --tls              everything over TLS: `latchkey certs` makes the
                       certificates, replicas talk mutual TLS, clients TLS

Exits 0 when every checker passed and every workload made progress, 1 when
one failed (or a disk-faulted replica misbehaved or could not be repaired),
2 when the run could not be carried out. The report folder holds summary.md
(verdicts, witnesses, counts, faults, disk faults and repairs), timeline.svg,
the merged history.jsonl (re-check: cargo run -p latchkey-nemesis -- check
DIR), the schedule, replica logs and per-worker histories.
Example: cargo xtask soak --minutes 30
";

const IMPORTS_HELP: &str = "\
cargo xtask imports [--check] [CRATE_DIR...]

Shows how the files of a crate import each other. Every .rs file under
CRATE_DIR/src is a node (src/lib.rs the crate root, src/a.rs and src/a/mod.rs
module a, src/a/b.rs module a::b); tests/, benches/, examples/, build.rs,
src/bin/ and items marked #[cfg(test)] are left out. File A imports file B
when A refers to an item defined in B: through a `use` (not a `pub use`
re-export, which is followed instead), a path in code (crate::a::X,
super::X, self::x::Y, child_module::X) or the names of an `impl Trait for
Type` header. Comments and string literals are ignored; paths into other
crates (std::, tokio::, latchkey_proto::) are not edges.

For each crate it prints every file with its floor (floor 1 imports nothing
in the crate; a file stands one floor above the highest file it imports; the
files of a circle share a floor and are marked) and the files it imports,
then every circle (files that import each other, directly or around a loop)
with the edges that tie it and the names used:
    circle 1: src/a.rs -> src/b.rs (Foo, bar); src/b.rs -> src/a.rs (Baz)
and last a summary line per crate: `latchkey-server: 31 files, 0 circles`.

CRATE_DIR defaults to crates/latchkey-server crates/latchkey-client. A
relative CRATE_DIR is taken from the current directory, else from the
workspace root; absolute ones are fine (another checkout, read only).

OPTIONS:
    --check    exit 1 when any of the crates has a circle (after printing it)

Exits 0 otherwise, 2 when a crate cannot be read.
Example: cargo xtask imports --check crates/latchkey-core
";

/// (name users type, aliases, example target, the package it belongs to)
const DEMOS: &[(&str, &[&str], &str, &str)] = &[
    ("three_replicas", &["three"], "three_replicas", "latchkey"),
    // The fencing examples belong to latchkey-fence, so that the facade's
    // examples (the default demo among them) compile no database driver.
    (
        "fenced",
        &["fenced_storage"],
        "fenced_storage",
        "latchkey-fence",
    ),
    ("config", &["config_sync"], "config_sync", "latchkey"),
    ("discovery", &["service_discovery"], "discovery", "latchkey"),
    (
        "election",
        &["leader_election"],
        "leader_election",
        "latchkey",
    ),
    (
        "semaphore",
        &["semaphore_pool"],
        "semaphore_pool",
        "latchkey",
    ),
    (
        "multilock",
        &["transfer", "multi_lock"],
        "transfer",
        "latchkey",
    ),
];

const BENCH_WORKLOADS: &[&str] = &[
    "kv", "lock", "all", "failover", "rolling", "churn", "elect", "watch",
];

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match dispatch(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(exit) => {
            if let Some(message) = exit.message {
                eprintln!("xtask: {message}");
            }
            ExitCode::from(exit.code)
        }
    }
}

fn dispatch(args: &[OsString]) -> Result {
    let Some((command, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return Err(Exit::silent(2));
    };
    match command.to_str() {
        Some("-h" | "--help") => {
            print!("{USAGE}");
            Ok(())
        }
        Some("help") => help(rest),
        Some("setup") => cmd_setup(rest),
        Some("demo") => cmd_demo(rest),
        Some("test") => cmd_test(rest),
        Some("bench") => cmd_bench(rest),
        Some("soak") => cmd_soak(rest),
        Some("imports") => cmd_imports(rest),
        _ => {
            eprint!("{USAGE}");
            Err(Exit::with(
                2,
                format!("unknown command `{}`", command.to_string_lossy()),
            ))
        }
    }
}

fn help(rest: &[OsString]) -> Result {
    let text = match rest.first().map(|a| a.to_str()) {
        None => USAGE,
        Some(Some("setup")) => SETUP_HELP,
        Some(Some("demo")) => DEMO_HELP,
        Some(Some("test")) => TEST_HELP,
        Some(Some("bench")) => BENCH_HELP,
        Some(Some("soak")) => SOAK_HELP,
        Some(Some("imports")) => IMPORTS_HELP,
        Some(_) => {
            eprint!("{USAGE}");
            return Err(Exit::with(
                2,
                format!("no help for unknown command `{}`", lossy(&rest[0])),
            ));
        }
    };
    print!("{text}");
    Ok(())
}

fn is_help(arg: &OsStr) -> bool {
    arg == "-h" || arg == "--help"
}

fn lossy(arg: &OsStr) -> String {
    arg.to_string_lossy().into_owned()
}

/// A usage error for `command`: the message, the command's help on stderr, exit 2.
fn usage_error(help_text: &str, message: String) -> Exit {
    eprint!("{help_text}");
    Exit::with(2, message)
}

// ---------------------------------------------------------------- setup

fn cmd_setup(rest: &[OsString]) -> Result {
    let mut mode = setup::Mode::Verbose;
    for arg in rest {
        if is_help(arg) {
            print!("{SETUP_HELP}");
            return Ok(());
        } else if arg == "--check" {
            mode = setup::Mode::Check;
        } else {
            return Err(usage_error(
                SETUP_HELP,
                format!("setup: unexpected argument `{}`", lossy(arg)),
            ));
        }
    }
    setup::ensure(mode)
}

// ---------------------------------------------------------------- demo

fn cmd_demo(rest: &[OsString]) -> Result {
    let (ours, passthrough) = split_at_dashdash(rest);
    let mut name: Option<&OsString> = None;
    let mut tls = false;
    for arg in ours {
        if is_help(arg) {
            print!("{DEMO_HELP}");
            return Ok(());
        } else if arg == "--tls" {
            tls = true;
        } else if arg.to_string_lossy().starts_with('-') {
            return Err(usage_error(
                DEMO_HELP,
                format!("demo: unknown option `{}`", lossy(arg)),
            ));
        } else if name.is_some() {
            return Err(usage_error(
                DEMO_HELP,
                format!(
                    "demo: expected one demo name, got another: `{}` (pass arguments to the demo after --)",
                    lossy(arg)
                ),
            ));
        } else {
            name = Some(arg);
        }
    }

    let (example, package) = match name {
        None => (DEMOS[0].2, DEMOS[0].3),
        Some(name) => {
            let wanted = name.to_string_lossy().replace('-', "_");
            DEMOS
                .iter()
                .find(|(n, aliases, _, _)| *n == wanted || aliases.contains(&wanted.as_str()))
                .map(|d| (d.2, d.3))
                .ok_or_else(|| {
                    let known: Vec<&str> = DEMOS.iter().map(|d| d.0).collect();
                    Exit::with(
                        2,
                        format!(
                            "demo: unknown demo `{}`; available demos: {} (default: {})",
                            lossy(name),
                            known.join(", "),
                            DEMOS[0].0
                        ),
                    )
                })?
        }
    };

    if tls && example != "three_replicas" {
        return Err(usage_error(
            DEMO_HELP,
            "demo: --tls is for the three_replicas demo".to_string(),
        ));
    }
    setup::ensure(setup::Mode::Quiet)?;
    let mut cmd = cargo(["run", "-p", package, "--example", example]);
    if example == "fenced_storage" {
        // The demo starts a throwaway PostgreSQL server; without one it
        // says how to get PostgreSQL and exits 1.
        match setup::postgres() {
            Ok(bindir) => {
                cmd.env("LATCHKEY_POSTGRES_BINDIR", bindir);
            }
            Err(e) => eprintln!(
                "xtask: warning: {}",
                e.message
                    .as_deref()
                    .unwrap_or("PostgreSQL is not available")
            ),
        }
    }
    // The process demos run `latchkey serve` processes: build the binary
    // and hand it over.
    let server = if matches!(example, "three_replicas" | "config_sync" | "discovery") {
        Some(build_demo_server(package, example)?)
    } else {
        None
    };
    if server.is_some() || !passthrough.is_empty() {
        cmd.arg("--");
    }
    if let Some(server) = server {
        cmd.arg(server);
    }
    if tls {
        cmd.arg("--tls");
    }
    cmd.args(passthrough);
    println!("xtask: {}", display(&cmd));
    run::run(&mut cmd)
}

/// Split at the first `--`: (before, after). Without `--`, after is empty.
fn split_at_dashdash(args: &[OsString]) -> (&[OsString], &[OsString]) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[]),
    }
}

// ---------------------------------------------------------------- test

fn cmd_test(rest: &[OsString]) -> Result {
    let (ours, cargo_test_args) = split_at_dashdash(rest);
    let mut quick = false;
    for arg in ours {
        if is_help(arg) {
            print!("{TEST_HELP}");
            return Ok(());
        } else if arg == "--quick" {
            quick = true;
        } else {
            return Err(usage_error(
                TEST_HELP,
                format!(
                    "test: unexpected argument `{}` (arguments for cargo test go after --)",
                    lossy(arg)
                ),
            ));
        }
    }

    setup::ensure(setup::Mode::Quiet)?;
    require_cargo_tool("fmt", "rustfmt")?;
    if !quick {
        require_cargo_tool("clippy", "clippy")?;
    }

    let mut test = cargo(["test", "--workspace"]);
    test.args(cargo_test_args);
    let steps = [
        Step::new("fmt", Some(cargo(["fmt", "--all", "--", "--check"]))),
        Step::new("imports", Some(imports_check()?)),
        Step::new(
            "clippy",
            (!quick).then(|| {
                cargo([
                    "clippy",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ])
            }),
        ),
        Step {
            name: "test",
            cmd: Some(test),
            prepare: Some(Box::new(require_postgres)),
        },
        python_step(),
        browser_step(),
        Step::new(
            "build server",
            (!quick).then(|| {
                cargo([
                    "build",
                    "--workspace",
                    "--bin",
                    "latchkey",
                    "--bin",
                    NEMESIS_PACKAGE,
                ])
            }),
        ),
        Step::new("nemesis", if quick { None } else { Some(ci_nemesis()?) }),
    ];

    let total = steps.len();
    let started_all = Instant::now();
    for (i, step) in steps.into_iter().enumerate() {
        let n = i + 1;
        let Step { name, cmd, prepare } = step;
        let Some(mut cmd) = cmd else {
            println!("xtask: [{n}/{total}] {name}: skipped (--quick)");
            continue;
        };
        println!("xtask: [{n}/{total}] {name}: {}", display(&cmd));
        let started = Instant::now();
        let result = match prepare {
            Some(prepare) => prepare(&mut cmd),
            None => Ok(()),
        }
        .and_then(|()| run::run(&mut cmd));
        let shown = display_with_env(&cmd);
        let took = fmt_duration(started.elapsed());
        match result {
            Ok(()) => println!("xtask: [{n}/{total}] {name}: ok in {took}"),
            Err(e) => {
                let detail = e.message.map(|m| format!(": {m}")).unwrap_or_default();
                let hint = if name == "fmt" {
                    " (run `cargo fmt --all` to fix)"
                } else {
                    ""
                };
                return Err(Exit::with(
                    e.code,
                    format!(
                        "[{n}/{total}] {name}: FAILED after {took} (exit {}){detail}{hint}: {shown}",
                        e.code
                    ),
                ));
            }
        }
    }
    println!(
        "xtask: test: all steps passed in {}",
        fmt_duration(started_all.elapsed())
    );
    Ok(())
}

/// Work done at the start of a step, before its command runs; may set the
/// command up.
type Prepare = Box<dyn FnOnce(&mut Command) -> Result>;

/// One step of `cargo xtask test`.
struct Step {
    name: &'static str,
    /// `None`: skipped with --quick.
    cmd: Option<Command>,
    /// Runs first, within the step (and its time).
    prepare: Option<Prepare>,
}

impl Step {
    fn new(name: &'static str, cmd: Option<Command>) -> Step {
        Step {
            name,
            cmd,
            prepare: None,
        }
    }
}

/// The test step's preparation: PostgreSQL's server programs, installed
/// when missing ([`setup::postgres`]), for latchkey-fence's database tests
/// (and its test with writer processes), which start a throwaway server each;
/// LATCHKEY_REQUIRE_POSTGRES makes those tests fail rather than skip if
/// it is still missing.
fn require_postgres(cmd: &mut Command) -> Result {
    let bindir = setup::postgres()?;
    cmd.env("LATCHKEY_POSTGRES_BINDIR", bindir)
        .env("LATCHKEY_REQUIRE_POSTGRES", "1");
    Ok(())
}

/// The imports step: this task runner's own `imports --check` on the
/// server and the client (no circle of files in either).
fn imports_check() -> Result<Command> {
    let me = env::current_exe()
        .map_err(|e| Exit::with(2, format!("cannot find the xtask binary itself: {e}")))?;
    let mut cmd = Command::new(me);
    cmd.args([
        "imports",
        "--check",
        "crates/latchkey-server",
        "crates/latchkey-client",
    ]);
    Ok(cmd)
}

/// The python step and the browser step name `--workspace`, as step 3 does,
/// not `-p latchkey`: with one package selected, cargo unifies the
/// dependencies' features differently and rebuilt the server and the CLI
/// (about 3 and 1.5 minutes of a CI run) for a test that runs in seconds.
///
/// The python step: the ignored test `python` of the latchkey package, with
/// LATCHKEY_PYTHON set to the python of a virtualenv kept next to the
/// target directory (outside the clone, reused by later runs like the
/// build), made and filled by [`setup::python_venv`] when the step starts.
fn python_step() -> Step {
    Step {
        name: "python",
        cmd: Some(cargo([
            "test",
            "--workspace",
            "--test",
            "python",
            "--",
            "--ignored",
            "--nocapture",
        ])),
        prepare: Some(Box::new(|cmd: &mut Command| {
            let target_dir = target_dir().ok_or_else(|| {
                Exit::with(
                    1,
                    "cannot tell the target directory, where the Python virtualenv goes \
                     (set CARGO_TARGET_DIR)",
                )
            })?;
            let python = setup::python_venv(&target_dir.join("python-venv"))?;
            cmd.env("LATCHKEY_PYTHON", python);
            require_postgres(cmd)
        })),
    }
}

/// The browser step: the ignored status-page test, in a headless Chromium
/// ([`setup::chromium`] finds it, or installs Debian's package, when the
/// step starts).
fn browser_step() -> Step {
    Step {
        name: "browser",
        cmd: Some(cargo([
            "test",
            "--workspace",
            "--test",
            "embedded_metrics",
            "--",
            "--ignored",
            "--nocapture",
        ])),
        prepare: Some(Box::new(|cmd: &mut Command| {
            let chromium = setup::chromium()?;
            cmd.env("LATCHKEY_CHROMIUM", chromium);
            Ok(())
        })),
    }
}

/// `display`, preceded by the environment variables set on `cmd` (`A=1 cargo ...`),
/// so that a failed step can be run again by hand.
fn display_with_env(cmd: &Command) -> String {
    let mut line = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            line.push_str(&format!(
                "{}={} ",
                key.to_string_lossy(),
                value.to_string_lossy()
            ));
        }
    }
    line.push_str(&display(cmd));
    line
}

/// Fail early and clearly when a rustup component is missing.
fn require_cargo_tool(subcommand: &str, component: &str) -> Result {
    let present = cargo([subcommand, "--version"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        Ok(())
    } else {
        Err(Exit::with(
            1,
            format!("`cargo {subcommand}` is not available; install it with: rustup component add {component}"),
        ))
    }
}

// ---------------------------------------------------------------- bench

const BENCH_PACKAGE: &str = "latchkey-bench";

fn cmd_bench(rest: &[OsString]) -> Result {
    let mut rest = rest;
    let workload = match rest.first().map(|a| a.to_str()) {
        Some(Some("-h" | "--help")) => {
            print!("{BENCH_HELP}");
            return Ok(());
        }
        Some(Some(w)) if BENCH_WORKLOADS.contains(&w) => {
            rest = &rest[1..];
            w
        }
        Some(Some(w)) if !w.starts_with('-') => {
            return Err(usage_error(
                BENCH_HELP,
                format!(
                    "bench: unknown workload `{w}`; choose one of: {}",
                    BENCH_WORKLOADS.join(", ")
                ),
            ));
        }
        Some(None) => {
            return Err(usage_error(
                BENCH_HELP,
                format!("bench: unknown workload `{}`", lossy(&rest[0])),
            ));
        }
        _ => BENCH_WORKLOADS[0],
    };
    // `bench kv -- --foo` and `bench kv --foo` mean the same.
    if rest.first().is_some_and(|a| a == "--") {
        rest = &rest[1..];
    }

    if !workspace_has_package(BENCH_PACKAGE) {
        return Err(Exit::with(
            2,
            format!("bench: benchmarks are not built yet (no `{BENCH_PACKAGE}` package in the workspace)"),
        ));
    }
    setup::ensure(setup::Mode::Quiet)?;
    // Every workload runs `latchkey serve` processes.
    run_build(bench_server_build())?;
    let server = built_server()?;
    let mut cmd = bench_cargo([
        "run",
        "-p",
        BENCH_PACKAGE,
        "--bin",
        BENCH_PACKAGE,
        "--",
        workload,
    ]);
    // First, so that a --server-bin in ARGS (parsed later) wins.
    cmd.arg("--server-bin").arg(server);
    cmd.args(rest);
    println!("xtask: {}", display(&cmd));
    run::run(&mut cmd)
}

/// Settings of every benchmark build, on top of the dev profile: the debug
/// assertions of openraft and of validit (whose `Valid` wrapper re-checks
/// openraft's state on every access when they are on) are off, as in an
/// application's release build. Measured on 2026-11-30 (three interleaved
/// rounds, docs/PERFORMANCE.md "Build and runtime"): every row 3-13 %
/// faster, put x1 1.03, get x32 1.13, lock cycle x32 1.11. Tests, the
/// soak and the demos keep the checks: an invariant openraft finds broken
/// stops the replica there. Both builds live side by side in the target
/// directory (the profile is part of each unit's identity), so switching
/// between `test` and `bench` rebuilds nothing the second time.
const BENCH_CONFIG: [&str; 2] = [
    "profile.dev.package.openraft.debug-assertions=false",
    "profile.dev.package.validit.debug-assertions=false",
];

/// The build of the server a benchmark runs.
fn bench_server_build() -> Command {
    bench_cargo(["build", "--workspace", "--bin", "latchkey"])
}

/// `cargo --config ... ARGS` with [`BENCH_CONFIG`].
fn bench_cargo<const N: usize>(args: [&str; N]) -> Command {
    let mut cmd = cargo(BENCH_CONFIG.iter().flat_map(|c| ["--config", c]));
    cmd.args(args);
    cmd
}

/// Build the `latchkey` binary (dev profile) and return its path.
fn build_server() -> Result<PathBuf> {
    build_bins(&["latchkey"])?;
    built_server()
}

/// The path of the `latchkey` binary a build just made; an error if the
/// build succeeded without it.
fn built_server() -> Result<PathBuf> {
    let server = server_path()?;
    if !server.is_file() {
        return Err(Exit::with(
            1,
            format!(
                "the server build succeeded but {} does not exist",
                server.display()
            ),
        ));
    }
    Ok(server)
}

/// Build the `latchkey` binary for a demo with the same package selection
/// as the demo's own `cargo run -p PACKAGE --example EXAMPLE`, and the
/// example with it, in one cargo call. Cargo unifies the dependencies'
/// features over the packages and targets it is asked for, so a
/// `--workspace` build of the server followed by `cargo run -p` compiled
/// every latchkey crate twice (55 s of a first `cargo xtask demo`); this
/// way the `cargo run` that follows only runs. The price: a later
/// `--workspace` build (`cargo xtask test`, `bench`, `soak`), or a demo
/// after one, builds the latchkey crates and a few dependencies (ring,
/// rustls, tonic) again, about 3 minutes here, never RocksDB.
fn build_demo_server(package: &str, example: &str) -> Result<PathBuf> {
    run_build(cargo([
        "build",
        "-p",
        package,
        "--bin",
        "latchkey",
        "--example",
        example,
    ]))?;
    built_server()
}

/// `cargo build --workspace --bin B ...`: `--workspace`, not `-p`, so the
/// dependencies' features unify as in `cargo test --workspace` and the
/// binaries the test step built are reused, not rebuilt.
fn build_bins(bins: &[&str]) -> Result {
    let mut build = cargo(["build", "--workspace"]);
    for bin in bins {
        build.arg("--bin").arg(bin);
    }
    run_build(build)
}

/// Print and run a `cargo build` command; its failure names the command.
fn run_build(mut build: Command) -> Result {
    println!("xtask: {}", display(&build));
    run::run(&mut build).map_err(|e| {
        Exit::with(
            e.code,
            format!("building failed (exit {}): {}", e.code, display(&build)),
        )
    })
}

/// Where the dev build of the `latchkey` binary goes.
fn server_path() -> Result<PathBuf> {
    bin_path("latchkey")
}

/// Where the dev build puts binary `name`.
fn bin_path(name: &str) -> Result<PathBuf> {
    let target_dir = target_dir()
        .ok_or_else(|| Exit::with(1, "cannot tell the target directory (set CARGO_TARGET_DIR)"))?;
    Ok(target_dir
        .join("debug")
        .join(format!("{name}{}", std::env::consts::EXE_SUFFIX)))
}

/// The workspace's target directory: CARGO_TARGET_DIR (relative to the
/// workspace root, where cargo runs), else `target_directory` from `cargo
/// metadata`, which also knows about `build.target-dir` in cargo's config.
fn target_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        return Some(run::workspace_root().join(dir));
    }
    let metadata = cargo_metadata()?;
    json_string_field(&metadata, "target_directory").map(PathBuf::from)
}

/// `cargo metadata --no-deps --format-version 1` (no resolution, no network),
/// its stdout if it succeeds.
fn cargo_metadata() -> Option<String> {
    let out = cargo(["metadata", "--no-deps", "--format-version", "1"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The string value of the first `"field":"..."` in compact JSON, unescaped.
fn json_string_field(json: &str, field: &str) -> Option<String> {
    let needle = format!("\"{field}\":\"");
    let start = json.find(&needle)? + needle.len();
    let mut out = String::new();
    let mut chars = json[start..].chars();
    loop {
        match chars.next()? {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
}

/// Whether the workspace has a package called `name`: asks `cargo metadata
/// --no-deps` (no resolution, no network); if that fails, looks at the
/// manifests under crates/.
fn workspace_has_package(name: &str) -> bool {
    if let Some(metadata) = cargo_metadata() {
        // Package objects start with name then version; dependency and
        // target objects do not have that pair.
        let needle = format!("\"name\":\"{name}\",\"version\":");
        return metadata.contains(&needle);
    }
    let needle = format!("name = \"{name}\"");
    fs::read_dir(run::workspace_root().join("crates"))
        .map(|entries| {
            entries.flatten().any(|e| {
                fs::read_to_string(e.path().join("Cargo.toml"))
                    .is_ok_and(|manifest| manifest.lines().any(|l| l.trim() == needle))
            })
        })
        .unwrap_or(false)
}

// ---------------------------------------------------------------- soak

const NEMESIS_PACKAGE: &str = "latchkey-nemesis";

/// The seed of the nemesis run inside `cargo xtask test`: fixed, so that CI
/// runs the same schedule every time (timing still varies).
const CI_SEED: &str = "20261121";

fn cmd_soak(rest: &[OsString]) -> Result {
    if rest.first().is_some_and(|a| is_help(a)) {
        print!("{SOAK_HELP}");
        return Ok(());
    }
    let mut args: Vec<OsString> = Vec::new();
    let mut duration = OsString::from("2m");
    let mut it = rest.iter();
    while let Some(arg) = it.next() {
        match arg.to_str() {
            Some(flag @ ("--minutes" | "--seconds")) => {
                let value = it
                    .next()
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u64>().ok())
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        usage_error(
                            SOAK_HELP,
                            format!("soak: {flag} needs a positive whole number"),
                        )
                    })?;
                let unit = if flag == "--minutes" { "m" } else { "s" };
                duration = OsString::from(format!("{value}{unit}"));
            }
            Some("--") => {}
            _ => args.push(arg.clone()),
        }
    }
    setup::ensure(setup::Mode::Quiet)?;
    build_bins(&[NEMESIS_PACKAGE])?;
    let mut cmd = nemesis_command(build_server()?, &duration, &args)?;
    println!("xtask: {}", display(&cmd));
    run::run(&mut cmd)
}

/// `latchkey-nemesis run --server-bin SERVER --duration D ARGS`, the
/// binary built before (by [`build_bins`], or the test's build step).
fn nemesis_command(server: PathBuf, duration: &OsString, args: &[OsString]) -> Result<Command> {
    let mut cmd = Command::new(bin_path(NEMESIS_PACKAGE)?);
    cmd.arg("run");
    cmd.arg("--server-bin").arg(server);
    cmd.arg("--duration").arg(duration);
    cmd.args(args);
    Ok(cmd)
}

/// The short nemesis run of `cargo xtask test`.
fn ci_nemesis() -> Result<Command> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let out = run::workspace_root()
        .join("soak-results")
        .join(format!("ci-{secs}-seed{CI_SEED}"));
    let args: Vec<OsString> = vec![
        "--seed".into(),
        CI_SEED.into(),
        "--nemesis".into(),
        "kill,pause,partition,disk".into(),
        // As a deployment runs: TLS between clients and replicas and
        // mutual TLS between the replicas.
        "--tls".into(),
        "--out".into(),
        out.into_os_string(),
    ];
    // Built by the step before this one.
    nemesis_command(server_path()?, &OsString::from("100s"), &args)
}

// ---------------------------------------------------------------- imports

fn cmd_imports(rest: &[OsString]) -> Result {
    let mut check = false;
    let mut dirs = Vec::new();
    for arg in rest {
        if is_help(arg) {
            print!("{IMPORTS_HELP}");
            return Ok(());
        } else if arg == "--check" {
            check = true;
        } else if arg.to_string_lossy().starts_with('-') {
            return Err(usage_error(
                IMPORTS_HELP,
                format!("imports: unknown option `{}`", lossy(arg)),
            ));
        } else {
            dirs.push(imports::crate_dir(std::path::Path::new(arg)));
        }
    }
    if dirs.is_empty() {
        dirs = imports::default_crate_dirs();
    }
    imports::run(&dirs, check)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_help_describes_every_workload() {
        for w in BENCH_WORKLOADS {
            assert!(
                BENCH_HELP.contains(&format!("\n    {w} ")),
                "BENCH_HELP lacks a line for `{w}`"
            );
        }
    }

    #[test]
    fn the_bench_server_is_built_without_openraft_checks() {
        let args: Vec<String> = bench_server_build()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        for package in ["openraft", "validit"] {
            let setting = format!("profile.dev.package.{package}.debug-assertions=false");
            let at = args.iter().position(|a| *a == setting);
            assert!(
                at.is_some_and(|i| i > 0 && args[i - 1] == "--config"),
                "the bench build lacks `--config {setting}`: {args:?}"
            );
        }
        let build = args.iter().position(|a| a == "build");
        assert!(
            build.is_some_and(|b| args[b..] == ["build", "--workspace", "--bin", "latchkey"]),
            "{args:?}"
        );
    }

    #[test]
    fn json_string_fields_are_found_and_unescaped() {
        let json = r#"{"packages":[],"target_directory":"/var/tmp/a \"b\"\\c\u00e9","version":1}"#;
        assert_eq!(
            json_string_field(json, "target_directory").as_deref(),
            Some("/var/tmp/a \"b\"\\c\u{e9}")
        );
        assert_eq!(json_string_field(json, "workspace_root"), None);
        assert_eq!(
            json_string_field(r#"{"target_directory":"/x"#, "target_directory"),
            None
        );
    }
}
