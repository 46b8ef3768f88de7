//! SEAL's interval-based TGDH rekeying (Rebuild, Batch, Queue-batch) as a
//! sans-IO engine: a leader, a signed rekey message, sponsors and their BKEY
//! messages (SEAL §3.3–3.6), on the algorithms of `crate::interval`.
//!
//! # What it does
//! Views are *followed*, not rekeyed: a view starts no key agreement, and
//! the key installed last stays in use ([`IntervalTgdh::secure_view`]) until
//! the next rekey. The joins and leaves since the last rekey form the batch.
//! It is not kept as a list of events but derived from the key tree and the
//! views: the leavers are the tree's members that have not been in every
//! view since the rekey with this member (the engine's `Change::mine`, which
//! follows the transitional sets), the joiners are the view's other members,
//! in view order. So a join then a leave of the same member within one
//! interval cancels, and a leave then a join is a leave and a join (the
//! member comes back with another `prev`), as SEAL §3.6 asks.
//!
//! # Rounds
//! 1. **Rekey message** (round tag [`ROUND_REKEY`]). The leader is the
//!    longest-standing member: the view's first member (views list members
//!    oldest first). On its driver's tick ([`IntervalTgdh::tick`]) it
//!    broadcasts the algorithm, the batch and, if anybody joins, its tree's
//!    public part (`Tree::encode`; absent for a leader with no
//!    tree, which starts from an empty tree and makes every member of the
//!    view a joiner). Its delivery starts the next run of the view (the
//!    next [`crate::Epoch`]) at every member: a member that shares the
//!    leader's tree checks the batch against its own and applies it; a
//!    joiner (listed in the batch) applies it to the received tree.
//! 2. **BKEY messages** (round tag [`ROUND_BKEY`]). Every member computes
//!    the same renewed nodes, sponsors, broadcast lists and packet plan
//!    (SEAL Fig. 3, `Rekeyed::plan`). Each sponsor broadcasts its packets in
//!    the plan's order, each as soon as it can compute every blinded key in
//!    it; a packet's nodes are implied by the plan (the body carries the
//!    blinded keys only), and a receiver accepts the next packet of that
//!    sponsor only, checking every key against those it holds. Members
//!    compute the keys of their path as the blinded keys arrive.
//! 3. **Key confirmation and install** (SEAL §3.5). The root's blinded key
//!    BK0 = g^K0 (K0 = H(group secret)) is on the list of one sponsor (the
//!    one the sponsor coordination gives the root: M8 in Fig. 4), which
//!    broadcasts it like the others. When the plan's last packet is
//!    delivered every member has the group secret and BK0; each computes
//!    its own g^K0 (one exponentiation, metered; the sponsor that computed
//!    BK0 to send it does not compute it again) and compares. Only if they
//!    match does it install the new key; if not, it installs nothing, drops
//!    the rekey, keeps the key it had, and reports the error
//!    ([`Misbehaved::Inconsistent`], round [`ROUND_BKEY`], naming BK0's
//!    sender: the blinded key contradicts what this member computed —
//!    perhaps because an earlier packet it accepted lied). A batch that
//!    renews nothing sends no packet and installs at the rekey message,
//!    confirmed against the root's blinded key every member holds (it was
//!    broadcast when that node was keyed; a mismatch names the leader's
//!    rekey message). A lone member has nobody to confirm with.
//!
//! # Queue-subtree during the interval (Queue-batch)
//! SEAL keys T' while the interval runs and merges it at the rekey (§2.2);
//! so does this engine:
//! 1. **Announcement** (round tag [`ROUND_QUEUE`]). In every view with
//!    joiners, the leader broadcasts, at the view, the view's T': the
//!    joiners (as its batch derives them) added to the T' keyed in the last
//!    view by `Algorithm::Batch` (at TGDH's join position, as Queue-subtree
//!    adds joiners), less that T''s members that no longer join or did not
//!    come from the last view with the leader (joiners take their leaves,
//!    or they are pruned). The last T' (its public part) is the
//!    announcement's base; if none of its members stays, T' starts afresh.
//!    Members that share the leader's tree check the joiners against their
//!    own batch and the base against the T' they hold; a joiner checks that
//!    it is named and, if it stays in T', that the base is the T' it holds.
//! 2. **T''s BKEY packets** (phase byte 3), in the view's first run: the
//!    plan of `Rekeyed` on T' (renewed nodes and sponsors as for a rekey),
//!    broadcast to the whole view. At the last one T' is *keyed*: its
//!    members hold its root key (H of its secret), everyone its blinded
//!    keys. T' of one member: the member draws its leaf key and blinded key
//!    at the announcement, and nothing is sent. A view that changes no
//!    joiner keeps T' as it was (nothing renewed, nothing sent).
//! 3. **The rekey message** says whether it merges the T' keyed in this
//!    view (`SUB_READY`: the leader had it keyed when it sent the message,
//!    so every member has when it is delivered, the view's messages being
//!    delivered in one agreed order) or keys T' in the rekey's run
//!    (`SUB_IN_RUN`: T' was not complete, e.g. the tick came right after
//!    the view, or a restart). A member refuses a message that names a T'
//!    it has not keyed with the batch's joiners. Merging, the rekey's plan
//!    is Queue-merge's on the keyed T'. In the run, Queue-subtree's plan
//!    comes first (phase byte 1: T' from nothing, all its internal nodes
//!    renewed; a lone joiner draws its leaf key and blinded key when the
//!    merge starts), then Queue-merge's; the interval's T' packets still on
//!    their way are refused as of an earlier run.
//!
//! A view drops the T' of the last one unless it was keyed: then it is the
//! base of the next announcement (a restarted rekey keys T' in its run). An
//! install ends it (the joiners are in the tree). [`IntervalStats`] meters
//! Queue-subtree apart: the exponentiations of phases 1 and 3 and of the
//! announcement (`subtree_exps`, read off the engine's meter around them),
//! their blinded keys and packets, and how each rekey found T'
//! (`merged_ready`, `keyed_in_run`).

//! # Cascades (SEAL §3.6)
//! A view during a rekey does not stop it if it takes neither the rekey's
//! leader nor a sponsor that still had packets to send: the rekey's members
//! that came from the last view with this member (the engine's
//! `Change::together`) carry it on, and the leave is the next rekey's, as
//! SEAL §3.6 says. They delivered the same packets in the last view
//! (virtual synchrony), so they hold the same state of it; a sponsor sends
//! again, in the new view, its packets that the last one did not deliver
//! (they were bound to it and are refused in this one). The key is
//! installed among those members only (`Ctx::install_among`, in view order):
//! a newcomer takes no part, drops the rekey's packets
//! ([`Error::Ignored`]: before a rekey message in the view, a member that is
//! not rekeying cannot tell them from a carried rekey's) and waits for the
//! next tick; under Queue-batch the leader announces its T' at the install.
//! A member that left mid-rekey is still in the installed tree and could
//! compute that key from the rekey's packets; the next rekey takes it out.
//!
//! The rekey is abandoned instead — every member goes back to the tree of
//! the last install and the batch is derived again from the views — if the
//! view takes its leader or an unsent sponsor, if an older member (of a
//! merge) now leads, if it takes a member of T' during Queue-batch's
//! Queue-subtree in the run (the merge, whose sponsors are still unknown,
//! could not go on without it; an old member that leaves then is merged
//! out, its leave this rekey's), or if the driver begins the view
//! after a fresh admission ([`Engine::admitting`]: certified members begin
//! such a view as their verdicts come in, so what one processed in it
//! another may not have). If its leader or an unsent sponsor left, the new
//! view's leader restarts at once (the batch then renews their nodes);
//! otherwise the batch waits for the next tick. Members that moved together
//! all delivered the same packets, so they all installed or none did; a
//! member that installed a key the leader did not share is a joiner of the
//! next rekey, so no view splits the group and none leaves a member waiting
//! for a packet that will never come.
//!
//! # How it differs from SEAL
//! * A rekey goes on across a view only in the rekey proper, under the same
//!   leader, and not across a view admitted afresh (see Cascades): there
//!   it is abandoned and waits for the next tick, where SEAL carries on.
//! * Members install at the plan's last packet, not as soon as they hold
//!   the root and BK0 (for the same reason: one delivery is everyone's
//!   commit point). SEAL's rekey is finished once the key is confirmed;
//!   BK0's round is the plan's last, but a packet of that round or an
//!   earlier one may still be delivered after BK0, and the install waits
//!   for it. The confirmation is SEAL's weaker one (§3.5: nobody announces
//!   success); in a session, the session layer's MACs
//!   (`conclave_secure::confirm`) come on top of it.
//! * A failed confirmation is reported and the member keeps its last key:
//!   SEAL says only that the member "will report the error". Members that
//!   confirmed hold the new key, so the group stays split until the member
//!   leaves and joins again; recovering is the application's.
//! * A batch that renews nothing is confirmed against the blinded key held
//!   (one exponentiation each); SEAL elects no sponsor then and says
//!   nothing of confirming it.
//! * The leader is the view's first member, and a merge of partitions is a
//!   batch in which the other side's members join the leader's tree.
//! * Messages travel in the TGDH envelope (`ProtocolId::Tgdh`, round tags 3,
//!   4 and 5, which per-view TGDH does not use); a group runs one policy.
//! * Queue-subtree is announced by the leader in each view with joiners and
//!   keyed from the last view's T' (SEAL's members add each joiner to T' as
//!   it comes, by TGDH); a member that leaves T' mid-interval has its leaf
//!   taken or pruned as in a Batch rekey, so it never holds the T' merged.
//!   The announcement (one signed broadcast per view with joiners) and T''s
//!   packets are interval work, which SEAL does not measure either.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use conclave_gcs::{MemberId, MemberMap, MemberSet, Members, View};
use rand_core::CryptoRngCore;
use zeroize::Zeroize;

use super::{get_elem, get_member, put_member, MAX_MEMBERS};
use crate::codec::{DecodeError, Reader, Writer};
use crate::domains;
use crate::engine::{Change, Ctx, Directory, Engine, Error, Misbehaved, Output, Protocol, Runner};
use crate::interval::{queue_merge, Algorithm, Batch, Packet, Rekeyed};
use crate::key::{Epoch, SecureView};
use crate::meter::Costs;
use crate::suite::{Group, Signer};
use crate::tree::{Bk, Tree};
use crate::ProtocolId;

/// The leader's rekey message: algorithm, batch, tree for the joiners.
pub const ROUND_REKEY: u8 = 3;
/// A sponsor's BKEY packet: blinded keys of one packet of the plan (the
/// body's first byte is its phase: 1 Queue-subtree in the rekey's run, 2
/// the rekey proper, 3 Queue-subtree during the interval).
pub const ROUND_BKEY: u8 = 4;
/// The leader's Queue-subtree announcement: T' of the view (Queue-batch).
pub const ROUND_QUEUE: u8 = 5;

/// Which of SEAL's algorithms a group uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IntervalAlgorithm {
    /// Rebuild a complete tree; every member a sponsor.
    Rebuild,
    /// Joiners replace leavers, then go in at the shallowest positions.
    Batch,
    /// Joiners gathered into a subtree, merged at the interval's end.
    QueueBatch,
}

impl IntervalAlgorithm {
    /// Every algorithm.
    pub const ALL: [Self; 3] = [Self::Rebuild, Self::Batch, Self::QueueBatch];

    /// Wire code (1–3).
    pub fn code(self) -> u8 {
        match self {
            Self::Rebuild => 1,
            Self::Batch => 2,
            Self::QueueBatch => 3,
        }
    }

    /// Parses [`IntervalAlgorithm::code`].
    pub fn from_code(c: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.code() == c)
    }

    /// Name as in SEAL, lower case: `rebuild`, `batch`, `queue-batch`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rebuild => "rebuild",
            Self::Batch => "batch",
            Self::QueueBatch => "queue-batch",
        }
    }

    /// Parses [`IntervalAlgorithm::name`] (case-insensitive).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name().eq_ignore_ascii_case(s))
    }

    fn inner(self) -> Algorithm {
        match self {
            Self::Rebuild => Algorithm::Rebuild,
            Self::Batch => Algorithm::Batch,
            Self::QueueBatch => Algorithm::QueueBatch,
        }
    }
}

/// What one member has done on the interval protocol's own account (the
/// engine's [`Costs`] meter the rest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IntervalStats {
    /// Blinded keys this member broadcast in BKEY packets.
    pub bks_sent: u64,
    /// BKEY packets this member broadcast.
    pub packets_sent: u64,
    /// Rekey messages this member sent as the leader.
    pub rekeys_led: u64,
    /// Rekeys this member started again at once after a view abandoned one
    /// whose leader or unsent sponsor left.
    pub restarts: u64,
    /// Views across which this member carried a rekey on (SEAL §3.6: the
    /// members that left were neither its leader nor a sponsor with packets
    /// still to send).
    pub carried: u64,
    /// Of the engine's exponentiations ([`Costs::exps`]), those spent on
    /// Queue-subtree: keying T', during the interval or in a rekey's run.
    pub subtree_exps: u64,
    /// Of `bks_sent`, Queue-subtree's (BKEY phases 1 and 3).
    pub subtree_bks_sent: u64,
    /// Of `packets_sent`, Queue-subtree's (BKEY phases 1 and 3).
    pub subtree_packets_sent: u64,
    /// Queue-subtree announcements this member sent as the leader.
    pub queues_led: u64,
    /// Rekey messages delivered that merged a T' keyed during the interval.
    pub merged_ready: u64,
    /// Rekey messages delivered (Queue-batch, with joiners) that keyed T'
    /// in the rekey's run: T' was not complete in the view when the leader
    /// sent it.
    pub keyed_in_run: u64,
    /// Not work done: SEAL's count of what this member would also have
    /// exponentiated in the rekeys it installed. SEAL §4.2 has each member
    /// update "the secret and blinded keys of the key path"; this engine
    /// blinds only the keys it broadcasts, and the root's for key
    /// confirmation. Counted at each install: the renewed nodes of its key
    /// path, the root excepted, whose blinded key it did not compute.
    pub path_bks_not_blinded: u64,
    /// Not work done: the BKEY packets this member would have broadcast in
    /// rekeys (the rekey proper: Queue-merge for Queue-batch) had it sent,
    /// on every input it processed, each blinded key of its list it had just
    /// become able to compute, as SEAL §4.2's process_thread does ("if the
    /// group member is a sponsor and the sesskey_engine contains the new
    /// blinded keys to be broadcast, the process_thread will broadcast a
    /// BKEY packet"), where this engine sends the plan's packets, one per
    /// round. Same lists and delivery order as the packets actually sent.
    pub reactive_packets_sent: u64,
    /// Not work done: the BKEY packets this member would have broadcast in
    /// the rekeys it installed (the rekey proper) had the members held, when
    /// each began, only what SEAL's do (`Rekeyed::seal_holds`: their own
    /// co-path and key path, §3.4 and §4.2; joiners the whole old tree)
    /// rather than this engine's whole tree: the same lists, in the rounds
    /// those holdings allow (`Rekeyed::plan_holding`).
    pub copath_packets_sent: u64,
    /// Not work done: the same as `copath_packets_sent` (SEAL's holdings)
    /// with SEAL's per-input sending (§4.2) instead of the plan's rounds:
    /// each sponsor answers every packet, the REKEY packet first, with the
    /// blinded keys of its list it has become able to compute
    /// (`Rekeyed::reactive_plan_holding`, in a modelled agreed order).
    pub copath_reactive_packets_sent: u64,
}

