//! What the probes (`memory_probe`, `keepalive_probe`) share: three
//! `latchkey serve` processes on loopback in a temporary directory, killed
//! when dropped, and what /proc says about each.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// Three replicas of `bin`, started with `serve_args` added.
pub struct ProbeCluster {
    pub addrs: Vec<String>,
    pub children: Vec<Child>,
    bin: String,
    members: String,
    serve_args: Vec<String>,
    dir: tempfile::TempDir,
}

impl ProbeCluster {
    pub fn start(bin: &str, serve_args: Vec<String>) -> std::io::Result<ProbeCluster> {
        let mut ports = Vec::new();
        let mut holders = Vec::new();
        for _ in 0..3 {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            ports.push(l.local_addr()?.port());
            holders.push(l);
        }
        drop(holders);
        let addrs: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let members = latchkey::initial_members_arg(&addrs);
        let mut cluster = ProbeCluster {
            addrs,
            children: Vec::new(),
            bin: bin.to_string(),
            members,
            serve_args,
            dir: tempfile::tempdir()?,
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

    /// Kill replica `i`, wipe its data directory, and start it again.
    #[allow(dead_code)] // Not every probe restarts a replica.
    pub fn restart_wiped(&mut self, i: usize) -> std::io::Result<()> {
        let _ = self.children[i].kill();
        let _ = self.children[i].wait();
        std::fs::remove_dir_all(self.data_dir(i))?;
        self.children[i] = self.spawn(i)?;
        Ok(())
    }

    fn spawn(&self, i: usize) -> std::io::Result<Child> {
        Command::new(&self.bin)
            .args([
                "serve",
                "--id",
                &(i + 1).to_string(),
                "--listen",
                &self.addrs[i],
            ])
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .args(["--initial-members", &self.members])
            .args(&self.serve_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }
}

impl Drop for ProbeCluster {
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
