//! Every gate through the one conformance suite (`suite/mod.rs`): the
//! memory and file gates directly, the database gates through adapters that
//! run each admission in a transaction of its own and commit it.

mod suite;
mod support;

use std::path::PathBuf;
use std::sync::Mutex;

use latchkey_fence::{Admission, FenceError, FenceGate, FileFenceGate, MemoryFenceGate};
use suite::{conformance, Limits};
use tempfile::TempDir;

#[test]
fn memory_gate_conforms() {
    conformance(Limits::NONE, || Box::new(MemoryFenceGate::new()));
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
    conformance(Limits::NONE, || {
        let dir = TempDir::new().unwrap();
        let gate = FileFenceGate::open(dir.path().join("fence")).unwrap();
        Box::new(TempFileGate { gate, _dir: dir })
    });
}

/// The suite again, on a file gate reopened before every check of state:
/// whatever the suite observes must also be what a restarted gate loads.
#[test]
fn file_gate_conforms_after_reopen() {
    conformance(Limits::NONE, || {
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
// The database gates, one committed transaction per admission
// ---------------------------------------------------------------------------

/// An SQLite gate on a database file of its own: each admission begins a
/// transaction on a pooled connection and commits it (a refused one is
/// rolled back), so concurrent admissions meet in the database, not in a
/// mutex of the test.
struct SqliteAdapter {
    fence: latchkey_fence::SqliteFence,
    path: PathBuf,
    pool: Mutex<Vec<rusqlite::Connection>>,
    _dir: TempDir,
}

impl SqliteAdapter {
    fn new() -> SqliteAdapter {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("guarded.db");
        let fence = latchkey_fence::SqliteFence::new();
        let adapter = SqliteAdapter {
            fence,
            path,
            pool: Mutex::default(),
            _dir: dir,
        };
        let db = adapter.connection();
        adapter.fence.install(&db).unwrap();
        adapter.pool.lock().unwrap().push(db);
        adapter
    }

    fn connection(&self) -> rusqlite::Connection {
        if let Some(db) = self.pool.lock().unwrap().pop() {
            return db;
        }
        let db = rusqlite::Connection::open(&self.path).unwrap();
        db.busy_timeout(std::time::Duration::from_secs(30)).unwrap();
        db.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL")
            .unwrap();
        db
    }
}

impl FenceGate for SqliteAdapter {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let mut db = self.connection();
        let admitted = self
            .fence
            .begin(&mut db, resource, token)
            .map(|(tx, admission)| {
                tx.commit().unwrap();
                admission
            });
        self.pool.lock().unwrap().push(db);
        admitted
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        let db = self.connection();
        let highest = self.fence.highest(&db, resource);
        self.pool.lock().unwrap().push(db);
        highest
    }
}

#[test]
fn sqlite_gate_conforms() {
    conformance(Limits::database(true), || Box::new(SqliteAdapter::new()));
}

/// A PostgreSQL gate on a table of its own in one scratch server: each
/// admission runs on a pooled connection in its own transaction.
struct PgAdapter {
    fence: latchkey_fence::PgFence,
    runtime: std::sync::Arc<tokio::runtime::Runtime>,
    conninfo: String,
    pool: Mutex<Vec<tokio_postgres::Client>>,
}

impl PgAdapter {
    fn connection(&self) -> tokio_postgres::Client {
        if let Some(db) = self.pool.lock().unwrap().pop() {
            return db;
        }
        self.runtime.block_on(async {
            let (db, connection) = tokio_postgres::connect(&self.conninfo, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            db
        })
    }
}

impl FenceGate for PgAdapter {
    fn admit(&self, resource: &str, token: u64) -> Result<Admission, FenceError> {
        let mut db = self.connection();
        let admitted = self.runtime.block_on(async {
            let (tx, admission) = self.fence.begin(&mut db, resource, token).await?;
            tx.commit().await.unwrap();
            Ok(admission)
        });
        self.pool.lock().unwrap().push(db);
        admitted
    }

    fn highest(&self, resource: &str) -> Result<Option<u64>, FenceError> {
        let db = self.connection();
        let highest = self.runtime.block_on(self.fence.highest(&db, resource));
        self.pool.lock().unwrap().push(db);
        highest
    }
}

#[test]
fn postgres_gate_conforms() {
    let Some(server) = support::scratch_postgres() else {
        return;
    };
    let runtime = std::sync::Arc::new(tokio::runtime::Runtime::new().unwrap());
    let tables = std::sync::atomic::AtomicU32::new(0);
    conformance(Limits::database(false), || {
        let n = tables.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let fence = latchkey_fence::PgFence::with_table(&format!("fence_{n}")).unwrap();
        let adapter = PgAdapter {
            fence,
            runtime: runtime.clone(),
            conninfo: server.connection_string(),
            pool: Mutex::default(),
        };
        let db = adapter.connection();
        runtime.block_on(adapter.fence.install(&db)).unwrap();
        adapter.pool.lock().unwrap().push(db);
        Box::new(adapter)
    });
}
