//! The engine interface and the plumbing every protocol shares.
//!
//! An [`Engine`] is one member's key agreement state machine for one group.
//! It is fed views ([`Engine::on_view`]) and the protocol messages the group
//! communication layer delivers ([`Engine::on_message`]), and answers with
//! [`Output`]s: messages to send and, when a run completes, the installed
//! [`SecureView`]. It does no I/O, reads no clock and draws randomness only
//! from the RNG passed in.
//!
//! [`Runner`] implements the interface once for all protocols. It opens and
//! seals envelopes (signature, group, view, protocol, replay checks; all before
//! any state changes), meters costs, installs keys, and keeps the knowledge
//! that makes cascaded membership events safe:
//!
//! * A member *installs* a run's key only when the run's final message is
//!   delivered, to the sender too, so by virtual synchrony the members that
//!   move together into the next view either all installed it or none did.
//! * Each member remembers which members of its view share its secure state
//!   (installed the same key) — all of them right after an install, then only
//!   those in its transitional set (same previous view) at each view change.
//!   A protocol is told on every view who shares its state (`Change::mine`) and
//!   whether everybody does (`Change::single`). Everybody in a transitional
//!   set computes the same answer, so a view in which not everyone shares one
//!   state is handled by every member as a merge of the subgroups, from their
//!   last secure states — an interrupted run is simply abandoned.
//!
//! The engine follows *every* view of the group communication layer, in
//! order, and derives who shares its state from the views themselves (each
//! member's `prev`): its driver never rewrites them. A view in which the
//! driver holds key agreement back (waiting for certificates, say) is given
//! with [`Engine::observe`], and its run begins later with
//! [`Engine::start`], whose [`StaticDirectory`] is the explicit set of
//! members admitted to the run with their identity keys. [`Engine::on_view`]
//! is both at once, with every member of the view and the engine's own
//! directory. A member that takes no part in a view's key agreement (it was
//! refused) says so with [`Engine::stand_aside`]: the others may install a
//! key without it, so it forgets its state and counts as a newcomer.
//!
//! A view may hold several runs: [`Engine::rekey`] (fed at the same point of
//! the agreed stream at every member, e.g. on an agreed rekey request or a
//! failed key confirmation) abandons the state of every member and runs the
//! view again as a merge of singletons, under the next [`Epoch`]. Messages
//! carry their run, so nothing of an earlier run is accepted in a later one.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use conclave_gcs::{kept_places, MemberId, MemberMap, MemberSet, Members, View, ViewId};
use rand_core::CryptoRngCore;

use crate::codec::DecodeError;
use crate::key::{Epoch, GroupKey, SecureView};
use crate::message::Envelope;
use crate::meter::Costs;
use crate::suite::{CryptoError, Group, Signer, Verifier};
use crate::ProtocolId;

/// Who may take part: maps members to their identity keys.
pub trait Directory: Send + Sync {
    /// The member's verifying key, if the member is trusted.
    fn verifier(&self, member: &MemberId) -> Option<Arc<dyn Verifier>>;
}

/// A fixed directory: a map from member to key (hashed: every member looks
/// up every member of every view in it, and a group's directory has a few
/// hundred names).
#[derive(Default, Clone)]
pub struct StaticDirectory {
    keys: MemberMap<Arc<dyn Verifier>>,
}

impl StaticDirectory {
    /// An empty directory.
    pub fn new() -> Self {
        Self::default()
    }
    /// Trusts `member` with `key`.
    pub fn insert(&mut self, member: MemberId, key: Arc<dyn Verifier>) {
        self.keys.insert(member, key);
    }

    /// Whether `member` is trusted.
    pub fn contains(&self, member: &MemberId) -> bool {
        self.keys.contains_key(member)
    }
}

impl Directory for StaticDirectory {
    fn verifier(&self, member: &MemberId) -> Option<Arc<dyn Verifier>> {
        self.keys.get(member).cloned()
    }
}

/// What an engine asks its driver to do.
#[derive(Clone, Debug)]
pub enum Output {
    /// Send `bytes` to `to`, or to the whole current view if `to` is `None`.
    Send {
        /// Unicast recipient, or `None` to broadcast (agreed order).
        to: Option<MemberId>,
        /// The signed message.
        bytes: Vec<u8>,
    },
    /// A run completed: the key for this view is agreed.
    Installed(SecureView),
}

