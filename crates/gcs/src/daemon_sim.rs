//! The `sim` backbone, second stage: real daemon [`Core`]s on a simulated
//! network, in virtual time, from one seed.
//!
//! Where [`crate::sim`] plays the group communication layer as a whole, this
//! module runs the daemons themselves: every simulated daemon holds a
//! [`Core`], exactly the state machine the standalone and cluster daemons
//! run, and the module plays the rest — clients on each daemon's machine, a
//! Totem-like backbone that puts every daemon's submissions into one agreed
//! order per connected component, and the network under it.
//!
//! # Model
//!
//! * **Time** is virtual, in microseconds; events run in time order (ties in
//!   the order they were scheduled), so a seed reproduces a run exactly.
//! * **Network**: one-way latency between daemons, plus a uniform jitter,
//!   plus loss: a lost transmission is sent again after a retransmission
//!   timeout, as Totem does, so loss shows up as delay. Clients reach their
//!   daemon in a fixed client latency, each connection in order (a
//!   submission never overtakes an earlier one of its connection, such as
//!   the operations of a reaction still on the CPU).
//! * **Agreed order**: the lowest daemon of each component sequences (Totem's
//!   token, collapsed into one place); every daemon delivers the sequenced
//!   operations in order, holding any that arrive early.
//! * **CPU**: each daemon's machine has one virtual CPU; processing an
//!   operation costs [`NetConfig::cpu_per_op`], and a client's reaction to a
//!   delivery costs what its handler says, on the same CPU.
//! * **Partitions and merges** take effect after a detection delay. A
//!   partition stops the daemons of the affected components at once (during
//!   detection Totem delivers nothing); a merge lets both sides go on until
//!   the new configuration forms. At the change, the daemons that move
//!   together from one configuration into the same next one (a transitional
//!   set) deliver the same remaining operations of the old one: everything
//!   any of them received, and everything any of them sent (an originator
//!   always holds its own messages), in sequence order — extended virtual
//!   synchrony. Where the set's own delivery begins (the point its most
//!   advanced daemon had reached), each of its daemons is told
//!   [`Op::Transitional`]. Then each daemon is told [`Op::Daemons`]; the cores exchange
//!   state through the new configuration. A submission that was not yet
//!   ordered when its configuration stopped is sent again in the next one.
//! * **Operation identities**: like a cluster shell, each daemon numbers the
//!   client operations it submits ([`Op::Numbered`], with its core's
//!   incarnation and 0, 1, 2, … in submission order), so that a core applies
//!   an operation submitted again at most once (see the core's module doc).
//! * **Crashes and restarts**: [`DaemonSim::crash`] stops a daemon at once.
//!   Everything on its way to it or to its clients, and everything it had not
//!   yet got ordered, is lost with it; what it had got ordered reaches the
//!   others. Its configuration stops (the token is lost) and, after the
//!   detection delay, the daemons that remain in it form a configuration
//!   without it, as after a partition. Its clients' connections are gone:
//!   the caller learns it from the call itself — every connection whose
//!   [`ConnId::daemon`] is the crashed daemon — and nothing more reaches
//!   them, while operations submitted on them are dropped. The daemons that
//!   remain see those clients go when their configuration changes (cause
//!   [`Cause::Network`](crate::Cause::Network)). [`DaemonSim::restart`]
//!   boots a fresh [`Core`] with a new random incarnation (from the
//!   simulation's seed) alone in its own configuration; a later
//!   [`DaemonSim::reconfigure`] that puts it with others merges it. Connection
//!   numbers go on counting across restarts, so a [`ConnId`] is never reused
//!   in a run. A crashed daemon is named in [`DaemonSim::reconfigure`] like
//!   any other, and left out of the configurations it installs until it
//!   restarts.
//!
//! The number of [`Op::Daemons`] and [`Op::State`] is, as on the cluster
//! backbone, each daemon's own count of the changes of the daemon group it
//! was told of, from 1 at each boot: daemons that restarted, or that a
//! cascade took through more configurations than others, number the same
//! change differently. A state is stamped with its receiver's count on
//! delivery. Like Totem, the simulator delivers every submission back to
//! its daemon, states included: the core relies on it (see its module doc).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::core::{ConnId, Core, DaemonId, Delivery, Limits, Machine, Op, OpId, Output};

