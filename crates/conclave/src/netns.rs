//! A Corosync cluster of Conclave daemons in network namespaces on one host,
//! for the cluster test and benchmarks (needs root, `ip`, corosync).
//!
//! Layout: one bridge namespace with a bridge, and per node a namespace with a
//! veth into the bridge (address 10.77.0.N/24, inside the namespaces only),
//! one corosync and one `conclave daemon --backbone cluster` listening on a
//! Unix socket in a private directory, which clients in the root namespace
//! connect to. Names carry the process id, so concurrent or aborted runs never
//! clash. Each corosync gets a private `/run` (its lock file is hard-coded)
//! and, with its daemon, a private `/dev/shm` (libqb's ring buffers), both
//! bind-mounted from the cluster's own directories: nothing is left in the
//! host's `/dev/shm` even after `kill -9`. Dropping a [`NetnsCluster`] kills
//! every process it started, deletes the namespaces and removes the
//! directories, also when a test panics.
//!
//! Shared between the test (`tests/cluster.rs`) and benchmarks by `#[path]`
//! or `mod`; it uses only std and anyhow.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One node: its namespace, corosync and daemon.
pub struct Node {
    /// The node's network namespace.
    pub netns: String,
    /// The daemon's Unix socket (reachable from the root namespace).
    pub socket: PathBuf,
    /// The node's bridge port (in the bridge namespace).
    port: String,
    /// The daemon's log.
    pub daemon_log: PathBuf,
    corosync_log: PathBuf,
    shm: PathBuf,
    corosync: Option<Child>,
    daemon: Option<Child>,
}

/// A running cluster; see the module docs.
pub struct NetnsCluster {
    /// The nodes, node id `i + 1` at index `i`.
    pub nodes: Vec<Node>,
    bridge: String,
    dir: PathBuf,
    shm_dir: PathBuf,
    namespaces: Vec<String>,
}

/// Runs `ip` with `args`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("cannot run ip (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

fn corosync_conf(nodes: usize, me: usize, dir: &Path) -> String {
    let mut list = String::new();
    for i in 1..=nodes {
        list.push_str(&format!("    node {{\n        nodeid: {i}\n        ring0_addr: 10.77.0.{i}\n    }}\n"));
    }
    format!(
        "totem {{\n    version: 2\n    cluster_name: conclave-test\n    transport: knet\n    crypto_cipher: none\n    \
         crypto_hash: none\n    token: 1000\n    token_coefficient: 0\n    consensus: 1200\n}}\n\
         nodelist {{\n{list}}}\n\
         logging {{\n    to_stderr: yes\n    to_logfile: no\n    to_syslog: no\n    timestamp: hires\n}}\n\
         system {{\n    state_dir: {}\n    sched_rr: no\n}}\n",
        dir.join(format!("n{me}/state")).display()
    )
}