/// Why an engine rejected an input. A rejected input changes no state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The bytes are not a well-formed message.
    #[error("malformed message: {0}")]
    Decode(#[from] DecodeError),
    /// A well-formed message for another group, suite or protocol.
    #[error("message for another group, suite or protocol")]
    WrongContext,
    /// A message of an earlier run in this view (see [`Engine::rekey`]).
    #[error("message of run {got}, current run is {current}")]
    WrongRun {
        /// The run the message names.
        got: u32,
        /// The engine's current run.
        current: u32,
    },
    /// A message bound to another view (stale, or replayed from elsewhere).
    #[error("message for view {got}, current view is {current:?}")]
    WrongView {
        /// The view the message names.
        got: ViewId,
        /// The engine's current view.
        current: Option<ViewId>,
    },
    /// A unicast addressed to someone else.
    #[error("message addressed to another member")]
    NotForMe,
    /// The sender is not in the current view (or differs from who the group
    /// communication layer says sent it).
    #[error("sender {0} is not a member of the current view")]
    NotAMember(MemberId),
    /// The sender has no trusted identity key.
    #[error("no trusted identity for {0}")]
    UnknownSender(MemberId),
    /// The signature does not verify.
    #[error("bad signature from {0}")]
    BadSignature(MemberId),
    /// The (sender, seq) pair was already accepted in this view.
    #[error("replayed message {1} from {0}")]
    Replay(MemberId, u32),
    /// A group element or key is invalid.
    #[error("crypto: {0}")]
    Crypto(#[from] CryptoError),
    /// A validly signed, well-formed message that no honest member would have
    /// sent: `sender` misbehaved (see [`Misbehaved`] for what that proves).
    #[error("{sender} misbehaved: {what}")]
    Misbehaved {
        /// The authenticated sender.
        sender: MemberId,
        /// What its message proves.
        what: Misbehaved,
    },
    /// The view's run counter is exhausted: no further rekey in this view
    /// (see [`Engine::rekey`] and [`Engine::restart`]).
    #[error("run counter exhausted in this view")]
    RunsExhausted,
    /// A broken invariant of this engine (a bug), not caused by the input.
    #[error("internal error: {0}")]
    Internal(&'static str),
    /// A message this member has no use for (e.g. a BD round-1 value from a
    /// non-neighbour). It was dropped before its signature was checked; a
    /// driver may ignore this error.
    #[error("message from {0} not needed by this member; dropped unverified")]
    Ignored(MemberId),
    /// A view that does not contain this member, or a message before any view.
    #[error("bad view: {0}")]
    BadView(&'static str),
}

/// What a message proves its sender did wrong ([`Error::Misbehaved`]).
///
/// Proven against the protocol and what this member holds: its own state and
/// the messages it accepted earlier in the run. Given the guarantees of the
/// group communication layer (virtual synchrony, agreed order, a sender's
/// messages in the order sent) every member of a transitional set computes
/// the same roles, so an honest member never sends such a message. (An
/// insider whose lie was accepted earlier, e.g. claiming members first, can
/// make a later honest message look wrong; the first message to contradict
/// the accepted ones is the one refused.) `round` is the protocol's round tag
/// of the refused message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Misbehaved {
    /// A round tag the protocol does not have.
    #[error("unknown round {round}")]
    UnknownRound {
        /// The round tag.
        round: u8,
    },
    /// A second message of a round each member sends (or this member
    /// receives) once per run.
    #[error("second message of round {round}")]
    Duplicate {
        /// The round tag.
        round: u8,
    },
    /// A message the current run never has: a round of another kind of run
    /// (a leave message in a merge), or any message after the run's key was
    /// installed (every honest message of a run precedes its final one).
    #[error("round {round} outside its run")]
    OutsideItsRun {
        /// The round tag.
        round: u8,
    },
    /// A message only the run's controller sends, from another member.
    #[error("round {round} from a member that is not the controller")]
    NotController {
        /// The round tag.
        round: u8,
    },
    /// A message only a sponsor sends (of that subgroup, node or run), from
    /// a member that is not that sponsor.
    #[error("round {round} from a member that is not the sponsor")]
    NotSponsor {
        /// The round tag.
        round: u8,
    },
    /// A message sent before its sender could have had what it needs: out
    /// of its turn in the order the protocol prescribes (e.g. a GDH token
    /// not from the receiver's predecessor in the chain, a final message
    /// before every announcement it depends on).
    #[error("round {round} out of its turn")]
    NotItsTurn {
        /// The round tag.
        round: u8,
    },
    /// A unicast to a member whose role never receives that round (e.g. a
    /// share sent to a member that is not the controller).
    #[error("round {round} sent to a member that does not take it")]
    WrongRecipient {
        /// The round tag.
        round: u8,
    },
    /// A reply this member never asked the sender for.
    #[error("round {round} not asked for")]
    Unsolicited {
        /// The round tag.
        round: u8,
    },
    /// Counts, lists or positions that do not fit the view or the run: wrong
    /// number of keys, members outside the view or out of order, a
    /// sponsor's path not fully computed.
    #[error("round {round} does not fit the view")]
    WrongShape {
        /// The round tag.
        round: u8,
    },
    /// Claims members that an accepted message of this run already
    /// announced.
    #[error("round {round} announces members already announced")]
    AlreadyAnnounced {
        /// The round tag.
        round: u8,
    },
    /// Contradicts this member's own state: its subgroup's tree or chain,
    /// its blinded keys, its channels, who is in its subgroup.
    #[error("round {round} contradicts this member's state")]
    Inconsistent {
        /// The round tag.
        round: u8,
    },
    /// An element outside the group's prime-order subgroup, found where it
    /// is used (BD checks its round-2 values once, in their product, and
    /// looks for the culprit only if that fails).
    #[error("round {round} carries an element outside the group")]
    OutsideTheGroup {
        /// The round tag.
        round: u8,
    },
}

impl Misbehaved {
    /// The error naming `sender` as the member that sent this.
    pub fn by(self, sender: &MemberId) -> Error {
        Error::Misbehaved { sender: sender.clone(), what: self }
    }
}

/// One member's key agreement engine for one group.
pub trait Engine: Send {
    /// The protocol this engine runs.
    fn protocol(&self) -> ProtocolId;
    /// The member this engine is.
    fn member(&self) -> &MemberId;
    /// A new view from the group communication layer. Abandons any run in
    /// progress and starts the run for this view among all its members, with
    /// the engine's own directory: [`Engine::observe`] then
    /// [`Engine::start`].
    fn on_view(&mut self, view: &View, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error>;
    /// A new view from the group communication layer whose run does not begin
    /// yet (see [`Engine::start`]). Abandons any run in progress and forgets
    /// the previous key; who shares this member's state is derived from the
    /// view's `prev` entries. Every view must be given, in order.
    fn observe(&mut self, view: &View) -> Result<(), Error>;
    /// Starts the run of the last observed view among the members that
    /// `admitted` names (this member must be one of them), verifying their
    /// messages with the keys it gives. Every admitted member must be given
    /// the same set at the same point of the agreed stream.
    fn start(&mut self, admitted: &StaticDirectory, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error>;
    /// This member takes no part in the current view's key agreement (it was
    /// refused): abandons any run and forgets its state, so that at the next
    /// view it counts as a newcomer (the others may install keys without it).
    fn stand_aside(&mut self);
    /// The view just observed is one whose run the driver holds back until
    /// every member is admitted afresh (a join or a merge, certified): its
    /// members begin it at different points of the agreed stream, so what
    /// one processed in it another may not have. An interval rekey under way
    /// does not go on across it ([`crate::protocols::seal`]). Called after
    /// [`Engine::observe`], before [`Engine::start`].
    fn admitting(&mut self) {}
    /// Starts a new run in the current view, from scratch: every member
    /// forgets its saved state and the view is agreed again as a merge of
    /// singletons, under the next [`Epoch`]. Every member of the view must be
    /// given it at the same point of the agreed stream (the driver's job).
    fn rekey(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error>;
    /// Starts run `run` of the last observed view from scratch, as
    /// [`Engine::rekey`] does, among the members `admitted` names (members
    /// admitted or set aside since the view's first run). `run` must be later
    /// than the current run. Every member must be given the same input at the
    /// same point of the agreed stream.
    fn restart(
        &mut self,
        admitted: &StaticDirectory,
        run: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error>;
    /// The epoch the current run will install (the current view and run).
    fn current_epoch(&self) -> Option<Epoch>;
    /// Whether keys outlive views (SEAL's interval rekeying; see
    /// [`crate::protocols::seal`]): a view starts no run, the last key
    /// installed stays in use ([`Engine::secure_view`]) until the next
    /// rekey, and rekeys start at the leader's [`Engine::tick`]. Such an
    /// engine refuses [`Engine::rekey`] and [`Engine::restart`].
    fn interval(&self) -> bool {
        false
    }
    /// The interval's tick, which the driver gives the view's leader (its
    /// first member) every interval: starts a rekey if the batch of joins and
    /// leaves is not empty. Refused by other engines and other members.
    fn tick(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error>;
    /// A message delivered in the current view by `from`.
    fn on_message(&mut self, from: &MemberId, bytes: &[u8], rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error>;

    /// Messages that have arrived together (`(sender, view, bytes)`: as
    /// [`Engine::on_message`] will be given them, in order, with the view
    /// the daemon delivered each in; a message made in another view is
    /// refused before its signature is checked, and is skipped here): their
    /// signatures are checked now in one batch (Ed25519 batch verification,
    /// about half the cost of checking one by one), and `on_message` does
    /// not check again a message whose signature passed here under the same
    /// key. Nothing else changes: a batch that fails leaves every message
    /// to `on_message`'s own check, and the cost meter counts a
    /// verification when the message is opened, as always.
    fn preverify(&mut self, _msgs: &[(&MemberId, ViewId, &[u8])]) {}
    /// The daemons' key for view `view` of a group they key (see
    /// [`crate::keyed`]), delivered before the view. Engines that agree
    /// their own keys refuse it.
    fn daemon_key(&mut self, view: ViewId, key: &[u8; 32]) -> Result<(), Error> {
        let _ = (view, key);
        Err(Error::BadView("this group's members agree their own keys"))
    }
    /// The secure view of the current view, once its key is agreed.
    fn secure_view(&self) -> Option<&SecureView>;
    /// Whether a run is in progress (a view without its key yet).
    fn in_progress(&self) -> bool;
    /// Everything this engine has spent so far.
    fn costs(&self) -> Costs;
    /// Interval engines ([`Engine::interval`]): the blinded keys and BKEY
    /// packets this member broadcast, the rekeys it led and restarted, so far
    /// (what [`crate::protocols::seal::IntervalTgdh::stats`] gives); `None`
    /// for the other engines.
    fn interval_stats(&self) -> Option<crate::protocols::seal::IntervalStats> {
        None
    }
    /// Test hook: the member's secrets, as encodings (see [`Leak`]).
    #[cfg(feature = "test-hooks")]
    fn leak(&self) -> Leak;
    /// Test hook: the group elements a message of this engine's protocol
    /// carries, as encodings.
    #[cfg(feature = "test-hooks")]
    fn public_elements(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error>;
    /// Test hook: exponentiates an encoded element by an encoded exponent, or
    /// hashes an element to an exponent, in this engine's group (for modelling
    /// what a departed member can compute).
    #[cfg(feature = "test-hooks")]
    fn attacker(&self) -> Box<dyn crate::testing::AttackerGroup>;
}

/// Test hook: what a member knows that nobody else should.
#[cfg(feature = "test-hooks")]
#[derive(Clone, Debug, Default)]
pub struct Leak {
    /// Secret exponents (contributions, node keys, channel keys).
    pub scalars: Vec<Vec<u8>>,
    /// Secret group elements (group secrets, node secrets, channel secrets).
    pub elements: Vec<Vec<u8>>,
    /// The raw group secret of the last installed key.
    pub group_secret: Option<Vec<u8>>,
}

/// Who shares what, at a view change (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct Change {
    /// Members of the view that share this member's secure state, itself
    /// included, in view order.
    /// (The view's own list, shared, when that is all of it.)
    pub mine: Members,
    /// Whether every member of the view shares this member's secure state.
    pub single: bool,
    /// Members of the view that were in every view this member went through
    /// since the last run began (a run's own members included), whether or
    /// not they installed its key: CKD keeps its channels with them.
    pub together: Together,
}

/// [`Change::together`]: as often as not every member of the view, or those
/// that came along with this member, which need no set of n names per
/// member and view.
#[derive(Clone, Debug)]
pub(crate) enum Together {
    /// Every member of the view.
    View,
    /// The members of the view that came from this view (`prev`).
    CameFrom(Option<ViewId>),
    /// These members.
    Set(MemberSet),
}

impl Together {
    /// Whether `m` is one of them (`cx`: the change's view).
    pub fn contains<G: Group>(&self, cx: &Ctx<'_, G>, m: &MemberId) -> bool {
        match self {
            Together::View => cx.contains(m),
            Together::CameFrom(prev) => cx.position(m).is_some_and(|p| cx.view.members[p].prev == *prev),
            Together::Set(set) => set.contains(m),
        }
    }

    /// Them, as a set (`cx`: the change's view).
    pub fn to_set<G: Group>(&self, cx: &Ctx<'_, G>) -> MemberSet {
        match self {
            Together::Set(set) => set.clone(),
            _ => cx.view.ids().filter(|m| self.contains(cx, m)).cloned().collect(),
        }
    }
}

impl Change {
    /// For each member of `view` (the view of this change), in view order,
    /// whether it is in [`Change::mine`]: one walk of both lists, no
    /// lookups. An error if `mine` is not in `view`'s order.
    pub fn mine_marks(&self, view: &View) -> Result<Vec<bool>, Error> {
        let mut mine = self.mine.iter().peekable();
        let marks = view.ids().map(|m| mine.next_if(|x| *x == m).is_some()).collect();
        match mine.next() {
            None => Ok(marks),
            Some(_) => Err(Error::Internal("a subgroup not in its view's order")),
        }
    }
}

/// A protocol, as [`Runner`] drives it.
pub(crate) trait Protocol<G: Group>: Send + Sized + 'static {
    /// Which protocol.
    const ID: ProtocolId;
    /// An interval protocol (SEAL's, `protocols::seal`): a view starts no
    /// run and does not forget the installed key (it stays in use until the
    /// next rekey); runs start when the protocol calls [`Ctx::next_run`] on
    /// an agreed message, after its leader's [`Protocol::on_tick`];
    /// [`Engine::rekey`] and [`Engine::restart`] are refused.
    const INTERVAL: bool = false;
    /// A member with no state yet.
    fn new() -> Self;
    /// Forget all state (the member starts over as a newcomer).
    fn reset(&mut self);
    /// A new view: start the run for it from the last secure state.
    fn on_view(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error>;
    /// A verified message of the current view. Must validate the whole body
    /// before changing any state.
    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error>;
    /// Whether a message of `round` from `from` carries anything this member,
    /// at position `me` of `view`, uses. Messages it does not want are dropped
    /// with [`Error::Ignored`] before their signature is checked (BD members
    /// only use their neighbours' round-1 values), so no unverified byte is
    /// ever used and no verification is wasted.
    fn wants(&self, _view: &View, _me: usize, _from: &MemberId, _round: u8) -> bool {
        true
    }
    /// The interval's tick, given to the leader by its driver (interval
    /// protocols only).
    fn on_tick(&mut self, _cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        Err(Error::BadView("this protocol has no rekeying interval"))
    }
    /// What an interval protocol has broadcast and led so far (see [`Engine::interval_stats`]).
    fn interval_stats(&self) -> Option<crate::protocols::seal::IntervalStats> {
        None
    }
    /// See [`Engine::admitting`].
    fn admitting(&mut self) {}
    /// The member's secrets (test hook).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>);
    /// The group elements a message body carries (test hook).
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error>;
}

/// What a protocol may do while handling an input: metered crypto, sending
/// and installing the key.
pub(crate) struct Ctx<'a, G: Group> {
    /// The group.
    pub g: &'a G,
    /// This member.
    pub me: &'a MemberId,
    /// The current view.
    pub view: &'a View,
    rng: &'a mut dyn CryptoRngCore,
    st: &'a mut Session,
    signer: &'a dyn Signer,
    install: &'a mut Option<Install<G>>,
}

/// A key to install at the end of the call: the group secret and, if not
/// every member of the view holds it, those that do.
pub(crate) struct Install<G: Group> {
    secret: G::Element,
    among: Option<Vec<MemberId>>,
}

impl<G: Group> Ctx<'_, G> {
    /// The position of `m` in the current view, if it is a member (a lookup,
    /// where [`View::position`] scans: this runs for every message, and
    /// groups have up to a thousand members).
    pub fn position<Q: std::hash::Hash + Eq + ?Sized>(&self, m: &Q) -> Option<usize>
    where
        MemberId: std::borrow::Borrow<Q>,
    {
        self.st.positions.get(m).copied()
    }
    /// Whether `m` is a member of the current view (see [`Ctx::position`]).
    pub fn contains(&self, m: &MemberId) -> bool {
        self.st.positions.contains_key(m)
    }
    /// A fresh random exponent.
    pub fn random(&mut self) -> G::Scalar {
        self.g.random_scalar(self.rng)
    }
    /// g^s (metered).
    pub fn exp_g(&mut self, s: &G::Scalar) -> G::Element {
        self.st.costs.exps += 1;
        self.g.exp_generator(s)
    }
    /// b^s (metered).
    pub fn exp(&mut self, b: &G::Element, s: &G::Scalar) -> G::Element {
        self.st.costs.exps += 1;
        self.g.exp(b, s)
    }
    /// Full-size exponentiations metered so far (for a protocol that
    /// splits them by phase: SEAL's Queue-subtree).
    pub fn exps(&self) -> u64 {
        self.st.costs.exps
    }
    /// b^e for small e (metered apart).
    pub fn exp_small(&mut self, b: &G::Element, e: u64) -> G::Element {
        self.st.costs.small_exps += 1;
        self.g.exp_small(b, e)
    }
    /// Starts the next run of the current view (interval protocols, on the
    /// delivery of an agreed message that starts a rekey): the key it
    /// installs is the next [`Epoch`] of the view; sequence numbers, replay
    /// and own-broadcast records start afresh, so nothing of the earlier run
    /// is accepted in it. Call it only once every check of the input passed.
    pub fn next_run(&mut self) -> Result<(), Error> {
        let st = &mut *self.st;
        st.run = st.run.checked_add(1).ok_or(Error::RunsExhausted)?;
        st.next_seq = 0;
        st.seen.clear();
        st.own.clear();
        Ok(())
    }
    /// Broadcasts a message of `round` to the current view.
    pub fn broadcast(&mut self, round: u8, body: Vec<u8>) {
        self.send(None, round, body);
    }
    /// Sends a message of `round` to one member.
    pub fn unicast(&mut self, to: &MemberId, round: u8, body: Vec<u8>) {
        self.send(Some(to.clone()), round, body);
    }
    fn send(&mut self, to: Option<MemberId>, round: u8, body: Vec<u8>) {
        let st = &mut *self.st;
        let mut env = Envelope {
            protocol: st.protocol,
            group_id: self.g.id(),
            group: st.group.clone(),
            view: self.view.id,
            run: st.run,
            sender: self.me.clone(),
            recipient: to.clone(),
            round,
            seq: st.next_seq,
            body,
            signature: Vec::new(),
        };
        st.next_seq += 1;
        env.signature = self.signer.sign(&env.signed_bytes());
        st.costs.sigs += 1;
        let bytes = env.encode();
        st.costs.bytes += bytes.len() as u64;
        if to.is_some() {
            st.costs.unicasts += 1;
        } else {
            st.costs.broadcasts += 1;
            st.own.insert(*blake3::hash(&bytes).as_bytes());
        }
        st.out.push(Output::Send { to, bytes });
    }
    /// Installs `secret` as this view's group secret. Called once, when the
    /// run's final message is delivered.
    pub fn install(&mut self, secret: &G::Element) {
        *self.install = Some(Install { secret: secret.clone(), among: None });
    }
    /// Installs `secret` as the key of `among` only, the view's members that
    /// took part in the run (in view order): an interval rekey carried on
    /// into a view with newcomers ([`crate::protocols::seal`]), which they
    /// did not take part in.
    pub fn install_among(&mut self, secret: &G::Element, among: Vec<MemberId>) {
        *self.install = Some(Install { secret: secret.clone(), among: Some(among) });
    }
}

/// What a member knows about another member's secure state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tag {
    /// This member has never installed a key here (only used for oneself).
    Fresh,
    /// Installed the key of this epoch.
    Installed(Epoch),
}

/// The protocol-independent state of one engine.
struct Session {
    protocol: ProtocolId,
    group: String,
    view: Option<View>,
    /// The run within `view` (see [`Epoch`]).
    run: u32,
    /// Each member's position in `view` (shared with `observed_positions`
    /// when the run's view is the observed one).
    positions: Arc<MemberMap<usize>>,
    next_seq: u32,
    seen: BTreeSet<(MemberId, u32)>,
    own: BTreeSet<[u8; 32]>,
    known: MemberMap<Tag>,
    secure: Option<SecureView>,
    costs: Costs,
    out: Vec<Output>,
    #[cfg(feature = "test-hooks")]
    last_secret: Option<Vec<u8>>,
}

/// Drives a [`Protocol`] as an [`Engine`].
pub(crate) struct Runner<G: Group, P: Protocol<G>> {
    g: G,
    me: MemberId,
    signer: Arc<dyn Signer>,
    /// The directory of runs started by [`Engine::on_view`].
    directory: Arc<dyn Directory>,
    /// The keys of the current run's members.
    run_keys: Arc<dyn Directory>,
    /// The last view observed (the current run's view is it, restricted to
    /// the admitted members).
    observed: Option<View>,
    /// Each member's position in `observed`, built once per view (or
    /// carried over from the view before, see [`Runner::follow`]): the run's
    /// view takes it when it is the observed view itself.
    observed_positions: Arc<MemberMap<usize>>,
    /// Members in every view observed since the last run began (see
    /// [`Change::together`]).
    together: MemberSet,
    /// No run has begun since the last [`Engine::observe`]: `known` and
    /// `together` then hold only members that came along with this one.
    just_observed: bool,
    /// Messages whose signatures passed [`Engine::preverify`]
    /// ([`checked_key`]), and the key each was checked with.
    preverified: HashMap<[u8; 32], Arc<dyn Verifier>>,
    st: Session,
    proto: P,
}

/// What a member knows of whom shares its state before it has any: itself, fresh.
fn fresh_known(me: &MemberId) -> MemberMap<Tag> {
    MemberMap::from_iter([(me.clone(), Tag::Fresh)])
}

/// Most messages remembered as verified by [`Engine::preverify`] (then it starts afresh).
const MAX_PREVERIFIED: usize = 4096;

impl<G: Group, P: Protocol<G>> Runner<G, P> {
    pub fn new(g: G, group: String, me: MemberId, signer: Arc<dyn Signer>, directory: Arc<dyn Directory>) -> Self {
        let known = fresh_known(&me);
        Self {
            g,
            me,
            signer,
            run_keys: directory.clone(),
            directory,
            observed: None,
            observed_positions: Arc::default(),
            together: MemberSet::default(),
            just_observed: false,
            preverified: HashMap::new(),
            st: Session {
                protocol: P::ID,
                group,
                view: None,
                run: 0,
                positions: Arc::default(),
                next_seq: 0,
                seen: BTreeSet::new(),
                own: BTreeSet::new(),
                known,
                secure: None,
                costs: Costs::default(),
                out: Vec::new(),
                #[cfg(feature = "test-hooks")]
                last_secret: None,
            },
            proto: P::new(),
        }
    }

    fn with_ctx(
        &mut self,
        rng: &mut dyn CryptoRngCore,
        f: impl FnOnce(&mut P, &mut Ctx<'_, G>) -> Result<(), Error>,
    ) -> Result<Vec<Output>, Error> {
        // The view is lent to the context for the call (not cloned: this runs
        // for every message) and put back before anything else reads it.
        let view = self.st.view.take().ok_or(Error::BadView("no view yet"))?;
        let mut install = None;
        let res = {
            let mut cx = Ctx {
                g: &self.g,
                me: &self.me,
                view: &view,
                rng,
                st: &mut self.st,
                signer: self.signer.as_ref(),
                install: &mut install,
            };
            f(&mut self.proto, &mut cx)
        };
        let epoch = Epoch::new(view.id, self.st.run);
        self.st.view = Some(view);
        if let Err(e) = res {
            self.st.out.clear();
            return Err(e);
        }
        if install.is_some() && self.st.secure.as_ref().is_some_and(|sv| sv.epoch == epoch) {
            self.st.out.clear();
            return Err(Error::Internal("second key in one run"));
        }
        if let Some(Install { secret, among }) = install {
            let enc = self.g.encode(&secret);
            let key = GroupKey::derive(&enc, P::ID, &self.st.group, epoch);
            let view = self.st.view.as_ref().expect("restored above");
            let whole = among.is_none();
            let members = match among {
                None => Members::of_view(view),
                Some(among) => Members::from(among),
            };
            // `known` holds members of the observed view only: as many as
            // the run's members, of the whole observed view, are they.
            // At a join those are the members known and the newcomers,
            // added (n names dropped and cloned again per member and join
            // before).
            if whole && self.is_observed(view) {
                let known = &mut self.st.known;
                let add = |known: &mut MemberMap<Tag>, ids: &mut dyn Iterator<Item = &MemberId>| {
                    for m in ids {
                        if !known.contains_key(m) {
                            known.insert(m.clone(), Tag::Installed(epoch));
                        }
                    }
                };
                // Those known came along with this member, as a rule: look
                // up only the members that came from elsewhere (n look-ups
                // per member and join before); every member if that does
                // not account for all.
                if known.len() != members.len() {
                    let my_prev = self.observed_positions.get(&self.me).map(|&i| view.members[i].prev);
                    add(known, &mut view.members.iter().filter(|m| Some(m.prev) != my_prev).map(|m| &m.id));
                    if known.len() != members.len() {
                        add(known, &mut view.ids());
                    }
                }
                debug_assert_eq!(self.st.known.len(), members.len());
                self.st.known.values_mut().for_each(|t| *t = Tag::Installed(epoch));
            } else {
                self.st.known.clear();
                self.st.known.extend(members.iter().map(|m| (m.clone(), Tag::Installed(epoch))));
            }
            let sv = SecureView { view_id: epoch.view, epoch, members, protocol: P::ID, key };
            self.st.secure = Some(sv.clone());
            self.st.out.push(Output::Installed(sv));
            #[cfg(feature = "test-hooks")]
            {
                self.st.last_secret = Some(enc);
            }
        }
        Ok(std::mem::take(&mut self.st.out))
    }

    /// The protocol, to configure it (interval protocols: the algorithm).
    pub fn protocol_mut(&mut self) -> &mut P {
        &mut self.proto
    }

    /// The protocol's state, read-only.
    pub fn protocol_ref(&self) -> &P {
        &self.proto
    }

    /// The interval's tick (see [`Protocol::on_tick`]).
    pub fn tick(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.with_ctx(rng, |p, cx| p.on_tick(cx))
    }

    /// The checks every view given to the engine passes: it contains this
    /// member (whose position is returned), once. Also returns every
    /// member's position.
    fn check_view(&self, view: &View) -> Result<(usize, MemberMap<usize>), Error> {
        match view.index() {
            Ok(positions) => {
                let me = *positions.get(&self.me).ok_or(Error::BadView("view does not contain this member"))?;
                Ok((me, positions))
            }
            Err(_) if !view.contains(&self.me) => Err(Error::BadView("view does not contain this member")),
            Err(_) => Err(Error::BadView("duplicate member")),
        }
    }

    /// `view` read as a change of the last observed view, for a view that
    /// keeps the order of the members that stay and adds newcomers at its
    /// end (every join and leave; views keep their members' order): this
    /// member's position, every member's position (the last view's map with
    /// the departed taken out and the newcomers put in, the others moved
    /// down in one pass over the map: no name is read or hashed but the
    /// changed ones'), and the members of the last view that did not come
    /// from it into `view` (departed, or there again from elsewhere).
    /// Walks both lists side by side (clones of one name compare by their
    /// address). `None`, with nothing changed, where [`Runner::check_view`]
    /// must index the view afresh: no view before, another order, this
    /// member gone, or a name twice.
    fn follow(&mut self, view: &View) -> Option<(usize, Arc<MemberMap<usize>>, Vec<MemberId>)> {
        let old = self.observed.as_ref()?;
        let last = Some(old.id);
        let (o, n) = (&old.members[..], &view.members[..]);
        let (to, j) = kept_places(o, n);
        let gone: Vec<usize> = (0..o.len()).filter(|&i| to[i].is_none()).collect();
        let newcomers = &n[j..];
        // A member that came along but stands elsewhere: another order.
        if newcomers.iter().any(|m| m.prev == last) {
            return None;
        }
        let me = to[*self.observed_positions.get(&self.me)?]?;
        // A newcomer named like a member that stays, or like another newcomer.
        let named = |m: &MemberId| self.observed_positions.get(m).is_some_and(|&i| to[i].is_some());
        let fresh: MemberSet = newcomers.iter().map(|m| m.id.clone()).collect();
        if fresh.len() != newcomers.len() || newcomers.iter().any(|m| named(&m.id)) {
            return None;
        }
        let mut positions = std::mem::take(&mut self.observed_positions);
        let map = Arc::make_mut(&mut positions);
        for &i in &gone {
            map.remove(&o[i].id);
        }
        if !gone.is_empty() {
            for p in map.values_mut() {
                *p -= gone.partition_point(|&g| g < *p);
            }
        }
        map.extend(newcomers.iter().enumerate().map(|(k, m)| (m.id.clone(), j + k)));
        let mut stayed_out: Vec<MemberId> = gone.iter().map(|&i| o[i].id.clone()).collect();
        stayed_out.extend(n[..j].iter().filter(|m| m.prev != last).map(|m| m.id.clone()));
        Some((me, positions, stayed_out))
    }

    /// Whether [`Runner::follow`] reads `view` as a change (test hook).
    #[cfg(test)]
    fn follow_would_apply(&self, view: &View) -> bool {
        let Some(old) = &self.observed else { return false };
        let (_, j) = kept_places(&old.members, &view.members);
        j > 0 && view.members[j..].iter().all(|m| m.prev != Some(old.id))
    }

    /// Whether `view` is the observed view itself, not restricted to fewer
    /// members (a restriction keeps the id and the order).
    fn is_observed(&self, view: &View) -> bool {
        self.observed.as_ref().is_some_and(|o| o.id == view.id && o.members.len() == view.members.len())
    }

    /// Makes `view` (checked) the current view, at `run`.
    fn enter(&mut self, view: View, run: u32) {
        // The observed view's positions serve its run unless the run's view
        // leaves members out (admission).
        self.st.positions = if self.is_observed(&view) {
            self.observed_positions.clone()
        } else {
            Arc::new(view.ids().enumerate().map(|(i, m)| (m.clone(), i)).collect())
        };
        self.st.view = Some(view);
        self.begin_run(run);
    }

    /// Starts counting messages afresh for `run`: sequence numbers, replays
    /// and own broadcasts are per run.
    fn begin_run(&mut self, run: u32) {
        self.st.run = run;
        self.st.next_seq = 0;
        self.st.seen.clear();
        self.st.own.clear();
    }

    /// The last observed view, restricted to the members `admitted` names.
    fn admitted_view(&self, admitted: &StaticDirectory) -> Result<View, Error> {
        let view = self.observed.as_ref().ok_or(Error::BadView("no view yet"))?;
        if !admitted.contains(&self.me) {
            return Err(Error::BadView("this member is not admitted to the run"));
        }
        let members = view.members.iter().filter(|m| admitted.contains(&m.id)).cloned().collect();
        Ok(View { id: view.id, members, cause: view.cause })
    }

    /// Begins run `run` of `view` (the observed view, perhaps restricted),
    /// told who shares this member's state.
    fn begin(
        &mut self,
        view: View,
        keys: Arc<dyn Directory>,
        run: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error> {
        let my_tag = self.st.known[&self.me];
        // `known` and `together` hold members of the observed view only
        // (`observe` keeps those): for a run of the whole observed view, as
        // many entries as members means every member, with no lookups. That
        // is every leave and every rekey of a group that stays together.
        let whole = self.is_observed(&view);
        let n = view.members.len();
        // Right after `observe`, they hold only members that came along with
        // this member (`moved`: the same `prev`), so as many entries as
        // such members means those members: a join's run (the old members
        // and the newcomers) needs no lookups either.
        let moved = match (std::mem::take(&mut self.just_observed), self.observed_positions.get(&self.me)) {
            (true, Some(&i)) if whole => {
                let prev = view.members[i].prev;
                Some((prev, view.members.iter().filter(|m| m.prev == prev).count()))
            }
            _ => None,
        };
        let all_mine = self.st.known.values().all(|t| *t == my_tag);
        let mine: Members = if whole && self.st.known.len() == n && all_mine {
            Members::of_view(&view)
        } else if let Some((prev, count)) = moved.filter(|&(_, count)| all_mine && self.st.known.len() == count) {
            let mine: Members = if count == n {
                Members::of_view(&view)
            } else {
                view.members.iter().filter(|m| m.prev == prev).map(|m| m.id.clone()).collect()
            };
            debug_assert!(view.ids().filter(|m| self.st.known.get(*m) == Some(&my_tag)).eq(mine.iter()));
            debug_assert_eq!(count, mine.len());
            mine
        } else {
            let mine: Members = view.ids().filter(|m| self.st.known.get(*m) == Some(&my_tag)).cloned().collect();
            if mine.len() == n {
                Members::of_view(&view)
            } else {
                mine
            }
        };
        let together = if whole && self.together.len() == n {
            Together::View
        } else if let Some((prev, _)) = moved.filter(|&(_, count)| self.together.len() == count) {
            // Of the view already (a subset of it: the members that came
            // along), and all but the members that did not come along.
            debug_assert!(view.members.iter().filter(|m| self.together.contains(&m.id)).all(|m| m.prev == prev));
            debug_assert!(view.ids().filter(|m| self.together.contains(*m)).count() == self.together.len());
            self.together.extend(view.members.iter().filter(|m| m.prev != prev).map(|m| m.id.clone()));
            debug_assert_eq!(self.together.len(), n);
            Together::CameFrom(prev)
        } else {
            let together = view.ids().filter(|m| self.together.contains(*m)).cloned().collect();
            self.together.clear();
            self.together.extend(view.ids().cloned());
            Together::Set(together)
        };
        let change = Change { single: mine.len() == n, mine, together };
        self.run_keys = keys;
        self.enter(view, run);
        self.with_ctx(rng, |p, cx| p.on_view(cx, &change))
    }

    /// All checks on an incoming message, before anything changes.
    fn open(&mut self, from: &MemberId, bytes: &[u8]) -> Result<Envelope, Error> {
        let env = Envelope::decode(bytes)?;
        if env.protocol != P::ID || env.group_id != self.g.id() || env.group != self.st.group {
            return Err(Error::WrongContext);
        }
        let view = self.st.view.as_ref().ok_or(Error::BadView("no view yet"))?;
        if env.view != view.id {
            return Err(Error::WrongView { got: env.view, current: Some(view.id) });
        }
        if env.run != self.st.run {
            return Err(Error::WrongRun { got: env.run, current: self.st.run });
        }
        if env.recipient.as_ref().is_some_and(|r| r != &self.me) {
            return Err(Error::NotForMe);
        }
        if &env.sender != from || !self.st.positions.contains_key(&env.sender) {
            return Err(Error::NotAMember(env.sender));
        }
        if self.st.seen.contains(&(env.sender.clone(), env.seq)) {
            return Err(Error::Replay(env.sender, env.seq));
        }
        let me = *self.st.positions.get(&self.me).ok_or(Error::BadView("not a member of its own view"))?;
        if env.sender != self.me && !self.proto.wants(view, me, &env.sender, env.round) {
            return Err(Error::Ignored(env.sender));
        }
        if env.sender == self.me {
            // Our own broadcast coming back: accept exactly what we sent.
            if !self.st.own.contains(blake3::hash(bytes).as_bytes()) {
                return Err(Error::BadSignature(env.sender));
            }
        } else {
            let key = self.run_keys.verifier(&env.sender).ok_or_else(|| Error::UnknownSender(env.sender.clone()))?;
            self.st.costs.verifs += 1;
            let signed = env.signed_bytes();
            let checked = !self.preverified.is_empty()
                && self
                    .preverified
                    .remove(&checked_key(&signed, &env.signature))
                    .is_some_and(|k| Arc::ptr_eq(&k, &key));
            if !checked {
                key.verify(&signed, &env.signature).map_err(|_| Error::BadSignature(env.sender.clone()))?;
            }
        }
        Ok(env)
    }
}

/// What [`Engine::preverify`] records of a message whose signature it
/// checked, and `open` looks up: a hash of the signed bytes (which hold
/// the digest of everything but the signature) and the signature, so only
/// the very message checked, byte for byte, skips its check.
fn checked_key(signed: &[u8], signature: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&(signed.len() as u32).to_be_bytes());
    h.update(signed);
    h.update(signature);
    *h.finalize().as_bytes()
}

impl<G: Group, P: Protocol<G>> Engine for Runner<G, P> {
    fn protocol(&self) -> ProtocolId {
        P::ID
    }

    fn member(&self) -> &MemberId {
        &self.me
    }

    fn on_view(&mut self, view: &View, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.observe(view)?;
        let keys = self.directory.clone();
        self.begin(view.clone(), keys, 0, rng)
    }

    fn preverify(&mut self, msgs: &[(&MemberId, ViewId, &[u8])]) {
        let mut items = Vec::new();
        for &(from, delivered_in, bytes) in msgs {
            let Ok(env) = Envelope::decode(bytes) else { continue };
            if &env.sender != from
                || env.sender == self.me
                || env.view != delivered_in
                || env.protocol != P::ID
                || env.group != self.st.group
            {
                continue;
            }
            let Some(key) = self.run_keys.verifier(&env.sender) else { continue };
            let signed = env.signed_bytes();
            let h = checked_key(&signed, &env.signature);
            items.push((key, signed, env.signature, h));
        }
        if items.len() < 2 {
            return;
        }
        let batch: Vec<(&dyn Verifier, &[u8], &[u8])> =
            items.iter().map(|(k, m, s, _)| (k.as_ref(), m.as_slice(), s.as_slice())).collect();
        if crate::suite::verify_batch(&batch).is_err() {
            return;
        }
        if self.preverified.len() + items.len() > MAX_PREVERIFIED {
            self.preverified.clear();
        }
        self.preverified.extend(items.into_iter().map(|(k, _, _, h)| (h, k)));
    }

    fn observe(&mut self, view: &View) -> Result<(), Error> {
        // The last run's positions go (no message is taken until `start`),
        // so that the observed ones are not shared when `follow` changes them.
        self.st.positions = Arc::default();
        let (me, positions, stayed_out) = match self.follow(view) {
            Some((me, positions, stayed_out)) => (me, positions, Some(stayed_out)),
            None => {
                let (me, positions) = self.check_view(view)?;
                (me, Arc::new(positions), None)
            }
        };
        let prev = view.members[me].prev;
        let last = self.observed.as_ref().map(|v| v.id);
        if prev.is_none() || prev != last {
            // A newcomer (or a member whose history we did not see): start over.
            self.proto.reset();
            self.st.known = fresh_known(&self.me);
            self.together = MemberSet::from_iter([self.me.clone()]);
        } else if let Some(stayed_out) = stayed_out {
            // `known` and `together` hold members of the last observed view
            // only: those that did not come along are all there is to drop.
            for m in &stayed_out {
                self.st.known.remove(m);
                self.together.remove(m);
            }
        } else {
            // Who came from this member's previous view (the transitional set).
            let moved = |m: &MemberId| positions.get(m).is_some_and(|&i| view.members[i].prev == prev);
            self.st.known.retain(|m, _| moved(m));
            self.together.retain(|m| moved(m));
        }
        self.observed = Some(view.clone());
        self.observed_positions = positions;
        self.just_observed = true;
        // No run (and no key) until `start`: messages of the abandoned run
        // are refused, and the previous key is forgotten (an interval
        // protocol keeps using it until its next rekey).
        self.st.view = None;
        if !P::INTERVAL {
            self.st.secure = None;
        }
        Ok(())
    }

    fn start(&mut self, admitted: &StaticDirectory, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        let view = self.admitted_view(admitted)?;
        self.begin(view, Arc::new(admitted.clone()), 0, rng)
    }

    fn stand_aside(&mut self) {
        self.proto.reset();
        self.st.known = fresh_known(&self.me);
        self.together = MemberSet::from_iter([self.me.clone()]);
        self.st.view = None;
        self.st.secure = None;
    }

    fn restart(
        &mut self,
        admitted: &StaticDirectory,
        run: u32,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error> {
        if P::INTERVAL {
            return Err(Error::BadView("an interval engine rekeys on its leader's tick"));
        }
        let view = self.admitted_view(admitted)?;
        if run == 0 {
            return Err(Error::BadView("a restart is a later run than the view's own"));
        }
        if self.st.view.as_ref().is_some_and(|current| current.id == view.id && run <= self.st.run) {
            return Err(Error::BadView("a restart of the current view goes to a later run"));
        }
        self.run_keys = Arc::new(admitted.clone());
        self.enter(view, run - 1);
        self.rekey(rng)
    }

    fn rekey(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        if P::INTERVAL {
            return Err(Error::BadView("an interval engine rekeys on its leader's tick"));
        }
        let n = self.st.view.as_ref().ok_or(Error::BadView("no view yet"))?.members.len();
        self.proto.reset();
        self.st.known = fresh_known(&self.me);
        let run = self.st.run.checked_add(1).ok_or(Error::RunsExhausted)?;
        self.begin_run(run);
        self.together = self.st.view.as_ref().map(|v| v.ids().cloned().collect()).unwrap_or_default();
        let change = Change { mine: Members::from(vec![self.me.clone()]), single: n == 1, together: Together::View };
        self.with_ctx(rng, |p, cx| p.on_view(cx, &change))
    }

    fn current_epoch(&self) -> Option<Epoch> {
        self.st.view.as_ref().map(|v| Epoch::new(v.id, self.st.run))
    }

    fn interval(&self) -> bool {
        P::INTERVAL
    }

    fn tick(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        Runner::tick(self, rng)
    }

    fn on_message(&mut self, from: &MemberId, bytes: &[u8], rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        let env = self.open(from, bytes)?;
        let run = self.st.run;
        let out = self.with_ctx(rng, |p, cx| p.on_message(cx, &env.sender, env.round, &env.body))?;
        // A message that started the next run (Ctx::next_run) belongs to the
        // run before it, whose records are gone with it.
        if self.st.run == run {
            self.st.seen.insert((env.sender, env.seq));
        }
        Ok(out)
    }

    fn secure_view(&self) -> Option<&SecureView> {
        let sv = self.st.secure.as_ref()?;
        (P::INTERVAL || Some(sv.epoch) == self.current_epoch()).then_some(sv)
    }

    fn in_progress(&self) -> bool {
        self.st.view.is_some() && self.secure_view().is_none()
    }

    fn costs(&self) -> Costs {
        self.st.costs
    }

    fn interval_stats(&self) -> Option<crate::protocols::seal::IntervalStats> {
        self.proto.interval_stats()
    }

    fn admitting(&mut self) {
        self.proto.admitting();
    }

    #[cfg(feature = "test-hooks")]
    fn leak(&self) -> Leak {
        let (s, e) = self.proto.secrets();
        Leak {
            scalars: s.iter().map(|x| self.g.encode_scalar(x)).collect(),
            elements: e.iter().map(|x| self.g.encode(x)).collect(),
            group_secret: self.st.last_secret.clone(),
        }
    }

    #[cfg(feature = "test-hooks")]
    fn public_elements(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let env = Envelope::decode(bytes)?;
        Ok(P::public_elements(&self.g, env.round, &env.body)?.iter().map(|e| self.g.encode(e)).collect())
    }

    #[cfg(feature = "test-hooks")]
    fn attacker(&self) -> Box<dyn crate::testing::AttackerGroup> {
        Box::new(crate::testing::Attacker(self.g.clone()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use conclave_gcs::view::Cause;
    use conclave_gcs::{MemberId, MemberMap, MemberSet, View, ViewId, ViewMember};
    use rand_chacha::ChaCha20Rng;
    use rand_core::{RngCore, SeedableRng};

    use super::{Engine, Epoch, Runner, Tag};
    use crate::protocols::tgdh::Tgdh;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::{generate_signer, SignatureId};
    use crate::StaticDirectory;

    /// Random views of up to 10 names, each from the one before: members
    /// kept in order or now and then two swapped, newcomers at the end or now
    /// and then in between, names coming back, `prev` mostly the last view,
    /// sometimes another or none. After each, what `observe` keeps (the
    /// positions, and who stays in `known` and `together`) is what indexing
    /// the view afresh and looking every member up gives.
    #[test]
    fn a_view_read_as_a_change_of_the_last_gives_what_indexing_it_gives() {
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let names: Vec<MemberId> = (0..10).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
        let me = names[0].clone();
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
        let mut r: Runner<Ristretto255, Tgdh<Ristretto255>> =
            Runner::new(Ristretto255, "g".into(), me.clone(), signer, Arc::new(StaticDirectory::new()));
        let mut list: Vec<ViewMember> = vec![ViewMember { id: me.clone(), prev: None }];
        let mut followed = 0;
        for seq in 1..3000u64 {
            let last = r.observed.as_ref().map(|v| v.id);
            let mut next: Vec<ViewMember> = Vec::new();
            for m in &list {
                if m.id != me && rng.next_u32() % 4 == 0 {
                    continue;
                }
                let prev = match rng.next_u32() % 10 {
                    0 => None,
                    1 => Some(ViewId::new(9, seq)),
                    _ => last,
                };
                next.push(ViewMember { id: m.id.clone(), prev });
            }
            if next.len() > 1 && rng.next_u32() % 8 == 0 {
                let (a, b) = (rng.next_u32() as usize % next.len(), rng.next_u32() as usize % next.len());
                next.swap(a, b);
            }
            for name in &names {
                if !next.iter().any(|m| &m.id == name) && rng.next_u32() % 5 == 0 {
                    let prev = if rng.next_u32() % 3 == 0 { last } else { None };
                    let at =
                        if rng.next_u32() % 6 == 0 { rng.next_u32() as usize % (next.len() + 1) } else { next.len() };
                    next.insert(at, ViewMember { id: name.clone(), prev });
                }
            }
            // Before: `known` and `together` hold members of the observed view.
            let tag = Tag::Installed(Epoch::new(ViewId::new(1, seq), 0));
            r.st.known = list.iter().filter(|_| rng.next_u32() % 3 != 0).map(|m| (m.id.clone(), tag)).collect();
            r.st.known.insert(me.clone(), tag);
            r.together = list.iter().filter(|_| rng.next_u32() % 3 != 0).map(|m| m.id.clone()).collect();
            let (known, together) = (r.st.known.clone(), r.together.clone());
            let view = View { id: ViewId::new(1, seq), members: next.clone().into(), cause: Cause::Join };
            if r.observed.is_some() && r.follow_would_apply(&view) {
                followed += 1;
            }
            r.observe(&view).unwrap();
            let expected: MemberMap<usize> = view.index().unwrap();
            assert_eq!(*r.observed_positions, expected, "view {seq}");
            let prev = next.iter().find(|m| m.id == me).unwrap().prev;
            let moved = |m: &MemberId| expected.get(m).is_some_and(|&i| next[i].prev == prev);
            let sorted = |s: &MemberSet| s.iter().cloned().collect::<std::collections::BTreeSet<_>>();
            if prev.is_some() && prev == last {
                let kept: BTreeMap<MemberId, Tag> = known.into_iter().filter(|(m, _)| moved(m)).collect();
                assert_eq!(r.st.known.clone().into_iter().collect::<BTreeMap<_, _>>(), kept, "view {seq}");
                let kept: MemberSet = together.into_iter().filter(|m| moved(m)).collect();
                assert_eq!(sorted(&r.together), sorted(&kept), "view {seq}");
            }
            list = next;
        }
        assert!(followed > 1000, "most views are read as changes: {followed}");
    }
}
