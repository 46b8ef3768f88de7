//! `conclave gauge`: SEAL's Gauger (§6). This module is the command, its
//! tables and charts, and `--engine sim`, in virtual time; `--engine daemon`
//! (real sessions, wall clock) is `crate::live::gauge`, which draws the same
//! churn and averages the same way ([`summarize`]).
//!
//! N members repeatedly join and leave one group. Each is a client of a
//! simulated daemon (`conclave_gcs::daemon_sim::DaemonSim`, the real daemon
//! core on a simulated LAN; members round-robin over `--machines` daemons,
//! 3 as in SEAL §6.2, 8 in §6.1), and stays in for T_in + c and out for
//! T_out + c seconds, T exponentially distributed with mean `--t-in` /
//! `--t-out` and c = `--constant`, drawn afresh for every stay. At time 0
//! each member is in with probability (t_in + c) / (t_in + t_out + 2c), the
//! share of time it spends in; those that are in join at once (1 ms apart).
//! A member that joins is a new process: a fresh engine, as after SEAL's
//! `SEAL_leave` and `SEAL_join`.
//!
//! # Rekeying
//! * **Interval algorithms** (`--algorithm rebuild|batch|queue-batch`): the
//!   engine is [`IntervalTgdh`]. Views are followed, not rekeyed; every
//!   `--interval` seconds of virtual time (at k·interval, k = 1, 2, …) the
//!   leader — the member that is first in its latest view — is given
//!   [`IntervalTgdh::tick`], and its rekey message goes out through its
//!   daemon. A new leader restarts at once if a view took the leader or an
//!   unsent sponsor during a rekey (the engine's restart).
//! * **Baseline** (`--baseline`, on by default): the same churn (same seed,
//!   so the same join and leave times) with per-view TGDH
//!   (`new_engine(ProtocolId::Tgdh)`): every view is rekeyed.
//!
//! After `--duration` no one joins or leaves any more; the run goes on until
//! the daemons are quiet, then (interval algorithms) the leader ticks once
//! more so that every member still in holds the key of the last view; that
//! last rekey is counted like the others.
//!
//! # What is counted, and how it is averaged (SEAL §6)
//! A member's *rekeying operation* starts when it receives the first rekey
//! message since its last install (or since it joined) — SEAL §6: "from the
//! instant at which a member receives the first rekeying message … to the
//! instant at which the updated group key is confirmed" — and ends when it
//! installs the new key; a restart (a second rekey message before the
//! install) stays in the same operation, as in SEAL. For the baseline it
//! starts at the view that starts the run (a cascading view stays in it).
//! Everything the member's engine does between the two is charged to the
//! operation: the deltas of its `costs()` (exponentiations) and, for the
//! interval engine, of its `stats()` (blinded keys and BKEY packets it
//! broadcast, restarts it led), read around every input the engine is given.
//! What an interval engine does outside an operation (Queue-batch: keying T'
//! during the interval) is kept apart and charged to the member's next
//! install, in the totals only (below).
//!
//! A *rekey* is one installed epoch: the members that install it are the
//! members of that rekey. Per rekey:
//! * **rekeying time**: the mean, over its members, of install − start, in
//!   virtual seconds;
//! * **exponentiations**: the mean, over its members, of each one's own;
//! * **broadcast blinded keys** and **BKEY packets**: the sum, over its
//!   members, of what each broadcast — all of it reaches every member, so
//!   this is also what each member sees, and its mean over the members is
//!   the same number. That is how `interval.rs` reads Table 2
//!   (`IntervalCosts::table2`): ~7 blinded keys and ~6 packets per member in
//!   groups of ~7 only fit as the counts each member sees. The baseline's
//!   packets are its broadcasts; its blinded keys are not counted (`-`).
//!
//! These three are given twice. **On SEAL's terms** (`exps`,
//! `blinded_keys`, `bkey_packets`): without Queue-subtree, which SEAL does
//! not measure (§6), so Queue-batch's are Queue-merge's. The engine meters
//! Queue-subtree apart (`IntervalStats::subtree_exps`, `subtree_bks_sent`,
//! `subtree_packets_sent`: the exponentiations are read off the engine's own
//! meter around T''s work, the blinded keys and packets are those of the
//! BKEY phases 1 and 3), and the operation's Queue-subtree share is taken
//! out. **With T'** (`total_*`, columns `(+T')`): everything, the
//! operation's and what the member spent keying T' during the interval
//! since its last install. For Rebuild and Batch both are the same.
//! Queue-batch's engine keys T' during the interval, in each view with
//! joiners (`protocols::seal`); if T' is not keyed when the rekey message
//! comes (a tick right after a view, a restart), the rekey keys it in its
//! run, and that rekey's time includes it: `T' in run` counts those rekeys.
//!
//! Rows beside Table 2 (and `seal_exps`, `reactive_bkey_packets` in
//! the JSON and CSV) are counted SEAL's way and are not work done: the
//! exponentiations had every member also blinded its key path's renewed
//! nodes (SEAL §4.2: a member updates "the secret and blinded keys of the
//! key path"; `IntervalStats::path_bks_not_blinded`), and the BKEY packets
//! had every sponsor sent, on each input it processed, what it had just
//! become able to compute (§4.2's process_thread;
//! `IntervalStats::reactive_packets_sent`). A third row
//! (`copath_bkey_packets`) is the BKEY packets had the members held, when
//! the rekey began, only SEAL's blinded keys: their co-paths' and key
//! paths' (§3.4, "each member holds the blinded keys along its own
//! co-path"), a joiner the whole old tree (`Rekeyed::seal_holds`), where
//! ours hold the whole tree (`IntervalStats::copath_packets_sent`). A
//! fourth (`copath_reactive_bkey_packets`) combines the two readings: SEAL's
//! holdings and per-input sending (`Rekeyed::reactive_plan_holding`,
//! `IntervalStats::copath_reactive_packets_sent`). All on SEAL's terms
//! (Queue-merge only). Last, `rekey_packets`: the REKEY packets (rekey
//! messages) each member of a rekey received in its operation, averaged
//! over them. SEAL's REKEY packet carries the key tree's blinded keys
//! (§3.3), so it is one of §6's "broadcast packets of blinded keys during a
//! rekeying operation" if Table 2 counts what that definition says; the
//! table's last two rows add it to the BKEY packets (ours, and with SEAL's
//! holdings).
//!
//! The run's figures are then the mean over rekeys of these per-rekey
//! figures: SEAL's "averaged over the number of existing members in the
//! group at each rekeying interval and then over the number of rekeying
//! intervals" (§6.1, Experiment 1). Intervals without a rekey (an empty
//! batch sends nothing) are not averaged in. `restarts` is the sum of the
//! engines' `IntervalStats::restarts` (rekeys the leader started again at
//! once after a view took the leader or an unsent sponsor); for the
//! baseline it is the number of views that arrived while a member's run was
//! in progress (cascades).
//!
//! What a member spent in an operation it never finished (it left first) is
//! not counted, nor is the rekey message's signature at the tick (the tick
//! is not a delivery, so it is sent without CPU time).
//!
//! # Cost model (virtual time)
//! Group ristretto255, signatures Ed25519. Each input's crypto is charged to
//! the member's machine's virtual CPU (one per daemon machine, shared by its
//! members). With `--costs seal2006` the charges are those of SEAL's Table 2
//! testbed instead ([`OpCosts::of`] derives each from the TISSEC paper's
//! measured costs, scaled by clock, and cites it); the engines still compute
//! in ristretto255, so only the time changes. By default (`--costs
//! measured`) they are this machine's measured costs, from the team's crypto cost
//! measurements on the build machine (2 vCPU Xeon, KVM, 2026-11-21,
//! per-thread CPU time, median): an exponentiation 32.3 µs
//! (ristretto255 variable-base scalar multiplication, curve25519-dalek
//! 4.1.3; the engines' fixed-base ones, 12.3 µs there, are charged the same
//! since `Costs` does not tell them apart), a signature 18.6 µs and a
//! verification 40.8 µs (Ed25519, ed25519-dalek, as measured there for
//! 3.0.0; this workspace builds 2.1). The network is `NetConfig::default()`:
//! 80 µs one way between daemons plus up to 20 µs jitter, 10 µs between a
//! client and its daemon, 5 µs of daemon CPU per operation, no loss. A
//! member's install is at the delivery that completes it plus that
//! reaction's CPU time (a wait for its machine's CPU is not added; later
//! messages it sends do wait).
//!
//! # How it differs from SEAL's Gauger
//! * The engine keys T' during the interval as SEAL does, but announces and
//!   re-keys it in each view that has joiners (on the last view's T': see
//!   `protocols::seal`), where SEAL's members add each joiner to T' as it
//!   comes. That is interval work, not measured on SEAL's terms; the
//!   `(+T')` columns show it.
//! * A view during a rekey that takes neither the leader nor an unsent
//!   sponsor lets it go on among its members, as SEAL's does (§3.6), but
//!   it is abandoned until the next tick when a merge puts an older member
//!   in the lead or a joiner leaves during Queue-batch's Queue-subtree in
//!   the run (see `protocols::seal`, "Cascades"): such a rekey's rekeying
//!   time includes the wait, so the tables print the median beside the mean, and the
//!   abandoned rekeys (rekey messages sent minus rekeys installed).
//! * Key confirmation is SEAL's (§3.5), in the engine: each member checks
//!   its own g^K0 against the broadcast BK0 before it installs, one
//!   exponentiation (none for BK0's sender), counted. The install is at the
//!   plan's last packet, where SEAL's member is done once it has confirmed.
//! * SEAL's rekey times are wall-clock on 2004 machines with 1024-bit DH,
//!   RSA-1024 signatures and Spread; ours are virtual, from the costs above:
//!   they are compared in ratio only to show the order of magnitude.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use clap::{Args, ValueEnum};
use conclave_gcs::core::{ConnId, Delivery, Op, Service};
use conclave_gcs::daemon_sim::{DaemonSim, Micros, NetConfig, Reaction};
use conclave_gcs::{GroupName, MemberId, View, ViewId};
use conclave_gka::message::Envelope;
use conclave_gka::protocols::seal::{IntervalAlgorithm, IntervalStats, IntervalTgdh, ROUND_REKEY};
use conclave_gka::suite::ristretto::Ristretto255;
use conclave_gka::suite::{generate_signer, Signer};
use conclave_gka::{
    new_engine, Config, Costs, Engine, Epoch, GroupId, Output, ProtocolId, SecureView, SignatureId, StaticDirectory,
};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use serde::Serialize;

