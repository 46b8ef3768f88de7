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
}

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
) -> Result<Point> {
    let (messages, window) = shape(max_messages, size);
    let placed: Vec<PathBuf> = match sockets {
        [] => return Err(anyhow!("no daemon to send through")),
        [one] => vec![one.clone()],
        [first, .., last] => vec![first.clone(), last.clone()],
    };
    let group = format!("fig7-{tag}-{mode}-{size}");
    let msgs_per_s = match policy {
        None => plain(&placed, &group, size, receivers, messages, window).await?,
        Some(policy) => {
            let f = secure::SecureFlood {
                sockets: &placed,
                group: group.clone(),
                receivers: receivers + 1,
                senders: 1,
                per_sender: messages,
                size,
                window,
                policy,
            };
            secure::round(&f).await?
        }
    };
    let sender_signatures = policy.filter(|p| p.mode != GroupMode::ThreeStep).map(|p| p.sender_signatures);
    Ok(Point { mode, size, msgs_per_s, sender_signatures })
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
                    out.push(round(&sockets, m, 256, 1, 50, &tag.to_string()).await?);
                }
                Ok(out)
            })
            .unwrap();
        assert_eq!(points.len(), modes().len());
        for p in &points {
            assert!(p.msgs_per_s > 0.0, "{p:?}");
        }
    }
}
