//! `conclave keys`: the group authority and the members' certified identities.
//!
//! A key directory (`--dir DIR`, by default `$XDG_STATE_HOME/conclave/keys`,
//! else `~/.local/state/conclave/keys`; never a shared `/tmp` path) holds:
//!
//! * `authority.crt` — the authority's self-signed CA certificate (PEM), what
//!   members trust; `authority.key` — its Ed25519 secret key (PKCS#8 PEM, mode
//!   0600); `authority.crl` — the CRL it signs (PEM, numbered, re-signed on
//!   every revocation).
//! * `members/NAME.crt` and `members/NAME.key` (0600) — a member's
//!   certificate (subject CN = NAME, clientAuth usage, issued by the
//!   authority) and secret key.
//! * Secret keys may be protected by a passphrase (`keys authority
//!   --passphrase`, `keys issue --member-passphrase`): they are then
//!   encrypted PKCS#8 (`ENCRYPTED PRIVATE KEY`; scrypt and AES-256-CBC), and
//!   every command that uses one asks for the passphrase (see
//!   [`crate::passphrase`]).
//! * `daemon.crt` and `daemon.key` (0600) — a daemon's TLS server
//!   certificate (serverAuth usage, its host names as subject alternative
//!   names) and secret key, for `conclave daemon --tls-cert/--tls-key`.
//!
//! The directory and `members/` must be real directories (not symbolic
//! links), owned by the user and private (mode 0700); anything else is
//! refused with the command that fixes it. Directories are created 0700,
//! parents too. Every file is written to a new file of a random name
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, 0600 or 0644), synced, then renamed over
//! its target, so a link planted at either name is never written through
//! (one at the target is replaced); key files are read with `O_NOFOLLOW`,
//! so a link there is refused, not trusted. Secret keys readable by group
//! or others are refused. Keys are drawn from the OS's RNG. The crypto is
//! `conclave_secure::trust`'s; this module only reads and writes the files.

use std::ffi::OsString;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use conclave_secure::trust::{self, Authority, Identity, Issuer, Revocation};
use conclave_secure::MemberId;
use rand_core::{CryptoRngCore, RngCore};
use zeroize::Zeroizing;

use crate::passphrase::{NewPassphrase, PassphraseArgs};

const DAY: Duration = Duration::from_secs(86_400);

