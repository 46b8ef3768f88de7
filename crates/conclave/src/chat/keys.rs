//! The stop-gap key directory of `conclave chat` (see the module doc of
//! [`crate::chat`]): `DIR/<name>.pub` holds a member's hex Ed25519 public
//! key, `DIR/<name>.key` (mode 0600) its hex secret seed.

use std::fs::{DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use conclave_gka::suite::ed25519::{Ed25519Signer, Ed25519Verifier};
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::{Directory, MemberId};
use rand_core::CryptoRngCore;

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

/// Whether `name` may name a key file (no path separators, no hidden files).
fn file_safe(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains('/') && !name.contains('\0')
}

/// Loads `DIR/<name>.key`, or creates it (and the directory, mode 0700)
/// with a seed drawn from `rng`; (re)writes `DIR/<name>.pub` to match.
pub fn load_or_create(dir: &Path, name: &str, rng: &mut dyn CryptoRngCore) -> Result<Arc<dyn Signer>> {
    if !file_safe(name) {
        bail!("member name {name:?} cannot name a key file");
    }
    DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("cannot create key directory {}", dir.display()))?;
    let key_path = dir.join(format!("{name}.key"));
    let seed = match std::fs::read_to_string(&key_path) {
        Ok(text) => {
            let mode = std::fs::metadata(&key_path)?.permissions().mode();
            if mode & 0o077 != 0 {
                bail!("secret key {} is accessible by others (mode {:o}); chmod 600 it", key_path.display(), mode);
            }
            Seed::parse(text.trim()).with_context(|| format!("bad secret key file {}", key_path.display()))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut seed = Seed([0; 32]);
            rng.fill_bytes(&mut seed.0);
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&key_path)
                .with_context(|| format!("cannot create secret key {}", key_path.display()))?;
            writeln!(f, "{}", hex::encode(seed.0))?;
            seed
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read secret key {}", key_path.display())),
    };
    let signer = Ed25519Signer::from_seed(&seed.0);
    let public = hex::encode(signer.verifier().public_bytes());
    let pub_path = dir.join(format!("{name}.pub"));
    if std::fs::read_to_string(&pub_path).map(|s| s.trim() != public).unwrap_or(true) {
        // Write then rename, so a reader never sees half a key.
        let tmp = dir.join(format!(".{name}.pub.{}", std::process::id()));
        std::fs::write(&tmp, format!("{public}\n"))?;
        std::fs::rename(&tmp, &pub_path).with_context(|| format!("cannot write {}", pub_path.display()))?;
    }
    Ok(Arc::new(signer))
}

/// A [`Directory`] that reads `DIR/<member>.pub` on every lookup: a member
/// without a (valid) file is unknown, so its messages are rejected.
pub struct KeyDir {
    dir: PathBuf,
}

impl KeyDir {
    /// The directory at `dir`.
    pub fn new(dir: PathBuf) -> Self {
        KeyDir { dir }
    }
}

impl Directory for KeyDir {
    fn verifier(&self, member: &MemberId) -> Option<Arc<dyn Verifier>> {
        if !file_safe(member.as_str()) {
            return None;
        }
        let text = std::fs::read_to_string(self.dir.join(format!("{}.pub", member.as_str()))).ok()?;
        let bytes = hex::decode(text.trim()).ok()?;
        Some(Arc::new(Ed25519Verifier::from_bytes(&bytes).ok()?))
    }
}

/// A 32-byte secret seed, overwritten when dropped.
struct Seed([u8; 32]);

impl Seed {
    fn parse(hex_text: &str) -> Result<Seed> {
        let v = hex::decode(hex_text)?;
        let arr: [u8; 32] = v.as_slice().try_into().map_err(|_| anyhow::anyhow!("seed must be 32 bytes"))?;
        Ok(Seed(arr))
    }
}

impl Drop for Seed {
    fn drop(&mut self) {
        // black_box keeps the wipe from being optimized away.
        std::hint::black_box(&mut self.0).fill(0);
    }
}
