//! Key confirmation among the daemons: before a key of the daemons keys any
//! view, every daemon of its run proves over the ordered stream that it
//! holds the same key.
//!
//! Each daemon of a run that installed `K_s` multicasts, over the stream, a
//! MAC under a confirmation key derived from `K_s` (its own label, apart
//! from every view key's) over the epoch of the run, the daemons of the run
//! and its own number, and a signature of its identity over that MAC. When
//! the last of the run's daemons' confirmations is ordered (the same point
//! of the stream at every daemon), each daemon decides: every MAC matched
//! its own key, and the key is confirmed; or some daemon holds another key
//! (its MAC did not match, and its signature holds), and every daemon sees
//! at least one such MAC, so all rekey from scratch at that same point. A
//! MAC that does not match and whose signature does not hold is a forgery,
//! dropped: the real confirmation is awaited. A MAC that matches needs no
//! signature check: only a holder of `K_s` can make it, and the epoch and
//! the daemons' list bind it to this run.
//!
//! **Why the members of keyed groups confirm nothing.** A view's key is
//! `HMAC(K_s, g ‖ view id)` ([`crate::view_key`]): the same function of a
//! confirmed `K_s` and of inputs every daemon takes from the one ordered
//! stream. Once the daemons have confirmed `K_s`, every member of every
//! keyed group gets the same key for the same view from its own daemon —
//! which it trusts with the key anyway, as these modes trust the daemons
//! with the traffic. So one confirmation round among the daemons, per key
//! of theirs, replaces one per view of every keyed group (n unicasts and a
//! multicast each), and a keyed group's join or leave costs its membership
//! change and one HMAC per view, as the paper's Integrated VS does (§4.3.2).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use conclave_gcs::core::DaemonId;
use conclave_gka::key::EPOCH_LEN;
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::Epoch;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

/// The label the confirmation key is derived from `K_s` with.
const CONFIRM_KEY_LABEL: &[u8] = b"conclave/integrated/v1/daemon-confirm-key";
/// The label of the MAC's input.
const CONFIRM_MAC_LABEL: &[u8] = b"conclave/integrated/v1/daemon-confirm";
/// The label of the signed bytes.
const CONFIRM_SIGNED_LABEL: &[u8] = b"conclave/integrated/v1/daemon-confirm-signed";

/// How many confirmations of runs not (yet) confirming here are kept per
/// daemon (see [`Confirming::early`]): a run's confirmation can be ordered
/// before this daemon installed the key it confirms.
const EARLY_PER_DAEMON: usize = 2;

/// A confirmation's body (after its kind byte): `epoch ‖ MAC ‖ signature`.
pub(crate) fn encode(epoch: Epoch, mac: &[u8; 32], signature: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(EPOCH_LEN + 32 + signature.len());
    body.extend_from_slice(&epoch.to_bytes());
    body.extend_from_slice(mac);
    body.extend_from_slice(signature);
    body
}

/// A confirmation's epoch, MAC and signature; `None` if too short.
pub(crate) fn decode(body: &[u8]) -> Option<(Epoch, [u8; 32], &[u8])> {
    let (epoch, rest) = body.split_first_chunk::<EPOCH_LEN>()?;
    let (mac, signature) = rest.split_first_chunk::<32>()?;
    Some((Epoch::from_bytes(*epoch), *mac, signature))
}

/// What the signature of daemon `sender`'s confirmation covers.
fn signed_bytes(epoch: Epoch, mac: &[u8; 32], sender: DaemonId) -> Vec<u8> {
    let mut m = Vec::with_capacity(CONFIRM_SIGNED_LABEL.len() + EPOCH_LEN + 34);
    m.extend_from_slice(CONFIRM_SIGNED_LABEL);
    m.extend_from_slice(&epoch.to_bytes());
    m.extend_from_slice(mac);
    m.extend_from_slice(&sender.0.to_be_bytes());
    m
}

/// How a run's confirmation stands after a confirmation.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Tally {
    /// Some daemon of the run has not confirmed yet.
    Waiting,
    /// Every daemon of the run holds this daemon's key.
    Confirmed,
    /// Every daemon of the run has confirmed, and these hold another key
    /// (their signatures hold): the run is agreed again from scratch.
    Split(Vec<DaemonId>),
}

/// One run's key being confirmed among its daemons.
pub(crate) struct Confirming {
    /// The run's epoch.
    epoch: Epoch,
    /// The confirmation key, derived from the run's key.
    key: Zeroizing<[u8; 32]>,
    /// The run's daemons and their verifying keys.
    daemons: BTreeMap<DaemonId, Arc<dyn Verifier>>,
    /// Daemons whose confirmation matched.
    matched: BTreeSet<DaemonId>,
    /// Daemons whose confirmation did not match, signed.
    split: BTreeSet<DaemonId>,
}

