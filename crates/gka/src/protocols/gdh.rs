//! Group Diffie-Hellman (TISSEC §4.1, Fig. 1 merge, Fig. 2 partition).
//!
//! The group secret is K = g^{r_1 r_2 ··· r_n}, one contribution r_i per
//! member. After every install each member keeps (`Saved`) its contribution,
//! the broadcast list of partial keys S = {M_j -> K^{1/r_j}} and K itself;
//! everything a run builds is kept apart (`Run`) and only replaces the saved
//! state when the run's key is installed, so an abandoned run (a cascaded
//! view) leaves the last secure state intact.
//!
//! * Leave / partition / rekey (`Change::single`: every member shares my
//!   state). The controller is the last member of the view (the most recent
//!   one). From the stored list it picks a fresh r'_d, refreshes every other
//!   remaining member's partial key as S_j^{r'_d / r_d} and keeps its own
//!   (S_d does not contain r_d), and broadcasts the list (round 4). Everybody,
//!   the controller on self-delivery, computes K' = S'_i^{r_i} and installs.
//!   The leavers' partial keys are simply not in the list.
//! * Merge / join (several subgroups). The *old* group is the subgroup of the
//!   first member of the view; every other member (fresh members, and members
//!   of other keyed subgroups, whose old state is replaced at install) is a
//!   *new* member, and the new members in view order form the *chain*. The
//!   first member picks a fresh r'_1 and unicasts the token S_1^{r'_1} (g^{r'_1}
//!   if it has nobody of its old group with it) with the chain list to the
//!   first chain member (round 1). Each chain member but the last adds a fresh
//!   contribution and forwards the token to the next (round 1); the last one
//!   broadcasts it without adding anything (round 2). Every member but the last
//!   factors its contribution out (r'_1 for the first member, the stored r_i
//!   for the other old members, the fresh ones for chain members) and unicasts
//!   the result to the last chain member (round 3), the new controller, which
//!   raises each of them to its fresh contribution as they arrive and
//!   broadcasts the list of partial keys (round 4), its own being the token.
//!   Everybody computes K = S_i^{r_i} on delivery and installs.
//! * A member alone installs g^r for a fresh r, without messages.
//!
//! Costs (n = size before, m = merging, p = leaving members; tests below):
//! exactly the GDH rows of Tables I and II for join (m = 1), merge, leave
//! and p members leaving together. Differences: a member left alone installs
//! without any message (leave from n = 2: 0 messages, 1 exp); a network
//! partition rekeys every component, so the event counts one broadcast per
//! component and its critical path is the largest component's (max(n-p, p)
//! exps); forming a group of k fresh members is a merge into the first
//! member's stateless subgroup (n = 1, m = k-1); a keyed subgroup merging in
//! costs the same as individuals (its members join the chain), and which side
//! is "old" follows view order (the oldest member's subgroup), not size.
//!
//! Old members know the chain (the view minus their subgroup); new members
//! learn it from the token, whose sender must be their predecessor in it (the
//! first member for the first chain member). Every message is checked against
//! the role of its sender and the state of the run before anything changes.

use std::collections::BTreeMap;

use conclave_gcs::view::MAX_MEMBER_NAME;
use conclave_gcs::{MemberId, MemberMap, Members, View};
use zeroize::Zeroize;

use super::{get_elem, get_member, put_elem, put_member, MAX_MEMBERS};
use crate::codec::{DecodeError, Reader, Writer};
use crate::engine::{Change, Ctx, Error, Misbehaved, Protocol};
use crate::suite::Group;
use crate::ProtocolId;

/// Merge: the accumulating token, unicast along the chain, with the chain.
const ROUND_TOKEN: u8 = 1;
/// Merge: the complete token, broadcast by the last chain member.
const ROUND_BCAST: u8 = 2;
/// Merge: a factor-out token, unicast to the new controller.
const ROUND_FACTOR: u8 = 3;
/// The list of partial keys, broadcast by the controller (final message).
const ROUND_LIST: u8 = 4;

/// What the last install left: the member's persistent GDH state.
struct Saved<G: Group> {
    /// My contribution r_i.
    r: G::Scalar,
    /// The broadcast partial keys K^{1/r_j}, one per member of the secure view
    /// (empty after a lone install), as the list carried them: a member
    /// decodes (and validates) only the elements it uses — its own when the
    /// list arrives, all of them only as the controller of a later refresh.
    /// Decoding every element of every list was O(n) point decompressions
    /// (MODP: subgroup checks, each an exponentiation) per member and run.
    partials: Partials,
    /// Whether I sent that list (as controller): its elements are then all
    /// mine, raised from checked elements (or my own entry, checked when I
    /// used it), so a refresh raises them without checking each again — for
    /// MODP n subgroup checks, each an exponentiation, on the controller's
    /// critical path at every leave.
    sent_by_me: bool,
    /// The group secret K.
    key: G::Element,
}

/// Decodes a partial key of a list: checked, unless the list is one I sent
/// (its elements I made from checked ones).
fn decode_partial<G: Group>(g: &G, bytes: &[u8], sent_by_me: bool) -> Result<G::Element, crate::suite::CryptoError> {
    if sent_by_me {
        g.decode_unchecked(bytes)
    } else {
        g.decode(bytes)
    }
}

/// A list of partial keys as it came: (name, encoded element) pairs.
type RawList<'a> = Vec<(&'a [u8], &'a [u8])>;

