//! The `sim` backbone, first stage: an in-memory, seeded group communication
//! layer for simulated members.
//!
//! It plays what the daemons provide to their clients: views with unique ids
//! and transitional information, agreed-order broadcast within a view, and
//! FIFO unicast, with virtual synchrony at view changes. Every choice it makes
//! (which component delivers next, how much of an interrupted view's traffic
//! gets through) comes from one seeded RNG, so a seed reproduces a run exactly.
//!
//! Virtual synchrony is modelled as Spread does it: when a view changes, the
//! members that move together from one view into the same next view (a
//! *transitional set*) all deliver the same prefix of the old view's pending
//! messages, then the new view. Messages that handlers produce during that
//! flush are cut off by the view change and dropped for everyone.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::view::{Cause, MemberId, View, ViewId, ViewMember};

/// A message a simulated member sends: to one member, or (`to == None`) to
/// every member of its current view, the sender included (as Spread delivers
/// a sender's own multicasts back to it, in order).
#[derive(Clone, Debug)]
pub struct Outgoing<M> {
    /// Recipient of a unicast; `None` broadcasts.
    pub to: Option<MemberId>,
    /// Payload.
    pub msg: M,
}

/// A simulated member: it is fed views and messages and answers with messages.
pub trait SimNode {
    /// What the members send each other.
    type Msg: Clone;
    /// A new view was installed at this member.
    fn on_view(&mut self, view: &View, out: &mut Vec<Outgoing<Self::Msg>>);
    /// A message from `from`, sent in the member's current view.
    fn on_message(&mut self, from: &MemberId, msg: &Self::Msg, out: &mut Vec<Outgoing<Self::Msg>>);
}

/// How much of an interrupted view's pending traffic each transitional set
/// delivers before the next view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flush {
    /// Everything that was sent gets through.
    All,
    /// A random prefix (chosen per transitional set) gets through.
    RandomPrefix,
}

/// Errors from driving the simulation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// The named member does not exist.
    #[error("unknown member {0}")]
    UnknownMember(MemberId),
    /// A member was named twice.
    #[error("member {0} named twice")]
    Duplicate(MemberId),
    /// A member that is in a view was asked to join again.
    #[error("member {0} is already in a group view")]
    AlreadyInView(MemberId),
    /// A member not in any view was used where one was needed.
    #[error("member {0} is not in any view")]
    NotInView(MemberId),
    /// Traffic did not die down: a livelock in the members' protocol.
    #[error("still busy after {0} deliveries")]
    Livelock(u64),
}

/// A message in flight inside one component.
#[derive(Clone, Debug)]
struct InFlight<M> {
    from: MemberId,
    to: Option<MemberId>,
    msg: M,
}

/// A connected component: one view and its pending traffic.
struct Component<M> {
    view: View,
    queue: VecDeque<InFlight<M>>,
}

struct Slot<N> {
    node: N,
    /// Join order; views list members oldest first.
    age: u64,
}

/// One delivered message, as recorded when tracing is on.
#[derive(Clone, Debug)]
pub struct Delivery<M> {
    /// The view the message was sent in.
    pub view: ViewId,
    /// Sender.
    pub from: MemberId,
    /// Unicast recipient, or `None` for a broadcast.
    pub to: Option<MemberId>,
    /// Payload.
    pub msg: M,
}

/// The simulated group communication layer for one group.
pub struct Sim<N: SimNode> {
    rng: ChaCha20Rng,
    /// The incarnation of every view id (the seed: one simulated lifetime).
    incarnation: u64,
    next_view: u64,
    next_age: u64,
    nodes: BTreeMap<MemberId, Slot<N>>,
    components: Vec<Component<N::Msg>>,
    flush: Flush,
    delivered: u64,
    trace: Option<Vec<Delivery<N::Msg>>>,
}

impl<N: SimNode> Sim<N> {
    /// A new, empty simulation whose every choice derives from `seed`.
    pub fn new(seed: u64, flush: Flush) -> Self {
        Self {
            rng: ChaCha20Rng::seed_from_u64(seed),
            incarnation: seed,
            next_view: 1,
            next_age: 0,
            nodes: BTreeMap::new(),
            components: Vec::new(),
            flush,
            delivered: 0,
            trace: None,
        }
    }