impl Confirming {
    /// Starts confirming the key `secret` of run `epoch` among `daemons`
    /// (each with its verifying key; `me` among them): the state, and this
    /// daemon's own confirmation body, signed by `signer`, to multicast.
    pub(crate) fn start(
        epoch: Epoch,
        secret: &[u8; 32],
        daemons: BTreeMap<DaemonId, Arc<dyn Verifier>>,
        me: DaemonId,
        signer: &dyn Signer,
    ) -> (Self, Vec<u8>) {
        let mut kdf = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes any key");
        kdf.update(CONFIRM_KEY_LABEL);
        let key = Zeroizing::new(<[u8; 32]>::from(kdf.finalize().into_bytes()));
        let confirming = Self { epoch, key, daemons, matched: BTreeSet::new(), split: BTreeSet::new() };
        let mac = confirming.mac(me);
        let signature = signer.sign(&signed_bytes(epoch, &mac, me));
        // Its own confirmation counts when the stream orders it, as the
        // others' do: every daemon decides at the same point of the stream.
        (confirming, encode(epoch, &mac, &signature))
    }

    /// The MAC daemon `sender` sends if it holds this key: over the epoch,
    /// the run's daemons (in order) and the sender.
    fn mac(&self, sender: DaemonId) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.key.as_ref()).expect("HMAC takes any key");
        mac.update(CONFIRM_MAC_LABEL);
        mac.update(&self.epoch.to_bytes());
        mac.update(&(self.daemons.len() as u16).to_be_bytes());
        for d in self.daemons.keys() {
            mac.update(&d.0.to_be_bytes());
        }
        mac.update(&sender.0.to_be_bytes());
        mac.finalize().into_bytes().into()
    }

    /// The epoch being confirmed.
    pub(crate) fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Daemon `from`'s confirmation body, in stream order. One of another
    /// epoch, from a daemon not of the run, or from one already heard, is
    /// dropped; so is one whose MAC does not match and whose signature does
    /// not hold (a forgery).
    pub(crate) fn on_confirm(&mut self, from: DaemonId, body: &[u8]) -> Tally {
        let Some((epoch, mac, signature)) = decode(body) else {
            tracing::warn!(daemon = from.0, "a malformed key confirmation of the daemons; dropped");
            return self.tally();
        };
        let heard = self.matched.contains(&from) || self.split.contains(&from);
        let Some(verifier) = self.daemons.get(&from).filter(|_| epoch == self.epoch && !heard) else {
            return self.tally();
        };
        if bool::from(self.mac(from).ct_eq(&mac)) {
            self.matched.insert(from);
        } else if verifier.verify(&signed_bytes(epoch, &mac, from), signature).is_ok() {
            tracing::error!(daemon = from.0, ?epoch, "a daemon holds another key of the daemons");
            self.split.insert(from);
        } else {
            tracing::warn!(daemon = from.0, "a key confirmation of the daemons whose MAC and signature fail; dropped");
        }
        self.tally()
    }

    fn tally(&self) -> Tally {
        if self.matched.len() + self.split.len() < self.daemons.len() {
            Tally::Waiting
        } else if self.split.is_empty() {
            Tally::Confirmed
        } else {
            Tally::Split(self.split.iter().copied().collect())
        }
    }
}

/// Confirmations ordered before this daemon confirms their run (it had not
/// installed the key yet): a few per daemon, for the next run to take.
#[derive(Default)]
pub(crate) struct Early {
    by_daemon: BTreeMap<DaemonId, Vec<Vec<u8>>>,
}

impl Early {
    /// Keeps `body` from daemon `from` (at most [`EARLY_PER_DAEMON`] each).
    pub(crate) fn keep(&mut self, from: DaemonId, body: &[u8]) {
        let kept = self.by_daemon.entry(from).or_default();
        if kept.len() < EARLY_PER_DAEMON {
            kept.push(body.to_vec());
        }
    }