/// `conclave keys` subcommands.
#[derive(Subcommand, Debug)]
pub enum KeysCommand {
    /// Create the group authority (CA certificate, key and an empty CRL) in DIR.
    Authority {
        #[command(flatten)]
        dir: DirArg,
        /// The authority's name (its certificate's common name).
        #[arg(long, default_value = "Conclave group authority")]
        name: String,
        /// Validity of the authority certificate, in days.
        #[arg(long, default_value_t = 3650)]
        days: u64,
        /// Protect the authority's secret key with a passphrase, asked twice on the terminal (no echo).
        /// Every command that issues or revokes then asks for it (or takes --passphrase-file/-env).
        #[arg(long, conflicts_with_all = ["passphrase_file", "passphrase_env"])]
        passphrase: bool,
        /// Protect the authority's secret key with the passphrase on the first line of PATH.
        #[arg(long, value_name = "PATH", conflicts_with = "passphrase_env")]
        passphrase_file: Option<PathBuf>,
        /// Protect the authority's secret key with the passphrase in the environment variable VAR.
        #[arg(long, value_name = "VAR")]
        passphrase_env: Option<String>,
    },
    /// Issue a member identity: DIR/members/NAME.key and NAME.crt (refuses to overwrite).
    Issue {
        /// Member name (as the member connects to the daemon).
        name: String,
        #[command(flatten)]
        dir: DirArg,
        /// Validity of the certificate, in days (at least 1).
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// Replace NAME's certificate if it is revoked or expired (a valid one must be revoked first).
        #[arg(long)]
        replace: bool,
        /// The authority key's passphrase, if it has one.
        #[command(flatten)]
        unlock: PassphraseArgs,
        /// Protect the member's new secret key with a passphrase, asked twice on the terminal (no echo).
        #[arg(long, conflicts_with_all = ["member_passphrase_file", "member_passphrase_env"])]
        member_passphrase: bool,
        /// Protect the member's new secret key with the passphrase on the first line of PATH.
        #[arg(long, value_name = "PATH", conflicts_with = "member_passphrase_env")]
        member_passphrase_file: Option<PathBuf>,
        /// Protect the member's new secret key with the passphrase in the environment variable VAR.
        #[arg(long, value_name = "VAR")]
        member_passphrase_env: Option<String>,
    },
    /// Revoke a member's certificate: adds its serial to the CRL and re-signs it.
    Revoke {
        /// Member name.
        name: String,
        #[command(flatten)]
        dir: DirArg,
        /// Why (recorded in the CRL and shown to the group).
        #[arg(long, value_enum, default_value = "unspecified")]
        reason: Reason,
        /// The authority key's passphrase, if it has one.
        #[command(flatten)]
        unlock: PassphraseArgs,
    },
    /// Issue the daemon's TLS server certificate: DIR/daemon.crt and daemon.key
    /// (refuses to overwrite). Clients that trust the authority trust the daemon.
    Daemon {
        /// Host names or IP addresses clients reach the daemon by (repeatable).
        #[arg(long = "host", value_name = "NAME", required = true)]
        hosts: Vec<String>,
        #[command(flatten)]
        dir: DirArg,
        /// Validity of the certificate, in days.
        #[arg(long, default_value_t = 365)]
        days: u64,
        /// The authority key's passphrase, if it has one (the daemon's own key is written unprotected: a
        /// daemon starts unattended).
        #[command(flatten)]
        unlock: PassphraseArgs,
    },
    /// List the issued members: serial, validity, revoked or not.
    List {
        #[command(flatten)]
        dir: DirArg,
        /// Print one JSON object (authority, CRL number, members with serial, validity and status) instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The key directory option.
#[derive(Args, Debug)]
pub struct DirArg {
    /// Key directory, private to you (mode 0700) [default: $XDG_STATE_HOME/conclave/keys, else
    /// ~/.local/state/conclave/keys].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

impl DirArg {
    /// The key directory, checked (see [`KeyDir::open`]).
    fn open(&self) -> Result<KeyDir> {
        KeyDir::open(match &self.dir {
            Some(dir) => dir.clone(),
            None => default_dir("--dir DIR")?,
        })
    }
}

/// Revocation reasons (RFC 5280 §5.3.1) offered on the command line.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub enum Reason {
    /// No reason given.
    Unspecified,
    /// The member's secret key was exposed.
    KeyCompromise,
    /// The member left the organisation.
    AffiliationChanged,
    /// Replaced by a new certificate.
    Superseded,
    /// The member no longer needs the certificate.
    CessationOfOperation,
    /// The member lost the right to take part.
    PrivilegeWithdrawn,
}

impl Reason {
    fn rcgen(self) -> rcgen::RevocationReason {
        use rcgen::RevocationReason as R;
        match self {
            Reason::Unspecified => R::Unspecified,
            Reason::KeyCompromise => R::KeyCompromise,
            Reason::AffiliationChanged => R::AffiliationChanged,
            Reason::Superseded => R::Superseded,
            Reason::CessationOfOperation => R::CessationOfOperation,
            Reason::PrivilegeWithdrawn => R::PrivilegeWithdrawn,
        }
    }
}

/// The default key directory: `$XDG_STATE_HOME/conclave/keys`, else
/// `$HOME/.local/state/conclave/keys`; an error that says to pass `option`
/// if neither variable holds an absolute path. Never a shared `/tmp` path.
pub fn default_dir(option: &str) -> Result<PathBuf> {
    default_dir_from(|var| std::env::var_os(var), option)
}

fn default_dir_from(env: impl Fn(&str) -> Option<OsString>, option: &str) -> Result<PathBuf> {
    // The XDG base directory spec: relative paths are invalid and ignored.
    let absolute = |var: &str| env(var).map(PathBuf::from).filter(|p| p.is_absolute());
    if let Some(state) = absolute("XDG_STATE_HOME") {
        Ok(state.join("conclave").join("keys"))
    } else if let Some(home) = absolute("HOME") {
        Ok(home.join(".local/state/conclave/keys"))
    } else {
        bail!(
            "cannot choose a default key directory: neither $XDG_STATE_HOME nor $HOME is set (to an absolute \
             path); pass a directory of your own with {option}"
        )
    }
}

/// The effective user id of this process.
fn my_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Refuses an existing `dir` unless it is a real directory (not a symbolic
/// link), owned by this user, with no permission bits for group or others;
/// the error says what is wrong and how to fix it. Says whether `dir` exists.
pub fn check_private_dir(dir: &Path, what: &str) -> Result<bool> {
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("cannot check {what} {}", dir.display())),
    };
    let shown = dir.display();
    if meta.file_type().is_symlink() {
        bail!(
            "{what} {shown} is a symbolic link; refusing it (whoever controls the link controls the keys): \
             pass the real directory, or remove the link (rm {shown})"
        );
    }
    if !meta.is_dir() {
        bail!("{what} {shown} is not a directory");
    }
    let me = my_uid();
    if meta.uid() != me {
        bail!(
            "{what} {shown} is owned by uid {}, not by you (uid {me}); refusing it (its owner can read and \
             replace the keys): use a directory of your own, or, if it should be yours, `chown {me} {shown}` \
             (as root) and `chmod 700 {shown}`",
            meta.uid()
        );
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        bail!(
            "{what} {shown} has mode {mode:o}: group or others have access to it, and it must be private to you \
             (mode 700); fix it with `chmod 700 {shown}`"
        );
    }
    Ok(true)
}

/// Runs `conclave keys`.
pub fn run(cmd: KeysCommand) -> Result<()> {
    let rng = &mut rand_core::OsRng;
    match cmd {
        KeysCommand::Authority { dir, name, days, passphrase, passphrase_file, passphrase_env } => {
            let kd = dir.open()?;
            if kd.has_authority() || kd.can_issue() {
                bail!("{} already holds an authority; remove it first to start over", kd.dir.display());
            }
            let new = NewPassphrase {
                prompt: passphrase,
                file: passphrase_file.as_deref(),
                env: passphrase_env.as_deref(),
                names: ["--passphrase", "--passphrase-file", "--passphrase-env"],
            };
            let protect = new.get("the authority's secret key")?;
            kd.create_authority_protected(&name, days, protect.as_deref().map(|p| p.as_slice()), rng)?;
            let how = if protect.is_some() { ", its secret key protected by a passphrase" } else { "" };
            println!("created the authority {name:?} in {}{how}", kd.dir.display());
        }
        KeysCommand::Issue {
            name,
            dir,
            days,
            replace,
            unlock,
            member_passphrase,
            member_passphrase_file,
            member_passphrase_env,
        } => {
            let kd = dir.open()?;
            let new = NewPassphrase {
                prompt: member_passphrase,
                file: member_passphrase_file.as_deref(),
                env: member_passphrase_env.as_deref(),
                names: ["--member-passphrase", "--member-passphrase-file", "--member-passphrase-env"],
            };
            let protect = new.get(&format!("{name}'s secret key"))?;
            let protect = protect.as_deref().map(|p| p.as_slice());
            let serial = kd.issue_with(&name, days, replace, &unlock, protect, rng)?;
            let how = if protect.is_some() { " (its secret key protected by a passphrase)" } else { "" };
            println!("issued {name} (serial {serial}): {}{how}", kd.member_cert(&name).display());
        }
        KeysCommand::Revoke { name, dir, reason, unlock } => {
            let kd = dir.open()?;
            let (serial, number) = kd.revoke_with(&name, reason, &unlock)?;
            println!("revoked {name} (serial {serial}); CRL number {number}: {}", kd.crl().display());
        }
        KeysCommand::Daemon { hosts, dir, days, unlock } => {
            let kd = dir.open()?;
            let serial = kd.issue_daemon(&hosts, days, &unlock, rng)?;
            println!(
                "issued the daemon certificate for {} (serial {serial}): {} and {}",
                hosts.join(", "),
                kd.daemon_cert().display(),
                kd.daemon_key().display()
            );
        }
        KeysCommand::List { dir, json } => dir.open()?.list(json)?,
    }
    Ok(())
}

/// A key directory (see the module doc).
pub struct KeyDir {
    dir: PathBuf,
}

impl KeyDir {
    /// The directory at `dir` (not created until something is written);
    /// refused if it, or its `members/`, exists and is not a private
    /// directory of this user's ([`check_private_dir`]).
    pub fn open(dir: PathBuf) -> Result<KeyDir> {
        let kd = KeyDir { dir };
        if check_private_dir(&kd.dir, "key directory")? {
            check_private_dir(&kd.members(), "key directory")?;
        }
        Ok(kd)
    }