    /// Records every message sent from now on (see [`Sim::trace`]).
    pub fn enable_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// Every message sent while tracing was on, including ones a view change
    /// cut off: an eavesdropper sees them all.
    pub fn trace(&self) -> &[Delivery<N::Msg>] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Registers a member that is not yet in any view.
    pub fn add_node(&mut self, id: MemberId, node: N) -> Result<(), SimError> {
        if self.nodes.contains_key(&id) {
            return Err(SimError::Duplicate(id));
        }
        let age = self.next_age;
        self.next_age += 1;
        self.nodes.insert(id, Slot { node, age });
        Ok(())
    }

    /// The member's node.
    pub fn node(&self, id: &MemberId) -> Option<&N> {
        self.nodes.get(id).map(|s| &s.node)
    }

    /// The member's node, mutably.
    pub fn node_mut(&mut self, id: &MemberId) -> Option<&mut N> {
        self.nodes.get_mut(id).map(|s| &mut s.node)
    }

    /// All registered members and their nodes.
    pub fn nodes(&self) -> impl Iterator<Item = (&MemberId, &N)> {
        self.nodes.iter().map(|(id, s)| (id, &s.node))
    }

    /// The current views, one per connected component.
    pub fn views(&self) -> Vec<&View> {
        self.components.iter().map(|c| &c.view).collect()
    }

    /// The view `id` is in, if any.
    pub fn view_of(&self, id: &MemberId) -> Option<&View> {
        self.components.iter().map(|c| &c.view).find(|v| v.contains(id))
    }

    /// Messages delivered so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }

    /// Whether any message is still pending.
    pub fn busy(&self) -> bool {
        self.components.iter().any(|c| !c.queue.is_empty())
    }

    /// The simulation's RNG, for drivers that want seeded choices of their own.
    pub fn rng(&mut self) -> &mut ChaCha20Rng {
        &mut self.rng
    }

    fn component_index(&self, id: &MemberId) -> Option<usize> {
        self.components.iter().position(|c| c.view.contains(id))
    }

    /// `joiners` (not in any view) join the component of `existing`, or form
    /// a new group together if `existing` is `None`.
    pub fn join(&mut self, joiners: &[MemberId], existing: Option<&MemberId>) -> Result<(), SimError> {
        let mut group: Vec<MemberId> = match existing {
            Some(e) => {
                let c = self.component_index(e).ok_or_else(|| SimError::NotInView(e.clone()))?;
                self.components[c].view.ids().cloned().collect()
            }
            None => Vec::new(),
        };
        for j in joiners {
            if !self.nodes.contains_key(j) {
                return Err(SimError::UnknownMember(j.clone()));
            }
            if self.component_index(j).is_some() {
                return Err(SimError::AlreadyInView(j.clone()));
            }
            group.push(j.clone());
        }
        self.reconfigure(vec![group], Cause::Join)
    }

    /// `leavers` leave their views (they may be in different components).
    pub fn leave(&mut self, leavers: &[MemberId]) -> Result<(), SimError> {
        let gone: BTreeSet<&MemberId> = leavers.iter().collect();
        let mut groups = Vec::new();
        for l in leavers {
            let c = self.component_index(l).ok_or_else(|| SimError::NotInView(l.clone()))?;
            let rest: Vec<MemberId> = self.components[c].view.ids().filter(|m| !gone.contains(m)).cloned().collect();
            if !groups.contains(&rest) {
                groups.push(rest);
            }
        }
        groups.retain(|g| !g.is_empty());
        // A component that lost everyone still has to be torn down.
        self.reconfigure_with_departures(groups, leavers, Cause::Leave)
    }

    /// Splits the component of `parts[0][0]` into the given parts (which must
    /// cover it exactly) as a network partition.
    pub fn partition(&mut self, parts: Vec<Vec<MemberId>>) -> Result<(), SimError> {
        self.reconfigure(parts, Cause::Network)
    }

