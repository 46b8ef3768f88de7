//! The TGDH key tree, shared by the engines that agree keys on one.
//!
//! A binary tree whose leaves are members (TISSEC §4.3; Kim, Perrig and
//! Tsudik). A leaf's key is its member's random contribution r; an internal
//! node with children L and R has the secret element BK_R^{k_L} =
//! BK_L^{k_R} = g^{k_L k_R} and, unless it is the root, the key k = H(secret
//! element) (hash domain `TGDH_NODE`); every node's blinded key is BK = g^k.
//! The root's secret element is the group secret.
//!
//! This module is the tree and the rules that are a function of the tree
//! alone: building it ([`Tree::leaf`], [`Tree::merge`], [`Tree::insert_all`],
//! [`Tree::balanced`], [`Tree::graft`]), removing members ([`Tree::prune`],
//! [`Tree::prune_leaves`]), who sponsors what
//! ([`Tree::refresher`], [`Tree::lowest_unknown`], [`Tree::sponsors`]),
//! computing the keys on a member's path, their blinded keys and the group
//! secret ([`Tree::climb`], [`Tree::blind`], [`Tree::group_secret`]), and the
//! wire format ([`Tree::encode`], [`Tree::decode`]). It holds no engine state:
//! no view, run or message, and its exponentiations go through [`KeyOps`],
//! which the caller implements to meter them (an engine's `Ctx` does; a bare
//! [`Group`] computes unmetered).
//!
//! Who uses it:
//! * the TGDH engine (`protocols::tgdh`): per membership event, prune or
//!   merge, then sponsor rounds until every blinded key is known;
//! * SEAL's interval-based TGDH rekeying (Rebuild, Batch, Queue-batch), which
//!   applies a batch of joins and leaves to the same tree at interval ends;
//! * the integrated architecture's daemon-level TGDH, which keeps one such
//!   tree among the daemons.
//!
//! Nodes live in an arena (`Vec`) and refer to each other by index; an arena
//! only ever holds the nodes of one tree (pruning builds a new arena, merging
//! appends), so indices are stable for the rounds of one run. Every walk is
//! iterative: a tree received from the network may be as deep as it has
//! leaves, and deep recursion must not overflow the stack.
//!
//! Each node holds its blinded key (public, `None` while unknown) and, on the
//! owner's own path only, its key (secret, zeroized when dropped or replaced).

use std::cmp::Reverse;

use std::sync::{Arc, OnceLock};

use conclave_gcs::{MemberId, MemberMap, MemberSet};
use zeroize::Zeroize;

use crate::codec::{DecodeError, Reader, Writer};
use crate::domains;
use crate::engine::{Ctx, Error};
use crate::protocols::{get_member, put_member, MAX_MEMBERS};
use crate::suite::Group;

/// The group operations tree computations spend, so that the caller can
/// meter them.
pub(crate) trait KeyOps<G: Group> {
    /// The group.
    fn group(&self) -> &G;
    /// b^k.
    fn exp(&mut self, b: &G::Element, k: &G::Scalar) -> G::Element;
    /// g^k.
    fn exp_g(&mut self, k: &G::Scalar) -> G::Element;
}

/// Unmetered.
impl<G: Group> KeyOps<G> for G {
    fn group(&self) -> &G {
        self
    }
    fn exp(&mut self, b: &G::Element, k: &G::Scalar) -> G::Element {
        Group::exp(self, b, k)
    }
    fn exp_g(&mut self, k: &G::Scalar) -> G::Element {
        self.exp_generator(k)
    }
}

/// Metered by the engine.
impl<G: Group> KeyOps<G> for Ctx<'_, G> {
    fn group(&self) -> &G {
        self.g
    }
    fn exp(&mut self, b: &G::Element, k: &G::Scalar) -> G::Element {
        Ctx::exp(self, b, k)
    }
    fn exp_g(&mut self, k: &G::Scalar) -> G::Element {
        Ctx::exp_g(self, k)
    }
}

/// H(b^k): the key of a parent from one child's key and the other's blinded key.
fn node_key<G: Group>(ops: &mut impl KeyOps<G>, k: &G::Scalar, b: &G::Element) -> G::Scalar {
    let mut s = ops.exp(b, k);
    let key = ops.group().hash_to_scalar(domains::TGDH_NODE, &s);
    s.zeroize();
    key
}

/// Node tags on the wire: bit 0 = leaf, bit 1 = blinded key follows.
const TAG_LEAF: u8 = 1;
const TAG_BK: u8 = 2;

/// A blinded key with its encoding, made once: the bytes it arrived as, or
/// encoded when it was computed. Trees (TGDH's, STR's chains) compare blinded keys by these bytes
/// (a memcmp, where comparing group elements costs field multiplications;
/// every group's encoding is canonical, so equal bytes are equal elements)
/// and write them without encoding again (an inversion per point).
///
/// A blinded key read from a message is checked to lie in the prime-order
/// subgroup only where it meets a secret exponent ([`Bk::checked`]), once:
/// a member reads whole trees, but raises only its co-path's blinded keys
/// to its secrets, and with MODP groups each check is an exponentiation
/// (at 64 members, three quarters of a TGDH join's CPU went to checking
/// blinded keys as they were read).
pub(crate) struct Bk<G: Group> {
    elem: G::Element,
    /// Its encoding.
    enc: G::Encoding,
    /// Whether `elem` lies in the prime-order subgroup: so for computed
    /// ones; for read ones, checked when first needed.
    in_subgroup: OnceLock<bool>,
}

impl<G: Group> Bk<G> {
    /// A blinded key this member computed.
    pub fn computed(g: &G, elem: G::Element) -> Arc<Self> {
        let enc = g.encoding(&elem);
        Arc::new(Self { elem, enc, in_subgroup: OnceLock::from(true) })
    }

    /// Reads a blinded key: canonical and not the identity; its subgroup
    /// is checked where it is used ([`Bk::checked`]).
    pub fn read(r: &mut Reader<'_>, g: &G) -> Result<Arc<Self>, Error> {
        let bytes = r.bytes(g.element_len(), "group element")?;
        let elem = g.decode_unchecked(bytes)?;
        let enc = g.encoding_of(bytes).ok_or(DecodeError::Bad("group element length"))?;
        let in_subgroup = if g.prime_order() { OnceLock::from(true) } else { OnceLock::new() };
        Ok(Arc::new(Self { elem, enc, in_subgroup }))
    }

    /// The element, to raise to a secret exponent: `None` if it lies outside
    /// the prime-order subgroup (checked once).
    pub fn checked(&self, g: &G) -> Option<&G::Element> {
        self.in_subgroup.get_or_init(|| g.in_subgroup(&self.elem)).then_some(&self.elem)
    }

    /// The element, for comparisons and public uses only: never raise it to
    /// a secret exponent (see [`Bk::checked`]).
    pub fn public(&self) -> &G::Element {
        &self.elem
    }

    /// Writes it.
    pub fn write(&self, w: &mut Writer) {
        w.raw(self.enc.as_ref());
    }

    /// Its encoding.
    pub fn bytes(&self) -> &[u8] {
        self.enc.as_ref()
    }
}

impl<G: Group> PartialEq for Bk<G> {
    fn eq(&self, other: &Self) -> bool {
        self.enc == other.enc
    }
}

/// One node of a key tree.
#[derive(Clone)]
pub(crate) struct Node<G: Group> {
    /// The parent, but for the root.
    pub parent: Option<usize>,
    /// Left and right child, for internal nodes.
    pub kids: Option<[usize; 2]>,
    /// The member, for leaves.
    pub member: Option<MemberId>,
    /// The blinded key g^k, when known.
    /// (Shared: a run's copy of the tree shares the saved tree's.)
    pub bk: Option<Arc<Bk<G>>>,
    /// The key k (leaf: the member's contribution), on the owner's path only.
    pub key: Option<G::Scalar>,
}

