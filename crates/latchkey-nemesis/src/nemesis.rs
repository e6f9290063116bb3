//! The nemesis: a schedule of faults drawn from a seed, printed before the
//! run, and carried out against the cluster and the client processes.
//!
//! The schedule depends on the seed, the fault kinds, the duration and the
//! session TTL only, so the same command line replays the same faults in
//! the same order with the same durations. Which replica "the leader" is
//! gets decided when the fault starts, and the report records the replica
//! actually hit.
//!
//! Disk faults (`disk`) break one replica's data directory: wipe it, cut
//! its newest write-ahead log short, flip a byte of a table file, or delete
//! it under the running replica. The replica must then refuse to start,
//! exit, or wait to be added again; the harness repairs it the documented
//! way (a fresh data directory, `members add`) before the next fault. A
//! disk fault is never paired with another fault, and the repair (which
//! needs both other replicas) finishes before the next step begins, so it
//! never overlaps a fault on a second replica.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// The kinds of fault a run may use (`--nemesis kill,pause,partition,disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// SIGKILL a replica, restart it later on its data.
    Kill,
    /// SIGSTOP a replica or a lock client for longer than the session TTL.
    Pause,
    /// Cut a replica off from its peers (its clients still reach it).
    Partition,
    /// Break a replica's data directory ([`DiskFault`]); repair it.
    Disk,
}

impl Kind {
    /// Parses one kind.
    pub fn parse(s: &str) -> Option<Kind> {
        match s.trim() {
            "kill" => Some(Kind::Kill),
            "pause" => Some(Kind::Pause),
            "partition" => Some(Kind::Partition),
            "disk" => Some(Kind::Disk),
            _ => None,
        }
    }
}

/// Which replica a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The current leader (a random replica when there is none).
    Leader,
    /// Replica `i` (0-based).
    Node(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Leader => f.write_str("the leader"),
            Target::Node(i) => write!(f, "n{}", i + 1),
        }
    }
}

/// What a disk fault does to one replica's data directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    /// SIGKILL, delete the data directory, restart on the empty one.
    Wipe,
    /// SIGKILL, cut the newest RocksDB write-ahead log (`db/*.log`) to half
    /// its length (the largest one when the newest is nearly empty),
    /// restart.
    TruncateWal,
    /// SIGKILL, flip a byte in the middle of the largest table file
    /// (`db/*.sst`; truncate-wal when there is none), restart.
    FlipSst,
    /// Delete the data directory under the running replica, which must
    /// exit on its own within [`DELETE_RUNNING_EXIT`].
    DeleteRunning,
}

/// How long a replica whose data directory was deleted under it may keep
/// running: past this it is a "zombie replica" and the run fails.
pub const DELETE_RUNNING_EXIT: Duration = Duration::from_secs(10);

/// What the schedule counts for repairing a disk-faulted replica (a fresh
/// data directory added back as a voter); the run takes what it takes.
pub const REPAIR_ESTIMATE: Duration = Duration::from_secs(5);

impl DiskFault {
    /// Every disk fault, in the order they are drawn from.
    pub const ALL: [DiskFault; 4] = [
        DiskFault::Wipe,
        DiskFault::TruncateWal,
        DiskFault::FlipSst,
        DiskFault::DeleteRunning,
    ];

    /// The name in the report and the timeline.
    pub fn name(self) -> &'static str {
        match self {
            DiskFault::Wipe => "wipe",
            DiskFault::TruncateWal => "truncate-wal",
            DiskFault::FlipSst => "flip-sst",
            DiskFault::DeleteRunning => "delete-running",
        }
    }
}

