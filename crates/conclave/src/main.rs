//! `conclave`: the one command line of Conclave.
//!
//! It wires the library crates together and holds no protocol logic of its
//! own: the key agreement benchmarks (`conclave bench`, from `conclave-bench`,
//! behind the default feature `bench`), the standalone
//! daemon (`conclave daemon`), an interactive client in the manner of
//! Spread's spuser (`conclave client`) and a load generator in the manner of
//! spflooder (`conclave flood`), and `conclave demo`, which runs the whole
//! stack (daemon, secure sessions, key agreement) in one process, `conclave chat`, and `conclave keys`
//! (certified identities), and `conclave gauge` (SEAL's Gauger on simulated daemons or real sessions, from
//! `conclave-bench`).
//!
//! Built without the default feature `bench` (`--no-default-features`), it
//! is the daemon, client, chat, demo and keys without the benchmarks and the
//! load generator, and without their dependencies (mls-rs, plotters, resvg).
#![forbid(unsafe_code)]

mod chat;
mod client;
mod daemon;
mod demo;
#[cfg(feature = "bench")]
mod flood;
mod keys;
mod logging;
mod passphrase;
mod sim;
mod status;

use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use clap::{ArgAction, CommandFactory, Parser, Subcommand};

/// Conclave: secure group communication with contributory group key agreement.
#[derive(Parser)]
#[command(name = "conclave", version, about, long_about = None)]
#[command(after_help = "Shell completions: `conclave completions bash` (or zsh, fish, elvish, powershell) prints a \
script to load in your shell; `conclave man` prints the manual page (`conclave man | man -l -`).")]
struct Cli {
    /// Log more: -v debug, -vv trace (the daemon logs at info by default; the benchmarks log only with -v or RUST_LOG). RUST_LOG, when set, takes precedence
    /// [default: info].
    #[arg(short, long, action = ArgAction::Count, global = true, conflicts_with = "quiet")]
    verbose: u8,
    /// Log less: -q warnings and errors only, -qq errors only, -qqq nothing. RUST_LOG, when set, takes precedence.
    #[arg(short, long, action = ArgAction::Count, global = true)]
    quiet: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Benchmarks that reproduce the papers' measurements.
    #[cfg(feature = "bench")]
    #[command(subcommand)]
    Bench(conclave_bench::Command),
    /// SEAL's Gauger: members repeatedly join and leave one group on simulated daemons (virtual time) or as
    /// real sessions over real daemons (wall clock), rekeyed by SEAL's interval algorithms and by per-view
    /// TGDH, beside SEAL's Table 2; charts like its Figures 9-11.
    #[cfg(feature = "bench")]
    Gauge(conclave_bench::GaugeArgs),
    /// The whole stack in one process: an embedded daemon and scripted members
    /// that join, talk and leave under each protocol, with secure views,
    /// rekey times and decrypted traffic printed.
    Demo(demo::DemoArgs),
    /// Run the standalone group communication daemon until Ctrl-C or SIGTERM.
    Daemon(Box<daemon::DaemonArgs>),
    /// Connect to a daemon and type commands (join, send, leave, ...) on stdin.
    Client(client::ClientArgs),
    /// Show a running daemon's groups, members, connections, queues, limits, uptime, daemon group and access
    /// rules (for its own Unix user, root and its configured operators).
    Status(status::StatusArgs),
    /// A secure chat room in the terminal (end-to-end encrypted, rekeyed on every membership change).
    Chat(chat::ChatArgs),
    /// Load test: several connections flood one group with agreed messages.
    #[cfg(feature = "bench")]
    Flood(flood::FloodArgs),
    /// The secure stack from seeds on simulated daemons (partitions, merges, crashes), with an attacker: checks that no key splits, nobody is stuck and nothing forged is accepted.
    Sim(sim::SimArgs),
    /// Certified identities: the group authority, member certificates and revocation.
    Keys {
        #[command(subcommand)]
        which: keys::KeysCommand,
    },
    /// Print a shell completion script on stdout, e.g. `conclave completions bash > ~/.local/share/bash-completion/completions/conclave`.
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) on stdout: `conclave man | man -l -`, or `conclave man daemon` for one command's page.
    Man {
        /// A command whose page to print (e.g. daemon, client, keys) [default: the page of conclave itself].
        #[arg(value_name = "COMMAND")]
        command: Option<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    logging::set_verbosity(cli.verbose, cli.quiet);
    quiet_when_stdout_closes();
    // A print to a closed stdout (`conclave demo | head -1`) panics in
    // `println!`; the panic unwinds through the command, so its guards remove
    // temporary files and stop embedded daemons, and the run ends quietly.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli.command)));
    if STDOUT_CLOSED.load(Ordering::SeqCst) {
        std::process::exit(0);
    }
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            eprintln!("conclave: {}", error_text(&e));
            std::process::exit(1);
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

fn run(command: Command) -> Result<()> {
    // The benchmarks run sessions and daemons in this process: their log is
    // written only when asked for (`RUST_LOG` or -v), not over the progress.
    #[cfg(feature = "bench")]
    if matches!(command, Command::Bench(_) | Command::Gauge(_)) && logging::asked_for() {
        logging::init(logging::LogFormat::Text)?;
    }
    match command {
        #[cfg(feature = "bench")]
        Command::Bench(which) => conclave_bench::run(which),
        #[cfg(feature = "bench")]
        Command::Gauge(args) => conclave_bench::run_gauge(args),
        Command::Demo(args) => demo::run(args),
        Command::Daemon(args) => daemon::run(*args),
        Command::Client(args) => client::run(args),
        Command::Status(args) => status::run(args),
        Command::Chat(args) => chat::run(args),
        #[cfg(feature = "bench")]
        Command::Flood(args) => flood::run(args),
        Command::Sim(args) => sim::run(args),
        Command::Keys { which } => keys::run(which),
        Command::Completions { shell } => {
            let mut cli = Cli::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cli, "conclave", &mut out);
            // print!: a closed stdout ends the run quietly (see quiet_when_stdout_closes).
            print!("{}", String::from_utf8_lossy(&out));
            Ok(())
        }
        Command::Man { command } => man(command.as_deref()),
    }
}

