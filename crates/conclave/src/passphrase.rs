//! Passphrases of protected secret keys (encrypted PKCS#8, see
//! `conclave_secure::trust::protect_key`): given by a file
//! (`--passphrase-file PATH`, its first line), an environment variable
//! (`--passphrase-env VAR`), or typed at a prompt on the terminal (no echo)
//! when standard input is one. Passphrases live in `Zeroizing` buffers and
//! are never printed.

use std::io::{BufRead, IsTerminal, Write};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_secure::trust::{self, TrustError};
use zeroize::Zeroizing;

/// How to give the passphrase of a protected secret key.
#[derive(Args, Debug, Clone, Default)]
pub struct PassphraseArgs {
    /// If the secret key is protected by a passphrase: read the passphrase from the first line of PATH
    /// (keep the file private). Without this or --passphrase-env, it is asked on the terminal.
    #[arg(long, value_name = "PATH", conflicts_with = "passphrase_env")]
    pub passphrase_file: Option<PathBuf>,
    /// If the secret key is protected by a passphrase: read the passphrase from the environment variable VAR.
    #[arg(long, value_name = "VAR")]
    pub passphrase_env: Option<String>,
}

/// How to give the passphrase that protects a new key, for each of its kinds
/// of option names.
pub struct NewPassphrase<'a> {
    /// `--passphrase`-like flag: ask on the terminal, twice.
    pub prompt: bool,
    /// `--passphrase-file`-like.
    pub file: Option<&'a Path>,
    /// `--passphrase-env`-like.
    pub env: Option<&'a str>,
    /// The option names, for messages ("--passphrase-file" ...).
    pub names: [&'static str; 3],
}

impl NewPassphrase<'_> {
    /// The passphrase to protect a new key `what` with, or `None` if none was asked for.
    pub fn get(&self, what: &str) -> Result<Option<Zeroizing<Vec<u8>>>> {
        let [prompt_flag, file_flag, env_flag] = self.names;
        let p = if let Some(path) = self.file {
            from_file(path, file_flag)?
        } else if let Some(var) = self.env {
            from_env(var, env_flag)?
        } else if self.prompt {
            if !std::io::stdin().is_terminal() {
                bail!("{prompt_flag} asks for the passphrase on a terminal, and this is not one: give {file_flag} or {env_flag}");
            }
            let first = prompt(&format!("New passphrase for {what}: "))?;
            let second = prompt("The same passphrase again: ")?;
            if first != second {
                bail!("the two passphrases differ; nothing was written");
            }
            first
        } else {
            return Ok(None);
        };
        if p.is_empty() {
            bail!("the passphrase for {what} is empty; give a non-empty one, or none to leave the key unprotected");
        }
        Ok(Some(p))
    }
}

impl PassphraseArgs {
    /// The plain PEM of the secret key `key_pem` read from `path`: as it is
    /// if it is not protected; else opened with the passphrase from
    /// `--passphrase-file`, `--passphrase-env` or a prompt, with an error
    /// that says what to do when none can be had or it is wrong.
    pub fn open_key(&self, key_pem: &str, path: &Path) -> Result<Zeroizing<String>> {
        if !trust::key_is_protected(key_pem) {
            return Ok(Zeroizing::new(key_pem.to_owned()));
        }
        let (passphrase, from) = if let Some(file) = &self.passphrase_file {
            (from_file(file, "--passphrase-file")?, format!("the one in {}", file.display()))
        } else if let Some(var) = &self.passphrase_env {
            (from_env(var, "--passphrase-env")?, format!("the one in ${var}"))
        } else if std::io::stdin().is_terminal() {
            (prompt(&format!("Passphrase for {}: ", path.display()))?, "the one typed".to_owned())
        } else {
            bail!(
                "{} is protected by a passphrase: give --passphrase-file or --passphrase-env, or run on a terminal",
                path.display()
            );
        };
        trust::unprotect_key(key_pem, Some(&passphrase)).map_err(|e| match e {
            TrustError::WrongPassphrase => {
                anyhow::anyhow!("wrong passphrase for {} ({from} does not open it)", path.display())
            }
            e => anyhow::anyhow!("cannot open the protected key {}: {e}", path.display()),
        })
    }
}

/// The first line of `path` (without its line ending).
fn from_file(path: &Path, flag: &str) -> Result<Zeroizing<Vec<u8>>> {
    let bytes = Zeroizing::new(
        std::fs::read(path).with_context(|| format!("cannot read the passphrase file {} ({flag})", path.display()))?,
    );
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        bail!("the passphrase file {} ({flag}) is empty", path.display());
    }
    Ok(Zeroizing::new(line.to_vec()))
}

/// The value of the environment variable `var`.
fn from_env(var: &str, flag: &str) -> Result<Zeroizing<Vec<u8>>> {
    match std::env::var_os(var) {
        Some(v) if !v.is_empty() => Ok(Zeroizing::new(v.into_vec())),
        Some(_) => bail!("the environment variable {var} ({flag}) is empty"),
        None => bail!("the environment variable {var} ({flag}) is not set"),
    }
}

/// Asks for a passphrase on the terminal (`/dev/tty`), echo off.
fn prompt(text: &str) -> Result<Zeroizing<Vec<u8>>> {
    use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions};
    let tty =
        std::fs::OpenOptions::new().read(true).write(true).open("/dev/tty").context("cannot open the terminal")?;
    let saved = tcgetattr(&tty).context("cannot set up the terminal")?;
    let mut quiet = saved.clone();
    quiet.local_modes.remove(LocalModes::ECHO);
    quiet.local_modes.insert(LocalModes::ECHONL);
    (&tty).write_all(text.as_bytes()).and_then(|()| (&tty).flush()).context("cannot write to the terminal")?;
    tcsetattr(&tty, OptionalActions::Flush, &quiet).context("cannot turn the terminal's echo off")?;
    let mut line = Zeroizing::new(Vec::new());
    let read = std::io::BufReader::new(&tty).read_until(b'\n', &mut line);
    let _ = tcsetattr(&tty, OptionalActions::Now, &saved);
    read.context("cannot read the passphrase from the terminal")?;
    while matches!(line.last(), Some(b'\n' | b'\r')) {
        line.pop();
    }
    Ok(line)
}
