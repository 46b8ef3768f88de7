//! `conclave bench gcs`: group communication measured on real sockets,
//! printed as tables.
//!
//! * **Agreed multicast.** R members join one group; S of them send. Latency
//!   runs keep one message in flight per sender (each sends its next message
//!   once its previous one came back), so they show the cost of one message
//!   through the daemon rather than queueing; every receiver measures every
//!   message from its send time (one process, one clock), and the table gives
//!   p50 and p99. Throughput runs flood a bounded number of messages per size
//!   (shared by the senders, capped at [`FLOOD_BYTES`] of payload) and count
//!   messages and payload bytes per second until every receiver has all.
//! * **Membership.** For each group size n, n−1 members are in a group and
//!   one more joins: the join latency is from the join request until every
//!   member, the joiner included, has the view of n; then the same member
//!   leaves, until the others have the view of n−1 and the leaver its Left.
//!
//! Each measurement runs against every *target*: the daemons given with
//! `--unix` (clients spread round-robin over them), else an embedded
//! standalone daemon in this process, with `--tls` the same embedded daemon
//! over TLS, and with `--cluster` three daemons over Corosync in network
//! namespaces (clients spread over the nodes). A target may name another to
//! compare with: its rows then carry the ratio (TLS and the cluster against
//! the standalone daemon's Unix socket).
//!
//! With `--cluster`, the same run also measures the floor under the cluster:
//! Corosync CPG's own agreed delivery between bare CPG processes, one per
//! node as the daemons are, in the same latency and throughput rounds
//! (see [`cluster`]); the cluster's rows are then divided by it.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use conclave_gcs_net::{Client, ClientReceiver, Daemon, DaemonConfig, Event, Identity, TlsClientOptions, TlsListen};
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::Serialize;
use tokio::task::JoinSet;

use crate::flood::{self, Conn, Flood, HEADER};

#[cfg(feature = "cluster")]
mod cluster;
#[cfg(feature = "cluster")]
pub mod floor;
pub(crate) mod secure;
#[cfg(feature = "cluster")]
use cluster::Cluster;
#[cfg(feature = "cluster")]
pub use cluster::{run_probe as run_cpg_floor, CpgFloorArgs};

/// Without the `cluster` feature there is never a cluster.
#[cfg(not(feature = "cluster"))]
enum Cluster {}

#[cfg(not(feature = "cluster"))]
impl Cluster {
    fn sockets(&self) -> Vec<PathBuf> {
        match *self {}
    }

    async fn floor_round(&self, _: usize, _: usize, _: usize, _: usize, _: usize, _: Duration) -> Result<flood::Row> {
        match *self {}
    }
}

/// Payload a throughput run sends at most, all senders together.
pub(crate) const FLOOD_BYTES: usize = 64 << 20;

/// Payload all senders together may have in flight in a throughput run
/// (and at most 2048 messages), so that no receiver's queue at the daemon
/// grows past that.
pub(crate) const WINDOW_BYTES: usize = 16 << 20;