/// Prints the manual page of conclave, or of one of its commands.
fn man(command: Option<&str>) -> Result<()> {
    let mut cli = Cli::command();
    // Built, the commands carry the global options (-v, -q) too.
    cli.build();
    let page = match command {
        None => cli,
        Some(name) => {
            let Some(sub) = cli.find_subcommand(name) else {
                let names: Vec<&str> = cli.get_subcommands().map(|c| c.get_name()).collect();
                anyhow::bail!("there is no command {name:?}; the commands are {}", names.join(", "));
            };
            // The page is conclave-daemon(1), its synopsis `conclave daemon`.
            let page: &'static str = Box::leak(format!("conclave-{}", sub.get_name()).into_boxed_str());
            sub.clone().name(page).bin_name(format!("conclave {}", sub.get_name())).version(env!("CARGO_PKG_VERSION"))
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page).render(&mut out)?;
    print!("{}", String::from_utf8_lossy(&out));
    Ok(())
}

/// An error and its causes on one line, each said once: a cause whose text
/// its context already shows (`i/o error: {0}` over the i/o error itself) is
/// not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let said = cause.to_string();
        if said.is_empty() || text.contains(&said) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&said);
    }
    text
}

/// Set once a print to stdout failed because the reader went away.
static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);

/// Makes a print to a closed stdout (EPIPE: Rust ignores SIGPIPE, so
/// `println!` panics instead of the process dying) end the run quietly: the
/// panic hook records it and prints nothing, nor for the panics that follow
/// from it (a worker thread that died printing); `main` then exits 0. Every
/// other panic is reported as usual.
fn quiet_when_stdout_closes() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            STDOUT_CLOSED.store(true, Ordering::SeqCst);
        }
        if !STDOUT_CLOSED.load(Ordering::SeqCst) {
            report(info);
        }
    }));
}

/// Runs a networked command on a tokio runtime. The runtime does not wait
/// for a read of stdin that is still pending when the command ends.
fn block_on<T>(f: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let r = rt.block_on(f);
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    r
}
