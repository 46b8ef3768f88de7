//! Secure data through the same daemon: the throughput round of the agreed
//! multicast table, sent through `conclave_secure::Session`s (a group key,
//! AES-256-GCM per sender) with the group policy's sender signatures
//! on (the default: Ed25519, one signature per message, every receiver
//! verifies it) and off, each against the plain round's messages per second
//! on the same daemon and point.
//!
//! Every member runs in a task of its own; senders keep a window of their
//! own messages in flight (the next goes out when one comes back, as in the
//! plain round) and the round ends when every member has every message.
//! With [`SecureFlood::churn`], one more member joins and leaves the group
//! all through the round, so that the messages in flight at each view
//! change cross it (Fig. 7 of the integrated architecture's paper, Optimized
//! EVS "with re-encryption").

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use conclave_gka::suite::{generate_signer, SignatureId};
use conclave_gka::StaticDirectory;
use conclave_secure::{MemberId, Policy, RejectReason, SecureEvent, Session};
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
    /// One more member (on the last socket, counted nowhere) joins the group
    /// and leaves it again, waiting this long after each, from the start of
    /// the round to its end: two view changes per cycle.
    pub churn: Option<Duration>,
    /// The round ends this long after it started if not every member has
    /// every message by then (under churn a mode may crawl: Integrated VS
    /// sends again whatever crosses a view change); the rate is then what
    /// the member that got fewest got, per second.
    pub deadline: Option<Duration>,
}

/// What one round measured.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    /// Messages (of all senders) per second: the fewest any member got over
    /// the longest any member took (all of them, unless the deadline came).
    pub msgs_per_s: f64,
    /// Secure views the first sender delivered during the round (churn).
    pub views: usize,
    /// Optimized EVS: messages the first sender read re-encrypted by its
    /// daemon (its own that crossed a view change among them).
    pub reencrypted: u64,
    /// Under churn: the most messages a member was told were lost
    /// (Optimized EVS: `KeyGone`, `CutShort`).
    pub lost: usize,
}

