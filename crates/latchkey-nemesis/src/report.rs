//! The report folder of a run:
//!
//! - `summary.md`: the verdicts (with witnesses), operation counts, the
//!   faults carried out (for disk faults: what the replica did, and each
//!   repair with its start, end and outcome), how to replay the run;
//! - `verdicts.json`: the verdicts, machine-readable;
//! - `history.jsonl`: the merged history the checkers read (re-check it
//!   with `latchkey-nemesis check <folder>`);
//! - `nemesis.jsonl`, `leaders.jsonl`: fault windows (disk faults and
//!   repairs with a `detail`) and leader samples;
//! - `timeline.svg`: faults, leader, lock holders with their tokens, and
//!   refused stale writes on one time axis;
//! - `schedule.txt`, `logs/` (replicas), `workers/` (per-process histories
//!   and logs).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use latchkey_check::abandoned::{self, Measure};
use latchkey_check::history::{
    DurabilityOp, ElectionOp, LockOp, RegisterOp, SemaphoreOp, SequenceOp, WatchOp,
};
use latchkey_check::{History, Op, Outcome, Status, Verdict};
use serde::{Deserialize, Serialize};

use crate::churn::{PhaseTimes, CHURN_KILL};
use crate::error::{Error, Result};
use crate::nemesis::{FaultWindow, Kind};
use crate::timeline;

/// Which replica led at one moment, as the harness saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderSample {
    /// CLOCK_MONOTONIC, ns.
    pub time_ns: u64,
    /// The leader's id (1-3), if one answered as leader.
    pub leader: Option<u64>,
    /// Its term.
    pub term: Option<u64>,
}

/// Facts about the run for the summary.
#[derive(Debug, Clone)]
pub struct RunInfo {
    pub seed: u64,
    pub replay: String,
    pub network: String,
    pub kinds: Vec<Kind>,
    pub planned: usize,
    pub schedule: String,
    pub start_ns: u64,
    pub fault_end_ns: u64,
    pub end_ns: u64,
    /// When the leader-churn phase ran, if it did.
    pub churn: Option<PhaseTimes>,
    /// Why the run stopped early, if it did.
    pub failure: Option<String>,
    pub notes: Vec<String>,
}

/// `run.json`: when the run's phases were (CLOCK_MONOTONIC, ns), for
/// redrawing its timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTimes {
    pub seed: u64,
    pub start_ns: u64,
    pub fault_end_ns: u64,
    pub end_ns: u64,
    /// When the leader-churn phase began (0: none, or a run of an older
    /// build).
    #[serde(default)]
    pub churn_start_ns: u64,
}

/// Draws the timeline of a report folder between `from` and `to` (seconds
/// since the start of the run; `to` defaults to the end) into `out`.
pub fn redraw(folder: &Path, from: f64, to: Option<f64>, out: &Path) -> Result<()> {
    let read = |name: &str| {
        let p = folder.join(name);
        std::fs::read_to_string(&p).map_err(Error::io(format!("read {}", p.display())))
    };
    let history = History::from_json_lines(&read("history.jsonl")?)
        .map_err(|e| Error::History(e.to_string()))?;
    let parse_lines = |text: String, name: &str| -> Result<Vec<serde_json::Value>> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).map_err(|e| Error::History(format!("{name}: {e}"))))
            .collect()
    };
    let faults: Vec<FaultWindow> = parse_lines(read("nemesis.jsonl")?, "nemesis.jsonl")?
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    let leaders: Vec<LeaderSample> = parse_lines(read("leaders.jsonl")?, "leaders.jsonl")?
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect();
    let last_event = history.events().last().map_or(0, |e| e.time_ns);
    // Runs of older builds have no run.json: start at the first sample.
    let times = match read("run.json")
        .ok()
        .and_then(|t| serde_json::from_str::<RunTimes>(&t).ok())
    {
        Some(t) => t,
        None => RunTimes {
            seed: 0,
            start_ns: leaders.first().map_or(0, |s| s.time_ns),
            fault_end_ns: 0,
            end_ns: last_event,
            churn_start_ns: 0,
        },
    };
    let at = |s: f64| times.start_ns.saturating_add((s.max(0.0) * 1e9) as u64);
    let t0 = at(from);
    let t1 = to
        .map_or(times.end_ns, at)
        .min(times.end_ns.max(last_event));
    if t1 <= t0 {
        return Err(Error::Usage(format!(
            "the window {from} s .. {to:?} s is empty (the run lasted {:.0} s)",
            (times.end_ns.saturating_sub(times.start_ns)) as f64 / 1e9
        )));
    }
    let mut markers = Vec::new();
    if times.fault_end_ns > 0 {
        markers.push((times.fault_end_ns, "faults end, all healed".to_owned()));
    }
    if times.churn_start_ns > 0 {
        markers.push((times.churn_start_ns, CHURN_MARKER.to_owned()));
    }
    let svg = timeline::render(
        &history,
        &faults,
        &leaders,
        &markers,
        times.start_ns,
        t0,
        t1,
    );
    std::fs::write(out, svg).map_err(Error::io(format!("write {}", out.display())))
}