use crate::events::model;

/// Which machine the virtual CPU and network stand for (`--costs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GaugeCosts {
    /// This machine: ristretto255 and Ed25519 as measured here, a LAN of
    /// today (`NetConfig::default()`).
    #[default]
    Measured,
    /// SEAL's wired testbed of Table 2 (§6.2: Pentium 4 1.8 GHz, 1024-bit
    /// Diffie–Hellman, RSA-1024 on every packet, Spread on a 100 Mbps LAN),
    /// derived from the TISSEC paper's measurements (see [`OpCosts::of`]).
    Seal2006,
}

/// Virtual CPU per operation and the network, for one [`GaugeCosts`].
#[derive(Clone, Debug)]
pub(crate) struct OpCosts {
    /// Per exponentiation, µs.
    pub exp_us: f64,
    /// Per signature, µs.
    pub sign_us: f64,
    /// Per verification, µs.
    pub verify_us: f64,
    /// The simulated daemons' network.
    pub net: NetConfig,
    /// Where the numbers come from, for the header.
    pub source: &'static str,
}

/// Clock of SEAL's Table 2 machines (§6.2, "three Pentium 4/1.8 GHz Linux
/// machines") over that of the TISSEC testbed (§6.1.1, "666 MHz Pentium
/// III"), whose per-operation costs ([`model::PIII_666`]) are the nearest
/// measured ones. Scaling
/// by clock assumes a P4 does as much big-number work per cycle as a PIII;
/// it did less (a slower integer multiplier), so the costs below are if
/// anything a floor.
const SEAL_OVER_TISSEC_CLOCK: f64 = 1800.0 / 666.0;

impl GaugeCosts {
    fn name(self) -> &'static str {
        match self {
            GaugeCosts::Measured => "measured",
            GaugeCosts::Seal2006 => "seal2006",
        }
    }
}

impl OpCosts {
    pub(crate) fn of(costs: GaugeCosts) -> Self {
        match costs {
            // crypto-costs-measured.md: ristretto255 variable-base scalar
            // multiplication (curve25519-dalek 4.1.3), Ed25519 signing and
            // verification.
            GaugeCosts::Measured => OpCosts {
                exp_us: 32.3,
                sign_us: 18.6,
                verify_us: 40.8,
                net: NetConfig::default(),
                source: "this machine (crypto-costs-measured.md: ristretto255, Ed25519), a LAN of 80 µs one way",
            },
            GaugeCosts::Seal2006 => {
                // The TISSEC testbed's measured costs (§6.1.1, `events::model`).
                let piii = model::PIII_666;
                OpCosts {
                    // A 1024-bit modular exponentiation with a 160-bit
                    // exponent, 5.3 ms on the PIII. SEAL's exponents are full
                    // length: a TGDH node's secret key, used as the exponent
                    // one level up, is an element of the 1024-bit group, and
                    // OpenSSL's DH_generate_key draws a leaf key of
                    // BN_num_bits(p) − 1 bits when no length is set. Square
                    // and multiply costs grow with the exponent's bits:
                    // × 1024 / 160.
                    exp_us: piii.exp512 * model::EXP_1024_OVER_512 * 1000.0 * 1024.0 / 160.0
                        / SEAL_OVER_TISSEC_CLOCK,
                    // RSA-1024 signing, 9.6 ms on the PIII.
                    sign_us: piii.sign * 1000.0 / SEAL_OVER_TISSEC_CLOCK,
                    // Verification 0.2 ms with public exponent 3 (2 modular
                    // multiplications). SEAL's certificates come from
                    // OpenSSL's tools (§4.1), whose genrsa uses 65537 unless
                    // told otherwise: 17 multiplications.
                    verify_us: piii.verify * 1000.0 * 17.0 / 2.0 / SEAL_OVER_TISSEC_CLOCK,
                    net: NetConfig {
                        // One agreed multicast, sent and delivered, took
                        // 0.75 ms on the TISSEC Spread LAN; SEAL gives no
                        // network figure. Half of it one way between daemons.
                        latency: (model::LAN_AGREED_MS * 1000.0 / 2.0).round() as Micros,
                        ..NetConfig::default()
                    },
                    source: "SEAL's Table 2 testbed (P4 1.8 GHz, DH-1024 with full-length exponents, RSA-1024 e = \
                             65537), from the TISSEC paper's PIII 666 MHz costs scaled by clock; 375 µs one way between \
                             daemons",
                }
            }
        }
    }
}

const SECOND: f64 = 1e6;

/// What runs the members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum GaugeEngine {
    /// Simulated daemons in virtual time, crypto charged from a cost model.
    Sim,
    /// Real sessions over the embedded daemon (or `--cluster N`), wall-clock time.
    Daemon,
}

impl GaugeEngine {
    fn name(self) -> &'static str {
        match self {
            GaugeEngine::Sim => "sim",
            GaugeEngine::Daemon => "daemon",
        }
    }
}

/// Which interval algorithms to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AlgorithmChoice {
    /// Rebuild a complete tree every interval.
    Rebuild,
    /// Joiners replace leavers, then the shallowest positions.
    Batch,
    /// Joiners gathered in a subtree, merged at the interval's end.
    QueueBatch,
    /// All three.
    All,
}

impl AlgorithmChoice {
    fn algorithms(self) -> Vec<IntervalAlgorithm> {
        match self {
            Self::Rebuild => vec![IntervalAlgorithm::Rebuild],
            Self::Batch => vec![IntervalAlgorithm::Batch],
            Self::QueueBatch => vec![IntervalAlgorithm::QueueBatch],
            Self::All => IntervalAlgorithm::ALL.to_vec(),
        }
    }
}

/// A span of virtual time: `2h`, `30m`, `90s` or plain seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span(
    /// Seconds.
    pub f64,
);

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (num, unit) = match t.char_indices().last() {
            Some((i, 'h')) => (&t[..i], 3600.0),
            Some((i, 'm')) => (&t[..i], 60.0),
            Some((i, 's')) => (&t[..i], 1.0),
            _ => (t, 1.0),
        };
        match num.trim().parse::<f64>() {
            Ok(v) if v.is_finite() && v > 0.0 => Ok(Span(v * unit)),
            _ => Err(format!("{s:?} is not a duration (e.g. 2h, 30m, 90s)")),
        }
    }
}

/// Options of `conclave gauge`.
#[derive(Args, Clone)]
pub struct GaugeArgs {
    /// Engine: `sim` (simulated daemons, virtual time: SEAL's two-hour runs in
    /// seconds) or `daemon` (real secure sessions over an embedded daemon, or
    /// the Corosync cluster of --cluster, in wall-clock time: give short runs,
    /// e.g. --duration 2m --t-in 5 --t-out 5 --constant 2 --interval 3).
    #[arg(long, value_enum, default_value = "sim")]
    engine: GaugeEngine,
    /// `--engine daemon`: run the members over a Corosync cluster of N nodes
    /// in network namespaces (needs the `cluster` feature and root) instead
    /// of one embedded daemon.
    #[arg(long, value_name = "N")]
    cluster: Option<usize>,
    /// Members that join and leave (each a Gauger).
    #[arg(long, default_value_t = 15)]
    members: usize,
    /// `--engine sim`: whose CPU and network the virtual time stands for:
    /// `measured` (this machine's ristretto255 and Ed25519, a LAN of today)
    /// or `seal2006` (SEAL's Table 2 testbed: Pentium 4 1.8 GHz, 1024-bit
    /// DH with full-length exponents, RSA-1024, derived from the TISSEC
    /// paper's measured costs; see docs/gauge.md). The engines still run
    /// ristretto255 and Ed25519: only the time charged changes.
    #[arg(long, value_enum, default_value = "measured")]
    costs: GaugeCosts,
    /// Simulated daemon machines; members go round-robin over them (`--engine
    /// sim`; the daemon engine uses one embedded daemon or the cluster's nodes).
    #[arg(long, default_value_t = 3)]
    machines: u16,
    /// Mean of T_in, seconds (a member stays in for T_in + c). A list
    /// (`30,60,90`) runs every value: SEAL's Fig. 9 varies T_in.
    #[arg(long, value_delimiter = ',', default_value = "30")]
    t_in: Vec<f64>,
    /// Mean of T_out, seconds (a member stays out for T_out + c); a list runs
    /// every value (with every T_in, unless --paired).
    #[arg(long, value_delimiter = ',', default_value = "30")]
    t_out: Vec<f64>,
    /// Pair the T_in and T_out lists (the i-th with the i-th) instead of
    /// running every combination: `--t-in 30,60,90 --t-out 30,60,90 --paired`
    /// is SEAL's Experiment 2 (Fig. 10, T_in = T_out).
    #[arg(long)]
    paired: bool,
    /// The constant c, seconds.
    #[arg(long, default_value_t = 10.0)]
    constant: f64,
    /// Rekeying interval, seconds (the leader ticks every interval).
    #[arg(long, default_value_t = 15.0)]
    interval: f64,
    /// Time of churn: `2h`, `30m`, `90s` (default: 2h of virtual time with
    /// `--engine sim`, 2m of wall-clock time with `--engine daemon`).
    #[arg(long)]
    duration: Option<Span>,
    /// Interval algorithm(s).
    #[arg(long, value_enum, default_value = "all")]
    algorithm: AlgorithmChoice,
    /// Also run each interval algorithm with the policy option
    /// `:rekey-on-leave` (the leader rekeys at once when a member of the key
    /// leaves; joins still batch): rows `ALGORITHM +leave`.
    #[arg(long)]
    rekey_on_leave: bool,
    /// Also run the same churn through per-view TGDH (`--baseline false` to leave it out).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    baseline: bool,
    /// The one seed of the run (churn, daemons, members' keys).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON array (one object per run) instead of the tables.
    #[arg(long)]
    json: bool,
    /// Write gauge.csv, gauge.json, rekeys.csv and charts (SVG and PNG) into this directory (checked before
    /// the run): per configuration the rekeying time of each rekey (SEAL Fig. 11), and with several T_in
    /// per T_out, or several T_in = T_out, each metric against T (Fig. 9, Fig. 10).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the members run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// SEAL's interval rekeying.
    Interval(IntervalAlgorithm),
    /// SEAL's interval rekeying with the policy option `:rekey-on-leave`:
    /// the leader ticks at once when a view drops a member of the key in use
    /// (as `conclave_secure::SessionCore` does), joins still wait.
    OnLeave(IntervalAlgorithm),
    /// TGDH, every view rekeyed.
    PerView,
}