    /// Path of the file (see the module doc).
    pub fn ca_cert(&self) -> PathBuf {
        self.dir.join("authority.crt")
    }
    fn ca_key(&self) -> PathBuf {
        self.dir.join("authority.key")
    }
    /// Path of the file (see the module doc).
    pub fn crl(&self) -> PathBuf {
        self.dir.join("authority.crl")
    }
    fn daemon_cert(&self) -> PathBuf {
        self.dir.join("daemon.crt")
    }
    fn daemon_key(&self) -> PathBuf {
        self.dir.join("daemon.key")
    }
    fn members(&self) -> PathBuf {
        self.dir.join("members")
    }
    /// Path of the file (see the module doc).
    pub fn member_cert(&self, name: &str) -> PathBuf {
        self.members().join(format!("{name}.crt"))
    }
    /// Path of the file (see the module doc).
    pub fn member_key(&self, name: &str) -> PathBuf {
        self.members().join(format!("{name}.key"))
    }

    /// Whether the directory holds an authority certificate.
    pub fn has_authority(&self) -> bool {
        present(&self.ca_cert())
    }

    /// Whether the directory holds a certificate for `name`.
    pub fn has_member(&self, name: &str) -> bool {
        present(&self.member_cert(name))
    }

    /// Whether this directory can issue (holds the authority's secret key).
    pub fn can_issue(&self) -> bool {
        present(&self.ca_key())
    }