/// The rekey message's body.
struct RekeyMsg<G: Group> {
    algorithm: u8,
    /// [`SUB_IN_RUN`] or [`SUB_READY`].
    subtree: u8,
    batch: Batch,
    tree: Option<Tree<G>>,
}

/// Rekey message: no T', or T' is keyed in the rekey's run.
const SUB_IN_RUN: u8 = 0;
/// Rekey message: merge the T' keyed in this view (Queue-batch).
const SUB_READY: u8 = 1;

impl<G: Group> RekeyMsg<G> {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.u8(self.algorithm);
        w.u8(self.subtree);
        for list in [&self.batch.joins, &self.batch.leaves] {
            put_members(&mut w, list);
        }
        put_tree(&mut w, self.tree.as_ref());
        w.buf
    }

    fn decode(body: &[u8], g: &G) -> Result<Self, Error> {
        let mut r = Reader::new(body);
        let algorithm = r.u8("algorithm")?;
        let subtree = r.u8("subtree")?;
        if subtree > SUB_READY {
            return Err(DecodeError::Bad("subtree").into());
        }
        let joins = get_members(&mut r)?;
        let leaves = get_members(&mut r)?;
        let tree = get_tree(&mut r, g)?;
        r.finish()?;
        Ok(Self { algorithm, subtree, batch: Batch { joins, leaves }, tree })
    }
}

/// The leader's Queue-subtree announcement (Queue-batch, in each view with
/// joiners): T' of this view is `Algorithm::Batch` applied to `base` (the T'
/// keyed in the last view, as the leader holds it, if any of its members
/// stay in T') with `joins` and `leaves`.
struct QueueMsg<G: Group> {
    joins: Vec<MemberId>,
    leaves: Vec<MemberId>,
    base: Option<Tree<G>>,
}

impl<G: Group> QueueMsg<G> {
    fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        put_members(&mut w, &self.joins);
        put_members(&mut w, &self.leaves);
        put_tree(&mut w, self.base.as_ref());
        w.buf
    }

    fn decode(body: &[u8], g: &G) -> Result<Self, Error> {
        let mut r = Reader::new(body);
        let joins = get_members(&mut r)?;
        let leaves = get_members(&mut r)?;
        let base = get_tree(&mut r, g)?;
        r.finish()?;
        Ok(Self { joins, leaves, base })
    }

    /// T''s members: the base's, less the leavers, then the joiners.
    fn members(&self) -> Vec<MemberId> {
        let leaving: BTreeSet<&MemberId> = self.leaves.iter().collect();
        let mut v: Vec<MemberId> = self
            .base
            .as_ref()
            .map(|t| t.members())
            .unwrap_or_default()
            .into_iter()
            .filter(|m| !leaving.contains(m))
            .collect();
        v.extend(self.joins.iter().cloned());
        v
    }
}

fn put_members(w: &mut Writer, list: &[MemberId]) {
    w.count(list.len());
    for m in list {
        put_member(w, m);
    }
}

fn get_members(r: &mut Reader<'_>) -> Result<Vec<MemberId>, Error> {
    let n = r.count(MAX_MEMBERS, 2, "members")?;
    (0..n).map(|_| get_member(r)).collect()
}

fn put_tree<G: Group>(w: &mut Writer, t: Option<&Tree<G>>) {
    match t {
        None => {
            w.u8(0);
        }
        Some(t) => {
            w.u8(1);
            t.encode(w);
        }
    }
}

fn get_tree<G: Group>(r: &mut Reader<'_>, g: &G) -> Result<Option<Tree<G>>, Error> {
    match r.u8("tree flag")? {
        0 => Ok(None),
        1 => Ok(Some(Tree::decode(r, g)?)),
        _ => Err(DecodeError::Bad("tree flag").into()),
    }
}

/// Whether `mine` (as this member holds it) is the tree `announced`: same
/// shape and members, and every blinded key announced is the one held.
fn same_tree<G: Group>(mine: &Tree<G>, announced: &Tree<G>) -> bool {
    mine.correspondence(announced).is_some_and(|pairs| {
        pairs.iter().all(|&(x, y)| announced.nodes[y].bk.as_ref().is_none_or(|b| mine.nodes[x].bk.as_ref() == Some(b)))
    })
}

/// Which part of a rekey a phase is (the BKEY packets' first byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Queue-subtree in the rekey's run: T' was not keyed in the view.
    Subtree = 1,
    /// The rekey proper (Queue-merge for Queue-batch).
    Main = 2,
    /// Queue-subtree during the interval: T' of the view.
    Queue = 3,
}

/// One plan's worth of BKEY packets on one tree.
struct Phase<G: Group> {
    kind: Kind,
    r: Rekeyed<G>,
    /// This member's leaf, if it is in the phase's tree.
    me: Option<usize>,
    plan: Vec<Packet>,
    /// Per sponsor leaf, the plan indices of its packets, in order.
    by_sponsor: HashMap<usize, Vec<usize>>,
    /// Per sponsor leaf, how many of its packets were delivered.
    delivered: HashMap<usize, usize>,
    /// Packets delivered in all.
    total: usize,
    /// This member's packets sent.
    sent: usize,
    /// Of this member's list, how many blinded keys SEAL's per-input
    /// sending would have sent so far (`IntervalStats::reactive_packets_sent`).
    reactive: usize,
    leaf: MemberMap<usize>,
    secret: Option<G::Element>,
}

impl<G: Group> Drop for Phase<G> {
    fn drop(&mut self) {
        if let Some(s) = self.secret.as_mut() {
            s.zeroize();
        }
    }
}

impl<G: Group> Phase<G> {
    fn new(kind: Kind, r: Rekeyed<G>, me: &MemberId) -> Self {
        let plan = r.plan();
        let mut by_sponsor: HashMap<usize, Vec<usize>> = HashMap::new();
        for (i, p) in plan.iter().enumerate() {
            by_sponsor.entry(p.sponsor).or_default().push(i);
        }
        let leaf = r.tree.leaf_index();
        Self {
            kind,
            me: leaf.get(me).copied(),
            r,
            plan,
            by_sponsor,
            delivered: HashMap::new(),
            total: 0,
            sent: 0,
            reactive: 0,
            leaf,
            secret: None,
        }
    }

    fn lone(&self) -> bool {
        self.r.tree.nodes.len() == 1
    }

    /// T' once its phase is complete: this member's path keys and, if it is
    /// in T', the root's key (H of T''s secret).
    fn keyed_subtree(&self, cx: &Ctx<'_, G>) -> Tree<G> {
        let mut sub = self.r.tree.clone();
        let root = sub.root;
        if let (Some(_), Some(s), None) = (self.me, &self.secret, &sub.nodes[root].key) {
            sub.nodes[root].key = Some(cx.g.hash_to_scalar(domains::TGDH_NODE, s));
        }
        sub
    }
}

/// A rekey in progress.
struct Rekey<G: Group> {
    leader: MemberId,
    /// Its members still taking part: the view's when it started, less
    /// those that did not come with this member through a view that
    /// carried it on (SEAL §3.6).
    active: BTreeSet<MemberId>,
    /// A view carried it on: not every member of the view may hold its key.
    carried: bool,
    batch: Batch,
    /// The tree the batch applies to, as this member holds it.
    base: Option<Tree<G>>,
    phase: Phase<G>,
}

/// T' of the current view (Queue-batch): announced by the leader, keyed by
/// its members during the interval.
struct Queue<G: Group> {
    /// Its members.
    members: BTreeSet<MemberId>,
    /// Its BKEY packets, while they come.
    phase: Option<Phase<G>>,
    /// T' once keyed (keys on this member's path if it is in T').
    done: Option<Tree<G>>,
}

/// One member's state of SEAL's interval-based TGDH.
pub struct Seal<G: Group> {
    algorithm: IntervalAlgorithm,
    /// The tree as of the last install (keys on this member's path).
    saved: Option<Tree<G>>,
    /// Members of the view that share `saved` (the engine's `Change::mine`).
    mine: Members,
    rekey: Option<Rekey<G>>,
    /// T' of this view (Queue-batch).
    queue: Option<Queue<G>>,
    /// T' as keyed in the last view, if it was: the base of this view's.
    last_sub: Option<Tree<G>>,
    /// Members of the view that were in the last one with this member.
    together: MemberSet,
    /// The leader's rekey message is on its way.
    ticked: bool,
    /// A rekey message was delivered in this view: every member of the
    /// view takes part in the rekey from then on.
    rekeyed_in_view: bool,
    /// The next view is begun after a fresh admission ([`Engine::admitting`]):
    /// a rekey under way does not go on across it.
    admitting: bool,
    /// The group rekeys at once on a leave (`:rekey-on-leave`): a rekey
    /// under way that loses a member is restarted, not carried on.
    rekey_on_leave: bool,
    stats: IntervalStats,
}

impl<G: Group> Seal<G> {
    /// The batch as this member sees it: leavers from its tree, joiners the
    /// view's members that do not share it.
    fn own_batch(&self, view: &View) -> Batch {
        let mine: BTreeSet<&MemberId> = self.mine.iter().collect();
        let tree_members = self.saved.as_ref().map(|t| t.members()).unwrap_or_default();
        Batch {
            joins: view.ids().filter(|m| !mine.contains(m) || self.saved.is_none()).cloned().collect(),
            leaves: tree_members.into_iter().filter(|m| !mine.contains(m)).collect(),
        }
    }

    /// Whether this member shares the leader's tree (else it joins).
    fn shares_leaders_tree(&self, leader: &MemberId) -> bool {
        self.saved.is_some() && self.mine.contains(leader)
    }

    fn start_rekey(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let batch = self.own_batch(cx.view);
        if batch.joins.is_empty() && batch.leaves.is_empty() {
            return Ok(());
        }
        let joins: BTreeSet<&MemberId> = batch.joins.iter().collect();
        let ready = self.algorithm == IntervalAlgorithm::QueueBatch
            && !joins.is_empty()
            && self.queue.as_ref().is_some_and(|q| q.done.is_some() && q.members.iter().eq(joins.iter().copied()));
        let tree = if batch.joins.is_empty() { None } else { self.saved.as_ref().map(|t| t.public()) };
        let subtree = if ready { SUB_READY } else { SUB_IN_RUN };
        let msg = RekeyMsg { algorithm: self.algorithm.code(), subtree, batch, tree };
        cx.broadcast(ROUND_REKEY, msg.encode());
        self.ticked = true;
        self.stats.rekeys_led += 1;
        Ok(())
    }

    /// The leader's Queue-subtree announcement for this view (Queue-batch,
    /// if anybody joins): T' of the waiting joiners, on the last view's T'
    /// kept for those of its members that came from that view with the
    /// leader and still join.
    fn announce(&mut self, cx: &mut Ctx<'_, G>) {
        let batch = self.own_batch(cx.view);
        if self.algorithm != IntervalAlgorithm::QueueBatch || batch.joins.is_empty() {
            return;
        }
        let joining: BTreeSet<&MemberId> = batch.joins.iter().collect();
        let prev = self.last_sub.as_ref().map(|t| t.members()).unwrap_or_default();
        let kept: BTreeSet<&MemberId> =
            prev.iter().filter(|m| joining.contains(m) && self.together.contains(*m)).collect();
        let msg = if kept.is_empty() {
            QueueMsg { joins: batch.joins.clone(), leaves: Vec::new(), base: None }
        } else {
            QueueMsg {
                joins: batch.joins.iter().filter(|m| !kept.contains(m)).cloned().collect(),
                leaves: prev.iter().filter(|m| !kept.contains(m)).cloned().collect(),
                base: self.last_sub.as_ref().map(|t| t.public()),
            }
        };
        cx.broadcast(ROUND_QUEUE, msg.encode());
        self.stats.queues_led += 1;
    }