/// Longest one step (a round, a connect, a view change) may take.
pub(crate) const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Options of `conclave bench gcs`.
#[derive(Args, Debug)]
#[command(after_help = "Latency is from send to delivery at every receiver, in microseconds, with one message in \
flight per sender. Throughput counts the messages (and payload bytes) of a bounded flood per second, until \
every receiver has all of them. Join and leave latency run until every member has the new view. \
With --tls, the same embedded daemon is measured over TLS too, and the TLS rows carry their ratio to the \
Unix socket (×: TLS value / Unix value). The embedded daemon shares this process's CPUs with the clients. \
With --cluster (root; conclave built with --features cluster), three daemons over Corosync run in network \
namespaces, the clients spread over them, and their rows carry the ratio to the standalone daemon; Corosync CPG's \
own agreed delivery between bare CPG processes on the same nodes is measured in the same rounds, as the floor, \
and printed with the ratio cluster / floor.")]
pub struct GcsArgs {
    /// Daemon to measure, by Unix socket (repeatable: clients are spread round-robin over the daemons)
    /// [default: an embedded standalone daemon in this process].
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,
    /// Also measure the embedded daemon over TLS (certificate generated at start) and print the ratio to its Unix socket.
    #[arg(long, conflicts_with = "unix")]
    tls: bool,
    /// Also measure a three-node cluster (Corosync in network namespaces, clients spread over the nodes) and
    /// Corosync CPG's raw delivery as its floor (needs root and a build with --features cluster).
    #[arg(long, conflicts_with = "unix")]
    cluster: bool,
    /// Payload sizes in bytes (comma-separated, at least 16).
    #[arg(long, value_delimiter = ',', default_value = "64,1024,16384,65536", value_name = "BYTES,...")]
    sizes: Vec<usize>,
    /// Numbers of senders (comma-separated), each at most --receivers.
    #[arg(long, value_delimiter = ',', default_value = "1,4", value_name = "S,...")]
    senders: Vec<usize>,
    /// Members of the multicast group (the senders among them); every one receives every message.
    #[arg(long, default_value_t = 4, value_name = "R")]
    receivers: usize,
    /// Latency: messages per sender and size.
    #[arg(long, default_value_t = 200, value_name = "N")]
    latency_count: usize,
    /// Throughput: messages per size, all senders together (at most 64 MiB of payload).
    #[arg(long, default_value_t = 4000, value_name = "N")]
    count: usize,
    /// Join and leave: group sizes after the join (comma-separated, at least 2).
    #[arg(long, value_delimiter = ',', default_value = "2,8,32,128", value_name = "N,...")]
    group_sizes: Vec<usize>,
    /// Join and leave: repetitions per group size.
    #[arg(long, default_value_t = 10, value_name = "N")]
    reps: usize,
    /// Also write every result as JSON to this file.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// A smoke run for CI: 20 latency and 200 flood messages, group sizes 2 and 4, 2 repetitions.
    #[arg(long)]
    quick: bool,
    /// Skip the secure data rounds (the throughput rounds again, through secure sessions with sender
    /// signatures on and off).
    #[arg(long)]
    no_secure: bool,
}

/// How the clients of a target reach their daemon(s).
enum Reach {
    /// Unix sockets, one client after another round-robin.
    Unix(Vec<PathBuf>),
    /// TLS on loopback, checked against a generated authority.
    Tls { addr: SocketAddr, options: TlsClientOptions },
}

/// Daemons measured as one: a row label, and the target its ratios are
/// taken against, if any.
struct Target {
    name: &'static str,
    compare_to: Option<&'static str>,
    reach: Reach,
}

impl Target {
    /// Connects the `i`-th client of this target as `name`.
    async fn connect(&self, i: usize, name: &str) -> Result<Client> {
        let connect = async {
            match &self.reach {
                Reach::Unix(paths) => {
                    let path = &paths[i % paths.len()];
                    Client::connect_unix(path, name)
                        .await
                        .with_context(|| format!("cannot connect to the daemon at {} as {name}", path.display()))
                }
                Reach::Tls { addr, options } => Client::connect_tls(*addr, "localhost", options, name)
                    .await
                    .with_context(|| format!("cannot connect over TLS to {addr} as {name}")),
            }
        };
        let mut c =
            tokio::time::timeout(STEP_LIMIT, connect).await.map_err(|_| anyhow!("connecting {name} timed out"))??;
        c.set_max_payload(64 << 20);
        Ok(c)
    }
}

/// One row of the multicast table.
#[derive(Serialize)]
struct MulticastRow {
    target: &'static str,
    senders: usize,
    receivers: usize,
    size: usize,
    latency_p50_us: f64,
    latency_p99_us: f64,
    latency_samples: usize,
    flood_messages: usize,
    messages_per_s: f64,
    mb_per_s: f64,
}

