//! `conclave bench events`: the time from a membership event until every
//! member holds the new key (TISSEC §6), on the simulator with virtual time.
//!
//! The key agreement engines run for real; every operation they perform is
//! charged virtual CPU time from a cost model, and every message virtual
//! network time:
//!
//! * **Placement.** Members are spread round-robin over 13 machines with 2
//!   CPUs each (the paper's testbed); members on one machine share its CPUs
//!   and a member handles one input at a time. The scheduler ([`sched`]) is
//!   work-conserving: a ready job runs on any free CPU of its machine, and
//!   never waits while one is idle.
//! * **Costs and network, `--costs tissec2002`.** The TISSEC testbed of
//!   [`model`], where every constant cites the paper: per-machine CPU costs
//!   and CPU counts (the WAN's remote machines differ), Spread's token ring
//!   over the 13 daemons (a message waits for the token at its sender's
//!   daemon; agreed multicasts calibrated to §6.1.1's 0.75 ms on the LAN and
//!   §6.2.1's 392 / 328 / 334 ms by sending site on the WAN), a receive cost
//!   per delivered message calibrated on §6.1.1's all-to-all, and the
//!   membership service's time of §6.1.1 (LAN) and Fig. 16 (WAN). The WAN
//!   profile of §6.2.1 puts 11 machines at JHU and one each at UCI and ICU.
//! * **Network, `--costs measured` and the daemon engine's bound.** An agreed
//!   multicast is delivered to all members at once, `multicast` ms plus the
//!   largest one-way delay from the sender's site after it was sent; a
//!   unicast `multicast` ms plus the one-way delay between the two sites;
//!   each delivery costs its receiver `receive` ms of CPU; the new view
//!   reaches the members after 0.7 ms (2 members) to 2.8 ms (50), linearly.
//! * **Placement and events (§6.1.2).** Members go round-robin over the
//!   machines in an order drawn from the seed (the joiner is on a random
//!   machine); the leaver is drawn from the seed (STR: the middle of the
//!   chain); `partition` is a partition between servers (§6.1.5), the
//!   members of a machine on one side.
//!
//! Each point also prints the lower bound: the same run's critical path with
//! unlimited CPUs — every member's work charged at the operation costs, every
//! message its network delay, but no waiting for a busy CPU — and the measured
//! time divided by it.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, ValueEnum};
use conclave_gcs::sim::{Delivery, Flush};
use conclave_gcs::MemberId;
use conclave_gka::harness::{Harness, Msg};
use conclave_gka::{Costs, GroupId, ProtocolId, SignatureId};
use conclave_secure::Policy;
use serde::Serialize;

use crate::crypto;

pub(crate) mod model;
mod sched;
use crate::scenario::{halves, odd_even, one_way, site, Placement, TimedEvent, Wan, MACHINES};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use sched::Scheduler;

/// Which per-operation costs to charge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CostsFrom {
    /// Measured on this machine at start (`conclave bench crypto`: the least median of five rounds).
    Measured,
    /// The paper's 2002 testbed (667 MHz Pentium III, OpenSSL, Spread).
    Tissec2002,
}

/// Options of `conclave bench events`.
#[derive(Args)]
pub struct EventsArgs {
    /// Protocols (comma-separated). With --engine daemon also the groups the
    /// daemons key (the integrated architecture): `integrated-vs` and
    /// `optimized-evs`, timed beside the membership line (no member key
    /// agreement, so no bound); on the simulated daemons they are
    /// `conclave bench integrated --figures 5`'s.
    #[arg(long, value_delimiter = ',', default_value = "gdh,ckd,tgdh,str,bd")]
    protocols: Vec<String>,
    /// Events (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "join,leave,partition,merge")]
    events: Vec<TimedEvent>,
    /// Group sizes n after a join / before a leave, partition or merge
    /// (comma-separated; `A-B/S` is A, A+S, … up to B, e.g. `100-1000/100`).
    #[arg(long, value_delimiter = ',', default_value = "2,5,10,20,30,40,50")]
    sizes: Vec<Sizes>,
    /// Group: ristretto255, modp512, modp1024, modp2048. With --costs tissec2002
    /// only the exponentiation cost of modp512 or modp1024 differs.
    #[arg(long, default_value = "modp512")]
    suite: String,
    /// Signature scheme (see `bench counts --help`).
    #[arg(long, default_value = "ed25519")]
    signature: String,
    /// Cost model.
    #[arg(long, value_enum, default_value = "tissec2002")]
    costs: CostsFrom,
    /// Network profile.
    #[arg(long, value_enum, default_value = "lan")]
    wan: Wan,
    /// Runs per point (mean, p50 and p95 are over these).
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Charts with a logarithmic time axis (default: linear, as the paper's figures).
    #[arg(long)]
    log_y: bool,
    /// Write events.csv, events.json and one chart per event (SVG and PNG) into
    /// this directory; with the MLS peer also mls.csv and mls.json.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
    /// Engine: `sim` (virtual time, cost model, 13 simulated machines) or
    /// `daemon` (wall-clock time over real daemons, every member a real
    /// secure session on this machine; measured costs; join and leave only
    /// unless --cluster).
    #[arg(long, value_enum, default_value = "sim")]
    engine: EngineKind,
    /// With --engine daemon: a Corosync cluster of N nodes (default 3), each
    /// in a network namespace with its own daemon, members round-robin over
    /// the nodes, instead of one embedded daemon; partition and merge then
    /// run too, and --wan tissec2002 (N = 3) delays every frame between the
    /// nodes in a userspace delay hub (this kernel has no netem). Needs root,
    /// corosync and a build with --features cluster.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "3")]
    cluster: Option<usize>,
    /// Peer to compare join and leave with, in the same run: `mls` times mls-rs
    /// add and remove commits on this machine. Default: `mls` with measured
    /// costs, `none` with tissec2002 costs (2002 CPU costs against a 2020s MLS
    /// library on today's CPU would compare machines, not protocols).
    #[arg(long, value_enum)]
    peer: Option<Peer>,
    /// With --engine daemon, the membership line (Fig. 16) is timed before
    /// the protocols at every event and size: the same event with plain
    /// group communication clients, no key agreement. This leaves it out.
    #[arg(long)]
    no_membership: bool,
}

/// What runs the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EngineKind {
    /// The simulator: virtual time from the cost model.
    Sim,
    /// Real sessions over an embedded daemon, wall-clock time.
    Daemon,
}

/// One item of `--sizes`: a size or a range with a step.
#[derive(Clone, Debug)]
pub struct Sizes(Vec<usize>);

impl std::str::FromStr for Sizes {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| t.trim().parse::<usize>().map_err(|_| format!("{t:?} is not a group size"));
        let Some((from, rest)) = s.split_once('-') else { return Ok(Sizes(vec![num(s)?])) };
        let (to, step) = rest.split_once('/').ok_or_else(|| format!("range {s:?} needs a step, e.g. 100-1000/100"))?;
        let (from, to, step) = (num(from)?, num(to)?, num(step)?);
        if step == 0 || from > to {
            return Err(format!("range {s:?} is empty (want A-B/S with A ≤ B and S ≥ 1)"));
        }
        Ok(Sizes((from..=to).step_by(step).collect()))
    }
}

/// A peer system timed beside our protocols.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// MLS (RFC 9420) via mls-rs.
    Mls,
    /// No peer.
    None,
}

/// Per-operation and per-message costs, in milliseconds.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CostModel {
    pub exp: f64,
    /// An exponentiation of the generator (Ristretto's from a table; the
    /// same as `exp` for MODP and on the 2002 testbed).
    pub exp_g: f64,
    pub small_exp: f64,
    pub sign: f64,
    pub verify: f64,
    /// One signature verified in a batch (Ed25519's batch verification of
    /// a session's envelopes); `verify` where there is no batch (RSA, and
    /// the 2002 testbed).
    pub verify_batched: f64,
    /// Overhead of delivering one agreed multicast or unicast.
    pub multicast: f64,
    /// CPU a member spends receiving one message (§6.1.1: an all-to-all round
    /// of agreed multicasts took about 2 ms at 2 members and 21 ms at 50, so
    /// roughly 0.4 ms per message received on the 2002 testbed).
    pub receive: f64,
    /// Membership service time for 2 members; grows linearly to 4× at 50.
    pub membership_2: f64,
    /// The TISSEC testbed of [`model`]: per-machine costs, CPUs, Spread's
    /// token ring and the membership service of §6 (on the simulator's
    /// testbed; the fields above are its 666 MHz PIII and are what a cluster
    /// placement is charged).
    #[serde(skip)]
    pub tissec: bool,
}

