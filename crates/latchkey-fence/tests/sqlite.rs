//! The SQLite gate inside real transactions: a newer writer waits for the
//! open check, a stale writer is refused after the newer one committed, and
//! a check outside a transaction is refused.
//!
//! `a_newer_writer_waits_for_the_open_check` is the test that fails when the
//! check leaves the write's transaction (the stale write then lands last).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use latchkey_fence::{Admission, FenceError, SqliteFence};
use rusqlite::{params, Connection};
use tempfile::TempDir;

const RESOURCE: &str = "orders";

/// A guarded database: one document row, and a log of every write in the
/// order the writes ran.
fn open(path: &Path) -> Connection {
    let db = Connection::open(path).unwrap();
    db.busy_timeout(Duration::from_secs(20)).unwrap();
    db.execute_batch(
        "PRAGMA journal_mode=WAL;
         CREATE TABLE IF NOT EXISTS doc (id INTEGER PRIMARY KEY, owner TEXT NOT NULL);
         CREATE TABLE IF NOT EXISTS log (seq INTEGER PRIMARY KEY AUTOINCREMENT, owner TEXT NOT NULL);",
    )
    .unwrap();
    db
}

fn setup() -> (TempDir, std::path::PathBuf, SqliteFence) {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("guarded.db");
    let fence = SqliteFence::new();
    fence.install(&open(&path)).unwrap();
    (dir, path, fence)
}

/// The guarded write: the document becomes `owner`'s, and the log says so.
fn write(db: &Connection, owner: &str) {
    db.execute(
        "INSERT INTO doc (id, owner) VALUES (1, ?1) ON CONFLICT (id) DO UPDATE SET owner = ?1",
        params![owner],
    )
    .unwrap();
    db.execute("INSERT INTO log (owner) VALUES (?1)", params![owner])
        .unwrap();
}

fn owner(db: &Connection) -> Option<String> {
    db.query_row("SELECT owner FROM doc WHERE id = 1", [], |r| r.get(0))
        .ok()
}

fn log(db: &Connection) -> Vec<String> {
    let mut st = db.prepare("SELECT owner FROM log ORDER BY seq").unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// Set by writer B's busy handler: B is waiting for the database's write
/// lock. (A busy handler is a plain function, hence a static; only one test
/// uses it.)
static B_WAITS: AtomicBool = AtomicBool::new(false);

/// Writer B's busy handler: note that B waits, and keep waiting (20 s).
fn b_busy(attempt: i32) -> bool {
    B_WAITS.store(true, Ordering::SeqCst);
    thread::sleep(Duration::from_millis(10));
    attempt < 2_000
}

#[test]
fn a_newer_writer_waits_for_the_open_check() {
    let (_dir, path, fence) = setup();
    let mut a = open(&path);
    let tx_a = a.transaction().unwrap();
    assert_eq!(
        fence.admit(&tx_a, RESOURCE, 33).unwrap(),
        Admission::Raised { previous: None }
    );

    // Writer B (token 34) starts while A's check is open.
    let b = thread::spawn({
        let (path, fence) = (path.clone(), fence.clone());
        move || {
            let mut b = open(&path);
            b.busy_handler(Some(b_busy)).unwrap();
            let tx_b = b.transaction().unwrap();
            let admitted = fence.admit(&tx_b, RESOURCE, 34).unwrap();
            write(&tx_b, "B");
            tx_b.commit().unwrap();
            admitted
        }
    });
    // Go on once B waits for A or is done (with the check out of the
    // transaction, B does not wait and is done first).
    let deadline = Instant::now() + Duration::from_secs(20);
    while !B_WAITS.load(Ordering::SeqCst) && !b.is_finished() {
        assert!(
            Instant::now() < deadline,
            "writer B neither waited nor finished"
        );
        thread::sleep(Duration::from_millis(5));
    }
    write(&tx_a, "A");
    tx_a.commit().unwrap();
    assert_eq!(b.join().unwrap(), Admission::Raised { previous: Some(33) });

    let db = open(&path);
    assert_eq!(
        log(&db),
        ["A", "B"],
        "the newer writer's write must land last"
    );
    assert_eq!(owner(&db).as_deref(), Some("B"));
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(34));
}

#[test]
fn a_stale_writer_is_refused_after_the_newer_commit() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    for (token, who) in [(33, "A"), (34, "B")] {
        let tx = db.transaction().unwrap();
        fence.admit(&tx, RESOURCE, token).unwrap();
        write(&tx, who);
        tx.commit().unwrap();
    }
    // A wakes up with 33.
    let tx = db.transaction().unwrap();
    let err = fence.admit(&tx, RESOURCE, 33).unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { token: 33, highest: 34, ref resource } if resource == RESOURCE),
        "{err:?}"
    );
    drop(tx); // rolled back
    assert_eq!(owner(&db).as_deref(), Some("B"));
    assert_eq!(log(&db), ["A", "B"]);

    // The same holder again is admitted without a raise.
    let tx = db.transaction().unwrap();
    assert_eq!(fence.admit(&tx, RESOURCE, 34).unwrap(), Admission::Repeated);
    tx.commit().unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(34));
}