/// One fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a replica; restart it after `down`.
    Kill { target: Target, down: Duration },
    /// SIGSTOP a replica; SIGCONT after `pause`.
    PauseReplica { target: Target, pause: Duration },
    /// SIGSTOP lock worker `worker`; SIGCONT after `pause`.
    PauseClient { worker: usize, pause: Duration },
    /// Isolate a replica from its peers; heal after `cut`.
    Partition { target: Target, cut: Duration },
    /// Break a replica's data directory; restart it after `down` (not for
    /// [`DiskFault::DeleteRunning`]), then repair it if it refuses to
    /// start, exits or waits to be added. Never part of [`Fault::Both`].
    Disk {
        target: Target,
        what: DiskFault,
        down: Duration,
    },
    /// Two faults at once, each ending on its own time.
    Both(Box<Fault>, Box<Fault>),
}

impl Fault {
    /// How long the fault lasts.
    pub fn length(&self) -> Duration {
        match self {
            Fault::Kill { down: d, .. }
            | Fault::PauseReplica { pause: d, .. }
            | Fault::PauseClient { pause: d, .. }
            | Fault::Partition { cut: d, .. } => *d,
            Fault::Disk { down, .. } => *down + REPAIR_ESTIMATE,
            Fault::Both(a, b) => a.length().max(b.length()),
        }
    }

    /// Whether this fault, or a part of it, is a disk fault.
    pub fn has_disk(&self) -> bool {
        match self {
            Fault::Disk { .. } => true,
            Fault::Both(a, b) => a.has_disk() || b.has_disk(),
            _ => false,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Kill { target, down } => write!(f, "kill -9 {target}, restart after {down:?}"),
            Fault::PauseReplica { target, pause } => {
                write!(f, "SIGSTOP {target} for {pause:?}")
            }
            Fault::PauseClient { worker, pause } => {
                write!(f, "SIGSTOP lock client w{worker} for {pause:?}")
            }
            Fault::Partition { target, cut } => {
                write!(f, "isolate {target} from its peers for {cut:?}")
            }
            Fault::Disk { target, what, down } => match what {
                DiskFault::Wipe => write!(
                    f,
                    "disk: kill -9 {target}, delete its data directory, restart after {down:?}; \
                     repair"
                ),
                DiskFault::TruncateWal => write!(
                    f,
                    "disk: kill -9 {target}, cut its newest WAL to half, restart after {down:?}; \
                     repair if needed"
                ),
                DiskFault::FlipSst => write!(
                    f,
                    "disk: kill -9 {target}, flip a byte of an SST, restart after {down:?}; \
                     repair if needed"
                ),
                DiskFault::DeleteRunning => write!(
                    f,
                    "disk: delete the data directory under running {target} (must exit within \
                     {DELETE_RUNNING_EXIT:?}); repair"
                ),
            },
            Fault::Both(a, b) => write!(f, "{a}  +  {b}"),
        }
    }
}

/// A fault after a quiet period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Time without faults before this one starts.
    pub quiet: Duration,
    /// The fault.
    pub fault: Fault,
}

/// What the schedule is drawn from.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The run's seed.
    pub seed: u64,
    /// The enabled kinds (not empty).
    pub kinds: Vec<Kind>,
    /// The whole fault phase.
    pub duration: Duration,
    /// The lock clients' session TTL: pauses last longer.
    pub ttl: Duration,
    /// The worker numbers of the clients that hold locks or permits (pause
    /// targets).
    pub lock_workers: Vec<usize>,
}