/// One row of the membership table.
#[derive(Serialize)]
struct MembershipRow {
    target: &'static str,
    group_size: usize,
    reps: usize,
    join_p50_us: f64,
    join_max_us: f64,
    leave_p50_us: f64,
    leave_max_us: f64,
}

/// One row of the floor table: Corosync CPG's own delivery, and the
/// cluster's values divided by it.
#[derive(Serialize)]
struct FloorRow {
    senders: usize,
    receivers: usize,
    size: usize,
    latency_p50_us: f64,
    latency_p99_us: f64,
    latency_samples: usize,
    flood_messages: usize,
    messages_per_s: f64,
    mb_per_s: f64,
    /// Cluster latency p50 / floor latency p50.
    cluster_p50_ratio: f64,
    /// Cluster latency p99 / floor latency p99.
    cluster_p99_ratio: f64,
    /// Cluster messages/s / floor messages/s.
    cluster_msgs_ratio: f64,
}

#[derive(Serialize)]
struct Report {
    multicast: Vec<MulticastRow>,
    membership: Vec<MembershipRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    floor: Vec<FloorRow>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    secure: Vec<secure::SecureRow>,
}

/// Runs the benchmark.
pub fn run(mut args: GcsArgs) -> Result<()> {
    if args.quick {
        args.latency_count = 20;
        args.count = 200;
        args.group_sizes = vec![2, 4];
        args.reps = 2;
    }
    if let Some(s) = args.sizes.iter().find(|&&s| s < HEADER) {
        bail!("--sizes {s} is too small: payloads carry a {HEADER}-byte header");
    }
    if args.senders.iter().any(|&s| s == 0 || s > args.receivers) {
        bail!("every --senders value must be between 1 and --receivers ({})", args.receivers);
    }
    if args.group_sizes.iter().any(|&n| n < 2) {
        bail!("--group-sizes must be at least 2 (one member joins the others)");
    }
    if args.latency_count == 0 || args.count == 0 || args.reps == 0 {
        bail!("--latency-count, --count and --reps must be at least 1");
    }
    if !args.cluster {
        return crate::block_on(bench(args, None));
    }
    #[cfg(not(feature = "cluster"))]
    bail!(
        "--cluster needs conclave built with the cluster feature: \
         cargo build --release -p conclave --features cluster (needs corosync's libraries: apt-get install corosync \
         libcorosync-common-dev libcpg-dev libquorum-dev libcfg-dev libcmap-dev libvotequorum-dev), run as root"
    );
    #[cfg(feature = "cluster")]
    crate::block_on(cluster_bench(args))
}

/// The benchmark with a cluster, which is stopped and removed on every way
/// out: an error, a panic that unwinds, Ctrl-C or SIGTERM (caught from before
/// the cluster starts, so that they end the run through the cluster's Drop
/// instead of killing the process).
#[cfg(feature = "cluster")]
async fn cluster_bench(args: GcsArgs) -> Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot catch SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    eprintln!("starting a three-node cluster (network namespaces, corosync, conclave daemon --backbone cluster)");
    let cluster = tokio::task::spawn_blocking(Cluster::start).await.context("starting the cluster")??;
    // A signal that came during the start is still pending here: biased, it wins before the bench begins.
    tokio::select! {
        biased;
        _ = interrupt.recv() => bail!("interrupted"),
        _ = terminate.recv() => bail!("terminated"),
        r = bench(args, Some(&cluster)) => r,
    }
}

/// An embedded standalone daemon on a Unix socket in a temporary directory,
/// with a TLS listener on loopback if asked for.
struct Embedded {
    daemon: Daemon,
    tls: Option<TlsClientOptions>,
    _dir: tempfile::TempDir,
}

