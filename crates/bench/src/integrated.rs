//! `conclave bench integrated`: the layered against the integrated
//! architecture, beside Figures 5, 6 and 7 of "Scaling Secure Group
//! Communication Systems: Beyond Peer-to-Peer" (Amir, Nita-Rotaru, Stanton,
//! Tsudik; DISCEX III, 2003), §5.
//!
//! Two engines run Figures 5 and 6:
//! * `--engine sim` (the default; no root needed): simulated daemons in
//!   virtual time, 13 as the paper's testbed, real secure sessions over them,
//!   cryptography charged at this machine's measured costs or the 2002
//!   testbed's ([`sim`], [`metered`], [`model`]);
//! * `--engine cluster`: a Corosync cluster of certified daemons in network
//!   namespaces, real sessions, wall clock ([`cluster`]).
//!
//! The architectures are policies: **layered-tgdh** (the members of each
//! group run TGDH themselves, the paper's choice for the layered
//! architecture, §5.1) and **integrated-vs** (the daemons agree one key with
//! TGDH among themselves and give every view its key by one HMAC).
//!
//! Fig. 5: one group of n members; join, leave, partition, merge. Fig. 6: G
//! groups of `--group-size` members, one split of the daemons and its heal:
//! the time until every member of every group holds its new key, with the
//! layered/integrated ratio. Fig. 7 ([`throughput`]): data throughput
//! against message size for plaintext, layered-tgdh, integrated-vs,
//! three-step and optimized-evs, real sessions in wall-clock time, on the embedded standalone
//! daemon or (cluster) across two nodes.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use conclave_gka::{GroupId, ProtocolId};
use conclave_secure::Policy;
use serde::Serialize;

use crate::scenario::{TimedEvent, Wan};

mod cluster;
mod metered;
mod model;
mod sim;
mod throughput;

pub use model::CostsFrom;

/// What runs Figures 5 and 6.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// Simulated daemons in virtual time, real sessions, crypto charged by a cost model.
    Sim,
    /// A Corosync cluster in network namespaces, real sessions, wall clock (root, corosync, --features cluster).
    Cluster,
}

/// Options of `conclave bench integrated`.
#[derive(Args, Clone)]
#[command(after_help = "\
Fig. 5 and 6 time from the event (a join or leave request; for a partition or merge, the daemons' new \
configuration on the sim, the network change itself on the cluster) until the last member concerned holds \
its new key (sim; `mean_ms`) and shows the confirmed secure view (`confirmed_ms`; the cluster's `mean_ms`). \
Fig. 7 measures messages per second of one sender's flood until every receiver has every message.

Examples:
  conclave bench integrated                              # Figs 5-7: sim on 13 daemons, Fig 7 embedded
  conclave bench integrated --figures 6 --groups 1,10,100,200,1000
  conclave bench integrated --costs tissec2002 --figures 5,6 --out results/
  conclave bench integrated --figures 7 --msg-sizes 1024,16384 --json
  sudo conclave bench integrated --engine cluster        # needs --features cluster and corosync")]