/// Draws the schedule: quiet 1-3 s, then a fault, until the duration is
/// used up. The kinds take turns (shuffled within each round), so a short
/// run still has every kind; from the second round on, one step in four,
/// when more than one kind is enabled, is two faults at once (a replica
/// fault together with a client pause, or a kill with a partition of
/// another replica). A disk fault is never paired: it and its repair have
/// the cluster to themselves. Every kind is drawn once in the first round,
/// so a run whose first round fits has at least one disk fault, early.
pub fn plan(input: &PlanInput) -> Vec<Step> {
    let mut rng = Rng::new(input.seed).fork(0x6e656d);
    let ttl_ms = input.ttl.as_millis() as u64;
    let mut steps = Vec::new();
    let mut used = Duration::ZERO;
    let mut round: Vec<Kind> = Vec::new();
    let mut rounds = 0u64;
    while !input.kinds.is_empty() {
        if round.is_empty() {
            round = input.kinds.clone();
            // Fisher-Yates with the seeded generator.
            for i in (1..round.len()).rev() {
                let j = rng.below(i + 1);
                round.swap(i, j);
            }
            rounds += 1;
        }
        let Some(kind) = round.pop() else { break };
        let quiet = Duration::from_millis(rng.between(1000, 3000));
        let mut fault = single(&mut rng, kind, ttl_ms, &input.lock_workers);
        if kind != Kind::Disk && rounds > 1 && input.kinds.len() > 1 && rng.chance(25) {
            let other = input.kinds[rng.below(input.kinds.len())];
            let second = match (kind, other) {
                // A kill of one replica with a partition of another: no
                // majority until one of them ends. Safety must hold
                // throughout, and the cluster must recover. Any other pair
                // is a replica fault with a client pause.
                (Kind::Kill, Kind::Partition) | (Kind::Partition, Kind::Kill) => {
                    let (a, b) = distinct_pair(&mut rng);
                    fault = single_on(&mut rng, Kind::Kill, Target::Node(a), ttl_ms);
                    Some(single_on(
                        &mut rng,
                        Kind::Partition,
                        Target::Node(b),
                        ttl_ms,
                    ))
                }
                _ if !input.lock_workers.is_empty() && input.kinds.contains(&Kind::Pause) => {
                    Some(client_pause(&mut rng, ttl_ms, &input.lock_workers))
                }
                _ => None,
            };
            if let Some(second) = second {
                if !matches!(fault, Fault::PauseClient { .. }) {
                    fault = Fault::Both(Box::new(fault), Box::new(second));
                }
            }
        }
        let total = quiet + fault.length();
        if used + total > input.duration && !steps.is_empty() {
            break;
        }
        used += total;
        steps.push(Step { quiet, fault });
        if used >= input.duration {
            break;
        }
    }
    steps
}

fn target(rng: &mut Rng) -> Target {
    if rng.chance(50) {
        Target::Leader
    } else {
        Target::Node(rng.below(3))
    }
}

fn distinct_pair(rng: &mut Rng) -> (usize, usize) {
    let a = rng.below(3);
    let b = (a + 1 + rng.below(2)) % 3;
    (a, b)
}

fn single(rng: &mut Rng, kind: Kind, ttl_ms: u64, lock_workers: &[usize]) -> Fault {
    if kind == Kind::Pause && !lock_workers.is_empty() && rng.chance(40) {
        return client_pause(rng, ttl_ms, lock_workers);
    }
    let t = target(rng);
    single_on(rng, kind, t, ttl_ms)
}

fn single_on(rng: &mut Rng, kind: Kind, target: Target, ttl_ms: u64) -> Fault {
    match kind {
        Kind::Kill => Fault::Kill {
            target,
            down: Duration::from_millis(rng.between(500, 4000)),
        },
        Kind::Pause => Fault::PauseReplica {
            target,
            pause: Duration::from_millis(rng.between(ttl_ms + 500, ttl_ms * 2 + 1000)),
        },
        Kind::Partition => Fault::Partition {
            target,
            cut: Duration::from_millis(rng.between(1500, 6000)),
        },
        Kind::Disk => {
            let what = DiskFault::ALL[rng.below(DiskFault::ALL.len())];
            let down = if what == DiskFault::DeleteRunning {
                Duration::ZERO
            } else {
                Duration::from_millis(rng.between(500, 3000))
            };
            Fault::Disk { target, what, down }
        }
    }
}

fn client_pause(rng: &mut Rng, ttl_ms: u64, lock_workers: &[usize]) -> Fault {
    Fault::PauseClient {
        worker: lock_workers[rng.below(lock_workers.len())],
        pause: Duration::from_millis(rng.between(ttl_ms + 500, ttl_ms * 2 + 1000)),
    }
}

