//! Centralized key distribution with a dynamically chosen controller
//! (TISSEC §4.2, Fig. 3 merge, Fig. 4 partition).
//!
//! The group secret is not contributory: the *controller* — the first (oldest)
//! member of the view in view order, which every member knows without
//! communication — picks it and sends it to every other member over a
//! pairwise channel.
//!
//! **Channels.** A channel between the controller C and a member X is an
//! authenticated (the runner signs every message) Diffie-Hellman exchange:
//! C's share g^{r_C} (C keeps r_C while it is controller and reuses it for
//! every channel it sets up) and X's fresh share g^{r_X}; the channel key is
//! k = H(g^{r_C r_X}) (domain `CKD_CHANNEL`) and its id a hash of both shares.
//! A channel stays as long as both ends stay together (the point of CKD: "each
//! such key stays unchanged as long as both parties remain in the group"), and
//! whoever is controller later may use it, whichever end set it up. At every
//! run a member drops its channel with a peer that was not in every view it
//! went through since the last run (`Change::together`, from the views'
//! `ViewMember::prev`): then one of them saw a view the other did not, so
//! both drop it — the rule is symmetric, so both ends always agree on which
//! channels survive.
//!
//! A channel end is *usable* (the controller may send over it) when its owner
//! knows the other end holds the same channel: the controller end once it has
//! received the member's share (the member computed the channel before
//! sending it), the member end once a key message naming it was delivered.
//! A member end that was never confirmed (its run was interrupted) is not
//! used if that member becomes controller; it re-establishes the channel
//! instead. So the controller only ever names channels the member holds, and a
//! mismatch, which a member rejects, never happens in honest runs.
//!
//! **A run** (one per view; the controller decides from its own channel table,
//! the others follow):
//!
//! * If the controller has a usable channel with every other member: it picks
//!   x and broadcasts, for every other member i in view order, (i, channel id,
//!   token_i = g^{x·k_i}) = K_s^{k_i} with K_s = g^x — 1 round (leave,
//!   partition, or any view without newcomers to the controller).
//! * Otherwise (join, merge, a new controller after the old one left or after
//!   a partition, merges of keyed subgroups whose members have channels with
//!   another controller): round 1, the controller broadcasts g^{r_C} and the
//!   list N of members that must (re)establish a channel; round 2, each member
//!   of N picks a fresh r_X, computes its channel and unicasts g^{r_X} to the
//!   controller; round 3, the controller, with every share of N, computes those
//!   channels and broadcasts the key message above.
//! * Every member computes K_s = token_i^{k_i^{-1}} and installs it when the
//!   key message is delivered; the controller installs K_s = g^x when its own
//!   key message comes back (computing g^x only then, in parallel with the
//!   members' decryption).
//! * A member alone installs g^r for a fresh r, without messages.
//!
//! Cascades need nothing special: a new view abandons the run; channels that
//! were completed stay (both ends), half-completed ones are either unusable or
//! re-established, as above. Merges of several subgroups are handled the same
//! way as joins: members without a usable channel with the new controller are
//! in N, whatever subgroup they come from.
//!
//! **Costs.** See the tests at the end of this file for the measured counts
//! and how they compare with Tables I and II of the paper.

use std::collections::{BTreeMap, BTreeSet};

use conclave_gcs::view::MAX_MEMBER_NAME;
use conclave_gcs::MemberId;
use sha2::{Digest, Sha256};
use zeroize::Zeroize;

use super::{get_elem, get_name, put_elem, put_member, MAX_MEMBERS};
use crate::codec::{DecodeError, Reader, Writer};
use crate::domains;
use crate::engine::{Change, Ctx, Error, Misbehaved, Protocol};
use crate::suite::Group;
use crate::ProtocolId;

/// Round 1 (broadcast, controller): g^{r_C} and the members that must set up a channel.
const ROUND_SETUP: u8 = 1;
/// Round 2 (unicast, member of N to the controller): g^{r_X}.
const ROUND_SHARE: u8 = 2;
/// Final round (broadcast, controller): (member, channel id, token) for every other member.
const ROUND_KEY: u8 = 3;

/// Length of a channel id.
const ID_LEN: usize = 32;

/// A channel id: a hash of both public shares (controller's first).
fn channel_id<G: Group>(g: &G, ctrl_share: &G::Element, member_share: &G::Element) -> [u8; ID_LEN] {
    let mut h = Sha256::new();
    h.update(b"conclave/ckd/channel-id");
    h.update(g.encode(ctrl_share));
    h.update(g.encode(member_share));
    h.finalize().into()
}