pub struct IntegratedArgs {
    /// Figures to produce (comma-separated: 5, 6, 7).
    #[arg(long, value_delimiter = ',', default_value = "5,6,7")]
    figures: Vec<u8>,
    /// Engine for Figs. 5 and 6: `sim` (simulated daemons, virtual time) or `cluster` (Corosync in network
    /// namespaces, wall clock; needs root, corosync and a build with --features cluster). Fig. 7 runs on the
    /// embedded standalone daemon with `sim`, across two cluster nodes with `cluster`.
    #[arg(long, value_enum, default_value = "sim")]
    engine: Engine,
    /// Sim: per-operation crypto costs, `measured` on this machine at the start of the run or `tissec2002`
    /// (the 2002 testbed: 667 MHz Pentium III, 512-bit DH, RSA-1024).
    #[arg(long, value_enum, default_value = "measured")]
    costs: CostsFrom,
    /// Sim: the layered members' key confirmations (one signature per member per new key) cost nothing, as in
    /// the paper's Secure Spread, which confirmed no key. Integrated members confirm nothing (their daemons
    /// confirm the daemons' key among themselves, charged to the daemons).
    #[arg(long)]
    free_confirmations: bool,
    /// Sim: simulated daemons (the paper's testbed had 13); a partition splits them in half.
    #[arg(long, value_name = "N", default_value_t = 13)]
    daemons: u16,
    /// Cluster: nodes (each a network namespace with corosync and a daemon); a partition puts the last ⌊N/2⌋ on
    /// a side of their own.
    #[arg(long, value_name = "N", default_value_t = 3)]
    cluster: usize,
    /// Fig. 5: group sizes n (comma-separated; the size after a join, before a leave, partition or merge).
    #[arg(long, value_delimiter = ',', default_value = "13,26,52,104")]
    sizes: Vec<usize>,
    /// Fig. 5: events (comma-separated: join, leave, partition, merge).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "join,leave,partition,merge")]
    events: Vec<TimedEvent>,
    /// Fig. 5: runs per point, each with its own seed (the tables show the mean; on the sim seeds move the
    /// network's jitter and the key trees' shapes).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Fig. 6: numbers of groups (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,200,1000")]
    groups: Vec<usize>,
    /// Fig. 6: members per group (the paper's 13: its number of servers).
    #[arg(long, default_value_t = 13)]
    group_size: usize,
    /// Fig. 7: message sizes in bytes (comma-separated; 16 to 1048576).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096,16384,65536")]
    msg_sizes: Vec<usize>,
    /// Fig. 7: modes (comma-separated: plaintext, layered-tgdh, integrated-vs, three-step, optimized-evs);
    /// the × plaintext column needs plaintext among them.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plaintext,layered-tgdh,integrated-vs,three-step,optimized-evs"
    )]
    modes: Vec<String>,
    /// Fig. 7: receivers besides the sender (the paper had one sender).
    #[arg(long, default_value_t = 2)]
    receivers: usize,
    /// Fig. 7: messages per round at most (also at most 64 MiB of payload).
    #[arg(long, default_value_t = 10000)]
    messages: usize,
    /// Fig. 7: the secure modes' data without sender signatures (`Policy::sender_signatures` off: the group key
    /// alone authenticates, as in the paper's Secure Spread); by default every message is signed (Ed25519).
    #[arg(long)]
    no_sender_signatures: bool,
    /// Fig. 7: also run Integrated VS and Optimized EVS while one more member joins and leaves the group, waiting
    /// this many ms after each, all through the round: the messages in flight at each view change cross it
    /// (Integrated VS sends them again, Optimized EVS's daemons re-encrypt them). 0: no such rows.
    #[arg(long, default_value_t = 20)]
    churn_ms: u64,
    /// First seed (identities, the simulated network, the engines' randomness).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON array of rows instead of tables: each with figure, mode, event, groups, members, size and
    /// mean_ms (Figs. 5, 6) or msgs_per_s and mb_per_s (Fig. 7).
    #[arg(long)]
    json: bool,
    /// Also write integrated.csv, integrated.json and charts (SVG and PNG) into this directory.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
}

/// Figs. 5 and 6's architectures: the `mode` name and the policy.
pub(crate) fn fig56_modes() -> [(&'static str, Policy); 2] {
    [("layered-tgdh", Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255)), ("integrated-vs", Policy::integrated())]
}

/// One measurement: a row of `--json`, the CSV and the tables.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// 5, 6 or 7.
    pub figure: u8,
    /// `plaintext` (Figs. 5 and 6: the membership line), `layered-tgdh`, `integrated-vs`, `three-step`,
    /// `optimized-evs`.
    pub mode: &'static str,
    /// Figs. 5 and 6: join, leave, partition, merge.
    pub event: Option<TimedEvent>,
    /// Groups re-keyed at once (1 but in Fig. 6).
    pub groups: usize,
    /// Members per group (Fig. 7: the sender and the receivers).
    pub members: usize,
    /// Fig. 7: message bytes.
    pub size: Option<usize>,
    /// Figs. 5 and 6, ms: sim, until every member concerned holds its new key (plaintext: has the new view);
    /// cluster, until every member shows the confirmed secure view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mean_ms: Option<f64>,
    /// Until every member shows the confirmed secure view, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmed_ms: Option<f64>,
    /// Cluster: the longest any member took from its daemon's view to the key, ms.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_ms: Option<f64>,
    /// Fig. 7: whether every data message carried its sender's signature (secure modes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sender_signatures: Option<bool>,
    /// Fig. 7 with churn: one more member joined and left the group all through the round, waiting this many ms
    /// after each.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn_ms: Option<u64>,
    /// Fig. 7 with churn: secure views the sender delivered during the round.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub views: Option<usize>,
    /// Fig. 7 with churn, Optimized EVS: messages the sender read re-encrypted by its daemon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reencrypted: Option<u64>,
    /// Fig. 7 with churn: the most messages a member was told were lost (Optimized EVS: sealed under a key its
    /// daemon no longer held, having crossed more views than the key-out).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<usize>,
    /// Fig. 7: messages per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub msgs_per_s: Option<f64>,
    /// Fig. 7: payload megabytes (10^6 bytes) per second.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mb_per_s: Option<f64>,
    /// `sim`, `cluster` or (Fig. 7 without a cluster) `embedded`.
    pub engine: &'static str,
    /// Sim: `measured` or `tissec2002`.
    pub costs: Option<&'static str>,
    /// Sim: whether the members' key confirmation signatures were charged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirmations_charged: Option<bool>,
    /// Daemons.
    pub daemons: usize,
    /// Runs averaged.
    pub runs: usize,
}

