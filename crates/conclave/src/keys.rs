//! `conclave keys`: the group authority and the members' certified identities.
//!
//! A key directory (`--dir DIR`, by default `$XDG_RUNTIME_DIR/conclave-keys`
//! or `/tmp/conclave-keys-$UID`) holds:
//!
//! * `authority.crt` — the authority's self-signed CA certificate (PEM), what
//!   members trust; `authority.key` — its Ed25519 secret key (PKCS#8 PEM, mode
//!   0600); `authority.crl` — the CRL it signs (PEM, numbered, re-signed on
//!   every revocation).
//! * `members/NAME.crt` and `members/NAME.key` (0600) — a member's
//!   certificate (subject CN = NAME, clientAuth usage, issued by the
//!   authority) and secret key.
//! * `daemon.crt` and `daemon.key` (0600) — a daemon's TLS server
//!   certificate (serverAuth usage, its host names as subject alternative
//!   names) and secret key, for `conclave daemon --tls-cert/--tls-key`.
//!
//! Secret keys readable by group or others are refused. Keys are drawn from
//! the OS's RNG. The crypto is `conclave_secure::trust`'s; this module only
//! reads and writes the files.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use conclave_secure::trust::{self, Authority, Identity, Issuer, Revocation};
use conclave_secure::MemberId;
use rand_core::CryptoRngCore;

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
    },
    /// List the issued members: serial, validity, revoked or not.
    List {
        #[command(flatten)]
        dir: DirArg,
    },
}

/// The key directory option.
#[derive(Args, Debug)]
pub struct DirArg {
    /// Key directory [default: $XDG_RUNTIME_DIR/conclave-keys or /tmp/conclave-keys-$UID].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
}

impl DirArg {
    fn path(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(default_dir)
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

/// `$XDG_RUNTIME_DIR/conclave-keys`, or `/tmp/conclave-keys-$UID`.
pub fn default_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Path::new(&dir).join("conclave-keys"),
        _ => {
            use std::os::unix::fs::MetadataExt;
            let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
            PathBuf::from(format!("/tmp/conclave-keys-{uid}"))
        }
    }
}

/// Runs `conclave keys`.
pub fn run(cmd: KeysCommand) -> Result<()> {
    let rng = &mut rand_core::OsRng;
    match cmd {
        KeysCommand::Authority { dir, name, days } => {
            let kd = KeyDir::new(dir.path());
            kd.create_authority(&name, days, rng)?;
            println!("created the authority {name:?} in {}", kd.dir.display());
        }
        KeysCommand::Issue { name, dir, days, replace } => {
            let kd = KeyDir::new(dir.path());
            let serial = kd.issue(&name, days, replace, rng)?;
            println!("issued {name} (serial {serial}): {}", kd.member_cert(&name).display());
        }
        KeysCommand::Revoke { name, dir, reason } => {
            let kd = KeyDir::new(dir.path());
            let (serial, number) = kd.revoke(&name, reason)?;
            println!("revoked {name} (serial {serial}); CRL number {number}: {}", kd.crl().display());
        }
        KeysCommand::Daemon { hosts, dir, days } => {
            let kd = KeyDir::new(dir.path());
            let serial = kd.issue_daemon(&hosts, days, rng)?;
            println!(
                "issued the daemon certificate for {} (serial {serial}): {} and {}",
                hosts.join(", "),
                kd.daemon_cert().display(),
                kd.daemon_key().display()
            );
        }
        KeysCommand::List { dir } => KeyDir::new(dir.path()).list()?,
    }
    Ok(())
}

/// A key directory (see the module doc).
pub struct KeyDir {
    dir: PathBuf,
}

impl KeyDir {
    /// The directory at `dir` (not created until something is written).
    pub fn new(dir: PathBuf) -> KeyDir {
        KeyDir { dir }
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
        self.ca_cert().exists()
    }

    /// Whether the directory holds a certificate for `name`.
    pub fn has_member(&self, name: &str) -> bool {
        self.member_cert(name).exists()
    }

    /// Whether this directory can issue (holds the authority's secret key).
    pub fn can_issue(&self) -> bool {
        self.ca_key().exists()
    }

