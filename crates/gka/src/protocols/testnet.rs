//! A deterministic, hand-driven network of engines for the protocols' unit
//! tests, generic over the protocol: honest messages wait in a FIFO queue and
//! are delivered one at a time, and validly signed but bogus messages can be
//! forged from any member and offered to any other (insider misbehaviour).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use conclave_gcs::{Cause, MemberId, View, ViewId, ViewMember};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

use crate::engine::{Engine, Error, Output, StaticDirectory};
use crate::message::Envelope;
use crate::suite::{generate_signer, GroupId, SignatureId, Signer};
use crate::{new_engine, Config, GroupKey, ProtocolId};

/// The group name every test network uses.
const GROUP: &str = "testnet";

/// Forged messages are numbered from here: real ones count from 0 in each
/// view, so a forgery is never refused as a replay of a real message.
const FORGED_SEQ: u32 = 1_000_000;

/// A member name.
pub(crate) fn id(s: &str) -> MemberId {
    MemberId::new(s).unwrap()
}

/// A message on the network (`to` is `None` for a broadcast).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Packet {
    pub from: MemberId,
    pub to: Option<MemberId>,
    pub round: u8,
    pub bytes: Vec<u8>,
}

impl Packet {
    /// The body of the envelope.
    pub fn body(&self) -> Vec<u8> {
        Envelope::decode(&self.bytes).unwrap().body
    }
}

/// Engines of one protocol for named members, driven by hand.
pub(crate) struct Net {
    protocol: ProtocolId,
    group_id: GroupId,
    engines: BTreeMap<MemberId, Box<dyn Engine>>,
    signers: BTreeMap<MemberId, Arc<dyn Signer>>,
    pub rng: ChaCha20Rng,
    /// Sent and not yet delivered, oldest first.
    pub queue: VecDeque<Packet>,
    view: Option<View>,
    seq: u32,
}

impl Net {
    /// Engines for `names`, with Ed25519 identities from a `seed`ed RNG (which
    /// then drives the engines) and a directory of them all.
    pub fn new(protocol: ProtocolId, names: &[impl AsRef<str>], seed: u64) -> Self {
        Self::in_group(protocol, GroupId::Ristretto255, names, seed)
    }

    /// As [`Net::new`], computing in `group_id`.
    pub fn in_group(protocol: ProtocolId, group_id: GroupId, names: &[impl AsRef<str>], seed: u64) -> Self {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let mut dir = StaticDirectory::new();
        let mut signers = BTreeMap::new();
        for n in names {
            let s = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
            dir.insert(id(n.as_ref()), s.verifier());
            signers.insert(id(n.as_ref()), s);
        }
        let dir = Arc::new(dir);
        let engines = signers
            .iter()
            .map(|(m, s)| {
                let cfg = Config {
                    protocol,
                    group_id,
                    group: GROUP.into(),
                    me: m.clone(),
                    signer: s.clone(),
                    directory: dir.clone(),
                };
                (m.clone(), new_engine(cfg))
            })
            .collect();
        Self { protocol, group_id, engines, signers, rng, queue: VecDeque::new(), view: None, seq: FORGED_SEQ }
    }

    pub fn engine(&self, m: &str) -> &dyn Engine {
        self.engines[&id(m)].as_ref()
    }

    /// The members of the current view, in view order.
    pub fn members(&self) -> Vec<MemberId> {
        self.view.as_ref().expect("a view").ids().cloned().collect()
    }

    /// Queues what `from` sent; returns it.
    fn absorb(&mut self, from: &MemberId, out: Vec<Output>) -> Vec<Packet> {
        let mut sent = Vec::new();
        for o in out {
            if let Output::Send { to, bytes } = o {
                let round = Envelope::decode(&bytes).unwrap().round;
                sent.push(Packet { from: from.clone(), to, round, bytes });
            }
        }
        self.queue.extend(sent.iter().cloned());
        sent
    }

    /// Installs view `vid` of `(member, previous view)` in view order,
    /// dropping anything still queued; returns what the view triggers.
    pub fn install(&mut self, vid: u64, members: &[(&str, Option<u64>)]) -> Vec<Packet> {
        self.install_in(0, vid, members)
    }

    /// [`Net::install`] in a given daemon incarnation.
    pub fn install_in(&mut self, incarnation: u64, vid: u64, members: &[(&str, Option<u64>)]) -> Vec<Packet> {
        self.queue.clear();
        let view = View {
            id: ViewId::new(incarnation, vid),
            members: members
                .iter()
                .map(|(m, p)| ViewMember { id: id(m), prev: p.map(|p| ViewId::new(0, p)) })
                .collect(),
            cause: Cause::Join,
        };
        let mut sent = Vec::new();
        for m in view.ids() {
            let out = self.engines.get_mut(m).unwrap().on_view(&view, &mut self.rng).unwrap();
            sent.extend(self.absorb(m, out));
        }
        self.view = Some(view);
        sent
    }

    /// Installs view `vid` of `members`: `newcomers` come from no view, the
    /// others from the current one.
    pub fn view(&mut self, vid: u64, members: &[&str], newcomers: &[&str]) -> Vec<Packet> {
        let prev = self.view.as_ref().map(|v| v.id.seq);
        let members: Vec<_> = members.iter().map(|m| (*m, if newcomers.contains(m) { None } else { prev })).collect();
        self.install(vid, &members)
    }

