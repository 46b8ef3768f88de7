//! A process-wide count of the expensive operations the suites did: every
//! exponentiation (full-size exponent), subgroup check, signature and
//! verification, whoever asked for it — a protocol engine, a secure
//! session's key confirmation or envelope, a daemon.
//!
//! The engines' cost meter ([`crate::meter`]) counts one member's protocol
//! operations, deterministically, and is what the bounds are made of. This
//! counts what the whole process really computed, so that a benchmark can
//! tell the CPU its members spent on cryptography the protocols do not count
//! (subgroup checks, key confirmation, envelope signatures) from the CPU they
//! spent on everything else. Relaxed atomics: a few nanoseconds against
//! operations of tens of microseconds.

use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};

static EXPONENTIATIONS: AtomicU64 = AtomicU64::new(0);
static GENERATOR_EXPONENTIATIONS: AtomicU64 = AtomicU64::new(0);
static SUBGROUP_CHECKS: AtomicU64 = AtomicU64::new(0);
static SIGNATURES: AtomicU64 = AtomicU64::new(0);
static VERIFICATIONS: AtomicU64 = AtomicU64::new(0);
static BATCH_VERIFICATIONS: AtomicU64 = AtomicU64::new(0);

/// Operations counted so far in this process (or between two counts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Exponentiations of a received or computed base with a full-size
    /// exponent (not [`super::Group::exp_small`]'s short public ones).
    pub exponentiations: u64,
    /// Exponentiations of the generator (Ristretto: from a precomputed
    /// table, about a third of the cost).
    pub generator_exponentiations: u64,
    /// Subgroup membership checks that cost an exponentiation (MODP's
    /// `x^q = 1`; a Ristretto decoding has none).
    pub subgroup_checks: u64,
    /// Signatures made.
    pub signatures: u64,
    /// Signatures verified one by one.
    pub verifications: u64,
    /// Signatures verified in batches ([`super::verify_batch`] of Ed25519
    /// keys: about half a single verification's cost each).
    pub batch_verifications: u64,
}

/// What this process has counted since it started.
pub fn tally() -> Tally {
    Tally {
        exponentiations: EXPONENTIATIONS.load(Ordering::Relaxed),
        generator_exponentiations: GENERATOR_EXPONENTIATIONS.load(Ordering::Relaxed),
        subgroup_checks: SUBGROUP_CHECKS.load(Ordering::Relaxed),
        signatures: SIGNATURES.load(Ordering::Relaxed),
        verifications: VERIFICATIONS.load(Ordering::Relaxed),
        batch_verifications: BATCH_VERIFICATIONS.load(Ordering::Relaxed),
    }
}

impl Sub for Tally {
    type Output = Tally;
    fn sub(self, before: Tally) -> Tally {
        Tally {
            exponentiations: self.exponentiations - before.exponentiations,
            generator_exponentiations: self.generator_exponentiations - before.generator_exponentiations,
            subgroup_checks: self.subgroup_checks - before.subgroup_checks,
            signatures: self.signatures - before.signatures,
            verifications: self.verifications - before.verifications,
            batch_verifications: self.batch_verifications - before.batch_verifications,
        }
    }
}

pub(crate) fn exponentiation() {
    EXPONENTIATIONS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn generator_exponentiation() {
    GENERATOR_EXPONENTIATIONS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn subgroup_check() {
    SUBGROUP_CHECKS.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn signature() {
    SIGNATURES.fetch_add(1, Ordering::Relaxed);
}

pub(crate) fn verifications(n: usize) {
    VERIFICATIONS.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn batch_verifications(n: usize) {
    BATCH_VERIFICATIONS.fetch_add(n as u64, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::{generate_signer, Group, GroupId, SignatureId};
    use rand_core::SeedableRng;

    /// Other tests run in parallel in this process: counts only grow, so
    /// each is checked to have grown by at least what this test did.
    #[test]
    fn counts_what_the_suites_compute() {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let g = crate::suite::modp::Modp::new(GroupId::Modp512);
        let before = tally();
        let s = g.random_scalar(&mut rng);
        let e = g.exp_generator(&s);
        let _ = g.exp(&e, &s);
        let _ = g.exp_small(&e, 3);
        assert!(g.decode(&g.encode(&e)).is_ok());
        let signer = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
        let sig = signer.sign(b"m");
        let v = signer.verifier();
        v.verify(b"m", &sig).unwrap();
        crate::suite::verify_batch(&[(&*v, b"m", &sig), (&*v, b"m", &sig)]).unwrap();
        let d = tally() - before;
        assert!(d.exponentiations >= 1 && d.generator_exponentiations >= 1, "{d:?}");
        assert!(d.subgroup_checks >= 1, "{d:?}");
        assert!(d.signatures >= 1 && d.verifications >= 1 && d.batch_verifications >= 2, "{d:?}");
    }
}