    /// Everything kept, in the order each daemon sent it; emptied.
    pub(crate) fn take(&mut self) -> Vec<(DaemonId, Vec<u8>)> {
        std::mem::take(&mut self.by_daemon)
            .into_iter()
            .flat_map(|(d, bodies)| bodies.into_iter().map(move |b| (d, b)))
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.by_daemon.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_gcs::ViewId;
    use conclave_gka::suite::ed25519::Ed25519Signer;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn signers(n: u16) -> Vec<Arc<dyn Signer>> {
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        (0..n).map(|_| Arc::new(Ed25519Signer::generate(&mut rng)) as Arc<dyn Signer>).collect()
    }

    fn epoch() -> Epoch {
        Epoch::new(ViewId::from_bytes([3; 16]), 1)
    }

    fn daemons(s: &[Arc<dyn Signer>]) -> BTreeMap<DaemonId, Arc<dyn Verifier>> {
        s.iter().enumerate().map(|(i, s)| (DaemonId(i as u16 + 1), s.verifier())).collect()
    }

    /// Daemon i + 1's state and confirmation, holding the key made of `secrets[i]`.
    fn start_all(s: &[Arc<dyn Signer>], secrets: &[u8]) -> Vec<(Confirming, Vec<u8>)> {
        secrets
            .iter()
            .enumerate()
            .map(|(i, &k)| Confirming::start(epoch(), &[k; 32], daemons(s), DaemonId(i as u16 + 1), s[i].as_ref()))
            .collect()
    }

    #[test]
    fn daemons_with_one_key_confirm_it_once_every_one_is_heard() {
        let s = signers(3);
        let mut all = start_all(&s, &[9, 9, 9]);
        let bodies: Vec<Vec<u8>> = all.iter().map(|(_, b)| b.clone()).collect();
        let (me, _) = &mut all[0];
        assert_eq!(me.on_confirm(DaemonId(2), &bodies[1]), Tally::Waiting);
        // A replay of one already heard changes nothing.
        assert_eq!(me.on_confirm(DaemonId(2), &bodies[1]), Tally::Waiting);
        assert_eq!(me.on_confirm(DaemonId(3), &bodies[2]), Tally::Waiting, "its own is not ordered yet");
        assert_eq!(me.on_confirm(DaemonId(1), &bodies[0]), Tally::Confirmed);
    }

    #[test]
    fn a_daemon_with_another_key_is_a_split_that_every_daemon_sees() {
        let s = signers(3);
        let all = start_all(&s, &[9, 9, 4]);
        let bodies: Vec<Vec<u8>> = all.iter().map(|(_, b)| b.clone()).collect();
        for (i, (mut c, _)) in all.into_iter().enumerate() {
            let mut last = Tally::Waiting;
            for (j, body) in bodies.iter().enumerate() {
                last = c.on_confirm(DaemonId(j as u16 + 1), body);
            }
            let expected = if i == 2 { vec![DaemonId(1), DaemonId(2)] } else { vec![DaemonId(3)] };
            assert_eq!(last, Tally::Split(expected), "daemon {}", i + 1);
        }
    }

    #[test]
    fn a_forged_confirmation_is_dropped_and_the_real_one_awaited() {
        let s = signers(2);
        let mut all = start_all(&s, &[9, 9]);
        let (own, real) = (all[0].1.clone(), all[1].1.clone());
        let (me, _) = &mut all[0];
        assert_eq!(me.on_confirm(DaemonId(1), &own), Tally::Waiting);
        // Another key's MAC, signed by someone else: a forgery.
        let (_, forged) = Confirming::start(epoch(), &[4; 32], daemons(&s), DaemonId(2), s[0].as_ref());
        assert_eq!(me.on_confirm(DaemonId(2), &forged), Tally::Waiting);
        // Unsigned, malformed, of another epoch, from a stranger: dropped too.
        let (epoch, mac, _) = decode(&forged).unwrap();
        assert_eq!(me.on_confirm(DaemonId(2), &encode(epoch, &mac, &[])), Tally::Waiting);
        assert_eq!(me.on_confirm(DaemonId(2), &real[..10]), Tally::Waiting);
        let (_, m, sig) = decode(&real).unwrap();
        let other = Epoch::new(ViewId::from_bytes([4; 16]), 1);
        assert_eq!(me.on_confirm(DaemonId(2), &encode(other, &m, sig)), Tally::Waiting);
        assert_eq!(me.on_confirm(DaemonId(7), &real), Tally::Waiting);
        assert_eq!(me.on_confirm(DaemonId(2), &real), Tally::Confirmed);
    }

    #[test]
    fn a_confirmation_names_its_sender_so_it_cannot_be_echoed_for_another() {
        let s = signers(3);
        let mut all = start_all(&s, &[9, 9, 9]);
        let (own, from_2) = (all[0].1.clone(), all[1].1.clone());
        let (me, _) = &mut all[0];
        assert_eq!(me.on_confirm(DaemonId(1), &own), Tally::Waiting);
        // Daemon 2's confirmation presented as daemon 3's: its MAC does not
        // match daemon 3's, and its signature is daemon 2's.
        assert_eq!(me.on_confirm(DaemonId(3), &from_2), Tally::Waiting);
        assert_eq!(me.on_confirm(DaemonId(2), &from_2), Tally::Waiting);
    }

    #[test]
    fn early_keeps_a_bounded_number_per_daemon() {
        let mut early = Early::default();
        for i in 0..10u8 {
            early.keep(DaemonId(1), &[i]);
        }
        early.keep(DaemonId(2), &[42]);
        assert_eq!(early.take(), vec![(DaemonId(1), vec![0]), (DaemonId(1), vec![1]), (DaemonId(2), vec![42])]);
        assert!(early.take().is_empty());
    }
}
