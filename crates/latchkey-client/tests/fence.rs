//! The fence gate: one conformance suite that every [`FenceGate`] must pass,
//! run against each implementation, then the durability and damage checks
//! specific to [`FileFenceGate`].

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;
use std::sync::{Barrier, Mutex};
use std::thread;

use latchkey_client::{Admission, FenceError, FenceGate, FileFenceGate, MemoryFenceGate};
use proptest::prelude::*;
use tempfile::TempDir;

// ---------------------------------------------------------------------------
// Conformance suite
// ---------------------------------------------------------------------------

/// One check of the suite: a name and a function run on a fresh gate.
type Check = (&'static str, fn(&dyn FenceGate));

/// Every rule of the module documentation, checked on fresh gates from
/// `make`.
fn conformance(make: impl Fn() -> Box<dyn FenceGate>) {
    let checks: &[Check] = &[
        ("first_token_raises", first_token_raises),
        ("accepts_increasing_and_equal", accepts_increasing_and_equal),
        ("refuses_lower", refuses_lower),
        (
            "refusal_leaves_state_untouched",
            refusal_leaves_state_untouched,
        ),
        ("zero_is_refused", zero_is_refused),
        ("resources_are_independent", resources_are_independent),
        ("any_resource_name", any_resource_name),
        ("concurrent_pair_keeps_max", concurrent_pair_keeps_max),
        (
            "concurrent_equal_tokens_raise_once",
            concurrent_equal_tokens_raise_once,
        ),
        (
            "concurrent_admissions_are_monotonic",
            concurrent_admissions_are_monotonic,
        ),
    ];
    for (name, check) in checks {
        eprintln!("conformance: {name}");
        let gate = make();
        check(&*gate);
    }
}

fn first_token_raises(gate: &dyn FenceGate) {
    assert_eq!(gate.highest("r").unwrap(), None);
    assert_eq!(
        gate.admit("r", 5).unwrap(),
        Admission::Raised { previous: None }
    );
    assert_eq!(gate.highest("r").unwrap(), Some(5));
}

fn accepts_increasing_and_equal(gate: &dyn FenceGate) {
    assert_eq!(
        gate.admit("r", 1).unwrap(),
        Admission::Raised { previous: None }
    );
    assert_eq!(gate.admit("r", 1).unwrap(), Admission::Repeated);
    assert_eq!(
        gate.admit("r", 2).unwrap(),
        Admission::Raised { previous: Some(1) }
    );
    assert_eq!(
        gate.admit("r", 100).unwrap(),
        Admission::Raised { previous: Some(2) }
    );
    assert_eq!(gate.admit("r", 100).unwrap(), Admission::Repeated);
    assert_eq!(gate.admit("r", 100).unwrap(), Admission::Repeated);
    assert_eq!(gate.highest("r").unwrap(), Some(100));
    assert_eq!(
        gate.admit("r", u64::MAX).unwrap(),
        Admission::Raised {
            previous: Some(100)
        }
    );
    assert_eq!(gate.admit("r", u64::MAX).unwrap(), Admission::Repeated);
    assert_eq!(gate.highest("r").unwrap(), Some(u64::MAX));
}

fn refuses_lower(gate: &dyn FenceGate) {
    gate.admit("X", 34).unwrap();
    let err = gate.admit("X", 33).unwrap_err();
    match &err {
        FenceError::Stale {
            resource,
            token,
            highest,
        } => {
            assert_eq!(resource, "X");
            assert_eq!((*token, *highest), (33, 34));
        }
        other => panic!("expected Stale, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "token 33 is older than 34 already seen for resource \"X\": \
         a newer lock holder has written; this writer must stop"
    );
    // Far below too, and still after a raise.
    assert!(matches!(
        gate.admit("X", 1),
        Err(FenceError::Stale {
            token: 1,
            highest: 34,
            ..
        })
    ));
    gate.admit("X", 40).unwrap();
    assert!(matches!(
        gate.admit("X", 34),
        Err(FenceError::Stale {
            token: 34,
            highest: 40,
            ..
        })
    ));
}

fn refusal_leaves_state_untouched(gate: &dyn FenceGate) {
    gate.admit("r", 10).unwrap();
    gate.admit("other", 3).unwrap();
    for bad in [9, 1, 0] {
        gate.admit("r", bad).unwrap_err();
        assert_eq!(gate.highest("r").unwrap(), Some(10), "after refusing {bad}");
        assert_eq!(
            gate.highest("other").unwrap(),
            Some(3),
            "after refusing {bad}"
        );
    }
    // The holder of 10 is still admitted, as a repeat; 11 still raises from 10.
    assert_eq!(gate.admit("r", 10).unwrap(), Admission::Repeated);
    assert_eq!(
        gate.admit("r", 11).unwrap(),
        Admission::Raised { previous: Some(10) }
    );
}

fn zero_is_refused(gate: &dyn FenceGate) {
    // On a fresh resource: refused, and the resource stays unseen.
    let err = gate.admit("fresh", 0).unwrap_err();
    assert!(
        matches!(&err, FenceError::ZeroToken { resource } if resource == "fresh"),
        "{err:?}"
    );
    assert!(err.to_string().contains("token 0"), "{err}");
    assert!(err.to_string().contains("never issued"), "{err}");
    assert_eq!(gate.highest("fresh").unwrap(), None);
    // On a known resource: ZeroToken, not Stale.
    gate.admit("known", 5).unwrap();
    assert!(matches!(
        gate.admit("known", 0),
        Err(FenceError::ZeroToken { .. })
    ));
    assert_eq!(gate.highest("known").unwrap(), Some(5));
}

fn resources_are_independent(gate: &dyn FenceGate) {
    gate.admit("a", 10).unwrap();
    assert_eq!(
        gate.admit("b", 3).unwrap(),
        Admission::Raised { previous: None }
    );
    assert!(matches!(gate.admit("a", 5), Err(FenceError::Stale { .. })));
    gate.admit("b", 5).unwrap();
    assert_eq!(gate.highest("a").unwrap(), Some(10));
    assert_eq!(gate.highest("b").unwrap(), Some(5));
    assert_eq!(gate.highest("c").unwrap(), None);
    // No normalisation: these are all different resources.
    for name in ["A", "a ", " a", "a/", "ａ"] {
        assert_eq!(gate.highest(name).unwrap(), None, "{name:?}");
        assert_eq!(
            gate.admit(name, 1).unwrap(),
            Admission::Raised { previous: None },
            "{name:?}"
        );
    }
    assert_eq!(gate.highest("a").unwrap(), Some(10));
}

fn any_resource_name(gate: &dyn FenceGate) {
    let names = [
        "",
        "tab\there",
        "line\nbreak",
        "cr\rlf\n",
        "back\\slash",
        "\\t literally",
        "end\t3\t0000",
        "latchkey-fence 1",
        "é✓🔒",
        "nul\0byte",
    ];
    for (i, name) in names.iter().enumerate() {
        gate.admit(name, i as u64 + 1).unwrap();
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(gate.highest(name).unwrap(), Some(i as u64 + 1), "{name:?}");
    }
}

/// Two threads admit 5 and 6 at the same moment, many times: 6 always wins
/// and the highest is never left at 5.
fn concurrent_pair_keeps_max(gate: &dyn FenceGate) {
    for round in 0..50 {
        let resource = format!("pair/{round}");
        let barrier = Barrier::new(2);
        let (five, six) = thread::scope(|s| {
            let five = s.spawn(|| {
                barrier.wait();
                gate.admit(&resource, 5)
            });
            let six = s.spawn(|| {
                barrier.wait();
                gate.admit(&resource, 6)
            });
            (five.join().unwrap(), six.join().unwrap())
        });
        match six.unwrap() {
            Admission::Raised {
                previous: None | Some(5),
            } => {}
            other => panic!("round {round}: 6 admitted as {other:?}"),
        }
        match five {
            Ok(Admission::Raised { previous: None }) => {}
            Err(FenceError::Stale {
                token: 5,
                highest: 6,
                ..
            }) => {}
            other => panic!("round {round}: 5 answered {other:?}"),
        }
        assert_eq!(gate.highest(&resource).unwrap(), Some(6), "round {round}");
    }
}

/// Many threads admitting the same token at once: exactly one raises it,
/// the others see a repeat.
fn concurrent_equal_tokens_raise_once(gate: &dyn FenceGate) {
    const THREADS: usize = 8;
    for round in 0..10 {
        let resource = format!("same/{round}");
        let barrier = Barrier::new(THREADS);
        let answers: Vec<Admission> = thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(|| {
                        barrier.wait();
                        gate.admit(&resource, 7).unwrap()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let raised = answers
            .iter()
            .filter(|a| **a == Admission::Raised { previous: None })
            .count();
        let repeated = answers
            .iter()
            .filter(|a| **a == Admission::Repeated)
            .count();
        assert_eq!((raised, repeated), (1, THREADS - 1), "{answers:?}");
        assert_eq!(gate.highest(&resource).unwrap(), Some(7));
    }
}

/// Threads admit interleaved increasing tokens on shared resources. A log of
/// accepted tokens checks that no accepted token is lower than one accepted
/// before the call began, that every refusal names a higher accepted token,
/// and that the final highest is the largest token offered.
fn concurrent_admissions_are_monotonic(gate: &dyn FenceGate) {
    const THREADS: u64 = 8;
    const ROUNDS: u64 = 20;
    const RESOURCES: [&str; 3] = ["m/0", "m/1", "m/2"];
    let accepted: BTreeMap<&str, Mutex<Vec<u64>>> =
        RESOURCES.iter().map(|r| (*r, Mutex::default())).collect();
    let barrier = Barrier::new(THREADS as usize);
    thread::scope(|s| {
        for thread_index in 0..THREADS {
            let (accepted, barrier) = (&accepted, &barrier);
            s.spawn(move || {
                barrier.wait();
                for round in 0..ROUNDS {
                    let token = round * THREADS + thread_index + 1;
                    for k in 0..RESOURCES.len() {
                        // Vary the order of resources between threads.
                        let resource = RESOURCES[(k + thread_index as usize) % RESOURCES.len()];
                        let log = &accepted[resource];
                        let floor = log.lock().unwrap().iter().copied().max().unwrap_or(0);
                        match gate.admit(resource, token) {
                            Ok(_) => {
                                assert!(
                                    token >= floor,
                                    "{resource}: accepted {token} after {floor} was accepted"
                                );
                                log.lock().unwrap().push(token);
                            }
                            Err(FenceError::Stale {
                                token: refused,
                                highest,
                                ..
                            }) => {
                                assert_eq!(refused, token);
                                assert!(highest > token, "{resource}: {token} vs {highest}");
                                assert!(highest >= floor, "{resource}: {highest} < {floor}");
                                assert!(highest <= ROUNDS * THREADS, "never offered: {highest}");
                            }
                            Err(other) => panic!("{resource}: unexpected {other:?}"),
                        }
                    }
                }
            });
        }
    });
    for resource in RESOURCES {
        let log = accepted[resource].lock().unwrap();
        let max = log.iter().copied().max();
        // The largest token offered can never be refused.
        assert_eq!(max, Some(ROUNDS * THREADS), "{resource}");
        assert_eq!(gate.highest(resource).unwrap(), max, "{resource}");
    }
}

#[test]
fn memory_gate_conforms() {
    conformance(|| Box::new(MemoryFenceGate::new()));
}

/// A file gate that owns its temporary directory.
struct TempFileGate {
    gate: FileFenceGate,
    _dir: TempDir,
}

impl FenceGate for TempFileGate {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        self.gate.admit(resource, token)
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        self.gate.highest(resource)
    }
}

#[test]
fn file_gate_conforms() {
    conformance(|| {
        let dir = TempDir::new().unwrap();
        let gate = FileFenceGate::open(dir.path().join("fence")).unwrap();
        Box::new(TempFileGate { gate, _dir: dir })
    });
}

/// The suite again, on a file gate reopened before every check of state:
/// whatever the suite observes must also be what a restarted gate loads.
#[test]
fn file_gate_conforms_after_reopen() {
    conformance(|| {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("fence");
        FileFenceGate::open(&path).unwrap();
        Box::new(ReopeningGate {
            path,
            _dir: dir,
            lock: Mutex::new(()),
        })
    });
}

/// Opens the state file afresh for every call (serialized, since only one
/// gate may use a file at a time).
struct ReopeningGate {
    path: PathBuf,
    _dir: TempDir,
    lock: Mutex<()>,
}

impl FenceGate for ReopeningGate {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let _one_at_a_time = self.lock.lock().unwrap();
        FileFenceGate::open(&self.path)?.admit(resource, token)
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        let _one_at_a_time = self.lock.lock().unwrap();
        FileFenceGate::open(&self.path)?.highest(resource)
    }
}

// ---------------------------------------------------------------------------
// FileFenceGate: durability
// ---------------------------------------------------------------------------

fn state_path(dir: &TempDir) -> PathBuf {
    dir.path().join("fence.state")
}

#[test]
fn file_gate_survives_reopen() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    {
        let gate = FileFenceGate::open(&path).unwrap();
        assert_eq!(gate.path(), path);
        gate.admit("orders", 33).unwrap();
        gate.admit("orders", 34).unwrap();
        gate.admit("odd\tname\n", 7).unwrap();
        gate.admit("orders", 30).unwrap_err();
    }
    let gate = FileFenceGate::open(&path).unwrap();
    assert_eq!(gate.highest("orders").unwrap(), Some(34));
    assert_eq!(gate.highest("odd\tname\n").unwrap(), Some(7));
    assert_eq!(gate.highest("never").unwrap(), None);
    // The restarted gate still refuses the paused writer.
    assert!(matches!(
        gate.admit("orders", 33),
        Err(FenceError::Stale {
            token: 33,
            highest: 34,
            ..
        })
    ));
    assert_eq!(gate.admit("orders", 34).unwrap(), Admission::Repeated);
}

#[test]
fn open_creates_the_file_and_needs_its_directory() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    FileFenceGate::open(&path).unwrap();
    assert!(path.exists(), "an empty state file is written at open");
    assert!(FileFenceGate::open(&path)
        .unwrap()
        .highest("x")
        .unwrap()
        .is_none());

    let missing = dir.path().join("no-such-dir").join("fence");
    let err = FileFenceGate::open(&missing).unwrap_err();
    assert!(matches!(err, FenceError::Io { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-dir"), "{err}");
    assert!(!missing.exists());
}

#[test]
fn open_of_a_directory_is_an_io_error() {
    let dir = TempDir::new().unwrap();
    let err = FileFenceGate::open(dir.path()).unwrap_err();
    assert!(matches!(err, FenceError::Io { .. }), "{err:?}");
}

#[test]
fn refused_and_repeated_tokens_do_not_touch_the_file() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let gate = FileFenceGate::open(&path).unwrap();
    gate.admit("r", 10).unwrap();
    let before = fs::read(&path).unwrap();
    gate.admit("r", 10).unwrap();
    gate.admit("r", 9).unwrap_err();
    gate.admit("r", 0).unwrap_err();
    gate.admit("new", 0).unwrap_err();
    assert_eq!(fs::read(&path).unwrap(), before);
}

#[test]
fn file_is_the_documented_format() {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let gate = FileFenceGate::open(&path).unwrap();
    gate.admit("b", 2).unwrap();
    gate.admit("a\t\\", 1).unwrap();
    let text = fs::read_to_string(&path).unwrap();
    assert_eq!(text, craft("latchkey-fence 1\na\\t\\\\\t1\nb\t2\n", 2));
    assert!(!dir.path().join("fence.state.tmp").exists());
}

// ---------------------------------------------------------------------------
// FileFenceGate: failed persists admit nothing
// ---------------------------------------------------------------------------

fn assert_io(result: Result<Admission, FenceError>) {
    match result {
        Err(e @ FenceError::Io { .. }) => {
            assert!(e.to_string().contains("nothing was admitted"), "{e}");
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
}

#[test]
fn persist_failure_when_directory_removed() {
    let dir = TempDir::new().unwrap();
    let sub = dir.path().join("gone");
    fs::create_dir(&sub).unwrap();
    let gate = FileFenceGate::open(sub.join("fence")).unwrap();
    gate.admit("r", 5).unwrap();
    fs::remove_dir_all(&sub).unwrap();

    assert_io(gate.admit("r", 6));
    assert_eq!(gate.highest("r").unwrap(), Some(5));
    assert_io(gate.admit("new", 1));
    assert_eq!(gate.highest("new").unwrap(), None);
    // What needs no I/O still answers as before.
    assert_eq!(gate.admit("r", 5).unwrap(), Admission::Repeated);
    assert!(matches!(gate.admit("r", 4), Err(FenceError::Stale { .. })));

    // Once the directory is back, the same admission succeeds.
    fs::create_dir(&sub).unwrap();
    assert_eq!(
        gate.admit("r", 6).unwrap(),
        Admission::Raised { previous: Some(5) }
    );
    let reopened = FileFenceGate::open(sub.join("fence")).unwrap();
    assert_eq!(reopened.highest("r").unwrap(), Some(6));
    assert_eq!(reopened.highest("new").unwrap(), None);
}

#[test]
fn persist_failure_when_temp_file_cannot_be_created() {
    // A directory in the way of the temp file: fails even for root.
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let gate = FileFenceGate::open(&path).unwrap();
    gate.admit("r", 5).unwrap();
    let before = fs::read(&path).unwrap();
    let temp = dir.path().join("fence.state.tmp");
    fs::create_dir(&temp).unwrap();

    assert_io(gate.admit("r", 6));
    assert_eq!(gate.highest("r").unwrap(), Some(5));
    assert_eq!(fs::read(&path).unwrap(), before);

    fs::remove_dir(&temp).unwrap();
    gate.admit("r", 6).unwrap();
    assert_eq!(
        FileFenceGate::open(&path).unwrap().highest("r").unwrap(),
        Some(6)
    );
}

#[cfg(unix)]
#[test]
fn persist_failure_when_directory_read_only() {
    use std::os::unix::fs::PermissionsExt;

    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let gate = FileFenceGate::open(&path).unwrap();
    gate.admit("r", 5).unwrap();
    let set_mode = |mode| fs::set_permissions(dir.path(), fs::Permissions::from_mode(mode));
    set_mode(0o555).unwrap();
    // Root (or CAP_DAC_OVERRIDE) ignores permissions: nothing to check then.
    let probe = dir.path().join("probe");
    if fs::write(&probe, b"").is_ok() {
        fs::remove_file(&probe).unwrap();
        set_mode(0o755).unwrap();
        eprintln!("skipped: running with privileges that ignore directory permissions");
        return;
    }
    let result = gate.admit("r", 6);
    set_mode(0o755).unwrap();
    assert_io(result);
    assert_eq!(gate.highest("r").unwrap(), Some(5));
    assert_eq!(
        FileFenceGate::open(&path).unwrap().highest("r").unwrap(),
        Some(5)
    );
}

// ---------------------------------------------------------------------------
// FileFenceGate: damaged files
// ---------------------------------------------------------------------------

/// FNV-1a 64, as the format specifies.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A state file with `body` (header and entry lines) and a correct end line
/// claiming `count` entries.
fn craft(body: &str, count: u64) -> String {
    format!("{body}end\t{count}\t{:016x}\n", fnv1a(body.as_bytes()))
}

/// Open a gate on a file holding `bytes`.
fn open_with(bytes: &[u8]) -> (TempDir, Result<FileFenceGate, FenceError>) {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    fs::write(&path, bytes).unwrap();
    let result = FileFenceGate::open(&path);
    (dir, result)
}

/// The detail of the Corrupt error opening `bytes` gives.
fn corrupt_detail(bytes: &[u8]) -> String {
    let (dir, result) = open_with(bytes);
    match result {
        Err(e @ FenceError::Corrupt { .. }) => {
            let message = e.to_string();
            assert!(
                message.contains(&state_path(&dir).display().to_string()),
                "{message}"
            );
            let FenceError::Corrupt { detail, .. } = e else {
                unreachable!()
            };
            detail
        }
        Err(other) => panic!(
            "{:?}: expected Corrupt, got {other:?}",
            String::from_utf8_lossy(bytes)
        ),
        Ok(gate) => panic!(
            "{:?}: expected Corrupt, opened with {:?}",
            String::from_utf8_lossy(bytes),
            gate
        ),
    }
}

/// A valid file holding `entries`, written by the gate itself.
fn valid_file(entries: &BTreeMap<String, u64>) -> Vec<u8> {
    let dir = TempDir::new().unwrap();
    let path = state_path(&dir);
    let gate = FileFenceGate::open(&path).unwrap();
    for (resource, token) in entries {
        gate.admit(resource, *token).unwrap();
    }
    fs::read(&path).unwrap()
}

#[test]
fn crafted_valid_file_opens() {
    let (_dir, gate) = open_with(craft("latchkey-fence 1\nz\t9\na\\nb\t3\n", 2).as_bytes());
    let gate = gate.unwrap();
    assert_eq!(gate.highest("z").unwrap(), Some(9));
    assert_eq!(gate.highest("a\nb").unwrap(), Some(3));
}

#[test]
fn damaged_files_are_corrupt_with_a_reason() {
    let h = "latchkey-fence 1\n";
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "empty"),
        ("latchkey-fe".into(), "truncated"),
        ("latchkey-fence 1".into(), "truncated"),
        (h.into(), "truncated"),
        (format!("{h}a\t1\n"), "truncated"),
        (format!("{h}a\t1\nend\t1\t"), "truncated"),
        ("hello world\n".into(), "not a latchkey fence state file"),
        (craft("latchkey-fence 2\n", 0), "version \"2\""),
        (
            format!(
                "{h}a\t1\nend\t1\t{:016x}\n",
                fnv1a(format!("{h}a\t2\n").as_bytes())
            ),
            "checksum mismatch",
        ),
        (
            format!("{h}end\t0\t{:016x} \n", fnv1a(h.as_bytes())),
            "checksum mismatch",
        ),
        (format!("{h}end\t0\n"), "malformed end line"),
        (
            format!("{h}end\t00\t{:016x}\n", fnv1a(h.as_bytes())),
            "malformed entry count",
        ),
        (craft(&format!("{h}a\t1\n"), 2), "counts 2 entries but 1"),
        (craft(&format!("{h}a\t1\na\t2\n"), 2), "appears twice"),
        (
            craft(&format!("{h}a\\tb\t1\na\tb\t2\n"), 2),
            "malformed token",
        ),
        (craft(&format!("{h}a\t0\n"), 1), "token 0"),
        (craft(&format!("{h}a\t+5\n"), 1), "malformed token"),
        (craft(&format!("{h}a\t05\n"), 1), "malformed token"),
        (craft(&format!("{h}a\t-5\n"), 1), "malformed token"),
        (
            craft(&format!("{h}a\t18446744073709551616\n"), 1),
            "malformed token",
        ),
        (craft(&format!("{h}a 5\n"), 1), "no tab"),
        (craft(&format!("{h}a\\x\t5\n"), 1), "unknown escape"),
        (craft(&format!("{h}a\\\t5\n"), 1), "lone backslash"),
        (craft(&format!("{h}a\r\t5\n"), 1), "carriage return"),
    ];
    for (content, reason) in cases {
        let detail = corrupt_detail(content.as_bytes());
        assert!(
            detail.contains(reason),
            "{content:?}: detail {detail:?} does not mention {reason:?}"
        );
    }
    let detail = corrupt_detail(b"latchkey-fence 1\n\xff\t5\n");
    assert!(detail.contains("not UTF-8"), "{detail}");
}

#[test]
fn every_prefix_of_a_valid_file_is_corrupt() {
    let entries: BTreeMap<String, u64> = [("alpha", 3), ("beta\tb", 99), ("", 1)]
        .into_iter()
        .map(|(r, t)| (r.to_owned(), t))
        .collect();
    let bytes = valid_file(&entries);
    for len in 0..bytes.len() {
        corrupt_detail(&bytes[..len]);
    }
    // And the whole file opens, with every token.
    let (_dir, gate) = open_with(&bytes);
    let gate = gate.unwrap();
    for (resource, token) in &entries {
        assert_eq!(gate.highest(resource).unwrap(), Some(*token));
    }
}

fn entries_strategy() -> impl Strategy<Value = BTreeMap<String, u64>> {
    prop::collection::btree_map(any::<String>(), 1..=u64::MAX, 0..6)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Arbitrary bytes as the state file: a Corrupt error (or, by freak
    /// chance, a valid gate), never a panic and never an I/O error.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let (_dir, result) = open_with(&bytes);
        prop_assert!(
            matches!(result, Ok(_) | Err(FenceError::Corrupt { .. })),
            "{:?}", result
        );
    }

    /// Text that looks almost right: a header and tab-separated lines.
    #[test]
    fn arbitrary_lines_never_panic(
        lines in prop::collection::vec("[a-z\\\\\t0-9+-]{0,12}", 0..6),
        end in "end\t[0-9]{0,3}\t[0-9a-f]{0,17}",
    ) {
        let text = format!("latchkey-fence 1\n{}\n{end}\n", lines.join("\n"));
        let (_dir, result) = open_with(text.as_bytes());
        prop_assert!(
            matches!(result, Ok(_) | Err(FenceError::Corrupt { .. })),
            "{:?}", result
        );
    }

    /// Any change of one byte of a valid file is detected.
    #[test]
    fn any_single_byte_change_is_corrupt(
        entries in entries_strategy(),
        position in any::<prop::sample::Index>(),
        new_byte in any::<u8>(),
    ) {
        let mut bytes = valid_file(&entries);
        let i = position.index(bytes.len());
        prop_assume!(bytes[i] != new_byte);
        bytes[i] = new_byte;
        let (_dir, result) = open_with(&bytes);
        prop_assert!(matches!(result, Err(FenceError::Corrupt { .. })), "{:?}", result);
    }

    /// Any truncation of a valid file is detected.
    #[test]
    fn any_truncation_is_corrupt(entries in entries_strategy(), cut in any::<prop::sample::Index>()) {
        let bytes = valid_file(&entries);
        let len = cut.index(bytes.len());
        let (_dir, result) = open_with(&bytes[..len]);
        prop_assert!(matches!(result, Err(FenceError::Corrupt { .. })), "{:?}", result);
    }

    /// Any resource names and tokens survive a restart.
    #[test]
    fn any_names_and_tokens_round_trip(entries in entries_strategy()) {
        let bytes = valid_file(&entries);
        let (_dir, gate) = open_with(&bytes);
        let gate = gate.unwrap();
        for (resource, token) in &entries {
            prop_assert_eq!(gate.highest(resource).unwrap(), Some(*token));
        }
    }
}
