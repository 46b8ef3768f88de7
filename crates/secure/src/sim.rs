//! The secure stack from one seed: real [`SessionCore`]s as clients of a
//! real daemon core, in virtual time, with an attacker (TigerBeetle's VOPR is
//! the model; `conclave sim` is its command).
//!
//! One seed drives everything: which members join, leave, send or crash,
//! when the daemon restarts (a new incarnation; every connection is lost and
//! members come back over new ones), in which order each client's
//! deliveries are handled (interleaved with everything else, so views
//! cascade), and what the attacker does. The attacker taps every payload the
//! daemon delivers, in every daemon lifetime, and injects into a member's
//! connection — as a compromised link or daemon could — recorded payloads
//! of earlier views and lifetimes, replays under other senders' names, and
//! tampered copies. After every injection the member must show no new view
//! and no new message; at the end, with everything delivered:
//!
//! * every member of the group holds the daemon's current view as a secure
//!   view, and all hold the same key (no one stuck, no split);
//! * no epoch ever had two keys, and no key served two epochs;
//! * every data message was delivered at most once to each member, with the
//!   sender who wrote it (the text names it), and members that shared an
//!   epoch delivered the same messages in it; every message a member sent and
//!   stayed for came back to it.
//!
//! Not yet covered (see the README): certified members, several daemons
//! with partitions and merges (`conclave_gcs::daemon_sim`), network loss.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, Limits, Op, Output, Service};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_gka::suite::{generate_signer, SignatureId, Signer};
use conclave_gka::{Epoch, GroupId, ProtocolId, StaticDirectory};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use sha2::{Digest, Sha256};

use crate::core::{SessionCore, Transmit};
use crate::{Policy, SecureEvent};

/// What one run does.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// The group's protocol.
    pub protocol: ProtocolId,
    /// How many member names there are (each may come and go).
    pub members: usize,
    /// How many actions the seed chooses before everything settles.
    pub steps: usize,
}

/// What a run saw, and what went wrong.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Secure views delivered (summed over members).
    pub views: u64,
    /// Key confirmations that failed and were rekeyed (summed over members;
    /// with only honest members, each is also a failure).
    pub rekeys: u64,
    /// Data messages delivered (summed over members).
    pub messages: u64,
    /// Attacker injections tried.
    pub attacks: u64,
    /// Failures by kind, with the first description of each.
    pub failures: BTreeMap<&'static str, (u64, String)>,
    /// A hash of every event every member delivered, in order.
    pub trace_hash: [u8; 32],
}

impl Outcome {
    fn fail(&mut self, kind: &'static str, what: String) {
        self.failures.entry(kind).or_insert((0, what)).0 += 1;
    }
}

const GROUP: &str = "sim";

struct Live {
    conn: ConnId,
    session: SessionCore,
    inbox: VecDeque<Delivery>,
    /// The daemon view this member last handled.
    view: Option<ViewId>,
    joined: bool,
    /// Texts sent and not yet back, if the member has not left since.
    pending: BTreeSet<String>,
}

struct Slot {
    name: MemberId,
    signer: Arc<dyn Signer>,
    live: Option<Live>,
    /// Every event this member delivered in this connection, for the checks.
    log: Vec<SecureEvent>,
}

struct World {
    cfg: SimConfig,
    rng: ChaCha20Rng,
    base: Instant,
    now: Duration,
    core: Core,
    next_conn: u64,
    directory: Arc<StaticDirectory>,
    slots: Vec<Slot>,
    /// The attacker's recordings: (sender, view delivered in, daemon
    /// lifetime, payload). The attacker counts lifetimes itself (it sees
    /// every connection drop), whatever the view ids say.
    tapped: Vec<(MemberId, ViewId, u32, Bytes)>,
    lifetime: u32,
    /// Epoch → fingerprint and fingerprint → epoch, over the whole run.
    keys: BTreeMap<Epoch, String>,
    epochs_of_key: BTreeMap<String, Epoch>,
    /// (receiver name, epoch) → texts delivered there, over the whole run.
    delivered: BTreeMap<(usize, Epoch), Vec<String>>,
    trace: Sha256,
    sent: u64,
    out: Outcome,
}