/// One end of a pairwise channel.
struct Channel<G: Group> {
    id: [u8; ID_LEN],
    /// k = H(g^{r_C r_X}).
    k: G::Scalar,
    /// Whether this end knows that the other end holds the same channel.
    usable: bool,
}

impl<G: Group> Drop for Channel<G> {
    fn drop(&mut self) {
        self.k.zeroize();
    }
}

/// The controller's DH contribution, kept while it stays controller.
struct CtrlShare<G: Group> {
    r: G::Scalar,
    share: G::Element,
}

impl<G: Group> Drop for CtrlShare<G> {
    fn drop(&mut self) {
        self.r.zeroize();
    }
}

/// The state of the run of the current view (abandoned at the next view).
struct Run<G: Group> {
    /// The round-1 message of this view was delivered.
    setup_seen: bool,
    /// Controller: the members of N (asked for a share).
    asked: BTreeSet<MemberId>,
    /// Controller: members of N whose share is still awaited.
    awaiting: BTreeSet<MemberId>,
    /// Controller: the exponent x of K_s = g^x, kept until the key message comes back.
    x: Option<G::Scalar>,
    /// Controller: the key message was sent.
    key_sent: bool,
    /// The key of this view was installed.
    done: bool,
}

impl<G: Group> Run<G> {
    fn new() -> Self {
        Self {
            setup_seen: false,
            asked: BTreeSet::new(),
            awaiting: BTreeSet::new(),
            x: None,
            key_sent: false,
            done: false,
        }
    }
}

impl<G: Group> Drop for Run<G> {
    fn drop(&mut self) {
        if let Some(x) = self.x.as_mut() {
            x.zeroize();
        }
    }
}

/// One member's CKD state.
pub struct Ckd<G: Group> {
    /// Persistent: my end of each channel, by peer.
    channels: BTreeMap<MemberId, Channel<G>>,
    /// Persistent while I am controller: r_C and g^{r_C}.
    ctrl: Option<CtrlShare<G>>,
    /// The current run.
    run: Run<G>,
}

/// A decoded round-1 body.
struct Setup<'a, G: Group> {
    ctrl_share: G::Element,
    /// The names as they came: each is looked up in the view, and a name
    /// that is not a member's is refused there (n names per member and run:
    /// allocating each was a fifth of a CKD leave's CPU at 512 members).
    list: Vec<&'a str>,
}

/// A decoded key message body: the tokens as they came, each of the
/// element length. A member decodes (and validates) only its own: decoding
/// all n was O(n) point decompressions (MODP: subgroup checks, each an
/// exponentiation) per member, O(n²) per run. The names too are as they
/// came, compared with the view's.
struct KeyMsg<'a> {
    entries: Vec<(&'a [u8], [u8; ID_LEN], &'a [u8])>,
}

impl<G: Group> Ckd<G> {
    fn controller<'a>(cx: &'a Ctx<'_, G>) -> &'a MemberId {
        &cx.view.members[0].id
    }