impl CostModel {
    fn cpu(&self, c: Costs) -> f64 {
        c.exps as f64 * self.exp
            + c.small_exps as f64 * self.small_exp
            + c.sigs as f64 * self.sign
            + c.verifs as f64 * self.verify
    }

    fn membership(&self, n: usize) -> f64 {
        self.membership_2 * (1.0 + 3.0 * (n.saturating_sub(2) as f64) / 48.0)
    }

    fn build(from: CostsFrom, group: GroupId, scheme: SignatureId) -> Result<Self> {
        Ok(match from {
            CostsFrom::Tissec2002 => {
                let m = model::PIII_666;
                let exp = match group {
                    GroupId::Modp1024 => m.exp512 * model::EXP_1024_OVER_512,
                    _ => m.exp512,
                };
                CostModel {
                    exp,
                    small_exp: exp * model::SMALL_EXP_FRACTION,
                    sign: m.sign,
                    verify: m.verify,
                    exp_g: exp,
                    // The 2002 testbed signed with RSA: no batches.
                    verify_batched: m.verify,
                    multicast: model::LAN_AGREED_MS,
                    receive: model::RECEIVE_MS,
                    membership_2: model::membership_ms(Wan::Lan, TimedEvent::Join, 2),
                    tissec: true,
                }
            }
            CostsFrom::Measured => {
                // The least of several medians, a few milliseconds apart:
                // load from elsewhere only ever adds time, and one median
                // taken in a slow moment once raised every bound of a run
                // 2.5-fold (BD then came out below its own work bound).
                let rounds =
                    (0..COST_ROUNDS).map(|_| crypto::measure_suite(group, scheme, 100)).collect::<Result<Vec<_>>>()?;
                let get = |op: &str| {
                    rounds
                        .iter()
                        .filter_map(|ops| ops.iter().find(|c| c.op == op).map(|c| c.median_us / 1000.0))
                        .reduce(f64::min)
                        .unwrap_or(0.0)
                };
                CostModel {
                    exp: get("exp (variable base)"),
                    exp_g: get("exp (generator)"),
                    small_exp: get("exp (small, e=31)"),
                    sign: get("sign (200 B)"),
                    verify: get("verify (200 B)"),
                    verify_batched: match get(crypto::BATCH_VERIFY_OP) {
                        0.0 => get("verify (200 B)"),
                        batched => batched,
                    },
                    multicast: 0.16,
                    receive: 0.005,
                    membership_2: 0.7,
                    tissec: false,
                }
            }
        })
    }
}

/// The network and membership time of a one-round rekey started by member 0,
/// charged as the simulator charges it: the membership service's view, one
/// agreed multicast from member 0's machine to the farthest member, and
/// receiving it. Used for the MLS peer, whose commit is one such round.
pub(super) fn one_round_network_ms(model: &CostModel, wan: Wan, n: usize) -> f64 {
    let from = site(0, wan);
    let far = (0..n).map(|i| one_way(from, site(i % MACHINES, wan))).fold(0.0, f64::max);
    model.membership(n) + model.multicast + far + model.receive
}

const CPUS: usize = 2;

/// Rounds of `conclave bench crypto`'s measurement behind the `measured`
/// costs (each 100 timed runs per operation; the least median is taken).
const COST_ROUNDS: usize = 5;

/// One run's result.
#[derive(Debug)]
struct RunResult {
    total_ms: f64,
    /// The critical path: when the last member would install with a CPU of its own.
    bound_ms: f64,
    /// The total work: every member's metered crypto work, machine by
    /// machine, divided by that machine's CPUs; the busiest machine's.
    work_bound_ms: f64,
    /// Every member's metered crypto work, summed (ms).
    work_ms: f64,
    /// After a partition: when each side (first, second) last installed.
    sides_ms: Option<[f64; 2]>,
}

/// What a member's CPU does in one job.
enum Job {
    /// Handling the new view: the engine already did it (all members at
    /// once, inside the simulator); `work` ms of CPU, then `outputs` are sent.
    View { work: f64, installed: bool, outputs: Vec<Delivery<Msg>> },
    /// Handling one delivered message, which would have arrived at
    /// `ideal_arrival` with unlimited CPUs.
    Deliver { d: Delivery<Msg>, ideal_arrival: f64 },
}