/// The run's settings, checked.
pub(crate) struct Settings {
    engine: Engine,
    costs: CostsFrom,
    free_confirmations: bool,
    daemons: usize,
    sizes: Vec<usize>,
    events: Vec<TimedEvent>,
    runs: usize,
    groups: Vec<usize>,
    group_size: usize,
    seed: u64,
}

impl Settings {
    /// A row of figure `figure` with this run's engine, costs, daemons and runs.
    #[allow(clippy::too_many_arguments)]
    fn row(
        &self,
        figure: u8,
        mode: &'static str,
        event: Option<TimedEvent>,
        groups: usize,
        members: usize,
        size: Option<usize>,
        mean_ms: Option<f64>,
    ) -> Row {
        let sim = self.engine == Engine::Sim;
        Row {
            figure,
            mode,
            event,
            groups,
            members,
            size,
            mean_ms,
            confirmed_ms: None,
            key_ms: None,
            sender_signatures: None,
            churn_ms: None,
            views: None,
            reencrypted: None,
            lost: None,
            msgs_per_s: None,
            mb_per_s: None,
            engine: if sim { "sim" } else { "cluster" },
            costs: sim.then(|| self.costs.name()),
            confirmations_charged: sim.then_some(!self.free_confirmations),
            daemons: self.daemons,
            runs: self.runs,
        }
    }
}

/// Checks the options; the settings and the figures asked for.
fn check(args: &IntegratedArgs) -> Result<(Settings, [bool; 3])> {
    let mut figures = [false; 3];
    for &f in &args.figures {
        match f {
            5..=7 => figures[usize::from(f - 5)] = true,
            other => bail!("--figures: there is no Fig. {other} to produce (5, 6 or 7)"),
        }
    }
    let runs = args.runs;
    if args.engine == Engine::Cluster && (args.free_confirmations || args.costs != CostsFrom::Measured) {
        bail!("--costs and --free-confirmations are the sim's cost model: the cluster engine runs in wall-clock time");
    }
    if runs == 0 {
        bail!("--runs must be at least 1");
    }
    let daemons = match args.engine {
        Engine::Sim => usize::from(args.daemons),
        Engine::Cluster => args.cluster,
    };
    let network = args.events.iter().any(|e| e.needs_a_network()) || figures[1];
    if daemons == 0 || (network && daemons < 2 && (figures[0] || figures[1])) {
        bail!("{daemons} daemons cannot partition: give --daemons (sim) or --cluster (cluster) of at least 2");
    }
    if let Some(e) = args
        .events
        .iter()
        .find(|e| !matches!(e, TimedEvent::Join | TimedEvent::Leave | TimedEvent::Partition | TimedEvent::Merge))
    {
        bail!("{e:?} is not one of Fig. 5's events (join, leave, partition, merge)");
    }
    if figures[0] {
        if let Some(&n) = args.sizes.iter().find(|&&n| n < 2) {
            bail!("--sizes: group size {n} is too small: an event needs at least 2 members");
        }
        if args.engine == Engine::Cluster {
            if let Some(&n) = args.sizes.iter().find(|&&n| n < daemons) {
                bail!(
                    "--sizes: group size {n} is smaller than the {daemons} nodes: a partition would leave a side empty"
                );
            }
        }
    }
    if figures[1] {
        if args.group_size < 2 {
            bail!("--group-size must be at least 2");
        }
        if let Some(&g) = args.groups.iter().find(|&&g| g == 0) {
            bail!("--groups: {g} groups is no point");
        }
    }
    if figures[2] {
        if let Some(&s) = args.msg_sizes.iter().find(|&&s| !(crate::flood::HEADER..=1 << 20).contains(&s)) {
            bail!("--msg-sizes: {s} bytes is outside 16 to 1048576");
        }
        let known: Vec<&str> = throughput::modes().iter().map(|m| m.0).collect();
        if let Some(m) = args.modes.iter().find(|m| !known.contains(&m.as_str())) {
            bail!("--modes: no mode {m:?} (the modes: {})", known.join(", "));
        }
        if args.receivers == 0 || args.messages == 0 {
            bail!("--receivers and --messages must be at least 1");
        }
    }
    let settings = Settings {
        engine: args.engine,
        costs: args.costs,
        free_confirmations: args.free_confirmations,
        daemons,
        sizes: args.sizes.clone(),
        events: args.events.clone(),
        runs,
        groups: args.groups.clone(),
        group_size: args.group_size,
        seed: args.seed,
    };
    Ok((settings, figures))
}