/// Virtual time in microseconds.
pub type Micros = u64;

/// The simulated network and machines.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// One-way latency between two daemons.
    pub latency: Micros,
    /// Largest extra delay added to a transmission, drawn uniformly.
    pub jitter: Micros,
    /// Probability that one transmission between daemons is lost.
    pub loss: f64,
    /// Time after which a lost transmission is sent again.
    pub retransmit: Micros,
    /// One-way latency between a client and its daemon.
    pub client_latency: Micros,
    /// CPU time a daemon spends on one operation of the agreed stream.
    pub cpu_per_op: Micros,
    /// Time from a partition or merge until the new configuration forms.
    pub detect: Micros,
}

impl Default for NetConfig {
    /// A LAN like the one measured in the Corosync notes: about 80 µs one way,
    /// no loss, 2 s to detect a change (token 1000 ms, consensus 1200 ms).
    fn default() -> Self {
        Self {
            latency: 80,
            jitter: 20,
            loss: 0.0,
            retransmit: 1_000,
            client_latency: 10,
            cpu_per_op: 5,
            detect: 2_000_000,
        }
    }
}

/// Errors from driving the simulation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonSimError {
    /// The daemon does not exist.
    #[error("unknown daemon {0}")]
    UnknownDaemon(u16),
    /// A partition must name every daemon exactly once.
    #[error("a partition must name every daemon exactly once")]
    BadPartition,
    /// A loss probability outside [0, 1).
    #[error("loss must be in [0, 1)")]
    BadLoss,
    /// The daemon is crashed (and was not restarted).
    #[error("daemon {0} is crashed")]
    Crashed(u16),
    /// The daemon is running: only a crashed daemon restarts.
    #[error("daemon {0} is running")]
    Running(u16),
}

/// One delivery to one client, with its virtual time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// When the client got it.
    pub at: Micros,
    /// Which client.
    pub to: ConnId,
    /// What.
    pub delivery: Delivery,
}

/// What a client does on a delivery: operations to submit, and the CPU time
/// its reaction took on its machine.
#[derive(Default)]
pub struct Reaction {
    /// Operations to send to the client's daemon, in order.
    pub ops: Vec<Op>,
    /// CPU time the reaction costs before the operations go out.
    pub cpu: Micros,
}

enum Event {
    /// A client's operation reaches its daemon.
    FromClient { daemon: DaemonId, op: Op },
    /// A daemon's submission reaches the sequencer of its configuration.
    ToSequencer { config: u64, from: DaemonId, submission: u64, op: Op },
    /// A sequenced operation reaches a daemon.
    Arrive { config: u64, to: DaemonId, seq: usize },
    /// A delivery reaches a client.
    ToClient { to: ConnId, delivery: Delivery },
    /// The configuration change planned at `plan` takes effect.
    Reconfigure { plan: u64 },
}

/// A planned configuration change.
enum Plan {
    /// These components (crashed daemons are left out when it takes effect).
    Parts(Vec<Vec<DaemonId>>),
    /// A crash was detected: every configuration that lost a member to a
    /// crash (or a restart) goes on with the members that remain.
    Drop,
}

struct Scheduled {
    at: Micros,
    order: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.order) == (other.at, other.order)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.order).cmp(&(other.at, other.order))
    }
}

/// One configuration of the backbone: a connected component of daemons.
struct Config {
    members: BTreeSet<DaemonId>,
    /// Sequenced operations with their originators.
    log: Vec<(DaemonId, Op)>,
    /// Stopped by a partition being detected: nothing more is ordered or
    /// delivered in it.
    stopped: bool,
}

impl Config {
    fn sequencer(&self) -> DaemonId {
        *self.members.first().expect("a configuration has members")
    }
}

