//! `bench integrated --engine sim`: Figures 5 and 6 on simulated daemons, in
//! virtual time.
//!
//! The daemons are `conclave_gcs::daemon_sim::DaemonSim`'s (the real daemon
//! core on a simulated LAN, `NetConfig::default()`), 13 by default as the
//! paper's testbed: plain cores for the layered architecture (it has no
//! daemons' key), keyed daemons for the integrated one
//! ([`super::metered`]: `KeyedDaemon`s whose cryptography is charged to a
//! CPU of their own). Every member is a real `conclave_secure::SessionCore`
//! (the sans-IO core of the secure session an application uses) on a
//! connection of its own, member j of a group on daemon (g + j) mod D, so
//! that every group of 13 has one member on each of the 13 daemons, as the
//! paper's clients are "uniformly distributed" (§5.1).
//!
//! # Cost model
//! Every delivery goes to the member's session; what the session's key
//! agreement engine did (the deltas of its meter: exponentiations,
//! signatures, verifications) and each key confirmation it sent (one
//! signature) are charged at [`OpCosts`] to the CPU of the member's machine,
//! which all members on that daemon's machine share: a reaction waits for
//! the reactions before it. A daemon's cryptography is charged to the daemon
//! ([`super::metered`]). Nothing else a session does is charged (data keys
//! are derived with HKDF, far below an exponentiation). With
//! `--free-confirmations` the layered members' key confirmation signatures
//! cost nothing: the paper's Secure Spread confirmed no key.
//!
//! # What is timed
//! From the event — a join or leave request, or the daemons' installation of
//! their new configuration after a partition or a merge (the simulated
//! detection, 2 s, is not counted: it is the same for both architectures and
//! both figures of the paper time the key management) — until the last
//! member concerned:
//! * **membership**: has the daemons' new view of its group (layered run;
//!   the daemons hold a keyed group's view until its key is there);
//! * **keyed**: holds the new view's key: its session has installed it (the
//!   reaction in which it sends its key confirmation, on its machine's CPU,
//!   up to the confirmation's signature). This is the paper's measure, and
//!   the target;
//! * **confirmed**: shows the new secure view. A layered member shows it
//!   when every member's key confirmation has come back (Conclave's layered
//!   sessions confirm every key; the paper's Secure Spread did not); an
//!   integrated member when it holds the key, since the daemons confirmed
//!   the daemons' key it is derived from among themselves before keying any
//!   view with it (`conclave_integrated`, one signature per daemon per key,
//!   charged to the daemons like their key agreement).
//!
//! Session timers are not run (no honest run here needs one); a member that
//! ends up without the key of its latest view fails the point.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use conclave_gcs::core::{ConnId, Delivery, GroupMode, Op};
use conclave_gcs::daemon_sim::{DaemonSim, Micros, NetConfig, Reaction};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_gka::suite::{generate_signer, SignatureId};
use conclave_gka::{Costs, Directory, StaticDirectory};
use conclave_secure::payload::{parse_payload, tag, ParsedPayload};
use conclave_secure::{Policy, SecureEvent, SessionCore, Transmit};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use super::metered::{keyed_daemons, plain_daemons};
use super::model::OpCosts;
use crate::scenario::TimedEvent;

/// The simulated testbed: how many daemons, and what crypto costs.
#[derive(Clone)]
pub struct Testbed {
    pub daemons: u16,
    pub costs: OpCosts,
    /// Whether the members' key confirmations (one signature per member per
    /// key) cost CPU; without, the model is the paper's Secure Spread, which
    /// confirmed no key.
    pub charge_confirmations: bool,
}

impl Testbed {
    pub fn new(daemons: u16, costs: OpCosts) -> Self {
        Self { daemons, costs, charge_confirmations: true }
    }
}

/// One event, timed (ms after the event).
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    pub membership_ms: f64,
    pub keyed_ms: f64,
    pub confirmed_ms: f64,
}

impl Timing {
    /// The mean of `ts`.
    pub fn mean(ts: &[Timing]) -> Timing {
        let n = ts.len().max(1) as f64;
        Timing {
            membership_ms: ts.iter().map(|t| t.membership_ms).sum::<f64>() / n,
            keyed_ms: ts.iter().map(|t| t.keyed_ms).sum::<f64>() / n,
            confirmed_ms: ts.iter().map(|t| t.confirmed_ms).sum::<f64>() / n,
        }
    }
}