    fn on_queue(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_QUEUE;
        let msg = QueueMsg::decode(body, cx.g)?;
        if from != &cx.view.members[0].id {
            return Err(Misbehaved::NotController { round }.by(from));
        }
        if self.queue.is_some() || self.rekey.is_some() {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        if self.algorithm != IntervalAlgorithm::QueueBatch {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        let members = msg.members();
        let set: BTreeSet<MemberId> = members.iter().cloned().collect();
        if set.is_empty() || set.len() != members.len() || !members.iter().all(|m| cx.contains(m)) {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        let shares = self.shares_leaders_tree(from);
        if shares {
            let own: BTreeSet<MemberId> = self.own_batch(cx.view).joins.into_iter().collect();
            if own != set {
                return Err(Misbehaved::Inconsistent { round }.by(from));
            }
        } else if !set.contains(cx.me) {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        // The base as this member holds it: its own T' of the last view if
        // it shares the leader's tree or stays in T' (it must be the one
        // announced), else the announced tree.
        let base = match &msg.base {
            None => None,
            Some(b) => {
                let kept = b.find(cx.me).is_some() && !msg.leaves.contains(cx.me);
                if shares || kept {
                    let mine = self.last_sub.as_ref().filter(|t| same_tree(t, b));
                    Some(mine.ok_or_else(|| Misbehaved::Inconsistent { round }.by(from))?.clone())
                } else {
                    Some(b.clone())
                }
            }
        };
        let sub_batch = Batch { joins: msg.joins, leaves: msg.leaves };
        let r = Algorithm::Batch
            .apply(base.as_ref(), &sub_batch)
            .ok()
            .flatten()
            .ok_or_else(|| Misbehaved::WrongShape { round }.by(from))?;
        // Every check passed: this view's T' is keyed.
        let before = cx.exps();
        if r.tree.nodes.len() == 1 {
            // T' of one: its member holds its leaf's key and blinded key
            // (drawn now, or kept); nobody sends anything.
            let mut t = r.tree;
            let v = t.root;
            if t.nodes[v].member.as_ref() == Some(cx.me) && (t.nodes[v].key.is_none() || t.nodes[v].bk.is_none()) {
                let k = cx.random();
                let bk = cx.exp_g(&k);
                t.nodes[v].bk = Some(Bk::computed(cx.g, bk));
                t.nodes[v].key = Some(k);
            }
            self.queue = Some(Queue { members: set, phase: None, done: Some(t) });
        } else {
            let mut phase = Phase::new(Kind::Queue, r, cx.me);
            draw_fresh(cx, &mut phase);
            self.queue = Some(Queue { members: set, phase: Some(phase), done: None });
        }
        self.stats.subtree_exps += cx.exps() - before;
        self.advance_queue(cx)
    }

    /// T''s phase during the interval: own path keys, ready packets; T' is
    /// keyed at its last packet.
    fn advance_queue(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let Some(q) = &mut self.queue else { return Ok(()) };
        let Some(ph) = &mut q.phase else { return Ok(()) };
        let before = cx.exps();
        let done = step(cx, ph, &mut self.stats)?;
        if done {
            q.done = Some(ph.keyed_subtree(cx));
            q.phase = None;
        }
        self.stats.subtree_exps += cx.exps() - before;
        Ok(())
    }

    fn on_rekey(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_REKEY;
        let msg = RekeyMsg::decode(body, cx.g)?;
        let leader = &cx.view.members[0].id;
        if from != leader {
            return Err(Misbehaved::NotController { round }.by(from));
        }
        if self.rekey.is_some() {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        if msg.algorithm != self.algorithm.code() {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        let batch = msg.batch;
        let base = if self.shares_leaders_tree(from) {
            if batch != self.own_batch(cx.view) {
                return Err(Misbehaved::Inconsistent { round }.by(from));
            }
            if let (Some(t), Some(mine)) = (&msg.tree, &self.saved) {
                let same = mine
                    .correspondence(t)
                    .is_some_and(|pairs| pairs.iter().all(|&(x, y)| mine.nodes[x].bk == t.nodes[y].bk));
                if !same {
                    return Err(Misbehaved::Inconsistent { round }.by(from));
                }
            }
            self.saved.clone()
        } else {
            // A joiner: the batch must name it and cover the view exactly.
            if !batch.joins.contains(cx.me) || (msg.tree.is_none() && !batch.leaves.is_empty()) {
                return Err(Misbehaved::WrongShape { round }.by(from));
            }
            let leaving: BTreeSet<&MemberId> = batch.leaves.iter().collect();
            let mut after: BTreeSet<&MemberId> = BTreeSet::new();
            let old = msg.tree.as_ref().map(|t| t.members()).unwrap_or_default();
            after.extend(old.iter().filter(|m| !leaving.contains(m)));
            after.extend(batch.joins.iter());
            let view: BTreeSet<&MemberId> = cx.view.ids().collect();
            if after != view || old.len() - batch.leaves.len().min(old.len()) + batch.joins.len() != view.len() {
                return Err(Misbehaved::WrongShape { round }.by(from));
            }
            msg.tree
        };
        let algorithm = self.algorithm.inner();
        let queued = algorithm == Algorithm::QueueBatch && !batch.joins.is_empty();
        let phase = if msg.subtree == SUB_READY {
            // Merge the T' keyed in this view: it must be keyed here too,
            // with the batch's joiners.
            let joins: BTreeSet<&MemberId> = batch.joins.iter().collect();
            let sub = self
                .queue
                .as_ref()
                .filter(|q| queued && q.members.iter().eq(joins.iter().copied()))
                .and_then(|q| q.done.as_ref())
                .ok_or_else(|| Misbehaved::Inconsistent { round }.by(from))?;
            queue_merge(base.as_ref(), Some(sub), &batch.leaves)
                .ok()
                .flatten()
                .map(|r| Phase::new(Kind::Main, r, cx.me))
                .ok_or_else(|| Misbehaved::WrongShape { round }.by(from))?
        } else {
            first_phase(algorithm, base.as_ref(), &batch, cx.me)
                .map_err(|_| Misbehaved::WrongShape { round }.by(from))?
        };
        // Every check passed: the rekey starts, in the next run.
        cx.next_run()?;
        self.ticked = false;
        self.rekeyed_in_view = true;
        if queued && msg.subtree == SUB_READY {
            self.stats.merged_ready += 1;
        } else if queued {
            // T' is keyed in the run: this view's (unfinished) is dropped.
            self.stats.keyed_in_run += 1;
            self.queue = None;
        }
        let mut phase = phase;
        let before = cx.exps();
        draw_fresh(cx, &mut phase);
        self.stats.subtree_exps += cx.exps() - before;
        let active = cx.view.ids().cloned().collect();
        self.rekey = Some(Rekey { leader: from.clone(), active, carried: false, batch, base, phase });
        self.advance(cx)
    }

    fn on_bkey(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_BKEY;
        let kind = *body.first().ok_or(DecodeError::Bad("BKEY phase"))?;
        if kind == Kind::Queue as u8 {
            let ph = self
                .queue
                .as_mut()
                .and_then(|q| q.phase.as_mut())
                .ok_or_else(|| Misbehaved::OutsideItsRun { round }.by(from))?;
            accept_bkey(cx, ph, from, body)?;
            return self.advance_queue(cx);
        }
        let Some(rk) = &mut self.rekey else {
            if !self.rekeyed_in_view {
                // Perhaps a rekey carried on into this view among members
                // this one was not with (SEAL §3.6): not this member's, and
                // it changes nothing here.
                return Err(Error::Ignored(from.clone()));
            }
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        };
        if kind != rk.phase.kind as u8 {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        }
        accept_bkey(cx, &mut rk.phase, from, body)?;
        self.advance(cx)
    }

    /// After any change: compute own path keys, send the packets that are
    /// ready, finish phases whose last packet was delivered.
    fn advance(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        loop {
            let Some(rk) = &mut self.rekey else { return Ok(()) };
            let before = cx.exps();
            let done = step(cx, &mut rk.phase, &mut self.stats)?;
            if rk.phase.kind != Kind::Main {
                self.stats.subtree_exps += cx.exps() - before;
            }
            if !done {
                return Ok(());
            }
            // The phase's last packet is in.
            let rk = self.rekey.take().ok_or(Error::Internal("rekey lost"))?;
            match rk.phase.kind {
                Kind::Subtree | Kind::Queue => {
                    let sub = rk.phase.keyed_subtree(cx);
                    // Carried on: the old members gone since the rekey
                    // message leave with the batch's leavers (among which a
                    // member back in the interval, which joins through T').
                    let mut leaves = rk.batch.leaves.clone();
                    if let (Some(b), true) = (&rk.base, rk.carried) {
                        let gone = b.members().into_iter().filter(|m| !rk.active.contains(m) && !leaves.contains(m));
                        leaves.extend(gone.collect::<Vec<_>>());
                    }
                    let merged = queue_merge(rk.base.as_ref(), Some(&sub), &leaves)
                        .map_err(|_| Error::Internal("Queue-merge refused a checked batch"))?
                        .ok_or(Error::Internal("Queue-merge of nobody"))?;
                    let mut phase = Phase::new(Kind::Main, merged, cx.me);
                    let before = cx.exps();
                    draw_fresh(cx, &mut phase);
                    self.stats.subtree_exps += cx.exps() - before;
                    self.rekey = Some(Rekey { phase, ..rk });
                }
                Kind::Main => {
                    let mut phase = rk.phase;
                    // Key confirmation (SEAL §3.5) before anything changes:
                    // a mismatch drops the rekey, the last key stays in use.
                    confirm(cx, &phase, &rk.leader)?;
                    self.stats.path_bks_not_blinded += path_bks_not_blinded(&phase);
                    if let Some(me) = phase.me {
                        let holds = phase.r.seal_holds(rk.base.as_ref());
                        let plan = phase.r.plan_holding(&holds);
                        self.stats.copath_packets_sent += plan.iter().filter(|p| p.sponsor == me).count() as u64;
                        let reactive = phase.r.reactive_plan_holding(&holds);
                        self.stats.copath_reactive_packets_sent +=
                            reactive.iter().filter(|p| p.sponsor == me).count() as u64;
                    }
                    match phase.secret.take() {
                        Some(mut secret) => {
                            let holders: Option<Vec<MemberId>> =
                                rk.carried.then(|| cx.view.ids().filter(|m| rk.active.contains(*m)).cloned().collect());
                            match &holders {
                                None => cx.install(&secret),
                                Some(h) => cx.install_among(&secret, h.clone()),
                            }
                            secret.zeroize();
                            let mut t = phase.r.tree.clone();
                            if phase.lone() {
                                // The lone member's blinded key would be its
                                // secret's base: keep it to itself.
                                t.nodes[t.root].bk = None;
                            }
                            self.saved = Some(t);
                            self.mine = holders.map_or_else(|| Members::of_view(cx.view), Members::from);
                            // The joiners are in: no T' any more.
                            self.queue = None;
                            self.last_sub = None;
                            if rk.carried && &cx.view.members[0].id == cx.me {
                                // The view's newcomers wait for the next
                                // rekey: their T' now.
                                self.announce(cx);
                            }
                        }
                        None => return Err(Error::Internal("rekey complete without the group secret")),
                    }
                    return Ok(());
                }
            }
        }
    }
}

/// SEAL §3.5's key confirmation, at the plan's last packet: the member
/// computes its blinded group key g^K0 (K0 = H(group secret), one metered
/// exponentiation) and compares it with the root's blinded key it holds —
/// the one the plan's root sponsor broadcast (BK0), or, when nothing was
/// renewed, the one broadcast when that node was keyed. The sponsor that
/// computed BK0 to send it does not compute it again; a lone member has
/// nobody to confirm with. A mismatch names BK0's sender (the leader's
/// rekey message when nothing was sent) as contradicting this member's
/// state.
fn confirm<G: Group>(cx: &mut Ctx<'_, G>, ph: &Phase<G>, leader: &MemberId) -> Result<(), Error> {
    let (Some(me), Some(secret), false) = (ph.me, ph.secret.as_ref(), ph.lone()) else { return Ok(()) };
    let t = &ph.r.tree;
    let sender = ph.plan.iter().find(|p| p.nodes.contains(&t.root)).map(|p| p.sponsor);
    if sender == Some(me) {
        return Ok(());
    }
    let blame = match sender.and_then(|s| t.member(s)) {
        Some(m) => Misbehaved::Inconsistent { round: ROUND_BKEY }.by(m),
        None => Misbehaved::Inconsistent { round: ROUND_REKEY }.by(leader),
    };
    let held = t.nodes[t.root].bk.as_ref().ok_or_else(|| blame.clone())?;
    let mut k = cx.g.hash_to_scalar(domains::TGDH_NODE, secret);
    let mine = cx.exp_g(&k);
    k.zeroize();
    if &mine != held.public() {
        return Err(blame);
    }
    Ok(())
}

/// The renewed nodes of this member's key path, the root excepted, whose
/// blinded keys it did not compute (`IntervalStats::path_bks_not_blinded`).
fn path_bks_not_blinded<G: Group>(ph: &Phase<G>) -> u64 {
    let Some(me) = ph.me else { return 0 };
    let t = &ph.r.tree;
    let mine: BTreeSet<usize> =
        ph.by_sponsor.get(&me).into_iter().flatten().flat_map(|&i| ph.plan[i].nodes.iter().copied()).collect();
    t.path(me).into_iter().filter(|&v| v != t.root && ph.r.is_renewed(v) && !mine.contains(&v)).count() as u64
}

/// Checks a BKEY packet for `ph` (the next packet of its sender's in the
/// plan, blinded keys agreeing with those held) and only then records it.
fn accept_bkey<G: Group>(cx: &Ctx<'_, G>, ph: &mut Phase<G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
    let round = ROUND_BKEY;
    let mut r = Reader::new(body);
    r.u8("BKEY phase")?;
    let s = *ph.leaf.get(from).ok_or_else(|| Misbehaved::NotSponsor { round }.by(from))?;
    let done = ph.delivered.get(&s).copied().unwrap_or(0);
    let idx =
        *ph.by_sponsor.get(&s).and_then(|l| l.get(done)).ok_or_else(|| Misbehaved::NotSponsor { round }.by(from))?;
    let nodes = ph.plan[idx].nodes.clone();
    let k = r.count(MAX_MEMBERS, cx.g.element_len(), "BKEY blinded keys")?;
    if k != nodes.len() {
        return Err(Misbehaved::WrongShape { round }.by(from));
    }
    let mut bks = Vec::with_capacity(k);
    for _ in 0..k {
        bks.push(Bk::read(&mut r, cx.g)?);
    }
    r.finish()?;
    let t = &mut ph.r.tree;
    if nodes.iter().zip(&bks).any(|(&v, bk)| t.nodes[v].bk.as_ref().is_some_and(|b| b != bk)) {
        return Err(Misbehaved::Inconsistent { round }.by(from));
    }
    for (&v, bk) in nodes.iter().zip(bks) {
        t.nodes[v].bk = Some(bk);
    }
    ph.delivered.insert(s, done + 1);
    ph.total += 1;
    Ok(())
}

/// One step of a phase: this member's path keys and group (or T') secret as
/// far as it can, its packets that are ready. Whether the phase's last
/// packet is in.
fn step<G: Group>(cx: &mut Ctx<'_, G>, ph: &mut Phase<G>, stats: &mut IntervalStats) -> Result<bool, Error> {
    if let Some(me) = ph.me {
        if ph.lone() {
            if ph.kind == Kind::Main && ph.secret.is_none() {
                let t = &mut ph.r.tree;
                let r = t.nodes[me].key.clone().ok_or(Error::Internal("lone member without a key"))?;
                let bk = cx.exp_g(&r);
                ph.secret = Some(cx.exp(&bk, &r));
                t.nodes[me].bk = Some(Bk::computed(cx.g, bk));
            }
        } else {
            ph.r.tree.climb(cx, me, false);
            // T' whose root was kept needs no secret: its root's key is held.
            let root_held = ph.kind != Kind::Main && ph.r.tree.nodes[ph.r.tree.root].key.is_some();
            if ph.secret.is_none() && !root_held {
                ph.secret = ph.r.tree.group_secret(cx, me);
            }
            send_ready(cx, ph, stats)?;
            if ph.kind == Kind::Main {
                count_reactive(ph, me, stats);
            }
        }
    }
    Ok(ph.total >= ph.plan.len())
}

/// SEAL's per-input sending, counted (`IntervalStats::reactive_packets_sent`):
/// one packet if this input let the member compute blinded keys of its list
/// beyond those counted so far.
fn count_reactive<G: Group>(ph: &mut Phase<G>, me: usize, stats: &mut IntervalStats) {
    let Some(mine) = ph.by_sponsor.get(&me) else { return };
    let t = &ph.r.tree;
    let can = |v: usize| t.nodes[v].bk.is_some() || t.nodes[v].key.is_some() || (v == t.root && ph.secret.is_some());
    let ready = mine.iter().flat_map(|&i| &ph.plan[i].nodes).take_while(|&&v| can(v)).count();
    if ready > ph.reactive {
        ph.reactive = ready;
        stats.reactive_packets_sent += 1;
    }
}

/// The first phase of a rekey: Queue-subtree for Queue-batch with two or
/// more joiners, else the rekey proper.
fn first_phase<G: Group>(
    algorithm: Algorithm,
    base: Option<&Tree<G>>,
    batch: &Batch,
    me: &MemberId,
) -> Result<Phase<G>, crate::interval::BatchError> {
    match algorithm {
        Algorithm::QueueBatch if batch.joins.len() >= 2 => {
            // Check the whole batch first; T' alone is a Batch from nothing.
            Algorithm::QueueBatch.apply(base, batch)?;
            let sub = Algorithm::Batch.apply::<G>(None, &Batch { joins: batch.joins.clone(), leaves: Vec::new() })?;
            Ok(Phase::new(Kind::Subtree, sub.expect("joiners"), me))
        }
        Algorithm::QueueBatch => {
            let sub = batch.joins.first().map(|j| Tree::leaf(j.clone(), None, None));
            let r = queue_merge(base, sub.as_ref(), &batch.leaves)?;
            r.map(|r| Phase::new(Kind::Main, r, me)).ok_or(crate::interval::BatchError::TooMany)
        }
        a => a.apply(base, batch)?.map(|r| Phase::new(Kind::Main, r, me)).ok_or(crate::interval::BatchError::TooMany),
    }
}

/// A joiner draws its leaf key: a fresh leaf, a lone T' leaf (Queue-batch
/// with one joiner and T' not keyed in the view: its blinded key too, as
/// Queue-subtree would have), or a lone member's refreshed leaf.
fn draw_fresh<G: Group>(cx: &mut Ctx<'_, G>, ph: &mut Phase<G>) {
    let Some(me) = ph.me else { return };
    let fresh = ph.r.is_fresh(me);
    let t = &mut ph.r.tree;
    if fresh || t.nodes.len() == 1 {
        t.nodes[me].key = Some(cx.random());
    } else if t.nodes[me].key.is_none() {
        let k = cx.random();
        let bk = cx.exp_g(&k);
        t.nodes[me].bk = Some(Bk::computed(cx.g, bk));
        t.nodes[me].key = Some(k);
    }
}

/// Sends this member's next packets of the plan while it can compute them.
fn send_ready<G: Group>(cx: &mut Ctx<'_, G>, ph: &mut Phase<G>, stats: &mut IntervalStats) -> Result<(), Error> {
    let Some(me) = ph.me else { return Ok(()) };
    let Some(mine) = ph.by_sponsor.get(&me) else { return Ok(()) };
    while let Some(&idx) = mine.get(ph.sent) {
        let nodes = &ph.plan[idx].nodes;
        let t = &ph.r.tree;
        let can =
            |v: usize| t.nodes[v].bk.is_some() || t.nodes[v].key.is_some() || (v == t.root && ph.secret.is_some());
        if !nodes.iter().all(|&v| can(v)) {
            return Ok(());
        }
        let mut bks = Vec::with_capacity(nodes.len());
        for &v in nodes {
            let n = &ph.r.tree.nodes[v];
            let bk = if let Some(b) = &n.bk {
                b.clone()
            } else if let (true, Some(s)) = (v == ph.r.tree.root, ph.secret.as_ref()) {
                let mut k = cx.g.hash_to_scalar(domains::TGDH_NODE, s);
                let b = cx.exp_g(&k);
                k.zeroize();
                Bk::computed(cx.g, b)
            } else {
                // (A kept T''s root has its key and no secret.)
                let k = n.key.clone().ok_or(Error::Internal("node without a key"))?;
                let b = cx.exp_g(&k);
                Bk::computed(cx.g, b)
            };
            bks.push(bk);
        }
        let mut w = Writer::new();
        w.u8(ph.kind as u8);
        w.count(bks.len());
        for bk in &bks {
            bk.write(&mut w);
        }
        for (&v, bk) in nodes.iter().zip(bks) {
            ph.r.tree.nodes[v].bk = Some(bk);
        }
        stats.bks_sent += nodes.len() as u64;
        stats.packets_sent += 1;
        if ph.kind != Kind::Main {
            stats.subtree_bks_sent += nodes.len() as u64;
            stats.subtree_packets_sent += 1;
        }
        cx.broadcast(ROUND_BKEY, w.buf);
        ph.sent += 1;
    }
    Ok(())
}

impl<G: Group> Protocol<G> for Seal<G> {
    const ID: ProtocolId = ProtocolId::Tgdh;
    const INTERVAL: bool = true;

    fn new() -> Self {
        Self {
            algorithm: IntervalAlgorithm::Batch,
            saved: None,
            mine: Members::default(),
            rekey: None,
            queue: None,
            last_sub: None,
            together: MemberSet::default(),
            ticked: false,
            rekeyed_in_view: false,
            admitting: false,
            rekey_on_leave: false,
            stats: IntervalStats::default(),
        }
    }

    fn reset(&mut self) {
        let (algorithm, rekey_on_leave, stats) = (self.algorithm, self.rekey_on_leave, self.stats);
        *self = Self::new();
        self.algorithm = algorithm;
        self.rekey_on_leave = rekey_on_leave;
        self.stats = stats;
    }

    fn on_view(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        self.mine = change.mine.clone();
        self.together = change.together.to_set(cx);
        self.ticked = false;
        self.rekeyed_in_view = false;
        let admitted_afresh = std::mem::take(&mut self.admitting);
        // T' as keyed in the last view (if it was) is the base of this view's.
        self.last_sub = self.queue.take().and_then(|q| q.done);
        let leads = &cx.view.members[0].id == cx.me;
        if let Some(mut rk) = self.rekey.take() {
            // The rekey's members that came from the last view with this
            // member go on with it: they delivered the same packets there
            // (virtual synchrony), so they hold the same state of it.
            // (`together`: in every view since this member's last run began,
            // including views whose run the driver held back.)
            let going_on: BTreeSet<MemberId> =
                cx.view.ids().filter(|m| self.together.contains(*m) && rk.active.contains(*m)).cloned().collect();
            let gone = |m: &MemberId| !going_on.contains(m);
            let ph = &rk.phase;
            let unsent = ph.by_sponsor.iter().any(|(&s, list)| {
                ph.delivered.get(&s).copied().unwrap_or(0) < list.len() && ph.r.tree.member(s).is_some_and(gone)
            });
            // `:rekey-on-leave`: a leave is rekeyed at once, so a rekey that
            // lost a member (who could compute its key) starts again.
            let unsent = unsent || (self.rekey_on_leave && rk.active.iter().any(gone));
            // SEAL §3.6: a rekey goes on unless its leader or a sponsor that
            // had not sent all its packets left; the leave is the next
            // rekey's. It goes on only if its leader still leads (a merge
            // with an older member hands the lead, and the next rekey, to
            // that member). In Queue-batch's Queue-subtree in the run, the
            // merge's sponsors are still to come: it goes on only if every
            // member of T' stays, and the merge then takes the old members
            // that left out of the tree.
            let subtree_whole = rk.phase.kind == Kind::Main || rk.phase.leaf.keys().all(|m| !gone(m));
            let carry =
                !unsent && !admitted_afresh && !gone(&rk.leader) && cx.view.members[0].id == rk.leader && subtree_whole;
            if carry {
                rk.active = going_on;
                rk.carried = true;
                // Its packets sent in the last view and not delivered there
                // went to nobody that goes on: send them again in this one.
                if let Some(me) = rk.phase.me {
                    rk.phase.sent = rk.phase.delivered.get(&me).copied().unwrap_or(0);
                }
                self.rekey = Some(rk);
                self.stats.carried += 1;
                return self.advance(cx);
            }
            if (gone(&rk.leader) || unsent) && leads {
                // The restarted rekey keys T' in its run.
                self.stats.restarts += 1;
                return self.start_rekey(cx);
            }
        }
        if leads {
            self.announce(cx);
        }
        Ok(())
    }

    fn interval_stats(&self) -> Option<IntervalStats> {
        Some(self.stats)
    }

    fn admitting(&mut self) {
        self.admitting = true;
    }

    fn on_tick(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        if &cx.view.members[0].id != cx.me {
            return Err(Error::BadView("only the leader ticks"));
        }
        if self.rekey.is_some() || self.ticked {
            return Ok(());
        }
        self.start_rekey(cx)
    }

    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error> {
        match round {
            ROUND_REKEY => self.on_rekey(cx, from, body),
            ROUND_BKEY => self.on_bkey(cx, from, body),
            ROUND_QUEUE => self.on_queue(cx, from, body),
            _ => Err(Misbehaved::UnknownRound { round }.by(from)),
        }
    }

    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        let mut keys: Vec<G::Scalar> = self.saved.iter().flat_map(|t| t.keys()).cloned().collect();
        let mut elems = Vec::new();
        let mut phases: Vec<&Phase<G>> = Vec::new();
        phases.extend(self.rekey.as_ref().map(|rk| &rk.phase));
        if let Some(q) = &self.queue {
            phases.extend(q.phase.as_ref());
            keys.extend(q.done.iter().flat_map(|t| t.keys()).cloned());
        }
        keys.extend(self.last_sub.iter().flat_map(|t| t.keys()).cloned());
        for ph in phases {
            keys.extend(ph.r.tree.keys().cloned());
            elems.extend(ph.secret.iter().cloned());
        }
        (keys, elems)
    }

    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error> {
        match round {
            ROUND_REKEY => {
                Ok(RekeyMsg::decode(body, g)?.tree.iter().flat_map(|t| t.bks().cloned().collect::<Vec<_>>()).collect())
            }
            ROUND_QUEUE => {
                Ok(QueueMsg::decode(body, g)?.base.iter().flat_map(|t| t.bks().cloned().collect::<Vec<_>>()).collect())
            }
            ROUND_BKEY => {
                let mut r = Reader::new(body);
                r.u8("BKEY phase")?;
                let k = r.count(MAX_MEMBERS, g.element_len(), "BKEY blinded keys")?;
                (0..k).map(|_| get_elem(&mut r, g)).collect()
            }
            _ => Ok(Vec::new()),
        }
    }
}

/// The interval engine as an [`Engine`] (what `crate::new_interval_engine`
/// returns): [`Engine::tick`] is the interval's tick.
pub(crate) fn runner<G: Group>(
    g: G,
    group: String,
    me: MemberId,
    signer: Arc<dyn Signer>,
    directory: Arc<dyn Directory>,
    algorithm: IntervalAlgorithm,
    rekey_on_leave: bool,
) -> Runner<G, Seal<G>> {
    let mut runner = Runner::<G, Seal<G>>::new(g, group, me, signer, directory);
    runner.protocol_mut().algorithm = algorithm;
    runner.protocol_mut().rekey_on_leave = rekey_on_leave;
    runner
}

/// One member's interval TGDH engine (SEAL): see the module doc. Driven
/// like the other engines — views, messages in agreed order, randomness
/// injected — plus the interval's tick, which the driver gives the leader.
pub struct IntervalTgdh<G: Group> {
    runner: Runner<G, Seal<G>>,
}

impl<G: Group> IntervalTgdh<G> {
    /// A member with no state yet, computing in `g`, in `group`, using
    /// `algorithm`, trusting `directory`.
    pub fn new(
        g: G,
        group: String,
        me: MemberId,
        signer: Arc<dyn Signer>,
        directory: Arc<dyn Directory>,
        algorithm: IntervalAlgorithm,
    ) -> Self {
        Self { runner: runner(g, group, me, signer, directory, algorithm, false) }
    }

    /// The group rekeys at once on a leave (`:rekey-on-leave`; the driver
    /// ticks the leader when a member of the key in use leaves): a rekey
    /// under way that a view takes a member from is restarted at once by the
    /// leader, not carried on to a key the leaver could compute.
    pub fn rekey_on_leave(mut self) -> Self {
        self.runner.protocol_mut().rekey_on_leave = true;
        self
    }

    /// A view from the group communication layer: followed, not rekeyed
    /// (a rekey in progress goes on, is restarted or waits: see the module doc).
    /// Under Queue-batch the leader announces the view's T' if anybody joins.
    pub fn on_view(&mut self, view: &View, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.runner.on_view(view, rng)
    }

    /// The interval's tick: the leader broadcasts the rekey message if the
    /// batch is not empty and no rekey is under way. Refused at other
    /// members.
    pub fn tick(&mut self, rng: &mut dyn CryptoRngCore) -> Result<Vec<Output>, Error> {
        self.runner.tick(rng)
    }

    /// A message delivered in the current view. A rejected message changes
    /// no state.
    pub fn on_message(
        &mut self,
        from: &MemberId,
        bytes: &[u8],
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Vec<Output>, Error> {
        self.runner.on_message(from, bytes, rng)
    }

    /// The key in use: the last one installed (it outlives views until the
    /// next rekey), `None` before the first.
    pub fn secure_view(&self) -> Option<&SecureView> {
        self.runner.secure_view()
    }

    /// The epoch the next install would carry's view and current run.
    pub fn current_epoch(&self) -> Option<Epoch> {
        self.runner.current_epoch()
    }

    /// Whether a rekey is under way.
    pub fn rekeying(&self) -> bool {
        self.runner.protocol_ref().rekey.is_some()
    }

    /// Whether this member holds no key of the current group yet (it waits
    /// for the next rekey).
    pub fn waiting(&self) -> bool {
        self.runner.protocol_ref().saved.is_none()
    }

    /// Engine costs (exponentiations, signatures, verifications, broadcasts,
    /// bytes).
    pub fn costs(&self) -> Costs {
        self.runner.costs()
    }

    /// Blinded keys and packets sent, rekeys led, restarts.
    pub fn stats(&self) -> IntervalStats {
        self.runner.protocol_ref().stats
    }

    /// Test hook: the member's secrets.
    #[cfg(feature = "test-hooks")]
    pub fn leak(&self) -> crate::engine::Leak {
        self.runner.leak()
    }

    /// Test hook: the group elements a message carries.
    #[cfg(feature = "test-hooks")]
    pub fn public_elements(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        self.runner.public_elements(bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use conclave_gcs::view::Cause;
    use conclave_gcs::{MemberId, View, ViewId, ViewMember};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    use std::collections::BTreeSet;

    use super::{IntervalAlgorithm, IntervalStats, IntervalTgdh, Kind, ROUND_BKEY, ROUND_QUEUE, ROUND_REKEY};
    use crate::engine::{Error, Misbehaved, Output, StaticDirectory};
    use crate::interval::{Algorithm, Batch, IntervalCosts, MemberCosts};
    use crate::message::Envelope;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::{generate_signer, Signer};
    use crate::{Epoch, GroupId, ProtocolId, SignatureId};

    type E = IntervalTgdh<Ristretto255>;

    /// Members m0.. with engines, views in agreed order, and a FIFO of
    /// outputs delivered to every member of the current view.
    struct Net {
        algorithm: IntervalAlgorithm,
        names: Vec<MemberId>,
        signers: Vec<Arc<dyn Signer>>,
        dir: Arc<StaticDirectory>,
        engines: Vec<E>,
        /// The current view's members, oldest first.
        view: Vec<usize>,
        seq: u64,
        queue: VecDeque<(usize, Vec<u8>)>,
        /// Every broadcast so far (what a leaver listening on could see).
        wire: Vec<Vec<u8>>,
        /// Deliveries refused as of an earlier run (a rekey message overtook
        /// them): the driver drops them.
        stale: usize,
        /// Deliveries a member dropped as of a rekey it takes no part in (a
        /// newcomer's, of a rekey carried on into its view).
        ignored: usize,
        /// Members rekey at once on a leave (`IntervalTgdh::rekey_on_leave`).
        on_leave: bool,
        rng: ChaCha20Rng,
    }

    impl Net {
        /// Whether the attacker model reaches `target` from the secrets
        /// `scalars` and `elements` and every element broadcast so far (read
        /// as member `via` reads the wire).
        #[cfg(feature = "test-hooks")]
        fn reaches(&self, via: usize, scalars: &[Vec<u8>], elements: &[Vec<u8>], target: &[u8]) -> Option<bool> {
            use crate::engine::Engine;
            let publics: Vec<Vec<u8>> =
                self.wire.iter().flat_map(|b| self.engines[via].public_elements(b).unwrap_or_default()).collect();
            let domains = crate::testing::domains(ProtocolId::Tgdh);
            self.engines[via].runner.attacker().can_reach(scalars, elements, &publics, target, &domains, 2, 2_000_000)
        }

        fn new(algorithm: IntervalAlgorithm, n: usize, seed: u64) -> Net {
            let mut rng = ChaCha20Rng::seed_from_u64(seed);
            let names: Vec<MemberId> = (0..n).map(|i| MemberId::new(format!("m{i}")).unwrap()).collect();
            let signers: Vec<Arc<dyn Signer>> =
                names.iter().map(|_| generate_signer(SignatureId::Ed25519, &mut rng).unwrap()).collect();
            let mut dir = StaticDirectory::new();
            for (m, s) in names.iter().zip(&signers) {
                dir.insert(m.clone(), s.verifier());
            }
            let dir = Arc::new(dir);
            let mut net = Net {
                algorithm,
                names,
                signers,
                dir,
                engines: Vec::new(),
                view: Vec::new(),
                seq: 0,
                queue: VecDeque::new(),
                wire: Vec::new(),
                stale: 0,
                ignored: 0,
                on_leave: false,
                rng,
            };
            net.engines = (0..n).map(|i| net.fresh(i)).collect();
            net
        }

        fn fresh(&self, i: usize) -> E {
            let e = E::new(
                Ristretto255,
                "seal".into(),
                self.names[i].clone(),
                self.signers[i].clone(),
                self.dir.clone(),
                self.algorithm,
            );
            if self.on_leave {
                e.rekey_on_leave()
            } else {
                e
            }
        }

        fn push(&mut self, from: usize, outs: Vec<Output>) {
            for o in outs {
                if let Output::Send { bytes, .. } = o {
                    self.wire.push(bytes.clone());
                    self.queue.push_back((from, bytes));
                }
            }
        }

        /// A view of the current members minus `leave`, plus `join` (new
        /// processes) at the end, then everything sent in it delivered (the
        /// interval goes on: Queue-batch keys T').
        fn change(&mut self, join: &[usize], leave: &[usize]) {
            self.change_quiet(join, leave);
            self.pump(None);
        }

        /// The view only: undelivered messages of the last view are lost,
        /// those its members send at the view wait in the queue.
        fn change_quiet(&mut self, join: &[usize], leave: &[usize]) {
            self.queue.clear();
            let last = (self.seq > 0).then(|| ViewId::new(1, self.seq));
            self.seq += 1;
            let mut members: Vec<ViewMember> = Vec::new();
            let mut now = Vec::new();
            for &i in &self.view {
                if !leave.contains(&i) {
                    members.push(ViewMember { id: self.names[i].clone(), prev: last });
                    now.push(i);
                }
            }
            for &j in join {
                self.engines[j] = self.fresh(j);
                members.push(ViewMember { id: self.names[j].clone(), prev: None });
                now.push(j);
            }
            let view = View { id: ViewId::new(1, self.seq), members: members.into(), cause: Cause::Join };
            self.view = now;
            for &i in &self.view.clone() {
                let outs = self.engines[i].on_view(&view, &mut self.rng).unwrap();
                self.push(i, outs);
            }
        }

        fn leader(&self) -> usize {
            self.view[0]
        }

        fn tick(&mut self) {
            let l = self.leader();
            let outs = self.engines[l].tick(&mut self.rng).unwrap();
            self.push(l, outs);
        }

        /// Delivers up to `limit` queued messages (all if `None`), each to
        /// every member of the view; every delivery must be accepted, but a
        /// message of an earlier run (counted in `stale`) is refused by all.
        fn pump(&mut self, limit: Option<usize>) {
            let mut n = 0;
            while limit.is_none_or(|l| n < l) {
                let Some((from, bytes)) = self.queue.pop_front() else { break };
                n += 1;
                let mut refused = 0;
                for &j in &self.view.clone() {
                    let sender = self.names[from].clone();
                    match self.engines[j].on_message(&sender, &bytes, &mut self.rng) {
                        Ok(outs) => self.push(j, outs),
                        Err(Error::WrongRun { .. }) => refused += 1,
                        Err(Error::Ignored(_)) if !self.engines[j].rekeying() => self.ignored += 1,
                        Err(e) => panic!("{} refused a message of {}: {e}", self.names[j], self.names[from]),
                    }
                }
                assert!(refused == 0 || refused == self.view.len(), "a message of an earlier run for some only");
                self.stale += usize::from(refused > 0);
            }
        }

        /// Everyone in the view holds the same key, of a run after the
        /// view's first; returns it.
        fn agreed(&self) -> [u8; 32] {
            let first = self.engines[self.view[0]].secure_view().expect("a key");
            for &i in &self.view {
                let sv = self.engines[i].secure_view().unwrap_or_else(|| panic!("{} has no key", self.names[i]));
                assert_eq!(sv.key.expose_secret(), first.key.expose_secret(), "{} differs", self.names[i]);
                assert_eq!(sv.epoch, first.epoch);
                assert_eq!(sv.epoch.view, ViewId::new(1, self.seq), "the key is of the current view");
                assert!(sv.epoch.run >= 1, "installed by a rekey, not by the view");
                assert!(!self.engines[i].rekeying() && !self.engines[i].waiting());
                let mut ids: Vec<&MemberId> = sv.members.iter().collect();
                ids.sort();
                let mut want: Vec<&MemberId> = self.view.iter().map(|&i| &self.names[i]).collect();
                want.sort();
                assert_eq!(ids, want);
            }
            *first.key.expose_secret()
        }

        fn rekey(&mut self) -> [u8; 32] {
            self.tick();
            self.pump(None);
            self.agreed()
        }

        /// A signed message from member `i` in the current view and run.
        fn forge(&self, i: usize, run: u32, seq: u32, round: u8, body: Vec<u8>) -> Vec<u8> {
            let mut env = Envelope {
                protocol: ProtocolId::Tgdh,
                group_id: GroupId::Ristretto255,
                group: "seal".into(),
                view: ViewId::new(1, self.seq),
                run,
                sender: self.names[i].clone(),
                recipient: None,
                round,
                seq,
                body,
                signature: Vec::new(),
            };
            env.signature = self.signers[i].sign(&env.signed_bytes());
            env.encode()
        }
    }

    #[test]
    fn every_algorithm_gives_every_member_one_key_at_each_rekey_over_intervals_of_joins_and_leaves() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 14, 1);
            // The group forms: views come and go, nobody has a key until
            // the first tick.
            net.change(&[0, 1], &[]);
            net.change(&[2, 3, 4], &[]);
            assert!(net.view.iter().all(|&i| net.engines[i].secure_view().is_none() && net.engines[i].waiting()));
            let mut keys = vec![net.rekey()];
            // Intervals: (joins, leaves) per view, then a tick.
            let script: [&[(&[usize], &[usize])]; 6] = [
                &[(&[5], &[]), (&[6], &[1])],
                &[(&[], &[3]), (&[7, 8], &[])],
                // m9 joins and leaves within the interval: no trace of it.
                &[(&[9], &[]), (&[], &[9]), (&[10], &[2])],
                // The leader leaves between ticks: m4 leads next.
                &[(&[], &[0])],
                &[(&[11, 12], &[5, 6])],
                &[(&[13], &[]), (&[], &[8])],
            ];
            for interval in script {
                let before = net.view.clone();
                for (j, l) in interval {
                    net.change(j, l);
                    // The old key stays in use until the rekey, for those who had it.
                    for &i in &net.view {
                        if before.contains(&i) {
                            let k = net.engines[i].secure_view().map(|sv| *sv.key.expose_secret());
                            assert_eq!(k, keys.last().copied(), "{a:?}");
                        }
                    }
                }
                let k = net.rekey();
                assert!(!keys.contains(&k), "{a:?}: a new key");
                keys.push(k);
            }
            // Re-joining under the same name (a new process) is a leave and a join.
            net.change(&[], &[7]);
            net.change(&[7], &[]);
            let k = net.rekey();
            assert!(!keys.contains(&k), "{a:?}");
        }
    }

    #[test]
    fn a_tick_with_nothing_to_do_sends_nothing_and_only_the_leader_ticks() {
        let mut net = Net::new(IntervalAlgorithm::Batch, 3, 2);
        net.change(&[0, 1, 2], &[]);
        let k = net.rekey();
        let l = net.leader();
        assert!(net.engines[l].tick(&mut net.rng).unwrap().is_empty());
        assert!(matches!(net.engines[1].tick(&mut net.rng), Err(Error::BadView(_))));
        assert_eq!(net.agreed(), k);
    }

    /// What interval.rs says the members spend on `batch` applied to the
    /// tree `leader` holds: the rekey (Queue-batch: Queue-merge of the T'
    /// keyed in the interval) and, for Queue-batch, Queue-subtree of the
    /// joiners from nothing (T' of one: its member's leaf blinded key).
    fn expected(net: &Net, leader: usize, batch: &Batch) -> (IntervalCosts, IntervalCosts) {
        let p = net.engines[leader].runner.protocol_ref();
        let old = p.saved.as_ref();
        let main = net.algorithm.inner().apply(old, batch).unwrap().unwrap().costs();
        let mut sub = IntervalCosts::default();
        if net.algorithm == IntervalAlgorithm::QueueBatch && batch.joins.len() >= 2 {
            sub = Algorithm::Batch
                .apply::<Ristretto255>(None, &Batch { joins: batch.joins.clone(), leaves: vec![] })
                .unwrap()
                .unwrap()
                .subtree_costs();
        } else if net.algorithm == IntervalAlgorithm::QueueBatch {
            for j in &batch.joins {
                sub.members.insert(j.clone(), MemberCosts { exps: 1, ..MemberCosts::default() });
            }
        }
        (main, sub)
    }

    #[test]
    fn exponentiations_blinded_keys_and_packets_metered_on_real_rekeys_equal_the_interval_counts() {
        type Snap = Vec<(u64, IntervalStats)>;
        let snap = |net: &Net| -> Snap { net.engines.iter().map(|e| (e.costs().exps, e.stats())).collect() };
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 16, 3);
            net.change(&[0, 1, 2, 3, 4, 5, 6, 7], &[]);
            net.rekey();
            let cases: [(&[usize], &[usize]); 5] =
                [(&[8], &[3]), (&[9, 10, 11], &[0, 5]), (&[], &[1, 6]), (&[12, 13], &[]), (&[14], &[])];
            for (join, leave) in cases {
                // The view, and the interval after it (T' keyed there).
                let at_view = snap(&net);
                net.change(join, leave);
                let leader = net.leader();
                let batch = net.engines[leader].runner.protocol_ref().own_batch(&view_of(&net));
                let (main, sub) = expected(&net, leader, &batch);
                let old = net.engines[leader].runner.protocol_ref().saved.clone();
                let plan = net.algorithm.inner().apply(old.as_ref(), &batch).unwrap().unwrap();
                let before = snap(&net);
                net.rekey();
                assert_eq!(net.stale, 0, "{a:?}");
                let mut totals = [0u64; 4];
                for &i in &net.view {
                    let m = &net.names[i];
                    let e = &net.engines[i];
                    let (st, st0, stv) = (e.stats(), before[i].1, at_view[i].1);
                    // The rekey: the main plan's counts, none of them Queue-subtree's.
                    let want = main.members[m];
                    let got =
                        (e.costs().exps - before[i].0, st.bks_sent - st0.bks_sent, st.packets_sent - st0.packets_sent);
                    assert_eq!(got, (want.exps, want.bks_sent, want.packets_sent), "{a:?} {m}: rekey");
                    // Counted SEAL's way (§4.2): a key and a blinded key per
                    // renewed node of the key path (the root's: the group
                    // secret and g^K0), and a joiner's fresh leaf blinded.
                    let leaf = plan.tree.find(m).unwrap();
                    let renewed = plan.tree.path(leaf).into_iter().filter(|&v| plan.is_renewed(v)).count() as u64;
                    let seal = got.0 + st.path_bks_not_blinded - st0.path_bks_not_blinded;
                    assert_eq!(seal, 2 * renewed + u64::from(plan.is_fresh(leaf)), "{a:?} {m}: SEAL's count");
                    // Sending per input never sends fewer packets than per
                    // round (each round's packet waits for another input).
                    let reactive = st.reactive_packets_sent - st0.reactive_packets_sent;
                    assert!(reactive >= got.2, "{a:?} {m}: {reactive} < {}", got.2);
                    assert_eq!(st.subtree_exps, st0.subtree_exps, "{a:?} {m}");
                    assert_eq!(st.subtree_packets_sent, st0.subtree_packets_sent, "{a:?} {m}");
                    // The interval: Queue-subtree's counts, all metered as such
                    // (a joiner's engine is new at the view: it starts from 0).
                    let (exps0, stv) =
                        if join.contains(&i) { (0, IntervalStats::default()) } else { (at_view[i].0, stv) };
                    let w = sub.members.get(m).copied().unwrap_or_default();
                    let got = (before[i].0 - exps0, st0.bks_sent - stv.bks_sent, st0.packets_sent - stv.packets_sent);
                    assert_eq!(got, (w.exps, w.bks_sent, w.packets_sent), "{a:?} {m}: interval");
                    let split = (st0.subtree_exps - stv.subtree_exps, st0.subtree_bks_sent - stv.subtree_bks_sent);
                    assert_eq!(split, (w.exps, w.bks_sent), "{a:?} {m}: metered as Queue-subtree");
                    let queued = a == IntervalAlgorithm::QueueBatch && !join.is_empty();
                    assert_eq!(st.merged_ready - st0.merged_ready, u64::from(queued), "{a:?} {m}");
                    assert_eq!(st.keyed_in_run, 0, "{a:?} {m}");
                    totals[0] += st.bks_sent - st0.bks_sent;
                    totals[1] += st.packets_sent - st0.packets_sent;
                    totals[2] += st0.bks_sent - stv.bks_sent;
                    totals[3] += st0.packets_sent - stv.packets_sent;
                }
                assert_eq!(totals, [main.bks, main.packets, sub.bks, sub.packets], "{a:?} {join:?} {leave:?}");
            }
        }
    }

    fn view_of(net: &Net) -> View {
        let members = net
            .view
            .iter()
            .map(|&i| ViewMember { id: net.names[i].clone(), prev: Some(ViewId::new(1, net.seq - 1)) })
            .collect();
        View { id: ViewId::new(1, net.seq), members, cause: Cause::Join }
    }

    #[test]
    fn a_sponsor_leaving_before_it_sent_restarts_the_rekey_with_its_nodes_renewed() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 10, 4);
            net.change(&[0, 1, 2, 3, 4, 5], &[]);
            let k0 = net.rekey();
            net.change(&[6, 7], &[2]);
            net.tick();
            // The rekey message only: every sponsor still has to send.
            net.pump(Some(1));
            let leader = net.leader();
            let sponsors: Vec<usize> = {
                let rk = net.engines[leader].runner.protocol_ref().rekey.as_ref().expect("rekeying");
                let ph = &rk.phase;
                ph.by_sponsor
                    .keys()
                    .map(|&s| ph.r.tree.member(s).unwrap().clone())
                    .map(|m| net.names.iter().position(|n| *n == m).unwrap())
                    .collect()
            };
            let gone = *sponsors.iter().find(|&&s| s != leader).expect("a sponsor other than the leader");
            net.change_quiet(&[], &[gone]);
            assert!(net.engines[net.leader()].rekeying() || !net.queue.is_empty(), "{a:?}: restarted at once");
            assert_eq!(net.engines[net.leader()].stats().restarts, 1, "{a:?}");
            net.pump(None);
            let k = net.agreed();
            assert_ne!(k, k0, "{a:?}");
        }
    }

