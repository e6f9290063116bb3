//! The test hosts: one network namespace per replica, joined by veth pairs
//! to a bridge in the harness's own namespace, and partitions made by
//! blackhole routes inside the namespaces.
//!
//! Every name carries the harness's pid (`lkn<pid>-<i>` for namespaces,
//! `lkb<pid>` for the bridge, `lkv<pid>-<i>` for the bridge ends of the veth
//! pairs), so two runs never touch each other's hosts, and a run that was
//! killed before it could clean up is recognised by the next one (its pid is
//! gone) and removed by name. Nothing here ever deletes a name it did not
//! make.
//!
//! The replicas reach each other and the clients (which stay in the
//! harness's namespace) through the bridge, on `10.A.B.0/24`. A partition
//! isolates a replica from its peers with `blackhole` routes on both sides
//! (`ip route add blackhole <peer>/32`), while the clients still reach it:
//! the classic "leader cut off from its followers but not from its clients".
//! (This kernel has no `prio`/`netem` qdiscs nor tc actions; routes need
//! neither.)

use std::collections::BTreeSet;
use std::process::Command;

use crate::error::{Error, Result};

/// The network namespaces and bridge of one run.
#[derive(Debug)]
pub struct Netns {
    pid: u32,
    subnet: (u8, u8),
    nodes: usize,
    /// Blackholed (from, to) pairs currently installed.
    cut: BTreeSet<(usize, usize)>,
    created_bridge: bool,
    created_ns: Vec<String>,
}

