//! A Corosync cluster of Conclave daemons in network namespaces on one host,
//! for the cluster test and benchmarks (needs root, `ip`, corosync).
//!
//! Layout: one bridge namespace with a bridge, and per node a namespace with a
//! veth into the bridge (address 10.77.0.N/24, inside the namespaces only),
//! one corosync (totem crypto on, with a key made for the run) and one
//! `conclave daemon --backbone cluster` listening on a
//! Unix socket in a private directory, which clients in the root namespace
//! connect to. Names carry the process id, so concurrent or aborted runs never
//! clash. Each corosync gets a private `/run` (its lock file is hard-coded)
//! and, with its daemon, a private `/dev/shm` (libqb's ring buffers), both
//! bind-mounted from the cluster's own directories: nothing is left in the
//! host's `/dev/shm` even after `kill -9`. Dropping a [`NetnsCluster`] kills
//! every process it started, deletes the namespaces and removes the
//! directories, also when a test panics.
//!
//! For benchmarks the cluster can also split in two (the second side's
//! ports move to a second bridge) and take WAN delays: a userspace
//! `DelayHub` then replaces the bridge, as this machine's kernel has no
//! netem.
//!
//! Shared by the cluster test (`crates/conclave/tests/cluster.rs`) and the
//! benchmarks (`conclave-bench`, feature `cluster`); it uses only std, anyhow
//! and libc (`setns`), and the `ip` and `tc` commands.

use std::fs;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// One node: its namespace, corosync and daemon.
pub struct Node {
    /// "node N", or "impostor of node N", for messages.
    label: String,
    /// The node's directory: corosync.conf, authkey, run/, state/, logs.
    dir: PathBuf,
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
    /// Appended to the daemon's command line (see [`NetnsCluster::start_with`]).
    daemon_args: Vec<String>,
}

/// A running cluster; see the module docs.
pub struct NetnsCluster {
    /// The nodes, node id `i + 1` at index `i`.
    pub nodes: Vec<Node>,
    /// Impostors started by [`NetnsCluster::start_impostor`].
    pub impostors: Vec<Node>,
    /// Prefix of the cluster's namespaces: `ccl<pid>`.
    tag: String,
    bridge: String,
    dir: PathBuf,
    shm_dir: PathBuf,
    namespaces: Vec<String>,
    hub: Option<DelayHub>,
}

/// Runs `ip` with `args`, failing with its stderr.
fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("cannot run ip (is iproute2 installed?)")?;
    if !out.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// The corosync.conf of a node of `nodes` (corosync finds its own by its
/// address). Totem traffic is encrypted and authenticated
/// (knet, AES-256 and SHA-256) with the key at `authkey` in `node_dir`:
/// without it, anything that reaches the nodes' network could inject totem
/// packets, and so CPG messages in any node's name.
fn corosync_conf(nodes: usize, node_dir: &Path) -> String {
    let mut list = String::new();
    for i in 1..=nodes {
        list.push_str(&format!("    node {{\n        nodeid: {i}\n        ring0_addr: 10.77.0.{i}\n    }}\n"));
    }
    format!(
        "totem {{\n    version: 2\n    cluster_name: conclave-test\n    transport: knet\n    crypto_cipher: aes256\n    \
         crypto_hash: sha256\n    keyfile: {key}\n    token: 1000\n    token_coefficient: 0\n    consensus: 1200\n}}\n\
         nodelist {{\n{list}}}\n\
         logging {{\n    to_stderr: yes\n    to_logfile: no\n    to_syslog: no\n    timestamp: hires\n}}\n\
         system {{\n    state_dir: {state}\n    sched_rr: no\n}}\n",
        key = node_dir.join("authkey").display(),
        state = node_dir.join("state").display(),
    )
}

/// Bytes of the cluster's totem key (what `corosync-keygen` writes by default).
const AUTHKEY_LEN: usize = 256;

/// A fresh totem key for one cluster, from the kernel's random source.
fn new_authkey() -> Result<Vec<u8>> {
    use std::io::Read;
    let mut key = vec![0u8; AUTHKEY_LEN];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .context("cannot read a totem key from /dev/urandom")?;
    Ok(key)
}