impl<G: Group> Drop for Node<G> {
    fn drop(&mut self) {
        if let Some(k) = self.key.as_mut() {
            k.zeroize();
        }
    }
}

impl<G: Group> Node<G> {
    fn leaf(member: MemberId, key: Option<G::Scalar>, bk: Option<Arc<Bk<G>>>) -> Self {
        Self { parent: None, kids: None, member: Some(member), bk, key }
    }

    /// Forgets the key, zeroizing it.
    pub fn clear_key(&mut self) {
        if let Some(mut k) = self.key.take() {
            k.zeroize();
        }
    }
}

/// A key tree.
#[derive(Clone)]
pub(crate) struct Tree<G: Group> {
    /// The arena.
    pub nodes: Vec<Node<G>>,
    /// The root's index.
    pub root: usize,
}

/// Nodes of a tree as they were before it was changed in place
/// ([`Tree::prune_in_place`]), to put back ([`Tree::undo`]). Keys among them
/// are zeroized when it is dropped, as any node's.
pub(crate) struct Undo<G: Group> {
    /// The root before the changes.
    root: usize,
    /// The arena's length before the changes (nodes appended after it go).
    len: usize,
    /// Each changed node as it was, in the order noted.
    nodes: Vec<(usize, Node<G>)>,
}

impl<G: Group> Undo<G> {
    /// Nothing noted yet, for `tree`.
    pub fn of(tree: &Tree<G>) -> Self {
        Self { root: tree.root, len: tree.nodes.len(), nodes: Vec::new() }
    }

    /// The keys it holds (the member's secrets, as the tree's).
    pub fn keys(&self) -> impl Iterator<Item = &G::Scalar> {
        self.nodes.iter().filter_map(|(_, n)| n.key.as_ref())
    }
}

impl<G: Group> Tree<G> {
    /// A tree of one leaf.
    pub fn leaf(member: MemberId, key: Option<G::Scalar>, bk: Option<Arc<Bk<G>>>) -> Self {
        Self { nodes: vec![Node::leaf(member, key, bk)], root: 0 }
    }

    /// A copy without any key.
    pub fn public(&self) -> Self {
        let mut t = self.clone();
        for n in &mut t.nodes {
            n.clear_key();
        }
        t
    }

    /// Whether `v` is a leaf.
    pub fn is_leaf(&self, v: usize) -> bool {
        self.nodes[v].kids.is_none()
    }

    /// The nodes under `v` (itself included) in preorder: parents before
    /// children, left before right.
    pub fn preorder(&self, v: usize) -> Vec<usize> {
        // At most the arena: no growth on the way (a tree of n leaves has
        // 2n - 1 nodes, walked per member at a merge).
        let mut out = Vec::with_capacity(if v == self.root { self.nodes.len() } else { 0 });
        let mut stack = vec![v];
        while let Some(u) = stack.pop() {
            out.push(u);
            if let Some([l, r]) = self.nodes[u].kids {
                stack.push(r);
                stack.push(l);
            }
        }
        out
    }

    /// The leaves, left to right.
    pub fn leaves(&self) -> Vec<usize> {
        self.preorder(self.root).into_iter().filter(|&v| self.is_leaf(v)).collect()
    }

    /// How many leaves the tree has ([`Tree::leaves`]' walk without
    /// collecting the leaves).
    pub fn leaf_count(&self) -> usize {
        let mut count = 0;
        let mut stack = vec![self.root];
        while let Some(u) = stack.pop() {
            match self.nodes[u].kids {
                Some([l, r]) => stack.extend([r, l]),
                None => count += 1,
            }
        }
        count
    }

    /// The members, left to right.
    pub fn members(&self) -> Vec<MemberId> {
        self.leaves().into_iter().filter_map(|v| self.nodes[v].member.clone()).collect()
    }

    /// The leaf of `m`.
    pub fn find(&self, m: &MemberId) -> Option<usize> {
        self.nodes.iter().position(|n| n.kids.is_none() && n.member.as_ref() == Some(m))
    }

