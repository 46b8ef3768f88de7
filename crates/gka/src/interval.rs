//! SEAL's interval-based TGDH rekeying: Rebuild, Batch and Queue-batch
//! (Lee, Lui and Yau; SEAL §2.2), with SEAL's sponsor election and sponsor
//! coordination (§3.4, Fig. 3), as pure functions of the key tree.
//!
//! Members join and leave during a rekeying interval; at its end the whole
//! batch is applied to the key tree at once. Every member computes the same
//! new tree from the same old tree and batch (the leader's signed rekey
//! message carries both, in agreed order), so nothing here draws randomness
//! or depends on who computes.
//!
//! # The algorithms
//! * **Rebuild**: the new tree is the complete tree ([`Tree::balanced`]) of
//!   the staying members, in the old tree's left-to-right order, then the
//!   joiners in batch order. Every internal node is renewed (even one whose
//!   subtree happens to be unchanged: Rebuild is also the recovery path for
//!   members that lost their state), so every member is a sponsor.
//! * **Batch**: the leavers' leaves are taken in order of depth, shallowest
//!   first, then rightmost first, and each is given to the next joiner in
//!   batch order. Leavers left over are pruned as TGDH prunes (the sibling's
//!   subtree takes the parent's place). Joiners left over are inserted one
//!   by one at TGDH's join position ([`Tree::insert_all`]): the shallowest,
//!   then rightmost, node where a new parent does not make the tree higher,
//!   else at the root.
//! * **Queue-batch**: during the interval the joiners are gathered, in
//!   arrival order, into a subtree T' as TGDH joins them (Queue-subtree,
//!   [`queue_subtree`]); its members agree its keys before the interval ends.
//!   (The engine, `protocols::seal`, keys T' in each view that has joiners:
//!   the view's joiners added to the last view's T', those gone from it
//!   replaced or pruned, by [`Algorithm::Batch`] on that T'; or, if T' is
//!   not keyed when the rekey starts, from nothing in the rekey's run, the
//!   shape [`queue_subtree`] gives.)
//!   At the interval's end (Queue-merge, [`queue_merge`]) T' replaces the
//!   shallowest (then rightmost) leaver's leaf if anybody leaves, and is
//!   otherwise inserted at TGDH's position for a tree of its height; the
//!   other leavers are pruned.
//!
//! Shallowest-then-rightmost is the tie-break of this crate's TGDH insertion
//! and refresher rules; replacing the shallowest leavers first keeps the
//! joiners' paths (and so their rekeying cost) short, and leaves the deepest
//! leavers to pruning, which lowers the tree.
//!
//! # Renewed nodes
//! A node is *renewed* when its key must be computed anew. For Batch and
//! Queue-batch that is exactly the internal nodes whose subtree (shape and
//! members) is not a subtree of the old tree or of T': a subtree that
//! survived intact keeps its key, any other holds a joiner, lost a leaver or
//! was reshaped. A member that leaves and joins in one interval is a
//! joiner (SEAL §3.6): its leaf is new. Leaves are never renewed: a joiner's
//! leaf is a non-renewed node whose parent is renewed, as in SEAL, which is
//! what makes every joiner a sponsor. Renewed nodes are closed upwards. If
//! no node is renewed (an empty batch; leavers whose removal leaves an old
//! subtree as the whole tree) nobody sends anything: the new group secret is
//! the secret of that subtree's root, which no leaver held.
//!
//! # Sponsors and what they send
//! The blinded keys some member may lack are those of the renewed nodes and
//! of the non-renewed children of renewed nodes. A member is a sponsor when
//! it is the rightmost leaf under a non-renewed node whose parent is
//! renewed; its broadcast list ([`Rekeyed::broadcast_list`], Fig. 3) starts
//! with that node and climbs its path: a renewed parent whose children are
//! both renewed or both not is sent by the right child's sponsor, one with a
//! single renewed child by the renewed side's. Each such blinded key is thus
//! sent by exactly one member, computed by every member alone, with one walk
//! up its path. The root's blinded key is on a list too (SEAL sends it for
//! key confirmation, §3.5): it is g^H(group secret), computed like any
//! other node's.
//!
//! The text of Fig. 3 as extracted nests the list's first insertion and the
//! second loop inside the first loop, which would give a joiner (whose leaf's
//! parent is renewed) an empty list; the reading here is the one that
//! reproduces the Fig. 4 example exactly: climb while the parent is not
//! renewed, insert the node reached, then climb again.
//!
//! # Rounds and packets
//! A sponsor sends, in each round, one BKEY packet with every blinded key of
//! its list it can compute from what it held at the start and what earlier
//! rounds delivered ([`Rekeyed::plan`]). At the start every member holds the
//! blinded keys of every node of the old tree that is not renewed (this
//! crate's TGDH keeps the whole tree, and SEAL's rekey message carries it to
//! joiners), the old root's included (SEAL broadcast it for key
//! confirmation), not those of T' unless it is in T', nor a joiner's leaf's
//! (SEAL's members hold their co-paths only; the election and the lists do
//! not depend on this, some rounds would).
//!
//! # Costs ([`Rekeyed::costs`])
//! Per member: one exponentiation per renewed node on its path (the root's
//! is the group secret, computed even when the root is not renewed), one per
//! renewed node it blinds, and one for a joiner's own leaf when it sends it;
//! blinded keys and packets it sends. Every member receives every packet, so
//! the blinded keys and packets per rekey are also what each member sees:
//! Table 2 of SEAL reports about 7 blinded keys and 6 packets per member per
//! rekey in groups of about 7 members, which only fits as the counts each
//! member sees. Queue-batch's costs are those of Queue-merge; the keys of T'
//! are agreed during the interval (the paper measures the same; the engine
//! meters T''s work apart, `IntervalStats::subtree_*`). Key confirmation
//! (§3.5) is counted: every member of two or more computes g^K0 once to
//! compare it with the root's blinded key it received, but the sponsor that
//! computed it to broadcast it.

// The engine (`protocols::seal`) uses part of this module; the rest (Table 2's
// averages, the figures' trees) serves the tests and the coming `gauge`.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::{BTreeMap, BTreeSet, HashMap};

use conclave_gcs::MemberId;

use crate::protocols::MAX_MEMBERS;
use crate::suite::Group;
use crate::tree::Tree;

/// The membership changes of one rekeying interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Batch {
    /// Members joining, in the order they asked to.
    pub joins: Vec<MemberId>,
    /// Members leaving.
    pub leaves: Vec<MemberId>,
}

/// Why a batch cannot be applied to a tree.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BatchError {
    /// A leaver that is not in the tree.
    #[error("{0} leaves but is not a member")]
    NotAMember(MemberId),
    /// A joiner that is in the tree and does not leave.
    #[error("{0} joins but is already a member")]
    AlreadyAMember(MemberId),
    /// A member listed twice among the joiners or among the leavers.
    #[error("{0} is listed twice")]
    Twice(MemberId),
    /// More members than a tree may hold.
    #[error("more than {MAX_MEMBERS} members")]
    TooMany,
}

impl Batch {
    /// Checks the batch against the tree's members.
    fn check<G: Group>(&self, old: Option<&Tree<G>>) -> Result<(), BatchError> {
        let members: BTreeSet<MemberId> = old.map(|t| t.members().into_iter().collect()).unwrap_or_default();
        let mut leaving = BTreeSet::new();
        for m in &self.leaves {
            if !leaving.insert(m) {
                return Err(BatchError::Twice(m.clone()));
            }
            if !members.contains(m) {
                return Err(BatchError::NotAMember(m.clone()));
            }
        }
        let mut joining = BTreeSet::new();
        for m in &self.joins {
            if !joining.insert(m) {
                return Err(BatchError::Twice(m.clone()));
            }
            if members.contains(m) && !leaving.contains(m) {
                return Err(BatchError::AlreadyAMember(m.clone()));
            }
        }
        if members.len() - leaving.len() + joining.len() > MAX_MEMBERS {
            return Err(BatchError::TooMany);
        }
        Ok(())
    }
}

