//! The PostgreSQL gate inside real transactions, against a scratch server
//! of each test's own: a newer writer waits for the open check, a stale
//! writer is refused after the newer one committed (or while waiting behind
//! it), a savepoint rolled back after the check does not undo it, stricter
//! isolation fails safe, and concurrent holders never interleave.
//!
//! `a_newer_writer_waits_for_the_open_check` is the test that fails when the
//! check leaves the write's transaction (the stale write then lands last).
//! Without PostgreSQL installed these tests say so and pass, unless
//! `LATCHKEY_REQUIRE_POSTGRES` is set (as `cargo xtask test` does, after
//! installing it).

mod support;

use std::time::{Duration, Instant};

use latchkey_fence::{Admission, FenceError, PgFence, ScratchPostgres};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, IsolationLevel, NoTls};

const RESOURCE: &str = "orders";

async fn connect(server: &ScratchPostgres) -> Client {
    let (db, connection) = tokio_postgres::connect(&server.connection_string(), NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    db
}

async fn backend_pid(db: &Client) -> i32 {
    db.query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
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

/// Returns once the backend `pid` waits for a lock or `task` is done (20 s
/// at most).
async fn wait_for_lock<T>(observer: &Client, pid: i32, task: &JoinHandle<T>) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let waiting: bool = observer
            .query_one(
                "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) \
                 FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if waiting || task.is_finished() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {pid} neither waited nor finished"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Writer `who` with `token`, on its own connection: begin, write, commit.
fn spawn_writer(
    fence: &PgFence,
    mut db: Client,
    token: u64,
    who: &'static str,
) -> JoinHandle<Result<Admission, FenceError>> {
    let fence = fence.clone();
    tokio::spawn(async move {
        let (tx, admission) = fence.begin(&mut db, RESOURCE, token).await?;
        write(&tx, who).await;
        tx.commit().await.unwrap();
        Ok(admission)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_writer_waits_for_the_open_check() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (observer, fence) = setup(&server).await;
    let mut a = connect(&server).await;
    let (tx_a, admission) = fence.begin(&mut a, RESOURCE, 33).await.unwrap();
    assert_eq!(admission, Admission::Raised { previous: None });

    // Writer B (token 34) starts while A's check is open. Go on once B
    // waits for a lock or is done (with the check out of the transaction,
    // B does not wait and is done first).
    let b = connect(&server).await;
    let b_pid = backend_pid(&b).await;
    let b_task = spawn_writer(&fence, b, 34, "B");
    wait_for_lock(&observer, b_pid, &b_task).await;
    write(&tx_a, "A").await;
    tx_a.commit().await.unwrap();
    assert_eq!(
        b_task.await.unwrap().unwrap(),
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

/// A stale writer that starts while the newer writer's check is open waits
/// for it, and is then refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_waiting_behind_the_newer_is_refused() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (observer, fence) = setup(&server).await;
    let mut newer = connect(&server).await;
    let (tx, _) = fence.begin(&mut newer, RESOURCE, 34).await.unwrap();
    let stale = connect(&server).await;
    let stale_pid = backend_pid(&stale).await;
    let stale_task = spawn_writer(&fence, stale, 33, "stale");
    wait_for_lock(&observer, stale_pid, &stale_task).await;
    assert!(!stale_task.is_finished(), "the stale writer did not wait");
    write(&tx, "newer").await;
    tx.commit().await.unwrap();
    let err = stale_task.await.unwrap().unwrap_err();
    support::assert_stale(&err, 33, 34);
    assert_eq!(log(&observer).await, ["newer"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_writer_is_refused_after_the_newer_commit() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (mut db, fence) = setup(&server).await;
    for (token, who) in [(33, "A"), (34, "B")] {
        let (tx, _) = fence.begin(&mut db, RESOURCE, token).await.unwrap();
        write(&tx, who).await;
        tx.commit().await.unwrap();
    }
    let err = fence
        .begin(&mut db, RESOURCE, 33)
        .await
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(err, FenceError::Stale { token: 33, highest: 34, ref resource } if resource == RESOURCE),
        "{err:?}"
    );
    assert!(!err.retry());
    assert_eq!(owner(&db).await.as_deref(), Some("B"));
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(34));

    let (tx, admission) = fence.begin(&mut db, RESOURCE, 34).await.unwrap();
    assert_eq!(admission, Admission::Repeated);
    tx.commit().await.unwrap();
    for (bad, zero) in [(0, true), (i64::MAX as u64 + 1, false)] {
        let err = fence
            .begin(&mut db, RESOURCE, bad)
            .await
            .map(drop)
            .unwrap_err();
        match err {
            FenceError::ZeroToken { .. } => assert!(zero),
            FenceError::TokenTooLarge { .. } => assert!(!zero),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(34));
}

/// A savepoint taken after the check and rolled back leaves the check, and
/// its row lock, in place: a newer writer still waits for the commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_savepoint_rolled_back_after_the_check_keeps_it() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (observer, fence) = setup(&server).await;
    let mut a = connect(&server).await;
    let (mut tx, _) = fence.begin(&mut a, RESOURCE, 3).await.unwrap();
    {
        let sp = tx.savepoint("undo_me").await.unwrap();
        write(&sp, "undone").await;
        sp.rollback().await.unwrap();
    }
    assert_eq!(fence.highest(&tx, RESOURCE).await.unwrap(), Some(3));
    let b = connect(&server).await;
    let b_pid = backend_pid(&b).await;
    let b_task = spawn_writer(&fence, b, 4, "B");
    wait_for_lock(&observer, b_pid, &b_task).await;
    assert!(
        !b_task.is_finished(),
        "the newer writer did not wait for the check"
    );
    write(&tx, "A").await;
    tx.commit().await.unwrap();
    assert_eq!(
        b_task.await.unwrap().unwrap(),
        Admission::Raised { previous: Some(3) }
    );
    assert_eq!(log(&observer).await, ["A", "B"]);
}

/// Under REPEATABLE READ a check that waited for a newer commit fails with
/// a serialization error instead: nothing is admitted, and it says retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeatable_read_fails_safe() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let (mut db, fence) = setup(&server).await;
    let (tx, _) = fence.begin(&mut db, RESOURCE, 10).await.unwrap();
    tx.commit().await.unwrap();

    // A holds the row (token 11, not yet committed); B, under REPEATABLE
    // READ, checks: it waits for A, and A's commit comes after B's snapshot.
    let mut a = connect(&server).await;
    let (tx_a, _) = fence.begin(&mut a, RESOURCE, 11).await.unwrap();
    let mut b = connect(&server).await;
    let b_pid = backend_pid(&b).await;
    let b_task = tokio::spawn({
        let fence = fence.clone();
        async move {
            let builder = b
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead);
            fence.begin_with(builder, RESOURCE, 12).await.map(drop)
        }
    });
    wait_for_lock(&db, b_pid, &b_task).await;
    tx_a.commit().await.unwrap();
    let err = b_task.await.unwrap().unwrap_err();
    assert!(
        matches!(err, FenceError::Database { retry: true, .. }),
        "expected a serialization failure, got {err:?}"
    );
    assert!(err.to_string().contains("40001"), "{err}");
    assert!(err.retry());
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), Some(11));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_and_missing_tables_are_errors() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let mut db = connect(&server).await;
    let fence = PgFence::with_table("not_installed").unwrap();
    let err = fence
        .begin(&mut db, RESOURCE, 1)
        .await
        .map(drop)
        .unwrap_err();
    assert!(
        matches!(err, FenceError::Database { retry: false, .. }),
        "{err:?}"
    );
    // The server's words, not the driver's bare "db error".
    let text = err.to_string();
    assert!(text.contains("\"not_installed\" does not exist"), "{text}");
    assert!(text.contains("42P01"), "{text}");

    let fence = PgFence::new();
    fence.install(&db).await.unwrap();
    let err = fence
        .begin(&mut db, "nul\0name", 1)
        .await
        .map(drop)
        .unwrap_err();
    assert!(matches!(err, FenceError::Database { .. }), "{err:?}");
    assert!(matches!(
        PgFence::with_table("x; DROP TABLE doc"),
        Err(FenceError::BadTableName { .. })
    ));
    // Reserved words and a schema name are fine (names are quoted).
    db.batch_execute("CREATE SCHEMA app").await.unwrap();
    let order = PgFence::with_table("app.order").unwrap();
    order.install(&db).await.unwrap();
    let (tx, _) = order.begin(&mut db, RESOURCE, 9).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(order.highest(&db, RESOURCE).await.unwrap(), Some(9));
    assert_eq!(fence.highest(&db, RESOURCE).await.unwrap(), None);
}

/// Services starting together may all install the table. (Without the
/// advisory lock, some of 20 rounds of 6 simultaneous installs fail with a
/// duplicate key in PostgreSQL's catalog.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_installs_all_succeed() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    const SERVICES: usize = 6;
    let mut conns = Vec::new();
    for _ in 0..SERVICES {
        conns.push(std::sync::Arc::new(connect(&server).await));
    }
    for round in 0..20 {
        let fence = PgFence::with_table(&format!("fence_{round}")).unwrap();
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(SERVICES));
        let mut tasks = Vec::new();
        for db in &conns {
            let (db, fence, start) = (db.clone(), fence.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                start.wait().await;
                fence.install(&*db).await
            }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
    }
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
                let tx = match fence.begin(&mut conn, RESOURCE, token).await {
                    Ok((tx, _)) => tx,
                    Err(FenceError::Stale { .. }) => continue,
                    Err(e) => panic!("{e}"),
                };
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
    assert!(accepted > 0, "no writer was admitted");
    assert_eq!(rows.len(), 3 * accepted);
    support::assert_writers_contiguous(&rows);
}
