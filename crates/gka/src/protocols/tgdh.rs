//! Tree-based Group Diffie-Hellman, TGDH (TISSEC §4.3, Figs. 5 and 6; Kim,
//! Perrig and Tsudik).
//!
//! # The key tree
//! Members are the leaves of a binary tree. A leaf's key is its member's
//! random contribution r; an internal node with children L and R has the
//! secret element BK_R^{k_L} = BK_L^{k_R} = g^{k_L k_R}, and — unless it is
//! the root — the key k = H(secret element) (hash domain `TGDH_NODE`). Every
//! node's blinded key is BK = g^k. The root's secret element is the group
//! secret. Every member keeps the whole shape, every blinded key, and the
//! keys on its own path; that tree, as it was when the last key was
//! installed, is the member's persistent state. Each run
//! works on a copy, so a run interrupted by a new view is simply dropped; the
//! copy shares the saved tree's blinded keys, each held with its encoding, so
//! copying a tree, comparing an announced tree with one's own and sending one
//! costs no group operation.
//!
//! # Sponsors and rounds
//! A membership event invalidates the blinded keys (and keys) on some paths
//! to the root. The unknown blinded keys are always closed upwards (an
//! unknown node's ancestors are unknown). A non-root node whose blinded key is
//! unknown is *ready* when its children's blinded keys are known (or it is a
//! leaf whose member refreshed its key). Its *sponsor* is the rightmost leaf
//! under it: that member computes the keys and blinded keys from the ready
//! node up its path as far as the known blinded keys allow (stopping below
//! the root) and broadcasts them (round tag [`ROUND_KEYS`]). These rules are a
//! function of the public tree, which every member holds identically at every
//! delivery (agreed order), so exactly one member sends for each ready node;
//! a member remembers which ready node it already sent for, so it does not
//! send twice while its own message is in flight. Every member computes the
//! keys on its own path as soon as the blinded keys it needs are known.
//!
//! A member installs when, after a delivered message, every blinded key but
//! the root's is known: that condition depends only on the public tree, so it
//! becomes true at the same delivery for everybody, and the last sponsor
//! installs when its own final broadcast comes back. The root secret is
//! computed only then.
//!
//! # Leave and partition (`Change::single`)
//! Every member removes the departed leaves: a node that lost a child is
//! replaced by the other child's subtree, and every node above a removal point
//! is invalidated (Fig. 5). The sponsor of a removal point is the rightmost
//! leaf of the subtree that took its place; the shallowest of them (then the
//! rightmost) refreshes its leaf key, which invalidates its path. If nobody
//! left (a view with the same members), the rightmost member refreshes. Then
//! sponsor rounds as above: one round and one broadcast for a single leave.
//!
//! # Merge (`!Change::single`, Fig. 6)
//! Each subgroup removes the members that are not in it (`Change::mine`) from
//! the tree of its last secure state (a fresh member is a one-leaf tree); its
//! sponsor, the rightmost leaf, refreshes its leaf key, recomputes its path up
//! to the subtree's root and broadcasts the whole tree with its blinded keys
//! (round tag [`ROUND_TREE`]). A member knows its own subgroup only, so it
//! waits until the announced trees cover the view — using the announcement of
//! its own subgroup too, so that everybody merges identical inputs. Then
//! every member orders the trees (more leaves first, then by the view
//! position of their first member) and inserts each into the accumulated
//! tree, as the right child of a new node, at the shallowest (then rightmost)
//! node where it does not make the tree higher, or at the root if it would
//! everywhere. The new nodes and their ancestors are invalidated and sponsor
//! rounds follow. A join is the merge of a one-leaf tree: the joiner's and the
//! old group's announcements, then (unless the joiner went in at the root) the
//! joiner as the sponsor of its new parent: two rounds, three broadcasts.
//!
//! # Cascades
//! A new view abandons the run: the next one starts from the saved tree of
//! the last install, which all members of a subgroup share.
//!
//! # Validation
//! Trees are decoded with bounded counts and iteratively (no recursion on
//! received depth); every member appears at most once in the view's
//! announcements, which must come from their tree's rightmost leaf and carry
//! exactly the blinded keys its sponsor can compute; an announcement of the
//! member's own subgroup must match its own tree except on the sponsor's path.
//! A blinded-key broadcast must come from the sponsor of the lowest unknown
//! node on its path, and may only fill unknown nodes it can compute.

use std::collections::BTreeSet;
use std::sync::Arc;

use conclave_gcs::{kept_places, MemberId, MemberSet, ViewMember};
use zeroize::Zeroize;

use super::{get_elem, MAX_MEMBERS};
use crate::codec::{DecodeError, Reader, Writer};
use crate::engine::{Change, Ctx, Error, Misbehaved, Protocol};
use crate::suite::Group;
use crate::tree::{Bk, Tree, Undo};
use crate::ProtocolId;

/// A subgroup's tree, announced by its sponsor at a merge.
const ROUND_TREE: u8 = 1;
/// A sponsor's new blinded keys, bottom up along its path.
const ROUND_KEYS: u8 = 2;

/// One member's TGDH state.
pub struct Tgdh<G: Group> {
    /// The tree as of the last install (keys on this member's path), but
    /// while a rekey changes it in place (see [`Rounds::undo`]).
    saved: Option<Tree<G>>,
    /// Where the members of the last install's view have their leaves in `saved`.
    saved_places: Places,
    /// The run of the current view.
    run: Run<G>,
}

enum Run<G: Group> {
    /// No run: the key is installed (or there is no view).
    Idle,
    /// A merge, waiting for the subgroups' trees.
    Collect(Collect<G>),
    /// Sponsor rounds on the new tree.
    Rounds(Rounds<G>),
}

struct Collect<G: Group> {
    /// This member's subgroup's tree, with this member's keys.
    mine: Tree<G>,
    /// For each member of the view, by its place, whether it is of this
    /// member's subgroup (a set of its names was n names hashed per member
    /// and merge).
    mine_marks: Vec<bool>,
    /// How many members this member's subgroup has.
    mine_count: usize,
    /// Whether this member's subgroup has announced its tree.
    mine_announced: bool,
    /// The other subgroups' announced trees.
    others: Vec<Tree<G>>,
    /// Members of the other subgroups' trees announced so far.
    covered: MemberSet,
    /// `mine` is the saved tree itself, pruned in place (see [`Rounds::undo`]):
    /// what changed, the saved tree's places, and each member of the
    /// subgroup's leaf by its place in the view.
    in_place: Option<InPlace<G>>,
}

/// Why a merge did not go on in the saved tree ([`Tgdh::merge_in_place`]):
/// the saved tree, put back, and its places; a copy of the own subgroup's
/// tree to merge with the others instead (`None`: the merge failed).
struct NotFirst<G: Group> {
    saved: Tree<G>,
    places: Places,
    copy: Option<Tree<G>>,
    others: Vec<Tree<G>>,
}