struct Member {
    conn: ConnId,
    group: usize,
    session: SessionCore,
    /// In its group (joined and not left).
    inside: bool,
    /// Its latest daemon view of the group: id, size, when delivered.
    view: Option<(ViewId, usize, Micros)>,
    /// The latest key it installed: the view, and when.
    keyed: Option<(ViewId, Micros)>,
    /// Its latest secure view: view, size, when.
    secured: Option<(ViewId, usize, Micros)>,
    /// Its engine's meter, as last read.
    spent: Costs,
}

/// Everything the deliveries touch.
struct State {
    costs: OpCosts,
    charge_confirmations: bool,
    base: Instant,
    groups: Vec<GroupName>,
    members: Vec<Member>,
    by_conn: HashMap<ConnId, usize>,
    /// When each machine's members' CPU is free.
    cpu_free: Vec<Micros>,
    /// While groups form: deliveries held per member, handed over at once.
    forming: Option<BTreeMap<usize, Vec<Delivery>>>,
    failures: Vec<String>,
}

/// Whether payload `p` is a signed key confirmation or verdict.
fn signed_confirmation(p: &[u8]) -> bool {
    // Only these two are parsed: a key agreement message's parse decodes
    // its elements.
    if !matches!(p.first(), Some(&tag::CONFIRM | &tag::VERDICT)) {
        return false;
    }
    matches!(
        parse_payload(p),
        Ok(ParsedPayload::Confirm { signature_len, .. } | ParsedPayload::Verdict { signature_len, .. })
            if signature_len > 0
    )
}

impl State {
    fn react(&mut self, now: Micros, conn: ConnId, d: &Delivery) -> Reaction {
        let Some(&i) = self.by_conn.get(&conn) else { return Reaction::default() };
        if let Some(held) = self.forming.as_mut() {
            held.entry(i).or_default().push(d.clone());
            return Reaction::default();
        }
        self.deliver(i, now, vec![d.clone()])
    }

    /// Member `i`'s session handles `ds` at `now`; its crypto is charged.
    fn deliver(&mut self, i: usize, now: Micros, ds: Vec<Delivery>) -> Reaction {
        let m = &mut self.members[i];
        for d in &ds {
            if let Delivery::View { view, .. } = d {
                m.view = Some((view.id, view.members.len(), now));
            }
        }
        if let Err(e) = m.session.handle_deliveries(self.base + Duration::from_micros(now), ds) {
            self.failures.push(format!("{}: {e}", m.session.me()));
        }
        let group = &self.groups[m.group];
        let spent = m.session.meter(group.as_str()).map(|x| x.costs).unwrap_or_default();
        let d = spent - m.spent;
        m.spent = spent;
        // Confirmation signatures: a member's confirmation (to the
        // collector) and the collector's verdict, unless unsigned (groups
        // the daemons key).
        let mut ops = Vec::new();
        let mut confirmation_sigs = 0u64;
        while let Some(t) = m.session.poll_transmit() {
            if let Transmit::Unicast(_, _, p) | Transmit::Multicast(_, p) = &t {
                confirmation_sigs += u64::from(signed_confirmation(p));
            }
            ops.push(t.into_op(m.conn));
        }
        let confirmations = if self.charge_confirmations { confirmation_sigs } else { 0 };
        let cpu = self.costs.cpu(d.exps, d.sigs + confirmations, d.verifs, 0);
        let machine = usize::from(m.conn.daemon.0);
        let done = self.cpu_free[machine].max(now) + cpu;
        self.cpu_free[machine] = done;
        if let Some(v) = m.session.confirming_epoch(group.as_str()).map(|e| e.view) {
            // The key is installed before the confirmation is signed; a
            // member holds it from its first installation (a later
            // confirmation of the same view does not move that).
            let signing = self.costs.cpu(0, confirmations, 0, 0);
            if m.keyed.is_none_or(|(k, _)| k != v) {
                m.keyed = Some((v, done - signing.min(cpu)));
            }
        }
        while let Some(e) = m.session.poll_event() {
            match e {
                SecureEvent::View(v) => {
                    // A member alone, or whose verdict came in the delivery
                    // that installed its key, was never seen confirming.
                    if m.keyed.is_none_or(|(k, _)| k != v.epoch.view) {
                        m.keyed = Some((v.epoch.view, done));
                    }
                    m.secured = Some((v.epoch.view, v.members.len(), done))
                }
                SecureEvent::KeyMismatch { epoch, .. } => {
                    self.failures.push(format!("{}: key confirmation failed in {epoch}", m.session.me()))
                }
                SecureEvent::Left { .. } => {
                    (m.view, m.keyed, m.secured) = (None, None, None);
                }
                _ => {}
            }
        }
        Reaction { ops, cpu }
    }
}

