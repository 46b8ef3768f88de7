//! `conclave flood`: a load generator in the manner of Spread's spflooder.
//! K connections join one group; each sends N agreed messages while all of
//! them receive everything. Every payload carries its send time, so each
//! receiving sender measures the delivery latency of every message.
//!
//! The measuring round ([`round`]) is shared with `conclave bench gcs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, BytesMut};
use clap::Args;
use conclave_gcs_net::{ClientReceiver, ClientSender, Event, Service};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::client::Endpoint;

/// Bytes at the start of every payload: send time, sender, sequence number.
pub(crate) const HEADER: usize = 16;

/// Longest a round may take before the flood is declared stalled.
const ROUND_LIMIT: Duration = Duration::from_secs(300);

/// Options of `conclave flood`.
#[derive(Args, Debug)]
#[command(after_help = "msg/s and MB/s count messages (payload bytes) sent per second by all senders together; \
every message is delivered to all senders. Latency is from send to delivery, measured at every receiving sender.")]
pub struct FloodArgs {
    /// Name prefix of the connections: NAME-1 ... NAME-K [default: flood-PID].
    #[arg(long)]
    name: Option<String>,
    /// Group to flood.
    #[arg(long, default_value = "flood")]
    group: String,
    /// Messages each sender sends (per size).
    #[arg(long, default_value_t = 10_000)]
    count: usize,
    /// Payload size in bytes (at least 16).
    #[arg(long, default_value_t = 1024, value_name = "BYTES")]
    size: usize,
    /// Sweep: comma-separated payload sizes, one table row each (e.g. 64,1024,65536).
    #[arg(long, value_delimiter = ',', value_name = "BYTES,...", conflicts_with = "size")]
    sizes: Vec<usize>,
    /// Number of sending (and receiving) connections.
    #[arg(long, default_value_t = 1, value_name = "K")]
    senders: usize,
    /// Messages each sender may have in flight (sent, not yet delivered back to it)
    /// [default: 2048 / K, so that no receiver's queue at the daemon overflows].
    #[arg(long, value_name = "N")]
    window: Option<usize>,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// What one round measured.
pub(crate) struct Row {
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

    fn print(&self, senders: usize) {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        println!(
            "{:>8} {:>8} {:>10} {:>9.3} {:>11.0} {:>9.2} {:>9.3} {:>9.3} {:>9.3}",
            self.size,
            senders,
            self.sent,
            secs,
            self.sent as f64 / secs,
            (self.sent * self.size) as f64 / secs / 1e6,
            self.percentile(0.5),
            self.percentile(0.99),
            self.percentile(1.0),
        );
    }
}

fn header() {
    println!(
        "{:>8} {:>8} {:>10} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "size", "senders", "messages", "seconds", "msg/s", "MB/s", "p50 ms", "p99 ms", "max ms"
    );
}

/// A connection of a flood: its receiver is lent to a round's task while
/// the round runs.
pub(crate) struct Conn {
    /// The sending half.
    pub tx: ClientSender,
    /// The receiving half, `None` only during a round.
    pub rx: Option<ClientReceiver>,
}

/// Runs the flood.
pub fn run(args: FloodArgs) -> Result<()> {
    let sizes = if args.sizes.is_empty() { vec![args.size] } else { args.sizes.clone() };
    if let Some(s) = sizes.iter().find(|&&s| s < HEADER) {
        bail!("--size {s} is too small: payloads carry a {HEADER}-byte header");
    }
    if args.senders == 0 || args.count == 0 {
        bail!("--senders and --count must be at least 1");
    }
    let window = args.window.unwrap_or((2048 / args.senders).max(1)).max(1);
    crate::block_on(flood(args, sizes, window))
}

async fn flood(args: FloodArgs, sizes: Vec<usize>, window: usize) -> Result<()> {
    let prefix = args.name.clone().unwrap_or_else(|| format!("flood-{}", std::process::id()));
    let names: Vec<String> = (1..=args.senders).map(|i| format!("{prefix}-{i}")).collect();
    let max_size = sizes.iter().copied().max().unwrap_or(0);
    let mut conns = Vec::new();
    for name in &names {
        let mut c = args.endpoint.connect(name).await?;
        c.set_max_payload(max_size);
        c.join(&args.group).await?;
        let (tx, rx) = c.split();
        conns.push(Conn { tx, rx: Some(rx) });
    }
    let ours: Arc<HashSet<String>> = Arc::new(names.iter().cloned().collect());
    for c in &mut conns {
        wait_for_all(c.rx.as_mut().expect("receiver"), &args.group, &ours).await?;
    }
    eprintln!("{} sender(s) in group {}, {} messages each, window {window}", args.senders, args.group, args.count);
    header();
    let epoch = Instant::now();
    for &size in &sizes {
        let flood = Flood { group: &args.group, senders: args.senders, count: args.count, size, window };
        let row = tokio::time::timeout(ROUND_LIMIT, round(&mut conns, &ours, &flood, epoch))
            .await
            .map_err(|_| anyhow!("the flood stalled: a round took longer than {ROUND_LIMIT:?}"))??;
        row.print(args.senders);
    }
    for c in &conns {
        let _ = c.tx.bye().await;
    }
    Ok(())
}

/// Receives until a view of `group` holds every flood connection.
pub(crate) async fn wait_for_all(rx: &mut ClientReceiver, group: &str, ours: &HashSet<String>) -> Result<()> {
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
pub(crate) struct Flood<'a> {
    /// The group every connection is a member of.
    pub group: &'a str,
    /// The first `senders` connections send; all of them receive.
    pub senders: usize,
    /// Messages each sender sends.
    pub count: usize,
    /// Payload size in bytes (at least [`HEADER`]).
    pub size: usize,
    /// Messages a sender may have in flight (sent, not yet delivered back to it).
    pub window: usize,
}

/// Runs one round: the senders send `count` agreed messages each, every
/// connection receives all of them, and every receiver measures each
/// message's latency from its send time (relative to `epoch`).
pub(crate) async fn round(
    conns: &mut [Conn],
    ours: &Arc<HashSet<String>>,
    flood: &Flood<'_>,
    epoch: Instant,
) -> Result<Row> {
    let (n, size, window) = (flood.count, flood.size, flood.window);
    let expected = flood.senders * n;
    let start = Instant::now();
    let mut tasks: JoinSet<Result<Option<Received>>> = JoinSet::new();
    for (i, c) in conns.iter_mut().enumerate() {
        let credit = Arc::new(Semaphore::new(window));
        if i < flood.senders {
            let tx = c.tx.clone();
            let group = flood.group.to_string();
            let sender_credit = credit.clone();
            tasks.spawn(async move {
                for seq in 0..n {
                    sender_credit.acquire().await.context("credit")?.forget();
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
                        latencies.push((epoch.elapsed().as_nanos() as u64).saturating_sub(sent));
                        if from == i {
                            credit.add_permits(1);
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