/// The timeline's label where the leader-churn phase begins.
const CHURN_MARKER: &str = "leader churn: a dead holder's lock";

/// Counts of what the workloads did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// (workload/type, outcome) -> operations.
    pub ops: BTreeMap<String, BTreeMap<String, u64>>,
    pub grants: u64,
    pub gate_accepted: u64,
    pub gate_refused: u64,
    pub kv_accepted: u64,
    pub kv_refused: u64,
    pub permits: u64,
    pub permit_accepted: u64,
    pub permit_refused: u64,
    /// Leaders election observers were told of.
    pub observed: u64,
    pub acked_puts: u64,
    pub read_back: Option<u64>,
}

/// Counts a history's operations.
pub fn count(history: &History) -> Counts {
    let observed = history
        .instants()
        .iter()
        .filter(|e| {
            matches!(
                &e.op,
                Op::Election(ElectionOp::Observed { term: Some(_), .. })
            )
        })
        .count() as u64;
    let mut c = Counts {
        observed,
        ..Counts::default()
    };
    for op in history.operations() {
        let outcome = match op.outcome() {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Unknown => "unknown",
        };
        let name = match op.op() {
            Op::Register(RegisterOp::Read { .. }) => "register/read",
            Op::Register(RegisterOp::Write { .. }) => "register/write",
            Op::Register(RegisterOp::Cas { .. }) => "register/cas",
            Op::Lock(LockOp::Acquire { .. }) => "lock/acquire",
            Op::Lock(LockOp::FencedWrite { target, .. }) => match target {
                latchkey_check::history::FenceTarget::Gate => "lock/gate-write",
                latchkey_check::history::FenceTarget::Kv { .. } => "lock/kv-write",
            },
            Op::Lock(LockOp::HoldStart { .. } | LockOp::HoldEnd { .. }) => continue,
            Op::Sequence(SequenceOp::Alloc { .. }) => "sequence/alloc",
            Op::Durability(DurabilityOp::Put { .. }) => "durability/put",
            Op::Durability(DurabilityOp::ReadAll { .. }) => "durability/read-all",
            Op::Watch(WatchOp::Write { .. }) => "watch/write",
            Op::Watch(WatchOp::List { .. }) => "watch/list",
            Op::Watch(WatchOp::Gone { .. }) => "watch/gone-after-close",
            Op::Watch(WatchOp::Leftover { .. }) => "watch/leftover-bound-keys",
            Op::Watch(_) => continue,
            Op::Semaphore(SemaphoreOp::Acquire { .. }) => "semaphore/acquire",
            Op::Semaphore(SemaphoreOp::FencedWrite { .. }) => "semaphore/fenced-write",
            Op::Election(_) => continue,
            Op::Churn(_) => "churn/acquire",
        };
        *c.ops
            .entry(name.to_owned())
            .or_default()
            .entry(outcome.to_owned())
            .or_default() += 1;
        if op.outcome() != Outcome::Ok {
            continue;
        }
        match op.op() {
            Op::Lock(LockOp::Acquire { token: Some(_), .. }) => c.grants += 1,
            Op::Lock(LockOp::FencedWrite {
                target, accepted, ..
            }) => {
                let gate = matches!(target, latchkey_check::history::FenceTarget::Gate);
                match (gate, accepted) {
                    (true, Some(true)) => c.gate_accepted += 1,
                    (true, Some(false)) => c.gate_refused += 1,
                    (false, Some(true)) => c.kv_accepted += 1,
                    (false, Some(false)) => c.kv_refused += 1,
                    _ => {}
                }
            }
            Op::Semaphore(SemaphoreOp::Acquire { token: Some(_), .. }) => c.permits += 1,
            Op::Semaphore(SemaphoreOp::FencedWrite { accepted, .. }) => match accepted {
                Some(true) => c.permit_accepted += 1,
                Some(false) => c.permit_refused += 1,
                None => {}
            },
            Op::Durability(DurabilityOp::Put { .. }) => c.acked_puts += 1,
            Op::Durability(DurabilityOp::ReadAll { values: Some(v) }) => {
                c.read_back = Some(v.len() as u64)
            }
            _ => {}
        }
    }
    c
}