#[allow(clippy::too_many_arguments)]
fn run_once(
    protocol: ProtocolId,
    event: TimedEvent,
    n: usize,
    group: GroupId,
    scheme: SignatureId,
    model: &CostModel,
    place: Placement,
    seed: u64,
) -> Result<RunResult> {
    let mut h = Harness::new(protocol, group, scheme, seed, Flush::All);
    let ids = h.add_members(n).context("identities")?;
    let machine_of = place.machine_of(n, seed);
    let (first, second) = match event {
        TimedEvent::PartitionP1 | TimedEvent::PartitionP2 => odd_even(&ids),
        TimedEvent::PartitionHalves => halves(&ids),
        _ => place.sides(&ids, &machine_of),
    };
    if first.is_empty() || second.is_empty() {
        bail!("{n} members cannot partition into two sides on {} machines", place.machines);
    }
    match event {
        TimedEvent::Join => {
            h.event(|s| s.join(&ids[..n - 1], None))?;
        }
        TimedEvent::Leave | TimedEvent::Partition | TimedEvent::PartitionP1 | TimedEvent::PartitionHalves => {
            h.event(|s| s.join(&ids, None))?;
        }
        TimedEvent::Merge => {
            h.event(|s| s.join(&ids, None))?;
            h.event(|s| s.partition(vec![first.clone(), second.clone()]))?;
        }
        TimedEvent::PartitionP2 => {
            h.event(|s| s.join(&ids, None))?;
            h.event(|s| s.partition(vec![first.clone(), second.clone()]))?;
            h.event(|s| s.merge(&first[0], &second[0]))?;
        }
    }
    let placement: BTreeMap<MemberId, usize> = ids.iter().cloned().zip(machine_of.iter().copied()).collect();
    // The paper's testbed (model.rs) on the simulator's 13 machines; a cluster's
    // nodes get the reference machine's costs and direct delays.
    let paper = model.tissec && place.is_sim();
    let bed = model::testbed(place.wan);
    let cpu = |m: &MemberId, c: Costs| if paper { model::cpu_ms(&bed[placement[m]], group, c) } else { model.cpu(c) };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x1ea7_0016);
    let before: BTreeMap<MemberId, (Costs, usize)> = ids
        .iter()
        .map(|m| {
            let node = h.sim_ref().node(m).expect("member");
            (m.clone(), (node.engine.costs(), node.installs.len()))
        })
        .collect();
    h.reset_paths();
    let leaver = ids[leaver_index(protocol, n, &mut rng)].clone();
    // Where Spread's token is when the event happens (model.rs).
    let ring = paper.then(|| model::Ring::new(place.wan, (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64));
    match event {
        TimedEvent::Join => h.sim().join(&ids[n - 1..], Some(&ids[0]))?,
        TimedEvent::Leave => h.sim().leave(std::slice::from_ref(&leaver))?,
        TimedEvent::Partition | TimedEvent::PartitionP1 | TimedEvent::PartitionP2 | TimedEvent::PartitionHalves => {
            h.sim().partition(vec![first.clone(), second.clone()])?
        }
        TimedEvent::Merge => h.sim().merge(&first[0], &second[0])?,
    }
    let index: BTreeMap<MemberId, usize> = ids.iter().enumerate().map(|(i, m)| (m.clone(), i)).collect();
    let cpus = if paper { bed.iter().map(|m| m.cpus).collect() } else { vec![CPUS; place.machines] };
    let mut sched: Scheduler<Job> = Scheduler::new(machine_of.clone(), cpus.clone());
    // Crypto work per machine (ms), for the work bound.
    let mut machine_work = vec![0.0f64; cpus.len()];
    let mut installed_at: BTreeMap<MemberId, f64> = BTreeMap::new();
    let view_at = if paper { model::membership_ms(place.wan, event, n) } else { model.membership(n) };
    // Every member of the new views handled its view at once inside the
    // simulator; each member's CPU does that work when the view arrives.
    // Per member: when it would be done with what it has seen, given unlimited CPUs.
    let mut ideal: BTreeMap<MemberId, f64> = BTreeMap::new();
    let mut ideal_install: f64 = 0.0;
    let members: Vec<MemberId> =
        h.sim_ref().views().iter().flat_map(|v| v.ids().cloned().collect::<Vec<_>>()).collect();
    let mut outputs: BTreeMap<MemberId, Vec<Delivery<Msg>>> = BTreeMap::new();
    for d in h.sim().take_pending() {
        outputs.entry(d.from.clone()).or_default().push(d);
    }
    for m in &members {
        let node = h.sim_ref().node(m).expect("member");
        let work = cpu(m, node.engine.costs() - before[m].0);
        machine_work[placement[m]] += work;
        let installed = node.installs.len() > before[m].1;
        ideal.insert(m.clone(), view_at + work);
        if installed {
            ideal_install = ideal_install.max(ideal[m]);
        }
        let outputs = outputs.remove(m).unwrap_or_default();
        sched.arrive(index[m], view_at, Job::View { work, installed, outputs });
    }
    // Sends `d` at `at` (`ideal`: when it would be sent with unlimited CPUs).
    let send = |h: &Harness, sched: &mut Scheduler<Job>, d: Delivery<Msg>, at: f64, ideal: f64| {
        let Some(view) = h.sim_ref().view_of(&d.from).cloned() else { return };
        let from = placement[&d.from];
        let s_site = place.site(from);
        match &d.to {
            Some(r) => {
                let arrival = |t: f64| match &ring {
                    Some(ring) => ring.unicast_arrival(from, placement[r], t),
                    None => t + model.multicast + one_way(s_site, place.site(placement[r])),
                };
                let (r, at, ideal) = (index[r], arrival(at), arrival(ideal));
                sched.arrive(r, at, Job::Deliver { d, ideal_arrival: ideal });
            }
            None => {
                let far = view.ids().map(|r| one_way(s_site, place.site(placement[r]))).fold(0.0, f64::max);
                let arrival = |t: f64| match &ring {
                    Some(ring) => ring.multicast_arrival(from, t),
                    None => t + model.multicast + far,
                };
                let (at, ideal) = (arrival(at), arrival(ideal));
                for r in view.ids() {
                    sched.arrive(index[r], at, Job::Deliver { d: d.clone(), ideal_arrival: ideal });
                }
            }
        }
    };
    let mut steps = 0u64;
    while let Some(start) = sched.next() {
        steps += 1;
        if steps > 50_000_000 {
            bail!("{protocol} {event:?} n={n}: run does not end");
        }
        let to = ids[start.member].clone();
        let (work, installed, ideal_end, out) = match start.job {
            Job::View { work, installed, outputs } => (work, installed, ideal[&to], outputs),
            Job::Deliver { d, ideal_arrival } => {
                let (c0, i0) = {
                    let node = h.sim_ref().node(&to).expect("member");
                    (node.engine.costs(), node.installs.len())
                };
                let out = h.sim().deliver_to(&to, &d)?;
                let node = h.sim_ref().node(&to).expect("member");
                let crypto = cpu(&to, node.engine.costs() - c0);
                machine_work[placement[&to]] += crypto;
                let work = model.receive + crypto;
                let ideal_end = ideal.get(&to).copied().unwrap_or(0.0).max(ideal_arrival) + work;
                ideal.insert(to.clone(), ideal_end);
                let out = out.into_iter().map(|o| Delivery { view: d.view, from: to.clone(), to: o.to, msg: o.msg });
                (work, node.installs.len() > i0, ideal_end, out.collect())
            }
        };
        let end = start.start + work;
        sched.finish(start.member, end);
        if installed {
            installed_at.insert(to.clone(), end);
            ideal_install = ideal_install.max(ideal_end);
        }
        for d in out {
            send(&h, &mut sched, d, end, ideal_end);
        }
    }
    if let Err(e) = h.check_agreement() {
        bail!("{protocol} {event:?} n={n}: {e}");
    }
    // When the last of `ms` installed.
    let last_install =
        |ms: &[MemberId]| ms.iter().map(|m| installed_at.get(m).copied().unwrap_or(f64::NAN)).fold(0.0, f64::max);
    let total_ms = last_install(&members);
    let bound_ms = ideal_install;
    let work_bound_ms = machine_work.iter().zip(&cpus).map(|(w, &c)| w / c as f64).fold(0.0, f64::max);
    let sides_ms = matches!(
        event,
        TimedEvent::Partition | TimedEvent::PartitionP1 | TimedEvent::PartitionP2 | TimedEvent::PartitionHalves
    )
    .then(|| [last_install(&first), last_install(&second)]);
    let work_ms = machine_work.iter().sum();
    Ok(RunResult { total_ms, bound_ms, work_bound_ms, work_ms, sides_ms })
}

/// Which member (by join order) of `n` leaves. §6.1.2: STR's leaver is the
/// middle of the chain (the paper tested its average case); anyone else's is
/// drawn at random, so CKD's controller (the oldest) leaves with probability 1/n.
fn leaver_index(protocol: ProtocolId, n: usize, rng: &mut impl RngCore) -> usize {
    match protocol {
        ProtocolId::Str => n / 2,
        _ => (rng.next_u64() % n as u64) as usize,
    }
}

/// The protocol name of the membership line's points.
const MEMBERSHIP: &str = "membership";

/// One point of the output.
#[derive(Serialize, Debug)]
pub struct Point {
    /// A protocol's name, or [`MEMBERSHIP`].
    pub protocol: String,
    pub event: TimedEvent,
    pub n: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    /// `None` (JSON null) for the membership line: it has no cryptography.
    pub bound_ms: Option<f64>,
    pub ratio_to_bound: Option<f64>,
    /// Every member's metered crypto work divided by the CPUs they share
    /// (per machine; the busiest): what the fastest implementation needs
    /// when members share CPUs. `None` for the membership line.
    pub work_bound_ms: Option<f64>,
    pub ratio_to_work_bound: Option<f64>,
    /// CPU of all members together for the event, ms (mean over runs): on
    /// the simulator their modelled crypto work; on the daemon engine what
    /// this process (every member, and an embedded daemon) measured. `None`
    /// where not measured (a cluster's partition or merge).
    pub cpu_ms: Option<f64>,
    /// The op-count bound: every member's metered crypto work summed
    /// (exponentiations × exponentiation cost + signatures × signing cost +
    /// verifications × verification cost at this run's costs), *not* divided
    /// by CPUs: what `cpu_ms` would be if the members did nothing but their
    /// key agreement's counted operations. `None` for the membership line.
    pub op_bound_ms: Option<f64>,
    /// `cpu_ms` ÷ `op_bound_ms`, where both are known.
    pub ratio_to_op_bound: Option<f64>,
    /// The daemon engine: every exponentiation, subgroup check, signature
    /// and verification this process really did for the event (mean over
    /// runs; `conclave_gka::suite::tally`), at this run's costs: the
    /// protocol's own operations and those the op-count bound leaves out
    /// (MODP's subgroup checks, key confirmation, the envelopes' signatures).
    /// `cpu_ms` beyond it is what the session, the daemon and the system
    /// spent on everything but cryptography.
    pub crypto_ms: Option<f64>,
    /// `cpu_ms` ÷ `crypto_ms`.
    pub ratio_to_crypto: Option<f64>,
    /// Of `crypto_ms`'s operations, the subgroup checks (mean count).
    pub subgroup_checks: Option<f64>,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

impl Point {
    /// The point of `times` (ms, any order) against `bound`.
    fn new(protocol: ProtocolId, event: TimedEvent, n: usize, times: Vec<f64>, bounds: (f64, f64)) -> Point {
        Self::of(protocol.name(), event, n, times, Some(bounds))
    }

    /// The membership line's point of `times` (ms, any order): no bound.
    fn membership(event: TimedEvent, n: usize, times: Vec<f64>) -> Point {
        Self::of(MEMBERSHIP, event, n, times, None)
    }