async fn embedded(with_tls: bool) -> Result<Embedded> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory for the daemon's socket")?;
    let (tls, options) = if with_tls {
        let (server, client) = generated_tls()?;
        (Some(server), Some(client))
    } else {
        (None, None)
    };
    let config = DaemonConfig { unix: Some(dir.path().join("conclave.sock")), tls, ..DaemonConfig::default() };
    let daemon = Daemon::start(config).await.context("cannot start the embedded daemon")?;
    Ok(Embedded { daemon, tls: options, _dir: dir })
}

/// A TLS listener on loopback with a daemon certificate for localhost from a
/// throwaway authority (Ed25519, as `conclave keys` makes them), and client
/// options that trust the authority.
fn generated_tls() -> Result<(TlsListen, TlsClientOptions)> {
    let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(rcgen::DnType::CommonName, "conclave bench authority");
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca.self_signed(&ca_key)?;
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()])?;
    params.distinguished_name.push(rcgen::DnType::CommonName, "conclave bench daemon");
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let identity = Identity {
        cert_chain: vec![cert.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    };
    let server = TlsListen { addr: SocketAddr::from(([127, 0, 0, 1], 0)), identity, client_auth: None };
    let client = TlsClientOptions::new(&[ca.der().clone()], None)?;
    Ok((server, client))
}