struct SimDaemon {
    core: Box<dyn Machine>,
    /// Running (not crashed).
    up: bool,
    /// The first connection number of this lifetime: older ones are gone.
    first_conn: u64,
    config: u64,
    /// The changes of the daemon group this lifetime was told of: the
    /// number its next [`Op::Daemons`] carries is one more.
    changes: u64,
    /// Next sequence number to deliver in `config`.
    next: usize,
    /// Sequence numbers of `config` that arrived, delivered or not.
    arrived: BTreeSet<usize>,
    /// Submissions not yet ordered, by submission number, to send again in
    /// the next configuration.
    unordered: BTreeMap<u64, Op>,
    /// Number of the next submission.
    next_submission: u64,
    /// Number of the next client operation of this lifetime ([`OpId::seq`]).
    next_op: u64,
    /// When this daemon's latest submission reaches its sequencer: Totem
    /// keeps each sender's messages in order, so a later one never overtakes.
    last_at_sequencer: Micros,
    cpu_free: Micros,
    next_conn: u64,
    /// When the machine wants its time-out ([`Machine::poll_timeout`]).
    timer: Option<Micros>,
}

/// Makes the machine a simulated daemon runs, for a daemon and a fresh
/// incarnation: at the start, and at every restart.
pub type MachineMaker = Box<dyn FnMut(DaemonId, u64) -> Box<dyn Machine>>;

/// Simulated daemons on a simulated network. See the module doc.
pub struct DaemonSim {
    net: NetConfig,
    make: MachineMaker,
    rng: ChaCha20Rng,
    now: Micros,
    order: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    daemons: BTreeMap<DaemonId, SimDaemon>,
    configs: Vec<Config>,
    /// Planned configuration changes, by plan number.
    plans: BTreeMap<u64, Plan>,
    next_plan: u64,
    log: Vec<Delivered>,
    /// When each connection's latest submission reaches its daemon.
    last_from_client: BTreeMap<ConnId, Micros>,
}

impl DaemonSim {
    /// Daemons `0..daemons`, all in one configuration, at time 0, each
    /// running a plain [`Core`].
    pub fn new(daemons: u16, net: NetConfig, seed: u64) -> Result<Self, DaemonSimError> {
        Self::with_machines(
            daemons,
            net,
            seed,
            Box::new(|id, incarnation| Box::new(Core::new(id, Limits::default(), incarnation))),
        )
    }

    /// Daemons `0..daemons`, all in one configuration, at time 0, each
    /// running the machine `make` makes.
    pub fn with_machines(daemons: u16, net: NetConfig, seed: u64, make: MachineMaker) -> Result<Self, DaemonSimError> {
        if !(0.0..1.0).contains(&net.loss) {
            return Err(DaemonSimError::BadLoss);
        }
        let mut sim = Self {
            net,
            make,
            rng: ChaCha20Rng::seed_from_u64(seed),
            now: 0,
            order: 0,
            queue: BinaryHeap::new(),
            daemons: BTreeMap::new(),
            configs: Vec::new(),
            plans: BTreeMap::new(),
            next_plan: 0,
            log: Vec::new(),
            last_from_client: BTreeMap::new(),
        };
        for d in 0..daemons {
            let id = DaemonId(d);
            let daemon = SimDaemon {
                core: (sim.make)(id, sim.rng.next_u64()),
                up: true,
                first_conn: 1,
                config: 0,
                changes: 0,
                next: 0,
                arrived: BTreeSet::new(),
                unordered: BTreeMap::new(),
                next_submission: 0,
                next_op: 0,
                last_at_sequencer: 0,
                cpu_free: 0,
                next_conn: 1,
                timer: None,
            };
            sim.daemons.insert(id, daemon);
        }
        let all: Vec<DaemonId> = sim.daemons.keys().copied().collect();
        sim.configs.push(Config { members: BTreeSet::new(), log: Vec::new(), stopped: true });
        sim.install(vec![all]);
        Ok(sim)
    }

