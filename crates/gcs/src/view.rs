//! Group membership views, as the group communication layer delivers them.
//!
//! A view is what every member of a group agrees on between two membership
//! changes: a unique id, the ordered member list and why it changed. Each
//! member entry also carries the id of the view that member came from
//! (Spread's *transitional set*): members that install the same two views in a
//! row have delivered the same messages in the first (virtual synchrony), which
//! is what lets the key agreement layer know, without talking, which other
//! members share its state.

use std::fmt;
use std::sync::Arc;

/// A member's name in a group: unique within the system (like Spread's
/// private group names).
///
/// Shared, not owned: every member keeps its group's names in several maps
/// and sets (views, positions, trees, confirmations), rebuilt at every view,
/// so a clone is a reference count, not an allocation and a copy. Equality,
/// order and hash are the text's; two clones of one name compare equal by
/// address, without reading the text (the standard library's `Arc<str>`
/// reads it: its pointer shortcut is for sized types only), which is what
/// walking a view against the last one mostly does.
#[derive(Clone)]
pub struct MemberId(std::sync::Arc<str>);

impl std::hash::Hash for MemberId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // The text's hash, as equality is the text's.
        self.0.hash(state)
    }
}

impl PartialEq for MemberId {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl Eq for MemberId {}

impl PartialOrd for MemberId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for MemberId {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

/// The hasher of the maps and sets keyed by member name, which every member
/// rebuilds at every view with an entry per member: foldhash, several times
/// faster than the standard library's SipHash on short names and, like it,
/// seeded at random for every map, so names cannot be chosen to collide.
pub type NameHasher = foldhash::fast::RandomState;
/// A map keyed by member name (see [`NameHasher`]).
pub type MemberMap<V> = std::collections::HashMap<MemberId, V, NameHasher>;
/// A set of member names (see [`NameHasher`]).
pub type MemberSet = std::collections::HashSet<MemberId, NameHasher>;

/// Longest member name accepted anywhere (wire, views, protocol messages).
pub const MAX_MEMBER_NAME: usize = 255;

/// Errors about names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Names must not be empty.
    #[error("name is empty")]
    Empty,
    /// Names are limited in length.
    #[error("name is {len} bytes long; the limit is {max}")]
    TooLong {
        /// The name's length in bytes.
        len: usize,
        /// The limit for this kind of name.
        max: usize,
    },
    /// Names are printable and contain no whitespace.
    #[error("name contains a control or whitespace character")]
    BadCharacter,
}

impl MemberId {
    /// Checks and wraps a member name.
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        check_name(&name, MAX_MEMBER_NAME)?;
        Ok(Self(name.into()))
    }

