//! `conclave demo`: the whole stack on the embedded default, as a script.
//!
//! It starts a standalone daemon in this process on a private Unix socket and,
//! for each protocol, a group of members with secure sessions (layered
//! architecture): they join one by one, talk — also while a rekey is running —
//! and one of them leaves. Every secure view (members, epoch, key fingerprint,
//! how long the rekey took) and every decrypted message is printed as each
//! member sees it. Identities are certified by a group authority made for the
//! run; at the end a revoked member, mallory, tries to join and the others
//! print that they refused her and why.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_gcs_net::Client;
use conclave_gcs_net::{Daemon, DaemonConfig};
use conclave_secure::trust::{cert_info, Authority, Identity, Issuer, Revocation};
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use tokio::sync::mpsc;

use conclave_testkit::scripted::{self, Cmd, Report};

/// Options of `conclave demo`.
#[derive(Args)]
pub struct DemoArgs {
    /// Protocols to show (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "gdh,ckd,tgdh,str,bd")]
    protocols: Vec<String>,
    /// Group for the key agreement: ristretto255, modp512, modp1024, modp2048.
    #[arg(long, default_value = "ristretto255")]
    suite: String,
    /// Seed of the authority's and the members' identity keys.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object per line instead of text: {"event": "daemon", "socket"}, {"event": "protocol",
    /// "protocol", "suite"}, then each member's events with "protocol" and "who" (the member that saw it): "view"
    /// (epoch, members, fingerprint, rekey_ms), "message" (epoch, sender, text), "left", "refused" (member, reason),
    /// "excluded" (by, reason), "other" (text), "failed" (error).
    #[arg(long)]
    json: bool,
}

const NAMES: [&str; 4] = ["alice", "bob", "carol", "dave"];
const WAIT: Duration = Duration::from_secs(30);

