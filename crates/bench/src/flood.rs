//! The measuring round of a flood, shared by `conclave flood` (a load
//! generator in the manner of Spread's spflooder) and `conclave bench gcs`:
//! K connections are members of one group; each sender sends N agreed
//! messages while all of them receive everything. Every payload carries its
//! send time, so each receiving connection measures the delivery latency of
//! every message.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, BytesMut};
use conclave_gcs_net::{ClientReceiver, ClientSender, Event, Service};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Bytes at the start of every payload: send time, sender, sequence number.
pub const HEADER: usize = 16;

/// What one round measured.
pub struct Row {
    /// Payload size in bytes.
    pub size: usize,
    /// Messages sent by all senders together.
    pub sent: usize,
    /// From the first send until the last receiver had every message.
    pub elapsed: Duration,
    /// Send-to-delivery latencies at every receiver, in nanoseconds, sorted.
    pub latencies: Vec<u64>,
}

impl Row {
    /// The latency at quantile `p` (0 to 1), in milliseconds.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return 0.0;
        }
        let i = ((self.latencies.len() - 1) as f64 * p).round() as usize;
        self.latencies[i] as f64 / 1e6
    }
}

/// A connection of a flood: its receiver is lent to a round's task while
/// the round runs.
pub struct Conn {
    /// The sending half.
    pub tx: ClientSender,
    /// The receiving half, `None` only during a round.
    pub rx: Option<ClientReceiver>,
}

/// Receives until a view of `group` holds every flood connection.
pub async fn wait_for_all(rx: &mut ClientReceiver, group: &str, ours: &HashSet<String>) -> Result<()> {
    let wait = async {
        loop {
            match rx.recv().await? {
                Event::View { group: g, view }
                    if g.as_str() == group && ours.iter().all(|n| view.ids().any(|m| m.as_str() == n)) =>
                {
                    return Ok(());
                }
                Event::Error { code, text } => bail!("the daemon refused ({code:?}): {text}"),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .map_err(|_| anyhow!("timed out waiting for all senders to join {group}"))?
}

type Received = (usize, ClientReceiver, Vec<u64>, Instant);

/// One round of a flood.
pub struct Flood<'a> {
    /// The group every connection is a member of.
    pub group: &'a str,
    /// The first `senders` connections send; all of them receive.
    pub senders: usize,
    /// Messages each sender sends.
    pub count: usize,
    /// Payload size in bytes (at least [`HEADER`]).
    pub size: usize,
    /// Messages a sender may have in flight: sent, and not yet delivered to
    /// every connection. (Counting only the sender's own copy let a slow
    /// receiver fall further and further behind, until the daemon cut it
    /// off for not reading: `bench gcs --count 60000` with 4 senders.)
    pub window: usize,
}

/// Runs one round: the senders send `count` agreed messages each, every
/// connection receives all of them, and every receiver measures each
/// message's latency from its send time (relative to `epoch`).
pub async fn round(conns: &mut [Conn], ours: &Arc<HashSet<String>>, flood: &Flood<'_>, epoch: Instant) -> Result<Row> {
    let (n, size, window) = (flood.count, flood.size, flood.window);
    let expected = flood.senders * n;
    let start = Instant::now();
    let mut tasks: JoinSet<Result<Option<Received>>> = JoinSet::new();
    // A sender's credit comes back when the last connection has its message:
    // per sender, how many connections have each message in flight (slot
    // `seq % window`: at most `window` are in flight, so a slot is free
    // again before it is reused).
    let receivers = conns.len();
    let credits: Arc<Vec<Semaphore>> = Arc::new((0..flood.senders).map(|_| Semaphore::new(window)).collect());
    let arrived: Arc<Vec<Vec<AtomicUsize>>> =
        Arc::new((0..flood.senders).map(|_| (0..window).map(|_| AtomicUsize::new(0)).collect()).collect());
    for (i, c) in conns.iter_mut().enumerate() {
        if i < flood.senders {
            let tx = c.tx.clone();
            let group = flood.group.to_string();
            let credits = credits.clone();
            tasks.spawn(async move {
                for seq in 0..n {
                    credits[i].acquire().await.context("credit")?.forget();
                    let mut p = BytesMut::with_capacity(size);
                    p.put_u64(epoch.elapsed().as_nanos() as u64);
                    p.put_u32(i as u32);
                    p.put_u32(seq as u32);
                    p.resize(size, 0);
                    tx.multicast(&group, Service::Agreed, p.freeze()).await.context("sending")?;
                }
                Ok(None)
            });
        }
        let mut rx = c.rx.take().expect("receiver");
        let group = flood.group.to_string();
        let ours = ours.clone();
        let (credits, arrived) = (credits.clone(), arrived.clone());
        tasks.spawn(async move {
            let mut latencies = Vec::with_capacity(expected);
            let mut got = 0;
            while got < expected {
                match rx.recv().await.context("receiving")? {
                    Event::Message { group: g, sender, mut payload, .. }
                        if g.as_str() == group && ours.contains(sender.as_str()) && payload.len() >= HEADER =>
                    {
                        let sent = payload.get_u64();
                        let from = payload.get_u32() as usize;
                        let seq = payload.get_u32() as usize;
                        latencies.push((epoch.elapsed().as_nanos() as u64).saturating_sub(sent));
                        if let Some(slot) = arrived.get(from).map(|a| &a[seq % window]) {
                            if slot.fetch_add(1, Ordering::AcqRel) + 1 == receivers {
                                slot.store(0, Ordering::Release);
                                credits[from].add_permits(1);
                            }
                        }
                        got += 1;
                    }
                    Event::Error { code, text } => bail!("error from the daemon ({code:?}): {text}"),
                    _ => {}
                }
            }
            Ok(Some((i, rx, latencies, Instant::now())))
        });
    }
    let mut latencies = Vec::with_capacity(expected * conns.len());
    let mut end = start;
    while let Some(r) = tasks.join_next().await {
        match r.context("flood task")? {
            Ok(Some((i, rx, lat, done))) => {
                conns[i].rx = Some(rx);
                latencies.extend(lat);
                end = end.max(done);
            }
            Ok(None) => {}
            Err(e) => {
                tasks.abort_all();
                return Err(e);
            }
        }
    }
    latencies.sort_unstable();
    Ok(Row { size, sent: expected, elapsed: end - start, latencies })
}
