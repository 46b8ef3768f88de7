//! `conclave bench form`: how long a big group takes to form over a real
//! daemon, with MLS (mls-rs) forming a group of the same size in the same run.
//!
//! # What is timed
//! For every size n: a standalone daemon on a Unix socket (a `conclave
//! daemon` process of its own by default, or embedded in this process with
//! `--daemon embedded`), and n secure sessions (the whole stack an application uses) connected to it,
//! each in its own task, each with its own Ed25519 identity. Then every
//! member is asked to join one group *at once*, as the members of a
//! conference or a replicated service do when it starts. The time runs from
//! the first join request until every member has shown a secure view of all
//! n members, all with the same key (its fingerprint), confirmed by every
//! member (the session's key confirmation ends every run). The daemon sees n
//! joins in a row and installs a view per join (they are separate clients),
//! so each member sees a cascade of views; a view that arrives during a run
//! abandons it, and the key is agreed in the view that has everybody.
//!
//! The daemon's per-client queue is 64 times its default here (see
//! [`FORM_QUEUE_DEPTH`]): with the default, a member that falls behind the
//! burst at 512 members is cut off as too slow.
//!
//! Beside the time: the CPU spent by every member and the daemon (the total
//! work of forming on this machine), the peak resident memory during the
//! forming, and the bytes the daemon read from and wrote to its clients.
//! With the daemon in a process of its own, the members' memory (this
//! process) and the daemon's (its process) are apart, each also per member,
//! and the kernel gives the daemon's CPU (`/proc/PID/stat`, in 10 ms ticks)
//! and the bytes it wrote (`/proc/PID/io`'s `wchar`: a quiet daemon writes
//! only to its sockets; the kernel does not count socket reads, so the
//! bytes it read are not shown). Embedded, memory and CPU are the
//! process's, members and daemon together, and the daemon counts the bytes
//! it reads and writes itself (`Daemon::traffic`).
//!
//! # The MLS column
//! MLS forms a big group with one commit: every joiner publishes a key
//! package, the creator adds all n − 1 in one commit with one Welcome, and
//! every joiner processes the Welcome ([`crate::mls::form`]). That is the
//! fastest way MLS has, and the one a deployment creating a big group would
//! use; adding members one commit each (as a group that grows does) costs a
//! commit per member and every earlier member processing it, O(n²) in all,
//! and is not timed here. The MLS figures are CPU times of the operations
//! alone (no delivery service, no network): the key packages and Welcomes
//! are spread over this machine's CPUs, the commit between them
//! ([`crate::mls::MlsForm::on_cpus_ms`]). Above `--mls-sample` joiners only
//! that many Welcomes are processed and timed, and their mean stands for the
//! others (every joiner does the same work).

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use conclave_gka::suite::generate_signer;
use conclave_gka::{SignatureId, StaticDirectory};
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use conclave_testkit::scripted::{self, Cmd};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use tokio::sync::mpsc;

use conclave_gcs_net::{Daemon, DaemonConfig};

use crate::live::process_cpu_ms;

/// Frames the daemon queues for one client before it cuts the client off
/// as too slow: 64 times its default (4096). Members that keep up with the
/// burst of n views run (and send in) many of them, and those that fall
/// behind get every one of those messages queued; at 512 members the
/// default queue overflows. A deployment that starts groups of hundreds at
/// once sets `queue_depth` likewise. Frames are queued as shared buffers,
/// and the byte budget (`queue_bytes`) stays the default.
const FORM_QUEUE_DEPTH: usize = 4096 * 64;

/// Where `bench form` runs the daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DaemonPlace {
    /// A `conclave daemon` process of its own, on a Unix socket: the
    /// members' memory and CPU (this process) and the daemon's are measured
    /// apart.
    Process,
    /// In this process, beside the members: their memory and CPU together.
    Embedded,
}

/// The daemon a group forms on, wherever it runs.
enum FormDaemon {
    Embedded { daemon: Daemon, socket: std::path::PathBuf, _dir: tempfile::TempDir },
    Process(DaemonProcess),
}