    #[test]
    fn the_leader_leaving_mid_rekey_hands_the_restart_to_the_next_oldest() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 8, 5);
            net.change(&[0, 1, 2, 3], &[]);
            net.rekey();
            net.change(&[4, 5], &[]);
            net.tick();
            net.pump(Some(2));
            assert!(net.engines[1].rekeying(), "{a:?}");
            net.change(&[], &[0]);
            assert_eq!(net.leader(), 1);
            assert_eq!(net.engines[1].stats().restarts, 1, "{a:?}");
            net.pump(None);
            net.agreed();
        }
    }

    /// Pumps the rekey under way one message at a time until a member other
    /// than the leader may leave without stopping it (SEAL 3.6: it is no
    /// sponsor, or has sent all its packets), with packets still to come;
    /// returns that member.
    fn pump_until_a_free_leaver(net: &mut Net) -> Option<usize> {
        loop {
            let leader = net.leader();
            let rk = net.engines[leader].runner.protocol_ref().rekey.as_ref();
            if let Some(ph) = rk.map(|rk| &rk.phase).filter(|ph| ph.kind == Kind::Main) {
                let free = net.view.iter().copied().find(|&i| {
                    let leaf = ph.leaf.get(&net.names[i]);
                    let sent_all = leaf.is_none_or(|l| {
                        ph.by_sponsor.get(l).is_none_or(|list| ph.delivered.get(l).copied().unwrap_or(0) == list.len())
                    });
                    i != leader && leaf.is_some() && sent_all
                });
                if free.is_some() && ph.total < ph.plan.len() {
                    return free;
                }
            }
            if net.queue.is_empty() {
                return None;
            }
            net.pump(Some(1));
        }
    }

    /// Pumps the rekey under way one message at a time into Queue-subtree's
    /// packets in the rekey's run, with packets of it still to come.
    fn pump_into_subtree(net: &mut Net) {
        let subtree = |net: &Net| {
            let rk = net.engines[net.leader()].runner.protocol_ref().rekey.as_ref();
            rk.is_some_and(|rk| rk.phase.kind == Kind::Subtree && rk.phase.total < rk.phase.plan.len())
        };
        while !subtree(net) {
            assert!(!net.queue.is_empty(), "Queue-subtree ran out");
            net.pump(Some(1));
        }
    }

    /// The members of the view that hold a key hold the same one, of
    /// `epoch`, whose members they are; the others wait. Returns the key.
    fn agreed_among(net: &Net, epoch: Epoch, waiting: &[usize]) -> [u8; 32] {
        let holders: Vec<usize> = net.view.iter().copied().filter(|i| !waiting.contains(i)).collect();
        let first = net.engines[holders[0]].secure_view().expect("a key").clone();
        for &i in &holders {
            let sv = net.engines[i].secure_view().unwrap_or_else(|| panic!("{} has no key", net.names[i]));
            assert_eq!(sv.key.expose_secret(), first.key.expose_secret(), "{} differs", net.names[i]);
            assert_eq!(sv.epoch, epoch, "{}", net.names[i]);
            assert!(!net.engines[i].rekeying());
            let want: Vec<&MemberId> = holders.iter().map(|&h| &net.names[h]).collect();
            assert_eq!(sv.members.iter().collect::<Vec<_>>(), want, "the key's members are its holders, in view order");
        }
        for &w in waiting {
            assert!(net.engines[w].waiting(), "{} holds a key it took no part in", net.names[w]);
        }
        *first.key.expose_secret()
    }

    #[test]
    fn a_leave_during_a_rekey_that_takes_neither_its_leader_nor_an_unsent_sponsor_carries_it_on() {
        for a in IntervalAlgorithm::ALL {
            let mut carried = 0;
            for seed in 0..6 {
                let mut net = Net::new(a, 10, 20 + seed);
                net.change(&[0, 1, 2, 3, 4, 5], &[]);
                let k0 = net.rekey();
                net.change(&[6, 7], &[3]);
                net.tick();
                let Some(leaver) = pump_until_a_free_leaver(&mut net) else { continue };
                carried += 1;
                // The view loses what was still on its way: sponsors send it
                // again in the new view.
                net.change_quiet(&[], &[leaver]);
                let leader = net.leader();
                assert!(net.view.iter().all(|&i| net.engines[i].rekeying()), "{a:?}: the rekey goes on");
                assert_eq!(net.engines[leader].stats().restarts, 0, "{a:?}");
                assert_eq!(net.engines[leader].stats().carried, 1, "{a:?}");
                net.pump(None);
                assert_eq!(net.ignored, 0);
                let k1 = agreed_among(&net, Epoch::new(ViewId::new(1, net.seq), 0), &[]);
                assert_ne!(k1, k0, "{a:?}");
                // The leaver is still in the tree: the next rekey takes it out.
                let tree = net.engines[leader].runner.protocol_ref().saved.as_ref().unwrap().members();
                assert!(tree.contains(&net.names[leaver]), "{a:?}");
                let k2 = net.rekey();
                let tree = net.engines[leader].runner.protocol_ref().saved.as_ref().unwrap().members();
                assert!(!tree.contains(&net.names[leaver]) && k2 != k1, "{a:?}");
            }
            assert!(carried >= 3, "{a:?}: only {carried} rekeys with a member free to leave");
        }
    }

    #[test]
    fn with_rekey_on_leave_a_leave_during_a_rekey_restarts_it_without_the_leaver() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 10, 22);
            net.on_leave = true;
            net.engines = (0..10).map(|i| net.fresh(i)).collect();
            net.change(&[0, 1, 2, 3, 4, 5], &[]);
            net.rekey();
            net.change(&[6, 7], &[3]);
            net.tick();
            let leaver = pump_until_a_free_leaver(&mut net).expect("a member free to leave");
            net.change_quiet(&[], &[leaver]);
            let leader = net.leader();
            assert_eq!(net.engines[leader].stats().carried, 0, "{a:?}");
            assert_eq!(net.engines[leader].stats().restarts, 1, "{a:?}: restarted at once");
            net.pump(None);
            net.agreed();
            let tree = net.engines[leader].runner.protocol_ref().saved.as_ref().unwrap().members();
            assert!(!tree.contains(&net.names[leaver]), "{a:?}: the leaver is out of the key's tree");
        }
    }

    #[test]
    fn an_old_member_leaving_during_queue_subtree_in_the_run_is_merged_out_and_the_rekey_goes_on() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 10, 11);
        net.change(&[0, 1, 2, 3], &[]);
        net.rekey();
        // The tick before T' is keyed: T' is keyed in the rekey's run.
        net.change_quiet(&[4, 5, 6], &[]);
        net.tick();
        // Through the rekey message (and T''s first packets, refused as of
        // the view's first run), into Queue-subtree's packets.
        pump_into_subtree(&mut net);
        // m2, an old member (no T' sponsor), leaves mid Queue-subtree.
        net.change_quiet(&[], &[2]);
        assert!(net.view.iter().all(|&i| net.engines[i].rekeying()), "the rekey goes on");
        assert_eq!(net.engines[0].stats().carried, 1);
        net.pump(None);
        let k = agreed_among(&net, Epoch::new(ViewId::new(1, net.seq), 0), &[]);
        let tree = net.engines[0].runner.protocol_ref().saved.as_ref().unwrap().members();
        assert!(!tree.contains(&net.names[2]), "the leaver is merged out");
        assert_eq!(tree.len(), net.view.len());
        // Nothing is left for the next tick: the leave was this rekey's.
        net.tick();
        assert!(net.queue.is_empty());
        assert_eq!(agreed_among(&net, Epoch::new(ViewId::new(1, net.seq), 0), &[]), k);
        // A T' member leaving mid Queue-subtree stops it until the next tick.
        net.change_quiet(&[7, 8], &[]);
        net.tick();
        pump_into_subtree(&mut net);
        net.change_quiet(&[], &[7]);
        assert_eq!(net.engines[0].stats().carried, 1, "not carried with T' short of a member");
        net.pump(None);
        net.rekey();
    }

    #[test]
    fn a_member_back_in_the_interval_is_merged_out_and_in_when_queue_subtree_goes_on() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 10, 12);
        net.change(&[0, 1, 2, 3, 4], &[]);
        net.rekey();
        // m2 leaves and comes back (a leave and a join), with two others.
        net.change(&[], &[2]);
        net.change_quiet(&[2, 5, 6], &[]);
        net.tick();
        pump_into_subtree(&mut net);
        // m3, an old member, leaves mid Queue-subtree: m2 still leaves the
        // old tree and joins through T'.
        net.change_quiet(&[], &[3]);
        assert_eq!(net.engines[0].stats().carried, 1);
        net.pump(None);
        agreed_among(&net, Epoch::new(ViewId::new(1, net.seq), 0), &[]);
        let tree = net.engines[0].runner.protocol_ref().saved.as_ref().unwrap().members();
        assert_eq!(tree.len(), net.view.len());
        assert!(!tree.contains(&net.names[3]));
    }

    #[test]
    fn a_join_during_a_rekey_carries_it_on_and_the_newcomer_waits_for_the_next_tick() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 8, 6);
            net.change(&[0, 1, 2, 3, 4], &[]);
            let k0 = net.rekey();
            net.change(&[5], &[]);
            net.tick();
            net.pump(Some(1));
            // A newcomer arrives mid-rekey: nobody left, the rekey goes on
            // among the members it started with; the newcomer drops its
            // packets.
            net.change_quiet(&[6], &[]);
            assert!(net.view.iter().filter(|&&i| i != 6).all(|&i| net.engines[i].rekeying()), "{a:?}");
            net.pump(None);
            assert!(net.ignored > 0, "{a:?}: the newcomer saw the rekey's packets");
            let k1 = agreed_among(&net, Epoch::new(ViewId::new(1, net.seq), 0), &[6]);
            assert_ne!(k1, k0);
            // Queue-batch: the leader announced the newcomer's T' at the install.
            if a == IntervalAlgorithm::QueueBatch {
                assert_eq!(net.engines[net.leader()].stats().queues_led, 3, "one per view with joiners, and this");
            }
            // Cascade: another view before the next tick, then the tick.
            net.change(&[], &[3]);
            let k = net.rekey();
            assert_ne!(k, k1);
        }
    }

    #[test]
    fn a_merge_with_an_older_member_during_a_rekey_hands_the_next_rekey_to_it() {
        // m0..m2 are older than the group's members m3..m6 in the merged view
        // (views list members oldest first): the rekey of m3..m6 does not go
        // on under a leader that no longer leads; the next tick keys everyone.
        let mut net = Net::new(IntervalAlgorithm::Batch, 8, 9);
        net.change(&[3, 4, 5], &[]);
        net.rekey();
        net.change(&[6], &[]);
        net.tick();
        net.pump(Some(1));
        net.queue.clear();
        net.seq += 1;
        let last = ViewId::new(1, net.seq - 1);
        let mut members: Vec<ViewMember> =
            (0..3).map(|i| ViewMember { id: net.names[i].clone(), prev: None }).collect();
        members.extend([3, 4, 5, 6].map(|i| ViewMember { id: net.names[i].clone(), prev: Some(last) }));
        let view = View { id: ViewId::new(1, net.seq), members: members.into(), cause: Cause::Join };
        net.view = (0..7).collect();
        for i in 0..7 {
            if i < 3 {
                net.engines[i] = net.fresh(i);
            }
            let outs = net.engines[i].on_view(&view, &mut net.rng).unwrap();
            net.push(i, outs);
        }
        assert!(net.queue.is_empty() && (0..7).all(|i| !net.engines[i].rekeying()));
        assert_eq!(net.engines[3].stats().carried, 0);
        net.rekey();
    }

    /// Member `i`'s T' of this view, if keyed: its members and root key.
    fn keyed_t_prime(net: &Net, i: usize) -> Option<(Vec<MemberId>, Option<[u8; 32]>)> {
        let q = net.engines[i].runner.protocol_ref().queue.as_ref()?;
        let t = q.done.as_ref()?;
        let key = t.nodes[t.root].key.as_ref().map(|k| {
            let mut b = [0u8; 32];
            b.copy_from_slice(&crate::suite::Group::encode_scalar(&Ristretto255, k));
            b
        });
        Some((t.members(), key))
    }

    #[test]
    fn queue_batch_keys_t_prime_during_the_interval_and_the_rekey_merges_it() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 12, 9);
        net.change(&[0, 1, 2, 3, 4, 5], &[]);
        let k0 = net.rekey();
        net.change(&[6, 7, 8], &[1]);
        // Before any tick: every member holds the same T' of the joiners; the
        // joiners share its root key, the others have none; the old key stays.
        let joiners = [6, 7, 8];
        let (members, key) = keyed_t_prime(&net, 6).expect("T' keyed in the interval");
        assert_eq!(members.len(), 3);
        assert!(key.is_some());
        for &i in &net.view {
            let (m, k) = keyed_t_prime(&net, i).expect("T' keyed at every member");
            assert_eq!(m, members);
            assert_eq!(k, if joiners.contains(&i) { key } else { None });
            assert!(!net.engines[i].rekeying());
            if !joiners.contains(&i) {
                assert_eq!(net.engines[i].secure_view().map(|sv| *sv.key.expose_secret()), Some(k0));
            }
        }
        assert!(joiners.iter().all(|&j| net.engines[j].stats().subtree_packets_sent > 0));
        // The rekey merges it: its BKEY packets are all Queue-merge's, and
        // the joiners spend nothing more on T'.
        let before: Vec<IntervalStats> = net.engines.iter().map(|e| e.stats()).collect();
        let wire = net.wire.len();
        let k = net.rekey();
        assert_ne!(k, k0);
        for &i in &net.view {
            let st = net.engines[i].stats();
            assert_eq!((st.merged_ready - before[i].merged_ready, st.keyed_in_run), (1, 0));
            assert_eq!(st.subtree_exps, before[i].subtree_exps);
        }
        let phases: BTreeSet<u8> = net.wire[wire..]
            .iter()
            .map(|b| Envelope::decode(b).unwrap())
            .filter(|e| e.round == ROUND_BKEY)
            .map(|e| e.body[0])
            .collect();
        assert_eq!(phases, BTreeSet::from([2]));
    }

    #[test]
    fn views_during_the_interval_rekey_t_prime_among_the_joiners_still_waiting() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 14, 10);
        net.change(&[0, 1, 2, 3, 4], &[]);
        let k0 = net.rekey();
        net.change(&[5, 6, 7], &[]);
        let (_, key1) = keyed_t_prime(&net, 5).unwrap();
        // A joiner leaves mid-interval: T' is keyed again without it (on the
        // last one: m5 and m7 keep their leaves), to a root key it never held.
        net.change(&[], &[6]);
        let (members, key2) = keyed_t_prime(&net, 5).unwrap();
        assert_eq!(members, [net.names[5].clone(), net.names[7].clone()]);
        assert_eq!(keyed_t_prime(&net, 7).unwrap().1, key2);
        assert_ne!(key2, key1);
        // Another joins, and the leader leaves: the next oldest announces T'
        // on the last one, and merges it at its tick.
        net.change(&[8], &[0]);
        assert_eq!(net.leader(), 1);
        let (members, key3) = keyed_t_prime(&net, 8).unwrap();
        assert_eq!(members.len(), 3);
        assert_ne!(key3, key2);
        // A view that changes no joiner keeps T' as it is.
        net.change(&[], &[2]);
        assert_eq!(keyed_t_prime(&net, 8).unwrap().1, key3);
        let k = net.rekey();
        assert_ne!(k, k0);
        for &i in &net.view {
            assert_eq!(net.engines[i].stats().keyed_in_run, 0);
        }
        assert_eq!(net.stale, 0);
        // A joiner that came and went leaves no trace in the key's members.
        assert!(net.engines[1].secure_view().unwrap().members.iter().all(|m| m != &net.names[6]));
    }

    #[test]
    fn a_rekey_message_while_t_prime_is_being_keyed_keys_it_in_the_rekeys_run() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 10, 11);
        net.change(&[0, 1, 2, 3], &[]);
        let k0 = net.rekey();
        // The tick comes before the announcement is delivered: the rekey
        // message overtakes T''s packets, which are refused as of the view's
        // first run; T' is keyed in the rekey's run.
        net.change_quiet(&[4, 5, 6], &[2]);
        net.tick();
        net.pump(Some(2));
        assert!(net.stale == 0 && net.view.iter().all(|&i| net.engines[i].rekeying()));
        assert!(net.view.iter().all(|&i| net.engines[i].runner.protocol_ref().queue.is_none()), "T' dropped");
        net.pump(None);
        assert!(net.stale > 0);
        let k = net.agreed();
        assert_ne!(k, k0);
        for &i in &net.view {
            assert_eq!(net.engines[i].stats().keyed_in_run, 1);
        }
        // A rekey message that names a T' some member has not keyed is
        // refused, with no state change.
        net.change_quiet(&[7, 8], &[]);
        net.pump(Some(1)); // the announcement only: T''s packets wait
        let leader = net.leader();
        let batch = net.engines[leader].runner.protocol_ref().own_batch(&view_of(&net));
        let tree = net.engines[leader].runner.protocol_ref().saved.as_ref().map(|t| t.public());
        let body = super::RekeyMsg { algorithm: 3, subtree: super::SUB_READY, batch, tree }.encode();
        let forged = net.forge(leader, 0, 1, ROUND_REKEY, body);
        let epoch = net.engines[7].current_epoch();
        for &i in net.view.clone().iter().filter(|&&i| i != leader) {
            let err = net.engines[i].on_message(&net.names[leader], &forged, &mut net.rng).unwrap_err();
            assert!(matches!(err, Error::Misbehaved { what: Misbehaved::Inconsistent { .. }, .. }), "{err}");
            assert!(!net.engines[i].rekeying());
            assert_eq!(net.engines[i].current_epoch(), epoch);
        }
        net.pump(None);
        assert!(keyed_t_prime(&net, 7).is_some_and(|(_, k)| k.is_some()));
        net.rekey();
    }

    #[test]
    fn queue_announcements_from_others_than_the_leader_or_malformed_are_refused() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 8, 12);
        net.change(&[0, 1, 2], &[]);
        net.rekey();
        net.change_quiet(&[3, 4], &[]);
        let good = net.queue.front().unwrap().1.clone();
        let body = Envelope::decode(&good).unwrap().body;
        let check = |net: &mut Net, from: usize, bytes: &[u8], what: &dyn Fn(&Error) -> bool| {
            for &i in net.view.clone().iter().filter(|&&i| i != from) {
                let err = net.engines[i].on_message(&net.names[from], bytes, &mut net.rng).unwrap_err();
                assert!(what(&err), "{}: {err}", net.names[i]);
                assert!(net.engines[i].runner.protocol_ref().queue.is_none());
            }
        };
        let forged = net.forge(1, 0, 0, ROUND_QUEUE, body.clone());
        check(&mut net, 1, &forged, &|e| matches!(e, Error::Misbehaved { what: Misbehaved::NotController { .. }, .. }));
        for cut in 0..body.len() {
            let short = net.forge(0, 0, 0, ROUND_QUEUE, body[..cut].to_vec());
            check(&mut net, 0, &short, &|e| matches!(e, Error::Decode(_)));
        }
        // A T' that leaves out a joiner: refused by those who share the leader's tree.
        let lie = super::QueueMsg::<Ristretto255> { joins: vec![net.names[3].clone()], leaves: vec![], base: None };
        let lying = net.forge(0, 0, 0, ROUND_QUEUE, lie.encode());
        for i in [1usize, 2] {
            let err = net.engines[i].on_message(&net.names[0], &lying, &mut net.rng).unwrap_err();
            assert!(matches!(err, Error::Misbehaved { what: Misbehaved::Inconsistent { .. }, .. }), "{err}");
        }
        let err = net.engines[4].on_message(&net.names[0], &lying, &mut net.rng).unwrap_err();
        assert!(matches!(err, Error::Misbehaved { what: Misbehaved::WrongShape { .. }, .. }), "{err}");
        // The real one goes through.
        net.pump(None);
        assert!(keyed_t_prime(&net, 3).is_some());
        net.rekey();
    }

    #[test]
    fn a_broadcast_blinded_group_key_that_is_not_a_members_own_is_reported_and_its_key_not_installed() {
        use super::{get_elem, MAX_MEMBERS};
        use crate::codec::{Reader, Writer};
        use crate::protocols::put_elem;
        use crate::suite::Group;
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 8, 14);
            net.change(&[0, 1, 2, 3, 4], &[]);
            let k0 = net.rekey();
            net.change(&[5, 6], &[1]);
            net.tick();
            net.pump(Some(1));
            // Who broadcasts BK0 (SEAL §3.5), in which of its packets.
            let leader = net.leader();
            let (sender, nth) = {
                let ph = &net.engines[leader].runner.protocol_ref().rekey.as_ref().expect("rekeying").phase;
                let root = ph.r.tree.root;
                let idx = ph.plan.iter().position(|p| p.nodes.contains(&root)).expect("BK0 is in the plan");
                let s = ph.plan[idx].sponsor;
                let nth = ph.by_sponsor[&s].iter().position(|&i| i == idx).unwrap();
                (net.names.iter().position(|n| Some(n) == ph.r.tree.member(s)).unwrap(), nth)
            };
            // It lies to the others about BK0 (its own copy comes back as sent).
            let mut seen = 0;
            let mut errors = Vec::new();
            while let Some((from, bytes)) = net.queue.pop_front() {
                let mut env = Envelope::decode(&bytes).unwrap();
                let mut lie = None;
                if from == sender && env.round == ROUND_BKEY && env.body[0] == 2 {
                    if seen == nth {
                        let mut r = Reader::new(&env.body[1..]);
                        let k = r.count(MAX_MEMBERS, 32, "k").unwrap();
                        let mut bks: Vec<_> = (0..k).map(|_| get_elem(&mut r, &Ristretto255).unwrap()).collect();
                        let other = Ristretto255.random_scalar(&mut net.rng);
                        *bks.last_mut().unwrap() = Ristretto255.exp_generator(&other);
                        let mut w = Writer::new();
                        w.u8(2);
                        w.count(k);
                        for bk in &bks {
                            put_elem(&mut w, &Ristretto255, bk);
                        }
                        env.body = w.buf;
                        env.signature = net.signers[sender].sign(&env.signed_bytes());
                        lie = Some(env.encode());
                    }
                    seen += 1;
                }
                for &j in &net.view.clone() {
                    let b = if j == sender { &bytes } else { lie.as_ref().unwrap_or(&bytes) };
                    match net.engines[j].on_message(&net.names[from], b, &mut net.rng) {
                        Ok(outs) => net.push(j, outs),
                        Err(e) => errors.push((j, e)),
                    }
                }
            }
            assert!(seen > nth, "{a:?}: BK0 was sent");
            // Everyone else noticed, once, naming BK0's sender, and kept the
            // key it had (none for the joiners); the liar installed.
            let mut noticed: Vec<usize> = errors.iter().map(|(j, _)| *j).collect();
            noticed.sort_unstable();
            let mut others: Vec<usize> = net.view.iter().copied().filter(|&j| j != sender).collect();
            others.sort_unstable();
            assert_eq!(noticed, others, "{a:?}: {errors:?}");
            for (j, e) in &errors {
                let want = Error::Misbehaved {
                    sender: net.names[sender].clone(),
                    what: Misbehaved::Inconsistent { round: ROUND_BKEY },
                };
                assert_eq!(e, &want, "{a:?} {}", net.names[*j]);
                let e = &net.engines[*j];
                assert!(!e.rekeying(), "{a:?}");
                let key = e.secure_view().map(|sv| *sv.key.expose_secret());
                assert_eq!(key, if [5, 6].contains(j) { None } else { Some(k0) }, "{a:?} {}", net.names[*j]);
            }
            let liar = net.engines[sender].secure_view().map(|sv| *sv.key.expose_secret());
            assert!(liar.is_some_and(|k| k != k0), "{a:?}");
        }
    }

    #[test]
    fn a_batch_that_renews_nothing_is_confirmed_against_the_blinded_key_held() {
        // Four members, two leave: the other two are an old subtree, whose
        // root's blinded key every member holds; nothing is sent.
        let mut net = Net::new(IntervalAlgorithm::Batch, 4, 15);
        net.change(&[0, 1, 2, 3], &[]);
        net.rekey();
        let t = net.engines[0].runner.protocol_ref().saved.clone().unwrap();
        let under = |v: usize| -> Vec<usize> {
            let ms = t.preorder(v).into_iter().filter_map(|u| t.member(u));
            ms.map(|m| net.names.iter().position(|n| n == m).unwrap()).collect()
        };
        let [l, r] = t.nodes[t.root].kids.unwrap();
        let gone = under(r);
        assert_eq!((under(l).len(), gone.len()), (2, 2));
        net.change(&[], &gone);
        let before: Vec<u64> = net.engines.iter().map(|e| e.costs().exps).collect();
        let wire = net.wire.len();
        net.rekey();
        assert!(net.wire[wire..].iter().all(|b| Envelope::decode(b).unwrap().round == ROUND_REKEY));
        // The group secret, and g^K0 against the root's blinded key held.
        for &i in &net.view {
            assert_eq!(net.engines[i].costs().exps - before[i], 2, "{}", net.names[i]);
        }
    }

    #[test]
    fn forged_replayed_and_stale_rekey_and_bkey_messages_are_refused_without_a_state_change() {
        let mut net = Net::new(IntervalAlgorithm::Batch, 6, 7);
        net.change(&[0, 1, 2, 3], &[]);
        net.rekey();
        // A recorded BKEY of the finished rekey and its rekey message.
        let old_rekey = net.wire.iter().find(|b| Envelope::decode(b).unwrap().round == ROUND_REKEY).unwrap().clone();
        let old_bkey =
            net.wire.iter().rev().find(|b| Envelope::decode(b).unwrap().round == ROUND_BKEY).unwrap().clone();
        net.change(&[4], &[2]);
        let epoch = net.engines[1].current_epoch();
        let view = view_of(&net);
        let batch = net.engines[0].runner.protocol_ref().own_batch(&view);
        let body = |net: &Net, b: &Batch| {
            let p = net.engines[0].runner.protocol_ref();
            super::RekeyMsg { algorithm: 2, subtree: 0, batch: b.clone(), tree: p.saved.as_ref().map(|t| t.public()) }
                .encode()
        };
        let check = |net: &mut Net, from: usize, bytes: &[u8], what: &dyn Fn(&Error) -> bool| {
            // (The sender itself refuses what it did not send as a bad
            // signature: its own broadcasts are recognized by their hash.)
            for &i in net.view.clone().iter().filter(|&&i| i != from) {
                let err = net.engines[i].on_message(&net.names[from], bytes, &mut net.rng).unwrap_err();
                assert!(what(&err), "{}: {err}", net.names[i]);
                assert_eq!(net.engines[i].current_epoch(), epoch);
                assert!(!net.engines[i].rekeying());
            }
        };
        // Stale: the last view's messages.
        check(&mut net, 0, &old_rekey, &|e| matches!(e, Error::WrongView { .. }));
        check(&mut net, 3, &old_bkey, &|e| matches!(e, Error::WrongView { .. } | Error::NotAMember(_)));
        // Forged: a rekey message from a member that is not the leader.
        let good = body(&net, &batch);
        let forged = net.forge(1, 0, 0, ROUND_REKEY, good.clone());
        check(&mut net, 1, &forged, &|e| matches!(e, Error::Misbehaved { what: Misbehaved::NotController { .. }, .. }));
        // Forged: the leader's name, another's signature.
        let mut env = Envelope::decode(&net.forge(0, 0, 0, ROUND_REKEY, good.clone())).unwrap();
        env.signature = net.signers[1].sign(&env.signed_bytes());
        check(&mut net, 0, &env.encode(), &|e| matches!(e, Error::BadSignature(_)));
        // The leader lying about the batch (keeping the leaver m2 in):
        // refused by those who share its tree.
        let lie = Batch { joins: batch.joins.clone(), leaves: vec![] };
        let lying = net.forge(0, 0, 0, ROUND_REKEY, body(&net, &lie));
        for &i in &[1usize, 3] {
            let err = net.engines[i].on_message(&net.names[0], &lying, &mut net.rng).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::Misbehaved { what: Misbehaved::Inconsistent { .. } | Misbehaved::WrongShape { .. }, .. }
                ),
                "{err}"
            );
            assert!(!net.engines[i].rekeying());
        }
        // A BKEY before any rekey message in the view: perhaps of a rekey
        // carried on among others (SEAL 3.6), not this member's; dropped.
        // And garbage.
        let early = net.forge(3, 0, 0, ROUND_BKEY, vec![2, 0, 0, 0, 0]);
        check(&mut net, 3, &early, &|e| matches!(e, Error::Ignored(_)));
        let junk = net.forge(0, 0, 1, ROUND_REKEY, vec![2, 0xff]);
        check(&mut net, 0, &junk, &|e| matches!(e, Error::Decode(_)));
        // The real rekey goes through; the rekey message replayed after it
        // is of the previous run.
        net.tick();
        let rekey_msg = net.queue.front().unwrap().1.clone();
        net.pump(Some(1));
        let run1 = net.engines[1].current_epoch();
        for &i in &net.view.clone() {
            let err = net.engines[i].on_message(&net.names[0], &rekey_msg, &mut net.rng).unwrap_err();
            assert!(matches!(err, Error::WrongRun { got: 0, current: 1 }), "{err}");
        }
        // A BKEY from a member the plan gives nothing (or nothing more) to send.
        let leader = net.leader();
        let (idle, busy) = {
            let ph = &net.engines[leader].runner.protocol_ref().rekey.as_ref().unwrap().phase;
            let pos = |s: usize| net.names.iter().position(|n| n == ph.r.tree.member(s).unwrap()).unwrap();
            let idle = net.view.iter().copied().find(|&i| !ph.by_sponsor.contains_key(&ph.leaf[&net.names[i]]));
            (idle, pos(*ph.by_sponsor.keys().next().unwrap()))
        };
        if let Some(idle) = idle {
            let bogus = net.forge(idle, 1, 7, ROUND_BKEY, vec![2, 0, 0, 0, 1]);
            for &i in net.view.clone().iter().filter(|&&i| i != idle) {
                let err = net.engines[i].on_message(&net.names[idle], &bogus, &mut net.rng).unwrap_err();
                assert!(matches!(err, Error::Misbehaved { what: Misbehaved::NotSponsor { .. }, .. }), "{err}");
            }
        }
        // A sponsor's packet with the wrong number of keys.
        let short = net.forge(busy, 1, 9, ROUND_BKEY, vec![2, 0, 0, 0, 0]);
        for &i in net.view.clone().iter().filter(|&&i| i != busy) {
            let err = net.engines[i].on_message(&net.names[busy], &short, &mut net.rng).unwrap_err();
            assert!(matches!(err, Error::Misbehaved { what: Misbehaved::WrongShape { .. }, .. }), "{err}");
            assert_eq!(net.engines[i].current_epoch(), run1);
        }
        // None of it changed anything: the rekey completes with one key, and
        // each packet replayed after it is refused.
        let sent: Vec<(usize, Vec<u8>)> = net.queue.iter().cloned().collect();
        net.pump(None);
        net.agreed();
        for (from, bytes) in sent {
            let err = net.engines[1].on_message(&net.names[from], &bytes, &mut net.rng).unwrap_err();
            assert!(matches!(err, Error::Replay(..) | Error::Misbehaved { .. }), "{err}");
        }
        // A BKEY after the view's rekey is over is no carried rekey's.
        let late = net.forge(3, 1, 50, ROUND_BKEY, vec![2, 0, 0, 0, 0]);
        let err = net.engines[1].on_message(&net.names[3], &late, &mut net.rng).unwrap_err();
        assert!(matches!(err, Error::Misbehaved { what: Misbehaved::OutsideItsRun { .. }, .. }), "{err}");
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_member_that_left_before_a_rekey_cannot_reach_the_new_key_from_what_it_held_and_saw() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 8, 8);
            net.change(&[0, 1, 2, 3, 4], &[]);
            net.rekey();
            let leaver = 2;
            let held = net.engines[leaver].leak();
            net.change(&[5], &[leaver]);
            net.rekey();
            let target = net.engines[1].leak().group_secret.expect("a secret");
            // With every element broadcast in the group, before and after it left.
            let mut secrets = held.elements.clone();
            secrets.extend(held.group_secret.clone());
            let reach = net.reaches(1, &held.scalars, &secrets, &target);
            assert_eq!(reach, Some(false), "{a:?}: the leaver reaches the new key");
            // The model finds keys it can reach: a stayer's own keys reach it.
            let stay = net.engines[1].leak();
            assert_eq!(net.reaches(1, &stay.scalars, &stay.elements, &target), Some(true), "{a:?}");
        }
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_member_that_left_during_a_carried_rekey_cannot_reach_the_key_of_the_next_one() {
        for a in IntervalAlgorithm::ALL {
            let mut net = Net::new(a, 10, 21);
            net.change(&[0, 1, 2, 3, 4, 5], &[]);
            net.rekey();
            net.change(&[6, 7], &[3]);
            net.tick();
            let leaver = pump_until_a_free_leaver(&mut net).expect("a member free to leave");
            let held = net.engines[leaver].leak();
            net.change_quiet(&[], &[leaver]);
            net.pump(None);
            // What it held in the carried rekey may reach that rekey's key
            // (SEAL: the leave is the next rekey's); the next one shuts it out.
            net.rekey();
            let target = net.engines[net.leader()].leak().group_secret.expect("a secret");
            let mut secrets = held.elements.clone();
            secrets.extend(held.group_secret.clone());
            assert_eq!(net.reaches(0, &held.scalars, &secrets, &target), Some(false), "{a:?}");
            let stay = net.engines[net.leader()].leak();
            assert_eq!(net.reaches(0, &stay.scalars, &stay.elements, &target), Some(true), "{a:?}");
        }
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_joiner_that_left_t_prime_mid_interval_cannot_reach_the_key_that_merges_t_prime() {
        let mut net = Net::new(IntervalAlgorithm::QueueBatch, 10, 13);
        net.change(&[0, 1, 2, 3], &[]);
        net.rekey();
        net.change(&[4, 5, 6, 7], &[]);
        let gone = 5;
        let held = net.engines[gone].leak();
        assert!(!held.scalars.is_empty(), "it held T''s keys");
        net.change(&[], &[gone]);
        net.rekey();
        let target = net.engines[0].leak().group_secret.expect("a secret");
        let mut secrets = held.elements.clone();
        secrets.extend(held.group_secret.clone());
        let reach = net.reaches(0, &held.scalars, &secrets, &target);
        assert_eq!(reach, Some(false), "the joiner gone from T' reaches the key");
        // A joiner that stayed does.
        let stay = net.engines[4].leak();
        assert_eq!(net.reaches(0, &stay.scalars, &stay.elements, &target), Some(true));
    }
}
