//! Backup and restore with real processes: `latchkey snapshot save` from a
//! three-process cluster under load, `snapshot status` (and a damaged
//! file), `snapshot restore` into a fresh three-process cluster (which
//! refuses to form while one member was restored differently), and every
//! key, sequence, lock and token checked there.

#[path = "support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use latchkey::core::backup::DEFAULT_BUMP;
use support::{eventually, run_cli, wait_node_has, Cluster, LEADER_WAIT, TEST_LIMIT};

const KEYS: u64 = 200;
const TTL: Duration = Duration::from_secs(60);

/// What the source cluster did, for the restored one to be checked against.
#[derive(Debug, Default)]
struct Source {
    /// Load keys acknowledged before the backup was asked for.
    acked_before: Vec<u64>,
    /// Every load key a put was started for (acknowledged or not).
    attempted: u64,
    /// The end of the `ids` sequence (its next start) at the backup.
    sequence_next: u64,
    /// The lock `held`: its holder's session and token, held throughout.
    held: (u64, u64),
    /// The highest fencing token the source issued, after the backup too.
    max_token: u64,
    /// The highest revision the source's puts made, after the backup too.
    max_revision: u64,
    /// The revision the backup was taken at (its census says).
    backup_revision: u64,
    /// The end of sequence `late`, first used after the backup.
    late_end: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_under_load_restores_into_a_new_cluster() {
    let dir = tempfile::Builder::new()
        .prefix("latchkey-backup-")
        .tempdir()
        .expect("temporary directory");
    let file = dir.path().join("cluster.backup");
    let mut c = Cluster::start("backup-source", 3, &[])
        .await
        .expect("start the source cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, take_backup(&mut c, &file)).await;
    let source = match &outcome {
        Ok(Ok(source)) => Some(std::mem::take(&mut *source.lock().expect("not poisoned"))),
        _ => None,
    };
    c.finish(outcome.map(|r| r.map(|_| ())), TEST_LIMIT);
    let source = source.expect("the source cluster's run");

    let mut r = Cluster::create("backup-restored", 3, &[])
        .await
        .expect("create the restored cluster");
    let outcome = tokio::time::timeout(TEST_LIMIT, restore_and_check(&mut r, &file, &source)).await;
    r.finish(outcome, TEST_LIMIT);
}

async fn take_backup(c: &mut Cluster, file: &std::path::Path) -> Result<Mutex<Source>> {
    c.wait_for_leader(LEADER_WAIT).await?;
    let client = c.client()?;
    for i in 0..KEYS {
        client.put(format!("k{i}"), format!("v{i}")).await?;
    }
    let mut sequence_next = 0;
    for _ in 0..3 {
        sequence_next = client.next_sequence("ids", 10).await?.end;
    }
    let holder = client.session(TTL).await?;
    let held = holder.lock("held").acquire().await?;
    let held_at = (holder.id().0, u64::from(held.token()));

    // Load: puts of load/N (value N) and grants of lock `churn`, until told
    // to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(Mutex::new(Vec::new()));
    let max_token = Arc::new(AtomicU64::new(held_at.1));
    let max_revision = Arc::new(AtomicU64::new(0));
    let putter = {
        let (client, stop, next, acked) = (c.client()?, stop.clone(), next.clone(), acked.clone());
        let max_revision = max_revision.clone();
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if let Ok(revision) = client.put(format!("load/{n}"), n.to_string()).await {
                    max_revision.fetch_max(revision, Ordering::Relaxed);
                    acked.lock().map_err(|_| anyhow!("poisoned"))?.push(n);
                }
            }
            Ok::<_, anyhow::Error>(())
        })
    };
    let churner = {
        let (client, stop, max_token) = (c.client()?, stop.clone(), max_token.clone());
        tokio::spawn(async move {
            let session = client.session(TTL).await?;
            while !stop.load(Ordering::Relaxed) {
                let guard = session.lock("churn").acquire().await?;
                max_token.fetch_max(u64::from(guard.token()), Ordering::Relaxed);
                guard.release().await?;
            }
            Ok::<_, anyhow::Error>(())
        })
    };
    eventually(Duration::from_secs(30), "load running", async || {
        let n = acked.lock().map_err(|_| anyhow!("poisoned"))?.len();
        ensure!(n >= 50, "{n} load puts so far");
        Ok(())
    })
    .await?;
    let acked_before = acked.lock().map_err(|_| anyhow!("poisoned"))?.clone();
    let file_arg = file.display().to_string();
    let endpoints = c.endpoints_arg();
    // A backup holds session secrets: a caller without the cluster secret
    // (access control is off) is refused.
    let out = run_cli(&["--endpoints", &endpoints, "snapshot", "save", &file_arg]).await?;
    out.refused_with(2)?;
    ensure!(out.stderr.contains("cluster secret"), "{out:?}");
    ensure!(!file.exists(), "a refused backup wrote {}", file.display());
    let secret = c.secret_file();
    let out = run_cli(&[
        "--endpoints",
        &endpoints,
        "--cluster-secret-file",
        &secret,
        "snapshot",
        "save",
        &file_arg,
        "-w",
        "json",
    ])
    .await?;
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(file)?.permissions().mode() & 0o777;
        ensure!(mode == 0o600, "the backup file has mode {mode:o}");
    }
    let summary: serde_json::Value =
        serde_json::from_str(out.ok()?).context("snapshot save prints JSON")?;
    // The old cluster goes on granting after the backup: the restored one
    // must never issue those tokens again.
    let after = max_token.load(Ordering::Relaxed);
    eventually(
        Duration::from_secs(30),
        "grants after the backup",
        async || {
            let now = max_token.load(Ordering::Relaxed);
            ensure!(now >= after + 20, "token {now}");
            Ok(())
        },
    )
    .await?;
    stop.store(true, Ordering::Relaxed);
    putter.await??;
    churner.await??;
    // A sequence first used after the backup: the restored cluster must
    // not hand out its numbers again.
    let late_end = client.next_sequence("late", 5).await?.end;

    let contents = &summary["contents"];
    ensure!(
        contents["keys"].as_u64() >= Some(KEYS + acked_before.len() as u64),
        "the backup holds too few keys: {summary}"
    );
    ensure!(contents["sequences"] == 1, "{summary}");
    ensure!(contents["holders"].as_u64() >= Some(1), "{summary}");
    ensure!(summary["last_index"].as_u64() > Some(0), "{summary}");
    let backup_revision = contents["revision"]
        .as_u64()
        .with_context(|| format!("the backup's census has no revision: {summary}"))?;
    ensure!(
        backup_revision >= KEYS + acked_before.len() as u64,
        "the backup's revision {backup_revision} is below its puts: {summary}"
    );

    // `status` checks the file whole and says what it holds.
    let out = run_cli(&["snapshot", "status", &file_arg]).await?;
    ensure!(out.ok()?.contains("(ok)"), "{out:?}");
    let status_json: serde_json::Value = serde_json::from_str(
        run_cli(&["snapshot", "status", &file_arg, "-w", "json"])
            .await?
            .ok()?,
    )?;
    ensure!(
        status_json["checksum"] == summary["checksum"],
        "{status_json} vs {summary}"
    );
    // A damaged or cut file is refused, with a reason, exit 2.
    let mut bytes = std::fs::read(file)?;
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    let damaged = file.with_extension("damaged");
    std::fs::write(&damaged, &bytes)?;
    let out = run_cli(&["snapshot", "status", &damaged.display().to_string()]).await?;
    out.refused_with(2)?;
    ensure!(out.stderr.contains("checksum"), "{out:?}");
    std::fs::write(&damaged, &std::fs::read(file)?[..middle])?;
    let out = run_cli(&["snapshot", "status", &damaged.display().to_string()]).await?;
    out.refused_with(2)?;

    drop(held);
    Ok(Mutex::new(Source {
        acked_before,
        attempted: next.load(Ordering::Relaxed),
        sequence_next,
        held: held_at,
        max_token: max_token.load(Ordering::Relaxed),
        max_revision: max_revision.load(Ordering::Relaxed),
        backup_revision,
        late_end,
    }))
}

