//! Key agreement members on the seeded `sim` backbone, with the cost meter
//! turned into per-event figures.
//!
//! A [`Harness`] owns a [`Sim`] whose nodes are [`Member`]s (an engine, its own
//! seeded RNG and what it installed). [`Harness::event`] applies one
//! membership change, runs it to completion and reports what it cost:
//!
//! * `total`: the sum over all members;
//! * `serial`: the critical path, as Table II of the TISSEC paper counts it
//!   ("computation that can be processed in parallel is collapsed"). Each
//!   message carries the cost of the longest chain of work that led to it; a
//!   member's clock is the maximum of its own and that of each message it
//!   handles, plus what handling it cost. Each counter is maximised on its
//!   own, so `exps_serial` is the longest chain of exponentiations;
//! * `rounds`: the longest chain of messages, each causally after the last.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use conclave_gcs::sim::{Flush, Outgoing, Sim, SimError, SimNode};
use conclave_gcs::{MemberId, View};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::engine::{Engine, Error, Output, StaticDirectory};
use crate::key::SecureView;
use crate::meter::Costs;
use crate::suite::memo::Memo;
use crate::suite::modp::Modp;
use crate::suite::ristretto::Ristretto255;
use crate::suite::{generate_signer, CryptoError, GroupId, SignatureId, Signer, Verifier};
use crate::{engine_in, Config, ProtocolId};

/// A verifier that remembers the (message, signature) pairs it accepted.
///
/// On the simulator every broadcast is verified by each of its n receivers
/// with the same bytes, which makes real verification the bulk of the real
/// time of large groups (n² verifications to form a group of n). Remembering
/// turns those into one verification and n byte comparisons without changing
/// any outcome: verification is a deterministic function of key, message and
/// signature; only acceptances are remembered, keyed by the signature and
/// compared byte for byte on the message; and every engine still meters each
/// verification it asks for.
struct RememberingVerifier {
    inner: Arc<dyn Verifier>,
    accepted: Mutex<HashMap<Vec<u8>, Vec<Vec<u8>>>>,
}

impl RememberingVerifier {
    fn new(inner: Arc<dyn Verifier>) -> Self {
        Self { inner, accepted: Mutex::new(HashMap::new()) }
    }
}

impl Verifier for RememberingVerifier {
    fn scheme(&self) -> SignatureId {
        self.inner.scheme()
    }

    fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        let mut accepted = self.accepted.lock().unwrap_or_else(|e| e.into_inner());
        if accepted.get(sig).is_some_and(|msgs| msgs.iter().any(|m| m == msg)) {
            return Ok(());
        }
        self.inner.verify(msg, sig)?;
        accepted.entry(sig.to_vec()).or_default().push(msg.to_vec());
        Ok(())
    }

    fn public_bytes(&self) -> Vec<u8> {
        self.inner.public_bytes()
    }
}

/// The harness's group: one [`Memo`] shared by all its engines, without a
/// bound. Every broadcast reaches all n simulated members, who decode the
/// same bytes; sharing the memory decodes each element once per run instead
/// of once per member (a real engine remembers its own decodings only).
enum SimGroup {
    Ristretto255(Memo<Ristretto255>),
    Modp(Memo<Modp>),
}

impl SimGroup {
    fn new(id: GroupId) -> Self {
        match id {
            GroupId::Ristretto255 => Self::Ristretto255(Memo::new(Ristretto255, usize::MAX)),
            id => Self::Modp(Memo::new(Modp::new(id), usize::MAX)),
        }
    }

    fn engine(&self, cfg: Config) -> Box<dyn Engine> {
        match self {
            Self::Ristretto255(g) => engine_in(g.clone(), cfg),
            Self::Modp(g) => engine_in(g.clone(), cfg),
        }
    }
}

/// A message on the simulated network, with the critical path behind it.
#[derive(Clone, Debug)]
pub struct Msg {
    /// The signed protocol message.
    pub bytes: Arc<Vec<u8>>,
    /// Work on the longest chain that produced it.
    pub path: Costs,
    /// Messages on that chain, this one included.
    pub depth: u64,
}

/// One simulated member.
pub struct Member {
    /// Its engine.
    pub engine: Box<dyn Engine>,
    rng: ChaCha20Rng,
    clock: Costs,
    depth: u64,
    /// Every secure view it installed, in order.
    pub installs: Vec<SecureView>,
    /// Inputs its engine rejected (none in an honest run).
    pub errors: Vec<Error>,
}