    /// Creates the directory and `members/` (and missing parents) 0700, and
    /// checks them again (they may have been there already).
    fn mkdirs(&self) -> Result<()> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.members())
            .with_context(|| format!("cannot create key directory {}", self.dir.display()))?;
        check_private_dir(&self.dir, "key directory")?;
        check_private_dir(&self.members(), "key directory")?;
        Ok(())
    }

    /// Creates the authority; refuses if one exists.
    pub fn create_authority(&self, name: &str, days: u64, rng: &mut dyn CryptoRngCore) -> Result<()> {
        self.create_authority_protected(name, days, None, rng)
    }

    /// Creates the authority, its secret key protected by `passphrase` if
    /// one is given; refuses if one exists.
    pub fn create_authority_protected(
        &self,
        name: &str,
        days: u64,
        passphrase: Option<&[u8]>,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<()> {
        if self.has_authority() || self.can_issue() {
            bail!("{} already holds an authority; remove it first to start over", self.dir.display());
        }
        self.mkdirs()?;
        let now = SystemTime::now();
        // Back-date by an hour so clocks a little behind still accept it.
        let from = now - Duration::from_secs(3600);
        let (issuer, key_pem) = Issuer::create(name, from, now + validity(days)?, rng)?;
        let key_pem = protect(key_pem, passphrase, rng)?;
        write_secret(&self.ca_key(), &key_pem)?;
        write_public(&self.ca_cert(), issuer.ca_pem())?;
        write_public(&self.crl(), &issuer.crl(1, &[], now, now + 365 * DAY)?)?;
        Ok(())
    }

    fn issuer(&self, unlock: &PassphraseArgs) -> Result<Issuer> {
        if !self.can_issue() {
            bail!(
                "no authority key in {} (create one with `conclave keys authority --dir {}`)",
                self.dir.display(),
                self.dir.display()
            );
        }
        let key = Zeroizing::new(read_secret(&self.ca_key())?);
        let key = unlock.open_key(&key, &self.ca_key())?;
        let cert = read(&self.ca_cert())?;
        Issuer::load(&cert, &key).with_context(|| format!("bad authority in {}", self.dir.display()))
    }

    /// Issues `name`'s identity. Refuses to overwrite one, unless `replace`
    /// and the one there is revoked or expired. Returns the serial. (The
    /// commands all go through [`KeyDir::issue_with`].)
    #[cfg(test)]
    pub fn issue(&self, name: &str, days: u64, replace: bool, rng: &mut dyn CryptoRngCore) -> Result<String> {
        self.issue_with(name, days, replace, &PassphraseArgs::default(), None, rng)
    }

    /// As [`KeyDir::issue`], opening the authority's key with `unlock` if it
    /// is protected, and protecting the member's new key with `protect_with`
    /// if given.
    pub fn issue_with(
        &self,
        name: &str,
        days: u64,
        replace: bool,
        unlock: &PassphraseArgs,
        protect_with: Option<&[u8]>,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<String> {
        let member = MemberId::new(name).with_context(|| format!("bad member name {name:?}"))?;
        if !file_safe(name) {
            bail!("member name {name:?} cannot name a key file");
        }
        let validity = validity(days)?;
        let existing = present(&self.member_cert(name)) || present(&self.member_key(name));
        if existing {
            match (self.unusable(name)?, replace) {
                (Some(_), true) => {}
                (Some(why), false) => bail!(
                    "{name}'s certificate in {} {why}; issue a new one with `conclave keys issue {name} --replace`",
                    self.members().display()
                ),
                (None, _) => bail!(
                    "{name} already has a valid certificate in {}; to replace it, revoke it first \
                     (`conclave keys revoke {name}`) and then issue with --replace, or choose another name",
                    self.members().display()
                ),
            }
        }
        let issuer = self.issuer(unlock)?;
        self.mkdirs()?;
        let now = SystemTime::now();
        let issued = issuer.issue(&member, now - Duration::from_secs(3600), now + validity, rng)?;
        let key_pem = protect(issued.key_pem, protect_with, rng)?;
        if existing {
            for old in [self.member_cert(name), self.member_key(name)] {
                match std::fs::remove_file(&old) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(e).with_context(|| format!("cannot remove {}", old.display()))
                    }
                    _ => {}
                }
            }
        }
        write_secret(&self.member_key(name), &key_pem)?;
        write_public(&self.member_cert(name), &issued.cert_pem)?;
        Ok(issued.serial)
    }

    /// Issues the daemon's TLS server certificate for `hosts`; refuses to
    /// overwrite one. Returns the serial.
    pub fn issue_daemon(
        &self,
        hosts: &[String],
        days: u64,
        unlock: &PassphraseArgs,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<String> {
        if present(&self.daemon_cert()) || present(&self.daemon_key()) {
            bail!("{} already holds a daemon certificate; remove daemon.crt and daemon.key first", self.dir.display());
        }
        let validity = validity(days)?;
        let issuer = self.issuer(unlock)?;
        self.mkdirs()?;
        let now = SystemTime::now();
        let issued = issuer
            .issue_daemon(hosts, now - Duration::from_secs(3600), now + validity, rng)
            .context("cannot issue the daemon certificate (host names must be DNS names or IP addresses)")?;
        write_secret(&self.daemon_key(), &issued.key_pem)?;
        write_public(&self.daemon_cert(), &issued.cert_pem)?;
        Ok(issued.serial)
    }

    /// Why `name`'s certificate can no longer be used ("is revoked", "has
    /// expired", "is unreadable"), or `None` if it can.
    fn unusable(&self, name: &str) -> Result<Option<&'static str>> {
        let Some(pem) = read_opt(&self.member_cert(name))? else { return Ok(Some("is missing")) };
        let Ok(info) = trust::cert_info(&pem) else { return Ok(Some("is unreadable")) };
        let revoked = match read_opt(&self.crl())? {
            Some(pem) => trust::read_crl(&pem).with_context(|| format!("bad CRL {}", self.crl().display()))?.1,
            None => Vec::new(),
        };
        Ok(if revoked.iter().any(|r| r.serial == info.serial_bytes) {
            Some("is revoked")
        } else if info.not_after < SystemTime::now() {
            Some("has expired")
        } else {
            None
        })
    }

    /// Revokes `name`'s certificate. Returns its serial and the new CRL number.
    #[cfg(test)]
    pub fn revoke(&self, name: &str, reason: Reason) -> Result<(String, u64)> {
        self.revoke_with(name, reason, &PassphraseArgs::default())
    }

    /// As [`KeyDir::revoke`], opening the authority's key with `unlock` if it is protected.
    pub fn revoke_with(&self, name: &str, reason: Reason, unlock: &PassphraseArgs) -> Result<(String, u64)> {
        let issuer = self.issuer(unlock)?;
        let cert_path = self.member_cert(name);
        let info =
            trust::cert_info(&read(&cert_path)?).with_context(|| format!("bad certificate {}", cert_path.display()))?;
        let (number, mut revoked) = match read_opt(&self.crl())? {
            Some(pem) => trust::read_crl(&pem).with_context(|| format!("bad CRL {}", self.crl().display()))?,
            None => (0, Vec::new()),
        };
        if revoked.iter().any(|r| r.serial == info.serial_bytes) {
            bail!("{name}'s certificate (serial {}) is already revoked", info.serial);
        }
        let now = SystemTime::now();
        revoked.push(Revocation { serial: info.serial_bytes.clone(), time: now, reason: Some(reason.rcgen()) });
        let crl = issuer.crl(number + 1, &revoked, now, now + 365 * DAY)?;
        write_public(&self.crl(), &crl)?;
        Ok((info.serial, number + 1))
    }

    /// Prints the members, as text or as one JSON object.
    fn list(&self, json: bool) -> Result<()> {
        let authority = self.authority()?;
        let revoked = match read_opt(&self.crl())? {
            Some(pem) => trust::read_crl(&pem)?.1,
            None => Vec::new(),
        };
        let mut members = Vec::new();
        if !json {
            println!(
                "authority {} (CRL number {})",
                self.ca_cert().display(),
                authority.crl_number().unwrap_or("none")
            );
        }
        let mut names: Vec<PathBuf> = match std::fs::read_dir(self.members()) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        if names.is_empty() && !json {
            println!("no members issued yet");
        }
        let now = SystemTime::now();
        for path in names {
            let info = match read(&path).and_then(|pem| Ok(trust::cert_info(&pem)?)) {
                Ok(i) => i,
                Err(e) if json => {
                    members.push(serde_json::json!({
                        "file": path.display().to_string(),
                        "status": "unreadable",
                        "error": crate::error_text(&e),
                    }));
                    continue;
                }
                Err(e) => {
                    println!("{}: unreadable: {}", path.display(), crate::error_text(&e));
                    continue;
                }
            };
            if json {
                let revocation = revoked.iter().find(|r| r.serial == info.serial_bytes);
                let status = match revocation {
                    Some(_) => "revoked",
                    None if info.not_after < now => "expired",
                    None => "valid",
                };
                members.push(serde_json::json!({
                    "name": info.name.clone(),
                    "serial": info.serial.clone(),
                    "not_before": date(info.not_before),
                    "not_after": date(info.not_after),
                    "status": status,
                    "revoked": revocation.map(|r| serde_json::json!({
                        "date": date(r.time),
                        "reason": format!("{:?}", r.reason.unwrap_or(rcgen::RevocationReason::Unspecified)),
                    })),
                }));
                continue;
            }
            let status = if let Some(r) = revoked.iter().find(|r| r.serial == info.serial_bytes) {
                format!("REVOKED {} ({:?})", date(r.time), r.reason.unwrap_or(rcgen::RevocationReason::Unspecified))
            } else if info.not_after < now {
                "expired".into()
            } else {
                "valid".into()
            };
            println!(
                "{:<20} serial {}  {} .. {}  {status}",
                info.name,
                info.serial,
                date(info.not_before),
                date(info.not_after)
            );
        }
        if json {
            let out = serde_json::json!({
                "authority": self.ca_cert().display().to_string(),
                "crl_number": authority.crl_number(),
                "members": members,
            });
            println!("{out}");
        }
        Ok(())
    }

    /// The authority members trust (certificate and CRL, if any).
    pub fn authority(&self) -> Result<Authority> {
        let cert = read(&self.ca_cert())?;
        let crl = read_opt(&self.crl())?;
        Authority::from_pem(&cert, crl.as_deref()).with_context(|| format!("bad authority in {}", self.dir.display()))
    }

    /// `name`'s identity (its key unprotected).
    #[cfg(test)]
    pub fn identity(&self, name: &str) -> Result<Identity> {
        self.identity_with(name, &PassphraseArgs::default())
    }

    /// `name`'s identity, its key opened with `unlock` if it is protected.
    pub fn identity_with(&self, name: &str, unlock: &PassphraseArgs) -> Result<Identity> {
        if !file_safe(name) {
            bail!("member name {name:?} cannot name a key file");
        }
        let cert = read(&self.member_cert(name))?;
        let key = Zeroizing::new(read_secret(&self.member_key(name))?);
        let key = unlock.open_key(&key, &self.member_key(name))?;
        let id = Identity::from_pem(&cert, &key)
            .with_context(|| format!("bad identity {}", self.member_cert(name).display()))?;
        if id.name() != name {
            bail!("{} is issued to {:?}, not {name:?}", self.member_cert(name).display(), id.name());
        }
        Ok(id)
    }
}