async fn restore(r: &Cluster, file: &str, id: u64, bump: u64) -> Result<support::CliOutput> {
    let data_dir = r.data_dir(id).display().to_string();
    run_cli(&[
        "snapshot",
        "restore",
        file,
        "--data-dir",
        &data_dir,
        "--id",
        &id.to_string(),
        "--initial-members",
        r.members_arg(),
        "--bump",
        &bump.to_string(),
    ])
    .await
}

async fn restore_and_check(r: &mut Cluster, file: &std::path::Path, source: &Source) -> Result<()> {
    let file_arg = file.display().to_string();
    // Bad restores: an id that is not a member, a bump too small to help.
    let data_dir = r.data_dir(1).display().to_string();
    let out = run_cli(&[
        "snapshot",
        "restore",
        &file_arg,
        "--data-dir",
        &data_dir,
        "--id",
        "9",
        "--initial-members",
        r.members_arg(),
    ])
    .await?;
    out.refused_with(2)?;
    restore(r, &file_arg, 1, 10).await?.refused_with(2)?;

    // Node 3 restored with another bump: the members must not form a
    // cluster (their counters would differ).
    for id in [1, 2] {
        restore(r, &file_arg, id, DEFAULT_BUMP).await?.ok()?;
    }
    restore(r, &file_arg, 3, DEFAULT_BUMP + 1).await?.ok()?;
    // A restore never writes over a directory in use.
    restore(r, &file_arg, 3, DEFAULT_BUMP)
        .await?
        .refused_with(2)?;
    for id in r.ids() {
        r.restart(id)?;
    }
    eventually(
        Duration::from_secs(20),
        "the mismatch is reported",
        async || {
            let log = r.log_text(1);
            ensure!(log.contains("restored from another backup"), "not yet");
            Ok(())
        },
    )
    .await?;
    ensure!(
        r.leader_id().await.is_none(),
        "a cluster formed from members restored differently"
    );

    // Node 3 restored again, alike: the cluster forms.
    r.kill(3)?;
    std::fs::remove_dir_all(r.data_dir(3))?;
    restore(r, &file_arg, 3, DEFAULT_BUMP).await?.ok()?;
    r.restart(3)?;
    r.wait_for_leader(LEADER_WAIT).await?;
    let client = r.client()?;

    for i in 0..KEYS {
        let got = client.get(format!("k{i}")).await?;
        ensure!(
            got == Some(format!("v{i}").into_bytes()),
            "k{i} restored as {got:?}"
        );
    }
    for n in &source.acked_before {
        let got = client.get(format!("load/{n}")).await?;
        ensure!(
            got == Some(n.to_string().into_bytes()),
            "acknowledged load/{n} restored as {got:?}"
        );
    }
    let mut restored_load = BTreeMap::new();
    let mut range = latchkey::ScanRange::prefix(b"load/".to_vec(), 1000);
    loop {
        let page = client.scan(range.clone()).await?;
        let last = page.entries.last().map(|(k, _)| k.clone());
        restored_load.extend(page.entries);
        match last {
            Some(mut after) if page.more => {
                after.push(0);
                range.start = after;
            }
            _ => break,
        }
    }
    // Keys keep the revisions they had: none is above what the source
    // reached. A new write's revision is above everything the source made,
    // after the backup too (the restore moved the revision on by the bump).
    for (k, v) in &restored_load {
        ensure!(
            v.mod_revision <= source.max_revision && v.create_revision <= v.mod_revision,
            "{} restored with revisions {v:?} (source reached {})",
            String::from_utf8_lossy(k),
            source.max_revision
        );
    }
    let revision = client.put("after-restore", "x").await?;
    ensure!(
        revision > source.backup_revision + DEFAULT_BUMP && revision > source.max_revision,
        "a put after the restore made revision {revision}: not above the backup's {} + the \
         bump, or not above the source's last {}",
        source.backup_revision,
        source.max_revision
    );
    for (k, v) in &restored_load {
        let key = String::from_utf8_lossy(k);
        let n: u64 = key
            .strip_prefix("load/")
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("unexpected key {key}"))?;
        ensure!(n < source.attempted, "{key} was never written");
        ensure!(v.value == n.to_string().into_bytes(), "{key} = {v:?}");
    }

    // The sequence moved on by the bump.
    let next = client.next_sequence("ids", 1).await?;
    ensure!(
        next.start == source.sequence_next + DEFAULT_BUMP,
        "the sequence restarted at {} (source next {})",
        next.start,
        source.sequence_next
    );
    // The lock held at the backup is still held, by the same grant.
    let held = client
        .locks("held")
        .await?
        .into_iter()
        .find(|l| l.name == "held")
        .context("lock `held` was not restored")?;
    let holder = held.holders.first().context("lock `held` has no holder")?;
    ensure!(
        (holder.session.0, u64::from(holder.token)) == source.held,
        "held by {holder:?}, expected {:?}",
        source.held
    );
    // A new grant's token is above every token the old cluster issued,
    // after the backup too.
    let session = client.session(TTL).await?;
    let guard = session.lock("fresh").acquire().await?;
    ensure!(
        u64::from(guard.token()) > source.max_token,
        "new token {} not above the source's {}",
        guard.token(),
        source.max_token
    );
    ensure!(
        session.id().0 > DEFAULT_BUMP,
        "session id {:?}",
        session.id()
    );
    guard.release().await?;
    let late = client.next_sequence("late", 1).await?;
    ensure!(
        late.start >= source.late_end && late.start >= DEFAULT_BUMP,
        "sequence `late` restarted at {} (the source issued up to {})",
        late.start,
        source.late_end
    );

    // A member added later gets the restored state (as a snapshot: the
    // log does not hold it). Node 3's disk is replaced.
    r.kill(3)?;
    r.move_data_dir_aside(3, "old")?;
    r.restart_with(3, &["--initial-cluster-state", "existing"])?;
    let peer = r.peer_addr(3);
    let out = r.cli(&["members", "add", "3", &peer]).await?;
    ensure!(out.ok()? == "OK\n", "members add: {out:?}");
    let expected: BTreeMap<String, String> = (0..KEYS)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    wait_node_has(r, 3, &expected).await?;
    Ok(())
}
