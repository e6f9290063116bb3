//! The scratch PostgreSQL server: it asks for its password, keeps its
//! directories to itself, and the next start stops a server whose owner died
//! without stopping it.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio_postgres::NoTls;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_refused_and_the_directories_are_private() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let good = server.connection_string();
    let (db, connection) = tokio_postgres::connect(&good, NoTls).await.unwrap();
    tokio::spawn(connection);
    db.query_one("SELECT 1", &[]).await.unwrap();
    let bad = good.replace("password=", "password=x");
    assert!(tokio_postgres::connect(&bad, NoTls).await.is_err());
    for sub in ["data", "run"] {
        let mode = std::fs::metadata(server.dir().join(sub))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "{sub} is open to others: {mode:o}");
    }
}

#[test]
fn an_orphaned_server_is_stopped_by_the_next_start() {
    let Some(orphan) = support::scratch_postgres() else {
        return;
    };
    let pid = orphan.pid();
    let dir = orphan.dir().to_path_buf();
    // Its owner "dies": a pid that no longer exists, and no Drop runs.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead_pid = gone.id();
    gone.wait().unwrap();
    std::fs::write(dir.join("owner.pid"), dead_pid.to_string()).unwrap();
    std::mem::forget(orphan);

    let _next = support::scratch_postgres().expect("a second server");
    let deadline = Instant::now() + Duration::from_secs(20);
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    };
    while running() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!running(), "the orphaned server {pid} still runs");
    assert!(!dir.exists(), "{} was not deleted", dir.display());
}