/// Runs the benchmark.
pub fn run(args: IntegratedArgs) -> Result<()> {
    let (s, figures) = check(&args)?;
    if let Some(dir) = &args.out {
        check_writable(dir)?;
    }
    if s.engine == Engine::Cluster {
        cluster::preflight()?;
    }
    let fig5_points = match (figures[0], s.engine) {
        (false, _) => 0,
        (true, Engine::Sim) => s.sizes.len() * s.runs * 2,
        (true, Engine::Cluster) => s.sizes.len() * s.events.len(),
    };
    let fig6_points = if figures[1] { s.groups.len() * 2 } else { 0 };
    let chosen = |m: &&&str| args.modes.iter().any(|c| c == **m);
    let churned = if args.churn_ms > 0 { throughput::CHURNED.iter().filter(chosen).count() } else { 0 };
    let fig7_points = if figures[2] { args.msg_sizes.len() * (args.modes.len() + churned) } else { 0 };
    let bar = progress_bar((fig5_points + fig6_points + fig7_points) as u64);
    let mut step = |what: String| {
        if bar.is_hidden() {
            // No terminal: a line per point, for logs.
            eprintln!("{what}");
        }
        bar.set_message(what);
        bar.inc(1);
    };
    let mut out = std::io::stdout().lock();
    let mut notes = Vec::new();
    let mut rows = Vec::new();
    let target = match s.engine {
        Engine::Cluster => Some(cluster::start(s.daemons, &mut notes)?),
        Engine::Sim if figures[2] => Some(crate::live::Target::start(None, Wan::Lan, &mut notes)?),
        Engine::Sim => None,
    };
    match s.engine {
        Engine::Sim if figures[0] || figures[1] => {
            let costs = model::OpCosts::build(s.costs, 200)?;
            writeln!(
                notes,
                "sim: {} simulated daemons, costs {} (per operation: exponentiation {:.1} µs, signature {:.1} µs, \
                 verification {:.1} µs, HMAC {:.2} µs); key confirmation signatures {}",
                s.daemons,
                s.costs.name(),
                costs.exp_us,
                costs.sign_us,
                costs.verify_us,
                costs.hmac_us,
                if s.free_confirmations { "free (--free-confirmations)" } else { "charged" }
            )?;
            let mut bed = sim::Testbed::new(s.daemons as u16, costs);
            bed.charge_confirmations = !s.free_confirmations;
            if figures[0] {
                rows.extend(sim_fig5(&bed, &s, &mut step)?);
            }
            if figures[1] {
                rows.extend(sim_fig6(&bed, &s, &mut step)?);
            }
        }
        Engine::Sim => {}
        Engine::Cluster => {
            let t = target.as_ref().expect("a cluster");
            if figures[0] {
                rows.extend(cluster::fig5(t, &s, &mut step)?);
            }
            if figures[1] {
                rows.extend(cluster::fig6(t, &s, &mut step)?);
            }
        }
    }
    if figures[2] {
        let t = target.as_ref().expect("a target for Fig. 7");
        rows.extend(fig7(t, &s, &args, &mut step)?);
    }
    bar.finish_and_clear();
    if args.json {
        std::io::stderr().write_all(&notes)?;
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        out.write_all(&notes)?;
        write_tables(&mut out, &s, &rows)?;
    }
    if let Some(dir) = &args.out {
        let charts = write_outputs(dir, &rows)?;
        eprintln!("wrote integrated.csv, integrated.json and {} charts to {}", charts, dir.display());
    }
    Ok(())
}

/// Fig. 5 on the sim: per size, each architecture over `runs` seeds; the
/// membership line is the layered runs' (plain daemons deliver views at once).
fn sim_fig5(bed: &sim::Testbed, s: &Settings, step: &mut dyn FnMut(String)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (j, &n) in s.sizes.iter().enumerate() {
        let mut per_mode = Vec::new();
        for (mode, policy) in fig56_modes() {
            let mut runs = Vec::new();
            for r in 0..s.runs {
                step(format!("fig. 5: {mode}, n = {n}, run {}", r + 1));
                let seed = s.seed + (j * 1000 + r) as u64;
                runs.push(sim::fig5(bed, policy, n, &s.events, seed).with_context(|| format!("{mode} at n = {n}"))?);
            }
            per_mode.push((mode, runs));
        }
        for (e, &event) in s.events.iter().enumerate() {
            let mean = |runs: &[Vec<sim::Timing>]| sim::Timing::mean(&runs.iter().map(|r| r[e]).collect::<Vec<_>>());
            let membership = mean(&per_mode[0].1).membership_ms;
            rows.push(s.row(5, "plaintext", Some(event), 1, n, None, Some(membership)));
            for (mode, runs) in &per_mode {
                let t = mean(runs);
                rows.push(Row {
                    confirmed_ms: Some(t.confirmed_ms),
                    ..s.row(5, mode, Some(event), 1, n, None, Some(t.keyed_ms))
                });
            }
        }
    }
    Ok(rows)
}