/// Runs the demo.
pub fn run(args: DemoArgs) -> Result<()> {
    let protocols = conclave_testkit::names::protocols(&args.protocols)?;
    let group_id = conclave_testkit::names::group(&args.suite)?;
    // Removed when this returns, and when a print to a closed stdout unwinds.
    let dir = tempfile::Builder::new()
        .prefix("conclave-demo-")
        .tempdir()
        .context("cannot create a temporary directory for the embedded daemon's socket")?;
    let socket = dir.path().join("daemon.sock");
    crate::block_on(async move {
        let daemon = Daemon::start(DaemonConfig { unix: Some(socket.clone()), ..DaemonConfig::default() })
            .await
            .context("starting the embedded daemon")?;
        if args.json {
            println!("{}", serde_json::json!({ "event": "daemon", "socket": socket.display().to_string() }));
        } else {
            println!("embedded daemon on {}", socket.display());
        }
        let scripts = async {
            for protocol in protocols {
                script(&socket, Policy::new(protocol, group_id), args.seed, args.json).await?;
            }
            Ok(())
        };
        // Ctrl-C ends the demo the same way as the end of the script.
        let result = tokio::select! {
            r = scripts => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        daemon.shutdown().await;
        result
    })
}

/// One protocol's script.
async fn script(socket: &std::path::Path, policy: Policy, seed: u64, json: bool) -> Result<()> {
    let tag = policy.protocol.name();
    let show = |r: &Report<String>| if json { show_json(r, tag) } else { show(r) };
    if json {
        let suite = policy.group_id.name();
        println!("{}", serde_json::json!({ "event": "protocol", "protocol": tag, "suite": suite }));
    } else {
        println!("\n=== {} over {} ===", policy.protocol, policy.group_id.name());
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    // A group authority for the run: it certifies everyone, then revokes mallory.
    let now = SystemTime::now();
    let (from, until) = (now - Duration::from_secs(3600), now + Duration::from_secs(86_400));
    let (issuer, _ca_key) = Issuer::create("Conclave demo authority", from, until, &mut rng)?;
    let mut identities = Vec::new();
    let mut revoked = Vec::new();
    for n in NAMES.iter().chain(&["mallory"]) {
        let name = format!("{n}-{tag}");
        let issued = issuer.issue(&MemberId::new(name.clone())?, from, until, &mut rng)?;
        if *n == "mallory" {
            let reason = Some(rcgen::RevocationReason::KeyCompromise);
            revoked.push(Revocation { serial: cert_info(&issued.cert_pem)?.serial_bytes, time: now, reason });
        }
        identities.push((name, Identity::from_pem(&issued.cert_pem, &issued.key_pem)?));
    }
    let crl = issuer.crl(2, &revoked, now, until)?;
    let authority = Arc::new(Authority::from_pem(issuer.ca_pem(), Some(&crl))?);
    let (report_tx, mut reports) = mpsc::unbounded_channel::<Report<String>>();
    let mut members: BTreeMap<String, mpsc::UnboundedSender<Cmd>> = BTreeMap::new();
    for (name, identity) in identities {
        let client = Client::connect_unix(socket, &name).await?;
        let session = Session::connect_certified(client, MemberId::new(name.clone())?, identity, authority.clone());
        let tx = scripted::spawn(session, format!("demo-{tag}"), name.clone(), report_tx.clone());
        members.insert(name, tx);
    }
    let cmd = |who: &str, c: Cmd| -> Result<()> {
        members[&format!("{who}-{tag}")].send(c).map_err(|_| anyhow::anyhow!("{who} stopped"))
    };
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    // Waits until each named member has installed a secure view of `size`.
    let mut await_views =
        async |who: &[&str], size: usize, reports: &mut mpsc::UnboundedReceiver<Report<String>>| -> Result<()> {
            let deadline = Instant::now() + WAIT;
            let want: Vec<String> = who.iter().map(|w| format!("{w}-{tag}")).collect();
            while !want.iter().all(|w| seen.get(w) == Some(&size)) {
                let left = deadline.saturating_duration_since(Instant::now());
                let r = match tokio::time::timeout(left, reports.recv()).await {
                    Ok(Some(r)) => r,
                    _ => bail!("{tag}: timed out waiting for secure views of {size} members"),
                };
                show(&r);
                if let SecureEvent::View(v) = r.event.as_ref().map_err(|e| anyhow::anyhow!("{}: {e}", r.who))? {
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
    // Mallory's certificate is revoked: the others refuse her, and tell her why.
    cmd("mallory", Cmd::Join(policy))?;
    let mut refused_by = BTreeSet::new();
    let mut told = false;
    let deadline = Instant::now() + WAIT;
    while refused_by.len() < 3 || !told {
        let r = match tokio::time::timeout(deadline.saturating_duration_since(Instant::now()), reports.recv()).await {
            Ok(Some(r)) => r,
            _ => bail!("{tag}: timed out waiting for mallory's refusal"),
        };
        show(&r);
        match r.event.as_ref().map_err(|e| anyhow::anyhow!("{}: {e}", r.who))? {
            SecureEvent::Refused { member, .. } if member.as_str().starts_with("mallory") => {
                refused_by.insert(r.who.clone());
            }
            SecureEvent::Excluded { .. } if r.who.starts_with("mallory") => told = true,
            _ => {}
        }
    }
    // Let the last messages arrive, then print them.
    let settle = Instant::now() + Duration::from_millis(300);
    while let Ok(Some(r)) = tokio::time::timeout(settle.saturating_duration_since(Instant::now()), reports.recv()).await
    {
        show(&r);
    }
    Ok(())
}

/// One JSON line for a member's event (see `--json`).
fn show_json(r: &Report<String>, protocol: &str) {
    use serde_json::json;
    let short = |s: &str| s.split('-').next().unwrap_or(s).to_owned();
    let mut v = match &r.event {
        Err(e) => json!({ "event": "failed", "error": e.to_string() }),
        Ok(SecureEvent::View(v)) => json!({
            "event": "view",
            "epoch": v.epoch.to_string(),
            "members": v.members.iter().map(|m| short(m.as_str())).collect::<Vec<_>>(),
            "fingerprint": v.fingerprint.to_string(),
            "rekey_ms": v.rekey_time.as_secs_f64() * 1000.0,
        }),
        Ok(SecureEvent::Message { sender, epoch, data, .. }) => json!({
            "event": "message",
            "epoch": epoch.to_string(),
            "sender": short(sender.as_str()),
            "text": String::from_utf8_lossy(data),
        }),
        Ok(SecureEvent::Left { .. }) => json!({ "event": "left" }),
        Ok(SecureEvent::Refused { member, reason, .. }) => {
            json!({ "event": "refused", "member": short(member.as_str()), "reason": reason.to_string() })
        }
        Ok(SecureEvent::Excluded { by, reason, .. }) => {
            json!({ "event": "excluded", "by": short(by.as_str()), "reason": reason.to_string() })
        }
        Ok(other) => json!({ "event": "other", "text": format!("{other:?}") }),
    };
    v["protocol"] = json!(protocol);
    v["who"] = json!(short(&r.who));
    println!("{v}");
}

fn show(r: &Report<String>) {
    let who = r.who.split('-').next().unwrap_or(&r.who);
    let event = match &r.event {
        Ok(event) => event,
        Err(e) => return println!("{who:>6} | {e}"),
    };
    match event {
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
        SecureEvent::Refused { member, reason, .. } => {
            let member = member.as_str().split('-').next().unwrap_or("");
            println!("{who:>6} | refused {member}: {reason}");
        }
        SecureEvent::Excluded { by, reason, .. } => {
            let by = by.as_str().split('-').next().unwrap_or("");
            println!("{who:>6} | refused by {by}: {reason}");
        }
        other => println!("{who:>6} | {other:?}"),
    }
}
