//! The floor under the cluster backbone: agreed-delivery latency of bare CPG
//! multicasts on this node's corosync (see `conclave_bench::floor::raw_cpg_round_trips`).
//!
//! `cargo run --release -p conclave-bench --features cluster --example cpg_floor -- [COUNT] [SIZE] [GROUP]`

use std::time::Duration;

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().map_or(1000, |s| s.parse().expect("COUNT is a number"));
    let size: usize = args.next().map_or(64, |s| s.parse().expect("SIZE is a number of bytes"));
    let group = args.next().unwrap_or_else(|| "conclave-cpg-floor".to_owned());
    let mut times = match conclave_bench::floor::raw_cpg_round_trips(&group, count, size) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("cpg_floor: {e}");
            std::process::exit(1);
        }
    };
    times.sort();
    let at = |q: f64| times.get(((times.len() as f64 - 1.0) * q) as usize).copied().unwrap_or(Duration::ZERO);
    println!(
        "{count} agreed multicasts of {size} bytes: p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );
}