/// A `conclave daemon` child process (killed when dropped).
struct DaemonProcess {
    child: tokio::process::Child,
    pid: u32,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// What a daemon has used so far.
#[derive(Clone, Copy, Debug, Default)]
struct ProcUse {
    /// User and system CPU, ms, of a daemon process (the kernel counts it
    /// in clock ticks: 10 ms here); 0 for an embedded one, whose CPU is
    /// this process's.
    cpu_ms: f64,
    /// Bytes it read from its clients, when known: an embedded daemon counts
    /// them; the kernel counts a process's socket writes (`wchar`), not its
    /// socket reads (`recv` is not in `rchar`).
    read: Option<u64>,
    /// Bytes it wrote to its clients.
    written: u64,
}

impl FormDaemon {
    /// A fresh daemon for forming groups of up to `n` members, with a deeper
    /// per-client queue than the default ([`FORM_QUEUE_DEPTH`]).
    async fn start(place: DaemonPlace, n: usize) -> Result<Self> {
        let dir = tempfile::tempdir().context("cannot create a directory for the daemon's socket")?;
        let socket = dir.path().join("daemon.sock");
        match place {
            DaemonPlace::Embedded => {
                let config = DaemonConfig {
                    unix: Some(socket.clone()),
                    max_connections_per_peer: 100_000,
                    queue_depth: FORM_QUEUE_DEPTH,
                    ..DaemonConfig::default()
                };
                let daemon = Daemon::start(config).await.context("starting the embedded daemon")?;
                Ok(Self::Embedded { daemon, socket, _dir: dir })
            }
            DaemonPlace::Process => Ok(Self::Process(DaemonProcess::start(dir, socket, n).await?)),
        }
    }

    fn socket(&self) -> &std::path::Path {
        match self {
            Self::Embedded { socket, .. } => socket,
            Self::Process(p) => &p.socket,
        }
    }

    /// The daemon's use so far: its traffic, and its CPU when it runs apart.
    fn used(&self) -> Result<ProcUse> {
        match self {
            Self::Embedded { daemon, .. } => {
                Ok(ProcUse { cpu_ms: 0.0, read: Some(daemon.traffic().read()), written: daemon.traffic().written() })
            }
            Self::Process(p) => p.used(),
        }
    }

    /// Starts the daemon's peak memory afresh; false when it runs embedded
    /// (it is then in this process's).
    fn reset_peak_rss(&self) -> bool {
        match self {
            Self::Embedded { .. } => false,
            Self::Process(p) => reset_peak_rss_of(&p.pid.to_string()),
        }
    }

    fn peak_rss_mib(&self) -> Option<f64> {
        match self {
            Self::Embedded { .. } => None,
            Self::Process(p) => peak_rss_mib_of(&p.pid.to_string()),
        }
    }