async fn bench(args: GcsArgs, cluster: Option<&Cluster>) -> Result<()> {
    let mut embedded_daemon = None;
    let mut targets = Vec::new();
    if args.unix.is_empty() {
        let e = embedded(args.tls).await?;
        let path = e.daemon.unix_path().expect("the embedded daemon has a socket").to_owned();
        targets.push(Target { name: "unix", compare_to: None, reach: Reach::Unix(vec![path]) });
        if let (Some(addr), Some(options)) = (e.daemon.tls_addr(), e.tls.clone()) {
            targets.push(Target { name: "tls", compare_to: Some("unix"), reach: Reach::Tls { addr, options } });
        }
        eprintln!("embedded standalone daemon (sharing this process's CPUs with the clients)");
        embedded_daemon = Some(e);
    } else {
        let n = args.unix.len();
        eprintln!("{n} daemon(s) given; clients spread over them round-robin");
        targets.push(Target { name: "unix", compare_to: None, reach: Reach::Unix(args.unix.clone()) });
    }
    if let Some(c) = cluster {
        targets.push(Target { name: "cluster", compare_to: Some("unix"), reach: Reach::Unix(c.sockets()) });
        eprintln!("three-node cluster formed; its clients are spread over the nodes round-robin");
    }
    // Names unique to this run, so that it can share daemons with others.
    let prefix = format!("bench-{}", std::process::id());
    let epoch = Instant::now();

    let mut multicast = Vec::new();
    let mut floor = Vec::new();
    for t in &targets {
        // The floor runs right after the cluster's own rounds of each point, so that both see the same machine.
        let floor_of = cluster.filter(|_| t.name == "cluster");
        let (rows, floor_rows) = measure_multicast(&args, t, &prefix, epoch, floor_of).await?;
        multicast.extend(rows);
        floor.extend(floor_rows);
    }
    print_multicast(&args, &targets, &multicast);
    if !floor.is_empty() {
        println!();
        print_floor(&floor);
    }
    let mut secure_rows = Vec::new();
    if !args.no_secure {
        let socket = match &targets[0].reach {
            Reach::Unix(paths) => paths[0].clone(),
            Reach::Tls { .. } => unreachable!("the first target is a Unix socket"),
        };
        for plain in multicast.iter().filter(|r| r.target == targets[0].name) {
            let (per_sender, window) = flood_shape(&args, plain.senders, plain.size);
            let mut flood = secure::SecureFlood {
                sockets: std::slice::from_ref(&socket),
                group: String::new(),
                receivers: args.receivers,
                senders: plain.senders,
                per_sender,
                size: plain.size,
                window,
                policy: conclave_secure::Policy::new(
                    conclave_gka::ProtocolId::Tgdh,
                    conclave_gka::GroupId::Ristretto255,
                ),
                churn: None,
                deadline: None,
            };
            let mut rates = [0.0; 2];
            for (rate, on) in rates.iter_mut().zip([true, false]) {
                flood.policy.sender_signatures = on;
                let signed = if on { "signed" } else { "unsigned" };
                flood.group = format!("{prefix}-sec-{}-{}-{signed}", plain.senders, plain.size);
                eprintln!("secure round: {} senders, {} bytes, {signed}", plain.senders, plain.size);
                *rate = secure::round(&flood).await?.msgs_per_s;
            }
            let [signed_messages_per_s, unsigned_messages_per_s] = rates;
            secure_rows.push(secure::SecureRow {
                senders: plain.senders,
                receivers: args.receivers,
                size: plain.size,
                messages: per_sender * plain.senders,
                plain_messages_per_s: plain.messages_per_s,
                signed_messages_per_s,
                unsigned_messages_per_s,
            });
        }
        println!();
        secure::print(&secure_rows);
    }
    let mut membership = Vec::new();
    for t in &targets {
        for &n in &args.group_sizes {
            membership.push(measure_membership(t, &prefix, n, args.reps).await?);
        }
    }
    println!();
    print_membership(&targets, &membership);

    if let Some(path) = &args.json {
        let report = Report { multicast, membership, floor, secure: secure_rows };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(e) = embedded_daemon {
        e.daemon.shutdown().await;
    }
    Ok(())
}

/// Connects `count` clients of a target, named `{base}-{i}`.
async fn connect_all(t: &Target, base: &str, count: usize) -> Result<(Vec<Client>, Vec<String>)> {
    let names: Vec<String> = (0..count).map(|i| format!("{base}-{i}")).collect();
    let mut clients = Vec::with_capacity(count);
    for (i, name) in names.iter().enumerate() {
        clients.push(t.connect(i, name).await?);
    }
    Ok((clients, names))
}

/// Latency and throughput per sender count and size on one target, and
/// with `floor`, the floor under it measured right after each point.
async fn measure_multicast(
    args: &GcsArgs,
    t: &Target,
    prefix: &str,
    epoch: Instant,
    floor: Option<&Cluster>,
) -> Result<(Vec<MulticastRow>, Vec<FloorRow>)> {
    let group = format!("{prefix}-{}-mc", t.name);
    let (clients, names) = connect_all(t, &format!("{prefix}-{}-m", t.name), args.receivers).await?;
    let mut conns = Vec::with_capacity(clients.len());
    for c in clients {
        c.join(&group).await?;
        let (tx, rx) = c.split();
        conns.push(Conn { tx, rx: Some(rx) });
    }
    let ours: Arc<HashSet<String>> = Arc::new(names.into_iter().collect());
    for c in &mut conns {
        flood::wait_for_all(c.rx.as_mut().expect("receiver"), &group, &ours).await?;
    }
    let (mut rows, mut floor_rows) = (Vec::new(), Vec::new());
    for &senders in &args.senders {
        for &size in &args.sizes {
            let what = |kind| format!("{kind} round ({}, {senders} senders, {size} bytes)", t.name);
            let one_at_a_time = Flood { group: &group, senders, count: args.latency_count, size, window: 1 };
            let latency = timed_round(&mut conns, &ours, &one_at_a_time, epoch, what("latency")).await?;
            let (per_sender, window) = flood_shape(args, senders, size);
            let bounded = Flood { group: &group, senders, count: per_sender, size, window };
            let flood = timed_round(&mut conns, &ours, &bounded, epoch, what("throughput")).await?;
            let secs = flood.elapsed.as_secs_f64().max(1e-9);
            let row = MulticastRow {
                target: t.name,
                senders,
                receivers: args.receivers,
                size,
                latency_p50_us: latency.percentile(0.5) * 1e3,
                latency_p99_us: latency.percentile(0.99) * 1e3,
                latency_samples: latency.latencies.len(),
                flood_messages: flood.sent,
                messages_per_s: flood.sent as f64 / secs,
                mb_per_s: (flood.sent * size) as f64 / secs / 1e6,
            };
            if let Some(c) = floor {
                floor_rows.push(measure_floor(args, c, &row).await?);
            }
            rows.push(row);
        }
    }
    for c in &conns {
        let _ = c.tx.bye().await;
    }
    Ok((rows, floor_rows))
}

/// Messages per sender and window of a throughput round: `--count` in all,
/// at most [`FLOOD_BYTES`] of payload, at most [`WINDOW_BYTES`] in flight.
fn flood_shape(args: &GcsArgs, senders: usize, size: usize) -> (usize, usize) {
    let total = args.count.min(FLOOD_BYTES / size).max(senders);
    let window = ((WINDOW_BYTES / size).clamp(1, 2048) / senders).max(1);
    (total / senders, window)
}

/// The floor under the cluster at the point of `cluster` (its row): the same
/// latency and throughput rounds run by bare CPG processes, with the
/// cluster's values divided by the floor's.
async fn measure_floor(args: &GcsArgs, c: &Cluster, cluster: &MulticastRow) -> Result<FloorRow> {
    let (senders, size) = (cluster.senders, cluster.size);
    let latency = c.floor_round(args.receivers, senders, args.latency_count, size, 1, STEP_LIMIT).await?;
    let (per_sender, window) = flood_shape(args, senders, size);
    let flood = c.floor_round(args.receivers, senders, per_sender, size, window, STEP_LIMIT).await?;
    let secs = flood.elapsed.as_secs_f64().max(1e-9);
    let (p50, p99, msgs) = (latency.percentile(0.5) * 1e3, latency.percentile(0.99) * 1e3, flood.sent as f64 / secs);
    let div = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    Ok(FloorRow {
        senders,
        receivers: args.receivers,
        size,
        latency_p50_us: p50,
        latency_p99_us: p99,
        latency_samples: latency.latencies.len(),
        flood_messages: flood.sent,
        messages_per_s: msgs,
        mb_per_s: (flood.sent * size) as f64 / secs / 1e6,
        cluster_p50_ratio: div(cluster.latency_p50_us, p50),
        cluster_p99_ratio: div(cluster.latency_p99_us, p99),
        cluster_msgs_ratio: div(cluster.messages_per_s, msgs),
    })
}

/// A flood round that fails after [`STEP_LIMIT`] instead of hanging.
async fn timed_round(
    conns: &mut [Conn],
    ours: &Arc<HashSet<String>>,
    f: &Flood<'_>,
    epoch: Instant,
    what: String,
) -> Result<flood::Row> {
    tokio::time::timeout(STEP_LIMIT, flood::round(conns, ours, f, epoch))
        .await
        .map_err(|_| anyhow!("{what} took longer than {STEP_LIMIT:?}"))?
}

/// Receives on a lent receiver until `done` says so; returns it with the
/// time that happened.
async fn until(
    mut rx: ClientReceiver,
    done: impl Fn(&Event) -> bool + Send + 'static,
) -> Result<(ClientReceiver, Instant)> {
    loop {
        let ev = rx.recv().await.context("receiving")?;
        if let Event::Error { code, text } = &ev {
            bail!("error from the daemon ({code:?}): {text}");
        }
        if done(&ev) {
            return Ok((rx, Instant::now()));
        }
    }
}

/// Lends every receiver to a task waiting for `done`, and returns the
/// receivers and the latest time any of them got there.
async fn all_until(
    rxs: &mut [Option<ClientReceiver>],
    done: impl Fn(usize, &Event) -> bool + Send + Sync + Clone + 'static,
) -> Result<Instant> {
    let mut tasks = JoinSet::new();
    for (i, rx) in rxs.iter_mut().enumerate() {
        let rx = rx.take().expect("receiver");
        let done = done.clone();
        tasks.spawn(async move { (i, until(rx, move |ev| done(i, ev)).await) });
    }
    let wait = async {
        let mut last: Option<Instant> = None;
        while let Some(r) = tasks.join_next().await {
            let (i, r) = r.context("membership task")?;
            let (rx, at) = r?;
            rxs[i] = Some(rx);
            last = Some(last.map_or(at, |l| l.max(at)));
        }
        last.ok_or_else(|| anyhow!("no members"))
    };
    tokio::time::timeout(STEP_LIMIT, wait)
        .await
        .map_err(|_| anyhow!("a view change took longer than {STEP_LIMIT:?}"))?
}

fn view_of(group: &str, n: usize) -> impl Fn(usize, &Event) -> bool + Send + Sync + Clone + 'static {
    let group = group.to_string();
    move |_, ev| matches!(ev, Event::View { group: g, view } if g.as_str() == group && view.members.len() == n)
}