/// The interval-based algorithms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Algorithm {
    /// Rebuild a complete tree.
    Rebuild,
    /// Joiners replace leavers, then go in at the shallowest positions.
    Batch,
    /// Joiners gathered into a subtree during the interval, merged at its end.
    QueueBatch,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 3] = [Self::Rebuild, Self::Batch, Self::QueueBatch];

    /// Applies `batch` to `old` (`None`: nobody in the group yet). `None` if
    /// nobody is left.
    pub fn apply<G: Group>(self, old: Option<&Tree<G>>, batch: &Batch) -> Result<Option<Rekeyed<G>>, BatchError> {
        match self {
            Self::Rebuild => rebuild(old, batch),
            Self::Batch => batch_rekey(old, batch),
            Self::QueueBatch => {
                batch.check(old)?;
                queue_merge(old, queue_subtree::<G>(&batch.joins).as_ref(), &batch.leaves)
            }
        }
    }
}

/// Leaves of `leavers` in `t`, shallowest first, then rightmost first.
fn by_depth_then_right<G: Group>(t: &Tree<G>, leavers: &[MemberId]) -> Vec<usize> {
    let leaving: BTreeSet<&MemberId> = leavers.iter().collect();
    let mut v: Vec<(usize, usize)> =
        t.leaves().into_iter().enumerate().filter(|&(_, u)| t.member(u).is_some_and(|m| leaving.contains(m))).collect();
    v.sort_by_key(|&(i, u)| (t.depth(u), std::cmp::Reverse(i)));
    v.into_iter().map(|(_, u)| u).collect()
}

/// One-leaf trees of `members`, without keys.
fn leaves_of<G: Group>(members: &[MemberId]) -> Vec<Tree<G>> {
    members.iter().map(|m| Tree::leaf(m.clone(), None, None)).collect()
}

/// Rebuild: the complete tree of the staying members (old order) and the
/// joiners (batch order); every internal node renewed.
pub(crate) fn rebuild<G: Group>(old: Option<&Tree<G>>, batch: &Batch) -> Result<Option<Rekeyed<G>>, BatchError> {
    batch.check(old)?;
    let leaving: BTreeSet<&MemberId> = batch.leaves.iter().collect();
    let mut members: Vec<MemberId> =
        old.map(|t| t.members()).unwrap_or_default().into_iter().filter(|m| !leaving.contains(m)).collect();
    members.extend(batch.joins.iter().cloned());
    let Some(mut t) = Tree::balanced(&members) else { return Ok(None) };
    // A staying member's leaf keeps its key and blinded key.
    if let Some(old) = old {
        let idx = old.leaf_index();
        let joining: BTreeSet<&MemberId> = batch.joins.iter().collect();
        for v in t.leaves() {
            let Some(m) = t.nodes[v].member.clone() else { continue };
            if let (false, Some(&u)) = (joining.contains(&m), idx.get(&m)) {
                t.nodes[v].bk = old.nodes[u].bk.clone();
                t.nodes[v].key = old.nodes[u].key.clone();
            }
        }
    }
    Ok(Some(Rekeyed::new(t, old, None, &batch.joins, true)))
}

/// Batch: joiners take the leavers' leaves (shallowest, then rightmost
/// first), leftover leavers are pruned, leftover joiners inserted at TGDH's
/// join position.
pub(crate) fn batch_rekey<G: Group>(old: Option<&Tree<G>>, batch: &Batch) -> Result<Option<Rekeyed<G>>, BatchError> {
    batch.check(old)?;
    let mut joiners = batch.joins.iter();
    let mut t = match old {
        Some(old) => {
            let mut t = old.clone();
            let mut dropped = BTreeSet::new();
            for v in by_depth_then_right(old, &batch.leaves) {
                match joiners.next() {
                    Some(j) => {
                        t.graft(v, &Tree::leaf(j.clone(), None, None));
                    }
                    None => {
                        dropped.insert(v);
                    }
                }
            }
            t.prune_leaves(|v| !dropped.contains(&v)).map(|(t, _)| t)
        }
        None => None,
    };
    let rest: Vec<MemberId> = joiners.cloned().collect();
    let mut rest = leaves_of::<G>(&rest).into_iter();
    if t.is_none() {
        t = rest.next();
    }
    let Some(mut t) = t else { return Ok(None) };
    let rest: Vec<Tree<G>> = rest.collect();
    t.insert_all(&rest);
    Ok(Some(Rekeyed::new(t, old, None, &batch.joins, false)))
}

/// Queue-subtree: the joiners of an interval, in arrival order, as TGDH
/// joins them one by one. `None` for nobody.
pub(crate) fn queue_subtree<G: Group>(joins: &[MemberId]) -> Option<Tree<G>> {
    let mut leaves = leaves_of::<G>(joins).into_iter();
    let mut t = leaves.next()?;
    let rest: Vec<Tree<G>> = leaves.collect();
    t.insert_all(&rest);
    Some(t)
}

/// Queue-merge: `sub` (T', with whatever keys its members agreed) replaces
/// the shallowest (then rightmost) leaver, or goes in at TGDH's position
/// for its height if nobody leaves; the other leavers are pruned.
pub(crate) fn queue_merge<G: Group>(
    old: Option<&Tree<G>>,
    sub: Option<&Tree<G>>,
    leaves: &[MemberId],
) -> Result<Option<Rekeyed<G>>, BatchError> {
    let joins = sub.map(|s| s.members()).unwrap_or_default();
    Batch { joins: joins.clone(), leaves: leaves.to_vec() }.check(old)?;
    let t = match old {
        None => sub.cloned(),
        Some(old) => {
            let mut t = old.clone();
            let mut leavers = by_depth_then_right(old, leaves).into_iter();
            let mut grafted = false;
            if let Some(s) = sub {
                if let Some(v) = leavers.next() {
                    t.graft(v, s);
                    grafted = true;
                }
            }
            let dropped: BTreeSet<usize> = leavers.collect();
            let t = t.prune_leaves(|v| !dropped.contains(&v)).map(|(t, _)| t);
            match (t, sub, grafted) {
                (Some(mut t), Some(s), false) => {
                    t.insert_all([s]);
                    Some(t)
                }
                (None, Some(s), _) => Some(s.clone()),
                (t, _, _) => t,
            }
        }
    };
    Ok(t.map(|t| Rekeyed::new(t, old, sub, &joins, false)))
}

/// A subtree's shape and members, for recognizing subtrees that survived.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Shape {
    Leaf(MemberId),
    Pair(usize, usize),
}

/// The shape identifiers of `t`'s nodes (bottom up), interning new shapes
/// into `known` if `learn` (else `None` for a shape not known). Leaves that
/// `leaf_ok` refuses get no identifier, nor do their ancestors.
fn shapes<G: Group>(
    t: &Tree<G>,
    known: &mut HashMap<Shape, usize>,
    learn: bool,
    leaf_ok: impl Fn(&MemberId) -> bool,
) -> Vec<Option<usize>> {
    let mut id = vec![None; t.nodes.len()];
    for v in t.preorder(t.root).into_iter().rev() {
        let shape = match (t.nodes[v].kids, &t.nodes[v].member) {
            (Some([l, r]), _) => match (id[l], id[r]) {
                (Some(a), Some(b)) => Shape::Pair(a, b),
                _ => continue,
            },
            (None, Some(m)) if leaf_ok(m) => Shape::Leaf(m.clone()),
            (None, _) => continue,
        };
        id[v] = if learn {
            let next = known.len();
            Some(*known.entry(shape).or_insert(next))
        } else {
            known.get(&shape).copied()
        };
    }
    id
}

/// The result of one interval's rekeying: the new tree and which of its
/// nodes are renewed.
pub(crate) struct Rekeyed<G: Group> {
    /// The new tree. Renewed nodes and joiners' leaves (outside T') have no
    /// key or blinded key; every other node keeps what the old tree (or T')
    /// held.
    pub tree: Tree<G>,
    /// Per node: its key is computed anew.
    renewed: Vec<bool>,
    /// Per node: a joiner's leaf outside T' (nobody holds its blinded key).
    fresh: Vec<bool>,
    /// Per node: a node of T' (Queue-batch).
    queued: Vec<bool>,
}

/// One BKEY packet: a sponsor's blinded keys of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Packet {
    /// The sponsor's leaf.
    pub sponsor: usize,
    /// The round, from 1.
    pub round: u32,
    /// The nodes whose blinded keys it carries, bottom up.
    pub nodes: Vec<usize>,
}

