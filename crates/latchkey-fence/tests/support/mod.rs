//! What the database tests share: a scratch PostgreSQL server, or a clear
//! skip when PostgreSQL is not installed and the run does not require it.

use latchkey_fence::{ScratchPostgres, REQUIRE_ENV};

/// A scratch PostgreSQL server, or `None` (after saying so on stderr) when
/// PostgreSQL is not installed and `LATCHKEY_REQUIRE_POSTGRES` is unset.
/// Any other failure to start it fails the test.
#[allow(dead_code)]
pub fn scratch_postgres() -> Option<ScratchPostgres> {
    let server = ScratchPostgres::start_unless_missing().unwrap_or_else(|e| panic!("{e}"));
    if server.is_none() {
        eprintln!("SKIPPED: PostgreSQL is not installed (set {REQUIRE_ENV}=1 to fail instead)");
    }
    server
}

/// Fails unless `err` is the refusal of `token` because `highest` was seen.
#[allow(dead_code)]
pub fn assert_stale(err: &latchkey_fence::FenceError, token: u64, highest: u64) {
    assert!(
        matches!(
            err,
            latchkey_fence::FenceError::Stale { token: t, highest: h, .. } if *t == token && *h == highest
        ),
        "expected token {token} refused below {highest}, got {err:?}"
    );
}

/// Fails unless `rows` (log rows `token/part`, in the order they were
/// inserted) are whole runs of parts 0, 1, 2 per admitted writer, with
/// tokens never going back: no two writers ran their writes at once.
#[allow(dead_code)]
pub fn assert_writers_contiguous(rows: &[String]) {
    let mut last = 0u64;
    for chunk in rows.chunks(3) {
        let token: u64 = chunk[0]
            .split('/')
            .next()
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a log row that no writer wrote: {chunk:?}"));
        let expected: Vec<String> = (0..3).map(|p| format!("{token}/{p}")).collect();
        assert_eq!(
            chunk,
            expected.as_slice(),
            "a writer's rows were interleaved: {rows:?}"
        );
        assert!(token >= last, "token {token} wrote after {last}");
        last = token;
    }
}