    fn decode_setup<'a>(g: &G, body: &'a [u8]) -> Result<Setup<'a, G>, Error> {
        let mut r = Reader::new(body);
        let ctrl_share = get_elem(&mut r, g)?;
        let n = r.count(MAX_MEMBERS, 2, "CKD setup list")?;
        let mut list = Vec::with_capacity(n);
        for _ in 0..n {
            list.push(get_name(&mut r)?);
        }
        r.finish()?;
        Ok(Setup { ctrl_share, list })
    }

    fn decode_key<'a>(g: &G, body: &'a [u8]) -> Result<KeyMsg<'a>, Error> {
        let mut r = Reader::new(body);
        let n = r.count(MAX_MEMBERS, 2 + ID_LEN + g.element_len(), "CKD key list")?;
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let m = r.short_bytes(MAX_MEMBER_NAME, "member name")?;
            let mut id = [0u8; ID_LEN];
            id.copy_from_slice(r.bytes(ID_LEN, "CKD channel id")?);
            let token = r.bytes(g.element_len(), "group element")?;
            entries.push((m, id, token));
        }
        r.finish()?;
        Ok(KeyMsg { entries })
    }

    /// Controller: picks x and broadcasts the tokens g^{x k_i}.
    fn send_key(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let mut w = Writer::new();
        let others: Vec<MemberId> = cx.view.ids().skip(1).cloned().collect();
        w.count(others.len());
        let x = cx.random();
        for m in &others {
            let Some(ch) = self.channels.get(m).filter(|c| c.usable) else {
                // Unreachable by construction (we only get here with usable channels).
                return Err(Error::Internal("CKD controller lacks a channel"));
            };
            let mut e = cx.g.scalar_mul(&x, &ch.k);
            let token = cx.exp_g(&e);
            e.zeroize();
            put_member(&mut w, m);
            w.raw(&ch.id);
            put_elem(&mut w, cx.g, &token);
        }
        self.run.x = Some(x);
        self.run.key_sent = true;
        cx.broadcast(ROUND_KEY, w.buf);
        Ok(())
    }

    fn on_setup(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let setup = Self::decode_setup(cx.g, body)?;
        let ctrl = Self::controller(cx).clone();
        if *from != ctrl {
            return Err(Misbehaved::NotController { round: ROUND_SETUP }.by(from));
        }
        if self.run.setup_seen {
            return Err(Misbehaved::Duplicate { round: ROUND_SETUP }.by(from));
        }
        // N: non-empty, members of the view other than the controller, in view order.
        if setup.list.is_empty() {
            return Err(Misbehaved::WrongShape { round: ROUND_SETUP }.by(from));
        }
        let mut last = 0usize;
        for &m in &setup.list {
            match cx.position(m) {
                Some(p) if p > last => last = p,
                _ => return Err(Misbehaved::WrongShape { round: ROUND_SETUP }.by(from)),
            }
        }
        if from == cx.me {
            // Our own round 1 back: the shares are what we wait for.
            if self.ctrl.as_ref().map(|c| &c.share) != Some(&setup.ctrl_share) {
                return Err(Error::Internal("CKD setup share is not ours"));
            }
            self.run.setup_seen = true;
            return Ok(());
        }
        self.run.setup_seen = true;
        if !setup.list.contains(&cx.me.as_str()) {
            return Ok(());
        }
        // Set up (or replace) my channel with the controller.
        let mut r = cx.random();
        let share = cx.exp_g(&r);
        let mut secret = cx.exp(&setup.ctrl_share, &r);
        r.zeroize();
        let k = cx.g.hash_to_scalar(domains::CKD_CHANNEL, &secret);
        secret.zeroize();
        let id = channel_id(cx.g, &setup.ctrl_share, &share);
        self.channels.insert(ctrl.clone(), Channel { id, k, usable: false });
        let mut w = Writer::new();
        put_elem(&mut w, cx.g, &share);
        cx.unicast(&ctrl, ROUND_SHARE, w.buf);
        Ok(())
    }

    fn on_share(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let mut rd = Reader::new(body);
        let share = get_elem(&mut rd, cx.g)?;
        rd.finish()?;
        if Self::controller(cx) != cx.me {
            return Err(Misbehaved::WrongRecipient { round: ROUND_SHARE }.by(from));
        }
        if !self.run.asked.contains(from) {
            return Err(Misbehaved::Unsolicited { round: ROUND_SHARE }.by(from));
        }
        // Once the key is sent every asked member has answered.
        if self.run.key_sent || !self.run.awaiting.contains(from) {
            return Err(Misbehaved::Duplicate { round: ROUND_SHARE }.by(from));
        }
        let Some(ctrl) = self.ctrl.as_ref() else {
            return Err(Error::Internal("CKD controller without its share"));
        };
        let mut secret = cx.exp(&share, &ctrl.r);
        let ctrl_share = ctrl.share.clone();
        let k = cx.g.hash_to_scalar(domains::CKD_CHANNEL, &secret);
        secret.zeroize();
        let id = channel_id(cx.g, &ctrl_share, &share);
        self.channels.insert(from.clone(), Channel { id, k, usable: true });
        self.run.awaiting.remove(from);
        if self.run.awaiting.is_empty() {
            self.send_key(cx)?;
        }
        Ok(())
    }

    fn on_key(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let msg = Self::decode_key(cx.g, body)?;
        let ctrl = Self::controller(cx).clone();
        if *from != ctrl {
            return Err(Misbehaved::NotController { round: ROUND_KEY }.by(from));
        }
        if self.run.done {
            return Err(Misbehaved::Duplicate { round: ROUND_KEY }.by(from));
        }
        // One entry per other member, in view order. Each member checks the
        // count and its own entry's name (n names compared by every member
        // were n² per run); the others' entries are theirs to check.
        let pos = cx.position(cx.me).ok_or(Error::BadView("not a member"))?;
        let me = cx.me.as_str().as_bytes();
        if msg.entries.len() + 1 != cx.view.members.len() || (pos > 0 && msg.entries[pos - 1].0 != me) {
            return Err(Misbehaved::WrongShape { round: ROUND_KEY }.by(from));
        }
        if from == cx.me {
            let Some(mut x) = self.run.x.take() else {
                return Err(Error::Internal("CKD key message we did not send"));
            };
            let mut ks = cx.exp_g(&x);
            x.zeroize();
            self.run.done = true;
            cx.install(&ks);
            ks.zeroize();
            return Ok(());
        }
        let Some((_, id, token)) = pos.checked_sub(1).map(|i| &msg.entries[i]) else {
            // Unreachable: the controller is at position 0 and is `from`.
            return Err(Error::Internal("CKD key message to its controller"));
        };
        let Some(ch) = self.channels.get_mut(&ctrl).filter(|c| c.id == *id) else {
            return Err(Misbehaved::Inconsistent { round: ROUND_KEY }.by(from));
        };
        let token = cx.g.decode(token)?;
        let mut inv = cx.g.scalar_invert(&ch.k);
        ch.usable = true;
        let mut ks = cx.exp(&token, &inv);
        inv.zeroize();
        self.run.done = true;
        cx.install(&ks);
        ks.zeroize();
        Ok(())
    }
}