/// Runs one seed.
pub fn run(seed: u64, cfg: SimConfig) -> Outcome {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut directory = StaticDirectory::new();
    let mut slots = Vec::new();
    for i in 0..cfg.members {
        let name = MemberId::new(format!("m{i}")).expect("a valid name");
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).expect("Ed25519 keys");
        directory.insert(name.clone(), signer.verifier());
        slots.push(Slot { name, signer, live: None, log: Vec::new() });
    }
    let core = Core::new(DaemonId(0), Limits::default(), rng.next_u64());
    let mut w = World {
        cfg,
        rng,
        // Virtual time starts at an arbitrary instant; only differences
        // reach the sessions and the trace.
        base: Instant::now(),
        now: Duration::ZERO,
        core,
        next_conn: 1,
        directory: Arc::new(directory),
        slots,
        tapped: Vec::new(),
        lifetime: 0,
        keys: BTreeMap::new(),
        epochs_of_key: BTreeMap::new(),
        delivered: BTreeMap::new(),
        trace: Sha256::new(),
        sent: 0,
        out: Outcome::default(),
    };
    for _ in 0..cfg.steps {
        w.step();
    }
    w.settle();
    w.check_settled();
    w.out.trace_hash = w.trace.clone().finalize().into();
    w.out
}

impl World {
    fn pick(&mut self, n: usize) -> usize {
        (self.rng.next_u64() % n as u64) as usize
    }

    fn now(&self) -> Instant {
        self.base + self.now
    }

    fn policy(&self) -> Policy {
        Policy::new(self.cfg.protocol, GroupId::Ristretto255)
    }

    fn step(&mut self) {
        self.now += Duration::from_micros(100 + self.rng.next_u64() % 5_000);
        match self.pick(100) {
            0..=54 => self.deliver_one(),
            55..=66 => self.join_one(),
            67..=71 => self.leave_one(),
            72..=84 => self.send_one(),
            85..=87 => self.crash_one(),
            88 => self.restart(),
            _ => self.attack(),
        }
    }

    /// Applies an operation at the daemon and queues what it delivers.
    fn submit(&mut self, op: Op) {
        let mut out = Vec::new();
        self.core.handle(op, &mut out);
        for o in out {
            let Output::Deliver { to, delivery } = o else { continue };
            if let Delivery::Message { sender, view, payload, .. } | Delivery::Unicast { sender, view, payload, .. } =
                &delivery
            {
                self.tapped.push((sender.clone(), *view, self.lifetime, payload.clone()));
            }
            for c in to {
                if let Some(l) = self.slots.iter_mut().filter_map(|s| s.live.as_mut()).find(|l| l.conn == c) {
                    l.inbox.push_back(delivery.clone());
                }
            }
        }
    }

    /// Moves what member `i`'s session wants sent to the daemon, and what it
    /// delivered to its log.
    fn drain(&mut self, i: usize) -> Vec<SecureEvent> {
        let Some(l) = self.slots[i].live.as_mut() else { return Vec::new() };
        let conn = l.conn;
        let mut ops = Vec::new();
        while let Some(t) = l.session.poll_transmit() {
            ops.push(match t {
                Transmit::Join(group) => Op::Join { conn, group, open: false },
                Transmit::Leave(group) => Op::Leave { conn, group },
                Transmit::Multicast(group, payload) => Op::Multicast { conn, group, service: Service::Agreed, payload },
                Transmit::Unicast(group, to, payload) => Op::Unicast { conn, group, to, payload },
            });
        }
        let mut events = Vec::new();
        while let Some(e) = l.session.poll_event() {
            events.push(e);
        }
        for op in ops {
            self.submit(op);
        }
        for e in &events {
            self.record(i, e);
        }
        events
    }

    fn record(&mut self, i: usize, e: &SecureEvent) {
        self.trace.update(format!("{i}:{e:?}\n").as_bytes());
        let name = self.slots[i].name.clone();
        match e {
            SecureEvent::View(v) => {
                self.out.views += 1;
                let fp = v.fingerprint.clone();
                if let Some(old) = self.keys.insert(v.epoch, fp.clone()) {
                    if old != fp {
                        self.out.fail("key split", format!("epoch {} has keys {old} and {fp}", v.epoch));
                    }
                }
                if let Some(other) = self.epochs_of_key.insert(fp.clone(), v.epoch) {
                    if other != v.epoch {
                        self.out.fail("key reused", format!("key {fp} in epochs {other} and {}", v.epoch));
                    }
                }
            }
            SecureEvent::Message { sender, epoch, data, .. } => {
                self.out.messages += 1;
                let text = String::from_utf8_lossy(data).into_owned();
                if !text.starts_with(&format!("{sender}:")) {
                    self.out.fail("misattributed", format!("{name} got {text:?} as from {sender}"));
                }
                let seen = self.delivered.entry((i, *epoch)).or_default();
                if seen.contains(&text) {
                    self.out.fail("duplicated", format!("{name} got {text:?} twice in {epoch}"));
                }
                seen.push(text.clone());
                if *sender == name {
                    if let Some(l) = self.slots[i].live.as_mut() {
                        l.pending.remove(&text);
                    }
                }
            }
            SecureEvent::KeyMismatch { epoch, unconfirmed, .. } => {
                // Every member here is honest: no confirmation may fail.
                self.out.rekeys += 1;
                self.out.fail("key mismatch", format!("{name}: {unconfirmed:?} did not confirm {epoch}"));
            }
            SecureEvent::Left { .. } => {
                if let Some(l) = self.slots[i].live.as_mut() {
                    l.joined = false;
                }
            }
            _ => {}
        }
        self.slots[i].log.push(e.clone());
    }