/// Why `conclave chat` cannot run as `name` from `kd` without creating
/// something, and what creates it; `None` if `kd` holds `name`'s certificate.
pub fn chat_identity_missing(kd: &KeyDir, name: &str) -> Option<String> {
    if kd.has_member(name) {
        return None;
    }
    let dir = kd.dir.display();
    Some(if kd.has_authority() && !kd.can_issue() {
        format!(
            "no certificate for {name} in {dir}, and this directory cannot issue one (it holds no authority key): \
             ask the group's authority to run `conclave keys issue {name}` and copy members/{name}.crt and \
             members/{name}.key here"
        )
    } else {
        let authority =
            if kd.has_authority() { String::new() } else { format!("`conclave keys authority --dir {dir}` and then ") };
        format!(
            "no certificate for {name} in {dir}; nothing was created. Create it with {authority}`conclave keys issue \
             {name} --dir {dir}`, or run chat again with --create-identity to have it do so"
        )
    })
}

/// `conclave chat --create-identity`: creates the authority if `kd` has
/// none and issues `name`'s certificate if `kd` has none for it. Returns a
/// one-line notice of what was created (`None` if nothing was).
pub fn create_chat_identity(
    kd: &KeyDir,
    name: &str,
    unlock: &PassphraseArgs,
    rng: &mut dyn CryptoRngCore,
) -> Result<Option<String>> {
    if kd.has_member(name) {
        return Ok(None);
    }
    let mut created = Vec::new();
    if !kd.has_authority() && !kd.can_issue() {
        kd.create_authority("Conclave group authority", 3650, rng)?;
        created.push("a new group authority".to_owned());
    }
    if !kd.can_issue() {
        bail!("{}", chat_identity_missing(kd, name).unwrap_or_default());
    }
    let serial = kd.issue_with(name, 365, false, unlock, None, rng)?;
    created.push(format!("a certificate for {name} (serial {serial})"));
    Ok(Some(format!("created {} in {}", created.join(" and "), kd.dir.display())))
}

