//! Key confirmation: after a run installs a key, every member proves that
//! it holds the same key, before anyone uses it.
//!
//! Each member computes, for the new epoch, a MAC *per sender*: HMAC-SHA256
//! under a confirmation key derived from the new group key (never the data
//! keys), over the group, the epoch (view, with its daemon incarnation, and
//! run), the protocol, the member list (its digest, [`ListDigest`], taken
//! when a run starts in the view) and the sender's name. Because the
//! MAC names its sender, a member cannot confirm by echoing another's MAC: it
//! must hold the key. The message is also signed by the sender's identity
//! key (like every protocol message).
//!
//! **One collector.** The members do not multicast their confirmations to
//! each other (n² deliveries and n² MAC checks in all, the largest cost of a
//! real session beyond its cryptography at a few hundred members): each
//! sends its confirmation by unicast to the *collector*, the first member of
//! the key's member list still in the view (with interval rekeying a key
//! outlives views, and a member re-sends its confirmation when a view takes
//! the collector it had sent it to). The collector checks every MAC against
//! its own key and multicasts one signed *verdict*: the members whose MACs
//! did not match (none when the keys agree), under a MAC of its own, bound to
//! the same transcript and to the list. Every member checks that one MAC: n
//! unicasts, one multicast and 2n − 1 MAC checks per run in all.
//!
//! A signature is checked only when a MAC does *not* match: then it must be
//! known whether the sender really holds another key (a split, reported in
//! its name) or someone else sent junk in its name (dropped; the real one is
//! awaited). A MAC that matches needs no signature: only a holder of the key
//! can compute it, and the transcript binds it to this epoch, so it cannot
//! come from another run, view or daemon lifetime. The most a key holder
//! gains by lying (confirming in another's name, or, as collector, leaving a
//! member out of the verdict's list) is to hide from the others that one
//! member's key differs; that member itself finds the verdict's MAC (or, as
//! collector, the others' MACs) not matching its key, reports the mismatch
//! and never uses its key, so no member holds a key that differs from its
//! group's unnoticed — as when every member checked every MAC, which gave an
//! insider the same power.
//!
//! **Groups the daemons key** (Integrated VS, Optimized EVS) confirm
//! nothing here. Every view's key is one HMAC of the daemons' key `K_s`
//! over the group and the view id, which every daemon takes from the one
//! ordered stream, and the daemons confirm `K_s` among themselves before it
//! keys any view (`conclave_integrated`'s `confirm` module, the same scheme
//! among the daemons): so every member gets the same key for the same view
//! from its own daemon, which these modes trust with the key anyway. One
//! confirmation round among the daemons per key of theirs replaces one per
//! view of every keyed group. A confirmation or verdict is always signed
//! (only a member alone, which sends none, makes an empty signature); one
//! whose MAC does not match and whose signature is empty is a forgery.
//!
//! The verdict travels in agreed order, so all members decide on the same
//! message; it names the view its collector sent it in (in its MAC and
//! signature) and counts in that view only, so that no copy replayed into
//! another view or component decides there (with interval rekeying a
//! confirmation outlives views; the collector sends its verdict again in
//! each view until the members have decided). If its list is empty and its
//! MAC matches, the secure view is delivered; otherwise — the members hold different keys, or an insider
//! lied — every member reports the mismatch with the members it knows did
//! not match (the list, or the collector whose MAC did not match its own
//! key), and the view is rekeyed from scratch
//! ([`conclave_gka::Engine::rekey`]). No unconfirmed key ever reaches the
//! application.

use std::io::{BufWriter, Write};

use conclave_gcs::{GroupName, MemberId};
use conclave_gka::{Epoch, ProtocolId, ViewId};
use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// What key confirmation adds to a run whose view has `n` members whose keys
/// match, as the session performs it: two rounds, in which every member but
/// the collector unicasts one signed confirmation to the collector, which
/// multicasts one signed verdict (signatures are checked only for MACs that
/// do not match: none when the keys agree). `bench counts` prints it beside
/// each protocol's own counts, which stay comparable with TISSEC's tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConfirmCost {
    /// Rounds on the critical path.
    pub rounds: u64,
    /// Messages sent, all members together: the confirmations (unicasts to
    /// the collector) and the verdict (a multicast).
    pub broadcasts: u64,
    /// Signatures made by one member (the critical path).
    pub sigs_serial: u64,
    /// Signatures checked by one member (the critical path).
    pub verifs_serial: u64,
    /// Signatures made, all members together.
    pub sigs_total: u64,
    /// Signatures checked, all members together.
    pub verifs_total: u64,
    /// Bytes sent, all members together (payloads as the daemon carries them).
    pub bytes: u64,
}