    /// Merges the components of `a` and `b` as a network heal.
    pub fn merge(&mut self, a: &MemberId, b: &MemberId) -> Result<(), SimError> {
        let ca = self.component_index(a).ok_or_else(|| SimError::NotInView(a.clone()))?;
        let cb = self.component_index(b).ok_or_else(|| SimError::NotInView(b.clone()))?;
        let mut group: Vec<MemberId> = self.components[ca].view.ids().cloned().collect();
        if ca != cb {
            group.extend(self.components[cb].view.ids().cloned());
        }
        self.reconfigure(vec![group], Cause::Network)
    }

    /// Installs new views: each entry of `groups` becomes one component.
    /// Members of touched components that appear in no group depart.
    pub fn reconfigure(&mut self, groups: Vec<Vec<MemberId>>, cause: Cause) -> Result<(), SimError> {
        self.reconfigure_with_departures(groups, &[], cause)
    }

    fn reconfigure_with_departures(
        &mut self,
        groups: Vec<Vec<MemberId>>,
        departing: &[MemberId],
        cause: Cause,
    ) -> Result<(), SimError> {
        // Validate and find the touched components.
        let mut seen = BTreeSet::new();
        let mut touched = BTreeSet::new();
        for g in &groups {
            for m in g {
                if !self.nodes.contains_key(m) {
                    return Err(SimError::UnknownMember(m.clone()));
                }
                if !seen.insert(m.clone()) {
                    return Err(SimError::Duplicate(m.clone()));
                }
                if let Some(c) = self.component_index(m) {
                    touched.insert(c);
                }
            }
        }
        for d in departing {
            if let Some(c) = self.component_index(d) {
                touched.insert(c);
            }
        }
        // Flush: every transitional set delivers a common prefix of its old
        // component's pending messages.
        for &c in &touched {
            for g in &groups {
                let set: Vec<MemberId> = g.iter().filter(|m| self.components[c].view.contains(m)).cloned().collect();
                if set.is_empty() {
                    continue;
                }
                let pending = self.components[c].queue.len();
                let k = match self.flush {
                    Flush::All => pending,
                    Flush::RandomPrefix => (self.rng.next_u64() % (pending as u64 + 1)) as usize,
                };
                let msgs: Vec<InFlight<N::Msg>> = self.components[c].queue.iter().take(k).cloned().collect();
                for m in msgs {
                    for r in &set {
                        if Self::addressed_to(&m, r) {
                            let slot = self.nodes.get_mut(r).expect("member exists");
                            let mut cut_off = Vec::new();
                            slot.node.on_message(&m.from, &m.msg, &mut cut_off);
                            self.delivered += 1;
                            // Cut off by the view change: traced, never delivered.
                            Self::sent(&mut self.trace, &self.components[c].view, r, cut_off);
                        }
                    }
                }
            }
        }
        // Tear down the touched components and install the new views.
        let old_views: BTreeMap<MemberId, ViewId> = touched
            .iter()
            .flat_map(|&c| self.components[c].view.ids().map(move |m| (m.clone(), c)))
            .map(|(m, c)| (m, self.components[c].view.id))
            .collect();
        let mut keep = Vec::new();
        for (i, c) in self.components.drain(..).enumerate() {
            if !touched.contains(&i) {
                keep.push(c);
            }
        }
        self.components = keep;
        for g in groups {
            if g.is_empty() {
                continue;
            }
            let mut members: Vec<ViewMember> =
                g.iter().map(|m| ViewMember { id: m.clone(), prev: old_views.get(m).copied() }).collect();
            members.sort_by_key(|m| self.nodes[&m.id].age);
            let view = View { id: ViewId::new(self.incarnation, self.next_view), members: members.into(), cause };
            self.next_view += 1;
            let mut queue = VecDeque::new();
            for m in view.ids() {
                let mut out = Vec::new();
                self.nodes.get_mut(m).expect("member exists").node.on_view(&view, &mut out);
                for o in Self::sent(&mut self.trace, &view, m, out) {
                    queue.push_back(InFlight { from: m.clone(), to: o.to, msg: o.msg });
                }
            }
            self.components.push(Component { view, queue });
        }
        Ok(())
    }

    fn addressed_to(m: &InFlight<N::Msg>, r: &MemberId) -> bool {
        match &m.to {
            Some(to) => to == r,
            None => true,
        }
    }