impl Member {
    /// The critical-path costs behind this member's current state, since the
    /// last [`Harness::reset_paths`].
    pub fn critical_path(&self) -> Costs {
        self.clock
    }

    /// The longest message chain behind this member's current state.
    pub fn depth(&self) -> u64 {
        self.depth
    }

    fn absorb(&mut self, before: Costs, res: Result<Vec<Output>, Error>, out: &mut Vec<Outgoing<Msg>>) {
        let spent = self.engine.costs() - before;
        self.clock += spent;
        match res {
            Ok(outputs) => {
                for o in outputs {
                    match o {
                        Output::Send { to, bytes } => out.push(Outgoing {
                            to,
                            msg: Msg { bytes: Arc::new(bytes), path: self.clock, depth: self.depth + 1 },
                        }),
                        Output::Installed(sv) => self.installs.push(sv),
                    }
                }
            }
            Err(Error::Ignored(_)) => {}
            Err(e) => self.errors.push(e),
        }
    }
}

impl SimNode for Member {
    type Msg = Msg;

    fn on_view(&mut self, view: &View, out: &mut Vec<Outgoing<Msg>>) {
        let before = self.engine.costs();
        let res = self.engine.on_view(view, &mut self.rng);
        self.absorb(before, res, out);
    }

    fn on_message(&mut self, from: &MemberId, msg: &Msg, out: &mut Vec<Outgoing<Msg>>) {
        self.clock = self.clock.max(msg.path);
        self.depth = self.depth.max(msg.depth);
        let before = self.engine.costs();
        let res = self.engine.on_message(from, &msg.bytes, &mut self.rng);
        self.absorb(before, res, out);
    }
}

/// What one membership event cost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventCost {
    /// Longest causal chain of messages.
    pub rounds: u64,
    /// Critical-path costs (see the module doc).
    pub serial: Costs,
    /// Sum over all members.
    pub total: Costs,
}

/// Simulated members of one group running one protocol.
pub struct Harness {
    sim: Sim<Member>,
    protocol: ProtocolId,
    group_id: GroupId,
    group: SimGroup,
    scheme: SignatureId,
    directory: Arc<StaticDirectory>,
    pending: Vec<(MemberId, Arc<dyn Signer>)>,
    signers: std::collections::BTreeMap<MemberId, Arc<dyn Signer>>,
    rng: ChaCha20Rng,
    next_name: usize,
}

impl Harness {
    /// An empty harness whose every choice derives from `seed`.
    pub fn new(protocol: ProtocolId, group_id: GroupId, scheme: SignatureId, seed: u64, flush: Flush) -> Self {
        Self {
            sim: Sim::new(seed, flush),
            protocol,
            group_id,
            group: SimGroup::new(group_id),
            scheme,
            directory: Arc::new(StaticDirectory::new()),
            pending: Vec::new(),
            signers: Default::default(),
            rng: ChaCha20Rng::seed_from_u64(seed ^ 0x6b65_7973),
            next_name: 0,
        }
    }

    /// The protocol.
    pub fn protocol(&self) -> ProtocolId {
        self.protocol
    }

    /// Creates `n` members (with identities every member trusts), not yet in
    /// any view, and returns their names.
    pub fn add_members(&mut self, n: usize) -> Result<Vec<MemberId>, Error> {
        let mut ids = Vec::new();
        for _ in 0..n {
            let id = MemberId::new(format!("m{:04}", self.next_name)).expect("valid name");
            self.next_name += 1;
            let signer = generate_signer(self.scheme, &mut self.rng)?;
            Arc::get_mut(&mut self.directory)
                .expect("members are added before any engine exists")
                .insert(id.clone(), Arc::new(RememberingVerifier::new(signer.verifier())));
            self.signers.insert(id.clone(), signer.clone());
            self.pending.push((id.clone(), signer));
            ids.push(id);
        }
        Ok(ids)
    }

    fn materialize(&mut self) {
        // Engines share the final directory; they are created once every
        // identity has been added.
        for (id, signer) in std::mem::take(&mut self.pending) {
            let cfg = Config {
                protocol: self.protocol,
                group_id: self.group_id,
                group: "conclave-sim".into(),
                me: id.clone(),
                signer,
                directory: self.directory.clone(),
            };
            let rng = ChaCha20Rng::seed_from_u64(self.rng.next_u64());
            let m = Member {
                engine: self.group.engine(cfg),
                rng,
                clock: Costs::default(),
                depth: 0,
                installs: Vec::new(),
                errors: Vec::new(),
            };
            self.sim.add_node(id, m).expect("fresh name");
        }
    }

