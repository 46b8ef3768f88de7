//! `conclave sim`: the secure stack from seeds (see `conclave_secure::sim`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use conclave_secure::sim::{run as run_seed, Outcome, SimConfig};
use conclave_secure::{GroupMode, IntervalAlgorithm, ProtocolId};
use sha2::{Digest, Sha256};

/// Runs real secure sessions on real daemon cores over a simulated network
/// (latency, jitter, loss), in virtual time, from seeds: members join, leave,
/// send and crash, the daemons split into components and merge, a daemon
/// crashes and restarts, and an attacker replays, re-attributes and tampers
/// with what it recorded (on the members' connections; for three-step groups,
/// whose members trust their daemons, on the daemons' sealed backbone, which
/// must also carry nothing in clear). The run checks that no forged input is accepted,
/// no key splits or repeats, no message is lost, duplicated or
/// misattributed, members that move together delivered the same messages
/// (virtual synchrony), and, once everything is merged again, nobody is
/// stuck. A failing seed is printed with the command that replays it; the
/// exit status is then 1.
#[derive(Args, Debug)]
pub struct SimArgs {
    /// How many seeds to run per protocol.
    #[arg(long, default_value_t = 200)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Protocols, comma-separated: gdh, ckd, tgdh, str, bd (rekeyed on every view), SEAL's interval
    /// rekeying rebuild, batch, queue-batch (TGDH, rekeyed every 50 ms of virtual time),
    /// integrated-vs (the daemons agree a key with TGDH and key every view), three-step (no
    /// group key; the daemons seal everything between them under their key), and optimized-evs
    /// (keyed like integrated-vs; each message is sent once and the daemons re-encrypt it, or
    /// deliver a notice in its place, when it is delivered in a later view).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "gdh,ckd,tgdh,str,bd,rebuild,batch,queue-batch,integrated-vs,three-step,optimized-evs"
    )]
    protocols: Vec<String>,
    /// Member names per run (each comes and goes as the seed says).
    #[arg(long, default_value_t = 5)]
    members: usize,
    /// Actions per run before everything merges and settles.
    #[arg(long, default_value_t = 40)]
    steps: usize,
    /// Daemons per run (1 runs every member on one daemon, without partitions).
    #[arg(long, default_value_t = 3)]
    daemons: u16,
    /// Print every action and event of each run to stderr (for replaying one seed).
    #[arg(long)]
    trace: bool,
    /// Print one JSON array (one object per protocol) instead of a table.
    #[arg(long)]
    json: bool,
    /// Run every seed uncertified. By default every other seed (as the seed
    /// draws) runs in certified mode: members present certificates of one
    /// authority, and admission runs through the same faults and attacks.
    #[arg(long)]
    uncertified: bool,
}

struct Totals {
    protocol: Scheme,
    runs: u64,
    certified: u64,
    views: u64,
    rekeys: u64,
    messages: u64,
    notices: u64,
    attacks: u64,
    reconfigurations: u64,
    crashes: u64,
    failures: std::collections::BTreeMap<&'static str, u64>,
    first_failure: Option<(u64, &'static str, String)>,
    secs: f64,
    trace: String,
}

/// A protocol rekeyed on every view, SEAL's interval rekeying (both with
/// the members agreeing keys), or one of the integrated architecture's
/// modes: groups keyed by their daemons (Integrated VS, Optimized EVS), or
/// three-step groups (no key; the daemons seal their backbone).
#[derive(Clone, Copy)]
struct Scheme {
    protocol: ProtocolId,
    interval: Option<IntervalAlgorithm>,
    mode: GroupMode,
}

impl Scheme {
    fn parse(s: &str) -> anyhow::Result<Self> {
        let plain = Scheme { protocol: ProtocolId::Tgdh, interval: None, mode: GroupMode::Members };
        let integrated = [GroupMode::Keyed, GroupMode::ThreeStep, GroupMode::OptimizedEvs];
        if let Some(mode) = integrated.into_iter().find(|m| Self { mode: *m, ..plain }.name() == s) {
            return Ok(Scheme { mode, ..plain });
        }
        if let Some(protocol) = ProtocolId::from_name(s) {
            return Ok(Scheme { protocol, ..plain });
        }
        let algorithm = IntervalAlgorithm::from_name(s).with_context(|| {
            format!(
                "unknown protocol {s:?} (gdh, ckd, tgdh, str, bd; rebuild, batch, queue-batch; integrated-vs, \
                 three-step or optimized-evs)"
            )
        })?;
        Ok(Scheme { interval: Some(algorithm), ..plain })
    }