/// A merge's own subgroup worked on in the saved tree itself.
struct InPlace<G: Group> {
    undo: Undo<G>,
    places: Places,
    leaves: Vec<(usize, usize)>,
}

impl<G: Group> Collect<G> {
    /// How many members of the view the trees announced so far hold.
    fn covered(&self) -> usize {
        self.covered.len() + if self.mine_announced { self.mine_count } else { 0 }
    }

    /// Whether `m` is of this member's subgroup.
    fn is_mine(&self, cx: &Ctx<'_, G>, m: &MemberId) -> bool {
        cx.position(m).is_some_and(|p| self.mine_marks[p])
    }
}

struct Rounds<G: Group> {
    tree: Tree<G>,
    /// Each member's leaf in `tree`, by its place in the view: the shape is
    /// fixed for the rounds (looked up at every message; [`Tree::find`]
    /// would scan the tree).
    leaf: Vec<usize>,
    /// Ready nodes this member has broadcast the blinded keys of.
    sent: BTreeSet<usize>,
    /// A rekey works on the saved tree itself, changed in place (a few
    /// paths, where a copy would cost the whole tree): what it changed, and
    /// the saved tree's leaves, to put back if a new view abandons the run.
    undo: Option<(Undo<G>, Places)>,
}

/// The leaves of a saved tree by their members' places in the view of its
/// install, and that view's members. Views keep their members' order, so a
/// rekey finds where each went in the next view by walking both lists side
/// by side (two clones of one name compare by address), where looking up
/// every leaf's name would hash n names, each a read of memory no other
/// step touches.
#[derive(Default)]
struct Places {
    members: Option<Arc<[ViewMember]>>,
    leaves: Vec<usize>,
}

impl Places {
    /// For each place of the saved view, the place of its member in `view`
    /// (`None`: not in it); `None` if `view` is not the saved one's members
    /// in the same order, some gone.
    fn moved_into(&self, view: &[ViewMember]) -> Option<Vec<Option<usize>>> {
        self.walk(view).filter(|&(_, j)| j == view.len()).map(|(to, _)| to)
    }

    /// [`Places::moved_into`] for a view that may add newcomers after the
    /// members that stay: also how many of `view`'s members come first,
    /// from the saved view (the rest are not of it).
    fn walk(&self, view: &[ViewMember]) -> Option<(Vec<Option<usize>>, usize)> {
        let old = self.members.as_deref().filter(|m| m.len() == self.leaves.len())?;
        Some(kept_places(old, view))
    }
}

impl<G: Group> Rounds<G> {
    /// Rounds on `tree`, of `leaves` leaves, which must hold every member of
    /// the view once (`leaf`: each member's leaf, by its place in the view).
    fn new(cx: &Ctx<'_, G>, tree: Tree<G>, leaf: Vec<Option<usize>>, leaves: usize) -> Result<Self, Error> {
        let leaf: Vec<usize> = leaf
            .into_iter()
            .collect::<Option<_>>()
            .ok_or(Error::Internal("TGDH key tree lacks a member of the view"))?;
        // Every member has a leaf; as many leaves as members: one each.
        if leaves != cx.view.members.len() {
            return Err(Error::Internal("TGDH key tree holds a member twice"));
        }
        Ok(Self { tree, leaf, sent: BTreeSet::new(), undo: None })
    }

    /// The leaf of member `m` of the view.
    fn leaf_of(&self, cx: &Ctx<'_, G>, m: &MemberId) -> Option<usize> {
        cx.position(m).map(|p| self.leaf[p])
    }
}

impl<G: Group> Tgdh<G> {
    /// A view whose members all share this member's state: remove the
    /// departed, let the shallowest-rightmost removal sponsor refresh. The
    /// saved tree is changed in place, noting what changes: a leave
    /// changes a few paths, and a copy of the tree (n nodes) per member and
    /// view was most of a large group's cost of a leave.
    fn start_rekey(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let mut tree = self.saved.take().ok_or(Error::Internal("TGDH rekey without a key tree"))?;
        let saved_places = std::mem::take(&mut self.saved_places);
        let mut undo = Undo::of(&tree);
        match Self::prune_for_rekey(cx, &mut tree, &saved_places, &mut undo) {
            Ok((leaf, refresher)) => {
                if tree.member(refresher) == Some(cx.me) {
                    tree.nodes[refresher].key = Some(cx.random());
                }
                // Each member of the view has its own leaf (checked), and
                // the pruned tree no other.
                let undo = Some((undo, saved_places));
                self.run = Run::Rounds(Rounds { tree, leaf, sent: BTreeSet::new(), undo });
                self.advance(cx)
            }
            Err(e) => {
                tree.undo(undo);
                self.saved = Some(tree);
                self.saved_places = saved_places;
                Err(e)
            }
        }
    }

    /// Removes from `tree` (whose leaves `places` gives) the members not in
    /// the view and invalidates the refresher's path, noting every change in
    /// `undo`. Returns each member's leaf by its place in the view, and the
    /// refresher. Every check comes before the first change.
    fn prune_for_rekey(
        cx: &Ctx<'_, G>,
        tree: &mut Tree<G>,
        places: &Places,
        undo: &mut Undo<G>,
    ) -> Result<(Vec<usize>, usize), Error> {
        let n = cx.view.members.len();
        let mut leaf = vec![usize::MAX; n];
        let mut gone = Vec::new();
        // Each leaf's member's place in the view: by the walk, or else by name.
        let moved = places.moved_into(&cx.view.members);
        for (i, &v) in places.leaves.iter().enumerate() {
            let p = match &moved {
                Some(to) => to[i],
                None => tree.member(v).and_then(|m| cx.position(m)),
            };
            match p {
                Some(p) if leaf[p] == usize::MAX => leaf[p] = v,
                Some(_) => return Err(Error::Internal("TGDH key tree holds a member twice")),
                None => gone.push(v),
            }
        }
        if leaf.contains(&usize::MAX) {
            return Err(Error::Internal("TGDH key tree lacks a member of the view"));
        }
        let sponsors = tree.prune_in_place(&gone, undo).ok_or(Error::Internal("TGDH key tree out of order"))?;
        let refresher = tree.refresher(sponsors);
        tree.invalidate_path_noted(refresher, undo);
        Ok((leaf, refresher))
    }

    /// Abandons the run, if any: a rekey puts back the saved tree it changed.
    fn abandon(&mut self) {
        let (mut tree, undo, places) = match std::mem::replace(&mut self.run, Run::Idle) {
            Run::Rounds(Rounds { tree, undo: Some((undo, places)), .. }) => (tree, undo, places),
            Run::Collect(Collect { mine, in_place: Some(ip), .. }) => (mine, ip.undo, ip.places),
            _ => return,
        };
        tree.undo(undo);
        self.saved = Some(tree);
        self.saved_places = places;
    }