impl Policy {
    pub(crate) fn name(self) -> &'static str {
        use IntervalAlgorithm as A;
        match self {
            Policy::Interval(A::Rebuild) => "rebuild",
            Policy::Interval(A::Batch) => "batch",
            Policy::Interval(A::QueueBatch) => "queue-batch",
            Policy::OnLeave(A::Rebuild) => "rebuild +leave",
            Policy::OnLeave(A::Batch) => "batch +leave",
            Policy::OnLeave(A::QueueBatch) => "queue-batch +leave",
            Policy::PerView => "tgdh (per view)",
        }
    }

    /// The interval algorithm, if the group rekeys by interval.
    pub(crate) fn algorithm(self) -> Option<IntervalAlgorithm> {
        match self {
            Policy::Interval(a) | Policy::OnLeave(a) => Some(a),
            Policy::PerView => None,
        }
    }
}

/// The churn and group of one run.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Setup {
    pub members: usize,
    pub machines: u16,
    pub t_in: f64,
    pub t_out: f64,
    pub constant: f64,
    pub interval: f64,
    pub duration_s: f64,
    pub seed: u64,
    /// Whose CPU and network the virtual time stands for (`--engine sim`).
    pub costs: GaugeCosts,
}

/// One rekey (one installed epoch).
#[derive(Clone, Debug, Serialize)]
pub(crate) struct RekeyRecord {
    /// Virtual seconds at which its first member started it.
    pub at_s: f64,
    /// Members that installed it.
    pub members: usize,
    /// Mean rekeying time over its members, seconds.
    pub time_s: f64,
    /// Mean exponentiations over its members, on SEAL's terms: without
    /// Queue-subtree's (Queue-batch: Queue-merge only).
    pub exps: f64,
    /// Blinded keys broadcast, on SEAL's terms (interval algorithms only).
    pub blinded_keys: Option<u64>,
    /// BKEY packets, on SEAL's terms (baseline: broadcasts).
    pub packets: u64,
    /// Restarts during it (`None`: not measured, the daemon engine's baseline).
    pub restarts: Option<u64>,
    /// With Queue-subtree: everything its members spent on it, T' keyed
    /// during the interval (since each one's last install) included. The
    /// same as the above but for Queue-batch.
    pub total_exps: f64,
    pub total_blinded_keys: Option<u64>,
    pub total_packets: u64,
    /// Queue-batch with joiners: whether T' was keyed in the rekey's run
    /// (not complete when the rekey message came), else `None`.
    pub subtree_in_run: Option<bool>,
    /// Counted SEAL's way, not work done (interval algorithms only): `exps`
    /// plus the blinded keys of its members' key paths they did not compute
    /// (SEAL §4.2, `IntervalStats::path_bks_not_blinded`).
    pub seal_exps: Option<f64>,
    /// The BKEY packets of the rekey had sponsors sent on every input what
    /// they had just become able to compute (SEAL §4.2,
    /// `IntervalStats::reactive_packets_sent`; interval algorithms only).
    pub reactive_packets: Option<u64>,
    /// The BKEY packets of the rekey had its members held only SEAL's
    /// blinded keys when it began (their co-paths and key paths, §3.4;
    /// `IntervalStats::copath_packets_sent`; interval algorithms only).
    pub copath_packets: Option<u64>,
    /// The BKEY packets of the rekey with SEAL's holdings and per-input
    /// sending both (§3.4, §4.2; `IntervalStats::copath_reactive_packets_sent`).
    pub copath_reactive_packets: Option<u64>,
    /// The REKEY packets (rekey messages) of the rekey, as its members
    /// received them in their operations: the mean over its members (1;
    /// more when the rekey was begun again, restarted or abandoned until
    /// the next tick). SEAL's REKEY packet carries the
    /// key tree and its blinded keys (§3.3, Fig. 5), so §6's "broadcast
    /// packets of blinded keys during a rekeying operation" may count it
    /// beside the BKEY packets; interval algorithms on the simulator only
    /// (`null` on the daemon engine, whose meter does not count them).
    pub rekey_packets: Option<f64>,
}

/// One run's summary: the `--json` object.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub(crate) struct Summary {
    pub algorithm: String,
    pub members: usize,
    pub t_in: f64,
    pub t_out: f64,
    pub constant: f64,
    pub interval: f64,
    pub duration_s: f64,
    /// Whose CPU and network the simulator's virtual time stands for
    /// (`measured` on the daemon engine, which runs on this machine).
    pub costs: GaugeCosts,
    pub rekeys: u64,
    /// `null`: not measured (the daemon engine's baseline).
    pub restarts: Option<u64>,
    pub rekey_time_s: f64,
    /// Exponentiations, blinded keys and BKEY packets on SEAL's terms
    /// (Queue-batch: Queue-merge only).
    pub exps: f64,
    pub blinded_keys: Option<f64>,
    pub bkey_packets: f64,
    /// The same with Queue-subtree's (T' keyed during the interval or in
    /// the rekey's run).
    pub total_exps: f64,
    pub total_blinded_keys: Option<f64>,
    pub total_bkey_packets: f64,
    /// Queue-batch: rekeys that keyed T' in their run (`null`: none to key).
    pub subtree_in_run: Option<u64>,
    /// Counted SEAL's way (not work done; `null` for the baseline):
    /// exponentiations with every member blinding its key path's renewed
    /// nodes, and BKEY packets sent per processed input (SEAL §4.2; see
    /// [`RekeyRecord::seal_exps`], [`RekeyRecord::reactive_packets`]).
    pub seal_exps: Option<f64>,
    pub reactive_bkey_packets: Option<f64>,
    /// BKEY packets with SEAL's holdings (§3.4; see
    /// [`RekeyRecord::copath_packets`]; `null` for the baseline).
    pub copath_bkey_packets: Option<f64>,
    /// BKEY packets with SEAL's holdings and per-input sending (§3.4 and
    /// §4.2; see [`RekeyRecord::copath_reactive_packets`]).
    pub copath_reactive_bkey_packets: Option<f64>,
    /// REKEY packets per rekey (see [`RekeyRecord::rekey_packets`];
    /// `null` for the baseline and on the daemon engine).
    pub rekey_packets: Option<f64>,
}

/// A member in the group at the end: its name, its view's members, and
/// its key's fingerprint and members (`None`: no key).
pub(crate) type EndState = (MemberId, Vec<MemberId>, Option<(String, Vec<MemberId>)>);

/// A run's result.
pub(crate) struct RunResult {
    pub summary: Summary,
    pub rekeys: Vec<RekeyRecord>,
    /// Rekeys begun that installed nothing: rekey messages sent minus rekeys
    /// (restarted, or abandoned by a view until the next tick); the
    /// baseline's cascades (`None`: not measured).
    pub abandoned: Option<u64>,
    /// Median over rekeys of the rekeying time, seconds.
    pub median_time_s: f64,
    /// Distinct views the group went through (`None`: not seen, the daemon
    /// engine: a session shows only secure views).
    pub views: Option<u64>,
    /// At the end, per member still in: its name, its view's members and
    /// its key's fingerprint and members (None: no key).
    pub end: Vec<EndState>,
}

enum Eng {
    Interval(Box<IntervalTgdh<Ristretto255>>),
    PerView(Box<dyn Engine>),
}

impl Eng {
    fn on_view(&mut self, v: &View, rng: &mut ChaCha20Rng) -> Vec<Output> {
        let r = match self {
            Eng::Interval(e) => e.on_view(v, rng),
            Eng::PerView(e) => e.on_view(v, rng),
        };
        r.expect("a view is always accepted")
    }

    fn on_message(&mut self, from: &MemberId, bytes: &[u8], rng: &mut ChaCha20Rng) -> Vec<Output> {
        // Late messages of an abandoned run are refused: expected.
        match self {
            Eng::Interval(e) => e.on_message(from, bytes, rng),
            Eng::PerView(e) => e.on_message(from, bytes, rng),
        }
        .unwrap_or_default()
    }

    fn costs(&self) -> Costs {
        match self {
            Eng::Interval(e) => e.costs(),
            Eng::PerView(e) => e.costs(),
        }
    }

    fn stats(&self) -> IntervalStats {
        match self {
            Eng::Interval(e) => e.stats(),
            Eng::PerView(_) => IntervalStats::default(),
        }
    }

    fn secure_view(&self) -> Option<&SecureView> {
        match self {
            Eng::Interval(e) => e.secure_view(),
            Eng::PerView(e) => e.secure_view(),
        }
    }
}

/// What members spent on a rekey: one member's while it runs ([`Open`]),
/// summed over its members once it installed ([`Acc`]).
#[derive(Default, Clone, Copy)]
struct Counts {
    exps: u64,
    bks: u64,
    packets: u64,
    restarts: u64,
    /// Of `exps`, `bks` and `packets`, Queue-subtree's (the engine's
    /// `IntervalStats::subtree_*`).
    sub_exps: u64,
    sub_bks: u64,
    sub_packets: u64,
    /// T' was keyed in a rekey's run.
    in_run: bool,
    /// SEAL's counts (`IntervalStats::path_bks_not_blinded`,
    /// `reactive_packets_sent`).
    path_bks: u64,
    reactive: u64,
    copath: u64,
    copath_reactive: u64,
    /// Rekey messages (SEAL's REKEY packets) delivered to the member in
    /// its operation: the one that began it, and any restart's.
    rekey_msgs: u64,
}

impl Counts {
    fn add(&mut self, o: &Counts) {
        self.exps += o.exps;
        self.bks += o.bks;
        self.packets += o.packets;
        self.restarts += o.restarts;
        self.sub_exps += o.sub_exps;
        self.sub_bks += o.sub_bks;
        self.sub_packets += o.sub_packets;
        self.in_run |= o.in_run;
        self.path_bks += o.path_bks;
        self.reactive += o.reactive;
        self.copath += o.copath;
        self.copath_reactive += o.copath_reactive;
        self.rekey_msgs += o.rekey_msgs;
    }
}

/// A member's rekeying operation in progress.
#[derive(Default)]
struct Open {
    start: Micros,
    counts: Counts,
}