/// A simulated testbed with its members.
pub struct World {
    sim: DaemonSim,
    st: State,
    policy: Policy,
    daemons: u16,
}

impl World {
    /// `groups` groups of `size` members (and `spare` more per group, connected
    /// but not joined), with `policy`, on `bed`.
    pub fn new(bed: &Testbed, policy: Policy, groups: usize, size: usize, spare: usize, seed: u64) -> Result<Self> {
        if bed.daemons == 0 || size == 0 {
            bail!("--daemons and the group size must be at least 1");
        }
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let sim = if policy.mode == GroupMode::Keyed {
            keyed_daemons(bed.daemons, bed.costs, rng.next_u64())
        } else {
            plain_daemons(bed.daemons, rng.next_u64())
        };
        let mut directory = StaticDirectory::new();
        let mut ids = Vec::new();
        for g in 0..groups {
            for j in 0..size + spare {
                let name = MemberId::new(format!("g{g}m{j}"))?;
                let signer = generate_signer(SignatureId::Ed25519, &mut rng)?;
                directory.insert(name.clone(), signer.verifier());
                ids.push((g, j, name, signer));
            }
        }
        let directory: Arc<dyn Directory> = Arc::new(directory);
        let base = Instant::now();
        let mut w = World {
            sim,
            st: State {
                costs: bed.costs,
                charge_confirmations: bed.charge_confirmations,
                base,
                groups: (0..groups).map(|g| GroupName::new(format!("fig-g{g}"))).collect::<Result<_, _>>()?,
                members: Vec::new(),
                by_conn: HashMap::new(),
                cpu_free: vec![0; bed.daemons.into()],
                forming: None,
                failures: Vec::new(),
            },
            policy,
            daemons: bed.daemons,
        };
        for (g, j, name, signer) in ids {
            let daemon = ((g + j) % usize::from(bed.daemons)) as u16;
            let conn = w.sim.open(daemon)?;
            w.sim.submit(Op::Connect { conn, name: name.clone() });
            let rng = Box::new(ChaCha20Rng::seed_from_u64(rng.next_u64()));
            let session = SessionCore::new(name, signer, directory.clone(), rng, base);
            w.st.by_conn.insert(conn, w.st.members.len());
            w.st.members.push(Member {
                conn,
                group: g,
                session,
                inside: false,
                view: None,
                keyed: None,
                secured: None,
                spent: Costs::default(),
            });
        }
        Ok(w)
    }

    /// The members of group `g`, joined or not (its spares last).
    pub fn group(&self, g: usize) -> Vec<usize> {
        (0..self.st.members.len()).filter(|&i| self.st.members[i].group == g).collect()
    }

    fn now(&self) -> Instant {
        self.st.base + Duration::from_micros(self.sim.now())
    }

    /// Sends what member `i`'s session wants sent now.
    fn flush(&mut self, i: usize) {
        let m = &mut self.st.members[i];
        while let Some(t) = m.session.poll_transmit() {
            self.sim.submit(t.into_op(m.conn));
        }
    }

    fn join(&mut self, i: usize) -> Result<()> {
        let now = self.now();
        let m = &mut self.st.members[i];
        m.session.join(now, self.st.groups[m.group].as_str(), self.policy)?;
        m.inside = true;
        self.flush(i);
        Ok(())
    }

    /// Runs until nothing is left to do, the daemons' timers included (a
    /// metered daemon releases what its CPU has done by its timer, which
    /// `run_until(Micros::MAX)` alone does not wait for).
    fn settle(&mut self) -> Result<()> {
        let st = &mut self.st;
        loop {
            self.sim.run_until(Micros::MAX, &mut |now, conn, d| st.react(now, conn, d));
            match self.sim.next_event_at() {
                Some(at) => self.sim.run_until(at, &mut |now, conn, d| st.react(now, conn, d)),
                None => break,
            }
        }
        // The members' CPU may still be busy after the last event (a
        // reaction whose sends were handed over directly, while groups form):
        // the next event starts when it is done.
        let busy = st.cpu_free.iter().copied().max().unwrap_or(0);
        if busy > self.sim.now() {
            self.sim.run_until(busy, &mut |now, conn, d| st.react(now, conn, d));
        }
        if let Some(f) = self.st.failures.first() {
            bail!("{} failures in the simulation, the first: {f}", self.st.failures.len());
        }
        Ok(())
    }