#[test]
fn a_refused_check_committed_anyway_changes_nothing() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    let tx = db.transaction().unwrap();
    fence.admit(&tx, RESOURCE, 10).unwrap();
    tx.commit().unwrap();
    for bad in [0, 9, i64::MAX as u64 + 1] {
        let tx = db.transaction().unwrap();
        assert!(fence.admit(&tx, RESOURCE, bad).is_err(), "{bad}");
        tx.commit().unwrap();
        assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(10), "{bad}");
    }
    // A refused first check leaves no admitted token either.
    let tx = db.transaction().unwrap();
    assert!(matches!(
        fence.admit(&tx, "fresh", 0),
        Err(FenceError::ZeroToken { .. })
    ));
    tx.commit().unwrap();
    assert_eq!(fence.highest(&db, "fresh").unwrap(), None);
}

#[test]
fn outside_a_transaction_the_check_is_refused() {
    let (_dir, path, fence) = setup();
    let db = open(&path);
    let err = fence.admit(&db, RESOURCE, 5).unwrap_err();
    assert!(
        matches!(err, FenceError::NotInTransaction { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("outside a transaction"), "{err}");
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), None);
    let rows: i64 = db
        .query_row("SELECT count(*) FROM latchkey_fence", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0);
}

#[test]
fn a_savepoint_and_a_plain_begin_are_transactions_too() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    {
        let mut tx = db.transaction().unwrap();
        let sp = tx.savepoint().unwrap();
        fence.admit(&sp, RESOURCE, 3).unwrap();
        sp.commit().unwrap();
        tx.commit().unwrap();
    }
    db.execute_batch("BEGIN IMMEDIATE").unwrap();
    assert_eq!(
        fence.admit(&db, RESOURCE, 4).unwrap(),
        Admission::Raised { previous: Some(3) }
    );
    db.execute_batch("COMMIT").unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(4));
}

#[test]
fn tables_are_named_and_separate() {
    let (_dir, path, default) = setup();
    let mut db = open(&path);
    let other = SqliteFence::with_table("orders_fence").unwrap();
    assert_eq!(other.table(), "orders_fence");
    other.install(&db).unwrap();
    other.install(&db).unwrap(); // idempotent
    let tx = db.transaction().unwrap();
    other.admit(&tx, RESOURCE, 50).unwrap();
    default.admit(&tx, RESOURCE, 2).unwrap();
    tx.commit().unwrap();
    assert_eq!(other.highest(&db, RESOURCE).unwrap(), Some(50));
    assert_eq!(default.highest(&db, RESOURCE).unwrap(), Some(2));
    for bad in ["", "1x", "a;b", "x y"] {
        assert!(matches!(
            SqliteFence::with_table(bad),
            Err(FenceError::BadTableName { .. })
        ));
    }
}

#[test]
fn a_missing_table_or_a_damaged_row_is_an_error_not_an_admission() {
    let dir = TempDir::new().unwrap();
    let mut db = open(&dir.path().join("guarded.db"));
    let fence = SqliteFence::new();
    let tx = db.transaction().unwrap();
    let err = fence.admit(&tx, RESOURCE, 1).unwrap_err();
    assert!(matches!(err, FenceError::Database { .. }), "{err:?}");
    assert!(err.to_string().contains("latchkey_fence"), "{err}");
    drop(tx);

    fence.install(&db).unwrap();
    // A row set by hand to a value no gate writes. (The table's CHECK
    // refuses negatives, so build a table without it.)
    let raw = SqliteFence::with_table("raw_fence").unwrap();
    db.execute_batch(
        "CREATE TABLE raw_fence (resource TEXT PRIMARY KEY, token BIGINT NOT NULL);
         INSERT INTO raw_fence VALUES ('orders', -5);",
    )
    .unwrap();
    let tx = db.transaction().unwrap();
    let err = raw.admit(&tx, RESOURCE, 1).unwrap_err();
    assert!(
        matches!(err, FenceError::CorruptRow { stored: -5, .. }),
        "{err:?}"
    );
}

/// Many writers on their own connections and threads: every accepted
/// writer's rows are contiguous in the log, and their tokens never go back.
#[test]
fn concurrent_holders_never_interleave() {
    let (_dir, path, fence) = setup();
    const WRITERS: u32 = 6;
    const ROUNDS: u32 = 15;
    let accepted = AtomicU32::new(0);
    thread::scope(|s| {
        for w in 0..WRITERS {
            let (path, fence, accepted) = (&path, &fence, &accepted);
            s.spawn(move || {
                let mut db = open(path);
                for round in 0..ROUNDS {
                    let token = u64::from(round * WRITERS + w + 1);
                    let tx = db.transaction().unwrap();
                    if fence.admit(&tx, RESOURCE, token).is_err() {
                        continue;
                    }
                    for part in 0..3 {
                        tx.execute(
                            "INSERT INTO log (owner) VALUES (?1)",
                            params![format!("{token}/{part}")],
                        )
                        .unwrap();
                        thread::yield_now();
                    }
                    tx.commit().unwrap();
                    accepted.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let db = open(&path);
    let rows = log(&db);
    assert_eq!(rows.len(), 3 * accepted.load(Ordering::Relaxed) as usize);
    let mut last = 0u64;
    for chunk in rows.chunks(3) {
        let token: u64 = chunk[0].split('/').next().unwrap().parse().unwrap();
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