/// Writes `key` to `path`, readable by its owner only (mode 0400, as
/// corosync-keygen leaves it); the file must not exist yet.
fn write_authkey(path: &Path, key: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o400)
        .open(path)
        .and_then(|mut f| f.write_all(key))
        .with_context(|| format!("cannot write the totem key {}", path.display()))
}

impl NetnsCluster {
    /// Sets up `nodes` namespaces with corosync and a Conclave daemon each
    /// (`conclave` is the binary, `cpg_group` the daemons' group), and waits
    /// until every daemon is in one daemon group of all nodes.
    pub fn start(nodes: usize, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<Self> {
        Self::start_with(nodes, conclave, cpg_group, timeout, &|_| Vec::new())
    }

    /// As [`NetnsCluster::start`], with `daemon_args(i)` appended to the
    /// command line of node `i`'s daemon (nodes count from 1, as their ids
    /// and daemon numbers do); restarts keep them.
    pub fn start_with(
        nodes: usize,
        conclave: &Path,
        cpg_group: &str,
        timeout: Duration,
        daemon_args: &dyn Fn(usize) -> Vec<String>,
    ) -> Result<Self> {
        if !(1..=200).contains(&nodes) {
            bail!("between 1 and 200 nodes");
        }
        let tag = format!("ccl{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("conclave-cluster-{}", std::process::id()));
        let shm_dir = PathBuf::from(format!("/dev/shm/conclave-cluster-{}", std::process::id()));
        let mut cluster = NetnsCluster {
            nodes: Vec::new(),
            impostors: Vec::new(),
            tag: tag.clone(),
            bridge: format!("{tag}br"),
            dir: dir.clone(),
            shm_dir: shm_dir.clone(),
            namespaces: Vec::new(),
            hub: None,
        };
        // From here on, Drop cleans up whatever was made.
        fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let br = cluster.bridge.clone();
        ip(&["netns", "add", &br])?;
        cluster.namespaces.push(br.clone());
        ip(&["-n", &br, "link", "set", "lo", "up"])?;
        ip(&["-n", &br, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br0", "up"])?;
        // The second side of a split (see `split`): empty until then.
        ip(&["-n", &br, "link", "add", "br1", "type", "bridge"])?;
        ip(&["-n", &br, "link", "set", "br1", "up"])?;
        // One key per run, a copy in every node's directory (as on real nodes).
        let authkey = new_authkey()?;
        for i in 1..=nodes {
            let mut node = cluster.add_node(&format!("n{i}"), format!("node {i}"), i, nodes, &authkey)?;
            node.daemon_args = daemon_args(i);
            cluster.nodes.push(node);
        }
        for node in &mut cluster.nodes {
            node.start_corosync()?;
        }
        for node in &mut cluster.nodes {
            node.start_daemon(conclave, cpg_group, timeout)?;
        }
        let all: Vec<String> = (1..=nodes).map(|i| i.to_string()).collect();
        let formed = format!("daemon group: [{}]", all.join(", "));
        for i in 0..nodes {
            cluster.wait_log(i, &formed, timeout)?;
        }
        Ok(cluster)
    }

    /// Makes node `id`'s namespace (`<tag><name>`), on the main bridge with
    /// address 10.77.0.`id`, and its directory `<dir>/<name>` with `key` and a
    /// corosync.conf for node `id` of `nodes`; starts nothing.
    fn add_node(&mut self, name: &str, label: String, id: usize, nodes: usize, key: &[u8]) -> Result<Node> {
        let ns = format!("{}{name}", self.tag);
        let br = self.bridge.clone();
        ip(&["netns", "add", &ns])?;
        self.namespaces.push(ns.clone());
        let port = format!("p{name}");
        ip(&["-n", &ns, "link", "add", "eth0", "type", "veth", "peer", "name", &port, "netns", &br])?;
        ip(&["-n", &br, "link", "set", &port, "master", "br0", "up"])?;
        ip(&["-n", &ns, "addr", "add", &format!("10.77.0.{id}/24"), "dev", "eth0"])?;
        ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        let node_dir = self.dir.join(name);
        let shm = self.shm_dir.join(name);
        for d in [node_dir.join("run"), node_dir.join("state"), shm.clone()] {
            fs::create_dir_all(&d).with_context(|| format!("cannot create {}", d.display()))?;
        }
        write_authkey(&node_dir.join("authkey"), key)?;
        fs::write(node_dir.join("corosync.conf"), corosync_conf(nodes, &node_dir))?;
        Ok(Node {
            label,
            netns: ns,
            socket: self.dir.join(format!("{name}.sock")),
            port,
            daemon_log: node_dir.join("daemon.log"),
            corosync_log: node_dir.join("corosync.log"),
            dir: node_dir,
            shm,
            corosync: None,
            daemon: None,
            daemon_args: Vec::new(),
        })
    }

    /// Starts an impostor of node `i` (index into [`NetnsCluster::nodes`]):
    /// a namespace on the same bridge with that node's address, a corosync
    /// with that node's configuration but a totem key of its own, as someone
    /// on the network who knows everything but the key would run, and a
    /// daemon in the same CPG group. Cut the real node off first
    /// ([`NetnsCluster::cut`]): the two have one address. Returns once the
    /// impostor's daemon listens (it may be alone in its daemon group).
    pub fn start_impostor(&mut self, i: usize, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<&Node> {
        let (id, nodes) = (i + 1, self.nodes.len());
        let name = format!("x{id}");
        let mut node = self.add_node(&name, format!("impostor of node {id}"), id, nodes, &new_authkey()?)?;
        // Pushed first: Drop stops whatever of it started.
        node.start_corosync()?;
        self.impostors.push(node);
        let node = self.impostors.last_mut().expect("just pushed");
        node.start_daemon(conclave, cpg_group, timeout)?;
        Ok(node)
    }

    /// Kills node `i`'s daemon (SIGKILL, as in a crash: its socket file stays)
    /// and starts a new one; returns once it listens, or its error if it exits.
    pub fn restart_daemon(&mut self, i: usize, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<()> {
        let node = &mut self.nodes[i];
        if let Some(mut old) = node.daemon.take() {
            let _ = old.kill();
            let _ = old.wait();
        }
        // The socket file tells start_daemon that the daemon listens.
        match fs::remove_file(&node.socket) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("cannot remove {}", node.socket.display()));
            }
            _ => {}
        }
        node.start_daemon(conclave, cpg_group, timeout)
    }

    /// Waits until node `i`'s daemon log shows `text` in its last daemon-group line.
    pub fn wait_log(&self, i: usize, text: &str, timeout: Duration) -> Result<()> {
        self.nodes[i].wait_log(text, timeout)
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

    /// Splits the cluster in two: the nodes of `second` move to a bridge of
    /// their own, where they reach each other but none of the rest (unlike
    /// [`NetnsCluster::cut`], which leaves each cut node alone).
    pub fn split(&self, second: &[usize]) -> Result<()> {
        if let Some(hub) = &self.hub {
            let mut sides = hub.sides.lock().expect("hub sides");
            for &i in second {
                sides[i] = 1;
            }
            return Ok(());
        }
        for &i in second {
            ip(&["-n", &self.bridge, "link", "set", &self.nodes[i].port, "master", "br1"])?;
        }
        Ok(())
    }

    /// Undoes [`NetnsCluster::split`]: the nodes of `second` back on the main bridge.
    pub fn unsplit(&self, second: &[usize]) -> Result<()> {
        if let Some(hub) = &self.hub {
            let mut sides = hub.sides.lock().expect("hub sides");
            for &i in second {
                sides[i] = 0;
            }
            return Ok(());
        }
        for &i in second {
            ip(&["-n", &self.bridge, "link", "set", &self.nodes[i].port, "master", "br0"])?;
        }
        Ok(())
    }

    /// Replaces the bridge with a `DelayHub` (this kernel may lack
    /// netem): every frame from node `i` reaches node `j` after
    /// `one_way_ms[i][j]`. [`NetnsCluster::split`] and `unsplit` then act on
    /// the hub.
    pub fn delay(&mut self, one_way_ms: Vec<Vec<f64>>) -> Result<()> {
        if self.hub.is_some() {
            bail!("the cluster's delays are set already");
        }
        let ports: Vec<String> = self.nodes.iter().map(|n| n.port.clone()).collect();
        for port in &ports {
            ip(&["-n", &self.bridge, "link", "set", port, "nomaster"])?;
        }
        self.hub = Some(DelayHub::start(&self.bridge, &ports, one_way_ms)?);
        Ok(())
    }

    /// Round-trip times from node `from` to node `to`, in ms: `count` UDP
    /// echoes, one at a time, between sockets opened in the two namespaces.
    pub fn rtt(&self, from: usize, to: usize, count: usize) -> Result<Vec<f64>> {
        let addr = |i: usize| format!("10.77.0.{}:0", i + 1);
        let server = socket_in(&self.nodes[to].netns, &addr(to))?;
        let client = socket_in(&self.nodes[from].netns, &addr(from))?;
        let server_addr = server.local_addr()?;
        let limit = Some(Duration::from_secs(5));
        server.set_read_timeout(limit)?;
        client.set_read_timeout(limit)?;
        let echo = std::thread::spawn(move || -> std::io::Result<()> {
            let mut buf = [0u8; 64];
            for _ in 0..count {
                let (len, peer) = server.recv_from(&mut buf)?;
                server.send_to(&buf[..len], peer)?;
            }
            Ok(())
        });
        let mut rtts = Vec::with_capacity(count);
        let mut buf = [0u8; 64];
        for k in 0..count as u64 {
            let t0 = Instant::now();
            client.send_to(&k.to_be_bytes(), server_addr)?;
            let len =
                client.recv(&mut buf).with_context(|| format!("no echo from node {} to node {}", to + 1, from + 1))?;
            if buf[..len] != k.to_be_bytes() {
                bail!("echo {k} from node {} came back altered", to + 1);
            }
            rtts.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        echo.join().map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
        Ok(rtts)
    }

    /// The last lines of every log, for a failure report.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut s = String::new();
        for n in self.nodes.iter().chain(&self.impostors) {
            for path in [&n.daemon_log, &n.corosync_log] {
                let text = fs::read_to_string(path).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                s.push_str(&format!("--- {} {}\n", n.label, path.display()));
                for l in &all[all.len().saturating_sub(lines)..] {
                    s.push_str(l);
                    s.push('\n');
                }
            }
        }
        s
    }
}

impl Node {
    /// Starts the node's corosync, with a private `/run` and `/dev/shm`.
    fn start_corosync(&mut self) -> Result<()> {
        let script = format!(
            "mount --bind {run} /run && mount --bind {shm} /dev/shm && exec corosync -f -c {conf}",
            run = self.dir.join("run").display(),
            shm = self.shm.display(),
            conf = self.dir.join("corosync.conf").display(),
        );
        self.corosync = Some(spawn_in(&self.netns, &script, &self.corosync_log)?);
        Ok(())
    }

    /// Starts the node's daemon, retrying while its corosync is not up yet.
    fn start_daemon(&mut self, conclave: &Path, cpg_group: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let script = format!(
                "mount --bind {shm} /dev/shm && RUST_LOG=info exec {bin} daemon --backbone cluster --cpg-group {cpg_group} \
                 --unix {sock}{extra}",
                shm = self.shm.display(),
                bin = conclave.display(),
                sock = self.socket.display(),
                extra = self.daemon_args.iter().map(|a| format!(" '{}'", a.replace('\'', "'\\''"))).collect::<String>(),
            );
            let mut child = spawn_in(&self.netns, &script, &self.daemon_log)?;
            // The daemon listens only once it is in the CPG group.
            while Instant::now() < deadline {
                if let Some(status) = child.try_wait()? {
                    let log = fs::read_to_string(&self.daemon_log).unwrap_or_default();
                    if !log.contains("cannot connect to corosync") {
                        bail!("daemon of {} exited ({status}):\n{log}", self.label);
                    }
                    break;
                }
                if self.socket.exists() {
                    self.daemon = Some(child);
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                bail!("timed out waiting for the daemon of {} to listen (is corosync up?)", self.label);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The last daemon-group line of the daemon's log ("" before the first).
    pub fn daemon_group(&self) -> String {
        let log = fs::read_to_string(&self.daemon_log).unwrap_or_default();
        log.lines().rfind(|l| l.contains("daemon group:")).unwrap_or("").to_owned()
    }

    /// Waits until the daemon's log shows `text` in its last daemon-group line.
    pub fn wait_log(&self, text: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = self.daemon_group();
            if last.contains(text) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("timed out waiting for {} to report {text:?}; its last report: {last:?}", self.label);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The corosync log so far.
    pub fn corosync_log(&self) -> String {
        fs::read_to_string(&self.corosync_log).unwrap_or_default()
    }
}

/// Runs `make` in a thread that enters network namespace `netns` and ends:
/// sockets it opens stay in that namespace.
fn in_netns<T: Send + 'static>(netns: &str, make: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let path = Path::new("/var/run/netns").join(netns);
    let file = fs::File::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
    std::thread::spawn(move || -> Result<T> {
        // SAFETY: setns only changes this thread's network namespace (the
        // thread ends right after); the descriptor is open for the call.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            bail!("cannot enter network namespace: {}", std::io::Error::last_os_error());
        }
        make()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("namespace thread panicked"))?
}

/// A UDP socket bound to `addr` in network namespace `netns`.
fn socket_in(netns: &str, addr: &str) -> Result<std::net::UdpSocket> {
    let addr = addr.to_owned();
    in_netns(netns, move || std::net::UdpSocket::bind(&addr).with_context(|| format!("cannot bind {addr}")))
}

/// A userspace Ethernet hub with a delay per pair of ports, in the bridge
/// namespace in place of the bridge: raw packet sockets on the nodes'
/// ports, one thread per port that reads frames and queues a copy for every
/// other port on its side (`one_way_ms[from][to]` later), and one thread that
/// sends them when due, in due order. Netem would do this in the kernel, but
/// kernels without `sch_netem` (such as this machine's) are common in VMs.
///
/// Frames are copied as the kernel hands them over, so the UDP checksum of
/// an IPv4 datagram may be a partial one left for offload: the hub clears it
/// (zero means "no checksum" in IPv4). No TCP crosses between nodes here.
struct DelayHub {
    /// Side of each port: frames pass only between ports of one side.
    sides: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// Frames waiting for their time: (due, sequence, port, frame), earliest first.
type DueFrames = std::collections::BinaryHeap<std::cmp::Reverse<(Instant, u64, usize, Vec<u8>)>>;

impl DelayHub {
    fn start(bridge_ns: &str, ports: &[String], one_way_ms: Vec<Vec<f64>>) -> Result<Self> {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        use std::sync::{Arc, Condvar, Mutex};
        if one_way_ms.len() != ports.len() || one_way_ms.iter().any(|row| row.len() != ports.len()) {
            bail!("the delay matrix must be {0} × {0}", ports.len());
        }
        let mut sockets = Vec::new();
        for port in ports {
            let port = port.clone();
            sockets.push(Arc::new(in_netns(bridge_ns, move || packet_socket(&port))?));
        }
        let sides = Arc::new(Mutex::new(vec![0u8; ports.len()]));
        let stop = Arc::new(AtomicBool::new(false));
        let queue = Arc::new((Mutex::new(DueFrames::new()), Condvar::new()));
        let seq = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for (from, socket) in sockets.iter().enumerate() {
            let (socket, sides, stop, queue, seq) =
                (socket.clone(), sides.clone(), stop.clone(), queue.clone(), seq.clone());
            let delays: Vec<Duration> =
                one_way_ms[from].iter().map(|&ms| Duration::from_secs_f64(ms.max(0.0) / 1e3)).collect();
            threads.push(std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                while !stop.load(Ordering::Relaxed) {
                    let Some(len) = receive(&socket, &mut buf) else { continue };
                    let at = Instant::now();
                    let frame = &mut buf[..len];
                    clear_udp_checksum(frame);
                    let sides = sides.lock().expect("hub sides").clone();
                    let (lock, ready) = &*queue;
                    let mut due = lock.lock().expect("hub queue");
                    for (to, delay) in delays.iter().enumerate() {
                        if to != from && sides[to] == sides[from] {
                            let n = seq.fetch_add(1, Ordering::Relaxed);
                            due.push(std::cmp::Reverse((at + *delay, n, to, frame.to_vec())));
                        }
                    }
                    ready.notify_one();
                }
            }));
        }
        let sender_stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            let (lock, ready) = &*queue;
            let mut due = lock.lock().expect("hub queue");
            while !sender_stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                match due.peek() {
                    Some(std::cmp::Reverse((at, ..))) if *at <= now => {
                        let std::cmp::Reverse((_, _, to, frame)) = due.pop().expect("peeked");
                        // A send fails when the port is down (a cut node): the frame is lost, as on a wire.
                        // SAFETY: the socket is open (held by the Arc) and the buffer is valid for its length.
                        unsafe { libc::send(sockets[to].as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
                    }
                    next => {
                        let wait = next.map_or(Duration::from_millis(100), |std::cmp::Reverse((at, ..))| *at - now);
                        due = ready.wait_timeout(due, wait.min(Duration::from_millis(100))).expect("hub queue").0;
                    }
                }
            }
        }));
        Ok(DelayHub { sides, stop, threads })
    }

    /// Stops the threads (each sees the flag within 100 ms).
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A raw packet socket on interface `port` (of the calling thread's
/// namespace), with a 100 ms receive timeout.
fn packet_socket(port: &str) -> Result<OwnedFd> {
    let name = std::ffi::CString::new(port)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!("no interface {port}: {}", std::io::Error::last_os_error());
    }
    let all = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket creation; the descriptor is owned right away.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, all.into()) };
    if fd < 0 {
        bail!("cannot open a packet socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_ll is plain data; zero is valid for every field.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = all;
    addr.sll_ifindex = index as i32;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: addr is a valid sockaddr_ll of `len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const addr).cast(), len) } != 0 {
        bail!("cannot bind a packet socket to {port}: {}", std::io::Error::last_os_error());
    }
    let timeout = libc::timeval { tv_sec: 0, tv_usec: 100_000 };
    let size = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: a valid timeval of `size` bytes.
    if unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&raw const timeout).cast(), size)
    } != 0
    {
        bail!("cannot set a receive timeout: {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// The next frame that arrived on the port (not one the hub sent out of it),
/// or `None` after the receive timeout or an error.
fn receive(socket: &OwnedFd, buf: &mut [u8]) -> Option<usize> {
    // SAFETY: sockaddr_ll is plain data; zero is valid for every field.
    let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: buf and from are valid for the lengths given.
    let n = unsafe {
        libc::recvfrom(socket.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0, (&raw mut from).cast(), &mut len)
    };
    (n > 0 && from.sll_pkttype != libc::PACKET_OUTGOING).then_some(n as usize)
}

/// Clears the UDP checksum of an Ethernet frame carrying an unfragmented
/// or first-fragment IPv4 UDP datagram (see `DelayHub`).
fn clear_udp_checksum(frame: &mut [u8]) {
    const ETH: usize = 14;
    if frame.len() < ETH + 20 || frame[12..14] != [0x08, 0x00] || frame[ETH + 9] != 17 {
        return;
    }
    let fragment_offset = u16::from_be_bytes([frame[ETH + 6], frame[ETH + 7]]) & 0x1fff;
    let udp = ETH + usize::from(frame[ETH] & 0x0f) * 4;
    if fragment_offset == 0 && frame.len() >= udp + 8 {
        frame[udp + 6] = 0;
        frame[udp + 7] = 0;
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
        if let Some(hub) = self.hub.take() {
            hub.stop();
        }
        for node in self.nodes.iter_mut().chain(&mut self.impostors) {
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