    async fn shutdown(self) {
        match self {
            Self::Embedded { daemon, .. } => daemon.shutdown().await,
            Self::Process(mut p) => {
                let _ = p.child.kill().await;
            }
        }
    }
}

impl DaemonProcess {
    /// Starts `conclave daemon` (this program) on `socket`, quiet, and waits
    /// until it accepts connections.
    async fn start(dir: tempfile::TempDir, socket: std::path::PathBuf, n: usize) -> Result<Self> {
        let exe = std::env::current_exe().context("cannot find this program to start the daemon")?;
        let log = dir.path().join("daemon.log");
        let mut child = tokio::process::Command::new(exe)
            .arg("daemon")
            .arg("--unix")
            .arg(&socket)
            .args(["--queue-depth", &FORM_QUEUE_DEPTH.to_string()])
            .args(["--max-connections", &(n + 64).to_string()])
            .args(["--max-connections-per-peer", "100000"])
            .arg("-qq")
            .env_remove("RUST_LOG")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).context("cannot create the daemon's log")?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the daemon")?;
        let pid = child.id().ok_or_else(|| anyhow!("the daemon exited at once"))?;
        let started = Instant::now();
        // Ready once it accepts a connection (which it then drops, unnamed).
        while tokio::net::UnixStream::connect(&socket).await.is_err() {
            if let Some(status) = child.try_wait()? {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                bail!("the daemon exited ({status}):\n{}", text.trim_end());
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("the daemon did not accept connections on {} within 10 s", socket.display());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(Self { child, pid, socket, _dir: dir })
    }

    fn used(&self) -> Result<ProcUse> {
        let read = |what: &str| {
            std::fs::read_to_string(format!("/proc/{}/{what}", self.pid))
                .with_context(|| format!("cannot read the daemon's /proc/{}/{what}", self.pid))
        };
        // A quiet daemon writes only to its sockets: `wchar` (bytes through
        // `write` and its kin) counts them.
        let written = read("io")?
            .lines()
            .find_map(|l| l.strip_prefix("wchar:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| anyhow!("no wchar in the daemon's /proc/{}/io", self.pid))?;
        let stat = read("stat")?;
        // Fields after the command name (which may hold spaces): state is
        // field 3, utime 14 and stime 15.
        let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
        let fields: Vec<&str> = after.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
        let (Some(utime), Some(stime)) = (ticks(11), ticks(12)) else {
            bail!("cannot read the daemon's CPU time from /proc/{}/stat", self.pid);
        };
        // SAFETY: sysconf only reads a configuration value.
        let per_second = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
            t if t > 0 => t as f64,
            _ => 100.0,
        };
        Ok(ProcUse { cpu_ms: (utime + stime) as f64 * 1e3 / per_second, read: None, written })
    }
}

/// Options of `conclave bench form`.
#[derive(Args)]
pub struct FormArgs {
    /// Group sizes n (comma-separated): n members join one group at once.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512")]
    sizes: Vec<usize>,
    /// Protocols (comma-separated): gdh, ckd, tgdh, str, bd.
    #[arg(long, value_delimiter = ',', default_value = "tgdh")]
    protocols: Vec<String>,
    /// Group: ristretto255, modp512, modp1024, modp2048.
    #[arg(long, default_value = "ristretto255")]
    suite: String,
    /// Signature scheme of the members' identities.
    #[arg(long, default_value = "ed25519")]
    signature: String,
    /// Runs per size and protocol (a fresh daemon and fresh members each).
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Seed of the members' identities.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Longest wait for one group to form, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Leave out the MLS (mls-rs) column.
    #[arg(long)]
    no_mls: bool,
    /// MLS: Welcomes processed and timed per size (their mean stands for the rest).
    #[arg(long, default_value_t = 64)]
    mls_sample: usize,
    /// Where the daemon runs: `process` (a `conclave daemon` of its own, so
    /// that the members' memory and CPU and the daemon's are measured apart)
    /// or `embedded` (in this process, beside the members: both together).
    #[arg(long, value_enum, default_value_t = DaemonPlace::Process)]
    daemon: DaemonPlace,
    /// Print the results as JSON (one object per line) instead of tables.
    #[arg(long)]
    json: bool,
}

/// One formed group.
#[derive(Clone, Debug, serde::Serialize)]
struct Formed {
    protocol: String,
    n: usize,
    /// From the first join request until every member shows the confirmed key of all n.
    ms: f64,
    /// Where the daemon ran.
    daemon: DaemonPlace,
    /// CPU meanwhile: every member and the daemon.
    cpu_ms: f64,
    /// The daemon's share of `cpu_ms`, when it ran in a process of its own
    /// (the kernel counts it in 10 ms ticks).
    daemon_cpu_ms: Option<f64>,
    /// Peak resident memory of this process while forming, MiB: the members
    /// (and the daemon, when it ran embedded).
    peak_rss_mib: Option<f64>,
    /// Peak resident memory of the daemon's process while forming, MiB,
    /// when it ran in one of its own.
    daemon_peak_rss_mib: Option<f64>,
    /// Secure views every member showed, summed over members (n if each showed only the last).
    secure_views: usize,
    /// Bytes the daemon read from its clients while forming; counted only
    /// when it runs embedded (the kernel does not count a process's socket
    /// reads).
    daemon_read_bytes: Option<u64>,
    /// Bytes the daemon wrote to its clients while forming (a daemon
    /// process's `wchar`: it logs nothing).
    daemon_written_bytes: u64,
}

/// The MLS column of one size.
#[derive(Clone, Debug, serde::Serialize)]
struct MlsRow {
    n: usize,
    /// On this machine's CPUs (see [`crate::mls::MlsForm::on_cpus_ms`]).
    ms: f64,
    /// Every member's CPU, summed.
    cpu_ms: f64,
    #[serde(flatten)]
    detail: crate::mls::MlsForm,
}

/// Runs `conclave bench form`.
pub fn run(args: FormArgs) -> Result<()> {
    let protocols = conclave_testkit::names::protocols(&args.protocols)?;
    let group = conclave_testkit::names::group(&args.suite)?;
    let scheme = conclave_testkit::names::signature(&args.signature)?;
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(&bad) = args.sizes.iter().find(|&&n| !(2..=4096).contains(&n)) {
        bail!("group size {bad} out of range (2..=4096)");
    }
    // Every member's end of its connection is in this process, and the
    // daemon's end too when it is embedded.
    let ends = if args.daemon == DaemonPlace::Embedded { 2 } else { 1 };
    let needed = ends * args.sizes.iter().max().copied().unwrap_or(0) as u64 + 256;
    let limit = conclave_gcs_net::daemon::raise_descriptor_limit();
    if limit.is_some_and(|l| l < needed) {
        bail!(
            "{needed} open descriptors are needed, but the limit (ulimit -n) is {} and cannot be raised further",
            limit.unwrap_or_default()
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut out = std::io::stdout().lock();
    if !args.json {
        writeln!(
            out,
            "Forming a group: n secure sessions on {} join one group at once; time from the first join until \
             every member shows the same confirmed key of all n (wall clock, ms); CPU of all members and the daemon \
             (ms; {cpus} CPUs shared by all); peak resident memory (RSS) {}; bytes through the daemon; {} run(s) \
             per point, suite {}, signatures {}.",
            match args.daemon {
                DaemonPlace::Process => "a daemon process of their own (`conclave daemon`)",
                DaemonPlace::Embedded => "a daemon embedded in this process",
            },
            match args.daemon {
                DaemonPlace::Process => "of the members' process and of the daemon's, each also per member",
                DaemonPlace::Embedded => "of the process (members and daemon together), also per member",
            },
            args.runs,
            args.suite,
            args.signature
        )?;
        if !args.no_mls {
            writeln!(
                out,
                "mls: mls-rs (RFC 9420, X25519/AES-128-GCM/Ed25519) forming the same size with one commit adding all \
                 n − 1 members: key packages + commit + every Welcome, CPU only (no delivery), spread over {cpus} CPUs; \
                 above {} joiners the Welcomes are sampled.",
                args.mls_sample
            )?;
        }
    }
    let total = args.sizes.len() * (protocols.len() * args.runs + usize::from(!args.no_mls));
    let progress = progress_bar(total as u64);
    let mut formed = Vec::new();
    let mut mls = Vec::new();
    let mut tag = 0usize;
    for &n in &args.sizes {
        for &protocol in &protocols {
            for run in 0..args.runs {
                progress.set_message(format!("{} n={n} run {}", protocol.name(), run + 1));
                let policy = Policy::new(protocol, group);
                let seed = args.seed.wrapping_add(run as u64);
                let timeout = Duration::from_secs(args.timeout);
                let f = crate::block_on(form_once(policy, scheme, n, tag, seed, timeout, args.daemon))
                    .with_context(|| format!("{} forming {n}", protocol.name()))?;
                tag += 1;
                progress.inc(1);
                if args.json {
                    progress.suspend(|| println!("{}", serde_json::to_string(&f).expect("serializable")));
                } else {
                    progress.suspend(|| {
                        eprintln!(
                            "{} n={n}: {:.0} ms, CPU {:.0} ms, {} secure views",
                            protocol.name(),
                            f.ms,
                            f.cpu_ms,
                            f.secure_views
                        )
                    });
                }
                formed.push(f);
            }
        }
        if !args.no_mls {
            progress.set_message(format!("mls n={n}"));
            let m = crate::mls::form(n, args.mls_sample).with_context(|| format!("MLS forming {n}"))?;
            let row = MlsRow { n, ms: m.on_cpus_ms(cpus), cpu_ms: m.total_cpu_ms(), detail: m };
            progress.inc(1);
            if args.json {
                let mut v = serde_json::to_value(&row).expect("serializable");
                v["protocol"] = "mls".into();
                progress.suspend(|| println!("{v}"));
            }
            mls.push(row);
        }
    }
    progress.finish_and_clear();
    if !args.json {
        write_table(&mut out, &formed, &mls)?;
    }
    Ok(())
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:24} {wide_bar} {pos}/{len} points, {elapsed}")
            .expect("static template"),
    );
    bar
}

fn write_table(out: &mut impl Write, formed: &[Formed], mls: &[MlsRow]) -> Result<()> {
    let mls_at: BTreeMap<usize, &MlsRow> = mls.iter().map(|m| (m.n, m)).collect();
    let mut t = crate::table::new(
        [
            "proto",
            "n",
            "ms",
            "cpu Σ ms",
            "daemon cpu ms",
            "RSS MiB",
            "KiB/member",
            "daemon RSS MiB",
            "daemon KiB/member",
            "views Σ",
            "daemon in MiB",
            "daemon out MiB",
            "mls ms",
            "mls cpu Σ",
            "mls ÷ ours",
        ],
        1,
    );
    let mib = |b: u64| format!("{:.1}", b as f64 / (1024.0 * 1024.0));
    for f in formed {
        let m = mls_at.get(&f.n);
        t.add_row(vec![
            f.protocol.clone(),
            f.n.to_string(),
            format!("{:.0}", f.ms),
            format!("{:.0}", f.cpu_ms),
            f.daemon_cpu_ms.map_or("-".into(), |c| format!("{c:.0}")),
            f.peak_rss_mib.map_or("-".into(), |r| format!("{r:.0}")),
            f.peak_rss_mib.map_or("-".into(), |r| format!("{:.0}", r * 1024.0 / f.n as f64)),
            f.daemon_peak_rss_mib.map_or("-".into(), |r| format!("{r:.0}")),
            f.daemon_peak_rss_mib.map_or("-".into(), |r| format!("{:.0}", r * 1024.0 / f.n as f64)),
            f.secure_views.to_string(),
            f.daemon_read_bytes.map_or("-".into(), mib),
            mib(f.daemon_written_bytes),
            m.map_or("-".into(), |m| format!("{:.0}", m.ms)),
            m.map_or("-".into(), |m| format!("{:.0}", m.cpu_ms)),
            m.map_or("-".into(), |m| format!("{:.1}", m.ms / f.ms)),
        ]);
    }
    writeln!(out, "{t}")?;
    if !mls.is_empty() {
        let mut t = crate::table::new(
            ["mls n", "key packages Σ ms", "commit ms", "Welcome max ms", "Welcomes Σ ms", "Welcomes timed"],
            1,
        );
        for m in mls {
            let d = &m.detail;
            t.add_row(vec![
                m.n.to_string(),
                format!("{:.0}", d.key_packages_ms),
                format!("{:.0}", d.commit_ms),
                format!("{:.1}", d.max_welcome_ms),
                format!("{:.0}", d.welcomes_ms),
                format!("{} of {}", d.timed, m.n - 1),
            ]);
        }
        writeln!(out, "{t}")?;
    }
    Ok(())
}

/// Resets a process's peak resident memory (`VmHWM`) to its current
/// resident memory (`pid`: a number or `self`); false where the kernel does
/// not allow it.
fn reset_peak_rss_of(pid: &str) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// A process's peak resident memory since the last reset, in MiB.
fn peak_rss_mib_of(pid: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Forms one group of `n` under `policy` on a fresh daemon, wherever `place` puts it.
async fn form_once(
    policy: Policy,
    scheme: SignatureId,
    n: usize,
    tag: usize,
    seed: u64,
    timeout: Duration,
    place: DaemonPlace,
) -> Result<Formed> {
    let daemon = FormDaemon::start(place, n).await?;
    let socket = daemon.socket().to_owned();
    let r = async {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut directory = StaticDirectory::new();
        let mut signers = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("f{tag}-{i}");
            let s = generate_signer(scheme, &mut rng)?;
            directory.insert(MemberId::new(name.clone())?, s.verifier());
            signers.push((name, s));
        }
        let directory = Arc::new(directory);
        let group = format!("form-{tag}");
        let (report_tx, mut reports) = mpsc::unbounded_channel();
        let mut cmds = Vec::with_capacity(n);
        for (member, (name, signer)) in signers.into_iter().enumerate() {
            let session = Session::connect_unix(&socket, &name, signer, directory.clone())
                .await
                .with_context(|| format!("connecting member {member}"))?;
            cmds.push(scripted::spawn(session, group.clone(), member, report_tx.clone()));
        }
        drop(report_tx);
        let peak = reset_peak_rss_of("self");
        let daemon_peak = daemon.reset_peak_rss();
        let daemon0 = daemon.used()?;
        let (t0, cpu0) = (Instant::now(), process_cpu_ms());
        for (m, c) in cmds.iter().enumerate() {
            c.send(Cmd::Join(policy)).map_err(|_| anyhow!("member {m} stopped"))?;
        }
        // Per member: the key fingerprint of its last secure view of all n, and when.
        let mut full: Vec<Option<(String, Instant)>> = vec![None; n];
        let mut complete = 0;
        let mut views = 0;
        let deadline = tokio::time::Instant::now() + timeout;
        while complete < n {
            let r = match tokio::time::timeout_at(deadline, reports.recv()).await {
                Ok(Some(r)) => r,
                Ok(None) => bail!("every member stopped"),
                Err(_) => bail!("{complete} of {n} members hold the key after {timeout:?}"),
            };
            match r.event {
                Ok(SecureEvent::View(v)) => {
                    views += 1;
                    if v.members.len() == n {
                        if full[r.who].is_none() {
                            complete += 1;
                        }
                        full[r.who] = Some((v.fingerprint, r.at));
                    }
                }
                Ok(SecureEvent::DaemonError { code, text }) => {
                    bail!("member {}: the daemon says {code:?}: {text}", r.who)
                }
                Ok(_) => {}
                Err(e) => bail!("member {}: {e}", r.who),
            }
        }
        let members_cpu_ms = process_cpu_ms() - cpu0;
        let daemon1 = daemon.used()?;
        let daemon_cpu_ms = (place == DaemonPlace::Process).then_some(daemon1.cpu_ms - daemon0.cpu_ms);
        let full: Vec<(String, Instant)> = full.into_iter().map(|f| f.expect("complete")).collect();
        if full.iter().any(|(fp, _)| *fp != full[0].0) {
            bail!("members hold different keys for the view of all {n}");
        }
        let last = full.iter().map(|(_, at)| *at).max().expect("n ≥ 2");
        Ok(Formed {
            protocol: policy.protocol.name().to_owned(),
            n,
            ms: last.duration_since(t0).as_secs_f64() * 1e3,
            daemon: place,
            cpu_ms: members_cpu_ms + daemon_cpu_ms.unwrap_or(0.0),
            daemon_cpu_ms,
            peak_rss_mib: if peak { peak_rss_mib_of("self") } else { None },
            daemon_peak_rss_mib: if daemon_peak { daemon.peak_rss_mib() } else { None },
            secure_views: views,
            daemon_read_bytes: daemon1.read.zip(daemon0.read).map(|(after, before)| after - before),
            daemon_written_bytes: daemon1.written - daemon0.written,
        })
    }
    .await;
    daemon.shutdown().await;
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_gka::{GroupId, ProtocolId};

    #[test]
    fn a_small_group_forms_with_one_key_and_counts_its_traffic() {
        let policy = Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255);
        let f = crate::block_on(form_once(
            policy,
            SignatureId::Ed25519,
            5,
            0,
            7,
            Duration::from_secs(60),
            DaemonPlace::Embedded,
        ))
        .unwrap();
        assert_eq!(f.n, 5);
        assert!(f.secure_views >= 5, "every member showed the view of all: {f:?}");
        let read = f.daemon_read_bytes.expect("an embedded daemon counts what it reads");
        assert!(read > 0 && f.daemon_written_bytes > read, "{f:?}");
        assert_eq!((f.daemon_cpu_ms, f.daemon_peak_rss_mib), (None, None), "embedded: the process's own");
    }

    #[test]
    fn mls_forms_a_small_group_with_one_commit() {
        let m = crate::mls::form(4, 2).unwrap();
        assert_eq!(m.timed, 2);
        assert!(m.welcomes_ms > 0.0 && m.total_cpu_ms() >= m.commit_ms);
    }
}