    /// `bounds`: the critical path and the work bound.
    fn of(protocol: &str, event: TimedEvent, n: usize, mut times: Vec<f64>, bounds: Option<(f64, f64)>) -> Point {
        times.sort_by(f64::total_cmp);
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        Point {
            protocol: protocol.into(),
            event,
            n,
            mean_ms: mean,
            p50_ms: percentile(&times, 0.5),
            p95_ms: percentile(&times, 0.95),
            bound_ms: bounds.map(|b| b.0),
            ratio_to_bound: bounds.map(|b| mean / b.0),
            work_bound_ms: bounds.map(|b| b.1),
            ratio_to_work_bound: bounds.map(|b| mean / b.1),
            cpu_ms: None,
            op_bound_ms: None,
            ratio_to_op_bound: None,
            crypto_ms: None,
            ratio_to_crypto: None,
            subgroup_checks: None,
        }
    }

    /// Sets the CPU all members spent and the operations they did, each
    /// where measured in every run (the daemon engine).
    fn with_measured(mut self, samples: &[super::live::Sample], model: &CostModel) -> Point {
        self.cpu_ms = mean_cpu(samples);
        let ops: Option<Vec<_>> = samples.iter().map(|s| s.ops).collect();
        if let Some(ops) = ops.filter(|o| !o.is_empty()) {
            let runs = ops.len() as f64;
            let ms = |t: &conclave_gka::suite::tally::Tally| {
                (t.exponentiations + t.subgroup_checks) as f64 * model.exp
                    + t.generator_exponentiations as f64 * model.exp_g
                    + t.signatures as f64 * model.sign
                    + t.verifications as f64 * model.verify
                    + t.batch_verifications as f64 * model.verify_batched
            };
            let crypto = ops.iter().map(ms).sum::<f64>() / runs;
            if crypto == 0.0 {
                // Plain clients (the membership line): nothing to compare.
                return self;
            }
            self.crypto_ms = Some(crypto);
            self.ratio_to_crypto = self.cpu_ms.map(|c| c / crypto);
            self.subgroup_checks = Some(ops.iter().map(|t| t.subgroup_checks as f64).sum::<f64>() / runs);
        }
        self
    }

    /// Sets the op-count bound (and `cpu_ms` against it, if measured).
    /// The simulator: its members' CPU is their modelled crypto work, which
    /// is also the op-count bound.
    fn with_sim_cpu(mut self, work_ms: f64) -> Point {
        self.cpu_ms = Some(work_ms);
        self.with_op_bound(work_ms)
    }

    fn with_op_bound(mut self, op_bound_ms: f64) -> Point {
        self.op_bound_ms = Some(op_bound_ms);
        self.ratio_to_op_bound = self.cpu_ms.map(|c| c / op_bound_ms);
        self
    }
}

/// The original Cliques library's CPU for an event, summed over all members
/// (ms): issue 17's measurements on this machine kind, with 2048/256 DH and
/// RSA-2048; `None` where none was taken.
pub fn cliques_ms(protocol: &str, event: TimedEvent, n: usize) -> Option<f64> {
    let ms = match (protocol, event, n) {
        ("tgdh", TimedEvent::Leave, 64) => 150.0,
        ("tgdh", TimedEvent::Leave, 128) => 251.0,
        ("tgdh", TimedEvent::Join, 64) => 268.0,
        ("tgdh", TimedEvent::Join, 128) => 405.0,
        ("str", TimedEvent::Join, 64) => 220.0,
        ("str", TimedEvent::Join, 128) => 399.0,
        ("gdh", TimedEvent::Leave, 64) => 51.0,
        ("gdh", TimedEvent::Leave, 128) => 105.0,
        ("bd", TimedEvent::Join, 64) => 2411.0,
        ("bd", TimedEvent::Join, 128) => 10326.0,
        ("ckd", TimedEvent::Leave, 64) => 248.0,
        ("ckd", TimedEvent::Leave, 128) => 470.0,
        _ => return None,
    };
    Some(ms)
}

/// The points table.
fn write_points(out: &mut impl Write, points: &[Point]) -> std::io::Result<()> {
    let header = [
        "proto", "event", "n", "mean", "p50", "p95", "bound", "÷bound", "work", "÷work", "cpu Σ", "op bound", "÷op",
        "crypto", "÷crypto",
    ];
    let mut t = crate::table::new(header, 2);
    for p in points {
        t.add_row(vec![
            p.protocol.to_string(),
            event_name(p.event),
            p.n.to_string(),
            format!("{:.2}", p.mean_ms),
            format!("{:.2}", p.p50_ms),
            format!("{:.2}", p.p95_ms),
            crate::table::or_dash(p.bound_ms, 2),
            crate::table::or_dash(p.ratio_to_bound, 2),
            crate::table::or_dash(p.work_bound_ms, 2),
            crate::table::or_dash(p.ratio_to_work_bound, 2),
            crate::table::or_dash(p.cpu_ms, 2),
            crate::table::or_dash(p.op_bound_ms, 2),
            crate::table::or_dash(p.ratio_to_op_bound, 2),
            crate::table::or_dash(p.crypto_ms, 2),
            crate::table::or_dash(p.ratio_to_crypto, 2),
        ]);
    }
    writeln!(out, "{t}")
}

/// The points that have a Cliques measurement beside them (issue 17): all
/// members' CPU for the event, Conclave's and Cliques's.
fn write_cliques(out: &mut impl Write, points: &[Point]) -> std::io::Result<()> {
    let rows: Vec<(&Point, f64, f64)> =
        points.iter().filter_map(|p| Some((p, p.cpu_ms?, cliques_ms(&p.protocol, p.event, p.n)?))).collect();
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nBeside Cliques (C, 2002; all members' CPU for the event, measured with 2048/256 DH and RSA-2048 on this \
         machine kind), ms: cpu Σ against Cliques's sum and against this run's op-count bound; checks = the \
         subgroup checks done (MODP: one exponentiation each, which the op-count bound does not count), crypto = \
         every exponentiation, check, signature and verification done, at this run's costs."
    )?;
    let header = [
        "proto",
        "event",
        "n",
        "Cliques Σ",
        "cpu Σ",
        "Cliques ÷ cpu",
        "op bound",
        "cpu ÷ op",
        "checks",
        "crypto",
        "cpu ÷ crypto",
    ];
    let mut t = crate::table::new(header, 2);
    for (p, cpu, cliques) in rows {
        t.add_row(vec![
            p.protocol.clone(),
            event_name(p.event),
            p.n.to_string(),
            format!("{cliques:.0}"),
            format!("{cpu:.2}"),
            format!("{:.2}", cliques / cpu),
            crate::table::or_dash(p.op_bound_ms, 2),
            crate::table::or_dash(p.ratio_to_op_bound, 2),
            crate::table::or_dash(p.subgroup_checks, 0),
            crate::table::or_dash(p.crypto_ms, 2),
            crate::table::or_dash(p.ratio_to_crypto, 2),
        ]);
    }
    writeln!(out, "{t}")
}

/// The mean CPU of `samples`, if every one was measured.
fn mean_cpu(samples: &[super::live::Sample]) -> Option<f64> {
    let cpu: Option<Vec<f64>> = samples.iter().map(|s| s.cpu_ms).collect();
    cpu.filter(|c| !c.is_empty()).map(|c| c.iter().sum::<f64>() / c.len() as f64)
}

/// A point as it is measured (on stderr, above the progress bar): the table
/// comes once all are in.
fn point_line(p: &Point, done: usize, total: usize) -> String {
    format!("[{done}/{total}] {} {} n={}: mean {:.2} ms", p.protocol, event_name(p.event), p.n, p.mean_ms)
}

/// After the daemon engine's table: each protocol's mean minus the
/// membership line's mean at the same event and size, in ms, i.e. what key
/// agreement adds on top of the membership service (Fig. 16). Nothing
/// without membership points.
fn write_over_membership(out: &mut impl Write, points: &[Point], lines_of: &[String]) -> std::io::Result<()> {
    let lines: Vec<&Point> = points.iter().filter(|p| p.protocol == MEMBERSHIP).collect();
    if lines.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nKey agreement on top of membership: each protocol's mean minus the membership line's mean (plain \
         clients, same event), ms."
    )?;
    let mut header = vec!["event".to_string(), "n".to_string(), MEMBERSHIP.to_string()];
    header.extend(lines_of.iter().cloned());
    let mut t = crate::table::new(header, 1);
    for m in lines {
        let mut cells = vec![event_name(m.event), m.n.to_string(), format!("{:.2}", m.mean_ms)];
        for line in lines_of {
            let p = points.iter().find(|p| p.event == m.event && p.n == m.n && p.protocol == *line);
            cells.push(p.map_or_else(|| "-".to_string(), |p| format!("{:+.2}", p.mean_ms - m.mean_ms)));
        }
        t.add_row(cells);
    }
    writeln!(out, "{t}")
}

