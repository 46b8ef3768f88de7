//! `conclave bench gcs --cluster`: three Conclave daemons over Corosync in
//! network namespaces, and the floor under them, Corosync CPG's own agreed
//! delivery, measured by bare CPG processes on the same nodes.
//!
//! The floor processes are this executable again (`conclave bench cpg-floor`,
//! hidden), started inside a node's namespace with its corosync's `/dev/shm`
//! (corosync's IPC needs both). There is one per node, as there is one daemon
//! per node in the cluster, so CPG has the same three members in both; each
//! runs the senders whose clients the benchmark puts on its node (the i-th
//! client on node i mod 3, the first S clients sending) and measures every
//! message it receives. Each prints what it measured as JSON on stdout.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use super::floor::{cpg_floor_probe, FloorProbe, FLOOR_HEADER};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::flood::Row;
use conclave_testkit::netns::NetnsCluster;

/// Nodes of the benchmark's cluster.
const NODES: usize = 3;

/// Longest the cluster may take to form.
const FORM_LIMIT: Duration = Duration::from_secs(60);

/// A running three-node cluster; dropping it stops every process and deletes
/// the namespaces (also on an error or a panic that unwinds through it).
pub struct Cluster {
    nodes: NetnsCluster,
    exe: PathBuf,
    rounds: std::sync::atomic::AtomicUsize,
}

impl Cluster {
    /// Starts the cluster: namespaces, corosyncs and `conclave daemon
    /// --backbone cluster` (this executable) per node. Blocking.
    pub fn start() -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find this executable to run the cluster's daemons")?;
        let group = format!("conclave-bench-{}", std::process::id());
        let nodes = NetnsCluster::start(NODES, &exe, &group, FORM_LIMIT).context(
            "cannot start the three-node cluster (needs root, iproute2 and corosync; see the README's cluster section)",
        )?;
        Ok(Cluster { nodes, exe, rounds: Default::default() })
    }

    /// The daemons' Unix sockets, node 1 first.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.nodes.nodes.iter().map(|n| n.socket.clone()).collect()
    }

    /// One round of the floor: a bare CPG process per node in a fresh CPG
    /// group, running `senders` senders between them (placed as the clients
    /// are), each multicasting `count` messages of `size` bytes with at most
    /// `window` of its own in flight. Returns the latencies measured on the
    /// nodes that host some of the `receivers` clients, together, and the
    /// time from the first multicast until the last process had every message.
    pub async fn floor_round(
        &self,
        receivers: usize,
        senders: usize,
        count: usize,
        size: usize,
        window: usize,
        limit: Duration,
    ) -> Result<Row> {
        let round = self.rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let group = format!("conclave-floor-{}-{round}", std::process::id());
        // Dropping the set (on an error or the time limit) kills every process still running.
        let mut probes = JoinSet::new();
        for i in 0..NODES {
            let mut args: Vec<String> = ["bench", "cpg-floor", "--group", &group].map(String::from).into();
            for (flag, value) in [
                ("--members", NODES),
                ("--senders", senders),
                ("--count", count),
                ("--size", size),
                ("--window", window),
            ] {
                args.extend([flag.to_string(), value.to_string()]);
            }
            for sender in (i..senders).step_by(NODES) {
                args.extend(["--sender".to_string(), sender.to_string()]);
            }
            let mut command = tokio::process::Command::from(self.nodes.command_in(i, &self.exe, &args));
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
            let child = command.spawn().context("cannot start a CPG floor process")?;
            probes.spawn(async move { (i, child.wait_with_output().await) });
        }
        let outputs = async {
            let mut outputs = Vec::with_capacity(NODES);
            while let Some(joined) = probes.join_next().await {
                let (i, out) = joined.context("CPG floor task")?;
                let out = out.context("waiting for a CPG floor process")?;
                if !out.status.success() {
                    bail!(
                        "CPG floor process of node {} failed ({}): {}",
                        i + 1,
                        out.status,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                let parsed: ProbeOutput = serde_json::from_slice(&out.stdout)
                    .with_context(|| format!("the CPG floor process of node {} printed no result", i + 1))?;
                outputs.push((i, parsed));
            }
            Ok(outputs)
        };
        let outputs = tokio::time::timeout(limit, outputs)
            .await
            .map_err(|_| anyhow!("a CPG floor round ({senders} senders, {size} bytes) took longer than {limit:?}"))??;
        let expected = senders * count;
        let mut latencies = Vec::with_capacity(expected * receivers);
        let first_send = outputs.iter().filter(|(i, _)| *i < senders).map(|(_, o)| o.started_ns).min();
        // Only nodes with clients measure, as only clients measure in the cluster.
        let last_done = outputs.iter().map(|(_, o)| o.done_ns).max();
        for (i, o) in outputs {
            if o.latencies_ns.len() != expected {
                bail!(
                    "the CPG floor process of node {} received {} messages, not {expected}",
                    i + 1,
                    o.latencies_ns.len()
                );
            }
            if i < receivers {
                latencies.extend(o.latencies_ns);
            }
        }
        latencies.sort_unstable();
        let elapsed = match (first_send, last_done) {
            (Some(start), Some(end)) => Duration::from_nanos(end.saturating_sub(start)),
            _ => bail!("a CPG floor round had no senders"),
        };
        Ok(Row { size, sent: expected, elapsed, latencies })
    }
}

/// What a floor process prints (times in `CLOCK_MONOTONIC` nanoseconds).
#[derive(Serialize, Deserialize)]
struct ProbeOutput {
    latencies_ns: Vec<u64>,
    started_ns: u64,
    done_ns: u64,
}

/// Options of the hidden `conclave bench cpg-floor`: one bare CPG process of
/// a floor round, run by `conclave bench gcs --cluster` inside a node's
/// namespace.
#[derive(Args, Debug)]
pub struct CpgFloorArgs {
    /// The round's CPG group.
    #[arg(long)]
    group: String,
    /// Processes of the round: nobody sends before all are in the group.
    #[arg(long)]
    members: usize,
    /// Senders of the round, over all processes.
    #[arg(long)]
    senders: usize,
    /// A sender this process runs, by number below --senders (repeatable; none: only receive).
    #[arg(long)]
    sender: Vec<u32>,
    /// Messages per sender.
    #[arg(long)]
    count: usize,
    /// Payload size in bytes.
    #[arg(long)]
    size: usize,
    /// Own messages in flight at most.
    #[arg(long)]
    window: usize,
}

/// Runs one floor process and prints its result as JSON.
pub fn run_probe(args: CpgFloorArgs) -> Result<()> {
    if args.size < FLOOR_HEADER {
        bail!("--size must be at least {FLOOR_HEADER}");
    }
    let probe = FloorProbe {
        group: &args.group,
        members: args.members,
        senders: args.senders,
        mine: &args.sender,
        count: args.count,
        size: args.size,
        window: args.window,
    };
    let r = cpg_floor_probe(&probe).context("CPG floor round")?;
    let out = ProbeOutput { latencies_ns: r.latencies_ns, started_ns: r.started_ns, done_ns: r.done_ns };
    println!("{}", serde_json::to_string(&out)?);
    Ok(())
}