/// Join and leave latency in a group of `n` (after the join) on one target.
async fn measure_membership(t: &Target, prefix: &str, n: usize, reps: usize) -> Result<MembershipRow> {
    let group = format!("{prefix}-{}-g{n}", t.name);
    let (clients, _) = connect_all(t, &format!("{prefix}-{}-j{n}", t.name), n).await?;
    let mut txs = Vec::with_capacity(n);
    let mut rxs = Vec::with_capacity(n);
    for c in clients {
        let (tx, rx) = c.split();
        txs.push(tx);
        rxs.push(Some(rx));
    }
    let joiner = n - 1;
    for tx in &txs[..joiner] {
        tx.join(&group).await?;
    }
    all_until(&mut rxs[..joiner], view_of(&group, n - 1)).await?;
    let (mut joins, mut leaves) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for _ in 0..reps {
        let start = Instant::now();
        txs[joiner].join(&group).await?;
        joins.push(all_until(&mut rxs, view_of(&group, n)).await? - start);
        let start = Instant::now();
        txs[joiner].leave(&group).await?;
        let others = view_of(&group, n - 1);
        let left = group.clone();
        let done = move |i: usize, ev: &Event| match ev {
            Event::Left { group: g } if i == joiner => g.as_str() == left,
            _ => i != joiner && others(i, ev),
        };
        leaves.push(all_until(&mut rxs, done).await? - start);
    }
    for tx in &txs {
        let _ = tx.bye().await;
    }
    let us = |d: &Duration| d.as_secs_f64() * 1e6;
    let p50_max = |v: &mut Vec<Duration>| {
        v.sort_unstable();
        (us(&v[v.len() / 2]), us(v.last().expect("reps")))
    };
    let (join_p50_us, join_max_us) = p50_max(&mut joins);
    let (leave_p50_us, leave_max_us) = p50_max(&mut leaves);
    Ok(MembershipRow { target: t.name, group_size: n, reps, join_p50_us, join_max_us, leave_p50_us, leave_max_us })
}

