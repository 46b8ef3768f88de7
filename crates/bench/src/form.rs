//! `conclave bench form`: how long a big group takes to form over a real
//! daemon, with MLS (mls-rs) forming a group of the same size in the same run.
//!
//! # What is timed
//! For every size n: an embedded standalone daemon on a Unix socket, and n
//! secure sessions (the whole stack an application uses) connected to it,
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
//! Beside the time: the CPU this process spent (every member and the
//! daemon: the total work of forming on this machine), the process's peak
//! resident memory during the forming (members and daemon together; also
//! per member), and the bytes the daemon read from and wrote to its clients.
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

/// An embedded standalone daemon for forming: as `live::embedded_daemon`,
/// with a deeper per-client queue ([`FORM_QUEUE_DEPTH`]).
async fn form_daemon() -> Result<(tempfile::TempDir, std::path::PathBuf, Daemon)> {
    let dir = tempfile::tempdir().context("cannot create a directory for the daemon's socket")?;
    let socket = dir.path().join("daemon.sock");
    let config = DaemonConfig {
        unix: Some(socket.clone()),
        max_connections_per_peer: 100_000,
        queue_depth: FORM_QUEUE_DEPTH,
        ..DaemonConfig::default()
    };
    let daemon = Daemon::start(config).await.context("starting the embedded daemon")?;
    Ok((dir, socket, daemon))
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
    /// CPU of this process meanwhile: every member and the daemon.
    cpu_ms: f64,
    /// Peak resident memory of this process while forming (members and daemon), MiB.
    peak_rss_mib: Option<f64>,
    /// Secure views every member showed, summed over members (n if each showed only the last).
    secure_views: usize,
    /// Bytes the daemon read from its clients while forming.
    daemon_read_bytes: u64,
    /// Bytes the daemon wrote to its clients while forming.
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
    // Both ends of every member's connection are in this process.
    let needed = 2 * args.sizes.iter().max().copied().unwrap_or(0) as u64 + 256;
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
            "Forming a group: n secure sessions on an embedded daemon join one group at once; time from the first \
             join until every member shows the same confirmed key of all n (wall clock, ms); CPU of all members and \
             the daemon (ms; {cpus} CPUs shared by all); peak RSS of the process (members and daemon); bytes through \
             the daemon; {} run(s) per point, suite {}, signatures {}.",
            args.runs, args.suite, args.signature
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
                let f = crate::block_on(form_once(policy, scheme, n, tag, seed, timeout))
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
            "peak RSS MiB",
            "KiB/member",
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
            f.peak_rss_mib.map_or("-".into(), |r| format!("{r:.0}")),
            f.peak_rss_mib.map_or("-".into(), |r| format!("{:.0}", r * 1024.0 / f.n as f64)),
            f.secure_views.to_string(),
            mib(f.daemon_read_bytes),
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

/// Resets this process's peak resident memory (`VmHWM`) to its current
/// resident memory; false where the kernel does not allow it.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's peak resident memory since the last reset, in MiB.
fn peak_rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// Forms one group of `n` under `policy` on a fresh embedded daemon.
async fn form_once(
    policy: Policy,
    scheme: SignatureId,
    n: usize,
    tag: usize,
    seed: u64,
    timeout: Duration,
) -> Result<Formed> {
    let (_dir, socket, daemon) = form_daemon().await?;
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
        let peak = reset_peak_rss();
        let (read0, written0) = (daemon.traffic().read(), daemon.traffic().written());
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
        let cpu_ms = process_cpu_ms() - cpu0;
        let full: Vec<(String, Instant)> = full.into_iter().map(|f| f.expect("complete")).collect();
        if full.iter().any(|(fp, _)| *fp != full[0].0) {
            bail!("members hold different keys for the view of all {n}");
        }
        let last = full.iter().map(|(_, at)| *at).max().expect("n ≥ 2");
        Ok(Formed {
            protocol: policy.protocol.name().to_owned(),
            n,
            ms: last.duration_since(t0).as_secs_f64() * 1e3,
            cpu_ms,
            peak_rss_mib: if peak { peak_rss_mib() } else { None },
            secure_views: views,
            daemon_read_bytes: daemon.traffic().read() - read0,
            daemon_written_bytes: daemon.traffic().written() - written0,
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
        let f = crate::block_on(form_once(policy, SignatureId::Ed25519, 5, 0, 7, Duration::from_secs(60))).unwrap();
        assert_eq!(f.n, 5);
        assert!(f.secure_views >= 5, "every member showed the view of all: {f:?}");
        assert!(f.daemon_read_bytes > 0 && f.daemon_written_bytes > f.daemon_read_bytes, "{f:?}");
    }

    #[test]
    fn mls_forms_a_small_group_with_one_commit() {
        let m = crate::mls::form(4, 2).unwrap();
        assert_eq!(m.timed, 2);
        assert!(m.welcomes_ms > 0.0 && m.total_cpu_ms() >= m.commit_ms);
    }
}