impl<G: Group> Protocol<G> for Ckd<G> {
    const ID: ProtocolId = ProtocolId::Ckd;

    fn new() -> Self {
        Self { channels: BTreeMap::new(), ctrl: None, run: Run::new() }
    }

    fn reset(&mut self) {
        *self = Self::new();
    }

    fn on_view(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        self.run = Run::new();
        // Keep a channel only with peers that went through the same views as
        // me since the last run (a rule both ends apply alike).
        self.channels.retain(|peer, _| change.together.contains(cx, peer));
        let ctrl = Self::controller(cx).clone();
        if ctrl != *cx.me {
            self.ctrl = None;
        }
        if cx.view.members.len() == 1 {
            let mut r = cx.random();
            let mut k = cx.exp_g(&r);
            r.zeroize();
            self.run.done = true;
            cx.install(&k);
            k.zeroize();
            return Ok(());
        }
        if ctrl != *cx.me {
            return Ok(());
        }
        let need: Vec<MemberId> =
            cx.view.ids().skip(1).filter(|m| !self.channels.get(*m).is_some_and(|c| c.usable)).cloned().collect();
        if need.is_empty() {
            return self.send_key(cx);
        }
        if self.ctrl.is_none() {
            let r = cx.random();
            let share = cx.exp_g(&r);
            self.ctrl = Some(CtrlShare { r, share });
        }
        let share = self.ctrl.as_ref().map(|c| c.share.clone()).expect("just set");
        let mut w = Writer::new();
        put_elem(&mut w, cx.g, &share);
        w.count(need.len());
        for m in &need {
            put_member(&mut w, m);
        }
        self.run.asked = need.into_iter().collect();
        self.run.awaiting = self.run.asked.clone();
        cx.broadcast(ROUND_SETUP, w.buf);
        Ok(())
    }

    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error> {
        match round {
            ROUND_SETUP => self.on_setup(cx, from, body),
            ROUND_SHARE => self.on_share(cx, from, body),
            ROUND_KEY => self.on_key(cx, from, body),
            _ => Err(Misbehaved::UnknownRound { round }.by(from)),
        }
    }

    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        let mut s: Vec<G::Scalar> = self.channels.values().map(|c| c.k.clone()).collect();
        s.extend(self.ctrl.as_ref().map(|c| c.r.clone()));
        s.extend(self.run.x.clone());
        (s, Vec::new())
    }

    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error> {
        match round {
            ROUND_SETUP => Ok(vec![Self::decode_setup(g, body)?.ctrl_share]),
            ROUND_SHARE => {
                let mut r = Reader::new(body);
                let e = get_elem(&mut r, g)?;
                r.finish()?;
                Ok(vec![e])
            }
            ROUND_KEY => Self::decode_key(g, body)?.entries.into_iter().map(|(_, _, t)| Ok(g.decode(t)?)).collect(),
            _ => Err(Error::Decode(DecodeError::Bad("unknown CKD round"))),
        }
    }
}

