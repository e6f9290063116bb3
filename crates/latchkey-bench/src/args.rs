//! Command-line parsing (std only): `latchkey-bench <WORKLOAD> [OPTIONS]`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use latchkey::core::limits::MAX_VALUE_LEN;

pub const USAGE: &str = "\
latchkey-bench: benchmarks of a real three-replica latchkey cluster on loopback

USAGE:
    latchkey-bench kv   [OPTIONS]    puts, then linearizable gets, per client count
    latchkey-bench lock [OPTIONS]    lock-cycle (acquire + release of a lock of one's
                                     own) per client count, then contended (every
                                     task on one lock)
    latchkey-bench all  [OPTIONS]    kv, then lock (each on a fresh cluster)
    latchkey-bench failover [OPTIONS]
                                     under a write load, SIGKILL the leader --kills
                                     times: time to the first acknowledged write,
                                     and elections (spurious ones counted apart)
    latchkey-bench rolling [OPTIONS] under a put and lock load, SIGTERM and restart
                                     each replica in turn (the leader last),
                                     --rounds times (default 3): the longest
                                     call, failed calls, lost writes
    latchkey-bench churn [OPTIONS]   a dead holder's lock, while the leader is SIGKILLed
                                     --kills times, --lead after each takes over:
                                     time until the next waiter holds it
    latchkey-bench elect [OPTIONS]   election hand-over: a leader (a `latchkey elect`
                                     process, TTL --ttl) is SIGKILLed while a
                                     candidate waits; time until it leads, --rounds
                                     times (default 10)
    latchkey-bench watch [OPTIONS]   puts (x64, or the first --clients value) with
                                     and without --watchers watchers on the
                                     prefix (interleaved), the delay from a
                                     put's acknowledgement to each watcher; then
                                     one writer and one watcher
    cargo xtask bench [kv|lock|all|failover|rolling|churn|elect|watch] [OPTIONS]
                                     the usual way: builds the server first

OPTIONS:
    --duration D       how long each (workload, clients) run lasts (default 5s;
                       units ms, s or m; at most 10m)
    --clients LIST     concurrent client tasks, comma-separated, each 1..=1024:
                       kv's put and get runs (default 1,8,64), lock's
                       lock-cycle runs (default 1,32), and watch's writers
                       (the first value; default 64)
    --contended LIST   client tasks of lock's contended runs (default 32)
    --value-size N     bytes per kv value (default 128; at most 1 MiB)
    --out DIR          where the JSON results and SVG charts go (default
                       bench-results)
    --server-bin PATH  the `latchkey` binary to run (default: `latchkey` next to
                       this binary; `cargo xtask bench` passes it)
    --client-mode M    shared (default): every task clones one Client, so all
                       requests multiplex over one HTTP/2 connection per replica;
                       per-task: each task builds its own Client (own connections)
    --tmp-dir DIR      parent of the temporary data directory (default: $TMPDIR
                       or /tmp); put it on the disk you want to measure
    --transport T      stream (default: each client's requests share one
                       Pipeline.Calls stream per replica) or unary (every
                       request its own unary RPC, as a Python or Go client sends)
    --aged             lock: first age the cluster (--age-keys keys written,
                       --age-sessions sessions opened and closed), the
                       long-lived row to compare with a fresh cluster
    --age-keys N       keys --aged writes (default 1000000)
    --age-sessions N   sessions --aged opens and closes (default 100000)
    --kills N          failover and churn: leaders killed (default 10)
    --ttl D            churn and elect: the dead holder's or leader's session
                       TTL (default 5s)
    --lead D           churn: how long each leader leads before it is killed
                       (default 1s)
    --rounds N         churn, elect and rolling: rounds, each with a holder or
                       leader of its own, or a restart of every replica
                       (default 3 for churn and rolling, 10 for elect)
    --settle D         failover: quiet load before and after each kill, in which
                       any election is spurious; rolling: load before and after
                       each round (default 5s)
    --writers N        failover and rolling: writer tasks of the load (default 8)
    --watchers N       watch: watchers on the prefix (default 1000)
    --serve-arg ARG    one more argument for every `latchkey serve` (repeat it;
                       e.g. --serve-arg=--election-timeout=500ms for an A/B)
    --plain-writes     send writes plain, not retry-safe (the client opens no
                       session for them): the other side of an A/B of what
                       retry-safe writes cost
    --tls              run the servers with TLS (certificates from `latchkey
                       certs`; mutual TLS between them) and the clients over TLS
    -h, --help         print this text