    /// Every member's leaf, in one pass (where [`Tree::find`] would be called
    /// for many members).
    pub fn leaf_index(&self) -> MemberMap<usize> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.kids.is_none())
            .filter_map(|(v, n)| Some((n.member.clone()?, v)))
            .collect()
    }

    /// The member at leaf `v`.
    pub fn member(&self, v: usize) -> Option<&MemberId> {
        self.nodes[v].member.as_ref()
    }

    /// The rightmost leaf under `v`.
    pub fn rightmost(&self, mut v: usize) -> usize {
        while let Some([_, r]) = self.nodes[v].kids {
            v = r;
        }
        v
    }

    /// Distance from the root.
    pub fn depth(&self, mut v: usize) -> usize {
        let mut d = 0;
        while let Some(p) = self.nodes[v].parent {
            v = p;
            d += 1;
        }
        d
    }

    /// `v` and its ancestors, from `v` up to the root.
    pub fn path(&self, mut v: usize) -> Vec<usize> {
        let mut out = vec![v];
        while let Some(p) = self.nodes[v].parent {
            out.push(p);
            v = p;
        }
        out
    }

    /// The other child of `v`'s parent.
    pub fn sibling(&self, v: usize) -> Option<usize> {
        let [l, r] = self.nodes[self.nodes[v].parent?].kids?;
        Some(if l == v { r } else { l })
    }

    /// Whether the blinded key of `v` is known.
    pub fn has_bk(&self, v: usize) -> bool {
        self.nodes[v].bk.is_some()
    }

    /// A node whose blinded key can be computed now: a leaf (its owner knows
    /// the key), or an internal node whose children's blinded keys are known.
    pub fn ready(&self, v: usize) -> bool {
        match self.nodes[v].kids {
            None => true,
            Some([l, r]) => self.has_bk(l) && self.has_bk(r),
        }
    }

    /// Whether every blinded key except the root's is known, of the nodes
    /// reachable from the root. Unknown blinded keys are closed upwards (an
    /// unknown node's ancestors are unknown: every way a tree gets blinded
    /// keys keeps it so, and decoding refuses trees that are not), so that
    /// is whether the root's children are known: no walk, and nodes left
    /// unreachable by [`Tree::prune_in_place`] do not count.
    pub fn complete(&self) -> bool {
        self.nodes[self.root].kids.is_none_or(|[l, r]| self.has_bk(l) && self.has_bk(r))
    }

    /// Height of every node (leaves 0), indexed like `nodes`.
    pub fn heights(&self) -> Vec<usize> {
        let mut h = vec![0; self.nodes.len()];
        for v in self.preorder(self.root).into_iter().rev() {
            if let Some([l, r]) = self.nodes[v].kids {
                h[v] = 1 + h[l].max(h[r]);
            }
        }
        h
    }

    /// Forgets the blinded keys and keys of `v` and all its ancestors.
    pub fn invalidate_path(&mut self, v: usize) {
        for u in self.path(v) {
            self.nodes[u].bk = None;
            self.nodes[u].clear_key();
        }
    }

    /// The tree restricted to the members `keep` accepts, or `None` if it
    /// keeps nobody. A node that loses a child is replaced by the other child's
    /// subtree; every node above such a removal point loses its blinded key
    /// and key. Also returns the sponsor of each removal point: the rightmost
    /// leaf of the subtree that took the removed node's place (empty if
    /// nobody was removed).
    pub fn prune(&self, keep: impl Fn(&MemberId) -> bool) -> Option<(Self, Vec<usize>)> {
        self.prune_leaves(|v| self.nodes[v].member.as_ref().is_some_and(&keep))
    }

    /// Removes the leaves `gone` in place, as [`Tree::prune`] would remove
    /// their members (the same shape, the same blinded keys and keys
    /// forgotten above the removal points, the same sponsors, returned), and
    /// notes in `undo` every node it changes as it was. The removed leaves
    /// and their parents stay in the arena, unreachable and emptied. Costs
    /// O(depth) per removed leaf where a prune copies the tree: a rekey
    /// after a leave changes a few paths of a tree of n leaves, and a run
    /// that a new view abandons puts them back ([`Tree::undo`]). `None` if
    /// an entry of `gone` is not a leaf of the tree (or is one twice), or
    /// would remove the last leaf; the tree is then to be put back with
    /// `undo`.
    pub fn prune_in_place(&mut self, gone: &[usize], undo: &mut Undo<G>) -> Option<Vec<usize>> {
        let mut survivors = Vec::with_capacity(gone.len());
        for &l in gone {
            // The root, a node removed before or an internal node: refused.
            let p = self.nodes.get(l).filter(|n| n.kids.is_none())?.parent?;
            let s = self.sibling(l)?;
            let g = self.nodes[p].parent;
            match g {
                Some(g) => {
                    let kids = self.noted(undo, g).kids.as_mut().expect("a parent has children");
                    let slot = usize::from(kids[0] != p);
                    kids[slot] = s;
                }
                None => self.root = s,
            }
            self.noted(undo, s).parent = g;
            for v in [l, p] {
                let n = self.noted(undo, v);
                n.parent = None;
                n.kids = None;
                n.member = None;
                n.bk = None;
                n.clear_key();
            }
            if let Some(g) = g {
                self.invalidate_path_noted(g, undo);
            }
            survivors.push(s);
        }
        // A survivor removed later (as a removed leaf's parent) was succeeded
        // by the one promoted then, as a prune finds only the last.
        let alive = |t: &Self, v: usize| v == t.root || t.nodes[v].parent.is_some();
        Some(survivors.into_iter().filter(|&s| alive(self, s)).map(|s| self.rightmost(s)).collect())
    }

    /// [`Tree::invalidate_path`], noting each node in `undo` first.
    pub fn invalidate_path_noted(&mut self, v: usize, undo: &mut Undo<G>) {
        for u in self.path(v) {
            let n = self.noted(undo, u);
            n.bk = None;
            n.clear_key();
        }
    }

    /// Node `v`, noted in `undo` as it is now, to change.
    fn noted(&mut self, undo: &mut Undo<G>, v: usize) -> &mut Node<G> {
        undo.nodes.push((v, self.nodes[v].clone()));
        &mut self.nodes[v]
    }

    /// Puts back every node `undo` noted, as it was before the first change
    /// (what [`Tree::prune_in_place`] and the changes after it did).
    pub fn undo(&mut self, undo: Undo<G>) {
        self.nodes.truncate(undo.len);
        for (v, n) in undo.nodes.into_iter().rev().filter(|(v, _)| *v < undo.len) {
            self.nodes[v] = n;
        }
        self.root = undo.root;
    }

    /// [`Tree::prune`] by leaf index: keeps the leaves `keep` accepts (and
    /// that have a member). Also drops the nodes no longer reachable from
    /// the root (see [`Tree::graft`]): the result is a compact arena.
    pub fn prune_leaves(&self, mut keep: impl FnMut(usize) -> bool) -> Option<(Self, Vec<usize>)> {
        let mut out: Vec<Node<G>> = Vec::with_capacity(self.nodes.len());
        // For each old node: its new index and whether its new parent must be invalidated.
        let mut res: Vec<Option<(usize, bool)>> = vec![None; self.nodes.len()];
        let mut survivors = Vec::new();
        for v in self.preorder(self.root).into_iter().rev() {
            let n = &self.nodes[v];
            res[v] = match n.kids {
                None => match &n.member {
                    Some(m) if keep(v) => {
                        out.push(Node::leaf(m.clone(), n.key.clone(), n.bk.clone()));
                        Some((out.len() - 1, false))
                    }
                    _ => None,
                },
                Some([l, r]) => match (res[l], res[r]) {
                    (Some((a, ca)), Some((b, cb))) => {
                        let changed = ca || cb;
                        let (key, bk) = if changed { (None, None) } else { (n.key.clone(), n.bk.clone()) };
                        out.push(Node { parent: None, kids: Some([a, b]), member: None, bk, key });
                        let id = out.len() - 1;
                        out[a].parent = Some(id);
                        out[b].parent = Some(id);
                        Some((id, changed))
                    }
                    (Some((a, _)), None) | (None, Some((a, _))) => {
                        survivors.push(a);
                        Some((a, true))
                    }
                    (None, None) => None,
                },
            };
        }
        let (root, _) = res[self.root]?;
        let mut t = Self { nodes: out, root };
        let sponsors = survivors.into_iter().map(|s| t.rightmost(s)).collect();
        t.nodes[root].parent = None;
        Some((t, sponsors))
    }

    /// Who refreshes after a prune that returned `removal_sponsors`: the
    /// shallowest of them, then the rightmost; the rightmost leaf if nobody
    /// was removed (so every rekey changes the key).
    pub fn refresher(&self, removal_sponsors: Vec<usize>) -> usize {
        let Some(shallowest) = removal_sponsors.iter().map(|&s| self.depth(s)).min() else {
            return self.rightmost(self.root);
        };
        let mut candidates: Vec<usize> =
            removal_sponsors.into_iter().filter(|&s| self.depth(s) == shallowest).collect();
        candidates.sort_unstable();
        candidates.dedup();
        if let [only] = candidates[..] {
            // One leave (or one removal point): no need to order the leaves.
            return only;
        }
        let leaves = self.leaves();
        candidates.into_iter().max_by_key(|&s| leaves.iter().position(|&l| l == s)).expect("not empty")
    }

    /// The lowest node of `path` (a leaf's path, see [`Tree::path`]) below
    /// the root whose blinded key is unknown, as an index into `path`.
    pub fn lowest_unknown(&self, path: &[usize]) -> Option<usize> {
        path[..path.len() - 1].iter().position(|&v| !self.has_bk(v))
    }

    /// Whether `leaf` is the sponsor of node `v`: `v` is ready and `leaf` is
    /// the rightmost leaf under it.
    pub fn sponsors(&self, leaf: usize, v: usize) -> bool {
        self.ready(v) && self.rightmost(v) == leaf
    }

    /// Computes the keys on `leaf`'s path as far up as the known blinded keys
    /// allow, the root's too if `with_root` (a subgroup's root at a merge).
    pub fn climb(&mut self, ops: &mut impl KeyOps<G>, leaf: usize, with_root: bool) {
        let path = self.path(leaf);
        let end = if with_root { path.len() } else { path.len() - 1 };
        for i in 1..end {
            let (c, p) = (path[i - 1], path[i]);
            if self.nodes[p].key.is_some() {
                continue;
            }
            let Some(s) = self.sibling(c) else { break };
            // A blinded key outside the subgroup stops the climb like a
            // missing one: the member never reaches the group secret.
            let key = match (&self.nodes[c].key, self.nodes[s].bk.as_ref().and_then(|b| b.checked(ops.group()))) {
                (Some(k), Some(b)) => node_key(ops, k, b),
                _ => break,
            };
            self.nodes[p].key = Some(key);
        }
    }

    /// The blinded keys g^k of the nodes of `nodes` in turn, as long as their
    /// keys are known.
    pub fn blind(&self, ops: &mut impl KeyOps<G>, nodes: &[usize]) -> Vec<Arc<Bk<G>>> {
        nodes
            .iter()
            .map_while(|&u| self.nodes[u].key.as_ref())
            .map(|k| {
                let e = ops.exp_g(k);
                Bk::computed(ops.group(), e)
            })
            .collect()
    }

    /// The group secret, computed by the member at `leaf` from the key of
    /// the root's child on its path and the blinded key of the other child;
    /// `None` while either is unknown or for a one-leaf tree.
    pub fn group_secret(&self, ops: &mut impl KeyOps<G>, leaf: usize) -> Option<G::Element> {
        let path = self.path(leaf);
        let c = *path.get(path.len().checked_sub(2)?)?;
        let s = self.sibling(c)?;
        match (&self.nodes[c].key, self.nodes[s].bk.as_ref().and_then(|b| b.checked(ops.group()))) {
            (Some(k), Some(b)) => Some(ops.exp(b, k)),
            _ => None,
        }
    }

    /// Merges disjoint trees: ordered by more leaves first, then by `first`
    /// (e.g. the view position of a tree's first member), each inserted into
    /// the accumulated tree in turn (see [`Tree::insert_all`]). `None` for no
    /// tree.
    pub fn merge<K: Ord>(trees: Vec<Self>, first: impl Fn(&Self) -> K) -> Option<Self> {
        // `first` (O(leaves) for the caller) is asked only of trees whose
        // leaf count another tree shares: a join's large tree is not walked.
        let counts: Vec<usize> = trees.iter().map(Self::leaf_count).collect();
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        let shared = |c: usize| sorted.partition_point(|&d| d <= c) - sorted.partition_point(|&d| d < c) > 1;
        let mut keyed: Vec<_> =
            trees.into_iter().zip(counts).map(|(t, c)| ((Reverse(c), shared(c).then(|| first(&t))), t)).collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let mut trees = keyed.into_iter().map(|(_, t)| t);
        let mut acc = trees.next()?;
        let rest: Vec<Self> = trees.collect();
        acc.nodes.reserve(rest.iter().map(|t| t.nodes.len() + 1).sum());
        acc.insert_all(&rest);
        Some(acc)
    }

    /// Appends `other`'s nodes (as a detached subtree) and returns its root.
    fn append(&mut self, other: &Self) -> usize {
        let off = self.nodes.len();
        self.nodes.reserve(other.nodes.len());
        for n in &other.nodes {
            let mut c = n.clone();
            c.parent = c.parent.map(|p| p + off);
            c.kids = c.kids.map(|[l, r]| [l + off, r + off]);
            self.nodes.push(c);
        }
        other.root + off
    }

    /// Where a tree of height `hb` joins this tree, whose node heights are
    /// `h`: the shallowest, then rightmost, node x such that a new node with
    /// children (x, other) does not make the tree higher; the root if there is
    /// none.
    ///
    /// Searched level by level from the root, left to right, stopping at the
    /// first level that has such a node: a node that fails only because its
    /// own subtree is as high as its depth allows has children that may fit,
    /// and no node below a level where `hb` alone is too high can fit. A merge
    /// of n one-leaf trees then costs far less than n whole-tree walks.
    fn insertion_point_in(&self, h: &[usize], hb: usize) -> usize {
        let ha = h[self.root];
        let mut level = vec![self.root];
        let mut depth = 0;
        while !level.is_empty() && depth + 1 + hb <= ha {
            if let Some(&v) = level.iter().rev().find(|&&v| depth + 1 + h[v].max(hb) <= ha) {
                return v;
            }
            level = level.iter().filter_map(|&v| self.nodes[v].kids).flatten().collect();
            depth += 1;
        }
        self.root
    }

    /// Where `other` joins this tree (see [`Tree::insert_all`]).
    #[cfg(test)]
    pub fn insertion_point(&self, other: &Self) -> usize {
        self.insertion_point_in(&self.heights(), other.heights()[other.root])
    }

    /// Inserts `other` at its insertion point, as the right child of a new
    /// node; the new node and its ancestors lose their blinded keys and keys.
    /// Returns the new node.
    #[cfg(test)]
    pub fn insert(&mut self, other: &Self) -> usize {
        let mut h = self.heights();
        self.insert_with(other, &mut h)
    }

    /// Inserts each of `others` in turn, as [`Tree::insert`] would, keeping
    /// the node heights up to date instead of recomputing them per insertion.
    pub fn insert_all<'a>(&mut self, others: impl IntoIterator<Item = &'a Self>)
    where
        G: 'a,
    {
        let mut h = self.heights();
        for other in others {
            self.insert_with(other, &mut h);
        }
    }

    /// [`Tree::insert_all`] of trees already in merge order, noting in
    /// `undo` every node of this tree it changes (nodes it appends go with
    /// [`Tree::undo`]). Returns where each tree's nodes begin in the arena.
    pub fn insert_all_noted(&mut self, others: &[Self], undo: &mut Undo<G>) -> Vec<usize> {
        let mut h = self.heights();
        let mut offsets = Vec::with_capacity(others.len());
        for other in others {
            offsets.push(self.nodes.len());
            let hb = other.heights();
            let x = self.insertion_point_in(&h, hb[other.root]);
            let parent = self.nodes[x].parent;
            if let Some(p) = parent {
                self.noted(undo, p);
            }
            self.noted(undo, x);
            let n = self.insert_at(x, other, hb, &mut h);
            self.invalidate_path_noted(n, undo);
        }
        offsets
    }

    /// [`Tree::insert`] with this tree's node heights `h`, which it updates.
    fn insert_with(&mut self, other: &Self, h: &mut Vec<usize>) -> usize {
        let hb = other.heights();
        let x = self.insertion_point_in(h, hb[other.root]);
        let n = self.insert_at(x, other, hb, h);
        self.invalidate_path(n);
        n
    }

    /// Puts `other` (of node heights `hb`) beside node `x`, under a new node
    /// that takes `x`'s place, and returns the new node; `h`, this tree's
    /// heights, follows. The caller invalidates the new node's path.
    fn insert_at(&mut self, x: usize, other: &Self, hb: Vec<usize>, h: &mut Vec<usize>) -> usize {
        let b = self.append(other);
        h.extend(hb);
        let parent = self.nodes[x].parent;
        self.nodes.push(Node { parent, kids: Some([x, b]), member: None, bk: None, key: None });
        let n = self.nodes.len() - 1;
        h.push(0);
        match parent {
            None => self.root = n,
            Some(p) => {
                if let Some(kids) = self.nodes[p].kids.as_mut() {
                    let slot = if kids[0] == x { 0 } else { 1 };
                    kids[slot] = n;
                }
            }
        }
        self.nodes[x].parent = Some(n);
        self.nodes[b].parent = Some(n);
        for u in self.path(n) {
            if let Some([l, r]) = self.nodes[u].kids {
                h[u] = 1 + h[l].max(h[r]);
            }
        }
        n
    }

    /// Puts `other` in the place of node `v` and returns `other`'s root in
    /// this arena. `v`'s subtree leaves the tree, but its nodes stay in the
    /// arena, unreachable, until a [`Tree::prune_leaves`] (or
    /// [`Tree::compact`]); `v`'s former ancestors lose their blinded keys and
    /// keys. Grafting a one-leaf tree at a leaf replaces one member by
    /// another.
    pub fn graft(&mut self, v: usize, other: &Self) -> usize {
        let b = self.append(other);
        let parent = self.nodes[v].parent;
        self.nodes[b].parent = parent;
        self.nodes[v].parent = None;
        match parent {
            None => self.root = b,
            Some(p) => {
                if let Some(kids) = self.nodes[p].kids.as_mut() {
                    let slot = if kids[0] == v { 0 } else { 1 };
                    kids[slot] = b;
                }
                self.invalidate_path(p);
            }
        }
        b
    }

    /// The tree without the nodes that are not reachable from the root
    /// (left behind by [`Tree::graft`]), renumbered in preorder; keys and
    /// blinded keys are kept.
    pub fn compact(&self) -> Self {
        self.compacted().0
    }

    /// [`Tree::compact`], with each old node's new index (`usize::MAX`
    /// for the unreachable ones).
    pub fn compacted(&self) -> (Self, Vec<usize>) {
        let order = self.preorder(self.root);
        let mut new_of = vec![usize::MAX; self.nodes.len()];
        for (i, &v) in order.iter().enumerate() {
            new_of[v] = i;
        }
        let mut nodes: Vec<Node<G>> = order
            .iter()
            .map(|&v| {
                let mut n = self.nodes[v].clone();
                n.parent = n.parent.map(|p| new_of[p]);
                n.kids = n.kids.map(|[l, r]| [new_of[l], new_of[r]]);
                n
            })
            .collect();
        nodes[0].parent = None;
        (Self { nodes, root: 0 }, new_of)
    }

    /// A complete tree of `members`, left to right, without keys or blinded
    /// keys; `None` for no member. It is the heap-shaped tree of 2n - 1
    /// nodes (the children of node v are 2v + 1 and 2v + 2): every level is
    /// full but the last, whose leaves are leftmost, so the height is
    /// ceil(log2 n) and the leaves' depths differ by at most one.
    pub fn balanced(members: &[MemberId]) -> Option<Self> {
        let n = members.len();
        if n == 0 {
            return None;
        }
        let total = 2 * n - 1;
        let nodes = (0..total)
            .map(|v| Node {
                parent: v.checked_sub(1).map(|u| u / 2),
                kids: (2 * v + 2 < total).then_some([2 * v + 1, 2 * v + 2]),
                member: None,
                bk: None,
                key: None,
            })
            .collect();
        let mut t = Self { nodes, root: 0 };
        for (v, m) in t.leaves().into_iter().zip(members) {
            t.nodes[v].member = Some(m.clone());
        }
        Some(t)
    }

    /// Test helper: computes every missing key bottom up (a leaf's at
    /// random, an internal node's from its children) and every non-root
    /// node's missing blinded key, as if every member's keys were pooled.
    #[cfg(test)]
    pub fn fill_keys(&mut self, ops: &mut impl KeyOps<G>, rng: &mut dyn rand_core::CryptoRngCore) {
        for v in self.preorder(self.root).into_iter().rev() {
            if self.nodes[v].key.is_none() {
                let key = match self.nodes[v].kids {
                    None => ops.group().random_scalar(rng),
                    Some([l, r]) => match (&self.nodes[l].key, &self.nodes[r].bk) {
                        (Some(k), Some(b)) => node_key(ops, k, b.public()),
                        _ => unreachable!("children filled first"),
                    },
                };
                self.nodes[v].key = Some(key);
            }
            if v != self.root && self.nodes[v].bk.is_none() {
                let bk = self.nodes[v].key.as_ref().map(|k| ops.exp_g(k));
                self.nodes[v].bk = bk.map(|e| Bk::computed(ops.group(), e));
            }
        }
    }

    /// Whether both trees have the same shape and the same members at the
    /// same leaves; if so, pairs of corresponding nodes (self, other).
    pub fn correspondence(&self, other: &Self) -> Option<Vec<(usize, usize)>> {
        let a = self.preorder(self.root);
        let b = other.preorder(other.root);
        if a.len() != b.len() {
            return None;
        }
        for (&x, &y) in a.iter().zip(&b) {
            let (nx, ny) = (&self.nodes[x], &other.nodes[y]);
            if nx.kids.is_some() != ny.kids.is_some() || nx.member != ny.member {
                return None;
            }
        }
        Some(a.into_iter().zip(b).collect())
    }

    /// Every key held.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))] // test hooks only
    pub fn keys(&self) -> impl Iterator<Item = &G::Scalar> {
        self.nodes.iter().filter_map(|n| n.key.as_ref())
    }

    /// Every blinded key known.
    #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))] // test hooks only
    pub fn bks(&self) -> impl Iterator<Item = &G::Element> {
        self.nodes.iter().filter_map(|n| n.bk.as_ref().map(|b| b.public()))
    }

    /// Writes the shape, the members and the known blinded keys (never keys):
    /// the leaf count, then the nodes in preorder, each a tag byte, a member
    /// name for leaves and the blinded key if known.
    pub fn encode(&self, w: &mut Writer) {
        let order = self.preorder(self.root);
        w.count(order.len().div_ceil(2));
        for v in order {
            let n = &self.nodes[v];
            let tag = if n.kids.is_none() { TAG_LEAF } else { 0 } | if n.bk.is_some() { TAG_BK } else { 0 };
            w.u8(tag);
            if let Some(m) = &n.member {
                put_member(w, m);
            }
            if let Some(bk) = &n.bk {
                bk.write(w);
            }
        }
    }

    /// Reads a tree announced as this one but for the blinded keys of the
    /// nodes of `path` ([`Tree::encode`]'s format): the same shape and members,
    /// and off `path` the same blinded keys, compared by their bytes (nothing
    /// decoded or allocated there). Returns the blinded keys announced for
    /// `path`'s nodes, in its order (`None` where none is announced), or
    /// `Ok(None)` as soon as the announcement is not this tree so. A member
    /// reads its own subgroup's announcement at a merge this way: it holds all
    /// of it but the sponsor's path.
    #[allow(clippy::type_complexity)]
    pub fn read_as_own(
        &self,
        r: &mut Reader<'_>,
        g: &G,
        path: &[usize],
    ) -> Result<Option<Vec<Option<Arc<Bk<G>>>>>, Error> {
        let leaves = r.count(MAX_MEMBERS, 3, "TGDH tree leaves")?;
        // The leaves are counted on the way (the same shape, so the same
        // count), not by a walk of their own.
        let mut seen = 0;
        let mut out = vec![None; path.len()];
        // A preorder sequence of leaf and internal tags fixes the shape.
        for v in self.preorder(self.root) {
            let tag = r.u8("TGDH node tag")?;
            if tag > TAG_LEAF | TAG_BK {
                return Err(DecodeError::Bad("TGDH node tag").into());
            }
            let n = &self.nodes[v];
            if (tag & TAG_LEAF != 0) != n.kids.is_none() {
                return Ok(None);
            }
            if tag & TAG_LEAF != 0 {
                let name = r.short_bytes(255, "member name")?;
                if n.member.as_ref().map(|m| m.as_str().as_bytes()) != Some(name) {
                    return Ok(None);
                }
                seen += 1;
            }
            let announced = tag & TAG_BK != 0;
            if let Some(i) = path.iter().position(|&u| u == v) {
                out[i] = if announced { Some(Bk::read(r, g)?) } else { None };
            } else if announced != n.bk.is_some() {
                return Ok(None);
            } else if let Some(bk) = &n.bk {
                if r.bytes(g.element_len(), "group element")? != bk.enc.as_ref() {
                    return Ok(None);
                }
            }
        }
        Ok((seen == leaves).then_some(out))
    }

    /// Reads [`Tree::encode`]'s output: at most [`MAX_MEMBERS`] leaves, a
    /// well-formed binary tree, every member at most once, every element valid.
    pub fn decode(r: &mut Reader<'_>, g: &G) -> Result<Self, Error> {
        // A leaf takes at least a tag, a name length and one name byte.
        let leaves = r.count(MAX_MEMBERS, 3, "TGDH tree leaves")?;
        if leaves == 0 {
            return Err(DecodeError::Bad("empty TGDH tree").into());
        }
        let total = 2 * leaves - 1;
        let mut nodes: Vec<Node<G>> = Vec::with_capacity(total);
        let mut filled: Vec<u8> = Vec::with_capacity(total);
        let mut open: Vec<usize> = Vec::new(); // internal nodes still missing a child
        let mut names = MemberSet::with_capacity_and_hasher(leaves, Default::default());
        for i in 0..total {
            if i > 0 && open.is_empty() {
                return Err(DecodeError::Bad("TGDH tree shape").into());
            }
            let tag = r.u8("TGDH node tag")?;
            if tag > TAG_LEAF | TAG_BK {
                return Err(DecodeError::Bad("TGDH node tag").into());
            }
            let member = if tag & TAG_LEAF != 0 {
                let m = get_member(r)?;
                if !names.insert(m.clone()) {
                    return Err(DecodeError::Bad("member twice in a TGDH tree").into());
                }
                Some(m)
            } else {
                None
            };
            let bk = if tag & TAG_BK != 0 { Some(Bk::read(r, g)?) } else { None };
            let parent = open.last().copied();
            let kids = member.is_none().then_some([usize::MAX; 2]);
            nodes.push(Node { parent, kids, member, bk, key: None });
            filled.push(0);
            if let Some(p) = parent {
                let slot = filled[p] as usize;
                if let Some(k) = nodes[p].kids.as_mut() {
                    k[slot] = i;
                }
                filled[p] += 1;
            }
            if tag & TAG_LEAF == 0 {
                open.push(i);
            } else {
                while open.last().is_some_and(|&t| filled[t] == 2) {
                    open.pop();
                }
            }
        }
        if !open.is_empty() {
            return Err(DecodeError::Bad("TGDH tree shape").into());
        }
        Ok(Self { nodes, root: 0 })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    //! The tree on its own, computing in a bare group (unmetered): no engine.

    use conclave_gcs::MemberId;
    use rand_chacha::ChaCha20Rng;
    use rand_core::{RngCore, SeedableRng};

    use super::{node_key, Bk, Node, Tree, Undo};
    use crate::codec::{Reader, Writer};
    use crate::engine::Error;
    use crate::suite::ristretto::Ristretto255;
    use crate::suite::Group;

    /// Member `i`'s name.
    pub(crate) fn id(i: usize) -> MemberId {
        MemberId::new(format!("m{i:04}")).unwrap()
    }

    /// A blinded key read from a message is checked where it would meet a
    /// secret: one outside the subgroup stops the climb, and the member
    /// computes no group secret from it.
    #[test]
    fn a_blinded_key_outside_the_subgroup_is_never_raised_to_a_secret() {
        use crate::suite::modp::Modp;
        use crate::suite::GroupId;
        let g = Modp::new(GroupId::Modp512);
        let len = g.element_len();
        let outside = (2u8..).map(|h| [vec![0; len - 1], vec![h]].concat()).find(|b| g.decode(b).is_err()).unwrap();
        let bad = Bk::read(&mut Reader::new(&outside), &g).expect("read without the check");
        assert!(bad.checked(&g).is_none());
        let good_bytes = g.encode(&g.exp_generator(&g.scalar_from_u64(5)));
        let good = Bk::read(&mut Reader::new(&good_bytes), &g).unwrap();
        assert!(good.checked(&g).is_some());
        let k = g.random_scalar(&mut ChaCha20Rng::seed_from_u64(1));
        for (sibling, secret) in [(bad, false), (good, true)] {
            let mut t = Tree::leaf(id(0), Some(k.clone()), None);
            t.insert(&Tree::leaf(id(1), None, Some(sibling)));
            let leaf = t.leaf_index()[&id(0)];
            let mut ops = g;
            t.climb(&mut ops, leaf, true);
            assert_eq!(t.group_secret(&mut ops, leaf).is_some(), secret);
        }
    }

    pub(crate) fn singletons(n: usize) -> Tree<Ristretto255> {
        let mut t = Tree::leaf(id(0), None, None);
        for i in 1..n {
            t.insert(&Tree::leaf(id(i), None, None));
        }
        t
    }

    fn order(t: &Tree<Ristretto255>) -> Vec<usize> {
        t.members().iter().map(|m| m.as_str()[1..].parse().unwrap()).collect()
    }

    #[test]
    fn insertion_keeps_the_tree_low() {
        for n in 1..=64usize {
            let t = singletons(n);
            let h = t.heights()[t.root];
            assert_eq!(h, n.next_power_of_two().trailing_zeros() as usize, "n = {n}");
            assert_eq!(t.leaves().len(), n);
        }
        assert_eq!(order(&singletons(8)), (0..8).collect::<Vec<_>>());
        assert_eq!(order(&singletons(16)), [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 11, 12, 13, 14]);
        // A tree as high as the accumulated one goes in at the root.
        let mut a = singletons(4);
        a.insert(&singletons(3));
        assert_eq!(a.heights()[a.root], 3);
    }

    /// The insertion point as a scan of every node (the definition): the
    /// shallowest, then rightmost in preorder, node x where a new parent of x
    /// and a tree of height `hb` keeps the height; the root if none.
    fn insertion_point_by_scan(t: &Tree<Ristretto255>, hb: usize) -> usize {
        let h = t.heights();
        let ha = h[t.root];
        let mut best: Option<(usize, usize)> = None;
        for v in t.preorder(t.root) {
            let d = t.depth(v);
            if best.is_none_or(|(bd, _)| d <= bd) && d + 1 + h[v].max(hb) <= ha {
                best = Some((d, v));
            }
        }
        best.map_or(t.root, |(_, v)| v)
    }

    #[test]
    fn level_search_finds_the_insertion_point_of_the_scan() {
        // Trees of every shape that merges build: subgroups of random sizes
        // inserted in turn, each checked against the scan before it goes in.
        let mut rng = ChaCha20Rng::seed_from_u64(11);
        for _ in 0..40 {
            let mut acc = singletons(1 + (rng.next_u32() % 9) as usize);
            for _ in 0..12 {
                let other = singletons(1 + (rng.next_u32() % 20) as usize);
                let hb = other.heights()[other.root];
                assert_eq!(acc.insertion_point(&other), insertion_point_by_scan(&acc, hb));
                acc.insert(&other);
            }
        }
        for n in 1..=300 {
            let t = singletons(n);
            for hb in 0..4 {
                let other = singletons(1 << hb);
                assert_eq!(t.insertion_point(&other), insertion_point_by_scan(&t, hb), "n = {n}, hb = {hb}");
            }
        }
        // insert_all keeps its heights right: the same tree as one insert at a time.
        let parts: Vec<_> = (1..30).map(|k| singletons(1 + k % 7)).collect();
        let (mut one, mut all) = (singletons(5), singletons(5));
        for p in &parts {
            one.insert(p);
        }
        all.insert_all(&parts);
        assert_eq!(one.heights(), all.heights());
        assert!(one.correspondence(&all).is_some());
    }

    #[test]
    fn a_balanced_tree_is_complete_and_keeps_the_members_in_order() {
        for n in 1..=40usize {
            let members: Vec<MemberId> = (0..n).map(id).collect();
            let t = Tree::<Ristretto255>::balanced(&members).unwrap();
            assert_eq!(t.members(), members, "n = {n}");
            let h = n.next_power_of_two().trailing_zeros() as usize;
            assert_eq!(t.heights()[t.root], h, "n = {n}");
            // Leaves one level apart at most, the deeper ones leftmost.
            let depths: Vec<usize> = t.leaves().iter().map(|&v| t.depth(v)).collect();
            assert!(depths.iter().all(|&d| d <= h && d + 1 >= h), "n = {n}: {depths:?}");
            assert!(depths.windows(2).all(|w| w[0] >= w[1]), "n = {n}: {depths:?}");
            let d = decode(&encode(&t)).unwrap();
            assert!(t.correspondence(&d).is_some(), "n = {n}");
        }
        assert!(Tree::<Ristretto255>::balanced(&[]).is_none());
    }

    #[test]
    fn grafting_replaces_a_subtree_and_invalidates_only_the_path_above_it() {
        // ((m0, m1), (m2, m3)), every blinded key known; graft (m7, m8) at m1.
        let t = full_bks(singletons(4));
        let mut other = Tree::leaf(id(7), None, None);
        other.insert(&Tree::leaf(id(8), None, None));
        let mut a = t.clone();
        let v = a.find(&id(1)).unwrap();
        let b = a.graft(v, &other);
        assert_eq!(a.members(), [id(0), id(7), id(8), id(2), id(3)]);
        let p = a.nodes[b].parent.unwrap();
        assert!(!a.has_bk(p) && a.nodes[a.root].bk.is_none());
        let m0 = a.find(&id(0)).unwrap();
        let right = a.nodes[a.root].kids.unwrap()[1];
        assert!(a.has_bk(m0) && a.has_bk(right));
        // The replaced leaf stays in the arena until compacted.
        assert!(a.find(&id(1)).is_some());
        let c = a.compact();
        assert!(c.find(&id(1)).is_none());
        assert_eq!(c.nodes.len(), 9);
        assert!(a.correspondence(&c).is_some());
        // Pruning by index compacts too.
        let seven = a.find(&id(7)).unwrap();
        let (pr, _) = a.prune_leaves(|u| u != seven).unwrap();
        assert_eq!(pr.members(), [id(0), id(8), id(2), id(3)]);
        assert_eq!(pr.nodes.len(), 7);
        // At the root, the graft is the whole tree.
        let mut r = t.clone();
        let root = r.root;
        r.graft(root, &other);
        assert_eq!(r.compact().members(), [id(7), id(8)]);
    }

    #[test]
    fn pruning_names_the_sponsors() {
        let t = singletons(8);
        let (p, sponsors) = t.prune(|m| m != &id(7)).unwrap();
        let s: Vec<&MemberId> = sponsors.iter().filter_map(|&v| p.member(v)).collect();
        assert_eq!(s, [&id(6)]);
        assert_eq!(p.depth(sponsors[0]), 2);
        let (p, sponsors) = t.prune(|m| m.as_str()[1..].parse::<usize>().unwrap() % 2 == 1).unwrap();
        let mut s: Vec<&MemberId> = sponsors.iter().filter_map(|&v| p.member(v)).collect();
        s.sort();
        assert_eq!(s, [&id(1), &id(3), &id(5), &id(7)]);
        assert!(t.prune(|_| false).is_none());
        let (_, none) = t.prune(|_| true).unwrap();
        assert!(none.is_empty());
    }

    fn with_bks(mut t: Tree<Ristretto255>) -> Tree<Ristretto255> {
        let g = Ristretto255;
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        for (i, n) in t.nodes.iter_mut().enumerate() {
            if i % 3 != 0 {
                n.bk = Some(Bk::computed(&g, g.exp_generator(&g.random_scalar(&mut rng))));
            }
        }
        t
    }

    pub(crate) fn full_bks(mut t: Tree<Ristretto255>) -> Tree<Ristretto255> {
        let g = Ristretto255;
        for (i, n) in t.nodes.iter_mut().enumerate() {
            n.bk = Some(Bk::computed(&g, g.exp_generator(&g.scalar_from_u64(i as u64 + 2))));
        }
        t
    }

    pub(crate) fn encode(t: &Tree<Ristretto255>) -> Vec<u8> {
        let mut w = Writer::new();
        t.encode(&mut w);
        w.buf
    }

    fn decode(b: &[u8]) -> Result<Tree<Ristretto255>, Error> {
        let mut r = Reader::new(b);
        let t = Tree::decode(&mut r, &Ristretto255)?;
        r.finish()?;
        Ok(t)
    }

    #[test]
    fn tree_codec_round_trips_and_rejects_malformed_input() {
        let t = with_bks(singletons(13));
        let bytes = encode(&t);
        let d = decode(&bytes).unwrap();
        let pairs = t.correspondence(&d).unwrap();
        assert!(pairs.iter().all(|&(x, y)| t.nodes[x].bk == d.nodes[y].bk));
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = bytes.clone();
        long.push(0);
        assert!(decode(&long).is_err());
        // A forged leaf count cannot make the decoder allocate.
        assert!(decode(&[0xff, 0xff, 1, 1, b'a']).is_err());
        assert!(decode(&[0x10, 0x00]).is_err());
        assert!(decode(&[0, 0]).is_err());
        // A bad tag, an invalid element, a member twice, a shape that ends early.
        assert!(decode(&[0, 1, 4, 1, b'a']).is_err());
        let mut bad = vec![0, 1, 3, 1, b'a'];
        bad.extend([0xff; 32]);
        assert!(decode(&bad).is_err());
        assert!(decode(&[0, 2, 0, 1, 1, b'a', 1, 1, b'a']).is_err());
        assert!(decode(&[0, 2, 1, 1, b'a', 1, 1, b'b', 0]).is_err());
        // Flipping any byte never panics.
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            let _ = decode(&b);
        }
    }

    #[test]
    fn an_announcement_read_as_own_differs_only_on_the_path() {
        let g = Ristretto255;
        let t = full_bks(singletons(13));
        let s = t.rightmost(t.root);
        let path = t.path(s);
        // What a member holds: the tree without the sponsor's path.
        let mut mine = t.clone();
        mine.invalidate_path(s);
        let read = |bytes: &[u8]| {
            let mut r = Reader::new(bytes);
            let out = mine.read_as_own(&mut r, &g, &path);
            out.map(|o| o.filter(|_| r.remaining() == 0))
        };
        let bytes = encode(&t);
        let bks = read(&bytes).unwrap().expect("the same tree");
        assert!(path.iter().zip(&bks).all(|(&u, b)| b.is_some() && *b == t.nodes[u].bk));
        // Another blinded key off the path, another member, another shape.
        let off = t.leaves()[0];
        assert!(!path.contains(&off));
        let mut other = t.clone();
        other.nodes[off].bk = Some(Bk::computed(&g, g.exp_generator(&g.scalar_from_u64(99))));
        assert!(read(&encode(&other)).unwrap().is_none());
        let mut renamed = t.clone();
        renamed.nodes[off].member = Some(id(99));
        assert!(read(&encode(&renamed)).unwrap().is_none());
        let mut grown = t.clone();
        grown.insert(&Tree::leaf(id(20), None, None));
        assert!(read(&encode(&full_bks(grown))).unwrap().is_none());
        let mut unknown = t.clone();
        unknown.nodes[off].bk = None;
        assert!(read(&encode(&unknown)).unwrap().is_none());
        // The same nodes under another leaf count (a u16 first).
        for count in [12u16, 14] {
            let mut b = bytes.clone();
            b[..2].copy_from_slice(&count.to_be_bytes());
            assert!(read(&b).unwrap().is_none(), "{count} leaves announced");
        }
        // Cut or flipped input is an error or a mismatch, never a panic.
        for cut in 0..bytes.len() {
            assert!(!matches!(read(&bytes[..cut]), Ok(Some(_))), "cut at {cut}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            let _ = read(&b);
        }
    }

    #[test]
    fn deep_trees_are_handled_without_recursion() {
        // A caterpillar with MAX_MEMBERS leaves: as deep as a tree can be.
        let n = super::MAX_MEMBERS;
        let mut nodes: Vec<Node<Ristretto255>> = Vec::new();
        let mut top = 0;
        nodes.push(Node { parent: None, kids: None, member: Some(id(0)), bk: None, key: None });
        for i in 1..n {
            nodes.push(Node { parent: None, kids: None, member: Some(id(i)), bk: None, key: None });
            nodes.push(Node { parent: None, kids: Some([top, 2 * i - 1]), member: None, bk: None, key: None });
            nodes[top].parent = Some(2 * i);
            nodes[2 * i - 1].parent = Some(2 * i);
            top = 2 * i;
        }
        let t: Tree<Ristretto255> = Tree { nodes, root: top };
        let d = decode(&encode(&t)).unwrap();
        assert_eq!(d.heights()[d.root], n - 1);
        assert_eq!(d.depth(d.find(&id(0)).unwrap()), n - 1);
        let (p, _) = d.prune(|m| m != &id(1)).unwrap();
        assert_eq!(p.leaves().len(), n - 1);
    }

    /// A tree whose every key and blinded key is computed (as if by every
    /// sponsor), with random leaf keys.
    fn keyed(n: usize, seed: u64) -> Tree<Ristretto255> {
        let g = Ristretto255;
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut t = singletons(n);
        for v in t.preorder(t.root).into_iter().rev() {
            let key = match t.nodes[v].kids {
                None => g.random_scalar(&mut rng),
                Some([l, r]) => {
                    let (k, b) = (t.nodes[l].key.unwrap(), t.nodes[r].bk.clone().unwrap());
                    node_key(&mut g.clone(), &k, b.public())
                }
            };
            if v != t.root {
                t.nodes[v].bk = Some(Bk::computed(&g, g.exp_generator(&key)));
            }
            t.nodes[v].key = Some(key);
        }
        t
    }

    #[test]
    fn every_member_computes_the_same_group_secret_from_its_leaf_and_the_blinded_keys() {
        let mut g = Ristretto255;
        for n in [2, 3, 5, 8, 13] {
            let full = keyed(n, n as u64);
            let mut secrets = Vec::new();
            for leaf in full.leaves() {
                let mut t = full.public();
                t.nodes[leaf].key = full.nodes[leaf].key;
                assert!(t.group_secret(&mut g, leaf).is_none() || t.depth(leaf) == 1, "n = {n}");
                t.climb(&mut g, leaf, false);
                let path = t.path(leaf);
                // The blinded keys it would announce are the ones everybody holds.
                let top = path.len() - 1;
                let bks = t.blind(&mut g, &path[..top]);
                assert_eq!(bks.len(), top, "n = {n}");
                assert!(bks.iter().zip(&path).all(|(b, &u)| full.nodes[u].bk.as_ref() == Some(b)));
                secrets.push(t.group_secret(&mut g, leaf).expect("the whole path is known"));
            }
            assert!(secrets.windows(2).all(|w| w[0] == w[1]), "n = {n}");
        }
        assert!(Tree::<Ristretto255>::leaf(id(0), None, None).group_secret(&mut g, 0).is_none());
    }

    #[test]
    fn sponsors_follow_the_public_tree() {
        // (((0,1),(2,3)),4) without m4: the root's left subtree remains; its
        // rightmost leaf m3 refreshes. Nobody removed: the rightmost leaf.
        let t = keyed(5, 1);
        let (p, removal) = t.prune(|m| m != &id(4)).unwrap();
        let r = p.refresher(removal);
        assert_eq!(p.member(r), Some(&id(3)));
        let (p, removal) = t.prune(|_| true).unwrap();
        assert_eq!(p.member(p.refresher(removal)), Some(&id(4)));
        // Without m1 and m3, m0 and m2 sponsor their removal points; both are
        // at depth 1, and m2 is the rightmost.
        let (mut p, removal) = t.prune(|m| m != &id(1) && m != &id(3)).unwrap();
        assert_eq!(removal.len(), 2);
        let r = p.refresher(removal);
        assert_eq!(p.member(r), Some(&id(2)));
        p.invalidate_path(r);
        let path = p.path(r);
        assert_eq!(p.lowest_unknown(&path), Some(0));
        assert!(p.sponsors(r, path[0]));
        // m0's path is unknown from its parent up, which waits for m2.
        let m0 = p.find(&id(0)).unwrap();
        let path0 = p.path(m0);
        assert_eq!(p.lowest_unknown(&path0), Some(1));
        assert!(!p.sponsors(m0, path0[1]));
        // Merging orders by size, then by `first`.
        let merged = Tree::merge(vec![singletons(1), singletons(3)], |t| t.leaves().len()).unwrap();
        assert_eq!(merged.leaves().len(), 4);
        assert_eq!(merged.members()[..3], singletons(3).members()[..]);
        assert!(Tree::<Ristretto255>::merge(Vec::new(), |_| 0).is_none());
    }

    /// The keys of the nodes reachable from the root, in preorder.
    fn reachable_keys(t: &Tree<Ristretto255>) -> Vec<Option<curve25519_dalek::Scalar>> {
        t.preorder(t.root).into_iter().map(|v| t.nodes[v].key).collect()
    }

    /// Each node of the arena as it stands: shape, member, blinded key, key.
    fn arena(t: &Tree<Ristretto255>) -> Vec<String> {
        let bk = |n: &Node<Ristretto255>| n.bk.as_ref().map(|b| b.bytes().to_vec());
        t.nodes.iter().map(|n| format!("{:?} {:?} {:?} {:?} {:?}", n.parent, n.kids, n.member, bk(n), n.key)).collect()
    }

    #[test]
    fn pruning_in_place_is_a_prune_and_undoes_exactly() {
        let g = Ristretto255;
        let mut rng = ChaCha20Rng::seed_from_u64(23);
        for n in 2..=40usize {
            for round in 0..6 {
                let mut t = full_bks(singletons(n));
                for (i, node) in t.nodes.iter_mut().enumerate() {
                    node.key = (i % 3 != 0).then(|| g.scalar_from_u64(i as u64 + 100));
                }
                t.nodes[t.root].bk = None;
                let leaves = t.leaves();
                // Between one leaf and all but one gone, in a random order.
                let mut gone: Vec<usize> = leaves.iter().copied().filter(|_| rng.next_u32() % 3 == 0).collect();
                gone.truncate(n - 1);
                if gone.is_empty() || round == 0 {
                    gone = vec![leaves[rng.next_u32() as usize % n]];
                }
                for i in (1..gone.len()).rev() {
                    gone.swap(i, rng.next_u32() as usize % (i + 1));
                }
                let names: Vec<MemberId> = gone.iter().map(|&v| t.member(v).unwrap().clone()).collect();
                let (pruned, sponsors) = t.prune(|m| !names.contains(m)).unwrap();
                let before = arena(&t);
                let mut undo = Undo::of(&t);
                let mut inplace = t.clone();
                let got = inplace.prune_in_place(&gone, &mut undo).unwrap();
                assert_eq!(encode(&inplace), encode(&pruned), "n {n}, gone {names:?}: the same tree");
                assert_eq!(reachable_keys(&inplace), reachable_keys(&pruned), "n {n}: the same keys kept");
                assert_eq!(inplace.keys().count(), pruned.keys().count(), "n {n}: no key left unreachable");
                let sponsor_names = |t: &Tree<Ristretto255>, s: &[usize]| {
                    let mut v: Vec<MemberId> = s.iter().map(|&x| t.member(x).unwrap().clone()).collect();
                    v.sort();
                    v.dedup();
                    v
                };
                assert_eq!(
                    sponsor_names(&inplace, &got),
                    sponsor_names(&pruned, &sponsors),
                    "n {n}: the same sponsors"
                );
                // The rule, by its definition: the shallowest sponsor, then the rightmost.
                let leaves = pruned.leaves();
                let by_definition = sponsors
                    .iter()
                    .copied()
                    .min_by_key(|&s| (pruned.depth(s), std::cmp::Reverse(leaves.iter().position(|&l| l == s))))
                    .unwrap();
                assert_eq!(pruned.refresher(sponsors.clone()), by_definition, "n {n}: the refresher");
                let refresher = inplace.refresher(got);
                assert_eq!(
                    inplace.member(refresher),
                    pruned.member(pruned.refresher(sponsors)),
                    "n {n}: the same refresher"
                );
                inplace.invalidate_path_noted(refresher, &mut undo);
                inplace.nodes[refresher].key = Some(g.scalar_from_u64(7));
                inplace.undo(undo);
                assert_eq!(arena(&inplace), before, "n {n}: undone exactly");
                assert_eq!(inplace.root, t.root);
            }
        }
        // Refused, for the caller to undo: the last leaf, a leaf twice, an internal node.
        let mut t = full_bks(singletons(3));
        let leaves = t.leaves();
        for gone in [leaves.clone(), vec![leaves[0], leaves[0]], vec![t.root]] {
            let before = arena(&t);
            let mut undo = Undo::of(&t);
            assert!(t.prune_in_place(&gone, &mut undo).is_none(), "{gone:?}");
            t.undo(undo);
            assert_eq!(arena(&t), before);
        }
    }
}
