//! Key confirmation: after a run installs a key, every member proves to the
//! others that it holds the same key, before anyone uses it.
//!
//! Each member multicasts, for the new epoch, a MAC *per sender*: HMAC-SHA256
//! under a confirmation key derived from the new group key (never the data
//! keys), over the group, the epoch (view, with its daemon incarnation, and
//! run), the protocol, the member list and the sender's name. Because the
//! MAC names its sender, a member cannot confirm by echoing another's MAC: it
//! must hold the key. The message is also signed by the sender's identity
//! key (like every protocol message).
//!
//! A member checks that signature only when the MAC does *not* match its own
//! key: then it must know whether the sender really holds another key (a
//! split, reported in the sender's name) or someone else sent junk in its
//! name (dropped; the real confirmation is awaited). A MAC that matches needs
//! no signature: only a holder of the key can compute it, and the transcript
//! binds it to this epoch, so it cannot come from another run, view or
//! daemon lifetime. The most a key holder gains by confirming in another's
//! name is to hide from the others that this member's key differs; that
//! member itself sees every other MAC fail, reports the mismatch and never
//! uses its key, so no member holds a key that differs from its group's
//! unnoticed. This keeps confirmation at n MACs and no signature checks per
//! member (n² signature checks in all were the largest cost of a real
//! session at a hundred members).
//!
//! Every member checks every other member's MAC against the key it holds
//! itself. Confirmations travel in agreed order, so all members decide on the
//! same message (the last confirmation): if every MAC matches, the secure view
//! is delivered; if any does not — the members hold different keys, or an
//! insider lied — every member reports the mismatch with the epoch and the
//! members whose MACs did not match, and the view is rekeyed from scratch
//! ([`conclave_gka::Engine::rekey`]). No unconfirmed key ever reaches the
//! application.

use conclave_gcs::{GroupName, MemberId};
use conclave_gka::{Epoch, ProtocolId, ViewId};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// What key confirmation adds to a run whose view has `n` members whose keys
/// match, as the session performs it: one round, in which every member
/// multicasts one signed confirmation and checks every other member's MAC
/// (signatures are checked only for MACs that do not match: none when the
/// keys agree). `bench counts` prints it beside each protocol's own counts,
/// which stay comparable with TISSEC's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfirmCost {
    /// Rounds on the critical path.
    pub rounds: u64,
    /// Multicasts, all members together.
    pub broadcasts: u64,
    /// Signatures made by one member (the critical path).
    pub sigs_serial: u64,
    /// Signatures checked by one member (the critical path).
    pub verifs_serial: u64,
    /// Signatures made, all members together.
    pub sigs_total: u64,
    /// Signatures checked, all members together.
    pub verifs_total: u64,
    /// Bytes multicast, all members together (payloads as the daemon carries them).
    pub bytes: u64,
}

/// The confirmation cost of a run among `n` members whose signatures are
/// `signature_len` bytes long.
pub fn confirmation_cost(n: usize, signature_len: usize) -> ConfirmCost {
    let n = n as u64;
    ConfirmCost {
        rounds: 1,
        broadcasts: n,
        sigs_serial: 1,
        verifs_serial: 0,
        sigs_total: n,
        verifs_total: 0,
        bytes: n * confirmation_len(signature_len) as u64,
    }
}

/// A confirmation's payload length: `tag ‖ epoch ‖ MAC ‖ signature`.
pub(crate) fn confirmation_len(signature_len: usize) -> usize {
    1 + conclave_gka::key::EPOCH_LEN + 32 + signature_len
}

/// The confirmation MACs of one member for one epoch: what it sends, and
/// what it expects from each other member.
pub(crate) struct Confirmer {
    /// HMAC under the confirmation key with the SHA-256 of the run's
    /// transcript already absorbed (the member list makes the transcript
    /// grow with the group, and each member computes n MACs over it): each
    /// MAC clones it and adds the sender's name, so the key's pads and the
    /// transcript are hashed once per run, not once per confirmation.
    keyed: Hmac<Sha256>,
}

impl Confirmer {
    /// For the key (`GroupKey::expose_secret`) agreed in `epoch` by `protocol` among `members` (view order).
    pub fn new(key: &[u8; 32], group: &GroupName, epoch: Epoch, protocol: ProtocolId, members: &[MemberId]) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/secure/v1/confirm-key"), key);
        let mut k = Zeroizing::new([0u8; 32]);
        hk.expand(b"key confirmation", k.as_mut()).expect("32 bytes is a valid HKDF-SHA256 output length");
        let mut transcript = b"conclave/secure/v1/confirm\0".to_vec();
        put(&mut transcript, group.as_str().as_bytes());
        transcript.extend_from_slice(&epoch.to_bytes());
        transcript.push(protocol.code());
        transcript.extend_from_slice(&(members.len() as u32).to_be_bytes());
        for m in members {
            put(&mut transcript, m.as_str().as_bytes());
        }
        let mut keyed = <Hmac<Sha256> as Mac>::new_from_slice(k.as_ref()).expect("HMAC takes any key length");
        keyed.update(&Sha256::digest(&transcript));
        Self { keyed }
    }

    /// The MAC that `sender` must present.
    pub fn mac(&self, sender: &MemberId) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        mac.update(sender.as_str().as_bytes());
        mac.finalize().into_bytes().into()
    }

    /// Whether `sender`'s MAC shows it holds this member's key.
    pub fn matches(&self, sender: &MemberId, mac: &[u8; 32]) -> bool {
        self.mac(sender).ct_eq(mac).into()
    }
}

