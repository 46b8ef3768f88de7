//! The keys a run produces and the secure view that carries them.
//!
//! The agreed group secret never leaves this crate raw: installing a secure
//! view derives the application key from it with HKDF-SHA256, bound to the
//! protocol, the group name and the epoch, and the secret is dropped.
//!
//! **Epochs are not views.** An [`Epoch`] names one key: the view it was
//! agreed in and the run within that view (0 for the run a view starts;
//! one more for every rekey in the same view). Every member of a view counts
//! runs alike — a run starts only on a view or on an agreed rekey input — so
//! no agreement on a group-wide counter is needed, and a view may hold
//! several keys.

use std::fmt;
use std::fmt::Write as _;

use conclave_gcs::ViewId;
use hkdf::Hkdf;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::ProtocolId;

/// The application key of one epoch: 32 bytes, zeroized on drop, never printed.
#[derive(Clone)]
pub struct GroupKey {
    bytes: Zeroizing<[u8; 32]>,
}

impl GroupKey {
    /// Derives the application key from the encoded group secret.
    pub(crate) fn derive(secret: &[u8], protocol: ProtocolId, group: &str, epoch: Epoch) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/gka/v1/app-key"), secret);
        let mut info = Vec::with_capacity(16 + group.len());
        info.extend_from_slice(protocol.name().as_bytes());
        info.push(0);
        info.extend_from_slice(&(group.len() as u16).to_be_bytes());
        info.extend_from_slice(group.as_bytes());
        info.extend_from_slice(&epoch.to_bytes());
        let mut bytes = Zeroizing::new([0u8; 32]);
        hk.expand(&info, bytes.as_mut()).expect("32 bytes is a valid HKDF-SHA256 output length");
        Self { bytes }
    }

    /// The key bytes, for the secure layer's own derivations.
    pub fn expose_secret(&self) -> &[u8; 32] {
        &self.bytes
    }

    /// A short public fingerprint (a hash of the key), safe to print.
    pub fn fingerprint(&self) -> String {
        let d = Sha256::new().chain_update(b"conclave/key-fingerprint").chain_update(self.bytes.as_ref()).finalize();
        // Written into one string (a `String` per byte was most of the cost:
        // every member computes it for every secure view it shows).
        let mut hex = String::with_capacity(12);
        for b in &d[..6] {
            let _ = write!(hex, "{b:02x}");
        }
        hex
    }
}

impl PartialEq for GroupKey {
    fn eq(&self, other: &Self) -> bool {
        self.bytes[..].ct_eq(&other.bytes[..]).into()
    }
}

impl Eq for GroupKey {}

impl fmt::Debug for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GroupKey(fp {})", self.fingerprint())
    }
}

/// The epoch of a key: the view it was agreed in and the run in that view.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Epoch {
    /// The view the key was agreed in.
    pub view: ViewId,
    /// The run within that view: 0 for the view's own run, then one more
    /// for each rekey (refresh, or a new run after a failed key confirmation).
    pub run: u32,
}

/// Bytes in [`Epoch::to_bytes`].
pub const EPOCH_LEN: usize = 20;

impl Epoch {
    /// The epoch of run `run` in `view`.
    pub const fn new(view: ViewId, run: u32) -> Self {
        Self { view, run }
    }

    /// 20 bytes: the view id ([`ViewId::to_bytes`]), then the run (big-endian).
    pub fn to_bytes(self) -> [u8; EPOCH_LEN] {
        let mut b = [0; EPOCH_LEN];
        b[..16].copy_from_slice(&self.view.to_bytes());
        b[16..].copy_from_slice(&self.run.to_be_bytes());
        b
    }

    /// Parses [`Epoch::to_bytes`].
    pub fn from_bytes(b: [u8; EPOCH_LEN]) -> Self {
        let (v, r) = b.split_at(16);
        Self::new(
            ViewId::from_bytes(v.try_into().expect("16 bytes")),
            u32::from_be_bytes(r.try_into().expect("4 bytes")),
        )
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.view, self.run)
    }
}

/// A view with its agreed key: what the application may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecureView {
    /// The group communication view the key was agreed in.
    pub view_id: ViewId,
    /// The key's epoch (that view, and the run in it: unique, and the same
    /// at every member).
    pub epoch: Epoch,
    /// Members, in view order (shared: the engine, the session and the
    /// application each hold the list of a view of hundreds, and copying it
    /// touches every name).
    pub members: conclave_gcs::Members,
    /// Which protocol agreed the key.
    pub protocol: ProtocolId,
    /// The application key.
    pub key: GroupKey,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_bound_to_group_epoch_and_protocol_and_never_printed() {
        let e = |inc, seq, run| Epoch::new(ViewId::new(inc, seq), run);
        let k = GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", e(5, 1, 0));
        assert_eq!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", e(5, 1, 0)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", e(5, 2, 0)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", e(6, 1, 0)), "another daemon lifetime");
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", e(5, 1, 1)), "another run in the view");
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "h", e(5, 1, 0)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Str, "g", e(5, 1, 0)));
        assert_eq!(Epoch::from_bytes(e(5, 1, 3).to_bytes()), e(5, 1, 3));
        let shown = format!("{k:?}");
        let hex: String = k.expose_secret().iter().map(|b| format!("{b:02x}")).collect();
        assert!(!shown.contains(&hex[..8]), "{shown}");
    }
}
