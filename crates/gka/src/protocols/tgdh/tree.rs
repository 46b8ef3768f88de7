//! The TGDH key tree: a binary tree whose leaves are members.
//!
//! Nodes live in an arena (`Vec`) and refer to each other by index; an arena
//! only ever holds the nodes of one tree (pruning builds a new arena, merging
//! appends), so indices are stable for the rounds of one run. Every walk is
//! iterative: a tree received from the network may be as deep as it has
//! leaves, and deep recursion must not overflow the stack.
//!
//! Each node holds its blinded key (public, `None` while unknown) and, on the
//! owner's own path only, its key (secret, zeroized when dropped or replaced).

use std::collections::{BTreeSet, HashMap};

use conclave_gcs::MemberId;
use zeroize::Zeroize;

use crate::codec::{DecodeError, Reader, Writer};
use crate::engine::Error;
use crate::protocols::{get_elem, get_member, put_elem, put_member, MAX_MEMBERS};
use crate::suite::Group;

/// Node tags on the wire: bit 0 = leaf, bit 1 = blinded key follows.
const TAG_LEAF: u8 = 1;
const TAG_BK: u8 = 2;

/// One node of a key tree.
#[derive(Clone)]
pub(super) struct Node<G: Group> {
    pub parent: Option<usize>,
    /// Left and right child, for internal nodes.
    pub kids: Option<[usize; 2]>,
    /// The member, for leaves.
    pub member: Option<MemberId>,
    /// The blinded key g^k, when known.
    pub bk: Option<G::Element>,
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
    fn leaf(member: MemberId, key: Option<G::Scalar>, bk: Option<G::Element>) -> Self {
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
pub(super) struct Tree<G: Group> {
    pub nodes: Vec<Node<G>>,
    pub root: usize,
}

impl<G: Group> Tree<G> {
    /// A tree of one leaf.
    pub fn leaf(member: MemberId, key: Option<G::Scalar>, bk: Option<G::Element>) -> Self {
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
        let mut out = Vec::new();
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
    pub fn leaf_index(&self) -> HashMap<MemberId, usize> {
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

    /// Whether every blinded key except the root's is known.
    pub fn complete(&self) -> bool {
        self.nodes.iter().enumerate().all(|(i, n)| i == self.root || n.bk.is_some())
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
        let mut out: Vec<Node<G>> = Vec::new();
        // For each old node: its new index and whether its new parent must be invalidated.
        let mut res: Vec<Option<(usize, bool)>> = vec![None; self.nodes.len()];
        let mut survivors = Vec::new();
        for v in self.preorder(self.root).into_iter().rev() {
            let n = &self.nodes[v];
            res[v] = match n.kids {
                None => match &n.member {
                    Some(m) if keep(m) => {
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

    /// Appends `other`'s nodes (as a detached subtree) and returns its root.
    fn append(&mut self, other: &Self) -> usize {
        let off = self.nodes.len();
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

    /// [`Tree::insert`] with this tree's node heights `h`, which it updates.
    fn insert_with(&mut self, other: &Self, h: &mut Vec<usize>) -> usize {
        let hb = other.heights();
        let x = self.insertion_point_in(h, hb[other.root]);
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
        self.invalidate_path(n);
        n
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
        self.nodes.iter().filter_map(|n| n.bk.as_ref())
    }

    /// Writes the shape, the members and the known blinded keys (never keys):
    /// the leaf count, then the nodes in preorder, each a tag byte, a member
    /// name for leaves and the blinded key if known.
    pub fn encode(&self, w: &mut Writer, g: &G) {
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
                put_elem(w, g, bk);
            }
        }
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
        let mut names = BTreeSet::new();
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
            let bk = if tag & TAG_BK != 0 { Some(get_elem(r, g)?) } else { None };
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