/// Runs `ip` with `args`; an error carrying its stderr when it fails.
pub fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::setup(format!("cannot run `ip` (iproute2): {e}")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(Error::setup(format!(
            "`ip {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// Whether this process may create network namespaces: root, and `ip` works.
pub fn netns_available() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    root && ip(&["netns", "list"]).is_ok()
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// The pid in a name made by this module (`lkn123-1`, `lkb123`, `lkv123-1`).
fn owner_pid(name: &str, prefix: &str) -> Option<u32> {
    let rest = name.strip_prefix(prefix)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Removes the namespaces and bridges of earlier runs whose harness is gone.
pub fn sweep_stale() {
    if let Ok(list) = ip(&["netns", "list"]) {
        for line in list.lines() {
            let name = line.split_whitespace().next().unwrap_or("");
            if let Some(pid) = owner_pid(name, "lkn") {
                if !pid_alive(pid) {
                    tracing::info!(name, "removing a stale namespace of a dead run");
                    let _ = ip(&["netns", "del", name]);
                }
            }
        }
    }
    if let Ok(list) = ip(&["-o", "link", "show"]) {
        for line in list.lines() {
            // "7: lkb123: <BROADCAST,...". The name may carry "@peer".
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            let name = name.split('@').next().unwrap_or(name);
            for prefix in ["lkb", "lkv"] {
                if let Some(pid) = owner_pid(name, prefix) {
                    if !pid_alive(pid) {
                        tracing::info!(name, "removing a stale link of a dead run");
                        let _ = ip(&["link", "del", name]);
                    }
                }
            }
        }
    }
}

impl Netns {
    /// Creates `nodes` namespaces on a fresh bridge. On error, whatever was
    /// made is removed again.
    pub fn create(nodes: usize) -> Result<Netns> {
        sweep_stale();
        let pid = std::process::id();
        let routes = ip(&["-4", "route", "show"]).unwrap_or_default();
        let mut subnet = (100 + ((pid / 256) % 100) as u8, (pid % 256) as u8);
        for _ in 0..256 {
            let prefix = format!("10.{}.{}.", subnet.0, subnet.1);
            if !routes.contains(&prefix) {
                break;
            }
            subnet.1 = subnet.1.wrapping_add(1);
        }
        let mut net = Netns {
            pid,
            subnet,
            nodes,
            cut: BTreeSet::new(),
            created_bridge: false,
            created_ns: Vec::new(),
        };
        net.build()?;
        Ok(net)
    }

    fn build(&mut self) -> Result<()> {
        let bridge = self.bridge();
        ip(&["link", "add", &bridge, "type", "bridge"])?;
        self.created_bridge = true;
        ip(&["link", "set", &bridge, "up"])?;
        ip(&[
            "addr",
            "add",
            &format!("{}/24", self.host_ip()),
            "dev",
            &bridge,
        ])?;
        for node in 0..self.nodes {
            let ns = self.ns_name(node);
            let veth = format!("lkv{}-{}", self.pid, node + 1);
            ip(&["netns", "add", &ns])?;
            self.created_ns.push(ns.clone());
            ip(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ])?;
            ip(&["link", "set", &veth, "master", &bridge, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", self.node_ip(node)),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn bridge(&self) -> String {
        format!("lkb{}", self.pid)
    }

    /// The harness's address on the bridge.
    pub fn host_ip(&self) -> String {
        format!("10.{}.{}.1", self.subnet.0, self.subnet.1)
    }

    /// The namespace of replica `node` (0-based).
    pub fn ns_name(&self, node: usize) -> String {
        format!("lkn{}-{}", self.pid, node + 1)
    }

    /// The address of replica `node` (0-based).
    pub fn node_ip(&self, node: usize) -> String {
        format!("10.{}.{}.{}", self.subnet.0, self.subnet.1, 11 + node)
    }

    /// A command that runs `program` inside replica `node`'s namespace.
    /// `ip netns exec` execs the program in place: the child's pid is the
    /// program's, so signals sent to it reach the replica itself.
    pub fn command(&self, node: usize, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.arg("netns")
            .arg("exec")
            .arg(self.ns_name(node))
            .arg(program);
        cmd
    }

    /// Cuts replica `node` off from every other replica, both ways; the
    /// clients still reach it.
    pub fn isolate(&mut self, node: usize) -> Result<()> {
        for peer in (0..self.nodes).filter(|&p| p != node) {
            self.blackhole(node, peer)?;
            self.blackhole(peer, node)?;
        }
        Ok(())
    }

    fn blackhole(&mut self, from: usize, to: usize) -> Result<()> {
        if self.cut.contains(&(from, to)) {
            return Ok(());
        }
        let ns = self.ns_name(from);
        let dst = format!("{}/32", self.node_ip(to));
        ip(&["-n", &ns, "route", "add", "blackhole", &dst])?;
        self.cut.insert((from, to));
        Ok(())
    }

    /// Removes every partition.
    pub fn heal(&mut self) -> Result<()> {
        let mut first_error = None;
        for (from, to) in std::mem::take(&mut self.cut) {
            let ns = self.ns_name(from);
            let dst = format!("{}/32", self.node_ip(to));
            if let Err(e) = ip(&["-n", &ns, "route", "del", "blackhole", &dst]) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Netns {
    /// Deletes the namespaces (which takes their veth pairs with them) and
    /// the bridge, by name. The replicas must be stopped first: a namespace
    /// with a live process in it outlives its name.
    fn drop(&mut self) {
        // The veth pairs first (deleting our end deletes both): a namespace
        // is torn down lazily by the kernel, and its links could linger.
        for node in 0..self.created_ns.len() {
            let _ = ip(&["link", "del", &format!("lkv{}-{}", self.pid, node + 1)]);
        }
        for ns in self.created_ns.drain(..) {
            if let Err(e) = ip(&["netns", "del", &ns]) {
                tracing::warn!(%e, "cleanup");
            }
        }
        if self.created_bridge {
            if let Err(e) = ip(&["link", "del", &self.bridge()]) {
                tracing::warn!(%e, "cleanup");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::owner_pid;

    #[test]
    fn owner_pid_reads_only_our_names() {
        assert_eq!(owner_pid("lkn123-1", "lkn"), Some(123));
        assert_eq!(owner_pid("lkb77", "lkb"), Some(77));
        assert_eq!(owner_pid("lkv9-3", "lkv"), Some(9));
        assert_eq!(owner_pid("eth0", "lkn"), None);
        assert_eq!(owner_pid("lknx", "lkn"), None);
    }
}
