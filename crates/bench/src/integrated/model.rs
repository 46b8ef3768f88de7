//! The cost model of `bench integrated --engine sim`: what each metered
//! cryptographic operation costs the CPU of the process that does it (a
//! member's session, or a daemon), in virtual microseconds.
//!
//! Only cryptography is charged here. The daemons' own work per operation of
//! the agreed stream and the network are `NetConfig::default()` of
//! `conclave_gcs::daemon_sim` (80 µs one way between daemons plus up to
//! 20 µs jitter, 10 µs between a client and its daemon, 5 µs of daemon CPU
//! per operation, 2 s to detect a partition or merge), in both cost models.

use anyhow::{Context, Result};
use clap::ValueEnum;
use conclave_gka::suite::SignatureId;
use conclave_gka::GroupId;
use serde::Serialize;

use crate::events::model::PIII_666;

/// Where the per-operation costs come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CostsFrom {
    /// This machine's costs, measured at the start of the run.
    Measured,
    /// The TISSEC paper's 2002 LAN testbed (the integrated-architecture paper's
    /// machines: 13 dual 667 MHz Pentium III).
    Tissec2002,
}

impl CostsFrom {
    pub fn name(self) -> &'static str {
        match self {
            CostsFrom::Measured => "measured",
            CostsFrom::Tissec2002 => "tissec2002",
        }
    }
}

/// Per-operation CPU costs, µs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct OpCosts {
    /// One full exponentiation (a ristretto255 scalar multiplication in our
    /// engines; a modular exponentiation on the 2002 testbed).
    pub exp_us: f64,
    /// One signature (Ed25519 here; RSA-1024 on the 2002 testbed).
    pub sign_us: f64,
    /// One verification.
    pub verify_us: f64,
    /// One HMAC-SHA256 over a short input (the Group Keys Engine's one MAC
    /// per keyed view).
    pub hmac_us: f64,
}

impl OpCosts {
    /// The costs of `from`: measured now (`iterations` timed runs each, the
    /// median), or the 2002 testbed's.
    pub fn build(from: CostsFrom, iterations: usize) -> Result<Self> {
        match from {
            CostsFrom::Tissec2002 => Ok(Self::tissec2002()),
            CostsFrom::Measured => Self::measure(iterations),
        }
    }

    /// The 2002 testbed (TISSEC §6.1.1, as `bench events --costs tissec2002`
    /// has it in `events::model::PIII_666`): an exponentiation 1.7 ms (512-bit
    /// modulus, 160-bit exponent: the paper's LAN figures), an RSA-1024
    /// signature 9.6 ms and a verification 0.2 ms. Neither paper gives an
    /// HMAC's cost: 6 µs is our estimate, not a measurement — HMAC-SHA1 over a
    /// short input is four compressions of 64 bytes, at about 15 cycles per
    /// byte on a Pentium III (OpenSSL of the time) about 3,800 cycles, 5.8 µs
    /// at 667 MHz. It is small against everything else either way.
    pub fn tissec2002() -> Self {
        Self {
            exp_us: PIII_666.exp512 * 1e3,
            sign_us: PIII_666.sign * 1e3,
            verify_us: PIII_666.verify * 1e3,
            hmac_us: 6.0,
        }
    }

    /// This machine's costs, measured now: `bench crypto`'s timings of
    /// ristretto255 variable-base exponentiation and Ed25519 signing and
    /// verification of 200 bytes (`crypto::measure_suite`, median), and an
    /// HMAC-SHA256 of a view key's input timed the same way.
    pub fn measure(iterations: usize) -> Result<Self> {
        let ops = crate::crypto::measure_suite(GroupId::Ristretto255, SignatureId::Ed25519, iterations.max(1))?;
        let find = |op: &str| {
            ops.iter().find(|c| c.op == op).map(|c| c.median_us).with_context(|| format!("no measurement of {op}"))
        };
        Ok(Self {
            exp_us: find("exp (variable base)")?,
            sign_us: find("sign (200 B)")?,
            verify_us: find("verify (200 B)")?,
            hmac_us: measure_hmac(iterations.max(1)),
        })
    }

    /// The CPU of `exps` exponentiations, `sigs` signatures, `verifs`
    /// verifications and `hmacs` HMACs, in whole µs.
    pub fn cpu(&self, exps: u64, sigs: u64, verifs: u64, hmacs: u64) -> u64 {
        let us = exps as f64 * self.exp_us
            + sigs as f64 * self.sign_us
            + verifs as f64 * self.verify_us
            + hmacs as f64 * self.hmac_us;
        us.round() as u64
    }
}

/// The median µs of one HMAC-SHA256 keyed with 32 bytes over a view key's
/// input (a label, a group name and a 16-byte view id: about 60 bytes).
fn measure_hmac(iterations: usize) -> f64 {
    use hmac::{Hmac, Mac};
    use std::hint::black_box;
    let key = [7u8; 32];
    let input = [9u8; 60];
    let once = || {
        let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(black_box(&key)).expect("HMAC takes any key");
        mac.update(black_box(&input));
        black_box(mac.finalize().into_bytes());
    };
    for _ in 0..10 {
        once();
    }
    // Each sample times 100 MACs: one is below the clock's resolution.
    let mut samples: Vec<f64> = (0..iterations)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..100 {
                once();
            }
            t.elapsed().as_secs_f64() * 1e6 / 100.0
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_2002_costs_are_the_tissec_testbeds_and_measured_ones_are_positive() {
        let t = OpCosts::tissec2002();
        assert_eq!((t.exp_us, t.sign_us, t.verify_us), (1700.0, 9600.0, 200.0));
        let m = OpCosts::measure(3).unwrap();
        assert!(m.exp_us > 0.0 && m.sign_us > 0.0 && m.verify_us > 0.0 && m.hmac_us > 0.0, "{m:?}");
        assert_eq!(t.cpu(1, 1, 1, 0), 11_500);
    }
}