/// The groups the daemons key, by their `--protocols` names (see [`Policy`]'s
/// names): the daemon engine times them beside the protocols.
const KEYED_MODES: [&str; 2] = ["integrated-vs", "optimized-evs"];

/// After the daemon engine's tables: each group the daemons key against the
/// membership line, as a ratio of means (issue 14: a join or leave in such a
/// group costs the membership change plus one HMAC per member, and the
/// target is within 1.2×). Nothing without membership points or keyed lines.
fn write_keyed_over_membership(out: &mut impl Write, points: &[Point], keyed: &[String]) -> std::io::Result<()> {
    let lines: Vec<&Point> = points.iter().filter(|p| p.protocol == MEMBERSHIP).collect();
    if lines.is_empty() || keyed.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nKeyed by the daemons against membership: each mode's mean ÷ the membership line's mean (same event and \
         size; the target is 1.2×), and its CPU Σ ÷ the membership line's."
    )?;
    let mut header = vec!["event".to_string(), "n".to_string(), MEMBERSHIP.to_string()];
    for mode in keyed {
        header.extend([mode.clone(), "÷ membership".into(), "cpu ÷ membership".into()]);
    }
    let mut t = crate::table::new(header, 1);
    for m in lines {
        let mut cells = vec![event_name(m.event), m.n.to_string(), format!("{:.2}", m.mean_ms)];
        for mode in keyed {
            match points.iter().find(|p| p.event == m.event && p.n == m.n && p.protocol == *mode) {
                Some(p) => cells.extend([
                    format!("{:.2}", p.mean_ms),
                    format!("{:.2}", p.mean_ms / m.mean_ms),
                    match (p.cpu_ms, m.cpu_ms) {
                        (Some(c), Some(mc)) if mc > 0.0 => format!("{:.2}", c / mc),
                        _ => "-".into(),
                    },
                ]),
                None => cells.extend(["-".to_string(), "-".into(), "-".into()]),
            }
        }
        t.add_row(cells);
    }
    writeln!(out, "{t}")
}

/// Runs the benchmark.
pub fn run(args: EventsArgs) -> Result<()> {
    let (keyed, layered): (Vec<String>, Vec<String>) =
        args.protocols.iter().cloned().partition(|p| KEYED_MODES.contains(&p.as_str()));
    let protocols = conclave_testkit::names::protocols(&layered)
        .context("--protocols: also integrated-vs or optimized-evs with --engine daemon")?;
    if protocols.is_empty() && keyed.is_empty() {
        bail!("--protocols names no protocol");
    }
    if !keyed.is_empty() && args.engine != EngineKind::Daemon {
        bail!(
            "{} is keyed by the daemons: time it on real daemons with --engine daemon, or on the simulated daemons \
             with `conclave bench integrated --figures 5`",
            keyed[0]
        );
    }
    let group = conclave_testkit::names::group(&args.suite)?;
    let scheme = conclave_testkit::names::signature(&args.signature)?;
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let sizes: Vec<usize> = args.sizes.iter().flat_map(|s| s.0.iter().copied()).collect();
    if let Some(&bad) = sizes.iter().find(|&&n| !(2..=1000).contains(&n)) {
        bail!("group size {bad} out of range (2..=1000)");
    }
    let peer_sizes = peer_sizes(&args, &sizes)?;
    if args.engine == EngineKind::Daemon {
        if args.costs != CostsFrom::Measured {
            bail!("--engine daemon runs on this machine: give --costs measured (its bound uses this machine's costs)");
        }
        if let Some(&e) = args
            .events
            .iter()
            .find(|e| matches!(e, TimedEvent::PartitionP1 | TimedEvent::PartitionP2 | TimedEvent::PartitionHalves))
        {
            bail!(
                "{} is the simulator's odd/even split (Fig. 13); on the daemon engine a partition splits the \
                 cluster's nodes, and every run after the first repeats the same split: use --events partition",
                event_name(e)
            );
        }
        if args.cluster.is_none() && args.events.iter().any(|e| e.needs_a_network()) {
            bail!(
                "--engine daemon without --cluster times join and leave only (a standalone daemon cannot partition): \
                 use --events join,leave, or --cluster N"
            );
        }
    } else if args.cluster.is_some() {
        bail!("--cluster runs real daemons: give --engine daemon");
    }
    let model = CostModel::build(args.costs, group, scheme)?;
    let mut out = std::io::stdout().lock();
    if args.engine == EngineKind::Daemon {
        // The daemon engine's network is real (loopback, or the cluster's
        // namespaces with the WAN delay hub): the bound and the MLS peer get
        // no modelled membership or per-message costs, and the bound gets the
        // WAN's one-way delays only with --wan (from its placement).
        let model = CostModel { multicast: 0.0, receive: 0.0, membership_2: 0.0, ..model };
        let points = daemon_points(&args, &protocols, &keyed, &sizes, group, scheme, &model, &mut out)?;
        return finish(&args, &protocols, &peer_sizes, points, &model, &mut out);
    }
    writeln!(
        out,
        "Time until every member has the new key, virtual ms ({:?} costs: exp {:.3}, sign {:.3}, verify {:.3}, message {:.2}; {:?} network; {} runs per point).",
        args.costs, model.exp, model.sign, model.verify, model.multicast, args.wan, args.runs
    )?;
    let mut points = Vec::new();
    let mut sides = Vec::new();
    let total = args.events.len() * protocols.len() * sizes.len();
    let progress = progress_bar((total * args.runs) as u64);
    let mut done = 0;
    for &event in &args.events {
        for &protocol in &protocols {
            for &n in &sizes {
                done += 1;
                let mut times = Vec::new();
                let mut bounds = Vec::new();
                let mut work_bounds = Vec::new();
                let mut works = Vec::new();
                let mut side_sums = Some([0.0; 2]);
                for r in 0..args.runs {
                    progress.set_message(format!(
                        "{} {} n={n} run {}/{}",
                        protocol.name(),
                        event_name(event),
                        r + 1,
                        args.runs
                    ));
                    let res = run_once(
                        protocol,
                        event,
                        n,
                        group,
                        scheme,
                        &model,
                        Placement::sim(args.wan),
                        args.seed + r as u64,
                    )?;
                    progress.inc(1);
                    times.push(res.total_ms);
                    bounds.push(res.bound_ms);
                    work_bounds.push(res.work_bound_ms);
                    works.push(res.work_ms);
                    side_sums = side_sums.zip(res.sides_ms).map(|(a, b)| [a[0] + b[0], a[1] + b[1]]);
                }
                if let Some([a, b]) = side_sums {
                    let runs = args.runs as f64;
                    sides.push(SidesRow {
                        protocol: protocol.name(),
                        event,
                        n,
                        first_ms: a / runs,
                        second_ms: b / runs,
                    });
                }
                let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
                let p = Point::new(protocol, event, n, times, (mean(&bounds), mean(&work_bounds)))
                    .with_sim_cpu(mean(&works));
                // Printed above the bar so the two do not tear each other.
                progress.suspend(|| eprintln!("{}", point_line(&p, done, total)));
                points.push(p);
            }
        }
    }
    progress.finish_and_clear();
    write_points(&mut out, &points)?;
    write_sides(&mut out, &sides, &args)?;
    finish(&args, &protocols, &peer_sizes, points, &model, &mut out)
}

/// The mean time of each side of a partition, as Fig. 13 plots them.
struct SidesRow {
    protocol: &'static str,
    event: TimedEvent,
    n: usize,
    first_ms: f64,
    second_ms: f64,
}