Every lock task has its own session (ttl 10s). Exit codes: 0 done, 1 the
benchmark could not run (servers did not start, ...), 2 bad usage,
130 interrupted. Results are measurements, never a pass/fail verdict; a lock
safety violation is reported loudly but does not change the exit code.
";

/// Which benchmark to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    Kv,
    Lock,
    All,
    Failover,
    Rolling,
    Churn,
    Elect,
    Watch,
}

/// How client tasks get their `Client`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientMode {
    /// One `Client`, cloned into every task (clones share connections).
    Shared,
    /// One `Client` per task, each with its own connections.
    PerTask,
}

impl ClientMode {
    pub fn name(self) -> &'static str {
        match self {
            ClientMode::Shared => "shared",
            ClientMode::PerTask => "per-task",
        }
    }
}

/// Client counts of kv's runs when --clients is not given.
pub const KV_CLIENTS: &[usize] = &[1, 8, 64];
/// Writers of the watch benchmark when --clients is not given.
const WATCH_WRITERS: usize = 64;
/// Client counts of lock-cycle's runs when --clients is not given.
pub const LOCK_CYCLE_CLIENTS: &[usize] = &[1, 32];
/// Client counts of contended's runs when --contended is not given.
pub const CONTENDED_CLIENTS: &[usize] = &[32];

/// Options of every benchmark.
#[derive(Debug, Clone)]
pub struct Options {
    pub duration: Duration,
    /// --clients: kv's and lock-cycle's counts (None: each its default).
    pub clients: Option<Vec<usize>>,
    /// --contended: contended's counts (None: the default).
    pub contended: Option<Vec<usize>>,
    pub value_size: usize,
    pub out: PathBuf,
    pub server_bin: Option<PathBuf>,
    pub client_mode: ClientMode,
    pub tmp_dir: Option<PathBuf>,
    pub unary: bool,
    /// --tls: servers and clients over TLS.
    pub tls: bool,
    /// --plain-writes: the clients' writes are not retry-safe.
    pub plain_writes: bool,
    /// --kills: failover's leader kills.
    pub kills: usize,
    /// --settle: failover's quiet load around each kill.
    pub settle: Duration,
    /// --writers: failover's writer tasks.
    pub failover_writers: usize,
    /// --watchers: the watch benchmark's watchers.
    pub watchers: usize,
    /// --ttl: the dead holder's TTL (churn), the dead leader's (elect).
    pub ttl: Duration,
    /// --lead: how long churn lets each leader lead.
    pub churn_lead: Duration,
    /// --rounds: churn's and elect's rounds (each has its default).
    pub rounds: Option<usize>,
    /// --serve-arg: extra arguments of every `latchkey serve`.
    pub serve_args: Vec<String>,
    /// --aged: lock ages the cluster first.
    pub aged: bool,
    /// --age-keys, --age-sessions: how much.
    pub age_keys: u64,
    pub age_sessions: u64,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            duration: Duration::from_secs(5),
            clients: None,
            contended: None,
            value_size: 128,
            out: PathBuf::from("bench-results"),
            server_bin: None,
            client_mode: ClientMode::Shared,
            tmp_dir: None,
            unary: false,
            tls: false,
            plain_writes: false,
            kills: 10,
            settle: Duration::from_secs(5),
            failover_writers: 8,
            watchers: 1_000,
            ttl: Duration::from_secs(5),
            churn_lead: Duration::from_secs(1),
            rounds: None,
            serve_args: Vec::new(),
            aged: false,
            age_keys: 1_000_000,
            age_sessions: 100_000,
        }
    }
}