/// `key_pem` protected by `passphrase` if one is given, else as it is.
fn protect(
    key_pem: Zeroizing<String>,
    passphrase: Option<&[u8]>,
    rng: &mut dyn CryptoRngCore,
) -> Result<Zeroizing<String>> {
    match passphrase {
        Some(p) => trust::protect_key(&key_pem, p, rng).context("cannot protect the secret key with the passphrase"),
        None => Ok(key_pem),
    }
}

/// A certificate's validity of `days` days; at least one.
fn validity(days: u64) -> Result<Duration> {
    if days == 0 {
        bail!("--days must be at least 1: a certificate valid for 0 days has already expired when it is issued");
    }
    Ok(Duration::from_secs(days.saturating_mul(86_400)))
}

/// Whether `name` may name a key file (no path separators, no hidden files).
fn file_safe(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains('/') && !name.contains('\0')
}

fn date(t: SystemTime) -> String {
    time::OffsetDateTime::from(t).date().to_string()
}

/// Whether something (a file, a link, anything) is at `path`.
fn present(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// `O_NOFOLLOW`: opening a symbolic link fails.
fn nofollow() -> i32 {
    rustix::fs::OFlags::NOFOLLOW.bits() as i32
}

/// Opens a key file to read, refusing a symbolic link or anything but a
/// regular file; `None` if there is none.
fn open_key_file(path: &Path) -> Result<Option<File>> {
    let f = match OpenOptions::new().read(true).custom_flags(nofollow()).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
                bail!(
                    "{} is a symbolic link; refusing it (key files must be regular files): remove it (rm {})",
                    path.display(),
                    path.display()
                );
            }
            return Err(e).with_context(|| format!("cannot read {}", path.display()));
        }
    };
    let meta = f.metadata().with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok(Some(f))
}

fn read_file(mut f: File, path: &Path) -> Result<String> {
    let mut text = String::new();
    f.read_to_string(&mut text).with_context(|| format!("cannot read {}", path.display()))?;
    Ok(text)
}

/// Reads a key file (never through a link); `None` if there is none.
fn read_opt(path: &Path) -> Result<Option<String>> {
    open_key_file(path)?.map(|f| read_file(f, path)).transpose()
}

/// Reads a key file (never through a link).
fn read(path: &Path) -> Result<String> {
    read_opt(path)?.with_context(|| format!("cannot read {}: no such file", path.display()))
}