/// Prints each partition's two sides apart (and writes `sides.csv` with `--out`):
/// Fig. 13 shows them apart, since a side's cost depends on where its members
/// sit in the tree and on whether it keeps CKD's controller.
fn write_sides(out: &mut impl Write, rows: &[SidesRow], args: &EventsArgs) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "\nEach side of a partition, mean virtual ms until its last member has its key (first side: the members on \
         the lower-numbered machines for partition, the first n/2 members for partition-halves, the odd-numbered \
         ones (1st, 3rd, …) with the oldest member for partition-p1/p2; second: the rest)."
    )?;
    let mut t = crate::table::new(["proto", "event", "n", "first", "second"], 2);
    let mut records = vec![csv_record(["protocol", "event", "n", "first_side_ms", "second_side_ms"])];
    for r in rows {
        let event = event_name(r.event);
        let (first, second) = (format!("{:.2}", r.first_ms), format!("{:.2}", r.second_ms));
        t.add_row(vec![r.protocol.to_string(), event.clone(), r.n.to_string(), first, second]);
        records.push(vec![r.protocol.into(), event, r.n.to_string(), ms3(r.first_ms), ms3(r.second_ms)]);
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        write_csv(&dir.join("sides.csv"), &records)?;
    }
    writeln!(out, "{t}")?;
    Ok(())
}

/// The daemon engine ([`super::live`]): every point timed over real daemons
/// with real sessions. The bound beside it is the simulator's
/// contention-free critical path of the same event charged at this
/// machine's crypto costs with no membership or receive time (`model` has
/// no such terms), with the members placed as on the daemons (one machine
/// per cluster node); on the WAN each message on the path adds its one-way
/// delay between the nodes' sites. What the cryptography and the wire alone
/// need when every member has a CPU of its own.
///
/// Unless `--no-membership`, each event and size is first timed with plain
/// group communication clients (the membership line, [`MEMBERSHIP`]), and a
/// table of what each protocol adds on top of it follows the points.
#[allow(clippy::too_many_arguments)]
fn daemon_points(
    args: &EventsArgs,
    protocols: &[ProtocolId],
    keyed: &[String],
    sizes: &[usize],
    group: GroupId,
    scheme: SignatureId,
    model: &CostModel,
    out: &mut impl Write,
) -> Result<Vec<Point>> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let target = super::live::Target::start(args.cluster, args.wan, out)?;
    let daemons = match args.cluster {
        Some(nodes) => format!("{nodes} cluster daemons over Corosync"),
        None => "an embedded daemon".into(),
    };
    let network = match args.wan {
        Wan::Lan => "no network",
        Wan::Tissec2002 => "plus each message's one-way WAN delay on that path (rounds × one-way latency)",
    };
    writeln!(
        out,
        "Time until every member shows the new secure view, wall-clock ms: {daemons}, every member a secure \
         session on this machine ({cpus} CPUs shared by all members and daemons); bound = the simulator's crypto \
         critical path of the same event at this machine's costs (exp {:.3}, sign {:.3}, verify {:.3} ms), with the \
         same placement, {network}; it leaves out the daemons, Corosync and its failure detection; work = every \
         member's metered crypto work at the same costs, summed, over this machine's {cpus} CPUs; {} runs per point.",
        model.exp, model.sign, model.verify, args.runs
    )?;
    let membership = !args.no_membership;
    if membership {
        writeln!(
            out,
            "{MEMBERSHIP}: the same event with plain group communication clients (no key agreement, no secure \
             session), same placement and leavers, until every member has the new view: the membership service's \
             share of every protocol's time (Fig. 16); no bound."
        )?;
    }
    if !keyed.is_empty() {
        writeln!(
            out,
            "{}: groups the daemons key (the integrated architecture): every member takes the view's key from its \
             daemon, one HMAC of the daemons' key, which the daemons confirmed among themselves; no member key \
             agreement or confirmation, so no bound: compared with the membership line.",
            keyed.join(", ")
        )?;
    }
    let lines = protocols.len() + keyed.len() + usize::from(membership);
    let total = args.events.len() * lines * sizes.len();
    let progress = progress_bar(total as u64);
    let mut points = Vec::new();
    for &event in &args.events {
        if membership {
            for &n in sizes {
                progress.set_message(format!("{MEMBERSHIP} {} n={n} (daemon)", event_name(event)));
                let samples = target.time_membership(event, n, args.runs, args.seed)?;
                let p =
                    Point::membership(event, n, samples.iter().map(|s| s.ms).collect()).with_measured(&samples, model);
                progress.inc(1);
                progress.suspend(|| eprintln!("{}", point_line(&p, points.len() + 1, total)));
                points.push(p);
            }
        }
        for &protocol in protocols {
            for &n in sizes {
                progress.set_message(format!("{} {} n={n} (daemon)", protocol.name(), event_name(event)));
                let policy = Policy::new(protocol, group);
                let samples = target.time(policy, scheme, event, n, args.runs, args.seed)?;
                let times = samples.iter().map(|s| s.ms).collect();
                let once = run_once(protocol, event, n, group, scheme, model, target.placement(), args.seed)?;
                // Every member runs in this process, on this machine's CPUs
                // (a cluster's nodes are namespaces of this machine too): the
                // work bound is all members' work over those CPUs, not the
                // simulator's per-machine figure.
                let work_bound = once.work_ms / cpus as f64;
                let p = Point::new(protocol, event, n, times, (once.bound_ms, work_bound))
                    .with_measured(&samples, model)
                    .with_op_bound(once.work_ms);
                progress.inc(1);
                progress.suspend(|| eprintln!("{}", point_line(&p, points.len() + 1, total)));
                points.push(p);
            }
        }
        for mode in keyed {
            for &n in sizes {
                progress.set_message(format!("{mode} {} n={n} (daemon)", event_name(event)));
                let policy: Policy = mode.parse().map_err(|e| anyhow!("{e}"))?;
                let samples = target.time(policy, scheme, event, n, args.runs, args.seed)?;
                let p = Point::of(mode, event, n, samples.iter().map(|s| s.ms).collect(), None)
                    .with_measured(&samples, model);
                progress.inc(1);
                progress.suspend(|| eprintln!("{}", point_line(&p, points.len() + 1, total)));
                points.push(p);
            }
        }
    }
    progress.finish_and_clear();
    write_points(out, &points)?;
    let mut names: Vec<String> = protocols.iter().map(|p| p.name().to_string()).collect();
    names.extend(keyed.iter().cloned());
    write_over_membership(out, &points, &names)?;
    write_keyed_over_membership(out, &points, keyed)?;
    write_cliques(out, &points)?;
    Ok(points)
}

/// The sizes at which to time the peer: none without one or without joins
/// and leaves; an error for a peer that cannot be compared.
fn peer_sizes(args: &EventsArgs, sizes: &[usize]) -> Result<Vec<usize>> {
    let peer = match (args.peer, args.costs) {
        (Some(Peer::Mls), CostsFrom::Tissec2002) => bail!(
            "--peer mls needs --costs measured: MLS is timed on this machine, the tissec2002 costs are a 2002 testbed's"
        ),
        (Some(Peer::Mls), _) if args.engine == EngineKind::Daemon && args.wan != Wan::Lan => {
            bail!("--peer mls has no WAN network term on the daemon engine: leave --peer out, or use --wan lan")
        }
        (Some(p), _) => p,
        (None, _) if args.engine == EngineKind::Daemon && args.wan != Wan::Lan => Peer::None,
        (None, CostsFrom::Measured) => Peer::Mls,
        (None, CostsFrom::Tissec2002) => Peer::None,
    };
    Ok(match peer {
        Peer::Mls if args.events.iter().any(|e| matches!(e, TimedEvent::Join | TimedEvent::Leave)) => {
            sizes.iter().copied().filter(|&n| n >= 3).collect()
        }
        _ => Vec::new(),
    })
}

