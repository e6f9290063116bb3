//! The SQLite gate inside real transactions: a newer writer waits for the
//! open check, a stale writer is refused after the newer one committed (or
//! while waiting behind it), a connection already in a transaction is
//! refused, and a savepoint rolled back after the check does not undo it.
//!
//! `a_newer_writer_waits_for_the_open_check` is the test that fails when the
//! check leaves the write's transaction (the stale write then lands last).

mod support;

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
    let (tx_a, admission) = fence.begin(&mut a, RESOURCE, 33).unwrap();
    assert_eq!(admission, Admission::Raised { previous: None });

    // Writer B (token 34) starts while A's check is open.
    let b = thread::spawn({
        let (path, fence) = (path.clone(), fence.clone());
        move || {
            let mut b = open(&path);
            b.busy_handler(Some(b_busy)).unwrap();
            let (tx_b, admitted) = fence.begin(&mut b, RESOURCE, 34).unwrap();
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
        let (tx, _) = fence.begin(&mut db, RESOURCE, token).unwrap();
        write(&tx, who);
        tx.commit().unwrap();
    }
    // A wakes up with 33.
    let err = fence.begin(&mut db, RESOURCE, 33).map(drop).unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { token: 33, highest: 34, ref resource } if resource == RESOURCE),
        "{err:?}"
    );
    assert!(!err.retry());
    assert!(
        db.is_autocommit(),
        "the refused transaction was not rolled back"
    );
    assert_eq!(owner(&db).as_deref(), Some("B"));
    assert_eq!(log(&db), ["A", "B"]);

    // The same holder again is admitted without a raise.
    let (tx, admission) = fence.begin(&mut db, RESOURCE, 34).unwrap();
    assert_eq!(admission, Admission::Repeated);
    tx.commit().unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(34));
}

#[test]
fn a_refused_check_leaves_nothing() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    fence
        .begin(&mut db, RESOURCE, 10)
        .unwrap()
        .0
        .commit()
        .unwrap();
    for bad in [0, 9, i64::MAX as u64 + 1] {
        assert!(fence.begin(&mut db, RESOURCE, bad).is_err(), "{bad}");
        assert!(db.is_autocommit(), "{bad}: the transaction is still open");
        assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(10), "{bad}");
    }
    assert!(matches!(
        fence.begin(&mut db, "fresh", 0),
        Err(FenceError::ZeroToken { .. })
    ));
    assert_eq!(fence.highest(&db, "fresh").unwrap(), None);
}

/// A stale writer that starts while the newer writer's check is open waits
/// for it, and is then refused.
#[test]
fn a_stale_writer_waiting_behind_the_newer_is_refused() {
    let (_dir, path, fence) = setup();
    let mut newer = open(&path);
    let (tx, _) = fence.begin(&mut newer, RESOURCE, 34).unwrap();
    let stale = thread::spawn({
        let (path, fence) = (path.clone(), fence.clone());
        move || {
            let mut db = open(&path);
            fence.begin(&mut db, RESOURCE, 33).map(drop)
        }
    });
    thread::sleep(Duration::from_millis(50));
    write(&tx, "newer");
    tx.commit().unwrap();
    let err = stale.join().unwrap().unwrap_err();
    support::assert_stale(&err, 33, 34);
    assert_eq!(log(&open(&path)), ["newer"]);
}

#[test]
fn a_connection_already_in_a_transaction_is_refused() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    db.execute_batch("BEGIN").unwrap();
    let err = fence.begin(&mut db, RESOURCE, 5).map(drop).unwrap_err();
    assert!(
        matches!(err, FenceError::NestedTransaction { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("already inside a transaction"),
        "{err}"
    );
    db.execute_batch("ROLLBACK").unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), None);
}

/// A savepoint taken after the check and rolled back leaves the check (and
/// the write lock) in place.
#[test]
fn a_savepoint_rolled_back_after_the_check_keeps_it() {
    let (_dir, path, fence) = setup();
    let mut db = open(&path);
    let (mut tx, _) = fence.begin(&mut db, RESOURCE, 3).unwrap();
    {
        let mut sp = tx.savepoint().unwrap();
        write(&sp, "undone");
        sp.rollback().unwrap();
    }
    assert_eq!(fence.highest(&tx, RESOURCE).unwrap(), Some(3));
    write(&tx, "kept");
    tx.commit().unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).unwrap(), Some(3));
    assert_eq!(log(&db), ["kept"]);
}

#[test]
fn tables_are_named_and_separate() {
    let (_dir, path, default) = setup();
    let mut db = open(&path);
    let other = SqliteFence::with_table("orders_fence").unwrap();
    assert_eq!(other.table(), "orders_fence");
    other.install(&db).unwrap();
    other.install(&db).unwrap(); // idempotent
    other
        .begin(&mut db, RESOURCE, 50)
        .unwrap()
        .0
        .commit()
        .unwrap();
    default
        .begin(&mut db, RESOURCE, 2)
        .unwrap()
        .0
        .commit()
        .unwrap();
    assert_eq!(other.highest(&db, RESOURCE).unwrap(), Some(50));
    assert_eq!(default.highest(&db, RESOURCE).unwrap(), Some(2));
    // Reserved words and a schema name are fine (names are quoted).
    let order = SqliteFence::with_table("main.order").unwrap();
    order.install(&db).unwrap();
    order
        .begin(&mut db, RESOURCE, 7)
        .unwrap()
        .0
        .commit()
        .unwrap();
    assert_eq!(order.highest(&db, RESOURCE).unwrap(), Some(7));
    for bad in ["", "1x", "a;b", "x y", "Orders", "sqlite_fence"] {
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
    let err = fence.begin(&mut db, RESOURCE, 1).map(drop).unwrap_err();
    assert!(
        matches!(err, FenceError::Database { retry: false, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("latchkey_fence"), "{err}");
    assert!(err.to_string().contains("no such table"), "{err}");
    assert!(db.is_autocommit());

    fence.install(&db).unwrap();
    // A row set by hand to a value no gate writes. (The table's CHECK
    // refuses negatives, so build a table without it.)
    let raw = SqliteFence::with_table("raw_fence").unwrap();
    db.execute_batch(
        "CREATE TABLE raw_fence (resource TEXT PRIMARY KEY, token BIGINT NOT NULL);
         INSERT INTO raw_fence VALUES ('orders', -5);",
    )
    .unwrap();
    let err = raw.begin(&mut db, RESOURCE, 1).map(drop).unwrap_err();
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
                    let tx = match fence.begin(&mut db, RESOURCE, token) {
                        Ok((tx, _)) => tx,
                        Err(FenceError::Stale { .. }) => continue,
                        Err(e) => panic!("{e}"),
                    };
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
    let accepted = accepted.load(Ordering::Relaxed) as usize;
    assert!(accepted > 0, "no writer was admitted");
    assert_eq!(rows.len(), 3 * accepted);
    support::assert_writers_contiguous(&rows);
}