    /// The simulated group communication layer.
    pub fn sim(&mut self) -> &mut Sim<Member> {
        self.materialize();
        &mut self.sim
    }

    /// Read-only access to the simulation.
    pub fn sim_ref(&self) -> &Sim<Member> {
        &self.sim
    }

    /// Starts critical-path accounting afresh at every member (what
    /// [`Harness::event`] does before applying its event), for drivers that
    /// deliver messages themselves.
    pub fn reset_paths(&mut self) {
        self.materialize();
        let ids: Vec<MemberId> = self.sim.nodes().map(|(id, _)| id.clone()).collect();
        for id in &ids {
            let m = self.sim.node_mut(id).expect("exists");
            m.clock = Costs::default();
            m.depth = 0;
        }
    }

    /// Applies `op`, runs to quiescence, and reports what it cost, over all members.
    pub fn event(&mut self, op: impl FnOnce(&mut Sim<Member>) -> Result<(), SimError>) -> Result<EventCost, SimError> {
        self.event_at(None, op)
    }

    /// Like [`Harness::event`], but reports only what the members of `focus`'s
    /// final view did (e.g. the side of a partition that the paper counts).
    pub fn event_at(
        &mut self,
        focus: Option<&MemberId>,
        op: impl FnOnce(&mut Sim<Member>) -> Result<(), SimError>,
    ) -> Result<EventCost, SimError> {
        self.reset_paths();
        let ids: Vec<MemberId> = self.sim.nodes().map(|(id, _)| id.clone()).collect();
        let starts: std::collections::BTreeMap<MemberId, Costs> =
            ids.iter().map(|id| (id.clone(), self.sim.node(id).expect("exists").engine.costs())).collect();
        op(&mut self.sim)?;
        self.sim.run(50_000_000)?;
        let scope: Option<Vec<MemberId>> = match focus {
            Some(f) => {
                Some(self.sim.view_of(f).ok_or_else(|| SimError::NotInView(f.clone()))?.ids().cloned().collect())
            }
            None => None,
        };
        let mut cost = EventCost::default();
        for (id, m) in self.sim.nodes() {
            if scope.as_ref().is_some_and(|s| !s.contains(id)) {
                continue;
            }
            cost.serial = cost.serial.max(m.clock);
            cost.rounds = cost.rounds.max(m.depth);
            cost.total += m.engine.costs() - starts[id];
        }
        Ok(cost)
    }

    /// Checks that in every component each member holds the secure view of
    /// its current view and that all of them hold the same key.
    pub fn check_agreement(&self) -> Result<(), String> {
        for view in self.sim.views() {
            let mut key = None;
            for id in view.ids() {
                let m = self.sim.node(id).expect("member exists");
                let sv = m.engine.secure_view().ok_or_else(|| {
                    format!("{id} has no key for {} (members {:?})", view.id, view.ids().collect::<Vec<_>>())
                })?;
                if sv.view_id != view.id || !sv.members.iter().eq(view.ids()) {
                    return Err(format!("{id} holds a secure view that is not its view {}", view.id));
                }
                match &key {
                    None => key = Some((id.clone(), sv.key.clone())),
                    Some((first, k)) if *k != sv.key => {
                        return Err(format!("{id} and {first} hold different keys in {}", view.id))
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// A message with any round and body, validly signed by `member` for its
    /// current view: how tests and fuzzers reach the protocols' body decoders
    /// past the signature check.
    pub fn sign_as(&self, member: &MemberId, to: Option<&MemberId>, round: u8, body: &[u8]) -> Option<Vec<u8>> {
        let view = self.sim.view_of(member)?;
        let signer = self.signers.get(member)?;
        let mut env = crate::message::Envelope {
            protocol: self.protocol,
            group_id: self.group_id,
            group: "conclave-sim".into(),
            view: view.id,
            run: 0,
            sender: member.clone(),
            recipient: to.cloned(),
            round,
            seq: u32::MAX - (round as u32),
            body: body.to_vec(),
            signature: Vec::new(),
        };
        env.signature = signer.sign(&env.signed_bytes());
        Some(env.encode())
    }

    /// Every engine error so far, with the member that reported it.
    pub fn errors(&self) -> Vec<(MemberId, Error)> {
        self.sim.nodes().flat_map(|(id, m)| m.errors.iter().map(move |e| (id.clone(), e.clone()))).collect()
    }
}
