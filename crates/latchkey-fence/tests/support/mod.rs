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