    /// A merge: prune to the own subgroup; its sponsor refreshes and
    /// announces the subgroup's tree.
    fn start_merge(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        let marks = change.mine_marks(cx.view)?;
        let (mut t, mut in_place) = match self.prune_in_place_to(cx, change, &marks)? {
            Some((t, in_place)) => (t, Some(in_place)),
            None => {
                // The saved tree pruned to the subgroup holds all of it exactly
                // when it has as many leaves (a tree holds each member once).
                let of_mine = |m: &MemberId| cx.position(m).is_some_and(|p| marks[p]);
                let pruned = self.saved.as_ref().and_then(|s| s.prune(of_mine)).map(|(t, _)| t);
                let t = match pruned {
                    Some(t) if t.leaf_count() == change.mine.len() => t,
                    _ if change.mine.len() == 1 && &change.mine[0] == cx.me => Tree::leaf(cx.me.clone(), None, None),
                    _ => return Err(Error::Internal("TGDH key tree lacks a member of the subgroup")),
                };
                (t, None)
            }
        };
        let sponsor = t.rightmost(t.root);
        match in_place.as_mut() {
            Some(ip) => t.invalidate_path_noted(sponsor, &mut ip.undo),
            None => t.invalidate_path(sponsor),
        }
        if t.member(sponsor) == Some(cx.me) {
            t.nodes[sponsor].key = Some(cx.random());
            t.climb(cx, sponsor, true);
            let mut ann = t.public();
            let path = t.path(sponsor);
            for (u, bk) in path.iter().zip(t.blind(cx, &path)) {
                ann.nodes[*u].bk = Some(bk);
            }
            let mut w = Writer::new();
            ann.encode(&mut w);
            cx.broadcast(ROUND_TREE, w.buf);
        }
        self.run = Run::Collect(Collect {
            mine: t,
            mine_marks: marks,
            mine_count: change.mine.len(),
            mine_announced: false,
            others: Vec::new(),
            covered: MemberSet::default(),
            in_place,
        });
        Ok(())
    }

    /// The saved tree, pruned in place to the subgroup (`Change::mine`), if
    /// the saved view's members are found in the view by walking both lists
    /// and the subgroup is all there: a join leaves the old members' tree
    /// as it is but for the sponsor's path, where a prune would copy it.
    /// `None`, with nothing changed, for the prune by name.
    #[allow(clippy::type_complexity)]
    fn prune_in_place_to(
        &mut self,
        cx: &Ctx<'_, G>,
        change: &Change,
        marks: &[bool],
    ) -> Result<Option<(Tree<G>, InPlace<G>)>, Error> {
        let Some((to, _)) = self.saved_places.walk(&cx.view.members) else { return Ok(None) };
        if self.saved.is_none() {
            return Ok(None);
        }
        let mut gone = Vec::new();
        let mut leaves = Vec::with_capacity(change.mine.len());
        for (i, &v) in self.saved_places.leaves.iter().enumerate() {
            match to[i] {
                Some(p) if marks[p] => leaves.push((p, v)),
                _ => gone.push(v),
            }
        }
        if leaves.is_empty() || leaves.len() != change.mine.len() {
            return Ok(None);
        }
        let mut tree = self.saved.take().expect("checked");
        let mut undo = Undo::of(&tree);
        if tree.prune_in_place(&gone, &mut undo).is_none() {
            tree.undo(undo);
            self.saved = Some(tree);
            return Ok(None);
        }
        let places = std::mem::take(&mut self.saved_places);
        Ok(Some((tree, InPlace { undo, places, leaves })))
    }

    /// A subgroup's announced tree.
    fn on_tree(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_TREE;
        let bad = |what: Misbehaved| Err(what.by(from));
        let Run::Collect(co) = &mut self.run else {
            return bad(Misbehaved::OutsideItsRun { round });
        };
        if co.is_mine(cx, from) {
            Self::on_own_tree(co, cx, from, body)?;
        } else {
            Self::on_other_tree(co, cx, from, body)?;
        }
        if co.covered() < cx.view.members.len() {
            return Ok(());
        }
        // Every subgroup has announced: merge.
        let Run::Collect(co) = std::mem::replace(&mut self.run, Run::Idle) else {
            return Err(Error::Internal("TGDH merge state lost"));
        };
        let Collect { mine, others, in_place, .. } = co;
        if let Some(ip) = in_place {
            match Self::merge_in_place(cx, mine, others, ip) {
                Ok(rd) => {
                    self.run = Run::Rounds(rd);
                    return self.advance(cx);
                }
                Err(not_first) => {
                    // Another subgroup goes first: merge a copy, as without
                    // the saved tree, which is put back.
                    let NotFirst { saved, places, copy, others } = *not_first;
                    self.saved = Some(saved);
                    self.saved_places = places;
                    let copy = copy.ok_or(Error::Internal("TGDH merge lacks a member of the view"))?;
                    return self.merge_copies(cx, copy, others);
                }
            }
        }
        self.merge_copies(cx, mine, others)
    }

    /// A tree's first member's place in the view (how [`Tree::merge`]
    /// orders trees of as many leaves).
    fn first_place(cx: &Ctx<'_, G>, t: &Tree<G>) -> Option<usize> {
        t.members().iter().filter_map(|m| cx.position(m)).min()
    }

    /// The merge of the subgroups' trees, each a tree of its own.
    fn merge_copies(&mut self, cx: &mut Ctx<'_, G>, mine: Tree<G>, mut trees: Vec<Tree<G>>) -> Result<(), Error> {
        trees.push(mine);
        let acc = Tree::merge(trees, |t| Self::first_place(cx, t)).ok_or(Error::Internal("TGDH merge of nothing"))?;
        let leaves = acc.leaves();
        let mut leaf = vec![None; cx.view.members.len()];
        for &v in &leaves {
            if let Some(p) = acc.member(v).and_then(|m| cx.position(m)) {
                leaf[p] = Some(v);
            }
        }
        self.run = Run::Rounds(Rounds::new(cx, acc, leaf, leaves.len())?);
        self.advance(cx)
    }

