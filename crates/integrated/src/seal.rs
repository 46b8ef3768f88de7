//! The sealed backbone (the Three-Step client–server architecture, paper
//! §4.3.1): every client operation that goes from one daemon to the others
//! is sealed with an AEAD key derived from the daemons' key `K_s`.
//!
//! A daemon seals its clients' operations (joins, leaves, multicasts,
//! unicasts, connects and disconnects alike: control traffic as well as
//! data) under the newest key of its configuration and submits them as
//! [`Op::DaemonKa`] traffic; every daemon opens them in stream order and
//! feeds the operation inside to its core. What does not go sealed: the
//! daemons' key agreement itself (signed by each daemon's identity key), and
//! the state exchange after a change of the daemon group, which runs before
//! there is a key (the paper's membership protocol, which it protects with
//! the daemons' long-term keys; here it relies on the backbone's own
//! protection, Corosync's totem encryption in a cluster).
//!
//! **One decision everywhere.** Whether a sealed operation is applied must
//! be the same at every daemon, or their cores diverge. So a daemon opens
//! one only under a key agreed *in the current configuration*, which every
//! daemon of it holds: the keys are dropped at every change of the daemon
//! group, and an operation sealed under one that is gone (it was on its way
//! when the daemon group changed) is *void* at every daemon alike. Its
//! sender submits it again under the next key, before anything it has not
//! sent yet, so its clients' operations keep their order: while any
//! operation it sealed under a key that is gone is still on its way, it
//! seals nothing new (the backbone keeps each daemon's submissions in order,
//! so each comes back, void, before anything sealed after it would). A
//! daemon alone in its configuration has its next key at once, before its
//! void operations are back; this is what keeps them first.
//!
//! **Nonces and replays.** The AEAD is AES-256-GCM (ring's) with the key
//! `HMAC-SHA256(K_s, label)`; the nonce is the sealing daemon's number and
//! its count of operations sealed under that key, which starts at 0 with
//! every key, so no two seals share a nonce. The associated data binds the
//! daemon, the key's epoch and the count. A daemon accepts from each other
//! daemon only counts above the last it accepted under that key: the
//! backbone keeps a sender's submissions in order, so a count that goes
//! back is a replay.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use conclave_gcs::backbone::{decode_op, op_bytes};
use conclave_gcs::core::{DaemonId, Op, Output};
use conclave_gka::key::EPOCH_LEN;
use conclave_gka::Epoch;
use hmac::{Hmac, Mac};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The label of the sealing key's derivation.
const SEAL_KEY_LABEL: &[u8] = b"conclave/integrated/v2/backbone-seal-aes256gcm";
/// The label that starts a sealed operation's associated data.
const SEAL_AAD_LABEL: &[u8] = b"conclave/integrated/v1/sealed-op";

/// The most keys of one configuration a daemon keeps for opening (the
/// daemons renew their key by data-out or time-out; an operation sealed
/// under a key this many renewals old is void, and sent again).
const KEEP: usize = 4;

/// A sealed operation's body after its kind byte: epoch, count, ciphertext.
const HEADER: usize = EPOCH_LEN + 8;

/// One key of the configuration. (The derived key is zeroized; ring's
/// expanded AES key schedule is not.)
struct SealKey {
    epoch: Epoch,
    aead: LessSafeKey,
}

impl SealKey {
    fn new(epoch: Epoch, server_key: &[u8; 32]) -> Self {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(server_key).expect("HMAC takes any key");
        mac.update(SEAL_KEY_LABEL);
        let key = Zeroizing::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
        let aead = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &*key).expect("32 bytes is an AES-256 key"));
        Self { epoch, aead }
    }
}

