//! `conclave`: the one command line of Conclave.
//!
//! It wires the library crates together and holds no protocol logic of its
//! own. Today it runs the key agreement benchmarks (`conclave bench`); the
//! daemon, chat, gauge and keys commands of DESIGN.md join it as they land.

mod bench;

use anyhow::Result;
use clap::{Parser, Subcommand};

/// Conclave: secure group communication with contributory group key agreement.
#[derive(Parser)]
#[command(name = "conclave", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks that reproduce the papers' measurements.
    Bench {
        #[command(subcommand)]
        which: bench::BenchCommand,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Bench { which } => bench::run(which),
    }
}
