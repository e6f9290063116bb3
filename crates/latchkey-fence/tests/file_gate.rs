//! The durability and damage checks specific to `FileFenceGate` (its
//! rules are checked by the conformance suite).

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use latchkey_fence::{Admission, FenceError, FenceGate, FileFenceGate};
use proptest::prelude::*;
use tempfile::TempDir;

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