/// Fig. 6 on the sim: per number of groups, each architecture, one split and
/// one heal.
fn sim_fig6(bed: &sim::Testbed, s: &Settings, step: &mut dyn FnMut(String)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (k, &g) in s.groups.iter().enumerate() {
        for (mode, policy) in fig56_modes() {
            step(format!("fig. 6: {g} groups of {} ({mode})", s.group_size));
            let seed = s.seed + 1_000_000 + k as u64;
            let timings =
                sim::fig6(bed, policy, g, s.group_size, seed).with_context(|| format!("{mode}, {g} groups"))?;
            for (event, t) in [TimedEvent::Partition, TimedEvent::Merge].into_iter().zip(timings) {
                if mode == "layered-tgdh" {
                    rows.push(Row {
                        runs: 1,
                        ..s.row(6, "plaintext", Some(event), g, s.group_size, None, Some(t.membership_ms))
                    });
                }
                rows.push(Row {
                    confirmed_ms: Some(t.confirmed_ms),
                    runs: 1,
                    ..s.row(6, mode, Some(event), g, s.group_size, None, Some(t.keyed_ms))
                });
            }
        }
    }
    Ok(rows)
}

/// Fig. 7 on `target`'s daemons: every mode at every size.
fn fig7(
    target: &crate::live::Target,
    s: &Settings,
    args: &IntegratedArgs,
    step: &mut dyn FnMut(String),
) -> Result<Vec<Row>> {
    let (sizes, receivers, messages) = (args.msg_sizes.clone(), args.receivers, args.messages);
    let modes = args.modes.clone();
    let signed = !args.no_sender_signatures;
    let churn = (args.churn_ms > 0).then(|| std::time::Duration::from_millis(args.churn_ms));
    let cluster = s.engine == Engine::Cluster;
    let points = target.run(|sockets, tag| async move {
        let mut points = Vec::new();
        for &size in &sizes {
            let chosen = |m: &(&str, Option<Policy>)| modes.iter().any(|c| c == m.0);
            let churned = throughput::modes().into_iter().filter(chosen).filter(|m| throughput::CHURNED.contains(&m.0));
            let runs = throughput::modes()
                .into_iter()
                .filter(chosen)
                .map(|m| (m, None))
                .chain(churned.filter_map(|m| Some((m, Some(churn?)))));
            for ((name, policy), churn) in runs {
                let mode = (name, policy.map(|p| Policy { sender_signatures: signed, ..p }));
                let with = if churn.is_some() { " with churn" } else { "" };
                step(format!("fig. 7: {name}{with} at {size} B"));
                let p = throughput::round(&sockets, mode, size, receivers, messages, &tag.to_string(), churn)
                    .await
                    .with_context(|| format!("{}{with} at {size} bytes", mode.0))?;
                points.push(p);
            }
        }
        Ok(points)
    })?;
    Ok(points
        .into_iter()
        .map(|p| Row {
            sender_signatures: p.sender_signatures,
            churn_ms: p.churn.map(|c| c.period_ms),
            views: p.churn.map(|c| c.views),
            reencrypted: p.churn.filter(|_| p.mode == "optimized-evs").map(|c| c.reencrypted),
            lost: p.churn.map(|c| c.lost),
            msgs_per_s: Some(p.msgs_per_s),
            mb_per_s: Some(p.mb_per_s()),
            engine: if cluster { "cluster" } else { "embedded" },
            costs: None,
            confirmations_charged: None,
            daemons: if cluster { s.daemons } else { 1 },
            runs: 1,
            ..s.row(7, p.mode, None, 1, receivers + 1, Some(p.size), None)
        })
        .collect())
}

/// The row of `mode` among `rows` at the same figure, event, groups, members,
/// size and churn as `like` (plaintext has no churn: any row's plaintext
/// is the one without).
fn find<'a>(rows: &'a [Row], like: &Row, mode: &str) -> Option<&'a Row> {
    let churn = if mode == "plaintext" { None } else { like.churn_ms };
    rows.iter().find(|r| {
        r.figure == like.figure
            && r.mode == mode
            && r.event == like.event
            && r.groups == like.groups
            && r.members == like.members
            && r.size == like.size
            && r.churn_ms == churn
    })
}

fn ms(v: Option<f64>) -> String {
    let digits = match v {
        Some(v) if v >= 100.0 => 0,
        Some(v) if v >= 10.0 => 1,
        _ => 2,
    };
    crate::table::or_dash(v, digits)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.1}", a / b),
        _ => "-".into(),
    }
}

fn event_name(e: Option<TimedEvent>) -> String {
    e.map_or_else(String::new, |e| format!("{e:?}").to_lowercase())
}