    /// The current virtual time.
    pub fn now(&self) -> Micros {
        self.now
    }

    /// A running daemon's core, to inspect (`None` while it is crashed).
    pub fn core(&self, daemon: u16) -> Option<&Core> {
        self.machine(daemon).map(|m| m.core())
    }

    /// The machine daemon `daemon` runs, if it is running.
    pub fn machine(&self, daemon: u16) -> Option<&dyn Machine> {
        self.daemons.get(&DaemonId(daemon)).filter(|d| d.up).map(|d| d.core.as_ref())
    }

    /// Whether `daemon` exists and is running.
    pub fn is_up(&self, daemon: u16) -> bool {
        self.daemons.get(&DaemonId(daemon)).is_some_and(|d| d.up)
    }

    /// Whether nothing is left to do: no message, delivery or configuration
    /// change is on its way.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// A new connection on `daemon` (the client still has to say Hello with
    /// an [`Op::Connect`]).
    pub fn open(&mut self, daemon: u16) -> Result<ConnId, DaemonSimError> {
        let d = self.daemons.get_mut(&DaemonId(daemon)).ok_or(DaemonSimError::UnknownDaemon(daemon))?;
        if !d.up {
            return Err(DaemonSimError::Crashed(daemon));
        }
        let conn = ConnId { daemon: DaemonId(daemon), local: d.next_conn };
        d.next_conn += 1;
        Ok(conn)
    }

    /// A client sends `op` to its daemon now (the daemon is the one of the
    /// operation's connection). An operation on a connection that a crash
    /// ended is dropped.
    pub fn submit(&mut self, op: Op) {
        self.submit_at(self.now, op);
    }

    fn submit_at(&mut self, at: Micros, op: Op) {
        let Some(conn) = op.conn().filter(|c| self.alive(*c)) else { return };
        let last = self.last_from_client.entry(conn).or_default();
        let when = (at + self.net.client_latency).max(*last);
        *last = when;
        self.schedule(when, Event::FromClient { daemon: conn.daemon, op });
    }

    /// Every operation the backbone has ordered so far, with the daemon that
    /// submitted it, configuration by configuration: what went between the
    /// daemons (a capture of the wire, for tests).
    pub fn ordered_ops(&self) -> impl Iterator<Item = (DaemonId, &Op)> {
        self.configs.iter().flat_map(|c| c.log.iter().map(|(from, op)| (*from, op)))
    }

    /// Whether a connection is one of a running daemon's current lifetime.
    fn alive(&self, conn: ConnId) -> bool {
        self.daemons.get(&conn.daemon).is_some_and(|d| d.up && conn.local >= d.first_conn)
    }

    /// Crashes `daemon` now (see the module doc): its clients' connections
    /// are gone, and the daemons of its configuration go on without it after
    /// the detection delay.
    pub fn crash(&mut self, daemon: u16) -> Result<(), DaemonSimError> {
        let id = DaemonId(daemon);
        let d = self.daemons.get_mut(&id).ok_or(DaemonSimError::UnknownDaemon(daemon))?;
        if !d.up {
            return Err(DaemonSimError::Crashed(daemon));
        }
        d.up = false;
        d.unordered.clear();
        d.arrived.clear();
        d.next = 0;
        let config = std::mem::replace(&mut d.config, 0);
        self.last_from_client.retain(|c, _| c.daemon != id);
        self.configs[config as usize].stopped = true;
        // Whatever was on its way to it, to its clients or from it is lost.
        let events = std::mem::take(&mut self.queue).into_vec();
        for Reverse(s) in events {
            let lost = match &s.event {
                Event::FromClient { daemon, .. } => *daemon == id,
                Event::ToSequencer { from, .. } => *from == id,
                Event::Arrive { to, .. } => *to == id,
                Event::ToClient { to, .. } => to.daemon == id,
                Event::Reconfigure { .. } => false,
            };
            if !lost {
                self.queue.push(Reverse(s));
            }
        }
        let plan = self.next_plan;
        self.next_plan += 1;
        self.plans.insert(plan, Plan::Drop);
        self.schedule(self.now + self.net.detect, Event::Reconfigure { plan });
        Ok(())
    }