#[cfg(test)]
mod tests {
    //! Costs against Tables I and II, and rejection of bad messages.
    //!
    //! How the measured counts differ from the paper's CKD rows (n = group size
    //! before the event, m = merging members, p = leaving members):
    //!
    //! * Exponentiations, serial (critical path as the harness measures it):
    //!   - leave n−1 (paper n−2) and partition n−p (paper n−p−1): the controller's
    //!     n−2 (n−p−1) tokens, plus 1 for the final step, when every member
    //!     decrypts K_s = token^{1/k} and, in parallel, the controller computes
    //!     K_s = g^x. The paper counts only the controller's tokens (as if K_s
    //!     were free and the decryption not on the path).
    //!   - join n+4 (paper n+2), merge n+2m+2 (paper n+2m): the new member's
    //!     share g^{r_X} (1) and its channel secret (g^{r_C})^{r_X} (1, the paper
    //!     leaves this one out), the controller's m channel secrets (received one
    //!     after the other: m on the path) and n+m−1 tokens, then the final
    //!     decryption (1, left out by the paper). The controller's g^{r_C} is
    //!     free here as in the paper: it was computed when it became controller
    //!     and is reused.
    //!   - controller leaves 2n (paper 2n−3): the new controller has no channel
    //!     and no r_C: g^{r_C} (1), a member's share and channel secret (2), n−2
    //!     channel secrets, n−2 tokens, the final decryption (1). The paper's
    //!     2n−3 is 1 + (n−2) + (n−2): it leaves out the member's two
    //!     exponentiations and the decryption.
    //! * Signatures, serial: 3 for every 3-round run (round 1, a share, the key
    //!   message) and 1 for a 1-round run; the paper's "2n−2 (?)" for a controller
    //!   change is the controller's plus the members' total, not a serial count.
    //! * Verifications, serial: exactly the paper's (3, 1, m+2, 1, n): a member
    //!   verifies round 1, the controller the m shares one after the other, a
    //!   member the key message. Own messages are free.
    //! * Messages: exactly Table I; for a controller change n (= 2 broadcasts +
    //!   n−2 unicasts), where the garbled Table I reads "3n−6 2n−4".
    use conclave_gcs::sim::Flush;
    use conclave_gcs::MemberId;

    use super::{ID_LEN, ROUND_KEY, ROUND_SETUP, ROUND_SHARE};
    use crate::codec::{Reader, Writer};
    use crate::engine::{Error, Misbehaved};
    use crate::harness::{EventCost, Harness};
    use crate::protocols::testnet::{id, Net, Packet};
    use crate::suite::{GroupId, SignatureId};
    use crate::ProtocolId;

    #[derive(Debug, PartialEq, Eq)]
    struct Expect {
        rounds: u64,
        unicasts: u64,
        broadcasts: u64,
        exps: u64,
        sigs: u64,
        verifs: u64,
    }

    fn got(c: EventCost) -> Expect {
        Expect {
            rounds: c.rounds,
            unicasts: c.total.unicasts,
            broadcasts: c.total.broadcasts,
            exps: c.serial.exps,
            sigs: c.serial.sigs,
            verifs: c.serial.verifs,
        }
    }

    fn ok(h: &Harness) {
        assert!(h.errors().is_empty(), "{:?}", h.errors());
        h.check_agreement().unwrap();
    }

    /// A harness with `total` members of which the first `n` form a keyed group.
    fn keyed_group(n: usize, total: usize) -> (Harness, Vec<MemberId>) {
        let mut h = Harness::new(ProtocolId::Ckd, GroupId::Ristretto255, SignatureId::Ed25519, 11, Flush::All);
        let ids = h.add_members(total).unwrap();
        let c = h.event(|s| s.join(&ids[..n], None)).unwrap();
        ok(&h);
        if n > 1 {
            // Forming a group is a controller change without a previous controller.
            let e = Expect {
                rounds: 3,
                unicasts: n as u64 - 1,
                broadcasts: 2,
                exps: 2 * n as u64 + 2,
                sigs: 3,
                verifs: n as u64 + 1,
            };
            assert_eq!(got(c), e, "form {n}");
        }
        (h, ids)
    }

    const SIZES: [u64; 4] = [2, 5, 8, 13];

    #[test]
    fn join_and_merge_of_fresh_members() {
        for n in SIZES {
            for m in [1u64, 3] {
                let (mut h, ids) = keyed_group(n as usize, n as usize + m as usize);
                let c = h.event(|s| s.join(&ids[n as usize..], Some(&ids[0]))).unwrap();
                ok(&h);
                // Table I/II join: 3 rounds, 3 messages (1 unicast), n+2 exps, 3 sigs, 3 verifs;
                // merge: 3 rounds, m+2 messages (m unicasts), n+2m exps, 3 sigs, m+2 verifs.
                // Exps differ by +2 (see the module doc).
                let e = Expect { rounds: 3, unicasts: m, broadcasts: 2, exps: n + 2 * m + 2, sigs: 3, verifs: m + 2 };
                assert_eq!(got(c), e, "n = {n}, m = {m}");
            }
        }
    }

