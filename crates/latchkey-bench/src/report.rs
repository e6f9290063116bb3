//! The results: a table on stdout, JSON files with what the machine was, and
//! an SVG chart of the same numbers.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::fsync::FsyncRate;
use crate::measure::RunResult;

/// What the numbers were measured on.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// Cores the benchmark may use (servers and clients share them).
    pub nproc: usize,
    pub cpu_model: Option<String>,
    pub kernel: Option<String>,
    /// File system of the data directory (from /proc/mounts).
    pub data_fs: Option<String>,
    pub git_commit: Option<String>,
    /// Uncommitted changes in the work tree when measured.
    pub git_dirty: Option<bool>,
    /// Whether the benchmark itself was built with debug assertions (the
    /// workspace's dev profile: optimised, with debug assertions).
    pub debug_assertions: bool,
}

impl Machine {
    pub fn read(data_dir: &Path) -> Machine {
        Machine {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_model: fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            }),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .ok()
                .map(|s| s.trim().to_string()),
            data_fs: filesystem_of(data_dir),
            git_commit: git(&["rev-parse", "HEAD"]),
            git_dirty: git(&["status", "--porcelain", "--untracked-files=no"])
                .map(|s| !s.is_empty()),
            debug_assertions: cfg!(debug_assertions),
        }
    }
}

/// `git ARGS` in the current directory, trimmed stdout; None if git fails.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The file-system type of the mount holding `path` (longest matching mount
/// point in /proc/mounts), e.g. "ext4", "xfs", "tmpfs".
pub fn filesystem_of(path: &Path) -> Option<String> {
    let path = fs::canonicalize(path).ok()?;
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    let mut best: Option<(usize, String)> = None;
    for line in mounts.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_dev), Some(mount), Some(fstype)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mount = mount.replace("\\040", " ");
        if path.starts_with(&mount) && best.as_ref().is_none_or(|(len, _)| mount.len() >= *len) {
            best = Some((mount.len(), fstype.to_string()));
        }
    }
    best.map(|(_, fs)| fs)
}

/// How put throughput compares with the disk's fsync rate.
#[derive(Debug, Clone, Serialize)]
pub struct GroupCommit {
    /// The client count compared (64 when measured, else the largest).
    pub clients: usize,
    pub put_ops_per_s: f64,
    pub fsync_per_s: f64,
    /// put/s ÷ fsync/s: above 1 means several writes share one fsync.
    pub ratio: f64,
}

impl GroupCommit {
    pub fn from_results(results: &[RunResult], fsync: &FsyncRate) -> Option<GroupCommit> {
        let puts = results.iter().filter(|r| r.workload == "put");
        let chosen = puts
            .clone()
            .find(|r| r.clients == 64)
            .or_else(|| puts.max_by_key(|r| r.clients))?;
        Some(GroupCommit {
            clients: chosen.clients,
            put_ops_per_s: chosen.ops_per_s,
            fsync_per_s: fsync.per_second,
            ratio: chosen.ops_per_s / fsync.per_second.max(1e-9),
        })
    }
}

/// How a benchmark was configured: what every workload has, and `W`, the
/// workload's own parameters (flattened into the same JSON object).
#[derive(Debug, Clone, Serialize)]
pub struct Config<W> {
    pub duration_s: f64,
    #[serde(flatten)]
    pub workload: W,
    pub client_mode: &'static str,
    /// The servers and clients talk TLS (`--tls`).
    pub tls: bool,
    /// The clients' writes are plain, not retry-safe (`--plain-writes`).
    pub plain_writes: bool,
    pub replicas: usize,
    pub server_bin: String,
    pub server_settings: &'static str,
    pub request_timeout_s: f64,
}

/// What a workload's parameters add to the report.
pub trait Params {
    /// For the table's title, e.g. "128-byte values".
    fn describe(&self) -> String;
    /// Lines printed under the table (may be empty).
    fn notes(&self, _results: &[RunResult]) -> String {
        String::new()
    }
}

/// The kv benchmark's own parameters.
#[derive(Debug, Clone, Serialize)]
pub struct KvParams {
    pub clients: Vec<usize>,
    pub value_size: usize,
}

impl Params for KvParams {
    fn describe(&self) -> String {
        format!("{}-byte values", self.value_size)
    }
}

/// Everything one benchmark run produced; written as JSON.
#[derive(Debug, Clone, Serialize)]
pub struct Report<W> {
    /// "kv" or "lock"; also the JSON files' prefix.
    pub benchmark: &'static str,
    pub schema_version: u32,
    pub unix_time: u64,
    pub config: Config<W>,
    pub machine: Machine,
    pub fsync: FsyncRate,
    pub results: Vec<RunResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_commit: Option<GroupCommit>,
    pub total_seconds: f64,
}