impl Options {
    /// Client counts of kv's put and get runs.
    pub fn kv_clients(&self) -> Vec<usize> {
        self.clients.clone().unwrap_or_else(|| KV_CLIENTS.to_vec())
    }

    /// Client counts of lock-cycle's runs.
    pub fn lock_cycle_clients(&self) -> Vec<usize> {
        self.clients
            .clone()
            .unwrap_or_else(|| LOCK_CYCLE_CLIENTS.to_vec())
    }

    /// Writer tasks of the watch benchmark's put runs.
    pub fn watch_writers(&self) -> usize {
        self.clients
            .as_ref()
            .and_then(|c| c.first().copied())
            .unwrap_or(WATCH_WRITERS)
    }

    /// Client counts of contended's runs.
    pub fn contended_clients(&self) -> Vec<usize> {
        self.contended
            .clone()
            .unwrap_or_else(|| CONTENDED_CLIENTS.to_vec())
    }
}

/// What the command line asks for.
#[derive(Debug)]
pub enum Parsed {
    Help,
    Run(Workload, Box<Options>),
}

const MAX_DURATION: Duration = Duration::from_secs(600);
const MAX_CLIENTS: usize = 1024;

/// Parse the arguments after the program name.
pub fn parse(args: &[OsString]) -> Result<Parsed, String> {
    let mut strings = Vec::with_capacity(args.len());
    for a in args {
        match a.to_str() {
            Some(s) => strings.push(s.to_string()),
            None => return Err(format!("argument {a:?} is not valid UTF-8")),
        }
    }
    let Some((first, rest)) = strings.split_first() else {
        return Err(
            "missing workload: kv, lock, all, failover, rolling, churn, elect or watch".into(),
        );
    };
    let workload = match first.as_str() {
        "-h" | "--help" | "help" => return Ok(Parsed::Help),
        "kv" => Workload::Kv,
        "lock" => Workload::Lock,
        "all" => Workload::All,
        "failover" => Workload::Failover,
        "rolling" => Workload::Rolling,
        "churn" => Workload::Churn,
        "elect" => Workload::Elect,
        "watch" => Workload::Watch,
        other => {
            return Err(format!(
                "unknown workload `{other}`: choose kv, lock, all, failover, rolling, churn, elect or watch"
            ))
        }
    };

    let mut opts = Options::default();
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        if arg == "--" {
            continue;
        }
        if arg == "--tls" {
            opts.tls = true;
            continue;
        }
        if arg == "--aged" {
            opts.aged = true;
            continue;
        }
        if arg == "--plain-writes" {
            opts.plain_writes = true;
            continue;
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        if !flag.starts_with("--") {
            return Err(format!("unexpected argument `{arg}`"));
        }
        let known = [
            "--duration",
            "--clients",
            "--contended",
            "--value-size",
            "--out",
            "--server-bin",
            "--client-mode",
            "--tmp-dir",
            "--transport",
            "--kills",
            "--settle",
            "--writers",
            "--watchers",
            "--ttl",
            "--lead",
            "--rounds",
            "--serve-arg",
            "--age-keys",
            "--age-sessions",
        ];
        if !known.contains(&flag) {
            return Err(format!("unknown option `{flag}`"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let Some(v) = rest.get(i) else {
                    return Err(format!("option {flag} needs a value"));
                };
                i += 1;
                v.clone()
            }
        };
        match flag {
            "--duration" => opts.duration = parse_duration(&value)?,
            "--clients" => opts.clients = Some(parse_clients(flag, &value)?),
            "--contended" => opts.contended = Some(parse_clients(flag, &value)?),
            "--value-size" => opts.value_size = parse_value_size(&value)?,
            "--out" => opts.out = non_empty_path(flag, &value)?,
            "--server-bin" => opts.server_bin = Some(non_empty_path(flag, &value)?),
            "--tmp-dir" => opts.tmp_dir = Some(non_empty_path(flag, &value)?),
            "--kills" => opts.kills = parse_count(flag, &value, 1000)?,
            "--settle" => opts.settle = parse_duration(&value)?,
            "--writers" => opts.failover_writers = parse_count(flag, &value, 1024)?,
            "--watchers" => opts.watchers = parse_count(flag, &value, 10_000)?,
            "--ttl" => opts.ttl = parse_duration(&value)?,
            "--lead" => opts.churn_lead = parse_duration(&value)?,
            "--rounds" => opts.rounds = Some(parse_count(flag, &value, 100)?),
            "--serve-arg" => opts.serve_args.push(value),
            "--age-keys" => opts.age_keys = parse_count(flag, &value, 100_000_000)? as u64,
            "--age-sessions" => opts.age_sessions = parse_count(flag, &value, 10_000_000)? as u64,
            "--transport" => {
                opts.unary = match value.as_str() {
                    "stream" => false,
                    "unary" => true,
                    other => {
                        return Err(format!("--transport: `{other}` is not `stream` or `unary`"))
                    }
                }
            }
            "--client-mode" => {
                opts.client_mode = match value.as_str() {
                    "shared" => ClientMode::Shared,
                    "per-task" | "own" => ClientMode::PerTask,
                    other => {
                        return Err(format!(
                            "--client-mode: `{other}` is neither `shared` nor `per-task`"
                        ))
                    }
                }
            }
            _ => return Err(format!("unknown option `{flag}`")),
        }
    }
    Ok(Parsed::Run(workload, Box::new(opts)))
}

/// A count in `1..=max`.
fn parse_count(flag: &str, value: &str, max: usize) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!(
            "{flag}: `{value}` is not a whole number from 1 to {max}"
        )),
    }
}