struct Member {
    name: MemberId,
    conn: ConnId,
    signer: Arc<dyn Signer>,
    /// Its engine while it is in the group (from its join until `Left`).
    engine: Option<Eng>,
    view: Option<View>,
    rng: ChaCha20Rng,
    open: Option<Open>,
    /// What it spent outside a rekeying operation since its last install
    /// or join (Queue-batch: keying T' during the interval).
    idle: Counts,
    /// In the group as the churn has it.
    inside: bool,
    /// When it next joins or leaves, µs.
    next: Micros,
}

#[derive(Default)]
struct Acc {
    start: Micros,
    members: usize,
    time_us: u64,
    /// In the members' rekeying operations.
    counts: Counts,
    /// Outside them, since their last install (T' during the interval).
    idle: Counts,
}

/// Everything the deliveries touch.
struct State {
    policy: Policy,
    group: GroupName,
    directory: Arc<StaticDirectory>,
    members: BTreeMap<ConnId, Member>,
    rekeys: BTreeMap<Epoch, Acc>,
    views: BTreeSet<ViewId>,
    /// Baseline: views that arrived while a member's run was open.
    cascades: BTreeSet<ViewId>,
    restarts: u64,
    /// Rekey messages the leaders sent (ticks and restarts).
    led: u64,
    engine_seeds: ChaCha20Rng,
    costs: OpCosts,
}

impl State {
    fn fresh_engine(&mut self, conn: ConnId) -> Eng {
        let m = &self.members[&conn];
        match self.policy {
            Policy::Interval(a) | Policy::OnLeave(a) => {
                let e = IntervalTgdh::new(
                    Ristretto255,
                    self.group.as_str().to_string(),
                    m.name.clone(),
                    m.signer.clone(),
                    self.directory.clone(),
                    a,
                );
                let on_leave = matches!(self.policy, Policy::OnLeave(_));
                Eng::Interval(Box::new(if on_leave { e.rekey_on_leave() } else { e }))
            }
            Policy::PerView => Eng::PerView(new_engine(Config {
                protocol: ProtocolId::Tgdh,
                group_id: GroupId::Ristretto255,
                group: self.group.as_str().to_string(),
                me: m.name.clone(),
                signer: m.signer.clone(),
                directory: self.directory.clone(),
            })),
        }
    }

    /// Feeds one delivery to a member's engine; charges and records what it did.
    fn react(&mut self, now: Micros, conn: ConnId, d: &Delivery) -> Reaction {
        let policy = self.policy;
        let Some(m) = self.members.get_mut(&conn) else { return Reaction::default() };
        if let Delivery::Left { .. } = d {
            m.engine = None;
            m.view = None;
            m.open = None;
            m.idle = Counts::default();
            return Reaction::default();
        }
        let Some(engine) = m.engine.as_mut() else { return Reaction::default() };
        let (before, before_stats) = (engine.costs(), engine.stats());
        let outputs = match d {
            Delivery::View { view, .. } => {
                self.views.insert(view.id);
                m.view = Some(view.clone());
                if policy == Policy::PerView {
                    if m.open.is_some() {
                        self.cascades.insert(view.id);
                    } else {
                        m.open = Some(Open { start: now, ..Open::default() });
                    }
                }
                let mut outputs = engine.on_view(view, &mut m.rng);
                // :rekey-on-leave: the leader rekeys at once when a member of
                // the key in use is gone from the view.
                if let (Policy::OnLeave(_), Eng::Interval(e)) = (policy, &mut *engine) {
                    let leads = view.members.first().is_some_and(|f| f.id == m.name);
                    let holder_left = e.secure_view().is_some_and(|sv| sv.members.iter().any(|x| !view.contains(x)));
                    if leads && holder_left {
                        outputs.extend(e.tick(&mut m.rng).expect("the leader ticks"));
                    }
                }
                outputs
            }
            Delivery::Message { sender, payload, .. } => {
                if policy != Policy::PerView && is_rekey_message(payload) {
                    let open = m.open.get_or_insert_with(|| Open { start: now, ..Open::default() });
                    open.counts.rekey_msgs += 1;
                }
                engine.on_message(sender, payload, &mut m.rng)
            }
            _ => Vec::new(),
        };
        let (after, after_stats) = (engine.costs(), engine.stats());
        let cpu_us = (after.exps - before.exps) as f64 * self.costs.exp_us
            + (after.sigs - before.sigs) as f64 * self.costs.sign_us
            + (after.verifs - before.verifs) as f64 * self.costs.verify_us;
        let cpu = cpu_us.round() as Micros;
        let restarts = after_stats.restarts - before_stats.restarts;
        self.restarts += restarts;
        self.led += after_stats.rekeys_led - before_stats.rekeys_led;
        // Charged to the open rekeying operation, else (interval
        // algorithms) kept for the member's next install.
        let o = match (m.open.as_mut(), policy) {
            (Some(open), _) => Some(&mut open.counts),
            (None, Policy::Interval(_) | Policy::OnLeave(_)) => Some(&mut m.idle),
            (None, Policy::PerView) => None,
        };
        if let Some(o) = o {
            o.exps += after.exps - before.exps;
            o.restarts += restarts;
            match policy {
                Policy::Interval(_) | Policy::OnLeave(_) => {
                    let (a, b) = (after_stats, before_stats);
                    o.bks += a.bks_sent - b.bks_sent;
                    o.packets += a.packets_sent - b.packets_sent;
                    o.sub_exps += a.subtree_exps - b.subtree_exps;
                    o.sub_bks += a.subtree_bks_sent - b.subtree_bks_sent;
                    o.sub_packets += a.subtree_packets_sent - b.subtree_packets_sent;
                    o.in_run |= a.keyed_in_run > b.keyed_in_run;
                    o.path_bks += a.path_bks_not_blinded - b.path_bks_not_blinded;
                    o.reactive += a.reactive_packets_sent - b.reactive_packets_sent;
                    o.copath += a.copath_packets_sent - b.copath_packets_sent;
                    o.copath_reactive += a.copath_reactive_packets_sent - b.copath_reactive_packets_sent;
                }
                Policy::PerView => o.packets += after.broadcasts - before.broadcasts,
            }
        }
        let mut ops = Vec::new();
        for o in outputs {
            match o {
                Output::Send { to: None, bytes } => ops.push(Op::Multicast {
                    conn,
                    group: self.group.clone(),
                    service: Service::Agreed,
                    payload: Bytes::from(bytes),
                }),
                Output::Send { to: Some(to), bytes } => {
                    ops.push(Op::Unicast { conn, group: self.group.clone(), to, payload: Bytes::from(bytes) })
                }
                Output::Installed(sv) => {
                    let Some(open) = m.open.take() else { continue };
                    let acc =
                        self.rekeys.entry(sv.epoch).or_insert_with(|| Acc { start: open.start, ..Acc::default() });
                    acc.start = acc.start.min(open.start);
                    acc.members += 1;
                    acc.time_us += (now + cpu).saturating_sub(open.start);
                    acc.counts.add(&open.counts);
                    acc.idle.add(&std::mem::take(&mut m.idle));
                }
            }
        }
        Reaction { ops, cpu }
    }

    /// The leader ticks (interval algorithms): the member first in its own
    /// latest view.
    fn tick(&mut self, sim: &mut DaemonSim) {
        if self.policy.algorithm().is_none() {
            return;
        }
        for (conn, m) in self.members.iter_mut() {
            let leads = m.view.as_ref().is_some_and(|v| v.members.first().is_some_and(|f| f.id == m.name));
            let Some(Eng::Interval(e)) = m.engine.as_mut().filter(|_| leads) else { continue };
            let before = e.stats();
            let outs = e.tick(&mut m.rng).expect("the leader ticks");
            self.restarts += e.stats().restarts - before.restarts;
            self.led += e.stats().rekeys_led - before.rekeys_led;
            for o in outs {
                if let Output::Send { to: None, bytes } = o {
                    sim.submit(Op::Multicast {
                        conn: *conn,
                        group: self.group.clone(),
                        service: Service::Agreed,
                        payload: Bytes::from(bytes),
                    });
                }
            }
        }
    }
}

/// Whether a delivered payload is an interval rekey message.
fn is_rekey_message(payload: &[u8]) -> bool {
    Envelope::decode(payload).is_ok_and(|e| e.round == ROUND_REKEY)
}

/// An exponential draw with mean `mean` seconds, plus `c`, in µs.
fn stay(rng: &mut ChaCha20Rng, mean: f64, c: f64) -> Micros {
    let u = ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    ((-mean * u.ln() + c) * SECOND).round() as Micros
}