    #[test]
    fn merge_of_two_keyed_groups() {
        for n in SIZES {
            let m = 3u64;
            // The bigger group is older: its controller stays controller. The
            // merging members hold channels with their own (former) controller,
            // not with this one, so they are in N exactly like fresh members
            // and the costs are those of a merge of m fresh members. What
            // differs: they keep their channels with the former controller (it
            // is still with them), which will be used if that one becomes
            // controller while they are together, and the former controller
            // drops its r_C.
            let (mut h, ids) = keyed_group(n as usize, (n + m) as usize);
            h.event(|s| s.join(&ids[n as usize..], None)).unwrap();
            ok(&h);
            let c = h.event(|s| s.merge(&ids[0], &ids[n as usize])).unwrap();
            ok(&h);
            let e = Expect { rounds: 3, unicasts: m, broadcasts: 2, exps: n + 2 * m + 2, sigs: 3, verifs: m + 2 };
            assert_eq!(got(c), e, "n = {n}, m = {m}");

            // The smaller group is older: its controller becomes controller and
            // all n members of the other group set up channels with it (a merge
            // with the roles of n and m swapped: 2n+m+2 exps, n+2 verifs).
            let mut h = Harness::new(ProtocolId::Ckd, GroupId::Ristretto255, SignatureId::Ed25519, 5, Flush::All);
            let ids = h.add_members((n + m) as usize).unwrap();
            h.event(|s| s.join(&ids[..m as usize], None)).unwrap();
            h.event(|s| s.join(&ids[m as usize..], None)).unwrap();
            ok(&h);
            let c = h.event(|s| s.merge(&ids[m as usize], &ids[0])).unwrap();
            ok(&h);
            let e = Expect { rounds: 3, unicasts: n, broadcasts: 2, exps: 2 * n + m + 2, sigs: 3, verifs: n + 2 };
            assert_eq!(got(c), e, "n = {n}, m = {m}, older small group");
        }
    }

    #[test]
    fn leave_and_partition_without_the_controller() {
        for n in SIZES {
            for p in [1u64, 3] {
                if p >= n {
                    continue;
                }
                let (mut h, ids) = keyed_group(n as usize, n as usize);
                // p members other than the controller leave (the remaining
                // group sees the same view as in a partition).
                let gone: Vec<MemberId> = (0..p).map(|i| ids[(1 + i * (n - 1) / p) as usize].clone()).collect();
                let c = h.event(|s| s.leave(&gone)).unwrap();
                ok(&h);
                let e = if n - p == 1 {
                    // Alone: a fresh key, no messages.
                    Expect { rounds: 0, unicasts: 0, broadcasts: 0, exps: 1, sigs: 0, verifs: 0 }
                } else {
                    // Table: 1 round, 1 broadcast, n−p−1 exps, 1 sig, 1 verif (exps +1).
                    Expect { rounds: 1, unicasts: 0, broadcasts: 1, exps: n - p, sigs: 1, verifs: 1 }
                };
                assert_eq!(got(c), e, "n = {n}, p = {p}");
            }
        }
    }

    #[test]
    fn network_partition_costs_the_side_without_the_controller_a_new_controller() {
        // As the paper observes (§6.1.5), a real partition costs more than its
        // Table II row: the side without the controller elects a new one, which
        // sets up channels with the others. Here the p = 3 side does that.
        for n in [5u64, 8, 13] {
            let p = 3u64;
            let (mut h, ids) = keyed_group(n as usize, n as usize);
            let split = (n - p) as usize;
            let c = h.event(|s| s.partition(vec![ids[..split].to_vec(), ids[split..].to_vec()])).unwrap();
            ok(&h);
            // Controller side: 1 broadcast, n−p exps. New side: a controller
            // change among p members: 2 broadcasts, p−1 unicasts, 2p+2 = 8 exps.
            let e = Expect {
                rounds: 3,
                unicasts: p - 1,
                broadcasts: 3,
                exps: (n - p).max(2 * p + 2),
                sigs: 3,
                verifs: p + 1,
            };
            assert_eq!(got(c), e, "n = {n}, p = {p}");
        }
    }

    #[test]
    fn controller_leaves() {
        for n in SIZES {
            let (mut h, ids) = keyed_group(n as usize, n as usize);
            let c = h.event(|s| s.leave(&ids[..1])).unwrap();
            ok(&h);
            let e = if n == 2 {
                Expect { rounds: 0, unicasts: 0, broadcasts: 0, exps: 1, sigs: 0, verifs: 0 }
            } else {
                // Table: 3 rounds, n messages (n−2 unicasts, 2 broadcasts),
                // 2n−3 exps, "2n−2" sigs, n verifs.
                Expect { rounds: 3, unicasts: n - 2, broadcasts: 2, exps: 2 * n, sigs: 3, verifs: n }
            };
            assert_eq!(got(c), e, "n = {n}");
        }
    }