    /// Boots a crashed `daemon` again: a fresh core with a new incarnation,
    /// alone in its own configuration until a [`DaemonSim::reconfigure`]
    /// merges it.
    pub fn restart(&mut self, daemon: u16) -> Result<(), DaemonSimError> {
        let id = DaemonId(daemon);
        let incarnation = self.rng.next_u64();
        let now = self.now;
        let d = self.daemons.get_mut(&id).ok_or(DaemonSimError::UnknownDaemon(daemon))?;
        if d.up {
            return Err(DaemonSimError::Running(daemon));
        }
        d.core = (self.make)(id, incarnation);
        d.timer = d.core.poll_timeout();
        d.next_op = 0;
        d.changes = 0;
        d.up = true;
        d.first_conn = d.next_conn;
        d.last_at_sequencer = now;
        d.cpu_free = now;
        self.install(vec![vec![id]]);
        Ok(())
    }

    /// Splits the daemons into components, effective after the detection
    /// delay. Every daemon must be named exactly once (a crashed one too: it
    /// is left out until it restarts). Components that gain members merge;
    /// components that lose members stop at once until the change takes
    /// effect.
    pub fn reconfigure(&mut self, parts: &[&[u16]]) -> Result<(), DaemonSimError> {
        let mut seen = BTreeSet::new();
        let mut plan = Vec::new();
        for part in parts {
            let mut ds = Vec::new();
            for &d in *part {
                if !self.daemons.contains_key(&DaemonId(d)) {
                    return Err(DaemonSimError::UnknownDaemon(d));
                }
                if !seen.insert(d) {
                    return Err(DaemonSimError::BadPartition);
                }
                ds.push(DaemonId(d));
            }
            if !ds.is_empty() {
                plan.push(ds);
            }
        }
        if seen.len() != self.daemons.len() {
            return Err(DaemonSimError::BadPartition);
        }
        // A configuration that loses members has lost its token: it stops.
        for part in &plan {
            for d in part.iter().filter(|d| self.daemons[*d].up) {
                let config = self.daemons[d].config;
                let members = &self.configs[config as usize].members;
                if !members.iter().all(|m| part.contains(m)) {
                    self.configs[config as usize].stopped = true;
                }
            }
        }
        let id = self.next_plan;
        self.next_plan += 1;
        self.plans.insert(id, Plan::Parts(plan));
        self.schedule(self.now + self.net.detect, Event::Reconfigure { plan: id });
        Ok(())
    }

    /// Runs until nothing is left to do or virtual time passes `until`;
    /// every delivery to a client goes through `react`.
    pub fn run_until(&mut self, until: Micros, react: &mut dyn FnMut(Micros, ConnId, &Delivery) -> Reaction) {
        loop {
            let next = self.queue.peek().map(|Reverse(s)| s.at);
            // Machines' timers alone do not keep a run without end going:
            // with nothing else left, it is idle.
            if next.is_none() && until == Micros::MAX {
                break;
            }
            match (next, self.next_timer()) {
                (next, Some((at, d))) if next.is_none_or(|n| at < n) => {
                    if at > until {
                        break;
                    }
                    self.now = self.now.max(at);
                    self.fire_timer(d);
                }
                (Some(at), _) if at <= until => {
                    let Reverse(s) = self.queue.pop().expect("peeked");
                    self.now = s.at;
                    self.handle(s.event, react);
                }
                _ => break,
            }
        }
        if until != Micros::MAX {
            self.now = self.now.max(until);
        }
    }

    /// When the next event is due, if any: a driver whose clients set timers
    /// as they react runs up to it, then checks its timers.
    pub fn next_event_at(&self) -> Option<Micros> {
        let timer = self.next_timer().map(|(at, _)| at);
        self.queue.peek().map(|Reverse(s)| s.at).into_iter().chain(timer).min()
    }

