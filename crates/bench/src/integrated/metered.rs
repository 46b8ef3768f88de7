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
//!   ([`Counting`]) counts every signature its key agreement and its key
//!   confirmation make and every verification it does with the keys its
//!   trust hands out;
//! * **HMACs**: one per keyed view, which the daemon delivers as a
//!   `Delivery::GroupKey` output (not the few of each key confirmation among
//!   the daemons: one to derive its key, and one per daemon's MAC);
//! * **exponentiations**, exactly: the deltas of the daemon's key agreement
//!   engine's meter ([`KeyedDaemon::agreement_exponentiations`]).
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
use conclave_gka::suite::{generate_signer, CryptoError, SignatureId, Signer, Verifier};
use conclave_integrated::{DaemonTrust, KeyedDaemon};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use super::model::OpCosts;

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

/// A keyed daemon whose cryptography takes CPU time (see the module doc).
pub struct Metered {
    inner: KeyedDaemon,
    tally: Arc<Tally>,
    costs: OpCosts,
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
        let exps0 = self.inner.agreement_exponentiations();
        let mut produced = Vec::new();
        call(&mut self.inner, &mut produced);
        let (sigs1, verifs1) = self.tally.read();
        let exps = self.inner.agreement_exponentiations().saturating_sub(exps0);
        let hmacs = produced
            .iter()
            .filter(|o| matches!(o, Output::Deliver { delivery: Delivery::GroupKey { .. }, .. }))
            .count() as u64;
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
pub fn keyed_daemons(n: u16, costs: OpCosts, seed: u64) -> DaemonSim {
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
        Box::new(Metered { inner, tally, costs, busy: 0, queue: VecDeque::new() })
    };
    DaemonSim::with_machines(n, NetConfig::default(), rng.next_u64(), Box::new(make)).expect("a valid network")
}

/// `n` simulated plain daemons (the layered architecture: no daemons' key).
pub fn plain_daemons(n: u16, seed: u64) -> DaemonSim {
    DaemonSim::new(n, NetConfig::default(), seed).expect("a valid network")
}