fn non_empty_path(flag: &str, value: &str) -> Result<PathBuf, String> {
    if value.trim().is_empty() {
        Err(format!("{flag} needs a non-empty path"))
    } else {
        Ok(PathBuf::from(value))
    }
}

/// `500ms`, `3s`, `2.5s`, `1m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || format!("--duration: `{s}` is not a duration like 500ms, 5s or 1m");
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("--duration: `{s}` needs a unit: ms, s or m (e.g. 5s)"))?;
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| bad())?;
    let scale = match unit {
        "ms" => 0.001,
        "s" => 1.0,
        "m" => 60.0,
        _ => {
            return Err(format!(
                "--duration: unknown unit `{unit}` in `{s}`: use ms, s or m"
            ))
        }
    };
    let secs = n * scale;
    if !secs.is_finite() || secs < 0.1 {
        return Err(format!("--duration: `{s}` is too short (at least 100ms)"));
    }
    let d = Duration::from_secs_f64(secs);
    if d > MAX_DURATION {
        return Err(format!("--duration: `{s}` is too long (at most 10m)"));
    }
    Ok(d)
}

/// `1,8,64`, for the option `flag`.
pub fn parse_clients(flag: &str, s: &str) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let n: usize = part
            .parse()
            .map_err(|_| format!("{flag}: `{part}` is not a number"))?;
        if n == 0 || n > MAX_CLIENTS {
            return Err(format!("{flag}: {n} is out of range 1..={MAX_CLIENTS}"));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{flag}: give at least one client count, e.g. 1,8,64"
        ));
    }
    Ok(out)
}