    /// The merge into this member's own subgroup's tree, the saved tree
    /// changed in place, when that tree goes first in [`Tree::merge`]'s
    /// order (a join, for the old members): the others are inserted into it,
    /// every change noted. Otherwise gives back the saved tree, put back,
    /// and what to merge instead.
    fn merge_in_place(
        cx: &Ctx<'_, G>,
        mut mine: Tree<G>,
        others: Vec<Tree<G>>,
        mut ip: InPlace<G>,
    ) -> Result<Rounds<G>, Box<NotFirst<G>>> {
        let first = |t: &Tree<G>| Self::first_place(cx, t);
        // Tree::merge's order: more leaves first, then the first member's
        // place in the view (asked only of trees whose count another shares).
        let count = ip.leaves.len();
        let mine_first = ip.leaves.iter().map(|&(p, _)| p).min();
        let counts: Vec<usize> = others.iter().map(Tree::leaf_count).collect();
        let goes_first = counts.iter().zip(&others).all(|(&c, t)| c < count || (c == count && first(t) > mine_first));
        let n = cx.view.members.len();
        if !goes_first || count + counts.iter().sum::<usize>() != n {
            let copy = Some(mine.compact());
            mine.undo(ip.undo);
            return Err(Box::new(NotFirst { saved: mine, places: ip.places, copy, others }));
        }
        let mut rest: Vec<(usize, Option<usize>, Tree<G>)> =
            others.into_iter().zip(counts).map(|(t, c)| (c, first(&t), t)).collect();
        rest.sort_by_key(|&(c, first, _)| (std::cmp::Reverse(c), first));
        let rest: Vec<Tree<G>> = rest.into_iter().map(|(_, _, t)| t).collect();
        let offsets = mine.insert_all_noted(&rest, &mut ip.undo);
        let mut leaf = vec![usize::MAX; n];
        for &(p, v) in &ip.leaves {
            leaf[p] = v;
        }
        for (t, off) in rest.iter().zip(offsets) {
            for v in t.leaves() {
                if let Some(p) = t.member(v).and_then(|m| cx.position(m)) {
                    leaf[p] = off + v;
                }
            }
        }
        if leaf.contains(&usize::MAX) {
            // Cannot be (the trees hold each member of the view once, and
            // as many leaves): the saved tree is put back.
            mine.undo(ip.undo);
            return Err(Box::new(NotFirst { saved: mine, places: ip.places, copy: None, others: Vec::new() }));
        }
        Ok(Rounds { tree: mine, leaf, sent: BTreeSet::new(), undo: Some((ip.undo, ip.places)) })
    }

    /// The announcement of this member's own subgroup: its own tree but for
    /// the sponsor's new path, read against that tree (no decoding off the
    /// path).
    fn on_own_tree(co: &mut Collect<G>, cx: &Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_TREE;
        let bad = |what: Misbehaved| Err(what.by(from));
        if co.mine_announced {
            return bad(Misbehaved::AlreadyAnnounced { round });
        }
        let t = &mut co.mine;
        let s = t.rightmost(t.root);
        if t.member(s) != Some(from) {
            return bad(Misbehaved::NotSponsor { round });
        }
        let spath = t.path(s);
        let mut r = Reader::new(body);
        let Some(bks) = t.read_as_own(&mut r, cx.g, &spath)? else {
            return bad(Misbehaved::Inconsistent { round });
        };
        r.finish()?;
        // On the sponsor's path, a blinded key exactly where both children's
        // are known (off the path they are this member's own).
        let known = |v: usize| match spath.iter().position(|&u| u == v) {
            Some(i) => bks[i].is_some(),
            None => t.has_bk(v),
        };
        let ready = |v: usize| t.nodes[v].kids.is_none_or(|[l, r]| known(l) && known(r));
        if !known(s) || spath[1..].iter().any(|&u| known(u) != ready(u)) {
            return bad(Misbehaved::WrongShape { round });
        }
        for (&u, bk) in spath.iter().zip(bks) {
            t.nodes[u].bk = bk;
        }
        co.mine_announced = true;
        Ok(())
    }

    /// Another subgroup's announced tree, decoded whole.
    fn on_other_tree(co: &mut Collect<G>, cx: &Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_TREE;
        let bad = |what: Misbehaved| Err(what.by(from));
        let mut r = Reader::new(body);
        let b = Tree::decode(&mut r, cx.g)?;
        r.finish()?;
        let members = b.members();
        if members.iter().any(|m| !cx.contains(m)) {
            return bad(Misbehaved::WrongShape { round });
        }
        if members.iter().any(|m| co.covered.contains(m)) {
            return bad(Misbehaved::AlreadyAnnounced { round });
        }
        let Some(s) = b.find(from) else {
            // A subgroup's tree is announced by a member of it.
            return bad(Misbehaved::WrongShape { round });
        };
        if b.rightmost(b.root) != s {
            return bad(Misbehaved::NotSponsor { round });
        }
        for v in 0..b.nodes.len() {
            if let Some([l, r]) = b.nodes[v].kids {
                if b.has_bk(v) && !(b.has_bk(l) && b.has_bk(r)) {
                    return Err(DecodeError::Bad("TGDH blinded key above an unknown one").into());
                }
            }
        }
        let spath = b.path(s);
        if !b.has_bk(s) || spath[1..].iter().any(|&u| b.has_bk(u) != b.ready(u)) {
            return bad(Misbehaved::WrongShape { round });
        }
        if members.iter().any(|m| co.is_mine(cx, m)) {
            return bad(Misbehaved::Inconsistent { round });
        }
        co.others.push(b);
        co.covered.extend(members);
        Ok(())
    }

    /// A sponsor's new blinded keys.
    fn on_keys(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, body: &[u8]) -> Result<(), Error> {
        let round = ROUND_KEYS;
        let Run::Rounds(rd) = &mut self.run else {
            return Err(Misbehaved::OutsideItsRun { round }.by(from));
        };
        // The rounds' tree holds every member of the view.
        let s = rd.leaf_of(cx, from).ok_or(Error::Internal("TGDH blinded keys from a member not in the tree"))?;
        let t = &mut rd.tree;
        let path = t.path(s);
        let top = path.len() - 1;
        // A member whose path is complete is the sponsor of nothing.
        let i = t.lowest_unknown(&path).ok_or_else(|| Misbehaved::NotSponsor { round }.by(from))?;
        if !t.sponsors(s, path[i]) {
            return Err(Misbehaved::NotSponsor { round }.by(from));
        }
        let mut r = Reader::new(body);
        let k = r.count(MAX_MEMBERS, cx.g.element_len(), "TGDH blinded keys")?;
        if k == 0 || i + k > top {
            return Err(DecodeError::Bad("TGDH blinded key count").into());
        }
        if (i + 1..i + k).any(|j| !t.sibling(path[j - 1]).is_some_and(|u| t.has_bk(u))) {
            return Err(Misbehaved::WrongShape { round }.by(from));
        }
        let mut bks = Vec::with_capacity(k);
        for _ in 0..k {
            bks.push(Bk::read(&mut r, cx.g)?);
        }
        r.finish()?;
        for (j, bk) in bks.into_iter().enumerate() {
            t.nodes[path[i + j]].bk = Some(bk);
        }
        self.advance(cx)
    }

