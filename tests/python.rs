//! The gRPC API from another language: tests/python/latchkey_client_test.py,
//! examples/python/lock_example.py and examples/python/config_sync.py, run
//! with Python's grpcio against a real three-process cluster; and the
//! Python package of clients/python, built from this checkout's .proto and
//! tested with pytest against a cluster of its own, its PostgreSQL fence
//! (and examples/python/fenced_postgres.py) against a throwaway PostgreSQL
//! server.
//!
//! Ignored by a plain `cargo test` (it needs a Python environment):
//! `cargo xtask test` runs it with LATCHKEY_PYTHON naming the python of a
//! virtualenv holding grpcio, grpcio-tools, grpcio-reflection, pytest,
//! setuptools and psycopg, and PostgreSQL installed. By hand:
//! `LATCHKEY_PYTHON=/path/to/venv/bin/python cargo test -p latchkey --test
//! python -- --ignored --nocapture`.

#[path = "support/mod.rs"]
mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use support::{run_cli, Cluster, LEADER_WAIT};

/// Bound on the test script (about 20 s on an idle machine).
const SCRIPT_LIMIT: Duration = Duration::from_secs(180);
/// Bound on the example (a few seconds).
const EXAMPLE_LIMIT: Duration = Duration::from_secs(60);
/// Bound on generating the stubs.
const PROTOC_LIMIT: Duration = Duration::from_secs(60);
/// Bound on building and installing the package (stubs included).
const INSTALL_LIMIT: Duration = Duration::from_secs(120);
/// Bound on the package's pytest run (about 40 s on an idle machine).
const PYTEST_LIMIT: Duration = Duration::from_secs(240);