/// One fault as it happened, for the report and the timeline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultWindow {
    /// `kill`, `pause`, `pause-client` or `partition`; a disk fault's name
    /// ([`DiskFault::name`]), from the fault to the moment the harness saw
    /// what the replica made of it; `late-exit` when a replica whose disk
    /// was damaged earlier exits later; `repair` for a repair.
    pub kind: String,
    /// `n1`..`n3` for replicas, `w<N>` for a client worker.
    pub target: String,
    /// When it began (CLOCK_MONOTONIC, ns).
    pub start_ns: u64,
    /// When it was undone.
    pub end_ns: u64,
    /// What happened (disk faults and repairs): what was damaged, how the
    /// replica reacted, how the repair went.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(seed: u64, kinds: Vec<Kind>, secs: u64) -> PlanInput {
        PlanInput {
            seed,
            kinds,
            duration: Duration::from_secs(secs),
            ttl: Duration::from_secs(2),
            lock_workers: vec![0, 1, 2],
        }
    }

    #[test]
    fn same_seed_same_schedule_and_fits_the_duration() {
        let a = plan(&input(
            7,
            vec![Kind::Kill, Kind::Pause, Kind::Partition],
            120,
        ));
        let b = plan(&input(
            7,
            vec![Kind::Kill, Kind::Pause, Kind::Partition],
            120,
        ));
        assert_eq!(a, b);
        let c = plan(&input(
            8,
            vec![Kind::Kill, Kind::Pause, Kind::Partition],
            120,
        ));
        assert_ne!(a, c);
        let total: Duration = a.iter().map(|s| s.quiet + s.fault.length()).sum();
        assert!(total <= Duration::from_secs(120));
        assert!(a.len() >= 6, "{} steps", a.len());
    }

    #[test]
    fn every_kind_appears_early() {
        for seed in 0..50 {
            let p = plan(&input(
                seed,
                vec![Kind::Kill, Kind::Pause, Kind::Partition],
                60,
            ));
            let text: Vec<String> = p.iter().take(3).map(|s| s.fault.to_string()).collect();
            let all = text.join(" | ");
            assert!(all.contains("kill -9"), "seed {seed}: {all}");
            assert!(all.contains("SIGSTOP"), "seed {seed}: {all}");
            assert!(all.contains("isolate"), "seed {seed}: {all}");
        }
    }

    #[test]
    fn pauses_outlast_the_ttl_and_combos_keep_a_majority() {
        let p = plan(&input(
            3,
            vec![Kind::Kill, Kind::Pause, Kind::Partition],
            3600,
        ));
        let mut combos = 0;
        for s in &p {
            match &s.fault {
                Fault::PauseReplica { pause, .. } | Fault::PauseClient { pause, .. } => {
                    assert!(*pause > Duration::from_secs(2))
                }
                Fault::Both(a, b) => {
                    combos += 1;
                    // Two replica faults name two different replicas;
                    // any other pair is one fault and a client pause.
                    if let (Fault::Kill { target: x, .. }, Fault::Partition { target: y, .. }) =
                        (a.as_ref(), b.as_ref())
                    {
                        assert_ne!(x, y);
                    } else {
                        assert!(matches!(b.as_ref(), Fault::PauseClient { .. }), "{s:?}");
                    }
                }
                _ => {}
            }
        }
        assert!(combos > 10, "{combos} combos");
    }

    const ALL: [Kind; 4] = [Kind::Kill, Kind::Pause, Kind::Partition, Kind::Disk];

    /// When each step's fault starts, as planned (seconds after the start).
    fn starts(p: &[Step]) -> Vec<f64> {
        let mut at = Duration::ZERO;
        p.iter()
            .map(|s| {
                at += s.quiet;
                let start = at.as_secs_f64();
                at += s.fault.length();
                start
            })
            .collect()
    }

    #[test]
    fn disk_schedules_are_deterministic() {
        for seed in [0, 1, 7, 20261121] {
            let a = plan(&input(seed, ALL.to_vec(), 600));
            assert_eq!(a, plan(&input(seed, ALL.to_vec(), 600)), "seed {seed}");
            assert!(a.iter().any(|s| s.fault.has_disk()), "seed {seed}");
        }
        assert_ne!(
            plan(&input(1, ALL.to_vec(), 600)),
            plan(&input(2, ALL.to_vec(), 600))
        );
    }

    #[test]
    fn adding_disk_leaves_other_kinds_alone() {
        // A run without disk faults draws exactly what it drew before disk
        // faults existed (docs/nemesis-sample, seed 777): old seeds replay.
        let p = plan(&PlanInput {
            seed: 777,
            kinds: vec![Kind::Kill, Kind::Pause, Kind::Partition],
            duration: Duration::from_secs(1800),
            ttl: Duration::from_secs(3),
            lock_workers: vec![0, 1, 2],
        });
        let text: Vec<String> = p
            .iter()
            .take(6)
            .map(|s| format!("{:.1} {}", s.quiet.as_secs_f64(), s.fault))
            .collect();
        assert_eq!(
            text,
            [
                "1.6 isolate n3 from its peers for 5.345s",
                "1.3 kill -9 the leader, restart after 599ms",
                "1.8 SIGSTOP n3 for 6.711s",
                "2.6 SIGSTOP lock client w2 for 5.858s",
                "1.9 kill -9 the leader, restart after 1.449s",
                "2.7 kill -9 n2, restart after 516ms  +  isolate n1 from its peers for 4.092s",
            ]
        );
        assert!(!p.iter().any(|s| s.fault.has_disk()));
    }

    #[test]
    fn disk_faults_never_overlap_a_second_replica_fault() {
        let mut disk = 0;
        let mut kinds_seen = std::collections::BTreeSet::new();
        for seed in 0..100 {
            for s in plan(&input(seed, ALL.to_vec(), 3600)) {
                match &s.fault {
                    Fault::Disk { what, down, .. } => {
                        disk += 1;
                        kinds_seen.insert(what.name());
                        if *what == DiskFault::DeleteRunning {
                            assert_eq!(*down, Duration::ZERO);
                        } else {
                            assert!(*down >= Duration::from_millis(500));
                        }
                        assert!(s.fault.length() >= REPAIR_ESTIMATE);
                    }
                    Fault::Both(a, b) => {
                        assert!(!a.has_disk() && !b.has_disk(), "seed {seed}: {}", s.fault)
                    }
                    _ => {}
                }
                // Steps run one after another: a disk step is alone.
                assert!(!matches!(&s.fault, Fault::Both(..)) || !s.fault.has_disk());
            }
        }
        assert!(disk > 1000, "{disk} disk faults");
        assert_eq!(kinds_seen.len(), 4, "{kinds_seen:?}");
    }

    #[test]
    fn a_100s_run_has_a_disk_fault_in_its_first_minute() {
        let ci = PlanInput {
            seed: 20261121,
            kinds: ALL.to_vec(),
            duration: Duration::from_secs(100),
            ttl: Duration::from_secs(3),
            lock_workers: vec![0, 1, 2],
        };
        for seed in (0..300).chain([20261121]) {
            for ttl in [2, 3] {
                let p = plan(&PlanInput {
                    seed,
                    ttl: Duration::from_secs(ttl),
                    ..ci.clone()
                });
                let at = starts(&p);
                let first = p.iter().position(|s| s.fault.has_disk());
                assert!(
                    first.is_some_and(|i| at[i] < 60.0),
                    "seed {seed} ttl {ttl}s: no disk fault in the first minute: {p:?}"
                );
            }
        }
    }

    #[test]
    fn a_single_kind_works() {
        let p = plan(&input(1, vec![Kind::Kill], 30));
        assert!(!p.is_empty());
        assert!(p.iter().all(|s| matches!(s.fault, Fault::Kill { .. })));
        assert!(plan(&input(1, vec![], 30)).is_empty());
        let p = plan(&input(1, vec![Kind::Disk], 60));
        assert!(p.len() >= 2);
        assert!(p.iter().all(|s| matches!(s.fault, Fault::Disk { .. })));
        assert_eq!(Kind::parse("disk"), Some(Kind::Disk));
    }
}