fn unit(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// Runs one policy over the churn of `setup`. `progress` is told the
/// virtual time reached, in µs.
pub(crate) fn run_once(setup: &Setup, policy: Policy, progress: &mut dyn FnMut(Micros)) -> Result<RunResult> {
    if setup.members == 0 || setup.machines == 0 {
        bail!("--members and --machines must be at least 1");
    }
    if !(setup.interval > 0.0 && setup.t_in >= 0.0 && setup.t_out >= 0.0 && setup.constant >= 0.0) {
        bail!("--interval must be positive, --t-in, --t-out and --constant not negative");
    }
    if setup.constant + setup.t_in <= 0.0 || setup.constant + setup.t_out <= 0.0 {
        bail!("T_in + c and T_out + c must be positive");
    }
    // One seed drives all: the churn (the same for every policy), the
    // daemons, the identities and the engines' randomness.
    let mut churn = ChaCha20Rng::seed_from_u64(setup.seed);
    let mut keys = ChaCha20Rng::seed_from_u64(setup.seed ^ 0x6a09_e667_f3bc_c908);
    let costs = OpCosts::of(setup.costs);
    let mut sim =
        DaemonSim::new(setup.machines, costs.net.clone(), setup.seed).map_err(|e| anyhow::anyhow!("daemons: {e}"))?;
    let group = GroupName::new("gauge").expect("a valid group name");
    let mut directory = StaticDirectory::new();
    let mut members = BTreeMap::new();
    for i in 0..setup.members {
        let name = MemberId::new(format!("g{i}")).expect("a valid member name");
        let signer = generate_signer(SignatureId::Ed25519, &mut keys).context("identity")?;
        directory.insert(name.clone(), signer.verifier());
        let conn = sim.open((i % setup.machines as usize) as u16).map_err(|e| anyhow::anyhow!("{e}"))?;
        sim.submit(Op::Connect { conn, name: name.clone() });
        let next = first_change(&mut churn, setup, i);
        members.insert(
            conn,
            Member {
                name,
                conn,
                signer,
                engine: None,
                view: None,
                rng: ChaCha20Rng::seed_from_u64(0),
                open: None,
                idle: Counts::default(),
                inside: false,
                next,
            },
        );
    }
    let mut st = State {
        policy,
        group: group.clone(),
        directory: Arc::new(directory),
        members,
        rekeys: BTreeMap::new(),
        views: BTreeSet::new(),
        cascades: BTreeSet::new(),
        restarts: 0,
        led: 0,
        engine_seeds: ChaCha20Rng::seed_from_u64(setup.seed ^ 0xbb67_ae85_84ca_a73b),
        costs,
    };
    let end = (setup.duration_s * SECOND).round() as Micros;
    let interval = ((setup.interval * SECOND).round() as Micros).max(1);
    let mut next_tick = interval;
    loop {
        let next_churn = st.members.values().map(|m| m.next).min().unwrap_or(Micros::MAX);
        let t = match policy.algorithm() {
            Some(_) => next_churn.min(next_tick),
            None => next_churn,
        };
        if t > end {
            break;
        }
        sim.run_until(t, &mut |now, c, d| st.react(now, c, d));
        if next_churn == t {
            let due: Vec<ConnId> = st.members.values().filter(|m| m.next == t).map(|m| m.conn).collect();
            for conn in due {
                toggle(&mut st, &mut sim, &mut churn, setup, conn, t);
            }
        }
        if t == next_tick {
            st.tick(&mut sim);
            next_tick += interval;
        }
        progress(t);
    }
    // No more churn: let the daemons go quiet, then the last rekey.
    sim.run_until(Micros::MAX, &mut |now, c, d| st.react(now, c, d));
    if policy.algorithm().is_some() {
        st.tick(&mut sim);
        sim.run_until(Micros::MAX, &mut |now, c, d| st.react(now, c, d));
    }
    progress(end);
    Ok(finish(st, setup, policy))
}

/// Member `conn` joins (a fresh engine) or leaves at `t`; its next change is drawn.
fn toggle(st: &mut State, sim: &mut DaemonSim, churn: &mut ChaCha20Rng, setup: &Setup, conn: ConnId, t: Micros) {
    let inside = st.members[&conn].inside;
    if inside {
        sim.submit(Op::Leave { conn, group: st.group.clone() });
    } else {
        let engine = st.fresh_engine(conn);
        let seed = st.engine_seeds.next_u64();
        let m = st.members.get_mut(&conn).expect("member");
        m.engine = Some(engine);
        m.view = None;
        m.open = None;
        m.idle = Counts::default();
        m.rng = ChaCha20Rng::seed_from_u64(seed);
        sim.submit(Op::Join {
            conn,
            group: st.group.clone(),
            open: false,
            mode: conclave_gcs::core::GroupMode::Members,
        });
    }
    let m = st.members.get_mut(&conn).expect("member");
    m.inside = !inside;
    m.next = t + next_stay(churn, setup, m.inside);
}

/// When member `i` first joins, µs from the start (both engines draw the
/// churn alike): at time 0 a member is in with the share of time a member
/// spends in, (T_in + c) / (T_in + T_out + 2c), and those join 1 ms apart;
/// the others join after a stay out.
pub(crate) fn first_change(churn: &mut ChaCha20Rng, setup: &Setup, i: usize) -> Micros {
    let p_in = (setup.t_in + setup.constant) / (setup.t_in + setup.t_out + 2.0 * setup.constant);
    let starts_in = unit(churn) < p_in;
    if starts_in {
        1_000 * (i as Micros + 1)
    } else {
        stay(churn, setup.t_out, setup.constant)
    }
}

/// How long a member that just went in (`inside`) or out stays so, µs.
pub(crate) fn next_stay(churn: &mut ChaCha20Rng, setup: &Setup, inside: bool) -> Micros {
    let mean = if inside { setup.t_in } else { setup.t_out };
    stay(churn, mean, setup.constant).max(1)
}

fn finish(st: State, setup: &Setup, policy: Policy) -> RunResult {
    let rekeys: Vec<RekeyRecord> = st
        .rekeys
        .values()
        .map(|a| {
            let n = a.members.max(1) as f64;
            let (start, members, time_us, idle, a) = (a.start, a.members, a.time_us, a.idle, a.counts);
            let queued = policy.algorithm() == Some(IntervalAlgorithm::QueueBatch) && (a.sub_exps + idle.sub_exps) > 0;
            let interval = policy != Policy::PerView;
            RekeyRecord {
                at_s: start as f64 / SECOND,
                members,
                time_s: time_us as f64 / n / SECOND,
                exps: (a.exps - a.sub_exps) as f64 / n,
                blinded_keys: interval.then_some(a.bks - a.sub_bks),
                packets: a.packets - a.sub_packets,
                restarts: Some(a.restarts),
                total_exps: (a.exps + idle.exps) as f64 / n,
                total_blinded_keys: interval.then_some(a.bks + idle.bks),
                total_packets: a.packets + idle.packets,
                subtree_in_run: queued.then_some(a.in_run),
                seal_exps: interval.then(|| (a.exps - a.sub_exps + a.path_bks) as f64 / n),
                reactive_packets: interval.then_some(a.reactive),
                copath_packets: interval.then_some(a.copath),
                copath_reactive_packets: interval.then_some(a.copath_reactive),
                rekey_packets: interval.then(|| a.rekey_msgs as f64 / n),
            }
        })
        .collect();
    let restarts = match policy.algorithm() {
        Some(_) => st.restarts,
        None => st.cascades.len() as u64,
    };
    let end = st
        .members
        .values()
        .filter(|m| m.inside)
        .map(|m| {
            let view = m.view.as_ref().map(|v| v.ids().cloned().collect()).unwrap_or_default();
            let key =
                m.engine.as_ref().and_then(|e| e.secure_view()).map(|sv| (sv.key.fingerprint(), sv.members.to_vec()));
            (m.name.clone(), view, key)
        })
        .collect();
    let abandoned = match policy.algorithm() {
        Some(_) => st.led.saturating_sub(rekeys.len() as u64),
        None => restarts,
    };
    let counted = Counted { restarts: Some(restarts), abandoned: Some(abandoned), views: Some(st.views.len() as u64) };
    summarize(setup, policy, rekeys, counted, end)
}

/// What a run counted besides its rekeys (`None`: not measured).
pub(crate) struct Counted {
    pub restarts: Option<u64>,
    pub abandoned: Option<u64>,
    pub views: Option<u64>,
}

/// A run's result from its rekeys, whichever engine ran it: the means over
/// rekeys (SEAL §6's averaging) and the median rekeying time.
pub(crate) fn summarize(
    setup: &Setup,
    policy: Policy,
    mut rekeys: Vec<RekeyRecord>,
    counted: Counted,
    end: Vec<EndState>,
) -> RunResult {
    rekeys.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    let k = rekeys.len().max(1) as f64;
    let mean = |f: &dyn Fn(&RekeyRecord) -> f64| rekeys.iter().map(f).sum::<f64>() / k;
    let interval = policy != Policy::PerView;
    let summary = Summary {
        algorithm: policy.name().to_string(),
        members: setup.members,
        t_in: setup.t_in,
        t_out: setup.t_out,
        constant: setup.constant,
        interval: setup.interval,
        duration_s: setup.duration_s,
        costs: setup.costs,
        rekeys: rekeys.len() as u64,
        restarts: counted.restarts,
        rekey_time_s: mean(&|r| r.time_s),
        exps: mean(&|r| r.exps),
        blinded_keys: interval.then(|| mean(&|r| r.blinded_keys.unwrap_or(0) as f64)),
        bkey_packets: mean(&|r| r.packets as f64),
        total_exps: mean(&|r| r.total_exps),
        total_blinded_keys: interval.then(|| mean(&|r| r.total_blinded_keys.unwrap_or(0) as f64)),
        total_bkey_packets: mean(&|r| r.total_packets as f64),
        subtree_in_run: rekeys
            .iter()
            .any(|r| r.subtree_in_run.is_some())
            .then(|| rekeys.iter().filter(|r| r.subtree_in_run == Some(true)).count() as u64),
        seal_exps: interval.then(|| mean(&|r| r.seal_exps.unwrap_or(0.0))),
        reactive_bkey_packets: interval.then(|| mean(&|r| r.reactive_packets.unwrap_or(0) as f64)),
        copath_bkey_packets: interval.then(|| mean(&|r| r.copath_packets.unwrap_or(0) as f64)),
        copath_reactive_bkey_packets: interval.then(|| mean(&|r| r.copath_reactive_packets.unwrap_or(0) as f64)),
        rekey_packets: rekeys
            .iter()
            .any(|r| r.rekey_packets.is_some())
            .then(|| mean(&|r| r.rekey_packets.unwrap_or(0.0))),
    };
    let mut times: Vec<f64> = rekeys.iter().map(|r| r.time_s).collect();
    times.sort_by(f64::total_cmp);
    let median_time_s = times.get(times.len() / 2).copied().unwrap_or(0.0);
    RunResult { summary, rekeys, abandoned: counted.abandoned, median_time_s, views: counted.views, end }
}

/// SEAL Table 2, wired LAN (15 members, interval 15 s, c = 10 s, 2 h,
/// Queue-batch): T_in = T_out, rekeying time (s), exponentiations,
/// broadcast blinded keys, BKEY packets.
pub(crate) const TABLE2_WIRED: [(f64, [f64; 4]); 3] =
    [(30.0, [0.45, 4.08, 7.16, 6.24]), (60.0, [0.43, 3.81, 6.70, 5.83]), (90.0, [0.40, 3.66, 6.39, 5.59])];

/// Table 2's row for this setup, if it is Table 2's configuration.
fn table2_row(s: &Setup) -> Option<[f64; 4]> {
    let same = |a: f64, b: f64| (a - b).abs() < 1e-9;
    if s.members != 15 || !same(s.interval, 15.0) || !same(s.constant, 10.0) || !same(s.duration_s, 7200.0) {
        return None;
    }
    TABLE2_WIRED.iter().find(|(t, _)| same(s.t_in, *t) && same(s.t_out, *t)).map(|(_, row)| *row)
}

/// Runs `conclave gauge`.
pub fn run(args: GaugeArgs) -> Result<()> {
    let duration = args.duration.unwrap_or(match args.engine {
        GaugeEngine::Sim => Span(7200.0),
        GaugeEngine::Daemon => Span(120.0),
    });
    if args.cluster.is_some() && args.engine != GaugeEngine::Daemon {
        bail!("--cluster runs real daemons: give it with --engine daemon");
    }
    if args.costs != GaugeCosts::Measured && args.engine != GaugeEngine::Sim {
        bail!("--costs sets the simulator's virtual time: the daemon engine runs in wall-clock time on this machine");
    }
    let pairs: Vec<(f64, f64)> = if args.paired {
        if args.t_in.len() != args.t_out.len() {
            bail!(
                "--paired needs as many --t-in values as --t-out values ({} and {})",
                args.t_in.len(),
                args.t_out.len()
            );
        }
        args.t_in.iter().copied().zip(args.t_out.iter().copied()).collect()
    } else {
        args.t_out.iter().flat_map(|&o| args.t_in.iter().map(move |&i| (i, o))).collect()
    };
    let setups: Vec<Setup> = pairs
        .iter()
        .map(|&(t_in, t_out)| Setup {
            members: args.members,
            machines: args.machines,
            t_in,
            t_out,
            constant: args.constant,
            interval: args.interval,
            duration_s: duration.0,
            seed: args.seed,
            costs: args.costs,
        })
        .collect();
    if args.members == 0 || args.interval <= 0.0 {
        bail!("--members must be at least 1 and --interval positive");
    }
    if let Some(dir) = &args.out {
        check_writable(dir)?;
    }
    let mut policies: Vec<Policy> = Vec::new();
    for a in args.algorithm.algorithms() {
        policies.push(Policy::Interval(a));
        if args.rekey_on_leave {
            policies.push(Policy::OnLeave(a));
        }
    }
    if args.baseline {
        policies.push(Policy::PerView);
    }
    let replay = replay_command(&args, duration);
    let target = match args.engine {
        GaugeEngine::Sim => None,
        GaugeEngine::Daemon => {
            Some(crate::live::Target::start(args.cluster, crate::scenario::Wan::Lan, &mut std::io::stderr())?)
        }
    };
    let end = (duration.0 * SECOND) as u64;
    let bar = progress_bar(end * (policies.len() * setups.len()) as u64, args.engine);
    let mut results = Vec::new();
    let runs = setups.iter().flat_map(|s| policies.iter().map(move |p| (s, *p)));
    for (i, (setup, p)) in runs.enumerate() {
        bar.set_message(format!("{} {}/{}", p.name(), setup.t_in, setup.t_out));
        let base = end * i as u64;
        let r = match &target {
            None => run_once(setup, p, &mut |t| bar.set_position(base + t.min(end)))?,
            Some(target) => crate::live::gauge::run_once(target, setup, p, &mut |s| {
                bar.set_position(base + ((s * SECOND) as u64).min(end))
            })
            .with_context(|| format!("{} over real daemons", p.name()))?,
        };
        let inside = agreed(&r).with_context(|| format!("{}, seed {}", p.name(), setup.seed))?;
        bar.suspend(|| {
            eprintln!(
                "{} (T_in {} s, T_out {} s): {} rekeys, {} restarts, {} views; at the end {inside} members in, one \
                 key, of their view",
                p.name(),
                setup.t_in,
                setup.t_out,
                r.summary.rekeys,
                crate::table::or_dash(r.summary.restarts.map(|v| v as f64), 0),
                crate::table::or_dash(r.views.map(|v| v as f64), 0)
            )
        });
        results.push(r);
    }
    bar.finish_and_clear();
    let summaries: Vec<&Summary> = results.iter().map(|r| &r.summary).collect();
    let mut out = std::io::stdout().lock();
    if args.json {
        eprintln!("replay: {replay}");
        writeln!(out, "{}", serde_json::to_string_pretty(&summaries)?)?;
    } else {
        writeln!(out, "replay: {replay}")?;
        for (setup, rs) in setups.iter().zip(results.chunks(policies.len())) {
            write_tables(&mut out, setup, args.engine, rs)?;
        }
    }
    if let Some(dir) = &args.out {
        let charts = write_outputs(dir, &results)?;
        if !args.json {
            writeln!(out, "wrote gauge.csv, gauge.json, rekeys.csv and {} to {}", charts.join(", "), dir.display())?;
        }
    }
    Ok(())
}

/// Checks that every member in at the end holds one key, of its view;
/// returns how many are in.
pub(crate) fn agreed(r: &RunResult) -> Result<usize> {
    let mut first: Option<&str> = None;
    for (name, view, key) in &r.end {
        let Some((fp, members)) = key else { bail!("{name} is in the group at the end without a key") };
        if first.is_some_and(|f| f != fp) {
            bail!("{name} holds another key than {}", r.end[0].0);
        }
        first = Some(fp);
        let (mut a, mut b) = (members.clone(), view.clone());
        a.sort();
        b.sort();
        if a != b {
            bail!("{name}'s key is not of its view");
        }
    }
    Ok(r.end.len())
}

fn replay_command(a: &GaugeArgs, duration: Span) -> String {
    let algorithm = a.algorithm.to_possible_value().map(|v| v.get_name().to_string()).unwrap_or_default();
    let placement = match (a.engine, a.cluster) {
        (GaugeEngine::Sim, _) => format!("--machines {}", a.machines),
        (GaugeEngine::Daemon, Some(n)) => format!("--cluster {n}"),
        (GaugeEngine::Daemon, None) => String::new(),
    };
    let list = |v: &[f64]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",");
    let cmd = format!(
        "conclave gauge --engine {} --members {} {placement} --t-in {} --t-out {}{} --constant {} --interval {} \
         --duration {}s --algorithm {algorithm}{} --baseline {} --costs {} --seed {}",
        a.engine.name(),
        a.members,
        list(&a.t_in),
        list(&a.t_out),
        if a.paired { " --paired" } else { "" },
        a.constant,
        a.interval,
        duration.0,
        if a.rekey_on_leave { " --rekey-on-leave" } else { "" },
        a.baseline,
        a.costs.name(),
        a.seed
    );
    cmd.replace("  ", " ")
}