    fn deliver_one(&mut self) {
        let busy: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].live.as_ref().is_some_and(|l| !l.inbox.is_empty()))
            .collect();
        if busy.is_empty() {
            return;
        }
        let i = busy[self.pick(busy.len())];
        self.deliver_to(i);
    }

    fn deliver_to(&mut self, i: usize) {
        let now = self.now();
        let Some(l) = self.slots[i].live.as_mut() else { return };
        let Some(d) = l.inbox.pop_front() else { return };
        if let Delivery::View { view, .. } = &d {
            l.view = Some(view.id);
        }
        if let Err(e) = l.session.handle_delivery(now, d) {
            self.out.fail("session error", format!("{}: {e}", self.slots[i].name));
        }
        self.drain(i);
    }

    fn join_one(&mut self) {
        let i = self.pick(self.slots.len());
        let now = self.now();
        if self.slots[i].live.is_none() {
            let conn = ConnId { daemon: DaemonId(0), local: self.next_conn };
            self.next_conn += 1;
            let rng = Box::new(ChaCha20Rng::seed_from_u64(self.rng.next_u64()));
            let s = &self.slots[i];
            let session = SessionCore::new(s.name.clone(), s.signer.clone(), self.directory.clone(), rng, now);
            let name = s.name.clone();
            self.slots[i].live = Some(Live {
                conn,
                session,
                inbox: VecDeque::new(),
                view: None,
                joined: false,
                pending: BTreeSet::new(),
            });
            self.slots[i].log.clear();
            self.submit(Op::Connect { conn, name });
        }
        let policy = self.policy();
        let Some(l) = self.slots[i].live.as_mut() else { return };
        if l.joined {
            return;
        }
        if l.session.join(now, GROUP, policy).is_ok() {
            l.joined = true;
        }
        self.drain(i);
    }

    fn leave_one(&mut self) {
        let i = self.pick(self.slots.len());
        let now = self.now();
        let Some(l) = self.slots[i].live.as_mut().filter(|l| l.joined) else { return };
        if l.session.leave(now, GROUP).is_ok() {
            l.pending.clear(); // waiting messages are dropped on a leave
        }
        self.drain(i);
    }

    fn send_one(&mut self) {
        let i = self.pick(self.slots.len());
        let now = self.now();
        self.sent += 1;
        let text = format!("{}:{}", self.slots[i].name, self.sent);
        let Some(l) = self.slots[i].live.as_mut().filter(|l| l.joined) else { return };
        if l.session.send(now, GROUP, text.as_bytes()).is_ok() {
            l.pending.insert(text);
        }
        self.drain(i);
    }

    fn crash_one(&mut self) {
        let i = self.pick(self.slots.len());
        if let Some(l) = self.slots[i].live.take() {
            self.submit(Op::Disconnect { conn: l.conn });
        }
    }

    /// The daemon restarts: a new incarnation, every connection lost.
    fn restart(&mut self) {
        for s in &mut self.slots {
            s.live = None;
        }
        self.core = Core::new(DaemonId(0), Limits::default(), self.rng.next_u64());
        self.lifetime += 1;
        self.trace.update(b"restart\n");
    }

    /// Injects a recorded, re-attributed or tampered payload into a member's
    /// connection: it must change nothing the application can see.
    fn attack(&mut self) {
        let live: Vec<usize> = (0..self.slots.len()).filter(|&i| self.slots[i].live.is_some()).collect();
        if live.is_empty() || self.tapped.is_empty() {
            return;
        }
        let i = live[self.pick(live.len())];
        let t = self.pick(self.tapped.len());
        let (sender, made_in, lifetime, payload) = self.tapped[t].clone();
        let Some(current) = self.slots[i].live.as_ref().and_then(|l| l.view) else { return };
        let mut payload = payload.to_vec();
        let (sender, how) = match self.pick(3) {
            // A replay of an earlier view or an earlier daemon lifetime, as it
            // was. (A payload of a later view than the member has handled is
            // still on its way to it: delivering it early is no replay.)
            0 if lifetime != self.lifetime || made_in.seq < current.seq => (sender, "replayed"),
            // Someone else's payload under another member's name.
            1 => {
                let o = self.pick(self.slots.len());
                let other = self.slots[o].name.clone();
                if other == sender {
                    return;
                }
                (other, "re-attributed")
            }
            // A tampered copy.
            _ => {
                if payload.len() < 2 {
                    return;
                }
                let at = 1 + self.pick(payload.len() - 1);
                payload[at] ^= 1 << self.pick(8);
                (sender, "tampered")
            }
        };
        self.out.attacks += 1;
        let now = self.now();
        let group = GroupName::new(GROUP).expect("a valid name");
        let d = Delivery::Message { group, sender, service: Service::Agreed, view: current, payload: payload.into() };
        let l = self.slots[i].live.as_mut().expect("chosen live");
        if let Err(e) = l.session.handle_delivery(now, d) {
            self.out.fail("session error", format!("{}: {e}", self.slots[i].name));
        }
        let events = self.drain(i);
        if events.iter().any(|e| matches!(e, SecureEvent::View(_) | SecureEvent::Message { .. })) {
            self.out.fail("accepted forgery", format!("{} accepted a {how} payload: {events:?}", self.slots[i].name));
        }
    }

    /// Delivers everything still queued (bounded: a run that never settles
    /// is a failure of its own).
    fn settle(&mut self) {
        for _ in 0..200_000 {
            let busy: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].live.as_ref().is_some_and(|l| !l.inbox.is_empty()))
                .collect();
            if busy.is_empty() {
                return;
            }
            for i in busy {
                self.deliver_to(i);
            }
        }
        self.out.fail("stuck", "deliveries never ran out".into());
    }

    fn check_settled(&mut self) {
        let group = GroupName::new(GROUP).expect("a valid name");
        let Some(view) = self.core.view(&group).cloned() else { return };
        let mut fingerprints = BTreeSet::new();
        for i in 0..self.slots.len() {
            let Some(l) = self.slots[i].live.as_ref() else { continue };
            if !view.contains(&self.slots[i].name) {
                continue;
            }
            let last = self.slots[i].log.iter().rev().find_map(|e| match e {
                SecureEvent::View(v) => Some(v.clone()),
                _ => None,
            });
            let name = &self.slots[i].name;
            match last {
                Some(v) if v.epoch.view == view.id && v.members.iter().eq(view.ids()) => {
                    fingerprints.insert(v.fingerprint);
                }
                other => self.out.fail(
                    "stuck",
                    format!("{name} holds {:?}, the daemon's view is {}", other.map(|v| v.epoch), view.id),
                ),
            }
            if !l.pending.is_empty() {
                self.out.fail("lost", format!("{name} never got back {:?}", l.pending));
            }
        }
        if fingerprints.len() > 1 {
            self.out.fail("key split", format!("members of {} hold keys {fingerprints:?}", view.id));
        }
        // Members that delivered an epoch's key and stayed connected through
        // it delivered the same messages in it.
        let mut by_epoch: BTreeMap<Epoch, Vec<(usize, BTreeSet<String>)>> = BTreeMap::new();
        for ((i, epoch), texts) in &self.delivered {
            by_epoch.entry(*epoch).or_default().push((*i, texts.iter().cloned().collect()));
        }
        for (epoch, sets) in by_epoch {
            let holders: Vec<usize> = (0..self.slots.len())
                .filter(|&i| {
                    self.slots[i].live.is_some()
                        && self.slots[i].log.iter().any(|e| matches!(e, SecureEvent::View(v) if v.epoch == epoch))
                })
                .collect();
            let empty = BTreeSet::new();
            let got = |i: usize| sets.iter().find(|(j, _)| *j == i).map_or(&empty, |(_, s)| s);
            if let Some(&first) = holders.first() {
                for &i in &holders[1..] {
                    if got(i) != got(first) {
                        let (a, b) = (&self.slots[first].name, &self.slots[i].name);
                        self.out
                            .fail("virtual synchrony", format!("{a} and {b} delivered different messages in {epoch}"));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_passes_a_few_seeds_and_a_seed_replays_exactly() {
        for protocol in ProtocolId::ALL {
            let cfg = SimConfig { protocol, members: 4, steps: 150 };
            for seed in 0..8 {
                let out = run(seed, cfg);
                assert!(out.failures.is_empty(), "{protocol} seed {seed}: {:?}", out.failures);
                assert_eq!(run(seed, cfg).trace_hash, out.trace_hash, "{protocol} seed {seed} replays differently");
            }
        }
    }
}