    /// [`MemberId::new`] from borrowed text: one allocation, where a
    /// `String` first would take two (decoders read every name of a view).
    pub fn from_name(name: &str) -> Result<Self, NameError> {
        check_name(name, MAX_MEMBER_NAME)?;
        Ok(Self(name.into()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for MemberId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The names a decoder has read lately, so that the same name read again —
/// every name of every view, the sender of every message — is a reference
/// count, not an allocation (and its checks) and, later, a free. At most
/// [`NameCache::MAX`] names; then it starts afresh.
#[derive(Default)]
pub struct NameCache {
    names: MemberSet,
}

impl NameCache {
    /// Most names held.
    pub const MAX: usize = 4096;

    /// `name` as a member name: the one held if it was read before, else
    /// checked ([`MemberId::from_name`]) and held.
    pub fn name(&mut self, name: &str) -> Result<MemberId, NameError> {
        if let Some(m) = self.names.get(name) {
            return Ok(m.clone());
        }
        let m = MemberId::from_name(name)?;
        if self.names.len() >= Self::MAX {
            self.names.clear();
        }
        self.names.insert(m.clone());
        Ok(m)
    }
}

/// Checks the rules every name follows: non-empty, at most `max` bytes,
/// printable and without whitespace.
fn check_name(name: &str, max: usize) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > max {
        return Err(NameError::TooLong { len: name.len(), max });
    }
    // ASCII (nearly every name) is printable and not whitespace exactly
    // when graphic; other text goes character by character.
    let bad = if name.is_ascii() {
        !name.bytes().all(|b| b.is_ascii_graphic())
    } else {
        name.chars().any(|c| c.is_control() || c.is_whitespace())
    };
    if bad {
        return Err(NameError::BadCharacter);
    }
    Ok(())
}

impl fmt::Debug for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A lightweight group's name: chosen by the clients that join it, unique
/// within the system.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

/// Longest group name accepted anywhere.
pub const MAX_GROUP_NAME: usize = 128;

impl GroupName {
    /// Checks and wraps a group name (same rules as member names, with a
    /// limit of [`MAX_GROUP_NAME`] bytes).
    pub fn new(name: impl Into<String>) -> Result<Self, NameError> {
        let name = name.into();
        check_name(&name, MAX_GROUP_NAME)?;
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A view's identity: unique for the lifetime of the system, so protocol
/// messages bound to it can never be replayed into another view.
///
/// `seq` is the daemon group's view counter; `incarnation` is a random
/// value drawn when a daemon starts, and derived anew from the daemons'
/// values whenever the daemon group changes (see *View ids* in the core's
/// docs). Counters start over when daemons restart; the incarnation does
/// not repeat, so a view id — and whatever is signed over it — never
/// recurs across daemon lifetimes, components or transitional sets. Ids
/// carry no order.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ViewId {
    /// The daemon group's random value when it installed the view.
    pub incarnation: u64,
    /// The view counter within that incarnation.
    pub seq: u64,
}

impl ViewId {
    /// The view id `seq` of `incarnation`.
    pub const fn new(incarnation: u64, seq: u64) -> Self {
        Self { incarnation, seq }
    }

    /// The id as 16 bytes (incarnation, then counter; big-endian), as wire
    /// formats and signed transcripts carry it.
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0; 16];
        b[..8].copy_from_slice(&self.incarnation.to_be_bytes());
        b[8..].copy_from_slice(&self.seq.to_be_bytes());
        b
    }

    /// Parses [`ViewId::to_bytes`].
    pub fn from_bytes(b: [u8; 16]) -> Self {
        let (i, s) = b.split_at(8);
        Self::new(
            u64::from_be_bytes(i.try_into().expect("8 bytes")),
            u64::from_be_bytes(s.try_into().expect("8 bytes")),
        )
    }
}

impl fmt::Display for ViewId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The counter, and enough of the incarnation to tell lifetimes apart.
        write!(f, "v{}.{:04x}", self.seq, self.incarnation >> 48)
    }
}

/// Why a view changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Cause {
    /// Members asked to join.
    Join,
    /// Members asked to leave.
    Leave,
    /// Members disconnected from their daemon.
    Disconnect,
    /// The network partitioned or merged.
    Network,
    /// The daemons renewed the key of a group they key (same members, a
    /// new view: the integrated architecture's artificial view change).
    Refresh,
}

/// One member of a view, with the view it came from.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ViewMember {
    /// Who.
    pub id: MemberId,
    /// The view this member was in just before this one (`None` for a member
    /// that was in no view of this group).
    pub prev: Option<ViewId>,
}

/// How a view `new` keeps the members of an earlier view `old`, found by
/// walking the two lists side by side (no names hashed): for each place of
/// `old`, the place of its member in `new` if that member is the next one
/// of `new` there (`None`: it is not, so it is taken as gone), and how many
/// of `new`'s first members that accounts for. A view that keeps the
/// earlier one's order, some gone and newcomers after those that stay,
/// is read whole this way (the count is then `new`'s members before the
/// newcomers); any other is for the caller to recognise (a member that
/// stays but stands elsewhere is then among the "newcomers").
pub fn kept_places(old: &[ViewMember], new: &[ViewMember]) -> (Vec<Option<usize>>, usize) {
    let mut to = vec![None; old.len()];
    let mut j = 0;
    for (i, m) in old.iter().enumerate() {
        if new.get(j).is_some_and(|n| n.id == m.id) {
            to[i] = Some(j);
            j += 1;
        }
    }
    (to, j)
}

/// The members of a secure view, in view order, shared: a whole view's list
/// (the view's own, so a key for a view of hundreds copies no name), or a
/// list of some of them (a key installed among part of a view). A clone is
/// a reference count. Two lists are equal when they name the same members
/// in the same order, whichever way each is held.
#[derive(Clone)]
pub struct Members(MembersRepr);