    /// Every member of the view rekeys (as an agreed rekey input would make
    /// them, all at the same point); returns what they send.
    pub fn rekey(&mut self) -> Vec<Packet> {
        self.queue.clear();
        let mut sent = Vec::new();
        for m in self.members() {
            let out = self.engines.get_mut(&m).unwrap().rekey(&mut self.rng).unwrap();
            sent.extend(self.absorb(&m, out));
        }
        sent
    }

    /// Removes the `i`-th queued message.
    pub fn take(&mut self, i: usize) -> Packet {
        self.queue.remove(i).expect("a queued message")
    }

    /// Delivers `p` to its recipients in the view, which must accept it;
    /// queues and returns what they send in turn.
    pub fn deliver(&mut self, p: &Packet) -> Vec<Packet> {
        let mut sent = Vec::new();
        for r in self.members() {
            if p.to.as_ref().is_some_and(|to| to != &r) {
                continue;
            }
            let out = match self.engines.get_mut(&r).unwrap().on_message(&p.from, &p.bytes, &mut self.rng) {
                Ok(out) => out,
                Err(Error::Ignored(_)) => continue, // BD: not a neighbour's value
                Err(e) => panic!("{r} refused {p:?}: {e}"),
            };
            sent.extend(self.absorb(&r, out));
        }
        sent
    }

    /// Delivers the oldest queued message; returns it, `None` when none is left.
    pub fn step(&mut self) -> Option<Packet> {
        let p = self.queue.pop_front()?;
        self.deliver(&p);
        Some(p)
    }

    /// Delivers everything until quiet.
    pub fn run(&mut self) {
        while self.step().is_some() {}
    }

    /// Delivers messages until one matching `f` was delivered.
    pub fn run_until(&mut self, f: impl Fn(&Packet) -> bool) {
        while !f(&self.step().expect("the awaited message")) {}
    }

    /// A message of the current view validly signed by `from`, with any
    /// recipient, round and body.
    pub fn forge(&mut self, from: &str, to: Option<&str>, round: u8, body: Vec<u8>) -> Packet {
        self.seq += 1;
        let mut env = Envelope {
            protocol: self.protocol,
            group_id: self.group_id,
            group: GROUP.into(),
            view: self.view.as_ref().expect("a view").id,
            run: 0,
            sender: id(from),
            recipient: to.map(id),
            round,
            seq: self.seq,
            body,
            signature: Vec::new(),
        };
        env.signature = self.signers[&id(from)].sign(&env.signed_bytes());
        Packet { from: id(from), to: to.map(id), round, bytes: env.encode() }
    }

    /// Offers `p` to `at` alone; returns its verdict (anything it sends is
    /// dropped).
    pub fn offer(&mut self, at: &str, p: &Packet) -> Result<Vec<Output>, Error> {
        self.engines.get_mut(&id(at)).unwrap().on_message(&p.from, &p.bytes, &mut self.rng)
    }

    /// Offers `p` to `at`, which must reject it before any work (no
    /// exponentiation or signature) and without changing state; returns the
    /// error.
    pub fn refuse(&mut self, at: &str, p: &Packet) -> Error {
        self.refused(at, p, "a bogus message")
    }

    fn refused(&mut self, at: &str, p: &Packet, what: &str) -> Error {
        let e = self.engine(at);
        let before = (e.costs(), e.in_progress(), e.secure_view().map(|s| s.key.clone()));
        let err = match self.offer(at, p) {
            Ok(_) => panic!("{at} accepted {what}"),
            Err(err) => err,
        };
        let e = self.engine(at);
        let after = (e.costs(), e.in_progress(), e.secure_view().map(|s| s.key.clone()));
        assert_eq!((after.0.exps, after.0.sigs), (before.0.exps, before.0.sigs), "{at} worked on {what}: {err}");
        assert_eq!((after.1, after.2), (before.1, before.2), "{at} changed state on {what}: {err}");
        err
    }

    /// Forges a message and has `at` [`refuse`](Self::refuse) it.
    pub fn reject(&mut self, at: &str, from: &str, to: Option<&str>, round: u8, body: Vec<u8>) -> Error {
        let p = self.forge(from, to, round, body);
        self.refuse(at, &p)
    }

    /// Forges a broadcast which every other member of the view must refuse.
    pub fn reject_all(&mut self, from: &str, round: u8, body: Vec<u8>, what: &str) {
        let p = self.forge(from, None, round, body);
        for m in self.members() {
            if m != p.from {
                self.refused(m.as_str(), &p, what);
            }
        }
    }

    /// The key `m` installed for its current view, if any.
    pub fn key(&self, m: &str) -> Option<GroupKey> {
        self.engine(m).secure_view().map(|s| s.key.clone())
    }

    /// Every member of the view installed the same key; returns it.
    pub fn agreed(&self) -> GroupKey {
        let keys: Vec<_> = self.members().iter().map(|m| self.key(m.as_str()).expect("installed")).collect();
        assert!(keys.windows(2).all(|w| w[0] == w[1]), "{keys:?}");
        keys[0].clone()
    }
}
