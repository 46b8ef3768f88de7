//! `conclave bench soak`: many well-behaved clients with churn and traffic
//! against one daemon for a long time, while an attacker runs each resource
//! attack in turn.
//!
//! The daemon is a child process (`conclave daemon`, the same binary), so
//! that its resident memory and descriptors can be read from
//! `/proc/PID/status` and `/proc/PID/fd`. It listens on a Unix socket, on
//! plain TCP and on TLS, all on loopback, and certifies names: TLS clients
//! must show a certificate of a throwaway authority made at start, and local
//! clients without one may take only the names `soak-a-*` ([unix_names]).
//!
//! **Well-behaved clients** (`soak-c-N`) connect over TLS, each with its own
//! certificate, and are members of `--groups-per-client` of the `--groups`
//! groups. Each sends sequence-numbered, timestamped agreed multicasts to its
//! groups (`--rate` per second, Poisson), and leaves one of its groups and
//! rejoins it a moment later (`--churn` per minute, Poisson).
//!
//! **What a member is owed.** The daemon's semantics (crates/gcs, *Virtual
//! synchrony*): a multicast is ordered at one point of the group's stream and
//! delivered to every member of the view current at that point, tagged with
//! that view's id; a view change is a point in the stream, so a member is owed
//! exactly the messages tagged with the views it installed, each once, and
//! nothing ordered before its join or after its leave. The sender is a member
//! of that view too and gets its own message back, which tells it the view.
//! So: every sender counts its own messages per (group, view) as they come
//! back; every member records the members of each view it installs; every
//! receiver counts what it gets per (group, view), refusing (as "duplicated")
//! a message tagged with a view other than the one it is in, and a second
//! delivery of a sender's sequence number. A message of (group, view) is owed
//! once to each well-behaved member of that view: lost = owed − received,
//! per (group, view), plus the messages a sender never got back. At the end
//! every client leaves its groups and waits for each Left, which comes after
//! everything it is owed (its queue is FIFO).
//!
//! **The attacker** runs one attack per slice of the duration (after a first
//! slice without attack), in cycles, each checked against what the daemon
//! must do:
//! * `tls-handshake-flood`: more idle TCP connections to the TLS port than the
//!   daemon's handshake cap (from 127.0.0.2 onwards, 50 per address), never a
//!   ClientHello; a new certified client must still connect within 2 s, and
//!   every idle socket must be closed by the daemon (evicted, or timed out).
//! * `never-reads`: a client that joins a group of its own and never reads
//!   while another floods that group with 64 KiB messages; it must be cut off
//!   (QueueOverflow) within a few times its byte budget.
//! * `connection-exhaustion`: local connections that say Hello until the
//!   per-user cap refuses one (TooManyConnections, in words), then TCP
//!   connections without Hello until the global cap refuses one; a new
//!   certified client is then refused in words, and served again once the
//!   attacker lets go.
//! * `incomplete-frame`: local clients that say Hello, then send the first
//!   KiB of a 1 MiB frame and nothing more; each must be timed out (Timeout).
//! * `name-squatting`: local and plain-TCP clients that say Hello as a
//!   certified member's name; each must be refused (IdentityMismatch).
//!
//! Phases are the slices of the duration; a message belongs to the phase in
//! which it was sent. Latency is from send to delivery at every receiver
//! (one process, one clock). The daemon's resident memory and descriptors
//! are sampled every 250 ms.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, BytesMut};
use clap::Args;
use conclave_gcs::core::ErrorCode;
use conclave_gcs::wire::{self, FrameReader, Request};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_gcs_net::{Client, ClientError, ClientReceiver, ClientSender, Event, Identity, Service, TlsClientOptions};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Bytes at the start of every payload: send time, sender, sequence number, phase.
const HEADER: usize = 17;

/// Messages a client may have sent and not yet got back.
const WINDOW: u32 = 64;

/// Longest one connect, Hello or request may take.
const STEP: Duration = Duration::from_secs(20);

/// Longest the final drain (every client leaves its groups) may take.
const DRAIN: Duration = Duration::from_secs(120);

/// The daemon's limits for the soak: a small byte budget and frame timeout so
/// that the attacks they stop fit in a slice.
const QUEUE_BYTES: usize = 8 << 20;
const FRAME_TIMEOUT_SECS: u64 = 2;
/// The daemon's default handshake cap and timeout (not changed here).
const MAX_HANDSHAKES: usize = 1024;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);

/// The phases: a first slice without attack, then each attack.
const PHASES: [&str; 6] =
    ["no-attack", "tls-handshake-flood", "never-reads", "connection-exhaustion", "incomplete-frame", "name-squatting"];

/// Options of `conclave bench soak`.
#[derive(Args, Debug)]
#[command(after_help = "The daemon is a child process of this binary (`conclave daemon`) on loopback only: a Unix \
socket, plain TCP and TLS on 127.0.0.1, certifying names. Well-behaved clients connect over TLS, each with a \
certificate of a throwaway authority made at start (no CRL), and churn by leaving and rejoining their groups on \
one connection. The daemon's per-peer cap is raised to --clients + 64 (on loopback every TLS client comes from \
127.0.0.1), its global cap to twice that, its per-client byte budget is 8 MiB and its frame timeout 2 s (so the \
never-reads and incomplete-frame attacks fit in a slice); the rest are its defaults.

A member is owed every message delivered in a view it is in (the daemon tags each message with the view it was \
ordered in; a view change is a point in the stream), once, and nothing ordered before its join or after its leave. \
delivered: owed messages received; lost: owed and never received (or never ordered: its sender never got it \
back); duplicated: a second delivery of a sequence number, or a delivery in a view the receiver was not in. \
Latency is from send to delivery at every receiver. Daemon RSS and descriptors are peaks of samples every 250 ms \
(the total's RSS is the kernel's high-water mark, VmHWM). Attacker: connections made, and how many the daemon \
refused or disconnected as it must, of how many it should have; a phase's attack passes if every cycle did.

