//! The keys a run produces and the secure view that carries them.
//!
//! The agreed group secret never leaves this crate raw: installing a secure
//! view derives the application key from it with HKDF-SHA256, bound to the
//! protocol, the group name and the epoch, and the secret is dropped.

use std::fmt;

use conclave_gcs::{MemberId, ViewId};
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
    pub(crate) fn derive(secret: &[u8], protocol: ProtocolId, group: &str, epoch: ViewId) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/gka/v1/app-key"), secret);
        let mut info = Vec::with_capacity(16 + group.len());
        info.extend_from_slice(protocol.name().as_bytes());
        info.push(0);
        info.extend_from_slice(&(group.len() as u16).to_be_bytes());
        info.extend_from_slice(group.as_bytes());
        info.extend_from_slice(&epoch.0.to_be_bytes());
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
        d[..6].iter().map(|b| format!("{b:02x}")).collect()
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

/// A view with its agreed key: what the application may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecureView {
    /// The group communication view the key was agreed in.
    pub view_id: ViewId,
    /// The key epoch (the id of that view: unique, and the same at every member).
    pub epoch: ViewId,
    /// Members, in view order.
    pub members: Vec<MemberId>,
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
        let k = GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", ViewId(1));
        assert_eq!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", ViewId(1)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "g", ViewId(2)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Tgdh, "h", ViewId(1)));
        assert_ne!(k, GroupKey::derive(b"secret", ProtocolId::Str, "g", ViewId(1)));
        let shown = format!("{k:?}");
        let hex: String = k.expose_secret().iter().map(|b| format!("{b:02x}")).collect();
        assert!(!shown.contains(&hex[..8]), "{shown}");
    }
}