/// The tables of Figs. 5, 6 and 7, and the issue's targets beside them.
fn write_tables(out: &mut impl Write, s: &Settings, rows: &[Row]) -> Result<()> {
    let sim = s.engine == Engine::Sim;
    let (held, shown) = if sim { ("keyed", "confirmed") } else { ("total", "key") };
    for figure in [5u8, 6] {
        let layered: Vec<&Row> = rows.iter().filter(|r| r.figure == figure && r.mode == "layered-tgdh").collect();
        if layered.is_empty() {
            continue;
        }
        if figure == 5 {
            writeln!(
                out,
                "\nFig. 5: one group of n members, mean of {} run(s); ms from the event until the last member {}; \
                 membership: until the last has the daemons' new view (plain clients' part)",
                s.runs,
                if sim {
                    "holds its new key (keyed) and shows the confirmed secure view (confirmed)"
                } else {
                    "shows its new secure view (total), and the longest any member took from its daemon's view to the key (key)"
                }
            )?;
        } else {
            writeln!(
                out,
                "\nFig. 6: groups of {} members, the daemons split in half and heal: ms until every member of every \
                 group {}",
                s.group_size,
                if sim {
                    "holds its new key (keyed) and shows its confirmed secure view (confirmed)"
                } else {
                    "shows its new secure view (total)"
                }
            )?;
        }
        let first = if figure == 5 { "n" } else { "groups" };
        let mut t = crate::table::new(
            vec![
                "event".to_string(),
                first.to_string(),
                "membership".into(),
                format!("layered {held}"),
                format!("integrated {held}"),
                "ratio".into(),
                format!("layered {shown}"),
                format!("integrated {shown}"),
                "ratio".into(),
            ],
            1,
        );
        for l in layered {
            let i = find(rows, l, "integrated-vs");
            let m = find(rows, l, "plaintext");
            let second = |r: Option<&Row>| if sim { r.and_then(|r| r.confirmed_ms) } else { r.and_then(|r| r.key_ms) };
            t.add_row(vec![
                event_name(l.event),
                (if figure == 5 { l.members } else { l.groups }).to_string(),
                ms(m.and_then(|m| m.mean_ms)),
                ms(l.mean_ms),
                ms(i.and_then(|i| i.mean_ms)),
                ratio(l.mean_ms, i.and_then(|i| i.mean_ms)),
                ms(second(Some(l))),
                ms(second(i)),
                ratio(second(Some(l)), second(i)),
            ]);
        }
        writeln!(out, "{t}")?;
        if figure == 6 {
            targets_fig6(out, rows)?;
        }
    }
    let fig7: Vec<&Row> = rows.iter().filter(|r| r.figure == 7).collect();
    if let Some(first) = fig7.first() {
        writeln!(
            out,
            "\nFig. 7: data throughput, one sender and {} receivers, {}; secure modes' data {}; × plaintext: messages \
             per second against the plaintext round of the same size in this run; µs/msg: the round's time per \
             message",
            first.members - 1,
            if first.engine == "cluster" {
                "the sender on the first node, the receivers on the last: three-step's daemons seal what crosses"
            } else {
                "all on the embedded standalone daemon: nothing goes between daemons, so three-step seals nothing"
            },
            if fig7.iter().any(|r| r.sender_signatures == Some(false)) {
                "unsigned (--no-sender-signatures)"
            } else {
                "signed by its sender (Ed25519), verified by every receiver"
            }
        )?;
        let mut t = crate::table::new(
            ["size", "mode", "churn", "msgs/s", "MB/s", "× plaintext", "µs/msg", "views", "re-encrypted", "lost"],
            3,
        );
        for r in &fig7 {
            let plain = find(rows, r, "plaintext").and_then(|p| p.msgs_per_s);
            let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
            t.add_row(vec![
                r.size.unwrap_or(0).to_string(),
                r.mode.to_string(),
                r.churn_ms.map_or("-".to_string(), |c| format!("{c} ms")),
                format!("{:.0}", r.msgs_per_s.unwrap_or(0.0)),
                format!("{:.1}", r.mb_per_s.unwrap_or(0.0)),
                match (r.msgs_per_s, plain) {
                    (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                    _ => "-".into(),
                },
                match r.msgs_per_s {
                    Some(m) if m > 0.0 => format!("{:.1}", 1e6 / m),
                    _ => "-".into(),
                },
                opt(r.views.map(|v| v as u64)),
                opt(r.reencrypted),
                opt(r.lost.map(|v| v as u64)),
            ]);
        }
        writeln!(out, "{t}")?;
        if fig7.iter().any(|r| r.churn_ms.is_some()) {
            writeln!(
                out,
                "churn: one more member joined and left the group all through the round, waiting that long after \
                 each, for at most {} s; views: secure views the sender delivered meanwhile; re-encrypted: messages \
                 the sender read re-encrypted by its daemon (Optimized EVS; Integrated VS sends such messages \
                 again); lost: the most messages a member was told were lost (sealed under a key its daemon no \
                 longer held)",
                throughput::CHURN_ROUND.as_secs()
            )?;
        }
        let at_least_1k: Vec<(usize, f64)> = fig7
            .iter()
            .filter(|r| r.mode == "integrated-vs" && r.churn_ms.is_none() && r.size.is_some_and(|s| s >= 1024))
            .filter_map(|r| Some((r.size?, r.msgs_per_s? / find(rows, r, "plaintext")?.msgs_per_s?)))
            .collect();
        if let Some(&(size, worst)) = at_least_1k.iter().min_by(|a, b| a.1.total_cmp(&b.1)) {
            writeln!(
                out,
                "target: integrated-vs at ≥ 1 KiB ≥ 0.8× plaintext — lowest {worst:.2}× (at {size} B): {}",
                if worst >= 0.8 { "met" } else { "missed" }
            )?;
        }
    }
    Ok(())
}

/// The issue's Fig. 6 targets, where the run has the points.
fn targets_fig6(out: &mut impl Write, rows: &[Row]) -> Result<()> {
    let at = |mode: &str, g: usize| -> Vec<&Row> {
        rows.iter().filter(|r| r.figure == 6 && r.mode == mode && r.groups == g).collect()
    };
    let worst = |rs: &[&Row]| {
        rs.iter().filter_map(|r| r.mean_ms).fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))
    };
    if let Some(w) = worst(&at("integrated-vs", 1000)) {
        writeln!(
            out,
            "target: 1000 integrated groups keyed within 50 ms — slowest event {w:.1} ms: {}",
            if w <= 50.0 { "met" } else { "missed" }
        )?;
    }
    for r in at("layered-tgdh", 200) {
        let Some(i) = find(rows, r, "integrated-vs") else { continue };
        if let (Some(l), Some(i)) = (r.mean_ms, i.mean_ms) {
            writeln!(
                out,
                "target: layered/integrated at 200 groups ≥ 50× — {}: {:.0} / {:.1} ms = {:.0}×: {}",
                event_name(r.event),
                l,
                i,
                l / i,
                if l / i >= 50.0 { "met" } else { "missed" }
            )?;
        }
    }
    Ok(())
}