Exits non-zero if a well-behaved message was lost or duplicated, a well-behaved client was disconnected, or an \
attack did not get the answer it must. Raises its own descriptor limit (ulimit -n) to the hard limit, and stops \
with an error if that is too low for the run. Ctrl-C stops the daemon and removes the temporary directory.")]
pub struct SoakArgs {
    /// Well-behaved clients.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Groups the clients are spread over.
    #[arg(long, default_value_t = 200)]
    groups: usize,
    /// Groups each client is a member of (when not churning).
    #[arg(long, default_value_t = 2, value_name = "N")]
    groups_per_client: usize,
    /// How long: traffic, churn and the attacks, e.g. 10m, 90s, 1h (at most 24h).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// Messages each client sends per second (to one of its groups at random).
    #[arg(long, default_value_t = 1.0, value_name = "PER_S")]
    rate: f64,
    /// Times each client leaves one of its groups per minute (it rejoins 0.2-2 s later).
    #[arg(long, default_value_t = 2.0, value_name = "PER_MIN")]
    churn: f64,
    /// Payload size in bytes (at least 17).
    #[arg(long, default_value_t = 100, value_name = "BYTES")]
    size: usize,
    /// Seed of the clients' timing and choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the result as one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// `10m`, `90s`, `1h`, `500ms` or a number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let n: f64 = num.parse().map_err(|_| format!("{s:?} is not a duration (e.g. 10m, 90s, 1h)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {s:?}: use ms, s, m or h")),
    };
    if !(secs > 0.0 && secs <= 86_400.0) {
        return Err(format!("{s:?} is out of range: more than 0, at most 24h"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs the soak.
pub fn run(args: SoakArgs) -> Result<()> {
    if args.clients < 2 || args.groups == 0 || args.groups_per_client == 0 {
        bail!("--clients must be at least 2, --groups and --groups-per-client at least 1");
    }
    if args.groups_per_client > args.groups {
        bail!("--groups-per-client ({}) is more than --groups ({})", args.groups_per_client, args.groups);
    }
    if args.size < HEADER || args.size > 65536 {
        bail!("--size must be from {HEADER} to 65536 bytes");
    }
    if !(args.rate > 0.0 && args.rate <= 1000.0 && (0.0..=600.0).contains(&args.churn)) {
        bail!("--rate must be more than 0 and at most 1000, --churn from 0 to 600");
    }
    crate::block_on(soak(args))
}

/// What one phase measured.
#[derive(Default, Clone)]
struct PhaseStats {
    sent: u64,
    delivered: u64,
    duplicated: u64,
    lost: u64,
    latencies_us: Vec<u32>,
    peak_rss_kib: u64,
    peak_fds: u64,
    attack: AttackStats,
}

/// What the attacker did in one phase.
#[derive(Default, Clone, Serialize)]
struct AttackStats {
    cycles: u64,
    connections: u64,
    answered: u64,
    should_answer: u64,
    failures: Vec<String>,
}

impl AttackStats {
    fn add(&mut self, c: Cycle) {
        self.cycles += 1;
        self.connections += c.connections;
        self.answered += c.answered;
        self.should_answer += c.should_answer;
        if let Some(f) = c.failure {
            if self.failures.len() < 5 {
                self.failures.push(f);
            }
        }
    }
}

/// One attack cycle: connections made, how many the daemon refused or cut
/// off as it must, of how many it should have, and what went wrong.
#[derive(Default)]
struct Cycle {
    connections: u64,
    answered: u64,
    should_answer: u64,
    failure: Option<String>,
}

/// The certificates of a run.
struct Pki {
    ca: CertificateDer<'static>,
    ca_cert: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    fn new() -> Result<Self> {
        let ca_key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(rcgen::DnType::CommonName, "conclave soak authority");
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key)?;
        Ok(Self { ca: ca_cert.der().clone(), ca_cert, ca_key })
    }

    /// A certificate for `cn` (with `sans`), and its key.
    fn issue(&self, cn: &str, sans: &[&str]) -> Result<(rcgen::Certificate, rcgen::KeyPair)> {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519)?;
        let mut params = rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let cert = params.signed_by(&key, &self.ca_cert, &self.ca_key)?;
        Ok((cert, key))
    }

    /// Client options showing a certificate for `name`.
    fn client(&self, name: &str) -> Result<TlsClientOptions> {
        let (cert, key) = self.issue(name, &[])?;
        let identity = Identity {
            cert_chain: vec![cert.der().clone()],
            key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        };
        Ok(TlsClientOptions::new(std::slice::from_ref(&self.ca), Some(identity))?)
    }
}

/// The daemon under test: a child process, stopped (SIGTERM, then SIGKILL)
/// when dropped or by [`DaemonChild::stop`].
struct DaemonChild {
    pid: u32,
    unix: PathBuf,
    tcp: SocketAddr,
    tls: SocketAddr,
    log: PathBuf,
    per_peer: usize,
    max_connections: usize,
}

impl DaemonChild {
    async fn start(dir: &Path, pki: &Pki, clients: usize) -> Result<(Self, DaemonProcess)> {
        let (cert, key) = pki.issue("conclave soak daemon", &["localhost", "127.0.0.1"])?;
        std::fs::write(dir.join("ca.crt"), pki.ca_cert.pem())?;
        std::fs::write(dir.join("daemon.crt"), cert.pem())?;
        std::fs::write(dir.join("daemon.key"), key.serialize_pem())?;
        let unix = dir.join("conclave.sock");
        let per_peer = clients + 64;
        let max_connections = 2 * per_peer;
        use std::os::unix::fs::MetadataExt;
        let uid = std::fs::metadata("/proc/self")?.uid();
        let config = format!(
            "[listen]\nunix = {unix:?}\ntcp = \"127.0.0.1:0\"\n\n[limits]\nqueue_bytes = {QUEUE_BYTES}\n\
             frame_timeout_secs = {FRAME_TIMEOUT_SECS}\nmax_connections = {max_connections}\n\
             max_connections_per_peer = {per_peer}\n\n[tls]\nlisten = \"127.0.0.1:0\"\ncert = {:?}\nkey = {:?}\n\
             client_ca = {:?}\nno_crl = true\n\n[unix_names]\n{uid} = [\"soak-a-*\"]\n",
            dir.join("daemon.crt"),
            dir.join("daemon.key"),
            dir.join("ca.crt"),
        );
        let config_path = dir.join("conclave.toml");
        std::fs::write(&config_path, config)?;
        let log = dir.join("daemon.log");
        let exe = std::env::current_exe().context("cannot find this program to start the daemon")?;
        let child = tokio::process::Command::new(exe)
            .arg("daemon")
            .arg("--config")
            .arg(&config_path)
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the daemon")?;
        let pid = child.id().ok_or_else(|| anyhow!("the daemon exited at once"))?;
        let mut child = DaemonProcess(child);
        let mut d = DaemonChild {
            pid,
            unix,
            tcp: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
            per_peer,
            max_connections,
        };
        let started = Instant::now();
        loop {
            let text = std::fs::read_to_string(&d.log).unwrap_or_default();
            let addr = |what: &str| {
                text.split(what).nth(1).and_then(|s| s.split_whitespace().next()).and_then(|a| a.parse().ok())
            };
            if let (Some(tcp), Some(tls)) = (addr("listening on tcp "), addr("listening on tls ")) {
                d.tcp = tcp;
                d.tls = tls;
                break;
            }
            if let Some(status) = child.0.try_wait()? {
                bail!("the daemon exited ({status}):\n{}", d.log_tail());
            }
            if started.elapsed() > STEP {
                bail!("the daemon did not start within {STEP:?}:\n{}", d.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !d.tcp.ip().is_loopback() || !d.tls.ip().is_loopback() {
            bail!("the daemon listens off loopback ({}, {})", d.tcp, d.tls);
        }
        Ok((d, child))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Resident memory (KiB), its high-water mark (KiB) and open descriptors.
    fn sample(&self) -> Option<(u64, u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        };
        let fds = std::fs::read_dir(format!("/proc/{}/fd", self.pid)).ok()?.count() as u64;
        Some((field("VmRSS:")?, field("VmHWM:")?, fds))
    }
}

/// The daemon's process, killed if dropped without [`DaemonProcess::stop`].
struct DaemonProcess(tokio::process::Child);

impl DaemonProcess {
    /// Stops the daemon: SIGTERM, up to 10 s to exit, then SIGKILL.
    async fn stop(mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.0.try_wait() {
            return Some(status);
        }
        if let Some(pid) = self.0.id() {
            // Our own child, not yet reaped (try_wait said it runs): the pid is still its.
            let _ = std::process::Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
        }
        match tokio::time::timeout(Duration::from_secs(10), self.0.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                let _ = self.0.kill().await;
                None
            }
        }
    }
}

/// Aborts a task when dropped (the run's helpers end with it, however it ends).
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// State shared by the run's tasks.
struct Shared {
    epoch: Instant,
    phase: AtomicUsize,
    phases: Mutex<Vec<PhaseStats>>,
    delivered: AtomicU64,
    /// Unique suffixes for the attacker's names.
    next_name: AtomicU64,
}

impl Shared {
    fn phase(&self) -> usize {
        self.phase.load(Ordering::Relaxed)
    }
}

async fn soak(args: SoakArgs) -> Result<()> {
    // Both ends of every connection count here: the clients, and at most the
    // flood or the exhaustion attack at a time (its per-peer cap).
    let needed = (args.clients + MAX_HANDSHAKES.max(args.clients + 64) + 64 + 256) as u64;
    let limit = conclave_gcs_net::daemon::raise_descriptor_limit();
    if limit.is_some_and(|l| l < needed) {
        bail!(
            "this run needs about {needed} open descriptors, but the descriptor limit (ulimit -n) is {} and cannot \
             be raised further (its hard limit); raise the hard limit, or run fewer --clients",
            limit.unwrap_or_default()
        );
    }
    let dir = tempfile::Builder::new().prefix("conclave-soak-").tempdir()?;
    let pki = Pki::new()?;
    let (daemon, process) = DaemonChild::start(dir.path(), &pki, args.clients).await?;
    let daemon = Arc::new(daemon);
    let outcome = tokio::select! {
        r = run_soak(&args, &pki, daemon.clone()) => r,
        _ = interrupted() => Err(anyhow!("interrupted: the daemon is stopped and the temporary directory removed")),
    };
    let tail = daemon.log_tail();
    let status = process.stop().await;
    drop(dir);
    let report = outcome?;
    print_report(&report, &args);
    let mut problems = Vec::new();
    let total = &report.total;
    if total.lost > 0 || total.duplicated > 0 {
        problems.push(format!("{} well-behaved messages lost, {} duplicated", total.lost, total.duplicated));
    }
    if !report.client_errors.is_empty() {
        problems.push(format!(
            "{} well-behaved client(s) had errors, e.g. {}",
            report.client_errors.len(),
            report.client_errors[0]
        ));
    }
    for (name, p) in PHASES.iter().zip(&report.phases).skip(1) {
        if !p.attack.failures.is_empty() || p.attack.cycles == 0 {
            problems
                .push(format!("attack {name}: {}", p.attack.failures.first().map_or("no cycle ran", String::as_str)));
        }
    }
    if status.is_none_or(|s| !s.success()) {
        problems.push(format!("the daemon did not stop cleanly ({status:?}); its log ends:\n{tail}"));
    }
    if !problems.is_empty() {
        bail!("the soak failed: {}", problems.join("; "));
    }
    Ok(())
}

/// Ctrl-C or SIGTERM.
async fn interrupted() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The result of a run.
struct Report {
    phases: Vec<PhaseStats>,
    total: PhaseStats,
    peak_rss_hwm_kib: u64,
    client_errors: Vec<String>,
    elapsed: Duration,
}

async fn run_soak(args: &SoakArgs, pki: &Pki, daemon: Arc<DaemonChild>) -> Result<Report> {
    let shared = Arc::new(Shared {
        epoch: Instant::now(),
        phase: AtomicUsize::new(0),
        phases: Mutex::new(vec![PhaseStats::default(); PHASES.len()]),
        delivered: AtomicU64::new(0),
        next_name: AtomicU64::new(0),
    });
    let bar = progress_bar(args.duration);
    bar.set_message(format!("connecting {} clients", args.clients));

    // The memory and descriptor sampler, for the whole run.
    let (stop_sampling, mut sampling) = watch::channel(false);
    let mut sampler = {
        let (shared, daemon) = (shared.clone(), daemon.clone());
        AbortOnDrop(tokio::spawn(async move {
            let mut hwm = 0;
            loop {
                if let Some((rss, peak, fds)) = daemon.sample() {
                    hwm = hwm.max(peak);
                    let mut phases = shared.phases.lock().expect("phases");
                    let p = &mut phases[shared.phase()];
                    p.peak_rss_kib = p.peak_rss_kib.max(rss);
                    p.peak_fds = p.peak_fds.max(fds);
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(250)) => {}
                    _ = sampling.changed() => return hwm,
                }
            }
        }))
    };

    // Connect the well-behaved clients, 16 at a time.
    let mut conns: Vec<Option<(ClientSender, ClientReceiver)>> = (0..args.clients).map(|_| None).collect();
    let mut connecting = JoinSet::new();
    for i in 0..args.clients {
        if connecting.len() >= 16 {
            let (i, c) = connecting.join_next().await.expect("a connect")??;
            conns[i] = Some(c);
        }
        let options = pki.client(&client_name(i))?;
        let addr = daemon.tls;
        connecting.spawn(async move {
            let name = client_name(i);
            let c = tokio::time::timeout(STEP, Client::connect_tls(addr, "localhost", &options, &name))
                .await
                .map_err(|_| anyhow!("connecting {name} timed out"))?
                .with_context(|| format!("cannot connect {name} over TLS"))?;
            anyhow::Ok((i, c.split()))
        });
    }
    while let Some(r) = connecting.join_next().await {
        let (i, c) = r??;
        conns[i] = Some(c);
    }

    // Traffic and churn until the attacker is done and the duration over.
    let start = Instant::now();
    let (stop, stopped) = watch::channel(false);
    let mut clients = JoinSet::new();
    for (i, c) in conns.into_iter().enumerate() {
        let (tx, rx) = c.expect("connected");
        let groups: Vec<usize> = (0..args.groups_per_client)
            .map(|k| (i + k * args.groups.div_ceil(args.groups_per_client)) % args.groups)
            .collect();
        let mut groups = groups;
        groups.sort_unstable();
        groups.dedup();
        let plan = ClientPlan {
            me: i as u32,
            groups,
            rate: args.rate,
            churn: args.churn / 60.0,
            size: args.size,
            seed: args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64,
        };
        clients.spawn(client(plan, tx, rx, shared.clone(), stopped.clone()));
    }
    let slice = args.duration / PHASES.len() as u32;
    let attacker = tokio::spawn(attacker(start, slice, daemon.clone(), Arc::new(pki_probes(pki, 64)?), shared.clone()));
    let mut attacker = Some(AbortOnDrop(attacker));
    let mut ticks = tokio::time::interval(Duration::from_millis(500));
    let deadline = start + args.duration;
    loop {
        ticks.tick().await;
        let phase = shared.phase();
        bar.set_position(start.elapsed().as_secs().min(args.duration.as_secs()));
        bar.set_message(format!("{} · {} delivered", PHASES[phase], shared.delivered.load(Ordering::Relaxed)));
        if let Some(a) = attacker.as_mut().filter(|a| a.0.is_finished()) {
            (&mut a.0).await.context("attacker task")??;
            attacker = None;
        }
        if attacker.is_none() && Instant::now() >= deadline {
            break;
        }
    }
    bar.set_message("draining: every client leaves its groups");
    let _ = stop.send(true);
    let mut outs = Vec::with_capacity(args.clients);
    let drained = tokio::time::timeout(DRAIN + Duration::from_secs(10), async {
        while let Some(r) = clients.join_next().await {
            outs.push(r.context("client task")?);
        }
        anyhow::Ok(())
    })
    .await;
    let elapsed = start.elapsed();
    bar.finish_and_clear();
    let _ = stop_sampling.send(true);
    let hwm = (&mut sampler.0).await.unwrap_or(0);
    drained.map_err(|_| anyhow!("the clients did not finish draining within {DRAIN:?}"))??;
    Ok(account(outs, &shared, hwm, elapsed))
}

fn client_name(i: usize) -> String {
    format!("soak-c-{i}")
}

/// Certified probe clients (well-behaved newcomers the attacks check are
/// still served), used round-robin.
struct Probes {
    options: Vec<(String, TlsClientOptions)>,
    next: AtomicUsize,
}

fn pki_probes(pki: &Pki, n: usize) -> Result<Probes> {
    let options =
        (0..n).map(|i| Ok((format!("soak-p-{i}"), pki.client(&format!("soak-p-{i}"))?))).collect::<Result<_>>()?;
    Ok(Probes { options, next: AtomicUsize::new(0) })
}

impl Probes {
    /// Connects the next probe over TLS.
    async fn connect(&self, addr: SocketAddr) -> Result<Client, ClientError> {
        let (name, options) = &self.options[self.next.fetch_add(1, Ordering::Relaxed) % self.options.len()];
        match tokio::time::timeout(STEP, Client::connect_tls(addr, "localhost", options, name)).await {
            Ok(r) => r,
            Err(_) => Err(ClientError::Closed),
        }
    }
}

fn progress_bar(duration: Duration) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(duration.as_secs().max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:48} {wide_bar} {pos}/{len} s").expect("static template"),
    );
    bar
}