/// Why a run that broke no rule still did not show anything: a workload
/// that never succeeded proves nothing.
pub fn activity_problems(c: &Counts) -> Vec<String> {
    let ok = |name: &str| {
        c.ops
            .get(name)
            .and_then(|m| m.get("ok"))
            .copied()
            .unwrap_or(0)
    };
    let mut problems = Vec::new();
    if c.grants == 0 {
        problems.push("no lock was ever granted".to_owned());
    }
    if c.gate_accepted == 0 || c.kv_accepted == 0 {
        problems.push("no fenced write was ever accepted".to_owned());
    }
    if c.permits == 0 || c.permit_accepted == 0 {
        problems.push("the semaphore workload never wrote with a permit".to_owned());
    }
    if c.observed == 0 {
        problems.push("no election observer was ever told of a leader".to_owned());
    }
    if ok("register/read") == 0 || ok("register/write") + ok("register/cas") == 0 {
        problems.push("the register workload never completed a read and a write".to_owned());
    }
    if ok("sequence/alloc") == 0 {
        problems.push("no sequence number was ever allocated".to_owned());
    }
    if c.acked_puts == 0 {
        problems.push("no durability put was ever acknowledged".to_owned());
    }
    if c.read_back.is_none() {
        problems.push("the read-back after the full restart did not happen".to_owned());
    }
    problems
}

/// Checks the history, writes the report folder, prints the summary.
/// `Ok(true)` when every verdict passed and every workload made progress.
pub fn write(
    out: &Path,
    info: &RunInfo,
    history: &History,
    windows: &[FaultWindow],
    leaders: &[LeaderSample],
) -> Result<bool> {
    let save = |name: &str, text: &str| {
        std::fs::write(out.join(name), text).map_err(Error::io(format!("write {name}")))
    };
    // The raw material first: if a checker fails to finish, it is kept.
    save("history.jsonl", &history.to_json_lines())?;
    save("nemesis.jsonl", &json_lines(windows))?;
    save("leaders.jsonl", &json_lines(leaders))?;
    let run = RunTimes {
        seed: info.seed,
        start_ns: info.start_ns,
        fault_end_ns: info.fault_end_ns,
        end_ns: info.end_ns,
        churn_start_ns: info.churn.map_or(0, |c| c.start_ns),
    };
    save("run.json", &serde_json::to_string(&run).unwrap_or_default())?;

    let verdicts = timed_checks(history);
    let counts = count(history);
    let problems = activity_problems(&counts);
    let passed = info.failure.is_none()
        && problems.is_empty()
        && verdicts.iter().all(|v| v.status == Status::Pass);
    let verdicts_json = serde_json::to_string_pretty(&verdicts)
        .map_err(|e| Error::History(format!("encode the verdicts: {e}")))?;
    save("verdicts.json", &verdicts_json)?;
    let mut markers = vec![(info.fault_end_ns, "faults end, all healed".to_owned())];
    if let Some(c) = info.churn {
        markers.push((c.start_ns, CHURN_MARKER.to_owned()));
    }
    save(
        "timeline.svg",
        &timeline::render(
            history,
            windows,
            leaders,
            &markers,
            info.start_ns,
            info.start_ns,
            info.end_ns,
        ),
    )?;
    let churn = abandoned::measure(history);
    let summary = summary(info, &verdicts, &counts, &problems, windows, &churn, passed);
    save("summary.md", &summary)?;
    eprintln!("{summary}");
    eprintln!("nemesis: report in {}", out.display());
    Ok(passed)
}

