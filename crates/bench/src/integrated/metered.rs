//! The simulated keyed daemons of `bench integrated --engine sim`, with their
//! cryptography charged to their CPU.
//!
//! Each daemon is a `conclave_integrated::KeyedDaemon` around the real daemon
//! core, built as `conclave_secure::sim` builds them (an Ed25519 identity per
//! daemon from the seed, every daemon trusting the others), inside
//! [`Metered`], a [`Machine`] that charges what the daemon's cryptography
//! costs and holds the daemon's outputs until its CPU is done with it:
//!
//! * **signatures and verifications**, exactly: the daemon's identity
//!   ([`Counting`]) counts every signature its key agreement makes and every
//!   verification it does with the keys its trust hands out;
//! * **HMACs**, exactly: one per keyed view, which the daemon delivers as a
//!   `Delivery::GroupKey` output;
//! * **exponentiations**, from a calibration: `KeyedDaemon` does not expose
//!   its engine's meter, so [`Calibration`] runs the same agreement (TGDH over
//!   ristretto255 among the same daemon names, from scratch as
//!   `KeyedDaemon::start_agreement` does) in-process once per number of
//!   daemons, and each daemon is charged its engine's exponentiations, spread
//!   over the calls in which it sends a message of the agreement or installs
//!   the key, in the calibration's order. Totals are exact; the split between
//!   a daemon's calls is the calibration's (its stream order may differ from
//!   the simulation's).
//!
//! The daemon's cryptography runs on a CPU of its own (the paper's testbed
//! machines had two), in order: a call's outputs leave when the CPU has done
//! that call's cryptography and every earlier call's. Its per-operation work
//! stays on the simulated machine's CPU (`NetConfig::cpu_per_op`), which its
//! members share; outputs released by the timer pay that once more.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use conclave_gcs::core::{Core, DaemonId, Delivery, Limits, Machine, Op, Output};
use conclave_gcs::daemon_sim::{DaemonSim, NetConfig};
use conclave_gcs::{Cause, View, ViewId, ViewMember};
use conclave_gka::suite::{generate_signer, CryptoError, SignatureId, Signer, Verifier};
use conclave_gka::{GroupId, Output as EngineOutput, ProtocolId, StaticDirectory};
use conclave_integrated::{daemon_member, DaemonTrust, KeyedDaemon, DAEMON_GROUP};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use super::model::OpCosts;

/// The first byte of a daemons' key agreement message in an `Op::DaemonKa`
/// (`conclave_integrated`'s private `ka_kind::AGREEMENT`).
const KA_AGREEMENT: u8 = 1;

/// Signatures and verifications made through one daemon's identity.
#[derive(Default)]
pub struct Tally {
    sigs: AtomicU64,
    verifs: AtomicU64,
}

impl Tally {
    fn read(&self) -> (u64, u64) {
        (self.sigs.load(Ordering::Relaxed), self.verifs.load(Ordering::Relaxed))
    }
}

/// A signer or verifier that counts its uses into a [`Tally`].
pub struct Counting<T: ?Sized> {
    inner: Arc<T>,
    tally: Arc<Tally>,
}

impl Signer for Counting<dyn Signer> {
    fn scheme(&self) -> SignatureId {
        self.inner.scheme()
    }
    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        self.tally.sigs.fetch_add(1, Ordering::Relaxed);
        self.inner.sign(msg)
    }
    fn verifier(&self) -> Arc<dyn Verifier> {
        self.inner.verifier()
    }
}

impl Verifier for Counting<dyn Verifier> {
    fn scheme(&self) -> SignatureId {
        self.inner.scheme()
    }
    fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        self.tally.verifs.fetch_add(1, Ordering::Relaxed);
        self.inner.verify(msg, sig)
    }
    fn public_bytes(&self) -> Vec<u8> {
        self.inner.public_bytes()
    }
    // No `as_ed25519`: a batch of these is checked one by one, and counted.
}