fn parse_value_size(s: &str) -> Result<usize, String> {
    let n: usize = s
        .trim()
        .parse()
        .map_err(|_| format!("--value-size: `{s}` is not a number of bytes"))?;
    if n > MAX_VALUE_LEN {
        return Err(format!(
            "--value-size: {n} is above the largest value latchkey accepts ({MAX_VALUE_LEN} bytes)"
        ));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

    #[test]
    fn defaults_and_overrides() {
        let Ok(Parsed::Run(Workload::Kv, o)) = parse(&args(&["kv"])) else {
            panic!("kv should parse");
        };
        assert_eq!(o.kv_clients(), vec![1, 8, 64]);
        assert_eq!(o.lock_cycle_clients(), vec![1, 32]);
        assert_eq!(o.contended_clients(), vec![32]);
        assert_eq!(o.duration, Duration::from_secs(5));
        let parsed = parse(&args(&[
            "kv",
            "--duration=3s",
            "--clients",
            "2, 4,4",
            "--value-size",
            "16",
            "--client-mode",
            "per-task",
            "--server-bin",
            "/a",
            "--server-bin",
            "/b",
        ]));
        let Ok(Parsed::Run(_, o)) = parsed else {
            panic!("should parse: {parsed:?}");
        };
        assert_eq!(o.duration, Duration::from_secs(3));
        assert_eq!(o.kv_clients(), vec![2, 4]);
        assert_eq!(o.lock_cycle_clients(), vec![2, 4]);
        assert_eq!(o.contended_clients(), vec![32]);
        assert_eq!(o.value_size, 16);
        assert_eq!(o.client_mode, ClientMode::PerTask);
        assert_eq!(o.server_bin, Some(PathBuf::from("/b")));
    }

    #[test]
    fn lock_options() {
        let parsed = parse(&args(&["lock", "--contended=4,16", "--duration", "1s"]));
        let Ok(Parsed::Run(Workload::Lock, o)) = parsed else {
            panic!("lock should parse: {parsed:?}");
        };
        assert_eq!(o.lock_cycle_clients(), vec![1, 32]);
        assert_eq!(o.contended_clients(), vec![4, 16]);
        assert!(!o.aged);
        let parsed = parse(&args(&[
            "lock",
            "--aged",
            "--age-keys=10",
            "--age-sessions",
            "5",
        ]));
        let Ok(Parsed::Run(Workload::Lock, o)) = parsed else {
            panic!("lock --aged should parse: {parsed:?}");
        };
        assert!(o.aged);
        assert_eq!((o.age_keys, o.age_sessions), (10, 5));
        assert!(matches!(
            parse(&args(&["all"])),
            Ok(Parsed::Run(Workload::All, _))
        ));
    }

    #[test]
    fn failover_options() {
        let parsed = parse(&args(&[
            "failover",
            "--kills",
            "3",
            "--settle=2s",
            "--writers",
            "2",
            "--serve-arg=--heartbeat=100ms",
            "--serve-arg",
            "--election-timeout=500ms",
        ]));
        let Ok(Parsed::Run(Workload::Failover, o)) = parsed else {
            panic!("failover should parse: {parsed:?}");
        };
        assert_eq!((o.kills, o.failover_writers), (3, 2));
        assert_eq!(o.settle, Duration::from_secs(2));
        assert_eq!(
            o.serve_args,
            vec!["--heartbeat=100ms", "--election-timeout=500ms"]
        );
        for bad in [
            &["failover", "--kills", "0"][..],
            &["failover", "--writers", "x"],
            &["failover", "--settle", "1"],
            &["failover", "--serve-arg"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            &["nope"][..],
            &["kv", "--duration", "5"],
            &["kv", "--duration", "0s"],
            &["kv", "--duration", "11m"],
            &["kv", "--clients", "0"],
            &["kv", "--clients", ""],
            &["kv", "--clients", "a"],
            &["lock", "--contended", "0"],
            &["lock", "--contended"],
            &["kv", "--value-size", "-1"],
            &["kv", "--value-size", "99999999"],
            &["kv", "--what"],
            &["kv", "--out"],
            &["kv", "stray"],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2.5s"), Ok(Duration::from_millis(2500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    }
}