    #[test]
    fn channels_persist_until_a_controller_change() {
        let (mut h, ids) = keyed_group(6, 8);
        // A join, then leaves and a rekey without newcomers: only the join sets up a channel.
        let c = h.event(|s| s.join(&ids[6..7], Some(&ids[0]))).unwrap();
        assert_eq!(c.total.unicasts, 1);
        let c = h.event(|s| s.leave(&ids[3..4])).unwrap();
        assert_eq!((c.rounds, c.total.unicasts), (1, 0));
        ok(&h);
        // A second group merges in, then the original controller leaves: the
        // next oldest member has channels with nobody and sets them all up.
        h.event(|s| s.join(&ids[7..8], None)).unwrap();
        h.event(|s| s.merge(&ids[0], &ids[7])).unwrap();
        ok(&h);
        let c = h.event(|s| s.leave(&ids[..1])).unwrap();
        ok(&h);
        assert_eq!((c.rounds, c.total.unicasts), (3, 5));
        // And then it is the controller with channels to everybody.
        let c = h.event(|s| s.leave(&ids[7..8])).unwrap();
        ok(&h);
        assert_eq!((c.rounds, c.total.unicasts), (1, 0));
    }

    /// Re-encodes a key message body with the entries transformed by `f`.
    fn rewrite_key(body: &[u8], f: impl FnOnce(&mut Vec<(Vec<u8>, [u8; ID_LEN], Vec<u8>)>)) -> Vec<u8> {
        let mut r = Reader::new(body);
        let n = r.count(100, 1, "n").unwrap();
        let mut entries = Vec::new();
        for _ in 0..n {
            let name = r.short_bytes(255, "m").unwrap().to_vec();
            let mut id = [0u8; ID_LEN];
            id.copy_from_slice(r.bytes(ID_LEN, "id").unwrap());
            let t = r.bytes(32, "t").unwrap().to_vec();
            entries.push((name, id, t));
        }
        f(&mut entries);
        let mut w = Writer::new();
        w.count(entries.len());
        for (name, id, t) in &entries {
            w.short_bytes(name).raw(id).raw(t);
        }
        w.buf
    }

