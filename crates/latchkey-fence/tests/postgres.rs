//! The PostgreSQL gate inside real transactions, against a scratch server
//! of each test's own: a newer writer waits for the open check, a stale
//! writer is refused after the newer one committed, stricter isolation
//! fails safe, and concurrent holders never interleave.
//!
//! `a_newer_writer_waits_for_the_open_check` is the test that fails when the
//! check leaves the write's transaction (the stale write then lands last).
//! Without PostgreSQL installed these tests say so and pass, unless
//! `LATCHKEY_REQUIRE_POSTGRES` is set (as `cargo xtask test` does, after
//! installing it).

mod support;

use std::time::{Duration, Instant};

use latchkey_fence::{Admission, FenceError, PgFence, ScratchPostgres};
use tokio_postgres::{Client, IsolationLevel, NoTls};

const RESOURCE: &str = "orders";

async fn connect(server: &ScratchPostgres) -> Client {
    let (db, connection) = tokio_postgres::connect(&server.connection_string(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db
}

/// A guarded database: one document row and a log of writes in the order
/// they ran (`seq` comes from a sequence, taken when the row is inserted).
async fn setup(server: &ScratchPostgres) -> (Client, PgFence) {
    let db = connect(server).await;
    db.batch_execute(
        "CREATE TABLE doc (id INT PRIMARY KEY, owner TEXT NOT NULL);
         CREATE TABLE log (seq BIGSERIAL PRIMARY KEY, owner TEXT NOT NULL);",
    )
    .await
    .unwrap();
    let fence = PgFence::new();
    fence.install(&db).await.unwrap();
    fence.install(&db).await.unwrap(); // idempotent
    (db, fence)
}

/// The guarded write: the document becomes `owner`'s, and the log says so.
async fn write(db: &impl tokio_postgres::GenericClient, owner: &str) {
    db.execute(
        "INSERT INTO doc (id, owner) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET owner = $1",
        &[&owner],
    )
    .await
    .unwrap();
    db.execute("INSERT INTO log (owner) VALUES ($1)", &[&owner])
        .await
        .unwrap();
}

async fn owner(db: &Client) -> Option<String> {
    db.query_opt("SELECT owner FROM doc WHERE id = 1", &[])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

async fn log(db: &Client) -> Vec<String> {
    db.query("SELECT owner FROM log ORDER BY seq", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_writer_waits_for_the_open_check() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (observer, fence) = setup(&server).await;
    let mut a = connect(&server).await;
    let tx_a = a.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx_a, RESOURCE, 33).await.unwrap(),
        Admission::Raised { previous: None }
    );

    // Writer B (token 34) starts while A's check is open.
    let mut b = connect(&server).await;
    let b_pid: i32 = b
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let b_task = tokio::spawn({
        let fence = fence.clone();
        async move {
            let tx_b = b.transaction().await.unwrap();
            let admitted = fence.admit(&tx_b, RESOURCE, 34).await.unwrap();
            write(&tx_b, "B").await;
            tx_b.commit().await.unwrap();
            admitted
        }
    });
    // Go on once B waits for a lock or is done (with the check out of the
    // transaction, B does not wait and is done first).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: bool = observer
            .query_one(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) \
                 FROM pg_stat_activity WHERE pid = $1",
                &[&b_pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting || b_task.is_finished() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writer B neither waited nor finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    write(&tx_a, "A").await;
    tx_a.commit().await.unwrap();
    assert_eq!(
        b_task.await.unwrap(),
        Admission::Raised { previous: Some(33) }
    );

    assert_eq!(
        log(&observer).await,
        ["A", "B"],
        "the newer writer's write must land last"
    );
    assert_eq!(owner(&observer).await.as_deref(), Some("B"));
    assert_eq!(fence.highest(&observer, RESOURCE).await.unwrap(), Some(34));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_is_refused_after_the_newer_commit() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (mut db, fence) = setup(&server).await;
    for (token, who) in [(33, "A"), (34, "B")] {
        let tx = db.transaction().await.unwrap();
        fence.admit(&tx, RESOURCE, token).await.unwrap();
        write(&tx, who).await;
        tx.commit().await.unwrap();
    }
    let tx = db.transaction().await.unwrap();
    let err = fence.admit(&tx, RESOURCE, 33).await.unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { token: 33, highest: 34, ref resource } if resource == RESOURCE),
        "{err:?}"
    );
    // Committing anyway changes nothing.
    tx.commit().await.unwrap();
    assert_eq!(owner(&db).await.as_deref(), Some("B"));
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(34));

    let tx = db.transaction().await.unwrap();
    assert_eq!(
        fence.admit(&tx, RESOURCE, 34).await.unwrap(),
        Admission::Repeated
    );
    for (bad, zero) in [(0, true), (i64::MAX as u64 + 1, false)] {
        let err = fence.admit(&tx, RESOURCE, bad).await.unwrap_err();
        match err {
            FenceError::ZeroToken { .. } => assert!(zero),
            FenceError::TokenTooLarge { .. } => assert!(!zero),
            other => panic!("{other:?}"),
        }
    }
    tx.commit().await.unwrap();
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(34));
}