impl NetnsCluster {
    /// Sets up `nodes` namespaces with corosync and a Conclave daemon each
    /// (`conclave` is the binary, `cpg_group` the daemons' group), and waits
    /// until every daemon is in one daemon group of all nodes.
    pub fn start(nodes: usize, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<Self> {
        if !(1..=200).contains(&nodes) {
            bail!("between 1 and 200 nodes");
        }
        let tag = format!("ccl{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("conclave-cluster-{}", std::process::id()));
        let shm_dir = PathBuf::from(format!("/dev/shm/conclave-cluster-{}", std::process::id()));
        let mut cluster = NetnsCluster {
            nodes: Vec::new(),
            bridge: format!("{tag}br"),
            dir: dir.clone(),
            shm_dir: shm_dir.clone(),
            namespaces: Vec::new(),
        };
        // From here on, Drop cleans up whatever was made.
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let br = cluster.bridge.clone();
        ip(&["netns", "add", &br])?;
        cluster.namespaces.push(br.clone());
        ip(&["-n", &br, "link", "set", "lo", "up"])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        for i in 1..=nodes {
            let ns = format!("{tag}n{i}");
            ip(&["netns", "add", &ns])?;
            cluster.namespaces.push(ns.clone());
            let port = format!("p{i}");
            ip(&["-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &br])?;
            ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"])?;
            ip(&["-n", &ns, "addr", "add", &format!("10.77.0.{i}/24"), "dev", "eth0"])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            let node_dir = dir.join(format!("n{i}"));
            let shm = shm_dir.join(format!("n{i}"));
            for d in [node_dir.join("run"), node_dir.join("state"), shm.clone()] {
                fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
            }
            let conf = node_dir.join("corosync.conf");
            fs::write(&conf, corosync_conf(nodes, i, &dir))?;
            cluster.nodes.push(Node {
                netns: ns,
                socket: dir.join(format!("n{i}.sock")),
                port,
                daemon_log: node_dir.join("daemon.log"),
                corosync_log: node_dir.join("corosync.log"),
                shm,
                corosync: None,
                daemon: None,
            });
        }
        for i in 0..nodes {
            let node = &cluster.nodes[i];
            let script = format!(
                "mount --bind {run} /run && mount --bind {shm} /dev/shm && exec corosync -f -c {conf}",
                run = dir.join(format!("n{}/run", i + 1)).display(),
                shm = node.shm.display(),
                conf = dir.join(format!("n{}/corosync.conf", i + 1)).display(),
            );
            let child = spawn_in(&node.netns, &script, &node.corosync_log)?;
            cluster.nodes[i].corosync = Some(child);
        }
        for i in 0..nodes {
            cluster.start_daemon(i, conclave, cpg_group, timeout)?;
        }
        let all: Vec<String> = (1..=nodes).map(|i| i.to_string()).collect();
        let formed = format!("daemon group: [{}]", all.join(", "));
        for i in 0..nodes {
            cluster.wait_log(i, &formed, timeout)?;
        }
        Ok(cluster)
    }

    /// Starts node `i`'s daemon, retrying while its corosync is not up yet.
    fn start_daemon(&mut self, i: usize, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let node = &self.nodes[i];
            let script = format!(
                "mount --bind {shm} /dev/shm && RUST_LOG=info exec {bin} daemon --backbone cluster --cpg-group {cpg_group} \
                 --unix {sock}",
                shm = node.shm.display(),
                bin = conclave.display(),
                sock = node.socket.display(),
            );
            let mut child = spawn_in(&node.netns, &script, &node.daemon_log)?;
            // The daemon listens only once it is in the CPG group.
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    let log = fs::read_to_string(&node.daemon_log).unwrap_or_default();
                    if !log.contains("cannot connect to corosync") {
                        bail!("daemon of node {} exited ({status}):\n{log}", i + 1);
                    }
                    break;
                }
                if node.socket.exists() {
                    self.nodes[i].daemon = Some(child);
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("timed out waiting for the daemon of node {} to listen (is corosync up?)", i + 1);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until node `i`'s daemon log shows `text` in its last daemon-group line.
    pub fn wait_log(&self, i: usize, text: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let node = &self.nodes[i];
        loop {
            let log = fs::read_to_string(&node.daemon_log).unwrap_or_default();
            let last = log.lines().rfind(|l| l.contains("daemon group:")).unwrap_or("");
            if last.contains(text) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("timed out waiting for node {} to report {text:?}; its last report: {last:?}", i + 1);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A command that runs `program` with `args` in node `i`'s network
    /// namespace with its corosync's `/dev/shm`, as a client of that corosync
    /// (corosync's IPC needs both).
    pub fn command_in(&self, i: usize, program: &Path, args: &[String]) -> Command {
        let mut c = Command::new("ip");
        // The paths go to sh as arguments, never into the script: no quoting to get wrong.
        c.args(["netns", "exec", &self.nodes[i].netns, "sh", "-c", "mount --bind \"$0\" /dev/shm && exec \"$@\""])
            .arg(&self.nodes[i].shm)
            .arg(program)
            .args(args);
        c
    }

    /// Cuts node `i` off the network (its bridge port down).
    pub fn cut(&self, i: usize) -> Result<()> {
        ip(&["-n", &self.bridge, "link", "set", &self.nodes[i].port, "down"])
    }

    /// Reconnects node `i` (its bridge port up).
    pub fn heal(&self, i: usize) -> Result<()> {
        ip(&["-n", &self.bridge, "link", "set", &self.nodes[i].port, "up"])
    }

    /// The last lines of every log, for a failure report.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut s = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            for path in [&n.daemon_log, &n.corosync_log] {
                let text = fs::read_to_string(path).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                s.push_str(&format!("--- node {} {}\n", i + 1, path.display()));
                for l in &all[all.len().saturating_sub(lines)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        s
    }
}

/// Runs `script` with sh in network namespace `netns` (and a mount
/// namespace of its own), output to `log`.
fn spawn_in(netns: &str, script: &str, log: &Path) -> Result<Child> {
    let out = fs::File::create(log).with_context(|| format!("cannot create {}", log.display()))?;
    let err = out.try_clone()?;
    Command::new("ip")
        .args(["netns", "exec", netns, "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .with_context(|| format!("cannot start {script:?} in {netns}"))
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("cluster logs:\n{}", self.log_tails(40));
        }
        for node in &mut self.nodes {
            for child in [node.daemon.take(), node.corosync.take()].into_iter().flatten() {
                let mut child = child;
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        for ns in self.namespaces.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("cleanup: {e}");
            }
        }
        let _ = fs::remove_dir_all(&self.shm_dir);
        let _ = fs::remove_dir_all(&self.dir);
    }
}