#[derive(Clone)]
enum MembersRepr {
    View(Arc<[ViewMember]>),
    Ids(Arc<[MemberId]>),
}

impl Members {
    /// The members of a whole view: its list, shared.
    pub fn of_view(view: &View) -> Self {
        Self(MembersRepr::View(view.members.clone()))
    }

    /// How many.
    pub fn len(&self) -> usize {
        match &self.0 {
            MembersRepr::View(v) => v.len(),
            MembersRepr::Ids(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`-th member in view order.
    pub fn get(&self, i: usize) -> Option<&MemberId> {
        match &self.0 {
            MembersRepr::View(v) => v.get(i).map(|m| &m.id),
            MembersRepr::Ids(v) => v.get(i),
        }
    }

    /// The first (oldest) member.
    pub fn first(&self) -> Option<&MemberId> {
        self.get(0)
    }

    /// The members in view order.
    pub fn iter(&self) -> MembersIter<'_> {
        match &self.0 {
            MembersRepr::View(v) => MembersIter::View(v.iter()),
            MembersRepr::Ids(v) => MembersIter::Ids(v.iter()),
        }
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: &MemberId) -> bool {
        self.iter().any(|m| m == id)
    }

    /// Position of `id` in the list.
    pub fn position(&self, id: &MemberId) -> Option<usize> {
        self.iter().position(|m| m == id)
    }

    /// Whether this is `view`'s own list (shared with it, not a copy of
    /// it): a member of the view is then one of these, found in a set of the
    /// view's members rather than by reading this list.
    pub fn is_list_of(&self, view: &View) -> bool {
        matches!(&self.0, MembersRepr::View(v) if Arc::ptr_eq(v, &view.members))
    }

    /// The members, copied into a vector.
    pub fn to_vec(&self) -> Vec<MemberId> {
        self.iter().cloned().collect()
    }
}

/// The members of a [`Members`] list in order.
#[derive(Clone)]
pub enum MembersIter<'a> {
    #[doc(hidden)]
    View(std::slice::Iter<'a, ViewMember>),
    #[doc(hidden)]
    Ids(std::slice::Iter<'a, MemberId>),
}

impl<'a> Iterator for MembersIter<'a> {
    type Item = &'a MemberId;

    fn next(&mut self) -> Option<&'a MemberId> {
        match self {
            MembersIter::View(i) => i.next().map(|m| &m.id),
            MembersIter::Ids(i) => i.next(),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self {
            MembersIter::View(i) => i.size_hint(),
            MembersIter::Ids(i) => i.size_hint(),
        }
    }
}

impl ExactSizeIterator for MembersIter<'_> {}

impl DoubleEndedIterator for MembersIter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        match self {
            MembersIter::View(i) => i.next_back().map(|m| &m.id),
            MembersIter::Ids(i) => i.next_back(),
        }
    }
}

impl<'a> IntoIterator for &'a Members {
    type Item = &'a MemberId;
    type IntoIter = MembersIter<'a>;

    fn into_iter(self) -> MembersIter<'a> {
        self.iter()
    }
}

impl std::ops::Index<usize> for Members {
    type Output = MemberId;

    fn index(&self, i: usize) -> &MemberId {
        self.get(i).expect("member index within the list")
    }
}

impl PartialEq for Members {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Members {}

impl PartialEq<[MemberId]> for Members {
    fn eq(&self, other: &[MemberId]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<Vec<MemberId>> for Members {
    fn eq(&self, other: &Vec<MemberId>) -> bool {
        *self == other[..]
    }
}

impl fmt::Debug for Members {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Default for Members {
    fn default() -> Self {
        Self(MembersRepr::Ids(Arc::new([])))
    }
}

impl From<Arc<[MemberId]>> for Members {
    fn from(ids: Arc<[MemberId]>) -> Self {
        Self(MembersRepr::Ids(ids))
    }
}

impl From<Vec<MemberId>> for Members {
    fn from(ids: Vec<MemberId>) -> Self {
        Self(MembersRepr::Ids(ids.into()))
    }
}

impl FromIterator<MemberId> for Members {
    fn from_iter<I: IntoIterator<Item = MemberId>>(iter: I) -> Self {
        Self(MembersRepr::Ids(iter.into_iter().collect()))
    }
}

/// A membership view of one group.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct View {
    /// Unique id.
    pub id: ViewId,
    /// Members, oldest first. Every member of the view sees the same order.
    /// Shared: a copy of a view (the client's last view of a group, which
    /// the next one given as changes is read against; the session's; an
    /// application's) is a reference count, not n of them, and the list
    /// is freed once, by whoever holds it last.
    pub members: Arc<[ViewMember]>,
    /// Why the view changed.
    pub cause: Cause,
}

impl View {
    /// The member ids in view order.
    pub fn ids(&self) -> impl Iterator<Item = &MemberId> {
        self.members.iter().map(|m| &m.id)
    }

    /// Whether `id` is a member.
    pub fn contains(&self, id: &MemberId) -> bool {
        self.members.iter().any(|m| &m.id == id)
    }

    /// Position of `id` in the member list.
    pub fn position(&self, id: &MemberId) -> Option<usize> {
        self.members.iter().position(|m| &m.id == id)
    }

    /// The entry for `id`.
    pub fn member(&self, id: &MemberId) -> Option<&ViewMember> {
        self.members.iter().find(|m| &m.id == id)
    }

    /// Each member's position, in one pass, or the first name the list
    /// holds twice (a view names every member once).
    pub fn index(&self) -> Result<MemberMap<usize>, MemberId> {
        let mut positions = MemberMap::with_capacity_and_hasher(self.members.len(), NameHasher::default());
        for (i, m) in self.members.iter().enumerate() {
            if positions.insert(m.id.clone(), i).is_some() {
                return Err(m.id.clone());
            }
        }
        Ok(positions)
    }

    /// The members that came to this view from the view of `id` (a
    /// transitional set: they moved together, so they delivered the same
    /// messages in it). One pass over the list, for callers that would
    /// otherwise look each member up in turn.
    pub fn came_from(&self, id: Option<ViewId>) -> std::collections::BTreeSet<&MemberId> {
        match id {
            Some(prev) => self.members.iter().filter(|m| m.prev == Some(prev)).map(|m| &m.id).collect(),
            None => Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{kept_places, MemberId, ViewMember};

    fn list(names: &str) -> Vec<ViewMember> {
        names.chars().map(|c| ViewMember { id: MemberId::new(c.to_string()).unwrap(), prev: None }).collect()
    }

    #[test]
    fn kept_places_walks_a_view_that_keeps_the_order() {
        // Two gone, two newcomers after those that stay.
        assert_eq!(kept_places(&list("abcde"), &list("acexy")), (vec![Some(0), None, Some(1), None, Some(2)], 3));
        // Nobody kept; nobody new.
        assert_eq!(kept_places(&list("ab"), &list("xy")), (vec![None, None], 0));
        assert_eq!(kept_places(&list("ab"), &list("ab")), (vec![Some(0), Some(1)], 2));
        // b stays but stands after c: taken as gone, and b is after the count.
        assert_eq!(kept_places(&list("abc"), &list("acb")), (vec![Some(0), None, Some(1)], 2));
    }

    #[test]
    fn names_compare_by_text_whether_or_not_they_share_an_allocation() {
        let a = MemberId::new("alice").unwrap();
        let (also_a, b) = (MemberId::new("alice").unwrap(), MemberId::new("bob").unwrap());
        assert!(!std::sync::Arc::ptr_eq(&a.0, &also_a.0));
        assert_eq!(a, a.clone());
        assert_eq!(a, also_a);
        assert_ne!(a, b);
        assert_eq!(a.cmp(&a.clone()), std::cmp::Ordering::Equal);
        assert_eq!(a.cmp(&also_a), std::cmp::Ordering::Equal);
        assert_eq!(a.cmp(&b), std::cmp::Ordering::Less);
        assert_eq!(b.partial_cmp(&a), Some(std::cmp::Ordering::Greater));
    }

    #[test]
    fn a_whole_views_members_share_its_list_and_equal_the_same_names_held_apart() {
        let id = |n: &str| MemberId::new(n).unwrap();
        let view = View {
            id: ViewId::new(1, 2),
            members: vec![ViewMember { id: id("a"), prev: None }, ViewMember { id: id("b"), prev: None }].into(),
            cause: Cause::Join,
        };
        let before = std::sync::Arc::strong_count(&view.members);
        let whole = Members::of_view(&view);
        assert_eq!(std::sync::Arc::strong_count(&view.members), before + 1, "shared, not copied");
        let apart: Members = vec![id("a"), id("b")].into();
        assert!(whole.is_list_of(&view) && !apart.is_list_of(&view));
        let copy = View { members: view.members.to_vec().into(), ..view.clone() };
        assert!(!whole.is_list_of(&copy), "the same names in another list");
        assert_eq!(whole, apart);
        assert_eq!(whole, vec![id("a"), id("b")]);
        assert_ne!(whole, Members::from(vec![id("b"), id("a")]));
        assert_ne!(whole, Members::from(vec![id("a")]));
        assert_eq!((whole.len(), whole.first(), whole.get(2)), (2, Some(&id("a")), None));
        assert_eq!(&whole[1], &id("b"));
        assert!(whole.contains(&id("b")) && !whole.contains(&id("c")));
        assert_eq!(whole.position(&id("b")), Some(1));
        assert_eq!(whole.iter().rev().cloned().collect::<Vec<_>>(), vec![id("b"), id("a")]);
        assert_eq!(format!("{whole:?}"), format!("{apart:?}"));
        assert!(Members::default().is_empty());
    }

    #[test]
    fn a_name_read_again_is_the_one_held_and_a_bad_one_is_refused() {
        let mut names = NameCache::default();
        let a = names.name("alice").unwrap();
        let again = names.name("alice").unwrap();
        assert!(std::sync::Arc::ptr_eq(&a.0, &again.0), "held, not allocated again");
        assert_eq!(names.name("bad name"), Err(NameError::BadCharacter));
        assert_eq!(names.name(""), Err(NameError::Empty));
        // Bounded: past the limit it starts afresh.
        for i in 0..NameCache::MAX + 1 {
            names.name(&format!("m{i}")).unwrap();
        }
        assert!(names.names.len() <= NameCache::MAX);
        let fresh = names.name("alice").unwrap();
        assert!(!std::sync::Arc::ptr_eq(&a.0, &fresh.0) && a == fresh);
    }

    use super::*;

    #[test]
    fn ascii_names_follow_the_character_rule() {
        for b in 0u8..128 {
            let c = b as char;
            let name = format!("a{c}b");
            let allowed = !(c.is_control() || c.is_whitespace());
            assert_eq!(MemberId::from_name(&name).is_ok(), allowed, "byte {b:#x}");
            assert_eq!(MemberId::new(name).is_ok(), allowed, "byte {b:#x}");
        }
        assert!(MemberId::from_name("é\u{2003}").is_err(), "a non-ASCII space");
        assert!(MemberId::from_name("gruß").is_ok());
    }

    #[test]
    fn index_finds_each_position_or_a_name_held_twice() {
        let m = |id: &str| ViewMember { id: MemberId::new(id).unwrap(), prev: None };
        let mut view = View { id: ViewId::new(0, 1), members: vec![m("a"), m("b"), m("c")].into(), cause: Cause::Join };
        let idx = view.index().unwrap();
        assert_eq!((idx[&m("a").id], idx[&m("c").id], idx.len()), (0, 2, 3));
        view.members = view.members.iter().cloned().chain([m("b")]).collect();
        assert_eq!(view.index().unwrap_err(), m("b").id);
    }

    #[test]
    fn came_from_is_the_transitional_set_of_a_view() {
        let m = |id: &str, prev: Option<u64>| ViewMember {
            id: MemberId::new(id).unwrap(),
            prev: prev.map(|p| ViewId::new(0, p)),
        };
        let view = View {
            id: ViewId::new(0, 9),
            members: vec![m("a", Some(7)), m("b", Some(8)), m("c", None), m("d", Some(7))].into(),
            cause: Cause::Network,
        };
        let names = |id| view.came_from(id).into_iter().map(|m| m.as_str().to_string()).collect::<Vec<_>>();
        assert_eq!(names(Some(ViewId::new(0, 7))), ["a", "d"]);
        assert_eq!(names(Some(ViewId::new(0, 8))), ["b"]);
        assert!(view.came_from(Some(ViewId::new(0, 1))).is_empty());
        assert!(view.came_from(None).is_empty(), "newcomers share no state with anyone");
    }
}