/// The whole body: the script, the example and the wait for a leader.
const BODY_LIMIT: Duration = Duration::from_secs(300);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with grpcio: run it via `cargo xtask test`"]
async fn python_client_and_example() {
    let Some(python) = std::env::var_os("LATCHKEY_PYTHON").filter(|p| !p.is_empty()) else {
        panic!(
            "LATCHKEY_PYTHON is not set: run this test via `cargo xtask test`, which makes a \
             virtualenv with grpcio, grpcio-tools and grpcio-reflection and sets it; or set \
             LATCHKEY_PYTHON to such a python yourself"
        );
    };
    let work = tempfile::Builder::new()
        .prefix("latchkey-python-")
        .tempdir()
        .expect("create a temporary directory");
    let stubs = work.path().join("stubs");
    generate_stubs(&python, &stubs, work.path())
        .await
        .unwrap_or_else(|e| panic!("generating the Python stubs failed: {e:#}"));

    let mut c = Cluster::start("python", 3, &[])
        .await
        .expect("start the cluster");
    let outcome =
        tokio::time::timeout(BODY_LIMIT, body(&mut c, &python, &stubs, work.path())).await;
    c.finish(outcome, BODY_LIMIT);

    // The example again, over mutual TLS, against replicas with
    // certificates from `latchkey certs` that require client certificates.
    let certs = work.path().join("certs");
    let made = run_cli(&[
        "certs",
        "--out",
        &certs.display().to_string(),
        "--nodes",
        "3",
    ])
    .await;
    assert!(
        matches!(&made, Ok(out) if out.code == Some(0)),
        "latchkey certs: {made:?}"
    );
    let path = |name: &str| certs.join(name).display().to_string();
    let (ca, node, key) = (
        path("ca.pem"),
        path("node-{id}.pem"),
        path("node-{id}-key.pem"),
    );
    let mut c = Cluster::start(
        "python-tls",
        3,
        &[
            "--cacert",
            &ca,
            "--cert",
            &node,
            "--key",
            &key,
            "--client-cert-auth",
        ],
    )
    .await
    .expect("start the TLS cluster");
    let site = work.path().join("site");
    install_package(&python, work.path(), &site)
        .await
        .unwrap_or_else(|e| panic!("installing clients/python failed: {e:#}"));
    let outcome = tokio::time::timeout(
        BODY_LIMIT,
        example_over_tls(&mut c, &python, &stubs, &site, work.path(), &certs),
    )
    .await;
    c.finish(outcome, BODY_LIMIT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Python with grpcio-tools, setuptools and pytest: run it via `cargo xtask test`"]
async fn python_package_against_a_cluster() {
    let Some(python) = std::env::var_os("LATCHKEY_PYTHON").filter(|p| !p.is_empty()) else {
        panic!("LATCHKEY_PYTHON is not set: run this test via `cargo xtask test`");
    };
    let work = tempfile::Builder::new()
        .prefix("latchkey-python-package-")
        .tempdir()
        .expect("create a temporary directory");
    let site = work.path().join("site");
    let package = install_package(&python, work.path(), &site)
        .await
        .unwrap_or_else(|e| panic!("installing clients/python failed: {e:#}"));
    // The fence's tests and example write to a throwaway PostgreSQL.
    let pg = latchkey_fence::ScratchPostgres::start().unwrap_or_else(|e| panic!("{e}"));
    let mut c = Cluster::start("python-package", 3, &[])
        .await
        .expect("start the cluster");
    let outcome = tokio::time::timeout(
        BODY_LIMIT,
        pytest(&mut c, &python, &package, &site, work.path(), &pg),
    )
    .await;
    if !matches!(outcome, Ok(Ok(()))) {
        eprintln!("PostgreSQL's log:\n{}", pg.log_tail());
    }
    c.finish(outcome, BODY_LIMIT);
}

/// Copy clients/python into `work` (so the build writes nothing into the
/// checkout) and `pip install` it into `site`, its stubs generated from
/// this checkout's .proto; the copy's path.
async fn install_package(python: &OsString, work: &Path, site: &Path) -> Result<PathBuf> {
    let package = work.join("package");
    copy_tree(&repo_root().join("clients/python"), &package)?;
    let proto = repo_root().join("crates/latchkey-proto/proto/latchkey.proto");
    let args: Vec<OsString> = vec![
        "-m".into(),
        "pip".into(),
        "install".into(),
        "--quiet".into(),
        "--no-deps".into(),
        "--no-build-isolation".into(),
        "--no-index".into(),
        "--disable-pip-version-check".into(),
        "--target".into(),
        site.into(),
        package.clone().into(),
    ];
    run_python_with(
        "pip install clients/python",
        python,
        &args,
        &package,
        &[("LATCHKEY_PROTO", proto.into())],
        INSTALL_LIMIT,
        &work.join("install.log"),
    )
    .await?;
    Ok(package)
}

/// A copy of `from` in `to`, without build outputs and caches.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let skip = name == "build"
            || name == "__pycache__"
            || name == ".pytest_cache"
            || name.to_string_lossy().ends_with(".egg-info");
        if skip {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        if entry.file_type()?.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .with_context(|| format!("copy {} to {}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// The package's pytest suite against `c`, the replicas' pids given so its
/// last test can kill the leader.
async fn pytest(
    c: &mut Cluster,
    python: &OsString,
    package: &Path,
    site: &Path,
    work: &Path,
    pg: &latchkey_fence::ScratchPostgres,
) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let example = repo_root().join("examples/python/fenced_postgres.py");
    let out = run_python_with(
        "fenced_postgres.py",
        python,
        &[
            example.into(),
            c.endpoints_arg().into(),
            "--postgres".into(),
            pg.connection_string().into(),
        ],
        site,
        &[],
        EXAMPLE_LIMIT,
        &work.join("fenced_postgres.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("A's late write was refused"),
        "fenced_postgres.py exited 0 without finishing:\n{out}"
    );
    let example = repo_root().join("examples/python/fenced_lock.py");
    let out = run_python_with(
        "fenced_lock.py",
        python,
        &[example.into(), c.endpoints_arg().into()],
        site,
        &[],
        EXAMPLE_LIMIT,
        &work.join("fenced_lock.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("released and closed"),
        "fenced_lock.py exited 0 without finishing:\n{out}"
    );
    let pids: Vec<String> = c
        .ids()
        .into_iter()
        .filter_map(|id| c.pid(id).map(|pid| format!("{}={pid}", c.addr(id))))
        .collect();
    let args: Vec<OsString> = vec![
        "-m".into(),
        "pytest".into(),
        "-q".into(),
        "-p".into(),
        "no:cacheprovider".into(),
        package.join("tests").into(),
    ];
    run_python_with(
        "pytest clients/python/tests",
        python,
        &args,
        site,
        &[
            ("LATCHKEY_ENDPOINTS", c.endpoints_arg().into()),
            ("LATCHKEY_PIDS", pids.join(",").into()),
            ("LATCHKEY_POSTGRES", pg.connection_string().into()),
            (
                "LATCHKEY_CLUSTER_SECRET",
                std::fs::read_to_string(c.secret_file())
                    .context("read the cluster secret")?
                    .into(),
            ),
        ],
        PYTEST_LIMIT,
        &work.join("pytest.log"),
    )
    .await?;
    Ok(())
}

async fn example_over_tls(
    c: &mut Cluster,
    python: &OsString,
    stubs: &Path,
    site: &Path,
    work: &Path,
    certs: &Path,
) -> Result<()> {
    // Both scripts take the same TLS options: trust the CA, present the
    // client certificate; then the endpoints.
    let with_tls = |script: &str, more: &[OsString]| -> Vec<OsString> {
        let mut args: Vec<OsString> = vec![repo_root().join(script).into()];
        args.extend_from_slice(more);
        for (flag, file) in [
            ("--cacert", "ca.pem"),
            ("--cert", "client.pem"),
            ("--key", "client-key.pem"),
        ] {
            args.push(flag.into());
            args.push(certs.join(file).into());
        }
        args.push(c.endpoints_arg().into());
        args
    };
    // The whole contract over mutual TLS.
    run_python(
        "latchkey_client_test.py over TLS",
        python,
        &with_tls(
            "tests/python/latchkey_client_test.py",
            &["--stubs".into(), stubs.into()],
        ),
        stubs,
        SCRIPT_LIMIT,
        &work.join("client_test_tls.log"),
    )
    .await?;
    let out = run_python(
        "lock_example.py over TLS",
        python,
        &with_tls("examples/python/lock_example.py", &[]),
        stubs,
        EXAMPLE_LIMIT,
        &work.join("lock_example_tls.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("released and closed"),
        "lock_example.py over TLS exited 0 without finishing:\n{out}"
    );
    // The Python package's example, with `latchkey.Tls`.
    let out = run_python_with(
        "fenced_lock.py over TLS",
        python,
        &with_tls("examples/python/fenced_lock.py", &[]),
        site,
        &[],
        EXAMPLE_LIMIT,
        &work.join("fenced_lock_tls.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("released and closed"),
        "fenced_lock.py over TLS exited 0 without finishing:\n{out}"
    );
    c.assert_all_alive()
}

async fn body(c: &mut Cluster, python: &OsString, stubs: &Path, work: &Path) -> Result<()> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let endpoints = c.endpoints_arg();
    let root = repo_root();

    let script = root.join("tests/python/latchkey_client_test.py");
    let mut args: Vec<OsString> = vec![script.into(), "--stubs".into(), stubs.into()];
    args.push(endpoints.clone().into());
    run_python(
        "latchkey_client_test.py",
        python,
        &args,
        stubs,
        SCRIPT_LIMIT,
        &work.join("client_test.log"),
    )
    .await?;

    let example = root.join("examples/python/lock_example.py");
    let out = run_python(
        "lock_example.py",
        python,
        &[example.into(), endpoints.into()],
        stubs,
        EXAMPLE_LIMIT,
        &work.join("lock_example.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("released and closed"),
        "lock_example.py exited 0 without finishing:\n{out}"
    );
    let example = root.join("examples/python/config_sync.py");
    let out = run_python(
        "config_sync.py",
        python,
        &[example.into(), c.endpoints_arg().into()],
        stubs,
        EXAMPLE_LIMIT,
        &work.join("config_sync.log"),
    )
    .await?;
    anyhow::ensure!(
        out.contains("in sync at revision"),
        "config_sync.py exited 0 without finishing:\n{out}"
    );
    c.assert_all_alive()
}

/// `python -m grpc_tools.protoc` for proto/latchkey.proto into `out`.
async fn generate_stubs(python: &OsString, out: &Path, work: &Path) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
    let proto = repo_root().join("proto");
    let mut python_out = OsString::from("--python_out=");
    python_out.push(out);
    let mut grpc_out = OsString::from("--grpc_python_out=");
    grpc_out.push(out);
    let mut include = OsString::from("-I");
    include.push(&proto);
    let args: Vec<OsString> = vec![
        "-m".into(),
        "grpc_tools.protoc".into(),
        include,
        python_out,
        grpc_out,
        proto.join("latchkey.proto").into(),
    ];
    run_python(
        "grpc_tools.protoc",
        python,
        &args,
        out,
        PROTOC_LIMIT,
        &work.join("protoc.log"),
    )
    .await?;
    for stub in ["latchkey_pb2.py", "latchkey_pb2_grpc.py"] {
        anyhow::ensure!(
            out.join(stub).is_file(),
            "grpc_tools.protoc made no {stub} in {}",
            out.display()
        );
    }
    Ok(())
}

/// Run `python args...` (stubs on PYTHONPATH, unbuffered), its stdout and
/// stderr together in `log`; killed after `limit`. Prints the output, and
/// fails with it on a non-zero exit. Returns the output.
async fn run_python(
    what: &str,
    python: &OsString,
    args: &[OsString],
    stubs: &Path,
    limit: Duration,
    log: &Path,
) -> Result<String> {
    run_python_with(what, python, args, stubs, &[], limit, log).await
}

/// [`run_python`] with more environment (`env`), in `stubs`' parent.
async fn run_python_with(
    what: &str,
    python: &OsString,
    args: &[OsString],
    path: &Path,
    env: &[(&str, OsString)],
    limit: Duration,
    log: &Path,
) -> Result<String> {
    let file = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    let file2 = file.try_clone().context("clone a file handle")?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(python)
        .arg("-u")
        .args(args)
        .current_dir(path.parent().unwrap_or(path))
        .env("PYTHONPATH", path)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("LATCHKEY_ENDPOINTS")
        .env_remove("LATCHKEY_PY_STUBS")
        .envs(env.iter().map(|(k, v)| (*k, v)))
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(file2)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {} for {what}", Path::new(python).display()))?;
    let waited = tokio::time::timeout(limit, child.wait()).await;
    let output = || std::fs::read_to_string(log).unwrap_or_else(|e| format!("(no output: {e})"));
    let status = match waited {
        Ok(status) => status.with_context(|| format!("wait for {what}"))?,
        Err(_) => {
            let _ = child.kill().await;
            bail!(
                "{what} did not finish within {limit:?} and was killed; its output:\n{}",
                output()
            );
        }
    };
    let text = output();
    eprintln!(
        "----- {what}: {status} after {:.1} s -----\n{text}",
        started.elapsed().as_secs_f64()
    );
    if !status.success() {
        bail!("{what} failed ({status}); its output:\n{text}");
    }
    Ok(text)
}