// ---------------------------------------------------------------------------
// Well-behaved clients.

/// What a well-behaved client does.
struct ClientPlan {
    me: u32,
    groups: Vec<usize>,
    rate: f64,
    /// Leaves per second.
    churn: f64,
    size: usize,
    seed: u64,
}

/// Where a client stands in one of its groups.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Intent {
    /// Join sent, its view not yet here.
    Joining,
    /// A member.
    In,
    /// Leave sent, Left not yet here.
    Leaving,
    /// Not a member; rejoins at this time (or never, when draining).
    Out(Option<Instant>),
}

struct Slot {
    group: usize,
    name: GroupName,
    intent: Intent,
    /// The view of the group this client is in, from its View to its Left.
    view: Option<ViewId>,
    seq: u32,
}

/// Per phase, what one client received and sent.
#[derive(Default, Clone)]
struct ClientPhase {
    sent: u64,
    delivered: u64,
    duplicated: u64,
    latencies_us: Vec<u32>,
}

/// What a client hands back.
struct ClientOut {
    phases: Vec<ClientPhase>,
    /// Its own messages that came back, per (group, view, phase).
    own: HashMap<(usize, ViewId, u8), u64>,
    /// Its own messages per phase that never came back.
    unconfirmed: Vec<u64>,
    /// Messages received per (group, view, phase).
    received: HashMap<(usize, ViewId, u8), u64>,
    /// Well-behaved members of each view it installed.
    views: HashMap<(usize, ViewId), u32>,
    error: Option<String>,
}

fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// An exponential delay of mean 1/`rate` seconds (at most an hour).
fn poisson(rng: &mut ChaCha8Rng, rate: f64) -> Duration {
    if rate <= 0.0 {
        return Duration::from_secs(3600);
    }
    Duration::from_secs_f64((-(1.0 - uniform(rng)).ln() / rate).min(3600.0))
}

fn group_name(g: usize) -> String {
    format!("soak-g-{g}")
}

async fn client(
    plan: ClientPlan,
    tx: ClientSender,
    mut rx: ClientReceiver,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<bool>,
) -> ClientOut {
    let mut out = ClientOut {
        phases: vec![ClientPhase::default(); PHASES.len()],
        own: HashMap::new(),
        unconfirmed: vec![0; PHASES.len()],
        received: HashMap::new(),
        views: HashMap::new(),
        error: None,
    };
    let r = client_loop(&plan, &tx, &mut rx, &shared, &mut stop, &mut out).await;
    if let Err(e) = r {
        out.error = Some(format!("{}: {e:#}", client_name(plan.me as usize)));
    }
    let _ = tx.bye().await;
    out
}

async fn client_loop(
    plan: &ClientPlan,
    tx: &ClientSender,
    rx: &mut ClientReceiver,
    shared: &Shared,
    stop: &mut watch::Receiver<bool>,
    out: &mut ClientOut,
) -> Result<()> {
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
    let mut slots: Vec<Slot> = plan
        .groups
        .iter()
        .map(|&g| {
            Ok(Slot { group: g, name: GroupName::new(group_name(g))?, intent: Intent::Joining, view: None, seq: 0 })
        })
        .collect::<Result<_>>()?;
    let by_name: HashMap<GroupName, usize> = slots.iter().enumerate().map(|(k, s)| (s.name.clone(), k)).collect();
    for s in &slots {
        step(tx.join(s.name.as_str())).await?;
    }
    // Outstanding own messages: (group slot, seq) -> phase, in send order per slot.
    let mut outstanding: HashMap<(usize, u32), u8> = HashMap::new();
    let mut last_seq: HashMap<(u32, usize), u32> = HashMap::new();
    let now = Instant::now();
    let mut next_send = now + poisson(&mut rng, plan.rate);
    let mut next_churn = now + poisson(&mut rng, plan.churn);
    let mut draining: Option<Instant> = None;
    loop {
        if let Some(since) = draining {
            if slots.iter().all(|s| matches!(s.intent, Intent::Out(None))) {
                break;
            }
            if since.elapsed() > DRAIN {
                bail!("still waiting for Left after {DRAIN:?}");
            }
        }
        let rejoin =
            slots.iter().filter_map(|s| if let Intent::Out(Some(t)) = s.intent { Some(t) } else { None }).min();
        let wake = match draining {
            Some(since) => since + DRAIN,
            None => [Some(next_send), Some(next_churn), rejoin].into_iter().flatten().min().expect("a time"),
        };
        tokio::select! {
            ev = rx.recv() => {
                let ev = ev.context("receiving")?;
                handle(ev, plan, &by_name, &mut slots, &mut outstanding, &mut last_seq, shared, out, draining.is_some())?;
            }
            _ = stop.changed(), if draining.is_none() => {
                draining = Some(Instant::now());
                for s in &mut slots {
                    match s.intent {
                        Intent::Joining | Intent::In => {
                            step(tx.leave(s.name.as_str())).await?;
                            s.intent = Intent::Leaving;
                        }
                        Intent::Out(_) => s.intent = Intent::Out(None),
                        Intent::Leaving => {}
                    }
                }
            }
            _ = tokio::time::sleep_until(wake.into()), if draining.is_none() => {
                let now = Instant::now();
                for s in &mut slots {
                    if matches!(s.intent, Intent::Out(Some(t)) if t <= now) {
                        step(tx.join(s.name.as_str())).await?;
                        s.intent = Intent::Joining;
                    }
                }
                if next_churn <= now {
                    next_churn = now + poisson(&mut rng, plan.churn);
                    let members: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].intent == Intent::In).collect();
                    if !members.is_empty() {
                        let k = members[(rng.next_u64() % members.len() as u64) as usize];
                        step(tx.leave(slots[k].name.as_str())).await?;
                        slots[k].intent = Intent::Leaving;
                    }
                }
                if next_send <= now {
                    next_send = now + poisson(&mut rng, plan.rate);
                    let members: Vec<usize> = (0..slots.len()).filter(|&k| slots[k].intent == Intent::In).collect();
                    if !members.is_empty() && outstanding.len() < WINDOW as usize {
                        let k = members[(rng.next_u64() % members.len() as u64) as usize];
                        let phase = shared.phase() as u8;
                        let seq = slots[k].seq;
                        slots[k].seq += 1;
                        let mut p = BytesMut::with_capacity(plan.size);
                        p.put_u64(shared.epoch.elapsed().as_nanos() as u64);
                        p.put_u32(plan.me);
                        p.put_u32(seq);
                        p.put_u8(phase);
                        p.resize(plan.size, 0);
                        step(tx.multicast(slots[k].name.as_str(), Service::Agreed, p.freeze())).await?;
                        outstanding.insert((k, seq), phase);
                        out.phases[phase as usize].sent += 1;
                    }
                }
            }
        }
    }
    for phase in outstanding.into_values() {
        out.unconfirmed[phase as usize] += 1;
    }
    Ok(())
}