/// What a member signs to send a confirmation.
pub(crate) fn confirm_signed(group: &GroupName, sender: &MemberId, epoch: Epoch, mac: &[u8; 32]) -> Vec<u8> {
    let mut t = b"conclave/secure/v1/confirm-signature\0".to_vec();
    put(&mut t, group.as_str().as_bytes());
    put(&mut t, sender.as_str().as_bytes());
    t.extend_from_slice(&epoch.to_bytes());
    t.extend_from_slice(mac);
    t
}

/// What the oldest member signs to tell a newcomer the group's policy.
pub(crate) fn policy_signed(
    group: &GroupName,
    view: ViewId,
    sender: &MemberId,
    recipient: &MemberId,
    policy: (u8, u8),
) -> Vec<u8> {
    let mut t = b"conclave/secure/v1/policy-signature\0".to_vec();
    put(&mut t, group.as_str().as_bytes());
    t.extend_from_slice(&view.to_bytes());
    put(&mut t, sender.as_str().as_bytes());
    put(&mut t, recipient.as_str().as_bytes());
    t.extend_from_slice(&[policy.0, policy.1]);
    t
}

/// What a timeout notice's signature covers: the group, the view, the
/// sender and the names part, under a domain of its own.
pub(crate) fn timeout_signed(group: &GroupName, view: ViewId, sender: &MemberId, names: &[u8]) -> Vec<u8> {
    let mut t = b"conclave/secure/v1/timeout-signature\0".to_vec();
    put(&mut t, group.as_str().as_bytes());
    t.extend_from_slice(&view.to_bytes());
    put(&mut t, sender.as_str().as_bytes());
    t.extend_from_slice(names);
    t
}

fn put(t: &mut Vec<u8>, part: &[u8]) {
    t.extend_from_slice(&(part.len() as u16).to_be_bytes());
    t.extend_from_slice(part);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_name_their_sender_and_bind_the_epoch() {
        let id = |s: &str| MemberId::new(s).unwrap();
        let g = GroupName::new("g").unwrap();
        let members = [id("a"), id("b")];
        let e = |run| Epoch::new(ViewId::new(9, 4), run);
        let key = |b: u8| [b; 32];
        let c = Confirmer::new(&key(1), &g, e(0), ProtocolId::Tgdh, &members);
        let mac_a = c.mac(&id("a"));
        assert!(c.matches(&id("a"), &mac_a));
        assert!(!c.matches(&id("b"), &mac_a), "echoing another member's MAC proves nothing");
        let other_key = Confirmer::new(&key(2), &g, e(0), ProtocolId::Tgdh, &members);
        assert!(!other_key.matches(&id("a"), &mac_a), "another key");
        let other_run = Confirmer::new(&key(1), &g, e(1), ProtocolId::Tgdh, &members);
        assert!(!other_run.matches(&id("a"), &mac_a), "another run");
        let fewer = Confirmer::new(&key(1), &g, e(0), ProtocolId::Tgdh, &members[..1]);
        assert!(!fewer.matches(&id("a"), &mac_a), "another member list");
    }

    #[test]
    fn a_mac_is_hmac_over_the_transcript_hash_and_the_sender() {
        // The MAC as the wire defines it, computed from scratch for every
        // sender: the precomputed state gives the same bytes.
        let id = |s: &str| MemberId::new(s).unwrap();
        let g = GroupName::new("g").unwrap();
        let members = [id("a"), id("bb")];
        let epoch = Epoch::new(ViewId::new(3, 7), 2);
        let c = Confirmer::new(&[7; 32], &g, epoch, ProtocolId::Gdh, &members);
        let mut k = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"conclave/secure/v1/confirm-key"), &[7; 32])
            .expand(b"key confirmation", &mut k)
            .unwrap();
        let mut t = b"conclave/secure/v1/confirm\0".to_vec();
        put(&mut t, b"g");
        t.extend_from_slice(&epoch.to_bytes());
        t.push(ProtocolId::Gdh.code());
        t.extend_from_slice(&2u32.to_be_bytes());
        put(&mut t, b"a");
        put(&mut t, b"bb");
        for m in &members {
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&k).unwrap();
            mac.update(&Sha256::digest(&t));
            mac.update(m.as_str().as_bytes());
            let want: [u8; 32] = mac.finalize().into_bytes().into();
            assert_eq!(c.mac(m), want);
            assert_eq!(c.mac(m), c.mac(m), "the state is not used up");
        }
    }
}