/// Reads a secret key (never through a link), refusing one that group or
/// others may read.
fn read_secret(path: &Path) -> Result<String> {
    let f = open_key_file(path)?.with_context(|| format!("cannot read {}: no such file", path.display()))?;
    let mode = f.metadata().with_context(|| format!("cannot read {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!("secret key {} is accessible by group or others (mode {:o}); chmod 600 it", path.display(), mode & 0o777);
    }
    read_file(f, path)
}

/// Writes a secret key file, mode 0600.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    write_file(path, text, 0o600)
}

/// Writes a public file, mode 0644.
fn write_public(path: &Path, text: &str) -> Result<()> {
    write_file(path, text, 0o644)
}

/// Writes `path` safely: to a new file of a random name next to it, created
/// with `O_CREAT|O_EXCL|O_NOFOLLOW` and `mode` (so nothing already there, a
/// planted link least of all, is ever opened), synced, then renamed over
/// `path` (which replaces a link at `path`, never follows it). Readers see
/// the old file or the whole new one.
fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().map_or("file".into(), |n| n.to_string_lossy());
    let mut random = [0u8; 8];
    rand_core::OsRng.fill_bytes(&mut random);
    let tmp = dir.join(format!(".{name}.{}.tmp", hex::encode(random)));
    let written = create_new_file(&tmp, mode).and_then(|mut f| {
        f.write_all(text.as_bytes())?;
        // The umask may have taken bits off; never added any.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", tmp.display()));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("cannot write {}", path.display()));
    }
    // Make the rename itself durable.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Creates a new file at `path` with `mode`; fails if anything (a link
/// included) is there.
fn create_new_file(path: &Path, mode: u32) -> std::io::Result<File> {
    OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(nofollow()).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn authority_issue_revoke_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(dir.path().join("keys")).unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(1);
        assert!(kd.issue("alice", 1, false, &mut rng).is_err(), "no authority yet");
        kd.create_authority("test", 10, &mut rng).unwrap();
        assert!(kd.create_authority("test", 10, &mut rng).is_err(), "refuses a second authority");
        kd.issue("alice", 1, false, &mut rng).unwrap();
        kd.issue("bob", 1, false, &mut rng).unwrap();
        assert!(kd.issue("alice", 1, false, &mut rng).is_err(), "refuses to overwrite");
        let mode = std::fs::metadata(kd.member_key("alice")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let mode = std::fs::metadata(kd.ca_key()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);

        let alice = MemberId::new("alice").unwrap();
        let id = kd.identity("alice").unwrap();
        let now = SystemTime::now();
        assert!(kd.authority().unwrap().verify(id.cert_der(), &alice, now).is_ok());
        let (_, n) = kd.revoke("alice", Reason::KeyCompromise).unwrap();
        assert_eq!(n, 2);
        assert!(kd.revoke("alice", Reason::KeyCompromise).is_err(), "already revoked");
        let (_, n) = kd.revoke("bob", Reason::Superseded).unwrap();
        assert_eq!(n, 3, "the CRL number grows");
        let authority = kd.authority().unwrap();
        assert_eq!(authority.crl_number(), Some("3"));
        assert!(matches!(
            authority.verify(id.cert_der(), &alice, now),
            Err(conclave_secure::Refusal::Revoked { reason: Some(r), .. }) if r == "key compromise"
        ));

        std::fs::set_permissions(kd.member_key("alice"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = format!("{:#}", kd.identity("alice").unwrap_err());
        assert!(err.contains("chmod 600"), "{err}");
    }

    #[test]
    fn chat_creates_what_is_missing_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(dir.path().join("keys")).unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(2);
        let hint = chat_identity_missing(&kd, "alice").unwrap();
        assert!(hint.contains("conclave keys authority") && hint.contains("--create-identity"), "{hint}");
        let notice = create_chat_identity(&kd, "alice", &PassphraseArgs::default(), &mut rng).unwrap().unwrap();
        assert!(notice.contains("new group authority") && notice.contains("certificate for alice"), "{notice}");
        assert!(chat_identity_missing(&kd, "alice").is_none());
        let id = kd.identity("alice").unwrap();
        assert_eq!(
            create_chat_identity(&kd, "alice", &PassphraseArgs::default(), &mut rng).unwrap(),
            None,
            "the second run creates nothing"
        );
        assert_eq!(kd.identity("alice").unwrap().cert_der(), id.cert_der(), "the second run reuses the identity");
        let authority = kd.authority().unwrap();
        assert!(authority.verify(id.cert_der(), &MemberId::new("alice").unwrap(), SystemTime::now()).is_ok());
        let notice = create_chat_identity(&kd, "bob", &PassphraseArgs::default(), &mut rng).unwrap().unwrap();
        assert!(!notice.contains("authority") && notice.contains("certificate for bob"), "{notice}");
        std::fs::remove_file(dir.path().join("keys/authority.key")).unwrap();
        let hint = chat_identity_missing(&kd, "carol").unwrap();
        assert!(hint.contains("cannot issue"), "{hint}");
        assert!(
            create_chat_identity(&kd, "carol", &PassphraseArgs::default(), &mut rng).is_err(),
            "cannot issue without the authority key"
        );
    }

    /// `chat --create-identity` under an authority whose key is protected:
    /// refused without its passphrase (no terminal here) or with a wrong
    /// one, issued with the right one; nothing is written by a refusal.
    #[test]
    fn chat_creates_an_identity_under_a_protected_authority_only_with_its_passphrase() {
        let dir = tempfile::tempdir().unwrap();
        let kd = KeyDir::open(dir.path().join("keys")).unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        kd.create_authority_protected("test", 30, Some(b"open sesame"), &mut rng).unwrap();
        let file = |text: &str| {
            let path = dir.path().join(format!("pass-{}", text.len()));
            std::fs::write(&path, format!("{text}\n")).unwrap();
            PassphraseArgs { passphrase_file: Some(path), passphrase_env: None }
        };
        let err = create_chat_identity(&kd, "alice", &PassphraseArgs::default(), &mut rng).unwrap_err();
        assert!(format!("{err:#}").contains("protected by a passphrase"), "{err:#}");
        let err = create_chat_identity(&kd, "alice", &file("wrong"), &mut rng).unwrap_err();
        assert!(format!("{err:#}").contains("wrong passphrase"), "{err:#}");
        assert!(chat_identity_missing(&kd, "alice").is_some(), "a refusal writes nothing");
        let notice = create_chat_identity(&kd, "alice", &file("open sesame"), &mut rng).unwrap().unwrap();
        assert!(notice.contains("certificate for alice") && !notice.contains("authority"), "{notice}");
        assert!(chat_identity_missing(&kd, "alice").is_none());
    }

    #[test]
    fn default_key_directory_is_never_in_tmp() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| OsString::from(v))
        };
        let dir = |vars: &'static [(&'static str, &'static str)]| default_dir_from(env(vars), "--dir DIR");
        assert_eq!(dir(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")]).unwrap(), Path::new("/s/conclave/keys"));
        assert_eq!(dir(&[("HOME", "/h")]).unwrap(), Path::new("/h/.local/state/conclave/keys"));
        assert_eq!(
            dir(&[("XDG_STATE_HOME", "rel"), ("HOME", "/h")]).unwrap(),
            Path::new("/h/.local/state/conclave/keys")
        );
        let err = dir(&[("XDG_RUNTIME_DIR", "/run/user/0"), ("HOME", "")]).unwrap_err().to_string();
        assert!(err.contains("--dir DIR") && !err.contains("/tmp"), "{err}");
    }

    /// The temporary file is created anew: a link (or anything) at its name
    /// fails the write, the link's target untouched; a link at the target
    /// is replaced by the new file, its target untouched.
    #[test]
    fn writes_never_follow_links() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "mine").unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(create_new_file(&link, 0o600).is_err());
        write_public(&link, "public").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "mine");
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_file());
        assert_eq!(std::fs::read_to_string(&link).unwrap(), "public");
        let mode = std::fs::metadata(&link).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o644);
        let leftovers: Vec<_> = std::fs::read_dir(t.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(leftovers.len(), 2, "{leftovers:?}");
    }
}