/// A request within [`STEP`].
async fn step(f: impl std::future::Future<Output = Result<(), ClientError>>) -> Result<()> {
    tokio::time::timeout(STEP, f).await.map_err(|_| anyhow!("a request took longer than {STEP:?}"))??;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn handle(
    ev: Event,
    plan: &ClientPlan,
    by_name: &HashMap<GroupName, usize>,
    slots: &mut [Slot],
    outstanding: &mut HashMap<(usize, u32), u8>,
    last_seq: &mut HashMap<(u32, usize), u32>,
    shared: &Shared,
    out: &mut ClientOut,
    draining: bool,
) -> Result<()> {
    let me = client_name(plan.me as usize);
    match ev {
        Event::View { group, view } => {
            let Some(&k) = by_name.get(&group) else { bail!("a view of {group}, which it never joined") };
            if !view.ids().any(|m| m.as_str() == me) {
                bail!("a view of {group} without itself");
            }
            let wb = view.ids().filter(|m| m.as_str().starts_with("soak-c-")).count() as u32;
            out.views.insert((slots[k].group, view.id), wb);
            slots[k].view = Some(view.id);
            if slots[k].intent == Intent::Joining {
                slots[k].intent = Intent::In;
            }
        }
        Event::Left { group } => {
            let Some(&k) = by_name.get(&group) else { bail!("Left of {group}, which it never joined") };
            if slots[k].intent != Intent::Leaving {
                bail!("Left of {group} without leaving it");
            }
            slots[k].view = None;
            slots[k].intent = if draining {
                Intent::Out(None)
            } else {
                let pause = 0.2 + 1.8 * (plan.seed.wrapping_add(slots[k].seq as u64) % 1000) as f64 / 1000.0;
                Intent::Out(Some(Instant::now() + Duration::from_secs_f64(pause)))
            };
        }
        Event::Message { group, view, mut payload, .. } => {
            let Some(&k) = by_name.get(&group) else { bail!("a message of {group}, which it never joined") };
            if payload.len() < HEADER {
                bail!("a message of {} bytes in {group}", payload.len());
            }
            let sent = payload.get_u64();
            let sender = payload.get_u32();
            let seq = payload.get_u32();
            let phase = (payload.get_u8() as usize).min(PHASES.len() - 1);
            let p = &mut out.phases[phase];
            let fresh = last_seq.get(&(sender, k)).is_none_or(|&last| seq > last);
            if slots[k].view != Some(view) || !fresh {
                p.duplicated += 1;
                return Ok(());
            }
            last_seq.insert((sender, k), seq);
            p.delivered += 1;
            shared.delivered.fetch_add(1, Ordering::Relaxed);
            let latency = (shared.epoch.elapsed().as_nanos() as u64).saturating_sub(sent) / 1000;
            p.latencies_us.push(latency.min(u32::MAX as u64) as u32);
            *out.received.entry((slots[k].group, view, phase as u8)).or_default() += 1;
            if sender == plan.me {
                outstanding.remove(&(k, seq));
                *out.own.entry((slots[k].group, view, phase as u8)).or_default() += 1;
            }
        }
        Event::Error { code, text } => bail!("error from the daemon ({code:?}): {text}"),
        _ => {}
    }
    Ok(())
}

/// Adds up what the clients got against what they were owed.
fn account(outs: Vec<ClientOut>, shared: &Shared, hwm: u64, elapsed: Duration) -> Report {
    let mut phases = shared.phases.lock().expect("phases").clone();
    let mut views: HashMap<(usize, ViewId), u32> = HashMap::new();
    let mut own: HashMap<(usize, ViewId, u8), u64> = HashMap::new();
    let mut received: HashMap<(usize, ViewId, u8), u64> = HashMap::new();
    let mut client_errors = Vec::new();
    let mut view_disagreements = 0u64;
    for o in outs {
        for (k, wb) in o.views {
            if *views.entry(k).or_insert(wb) != wb {
                view_disagreements += 1;
            }
        }
        for (k, n) in o.own {
            *own.entry(k).or_default() += n;
        }
        for (k, n) in o.received {
            *received.entry(k).or_default() += n;
        }
        for (p, c) in o.phases.into_iter().enumerate() {
            phases[p].sent += c.sent;
            phases[p].delivered += c.delivered;
            phases[p].duplicated += c.duplicated;
            phases[p].latencies_us.extend(c.latencies_us);
        }
        for (p, n) in o.unconfirmed.into_iter().enumerate() {
            phases[p].lost += n;
        }
        client_errors.extend(o.error);
    }
    if view_disagreements > 0 {
        client_errors.push(format!("{view_disagreements} view(s) seen with different members by different members"));
    }
    // Owed: each message that came back to its sender in (group, view), once
    // to each well-behaved member of that view.
    for ((g, v, p), n) in &own {
        let members = views.get(&(*g, *v)).copied().unwrap_or(0) as u64;
        let owed = n * members;
        let got = received.remove(&(*g, *v, *p)).unwrap_or(0);
        let phase = &mut phases[*p as usize];
        phase.lost += owed.saturating_sub(got);
        phase.duplicated += got.saturating_sub(owed);
    }
    // Received in a view where no message came back to its sender: owed to no one.
    for ((_, _, p), n) in received {
        phases[p as usize].duplicated += n;
    }
    let mut total = PhaseStats::default();
    for p in &mut phases {
        p.latencies_us.sort_unstable();
        total.sent += p.sent;
        total.delivered += p.delivered;
        total.duplicated += p.duplicated;
        total.lost += p.lost;
        total.latencies_us.extend_from_slice(&p.latencies_us);
        total.peak_rss_kib = total.peak_rss_kib.max(p.peak_rss_kib);
        total.peak_fds = total.peak_fds.max(p.peak_fds);
        total.attack.cycles += p.attack.cycles;
        total.attack.connections += p.attack.connections;
        total.attack.answered += p.attack.answered;
        total.attack.should_answer += p.attack.should_answer;
    }
    // The delivered count is what was received fresh in the receiver's view; lost and
    // duplicated come from the accounting above, so delivered excludes nothing owed twice.
    total.latencies_us.sort_unstable();
    total.peak_rss_kib = total.peak_rss_kib.max(hwm);
    Report { phases, total, peak_rss_hwm_kib: hwm, client_errors, elapsed }
}

fn percentile(sorted: &[u32], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[i] as f64 / 1000.0)
}