/// Under REPEATABLE READ a check that would have to wait for a newer
/// commit fails with a serialization error instead: nothing is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_fails_safe() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (mut db, fence) = setup(&server).await;
    let tx = db.transaction().await.unwrap();
    fence.admit(&tx, RESOURCE, 10).await.unwrap();
    tx.commit().await.unwrap();

    let mut a = connect(&server).await;
    let tx_a = a
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .start()
        .await
        .unwrap();
    tx_a.query_one("SELECT 1", &[]).await.unwrap(); // takes the snapshot
    let tx = db.transaction().await.unwrap();
    fence.admit(&tx, RESOURCE, 11).await.unwrap();
    tx.commit().await.unwrap();

    let err = fence.admit(&tx_a, RESOURCE, 12).await.unwrap_err();
    let FenceError::Database { ref source, .. } = err else {
        panic!("expected a serialization failure, got {err:?}");
    };
    let code = source
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(|e| e.code())
        .cloned();
    assert_eq!(
        code,
        Some(tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE)
    );
    drop(tx_a);
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_missing_tables_are_errors() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let mut db = connect(&server).await;
    let fence = PgFence::with_table("not_installed").unwrap();
    let tx = db.transaction().await.unwrap();
    let err = fence.admit(&tx, RESOURCE, 1).await.unwrap_err();
    assert!(matches!(err, FenceError::Database { .. }), "{err:?}");
    assert!(err.to_string().contains("not_installed"), "{err}");
    drop(tx);

    let fence = PgFence::new();
    fence.install(&db).await.unwrap();
    let tx = db.transaction().await.unwrap();
    let err = fence.admit(&tx, "nul\0name", 1).await.unwrap_err();
    assert!(matches!(err, FenceError::Database { .. }), "{err:?}");
    drop(tx);
    assert!(matches!(
        PgFence::with_table("x; DROP TABLE doc"),
        Err(FenceError::BadTableName { .. })
    ));
}

/// Many holders on their own connections: every accepted writer's rows are
/// contiguous in the log (sequence numbers are taken at insert time, so
/// writers running at once would interleave them), and tokens never go back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_holders_never_interleave() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (db, fence) = setup(&server).await;
    const WRITERS: u64 = 6;
    const ROUNDS: u64 = 12;
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let mut conn = connect(&server).await;
        let fence = fence.clone();
        tasks.push(tokio::spawn(async move {
            let mut accepted = 0;
            for round in 0..ROUNDS {
                let token = round * WRITERS + w + 1;
                let tx = conn.transaction().await.unwrap();
                if fence.admit(&tx, RESOURCE, token).await.is_err() {
                    continue;
                }
                for part in 0..3 {
                    tx.execute(
                        "INSERT INTO log (owner) VALUES ($1)",
                        &[&format!("{token}/{part}")],
                    )
                    .await
                    .unwrap();
                    tokio::task::yield_now().await;
                }
                tx.commit().await.unwrap();
                accepted += 1;
            }
            accepted
        }));
    }
    let mut accepted = 0;
    for task in tasks {
        accepted += task.await.unwrap();
    }
    let rows = log(&db).await;
    assert_eq!(rows.len(), 3 * accepted);
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