/// Files planted as symbolic links by someone else are never written through
/// nor trusted.
#[cfg(test)]
mod planted_links {
    use super::*;
    use rand_core::SeedableRng;

    /// A link at the temporary name a write goes through (the old
    /// `.NAME.PID`, predictable) to a file of the victim's: the victim's file
    /// is not modified and the key files are regular files.
    #[test]
    fn a_symlink_planted_at_the_temporary_name_is_not_written_through() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "the victim's private file").unwrap();
        let keys = t.path().join("keys");
        DirBuilder::new().mode(0o700).create(&keys).unwrap();
        for name in ["authority.crt", "authority.crl", "authority.key"] {
            std::os::unix::fs::symlink(&victim, keys.join(format!(".{name}.{}", std::process::id()))).unwrap();
        }
        let kd = KeyDir::open(keys.clone()).unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(3);
        let _ = kd.create_authority("test", 10, &mut rng);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "the victim's private file");
        for name in ["authority.crt", "authority.crl"] {
            let meta = std::fs::symlink_metadata(keys.join(name)).unwrap();
            assert!(meta.file_type().is_file(), "{name} is a {:?}", meta.file_type());
        }
    }

    /// `authority.crt` replaced by a link to another authority's certificate
    /// (trust-anchor substitution): refused, not trusted.
    #[test]
    fn a_symlinked_authority_certificate_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(4);
        let (ours, theirs) = (t.path().join("ours"), t.path().join("theirs"));
        KeyDir::open(ours.clone()).unwrap().create_authority("ours", 10, &mut rng).unwrap();
        KeyDir::open(theirs.clone()).unwrap().create_authority("theirs", 10, &mut rng).unwrap();
        std::fs::remove_file(ours.join("authority.crt")).unwrap();
        std::os::unix::fs::symlink(theirs.join("authority.crt"), ours.join("authority.crt")).unwrap();
        let Err(err) = KeyDir::open(ours.clone()).unwrap().authority() else {
            panic!("a linked authority certificate was trusted");
        };
        assert!(format!("{err:#}").contains("symbolic link"), "{err:#}");
    }
}
