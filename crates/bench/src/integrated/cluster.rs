//! `bench integrated --engine cluster`: Figures 5 and 6 on a Corosync
//! cluster of N nodes in network namespaces whose daemons are certified by a
//! fresh group authority, so they key groups.
//!
//! Every member is a real secure session (the `daemon` engine of `bench
//! events`: [`crate::live`]). Fig. 5: one group of n members; the time from
//! a join or leave request, or a split or heal of the network, until the last
//! member concerned shows the new secure view (its key installed and
//! confirmed, for both policies alike); the key part is the longest any
//! member took from its daemon's view to the key. The membership line —
//! plain clients, no keys — is the part that is the daemons' and Corosync's
//! own. Fig. 6: G groups of `--group-size` members, one split of the network
//! and its heal; the time until every member of every group shows its new
//! secure view.
//!
//! Differences from the paper's testbed, which every number must be read
//! with: 13 dual-CPU machines there, one machine here that runs every member
//! and every daemon (so a time is close to the *sum* of the members' work
//! divided by the cores, not the critical path); 3 daemons here by default,
//! 13 there; a partition and a merge include Corosync's detection of the
//! change (its token timeout and consensus, about 2 s) in both columns alike,
//! so the ratios of partition and merge are smaller than the protocols' own.

use anyhow::{bail, Context, Result};
use conclave_gka::SignatureId;

use super::{fig56_modes, Row, Settings};
use crate::live::{Sample, Target};
use crate::scenario::{TimedEvent, Wan};

/// Root, corosync and the `cluster` feature, or an error that says what is
/// missing.
pub fn preflight() -> Result<()> {
    if !cfg!(feature = "cluster") {
        bail!(
            "--engine cluster needs conclave built with the cluster feature: cargo build --release -p conclave \
             --features cluster (needs corosync's libraries: apt-get install corosync libcorosync-common-dev \
             libcpg-dev libquorum-dev libcfg-dev libcmap-dev libvotequorum-dev); or use --engine sim"
        );
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("--engine cluster needs root (it creates network namespaces and runs corosync in them); or use --engine sim");
    }
    let on_path =
        std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join("corosync").is_file()));
    if !on_path {
        bail!("--engine cluster needs corosync on the PATH (apt-get install corosync); or use --engine sim");
    }
    Ok(())
}

/// Starts the cluster (printing what it set up to `notes`).
pub fn start(nodes: usize, notes: &mut Vec<u8>) -> Result<Target> {
    Target::start(Some(nodes), Wan::Lan, notes)
}

fn mean(samples: &[Sample]) -> f64 {
    samples.iter().map(|s| s.ms).sum::<f64>() / samples.len().max(1) as f64
}

fn mean_key(samples: &[Sample]) -> Option<f64> {
    let keys: Vec<f64> = samples.iter().filter_map(|s| s.key_ms).collect();
    (!keys.is_empty()).then(|| keys.iter().sum::<f64>() / keys.len() as f64)
}

/// Fig. 5 on the cluster: per event and size, the membership line and both
/// architectures.
pub fn fig5(target: &Target, s: &Settings, step: &mut dyn FnMut(String)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (i, &event) in s.events.iter().enumerate() {
        for (j, &n) in s.sizes.iter().enumerate() {
            step(format!("fig. 5: {event:?} at n = {n}"));
            let seed = s.seed + (i * 1000 + j) as u64;
            let membership = target.time_membership(event, n, s.runs, seed)?;
            let row = |mode, samples: &[Sample]| Row {
                confirmed_ms: Some(mean(samples)),
                key_ms: mean_key(samples),
                ..s.row(5, mode, Some(event), 1, n, None, Some(mean(samples)))
            };
            rows.push(row("plaintext", &membership));
            for (mode, policy) in fig56_modes() {
                let samples =
                    target.time(policy, SignatureId::Ed25519, event, n, s.runs, seed).with_context(|| mode)?;
                rows.push(row(mode, &samples));
            }
        }
    }
    Ok(rows)
}

/// Fig. 6 on the cluster: per number of groups, both architectures, a split
/// and a heal.
pub fn fig6(target: &Target, s: &Settings, step: &mut dyn FnMut(String)) -> Result<Vec<Row>> {
    let mut rows = Vec::new();
    for (k, &g) in s.groups.iter().enumerate() {
        for (mode, policy) in fig56_modes() {
            step(format!("fig. 6: {g} groups of {} ({mode})", s.group_size));
            let seed = s.seed + 1_000_000 + k as u64;
            let healed = target
                .time_groups(policy, SignatureId::Ed25519, g, s.group_size, seed)
                .with_context(|| format!("{mode}, {g} groups"))?;
            for (event, sample) in [(TimedEvent::Partition, healed.split), (TimedEvent::Merge, healed.merge)] {
                rows.push(Row {
                    confirmed_ms: Some(sample.ms),
                    key_ms: sample.key_ms,
                    runs: 1,
                    ..s.row(6, mode, Some(event), g, s.group_size, None, Some(sample.ms))
                });
            }
        }
    }
    Ok(rows)
}
