//! `conclave flood`: a load generator in the manner of Spread's spflooder.
//! K connections join one group; each sends N agreed messages while all of
//! them receive everything. Every payload carries its send time, so each
//! receiving sender measures the delivery latency of every message.
//!
//! The measuring round ([`conclave_bench::flood::round`]) is shared with
//! `conclave bench gcs`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::Args;
use conclave_bench::flood::{round, wait_for_all, Conn, Flood, Row, HEADER};

use crate::client::Endpoint;

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
    /// [default: 2048 / K, and at most 16 MiB in flight from all senders together, so that no receiver's queue at
    /// the daemon overflows its byte budget (queue_bytes, 64 MiB by default)].
    #[arg(long, value_name = "N")]
    window: Option<usize>,
    /// Print each row as one JSON object per line (size, senders, messages, seconds, msg_per_s, mb_per_s, p50_ms,
    /// p99_ms, max_ms) instead of the table.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    endpoint: Endpoint,
}

/// Prints `row` as a line of the table, or as one JSON object.
fn print_row(row: &Row, senders: usize, json: bool) {
    let secs = row.elapsed.as_secs_f64().max(1e-9);
    if json {
        let out = serde_json::json!({
            "size": row.size,
            "senders": senders,
            "messages": row.sent,
            "seconds": secs,
            "msg_per_s": row.sent as f64 / secs,
            "mb_per_s": (row.sent * row.size) as f64 / secs / 1e6,
            "p50_ms": row.percentile(0.5),
            "p99_ms": row.percentile(0.99),
            "max_ms": row.percentile(1.0),
        });
        println!("{out}");
        return;
    }
    println!(
        "{:>8} {:>8} {:>10} {:>9.3} {:>11.0} {:>9.2} {:>9.3} {:>9.3} {:>9.3}",
        row.size,
        senders,
        row.sent,
        secs,
        row.sent as f64 / secs,
        (row.sent * row.size) as f64 / secs / 1e6,
        row.percentile(0.5),
        row.percentile(0.99),
        row.percentile(1.0),
    );
}

fn header() {
    println!(
        "{:>8} {:>8} {:>10} {:>9} {:>11} {:>9} {:>9} {:>9} {:>9}",
        "size", "senders", "messages", "seconds", "msg/s", "MB/s", "p50 ms", "p99 ms", "max ms"
    );
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
    crate::block_on(flood(args, sizes))
}

/// Most payload bytes all senders together keep in flight by default: a
/// receiver's queue at the daemon holds what is in flight, and the daemon
/// disconnects a client whose queue passes its byte budget (`queue_bytes`,
/// 64 MiB by default), so a quarter of it leaves room for a slow reader.
const IN_FLIGHT_BYTES: usize = 16 << 20;

/// The window per sender for `size`-byte messages: `--window`, or the
/// default (2048 messages from all senders, and at most [`IN_FLIGHT_BYTES`]).
fn window_for(args: &FloodArgs, size: usize) -> usize {
    args.window.unwrap_or_else(|| (2048 / args.senders).min(IN_FLIGHT_BYTES / (args.senders * size.max(1)))).max(1)
}

async fn flood(args: FloodArgs, sizes: Vec<usize>) -> Result<()> {
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
    let windows: Vec<String> = sizes.iter().map(|&size| window_for(&args, size).to_string()).collect();
    eprintln!(
        "{} sender(s) in group {}, {} messages each, window {} (messages in flight per sender{})",
        args.senders,
        args.group,
        args.count,
        windows.join(", "),
        if sizes.len() > 1 { ", by size" } else { "" }
    );
    if !args.json {
        header();
    }
    let epoch = Instant::now();
    for &size in &sizes {
        let window = window_for(&args, size);
        let flood = Flood { group: &args.group, senders: args.senders, count: args.count, size, window };
        let row = tokio::time::timeout(ROUND_LIMIT, round(&mut conns, &ours, &flood, epoch))
            .await
            .map_err(|_| anyhow!("the flood stalled: a round took longer than {ROUND_LIMIT:?}"))??;
        print_row(&row, args.senders, args.json);
    }
    for c in &conns {
        let _ = c.tx.bye().await;
    }
    Ok(())
}