    fn mkdirs(&self) -> Result<()> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(self.members())
            .with_context(|| format!("cannot create key directory {}", self.dir.display()))
    }

    /// Creates the authority; refuses if one exists.
    pub fn create_authority(&self, name: &str, days: u64, rng: &mut dyn CryptoRngCore) -> Result<()> {
        if self.has_authority() || self.can_issue() {
            bail!("{} already holds an authority; remove it first to start over", self.dir.display());
        }
        self.mkdirs()?;
        let now = SystemTime::now();
        // Back-date by an hour so clocks a little behind still accept it.
        let from = now - Duration::from_secs(3600);
        let (issuer, key_pem) = Issuer::create(name, from, now + validity(days)?, rng)?;
        write_secret(&self.ca_key(), &key_pem)?;
        write_public(&self.ca_cert(), issuer.ca_pem())?;
        write_public(&self.crl(), &issuer.crl(1, &[], now, now + 365 * DAY)?)?;
        Ok(())
    }

    fn issuer(&self) -> Result<Issuer> {
        if !self.can_issue() {
            bail!(
                "no authority key in {} (create one with `conclave keys authority --dir {}`)",
                self.dir.display(),
                self.dir.display()
            );
        }
        let key = read_secret(&self.ca_key())?;
        let cert = read(&self.ca_cert())?;
        Issuer::load(&cert, &key).with_context(|| format!("bad authority in {}", self.dir.display()))
    }

    /// Issues `name`'s identity. Refuses to overwrite one, unless `replace`
    /// and the one there is revoked or expired. Returns the serial.
    pub fn issue(&self, name: &str, days: u64, replace: bool, rng: &mut dyn CryptoRngCore) -> Result<String> {
        let member = MemberId::new(name).with_context(|| format!("bad member name {name:?}"))?;
        if !file_safe(name) {
            bail!("member name {name:?} cannot name a key file");
        }
        let validity = validity(days)?;
        let existing = self.member_cert(name).exists() || self.member_key(name).exists();
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
        let issuer = self.issuer()?;
        self.mkdirs()?;
        let now = SystemTime::now();
        let issued = issuer.issue(&member, now - Duration::from_secs(3600), now + validity, rng)?;
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
        write_secret(&self.member_key(name), &issued.key_pem)?;
        write_public(&self.member_cert(name), &issued.cert_pem)?;
        Ok(issued.serial)
    }

    /// Issues the daemon's TLS server certificate for `hosts`; refuses to
    /// overwrite one. Returns the serial.
    pub fn issue_daemon(&self, hosts: &[String], days: u64, rng: &mut dyn CryptoRngCore) -> Result<String> {
        if self.daemon_cert().exists() || self.daemon_key().exists() {
            bail!("{} already holds a daemon certificate; remove daemon.crt and daemon.key first", self.dir.display());
        }
        let validity = validity(days)?;
        let issuer = self.issuer()?;
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
        let Ok(pem) = std::fs::read_to_string(self.member_cert(name)) else { return Ok(Some("is missing")) };
        let Ok(info) = trust::cert_info(&pem) else { return Ok(Some("is unreadable")) };
        let revoked = match std::fs::read_to_string(self.crl()) {
            Ok(pem) => trust::read_crl(&pem).with_context(|| format!("bad CRL {}", self.crl().display()))?.1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.crl().display())),
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
    pub fn revoke(&self, name: &str, reason: Reason) -> Result<(String, u64)> {
        let issuer = self.issuer()?;
        let cert_path = self.member_cert(name);
        let info =
            trust::cert_info(&read(&cert_path)?).with_context(|| format!("bad certificate {}", cert_path.display()))?;
        let (number, mut revoked) = match std::fs::read_to_string(self.crl()) {
            Ok(pem) => trust::read_crl(&pem).with_context(|| format!("bad CRL {}", self.crl().display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (0, Vec::new()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.crl().display())),
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

    /// Prints the members.
    fn list(&self) -> Result<()> {
        let authority = self.authority()?;
        let revoked = match std::fs::read_to_string(self.crl()) {
            Ok(pem) => trust::read_crl(&pem)?.1,
            Err(_) => Vec::new(),
        };
        println!("authority {} (CRL number {})", self.ca_cert().display(), authority.crl_number().unwrap_or("none"));
        let mut names: Vec<PathBuf> = match std::fs::read_dir(self.members()) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "crt"))
                .collect(),
            Err(_) => Vec::new(),
        };
        names.sort();
        if names.is_empty() {
            println!("no members issued yet");
        }
        let now = SystemTime::now();
        for path in names {
            let info = match read(&path).and_then(|pem| Ok(trust::cert_info(&pem)?)) {
                Ok(i) => i,
                Err(e) => {
                    println!("{}: unreadable: {}", path.display(), crate::error_text(&e));
                    continue;
                }
            };
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
        Ok(())
    }

    /// The authority members trust (certificate and CRL, if any).
    pub fn authority(&self) -> Result<Authority> {
        let cert = read(&self.ca_cert())?;
        let crl = match std::fs::read_to_string(self.crl()) {
            Ok(c) => Some(c),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", self.crl().display())),
        };
        Authority::from_pem(&cert, crl.as_deref()).with_context(|| format!("bad authority in {}", self.dir.display()))
    }

    /// `name`'s identity.
    pub fn identity(&self, name: &str) -> Result<Identity> {
        if !file_safe(name) {
            bail!("member name {name:?} cannot name a key file");
        }
        let cert = read(&self.member_cert(name))?;
        let key = read_secret(&self.member_key(name))?;
        let id = Identity::from_pem(&cert, &key)
            .with_context(|| format!("bad identity {}", self.member_cert(name).display()))?;
        if id.name() != name {
            bail!("{} is issued to {:?}, not {name:?}", self.member_cert(name).display(), id.name());
        }
        Ok(id)
    }
}