    /// `who` join at once and the groups form (untimed): deliveries are held
    /// until the daemons are quiet and handed to each session in one batch
    /// (a session skips the views a later one supersedes), then the keys are
    /// agreed.
    pub fn form(&mut self, who: &[usize]) -> Result<()> {
        self.st.forming = Some(BTreeMap::new());
        for &i in who {
            self.join(i)?;
        }
        self.settle()?;
        let held = self.st.forming.take().unwrap_or_default();
        let now = self.sim.now();
        for (i, ds) in held {
            let r = self.st.deliver(i, now, ds);
            for op in r.ops {
                self.sim.submit(op);
            }
        }
        self.settle()?;
        self.measure(who, now).map(drop)
    }

    /// Member `i` joins its group: timed over its group's members.
    pub fn time_join(&mut self, i: usize) -> Result<Timing> {
        let t0 = self.sim.now();
        self.join(i)?;
        self.settle()?;
        let who = self.inside(self.st.members[i].group);
        self.measure(&who, t0)
    }

    /// Member `i` leaves its group: timed over those that stay.
    pub fn time_leave(&mut self, i: usize) -> Result<Timing> {
        let t0 = self.sim.now();
        let now = self.now();
        let m = &mut self.st.members[i];
        m.session.leave(now, self.st.groups[m.group].as_str())?;
        m.inside = false;
        self.flush(i);
        self.settle()?;
        let who = self.inside(self.st.members[i].group);
        self.measure(&who, t0)
    }

    /// The daemons split in half (`split`) or heal: timed over every member
    /// in a group, from the daemons' new configuration.
    pub fn time_network(&mut self, split: bool) -> Result<Timing> {
        let d = self.daemons;
        let half = d.div_ceil(2);
        let (a, b): (Vec<u16>, Vec<u16>) = (0..d).partition(|&x| x < half);
        if split {
            self.sim.reconfigure(&[&a, &b])?;
        } else {
            let all: Vec<u16> = (0..d).collect();
            self.sim.reconfigure(&[&all])?;
        }
        let t0 = self.sim.now() + NetConfig::default().detect;
        self.settle()?;
        let who: Vec<usize> = (0..self.st.members.len()).filter(|&i| self.st.members[i].inside).collect();
        self.measure(&who, t0)
    }

    fn inside(&self, g: usize) -> Vec<usize> {
        self.group(g).into_iter().filter(|&i| self.st.members[i].inside).collect()
    }

    /// The latest of `who`'s view, key and secure view, ms after `t0`; fails
    /// unless each holds the key and the secure view of its latest daemon view
    /// with all of that view's members.
    fn measure(&self, who: &[usize], t0: Micros) -> Result<Timing> {
        let mut worst = [0u64; 3];
        for &i in who {
            let m = &self.st.members[i];
            let me = m.session.me();
            let Some((view, size, at)) = m.view else { bail!("{me} has no view of its group") };
            match m.keyed {
                Some((v, t)) if v == view => worst[1] = worst[1].max(t),
                _ => bail!("{me} holds no key of its latest view {view}"),
            }
            match m.secured {
                Some((v, n, t)) if v == view && n == size => worst[2] = worst[2].max(t),
                s => bail!("{me} shows no secure view of its latest view {view} of {size} ({s:?})"),
            }
            worst[0] = worst[0].max(at);
        }
        let ms = |t: u64| t.saturating_sub(t0) as f64 / 1e3;
        Ok(Timing { membership_ms: ms(worst[0]), keyed_ms: ms(worst[1]), confirmed_ms: ms(worst[2]) })
    }

    /// Key agreements the daemons completed, summed over the daemons
    /// (integrated only; for tests).
    #[cfg(test)]
    pub fn daemon_agreements(&self) -> u64 {
        (0..self.daemons)
            .filter_map(|d| self.sim.machine(d))
            .filter_map(|m| (m as &dyn std::any::Any).downcast_ref::<super::metered::Metered>())
            .map(|m| m.agreements())
            .sum()
    }
}

