//! Fig. 7 of the integrated-architecture paper: data throughput against
//! message size, per mode, with real clients and sessions in wall-clock time.
//!
//! One sender and `--receivers` receivers are members of one group; the
//! sender keeps a window of its messages in flight (the next goes out when
//! one comes back to it) and the round ends when every member has every
//! message: `bench gcs`'s throughput round. `plaintext` is that round itself
//! ([`crate::flood::round`]: plain `conclave-gcs-net` clients, no session);
//! every other mode runs it through `conclave_secure::Session`s under its
//! policy (`crate::gcs::secure::round`).
//!
//! With churn ([`round`]'s `churn`), one more member joins and leaves the
//! group all through the round (`crate::gcs::secure`), so that the messages
//! in flight at each view change cross it: Integrated VS sends them again,
//! Optimized EVS has its daemons re-encrypt them (the paper's "Optimized
//! EVS with re-encryption"; §5.2 expects it below Integrated VS's line and
//! above Three-Step's when the membership changes).
//!
//! On a cluster the sender sits on the first node and every receiver on the
//! second, so that the sender's messages cross the backbone, where
//! three-step's daemons seal them; on the embedded standalone daemon nothing
//! goes between daemons and three-step seals nothing.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{anyhow, Context, Result};
use conclave_gcs_net::Client;
use conclave_gka::{GroupId, ProtocolId};
use conclave_secure::{GroupMode, Policy};

use crate::flood::{self, Conn, Flood};
use crate::gcs::{secure, FLOOD_BYTES, STEP_LIMIT, WINDOW_BYTES};

/// Fig. 7's modes, in the table's order: the name `--json` gives it and its
/// group policy (`None`: plain group communication clients, no session).
/// A mode is one entry here.
pub fn modes() -> Vec<(&'static str, Option<Policy>)> {
    vec![
        ("plaintext", None),
        ("layered-tgdh", Some(Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255))),
        ("integrated-vs", Some(Policy::integrated())),
        ("three-step", Some(Policy::three_step())),
        ("optimized-evs", Some(Policy::optimized_evs())),
    ]
}

/// One Fig. 7 point.
#[derive(Clone, Debug)]
pub struct Point {
    pub mode: &'static str,
    pub size: usize,
    pub msgs_per_s: f64,
    /// Whether the data carried sender signatures (`None`: no data messages
    /// of the secure layer: plaintext, three-step).
    pub sender_signatures: Option<bool>,
    /// With churn: its period (ms), the secure views the sender delivered
    /// during the round, and the messages it read re-encrypted.
    pub churn: Option<Churned>,
}

/// What churn did to a round.
#[derive(Clone, Copy, Debug)]
pub struct Churned {
    pub period_ms: u64,
    pub views: usize,
    pub reencrypted: u64,
    /// The most messages a member was told were lost (Optimized EVS:
    /// crossed more views than its daemon keeps keys for).
    pub lost: usize,
}

/// How long a round with churn runs at most: Integrated VS, which sends
/// again what crosses a view change, may deliver only a few messages per view
/// when views come every few tens of milliseconds.
pub const CHURN_ROUND: std::time::Duration = std::time::Duration::from_secs(3);

/// The modes Fig. 7 also runs with churn: the two keyed modes, one sending
/// again what crosses a view change, the other re-encrypting it.
pub const CHURNED: [&str; 2] = ["integrated-vs", "optimized-evs"];

impl Point {
    pub fn mb_per_s(&self) -> f64 {
        self.msgs_per_s * self.size as f64 / 1e6
    }
}

/// Messages of a round at `size` (at most `max`, at most
/// [`FLOOD_BYTES`] of payload) and the sender's window (at most
/// [`WINDOW_BYTES`] in flight), as `bench gcs` shapes its floods.
pub fn shape(max: usize, size: usize) -> (usize, usize) {
    ((max.min(FLOOD_BYTES / size.max(1))).max(1), (WINDOW_BYTES / size.max(1)).clamp(1, 2048))
}