    fn name(&self) -> &'static str {
        match self.mode {
            GroupMode::Keyed => "integrated-vs",
            GroupMode::ThreeStep => "three-step",
            GroupMode::OptimizedEvs => "optimized-evs",
            GroupMode::Members => self.interval.map_or(self.protocol.name(), |a| a.name()),
        }
    }
}

pub fn run(args: SimArgs) -> anyhow::Result<()> {
    let protocols = args.protocols.iter().map(|p| Scheme::parse(p)).collect::<anyhow::Result<Vec<_>>>()?;
    if args.members < 2 || args.members > conclave_secure::sim::MAX_MEMBERS {
        bail!("--members must be between 2 and {}", conclave_secure::sim::MAX_MEMBERS);
    }
    if args.daemons < 1 || args.daemons > 16 {
        bail!("--daemons must be between 1 and 16");
    }
    if args.trace {
        // The sessions' and daemons' own debug logs, interleaved with the trace.
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_max_level(tracing::Level::DEBUG)
            .without_time()
            .with_target(false)
            .try_init();
    }
    let mut all = Vec::new();
    for protocol in protocols {
        let cfg = SimConfig {
            protocol: protocol.protocol,
            interval: protocol.interval,
            mode: protocol.mode,
            members: args.members,
            steps: args.steps,
            daemons: args.daemons,
            print: args.trace,
            certified: !args.uncertified,
        };
        let start = Instant::now();
        let outcomes = run_seeds(&args, cfg, protocol.name());
        let secs = start.elapsed().as_secs_f64();
        let mut t = Totals {
            protocol,
            runs: args.seeds,
            certified: 0,
            views: 0,
            rekeys: 0,
            messages: 0,
            notices: 0,
            attacks: 0,
            reconfigurations: 0,
            crashes: 0,
            failures: Default::default(),
            first_failure: None,
            secs,
            trace: String::new(),
        };
        let mut trace = Sha256::new();
        for (seed, o) in outcomes {
            t.certified += u64::from(o.certified);
            t.views += o.views;
            t.rekeys += o.rekeys;
            t.messages += o.messages;
            t.notices += o.notices;
            t.attacks += o.attacks;
            t.reconfigurations += o.reconfigurations;
            t.crashes += o.crashes;
            trace.update(o.trace_hash);
            for (kind, (n, what)) in o.failures {
                *t.failures.entry(kind).or_default() += n;
                t.first_failure.get_or_insert((seed, kind, what));
            }
        }
        t.trace = trace.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
        if !args.json {
            eprintln!("{}: {} seeds in {secs:.1} s", protocol.name(), args.seeds);
        }
        all.push(t);
    }
    if args.json {
        let rows: Vec<serde_json::Value> = all
            .iter()
            .map(|t| {
                serde_json::json!({
                    "protocol": t.protocol.name(),
                    "runs": t.runs,
                    "certified_runs": t.certified,
                    "views": t.views,
                    "rekeys": t.rekeys,
                    "messages": t.messages,
                    "notices": t.notices,
                    "attacks": t.attacks,
                    "reconfigurations": t.reconfigurations,
                    "daemon_crashes": t.crashes,
                    "failures": t.failures,
                    "runs_per_s": t.runs as f64 / t.secs,
                    "trace_hash": t.trace,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        let header = [
            "protocol", "runs", "cert", "views", "rekeys", "messages", "notices", "attacks", "reconf", "crashes",
            "runs/s", "trace", "failures",
        ];
        let mut table = comfy_table::Table::new();
        table.load_style(comfy_table::presets::ASCII_MARKDOWN).set_header(header);
        for (i, column) in table.column_iter_mut().enumerate() {
            let left = i == 0 || i >= 11;
            column.set_cell_alignment(if left {
                comfy_table::CellAlignment::Left
            } else {
                comfy_table::CellAlignment::Right
            });
        }
        for t in &all {
            let failures: u64 = t.failures.values().sum();
            let kinds: Vec<String> = t.failures.iter().map(|(k, n)| format!("{k}: {n}")).collect();
            let kinds = if kinds.is_empty() { String::new() } else { format!(" ({})", kinds.join(", ")) };
            table.add_row(vec![
                t.protocol.name().to_string(),
                t.runs.to_string(),
                t.certified.to_string(),
                t.views.to_string(),
                t.rekeys.to_string(),
                t.messages.to_string(),
                t.notices.to_string(),
                t.attacks.to_string(),
                t.reconfigurations.to_string(),
                t.crashes.to_string(),
                format!("{:.0}", t.runs as f64 / t.secs),
                t.trace.clone(),
                format!("{failures}{kinds}"),
            ]);
        }
        println!("{table}");
        // The scale target, from the rates just measured (an
        // extrapolation: say so).
        let secs: f64 = all.iter().map(|t| 100_000.0 * t.secs / t.runs.max(1) as f64).sum();
        println!(
            "100,000 seeds per protocol would take about {:.0} min at these rates ({} threads; extrapolated)",
            secs / 60.0,
            std::thread::available_parallelism().map_or(1, |n| n.get())
        );
    }
    let failed: Vec<&Totals> = all.iter().filter(|t| t.first_failure.is_some()).collect();
    for t in &failed {
        let (seed, kind, what) = t.first_failure.as_ref().expect("filtered");
        eprintln!("FAILED {} seed {seed}: {kind}: {what}", t.protocol.name());
        for (kind, n) in &t.failures {
            eprintln!("  {kind}: {n}");
        }
        eprintln!(
            "replay: conclave sim --protocols {} --seed {seed} --seeds 1 --members {} --steps {} --daemons {}{}",
            t.protocol.name(),
            args.members,
            args.steps,
            args.daemons,
            if args.uncertified { " --uncertified" } else { "" }
        );
    }
    if !failed.is_empty() {
        std::process::exit(1);
    }
    Ok(())
}

/// The seeds of one protocol, over every CPU; outcomes in seed order. Shows
/// progress every ten seconds (unless the output is JSON).
fn run_seeds(args: &SimArgs, cfg: SimConfig, name: &str) -> Vec<(u64, Outcome)> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let done = AtomicU64::new(0);
    let start = Instant::now();
    let mut out: Vec<(u64, Outcome)> = std::thread::scope(|s| {
        let done = &done;
        let handles: Vec<_> = (0..threads)
            .map(|k| {
                s.spawn(move || {
                    (args.seed..args.seed + args.seeds)
                        .filter(|seed| seed % threads == k)
                        .map(|seed| {
                            let o = run_seed(seed, cfg);
                            done.fetch_add(1, Ordering::Relaxed);
                            (seed, o)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut shown = start;
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            if !args.json && shown.elapsed() >= Duration::from_secs(10) {
                shown = Instant::now();
                let n = done.load(Ordering::Relaxed);
                let rate = n as f64 / start.elapsed().as_secs_f64();
                eprintln!("{name}: {n}/{} seeds, {rate:.0} runs/s", args.seeds);
            }
        }
        handles.into_iter().flat_map(|h| h.join().expect("a simulation thread panicked")).collect()
    });
    out.sort_by_key(|(seed, _)| *seed);
    out
}