/// Fig. 5 for one architecture, group size and seed, as `bench events
/// --engine daemon` times its events: n is the size after a join, before a
/// leave, a partition or a merge. With a join among `events` a group of n − 1
/// forms and the n-th member joins first; then the daemons split in half and
/// heal (partition, merge); a leave (the last member) comes last. Returns the
/// timings in the order of `events`.
pub fn fig5(bed: &Testbed, policy: Policy, n: usize, events: &[TimedEvent], seed: u64) -> Result<Vec<Timing>> {
    use TimedEvent::*;
    if n < 2 {
        bail!("group size {n} is too small: an event needs at least 2 members");
    }
    let joins = events.contains(&Join);
    let mut w = World::new(bed, policy, 1, n, 0, seed)?;
    let members = w.group(0);
    w.form(&members[..if joins { n - 1 } else { n }])?;
    let mut done = BTreeMap::new();
    for e in [Join, Partition, Merge, Leave].into_iter().filter(|e| events.contains(e)) {
        let t = match e {
            Join => w.time_join(members[n - 1])?,
            Partition => w.time_network(true)?,
            Merge => w.time_network(false)?,
            _ => w.time_leave(members[n - 1])?,
        };
        done.insert(e as u8, t);
    }
    events
        .iter()
        .map(|e| done.get(&(*e as u8)).copied().ok_or_else(|| anyhow::anyhow!("{e:?} is not one of Fig. 5's events")))
        .collect()
}

/// Fig. 6 for one architecture: `groups` groups of `size` form, then the
/// daemons split in half and heal; the two events' timings.
pub fn fig6(bed: &Testbed, policy: Policy, groups: usize, size: usize, seed: u64) -> Result<[Timing; 2]> {
    let mut w = World::new(bed, policy, groups, size, 0, seed)?;
    let all: Vec<usize> = (0..groups * size).collect();
    w.form(&all)?;
    let split = w.time_network(true)?;
    let merge = w.time_network(false)?;
    Ok([split, merge])
}

#[cfg(test)]
mod tests {
    use super::*;
    use conclave_gka::{GroupId, ProtocolId};

    fn bed(daemons: u16) -> Testbed {
        Testbed::new(daemons, OpCosts::tissec2002())
    }

    #[test]
    fn fig6_on_three_daemons_keys_every_member_and_integrated_beats_layered() {
        let bed = bed(3);
        let layered = fig6(&bed, Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255), 2, 4, 7).unwrap();
        let integrated = fig6(&bed, Policy::integrated(), 2, 4, 7).unwrap();
        for (l, i) in layered.iter().zip(&integrated) {
            assert!(i.keyed_ms > 0.0 && l.keyed_ms > i.keyed_ms, "layered {l:?}, integrated {i:?}");
            assert!(i.membership_ms <= i.keyed_ms + 1e-9 && i.keyed_ms <= i.confirmed_ms, "{i:?}");
        }
    }

    #[test]
    fn fig5_times_every_event_and_is_deterministic_per_seed() {
        let bed = bed(3);
        let events = [TimedEvent::Join, TimedEvent::Leave, TimedEvent::Partition, TimedEvent::Merge];
        let a = fig5(&bed, Policy::integrated(), 4, &events, 3).unwrap();
        let b = fig5(&bed, Policy::integrated(), 4, &events, 3).unwrap();
        assert_eq!(a.len(), 4);
        for ((e, x), y) in events.iter().zip(&a).zip(&b) {
            assert_eq!((x.keyed_ms, x.confirmed_ms), (y.keyed_ms, y.confirmed_ms), "{e:?}");
            assert!(x.keyed_ms > 0.0, "{e:?}: {x:?}");
        }
    }

    #[test]
    fn the_daemons_agree_again_after_a_partition_and_a_merge() {
        let bed = bed(3);
        let mut w = World::new(&bed, Policy::integrated(), 1, 3, 0, 5).unwrap();
        w.form(&[0, 1, 2]).unwrap();
        let before = w.daemon_agreements();
        w.time_network(true).unwrap();
        w.time_network(false).unwrap();
        // Split: each side agrees (2 + 1 daemons); merge: all 3 again.
        assert_eq!(w.daemon_agreements() - before, 6);
    }
}