/// The partial keys of the last list, as it carried them: its members (the
/// view's own names, shared, in view order) and their encoded elements, one
/// after another. Kept in list order, not in a map keyed by name: a member
/// stores every list and uses one element of it, so n insertions per member
/// and run would be most of a large group's leave.
#[derive(Default)]
struct Partials {
    members: Members,
    elems: Vec<u8>,
}

impl Partials {
    /// The element of the `i`-th member of the list.
    fn elem(&self, i: usize) -> &[u8] {
        let len = self.elems.len() / self.members.len();
        &self.elems[i * len..(i + 1) * len]
    }

    /// The element of `m`, if the list has it.
    fn get(&self, m: &MemberId) -> Option<&[u8]> {
        self.members.iter().position(|x| x == m).map(|i| self.elem(i))
    }

    /// For each member of `view`, the place of its element in the list, if
    /// every one has one. Views keep their members' order, so one walk along
    /// the list finds them; a map of the list's names serves any other order.
    fn places(&self, view: &View) -> Option<Vec<usize>> {
        let mut places = Vec::with_capacity(view.members.len());
        let mut j = 0;
        for m in view.ids() {
            while j < self.members.len() && &self.members[j] != m {
                j += 1;
            }
            if j == self.members.len() {
                let index: MemberMap<usize> = self.members.iter().cloned().zip(0..).collect();
                return view.ids().map(|m| index.get(m).copied()).collect();
            }
            places.push(j);
            j += 1;
        }
        Some(places)
    }
}

impl<G: Group> Drop for Saved<G> {
    fn drop(&mut self) {
        self.r.zeroize();
        self.key.zeroize();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// No run (finished, or not started).
    Idle,
    /// Leave / partition / rekey: one list from the last member.
    Refresh,
    /// Merge / join: the token chain, factor-outs, then the list.
    Merge,
}

/// The state of the run for the current view.
struct Run<G: Group> {
    mode: Mode,
    /// Merge: the members of my subgroup.
    mine: Members,
    /// Merge: whether I belong to the old group (the first member's subgroup).
    old: bool,
    /// Merge: the new members in view order, once known.
    chain: Option<Vec<MemberId>>,
    /// Who broadcasts the list, once known.
    controller: Option<MemberId>,
    /// My contribution in this run, once chosen.
    contrib: Option<G::Scalar>,
    /// Merge, new member: the token reached me.
    got_token: bool,
    /// Merge, controller: the token I broadcast (my partial key).
    token: Option<G::Element>,
    /// Merge: the broadcast token was delivered.
    got_bcast: bool,
    /// Merge: I sent my factor-out token.
    sent_factor: bool,
    /// Merge, controller: partial keys computed from the factor-out tokens.
    partials: BTreeMap<MemberId, G::Element>,
    /// Controller: the list is sent.
    list_sent: bool,
}

impl<G: Group> Run<G> {
    fn idle() -> Self {
        Self {
            mode: Mode::Idle,
            mine: Members::default(),
            old: false,
            chain: None,
            controller: None,
            contrib: None,
            got_token: false,
            token: None,
            got_bcast: false,
            sent_factor: false,
            partials: BTreeMap::new(),
            list_sent: false,
        }
    }
}

impl<G: Group> Drop for Run<G> {
    fn drop(&mut self) {
        if let Some(c) = self.contrib.as_mut() {
            c.zeroize();
        }
    }
}

/// One member's GDH state.
pub struct Gdh<G: Group> {
    saved: Option<Saved<G>>,
    run: Run<G>,
}

/// A broken invariant of this engine (see [`Error::Internal`]).
fn internal(what: &'static str) -> Error {
    Error::Internal(what)
}

impl<G: Group> Gdh<G> {
    /// Decodes a member list (chain) of at most `MAX_MEMBERS` names.
    fn get_members(r: &mut Reader<'_>) -> Result<Vec<MemberId>, Error> {
        let n = r.count(MAX_MEMBERS, 2, "member list")?;
        (0..n).map(|_| get_member(r)).collect()
    }

    fn put_members(w: &mut Writer, ms: &[MemberId]) {
        w.count(ms.len());
        for m in ms {
            put_member(w, m);
        }
    }

    /// Decodes a list of partial keys.
    fn get_list(r: &mut Reader<'_>, g: &G) -> Result<Vec<(MemberId, G::Element)>, Error> {
        let n = r.count(MAX_MEMBERS, 2 + g.element_len(), "partial key list")?;
        (0..n).map(|_| Ok((get_member(r)?, get_elem(r, g)?))).collect()
    }

