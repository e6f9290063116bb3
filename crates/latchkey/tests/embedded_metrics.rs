//! The metrics listener on a real three-node cluster: `/metrics` in the
//! Prometheus text format with the Raft figures and the gRPC calls counted
//! by RPC and outcome, `/healthz` and `/readyz`, and the same text from
//! `Node::metrics` for an application that serves it itself; and the status
//! page in a headless Chromium (ignored unless run by `cargo xtask test`).

use std::collections::BTreeMap;
use std::time::Duration;

use latchkey::{Client, ClientOptions, Node};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod common;

use common::{addrs, client_addrs, reserve, secret, settings};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const LIMIT: Duration = Duration::from_secs(120);

/// `GET path` on `addr`: the status code and the body.
async fn http_get(
    addr: std::net::SocketAddr,
    path: &str,
) -> Result<(u16, String), Box<dyn std::error::Error>> {
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await?;
    let mut response = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        stream.read_to_string(&mut response),
    )
    .await??;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// The value of the sample `name` (with its labels, as printed), if any.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Poll `check` every 100 ms until it returns `Some`, for up to 30 s.
async fn eventually<T>(
    what: &str,
    mut check: impl AsyncFnMut() -> Result<Option<T>, Box<dyn std::error::Error>>,
) -> Result<T, Box<dyn std::error::Error>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!("{what}: not seen within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Three nodes with metrics listeners in `dir`, once they know their
/// leader, and a client of them.
async fn three_nodes(
    dir: &std::path::Path,
) -> Result<(BTreeMap<u64, Node>, u64, Client), Box<dyn std::error::Error>> {
    let listeners = reserve(3)?;
    let members = addrs(&listeners)?;
    let mut nodes = BTreeMap::new();
    for (id, ports) in listeners {
        let node = Node::builder(id)
            .listener(ports.client)
            .peer_listener(ports.peer)
            .metrics_listener(std::net::TcpListener::bind("127.0.0.1:0")?)
            .data_dir(dir.join(format!("node-{id}")))
            .initial_members(members.iter().cloned())
            .raft_settings(settings())
            .cluster_secret(secret())
            .start()
            .await?;
        nodes.insert(id, node);
    }
    let leader = nodes[&1].wait_for_leader(Duration::from_secs(30)).await?;
    let client = Client::with_options(
        client_addrs(&nodes),
        ClientOptions::default().with_request_timeout(Duration::from_secs(10)),
    )?;
    Ok((nodes, leader, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_health_and_readiness_over_http() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        let dir = tempfile::tempdir()?;
        let (mut nodes, leader, client) = three_nodes(dir.path()).await?;
        // Past `snapshot_every` (50): every replica builds a snapshot.
        for i in 0..60 {
            client.put(format!("k{i}"), "v").await?;
        }
        // Locks: `a` holds `m`, `b` waits for it in the queue.
        let a = client.session(Duration::from_secs(3)).await?;
        let b = client.session(Duration::from_secs(3)).await?;
        let held = a.lock("m").acquire().await?;
        let waiter = tokio::spawn(async move {
            let granted = b.lock("m").acquire().await;
            (b, granted)
        });
        // Every replica counts its own state the same way.
        for (id, node) in &nodes {
            let addr = node.metrics_addr().ok_or("no metrics listener")?;
            // Three sessions: a's, b's and the client's own, which makes
            // its puts retry-safe.
            let want = [
                ("latchkey_lock_sessions", 3.0),
                ("latchkey_lock_locks", 1.0),
                ("latchkey_lock_held", 1.0),
                ("latchkey_lock_grants", 1.0),
                ("latchkey_lock_waiters", 1.0),
                ("latchkey_lock_delayed", 0.0),
            ];
            eventually(&format!("node {id}'s lock census"), async || {
                let (_, text) = http_get(addr, "/metrics").await?;
                Ok(want
                    .iter()
                    .all(|(name, v)| sample(&text, name) == Some(*v))
                    .then_some(()))
            })
            .await?;
        }
        // The watchdog keeps the sessions alive (a third of the TTL).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        held.release().await?;
        let (b, granted) = waiter.await?;
        granted?.release().await?;
        b.close().await?;
        a.close().await?;
        let leader_addr = nodes[&leader].metrics_addr().ok_or("no metrics listener")?;
        eventually("the leader's lock histograms", async || {
            let (_, text) = http_get(leader_addr, "/metrics").await?;
            let count = |name: &str| sample(&text, name).unwrap_or(0.0);
            // b waited at least the 1.5 s pause for its grant.
            Ok(
                (count("latchkey_lock_acquire_wait_seconds_count{outcome=\"granted\"}") >= 2.0
                    && count("latchkey_lock_acquire_wait_seconds_sum{outcome=\"granted\"}") >= 1.5
                    && count("latchkey_lock_hold_seconds_count{end=\"released\"}") >= 2.0
                    && count("latchkey_lock_keepalive_margin_seconds_count") >= 1.0
                    && sample(&text, "latchkey_lock_sessions") == Some(1.0))
                .then_some(()),
            )
        })
        .await?;
        // A refused call, counted by its error's kind: an empty key sent
        // straight to the leader (the client would refuse it itself).
        let mut kv = latchkey_proto::v1::kv_client::KvClient::new(latchkey_proto::channel(
            nodes[&leader].advertise_addr(),
            Duration::from_secs(2),
            None,
        )?);
        let reply = kv
            .put(latchkey_proto::v1::PutRequest {
                key: Vec::new(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(reply.error.is_some(), "an empty key was accepted");

        let mut puts = 0.0;
        for (id, node) in &nodes {
            let addr = node.metrics_addr().ok_or("no metrics listener")?;
            let (status, text) = http_get(addr, "/metrics").await?;
            assert_eq!(status, 200, "node {id}: {text}");
            let term = sample(&text, "latchkey_raft_term").ok_or("no term")?;
            assert!(term >= 1.0, "node {id}: term {term}");
            assert_eq!(
                sample(&text, "latchkey_raft_leader_id"),
                Some(leader as f64),
                "node {id}"
            );
            let leading = sample(&text, "latchkey_raft_is_leader");
            assert_eq!(
                leading,
                Some(if *id == leader { 1.0 } else { 0.0 }),
                "node {id}"
            );
            assert_eq!(
                sample(&text, "latchkey_raft_voters"),
                Some(3.0),
                "node {id}"
            );
            assert_eq!(
                sample(&text, "latchkey_replica_condition{condition=\"serving\"}"),
                Some(1.0),
                "node {id}"
            );
            assert!(
                sample(&text, "latchkey_raft_applied_index").is_some_and(|a| a >= 5.0),
                "node {id}: {text}"
            );
            if *id == leader {
                for member in nodes.keys().filter(|m| **m != leader) {
                    let matched = sample(
                        &text,
                        &format!("latchkey_raft_matched_index{{member=\"{member}\"}}"),
                    );
                    assert!(matched.is_some_and(|m| m >= 5.0), "member {member}: {text}");
                }
            }
            if *id == leader {
                assert_eq!(
                    sample(
                        &text,
                        "latchkey_requests_total{rpc=\"put\",outcome=\"invalid_argument\"}"
                    ),
                    Some(1.0),
                    "{text}"
                );
            }
            puts +=
                sample(&text, "latchkey_requests_total{rpc=\"put\",outcome=\"ok\"}").unwrap_or(0.0);
            if *id == leader {
                // The client sends its calls to the leader.
                assert!(
                    text.contains("latchkey_request_duration_seconds_bucket{"),
                    "{text}"
                );
            }
            assert!(
                text.ends_with("# EOF\n"),
                "OpenMetrics text ends with # EOF"
            );
            // Storage: every replica synced its log for the puts, each sync
            // covering at least one append.
            let syncs = sample(&text, "latchkey_storage_wal_sync_seconds_count").unwrap_or(0.0);
            let appends = sample(&text, "latchkey_storage_group_commit_batch_sum").unwrap_or(0.0);
            assert!(syncs >= 1.0 && appends >= syncs, "node {id}: {text}");
            assert!(
                sample(&text, "latchkey_storage_wal_sync_seconds_sum").is_some_and(|s| s > 0.0),
                "node {id}: {text}"
            );
            assert!(
                sample(&text, "latchkey_storage_sst_bytes").is_some(),
                "node {id}"
            );
            assert!(
                sample(&text, "latchkey_storage_background_jobs").is_some_and(|j| j >= 0.0),
                "node {id}"
            );
            // The core's counters (at least) are held in memory.
            assert!(
                sample(&text, "latchkey_storage_lock_rooms_bytes").is_some_and(|b| b > 0.0),
                "node {id}: {text}"
            );
            // The same text, for an application that serves it itself.
            assert!(node.metrics().render().contains("latchkey_raft_term "));

            // Past `snapshot_every`, each replica built a snapshot.
            eventually(&format!("node {id}'s snapshot"), async || {
                let (_, text) = http_get(addr, "/metrics").await?;
                let built = |name: &str| sample(&text, name).is_some_and(|v| v > 0.0);
                Ok((built("latchkey_raft_snapshot_seconds_count{op=\"build\"}")
                    && built("latchkey_raft_snapshot_bytes_sum{op=\"build\"}"))
                .then_some(()))
            })
            .await?;

            assert_eq!(http_get(addr, "/healthz").await?.0, 200, "node {id}");
            assert_eq!(http_get(addr, "/readyz").await?.0, 200, "node {id}");
            assert_eq!(http_get(addr, "/nothing").await?.0, 404, "node {id}");
        }
        assert!(puts >= 5.0, "puts counted: {puts}");

        // The application's in-process calls are counted the same way.
        let addr = nodes[&leader].metrics_addr().ok_or("no metrics listener")?;
        let local_puts = async || -> Result<f64, Box<dyn std::error::Error>> {
            let (_, text) = http_get(addr, "/metrics").await?;
            Ok(sample(&text, "latchkey_requests_total{rpc=\"put\",outcome=\"ok\"}").unwrap_or(0.0))
        };
        let before = local_puts().await?;
        nodes[&leader].client().put("in-process", "v").await?;
        let after = local_puts().await?;
        assert!(
            after >= before + 1.0,
            "an in-process put was not counted: {before} -> {after}"
        );

        // The leader stops: a follower's /readyz says so until a new one is
        // elected (and a stopped node's listener is gone).
        let stopped_addr = nodes[&leader].metrics_addr().ok_or("no metrics listener")?;
        if let Some(node) = nodes.remove(&leader) {
            node.shutdown().await;
        }
        assert!(http_get(stopped_addr, "/healthz").await.is_err());
        let node = nodes.values().next().ok_or("no node left")?;
        let addr = node.metrics_addr().ok_or("no metrics listener")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let new_leader = loop {
            let (_, text) = http_get(addr, "/metrics").await?;
            let new_leader = sample(&text, "latchkey_raft_leader_id");
            if let Some(l) = new_leader.filter(|l| *l != 0.0 && *l != leader as f64) {
                assert!(
                    sample(&text, "latchkey_raft_leader_changes_total").is_some_and(|c| c >= 1.0),
                    "{text}"
                );
                break l as u64;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no leader change counted: {text}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // With the new leader's follower gone there is no majority: the
        // leader, which goes on calling itself leader (openraft's
        // check-quorum refuses its proposals but does not make it step
        // down), says it is not ready (but still healthy).
        let last = new_leader;
        let gone = *nodes
            .keys()
            .find(|id| **id != new_leader)
            .ok_or("no follower left")?;
        if let Some(node) = nodes.remove(&gone) {
            node.shutdown().await;
        }
        let addr = nodes[&last].metrics_addr().ok_or("no metrics listener")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = http_get(addr, "/readyz").await?;
            if status == 503 {
                assert!(body.contains("not ready"), "{body}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "still ready without a majority"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(http_get(addr, "/healthz").await?.0, 200);
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}

/// The browser the status-page test drives: LATCHKEY_CHROMIUM, else
/// `chromium` on the PATH (`cargo xtask test` installs Debian's package
/// when it is missing).
fn chromium() -> Result<std::path::PathBuf, Box<dyn std::error::Error>> {
    if let Some(path) = std::env::var_os("LATCHKEY_CHROMIUM") {
        return Ok(path.into());
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("chromium"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "no chromium: run `cargo xtask test` (it installs it) or set LATCHKEY_CHROMIUM".into()
        })
}

/// The page at `url` as a headless Chromium renders it after its script
/// ran (`--dump-dom` with a virtual-time budget, which waits for the
/// script's fetches); with `screenshot`, also a PNG of it there.
async fn render(
    url: &str,
    screenshot: Option<&std::path::Path>,
) -> Result<String, Box<dyn std::error::Error>> {
    let profile = tempfile::tempdir()?;
    let mut cmd = tokio::process::Command::new(chromium()?);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=3000",
        "--window-size=1100,900",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()));
    match screenshot {
        Some(path) => cmd.arg(format!("--screenshot={}", path.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        cmd.arg(url).kill_on_drop(true).output(),
    )
    .await??;
    if !out.status.success() {
        return Err(format!(
            "chromium exited {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The text of the element with id `id` in `dom` (a `<td>` or `<span>`).
fn element_text<'a>(dom: &'a str, id: &str) -> Option<&'a str> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let rest = &dom[start..];
    let open = rest.find('>')? + 1;
    let close = rest[open..].find('<')?;
    Some(&rest[open..open + close])
}

/// The status page in a real (headless) Chromium: it names the leader,
/// lists the members and a held lock with its token, and after the leader
/// is stopped a follower's page names the new leader. Run by `cargo xtask
/// test` (which installs Chromium); ignored by a plain `cargo test`. With
/// LATCHKEY_SCREENSHOT=PATH it also saves a screenshot of the page there
/// (how docs/status-page.png was made).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Chromium: run by `cargo xtask test`"]
async fn status_page_in_chromium() -> TestResult {
    tokio::time::timeout(LIMIT, async {
        chromium()?;
        let dir = tempfile::tempdir()?;
        let (mut nodes, leader, client) = three_nodes(dir.path()).await?;
        let session = client.session(Duration::from_secs(30)).await?;
        let guard = session.lock("jobs/<nightly>").acquire().await?;
        let mut urls = BTreeMap::new();
        for (id, node) in &nodes {
            let addr = node.metrics_addr().ok_or("no metrics listener")?;
            urls.insert(*id, format!("http://{addr}/"));
        }
        let url = |id: u64| -> Result<String, Box<dyn std::error::Error>> {
            Ok(urls.get(&id).ok_or("no such node")?.clone())
        };

        let dom = render(&url(leader)?, None).await?;
        assert_eq!(
            element_text(&dom, "leader"),
            Some(leader.to_string().as_str()),
            "{dom}"
        );
        assert_eq!(element_text(&dom, "state"), Some("Leader"), "{dom}");
        assert_eq!(element_text(&dom, "sessions"), Some("1"), "{dom}");
        assert_eq!(dom.matches("<tr class=\"leader\">").count(), 1, "{dom}");
        // Incarnations are 64-bit: shown digit for digit, not rounded.
        let incarnation = nodes[&leader].status().incarnation;
        assert!(dom.contains(&format!("<td>{incarnation}</td>")), "{dom}");
        // The lock's name is shown as text, escaped, with its holder's token.
        assert!(dom.contains("jobs/&lt;nightly&gt;"), "{dom}");
        assert!(
            dom.contains(&format!("{}: {}", session.id().0, u64::from(guard.token()))),
            "{dom}"
        );
        if let Some(path) = std::env::var_os("LATCHKEY_SCREENSHOT") {
            render(&url(leader)?, Some(std::path::Path::new(&path))).await?;
        }

        // The leader stops: a follower's page names the new one.
        if let Some(node) = nodes.remove(&leader) {
            node.shutdown().await;
        }
        let follower = *nodes.keys().next().ok_or("no node left")?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let dom = render(&url(follower)?, None).await?;
            let named = element_text(&dom, "leader").and_then(|l| l.parse::<u64>().ok());
            if named.is_some_and(|l| l != leader && nodes.contains_key(&l)) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the page never named a new leader: {dom}"
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        drop(guard);
        for node in nodes.into_values() {
            node.shutdown().await;
        }
        Ok::<_, Box<dyn std::error::Error>>(())
    })
    .await?
}
