//! `conclave demo`: the whole stack on the embedded default, as a script.
//!
//! It starts a standalone daemon in this process on a private Unix socket and,
//! for each protocol, a group of members with secure sessions (layered
//! architecture): they join one by one, talk — also while a rekey is running —
//! and one of them leaves. Every secure view (members, epoch, key fingerprint,
//! how long the rekey took) and every decrypted message is printed as each
//! member sees it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_gcs_net::{Daemon, DaemonConfig};
use conclave_gka::suite::{generate_signer, SignatureId};
use conclave_gka::StaticDirectory;
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use tokio::sync::mpsc;

/// Options of `conclave demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Protocols to show (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "gdh,ckd,tgdh,str,bd")]
    protocols: Vec<String>,
    /// Group for the key agreement: ristretto255, modp512, modp1024, modp2048.
    #[arg(long, default_value = "ristretto255")]
    suite: String,
    /// Seed of the members' identity keys.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

enum Cmd {
    Join(Policy),
    Send(String),
    Leave,
}

/// What the members report to the script.
struct Report {
    who: String,
    event: SecureEvent,
}

const NAMES: [&str; 4] = ["alice", "bob", "carol", "dave"];
const WAIT: Duration = Duration::from_secs(30);

/// Runs the demo.
pub fn run(args: DemoArgs) -> Result<()> {
    let protocols = crate::names::protocols(&args.protocols)?;
    let group_id = crate::names::group(&args.suite)?;
    crate::block_on(async move {
        let dir = std::env::temp_dir().join(format!("conclave-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let socket = dir.join("daemon.sock");
        let daemon = Daemon::start(DaemonConfig { unix: Some(socket.clone()), ..DaemonConfig::default() })
            .await
            .context("starting the embedded daemon")?;
        println!("embedded daemon on {}", socket.display());
        let mut result = Ok(());
        for protocol in protocols {
            result = script(&socket, Policy { protocol, group_id }, args.seed).await;
            if result.is_err() {
                break;
            }
        }
        daemon.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        result
    })
}

/// One protocol's script.
async fn script(socket: &std::path::Path, policy: Policy, seed: u64) -> Result<()> {
    let tag = policy.protocol.name();
    println!("\n=== {} over {} ===", policy.protocol, policy.group_id.name());
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut directory = StaticDirectory::new();
    let mut signers = Vec::new();
    for n in NAMES {
        let name = format!("{n}-{tag}");
        let s = generate_signer(SignatureId::Ed25519, &mut rng)?;
        directory.insert(MemberId::new(name.clone())?, s.verifier());
        signers.push((name, s));
    }
    let directory = Arc::new(directory);
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report>();
    let mut members: BTreeMap<String, mpsc::UnboundedSender<Cmd>> = BTreeMap::new();
    for (name, signer) in signers {
        let mut session = Session::connect_unix(socket, &name, signer, directory.clone()).await?;
        let (tx, mut rx) = mpsc::unbounded_channel::<Cmd>();
        let out = report_tx.clone();
        let group = format!("demo-{tag}");
        let who = name.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    cmd = rx.recv() => {
                        let r = match cmd {
                            None => return,
                            Some(Cmd::Join(p)) => session.join(&group, p),
                            Some(Cmd::Send(text)) => session.send(&group, text.as_bytes()),
                            Some(Cmd::Leave) => session.leave(&group),
                        };
                        if let Err(e) = r {
                            eprintln!("{who}: {e}");
                        }
                    }
                    ev = session.recv() => match ev {
                        Ok(event) => {
                            if out.send(Report { who: who.clone(), event }).is_err() {
                                return;
                            }
                        }
                        Err(_) => return,
                    },
                }
            }
        });
        members.insert(name, tx);
    }
    let cmd = |who: &str, c: Cmd| -> Result<()> {
        members[&format!("{who}-{tag}")].send(c).map_err(|_| anyhow::anyhow!("{who} stopped"))
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    // Waits until each named member has installed a secure view of `size`.
    let mut await_views = async |who: &[&str], size: usize, reports: &mut mpsc::UnboundedReceiver<Report>| -> Result<()> {
        let deadline = Instant::now() + WAIT;
        let want: Vec<String> = who.iter().map(|w| format!("{w}-{tag}")).collect();
        while !want.iter().all(|w| seen.get(w) == Some(&size)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = match tokio::time::timeout(left, reports.recv()).await {
                Ok(Some(r)) => r,
                _ => bail!("{tag}: timed out waiting for secure views of {size} members"),
            };
            show(&r);
            if let SecureEvent::View(v) = &r.event {
                seen.insert(r.who.clone(), v.members.len());
            }
        }
        Ok(())
    };
    cmd("alice", Cmd::Join(policy))?;
    await_views(&["alice"], 1, &mut reports).await?;
    cmd("bob", Cmd::Join(policy))?;
    await_views(&["alice", "bob"], 2, &mut reports).await?;
    cmd("alice", Cmd::Send("hello bob".into()))?;
    cmd("bob", Cmd::Send("hi alice".into()))?;
    // Carol joins while alice is talking: alice's message waits for the new key.
    cmd("carol", Cmd::Join(policy))?;
    cmd("alice", Cmd::Send("welcome, whoever joins next".into()))?;
    await_views(&["alice", "bob", "carol"], 3, &mut reports).await?;
    cmd("dave", Cmd::Join(policy))?;
    await_views(&["alice", "bob", "carol", "dave"], 4, &mut reports).await?;
    cmd("dave", Cmd::Send("dave here".into()))?;
    cmd("carol", Cmd::Leave)?;
    await_views(&["alice", "bob", "dave"], 3, &mut reports).await?;
    cmd("bob", Cmd::Send("carol cannot read this".into()))?;
    // Let the last messages arrive, then print them.
    let settle = Instant::now() + Duration::from_millis(300);
    while let Ok(Some(r)) = tokio::time::timeout(settle.saturating_duration_since(Instant::now()), reports.recv()).await {
        show(&r);
    }
    Ok(())
}

fn show(r: &Report) {
    let who = r.who.split('-').next().unwrap_or(&r.who);
    match &r.event {
        SecureEvent::View(v) => {
            let names: Vec<&str> = v.members.iter().map(|m| m.as_str().split('-').next().unwrap_or("")).collect();
            println!(
                "{who:>6} | secure view epoch {:>3}: {:<26} key {}  rekey {:>6.2} ms",
                v.epoch,
                names.join(" "),
                v.fingerprint,
                v.rekey_time.as_secs_f64() * 1000.0
            );
        }
        SecureEvent::Message { sender, epoch, data, .. } => {
            let from = sender.as_str().split('-').next().unwrap_or("");
            println!("{who:>6} | [epoch {epoch}] {from}: {}", String::from_utf8_lossy(data));
        }
        SecureEvent::Left { .. } => println!("{who:>6} | left the group"),
        other => println!("{who:>6} | {other:?}"),
    }
}