fn write_tables(out: &mut impl Write, setup: &Setup, engine: GaugeEngine, results: &[RunResult]) -> Result<()> {
    let costs = OpCosts::of(setup.costs);
    if engine == GaugeEngine::Daemon {
        writeln!(
            out,
            "\nGauger on real secure sessions over real daemons, wall-clock time: {} members, T_in {} s, T_out {} s, \
             c {} s, interval {} s, {} s of churn, seed {}. Per rekey, averaged over its members, then over rekeys \
             (SEAL §6); rekeying time from the first rekey message to the key confirmed by every member; blinded \
             keys and packets are those broadcast in the rekey, which every member sees. All members share this \
             machine's CPUs. -: not measured on this engine.\n",
            setup.members, setup.t_in, setup.t_out, setup.constant, setup.interval, setup.duration_s, setup.seed
        )?;
    } else {
        writeln!(
        out,
        "\nGauger on {} simulated daemons, virtual time: {} members, T_in {} s, T_out {} s, c {} s, interval {} s, \
         {} s of churn, seed {}. Per rekey, averaged over its members, then over rekeys (SEAL §6); blinded keys and \
         packets are those broadcast in the rekey, which every member sees. Costs ({}): exp {:.1} µs, sign {:.1} \
         µs, verify {:.1} µs; {}.\n",
        setup.machines,
        setup.members,
        setup.t_in,
        setup.t_out,
        setup.constant,
        setup.interval,
        setup.duration_s,
        setup.seed,
        setup.costs.name(),
        costs.exp_us,
        costs.sign_us,
        costs.verify_us,
        costs.source
    )?;
    }
    let mut t = crate::table::new(
        [
            "algorithm",
            "rekeys",
            "restarts",
            "abandoned",
            "views",
            "T' in run",
            "rekey time (ms)",
            "p50 (ms)",
            "exps",
            "blinded keys",
            "BKEY packets",
            "exps (+T')",
            "blinded keys (+T')",
            "BKEY packets (+T')",
            "exps/min",
        ],
        1,
    );
    for r in results {
        let s = &r.summary;
        t.add_row(vec![
            s.algorithm.clone(),
            s.rekeys.to_string(),
            crate::table::or_dash(s.restarts.map(|v| v as f64), 0),
            crate::table::or_dash(r.abandoned.map(|v| v as f64), 0),
            crate::table::or_dash(r.views.map(|v| v as f64), 0),
            crate::table::or_dash(s.subtree_in_run.map(|v| v as f64), 0),
            format!("{:.3}", s.rekey_time_s * 1e3),
            format!("{:.3}", r.median_time_s * 1e3),
            format!("{:.2}", s.exps),
            crate::table::or_dash(s.blinded_keys, 2),
            format!("{:.2}", s.bkey_packets),
            format!("{:.2}", s.total_exps),
            crate::table::or_dash(s.total_blinded_keys, 2),
            format!("{:.2}", s.total_bkey_packets),
            format!("{:.1}", exps_per_minute(r)),
        ]);
    }
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "exps, blinded keys, BKEY packets: on SEAL's terms, without Queue-subtree (Queue-batch: Queue-merge only). \
         (+T'): with Queue-subtree's, T' keyed during the interval (charged to the joiner's next install) or in the \
         rekey's run; the same for the other algorithms. T' in run: Queue-batch rekeys whose T' was not keyed when \
         the rekey message came, so it was keyed after it (and counted in the rekeying time). abandoned: rekeys \
         begun that installed nothing (restarted, or abandoned by a view and begun again at the next tick, whose \
         wait the rekeying time then includes: see p50); for the baseline, its cascades. exps/min: the \
         exponentiations (+T') per minute of a member in every rekey (the sum over rekeys of their per-member \
         mean, over the minutes of churn): the cost of rekeying more often (per view, or +leave: \
         :rekey-on-leave) against batching, beside the per-rekey means."
    )?;
    if let Some(paper) = table2_row(setup).filter(|_| engine == GaugeEngine::Sim) {
        if let Some(r) = results.iter().find(|r| r.summary.algorithm == "queue-batch") {
            let s = &r.summary;
            writeln!(
                out,
                "\nBeside SEAL Table 2 (wired LAN, Queue-batch, T_in = T_out = {} s), which measures Queue-merge \
                 only; the (+T') rows add Queue-subtree's. The (§4.2) rows are counted SEAL's way, not work \
                 done: every member blinding its key path's renewed nodes (\"updating the secret and blinded \
                 keys of the key path\"), sponsors sending on every input what they have just computed; (§3.4): \
                 members holding only their co-paths' blinded keys when the rekey begins; (§3.4, §4.2): both; \
                 (§3.3, §6): the rekey's REKEY packets, which carry the key tree's blinded keys, counted as \
                 broadcast packets of blinded keys beside its BKEY packets.\n",
                setup.t_in
            )?;
            let mut t = crate::table::new(["metric", "ours", "SEAL (wired)", "ours / SEAL"], 1);
            let ours = [
                s.rekey_time_s,
                s.exps,
                s.blinded_keys.unwrap_or(f64::NAN),
                s.bkey_packets,
                s.total_exps,
                s.total_blinded_keys.unwrap_or(f64::NAN),
                s.total_bkey_packets,
                s.seal_exps.unwrap_or(f64::NAN),
                s.reactive_bkey_packets.unwrap_or(f64::NAN),
                s.copath_bkey_packets.unwrap_or(f64::NAN),
                s.copath_reactive_bkey_packets.unwrap_or(f64::NAN),
                s.bkey_packets + s.rekey_packets.unwrap_or(f64::NAN),
                s.copath_bkey_packets.unwrap_or(f64::NAN) + s.rekey_packets.unwrap_or(f64::NAN),
            ];
            let names = [
                "rekeying time (s)",
                "exponentiations",
                "broadcast blinded keys",
                "BKEY packets",
                "exponentiations (+T')",
                "broadcast blinded keys (+T')",
                "BKEY packets (+T')",
                "exponentiations, key path blinded (§4.2)",
                "BKEY packets, sent per input (§4.2)",
                "BKEY packets, co-paths held (§3.4)",
                "BKEY packets, co-paths held, sent per input (§3.4, §4.2)",
                "BKEY and REKEY packets (§3.3, §6)",
                "BKEY and REKEY packets, co-paths held (§3.3, §3.4, §6)",
            ];
            let paper = [
                paper[0], paper[1], paper[2], paper[3], paper[1], paper[2], paper[3], paper[1], paper[3], paper[3],
                paper[3], paper[3], paper[3],
            ];
            for ((name, o), p) in names.iter().zip(ours).zip(paper) {
                t.add_row(vec![name.to_string(), format!("{o:.4}"), format!("{p:.2}"), format!("{:.3}", o / p)]);
            }
            writeln!(out, "{t}")?;
        }
    }
    Ok(())
}