    /// Reads a list of partial keys without decoding the names or the
    /// elements (each has the element length; [`Group::decode`] validates it
    /// where it is used): the names are checked against the view's.
    fn get_raw_list<'a>(r: &mut Reader<'a>, g: &G) -> Result<RawList<'a>, Error> {
        let n = r.count(MAX_MEMBERS, 2 + g.element_len(), "partial key list")?;
        (0..n)
            .map(|_| Ok((r.short_bytes(MAX_MEMBER_NAME, "member name")?, r.bytes(g.element_len(), "group element")?)))
            .collect()
    }

    fn on_view_inner(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        let n = cx.view.members.len();
        let me = cx.me.clone();
        if n == 1 {
            let r = cx.random();
            let key = cx.exp_g(&r);
            cx.install(&key);
            self.saved = Some(Saved { r, partials: Partials::default(), sent_by_me: false, key });
            return Ok(());
        }
        if change.single {
            // Leave, partition or rekey: everybody holds the same list.
            let saved = self.saved.as_ref().ok_or_else(|| internal("GDH refresh without a secure state"))?;
            let places = saved
                .partials
                .places(cx.view)
                .ok_or_else(|| internal("GDH refresh: a member has no stored partial key"))?;
            let controller = cx.view.members[n - 1].id.clone();
            let contrib = if controller == me {
                let fresh = cx.random();
                let mut inv = cx.g.scalar_invert(&saved.r);
                let mut f = cx.g.scalar_mul(&fresh, &inv);
                inv.zeroize();
                let mut w = Writer::new();
                w.count(n);
                for (m, &place) in cx.view.ids().zip(&places) {
                    let s = saved.partials.elem(place);
                    put_member(&mut w, m);
                    if *m == me {
                        w.raw(s);
                    } else {
                        let s = match decode_partial(cx.g, s, saved.sent_by_me) {
                            Ok(s) => s,
                            Err(e) => {
                                f.zeroize();
                                return Err(e.into());
                            }
                        };
                        put_elem(&mut w, cx.g, &cx.exp(&s, &f));
                    }
                }
                f.zeroize();
                cx.broadcast(ROUND_LIST, w.buf);
                self.run.list_sent = true;
                fresh
            } else {
                saved.r.clone()
            };
            self.run.mode = Mode::Refresh;
            self.run.controller = Some(controller);
            self.run.contrib = Some(contrib);
            return Ok(());
        }
        // Merge: the first member's subgroup is the old group.
        let first = cx.view.members[0].id.clone();
        let old = change.mine.contains(&first);
        self.run.mode = Mode::Merge;
        self.run.mine = change.mine.clone();
        self.run.old = old;
        if !old {
            // A new member: wait for the token.
            return Ok(());
        }
        // Marked in one walk, not by a search of the subgroup for every
        // member (n² name comparisons per member at a join into n).
        let marks = change.mine_marks(cx.view)?;
        let chain: Vec<MemberId> =
            cx.view.ids().zip(&marks).filter(|(_, &mine)| !mine).map(|(m, _)| m.clone()).collect();
        let last = chain.last().cloned().ok_or_else(|| internal("GDH merge without new members"))?;
        let contrib = if me == first {
            let fresh = cx.random();
            let token = if change.mine.len() > 1 {
                let s = self
                    .saved
                    .as_ref()
                    .and_then(|s| s.partials.get(&me))
                    .ok_or_else(|| internal("GDH merge: no stored partial key"))?;
                let s = cx.g.decode(s)?;
                cx.exp(&s, &fresh)
            } else {
                cx.exp_g(&fresh)
            };
            let mut w = Writer::new();
            Self::put_members(&mut w, &chain);
            put_elem(&mut w, cx.g, &token);
            cx.unicast(&chain[0], ROUND_TOKEN, w.buf);
            fresh
        } else {
            self.saved.as_ref().ok_or_else(|| internal("GDH merge: old member without state"))?.r.clone()
        };
        self.run.chain = Some(chain);
        self.run.controller = Some(last);
        self.run.contrib = Some(contrib);
        Ok(())
    }

    /// Round 1 at a new member: the token from my predecessor in the chain.
    fn on_token(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let mut r = Reader::new(body);
        let chain = Self::get_members(&mut r)?;
        let token = get_elem(&mut r, cx.g)?;
        r.finish()?;
        let bad = |what: Misbehaved| Err(what.by(from));
        let round = ROUND_TOKEN;
        if self.run.mode != Mode::Merge {
            return bad(Misbehaved::OutsideItsRun { round });
        }
        if self.run.old {
            // Old members know the chain; the token only goes to new ones.
            return bad(Misbehaved::WrongRecipient { round });
        }
        if self.run.got_token {
            return bad(Misbehaved::Duplicate { round });
        }
        let first = &cx.view.members[0].id;
        let mut prev_pos = None;
        for m in &chain {
            // Members of the view, in view order after the first member.
            match cx.position(m) {
                Some(pos) if pos > 0 && prev_pos.is_none_or(|p| pos > p) => prev_pos = Some(pos),
                _ => return bad(Misbehaved::WrongShape { round }),
            }
        }
        // Both in view order (the chain's is checked above): one walk.
        let mut rest = chain.iter();
        if !self.run.mine.iter().all(|m| rest.any(|c| c == m)) {
            // My subgroup is new as a whole: all of it is in the chain.
            return bad(Misbehaved::Inconsistent { round });
        }
        let Some(k) = chain.iter().position(|m| m == cx.me) else {
            // (Unreachable: I am in my subgroup.)
            return bad(Misbehaved::WrongShape { round });
        };
        let expected = if k == 0 { first } else { &chain[k - 1] };
        if from != expected {
            return bad(Misbehaved::NotItsTurn { round });
        }
        let fresh = cx.random();
        if k + 1 == chain.len() {
            // The last new member: the new controller broadcasts the token as is.
            let mut w = Writer::new();
            put_elem(&mut w, cx.g, &token);
            cx.broadcast(ROUND_BCAST, w.buf);
            self.run.token = Some(token);
        } else {
            let t = cx.exp(&token, &fresh);
            let mut w = Writer::new();
            Self::put_members(&mut w, &chain);
            put_elem(&mut w, cx.g, &t);
            cx.unicast(&chain[k + 1], ROUND_TOKEN, w.buf);
        }
        self.run.contrib = Some(fresh);
        self.run.controller = chain.last().cloned();
        self.run.chain = Some(chain);
        self.run.got_token = true;
        Ok(())
    }

    /// Round 2: the complete token, from the last chain member.
    fn on_bcast(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let mut r = Reader::new(body);
        let token = get_elem(&mut r, cx.g)?;
        r.finish()?;
        let round = ROUND_BCAST;
        if self.run.mode != Mode::Merge {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        // A new member learns the chain from the token, which passes it
        // before the last chain member can have broadcast.
        let controller = self.run.controller.clone().ok_or_else(|| Misbehaved::NotItsTurn { round }.by(from))?;
        if *from != controller {
            return Err(Misbehaved::NotController { round }.by(from));
        }
        if self.run.got_bcast {
            return Err(Misbehaved::Duplicate { round }.by(from));
        }
        if controller == *cx.me {
            // My own broadcast coming back.
            self.run.got_bcast = true;
            return Ok(());
        }
        let c = self.run.contrib.as_ref().ok_or_else(|| internal("GDH: no contribution to factor out"))?;
        let mut inv = cx.g.scalar_invert(c);
        let f = cx.exp(&token, &inv);
        inv.zeroize();
        let mut w = Writer::new();
        put_elem(&mut w, cx.g, &f);
        cx.unicast(&controller, ROUND_FACTOR, w.buf);
        self.run.got_bcast = true;
        self.run.sent_factor = true;
        Ok(())
    }

    /// Round 3 at the new controller: one factor-out token per other member.
    fn on_factor(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let mut r = Reader::new(body);
        let f = get_elem(&mut r, cx.g)?;
        r.finish()?;
        let run = &self.run;
        let round = ROUND_FACTOR;
        if run.mode != Mode::Merge {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        match &run.controller {
            // A new member learns that it is the controller from the token,
            // which reaches it before anybody can factor out.
            None => return Err(Misbehaved::NotItsTurn { round }.by(from)),
            Some(c) if c != cx.me => return Err(Misbehaved::WrongRecipient { round }.by(from)),
            Some(_) => {}
        }
        if from == cx.me {
            // The runner accepts no unicast from oneself.
            return Err(internal("GDH factor-out token from myself"));
        }
        // Once the list is sent, every other member's token is in.
        if run.list_sent || run.partials.contains_key(from) {
            return Err(Misbehaved::Duplicate { round }.by(from));
        }
        let (Some(token), Some(c)) = (run.token.clone(), run.contrib.as_ref()) else {
            // Factoring out needs the token I broadcast, which I hold from the
            // moment I broadcast it.
            return Err(Misbehaved::NotItsTurn { round }.by(from));
        };
        let p = cx.exp(&f, c);
        self.run.partials.insert(from.clone(), p);
        let n = cx.view.members.len();
        if self.run.partials.len() == n - 1 {
            let mut w = Writer::new();
            w.count(n);
            for m in cx.view.ids() {
                put_member(&mut w, m);
                put_elem(&mut w, cx.g, if m == cx.me { &token } else { &self.run.partials[m] });
            }
            cx.broadcast(ROUND_LIST, w.buf);
            self.run.list_sent = true;
        }
        Ok(())
    }

    /// Round 4: the list of partial keys from the controller; installs.
    fn on_list(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let mut r = Reader::new(body);
        let list = Self::get_raw_list(&mut r, cx.g)?;
        r.finish()?;
        let run = &self.run;
        let round = ROUND_LIST;
        if run.mode == Mode::Idle {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        if run.controller.as_ref() != Some(from) {
            return Err(Misbehaved::NotController { round }.by(from));
        }
        if from == cx.me && !run.list_sent {
            return Err(internal("GDH: my own list before I sent it"));
        }
        if from != cx.me && run.mode == Mode::Merge && !run.sent_factor {
            // The controller lists after every factor-out token, mine too.
            return Err(Misbehaved::NotItsTurn { round }.by(from));
        }
        // One partial key per member, in view order. Each member checks the
        // count and its own entry's name (n names compared by every member
        // were n² per run); the others' entries are theirs to check.
        let pos = cx.position(cx.me).ok_or(Error::BadView("not a member"))?;
        if list.len() != cx.view.members.len() || list[pos].0 != cx.me.as_str().as_bytes() {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        let c = run.contrib.clone().ok_or_else(|| internal("GDH: no contribution"))?;
        let sent_by_me = from == cx.me;
        let mine = decode_partial(cx.g, list[pos].1, sent_by_me)?;
        let key = cx.exp(&mine, &c);
        cx.install(&key);
        // The view's own list (n names cloned per member and run before),
        // and the elements copied as slices.
        let mut elems = Vec::with_capacity(list.len() * cx.g.element_len());
        for (_, e) in &list {
            elems.extend_from_slice(e);
        }
        let partials = Partials { members: Members::of_view(cx.view), elems };
        self.saved = Some(Saved { r: c, partials, sent_by_me, key });
        self.run = Run::idle();
        Ok(())
    }
}

impl<G: Group> Protocol<G> for Gdh<G> {
    const ID: ProtocolId = ProtocolId::Gdh;

    fn new() -> Self {
        Self { saved: None, run: Run::idle() }
    }

    fn reset(&mut self) {
        *self = Self::new();
    }

    fn on_view(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        // Abandon any run in progress; start from the saved state.
        self.run = Run::idle();
        let res = self.on_view_inner(cx, change);
        if res.is_err() {
            self.run = Run::idle();
        }
        res
    }

    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error> {
        match round {
            ROUND_TOKEN => self.on_token(cx, from, body),
            ROUND_BCAST => self.on_bcast(cx, from, body),
            ROUND_FACTOR => self.on_factor(cx, from, body),
            ROUND_LIST => self.on_list(cx, from, body),
            _ => Err(Misbehaved::UnknownRound { round }.by(from)),
        }
    }

    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        let mut scalars = Vec::new();
        let mut elements = Vec::new();
        if let Some(s) = &self.saved {
            scalars.push(s.r.clone());
            elements.push(s.key.clone());
        }
        if let Some(c) = &self.run.contrib {
            scalars.push(c.clone());
        }
        (scalars, elements)
    }

    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error> {
        let mut r = Reader::new(body);
        let out = match round {
            ROUND_TOKEN => {
                Self::get_members(&mut r)?;
                vec![get_elem(&mut r, g)?]
            }
            ROUND_BCAST | ROUND_FACTOR => vec![get_elem(&mut r, g)?],
            ROUND_LIST => Self::get_list(&mut r, g)?.into_iter().map(|(_, e)| e).collect(),
            _ => return Err(Error::Decode(DecodeError::Bad("unknown GDH round"))),
        };
        r.finish()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    //! Costs against Tables I and II of the paper (GDH rows), n = group size
    //! before the event, m = merging members, p = leaving members.
    //!
    //! `msgs`/`uni`/`bcast` are totals over the event; `exps`/`sigs`/`verifs`
    //! are on the critical path as the harness measures it.

    use conclave_gcs::sim::Flush;
    use conclave_gcs::MemberId;

    use crate::harness::{EventCost, Harness};
    use crate::suite::{GroupId, SignatureId};
    use crate::ProtocolId;

    const SIZES: [usize; 4] = [2, 5, 8, 13];

    fn harness(seed: u64) -> Harness {
        Harness::new(ProtocolId::Gdh, GroupId::Ristretto255, SignatureId::Ed25519, seed, Flush::All)
    }

    fn checked(h: &Harness) {
        assert!(h.errors().is_empty(), "errors: {:?}", h.errors());
        h.check_agreement().expect("agreement");
    }

    /// (rounds, msgs, unicasts, broadcasts, exps, sigs, verifs)
    fn counts(c: &EventCost) -> [u64; 7] {
        [
            c.rounds,
            c.total.unicasts + c.total.broadcasts,
            c.total.unicasts,
            c.total.broadcasts,
            c.serial.exps,
            c.serial.sigs,
            c.serial.verifs,
        ]
    }

    /// A keyed group of `n` members (formed as a merge of fresh members),
    /// plus `extra` members not in any view yet.
    fn group(seed: u64, n: usize, extra: usize) -> (Harness, Vec<MemberId>) {
        let mut h = harness(seed);
        let ids = h.add_members(n + extra).expect("members");
        let c = h.event(|s| s.join(&ids[..n], None)).expect("form");
        checked(&h);
        if n > 1 {
            // Forming a group of fresh members is a merge into the first
            // member's (stateless) subgroup: n = 1 and m = n - 1.
            let (n1, m) = (1, n as u64 - 1);
            assert_eq!(counts(&c), [m + 3, n1 + 2 * m + 1, n1 + 2 * m - 1, 2, n1 + 2 * m + 1, m + 3, n1 + 2 * m + 1]);
        }
        (h, ids)
    }

    fn merge_row(n: u64, m: u64) -> [u64; 7] {
        [m + 3, n + 2 * m + 1, n + 2 * m - 1, 2, n + 2 * m + 1, m + 3, n + 2 * m + 1]
    }

    #[test]
    fn join_matches_table() {
        for n in SIZES {
            let (mut h, ids) = group(1, n, 1);
            let c = h.event(|s| s.join(&ids[n..], Some(&ids[0]))).expect("join");
            checked(&h);
            let n = n as u64;
            // Table: 4 rounds, n+3 msgs, n+1 unicasts, 2 broadcasts; n+3 exps, 4 sigs, n+3 verifs.
            assert_eq!(counts(&c), [4, n + 3, n + 1, 2, n + 3, 4, n + 3], "join into {n}");
            assert_eq!(counts(&c), merge_row(n, 1));
        }
    }

    #[test]
    fn merge_of_individuals_matches_table() {
        for n in SIZES {
            let (mut h, ids) = group(2, n, 3);
            let c = h.event(|s| s.join(&ids[n..], Some(&ids[0]))).expect("join of 3");
            checked(&h);
            assert_eq!(counts(&c), merge_row(n as u64, 3), "3 join {n}");
        }
    }

    #[test]
    fn merge_of_keyed_group_matches_table() {
        // A keyed group of 3 (younger, so after the big group in view order)
        // merges into a keyed group of n: its members are chain members like
        // individuals (their old state is not used), so the counts are the
        // same as for 3 individuals.
        for n in SIZES {
            let (mut h, ids) = group(3, n, 3);
            h.event(|s| s.join(&ids[n..], None)).expect("form 3");
            checked(&h);
            let c = h.event(|s| s.merge(&ids[0], &ids[n])).expect("merge");
            checked(&h);
            assert_eq!(counts(&c), merge_row(n as u64, 3), "3 merge into {n}");
        }
    }

    #[test]
    fn merge_roles_follow_view_order() {
        // The old group is the subgroup of the first (oldest) member, whatever
        // the sizes: a keyed group of 3 older members merging with a keyed
        // group of n younger ones costs the merge row with the roles swapped
        // (old group of 3, m = n chain members).
        for n in SIZES {
            let mut h = harness(4);
            let ids = h.add_members(3 + n).expect("members");
            h.event(|s| s.join(&ids[..3], None)).expect("form 3");
            h.event(|s| s.join(&ids[3..], None)).expect("form n");
            checked(&h);
            let c = h.event(|s| s.merge(&ids[0], &ids[3])).expect("merge");
            checked(&h);
            assert_eq!(counts(&c), merge_row(3, n as u64), "{n} merge into 3");
        }
    }

    #[test]
    fn leave_matches_table() {
        for n in SIZES {
            // The leaver: first, a middle member, the controller (last).
            for who in [0, n / 2, n - 1] {
                let (mut h, ids) = group(5, n, 0);
                let c = h.event(|s| s.leave(&ids[who..who + 1])).expect("leave");
                checked(&h);
                let n = n as u64;
                if n == 2 {
                    // The remaining member is alone: it installs g^r, no
                    // message (the table's single broadcast is not needed).
                    assert_eq!(counts(&c), [0, 0, 0, 0, 1, 0, 0]);
                } else {
                    // Table: 1 round, 1 broadcast; n-1 exps, 1 sig, 1 verif.
                    assert_eq!(counts(&c), [1, 1, 0, 1, n - 1, 1, 1], "leave of {who} from {n}");
                }
            }
        }
    }

    #[test]
    fn partition_matches_table() {
        for n in [5usize, 8, 13] {
            let p = 3;
            // p members leave together (sim.leave): exactly the table's row.
            let (mut h, ids) = group(6, n, 0);
            let gone: Vec<MemberId> = vec![ids[0].clone(), ids[n / 2].clone(), ids[n - 1].clone()];
            let c = h.event(|s| s.leave(&gone)).expect("leave of 3");
            checked(&h);
            let (n, p) = (n as u64, p as u64);
            // Table: 1 round, 1 broadcast; n-p exps, 1 sig, 1 verif.
            assert_eq!(counts(&c), [1, 1, 0, 1, n - p, 1, 1], "{p} leave {n}");
        }
        for n in [5usize, 8, 13] {
            // A network partition into n-3 and 3: both components rekey, so
            // the event has 2 broadcasts and its critical path is the larger
            // component's, max(n-p, p) exps.
            let (mut h, ids) = group(7, n, 0);
            let small: Vec<MemberId> = vec![ids[1].clone(), ids[2].clone(), ids[4].clone()];
            let big: Vec<MemberId> = ids.iter().filter(|m| !small.contains(m)).cloned().collect();
            let c = h.event(|s| s.partition(vec![big.clone(), small.clone()])).expect("partition");
            checked(&h);
            let (n, p) = (n as u64, 3u64);
            assert_eq!(counts(&c), [1, 2, 0, 2, (n - p).max(p), 1, 1], "partition {n} into {}+{p}", n - p);
        }
    }

    /// A member that left cannot compute any later group secret from its
    /// secrets and every element sent on the network (closure under
    /// exponentiation, see `testing`).
    #[test]
    fn leaver_cannot_reach_later_secrets() {
        for who in [0usize, 1, 3] {
            let mut h = harness(8);
            let ids = h.add_members(5).expect("members");
            h.sim().enable_trace();
            h.event(|s| s.join(&ids[..4], None)).expect("form");
            let leaver = ids[who].clone();
            let rest: Vec<MemberId> = ids[..4].iter().filter(|m| **m != leaver).cloned().collect();
            let mut targets = Vec::new();
            h.event(|s| s.leave(std::slice::from_ref(&leaver))).expect("leave");
            targets.extend(h.sim_ref().node(&rest[0]).expect("stayer").engine.leak().group_secret);
            h.event(|s| s.join(&ids[4..5], Some(&rest[0]))).expect("join");
            targets.extend(h.sim_ref().node(&rest[0]).expect("stayer").engine.leak().group_secret);
            checked(&h);
            assert_eq!(targets.len(), 2);
            let sim = h.sim_ref();
            let m = sim.node(&leaver).expect("leaver");
            let leak = m.engine.leak();
            let mut publics = Vec::new();
            for d in sim.trace() {
                publics.extend(m.engine.public_elements(&d.msg.bytes).expect("own protocol"));
            }
            let attacker = m.engine.attacker();
            // One level here; tests/independence.rs closes two levels deep.
            for t in &targets {
                let reach = attacker.can_reach(&leak.scalars, &leak.elements, &publics, t, &[], 1, 2_000_000);
                assert_eq!(reach, Some(false), "leaver {who} reaches a later group secret");
            }
            // Sanity: the leaver does reach the secret it held.
            let own = leak.group_secret.expect("leaver had a key");
            assert_eq!(
                attacker.can_reach(&leak.scalars, &leak.elements, &publics, &own, &[], 1, 2_000_000),
                Some(true)
            );
        }
    }
}

/// Insider misbehaviour, driven by hand: messages validly signed by members
/// of the view but out of their role or out of order are rejected without
/// changing state, and the honest run still completes.
#[cfg(test)]
mod validation {
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    use super::{ROUND_BCAST, ROUND_FACTOR, ROUND_LIST, ROUND_TOKEN};
    use crate::codec::Writer;
    use crate::engine::{Error, Misbehaved};
    use crate::protocols::testnet::{id, Net};
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::Group;
    use crate::ProtocolId;

    fn elem() -> Vec<u8> {
        let g = Ristretto255;
        let mut rng = ChaCha20Rng::seed_from_u64(1);
        g.encode(&g.exp_generator(&g.random_scalar(&mut rng)))
    }

    fn token_body(chain: &[&str]) -> Vec<u8> {
        let mut w = Writer::new();
        w.count(chain.len());
        for m in chain {
            w.short_bytes(m.as_bytes());
        }
        w.raw(&elem());
        w.buf
    }

    fn elem_body() -> Vec<u8> {
        elem()
    }

    fn list_body(members: &[&str]) -> Vec<u8> {
        let e = elem();
        list_of(&members.iter().map(|m| (*m, e.as_slice())).collect::<Vec<_>>())
    }

    /// A list round's body: each member's name and the bytes given for its
    /// partial key.
    fn list_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
        let mut w = Writer::new();
        w.count(entries.len());
        for (m, e) in entries {
            w.short_bytes(m.as_bytes());
            w.raw(e);
        }
        w.buf
    }

    /// `e` is the proof `what` against `sender`.
    #[track_caller]
    fn proves(e: Error, what: Misbehaved, sender: &str) {
        assert_eq!(e, what.by(&id(sender)));
    }

    #[test]
    fn merge_rejects_out_of_role_messages() {
        let mut net = Net::new(ProtocolId::Gdh, &["a", "b", "c", "d"], 9);
        net.view(1, &["a", "b", "c"], &["a", "b", "c"]);
        net.run();
        net.agreed();
        // d joins: a sends the token to d; d is the chain and the controller.
        net.view(2, &["a", "b", "c", "d"], &["d"]);
        proves(
            net.reject("d", "b", Some("d"), ROUND_TOKEN, token_body(&["d"])),
            Misbehaved::NotItsTurn { round: ROUND_TOKEN },
            "b",
        );
        proves(
            net.reject("d", "a", Some("d"), ROUND_TOKEN, token_body(&["b", "d"])),
            Misbehaved::NotItsTurn { round: ROUND_TOKEN },
            "a",
        );
        proves(
            net.reject("d", "a", Some("d"), ROUND_TOKEN, token_body(&[])),
            Misbehaved::Inconsistent { round: ROUND_TOKEN },
            "a",
        );
        proves(
            net.reject("d", "a", Some("d"), ROUND_TOKEN, token_body(&["a", "d"])),
            Misbehaved::WrongShape { round: ROUND_TOKEN },
            "a",
        );
        proves(
            net.reject("d", "a", Some("d"), ROUND_TOKEN, token_body(&["d", "c"])),
            Misbehaved::WrongShape { round: ROUND_TOKEN },
            "a",
        );
        proves(
            net.reject("b", "a", Some("b"), ROUND_TOKEN, token_body(&["b"])),
            Misbehaved::WrongRecipient { round: ROUND_TOKEN },
            "a",
        );
        let mut trailing = token_body(&["d"]);
        trailing.push(0);
        assert!(matches!(net.reject("d", "a", Some("d"), ROUND_TOKEN, trailing), Error::Decode(_)));
        let mut bad = token_body(&["d"]);
        let l = bad.len();
        bad[l - 32..].fill(0xff);
        assert!(matches!(net.reject("d", "a", Some("d"), ROUND_TOKEN, bad), Error::Crypto(_)));
        proves(
            net.reject("b", "a", None, ROUND_BCAST, elem_body()),
            Misbehaved::NotController { round: ROUND_BCAST },
            "a",
        );
        // (A broadcast token from d, the last chain member, would be accepted
        // by b: b cannot know whether d received the token yet.)
        proves(
            net.reject("d", "b", Some("d"), ROUND_FACTOR, elem_body()),
            Misbehaved::NotItsTurn { round: ROUND_FACTOR },
            "b",
        );
        proves(
            net.reject("b", "d", None, ROUND_LIST, list_body(&["a", "b", "c", "d"])),
            Misbehaved::NotItsTurn { round: ROUND_LIST },
            "d",
        );
        proves(net.reject("b", "d", None, 9, elem_body()), Misbehaved::UnknownRound { round: 9 }, "d");
        // The token reaches d, which broadcasts it; b factors out.
        net.run_until(|p| p.from == id("b") && p.round == ROUND_FACTOR);
        proves(net.reject("b", "d", None, ROUND_BCAST, elem_body()), Misbehaved::Duplicate { round: ROUND_BCAST }, "d");
        proves(
            net.reject("d", "b", Some("d"), ROUND_FACTOR, elem_body()),
            Misbehaved::Duplicate { round: ROUND_FACTOR },
            "b",
        );
        net.reject("d", "d", Some("d"), ROUND_FACTOR, elem_body()); // the runner refuses it
        proves(
            net.reject("c", "b", Some("c"), ROUND_FACTOR, elem_body()),
            Misbehaved::WrongRecipient { round: ROUND_FACTOR },
            "b",
        );
        proves(
            net.reject("b", "c", None, ROUND_LIST, list_body(&["a", "b", "c", "d"])),
            Misbehaved::NotController { round: ROUND_LIST },
            "c",
        );
        proves(
            net.reject("b", "d", None, ROUND_LIST, list_body(&["a", "b", "c"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "d",
        );
        proves(
            net.reject("b", "d", None, ROUND_LIST, list_body(&["a", "c", "b", "d"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "d",
        );
        proves(
            net.reject("b", "d", None, ROUND_LIST, list_body(&["a", "b", "c", "d", "d"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "d",
        );
        // Each member checks the count and its own entry: c refuses a list
        // whose entry for c names another member.
        proves(
            net.reject("c", "d", None, ROUND_LIST, list_body(&["a", "b", "d", "d"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "d",
        );
        net.run();
        net.agreed();
        // After the install nothing more is accepted.
        proves(
            net.reject("b", "d", None, ROUND_LIST, list_body(&["a", "b", "c", "d"])),
            Misbehaved::OutsideItsRun { round: ROUND_LIST },
            "d",
        );
        proves(
            net.reject("d", "b", Some("d"), ROUND_FACTOR, elem_body()),
            Misbehaved::OutsideItsRun { round: ROUND_FACTOR },
            "b",
        );
    }

    #[test]
    fn refresh_rejects_out_of_role_messages() {
        let mut net = Net::new(ProtocolId::Gdh, &["a", "b", "c", "d"], 9);
        net.view(1, &["a", "b", "c", "d"], &["a", "b", "c", "d"]);
        net.run();
        net.agreed();
        // d leaves: c is the controller.
        net.view(2, &["a", "b", "c"], &[]);
        proves(
            net.reject("a", "b", None, ROUND_LIST, list_body(&["a", "b", "c"])),
            Misbehaved::NotController { round: ROUND_LIST },
            "b",
        );
        proves(
            net.reject("a", "c", None, ROUND_LIST, list_body(&["a", "b", "c", "d"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "c",
        );
        proves(
            net.reject("a", "c", None, ROUND_LIST, list_body(&["a", "c"])),
            Misbehaved::WrongShape { round: ROUND_LIST },
            "c",
        );
        proves(
            net.reject("a", "c", None, ROUND_BCAST, elem_body()),
            Misbehaved::OutsideItsRun { round: ROUND_BCAST },
            "c",
        );
        proves(
            net.reject("c", "a", Some("c"), ROUND_FACTOR, elem_body()),
            Misbehaved::OutsideItsRun { round: ROUND_FACTOR },
            "a",
        );
        proves(
            net.reject("a", "b", Some("a"), ROUND_TOKEN, token_body(&["a"])),
            Misbehaved::OutsideItsRun { round: ROUND_TOKEN },
            "b",
        );
        net.run();
        net.agreed();
    }

    #[test]
    fn a_list_is_validated_where_it_is_used() {
        let mut net = Net::new(ProtocolId::Gdh, &["a", "b", "c", "d"], 9);
        net.view(1, &["a", "b", "c", "d"], &["a", "b", "c", "d"]);
        net.run();
        net.agreed();
        // d leaves: c is the controller; a's partial key is no element.
        net.view(2, &["a", "b", "c"], &[]);
        let (junk, e) = (vec![0xff; elem().len()], elem());
        let body = list_of(&[("a", &junk), ("b", &e), ("c", &e)]);
        let e = net.reject("a", "c", None, ROUND_LIST, body);
        assert!(matches!(e, Error::Crypto(_)), "{e:?}");
        // A list one element short is refused by every member, before any decoding.
        let mut body = list_body(&["a", "b", "c"]);
        body.pop();
        let e = net.reject("b", "c", None, ROUND_LIST, body);
        assert!(matches!(e, Error::Decode(_)), "{e:?}");
    }

    /// A member raises its own entry of the controller's list to its secret
    /// only if the entry lies in the prime-order subgroup: the controller's
    /// own lists skip that check when it refreshes them, nobody else's do.
    #[test]
    fn a_partial_key_outside_the_subgroup_is_refused_by_its_member() {
        use crate::suite::modp::Modp;
        use crate::suite::{CryptoError, GroupId};
        let g = Modp::new(GroupId::Modp512);
        let len = g.element_len();
        let outside = (2u8..).map(|h| [vec![0; len - 1], vec![h]].concat()).find(|b| g.decode(b).is_err()).unwrap();
        let inside = g.encode(&g.exp_generator(&g.scalar_from_u64(3)));
        let mut net = Net::in_group(ProtocolId::Gdh, GroupId::Modp512, &["a", "b", "c", "d"], 4);
        net.view(1, &["a", "b", "c", "d"], &["a", "b", "c", "d"]);
        net.run();
        net.agreed();
        // d leaves; c, the controller, lists b's partial key outside the subgroup.
        net.view(2, &["a", "b", "c"], &[]);
        let bad = net.forge("c", None, ROUND_LIST, list_of(&[("a", &inside), ("b", &outside), ("c", &inside)]));
        let e = net.offer("b", &bad).expect_err("b refuses its entry");
        assert_eq!(e, Error::Crypto(CryptoError::InvalidElement));
        assert!(net.key("b").is_none(), "b installed a key");
    }
}

#[cfg(test)]
mod partials_tests {
    use super::Partials;
    use conclave_gcs::{Cause, MemberId, View, ViewId, ViewMember};

    fn view(names: &[&str]) -> View {
        let members = names.iter().map(|n| ViewMember { id: MemberId::new(*n).unwrap(), prev: None }).collect();
        View { id: ViewId::new(0, 1), members, cause: Cause::Leave }
    }

    #[test]
    fn stored_partials_are_found_in_view_order_and_in_any_other() {
        let members: Vec<MemberId> = ["a", "b", "c", "d"].iter().map(|n| MemberId::new(*n).unwrap()).collect();
        let p = Partials { members: members.clone().into(), elems: (0u8..8).collect() };
        assert_eq!(p.places(&view(&["a", "c", "d"])), Some(vec![0, 2, 3]), "a leave: one walk");
        assert_eq!(p.places(&view(&["d", "a"])), Some(vec![3, 0]), "another order: by name");
        assert_eq!(p.places(&view(&["a", "e"])), None, "a member with no partial key");
        assert_eq!(p.elem(2), &[4, 5]);
        assert_eq!(p.get(&members[3]), Some(&[6u8, 7][..]));
        assert_eq!(Partials::default().places(&view(&["a", "b"])), None);
    }
}