/// The MLS peer at `peer_sizes`, then the files of `--out`.
fn finish(
    args: &EventsArgs,
    protocols: &[ProtocolId],
    peer_sizes: &[usize],
    points: Vec<Point>,
    model: &CostModel,
    out: &mut impl Write,
) -> Result<()> {
    let progress = progress_bar(peer_sizes.len() as u64);
    let mut peer_rows = Vec::new();
    if !peer_sizes.is_empty() {
        // Warm-up, discarded: the first commits of a process pay for lazy
        // initialisation (allocator, tables) that later ones do not.
        super::mls::measure(3, args.seed)?;
    }
    for &n in peer_sizes {
        progress.set_message(format!("mls n={n}"));
        peer_rows.push(super::mls::measure_median(n, args.seed, args.runs)?);
        progress.inc(1);
    }
    progress.finish_and_clear();
    if !peer_rows.is_empty() {
        print_peer(out, &peer_rows, &points, protocols, args, model)?;
    }
    if let Some(dir) = &args.out {
        write_outputs(dir, &points, &peer_rows, model, args)?;
        writeln!(out, "wrote events.csv, events.json and charts (SVG, PNG) to {}", dir.display())?;
    }
    Ok(())
}

/// The MLS time for `event` at one size, in ms: members on their own CPUs, so
/// the network term, the commit and the slowest receiver add up.
fn mls_total(row: &super::mls::MlsSize, event: TimedEvent, model: &CostModel, wan: Wan) -> Option<f64> {
    let t = match event {
        TimedEvent::Join => row.join,
        TimedEvent::Leave => row.leave,
        _ => return None,
    };
    Some(one_round_network_ms(model, wan, row.n) + t.commit_ms + t.max_receive_ms)
}

fn print_peer(
    out: &mut impl Write,
    rows: &[super::mls::MlsSize],
    points: &[Point],
    protocols: &[ProtocolId],
    args: &EventsArgs,
    model: &CostModel,
) -> Result<()> {
    writeln!(
        out,
        "\nMLS peer: mls-rs, MLS_128_DHKEMX25519_AES128GCM_SHA256_Ed25519, RustCrypto; thread CPU ms on this machine, median of --runs runs per size (one above n = {}); \
         members on their own CPUs: membership + one message ({:?} network, as above) + commit + slowest timed receiver.",
        super::mls::MAX_REPEATED,
        args.wan
    )?;
    let mut header: Vec<String> = ["event", "n", "commit", "receive", "mls", "timed", "net"].map(String::from).into();
    for p in protocols {
        header.extend([p.name().to_string(), format!("{} ÷mls", p.name())]);
    }
    let mut table = crate::table::new(header, 1);
    for row in rows {
        for event in [TimedEvent::Join, TimedEvent::Leave] {
            if !args.events.contains(&event) {
                continue;
            }
            let t = if event == TimedEvent::Join { row.join } else { row.leave };
            let mls = mls_total(row, event, model, args.wan).expect("join or leave");
            let mut cells = vec![
                event_name(event),
                row.n.to_string(),
                format!("{:.2}", t.commit_ms),
                format!("{:.2}", t.max_receive_ms),
                format!("{mls:.2}"),
                format!("{}/{}", t.timed, t.receivers),
                format!("{:.2}", one_round_network_ms(model, args.wan, row.n)),
            ];
            for proto in protocols {
                match points.iter().find(|p| p.event == event && p.n == row.n && p.protocol == proto.name()) {
                    Some(p) => cells.extend([format!("{:.2}", p.mean_ms), format!("{:.2}", p.mean_ms / mls)]),
                    None => cells.extend(["-".to_string(), "-".to_string()]),
                }
            }
            table.add_row(cells);
        }
    }
    writeln!(out, "{table}")?;
    Ok(())
}

/// Lower-case event name, as on the command line.
fn event_name(event: TimedEvent) -> String {
    event.to_possible_value().expect("no skipped events").get_name().to_string()
}

/// One bar over all runs of all points, on stderr, and only when stderr is a
/// terminal: piped or redirected output stays exactly the table.
fn progress_bar(len: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg:28} {wide_bar} {pos}/{len} runs, ETA {eta}")
            .expect("static template"),
    );
    bar
}

/// A value in ms (or a ratio) as the CSV files give it: 3 decimals.
fn ms3(v: f64) -> String {
    format!("{v:.3}")
}

/// A header row.
fn csv_record<const N: usize>(fields: [&str; N]) -> Vec<String> {
    fields.iter().map(|f| f.to_string()).collect()
}

