//! Secure data through the same daemon: the throughput round of the agreed
//! multicast table, sent through `conclave_secure::Session`s (a group key,
//! ChaCha20-Poly1305 per sender) with the group policy's sender signatures
//! on (the default: Ed25519, one signature per message, every receiver
//! verifies it) and off, each against the plain round's messages per second
//! on the same daemon and point.
//!
//! Every member runs in a task of its own; senders keep a window of their
//! own messages in flight (the next goes out when one comes back, as in the
//! plain round) and the round ends when every member has every message.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use conclave_gka::suite::{generate_signer, SignatureId};
use conclave_gka::StaticDirectory;
use conclave_secure::{MemberId, Policy, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use serde::Serialize;
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use super::STEP_LIMIT;

/// One point: plain, signed and unsigned throughput.
#[derive(Serialize)]
pub struct SecureRow {
    pub senders: usize,
    pub receivers: usize,
    pub size: usize,
    pub messages: usize,
    pub plain_messages_per_s: f64,
    pub signed_messages_per_s: f64,
    pub unsigned_messages_per_s: f64,
}

/// What one secure round does.
pub struct SecureFlood<'a> {
    /// Member i connects to `sockets[i]`, the members past the end to the
    /// last one (so one socket puts everybody on one daemon).
    pub sockets: &'a [PathBuf],
    /// Unique per round: each round has a group of its own.
    pub group: String,
    pub receivers: usize,
    pub senders: usize,
    pub per_sender: usize,
    pub size: usize,
    pub window: usize,
    /// The group's policy (layered TGDH with or without sender signatures,
    /// Integrated VS, Three-Step, …).
    pub policy: Policy,
}

/// Runs one round and returns its messages per second.
pub async fn round(f: &SecureFlood<'_>) -> Result<f64> {
    let mut rng = ChaCha20Rng::seed_from_u64(f.receivers as u64);
    let mut directory = StaticDirectory::new();
    let mut members = Vec::with_capacity(f.receivers);
    for i in 0..f.receivers {
        let name = format!("{}-{i}", f.group);
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).map_err(|e| anyhow!("{e}"))?;
        directory.insert(MemberId::new(name.clone())?, signer.verifier());
        members.push((name, signer));
    }
    let directory = Arc::new(directory);
    let policy = f.policy;
    let last = f.sockets.len().checked_sub(1).context("no daemon socket")?;
    let mut sessions = Vec::with_capacity(f.receivers);
    for (i, (name, signer)) in members.into_iter().enumerate() {
        let socket = &f.sockets[i.min(last)];
        let mut s = Session::connect_unix(socket, &name, signer, directory.clone())
            .await
            .with_context(|| format!("cannot connect {name} to {}", socket.display()))?;
        s.join(&f.group, policy)?;
        sessions.push(s);
    }
    let barrier = Arc::new(Barrier::new(f.receivers + 1));
    let mut tasks = JoinSet::new();
    let total = f.senders * f.per_sender;
    for (i, mut s) in sessions.into_iter().enumerate() {
        let (group, barrier, receivers) = (f.group.clone(), barrier.clone(), f.receivers);
        let to_send = if i < f.senders { f.per_sender } else { 0 };
        let (size, window) = (f.size, f.window);
        tasks.spawn(async move {
            // Everyone holds the key of the full group before the clock starts.
            loop {
                match s.recv().await? {
                    SecureEvent::View(v) if v.members.len() == receivers => break,
                    SecureEvent::KeyMismatch { epoch, .. } => bail!("key mismatch in {epoch}"),
                    _ => {}
                }
            }
            barrier.wait().await;
            let start = Instant::now();
            let payload = vec![0x5a; size];
            let (mut sent, mut own_back, mut got) = (0, 0, 0);
            while sent < to_send.min(window) {
                s.send(&group, &payload)?;
                sent += 1;
            }
            while got < total {
                match s.recv().await? {
                    SecureEvent::Message { sender, .. } => {
                        got += 1;
                        if &sender == s.me() {
                            own_back += 1;
                            if sent < to_send && sent - own_back < window {
                                s.send(&group, &payload)?;
                                sent += 1;
                            }
                        }
                    }
                    SecureEvent::View(v) => bail!("the view changed during the round: {}", v.epoch),
                    SecureEvent::Rejected { sender, reason, .. } => {
                        bail!("a message from {sender} was rejected: {reason}")
                    }
                    _ => {}
                }
            }
            let elapsed = start.elapsed();
            let _ = s.leave(&group);
            Ok::<Duration, anyhow::Error>(elapsed)
        });
    }
    tokio::time::timeout(STEP_LIMIT, barrier.wait())
        .await
        .map_err(|_| anyhow!("the secure group {} never formed", f.group))?;
    let mut slowest = Duration::ZERO;
    let all = async {
        while let Some(r) = tasks.join_next().await {
            slowest = slowest.max(r.context("a member task failed")??);
        }
        Ok::<(), anyhow::Error>(())
    };
    tokio::time::timeout(STEP_LIMIT, all).await.map_err(|_| anyhow!("the secure round in {} stalled", f.group))??;
    Ok(total as f64 / slowest.as_secs_f64().max(1e-9))
}

/// Prints the table.
pub fn print(rows: &[SecureRow]) {
    println!(
        "secure data through the same daemon (TGDH key, ChaCha20-Poly1305): throughput with the policy's sender \
         signatures on (Ed25519, every receiver verifies) and off, and each as a ratio to plain agreed multicast"
    );
    let header = ["senders", "size", "messages", "plain msg/s", "signed msg/s", "/ plain", "unsigned msg/s", "/ plain"];
    let mut t = crate::table::new(header, 0);
    for r in rows {
        t.add_row(vec![
            r.senders.to_string(),
            r.size.to_string(),
            r.messages.to_string(),
            format!("{:.0}", r.plain_messages_per_s),
            format!("{:.0}", r.signed_messages_per_s),
            super::ratio(r.signed_messages_per_s, Some(r.plain_messages_per_s)),
            format!("{:.0}", r.unsigned_messages_per_s),
            super::ratio(r.unsigned_messages_per_s, Some(r.plain_messages_per_s)),
        ]);
    }
    println!("{t}");
}