    /// After any change: compute own path keys, do sponsor duty, install
    /// when every non-root blinded key is known.
    fn advance(&mut self, cx: &mut Ctx<'_, G>) -> Result<(), Error> {
        let Run::Rounds(rd) = &mut self.run else { return Ok(()) };
        let me = rd.leaf_of(cx, cx.me).ok_or(Error::Internal("TGDH tree lacks this member"))?;
        let t = &mut rd.tree;
        t.climb(cx, me, false);
        let path = t.path(me);
        let top = path.len() - 1;
        if top == 0 {
            return Err(Error::Internal("TGDH tree of one member in a run"));
        }
        if let Some(i) = t.lowest_unknown(&path) {
            let v = path[i];
            if t.sponsors(me, v) && rd.sent.insert(v) {
                let bks = t.blind(cx, &path[i..top]);
                let mut w = Writer::new();
                w.count(bks.len());
                for bk in &bks {
                    bk.write(&mut w);
                }
                cx.broadcast(ROUND_KEYS, w.buf);
            }
            return Ok(());
        }
        if !t.complete() {
            return Ok(());
        }
        let mut secret = t.group_secret(cx, me).ok_or(Error::Internal("TGDH key path incomplete"))?;
        cx.install(&secret);
        secret.zeroize();
        if let Run::Rounds(rd) = std::mem::replace(&mut self.run, Run::Idle) {
            let (mut tree, mut leaves) = (rd.tree, rd.leaf);
            // Changes in place leave removed nodes behind: once they are as
            // many as the tree's own, the tree is copied without them.
            if tree.nodes.len() > 4 * leaves.len() {
                let (compact, new_of) = tree.compacted();
                tree = compact;
                leaves.iter_mut().for_each(|v| *v = new_of[*v]);
            }
            self.saved = Some(tree);
            self.saved_places = Places { members: Some(cx.view.members.clone()), leaves };
        }
        Ok(())
    }
}

impl<G: Group> Protocol<G> for Tgdh<G> {
    const ID: ProtocolId = ProtocolId::Tgdh;

    fn new() -> Self {
        Self { saved: None, saved_places: Places::default(), run: Run::Idle }
    }

    fn reset(&mut self) {
        *self = Self::new();
    }

    fn on_view(&mut self, cx: &mut Ctx<'_, G>, change: &Change) -> Result<(), Error> {
        self.abandon();
        if cx.view.members.len() == 1 {
            // Alone: a fresh key, no messages. The leaf's key is refreshed
            // before it is ever used again (a merge's sponsor refreshes).
            let r = cx.random();
            let mut secret = cx.exp_g(&r);
            cx.install(&secret);
            secret.zeroize();
            self.saved = Some(Tree::leaf(cx.me.clone(), Some(r), None));
            self.saved_places = Places { members: Some(cx.view.members.clone()), leaves: vec![0] };
            return Ok(());
        }
        if change.single {
            self.start_rekey(cx)
        } else {
            self.start_merge(cx, change)
        }
    }

