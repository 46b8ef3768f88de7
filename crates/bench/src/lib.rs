//! `conclave-bench`: the benchmarks of Conclave, run as `conclave bench`
//! (the binary passes its `bench` subcommand through to [`Command`] and
//! [`run`]). Each command prints tables; some also write CSV, JSON and charts.
//!
//! * `bench counts` — rounds, messages and cryptographic operations per
//!   protocol, membership event and group size, counted on the seeded
//!   simulator beside the TISSEC paper's Tables I and II.
//! * `bench crypto` — every cryptographic operation of every suite, timed on
//!   this machine.
//! * `bench events` — the time from a membership event until every member
//!   holds the new key: on the simulator with virtual time and a cost model,
//!   or over real daemons (one embedded, or a Corosync cluster in network
//!   namespaces with the `cluster` feature), with MLS (mls-rs) as a peer.
//! * `bench form` — n secure sessions join one group at once on an embedded
//!   daemon: the time until all hold the confirmed key, CPU, peak memory and
//!   the daemon's traffic, beside mls-rs forming a group of n with one commit.
//! * `conclave gauge` (module `gauge`) — SEAL's Gauger: members joining and
//!   leaving one group on simulated daemons in virtual time, or as real
//!   sessions over real daemons in wall-clock time (`live::gauge`), rekeyed
//!   by the interval algorithms (Rebuild, Batch, Queue-batch, optionally with
//!   `:rekey-on-leave`) and by per-view TGDH, beside SEAL's Table 2, with
//!   charts like its Figures 9–11.
//! * `bench integrated` — the layered against the integrated architecture,
//!   beside the integrated-architecture paper's Figures 5–7: one group's
//!   events and many groups re-keyed by a partition and a merge, on simulated
//!   daemons in virtual time (default) or on a Corosync cluster of certified
//!   daemons; and data throughput per mode against message size.
//! * `bench gcs` — group communication on real sockets: agreed-multicast
//!   latency and throughput, join and leave latency; with the `cluster`
//!   feature also over Corosync, with bare CPG's own delivery as the floor.
//! * `bench soak` — many well-behaved clients with churn and traffic against
//!   one daemon (a child process) for a long time while an attacker runs each
//!   resource attack in turn: delivered, lost and duplicated messages, latency,
//!   the daemon's peak memory and descriptors, and how it answered each attack.
//!
//! The scenario vocabulary the commands share (membership events, sites and
//! their round trips, where members sit) is in `scenario`, which depends on
//! none of them; [`flood`] is the measuring round shared with `conclave flood`.
//! With the `cluster` feature, `floor` holds the bare CPG probes that measure
//! the floor under the cluster backbone.
#![warn(missing_docs)]

mod chart;
mod counts;
mod crypto;
mod events;
pub mod flood;
mod form;
mod gauge;
mod gcs;
mod integrated;
mod live;
mod mls;
mod paper;
mod scenario;
mod soak;
mod table;

#[cfg(feature = "cluster")]
pub use gcs::floor;

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum Command {
    /// One bare Corosync CPG process of `bench gcs --cluster`'s floor (run inside a node's namespace).
    #[cfg(feature = "cluster")]
    #[command(hide = true)]
    CpgFloor(gcs::CpgFloorArgs),
    /// Count rounds, messages and cryptographic operations per protocol,
    /// membership event and group size on the seeded simulator, beside the
    /// TISSEC paper's Tables I and II.
    Counts(counts::CountsArgs),
    /// Time every cryptographic operation of every suite on this machine.
    Crypto(crypto::CryptoArgs),
    /// Time from a membership event until every member has the new key, on
    /// the simulator with virtual time (TISSEC §6 scenarios).
    Events(events::EventsArgs),
    /// Forming a group: n secure sessions on a daemon process of their own join one group at once, timed until
    /// every member holds the same confirmed key; CPU, peak memory (the members' and the daemon's apart) and the
    /// daemon's bytes beside it, and mls-rs forming a group of the same size (one commit adding everybody) in the
    /// same run.
    Form(form::FormArgs),
    /// The layered against the integrated architecture (the integrated-architecture paper's §5): one group's
    /// join, leave, partition and merge (Fig. 5) and many groups re-keyed by one partition and merge (Fig. 6),
    /// on 13 simulated daemons in virtual time (default) or a Corosync cluster (--engine cluster: root,
    /// corosync, --features cluster); data throughput per mode against message size (Fig. 7).
    Integrated(integrated::IntegratedArgs),
    /// Group communication on real sockets: agreed-multicast latency and throughput, join and leave
    /// latency, against an embedded daemon or the daemons given (and over TLS with --tls).
    Gcs(gcs::GcsArgs),
    /// Soak: many well-behaved clients (default 1000 in 200 groups, 10 minutes) join, leave, rejoin and send
    /// against one daemon while an attacker runs each resource attack in turn; counts delivered, lost and
    /// duplicated messages, latency, the daemon's peak RSS and descriptors. Loopback only.
    Soak(soak::SoakArgs),
}

pub use gauge::{run as run_gauge, GaugeArgs};

/// Runs a benchmark.
pub fn run(cmd: Command) -> Result<()> {
    match cmd {
        #[cfg(feature = "cluster")]
        Command::CpgFloor(args) => gcs::run_cpg_floor(args),
        Command::Counts(args) => counts::run(args),
        Command::Crypto(args) => crypto::run(args),
        Command::Events(args) => events::run(args),
        Command::Form(args) => form::run(args),
        Command::Gcs(args) => gcs::run(args),
        Command::Integrated(args) => integrated::run(args),
        Command::Soak(args) => soak::run(args),
    }
}

/// Runs a networked benchmark on a tokio runtime. The runtime does not wait
/// for a read of stdin that is still pending when the benchmark ends.
fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let r = rt.block_on(f);
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    r
}