/// Microseconds as milliseconds with two decimals.
pub fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// The human-readable table.
pub fn table<W: Params>(report: &Report<W>) -> String {
    let mut t = String::new();
    let m = &report.machine;
    let c = &report.config;
    let _ = writeln!(
        t,
        "latchkey {} benchmark: {} replicas on loopback, {} cores, {}s per run, {}, {} client{}{}",
        report.benchmark,
        c.replicas,
        m.nproc,
        c.duration_s,
        c.workload.describe(),
        c.client_mode,
        if c.tls { ", TLS" } else { "" },
        if c.plain_writes { ", plain writes" } else { "" }
    );
    let _ = writeln!(
        t,
        "disk: {:.0} fsync/s ({} KiB write + fdatasync; p50 {} ms, p99 {} ms) on {}",
        report.fsync.per_second,
        report.fsync.block_bytes / 1024,
        ms(report.fsync.p50_us),
        ms(report.fsync.p99_us),
        m.data_fs.as_deref().unwrap_or("unknown fs"),
    );
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<10} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "WORKLOAD", "CLIENTS", "OPS/S", "P50 ms", "P99 ms", "P999 ms", "OPS", "ERRORS"
    );
    for r in &report.results {
        let _ = writeln!(
            t,
            "{:<10} {:>7} {:>10.0} {:>9} {:>9} {:>9} {:>9} {:>8}",
            r.workload,
            r.clients,
            r.ops_per_s,
            ms(r.latency_us.p50_us),
            ms(r.latency_us.p99_us),
            ms(r.latency_us.p999_us),
            r.ops,
            r.errors
        );
    }
    for r in report.results.iter().filter(|r| r.first_error.is_some()) {
        if let Some(e) = &r.first_error {
            let _ = writeln!(t, "first error ({} x{}): {e}", r.workload, r.clients);
        }
    }
    t.push_str(&c.workload.notes(&report.results));
    if let Some(g) = &report.group_commit {
        let _ = writeln!(t);
        let _ = writeln!(
            t,
            "group commit: put at {} clients {:.0}/s vs disk {:.0} fsync/s = {:.2}x{}",
            g.clients,
            g.put_ops_per_s,
            g.fsync_per_s,
            g.ratio,
            if g.ratio > 1.0 {
                " (above 1: writes share fsyncs)"
            } else {
                " (not above 1: each write may wait for its own fsync, or the CPU is the limit)"
            }
        );
    }
    t
}

/// Write `<out>/<benchmark>-<unix time>.json` and `.svg` (the chart, see
/// [`crate::chart`]), and the same two as `<out>/<benchmark>-latest.*`;
/// the stamped JSON's path and the latest chart's.
pub fn write_files<W: Params + Serialize>(
    report: &Report<W>,
    out: &Path,
) -> Result<(PathBuf, PathBuf), String> {
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let mut json = serde_json::to_string_pretty(report)
        .map_err(|e| format!("cannot encode the results as JSON: {e}"))?;
    json.push('\n');
    let svg = chart(report);
    let name = report.benchmark;
    let stamp = report.unix_time;
    for (ext, text) in [("json", &json), ("svg", &svg)] {
        for path in [
            out.join(format!("{name}-{stamp}.{ext}")),
            out.join(format!("{name}-latest.{ext}")),
        ] {
            fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        }
    }
    Ok((
        out.join(format!("{name}-{stamp}.json")),
        out.join(format!("{name}-latest.svg")),
    ))
}

/// Write `report` as `<out>/<name>.json` (pretty, for the one-number
/// benchmarks: elect, failover, churn), and say where on stderr.
pub fn write_json<T: Serialize>(report: &T, out: &Path, name: &str) -> Result<PathBuf, String> {
    fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let path = out.join(format!("{name}.json"));
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| format!("cannot encode the report: {e}"))?;
    fs::write(&path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("latchkey-bench: wrote {}", path.display());
    Ok(path)
}

/// The report's chart, titled with what was measured and on what.
pub fn chart<W: Params>(report: &Report<W>) -> String {
    let m = &report.machine;
    let c = &report.config;
    let title = format!(
        "latchkey {} benchmark: {} replicas on loopback, {} cores, {}s per run",
        report.benchmark, c.replicas, m.nproc, c.duration_s
    );
    let commit = m
        .git_commit
        .as_deref()
        .map(|h| {
            let modified = if m.git_dirty == Some(true) {
                " (modified)"
            } else {
                ""
            };
            format!("; commit {}{modified}", h.get(..10).unwrap_or(h))
        })
        .unwrap_or_default();
    let subtitle = format!(
        "{}, {} client; disk {:.0} fsync/s{commit}",
        c.workload.describe(),
        c.client_mode,
        report.fsync.per_second
    );
    crate::chart::svg(&title, &subtitle, &report.results)
}

/// Print the table and write the JSON files and the chart.
pub fn publish<W: Params + Serialize>(report: &Report<W>, out: &Path) -> Result<(), String> {
    print!("{}", table(report));
    let (stamped, chart) = write_files(report, out)?;
    println!(
        "\nresults: {} (and {}-latest.json); chart: {}",
        stamped.display(),
        report.benchmark,
        chart.display()
    );
    Ok(())
}