/// A daemon's identity and its trust in the others (every daemon of the
/// simulation), counting what it signs and verifies.
struct CountingTrust {
    me: Arc<dyn Signer>,
    keys: Arc<BTreeMap<DaemonId, Arc<dyn Verifier>>>,
    tally: Arc<Tally>,
}

impl DaemonTrust for CountingTrust {
    fn signer(&self) -> Arc<dyn Signer> {
        Arc::new(Counting::<dyn Signer> { inner: self.me.clone(), tally: self.tally.clone() })
    }
    fn credential(&self) -> Vec<u8> {
        Vec::new()
    }
    fn verify(&self, daemon: DaemonId, _credential: &[u8]) -> Result<Arc<dyn Verifier>, String> {
        let key = self.keys.get(&daemon).ok_or_else(|| format!("daemon {} is unknown", daemon.0))?;
        Ok(Arc::new(Counting::<dyn Verifier> { inner: key.clone(), tally: self.tally.clone() }))
    }
}

/// The exponentiations of the daemons' agreement from scratch among k
/// daemons: for daemon i (its rank among them), what its engine spent in each
/// of its calls that sent a message or installed the key, in order (the
/// exponentiations of calls that did neither are added to its next such
/// call).
pub struct Calibration {
    by_size: BTreeMap<usize, Vec<Vec<u64>>>,
}

impl Calibration {
    /// Runs the agreement among 1..=`max` daemons once each.
    pub fn new(max: usize, seed: u64) -> Self {
        let by_size = (1..=max.max(1)).map(|k| (k, calibrate(k, seed ^ k as u64))).collect();
        Self { by_size }
    }

    /// Daemon `rank`'s exponentiations in its `call`-th active call of an
    /// agreement among `k`; `None` past its last.
    fn exps(&self, k: usize, rank: usize, call: usize) -> u64 {
        self.by_size.get(&k).and_then(|d| d.get(rank)).and_then(|c| c.get(call)).copied().unwrap_or(0)
    }

    /// Daemon `rank`'s exponentiations in the whole agreement among `k`.
    #[cfg(test)]
    pub fn total(&self, k: usize, rank: usize) -> u64 {
        self.by_size.get(&k).and_then(|d| d.get(rank)).map_or(0, |c| c.iter().sum())
    }
}

/// One agreement among `k` daemons, in-process, its broadcasts delivered to
/// every daemon (the sender too, as the stream does) in the order sent.
fn calibrate(k: usize, seed: u64) -> Vec<Vec<u64>> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let ids: Vec<DaemonId> = (0..k as u16).map(DaemonId).collect();
    let signers: Vec<Arc<dyn Signer>> =
        ids.iter().map(|_| generate_signer(SignatureId::Ed25519, &mut rng).expect("Ed25519 keys")).collect();
    let mut directory = StaticDirectory::new();
    for (d, s) in ids.iter().zip(&signers) {
        directory.insert(daemon_member(*d), s.verifier());
    }
    let view = View {
        id: ViewId::new(seed, 1),
        members: ids.iter().map(|&d| ViewMember { id: daemon_member(d), prev: None }).collect(),
        cause: Cause::Network,
    };
    let mut engines: Vec<_> = ids
        .iter()
        .zip(&signers)
        .map(|(&d, s)| {
            conclave_gka::new_engine(conclave_gka::Config {
                protocol: ProtocolId::Tgdh,
                group_id: GroupId::Ristretto255,
                group: DAEMON_GROUP.to_string(),
                me: daemon_member(d),
                signer: s.clone(),
                directory: Arc::new(directory.clone()),
            })
        })
        .collect();
    let mut tally = CalibrationTally { calls: vec![Vec::new(); k], pending: vec![0; k], queue: VecDeque::new() };
    for (i, e) in engines.iter_mut().enumerate() {
        let before = e.costs().exps;
        let outs = e
            .observe(&view)
            .and_then(|()| e.start(&directory, &mut rng))
            .and_then(|_| e.rekey(&mut rng))
            .expect("the daemons' agreement starts");
        tally.step(i, e.costs().exps - before, outs);
    }
    while let Some((from, bytes)) = tally.queue.pop_front() {
        let sender = daemon_member(ids[from]);
        for (i, e) in engines.iter_mut().enumerate() {
            let before = e.costs().exps;
            let outs = e.on_message(&sender, &bytes, &mut rng).unwrap_or_default();
            tally.step(i, e.costs().exps - before, outs);
        }
    }
    tally.calls
}

