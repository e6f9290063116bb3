//! What the process demos and probes (`three_replicas`, `memory_probe`,
//! `keepalive_probe`) share: three `latchkey serve` processes on loopback in
//! a temporary directory, killed (SIGKILL) when dropped, and what /proc says
//! about each.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The `latchkey` binary next to this example's own (cargo puts examples in
/// `<target>/<profile>/examples/` and binaries one level up), if it exists.
#[allow(dead_code)] // Not every example looks it up.
pub fn sibling_server_bin() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let bin = exe.parent()?.parent()?.join("latchkey");
    bin.is_file().then_some(bin)
}

/// The secret the replicas share; a client that changes membership sends it
/// (`ClientOptions::with_cluster_secret`).
#[allow(dead_code)] // Not every example changes membership.
pub const CLUSTER_SECRET: &str = "latchkey-example-cluster-secret";

/// Three replicas of `bin`, started with `serve_args` added.
pub struct ProcessCluster {
    /// Each replica's client listener.
    pub addrs: Vec<String>,
    /// Each replica's peer listener (the initial members; `members add`).
    pub peer_addrs: Vec<String>,
    pub children: Vec<Child>,
    bin: String,
    members: String,
    serve_args: Vec<String>,
    /// With TLS: the directory `latchkey certs` wrote (ca.pem, node-N.pem,
    /// client.pem and their keys).
    pub certs: Option<PathBuf>,
    dir: tempfile::TempDir,
}

impl ProcessCluster {
    #[allow(dead_code)] // The demo uses `start_with`.
    pub fn start(bin: &str, serve_args: Vec<String>) -> std::io::Result<ProcessCluster> {
        ProcessCluster::start_with(bin, serve_args, false)
    }

    /// Like [`ProcessCluster::start`]; with `tls`, first certificates (as
    /// `latchkey certs` writes them) into the cluster's directory, then every replica serves TLS with its
    /// own certificate and talks mutual TLS to its peers.
    pub fn start_with(
        bin: &str,
        serve_args: Vec<String>,
        tls: bool,
    ) -> std::io::Result<ProcessCluster> {
        let mut addrs = latchkey::free_loopback_addrs(6)?;
        let peer_addrs = addrs.split_off(3);
        let members = latchkey::initial_members_arg(&peer_addrs);
        let dir = tempfile::tempdir()?;
        // The replicas authenticate each other with a shared secret, as a
        // deployment should (README, "Securing a cluster").
        let secret = dir.path().join("cluster.secret");
        std::fs::write(&secret, format!("{CLUSTER_SECRET}\n"))?;
        let serve_args = [
            "--cluster-secret-file".to_string(),
            secret.display().to_string(),
        ]
        .into_iter()
        .chain(serve_args)
        .collect();
        let certs = if tls {
            let certs = dir.path().join("certs");
            latchkey::certs::write_cluster(&certs, 3, &[], &[]).map_err(std::io::Error::other)?;
            Some(certs)
        } else {
            None
        };
        let mut cluster = ProcessCluster {
            addrs,
            peer_addrs,
            children: Vec::new(),
            bin: bin.to_string(),
            members,
            serve_args,
            certs,
            dir,
        };
        for i in 0..3 {
            let child = cluster.spawn(i)?;
            cluster.children.push(child);
        }
        Ok(cluster)
    }

    /// The data directory of replica `i` (0-based).
    pub fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("n{}", i + 1))
    }

    /// Kill replica `i` with SIGKILL, as a crash would: no shutdown, no
    /// flush, nothing it had not made durable survives.
    #[allow(dead_code)] // Not every example kills a replica.
    pub fn kill(&mut self, i: usize) {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
    }

    /// Start replica `i` again on its data directory, with the same command
    /// line.
    #[allow(dead_code)] // Not every example restarts a replica.
    pub fn restart(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        self.children[i] = self.spawn(i)?;
        Ok(())
    }

    /// Kill replica `i`, wipe its data directory, and start it again: it
    /// waits as a new member until it is added (`Client::add_member`).
    #[allow(dead_code)] // Not every example restarts a replica.
    pub fn restart_wiped(&mut self, i: usize) -> std::io::Result<()> {
        self.kill(i);
        std::fs::remove_dir_all(self.data_dir(i))?;
        self.children[i] = self.spawn(i)?;
        Ok(())
    }

    /// Where replica `i` writes its log.
    pub fn log_path(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("n{}.log", i + 1))
    }

    fn spawn(&self, i: usize) -> std::io::Result<Child> {
        let log = append(&self.log_path(i))?;
        let mut command = Command::new(&self.bin);
        if let Some(certs) = &self.certs {
            // Global options: before the subcommand.
            command
                .arg("--cacert")
                .arg(certs.join("ca.pem"))
                .arg("--cert")
                .arg(certs.join(format!("node-{}.pem", i + 1)))
                .arg("--key")
                .arg(certs.join(format!("node-{}-key.pem", i + 1)));
        }
        command
            .args([
                "serve",
                "--id",
                &(i + 1).to_string(),
                "--listen",
                &self.addrs[i],
                "--peer-listen",
                &self.peer_addrs[i],
            ])
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .args(["--initial-members", &self.members])
            .args(&self.serve_args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
    }
}

fn append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

impl Drop for ProcessCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// "VmRSS: ... kB, VmHWM: ... kB" of a process.
#[allow(dead_code)] // Not every probe reports memory.
pub fn rss(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .filter(|l| l.starts_with("VmRSS") || l.starts_with("VmHWM"))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect::<Vec<_>>()
        .join(", ")
}

/// CPU time (user + system) a process has used, in seconds; `pid` "self"
/// is this process. Clock ticks are taken as 100 per second (USER_HZ on
/// every mainstream Linux architecture).
#[allow(dead_code)] // Not every probe reports CPU.
pub fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces; the fields after it are fixed.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ")": state is field 3 of the whole line, utime 14, stime 15.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
