//! `latchkey snapshot save|status|restore`: back a cluster up to a file,
//! say what a file holds, and seed a new cluster's data directories from
//! one (see `latchkey_storage::backup` for the format and the seeding, and
//! `latchkey_core::backup` for why a restore moves counters on).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use latchkey::core::backup::{missing_counters, restore_row, Census, MIN_BUMP};
use latchkey::Client;
use latchkey_storage::backup::{self, BackupMeta};

use super::args::SnapshotCmd;
use super::failure::Failure;
use super::output::out;

/// Run one `snapshot` subcommand; `json` prints JSON.
pub async fn run(
    cmd: &SnapshotCmd,
    client: impl FnOnce() -> Result<Client, Failure>,
    json: bool,
) -> Result<ExitCode, Failure> {
    match cmd {
        SnapshotCmd::Save { file } => save(client()?, file, json).await,
        SnapshotCmd::Status { file } => {
            let blob = read(file)?;
            let (meta, census) = inspect(&blob)?;
            print_summary(&meta, &census, blob.len(), json)?;
            Ok(ExitCode::SUCCESS)
        }
        SnapshotCmd::Restore {
            file,
            data_dir,
            id,
            initial_members,
            bump,
        } => restore(file, data_dir, *id, initial_members, *bump, json),
    }
}

fn read(file: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(file)
        .map_err(|e| Failure::Usage(format!("cannot read the backup {}: {e}", file.display())))
}

/// Check `blob` whole and count what it holds.
fn inspect(blob: &[u8]) -> Result<(BackupMeta, Census), Failure> {
    let mut census = Census::default();
    let meta = backup::read_backup(blob, |k, v| census.add(&k, &v))
        .map_err(|e| Failure::Usage(e.to_string()))?;
    if census.damaged > 0 {
        return Err(Failure::Usage(format!(
            "the backup holds {} records that do not decode: it is damaged",
            census.damaged
        )));
    }
    Ok((meta, census))
}

fn print_summary(
    meta: &BackupMeta,
    census: &Census,
    bytes: usize,
    json: bool,
) -> Result<(), Failure> {
    let members: BTreeMap<u64, String> = meta
        .membership
        .membership()
        .nodes()
        .map(|(id, m)| (*id, m.peer_addr.clone()))
        .collect();
    let text = if json {
        let value = serde_json::json!({
            "last_index": meta.last_index(),
            "checksum": format!("{:016x}", meta.checksum),
            "bytes": bytes,
            "members": members,
            "contents": census,
        });
        serde_json::to_string_pretty(&value)
            .map_err(|e| Failure::Other(format!("cannot print JSON: {e}")))?
            + "\n"
    } else {
        let members = members
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(",");
        format!(
            "last index:      {}\nchecksum:        {:016x} (ok)\nbytes:           {bytes}\n\
             taken from:      {members}\nkeys:            {} ({} bytes)\n\
             sequences:       {}\nsessions:        {}\nlocks:           {} ({} holders, {} \
             waiters)\naccess control:  {} records\nlast token:      {}\nlast session:    {}\n\
             revision:        {}\n",
            meta.last_index(),
            meta.checksum,
            census.keys,
            census.data_bytes,
            census.sequences,
            census.sessions,
            census.locks,
            census.holders,
            census.waiters,
            census.access_control_rows,
            census.last_token,
            census.last_session,
            census.revision,
        )
    };
    out(&[text.as_bytes()])
}

async fn save(client: Client, file: &Path, json: bool) -> Result<ExitCode, Failure> {
    let backup = client.backup().await?;
    // Check it whole before it replaces anything.
    let (meta, census) = inspect(&backup.bytes)?;
    if meta.checksum != backup.checksum || meta.last_index() != backup.last_index {
        return Err(Failure::Unavailable(format!(
            "the backup received does not match what the leader announced (index {} checksum \
             {:016x}, received index {} checksum {:016x}): try again",
            backup.last_index,
            backup.checksum,
            meta.last_index(),
            meta.checksum
        )));
    }
    write_durably(file, &backup.bytes)?;
    print_summary(&meta, &census, backup.bytes.len(), json)?;
    Ok(ExitCode::SUCCESS)
}

/// Write `bytes` to `file` through a temporary file beside it, readable by
/// its owner only (a backup holds session secrets and password hashes),
/// synced and renamed into place (the directory synced too).
fn write_durably(file: &Path, bytes: &[u8]) -> Result<(), Failure> {
    use std::os::unix::fs::OpenOptionsExt;
    let failed = |what: &str, e: std::io::Error| {
        Failure::Other(format!("cannot {what} {}: {e}", file.display()))
    };
    let mut part = file.as_os_str().to_owned();
    part.push(".part");
    let part = PathBuf::from(part);
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&part)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&part, file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&part);
        return Err(failed("write", e));
    }
    let dir = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| failed("sync the directory of", e))
}

fn restore(
    file: &Path,
    data_dir: &Path,
    id: u64,
    members: &[(u64, String)],
    bump: u64,
    json: bool,
) -> Result<ExitCode, Failure> {
    let members = latchkey::initial_member_map(members.iter().cloned())
        .map_err(|e| Failure::Usage(e.to_string()))?;
    if !members.contains_key(&id) {
        return Err(Failure::Usage(format!(
            "--id {id} is not one of --initial-members"
        )));
    }
    if bump < MIN_BUMP {
        return Err(Failure::Usage(format!(
            "--bump {bump} is below {MIN_BUMP}: a restore must move the counters past whatever \
             the old cluster issued after the backup"
        )));
    }
    let blob = read(file)?;
    let (_, census) = inspect(&blob)?;
    // What else makes the restored state what it is: members restored with
    // another bump or member list must not form a cluster together.
    let plan = format!("bump={bump};members={members:?}");
    let extra = missing_counters(&census, bump);
    let meta = backup::restore(
        data_dir,
        &blob,
        plan.as_bytes(),
        |k, v| restore_row(k, v, bump).map_err(|e| e.to_string()),
        &extra,
    )
    .map_err(|e| match e {
        backup::BackupError::Storage(_) => Failure::Other(e.to_string()),
        _ => Failure::Usage(e.to_string()),
    })?;
    let mut restored = census;
    restored.last_token = restored.last_token.saturating_add(bump);
    restored.last_session = restored.last_session.saturating_add(bump);
    if json {
        print_summary(&meta, &restored, blob.len(), true)?;
    } else {
        let text = format!(
            "restored index {} into {} for node {id}: {} keys, {} sessions, {} locks; counters \
             moved on by {bump} (next token above {})\nstart it with: latchkey serve --id {id} \
             --data-dir {} --initial-members {} ...\n",
            meta.last_index(),
            data_dir.display(),
            restored.keys,
            restored.sessions,
            restored.locks,
            restored.last_token,
            data_dir.display(),
            members
                .iter()
                .map(|(id, a)| format!("{id}={a}"))
                .collect::<Vec<_>>()
                .join(","),
        );
        out(&[text.as_bytes()])?;
    }
    Ok(ExitCode::SUCCESS)
}