#[derive(Serialize)]
struct JsonRow<'a> {
    phase: &'a str,
    sent: u64,
    delivered: u64,
    lost: u64,
    duplicated: u64,
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    daemon_peak_rss_mib: Option<f64>,
    daemon_peak_fds: Option<u64>,
    attack: &'a AttackStats,
}

fn row<'a>(phase: &'a str, p: &'a PhaseStats) -> JsonRow<'a> {
    JsonRow {
        phase,
        sent: p.sent,
        delivered: p.delivered,
        lost: p.lost,
        duplicated: p.duplicated,
        p50_ms: percentile(&p.latencies_us, 0.5),
        p99_ms: percentile(&p.latencies_us, 0.99),
        // None: the phase was too short for a sample.
        daemon_peak_rss_mib: (p.peak_rss_kib > 0).then(|| p.peak_rss_kib as f64 / 1024.0),
        daemon_peak_fds: (p.peak_fds > 0).then_some(p.peak_fds),
        attack: &p.attack,
    }
}

fn print_report(r: &Report, args: &SoakArgs) {
    let rows: Vec<JsonRow> =
        PHASES.iter().zip(&r.phases).map(|(name, p)| row(name, p)).chain([row("total", &r.total)]).collect();
    if args.json {
        let out = serde_json::json!({
            "clients": args.clients,
            "groups": args.groups,
            "groups_per_client": args.groups_per_client,
            "duration_s": args.duration.as_secs_f64(),
            "elapsed_s": r.elapsed.as_secs_f64(),
            "rate_per_client_s": args.rate,
            "churn_per_client_min": args.churn,
            "size": args.size,
            "daemon_rss_hwm_mib": r.peak_rss_hwm_kib as f64 / 1024.0,
            "client_errors": r.client_errors,
            "phases": rows,
        });
        println!("{out}");
        return;
    }
    println!(
        "{} clients in {} groups ({} each), {:.0} s: {} msg/s and {} leaves/min per client, {}-byte payloads",
        args.clients,
        args.groups,
        args.groups_per_client,
        r.elapsed.as_secs_f64(),
        args.rate,
        args.churn,
        args.size
    );
    let mut t = crate::table::new(
        [
            "phase",
            "sent",
            "delivered",
            "lost",
            "duplicated",
            "p50 ms",
            "p99 ms",
            "daemon RSS MiB",
            "daemon fds",
            "attack cycles",
            "attacker conns",
            "refused/cut off",
            "attack",
        ],
        1,
    );
    for row in &rows {
        let a = row.attack;
        let attack = if row.phase == "no-attack" || row.phase == "total" {
            "-".to_string()
        } else if a.cycles > 0 && a.failures.is_empty() {
            "pass".to_string()
        } else {
            "FAIL".to_string()
        };
        t.add_row(vec![
            row.phase.to_string(),
            row.sent.to_string(),
            row.delivered.to_string(),
            row.lost.to_string(),
            row.duplicated.to_string(),
            crate::table::or_dash(row.p50_ms, 2),
            crate::table::or_dash(row.p99_ms, 2),
            crate::table::or_dash(row.daemon_peak_rss_mib, 1),
            row.daemon_peak_fds.map_or("-".to_string(), |n| n.to_string()),
            a.cycles.to_string(),
            a.connections.to_string(),
            format!("{}/{}", a.answered, a.should_answer),
            attack,
        ]);
    }
    println!("{t}");
    for (name, p) in PHASES.iter().zip(&r.phases) {
        for f in &p.attack.failures {
            println!("{name}: {f}");
        }
    }
    for e in r.client_errors.iter().take(5) {
        println!("well-behaved client error: {e}");
    }
}

// ---------------------------------------------------------------------------
// The attacker.