/// Fails early if `dir` cannot be written (before a long run).
fn check_writable(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    tempfile::NamedTempFile::new_in(dir).with_context(|| format!("{} is not writable", dir.display()))?;
    Ok(())
}

/// Writes integrated.csv, integrated.json and the charts; returns how many
/// charts (each as SVG and PNG).
fn write_outputs(dir: &Path, rows: &[Row]) -> Result<usize> {
    std::fs::write(dir.join("integrated.json"), serde_json::to_string_pretty(rows)?)
        .with_context(|| format!("writing {}", dir.join("integrated.json").display()))?;
    let mut w = csv::Writer::from_path(dir.join("integrated.csv"))?;
    w.write_record([
        "figure",
        "mode",
        "event",
        "groups",
        "members",
        "size",
        "mean_ms",
        "confirmed_ms",
        "key_ms",
        "msgs_per_s",
        "mb_per_s",
        "engine",
        "costs",
        "confirmations_charged",
        "sender_signatures",
        "churn_ms",
        "views",
        "reencrypted",
        "lost",
        "daemons",
        "runs",
    ])?;
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.4}"));
    for r in rows {
        w.write_record([
            r.figure.to_string(),
            r.mode.to_string(),
            event_name(r.event),
            r.groups.to_string(),
            r.members.to_string(),
            r.size.map_or(String::new(), |s| s.to_string()),
            opt(r.mean_ms),
            opt(r.confirmed_ms),
            opt(r.key_ms),
            opt(r.msgs_per_s),
            opt(r.mb_per_s),
            r.engine.to_string(),
            r.costs.unwrap_or("").to_string(),
            r.confirmations_charged.map_or(String::new(), |c| c.to_string()),
            r.sender_signatures.map_or(String::new(), |c| c.to_string()),
            r.churn_ms.map_or(String::new(), |c| c.to_string()),
            r.views.map_or(String::new(), |c| c.to_string()),
            r.reencrypted.map_or(String::new(), |c| c.to_string()),
            r.lost.map_or(String::new(), |c| c.to_string()),
            r.daemons.to_string(),
            r.runs.to_string(),
        ])?;
    }
    w.flush()?;
    let mut charts = 0;
    let series = |figure: u8, event: Option<TimedEvent>, x: fn(&Row) -> f64, y: fn(&Row) -> Option<f64>| {
        let mut lines: Vec<crate::chart::Series> = Vec::new();
        for r in rows.iter().filter(|r| r.figure == figure && r.event == event) {
            let Some(v) = y(r) else { continue };
            let name = match r.churn_ms {
                _ if r.mode == "plaintext" && figure != 7 => "membership".to_string(),
                Some(c) => format!("{}, churn {c} ms", r.mode),
                None => r.mode.to_string(),
            };
            match lines.iter_mut().find(|l| l.name == name) {
                Some(l) => l.points.push((x(r), v)),
                None => lines.push(crate::chart::Series { name, points: vec![(x(r), v)] }),
            }
        }
        lines
    };
    for event in [TimedEvent::Join, TimedEvent::Leave, TimedEvent::Partition, TimedEvent::Merge] {
        let lines = series(5, Some(event), |r| r.members as f64, |r| r.mean_ms);
        if !lines.is_empty() {
            let name = format!("fig5-{}.svg", event_name(Some(event)));
            let title = format!("Fig. 5: {} in one group", event_name(Some(event)));
            crate::chart::line_chart(
                &dir.join(&name),
                &title,
                "group size n",
                "ms until every member holds its key",
                &lines,
                false,
            )?;
            charts += 1;
        }
    }
    for event in [TimedEvent::Partition, TimedEvent::Merge] {
        let lines = series(6, Some(event), |r| r.groups as f64, |r| r.mean_ms);
        if !lines.is_empty() {
            let name = format!("fig6-{}.svg", event_name(Some(event)));
            let title = format!("Fig. 6: every group re-keyed after a daemon {}", event_name(Some(event)));
            crate::chart::line_chart(
                &dir.join(&name),
                &title,
                "groups",
                "ms until every member of every group holds its key",
                &lines,
                true,
            )?;
            charts += 1;
        }
    }
    let lines = series(7, None, |r| (r.size.unwrap_or(1) as f64).log2(), |r| r.mb_per_s);
    if !lines.is_empty() {
        crate::chart::line_chart(
            &dir.join("fig7.svg"),
            "Fig. 7: data throughput",
            "message size, log2 bytes (6 = 64 B, 10 = 1 KiB, 16 = 64 KiB)",
            "MB/s",
            &lines,
            false,
        )?;
        charts += 1;
    }
    Ok(charts)
}