/// Runs one round of `mode` at `size` on `sockets` (the sender on the first,
/// the receivers on the last); `tag` names its group and members afresh.
pub async fn round(
    sockets: &[PathBuf],
    (mode, policy): (&'static str, Option<Policy>),
    size: usize,
    receivers: usize,
    max_messages: usize,
    tag: &str,
    churn: Option<std::time::Duration>,
) -> Result<Point> {
    let (messages, window) = shape(max_messages, size);
    // With churn, what is in flight at a view change arrives before the new
    // key is confirmed, and every receiver holds it meanwhile, within a
    // bound per sender: keep the window to half of it.
    let window = match churn {
        Some(_) => window.min((conclave_secure::core::MAX_HELD_BYTES_PER_SENDER / 2 / size.max(1)).max(1)),
        None => window,
    };
    let placed: Vec<PathBuf> = match sockets {
        [] => return Err(anyhow!("no daemon to send through")),
        [one] => vec![one.clone()],
        [first, .., last] => vec![first.clone(), last.clone()],
    };
    let churned = if churn.is_some() { "-churn" } else { "" };
    let group = format!("fig7-{tag}-{mode}-{size}{churned}");
    let (msgs_per_s, churn) = match (policy, churn) {
        (None, Some(_)) => return Err(anyhow!("the plaintext round has no churn")),
        (None, None) => (plain(&placed, &group, size, receivers, messages, window).await?, None),
        (Some(policy), churn) => {
            let f = secure::SecureFlood {
                sockets: &placed,
                group: group.clone(),
                receivers: receivers + 1,
                senders: 1,
                per_sender: messages,
                size,
                window,
                policy,
                churn,
                deadline: churn.map(|_| CHURN_ROUND),
            };
            let o = secure::round(&f).await?;
            let churned = churn.map(|period| Churned {
                period_ms: period.as_millis() as u64,
                views: o.views,
                reencrypted: o.reencrypted,
                lost: o.lost,
            });
            (o.msgs_per_s, churned)
        }
    };
    let sender_signatures = policy.filter(|p| p.mode != GroupMode::ThreeStep).map(|p| p.sender_signatures);
    Ok(Point { mode, size, msgs_per_s, sender_signatures, churn })
}

/// The plain round: `bench gcs`'s flood with one sender.
async fn plain(
    sockets: &[PathBuf],
    group: &str,
    size: usize,
    receivers: usize,
    messages: usize,
    window: usize,
) -> Result<f64> {
    let names: Vec<String> = (0..=receivers).map(|i| format!("{group}-{i}")).collect();
    let mut conns = Vec::with_capacity(names.len());
    for (i, name) in names.iter().enumerate() {
        let socket = &sockets[i.min(sockets.len() - 1)];
        let mut c = tokio::time::timeout(STEP_LIMIT, Client::connect_unix(socket, name))
            .await
            .map_err(|_| anyhow!("connecting {name} timed out"))?
            .with_context(|| format!("cannot connect to the daemon at {} as {name}", socket.display()))?;
        c.set_max_payload(64 << 20);
        c.join(group).await?;
        let (tx, rx) = c.split();
        conns.push(Conn { tx, rx: Some(rx) });
    }
    let ours: Arc<HashSet<String>> = Arc::new(names.into_iter().collect());
    for c in &mut conns {
        flood::wait_for_all(c.rx.as_mut().expect("receiver"), group, &ours).await?;
    }
    let f = Flood { group, senders: 1, count: messages, size: size.max(flood::HEADER), window };
    let row = tokio::time::timeout(STEP_LIMIT, flood::round(&mut conns, &ours, &f, Instant::now()))
        .await
        .map_err(|_| anyhow!("the plain round in {group} stalled"))??;
    for c in &conns {
        let _ = c.tx.bye().await;
    }
    Ok(row.sent as f64 / row.elapsed.as_secs_f64().max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_moves_data_on_an_embedded_daemon() {
        let target = crate::live::Target::start(None, crate::scenario::Wan::Lan, &mut Vec::new()).unwrap();
        let points = target
            .run(|sockets, tag| async move {
                let mut out = Vec::new();
                for m in modes() {
                    out.push(round(&sockets, m, 256, 1, 50, &tag.to_string(), None).await?);
                }
                Ok(out)
            })
            .unwrap();
        assert_eq!(points.len(), modes().len());
        for p in &points {
            assert!(p.msgs_per_s > 0.0, "{p:?}");
        }
    }

    /// With a member joining and leaving every 20 ms, an Optimized EVS round
    /// crosses view changes: messages come back re-encrypted or, having
    /// crossed more views than the daemon keeps keys for, reported lost, and
    /// every receiver accounts for each message once (the round counts them
    /// and fails on any other refusal). What re-encryption does is tested in
    /// `conclave-secure`'s `tests/evs.rs`; this is the benchmark's churn.
    #[test]
    fn an_optimized_evs_round_with_churn_crosses_view_changes() {
        let target = crate::live::Target::start(None, crate::scenario::Wan::Lan, &mut Vec::new()).unwrap();
        let mode = modes().into_iter().find(|m| m.0 == "optimized-evs").unwrap();
        // Bundled, a round of a few thousand messages may end before the
        // churning member's first join: a few rounds, until one crossed.
        let churn = Some(std::time::Duration::from_millis(2));
        let mut rounds = Vec::new();
        for attempt in 0..5 {
            let p = target
                .run(|sockets, tag| async move {
                    round(&sockets, mode, 256, 2, 20_000, &format!("{tag}-{attempt}"), churn).await
                })
                .unwrap();
            let c = p.churn.expect("churned");
            if c.reencrypted + c.lost as u64 > 0 {
                return;
            }
            rounds.push(p);
        }
        panic!("no round crossed a view change: {rounds:?}");
    }
}