/// What [`calibrate`] gathers.
struct CalibrationTally {
    calls: Vec<Vec<u64>>,
    pending: Vec<u64>,
    queue: VecDeque<(usize, Vec<u8>)>,
}

impl CalibrationTally {
    /// Daemon `i`'s engine spent `exps` in a call that output `outs`.
    fn step(&mut self, i: usize, exps: u64, outs: Vec<EngineOutput>) {
        self.pending[i] += exps;
        let mut active = false;
        for o in outs {
            match o {
                EngineOutput::Send { bytes, .. } => {
                    self.queue.push_back((i, bytes));
                    active = true;
                }
                EngineOutput::Installed(_) => active = true,
            }
        }
        if active {
            self.calls[i].push(std::mem::take(&mut self.pending[i]));
        }
    }
}

/// A keyed daemon whose cryptography takes CPU time (see the module doc).
pub struct Metered {
    inner: KeyedDaemon,
    me: DaemonId,
    tally: Arc<Tally>,
    costs: OpCosts,
    calibration: Arc<Calibration>,
    /// Active calls of the agreement under way so far, and whether one is.
    calls: usize,
    agreeing: bool,
    /// The daemons' key epoch last seen.
    epoch: Option<conclave_gka::Epoch>,
    /// When the daemon's crypto CPU is free, and the outputs waiting for it.
    busy: u64,
    queue: VecDeque<(u64, Vec<Output>)>,
}

impl Metered {
    /// The daemons' key agreements this daemon completed.
    #[cfg(test)]
    pub fn agreements(&self) -> u64 {
        self.inner.agreements()
    }

    /// Runs one call of the inner daemon at `now` and charges it.
    fn charge(&mut self, now: u64, out: &mut Vec<Output>, call: impl FnOnce(&mut KeyedDaemon, &mut Vec<Output>)) {
        let (sigs0, verifs0) = self.tally.read();
        let mut produced = Vec::new();
        call(&mut self.inner, &mut produced);
        let (sigs1, verifs1) = self.tally.read();
        let hmacs = produced
            .iter()
            .filter(|o| matches!(o, Output::Deliver { delivery: Delivery::GroupKey { .. }, .. }))
            .count() as u64;
        let sent = produced.iter().any(
            |o| matches!(o, Output::Submit(Op::DaemonKa { payload, .. }) if payload.first() == Some(&KA_AGREEMENT)),
        );
        let epoch = self.inner.server_epoch();
        let installed = epoch.is_some() && epoch != self.epoch;
        if installed && !self.agreeing {
            // Alone in a new configuration: agreed within this one call.
            self.calls = 0;
        }
        if epoch.is_none() && !self.agreeing {
            // A new configuration: a new agreement from scratch.
            self.agreeing = true;
            self.calls = 0;
        }
        let mut exps = 0;
        if sent || installed {
            let daemons = self.inner.keyed_daemons().or_else(|| self.inner.core().configuration().map(|c| c.1));
            let daemons = daemons.unwrap_or_default();
            let k = daemons.len().max(1);
            let rank = daemons.iter().position(|&d| d == self.me).unwrap_or(0);
            exps = self.calibration.exps(k, rank, self.calls);
            self.calls += 1;
            if installed {
                // Whatever the calibration has after this call is charged now.
                let rest: u64 = (self.calls..).map_while(|c| self.calibration.by_size.get(&k)?.get(rank)?.get(c)).sum();
                exps += rest;
                self.agreeing = false;
            }
        }
        self.epoch = epoch;
        let cpu = self.costs.cpu(exps, sigs1 - sigs0, verifs1 - verifs0, hmacs);
        if cpu == 0 && self.queue.is_empty() {
            out.extend(produced);
            return;
        }
        self.busy = self.busy.max(now) + cpu;
        self.queue.push_back((self.busy, produced));
    }