    #[test]
    fn bad_messages_are_rejected_without_changing_state() {
        let mut net = Net::new(ProtocolId::Ckd, &["a", "b", "c", "d"], 3);
        // View 1: a, b, c, all fresh. a is the controller: round 1 lists b and c.
        net.view(1, &["a", "b", "c"], &["a", "b", "c"]);
        assert_eq!(net.queue.len(), 1);
        let setup = net.queue[0].clone();
        let setup_body = setup.body();
        assert_eq!(setup.round, ROUND_SETUP);
        // Only the controller may send round 1.
        let forged = net.forge("b", None, ROUND_SETUP, setup_body.clone());
        assert_eq!(net.refuse("c", &forged), Misbehaved::NotController { round: ROUND_SETUP }.by(&id("b")));
        // Malformed bodies.
        let mut trailing = setup_body.clone();
        trailing.push(0);
        for bad in [setup_body[..10].to_vec(), trailing, vec![0xff; setup_body.len()]] {
            net.reject("c", "a", None, ROUND_SETUP, bad);
        }
        // A list naming the controller or a non-member.
        let mut w = Writer::new();
        w.raw(&setup_body[..32]).count(1).short_bytes(b"a");
        assert_eq!(
            net.reject("c", "a", None, ROUND_SETUP, w.buf),
            Misbehaved::WrongShape { round: ROUND_SETUP }.by(&id("a"))
        );
        let mut w = Writer::new();
        w.raw(&setup_body[..32]).count(1).short_bytes(b"zz");
        assert_eq!(
            net.reject("c", "a", None, ROUND_SETUP, w.buf),
            Misbehaved::WrongShape { round: ROUND_SETUP }.by(&id("a"))
        );
        let mut w = Writer::new();
        w.raw(&setup_body[..32]).count(0);
        assert_eq!(
            net.reject("c", "a", None, ROUND_SETUP, w.buf),
            Misbehaved::WrongShape { round: ROUND_SETUP }.by(&id("a"))
        );

        net.step();
        let shares: Vec<Packet> = net.queue.iter().cloned().collect();
        assert_eq!(shares.len(), 2);
        assert!(shares.iter().all(|s| s.to == Some(id("a"))));
        // A second round 1 in the same view is refused.
        let again = net.forge("a", None, ROUND_SETUP, setup_body.clone());
        assert_eq!(net.refuse("b", &again), Misbehaved::Duplicate { round: ROUND_SETUP }.by(&id("a")));
        // A share sent to a non-controller is refused.
        let share_body = shares[0].body();
        assert_eq!(
            net.reject("c", "b", Some("c"), ROUND_SHARE, share_body.clone()),
            Misbehaved::WrongRecipient { round: ROUND_SHARE }.by(&id("b"))
        );
        // First share accepted, a second share from the same member refused.
        assert_eq!(net.step().as_ref(), Some(&shares[0]));
        assert!(net.queue.len() == 1, "nothing sent on the first share");
        let m = net.forge("b", Some("a"), ROUND_SHARE, share_body.clone());
        assert_eq!(net.refuse("a", &m), Misbehaved::Duplicate { round: ROUND_SHARE }.by(&id("b")));
        assert_eq!(net.step().as_ref(), Some(&shares[1]));
        assert_eq!(net.queue.len(), 1);
        let key = net.queue[0].clone();
        let key_body = key.body();
        assert_eq!(key.round, ROUND_KEY);

        // Key messages: only from the controller, listing exactly the others in
        // view order, naming channels the members hold.
        assert_eq!(
            net.reject("c", "b", None, ROUND_KEY, key_body.clone()),
            Misbehaved::NotController { round: ROUND_KEY }.by(&id("b"))
        );
        let variants = [
            rewrite_key(&key_body, |e| {
                e.pop();
            }),
            rewrite_key(&key_body, |e| e.swap(0, 1)),
            rewrite_key(&key_body, |e| {
                let x = e[0].clone();
                e.push(x)
            }),
            rewrite_key(&key_body, |e| e[0].0 = b"d".to_vec()),
            rewrite_key(&key_body, |e| e[0].1[0] ^= 1),
        ];
        let (shape, channel) =
            (Misbehaved::WrongShape { round: ROUND_KEY }, Misbehaved::Inconsistent { round: ROUND_KEY });
        for (i, (v, what)) in variants.into_iter().zip([shape, shape, shape, shape, channel]).enumerate() {
            let e = net.reject("b", "a", None, ROUND_KEY, v);
            assert_eq!(e, what.by(&id("a")), "variant {i}");
        }
        // Each member checks the count and its own entry: c refuses a list
        // whose entry for c names another member.
        let v = rewrite_key(&key_body, |e| e[1].0 = b"d".to_vec());
        assert_eq!(net.reject("c", "a", None, ROUND_KEY, v), shape.by(&id("a")));
        let e = net.reject("b", "a", None, ROUND_KEY, key_body[..key_body.len() - 1].to_vec());
        assert!(matches!(e, Error::Decode(_)), "{e:?}");
        // A member decodes its own token only: b refuses a list whose token
        // for b is no element.
        let bad_token = rewrite_key(&key_body, |e| e[0].2 = vec![0xff; e[0].2.len()]);
        let e = net.reject("b", "a", None, ROUND_KEY, bad_token);
        assert!(matches!(e, Error::Crypto(_)), "{e:?}");
        assert!(net.key("b").is_none());
        // The honest key message still works everywhere.
        net.run();
        net.agreed();
        // A second key message in the view is refused.
        let m = net.forge("a", None, ROUND_KEY, key_body.clone());
        assert_eq!(net.offer("b", &m).unwrap_err(), Misbehaved::Duplicate { round: ROUND_KEY }.by(&id("a")));
        assert_eq!(net.refuse("c", &m), Misbehaved::Duplicate { round: ROUND_KEY }.by(&id("a")));
        let m = net.forge("c", None, 9, Vec::new());
        assert_eq!(net.refuse("a", &m), Misbehaved::UnknownRound { round: 9 }.by(&id("c")));

        // View 2: d joins; only d is in N. A share from a member outside N is refused.
        net.view(2, &["a", "b", "c", "d"], &["d"]);
        assert_eq!(net.queue.len(), 1);
        assert_eq!(
            net.reject("a", "b", Some("a"), ROUND_SHARE, share_body),
            Misbehaved::Unsolicited { round: ROUND_SHARE }.by(&id("b"))
        );
        net.run();
        net.agreed();

        // View 3: b and c come from another view than a (say they saw a view
        // without it): every channel with them is dropped at both ends and set
        // up again; d, from the same view as a, keeps its channel.
        net.install(3, &[("a", Some(2)), ("b", Some(99)), ("c", Some(99)), ("d", Some(2))]);
        let b = net.queue[0].body();
        let mut r = Reader::new(&b);
        r.bytes(32, "share").unwrap();
        assert_eq!(r.count(10, 1, "n").unwrap(), 2);
        net.run();
        net.agreed();
    }
}