    fn on_message(&mut self, cx: &mut Ctx<'_, G>, from: &MemberId, round: u8, body: &[u8]) -> Result<(), Error> {
        match round {
            ROUND_TREE => self.on_tree(cx, from, body),
            ROUND_KEYS => self.on_keys(cx, from, body),
            _ => Err(Misbehaved::UnknownRound { round }.by(from)),
        }
    }

    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        let mut keys: Vec<G::Scalar> = self.saved.iter().flat_map(|t| t.keys()).cloned().collect();
        match &self.run {
            Run::Idle => {}
            Run::Collect(co) => {
                keys.extend(co.mine.keys().chain(co.others.iter().flat_map(|t| t.keys())).cloned());
                keys.extend(co.in_place.iter().flat_map(|ip| ip.undo.keys()).cloned());
            }
            Run::Rounds(rd) => {
                keys.extend(rd.tree.keys().cloned());
                keys.extend(rd.undo.iter().flat_map(|(u, _)| u.keys()).cloned());
            }
        }
        (keys, Vec::new())
    }

    fn public_elements(g: &G, round: u8, body: &[u8]) -> Result<Vec<G::Element>, Error> {
        let mut r = Reader::new(body);
        match round {
            ROUND_TREE => Ok(Tree::decode(&mut r, g)?.bks().cloned().collect()),
            ROUND_KEYS => {
                let k = r.count(MAX_MEMBERS, g.element_len(), "TGDH blinded keys")?;
                (0..k).map(|_| get_elem(&mut r, g)).collect()
            }
            _ => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use conclave_gcs::sim::Flush;
    use conclave_gcs::MemberId;

    use super::{ROUND_KEYS, ROUND_TREE};
    use crate::codec::{Reader, Writer};
    use crate::engine::Misbehaved;
    use crate::harness::{EventCost, Harness};
    use crate::protocols::testnet::Net;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::Group;
    use crate::tree::tests::{encode, full_bks, id, singletons};
    use crate::tree::{Bk, Tree};
    use crate::{GroupId, ProtocolId, SignatureId};

    #[test]
    fn a_rekey_follows_its_members_into_the_next_view_by_walking_both_lists() {
        use super::Places;
        use conclave_gcs::ViewMember;
        let list = |names: &[usize]| -> std::sync::Arc<[ViewMember]> {
            names.iter().map(|&i| ViewMember { id: id(i), prev: None }).collect()
        };
        let places = Places { members: Some(list(&[0, 1, 2, 3])), leaves: vec![6, 4, 2, 0] };
        assert_eq!(places.moved_into(&list(&[0, 2, 3])), Some(vec![Some(0), None, Some(1), Some(2)]));
        assert_eq!(places.moved_into(&list(&[3])), Some(vec![None, None, None, Some(0)]));
        assert_eq!(places.moved_into(&list(&[2, 0])), None, "another order: looked up by name instead");
        assert_eq!(places.moved_into(&list(&[0, 1, 9])), None, "a newcomer");
        let short = Places { members: Some(list(&[0, 1])), leaves: vec![0] };
        assert_eq!(short.moved_into(&list(&[0])), None, "not one leaf per place");
        assert_eq!(Places::default().moved_into(&list(&[0])), None);
    }

    // ---- Costs against Tables I and II ------------------------------------

    /// Membership events, applied to a group of n members m0..m(n-1) formed in
    /// one view: a merge of n one-leaf trees in view order, which is n
    /// successive insertions at the shallowest-rightmost place. For n = 2^h
    /// that is the full tree of height h (leaf order = view order for n ≤ 8;
    /// for 16 and 32 the right halves are shuffled, e.g. n = 16:
    /// ((((0,1),(2,3)),((4,5),(6,7))),(((8,9),(10,15)),((11,12),(13,14))))).
    #[derive(Clone, Copy, Debug)]
    enum Ev {
        /// One fresh member joins.
        Join,
        /// m fresh members join in one view (a merge of m + 1 subgroups).
        JoinMany(usize),
        /// The last member leaves.
        Leave,
        /// A separate group of m members merges in.
        Merge(usize),
        /// The group splits into its first and second half (view order): in
        /// the trees above, the root's two subtrees.
        Halves,
        /// The group splits into the members at even and odd view positions:
        /// in the trees above every pair of sibling leaves is split, the
        /// worst case (the paper's experiment of §6.1.5).
        Alternate,
    }

    fn measure(ev: Ev, n: usize) -> EventCost {
        let mut h = Harness::new(ProtocolId::Tgdh, GroupId::Ristretto255, SignatureId::Ed25519, n as u64, Flush::All);
        let ids = h.add_members(n + 3).unwrap();
        let (old, fresh) = ids.split_at(n);
        h.event(|s| s.join(old, None)).unwrap();
        if let Ev::Merge(m) = ev {
            h.event(|s| s.join(&fresh[..m], None)).unwrap();
        }
        let c = h
            .event(|s| match ev {
                Ev::Join => s.join(&fresh[..1], Some(&old[0])),
                Ev::JoinMany(m) => s.join(&fresh[..m], Some(&old[0])),
                Ev::Leave => s.leave(&old[n - 1..]),
                Ev::Merge(_) => s.merge(&old[0], &fresh[0]),
                Ev::Halves => s.partition(vec![old[..n / 2].to_vec(), old[n / 2..].to_vec()]),
                Ev::Alternate => {
                    let even: Vec<MemberId> = old.iter().step_by(2).cloned().collect();
                    let odd: Vec<MemberId> = old.iter().skip(1).step_by(2).cloned().collect();
                    s.partition(vec![even, odd])
                }
            })
            .unwrap();
        assert!(h.errors().is_empty(), "{ev:?} n={n}: {:?}", h.errors());
        h.check_agreement().unwrap();
        c
    }

    /// [rounds, broadcasts (all components), unicasts, serial exps, serial sigs, serial verifs]
    fn counts(ev: Ev, n: usize) -> [u64; 6] {
        let c = measure(ev, n);
        [c.rounds, c.total.broadcasts, c.total.unicasts, c.serial.exps, c.serial.sigs, c.serial.verifs]
    }

    /// Full trees: (n, h = log2 n).
    const FULL: [(usize, u64); 4] = [(4, 2), (8, 3), (16, 4), (32, 5)];

    #[test]
    fn join_into_a_full_tree_goes_in_at_the_root() {
        // Table: 2 rounds, 3 broadcasts, 3h/2 exps (worst case), 2 sigs, 3 verifs.
        // A full tree has no node where the joiner fits without growing the tree,
        // so it joins at the root: the new root's children are the old tree (whose
        // root blinded key the old sponsor announces) and the joiner's leaf, so
        // after the two announcements of round 1 nothing is missing: 1 round, 2
        // broadcasts, 1 sig and 2 verifs on the critical path. Exps: the old
        // sponsor (rightmost leaf, depth h) refreshes its leaf (1) and recomputes
        // its path up to the old root, key and blinded key at each of the h levels
        // (2h); its sibling then recomputes those h keys and the root: 3h + 2. The
        // paper's 3h/2 counts neither the whole refresh nor the receivers' work.
        for (n, h) in FULL {
            assert_eq!(counts(Ev::Join, n), [1, 2, 0, 3 * h + 2, 1, 2], "n = {n}");
        }
    }

    #[test]
    fn join_below_the_root_matches_table_one() {
        // Not full: the joiner goes in lower, as the right child of a new node,
        // and becomes the sponsor of that node: round 1 (joiner's leaf, old
        // sponsor's tree), round 2 (joiner's new blinded keys up to below the
        // root): 2 rounds, 3 broadcasts, 2 sigs, 3 verifs, as in the tables.
        // Exps for n = 5, tree (((0,1),(2,3)),4): m4 refreshes (leaf, key and
        // blinded key of the old root: 3), the joiner goes in next to m4 and
        // computes the new node's key and blinded key (2), the others the root
        // (1): 6. For n = 6 (sponsor at depth 2, 5 exps, then 2 + 1) 8, for
        // n = 13 (depth 3) 13.
        for (n, exps) in [(5, 6), (6, 8), (13, 13)] {
            assert_eq!(counts(Ev::Join, n), [2, 3, 0, exps, 2, 3], "n = {n}");
            assert_eq!(counts(Ev::Merge(1), n), [2, 3, 0, exps, 2, 3], "n = {n}");
        }
    }

    #[test]
    fn leave_is_one_broadcast() {
        // Table: 1 round, 1 broadcast, 3h/2 exps, 1 sig, 1 verif. The leaver's
        // sibling takes its parent's place (depth h - 1) and, as the shallowest
        // removal sponsor, refreshes its leaf and broadcasts its path: leaf
        // blinded key + key and blinded key for each of the h - 2 levels below the
        // root = 2h - 3 exps; its nearest neighbours then recompute h - 2 keys and
        // the root: 3h - 4 exps on the critical path.
        for (n, h) in FULL {
            assert_eq!(counts(Ev::Leave, n), [1, 1, 0, 3 * h - 4, 1, 1], "n = {n}");
        }
        // Unbalanced trees: the sponsor's depth decides. n = 5, (((0,1),(2,3)),4):
        // the root's left subtree becomes the tree, its rightmost leaf m3 (depth
        // 2) refreshes; n = 13: m11 takes the place of (11,12) at depth 2.
        assert_eq!(counts(Ev::Leave, 5), [1, 1, 0, 5, 1, 1]);
        assert_eq!(counts(Ev::Leave, 13), [1, 1, 0, 5, 1, 1]);
        // Two members: the one left alone installs a fresh key, no message.
        assert_eq!(counts(Ev::Leave, 2), [0, 0, 0, 1, 0, 0]);
    }

    #[test]
    fn merge_of_a_group_of_three() {
        // Table: 2 rounds, 3 broadcasts, 3h/2 exps, 2 sigs, 3 verifs. Into a full
        // tree the 3-member tree (height 2) goes in at the root, as a join does:
        // the two sponsors' announcements are all it takes (1 round, 2
        // broadcasts), and the larger tree's sponsor and its sibling dominate the
        // exps as for a join: 3h + 2.
        for (n, h) in FULL {
            assert_eq!(counts(Ev::Merge(3), n), [1, 2, 0, 3 * h + 2, 1, 2], "n = {n}");
        }
        // Not full, with room for the smaller tree below the root: n = 6,
        // ((0,1),(2,3)),(4,5) takes a 2-member tree at (4,5): 2 rounds, 3
        // broadcasts, exactly as in the tables.
        assert_eq!(counts(Ev::Merge(2), 6), [2, 3, 0, 8, 2, 3]);
    }

    #[test]
    fn three_members_joining_at_once() {
        // m fresh members are m one-leaf subgroups: m + 1 announcements, then
        // sponsors. Into a full tree the first joiner goes in at the root, the
        // second next to it, the third next to those two; one sponsor (the second
        // joiner) then broadcasts the two new nodes: 2 rounds, m + 2 = 5
        // broadcasts. Exps: old sponsor 2h + 1, then the second joiner 4 and
        // the first joiner 2 more: 2h + 7 (up to h = 5, where the old sponsor's
        // sibling's 3h + 2 takes over).
        for (n, h) in FULL {
            assert_eq!(counts(Ev::JoinMany(3), n), [2, 5, 0, 2 * h + 7, 2, 5], "n = {n}");
        }
        // n = 5: two of the new nodes are only computable in a third round.
        assert_eq!(counts(Ev::JoinMany(3), 5), [3, 7, 0, 8, 3, 7]);
    }

    #[test]
    fn partition_into_halves_along_the_tree() {
        // Table (worst case): h rounds, 2h broadcasts, 3h exps, h sigs, h verifs.
        // Splitting off one of the root's subtrees is the best case: each half is a
        // subtree, whose rightmost member refreshes and rekeys it like a leave
        // (1 round, 1 broadcast per half, 3h - 4 exps as for a leave).
        for (n, h) in FULL {
            assert_eq!(counts(Ev::Halves, n), [1, 2, 0, 3 * h - 4, 1, 1], "n = {n}");
        }
    }

    #[test]
    fn partition_scattering_every_pair() {
        // The worst case: every pair of sibling leaves is split, each half keeps a
        // full tree of height h - 1 all of whose internal blinded keys are new.
        // Round 1: the sponsor of every lowest internal node (the refresher, the
        // rightmost member, also covering its parent), then one round per level
        // up to the root's children: max(1, h - 2) rounds, and as many sigs on
        // the critical path (paper: h). Every non-root internal node of each
        // half's tree is sent by its own sponsor, the refresher's leaf and parent
        // in one message: max(1, 2^(h-1) - 2) broadcasts per half — more than the
        // paper's 2h for large n, since the sponsors of disjoint subtrees send in
        // parallel, and the member on the critical path verifies every message of
        // its half. Exps: the refresher's 3, then 2 per further round (key and
        // blinded key one level up), then the root: 2h - 2 from h = 4 on (paper:
        // 3h); h = 3: 3, then its neighbour's key and root, 5; h = 2: 2.
        assert_eq!(counts(Ev::Alternate, 4), [1, 2, 0, 2, 1, 1]);
        assert_eq!(counts(Ev::Alternate, 8), [1, 4, 0, 5, 1, 2]);
        assert_eq!(counts(Ev::Alternate, 16), [2, 12, 0, 6, 2, 6]);
        assert_eq!(counts(Ev::Alternate, 32), [3, 28, 0, 8, 3, 14]);
    }

    // ---- Rejection of forged or malformed messages -------------------------

    /// Member `i`'s name.
    fn name(i: usize) -> String {
        id(i).as_str().to_owned()
    }

    fn leaf_tree(m: usize, bk: bool) -> Vec<u8> {
        let g = Ristretto255;
        let bk = bk.then(|| Bk::computed(&g, g.exp_generator(&g.scalar_from_u64(5))));
        encode(&Tree::leaf(id(m), None, bk))
    }

    fn keys_body(k: usize, elem: &[u8]) -> Vec<u8> {
        let mut w = Writer::new();
        w.count(k);
        for _ in 0..k {
            w.raw(elem);
        }
        w.buf
    }

    #[test]
    fn forged_and_malformed_messages_are_rejected_without_effect() {
        let g = Ristretto255;
        let elem = g.encode(&g.exp_generator(&g.scalar_from_u64(3)));
        let names: Vec<String> = (0..6).map(name).collect();
        let mut net = Net::new(ProtocolId::Tgdh, &names, 99);
        // View 1: five fresh members, a merge of five one-leaf trees.
        let m: Vec<&str> = names.iter().map(String::as_str).collect();
        net.view(1, &m[..5], &m[..5]);
        net.reject_all(m[0], ROUND_TREE, leaf_tree(5, true), "a tree with a non-member");
        net.reject_all(m[0], ROUND_TREE, leaf_tree(0, false), "a sponsor's leaf without blinded key");
        net.reject_all(m[0], ROUND_TREE, leaf_tree(1, true), "a tree announced by someone else");
        net.reject_all(m[0], ROUND_TREE, vec![0, 1, 3, 1], "a truncated tree");
        net.reject_all(m[0], ROUND_TREE, [leaf_tree(0, true), vec![0]].concat(), "a tree with trailing bytes");
        net.reject_all(m[0], ROUND_KEYS, keys_body(1, &elem), "blinded keys during a merge");
        net.reject_all(m[0], 9, Vec::new(), "an unknown round");
        // Half of the announcements, then a second tree holding an announced member.
        for _ in 0..3 {
            net.step();
        }
        net.reject_all(m[3], ROUND_TREE, encode(&full_bks(singletons(2))), "a tree not from its sponsor");
        net.reject_all(m[1], ROUND_TREE, encode(&full_bks(singletons(2))), "a tree holding announced members");
        net.run();
        net.agreed();
        net.reject_all(m[0], ROUND_KEYS, keys_body(1, &elem), "blinded keys after the install");

        // View 2: m4 leaves (everybody else shares the state): one sponsor.
        net.view(2, &m[..4], &[]);
        assert_eq!(net.queue.len(), 1);
        let honest = net.queue[0].clone();
        let sponsor: usize = honest.from.as_str()[1..].parse().unwrap();
        for other in (0..4).filter(|&i| i != sponsor) {
            net.reject_all(m[other], ROUND_KEYS, keys_body(1, &elem), "blinded keys from a non-sponsor");
        }
        net.reject_all(m[sponsor], ROUND_KEYS, keys_body(0, &elem), "no blinded key");
        net.reject_all(m[sponsor], ROUND_KEYS, keys_body(5, &elem), "more blinded keys than the path holds");
        net.reject_all(m[sponsor], ROUND_KEYS, keys_body(1, &[0xff; 32]), "an invalid element");
        net.reject_all(m[sponsor], ROUND_KEYS, keys_body(1, &elem)[..20].to_vec(), "truncated blinded keys");
        net.reject_all(m[sponsor], ROUND_TREE, leaf_tree(sponsor, true), "a tree outside a merge");
        assert!(!honest.bytes.is_empty());
        net.run();
        net.agreed();

        // View 3: m5 (fresh) joins; its leaf must not be announced by another.
        net.view(3, &[m[0], m[1], m[2], m[3], m[5]], &[m[5]]);
        net.reject_all(m[0], ROUND_TREE, leaf_tree(5, true), "the joiner's tree from an old member");
        net.run();
        net.agreed();
    }

    #[test]
    fn misbehaviour_names_the_sender_and_what_it_proves() {
        let g = Ristretto255;
        let elem = g.encode(&g.exp_generator(&g.scalar_from_u64(3)));
        let names: Vec<String> = (0..6).map(name).collect();
        let mut net = Net::new(ProtocolId::Tgdh, &names, 98);
        let m: Vec<&str> = names.iter().map(String::as_str).collect();
        let by = |i: usize, what: Misbehaved| what.by(&id(i));
        // View 1: a merge of five one-leaf trees.
        net.view(1, &m[..5], &m[..5]);
        let pair = encode(&full_bks(singletons(2))); // (m0, m1): m1 is its sponsor
        let (tree, keys) = (ROUND_TREE, ROUND_KEYS);
        assert_eq!(net.reject(m[2], m[0], None, tree, pair.clone()), by(0, Misbehaved::NotSponsor { round: tree }));
        assert_eq!(
            net.reject(m[2], m[0], None, tree, leaf_tree(5, true)),
            by(0, Misbehaved::WrongShape { round: tree })
        );
        assert_eq!(
            net.reject(m[2], m[0], None, tree, leaf_tree(1, true)),
            by(0, Misbehaved::WrongShape { round: tree })
        );
        let outside = Misbehaved::OutsideItsRun { round: keys };
        assert_eq!(net.reject(m[2], m[0], None, keys, keys_body(1, &elem)), by(0, outside));
        assert_eq!(net.reject(m[2], m[3], None, 9, Vec::new()), by(3, Misbehaved::UnknownRound { round: 9 }));
        net.step(); // m0's leaf
        let announced = Misbehaved::AlreadyAnnounced { round: tree };
        assert_eq!(net.reject(m[2], m[1], None, tree, pair), by(1, announced));
        net.run();
        net.agreed();
        assert_eq!(net.reject(m[2], m[0], None, keys, keys_body(1, &elem)), by(0, outside));

        // View 2: m4 leaves; one sponsor, and no tree in a leave.
        net.view(2, &m[..4], &[]);
        let sponsor: usize = net.queue[0].from.as_str()[1..].parse().unwrap();
        let (other, at) = ((sponsor + 1) % 4, (sponsor + 2) % 4);
        let not_sponsor = Misbehaved::NotSponsor { round: keys };
        assert_eq!(net.reject(m[at], m[other], None, keys, keys_body(1, &elem)), by(other, not_sponsor));
        let outside = Misbehaved::OutsideItsRun { round: tree };
        assert_eq!(net.reject(m[at], m[sponsor], None, tree, leaf_tree(sponsor, true)), by(sponsor, outside));
        net.run();
        net.agreed();

        // View 3: m5 joins; its tree must not hold a member of the old group.
        net.view(3, &[m[0], m[1], m[2], m[3], m[5]], &[m[5]]);
        let mut claim = Tree::leaf(id(0), None, None);
        claim.insert(&Tree::leaf(id(5), None, None));
        let claim = encode(&full_bks(claim));
        assert_eq!(net.reject(m[1], m[5], None, tree, claim), by(5, Misbehaved::Inconsistent { round: tree }));
        // The old group's sponsor announces its tree with another blinded key
        // off its path: its own subgroup's members hold the true one.
        let honest = net.queue.iter().find(|p| p.round == tree && p.from != id(5)).unwrap().clone();
        let sponsor: usize = honest.from.as_str()[1..].parse().unwrap();
        let mut t = Tree::decode(&mut Reader::new(&honest.body()), &Ristretto255).unwrap();
        let first = t.leaves()[0];
        assert!(!t.path(t.rightmost(t.root)).contains(&first));
        t.nodes[first].bk =
            Some(Bk::computed(&Ristretto255, Ristretto255.exp_generator(&Ristretto255.scalar_from_u64(7))));
        let at = (sponsor + 1) % 4;
        let lie = Misbehaved::Inconsistent { round: tree };
        assert_eq!(net.reject(m[at], m[sponsor], None, tree, encode(&t)), by(sponsor, lie));
        net.run();
        net.agreed();
    }

    // ---- Key independence ---------------------------------------------------

    /// Whether `who`'s secrets before `ev`, with every element broadcast
    /// during it, reach the group secret installed by `by` after it.
    #[cfg(feature = "test-hooks")]
    fn reaches(
        n: usize,
        who: usize,
        by: usize,
        ev: impl FnOnce(&mut conclave_gcs::sim::Sim<crate::harness::Member>, &[MemberId]),
    ) -> bool {
        let mut h = Harness::new(ProtocolId::Tgdh, GroupId::Ristretto255, SignatureId::Ed25519, 3, Flush::All);
        let ids = h.add_members(n + 1).unwrap();
        h.sim().enable_trace();
        h.event(|s| s.join(&ids[..n], None)).unwrap();
        let leak = h.sim_ref().node(&ids[who]).unwrap().engine.leak();
        h.event(|s| {
            ev(s, &ids);
            Ok(())
        })
        .unwrap();
        h.check_agreement().unwrap();
        let sim = h.sim_ref();
        let m = sim.node(&ids[by]).unwrap();
        let publics: Vec<Vec<u8>> =
            sim.trace().iter().flat_map(|d| m.engine.public_elements(&d.msg.bytes).unwrap()).collect();
        let target = m.engine.leak().group_secret.unwrap();
        let mut elements = leak.elements.clone();
        elements.extend(leak.group_secret.clone());
        m.engine
            .attacker()
            .can_reach(&leak.scalars, &elements, &publics, &target, &[crate::domains::TGDH_NODE], 2, 200_000)
            .expect("within budget")
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn departed_members_cannot_reach_later_keys() {
        // Sanity check of the model: a member reaches its own next key.
        assert!(reaches(4, 0, 0, |s, ids| s.leave(&ids[3..4]).unwrap()));
        // Forward secrecy: a leaver (with everything it held) and the next key.
        assert!(!reaches(4, 3, 0, |s, ids| s.leave(&ids[3..4]).unwrap()));
        // A member partitioned away, and the key of the other side.
        assert!(!reaches(6, 5, 0, |s, ids| s.partition(vec![ids[..3].to_vec(), ids[3..6].to_vec()]).unwrap()));
    }

    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_joiner_cannot_reach_the_previous_key() {
        for n in [3, 4] {
            let mut h = Harness::new(ProtocolId::Tgdh, GroupId::Ristretto255, SignatureId::Ed25519, 5, Flush::All);
            let ids = h.add_members(n + 1).unwrap();
            h.sim().enable_trace();
            h.event(|s| s.join(&ids[..n], None)).unwrap();
            let old = h.sim_ref().node(&ids[0]).unwrap().engine.leak().group_secret.unwrap();
            h.event(|s| s.join(&ids[n..], Some(&ids[0]))).unwrap();
            h.check_agreement().unwrap();
            let sim = h.sim_ref();
            let j = &sim.node(&ids[n]).unwrap().engine;
            let publics: Vec<Vec<u8>> =
                sim.trace().iter().flat_map(|d| j.public_elements(&d.msg.bytes).unwrap()).collect();
            let leak = j.leak();
            let mut elements = leak.elements.clone();
            elements.extend(leak.group_secret.clone());
            let reach = j.attacker().can_reach(
                &leak.scalars,
                &elements,
                &publics,
                &old,
                &[crate::domains::TGDH_NODE],
                2,
                200_000,
            );
            assert_eq!(reach, Some(false), "n = {n}");
        }
    }
}