/// A bar over the run's points, on stderr when it is a terminal.
fn progress_bar(len: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:40} {wide_bar} {pos}/{len} points, ETA {eta}")
            .expect("static template"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: IntegratedArgs,
    }

    fn args(line: &str) -> IntegratedArgs {
        Cli::try_parse_from(std::iter::once("integrated").chain(line.split_whitespace())).unwrap().args
    }

    fn refused(line: &str) -> String {
        match check(&args(line)) {
            Ok(_) => panic!("{line} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_options_are_refused_with_a_reason() {
        assert!(check(&args("")).is_ok());
        assert!(refused("--figures 4").contains("Fig. 4"));
        assert!(refused("--sizes 1").contains("too small"));
        assert!(refused("--msg-sizes 8").contains("16 to 1048576"));
        assert!(refused("--figures 7 --modes plaintext,secure").contains("no mode \"secure\""));
        assert!(refused("--runs 0").contains("--runs"));
        assert!(refused("--daemons 1").contains("cannot partition"));
        assert!(refused("--figures 6 --groups 0").contains("--groups"));
        assert!(check(&args("--daemons 1 --figures 5 --events join,leave")).is_ok());
        assert!(refused("--engine cluster --costs tissec2002").contains("wall-clock"));
    }

    #[cfg(not(feature = "cluster"))]
    #[test]
    fn the_cluster_engine_without_its_feature_says_how_to_get_it() {
        let e = cluster::preflight().unwrap_err().to_string();
        assert!(e.contains("--features cluster") && e.contains("--engine sim"), "{e}");
    }

    #[test]
    fn json_rows_have_the_issues_keys_and_out_writes_csv_json_and_charts() {
        let a = args("--daemons 3 --sizes 4 --runs 1 --groups 2 --group-size 4 --costs tissec2002");
        let (s, _) = check(&a).unwrap();
        let bed = sim::Testbed::new(3, model::OpCosts::tissec2002());
        let mut rows = sim_fig5(&bed, &s, &mut |_| {}).unwrap();
        rows.extend(sim_fig6(&bed, &s, &mut |_| {}).unwrap());
        // Fig. 5: plaintext, layered, integrated per event; Fig. 6: the same per event.
        assert_eq!(rows.len(), 4 * 3 + 2 * 3);
        let json: serde_json::Value = serde_json::from_str(&serde_json::to_string(&rows).unwrap()).unwrap();
        for r in json.as_array().unwrap() {
            for key in ["figure", "mode", "event", "groups", "members", "size", "mean_ms"] {
                assert!(r.get(key).is_some(), "{key} missing in {r}");
            }
            assert!(["plaintext", "layered-tgdh", "integrated-vs"].contains(&r["mode"].as_str().unwrap()), "{r}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(write_outputs(dir.path(), &rows).unwrap(), 4 + 2);
        let csv = std::fs::read_to_string(dir.path().join("integrated.csv")).unwrap();
        assert_eq!(csv.lines().count(), rows.len() + 1);
        assert!(dir.path().join("fig6-merge.png").exists());
        let mut table = Vec::new();
        write_tables(&mut table, &s, &rows).unwrap();
        let table = String::from_utf8(table).unwrap();
        assert!(table.contains("Fig. 5") && table.contains("Fig. 6"), "{table}");
    }
}