/// `value / reference`, printed as "×1.23", or blank without a reference.
fn ratio(value: f64, reference: Option<f64>) -> String {
    match reference {
        Some(r) if r > 0.0 => format!("×{:.2}", value / r),
        _ => String::new(),
    }
}

/// Whether any target compares with another, so the tables need ratio columns.
fn compares(targets: &[Target]) -> Option<&'static str> {
    targets.iter().find_map(|t| t.compare_to)
}

fn print_multicast(args: &GcsArgs, targets: &[Target], rows: &[MulticastRow]) {
    println!(
        "agreed multicast, {} members receiving: latency with one message in flight per sender \
         ({} per sender), throughput of a flood of up to {} messages per size",
        args.receivers, args.latency_count, args.count
    );
    let reference = compares(targets);
    let mut header: Vec<String> =
        ["target", "senders", "size", "p50 µs", "p99 µs", "msg/s", "MB/s"].map(String::from).into();
    if let Some(r) = reference {
        header.extend([format!("p50 / {r}"), format!("msg/s / {r}")]);
    }
    let mut t = crate::table::new(header, 1);
    for row in rows {
        let mut cells = vec![
            row.target.to_string(),
            row.senders.to_string(),
            row.size.to_string(),
            format!("{:.1}", row.latency_p50_us),
            format!("{:.1}", row.latency_p99_us),
            format!("{:.0}", row.messages_per_s),
            format!("{:.2}", row.mb_per_s),
        ];
        if reference.is_some() {
            let compare_to = targets.iter().find(|t| t.name == row.target).and_then(|t| t.compare_to);
            let base =
                rows.iter().find(|b| Some(b.target) == compare_to && b.senders == row.senders && b.size == row.size);
            cells.push(ratio(row.latency_p50_us, base.map(|b| b.latency_p50_us)));
            cells.push(ratio(row.messages_per_s, base.map(|b| b.messages_per_s)));
        }
        t.add_row(cells);
    }
    println!("{t}");
}