    /// Runs until nothing is left to do, with clients that never react.
    pub fn run_idle(&mut self) {
        self.run_until(Micros::MAX, &mut |_, _, _| Reaction::default());
    }

    /// Takes the deliveries recorded so far.
    pub fn take_log(&mut self) -> Vec<Delivered> {
        std::mem::take(&mut self.log)
    }

    fn schedule(&mut self, at: Micros, event: Event) {
        self.order += 1;
        self.queue.push(Reverse(Scheduled { at, order: self.order, event }));
    }

    /// Time for one transmission between daemons, losses included.
    fn hop(&mut self, from: DaemonId, to: DaemonId) -> Micros {
        if from == to {
            return 0;
        }
        let mut t = self.net.latency + self.jitter();
        while self.net.loss > 0.0 && self.unit() < self.net.loss {
            t += self.net.retransmit + self.jitter();
        }
        t
    }

    fn jitter(&mut self) -> Micros {
        if self.net.jitter == 0 {
            0
        } else {
            self.rng.next_u64() % (self.net.jitter + 1)
        }
    }

    fn unit(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn handle(&mut self, event: Event, react: &mut dyn FnMut(Micros, ConnId, &Delivery) -> Reaction) {
        match event {
            Event::FromClient { daemon, op } => {
                if !op.conn().is_some_and(|c| self.alive(c)) {
                    return;
                }
                let d = self.daemons.get_mut(&daemon).expect("daemon");
                if !d.core.routes_submissions() {
                    self.send_to_sequencer(daemon, self.now, op);
                    return;
                }
                // Numbered here, as `send_to_sequencer` would, so that what
                // the machine makes of it carries its identity.
                let id = OpId { incarnation: d.core.core().incarnation(), seq: d.next_op };
                d.next_op += 1;
                let mut out = Vec::new();
                d.core.submit(op.numbered(id), self.now, &mut out);
                self.outputs(daemon, self.now, out);
            }
            Event::ToSequencer { config, from, submission, op } => {
                let c = &mut self.configs[config as usize];
                if c.stopped {
                    self.unordered(from, config, submission, op);
                    return;
                }
                c.log.push((from, op));
                let seq = c.log.len() - 1;
                let sequencer = c.sequencer();
                let members: Vec<DaemonId> = c.members.iter().copied().collect();
                for to in members {
                    let at = self.now + self.hop(sequencer, to);
                    self.schedule(at, Event::Arrive { config, to, seq });
                }
            }
            Event::Arrive { config, to, seq } => {
                let d = self.daemons.get_mut(&to).expect("daemon");
                if d.config != config {
                    return; // The change delivered what this daemon's set had.
                }
                d.arrived.insert(seq);
                if !self.configs[config as usize].stopped {
                    self.deliver_ready(to);
                }
            }
            Event::ToClient { to, delivery } => {
                if !self.alive(to) {
                    return;
                }
                let reaction = react(self.now, to, &delivery);
                self.log.push(Delivered { at: self.now, to, delivery });
                if reaction.ops.is_empty() && reaction.cpu == 0 {
                    return;
                }
                let d = self.daemons.get_mut(&to.daemon).expect("daemon");
                let done = d.cpu_free.max(self.now) + reaction.cpu;
                d.cpu_free = done;
                for op in reaction.ops {
                    self.submit_at(done, op);
                }
            }
            Event::Reconfigure { plan } => {
                let parts = match self.plans.remove(&plan).expect("planned") {
                    Plan::Parts(parts) => parts
                        .into_iter()
                        .map(|part| part.into_iter().filter(|d| self.daemons[d].up).collect::<Vec<_>>())
                        .filter(|part| !part.is_empty())
                        .collect(),
                    Plan::Drop => self.remaining(),
                };
                if !parts.is_empty() {
                    self.install(parts);
                }
            }
        }
    }

    /// Sends a daemon's submission to the sequencer of its configuration,
    /// leaving at `at`; in a stopped configuration it waits for the next. A
    /// client operation gets its identity here, unless it has one (sent
    /// again).
    fn send_to_sequencer(&mut self, from: DaemonId, at: Micros, op: Op) {
        let d = self.daemons.get_mut(&from).expect("daemon");
        let op = if op.is_plain_client_op() {
            let id = OpId { incarnation: d.core.core().incarnation(), seq: d.next_op };
            d.next_op += 1;
            op.numbered(id)
        } else {
            op
        };
        let submission = d.next_submission;
        d.next_submission += 1;
        let config = d.config;
        let c = &self.configs[config as usize];
        if c.stopped {
            self.daemons.get_mut(&from).expect("daemon").unordered.insert(submission, op);
            return;
        }
        let sequencer = c.sequencer();
        let hop = self.hop(from, sequencer);
        let d = self.daemons.get_mut(&from).expect("daemon");
        let arrives = (at + hop).max(d.last_at_sequencer);
        d.last_at_sequencer = arrives;
        self.schedule(arrives, Event::ToSequencer { config, from, submission, op });
    }

    /// The configurations of running daemons that lost a member to a crash
    /// or a restart, each as the members that remain in it.
    fn remaining(&self) -> Vec<Vec<DaemonId>> {
        let held: BTreeSet<u64> = self.daemons.values().filter(|d| d.up).map(|d| d.config).collect();
        held.into_iter()
            .filter_map(|c| {
                let members = &self.configs[c as usize].members;
                let stay: Vec<DaemonId> =
                    members.iter().copied().filter(|m| self.daemons[m].up && self.daemons[m].config == c).collect();
                (stay.len() < members.len()).then_some(stay)
            })
            .collect()
    }

    /// A submission that found its configuration stopped: its originator
    /// sends it again in its next configuration (or now, if it has one). A
    /// crashed originator lost it.
    fn unordered(&mut self, from: DaemonId, config: u64, submission: u64, op: Op) {
        if !self.daemons[&from].up {
            return;
        }
        if self.daemons[&from].config == config {
            self.daemons.get_mut(&from).expect("daemon").unordered.insert(submission, op);
        } else {
            self.send_to_sequencer(from, self.now, op);
        }
    }

    /// Delivers, in order, every operation of the daemon's configuration
    /// that has arrived.
    fn deliver_ready(&mut self, id: DaemonId) {
        loop {
            let d = &self.daemons[&id];
            if !d.arrived.contains(&d.next) {
                return;
            }
            let seq = d.next;
            self.daemons.get_mut(&id).expect("daemon").next += 1;
            self.process(id, seq);
        }
    }

    /// Runs one sequenced operation of the daemon's configuration through its core.
    fn process(&mut self, id: DaemonId, seq: usize) {
        let (config, changes) = (self.daemons[&id].config, self.daemons[&id].changes);
        let mut op = self.configs[config as usize].log[seq].1.clone();
        if let Op::State { epoch, .. } = &mut op {
            *epoch = changes;
        }
        self.apply(id, op);
    }

    fn apply(&mut self, id: DaemonId, op: Op) {
        let cpu = self.net.cpu_per_op;
        let d = self.daemons.get_mut(&id).expect("daemon");
        let done = d.cpu_free.max(self.now) + cpu;
        d.cpu_free = done;
        let mut out = Vec::new();
        d.core.handle(op, done, &mut out);
        d.timer = d.core.poll_timeout();
        self.outputs(id, done, out);
    }

    /// The daemon whose machine's time-out is due first, and when, if any.
    fn next_timer(&self) -> Option<(Micros, DaemonId)> {
        self.daemons.iter().filter(|(_, d)| d.up).filter_map(|(&id, d)| Some((d.timer?, id))).min()
    }

    /// Daemon `id`'s machine's time-out is due.
    fn fire_timer(&mut self, id: DaemonId) {
        let cpu = self.net.cpu_per_op;
        let d = self.daemons.get_mut(&id).expect("daemon");
        let done = d.cpu_free.max(self.now) + cpu;
        d.cpu_free = done;
        let mut out = Vec::new();
        d.core.handle_timeout(self.now, &mut out);
        d.timer = d.core.poll_timeout();
        self.outputs(id, done, out);
    }

    /// Sends on what daemon `id`'s machine output, done with it at `done`.
    fn outputs(&mut self, id: DaemonId, done: Micros, out: Vec<Output>) {
        for o in out {
            match o {
                Output::Deliver { to, delivery } => {
                    for c in to {
                        self.schedule(
                            done + self.net.client_latency,
                            Event::ToClient { to: c, delivery: delivery.clone() },
                        );
                    }
                }
                Output::Submit(op) => self.send_to_sequencer(id, done, op),
            }
        }
    }

    /// Installs new configurations: the transitional sets finish their old
    /// configurations together, then every daemon learns its new one.
    fn install(&mut self, mut parts: Vec<Vec<DaemonId>>) {
        // A component whose configuration goes on unchanged (running, the
        // same daemons) is told nothing, as Corosync tells its members
        // nothing when another component changes: so daemons number the
        // changes they see differently (see the module doc).
        parts.retain(|part| {
            let config = &self.configs[self.daemons[&part[0]].config as usize];
            let same = config.members.len() == part.len() && part.iter().all(|d| config.members.contains(d));
            !same || config.stopped
        });
        // Stop every configuration that ends here, so nothing more is ordered in it.
        for part in &parts {
            for d in part {
                let old = self.daemons[d].config;
                self.configs[old as usize].stopped = true;
            }
        }
        // Submissions still on their way to a stopped sequencer go back to
        // their originators, to be sent again in submission order.
        let events = std::mem::take(&mut self.queue).into_vec();
        for Reverse(s) in events {
            match s.event {
                Event::ToSequencer { config, from, submission, op } if self.configs[config as usize].stopped => {
                    self.unordered(from, config, submission, op);
                }
                event => self.queue.push(Reverse(Scheduled { event, ..s })),
            }
        }
        for part in parts {
            let mut transitional: BTreeMap<u64, Vec<DaemonId>> = BTreeMap::new();
            for &d in &part {
                transitional.entry(self.daemons[&d].config).or_default().push(d);
            }
            for (old, set) in &transitional {
                let log = &self.configs[*old as usize].log;
                let mut rest: BTreeSet<usize> =
                    set.iter().flat_map(|d| self.daemons[d].arrived.iter().copied()).collect();
                rest.extend(log.iter().enumerate().filter(|(_, (from, _))| set.contains(from)).map(|(i, _)| i));
                // The set's own delivery begins where its most advanced
                // daemon stands: the others catch up to there without holes
                // (that daemon delivered all of it), then all are told.
                let start = set.iter().map(|d| self.daemons[d].next).max().expect("a set has daemons");
                for &d in set {
                    let from = self.daemons[&d].next;
                    for &seq in rest.range(from..start) {
                        self.process(d, seq);
                    }
                    self.apply(d, Op::Transitional { members: set.clone() });
                    for &seq in rest.range(start..) {
                        self.process(d, seq);
                    }
                }
            }
            let config = self.configs.len() as u64;
            self.configs.push(Config { members: part.iter().copied().collect(), log: Vec::new(), stopped: false });
            let mut resend = Vec::new();
            for &d in &part {
                let daemon = self.daemons.get_mut(&d).expect("daemon");
                daemon.config = config;
                daemon.next = 0;
                daemon.arrived.clear();
                resend.push((d, std::mem::take(&mut daemon.unordered)));
            }
            for &d in &part {
                let daemon = self.daemons.get_mut(&d).expect("daemon");
                daemon.changes += 1;
                let epoch = daemon.changes;
                self.apply(d, Op::Daemons { epoch, members: part.clone() });
            }
            for (d, ops) in resend {
                for op in ops.into_values() {
                    self.send_to_sequencer(d, self.now, op);
                }
            }
        }
    }
}