/// The exponentiations per minute of churn of a member in every rekey: the
/// sum over rekeys of their per-member mean, over the churn's minutes.
fn exps_per_minute(r: &RunResult) -> f64 {
    r.rekeys.iter().map(|k| k.total_exps).sum::<f64>() / (r.summary.duration_s / 60.0)
}

/// Fails early if `dir` cannot be written (before a long run).
fn check_writable(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    tempfile::NamedTempFile::new_in(dir).with_context(|| format!("{} is not writable", dir.display()))?;
    Ok(())
}

/// A sweep of runs for a chart: file stem, what is fixed, the (T_in, T_out) swept.
type Sweep = (String, String, Vec<(f64, f64)>);
/// A chart's metric: file key, label, value of a run.
type Metric = (&'static str, &'static str, fn(&Summary) -> Option<f64>);

/// Writes gauge.json, gauge.csv, rekeys.csv and the charts; returns the
/// charts' names (each also as PNG).
fn write_outputs(dir: &Path, results: &[RunResult]) -> Result<Vec<String>> {
    let summaries: Vec<&Summary> = results.iter().map(|r| &r.summary).collect();
    std::fs::write(dir.join("gauge.json"), serde_json::to_string_pretty(&summaries)?)
        .with_context(|| format!("writing {}", dir.join("gauge.json").display()))?;
    let mut w = csv::Writer::from_path(dir.join("gauge.csv"))?;
    w.write_record([
        "algorithm",
        "members",
        "t_in",
        "t_out",
        "constant",
        "interval",
        "duration_s",
        "costs",
        "rekeys",
        "restarts",
        "rekey_time_s",
        "exps",
        "blinded_keys",
        "bkey_packets",
        "total_exps",
        "total_blinded_keys",
        "total_bkey_packets",
        "subtree_in_run",
        "seal_exps",
        "reactive_bkey_packets",
        "copath_bkey_packets",
        "copath_reactive_bkey_packets",
        "rekey_packets",
    ])?;
    for s in &summaries {
        w.write_record([
            s.algorithm.clone(),
            s.members.to_string(),
            s.t_in.to_string(),
            s.t_out.to_string(),
            s.constant.to_string(),
            s.interval.to_string(),
            s.duration_s.to_string(),
            s.costs.name().to_string(),
            s.rekeys.to_string(),
            s.restarts.map_or(String::new(), |v| v.to_string()),
            format!("{:.6}", s.rekey_time_s),
            format!("{:.4}", s.exps),
            s.blinded_keys.map_or(String::new(), |v| format!("{v:.4}")),
            format!("{:.4}", s.bkey_packets),
            format!("{:.4}", s.total_exps),
            s.total_blinded_keys.map_or(String::new(), |v| format!("{v:.4}")),
            format!("{:.4}", s.total_bkey_packets),
            s.subtree_in_run.map_or(String::new(), |v| v.to_string()),
            s.seal_exps.map_or(String::new(), |v| format!("{v:.4}")),
            s.reactive_bkey_packets.map_or(String::new(), |v| format!("{v:.4}")),
            s.copath_bkey_packets.map_or(String::new(), |v| format!("{v:.4}")),
            s.copath_reactive_bkey_packets.map_or(String::new(), |v| format!("{v:.4}")),
            s.rekey_packets.map_or(String::new(), |v| format!("{v:.4}")),
        ])?;
    }
    w.flush()?;
    let mut w = csv::Writer::from_path(dir.join("rekeys.csv"))?;
    w.write_record([
        "algorithm",
        "t_in",
        "t_out",
        "rekey",
        "at_s",
        "members",
        "rekey_time_s",
        "exps",
        "blinded_keys",
        "bkey_packets",
        "restarts",
        "total_exps",
        "total_blinded_keys",
        "total_bkey_packets",
        "subtree_in_run",
    ])?;
    for r in results {
        for (i, k) in r.rekeys.iter().enumerate() {
            w.write_record([
                r.summary.algorithm.clone(),
                r.summary.t_in.to_string(),
                r.summary.t_out.to_string(),
                (i + 1).to_string(),
                format!("{:.6}", k.at_s),
                k.members.to_string(),
                format!("{:.6}", k.time_s),
                format!("{:.4}", k.exps),
                k.blinded_keys.map_or(String::new(), |v| v.to_string()),
                k.packets.to_string(),
                k.restarts.map_or(String::new(), |v| v.to_string()),
                format!("{:.4}", k.total_exps),
                k.total_blinded_keys.map_or(String::new(), |v| v.to_string()),
                k.total_packets.to_string(),
                k.subtree_in_run.map_or(String::new(), |v| u8::from(v).to_string()),
            ])?;
        }
    }
    w.flush()?;
    let mut charts = Vec::new();
    // Like SEAL Fig. 11: each rekey's time over the first 200 rekeys, one
    // chart per (T_in, T_out); a restart shows as a spike, and as a point on
    // the restarts line.
    let mut configs: Vec<(f64, f64)> = Vec::new();
    for r in results {
        let c = (r.summary.t_in, r.summary.t_out);
        if !configs.contains(&c) {
            configs.push(c);
        }
    }
    for &(t_in, t_out) in &configs {
        let mut series = Vec::new();
        for r in results.iter().filter(|r| (r.summary.t_in, r.summary.t_out) == (t_in, t_out)) {
            let first: Vec<&RekeyRecord> = r.rekeys.iter().take(200).collect();
            let pts = first.iter().enumerate().map(|(i, k)| ((i + 1) as f64, k.time_s * 1e3)).collect();
            series.push(crate::chart::Series { name: r.summary.algorithm.clone(), points: pts });
            let spikes: Vec<(f64, f64)> = first
                .iter()
                .enumerate()
                .filter(|(_, k)| k.restarts.is_some_and(|r| r > 0))
                .map(|(i, k)| ((i + 1) as f64, k.time_s * 1e3))
                .collect();
            if !spikes.is_empty() {
                series.push(crate::chart::Series { name: format!("{} restarts", r.summary.algorithm), points: spikes });
            }
        }
        let name = format!("rekeys-tin{t_in}-tout{t_out}.svg");
        crate::chart::line_chart(
            &dir.join(&name),
            &format!("Fig. 11: rekeying time of each rekey (first 200), T_in {t_in} s, T_out {t_out} s"),
            "rekey",
            "rekeying time, mean over its members (ms)",
            &series,
            false,
        )?;
        charts.push(name);
    }
    // Like SEAL Fig. 9 (T_out fixed, T_in varied) and Fig. 10 (T_in = T_out
    // varied): each metric against T, one line per algorithm, wherever the
    // runs give at least two values of T.
    let mut t_outs: Vec<f64> = configs.iter().map(|c| c.1).collect();
    t_outs.dedup();
    let mut sweeps: Vec<Sweep> = Vec::new();
    for t_out in t_outs {
        let xs: Vec<(f64, f64)> = configs.iter().copied().filter(|c| c.1 == t_out).collect();
        sweeps.push((format!("fig9-tout{t_out}"), format!("T_out = {t_out} s"), xs));
    }
    sweeps.push(("fig10".into(), "T_in = T_out".into(), configs.iter().copied().filter(|c| c.0 == c.1).collect()));
    let metrics: [Metric; 4] = [
        ("time", "rekeying time (ms)", |s| Some(s.rekey_time_s * 1e3)),
        ("exps", "exponentiations", |s| Some(s.exps)),
        ("blinded-keys", "broadcast blinded keys", |s| s.blinded_keys),
        ("packets", "BKEY packets", |s| Some(s.bkey_packets)),
    ];
    for (stem, what, xs) in sweeps.iter().filter(|(_, _, xs)| xs.len() >= 2) {
        for (key, label, metric) in metrics {
            let mut lines: Vec<crate::chart::Series> = Vec::new();
            for r in results.iter().filter(|r| xs.contains(&(r.summary.t_in, r.summary.t_out))) {
                let Some(y) = metric(&r.summary) else { continue };
                let x = r.summary.t_in;
                match lines.iter_mut().find(|l| l.name == r.summary.algorithm) {
                    Some(l) => l.points.push((x, y)),
                    None => {
                        lines.push(crate::chart::Series { name: r.summary.algorithm.clone(), points: vec![(x, y)] })
                    }
                }
            }
            lines.iter_mut().for_each(|l| l.points.sort_by(|a, b| a.0.total_cmp(&b.0)));
            let name = format!("{stem}-{key}.svg");
            let x_label = if stem == "fig10" { "T_in = T_out (s)" } else { "T_in (s)" };
            let title = format!("{label} per member per rekey, {what}");
            crate::chart::line_chart(&dir.join(&name), &title, x_label, label, &lines, false)?;
            charts.push(name);
        }
    }
    Ok(charts)
}