/// What one member spends on one rekey.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MemberCosts {
    /// Exponentiations.
    pub exps: u64,
    /// Blinded keys it broadcasts.
    pub bks_sent: u64,
    /// BKEY packets it broadcasts (and signs).
    pub packets_sent: u64,
}

/// What one rekey costs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct IntervalCosts {
    /// Per member.
    pub members: BTreeMap<MemberId, MemberCosts>,
    /// Blinded keys broadcast (each member receives them all).
    pub bks: u64,
    /// BKEY packets broadcast (each member receives them all, and verifies
    /// those of the others).
    pub packets: u64,
    /// Rounds.
    pub rounds: u32,
}

impl IntervalCosts {
    /// SEAL Table 2's three counts for this rekey: exponentiations per
    /// member (mean), blinded keys and BKEY packets each member sees.
    pub fn table2(&self) -> (f64, f64, f64) {
        let n = self.members.len().max(1) as f64;
        let exps: u64 = self.members.values().map(|c| c.exps).sum();
        (exps as f64 / n, self.bks as f64, self.packets as f64)
    }
}

impl<G: Group> Rekeyed<G> {
    /// Marks the renewed nodes of `tree` (all internal nodes if `all`),
    /// given the old tree, T' and the joiners, and clears their keys.
    fn new(tree: Tree<G>, old: Option<&Tree<G>>, sub: Option<&Tree<G>>, joins: &[MemberId], all: bool) -> Self {
        let mut tree = tree.compact();
        let joining: BTreeSet<&MemberId> = joins.iter().collect();
        let mut known = HashMap::new();
        if let Some(old) = old {
            shapes(old, &mut known, true, |m| !joining.contains(m));
        }
        let sub_root = sub.and_then(|s| shapes(s, &mut known, true, |_| true)[s.root]);
        let ids = shapes(&tree, &mut known, false, |_| true);
        let n = tree.nodes.len();
        let renewed: Vec<bool> = (0..n).map(|v| !tree.is_leaf(v) && (all || ids[v].is_none())).collect();
        let mut queued = vec![false; n];
        if let Some(r) = (0..n).find(|&v| sub_root.is_some() && ids[v] == sub_root) {
            for u in tree.preorder(r) {
                queued[u] = true;
            }
        }
        let fresh: Vec<bool> =
            (0..n).map(|v| !queued[v] && tree.nodes[v].member.as_ref().is_some_and(|m| joining.contains(m))).collect();
        for v in 0..n {
            if renewed[v] || fresh[v] {
                tree.nodes[v].bk = None;
                tree.nodes[v].clear_key();
            }
        }
        Self { tree, renewed, fresh, queued }
    }

    /// `tree` with the given renewed nodes (nobody joined), e.g. a figure's.
    #[cfg(test)]
    pub fn with_renewed(tree: Tree<G>, renewed: &BTreeSet<usize>) -> Self {
        let n = tree.nodes.len();
        Self {
            renewed: (0..n).map(|v| renewed.contains(&v)).collect(),
            fresh: vec![false; n],
            queued: vec![false; n],
            tree,
        }
    }

    /// Whether node `v`'s key is computed anew.
    pub fn is_renewed(&self, v: usize) -> bool {
        self.renewed[v]
    }

    /// The renewed nodes.
    pub fn renewed(&self) -> BTreeSet<usize> {
        (0..self.renewed.len()).filter(|&v| self.renewed[v]).collect()
    }

    /// Whether `v` is a joiner's leaf outside T' (its member draws its key).
    pub fn is_fresh(&self, v: usize) -> bool {
        self.fresh[v]
    }

    /// Whether the member at `leaf` holds node `v`'s blinded key when the
    /// rekey starts (see the module doc).
    pub fn holds(&self, leaf: usize, v: usize) -> bool {
        if self.renewed[v] || self.fresh[v] {
            false
        } else if self.queued[v] {
            self.queued[leaf]
        } else {
            true
        }
    }

    /// What SEAL's members hold when the rekey starts, given the tree `old`
    /// the batch was applied to: a member of `old` the blinded keys of its
    /// own co-path (§3.4: "each member holds the blinded keys along its own
    /// co-path") and key path (§4.2: it keeps "the secret and blinded keys
    /// of the key path"), and the old root's (broadcast for key
    /// confirmation, §3.5); a joiner the whole old tree, which the rekey
    /// message carries (§3.3); T''s as [`Rekeyed::holds`] says. (This
    /// crate's members hold the whole tree: [`Rekeyed::holds`].)
    pub fn seal_holds<'a>(&'a self, old: Option<&'a Tree<G>>) -> impl Fn(usize, usize) -> bool + 'a {
        let count = |t: &Tree<G>| -> Vec<usize> {
            let mut c = vec![0; t.nodes.len()];
            for v in t.preorder(t.root).into_iter().rev() {
                c[v] = t.nodes[v].kids.map_or(1, |[l, r]| c[l] + c[r]);
            }
            c
        };
        let sizes = count(&self.tree);
        let old_sizes = old.map(count).unwrap_or_default();
        let old_leaf = old.map(|o| o.leaf_index()).unwrap_or_default();
        move |l: usize, v: usize| {
            let t = &self.tree;
            let Some(old) = old else { return self.holds(l, v) };
            if self.renewed[v] || self.fresh[v] || self.queued[v] || self.fresh[l] || self.queued[l] {
                return self.holds(l, v);
            }
            let (Some(&ol), Some(x)) = (t.member(l).and_then(|m| old_leaf.get(m)), t.member(t.rightmost(v))) else {
                return self.holds(l, v);
            };
            if t.path(l).contains(&v) {
                return true;
            }
            // v's subtree is one of `old`'s: the ancestor of one of its
            // leaves there with as many leaves.
            let Some(&start) = old_leaf.get(x) else { return self.holds(l, v) };
            let mut ov = start;
            while old_sizes[ov] < sizes[v] {
                match old.nodes[ov].parent {
                    Some(p) => ov = p,
                    None => break,
                }
            }
            match old.nodes[ov].parent {
                None => true,
                Some(p) => old.path(ol).contains(&p),
            }
        }
    }

    /// SEAL Fig. 3: the nodes whose blinded keys the member at `leaf`
    /// broadcasts, bottom up; empty if it is not a sponsor.
    pub fn broadcast_list(&self, leaf: usize) -> Vec<usize> {
        let t = &self.tree;
        let mut out = Vec::new();
        if !t.is_leaf(leaf) {
            return out;
        }
        let mut k = leaf;
        while let Some(p) = t.nodes[k].parent {
            if self.renewed[p] {
                break;
            }
            k = p;
        }
        // The election: the rightmost leaf under a non-renewed node whose
        // parent is renewed (never the root: a lone member sends nothing).
        if t.nodes[k].parent.is_none() || t.rightmost(k) != leaf {
            return out;
        }
        out.push(k);
        while let Some(p) = t.nodes[k].parent {
            let Some(s) = t.sibling(k) else { break };
            let right = t.nodes[p].kids.is_some_and(|[_, r]| r == k);
            match (self.renewed[k], self.renewed[s]) {
                (a, b) if a == b && right => out.push(p),
                (a, b) if a == b => break,
                (false, _) => break,
                (true, _) => out.push(p),
            }
            k = p;
        }
        out
    }

    /// The sponsors' leaves, left to right, with their broadcast lists.
    pub fn sponsors(&self) -> Vec<(usize, Vec<usize>)> {
        self.tree
            .leaves()
            .into_iter()
            .map(|l| (l, self.broadcast_list(l)))
            .filter(|(_, list)| !list.is_empty())
            .collect()
    }

    /// Rounds that pass before the member at `leaf` can compute the key of
    /// `v`, on its path, given the rounds in which the blinded keys it lacks
    /// (those `holds` denies it) are sent (`round`, filled below `v`).
    fn ready_after(&self, leaf: usize, v: usize, round: &[u32], holds: &dyn Fn(usize, usize) -> bool) -> u32 {
        self.lacked(leaf, v, holds).into_iter().map(|o| round[o]).max().unwrap_or(0)
    }