/// Runs one round.
pub async fn round(f: &SecureFlood<'_>) -> Result<Outcome> {
    let mut rng = ChaCha20Rng::seed_from_u64(f.receivers as u64);
    let mut directory = StaticDirectory::new();
    let mut members = Vec::with_capacity(f.receivers);
    for i in 0..f.receivers {
        let name = format!("{}-{i}", f.group);
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).map_err(|e| anyhow!("{e}"))?;
        directory.insert(MemberId::new(name.clone())?, signer.verifier());
        members.push((name, signer));
    }
    let churner = format!("{}-churn", f.group);
    let churner_signer = generate_signer(SignatureId::Ed25519, &mut rng).map_err(|e| anyhow!("{e}"))?;
    directory.insert(MemberId::new(churner.clone())?, churner_signer.verifier());
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
    let (churning, deadline) = (f.churn.is_some(), f.deadline);
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
            let (mut sent, mut own_back, mut got, mut lost, mut views) = (0, 0, 0, 0, 0);
            while sent < to_send.min(window) {
                s.send(&group, &payload)?;
                sent += 1;
            }
            let end = deadline.map(|d| tokio::time::Instant::from_std(start + d));
            while got + lost < total {
                let event = match end {
                    Some(end) => match tokio::time::timeout_at(end, s.recv()).await {
                        Ok(event) => event?,
                        Err(_) => break,
                    },
                    None => s.recv().await?,
                };
                // How many of this member's own messages the event accounts for.
                let mine = match event {
                    SecureEvent::Message { sender, .. } => {
                        got += 1;
                        usize::from(&sender == s.me())
                    }
                    // Under churn, Optimized EVS may lose a bundle that
                    // crossed more views than its daemon keeps keys for
                    // (key-out), and says so: its messages are counted, in
                    // their place.
                    SecureEvent::Rejected {
                        sender,
                        reason: RejectReason::KeyGone { messages, .. } | RejectReason::CutShort { messages, .. },
                        ..
                    } if churning => {
                        lost += messages as usize;
                        if &sender == s.me() {
                            messages as usize
                        } else {
                            0
                        }
                    }
                    SecureEvent::View(_) if churning => {
                        views += 1;
                        0
                    }
                    SecureEvent::View(v) => bail!("the view changed during the round: {}", v.epoch),
                    SecureEvent::Rejected { sender, reason, .. } => {
                        bail!("a message from {sender} was rejected: {reason}")
                    }
                    _ => 0,
                };
                own_back += mine;
                while mine > 0 && sent < to_send && sent - own_back < window {
                    s.send(&group, &payload)?;
                    sent += 1;
                }
            }
            let elapsed = start.elapsed();
            let reencrypted = s.reencrypted(&group);
            let _ = s.leave(&group);
            Ok::<_, anyhow::Error>((i, elapsed, got, lost, views, reencrypted))
        });
    }
    tokio::time::timeout(STEP_LIMIT, barrier.wait())
        .await
        .map_err(|_| anyhow!("the secure group {} never formed", f.group))?;
    let stop = Arc::new(AtomicBool::new(false));
    let churn = match f.churn {
        Some(period) => {
            let socket = &f.sockets[last];
            let s = Session::connect_unix(socket, &churner, churner_signer, directory.clone())
                .await
                .with_context(|| format!("cannot connect {churner} to {}", socket.display()))?;
            Some(tokio::spawn(churn_loop(s, f.group.clone(), policy, period, stop.clone())))
        }
        None => None,
    };
    let mut slowest = Duration::ZERO;
    let mut fewest = total;
    let mut most_lost = 0;
    let (mut views, mut reencrypted) = (0, 0);
    let all = async {
        while let Some(r) = tasks.join_next().await {
            let (i, elapsed, got, lost, v, re) = r.context("a member task failed")??;
            slowest = slowest.max(elapsed);
            fewest = fewest.min(got);
            most_lost = most_lost.max(lost);
            if i == 0 {
                (views, reencrypted) = (v, re);
            }
        }
        Ok::<(), anyhow::Error>(())
    };
    let res = tokio::time::timeout(STEP_LIMIT, all).await;
    stop.store(true, Ordering::Relaxed);
    if let Some(churn) = churn {
        churn.await.context("the churning member's task failed")??;
    }
    res.map_err(|_| anyhow!("the secure round in {} stalled", f.group))??;
    Ok(Outcome { msgs_per_s: fewest as f64 / slowest.as_secs_f64().max(1e-9), views, reencrypted, lost: most_lost })
}

/// The churning member of a round: joins, waits `period`, leaves, waits for
/// its leave to be done and `period` more, until `stop`; reads (and drops)
/// what it is sent all the while.
async fn churn_loop(
    mut s: Session,
    group: String,
    policy: Policy,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    while !stop.load(Ordering::Relaxed) {
        s.join(&group, policy)?;
        idle(&mut s, Instant::now() + period, true).await?;
        s.leave(&group)?;
        idle(&mut s, Instant::now() + period, false).await?;
    }
    Ok(())
}

/// Reads (and drops) what `s` is sent until `until` and, unless `left`,
/// until its leave is done (within [`STEP_LIMIT`] more).
async fn idle(s: &mut Session, until: Instant, mut left: bool) -> Result<()> {
    let deadline = until + STEP_LIMIT;
    loop {
        let now = Instant::now();
        if now >= until && left {
            return Ok(());
        }
        if now >= deadline {
            bail!("the churning member's leave never completed");
        }
        let wait = if now < until { until - now } else { deadline - now };
        if let Ok(event) = tokio::time::timeout(wait, s.recv()).await {
            left |= matches!(event?, SecureEvent::Left { .. });
        }
    }
}

/// Prints the table.
pub fn print(rows: &[SecureRow]) {
    println!(
        "secure data through the same daemon (TGDH key, AES-256-GCM): throughput with the policy's sender \
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