/// A bar over virtual time, on stderr when it is a terminal.
fn progress_bar(len: u64, engine: GaugeEngine) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(match engine {
            GaugeEngine::Sim => "{msg:16} {wide_bar} {percent}% of virtual time, ETA {eta}",
            GaugeEngine::Daemon => "{msg:16} {wide_bar} {percent}% of the churn (wall clock), ETA {eta}",
        })
        .expect("static template"),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(seed: u64) -> Setup {
        Setup {
            members: 6,
            machines: 3,
            t_in: 4.0,
            t_out: 4.0,
            constant: 2.0,
            interval: 3.0,
            duration_s: 40.0,
            seed,
            costs: GaugeCosts::Measured,
        }
    }

    fn run(setup: &Setup, p: Policy) -> RunResult {
        run_once(setup, p, &mut |_| {}).unwrap()
    }

    /// SEAL's 2006 costs are charged, not this machine's: a rekey of the
    /// same churn takes hundreds of times longer in virtual time (12.6 ms
    /// per exponentiation against 32 µs), and the header says whose costs.
    #[test]
    fn seal2006_costs_charge_the_2006_testbed() {
        let c = OpCosts::of(GaugeCosts::Seal2006);
        assert!((c.exp_us - 12_550.4).abs() < 0.1 && (c.sign_us - 3_552.0).abs() < 1.0, "{c:?}");
        let p = Policy::Interval(IntervalAlgorithm::Batch);
        let today = run(&setup(5), p).summary;
        let then = run(&Setup { costs: GaugeCosts::Seal2006, ..setup(5) }, p).summary;
        assert!(today.rekeys > 0 && then.rekeys > 0);
        assert!(
            then.rekey_time_s > 100.0 * today.rekey_time_s,
            "{} s against {} s",
            then.rekey_time_s,
            today.rekey_time_s
        );
        let mut header = Vec::new();
        write_tables(&mut header, &Setup { costs: GaugeCosts::Seal2006, ..setup(5) }, GaugeEngine::Sim, &[]).unwrap();
        let header = String::from_utf8(header).unwrap();
        assert!(header.contains("Costs (seal2006): exp 12550.4 µs"), "{header}");
    }

    #[test]
    fn a_short_gauge_run_is_deterministic_per_seed_and_differs_across_seeds() {
        let p = Policy::Interval(IntervalAlgorithm::QueueBatch);
        let json = |seed| serde_json::to_string(&run(&setup(seed), p).summary).unwrap();
        let a = json(1);
        assert_eq!(a, json(1));
        assert_ne!(a, json(2));
    }

    #[test]
    fn every_member_in_the_group_at_the_end_holds_the_same_key_and_counts_are_not_zero() {
        for p in IntervalAlgorithm::ALL.map(Policy::Interval).into_iter().chain([Policy::PerView]) {
            let r = run(&setup(3), p);
            assert!(!r.end.is_empty(), "{p:?}: somebody is in at the end");
            assert_eq!(agreed(&r).unwrap_or_else(|e| panic!("{p:?}: {e}")), r.end.len());
            let s = &r.summary;
            assert!(s.rekeys > 0 && s.exps > 0.0 && s.bkey_packets > 0.0 && s.rekey_time_s > 0.0, "{p:?}: {s:?}");
            assert!(r.abandoned.unwrap() >= s.restarts.unwrap() && r.median_time_s > 0.0, "{p:?}");
            if p != Policy::PerView {
                assert!(s.blinded_keys.is_some_and(|b| b > 0.0), "{p:?}: {s:?}");
                // Only Queue-batch has Queue-subtree work to leave out: T' keyed
                // during the interval, so (almost) never in the rekey's run.
                let totals = (s.total_exps, s.total_blinded_keys, s.total_bkey_packets);
                if p == Policy::Interval(IntervalAlgorithm::QueueBatch) {
                    assert!(totals.0 > s.exps && totals.1 > s.blinded_keys && totals.2 > s.bkey_packets, "{s:?}");
                    let in_run = s.subtree_in_run.expect("Queue-batch rekeys with joiners");
                    assert!(in_run * 2 < s.rekeys, "{in_run} of {} rekeys keyed T' in their run", s.rekeys);
                } else {
                    assert_eq!(totals, (s.exps, s.blinded_keys, s.bkey_packets), "{p:?}");
                    assert_eq!(s.subtree_in_run, None);
                }
                // Intervals batch the views: fewer rekeys than views.
                assert!(s.rekeys < r.views.unwrap(), "{p:?}: {} rekeys, {:?} views", s.rekeys, r.views);
                // Every member of a rekey received its rekey message; only a
                // rekey begun again (restarted, or abandoned until the next
                // tick) sends its members another.
                for k in &r.rekeys {
                    assert!(k.rekey_packets.is_some_and(|got| got >= 1.0), "{p:?}: {k:?}");
                }
                if r.abandoned == Some(0) {
                    assert_eq!(s.rekey_packets, Some(1.0), "{p:?}: {s:?}");
                }
            } else {
                assert_eq!(Some(s.rekeys), r.views, "per-view TGDH rekeys every view");
                assert_eq!(s.rekey_packets, None, "no rekey messages per view");
            }
        }
    }

    #[test]
    fn a_member_without_the_key_or_with_another_fails_the_end_check() {
        let mut r = run(&setup(4), Policy::Interval(IntervalAlgorithm::Batch));
        assert!(agreed(&r).is_ok());
        let (_, _, key) = r.end.last_mut().unwrap();
        key.as_mut().unwrap().0.push('x');
        assert!(agreed(&r).is_err());
        r.end.last_mut().unwrap().2 = None;
        assert!(agreed(&r).is_err());
    }

    #[test]
    fn out_writes_csv_json_and_the_per_rekey_chart_and_refuses_an_unwritable_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_writable(&file.join("sub")).is_err(), "a directory under a file");
        let out = dir.path().join("out");
        check_writable(&out).unwrap();
        let results: Vec<RunResult> = [Policy::Interval(IntervalAlgorithm::QueueBatch), Policy::PerView]
            .into_iter()
            .map(|p| run(&setup(5), p))
            .collect();
        let charts = write_outputs(&out, &results).unwrap();
        let json: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(out.join("gauge.json")).unwrap()).unwrap();
        assert_eq!(json.len(), 2);
        assert_eq!(json[0]["algorithm"], "queue-batch");
        assert!(json[1]["blinded_keys"].is_null());
        let rows = csv::Reader::from_path(out.join("rekeys.csv")).unwrap().records().count();
        assert_eq!(rows as u64, results[0].summary.rekeys + results[1].summary.rekeys);
        assert_eq!(charts, ["rekeys-tin4-tout4.svg"], "one configuration: no sweep charts");
        assert!(out.join("rekeys-tin4-tout4.svg").exists() && out.join("rekeys-tin4-tout4.png").exists());
    }

    #[test]
    fn out_draws_fig9_and_fig10_where_the_runs_sweep_t() {
        let dir = tempfile::tempdir().unwrap();
        let p = Policy::Interval(IntervalAlgorithm::Batch);
        let at = |t_in: f64, t_out: f64| Setup { t_in, t_out, ..setup(6) };
        // T_out fixed, T_in varied: Fig. 9's charts for that T_out, no Fig. 10.
        let results: Vec<RunResult> = [at(4.0, 4.0), at(6.0, 4.0)].iter().map(|s| run(s, p)).collect();
        let charts = write_outputs(dir.path(), &results).unwrap();
        let want = ["time", "exps", "blinded-keys", "packets"].map(|m| format!("fig9-tout4-{m}.svg"));
        assert_eq!(charts[..2], ["rekeys-tin4-tout4.svg", "rekeys-tin6-tout4.svg"]);
        assert_eq!(charts[2..], want);
        // T_in = T_out varied: Fig. 10's.
        let results: Vec<RunResult> = [at(4.0, 4.0), at(6.0, 6.0)].iter().map(|s| run(s, p)).collect();
        let charts = write_outputs(dir.path(), &results).unwrap();
        assert!(charts.iter().any(|c| c == "fig10-exps.svg") && !charts.iter().any(|c| c.starts_with("fig9")));
        for c in &charts {
            assert!(dir.path().join(c).exists() && dir.path().join(c.replace(".svg", ".png")).exists(), "{c}");
        }
    }

    #[test]
    fn rekey_on_leave_rekeys_more_often_than_plain_batching_on_the_same_churn() {
        for a in IntervalAlgorithm::ALL {
            let plain = run(&setup(7), Policy::Interval(a));
            let on_leave = run(&setup(7), Policy::OnLeave(a));
            assert_eq!(agreed(&on_leave).unwrap(), on_leave.end.len(), "{a:?}");
            // Same churn, so the same views; every leave of a key holder rekeys at once.
            assert_eq!(plain.views, on_leave.views, "{a:?}");
            assert!(
                on_leave.summary.rekeys > plain.summary.rekeys,
                "{a:?}: {} vs {}",
                on_leave.summary.rekeys,
                plain.summary.rekeys
            );
        }
    }

    #[test]
    fn durations_parse_hours_minutes_and_seconds() {
        assert_eq!("2h".parse::<Span>().unwrap().0, 7200.0);
        assert_eq!("30m".parse::<Span>().unwrap().0, 1800.0);
        assert_eq!("90s".parse::<Span>().unwrap().0, 90.0);
        assert_eq!("45".parse::<Span>().unwrap().0, 45.0);
        for bad in ["", "h", "-5s", "2d", "xs"] {
            assert!(bad.parse::<Span>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn table2_is_recognized_only_in_its_configuration() {
        let mut s = Setup {
            members: 15,
            machines: 3,
            t_in: 60.0,
            t_out: 60.0,
            constant: 10.0,
            interval: 15.0,
            duration_s: 7200.0,
            seed: 1,
            costs: GaugeCosts::Measured,
        };
        assert_eq!(table2_row(&s), Some([0.43, 3.81, 6.70, 5.83]));
        s.t_out = 30.0;
        assert_eq!(table2_row(&s), None);
    }
}