    /// The nodes whose blinded keys the member at `leaf` needs, and does not
    /// hold (`holds`), to compute the key of `v` on its path: the other child
    /// of every renewed node on the way up.
    fn lacked(&self, leaf: usize, v: usize, holds: &dyn Fn(usize, usize) -> bool) -> Vec<usize> {
        let t = &self.tree;
        let mut out = Vec::new();
        let mut c = leaf;
        while c != v {
            let Some(p) = t.nodes[c].parent else { break };
            if self.renewed[p] {
                out.extend(t.sibling(c).filter(|&o| !holds(leaf, o)));
            }
            c = p;
        }
        out
    }

    /// The BKEY packets, by round, then by sponsor left to right: each
    /// sponsor sends in a round the blinded keys of its list it can compute
    /// by then.
    pub fn plan(&self) -> Vec<Packet> {
        self.plan_holding(&|l, v| self.holds(l, v))
    }

    /// [`Rekeyed::plan`] had the members held, when the rekey starts, the
    /// blinded keys `holds(leaf, node)` says.
    pub fn plan_holding(&self, holds: &dyn Fn(usize, usize) -> bool) -> Vec<Packet> {
        let t = &self.tree;
        let lists = self.sponsors();
        let sender: HashMap<usize, usize> =
            lists.iter().flat_map(|(s, list)| list.iter().map(move |&v| (v, *s))).collect();
        let mut round = vec![0u32; t.nodes.len()];
        for v in t.preorder(t.root).into_iter().rev() {
            if let Some(&s) = sender.get(&v) {
                round[v] = 1 + self.ready_after(s, v, &round, holds);
            }
        }
        let mut packets: BTreeMap<(u32, usize), Vec<usize>> = BTreeMap::new();
        let position: HashMap<usize, usize> = lists.iter().enumerate().map(|(i, (s, _))| (*s, i)).collect();
        for (s, list) in &lists {
            for &v in list {
                packets.entry((round[v], position[s])).or_default().push(v);
            }
        }
        packets.into_iter().map(|((round, i), nodes)| Packet { sponsor: lists[i].0, round, nodes }).collect()
    }

    /// SEAL §4.2's per-input sending had the members held, when the rekey
    /// starts, the blinded keys `holds(leaf, node)` says: on every packet it
    /// processes — the REKEY packet first, then each BKEY packet in the
    /// agreed order — a sponsor broadcasts, in one BKEY packet, the blinded
    /// keys of its list it has become able to compute. The packets in the
    /// order sent; `round` is the input a packet answers (0: the REKEY
    /// packet, `i`: the `i`-th BKEY packet). Sponsors answer one input left
    /// to right, and what they send is ordered after everything already
    /// sent (one agreed stream, FIFO per sender).
    pub fn reactive_plan_holding(&self, holds: &dyn Fn(usize, usize) -> bool) -> Vec<Packet> {
        let lists = self.sponsors();
        let mut received = vec![false; self.tree.nodes.len()];
        let mut sent = vec![0; lists.len()];
        let mut stream: Vec<Packet> = Vec::new();
        let mut input = 0;
        while input <= stream.len() {
            if input > 0 {
                for &v in &stream[input - 1].nodes {
                    received[v] = true;
                }
            }
            for (i, (s, list)) in lists.iter().enumerate() {
                let ready = list.iter().take_while(|&&v| self.computable(*s, v, holds, &received)).count();
                if ready > sent[i] {
                    stream.push(Packet { sponsor: *s, round: input as u32, nodes: list[sent[i]..ready].to_vec() });
                    sent[i] = ready;
                }
            }
            input += 1;
        }
        stream
    }

    /// Whether the member at `leaf` can compute the key of `v`, on its path,
    /// holding what `holds` says and the blinded keys `received`.
    fn computable(&self, leaf: usize, v: usize, holds: &dyn Fn(usize, usize) -> bool, received: &[bool]) -> bool {
        self.lacked(leaf, v, holds).into_iter().all(|o| received[o])
    }

    /// The costs of this rekey (see the module doc).
    pub fn costs(&self) -> IntervalCosts {
        self.costs_with(true)
    }

    /// The costs of keying T' (Queue-subtree) on this plan: those of a
    /// rekey but key confirmation, T''s root key being no group key.
    pub fn subtree_costs(&self) -> IntervalCosts {
        self.costs_with(false)
    }