/// Writes `records` (the header first) to `path` with the `csv` crate.
fn write_csv(path: &std::path::Path, records: &[Vec<String>]) -> Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("writing {}", path.display()))?;
    for r in records {
        w.write_record(r).with_context(|| format!("writing {}", path.display()))?;
    }
    w.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn write_outputs(
    dir: &std::path::Path,
    points: &[Point],
    peer_rows: &[super::mls::MlsSize],
    model: &CostModel,
    args: &EventsArgs,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    if !peer_rows.is_empty() {
        std::fs::write(dir.join("mls.json"), serde_json::to_string_pretty(peer_rows)?)?;
        let mut records = vec![csv_record([
            "event",
            "n",
            "commit_ms",
            "max_receive_ms",
            "timed",
            "receivers",
            "network_ms",
            "total_ms",
        ])];
        for row in peer_rows {
            for (event, t) in [(TimedEvent::Join, row.join), (TimedEvent::Leave, row.leave)] {
                let total = mls_total(row, event, model, args.wan).expect("join or leave");
                records.push(vec![
                    event_name(event),
                    row.n.to_string(),
                    ms3(t.commit_ms),
                    ms3(t.max_receive_ms),
                    t.timed.to_string(),
                    t.receivers.to_string(),
                    ms3(one_round_network_ms(model, args.wan, row.n)),
                    ms3(total),
                ]);
            }
        }
        write_csv(&dir.join("mls.csv"), &records)?;
    }
    std::fs::write(dir.join("events.json"), serde_json::to_string_pretty(points)?)?;
    let mut records = vec![csv_record([
        "protocol",
        "event",
        "n",
        "mean_ms",
        "p50_ms",
        "p95_ms",
        "bound_ms",
        "ratio_to_bound",
        "work_bound_ms",
        "ratio_to_work_bound",
        "cpu_ms",
        "op_bound_ms",
        "ratio_to_op_bound",
        "crypto_ms",
        "ratio_to_crypto",
        "subgroup_checks",
    ])];
    // The membership line has no bound: empty fields.
    let or_empty = |v: Option<f64>| v.map_or(String::new(), ms3);
    for p in points {
        records.push(vec![
            p.protocol.clone(),
            event_name(p.event),
            p.n.to_string(),
            ms3(p.mean_ms),
            ms3(p.p50_ms),
            ms3(p.p95_ms),
            or_empty(p.bound_ms),
            or_empty(p.ratio_to_bound),
            or_empty(p.work_bound_ms),
            or_empty(p.ratio_to_work_bound),
            or_empty(p.cpu_ms),
            or_empty(p.op_bound_ms),
            or_empty(p.ratio_to_op_bound),
            or_empty(p.crypto_ms),
            or_empty(p.ratio_to_crypto),
            or_empty(p.subgroup_checks),
        ]);
    }
    write_csv(&dir.join("events.csv"), &records)?;
    for &event in &args.events {
        let name = event_name(event);
        let mut series = Vec::new();
        for proto in &args.protocols {
            let pts: Vec<(f64, f64)> = points
                .iter()
                .filter(|p| p.event == event && p.protocol == *proto)
                .map(|p| (p.n as f64, p.mean_ms))
                .collect();
            if !pts.is_empty() {
                series.push(super::chart::Series { name: proto.to_uppercase(), points: pts });
            }
        }
        let mls: Vec<(f64, f64)> =
            peer_rows.iter().filter_map(|r| Some((r.n as f64, mls_total(r, event, model, args.wan)?))).collect();
        if !mls.is_empty() {
            series.push(super::chart::Series { name: "MLS (mls-rs)".into(), points: mls });
        }
        // Fig. 16's line of the insecure membership service alone (daemon engine).
        let membership: Vec<(f64, f64)> = points
            .iter()
            .filter(|p| p.event == event && p.protocol == MEMBERSHIP)
            .map(|p| (p.n as f64, p.mean_ms))
            .collect();
        if !membership.is_empty() {
            series.push(super::chart::Series { name: MEMBERSHIP.into(), points: membership });
        }
        let value = |v: Option<clap::builder::PossibleValue>| v.map_or(String::new(), |v| v.get_name().to_string());
        let title = format!(
            "{name}: --suite {} --costs {} --wan {} ({} runs per point)",
            args.suite,
            value(args.costs.to_possible_value()),
            value(args.wan.to_possible_value()),
            args.runs
        );
        let (svg, x, y) = (dir.join(format!("{name}.svg")), "group size n", "time until every member has the key (ms)");
        super::chart::line_chart(&svg, &title, x, y, &series, args.log_y)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_single_values_and_ranges() {
        let parse = |s: &str| s.parse::<Sizes>().map(|s| s.0);
        assert_eq!(parse("7").unwrap(), vec![7]);
        assert_eq!(parse("100-400/100").unwrap(), vec![100, 200, 300, 400]);
        assert_eq!(parse("2-9/3").unwrap(), vec![2, 5, 8]);
        for bad in ["", "x", "5-2/1", "1-5/0", "1-5", "1-5/x"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn neither_bound_exceeds_the_time() {
        let model = CostModel::build(CostsFrom::Tissec2002, GroupId::Modp512, SignatureId::Ed25519).unwrap();
        for protocol in [ProtocolId::Gdh, ProtocolId::Ckd, ProtocolId::Tgdh, ProtocolId::Str, ProtocolId::Bd] {
            for event in TimedEvent::value_variants().iter().copied() {
                for wan in [Wan::Lan, Wan::Tissec2002] {
                    // The sim's testbed, and a 3-node cluster's (second side: node 3).
                    let cluster = Placement { machines: 3, wan, second_side_from: Some(2) };
                    for place in [Placement::sim(wan), cluster] {
                        let (group, scheme) = (GroupId::Modp512, SignatureId::Ed25519);
                        let r = run_once(protocol, event, 30, group, scheme, &model, place, 3).unwrap();
                        assert!(r.bound_ms > 0.0 && r.total_ms.is_finite(), "{protocol} {event:?}: {r:?}");
                        // The event queue keeps times in whole ns; the bound is exact.
                        assert!(r.bound_ms <= r.total_ms + 1e-3, "{protocol} {event:?} {place:?}: {r:?}");
                        // No machine can do its members' crypto faster than on all its CPUs at once.
                        assert!(r.work_bound_ms > 0.0, "{protocol} {event:?}: {r:?}");
                        assert!(r.work_bound_ms <= r.total_ms + 1e-3, "{protocol} {event:?} {place:?}: {r:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_cluster_bound_on_the_wan_adds_the_delays_between_its_nodes() {
        // Member i on node i mod 3, one node per site: every event's chain crosses sites,
        // where on the sim's testbed 6 members share the first site.
        let model = CostModel::build(CostsFrom::Tissec2002, GroupId::Modp512, SignatureId::Ed25519).unwrap();
        let (group, scheme) = (GroupId::Modp512, SignatureId::Ed25519);
        for event in [TimedEvent::Join, TimedEvent::Leave, TimedEvent::Partition, TimedEvent::Merge] {
            let bound = |place| run_once(ProtocolId::Tgdh, event, 6, group, scheme, &model, place, 3).unwrap().bound_ms;
            let cluster = |wan| Placement { machines: 3, wan, second_side_from: Some(2) };
            let (lan, wan) = (bound(cluster(Wan::Lan)), bound(cluster(Wan::Tissec2002)));
            assert!(wan >= lan + one_way(0, 1) - 1e-6, "{event:?}: LAN {lan} ms, WAN {wan} ms");
            // On the simulator's testbed Spread's daemons are on all 13 machines
            // (§6.2.1): even 6 members pay the WAN's membership (≥ 250 ms, Fig. 16).
            let (sim_lan, sim_wan) = (bound(Placement::sim(Wan::Lan)), bound(Placement::sim(Wan::Tissec2002)));
            assert!(sim_wan >= sim_lan + 250.0, "{event:?}: LAN {sim_lan} ms, WAN {sim_wan} ms");
        }
    }

    #[test]
    fn a_second_partition_on_the_same_split_is_cheaper_for_tgdh_only() {
        // Fig. 13: after P1 and a merge, TGDH's tree is clustered along the
        // split, so P2 takes fewer rounds; GDH's cost depends on the sizes alone.
        let model = CostModel::build(CostsFrom::Tissec2002, GroupId::Modp512, SignatureId::Ed25519).unwrap();
        let run = |protocol, event| {
            let (group, scheme, place) = (GroupId::Modp512, SignatureId::Ed25519, Placement::sim(Wan::Lan));
            run_once(protocol, event, 34, group, scheme, &model, place, 1).unwrap()
        };
        let (p1, p2) = (run(ProtocolId::Tgdh, TimedEvent::PartitionP1), run(ProtocolId::Tgdh, TimedEvent::PartitionP2));
        assert!(p2.total_ms < 0.5 * p1.total_ms, "TGDH P1 {p1:?}, P2 {p2:?}");
        let (p1, p2) = (run(ProtocolId::Gdh, TimedEvent::PartitionP1), run(ProtocolId::Gdh, TimedEvent::PartitionP2));
        assert!((p1.total_ms - p2.total_ms).abs() < 1e-6, "GDH P1 {p1:?}, P2 {p2:?}");
        let sides = p1.sides_ms.expect("a partition has sides");
        assert_eq!(sides[0].max(sides[1]), p1.total_ms, "the point is the slower side");
    }

    #[test]
    fn ckds_controller_leaves_about_one_run_in_n() {
        let n = 10;
        let controller = (1..=1000u64)
            .filter(|&seed| {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ 0x1ea7_0016);
                leaver_index(ProtocolId::Ckd, n, &mut rng) == 0
            })
            .count();
        assert!((60..=140).contains(&controller), "the controller left in {controller} of 1000 runs");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        assert_eq!(leaver_index(ProtocolId::Str, n, &mut rng), n / 2);
    }

    #[test]
    fn a_partition_between_servers_keeps_each_machine_on_one_side() {
        let mut h = Harness::new(ProtocolId::Gdh, GroupId::Modp512, SignatureId::Ed25519, 1, Flush::All);
        let ids = h.add_members(50).unwrap();
        let place = Placement::sim(Wan::Lan);
        let mut joiner_machines = std::collections::BTreeSet::new();
        for seed in 1..=20 {
            let machine_of = place.machine_of(50, seed);
            // As many members per machine as round-robin gives, in a seeded order.
            for m in 0..MACHINES {
                let k = machine_of.iter().filter(|&&x| x == m).count();
                assert_eq!(k, 50 / MACHINES + usize::from(m < 50 % MACHINES), "seed {seed} machine {m}");
            }
            joiner_machines.insert(machine_of[49]);
            let (a, b) = place.sides(&ids, &machine_of);
            assert!((24..=26).contains(&a.len()) && a.len() + b.len() == 50, "{} + {}", a.len(), b.len());
            let machine = |m: &MemberId| machine_of[ids.iter().position(|x| x == m).unwrap()];
            for x in &a {
                assert!(
                    b.iter().all(|y| machine(y) != machine(x)),
                    "seed {seed}: machine {} on both sides",
                    machine(x)
                );
            }
        }
        assert!(joiner_machines.len() > 5, "the joiner's machine is drawn from the seed: {joiner_machines:?}");
    }

    #[test]
    fn csv_files_are_written_with_a_header_and_quoted_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.csv");
        let records = vec![csv_record(["protocol", "note"]), vec!["gdh".into(), "a, b".into()]];
        write_csv(&path, &records).unwrap();
        let mut r = csv::Reader::from_path(&path).unwrap();
        assert_eq!(r.headers().unwrap(), vec!["protocol", "note"]);
        let row = r.records().next().unwrap().unwrap();
        assert_eq!(&row[1], "a, b", "a comma inside a field stays one field");
    }

    #[test]
    fn charts_come_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let svg = dir.path().join("join.svg");
        let series = [super::super::chart::Series { name: "TGDH".into(), points: vec![(2.0, 1.0), (10.0, 3.0)] }];
        for log_y in [false, true] {
            super::super::chart::line_chart(&svg, "join", "group size", "time (ms)", &series, log_y).unwrap();
        }
        let png = std::fs::read(dir.path().join("join.png")).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // PNG header: width and height, big-endian, at bytes 16..24.
        let (w, h) =
            (u32::from_be_bytes(png[16..20].try_into().unwrap()), u32::from_be_bytes(png[20..24].try_into().unwrap()));
        assert!(w >= 1200 && h >= 800, "{w}×{h}");
        assert!(png.len() > 5_000, "a chart with text and lines, not an empty image");
    }
}