/// Zero-config identities for `conclave chat`: creates the authority if the
/// directory has none and issues `name`'s certificate if the directory can,
/// saying so on stderr. Returns the identity and the authority.
pub fn chat_identity(dir: &Path, name: &str, rng: &mut dyn CryptoRngCore) -> Result<(Identity, Authority)> {
    let kd = KeyDir::new(dir.to_owned());
    if !kd.has_authority() {
        kd.create_authority("Conclave group authority", 3650, rng)?;
        eprintln!("conclave: created a new group authority in {}", dir.display());
    }
    if !kd.has_member(name) {
        if !kd.can_issue() {
            bail!(
                "no certificate for {name} in {}; ask the authority to run `conclave keys issue {name}`",
                dir.display()
            );
        }
        let serial = kd.issue(name, 365, false, rng)?;
        eprintln!("conclave: issued a certificate for {name} (serial {serial}) in {}", kd.members().display());
    }
    Ok((kd.identity(name)?, kd.authority()?))
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

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Reads a secret key, refusing one that group or others may read.
fn read_secret(path: &Path) -> Result<String> {
    let mode = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!("secret key {} is accessible by group or others (mode {:o}); chmod 600 it", path.display(), mode & 0o777);
    }
    read(path)
}

/// Writes a new secret key file, mode 0600; never overwrites.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    f.write_all(text.as_bytes()).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes a public file by write-then-rename, so readers never see half of it.
fn write_public(path: &Path, text: &str) -> Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn authority_issue_revoke_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let kd = KeyDir::new(dir.path().join("keys"));
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
    fn chat_creates_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(2);
        let (id, authority) = chat_identity(dir.path(), "alice", &mut rng).unwrap();
        assert_eq!(id.name(), "alice");
        let (id2, _) = chat_identity(dir.path(), "alice", &mut rng).unwrap();
        assert_eq!(id.cert_der(), id2.cert_der(), "the second run reuses the identity");
        assert!(authority.verify(id.cert_der(), &MemberId::new("alice").unwrap(), SystemTime::now()).is_ok());
        std::fs::remove_file(dir.path().join("authority.key")).unwrap();
        assert!(chat_identity(dir.path(), "bob", &mut rng).is_err(), "cannot issue without the authority key");
    }
}