    /// What a member sent in `view`: records all of it in the trace (an
    /// eavesdropper sees everything) and drops unicasts to non-members, as the
    /// daemon would.
    fn sent(
        trace: &mut Option<Vec<Delivery<N::Msg>>>,
        view: &View,
        from: &MemberId,
        out: Vec<Outgoing<N::Msg>>,
    ) -> Vec<Outgoing<N::Msg>> {
        if let Some(trace) = trace.as_mut() {
            for o in &out {
                trace.push(Delivery { view: view.id, from: from.clone(), to: o.to.clone(), msg: o.msg.clone() });
            }
        }
        out.into_iter().filter(|o| o.to.as_ref().is_none_or(|t| view.contains(t))).collect()
    }

    /// Delivers one pending message (from a component chosen by the seeded
    /// RNG). Returns false when nothing is pending.
    pub fn step(&mut self) -> bool {
        let busy: Vec<usize> = (0..self.components.len()).filter(|&i| !self.components[i].queue.is_empty()).collect();
        if busy.is_empty() {
            return false;
        }
        let c = busy[(self.rng.next_u64() % busy.len() as u64) as usize];
        // Disjoint borrows: the component's view is read while its queue and
        // the members change (no copy of the view per delivery).
        let Sim { nodes, components, trace, delivered, .. } = self;
        let Component { view, queue } = &mut components[c];
        let m = queue.pop_front().expect("non-empty");
        for r in view.ids() {
            if Self::addressed_to(&m, r) {
                let mut out = Vec::new();
                nodes.get_mut(r).expect("member exists").node.on_message(&m.from, &m.msg, &mut out);
                *delivered += 1;
                for o in Self::sent(trace, view, r, out) {
                    queue.push_back(InFlight { from: r.clone(), to: o.to, msg: o.msg });
                }
            }
        }
        true
    }

    /// Delivers up to `n` messages; returns how many were delivered.
    pub fn run_steps(&mut self, n: usize) -> usize {
        let mut done = 0;
        while done < n && self.step() {
            done += 1;
        }
        done
    }

    /// Takes every pending message out of the components' queues, in queue
    /// order, for a driver that schedules delivery itself (the timed
    /// benchmarks). Each entry is (view, sender, unicast recipient, message).
    pub fn take_pending(&mut self) -> Vec<Delivery<N::Msg>> {
        let mut out = Vec::new();
        for c in &mut self.components {
            let view = c.view.id;
            out.extend(c.queue.drain(..).map(|m| Delivery { view, from: m.from, to: m.to, msg: m.msg }));
        }
        out
    }

    /// Delivers one message to one member directly and returns what it sends
    /// in reply, for a driver that schedules delivery itself. The member must
    /// be in the view the message was sent in.
    pub fn deliver_to(&mut self, to: &MemberId, d: &Delivery<N::Msg>) -> Result<Vec<Outgoing<N::Msg>>, SimError> {
        let c = self.component_index(to).ok_or_else(|| SimError::NotInView(to.clone()))?;
        let Sim { nodes, components, trace, delivered, .. } = self;
        let view = &components[c].view;
        if view.id != d.view {
            return Err(SimError::NotInView(to.clone()));
        }
        let mut out = Vec::new();
        nodes
            .get_mut(to)
            .ok_or_else(|| SimError::UnknownMember(to.clone()))?
            .node
            .on_message(&d.from, &d.msg, &mut out);
        *delivered += 1;
        Ok(Self::sent(trace, view, to, out))
    }

