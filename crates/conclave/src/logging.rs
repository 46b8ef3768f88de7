//! The log of the commands that keep one (`conclave daemon`): on stderr, as
//! text or as JSON lines, at the level `-v`/`-q` choose unless `RUST_LOG`
//! says otherwise, in colour only on a terminal and never with `NO_COLOR`.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicI8, Ordering};

use anyhow::{bail, Result};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};

/// How the log is written.
#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum LogFormat {
    /// One line of text per event: time, level, message.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, message and the event's other fields.
    Json,
}

/// `-v` count minus `-q` count, set once by `main`.
static VERBOSITY: AtomicI8 = AtomicI8::new(0);

/// Records the global `-v`/`-q` counts.
pub fn set_verbosity(verbose: u8, quiet: u8) {
    let v = i16::from(verbose) - i16::from(quiet);
    VERBOSITY.store(v.clamp(-8, 8) as i8, Ordering::SeqCst);
}

/// The level `-v`/`-q` choose: info by default, then debug and trace with
/// `-v`, `-vv`; warn, error and nothing with `-q`, `-qq`, `-qqq`.
pub fn level() -> LevelFilter {
    match VERBOSITY.load(Ordering::SeqCst) {
        i8::MIN..=-3 => LevelFilter::OFF,
        -2 => LevelFilter::ERROR,
        -1 => LevelFilter::WARN,
        0 => LevelFilter::INFO,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Whether a log was asked for: `RUST_LOG` set (and not empty), or -v.
pub fn asked_for() -> bool {
    std::env::var("RUST_LOG").is_ok_and(|s| !s.trim().is_empty()) || VERBOSITY.load(Ordering::SeqCst) > 0
}

/// Whether to colour the log: only when stderr is a terminal and `NO_COLOR`
/// is unset or empty (<https://no-color.org>).
pub fn colour() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// What is logged: `RUST_LOG` when it is set (and not empty), else the level
/// of `-v`/`-q`.
fn filter() -> Result<EnvFilter> {
    match std::env::var("RUST_LOG") {
        Ok(spec) if !spec.trim().is_empty() => match EnvFilter::builder().parse(spec.trim()) {
            Ok(filter) => Ok(filter),
            Err(e) => bail!(
                "RUST_LOG={spec:?} is not a log filter ({e}); use a level (error, warn, info, debug, trace) or \
                 directives such as RUST_LOG=info,conclave_gcs_net=debug, or unset it and use -v/-q"
            ),
        },
        _ => Ok(EnvFilter::new(level().to_string())),
    }
}

/// Installs the log on stderr.
pub fn init(format: LogFormat) -> Result<()> {
    let filter = filter()?;
    let builder = tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter);
    let r = match format {
        LogFormat::Text => builder.with_target(false).with_ansi(colour()).try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .with_ansi(false)
            .try_init(),
    };
    if let Err(e) = r {
        bail!("cannot set up the log: {e}");
    }
    Ok(())
}