/// The confirmation cost of a run among `n` members whose signatures are
/// `signature_len` bytes long. A member alone confirms to itself: nothing
/// is sent or signed.
pub fn confirmation_cost(n: usize, signature_len: usize) -> ConfirmCost {
    let n = n as u64;
    if n <= 1 {
        return ConfirmCost {
            rounds: 0,
            broadcasts: 0,
            sigs_serial: 0,
            verifs_serial: 0,
            sigs_total: 0,
            verifs_total: 0,
            bytes: 0,
        };
    }
    ConfirmCost {
        rounds: 2,
        broadcasts: n,
        // A member's confirmation, then the collector's verdict.
        sigs_serial: 2,
        verifs_serial: 0,
        sigs_total: n,
        verifs_total: 0,
        bytes: (n - 1) * confirmation_len(signature_len) as u64 + verdict_len(signature_len, 0) as u64,
    }
}

/// A confirmation's payload length: `tag ‖ epoch ‖ MAC ‖ signature`.
pub(crate) fn confirmation_len(signature_len: usize) -> usize {
    1 + conclave_gka::key::EPOCH_LEN + 32 + signature_len
}

/// A verdict's payload length: `tag ‖ epoch ‖ view ‖ MAC ‖ u16 length ‖
/// signature ‖ names`, with `names` bytes of names (each `u8 length ‖ name`).
pub(crate) fn verdict_len(signature_len: usize, names: usize) -> usize {
    1 + conclave_gka::key::EPOCH_LEN + 16 + 32 + 2 + signature_len + names
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

/// The digest of a key's member list, in order, as key confirmation's
/// transcript takes it: SHA-256 over the list's length and each name,
/// length first.
///
/// A session takes it when a run starts in the view, right after the view
/// came ([`ListDigest::of`]), not when the run ends: a member reads the view's names as it comes (the client puts
/// the list together, the session follows it), and they are still in the
/// cache then; by the end of a run in a group of hundreds, other members'
/// work has pushed them out, and reading n names scattered over the heap
/// again was most of what a confirmation cost beside its signature.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ListDigest([u8; 32]);

impl ListDigest {
    /// The digest of `members`, in this order.
    pub(crate) fn of<'a, I>(members: I) -> Self
    where
        I: IntoIterator<Item = &'a MemberId>,
        I::IntoIter: ExactSizeIterator,
    {
        let members = members.into_iter();
        // Hashed as written, a few KiB at a time (the same bytes, so the
        // same digest): a buffer grown name by name was copied over and
        // over, and hashing each name as it came cost a copy into the
        // hash's block buffer per name.
        let mut list = BufWriter::with_capacity(4096, Sha256::new());
        write(&mut list, b"conclave/secure/v1/confirm-members\0");
        write(&mut list, &(members.len() as u32).to_be_bytes());
        for m in members {
            put(&mut list, m.as_str().as_bytes());
        }
        Self(list.into_inner().expect("hashing does not fail").finalize().into())
    }
}

impl Confirmer {
    /// For the key (`GroupKey::expose_secret`) agreed in `epoch` by
    /// `protocol` among the members whose list (view order) `members` digests.
    pub fn new(key: &[u8; 32], group: &GroupName, epoch: Epoch, protocol: ProtocolId, members: &ListDigest) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/secure/v1/confirm-key"), key);
        let mut k = Zeroizing::new([0u8; 32]);
        hk.expand(b"key confirmation", k.as_mut()).expect("32 bytes is a valid HKDF-SHA256 output length");
        let mut transcript = Sha256::new();
        write(&mut transcript, b"conclave/secure/v1/confirm\0");
        put(&mut transcript, group.as_str().as_bytes());
        write(&mut transcript, &epoch.to_bytes());
        write(&mut transcript, &[protocol.code()]);
        write(&mut transcript, &members.0);
        let mut keyed = <Hmac<Sha256> as Mac>::new_from_slice(k.as_ref()).expect("HMAC takes any key length");
        keyed.update(&transcript.finalize());
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

    /// The MAC of `collector`'s verdict that lists `names` (the verdict's
    /// names part) as not matching. After the transcript comes the byte
    /// 0xff, which no member name (UTF-8) contains, so no verdict's MAC is a
    /// member's confirmation MAC.
    pub fn verdict_mac(&self, collector: &MemberId, view: ViewId, names: &[u8]) -> [u8; 32] {
        let mut mac = self.keyed.clone();
        mac.update(b"\xffverdict");
        put_mac(&mut mac, collector.as_str().as_bytes());
        mac.update(&view.to_bytes());
        mac.update(names);
        mac.finalize().into_bytes().into()
    }

    /// Whether a verdict's MAC shows its collector holds this member's key.
    pub fn verdict_matches(&self, collector: &MemberId, view: ViewId, names: &[u8], mac: &[u8; 32]) -> bool {
        self.verdict_mac(collector, view, names).ct_eq(mac).into()
    }
}

fn put_mac(mac: &mut Hmac<Sha256>, part: &[u8]) {
    mac.update(&(part.len() as u16).to_be_bytes());
    mac.update(part);
}

/// What the collector signs to send a verdict.
pub(crate) fn verdict_signed(
    group: &GroupName,
    collector: &MemberId,
    epoch: Epoch,
    view: ViewId,
    mac: &[u8; 32],
    names: &[u8],
) -> Vec<u8> {
    let mut t = b"conclave/secure/v1/verdict-signature\0".to_vec();
    put(&mut t, group.as_str().as_bytes());
    put(&mut t, collector.as_str().as_bytes());
    t.extend_from_slice(&epoch.to_bytes());
    t.extend_from_slice(&view.to_bytes());
    t.extend_from_slice(mac);
    t.extend_from_slice(names);
    t
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

/// Appends `part` with its length first, to a transcript in memory or to
/// one being hashed.
fn put(t: &mut impl Write, part: &[u8]) {
    write(t, &(part.len() as u16).to_be_bytes());
    write(t, part);
}

/// Appends `bytes` to a transcript in memory or to one being hashed
/// (neither fails).
fn write(t: &mut impl Write, bytes: &[u8]) {
    t.write_all(bytes).expect("writing to memory or to a hash does not fail");
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
        let c = Confirmer::new(&key(1), &g, e(0), ProtocolId::Tgdh, &ListDigest::of(&members));
        let mac_a = c.mac(&id("a"));
        assert!(c.matches(&id("a"), &mac_a));
        assert!(!c.matches(&id("b"), &mac_a), "echoing another member's MAC proves nothing");
        let other_key = Confirmer::new(&key(2), &g, e(0), ProtocolId::Tgdh, &ListDigest::of(&members));
        assert!(!other_key.matches(&id("a"), &mac_a), "another key");
        let other_run = Confirmer::new(&key(1), &g, e(1), ProtocolId::Tgdh, &ListDigest::of(&members));
        assert!(!other_run.matches(&id("a"), &mac_a), "another run");
        let fewer = Confirmer::new(&key(1), &g, e(0), ProtocolId::Tgdh, &ListDigest::of(&members[..1]));
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
        let c = Confirmer::new(&[7; 32], &g, epoch, ProtocolId::Gdh, &ListDigest::of(&members));
        let mut k = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"conclave/secure/v1/confirm-key"), &[7; 32])
            .expand(b"key confirmation", &mut k)
            .unwrap();
        let mut list = b"conclave/secure/v1/confirm-members\0".to_vec();
        list.extend_from_slice(&2u32.to_be_bytes());
        put(&mut list, b"a");
        put(&mut list, b"bb");
        let mut t = b"conclave/secure/v1/confirm\0".to_vec();
        put(&mut t, b"g");
        t.extend_from_slice(&epoch.to_bytes());
        t.push(ProtocolId::Gdh.code());
        t.extend_from_slice(&Sha256::digest(&list));
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
