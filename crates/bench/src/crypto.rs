//! `conclave bench crypto`: what each cryptographic operation costs on this
//! machine, for every suite — the per-operation inputs of the `measured` cost
//! model and of the lower bound (critical path × per-operation cost).

use std::hint::black_box;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use conclave_gka::suite::modp::Modp;
use conclave_gka::suite::ristretto::Ristretto255;
use conclave_gka::suite::{generate_signer, verify_batch, Group, GroupId, SignatureId, Verifier};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;
use serde::Serialize;

/// Options of `conclave bench crypto`.
#[derive(Args)]
pub struct CryptoArgs {
    /// Groups to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "ristretto255,modp512,modp1024,modp2048")]
    groups: Vec<String>,
    /// Signature schemes to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "ed25519,rsa1024e3,rsa1024e65537,rsa2048e65537")]
    signatures: Vec<String>,
    /// Timed repetitions per operation (the median is reported).
    #[arg(long, default_value_t = 200)]
    iterations: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    json: bool,
}

/// One measured operation.
#[derive(Serialize, Debug)]
pub struct OpCost {
    pub suite: String,
    pub op: &'static str,
    pub median_us: f64,
    pub p95_us: f64,
}

/// Times `f` `iterations` times (after a short warm-up); returns (median, p95) in µs.
fn time(iterations: usize, mut f: impl FnMut()) -> (f64, f64) {
    for _ in 0..iterations.min(10) {
        f();
    }
    let mut samples: Vec<f64> = (0..iterations)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(|a, b| a.total_cmp(b));
    (samples[samples.len() / 2], samples[(samples.len() * 95 / 100).min(samples.len() - 1)])
}

fn group_ops<G: Group>(g: G, iterations: usize, out: &mut Vec<OpCost>) {
    let mut rng = ChaCha20Rng::seed_from_u64(1);
    let a = g.random_scalar(&mut rng);
    let b = g.random_scalar(&mut rng);
    let base = g.exp_generator(&a);
    let enc = g.encode(&base);
    let name = g.id().name().to_string();
    let mut push = |op, (median_us, p95_us)| out.push(OpCost { suite: name.clone(), op, median_us, p95_us });
    push("exp (variable base)", time(iterations, || drop(black_box(g.exp(black_box(&base), black_box(&b))))));
    push("exp (generator)", time(iterations, || drop(black_box(g.exp_generator(black_box(&b))))));
    push("exp (small, e=31)", time(iterations, || drop(black_box(g.exp_small(black_box(&base), 31)))));
    push("decode + validate", time(iterations, || drop(black_box(g.decode(black_box(&enc))))));
    push("hash to exponent", time(iterations, || drop(black_box(g.hash_to_scalar(b"bench", black_box(&base))))));
    push("exponent inverse", time(iterations, || drop(black_box(g.scalar_invert(black_box(&a))))));
}

/// How many signatures [`BATCH_VERIFY_OP`] checks at once (a few dozen:
/// about what a session's batch of envelopes holds in a large group).
const BATCH: usize = 32;
/// The per-signature cost of Ed25519's batch verification.
pub const BATCH_VERIFY_OP: &str = "verify (200 B, batch of 32, per signature)";

/// Measures one group and one signature scheme (the `measured` cost model).
pub fn measure_suite(group: GroupId, scheme: SignatureId, iterations: usize) -> Result<Vec<OpCost>> {
    let args =
        CryptoArgs { groups: vec![group.name().into()], signatures: vec![scheme.name()], iterations, json: false };
    measure(&args)
}

/// Measures every requested suite.
pub fn measure(args: &CryptoArgs) -> Result<Vec<OpCost>> {
    let mut out = Vec::new();
    for name in &args.groups {
        match conclave_testkit::names::group(name)? {
            GroupId::Ristretto255 => group_ops(Ristretto255, args.iterations, &mut out),
            other => group_ops(Modp::new(other), args.iterations, &mut out),
        }
    }
    let msg = [7u8; 200];
    for name in &args.signatures {
        let scheme = conclave_testkit::names::signature(name)?;
        let mut rng = ChaCha20Rng::seed_from_u64(2);
        let signer = generate_signer(scheme, &mut rng)?;
        let verifier = signer.verifier();
        let sig = signer.sign(&msg);
        let (m, p) = time(args.iterations, || drop(black_box(signer.sign(black_box(&msg)))));
        out.push(OpCost { suite: scheme.name(), op: "sign (200 B)", median_us: m, p95_us: p });
        let (m, p) = time(args.iterations, || drop(black_box(verifier.verify(black_box(&msg), black_box(&sig)))));
        out.push(OpCost { suite: scheme.name(), op: "verify (200 B)", median_us: m, p95_us: p });
        if scheme == SignatureId::Ed25519 {
            // What a session's batch check of many envelopes costs per signature.
            let items: Vec<(&dyn Verifier, &[u8], &[u8])> =
                (0..BATCH).map(|_| (&*verifier, &msg[..], &sig[..])).collect();
            let (m, p) = time(args.iterations, || drop(black_box(verify_batch(black_box(&items)))));
            let per = BATCH as f64;
            out.push(OpCost { suite: scheme.name(), op: BATCH_VERIFY_OP, median_us: m / per, p95_us: p / per });
        }
    }
    Ok(out)
}

/// Runs the benchmark.
pub fn run(args: CryptoArgs) -> Result<()> {
    if args.iterations == 0 {
        anyhow::bail!("--iterations must be at least 1");
    }
    let costs = measure(&args)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&costs)?);
        return Ok(());
    }
    println!("Per-operation cost on this machine (wall clock, {} timed runs each).", args.iterations);
    let mut t = crate::table::new(["suite", "operation", "median µs", "p95 µs"], 2);
    for c in &costs {
        t.add_row(vec![
            c.suite.to_string(),
            c.op.to_string(),
            format!("{:.2}", c.median_us),
            format!("{:.2}", c.p95_us),
        ]);
    }
    println!("{t}");
    Ok(())
}