fn print_floor(rows: &[FloorRow]) {
    println!(
        "floor under the cluster: Corosync CPG's own agreed delivery between bare CPG processes, one per node as \
         the daemons are, each running the senders of its node's clients; the same rounds as above (latency from \
         the multicast call to delivery, one message in flight per sender, measured on the nodes with clients; \
         throughput of the same flood until every node has it). ×: cluster value / floor value"
    );
    let header = [
        "target",
        "senders",
        "size",
        "p50 µs",
        "p99 µs",
        "msg/s",
        "MB/s",
        "cluster p50",
        "cluster p99",
        "cluster msg/s",
    ];
    let mut t = crate::table::new(header, 1);
    for r in rows {
        t.add_row(vec![
            "cpg".to_string(),
            r.senders.to_string(),
            r.size.to_string(),
            format!("{:.1}", r.latency_p50_us),
            format!("{:.1}", r.latency_p99_us),
            format!("{:.0}", r.messages_per_s),
            format!("{:.2}", r.mb_per_s),
            format!("×{:.2}", r.cluster_p50_ratio),
            format!("×{:.2}", r.cluster_p99_ratio),
            format!("×{:.2}", r.cluster_msgs_ratio),
        ]);
    }
    println!("{t}");
}

fn print_membership(targets: &[Target], rows: &[MembershipRow]) {
    println!(
        "join and leave: from the request until every member has the new view ({} repetitions)",
        rows.first().map_or(0, |r| r.reps)
    );
    let reference = compares(targets);
    let mut header: Vec<String> =
        ["target", "members", "join p50 µs", "join max µs", "leave p50 µs", "leave max µs"].map(String::from).into();
    if let Some(r) = reference {
        header.extend([format!("join / {r}"), format!("leave / {r}")]);
    }
    let mut t = crate::table::new(header, 1);
    for row in rows {
        let mut cells = vec![
            row.target.to_string(),
            row.group_size.to_string(),
            format!("{:.1}", row.join_p50_us),
            format!("{:.1}", row.join_max_us),
            format!("{:.1}", row.leave_p50_us),
            format!("{:.1}", row.leave_max_us),
        ];
        if reference.is_some() {
            let compare_to = targets.iter().find(|t| t.name == row.target).and_then(|t| t.compare_to);
            let base = rows.iter().find(|b| Some(b.target) == compare_to && b.group_size == row.group_size);
            cells.push(ratio(row.join_p50_us, base.map(|b| b.join_p50_us)));
            cells.push(ratio(row.leave_p50_us, base.map(|b| b.leave_p50_us)));
        }
        t.add_row(cells);
    }
    println!("{t}");
}