fn nonce(from: DaemonId, count: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[..2].copy_from_slice(&from.0.to_be_bytes());
    n[4..].copy_from_slice(&count.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad(from: DaemonId, epoch: &Epoch, count: u64) -> Vec<u8> {
    let mut aad = Vec::with_capacity(SEAL_AAD_LABEL.len() + 2 + EPOCH_LEN + 8);
    aad.extend_from_slice(SEAL_AAD_LABEL);
    aad.extend_from_slice(&from.0.to_be_bytes());
    aad.extend_from_slice(&epoch.to_bytes());
    aad.extend_from_slice(&count.to_be_bytes());
    aad
}

/// What became of a sealed operation delivered in stream order.
#[derive(Debug)]
pub(crate) enum Opened {
    /// Sealed under a key of the configuration and authentic: the operation.
    Op(Op),
    /// Sealed under a key that is gone: void at every daemon.
    Void,
    /// Not authentic, a replay, malformed, or not its sender's to send:
    /// dropped at every daemon.
    Refused(&'static str),
}

/// One daemon's side of the sealed backbone (see the [module docs](self)).
pub(crate) struct Sealing {
    me: DaemonId,
    /// The keys agreed in the current configuration, newest last.
    keys: VecDeque<SealKey>,
    /// This daemon's count of seals under the newest key.
    next_count: u64,
    /// Per key epoch and sending daemon, the last count accepted.
    accepted: BTreeMap<(Epoch, DaemonId), u64>,
    /// This daemon's sealed operations on their way through the backbone,
    /// in submission order: key epoch, count, the operation, and the body
    /// sent (a forgery may copy the epoch and count, not the rest).
    in_flight: VecDeque<(Epoch, u64, Op, Bytes)>,
    /// Operations waiting for a key: the first `voided` were void and go
    /// first, in their order; the rest were never sent.
    waiting: VecDeque<Op>,
    voided: usize,
    /// How many of `in_flight` were sealed under a key that is gone (they
    /// will be void): nothing new is sealed while there are any.
    stale: usize,
    /// This daemon's operations sent again after they were void.
    resent: u64,
}

impl Sealing {
    pub(crate) fn new(me: DaemonId) -> Self {
        Self {
            me,
            keys: VecDeque::new(),
            next_count: 0,
            accepted: BTreeMap::new(),
            in_flight: VecDeque::new(),
            waiting: VecDeque::new(),
            voided: 0,
            stale: 0,
            resent: 0,
        }
    }

    /// Operations of this daemon's clients waiting for the daemons' key.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// This daemon's operations sent again after they were void.
    pub(crate) fn resent(&self) -> u64 {
        self.resent
    }

    /// The daemon group changed: its keys are gone.
    pub(crate) fn configuration_changed(&mut self) {
        self.keys.clear();
        self.accepted.clear();
        self.stale = self.in_flight.len();
    }

    /// Whether new operations may be sealed now: there is a key, and nothing
    /// sealed under a key that is gone is still on its way.
    fn may_seal(&self) -> bool {
        !self.keys.is_empty() && self.stale == 0
    }

    /// Seals what waits, if it may.
    fn flush(&mut self, out: &mut Vec<Output>) {
        if !self.may_seal() {
            return;
        }
        self.voided = 0;
        for op in std::mem::take(&mut self.waiting) {
            self.seal(op, out);
        }
    }

    /// The daemons agreed the key `server_key` (its secret, of epoch
    /// `epoch`) in this configuration: what waited goes out under it.
    pub(crate) fn key_agreed(&mut self, epoch: Epoch, server_key: &[u8; 32], out: &mut Vec<Output>) {
        if self.keys.len() == KEEP {
            let old = self.keys.pop_front().expect("KEEP > 0");
            self.accepted.retain(|(e, _), _| *e != old.epoch);
            self.stale += self.in_flight.iter().filter(|(e, ..)| *e == old.epoch).count();
        }
        self.keys.push_back(SealKey::new(epoch, server_key));
        self.next_count = 0;
        self.flush(out);
    }

    /// One of this daemon's clients' operations (numbered) for the backbone:
    /// sealed and submitted, or held until there is a key.
    pub(crate) fn submit(&mut self, op: Op, out: &mut Vec<Output>) {
        if !self.may_seal() || !self.waiting.is_empty() {
            self.waiting.push_back(op);
        } else {
            self.seal(op, out);
        }
    }

    fn seal(&mut self, op: Op, out: &mut Vec<Output>) {
        let key = self.keys.back().expect("a key");
        let count = self.next_count;
        self.next_count += 1;
        let plain = op_bytes(&op);
        let aad = aad(self.me, &key.epoch, count);
        let mut payload = Vec::with_capacity(1 + HEADER + plain.len() + 16);
        payload.push(crate::ka_kind::SEALED);
        payload.extend_from_slice(&key.epoch.to_bytes());
        payload.extend_from_slice(&count.to_be_bytes());
        let start = payload.len();
        payload.extend_from_slice(&plain);
        let tag = key
            .aead
            .seal_in_place_separate_tag(nonce(self.me, count), Aad::from(&aad), &mut payload[start..])
            .expect("AES-256-GCM seals any length the backbone carries");
        payload.extend_from_slice(tag.as_ref());
        let payload = Bytes::from(payload);
        self.in_flight.push_back((key.epoch, count, op, payload.slice(1..)));
        out.push(Output::Submit(Op::DaemonKa { from: self.me, payload }));
    }

    /// A sealed operation from daemon `from`, in stream order (`body`: the
    /// payload after its kind byte). The decision is the same at every
    /// daemon of the configuration; this daemon's own void operations are
    /// sent again (now, if there is a newer key already).
    pub(crate) fn open(&mut self, from: DaemonId, body: &[u8], out: &mut Vec<Output>) -> Opened {
        let opened = self.decide(from, body);
        if from == self.me {
            self.returned(body, matches!(opened, Opened::Void), out);
        }
        opened
    }

    fn decide(&mut self, from: DaemonId, body: &[u8]) -> Opened {
        if body.len() < HEADER {
            return Opened::Refused("a sealed operation too short for its header");
        }
        let (epoch, rest) = body.split_at(EPOCH_LEN);
        let (count, ciphertext) = rest.split_at(8);
        let epoch = Epoch::from_bytes(epoch.try_into().expect("EPOCH_LEN bytes"));
        let count = u64::from_be_bytes(count.try_into().expect("8 bytes"));
        let Some(key) = self.keys.iter().find(|k| k.epoch == epoch) else { return Opened::Void };
        if self.accepted.get(&(epoch, from)).is_some_and(|&last| count <= last) {
            return Opened::Refused("a sealed operation replayed");
        }
        let aad = aad(from, &epoch, count);
        let mut plain = ciphertext.to_vec();
        let Ok(len) = key.aead.open_in_place(nonce(from, count), Aad::from(&aad), &mut plain).map(|p| p.len()) else {
            return Opened::Refused("a sealed operation that does not authenticate");
        };
        plain.truncate(len);
        self.accepted.insert((epoch, from), count);
        let op = match decode_op(Bytes::from(plain)) {
            Ok(op) => op,
            Err(_) => return Opened::Refused("a sealed operation that does not decode"),
        };
        // A daemon speaks for its own clients only, as on the plain backbone.
        match &op {
            Op::Numbered { .. } if op.conn().is_some_and(|c| c.daemon == from) => Opened::Op(op),
            _ => Opened::Refused("a sealed operation that is not its sender's clients'"),
        }
    }

    /// This daemon's own sealed operation came back through the backbone.
    fn returned(&mut self, body: &[u8], void: bool, out: &mut Vec<Output>) {
        let Some((_, _, _, sent)) = self.in_flight.front() else { return };
        if body != sent.as_ref() {
            // Not the oldest in flight. The backbone does not lose or reorder
            // this daemon's submissions, so it is someone else's under this
            // daemon's name: a replay, or a forgery that copied the epoch
            // and count of one on its way (which must not count as its
            // return: the real one would then find nothing to match, and a
            // void one would not be sent again). Nothing to resend.
            tracing::warn!(daemon = self.me.0, "a sealed operation under this daemon's name that it has not sent");
            return;
        }
        let (epoch, _, op, _) = self.in_flight.pop_front().expect("front");
        if !self.keys.iter().any(|k| k.epoch == epoch) {
            self.stale -= 1;
        }
        if void {
            self.resent += 1;
            self.waiting.insert(self.voided, op);
            self.voided += 1;
        }
        self.flush(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_gcs::core::{ConnId, OpId};
    use conclave_gcs::{GroupName, ViewId};

    fn epoch(n: u64) -> Epoch {
        Epoch { view: ViewId::from_bytes([n as u8; 16]), run: 0 }
    }

    fn key(n: u8) -> [u8; 32] {
        [n; 32]
    }

    fn client_op(daemon: u16, seq: u64) -> Op {
        let conn = ConnId { daemon: DaemonId(daemon), local: 1 };
        let op = Op::Leave { conn, group: GroupName::new("g").unwrap() };
        op.numbered(OpId { incarnation: 9, seq })
    }

    /// Daemons 0 and 1 with the same key; what 0 submits for `op`.
    fn pair() -> (Sealing, Sealing) {
        let (mut a, mut b) = (Sealing::new(DaemonId(0)), Sealing::new(DaemonId(1)));
        a.key_agreed(epoch(1), &key(7), &mut Vec::new());
        b.key_agreed(epoch(1), &key(7), &mut Vec::new());
        (a, b)
    }

    fn sealed(out: Vec<Output>) -> Vec<u8> {
        match out.as_slice() {
            [Output::Submit(Op::DaemonKa { payload, .. })] => {
                assert_eq!(payload[0], crate::ka_kind::SEALED);
                payload[1..].to_vec()
            }
            other => panic!("not one sealed submission: {other:?}"),
        }
    }

    #[test]
    fn a_sealed_operation_opens_once_under_its_key_and_its_senders_name_only() {
        let (mut a, mut b) = pair();
        let mut out = Vec::new();
        a.submit(client_op(0, 0), &mut out);
        let body = sealed(out);
        // Another daemon's name on it: the associated data does not match.
        assert!(matches!(b.open(DaemonId(2), &body, &mut Vec::new()), Opened::Refused(_)));
        assert!(matches!(b.open(DaemonId(0), &body, &mut Vec::new()), Opened::Op(op) if op == client_op(0, 0)));
        assert!(matches!(b.open(DaemonId(0), &body, &mut Vec::new()), Opened::Refused("a sealed operation replayed")));
        // Altered anywhere after the epoch: refused.
        let mut out = Vec::new();
        a.submit(client_op(0, 1), &mut out);
        let body = sealed(out);
        for i in [EPOCH_LEN, HEADER, body.len() - 1] {
            let mut bad = body.clone();
            bad[i] ^= 1;
            assert!(matches!(b.open(DaemonId(0), &bad, &mut Vec::new()), Opened::Refused(_)), "byte {i}");
        }
        assert!(matches!(b.open(DaemonId(0), &body[..HEADER - 1], &mut Vec::new()), Opened::Refused(_)));
        // Under a key b does not have: void, not refused.
        let mut other = epoch(2).to_bytes().to_vec();
        other.extend_from_slice(&body[EPOCH_LEN..]);
        assert!(matches!(b.open(DaemonId(0), &other, &mut Vec::new()), Opened::Void));
    }

    #[test]
    fn a_daemon_cannot_seal_another_daemons_clients_operations() {
        let (mut a, mut b) = pair();
        let mut out = Vec::new();
        a.submit(client_op(1, 0), &mut out);
        let body = sealed(out);
        assert!(matches!(b.open(DaemonId(0), &body, &mut Vec::new()), Opened::Refused(_)));
    }

    /// What daemon 1, holding daemon 0's next key (epoch 2), makes of
    /// daemon 0's submissions `out`, in order.
    fn opened_under_the_next_key(out: Vec<Output>) -> Vec<Op> {
        let mut b = Sealing::new(DaemonId(1));
        b.key_agreed(epoch(2), &key(8), &mut Vec::new());
        out.into_iter()
            .map(|o| match b.open(DaemonId(0), &sealed(vec![o]), &mut Vec::new()) {
                Opened::Op(op) => op,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn void_operations_go_again_before_newer_ones_under_the_next_key() {
        let (mut a, _) = pair();
        let mut out = Vec::new();
        a.submit(client_op(0, 0), &mut out);
        a.submit(client_op(0, 1), &mut out);
        let bodies: Vec<Vec<u8>> = out.into_iter().map(|o| sealed(vec![o])).collect();
        a.configuration_changed();
        let mut out = Vec::new();
        a.submit(client_op(0, 2), &mut out);
        assert!(out.is_empty(), "no key: the operation waits");
        for body in &bodies {
            assert!(matches!(a.open(DaemonId(0), body, &mut out), Opened::Void));
        }
        assert_eq!(a.waiting(), 3);
        a.key_agreed(epoch(2), &key(8), &mut out);
        let order = opened_under_the_next_key(out);
        assert_eq!(order, [client_op(0, 0), client_op(0, 1), client_op(0, 2)]);
        assert_eq!(a.resent(), 2);
    }

    /// `conclave sim --protocols three-step` seed 1254: an attacker on the
    /// backbone copied the epoch and count of a daemon's operation on its
    /// way, under that daemon's name, with a ciphertext of its own. Refused
    /// everywhere, but its sender took it for its own operation come back;
    /// had the real one then been void (the daemon group changing between
    /// the two), it would never have been sent again: lost.
    #[test]
    fn a_forgery_with_the_header_of_an_operation_on_its_way_is_not_its_return() {
        let (mut a, _) = pair();
        let mut out = Vec::new();
        a.submit(client_op(0, 0), &mut out);
        let body = sealed(out);
        let mut forged = body.clone();
        forged[HEADER] ^= 1;
        let mut out = Vec::new();
        assert!(matches!(a.open(DaemonId(0), &forged, &mut out), Opened::Refused(_)));
        a.configuration_changed();
        assert!(matches!(a.open(DaemonId(0), &body, &mut out), Opened::Void));
        a.key_agreed(epoch(2), &key(8), &mut out);
        assert_eq!(opened_under_the_next_key(out), [client_op(0, 0)], "the void operation goes again");
    }

    /// Alone in its next configuration, a daemon has the next key before its
    /// void operations are back: it seals nothing new until they are, so
    /// they still go first.
    #[test]
    fn a_daemon_with_its_next_key_at_once_still_sends_its_void_operations_first() {
        let (mut a, _) = pair();
        let mut out = Vec::new();
        a.submit(client_op(0, 0), &mut out);
        let body = sealed(out);
        a.configuration_changed();
        let mut out = Vec::new();
        a.key_agreed(epoch(2), &key(8), &mut out);
        a.submit(client_op(0, 1), &mut out);
        assert!(out.is_empty(), "sealed before the void operation came back");
        assert!(matches!(a.open(DaemonId(0), &body, &mut out), Opened::Void));
        let order = opened_under_the_next_key(out);
        assert_eq!(order, [client_op(0, 0), client_op(0, 1)]);
    }
}