    /// Delivers until nothing is pending, or fails after `limit` deliveries.
    pub fn run(&mut self, limit: u64) -> Result<(), SimError> {
        let start = self.delivered;
        while self.step() {
            if self.delivered - start > limit {
                return Err(SimError::Livelock(limit));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records what it sees; on a view it broadcasts its name once, and it
    /// echoes each broadcast back to the sender as a unicast.
    struct Echo {
        me: MemberId,
        views: Vec<View>,
        got: Vec<(MemberId, String)>,
    }

    impl SimNode for Echo {
        type Msg = String;
        fn on_view(&mut self, view: &View, out: &mut Vec<Outgoing<String>>) {
            self.views.push(view.clone());
            out.push(Outgoing { to: None, msg: format!("hello in {}", view.id) });
        }
        fn on_message(&mut self, from: &MemberId, msg: &String, out: &mut Vec<Outgoing<String>>) {
            self.got.push((from.clone(), msg.clone()));
            if msg.starts_with("hello") && from != &self.me {
                out.push(Outgoing { to: Some(from.clone()), msg: format!("ack {msg}") });
            }
        }
    }

    fn id(s: &str) -> MemberId {
        MemberId::new(s).unwrap()
    }

    fn sim(seed: u64, n: usize, flush: Flush) -> Sim<Echo> {
        let mut s = Sim::new(seed, flush);
        for i in 0..n {
            let me = id(&format!("m{i}"));
            s.add_node(me.clone(), Echo { me, views: Vec::new(), got: Vec::new() }).unwrap();
        }
        s
    }

    #[test]
    fn views_are_ordered_by_age_and_carry_previous_view() {
        let mut s = sim(1, 4, Flush::All);
        s.join(&[id("m2"), id("m0")], None).unwrap();
        s.run(1000).unwrap();
        s.join(&[id("m1")], Some(&id("m0"))).unwrap();
        let v = s.view_of(&id("m1")).unwrap().clone();
        assert_eq!(v.ids().map(|m| m.as_str()).collect::<Vec<_>>(), ["m0", "m1", "m2"]);
        assert_eq!(v.member(&id("m1")).unwrap().prev, None);
        assert_eq!(v.member(&id("m0")).unwrap().prev, Some(ViewId::new(1, 1)));
        assert_eq!(v.cause, Cause::Join);
    }

    #[test]
    fn every_member_gets_every_broadcast_and_its_unicasts() {
        let mut s = sim(2, 3, Flush::All);
        s.join(&[id("m0"), id("m1"), id("m2")], None).unwrap();
        s.run(1000).unwrap();
        for (me, node) in s.nodes() {
            let hellos = node.got.iter().filter(|(_, m)| m.starts_with("hello")).count();
            let acks = node.got.iter().filter(|(_, m)| m.starts_with("ack")).count();
            assert_eq!(hellos, 3, "{me}: two others and its own");
            assert_eq!(acks, 2, "{me}");
        }
    }

    #[test]
    fn a_transitional_set_delivers_one_common_prefix() {
        for seed in 0..50 {
            let mut s = sim(seed, 6, Flush::RandomPrefix);
            let all: Vec<MemberId> = (0..6).map(|i| id(&format!("m{i}"))).collect();
            s.join(&all, None).unwrap();
            s.run_steps(3);
            s.partition(vec![all[..3].to_vec(), all[3..].to_vec()]).unwrap();
            for side in [&all[..3], &all[3..]] {
                // Members of one side saw the same old-view broadcasts.
                let sets: Vec<BTreeSet<String>> = side
                    .iter()
                    .map(|m| {
                        let node = s.node(m).unwrap();
                        let mut set: BTreeSet<String> = node
                            .got
                            .iter()
                            .filter(|(_, msg)| msg.starts_with("hello in v1"))
                            .map(|(f, _)| f.to_string())
                            .collect();
                        set.insert(m.to_string());
                        set
                    })
                    .collect();
                // A sender's own message is never delivered to itself, so
                // each member's set has itself added; beyond that, the sets agree.
                let common: BTreeSet<String> = sets.iter().cloned().reduce(|a, b| &a & &b).unwrap();
                for (m, set) in side.iter().zip(&sets) {
                    let extra: Vec<_> = set.difference(&common).filter(|x| *x != m.as_str()).collect();
                    assert!(extra.is_empty(), "seed {seed}: {m} saw {extra:?} that others of its side did not");
                }
            }
        }
    }

    #[test]
    fn same_seed_same_run() {
        let run = |seed| {
            let mut s = sim(seed, 5, Flush::RandomPrefix);
            let all: Vec<MemberId> = (0..5).map(|i| id(&format!("m{i}"))).collect();
            s.join(&all, None).unwrap();
            s.run_steps(4);
            s.leave(&[all[1].clone()]).unwrap();
            s.run(10_000).unwrap();
            s.nodes().map(|(_, n)| n.got.clone()).collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
    }
}