    fn costs_with(&self, confirmation: bool) -> IntervalCosts {
        let t = &self.tree;
        let plan = self.plan();
        let leaves = t.leaves();
        let mut members = BTreeMap::new();
        for &l in &leaves {
            let Some(m) = t.member(l) else { continue };
            let mut c = MemberCosts::default();
            if leaves.len() > 1 {
                let path = t.path(l);
                let below_root = &path[1..path.len() - 1];
                c.exps = below_root.iter().filter(|&&v| self.renewed[v]).count() as u64 + 1;
            }
            for p in plan.iter().filter(|p| p.sponsor == l) {
                c.packets_sent += 1;
                c.bks_sent += p.nodes.len() as u64;
                c.exps += p.nodes.iter().filter(|&&v| self.renewed[v] || self.fresh[v]).count() as u64;
            }
            // Key confirmation: g^K0 against the root's blinded key, but by
            // the member that computed it to send it.
            if confirmation && leaves.len() > 1 && !plan.iter().any(|p| p.sponsor == l && p.nodes.contains(&t.root)) {
                c.exps += 1;
            }
            members.insert(m.clone(), c);
        }
        IntervalCosts {
            bks: plan.iter().map(|p| p.nodes.len() as u64).sum(),
            packets: plan.len() as u64,
            rounds: plan.iter().map(|p| p.round).max().unwrap_or(0),
            members,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use conclave_gcs::MemberId;
    use proptest::prelude::*;
    use rand_chacha::ChaCha20Rng;
    use rand_core::{RngCore, SeedableRng};

    use super::{
        queue_merge, queue_subtree, Algorithm, Batch, BatchError, IntervalCosts, MemberCosts, Packet, Rekeyed,
    };
    use crate::codec::{Reader, Writer};
    use crate::domains;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::Group;
    use crate::tree::tests::id;
    use crate::tree::{Bk, KeyOps, Node, Tree};

    type R = Ristretto255;
    type Elem = <R as Group>::Element;
    type Scalar = <R as Group>::Scalar;

    /// Counts the exponentiations of one member.
    struct Meter {
        exps: u64,
    }

    impl KeyOps<R> for Meter {
        fn group(&self) -> &R {
            &Ristretto255
        }
        fn exp(&mut self, b: &Elem, k: &Scalar) -> Elem {
            self.exps += 1;
            Group::exp(&Ristretto255, b, k)
        }
        fn exp_g(&mut self, k: &Scalar) -> Elem {
            self.exps += 1;
            Ristretto255.exp_generator(k)
        }
    }

    /// The paper's node numbers: the root is 0, node v's children 2v + 1 and 2v + 2.
    fn heap(t: &Tree<R>) -> Vec<u64> {
        let mut h = vec![0u64; t.nodes.len()];
        for v in t.preorder(t.root) {
            if let Some([l, r]) = t.nodes[v].kids {
                h[l] = 2 * h[v] + 1;
                h[r] = 2 * h[v] + 2;
            }
        }
        h
    }

    /// The node numbered `pos` in the paper's numbering.
    fn at(t: &Tree<R>, pos: u64) -> usize {
        heap(t).iter().position(|&p| p == pos).expect("no such node")
    }

    /// The tree whose leaves are member i at paper node p, for each (p, i).
    fn from_heap(leaves: &[(u64, usize)]) -> Tree<R> {
        let mut all = BTreeSet::new();
        for &(p, _) in leaves {
            let mut q = p;
            all.insert(q);
            while q > 0 {
                q = (q - 1) / 2;
                all.insert(q);
            }
        }
        let pos: Vec<u64> = all.into_iter().collect();
        let idx = |p: u64| pos.iter().position(|&q| q == p);
        let nodes = pos
            .iter()
            .map(|&p| Node {
                parent: p.checked_sub(1).map(|q| idx(q / 2).unwrap()),
                kids: idx(2 * p + 1).map(|l| [l, idx(2 * p + 2).expect("both children")]),
                member: leaves.iter().find(|&&(q, _)| q == p).map(|&(_, m)| id(m)),
                bk: None,
                key: None,
            })
            .collect();
        Tree { nodes, root: 0 }
    }

    /// Paper numbers of nodes.
    fn numbers(t: &Tree<R>, nodes: impl IntoIterator<Item = usize>) -> Vec<u64> {
        let h = heap(t);
        nodes.into_iter().map(|v| h[v]).collect()
    }

    /// Every key and blinded key computed, the root's blinded key too (SEAL
    /// broadcasts it for key confirmation, so every member holds it).
    fn keyed(mut t: Tree<R>, rng: &mut ChaCha20Rng) -> Tree<R> {
        t.fill_keys(&mut Ristretto255, rng);
        let k = t.nodes[t.root].key.unwrap();
        t.nodes[t.root].bk = Some(Bk::computed(&Ristretto255, Ristretto255.exp_generator(&k)));
        t
    }

    /// A random shape over `members`, in order.
    fn random_tree(rng: &mut ChaCha20Rng, members: &[MemberId]) -> Tree<R> {
        fn build(rng: &mut ChaCha20Rng, members: &[MemberId], nodes: &mut Vec<Node<R>>) -> usize {
            if members.len() == 1 {
                nodes.push(Node { parent: None, kids: None, member: Some(members[0].clone()), bk: None, key: None });
                return nodes.len() - 1;
            }
            let k = 1 + (rng.next_u64() % (members.len() as u64 - 1)) as usize;
            let l = build(rng, &members[..k], nodes);
            let r = build(rng, &members[k..], nodes);
            nodes.push(Node { parent: None, kids: Some([l, r]), member: None, bk: None, key: None });
            let p = nodes.len() - 1;
            nodes[l].parent = Some(p);
            nodes[r].parent = Some(p);
            p
        }
        let mut nodes = Vec::new();
        let root = build(rng, members, &mut nodes);
        Tree { nodes, root }
    }

    /// What happened when every member ran the rekey with real group operations.
    struct Outcome {
        /// Measured, in the shape of [`Rekeyed::costs`].
        costs: IntervalCosts,
        /// Every blinded key broadcast, with its node.
        sent: Vec<(usize, Elem)>,
        /// The group secret, as the pooled keys give it (`None` for one member).
        secret: Option<Elem>,
        /// Each member's keys at the end, by leaf order.
        keys: Vec<Vec<Scalar>>,
    }

    /// Runs the rekey `r` (whose non-renewed nodes carry the keys and
    /// blinded keys of the old tree and of T'): each member starts from
    /// its own copy holding what [`Rekeyed::holds`] says and the keys of its
    /// path's non-renewed nodes (a joiner draws its leaf key), then rounds:
    /// everybody computes what it can, sponsors send one packet each with
    /// what of their list they can compute, and every packet reaches
    /// everybody before the next round. Checks every secret and every
    /// blinded key against the pooled keys.
    fn simulate(r: &Rekeyed<R>, rng: &mut ChaCha20Rng) -> Outcome {
        let g = Ristretto255;
        let mut world = r.tree.clone();
        for v in 0..world.nodes.len() {
            if r.is_fresh(v) {
                world.nodes[v].key = Some(g.random_scalar(rng));
            }
        }
        let mut truth = world.clone();
        truth.fill_keys(&mut Ristretto255, rng);
        let leaves = world.leaves();
        let n = leaves.len();
        let secret = (n > 1).then(|| truth.group_secret(&mut Ristretto255, leaves[0]).unwrap());
        let mut own: Vec<Tree<R>> = leaves
            .iter()
            .map(|&l| {
                let mut t = world.public();
                for v in 0..t.nodes.len() {
                    if !r.holds(l, v) {
                        t.nodes[v].bk = None;
                    }
                }
                for v in t.path(l) {
                    if !r.is_renewed(v) {
                        t.nodes[v].key = world.nodes[v].key;
                    }
                }
                t
            })
            .collect();
        let lists: Vec<Vec<usize>> = leaves.iter().map(|&l| r.broadcast_list(l)).collect();
        let mut per = vec![MemberCosts::default(); n];
        let mut secrets: Vec<Option<Elem>> = vec![None; n];
        let mut done: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
        let mut sent = Vec::new();
        let mut rounds = 0;
        for round in 1.. {
            let mut packets = Vec::new();
            for (i, &l) in leaves.iter().enumerate() {
                let t = &mut own[i];
                let mut ops = Meter { exps: 0 };
                t.climb(&mut ops, l, false);
                if n > 1 && secrets[i].is_none() {
                    secrets[i] = t.group_secret(&mut ops, l);
                }
                let mut packet = Vec::new();
                for &v in &lists[i] {
                    if done[i].contains(&v) {
                        continue;
                    }
                    let bk = if let Some(b) = &t.nodes[v].bk {
                        b.clone()
                    } else if v == t.root {
                        let Some(s) = &secrets[i] else { break };
                        Bk::computed(&g, ops.exp_g(&g.hash_to_scalar(domains::TGDH_NODE, s)))
                    } else {
                        let Some(k) = &t.nodes[v].key else { break };
                        Bk::computed(&g, ops.exp_g(k))
                    };
                    t.nodes[v].bk = Some(bk.clone());
                    done[i].insert(v);
                    packet.push((v, bk));
                }
                per[i].exps += ops.exps;
                if !packet.is_empty() {
                    per[i].packets_sent += 1;
                    per[i].bks_sent += packet.len() as u64;
                    packets.push(packet);
                }
            }
            if packets.is_empty() {
                break;
            }
            rounds = round;
            for (v, bk) in packets.into_iter().flatten() {
                for t in own.iter_mut() {
                    match &t.nodes[v].bk {
                        Some(x) => assert!(x == &bk, "a blinded key contradicts one held"),
                        None => t.nodes[v].bk = Some(bk.clone()),
                    }
                }
                sent.push((v, *bk.public()));
            }
        }
        for (v, bk) in &sent {
            let want = if *v == truth.root {
                g.exp_generator(&g.hash_to_scalar(domains::TGDH_NODE, secret.as_ref().unwrap()))
            } else {
                *truth.nodes[*v].bk.as_ref().unwrap().public()
            };
            assert!(bk == &want, "node {v}'s blinded key is not the pooled one");
        }
        for s in &secrets {
            assert!(s == &secret, "a member's group secret differs from the pooled one");
        }
        // Key confirmation: each member but the root's sender blinds its
        // group secret's key and compares it with the root's blinded key.
        for (i, &l) in leaves.iter().enumerate() {
            let Some(s) = (n > 1).then_some(secrets[i]).flatten() else { continue };
            if done[i].contains(&world.root) {
                continue;
            }
            let mut ops = Meter { exps: 0 };
            let mine = ops.exp_g(&g.hash_to_scalar(domains::TGDH_NODE, &s));
            assert!(
                own[i].nodes[world.root].bk.as_ref().map(|b| b.public()) == Some(&mine),
                "{l}: the root's blinded key is not confirmed"
            );
            per[i].exps += ops.exps;
        }
        let packets = per.iter().map(|c| c.packets_sent).sum();
        let members = leaves.iter().zip(per).map(|(&l, c)| (world.member(l).unwrap().clone(), c)).collect();
        let costs = IntervalCosts { members, bks: sent.len() as u64, packets, rounds };
        let keys = own.iter().map(|t| t.keys().cloned().collect()).collect();
        Outcome { costs, sent, secret, keys }
    }

    /// Whether an outsider with the keys `scalars` and the secret elements
    /// `secrets`, seeing `publics`, reaches `target` within `depth` levels
    /// of TGDH's derivation: raise a known or public element to a known key,
    /// hash the result to a key (the idea of `testing::Attacker`, restricted
    /// to the operations the tree uses so that level 2 stays small).
    fn reaches(scalars: Vec<Scalar>, secrets: &[Elem], publics: &[Elem], target: &Elem, depth: usize) -> bool {
        let g = Ristretto255;
        let mut bases: Vec<Elem> = Vec::new();
        let mut seen = BTreeSet::new();
        let generator = g.exp_generator(&g.scalar_from_u64(1));
        for b in publics.iter().chain(secrets).chain([&generator]) {
            if seen.insert(g.encode(b)) {
                bases.push(*b);
            }
        }
        if bases.contains(target) {
            return true;
        }
        let mut frontier: Vec<Scalar> = scalars;
        frontier.extend(secrets.iter().map(|s| g.hash_to_scalar(domains::TGDH_NODE, s)));
        for _ in 0..depth {
            let mut next = Vec::new();
            for s in &frontier {
                for b in &bases {
                    let e = Group::exp(&g, b, s);
                    if &e == target {
                        return true;
                    }
                    next.push(g.hash_to_scalar(domains::TGDH_NODE, &e));
                }
            }
            frontier = next;
        }
        false
    }

    /// Applies `algo` (Queue-batch with a T' whose members agreed its keys).
    fn apply(algo: Algorithm, old: Option<&Tree<R>>, batch: &Batch, rng: &mut ChaCha20Rng) -> Option<Rekeyed<R>> {
        match algo {
            Algorithm::QueueBatch => {
                let sub = queue_subtree::<R>(&batch.joins).map(|s| keyed(s, rng));
                queue_merge(old, sub.as_ref(), &batch.leaves).unwrap()
            }
            a => a.apply(old, batch).unwrap(),
        }
    }

    /// The costs measured by [`simulate`], and what else it saw.
    fn measured(r: &Rekeyed<R>, rng: &mut ChaCha20Rng) -> (IntervalCosts, Outcome) {
        let out = simulate(r, rng);
        (out.costs.clone(), out)
    }

    fn members(range: std::ops::Range<usize>) -> Vec<MemberId> {
        range.map(id).collect()
    }

    // ---- The paper's examples -----------------------------------------------

    #[test]
    fn sponsor_coordination_reproduces_seal_fig_4() {
        // Fig. 4 itself is not in the text; it is read from §3.4: nodes 0, 1,
        // 2 and 6 are renewed; 3, 4, 5, 13 and 14 are the non-renewed
        // children of renewed nodes; the sponsors are M1, M2, M5, M7 and M8,
        // so (members numbered left to right) M1 is the rightmost member
        // under 3, M2 under 4, M5 under 5, M7 under 13 and M8 under 14, and
        // M6 and M7 are under 13. So 3 = M1, 4 = M2, 13 = (M6, M7), 14 = M8,
        // and 5 holds M3, M4 and M5; how 5 is shaped inside is not said and
        // changes nothing (taken here as ((M3, M4), M5): 23, 24 and 12).
        let t = from_heap(&[(3, 1), (4, 2), (23, 3), (24, 4), (12, 5), (27, 6), (28, 7), (14, 8)]);
        let renewed: BTreeSet<usize> = [0, 1, 2, 6].map(|p| at(&t, p)).into_iter().collect();
        let r = Rekeyed::with_renewed(t, &renewed);
        let lists: Vec<(MemberId, Vec<u64>)> = r
            .sponsors()
            .into_iter()
            .map(|(l, list)| (r.tree.member(l).unwrap().clone(), numbers(&r.tree, list)))
            .collect();
        assert_eq!(
            lists,
            [(id(1), vec![3]), (id(2), vec![4, 1]), (id(5), vec![5]), (id(7), vec![13]), (id(8), vec![14, 6, 2, 0])]
        );
        // Rounds: all but BK0 in round 1 (their sponsors hold the unchanged
        // siblings' blinded keys); BK0 needs BK1, sent in round 1, so M8 sends
        // it in a second packet in round 2 (the paper's "two rounds" case).
        // Packets as (sponsor, round, heap numbers of the nodes).
        let named = |plan: Vec<Packet>| -> Vec<(MemberId, u32, Vec<u64>)> {
            plan.into_iter()
                .map(|p| (r.tree.member(p.sponsor).unwrap().clone(), p.round, numbers(&r.tree, p.nodes)))
                .collect()
        };
        let plan = named(r.plan());
        assert_eq!(
            plan,
            [
                (id(1), 1, vec![3]),
                (id(2), 1, vec![4, 1]),
                (id(5), 1, vec![5]),
                (id(7), 1, vec![13]),
                (id(8), 1, vec![14, 6, 2]),
                (id(8), 2, vec![0]),
            ]
        );
        // Exps: the renewed nodes on each path (the root's is the group
        // secret) plus the renewed blinded keys sent: M1 2, M2 2 + BK1, M3-M5
        // 2, M6 3, M7 3, M8 3 + BK6, BK2, BK0; and key confirmation (§3.5),
        // g^K0 against the BK0 M8 broadcast, by everyone but M8.
        let c = r.costs();
        let exps: Vec<u64> = (1..=8).map(|i| c.members[&id(i)].exps).collect();
        assert_eq!(exps, [3, 4, 3, 3, 3, 4, 4, 6]);
        assert_eq!((c.bks, c.packets, c.rounds), (9, 6, 2));
        // Per-input sending (§4.2) with the whole tree held sends the same
        // packets: all but BK0 answer the REKEY packet, BK0 answers M2's.
        let reactive = named(r.reactive_plan_holding(&|l, v| r.holds(l, v)));
        assert_eq!(
            reactive,
            [
                (id(1), 0, vec![3]),
                (id(2), 0, vec![4, 1]),
                (id(5), 0, vec![5]),
                (id(7), 0, vec![13]),
                (id(8), 0, vec![14, 6, 2]),
                (id(8), 2, vec![0]),
            ]
        );
        // Holding nothing but their own paths, sponsors wait for siblings'
        // blinded keys: M2 sends BK1 on M1's BK3 (input 1), M8 BK14 at once,
        // BK6 and BK2 on M7's BK13 (input 4; M5's BK5 came before it), BK0 on
        // M2's BK1 (input 6): 8 packets for the same 9 blinded keys.
        let own_path = |l: usize, v: usize| r.tree.path(l).contains(&v);
        let reactive = named(r.reactive_plan_holding(&own_path));
        assert_eq!(
            reactive,
            [
                (id(1), 0, vec![3]),
                (id(2), 0, vec![4]),
                (id(5), 0, vec![5]),
                (id(7), 0, vec![13]),
                (id(8), 0, vec![14]),
                (id(2), 1, vec![1]),
                (id(8), 4, vec![6, 2]),
                (id(8), 6, vec![0]),
            ]
        );
        // The same counts, and one group secret, with real keys.
        let mut rng = ChaCha20Rng::seed_from_u64(4);
        let mut t = keyed(r.tree.clone(), &mut rng);
        for &v in &renewed {
            t.nodes[v].bk = None;
            t.nodes[v].clear_key();
        }
        let keyed_r = Rekeyed::with_renewed(t, &renewed);
        assert_eq!(measured(&keyed_r, &mut rng).0, c);
    }

    #[test]
    fn seal_members_hold_the_blinded_keys_of_their_co_paths_only() {
        // SEAL §3.4 on Fig. 4: "M6 and M7 do not hold the blinded key of
        // node 14 if it is promoted from one of its child nodes". Fig. 4's
        // tree before M9 (at 30, beside M8 at 29) left; Batch prunes it.
        let mut rng = ChaCha20Rng::seed_from_u64(5);
        let old = keyed(
            from_heap(&[(3, 1), (4, 2), (23, 3), (24, 4), (12, 5), (27, 6), (28, 7), (29, 8), (30, 9)]),
            &mut rng,
        );
        let r = Algorithm::Batch.apply(Some(&old), &Batch { joins: vec![], leaves: vec![id(9)] }).unwrap().unwrap();
        let leaf = |i: usize| r.tree.find(&id(i)).unwrap();
        assert_eq!(numbers(&r.tree, [leaf(8)]), [14]);
        let seal = r.seal_holds(Some(&old));
        let (n4, n5, n13, n14) = (at(&r.tree, 4), at(&r.tree, 5), at(&r.tree, 13), at(&r.tree, 14));
        assert!(!seal(leaf(6), n14) && !seal(leaf(7), n14));
        assert!(r.holds(leaf(6), n14) && r.holds(leaf(7), n14), "this crate's members hold the whole tree");
        // M8's old co-path was 30, 13, 5 and 1; M1's 4 and 2.
        assert!(seal(leaf(8), n13) && seal(leaf(8), n5));
        assert!(seal(leaf(1), n4) && !seal(leaf(1), n13) && !seal(leaf(1), n5));
        // A joiner holds the old tree the rekey message carries.
        let j = Algorithm::Batch.apply(Some(&old), &Batch { joins: vec![id(10)], leaves: vec![] }).unwrap().unwrap();
        let seal = j.seal_holds(Some(&old));
        let jl = j.tree.find(&id(10)).unwrap();
        let held = |v: usize| !j.is_renewed(v) && !j.is_fresh(v);
        assert!((0..j.tree.nodes.len()).filter(|&v| held(v)).all(|v| seal(jl, v)));
        // Holding less never sends a blinded key earlier: every packet of
        // the SEAL holdings' plan is in a round no earlier than the same
        // keys' in this crate's plan.
        for r in [&r, &j] {
            let seal = r.seal_holds(Some(&old));
            let round = |plan: Vec<Packet>| -> BTreeMap<usize, u32> {
                plan.into_iter().flat_map(|p| p.nodes.into_iter().map(move |v| (v, p.round))).collect()
            };
            let (ours, theirs) = (round(r.plan()), round(r.plan_holding(&seal)));
            assert_eq!(ours.keys().collect::<Vec<_>>(), theirs.keys().collect::<Vec<_>>());
            assert!(ours.iter().all(|(v, k)| theirs[v] >= *k));
        }
    }

    /// SEAL Fig. 1's tree: M1 at 7, M2 at 8, M3 at 4, M4 at 5, M5 at 13, M6 at 14.
    fn fig1() -> Tree<R> {
        from_heap(&[(7, 1), (8, 2), (4, 3), (5, 4), (13, 5), (14, 6)])
    }

    fn placed(r: &Rekeyed<R>) -> Vec<(u64, MemberId)> {
        let h = heap(&r.tree);
        r.tree.leaves().into_iter().map(|v| (h[v], r.tree.member(v).unwrap().clone())).collect()
    }

    #[test]
    fn batch_reproduces_seal_fig_2_and_saves_a_rekey_when_a_joiner_takes_a_leavers_place() {
        // Join of M7: M7 goes to node 12 under node 5, M4 moves to 11; nodes
        // 5, 2 and 0 are renewed.
        let join = Batch { joins: vec![id(7)], leaves: vec![] };
        let r = Algorithm::Batch.apply(Some(&fig1()), &join).unwrap().unwrap();
        assert_eq!(
            placed(&r),
            [(7, id(1)), (8, id(2)), (4, id(3)), (11, id(4)), (12, id(7)), (13, id(5)), (14, id(6))]
        );
        assert_eq!(numbers(&r.tree, r.renewed()), [0, 2, 5]);
        // Then M4 leaves: node 11 (M7) is promoted to 5; nodes 2 and 0 are renewed.
        let leave = Batch { joins: vec![], leaves: vec![id(4)] };
        let r2 = Algorithm::Batch.apply(Some(&r.tree), &leave).unwrap().unwrap();
        assert_eq!(placed(&r2), [(7, id(1)), (8, id(2)), (4, id(3)), (5, id(7)), (13, id(5)), (14, id(6))]);
        assert_eq!(numbers(&r2.tree, r2.renewed()), [0, 2]);
        // Both in one interval: M7 takes M4's leaf at once, one rekey
        // renewing 2 and 0.
        let both = Batch { joins: vec![id(7)], leaves: vec![id(4)] };
        let r3 = Algorithm::Batch.apply(Some(&fig1()), &both).unwrap().unwrap();
        assert_eq!(placed(&r3), placed(&r2));
        assert_eq!(numbers(&r3.tree, r3.renewed()), [0, 2]);
        assert!(r3.is_fresh(at(&r3.tree, 5)));
        // M7 (fresh) sends its leaf only: its sibling 6 is not renewed either,
        // so 6's sponsor M6 sends 2 (once M7's leaf is in: round 2), then 0;
        // M3 sends 1.
        let lists: Vec<(MemberId, Vec<u64>)> = r3
            .sponsors()
            .into_iter()
            .map(|(l, list)| (r3.tree.member(l).unwrap().clone(), numbers(&r3.tree, list)))
            .collect();
        assert_eq!(lists, [(id(3), vec![1]), (id(7), vec![5]), (id(6), vec![6, 2, 0])]);
        let c = r3.costs();
        assert_eq!((c.bks, c.packets, c.rounds), (5, 4, 2));
    }

    #[test]
    fn batch_and_queue_batch_place_joiners_at_the_shallowest_leavers_then_rightmost() {
        // Fig. 1: M3 (node 4) and M4 (node 5) are the shallowest; M4 is the
        // rightmost of them. Two leavers at depth 2 and one deeper (M1).
        let b = Batch { joins: vec![id(9)], leaves: vec![id(1), id(3), id(4)] };
        let r = Algorithm::Batch.apply(Some(&fig1()), &b).unwrap().unwrap();
        // M9 takes M4's node 5; M1 and M3 are pruned, M2 moves up to 1.
        assert_eq!(placed(&r), [(1, id(2)), (5, id(9)), (13, id(5)), (14, id(6))]);
        assert_eq!(numbers(&r.tree, r.renewed()), [0, 2]);
        let q = Algorithm::QueueBatch.apply(Some(&fig1()), &b).unwrap().unwrap();
        assert_eq!(placed(&q), placed(&r));
        // Queue-batch puts T' = (M9, M10) there whole.
        let b2 = Batch { joins: vec![id(9), id(10)], ..b };
        let q = Algorithm::QueueBatch.apply(Some(&fig1()), &b2).unwrap().unwrap();
        assert_eq!(placed(&q), [(1, id(2)), (11, id(9)), (12, id(10)), (13, id(5)), (14, id(6))]);
        assert_eq!(numbers(&q.tree, q.renewed()), [0, 2]);
        // Batch puts M9 at M4's place and M10 at TGDH's join position.
        let r = Algorithm::Batch.apply(Some(&fig1()), &b2).unwrap().unwrap();
        assert_eq!(placed(&r), [(3, id(2)), (4, id(10)), (5, id(9)), (13, id(5)), (14, id(6))]);
        assert_eq!(numbers(&r.tree, r.renewed()), [0, 1, 2]);
    }

    #[test]
    fn rebuild_renews_every_internal_node_and_elects_every_member() {
        let old = Tree::<R>::balanced(&members(0..8)).unwrap();
        let b = Batch { joins: vec![id(8), id(9)], leaves: vec![id(2)] };
        let r = Algorithm::Rebuild.apply(Some(&old), &b).unwrap().unwrap();
        let mut expect = members(0..10);
        expect.remove(2);
        assert_eq!(r.tree.members(), expect);
        assert_eq!(r.tree.heights()[r.tree.root], 4);
        assert_eq!(r.renewed().len(), 8);
        assert_eq!(r.sponsors().len(), 9);
    }

    #[test]
    fn batches_that_do_not_fit_the_tree_are_refused() {
        let old = Tree::<R>::balanced(&members(0..4)).unwrap();
        let cases = [
            (Batch { joins: vec![], leaves: vec![id(7)] }, BatchError::NotAMember(id(7))),
            (Batch { joins: vec![id(1)], leaves: vec![] }, BatchError::AlreadyAMember(id(1))),
            (Batch { joins: vec![id(5), id(5)], leaves: vec![] }, BatchError::Twice(id(5))),
            (Batch { joins: vec![], leaves: vec![id(1), id(1)] }, BatchError::Twice(id(1))),
        ];
        for (b, e) in cases {
            for a in Algorithm::ALL {
                assert_eq!(a.apply(Some(&old), &b).err(), Some(e.clone()), "{a:?}");
            }
        }
        // Leaving and joining again in one interval is a leave and a join.
        let again = Batch { joins: vec![id(1)], leaves: vec![id(1)] };
        for a in Algorithm::ALL {
            let r = a.apply(Some(&old), &again).unwrap().unwrap();
            assert!(r.renewed().contains(&r.tree.root), "{a:?}");
        }
        // Everybody leaving leaves nobody; joiners into nobody form the group.
        let all = Batch { joins: vec![], leaves: members(0..4) };
        for a in Algorithm::ALL {
            assert!(a.apply(Some(&old), &all).unwrap().is_none(), "{a:?}");
            let fresh = Batch { joins: members(0..3), leaves: vec![] };
            assert_eq!(a.apply::<R>(None, &fresh).unwrap().unwrap().tree.members(), members(0..3));
        }
    }

    #[test]
    fn metering_sample_batches_matches_a_computation_with_real_keys() {
        // Eight members m0..m7 in a complete tree (paper nodes 7..14).
        let mut rng = ChaCha20Rng::seed_from_u64(8);
        let old = keyed(Tree::balanced(&members(0..8)).unwrap(), &mut rng);
        // Batch, m8 replaces m3 (node 10): renewed 4, 1, 0. Sponsors m1 (3),
        // m2 (9), m8 (10, 4, 1, 0), m7 (2), all in round 1 (every sibling but
        // m8's leaf is held, and m8 sends that itself). Exps: m8 2 + 1 + its
        // leaf and three renewed blinded keys = 7; m2 3; m0 and m1 2; m4-m7 1;
        // and key confirmation, one more for everyone but m8 (BK0's sender).
        let b = Batch { joins: vec![id(8)], leaves: vec![id(3)] };
        let r = apply(Algorithm::Batch, Some(&old), &b, &mut rng).unwrap();
        let c = r.costs();
        let exps: Vec<u64> = [0, 1, 2, 8, 4, 5, 6, 7].map(|i| c.members[&id(i)].exps).to_vec();
        assert_eq!(exps, [3, 3, 4, 7, 2, 2, 2, 2]);
        assert_eq!((c.bks, c.packets, c.rounds), (7, 4, 1));
        assert_eq!(c.table2(), (25.0 / 8.0, 7.0, 4.0));
        assert_eq!(measured(&r, &mut rng).0, c);
        // Queue-batch, m8 and m9 join (T' of height 1, which only fits at
        // the root): m7 sends the old root's blinded key, m9 T''s and the
        // new root's; every member computes the root, m9 blinds it, the
        // others blind it to confirm it.
        let b = Batch { joins: vec![id(8), id(9)], leaves: vec![] };
        let r = apply(Algorithm::QueueBatch, Some(&old), &b, &mut rng).unwrap();
        let c = r.costs();
        assert!(members(0..9).iter().all(|m| c.members[m].exps == 2));
        assert_eq!(c.members[&id(9)].exps, 2);
        assert_eq!((c.bks, c.packets, c.rounds), (3, 2, 1));
        assert_eq!(measured(&r, &mut rng).0, c);
        // A few more, each checked against the computation and printed
        // (`--nocapture`) for the record.
        let samples = [
            Batch { joins: vec![id(8)], leaves: vec![id(3)] },
            Batch { joins: vec![id(8), id(9), id(10)], leaves: vec![id(0), id(5)] },
            Batch { joins: vec![], leaves: vec![id(1), id(6)] },
            Batch { joins: vec![id(8), id(9)], leaves: vec![] },
        ];
        for b in &samples {
            for a in Algorithm::ALL {
                let r = apply(a, Some(&old), b, &mut rng).unwrap();
                let c = r.costs();
                assert_eq!(measured(&r, &mut rng).0, c, "{a:?} {b:?}");
                let (e, k, p) = c.table2();
                eprintln!(
                    "{a:?} +{} -{}: exps/member {e:.3}, blinded keys {k}, packets {p}, rounds {}",
                    b.joins.len(),
                    b.leaves.len(),
                    c.rounds
                );
            }
        }
    }

    // ---- Properties -----------------------------------------------------------

    fn decode(t: &Tree<R>) -> Tree<R> {
        let mut w = Writer::new();
        t.encode(&mut w);
        let mut r = Reader::new(&w.buf);
        Tree::decode(&mut r, &Ristretto255).unwrap()
    }

    fn check(seed: u64, n: usize, leave_mask: u16, joins: usize, rejoin: bool) -> Result<(), TestCaseError> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let old_members = members(0..n);
        let old = (n > 0).then(|| keyed(random_tree(&mut rng, &old_members), &mut rng));
        let leaves: Vec<MemberId> =
            old_members.iter().enumerate().filter(|(i, _)| leave_mask >> i & 1 == 1).map(|(_, m)| m.clone()).collect();
        let mut join = members(100..100 + joins);
        if rejoin {
            join.extend(leaves.first().cloned());
        }
        let batch = Batch { joins: join.clone(), leaves: leaves.clone() };
        let mut expect: BTreeSet<MemberId> = old_members.iter().filter(|m| !leaves.contains(m)).cloned().collect();
        expect.extend(join.iter().cloned());
        for algo in Algorithm::ALL {
            let Some(r) = apply(algo, old.as_ref(), &batch, &mut rng) else {
                prop_assert!(expect.is_empty(), "{:?}: nobody left", algo);
                continue;
            };
            let t = &r.tree;
            prop_assert_eq!(t.members().into_iter().collect::<BTreeSet<_>>(), expect.clone());
            // Deterministic: a member holding the tree as decoded from the
            // wire gets the same shape and renewed nodes.
            if let Some(old) = &old {
                let again = algo.apply(Some(&decode(old)), &batch).unwrap().unwrap();
                let pairs = t.correspondence(&again.tree);
                prop_assert!(pairs.is_some(), "{:?}: another shape from the decoded tree", algo);
                for (x, y) in pairs.unwrap() {
                    prop_assert_eq!(r.is_renewed(x), again.is_renewed(y));
                }
            }
            // Renewed nodes are closed upwards.
            for v in r.renewed() {
                prop_assert!(t.nodes[v].parent.is_none_or(|p| r.is_renewed(p)));
            }
            // Every renewed node's blinded key, and every non-renewed child
            // of a renewed node's, is sent exactly once; nothing else is.
            let mut want: Vec<usize> = r.renewed().into_iter().collect();
            for v in r.renewed() {
                want.extend(t.nodes[v].kids.unwrap().into_iter().filter(|&c| !r.is_renewed(c)));
            }
            want.sort_unstable();
            let mut listed: Vec<usize> = r.sponsors().into_iter().flat_map(|(_, l)| l).collect();
            listed.sort_unstable();
            prop_assert_eq!(&listed, &want);
            // With real keys: one group secret for all (checked inside),
            // each blinded key sent once, and the metered counts.
            let (costs, out) = measured(&r, &mut rng);
            let mut sent: Vec<usize> = out.sent.iter().map(|(v, _)| *v).collect();
            sent.sort_unstable();
            prop_assert_eq!(&sent, &want);
            prop_assert_eq!(&costs, &r.costs());
            let Some(secret) = &out.secret else { continue };
            // Everything public: the old tree's and the new tree's blinded
            // keys (T''s among them) and every broadcast.
            let mut publics: Vec<Elem> = out.sent.iter().map(|(_, b)| *b).collect();
            publics.extend(old.iter().flat_map(|o| o.bks().cloned()));
            let mut pooled = t.clone();
            pooled.fill_keys(&mut Ristretto255, &mut rng);
            publics.extend(pooled.bks().cloned());
            // The model can find a key: a member reaches the group secret
            // from its own keys in one level.
            prop_assert!(reaches(out.keys[0].clone(), &[], &publics, secret, 1));
            if let Some(old) = &old {
                let old_secret = old.group_secret(&mut Ristretto255, old.leaves()[0]);
                // Forward secrecy: a leaver (not joining again), with every
                // key of its old path and the old group secret.
                if let Some(m) = leaves.iter().find(|m| !join.contains(m)) {
                    let leaf = old.find(m).unwrap();
                    let keys: Vec<Scalar> = old.path(leaf).iter().filter_map(|&v| old.nodes[v].key).collect();
                    let held: Vec<Elem> = old_secret.iter().cloned().collect();
                    prop_assert!(!reaches(keys, &held, &publics, secret, 2), "{:?}: a leaver reaches the key", algo);
                }
                // Backward secrecy: a joiner, with every key it ends with.
                if let (Some(j), Some(old_secret)) = (join.iter().position(|m| !leaves.contains(m)), &old_secret) {
                    let leaf = t.find(&join[j]).unwrap();
                    let i = t.leaves().iter().position(|&l| l == leaf).unwrap();
                    prop_assert!(
                        !reaches(out.keys[i].clone(), &[], &publics, old_secret, 2),
                        "{:?}: a joiner reaches the old key",
                        algo
                    );
                }
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn random_trees_and_batches_give_one_secret_that_leavers_and_joiners_cannot_reach(
            seed in any::<u64>(),
            n in 0usize..9,
            leave_mask in any::<u16>(),
            joins in 0usize..5,
            rejoin in any::<bool>(),
        ) {
            check(seed, n, leave_mask, joins, rejoin)?;
        }
    }
}
