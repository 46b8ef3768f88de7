//! `conclave bench`: benchmarks as commands that print tables.

mod chart;
mod counts;
mod crypto;
mod events;
mod gcs;
mod live;
mod mls;
mod paper;

use anyhow::Result;
use clap::Subcommand;

/// The benchmarks.
#[derive(Subcommand)]
pub enum BenchCommand {
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
    /// Group communication on real sockets: agreed-multicast latency and throughput, join and leave
    /// latency, against an embedded daemon or the daemons given (and over TLS with --tls).
    Gcs(gcs::GcsArgs),
}

/// Runs a benchmark.
pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        #[cfg(feature = "cluster")]
        BenchCommand::CpgFloor(args) => gcs::run_cpg_floor(args),
        BenchCommand::Counts(args) => counts::run(args),
        BenchCommand::Crypto(args) => crypto::run(args),
        BenchCommand::Events(args) => events::run(args),
        BenchCommand::Gcs(args) => gcs::run(args),
    }
}