    /// Passes on every output whose CPU is done by `now`.
    fn release(&mut self, now: u64, out: &mut Vec<Output>) {
        while self.queue.front().is_some_and(|(at, _)| *at <= now) {
            out.extend(self.queue.pop_front().expect("checked").1);
        }
    }
}

impl Machine for Metered {
    fn handle(&mut self, op: Op, now: u64, out: &mut Vec<Output>) {
        self.charge(now, out, |d, o| d.handle(op, now, o));
        self.release(now, out);
    }

    fn poll_timeout(&self) -> Option<u64> {
        let mine = self.queue.front().map(|(at, _)| *at);
        match (mine, self.inner.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn handle_timeout(&mut self, now: u64, out: &mut Vec<Output>) {
        if self.inner.poll_timeout().is_some_and(|t| t <= now) {
            self.charge(now, out, |d, o| d.handle_timeout(now, o));
        }
        self.release(now, out);
    }

    fn submit(&mut self, op: Op, now: u64, out: &mut Vec<Output>) {
        self.charge(now, out, |d, o| d.submit(op, now, o));
        self.release(now, out);
    }

    fn routes_submissions(&self) -> bool {
        self.inner.routes_submissions()
    }

    fn core(&self) -> &Core {
        self.inner.core()
    }
}

/// `n` simulated keyed daemons, metered with `costs`.
pub fn keyed_daemons(n: u16, costs: OpCosts, calibration: Arc<Calibration>, seed: u64) -> DaemonSim {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let signers: Vec<Arc<dyn Signer>> =
        (0..n).map(|_| generate_signer(SignatureId::Ed25519, &mut rng).expect("Ed25519 keys")).collect();
    let keys: Arc<BTreeMap<DaemonId, Arc<dyn Verifier>>> =
        Arc::new(signers.iter().enumerate().map(|(d, s)| (DaemonId(d as u16), s.verifier())).collect());
    let salt = rng.next_u64();
    let make = move |id: DaemonId, incarnation: u64| -> Box<dyn Machine> {
        let tally = Arc::new(Tally::default());
        let trust = CountingTrust { me: signers[usize::from(id.0)].clone(), keys: keys.clone(), tally: tally.clone() };
        let rng = Box::new(ChaCha20Rng::seed_from_u64(incarnation ^ salt));
        let inner = KeyedDaemon::new(Core::new(id, Limits::default(), incarnation), trust, rng);
        let epoch = inner.server_epoch();
        Box::new(Metered {
            inner,
            me: id,
            tally,
            costs,
            calibration: calibration.clone(),
            calls: 0,
            agreeing: false,
            epoch,
            busy: 0,
            queue: VecDeque::new(),
        })
    };
    DaemonSim::with_machines(n, NetConfig::default(), rng.next_u64(), Box::new(make)).expect("a valid network")
}

/// `n` simulated plain daemons (the layered architecture: no daemons' key).
pub fn plain_daemons(n: u16, seed: u64) -> DaemonSim {
    DaemonSim::new(n, NetConfig::default(), seed).expect("a valid network")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_daemon_exponentiates_in_an_agreement_of_several() {
        let c = Calibration::new(4, 1);
        for k in 2..=4 {
            for rank in 0..k {
                assert!(c.total(k, rank) > 0, "{k} daemons, rank {rank}");
            }
        }
    }
}