/// Runs every checker, printing how long each took.
fn timed_checks(history: &History) -> Vec<Verdict> {
    latchkey_check::CHECKERS
        .iter()
        .map(|(name, check)| {
            let started = std::time::Instant::now();
            let v = check(history);
            eprintln!(
                "nemesis: checked {name} in {:.1} s: {:?}",
                started.elapsed().as_secs_f64(),
                v.status
            );
            v
        })
        .collect()
}

fn json_lines<T: Serialize>(items: &[T]) -> String {
    let mut s = String::new();
    for i in items {
        if let Ok(line) = serde_json::to_string(i) {
            s.push_str(&line);
            s.push('\n');
        }
    }
    s
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// The summary in Markdown.
pub fn summary(
    info: &RunInfo,
    verdicts: &[Verdict],
    c: &Counts,
    problems: &[String],
    windows: &[FaultWindow],
    churn: &std::result::Result<Measure, String>,
    passed: bool,
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# latchkey nemesis run: {}\n",
        if passed { "PASS" } else { "FAIL" }
    );
    let kinds: Vec<String> = info
        .kinds
        .iter()
        .map(|k| format!("{k:?}").to_lowercase())
        .collect();
    let _ = writeln!(s, "- seed: `{}`; replay: `{}`", info.seed, info.replay);
    let _ = writeln!(
        s,
        "- hosts: {}; faults: {}; {} planned, {} fault windows carried out",
        info.network,
        kinds.join(", "),
        info.planned,
        windows.len()
    );
    let _ = writeln!(
        s,
        "- fault phase {:.1} s; clients, then the leader churn, ran {:.1} s",
        secs(info.fault_end_ns.saturating_sub(info.start_ns)),
        secs(info.end_ns.saturating_sub(info.start_ns))
    );
    let _ = writeln!(
        s,
        "- timeline: [timeline.svg](timeline.svg); history: `history.jsonl` (re-check with \
         `latchkey-nemesis check <this folder>`)\n"
    );
    if let Some(f) = &info.failure {
        let _ = writeln!(s, "**The run stopped early:** {f}\n");
    }
    for p in problems {
        let _ = writeln!(s, "**No progress:** {p}\n");
    }

    let _ = writeln!(s, "## Verdicts\n");
    for v in verdicts {
        let status = match v.status {
            Status::Pass => "pass",
            Status::Fail => "FAIL",
            Status::Inconclusive => "INCONCLUSIVE",
        };
        let _ = writeln!(
            s,
            "- **{}**: {status} ({} operations): {}",
            v.name, v.ops_checked, v.message
        );
        for n in &v.notes {
            let _ = writeln!(s, "  - note: {n}");
        }
        if !v.witness.is_empty() {
            let _ = writeln!(s, "\n  Witness:\n\n```text\n{v}\n```");
        }
    }

    let _ = writeln!(s, "\n## Lock service\n");
    let _ = writeln!(
        s,
        "- {} grants; fence gate: {} writes accepted, {} stale writes refused; fenced KV: {} \
         accepted, {} stale refused",
        c.grants, c.gate_accepted, c.gate_refused, c.kv_accepted, c.kv_refused
    );
    let _ = writeln!(
        s,
        "- semaphore: {} permits granted; writes fenced by a permit: {} accepted, {} stale \
         refused; election observers told of {} leaders",
        c.permits, c.permit_accepted, c.permit_refused, c.observed
    );
    let _ = writeln!(
        s,
        "- durability: {} acknowledged puts; {} keys read back after killing and restarting \
         every replica",
        c.acked_puts,
        c.read_back.map_or("no".to_owned(), |n| n.to_string())
    );

    let _ = writeln!(s, "\n## Leader churn\n");
    let _ = write!(s, "{}", churn_section(info, churn, windows));

    let _ = writeln!(s, "\n## Operations\n");
    let _ = writeln!(
        s,
        "| operation | ok | fail | unknown |\n|---|---:|---:|---:|"
    );
    for (name, by) in &c.ops {
        let get = |k: &str| by.get(k).copied().unwrap_or(0);
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {} |",
            get("ok"),
            get("fail"),
            get("unknown")
        );
    }

    let _ = writeln!(s, "\n## Faults\n");
    let mut by_kind: BTreeMap<&str, u64> = BTreeMap::new();
    for w in windows {
        *by_kind.entry(w.kind.as_str()).or_default() += 1;
    }
    let list: Vec<String> = by_kind.iter().map(|(k, n)| format!("{k}: {n}")).collect();
    let _ = writeln!(s, "Carried out: {}\n", list.join(", "));
    let _ = writeln!(
        s,
        "| start (s) | end (s) | fault | target |\n|---:|---:|---|---|"
    );
    for w in windows {
        let _ = writeln!(
            s,
            "| {:.1} | {:.1} | {} | {} |",
            secs(w.start_ns.saturating_sub(info.start_ns)),
            secs(w.end_ns.saturating_sub(info.start_ns)),
            w.kind,
            w.target
        );
    }
    let disk: Vec<&FaultWindow> = windows
        .iter()
        .filter(|w| w.detail.is_some() && w.kind != CHURN_KILL)
        .collect();
    if !disk.is_empty() {
        let _ = writeln!(
            s,
            "\n## Disk faults and repairs\n\nWhat each disk fault did and what the replica made \
             of it (the fault's window ends when that was seen), then each repair: a new data \
             directory, `members add`, until the leader lists the new incarnation as a voter \
             and the replica has caught up.\n"
        );
        for w in disk {
            let _ = writeln!(
                s,
                "- {:.1} s to {:.1} s, **{}** {}: {}",
                secs(w.start_ns.saturating_sub(info.start_ns)),
                secs(w.end_ns.saturating_sub(info.start_ns)),
                w.kind,
                w.target,
                w.detail.as_deref().unwrap_or("")
            );
        }
    }
    let _ = writeln!(s, "\nSchedule as planned:\n\n```text\n{}```", info.schedule);
    if !info.notes.is_empty() {
        let _ = writeln!(s, "\n## Notes\n");
        for n in &info.notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// The "Leader churn" section: how long the phase took, and what the
/// `abandoned` checker measured (its verdict is with the others).
fn churn_section(
    info: &RunInfo,
    churn: &std::result::Result<Measure, String>,
    windows: &[FaultWindow],
) -> String {
    let mut s = String::new();
    let kills: Vec<&FaultWindow> = windows.iter().filter(|w| w.kind == CHURN_KILL).collect();
    match info.churn {
        Some(t) => {
            let kills = kills.len();
            let _ = writeln!(
                s,
                "- phase: {:.1} s, from the holder's start to the cluster restored; {kills} \
                 leader(s) killed",
                secs(t.end_ns.saturating_sub(t.start_ns))
            );
        }
        None => {
            let _ = writeln!(s, "- phase: did not run");
        }
    }
    match churn {
        Ok(m) => {
            let verdict = match m.extension_ns {
                None => "never granted",
                Some(_) if m.within_bound() => "within the bound",
                Some(_) => "over the bound (reported, not failed)",
            };
            let _ = writeln!(s, "- {verdict}: {}", m.numbers());
            if let Some(why) = &m.skipped {
                let _ = writeln!(s, "- skipped in part: {why}");
            }
        }
        Err(why) => {
            let _ = writeln!(s, "- not measured: {why}");
        }
    }
    for w in kills {
        let _ = writeln!(
            s,
            "- {:.1} s: killed {}: {}",
            secs(w.start_ns.saturating_sub(info.start_ns)),
            w.target,
            w.detail.as_deref().unwrap_or("")
        );
    }
    s
}

/// Re-checks the history of a report folder; prints the verdicts.
/// When the folder has no `history.jsonl` (the run was cut short), the
/// per-process histories in `workers/` are merged instead.
pub fn recheck(folder: &Path) -> Result<bool> {
    let path = folder.join("history.jsonl");
    let history = if path.exists() {
        let text = std::fs::read_to_string(&path)
            .map_err(Error::io(format!("read {}", path.display())))?;
        History::from_json_lines(&text)
            .map_err(|e| Error::History(format!("{}: {e}", path.display())))?
    } else {
        let dir = folder.join("workers");
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
            .map_err(Error::io(format!("list {}", dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
            .collect();
        names.sort();
        eprintln!(
            "check: no history.jsonl; merging {} files of {}",
            names.len(),
            dir.display()
        );
        let mut files = Vec::new();
        for n in &names {
            files.push(crate::record::read_events(n)?);
        }
        crate::record::merge(files)?
    };
    let verdicts = timed_checks(&history);
    for v in &verdicts {
        eprintln!("{v}");
    }
    Ok(verdicts.iter().all(|v| v.status == Status::Pass))
}

#[cfg(test)]
mod tests {
    use super::*;
    use latchkey_check::history::ops;
    use latchkey_check::HistoryBuilder;

    #[test]
    fn counts_and_progress() {
        let mut h = HistoryBuilder::new();
        h.invoke(1, 1, ops::acquire("r", "a", None));
        h.ok(1, 2, ops::acquire("r", "a", Some(3)));
        h.invoke(1, 3, ops::gate_write("r", "a", 3, None));
        h.ok(1, 4, ops::gate_write("r", "a", 3, Some(true)));
        h.invoke(1, 5, ops::gate_write("r", "a", 2, None));
        h.ok(1, 6, ops::gate_write("r", "a", 2, Some(false)));
        h.invoke(2, 7, ops::put("d/1", "v"));
        h.ok(2, 8, ops::put("d/1", "v"));
        h.invoke(3, 9, ops::permit("s", 2, "b", None));
        h.ok(3, 10, ops::permit("s", 2, "b", Some(4)));
        h.invoke(3, 11, ops::permit_write("s", "k", "b", 4, None));
        h.ok(3, 12, ops::permit_write("s", "k", "b", 4, Some(false)));
        h.ok(4, 13, ops::observed("r", None, false));
        h.ok(4, 14, ops::observed("r", Some(3), false));
        let history = h.build().unwrap();
        let c = count(&history);
        assert_eq!(c.grants, 1);
        assert_eq!(c.gate_accepted, 1);
        assert_eq!(c.gate_refused, 1);
        assert_eq!(c.acked_puts, 1);
        assert_eq!((c.permits, c.permit_accepted, c.permit_refused), (1, 0, 1));
        assert_eq!(c.observed, 1);
        let problems = activity_problems(&c);
        assert!(problems.iter().any(|p| p.contains("semaphore")));
        assert!(!problems.iter().any(|p| p.contains("observer")));
        assert!(problems.iter().any(|p| p.contains("register")));
        assert!(problems.iter().any(|p| p.contains("read-back")));
        assert!(!problems.iter().any(|p| p.contains("granted")));
    }

    fn info() -> RunInfo {
        RunInfo {
            seed: 9,
            replay: "cargo xtask soak --seconds 10 --seed 9".into(),
            network: "loopback".into(),
            kinds: vec![Kind::Kill],
            planned: 1,
            schedule: "  1. kill\n".into(),
            start_ns: 0,
            fault_end_ns: 10,
            end_ns: 20,
            churn: None,
            failure: None,
            notes: vec![],
        }
    }

    #[test]
    fn disk_faults_and_repairs_are_in_the_summary() {
        let windows = vec![
            FaultWindow {
                kind: "kill".into(),
                target: "n1".into(),
                start_ns: 1_000_000_000,
                end_ns: 2_000_000_000,
                detail: None,
            },
            FaultWindow {
                kind: "wipe".into(),
                target: "n2".into(),
                start_ns: 3_000_000_000,
                end_ns: 4_000_000_000,
                detail: Some("deleted the data directory; restarted: Waiting".into()),
            },
            FaultWindow {
                kind: "repair".into(),
                target: "n2".into(),
                start_ns: 4_000_000_000,
                end_ns: 9_500_000_000,
                detail: Some("ok in 5.5 s: incarnation 1 -> 2".into()),
            },
        ];
        let s = summary(
            &info(),
            &[],
            &Counts::default(),
            &[],
            &windows,
            &Err("no leader-churn phase in this history".into()),
            true,
        );
        assert!(
            s.contains("Carried out: kill: 1, repair: 1, wipe: 1"),
            "{s}"
        );
        assert!(s.contains("## Disk faults and repairs"), "{s}");
        assert!(
            s.contains("- 4.0 s to 9.5 s, **repair** n2: ok in 5.5 s: incarnation 1 -> 2"),
            "{s}"
        );
        assert!(s.contains("**wipe** n2: deleted the data directory"), "{s}");
        // Windows of older runs, without details, still read back.
        let w: FaultWindow =
            serde_json::from_str(r#"{"kind":"kill","target":"n1","start_ns":1,"end_ns":2}"#)
                .unwrap();
        assert_eq!(w.detail, None);
        assert!(!json_lines(&[w]).contains("detail"));
    }

    #[test]
    fn the_leader_churn_numbers_are_in_the_summary() {
        let m = Measure {
            resource: "churn/abandoned".into(),
            ttl_ms: 5_000,
            killed_ns: 1_000_000_000,
            granted_ns: Some(11_000_000_000),
            waited_ns: 10_000_000_000,
            leader_changes: 4,
            leaderless_ns: 3_400_000_000,
            bound_ns: 8_900_000_000,
            extension_ns: Some(5_000_000_000),
            past_vouched_ns: Some(5_600_000_000),
            leak_after_ns: 36_700_000_000,
            skipped: None,
        };
        let mut info = info();
        info.churn = Some(PhaseTimes {
            start_ns: 0,
            end_ns: 12_500_000_000,
        });
        let s = summary(&info, &[], &Counts::default(), &[], &[], &Ok(m), true);
        assert!(s.contains("## Leader churn"), "{s}");
        assert!(s.contains("- phase: 12.5 s"), "{s}");
        assert!(
            s.contains("- within the bound: extension 5.00 s (freed 10.00 s after"),
            "{s}"
        );
        assert!(
            s.contains("bound 8.90 s (4 leader change(s), 3.40 s without"),
            "{s}"
        );
        info.churn = None;
        let s = summary(
            &info,
            &[],
            &Counts::default(),
            &[],
            &[],
            &Err("the holder was never killed".into()),
            true,
        );
        assert!(s.contains("- phase: did not run"), "{s}");
        assert!(
            s.contains("- not measured: the holder was never killed"),
            "{s}"
        );
    }

    #[test]
    fn a_violation_fails_the_run_with_its_witness() {
        // Two holders granted the same token: lock safety must fail, and
        // the report must say FAIL and show the events.
        let mut h = HistoryBuilder::new();
        h.invoke(1, 1, ops::acquire("r", "a", None));
        h.ok(1, 2, ops::acquire("r", "a", Some(5)));
        h.invoke(2, 3, ops::acquire("r", "b", None));
        h.ok(2, 4, ops::acquire("r", "b", Some(5)));
        let history = h.build().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let passed = write(dir.path(), &info(), &history, &[], &[]).unwrap();
        assert!(!passed);
        let summary = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
        assert!(
            summary.starts_with("# latchkey nemesis run: FAIL"),
            "{summary}"
        );
        assert!(summary.contains("**lock safety**: FAIL"), "{summary}");
        assert!(summary.contains("Witness"), "{summary}");
        let verdicts = std::fs::read_to_string(dir.path().join("verdicts.json")).unwrap();
        assert!(verdicts.contains("\"fail\""));
        assert!(dir.path().join("timeline.svg").exists());
        assert!(dir.path().join("history.jsonl").exists());
        // The saved history re-checks to the same answer.
        assert!(!recheck(dir.path()).unwrap());
    }
}