async fn attacker(
    start: Instant,
    slice: Duration,
    daemon: Arc<DaemonChild>,
    probes: Arc<Probes>,
    shared: Arc<Shared>,
) -> Result<()> {
    for (k, name) in PHASES.iter().enumerate() {
        shared.phase.store(k, Ordering::Relaxed);
        // Its slice of the duration; if the cycles of the phase before ran
        // past it (only at short durations), a whole slice from now.
        let end = (start + slice * (k as u32 + 1)).max(Instant::now() + slice);
        if k == 0 {
            tokio::time::sleep_until(end.into()).await;
            continue;
        }
        // At least one cycle, and no more than fit in the slice (and 10 000).
        for _ in 0..10_000 {
            let cycle = match *name {
                "tls-handshake-flood" => handshake_flood(&daemon, &probes).await,
                "never-reads" => never_reads(&daemon, &shared).await,
                "connection-exhaustion" => exhaustion(&daemon, &probes, &shared).await,
                "incomplete-frame" => incomplete_frames(&daemon, &shared).await,
                "name-squatting" => squatting(&daemon, &shared).await,
                _ => unreachable!("phase {name}"),
            };
            let cycle = cycle.unwrap_or_else(|e| Cycle { failure: Some(format!("{e:#}")), ..Cycle::default() });
            shared.phases.lock().expect("phases")[k].attack.add(cycle);
            if Instant::now() + Duration::from_millis(200) >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep_until(end.into()).await;
    }
    Ok(())
}

/// A raw connection's frames until it closes (or `limit` passes).
async fn read_events(mut s: impl AsyncRead + Unpin, limit: Duration) -> (Vec<Event>, bool) {
    let mut buf = BytesMut::new();
    let mut frames = FrameReader::new(4 << 20);
    let mut got = Vec::new();
    let r = tokio::time::timeout(limit, async {
        loop {
            match frames.next_frame(&mut buf) {
                Ok(Some(f)) => match wire::decode_delivery(f) {
                    Ok(e) => got.push(e),
                    Err(_) => return,
                },
                Ok(None) => {}
                Err(_) => return,
            }
            match s.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    (got, r.is_ok())
}

/// The first frame a raw connection gets (or `None` if it closes or `limit` passes first).
async fn first_event(s: &mut (impl AsyncRead + Unpin), limit: Duration) -> Option<Event> {
    let mut buf = BytesMut::new();
    let mut frames = FrameReader::new(4 << 20);
    tokio::time::timeout(limit, async {
        loop {
            if let Ok(Some(f)) = frames.next_frame(&mut buf) {
                return wire::decode_delivery(f).ok();
            }
            match s.read_buf(&mut buf).await {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    })
    .await
    .ok()
    .flatten()
}

fn request(req: &Request) -> BytesMut {
    let mut b = BytesMut::new();
    wire::encode_request(req, &mut b);
    b
}

fn hello(name: &str) -> Result<BytesMut> {
    Ok(request(&Request::Hello { name: MemberId::new(name)?, view_changes: false }))
}

async fn send_raw(s: &mut (impl AsyncWrite + Unpin), b: &[u8]) -> Result<()> {
    tokio::time::timeout(STEP, s.write_all(b)).await.map_err(|_| anyhow!("writing timed out"))??;
    Ok(())
}

fn attacker_name(shared: &Shared, kind: &str) -> String {
    format!("soak-a-{kind}-{}", shared.next_name.fetch_add(1, Ordering::Relaxed))
}

/// A TCP connection from the loopback address `127.0.0.<last>`.
async fn tcp_from(last: u8, to: SocketAddr) -> Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, last), 0)))?;
    Ok(tokio::time::timeout(STEP, socket.connect(to)).await.map_err(|_| anyhow!("connect timed out"))??)
}

/// Idle sockets that never send a ClientHello, past the handshake cap, from
/// 127.0.0.2 onwards (50 per address, under the per-address cap of 64); a
/// certified newcomer must get in within 2 s, and the daemon must close every
/// idle socket (evicted, or timed out after 3 s).
async fn handshake_flood(daemon: &DaemonChild, probes: &Probes) -> Result<Cycle> {
    let n = MAX_HANDSHAKES + 76;
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        idle.push(tcp_from(2 + (i / 50) as u8, daemon.tls).await?);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let probe = tokio::time::timeout(Duration::from_secs(2), probes.connect(daemon.tls)).await;
    let mut failure = match probe {
        Ok(Ok(c)) => {
            let _ = c.bye().await;
            None
        }
        Ok(Err(e)) => Some(format!("a certified newcomer was refused during the flood: {e}")),
        Err(_) => Some(format!("a certified newcomer did not get in within 2 s ({:?})", started.elapsed())),
    };
    let mut reads = JoinSet::new();
    for mut s in idle {
        reads.spawn(async move {
            let mut byte = [0u8; 1];
            let r = tokio::time::timeout(HANDSHAKE_TIMEOUT + Duration::from_secs(5), s.read(&mut byte)).await;
            matches!(r, Ok(Ok(0) | Err(_)))
        });
    }
    let mut closed = 0;
    while let Some(r) = reads.join_next().await {
        closed += r.unwrap_or(false) as u64;
    }
    if closed < n as u64 && failure.is_none() {
        failure = Some(format!("{} of {n} idle sockets were not closed by the daemon", n as u64 - closed));
    }
    Ok(Cycle { connections: n as u64 + 1, answered: closed, should_answer: n as u64, failure })
}

/// A member of a group of its own that never reads, while another member
/// floods the group with 64 KiB messages: it must be cut off (QueueOverflow)
/// before four times its byte budget has been sent.
async fn never_reads(daemon: &DaemonChild, shared: &Shared) -> Result<Cycle> {
    const SIZE: usize = 64 << 10;
    let group = format!("soak-attack-{}", shared.next_name.fetch_add(1, Ordering::Relaxed));
    let mute_name = attacker_name(shared, "mute");
    let mut mute = tokio::time::timeout(STEP, UnixStream::connect(&daemon.unix)).await??;
    let mut hello_join = hello(&mute_name)?;
    hello_join.extend_from_slice(&request(&Request::Join {
        group: GroupName::new(&group)?,
        open: false,
        mode: conclave_gcs::core::GroupMode::Members,
    }));
    send_raw(&mut mute, &hello_join).await?;
    let mut blaster =
        tokio::time::timeout(STEP, Client::connect_unix(&daemon.unix, &attacker_name(shared, "blast"))).await??;
    blaster.set_max_payload(SIZE);
    blaster.join(&group).await?;
    // Until the blaster's view holds both.
    let both = tokio::time::timeout(STEP, async {
        loop {
            if let Event::View { view, .. } = blaster.recv().await? {
                if view.members.len() == 2 {
                    return anyhow::Ok(());
                }
            }
        }
    })
    .await;
    both.map_err(|_| anyhow!("the never-reading member did not join"))??;
    let limit = 4 * QUEUE_BYTES / SIZE + 64;
    let mut cut = false;
    let mut sent = 0;
    while sent < limit && !cut {
        blaster.multicast(&group, Service::Agreed, vec![0u8; SIZE]).await?;
        sent += 1;
        // One in flight: wait for it back, watching for the mute member's departure.
        let back = tokio::time::timeout(STEP, async {
            loop {
                match blaster.recv().await? {
                    Event::Message { .. } => return anyhow::Ok(()),
                    Event::View { view, .. } if view.members.len() == 1 => cut = true,
                    _ => {}
                }
            }
        })
        .await;
        back.map_err(|_| anyhow!("the flooding member's own message did not come back"))??;
    }
    let _ = blaster.bye().await;
    let (got, closed) = read_events(mute, STEP).await;
    let last = got.last();
    let overflowed = matches!(last, Some(Event::Error { code: ErrorCode::QueueOverflow, .. })) && closed;
    let failure = (!overflowed).then(|| {
        format!(
            "the never-reading member was not cut off for its queue after {sent} messages of 64 KiB (last: {:?})",
            last.map(|e| format!("{e:?}").chars().take(120).collect::<String>())
        )
    });
    Ok(Cycle { connections: 2, answered: overflowed as u64, should_answer: 1, failure })
}

/// Local connections that say Hello until the per-user cap refuses one, then
/// TCP connections without Hello (from 127.0.0.100 onwards) until the global
/// cap refuses one; then a certified newcomer must be refused in words, and
/// served again once the attacker lets go.
async fn exhaustion(daemon: &DaemonChild, probes: &Probes, shared: &Shared) -> Result<Cycle> {
    let mut held_unix = Vec::new();
    let mut c = Cycle { should_answer: 3, ..Cycle::default() };
    let mut per_user_refused = false;
    for _ in 0..daemon.per_peer + 16 {
        let mut s = tokio::time::timeout(STEP, UnixStream::connect(&daemon.unix)).await??;
        c.connections += 1;
        send_raw(&mut s, &hello(&attacker_name(shared, "x"))?).await?;
        match first_event(&mut s, STEP).await {
            Some(Event::Welcome { .. }) => held_unix.push(s),
            Some(Event::Error { code: ErrorCode::TooManyConnections, text }) if text.contains("Unix user") => {
                per_user_refused = true;
                break;
            }
            other => bail!("a local connection over the cap got {other:?}, not TooManyConnections for its user"),
        }
    }
    if !per_user_refused {
        bail!(
            "{} local connections were all served: the per-user cap ({}) never refused",
            held_unix.len(),
            daemon.per_peer
        );
    }
    c.answered += 1;
    let mut held_tcp = Vec::new();
    let mut global_refused = false;
    for i in 0..daemon.max_connections + 16 {
        let mut s = tcp_from(100 + (i / 200) as u8, daemon.tcp).await?;
        c.connections += 1;
        match first_event(&mut s, Duration::from_millis(100)).await {
            None => held_tcp.push(s),
            Some(Event::Error { code: ErrorCode::TooManyConnections, text })
                if text.contains("as many client connections") =>
            {
                global_refused = true;
                break;
            }
            Some(other) => bail!("a TCP connection over the global cap got {other:?}, not TooManyConnections"),
        }
    }
    if !global_refused {
        bail!("the global cap ({}) never refused a connection", daemon.max_connections);
    }
    c.answered += 1;
    // A newcomer now: refused in words.
    c.connections += 1;
    let newcomer = probes.connect(daemon.tls).await;
    let refused_in_words = matches!(&newcomer, Err(ClientError::Refused { code: ErrorCode::TooManyConnections, .. }));
    drop(newcomer);
    drop(held_unix);
    drop(held_tcp);
    // And served once the attacker lets go; every refusal on the way in words.
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match probes.connect(daemon.tls).await {
                Ok(c) => {
                    let _ = c.bye().await;
                    return Ok(());
                }
                Err(ClientError::Refused { code: ErrorCode::TooManyConnections, .. }) => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    if refused_in_words {
        c.answered += 1;
    } else {
        c.failure = Some("a newcomer at the global cap was not refused with TooManyConnections".into());
    }
    match served {
        Ok(Ok(())) => {}
        Ok(Err(e)) => c.failure = Some(format!("a newcomer after the attack was refused: {e}")),
        Err(_) => c.failure = Some("a newcomer was not served within 10 s after the attacker let go".into()),
    }
    Ok(c)
}

/// Local clients that say Hello, then send the first KiB of a 1 MiB frame and
/// nothing more: each must be timed out (Timeout) within the frame timeout
/// (2 s) and a few seconds.
async fn incomplete_frames(daemon: &DaemonChild, shared: &Shared) -> Result<Cycle> {
    const N: usize = 32;
    let mut reads = JoinSet::new();
    for _ in 0..N {
        let mut s = tokio::time::timeout(STEP, UnixStream::connect(&daemon.unix)).await??;
        let mut partial = hello(&attacker_name(shared, "stuck"))?;
        partial.put_u32(1 << 20);
        partial.put_bytes(0x04, 1024);
        send_raw(&mut s, &partial).await?;
        reads.spawn(async move {
            let (got, closed) = read_events(s, Duration::from_secs(FRAME_TIMEOUT_SECS + 8)).await;
            closed
                && matches!(got.first(), Some(Event::Welcome { .. }))
                && matches!(got.last(), Some(Event::Error { code: ErrorCode::Timeout, .. }))
        });
    }
    let mut timed_out = 0;
    while let Some(r) = reads.join_next().await {
        timed_out += r.unwrap_or(false) as u64;
    }
    let failure =
        (timed_out < N as u64).then(|| format!("{} of {N} incomplete frames were not timed out", N as u64 - timed_out));
    Ok(Cycle { connections: N as u64, answered: timed_out, should_answer: N as u64, failure })
}

/// Hellos as a certified member's name over the Unix socket (as a connected
/// member's and as a free certified name) and over plain TCP: each must be
/// refused (IdentityMismatch).
async fn squatting(daemon: &DaemonChild, shared: &Shared) -> Result<Cycle> {
    const N: u64 = 16;
    let mut refused = 0;
    for i in 0..N {
        let n = shared.next_name.fetch_add(1, Ordering::Relaxed);
        let name = if i % 2 == 0 { format!("soak-c-{}", n % 2) } else { format!("soak-p-{}", 1000 + n) };
        let answer = if i % 4 == 3 {
            let mut s = tcp_from(1, daemon.tcp).await?;
            send_raw(&mut s, &hello(&name)?).await?;
            read_events(s, STEP).await
        } else {
            let mut s = tokio::time::timeout(STEP, UnixStream::connect(&daemon.unix)).await??;
            send_raw(&mut s, &hello(&name)?).await?;
            read_events(s, STEP).await
        };
        if answer.1 && matches!(&answer.0[..], [Event::Error { code: ErrorCode::IdentityMismatch, .. }]) {
            refused += 1;
        }
    }
    let failure =
        (refused < N).then(|| format!("{} of {N} Hellos under certified names were not refused", N - refused));
    Ok(Cycle { connections: N, answered: refused, should_answer: N, failure })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units_and_refuse_nonsense() {
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("8s").unwrap(), Duration::from_secs(8));
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1h").unwrap(), Duration::from_secs(3600));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("25h").is_err());
        assert!(parse_duration("10x").is_err());
        assert!(parse_duration("m").is_err());
    }

    fn shared() -> Shared {
        Shared {
            epoch: Instant::now(),
            phase: AtomicUsize::new(0),
            phases: Mutex::new(vec![PhaseStats::default(); PHASES.len()]),
            delivered: AtomicU64::new(0),
            next_name: AtomicU64::new(0),
        }
    }

    /// A client that installed `views` (each with `members` well-behaved
    /// members), got its own `own` messages back and received `received`.
    fn out(
        views: &[(ViewId, u32)],
        own: &[(ViewId, u8, u64)],
        received: &[(ViewId, u8, u64)],
        unconfirmed: u64,
    ) -> ClientOut {
        let mut phases = vec![ClientPhase::default(); PHASES.len()];
        phases[0].delivered = received.iter().map(|r| r.2).sum();
        let mut unconfirmed_per_phase = vec![0; PHASES.len()];
        unconfirmed_per_phase[0] = unconfirmed;
        ClientOut {
            phases,
            own: own.iter().map(|&(v, p, n)| ((0, v, p), n)).collect(),
            unconfirmed: unconfirmed_per_phase,
            received: received.iter().map(|&(v, p, n)| ((0, v, p), n)).collect(),
            views: views.iter().map(|&(v, n)| ((0, v), n)).collect(),
            error: None,
        }
    }

    /// Three members of view 1, two of view 2 (the third left between): a
    /// message in view 1 is owed to three, in view 2 to two. Losing one
    /// delivery, or getting one more than owed, or one message never coming
    /// back to its sender, shows in the counts; nothing else does.
    #[test]
    fn the_accounting_counts_what_each_view_owes() {
        let (v1, v2) = (ViewId::new(7, 1), ViewId::new(7, 2));
        let run = |a_got: u64, c_got: u64, unconfirmed: u64| {
            // a sends 4 in v1 and 2 in v2; b sends 1 in v1; c leaves after v1.
            let a = out(&[(v1, 3), (v2, 2)], &[(v1, 0, 4), (v2, 0, 2)], &[(v1, 0, a_got), (v2, 0, 2)], unconfirmed);
            let b = out(&[(v1, 3), (v2, 2)], &[(v1, 0, 1)], &[(v1, 0, 5), (v2, 0, 2)], 0);
            let c = out(&[(v1, 3)], &[], &[(v1, 0, c_got)], 0);
            let r = account(vec![a, b, c], &shared(), 0, Duration::ZERO);
            (r.total.lost, r.total.duplicated)
        };
        assert_eq!(run(5, 5, 0), (0, 0));
        assert_eq!(run(5, 4, 0), (1, 0));
        assert_eq!(run(6, 5, 0), (0, 1));
        assert_eq!(run(5, 5, 2), (2, 0));
    }

    #[test]
    fn percentiles_of_sorted_microseconds_are_milliseconds() {
        assert_eq!(percentile(&[], 0.5), None);
        let v: Vec<u32> = (1..=100).map(|i| i * 1000).collect();
        assert_eq!(percentile(&v, 0.5), Some(51.0));
        assert_eq!(percentile(&v, 0.99), Some(99.0));
    }
}
