//! `conclave bench integrated`: the layered against the integrated
//! architecture on real daemons, beside Figures 5 and 6 of "Scaling Secure
//! Group Communication Systems: Beyond Peer-to-Peer" (Amir, Nita-Rotaru,
//! Stanton, Tsudik; DISCEX III, 2003).
//!
//! Every member is a real secure session (the `daemon` engine of `bench
//! events`: [`crate::live`]), on a Corosync cluster of N nodes in network
//! namespaces whose daemons are certified by a fresh group authority, so
//! they key groups. Two policies run the same events:
//! * **layered** — `tgdh`: the members of each group run TGDH themselves
//!   (the paper's choice for the layered architecture, §5.1);
//! * **integrated** — `integrated-vs`: the daemons agree one key with TGDH
//!   among themselves and give every view its key by one HMAC.
//!
//! Fig. 5: one group of n members; the time from a join or leave request, or
//! a split or heal of the network, until the last member concerned shows the
//! new secure view (its key installed and, for both policies, confirmed the
//! same way). The membership line — plain clients, no keys — is the part
//! that is the daemons' and Corosync's own.
//!
//! Fig. 6: G groups of `--group-size` members each (13 in the paper: its
//! number of servers), one split of the network and its heal; the time until
//! every member of every group shows its new secure view. The layered
//! architecture runs one key agreement per group, the integrated one a
//! single agreement among the daemons and an HMAC per group.
//!
//! Differences from the paper's testbed, which every number must be read
//! with: 13 dual-CPU machines there, one 2-core machine here that runs every
//! member and every daemon (so a time is close to the *sum* of the members'
//! work divided by 2, not the critical path); 3 daemons here by default, 13
//! there; a partition and a merge include Corosync's detection of the change
//! (its token timeout and consensus, about 2 s) in both columns alike, so
//! the ratios of partition and merge are smaller than the protocols' own.

use std::io::Write;

use anyhow::{bail, Context, Result};
use clap::Args;
use conclave_gka::{GroupId, ProtocolId, SignatureId};
use conclave_secure::Policy;
use serde_json::json;

use crate::live::{Healed, Sample, Target};
use crate::scenario::{TimedEvent, Wan};

/// Options of `conclave bench integrated`.
#[derive(Args)]
pub struct IntegratedArgs {
    /// Cluster nodes (each a network namespace with corosync and a daemon); a partition puts the last ⌊N/2⌋ on
    /// a side of their own. Needs root, corosync and a build with --features cluster.
    #[arg(long, value_name = "N", default_value_t = 3)]
    cluster: usize,
    /// Fig. 5: group sizes (comma-separated; at least N for a partition to have two sides).
    #[arg(long, value_delimiter = ',', default_value = "13,26,52")]
    sizes: Vec<usize>,
    /// Fig. 5: events (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "join,leave,partition,merge")]
    events: Vec<TimedEvent>,
    /// Fig. 5: runs per point (the table shows their mean).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Fig. 6: numbers of groups (comma-separated; 0 or empty for none).
    #[arg(long, value_delimiter = ',', default_value = "1,10,50,100")]
    groups: Vec<usize>,
    /// Fig. 6: members per group (the paper's 13).
    #[arg(long, default_value_t = 13)]
    group_size: usize,
    /// First seed (members' identity keys).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one JSON object ({"fig5": [...], "fig6": [...]}) instead of tables.
    #[arg(long)]
    json: bool,
}

/// The two architectures, as policies.
fn policies() -> [(&'static str, Policy); 2] {
    [("layered", Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255)), ("integrated", Policy::integrated())]
}

fn mean(samples: &[Sample]) -> f64 {
    samples.iter().map(|s| s.ms).sum::<f64>() / samples.len().max(1) as f64
}

/// The mean of the samples' key parts (secure members only).
fn mean_key(samples: &[Sample]) -> f64 {
    let keys: Vec<f64> = samples.iter().filter_map(|s| s.key_ms).collect();
    keys.iter().sum::<f64>() / keys.len().max(1) as f64
}

/// One Fig. 5 point: the event, n, the membership line's mean, and per
/// architecture the mean total and the mean key part, in ms.
struct Fig5 {
    event: TimedEvent,
    n: usize,
    membership: f64,
    total: [f64; 2],
    key: [f64; 2],
}

/// Runs the benchmark.
pub fn run(args: IntegratedArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    if let Some(&n) = args.sizes.iter().find(|&&n| n < args.cluster.max(2)) {
        bail!("group size {n} is smaller than the {} nodes: a partition would leave a side empty", args.cluster);
    }
    if args.group_size < args.cluster.max(2) {
        bail!("--group-size {} is smaller than the {} nodes", args.group_size, args.cluster);
    }
    if let Some(e) = args
        .events
        .iter()
        .find(|e| !matches!(e, TimedEvent::Join | TimedEvent::Leave | TimedEvent::Partition | TimedEvent::Merge))
    {
        bail!("{e:?} is not one of Fig. 5's events (join, leave, partition, merge)");
    }
    let groups: Vec<usize> = args.groups.iter().copied().filter(|&g| g > 0).collect();
    let mut out = std::io::stdout().lock();
    let mut notes = Vec::new();
    let target = Target::start(Some(args.cluster), Wan::Lan, &mut notes)?;
    if !args.json {
        out.write_all(&notes)?;
    }
    let scheme = SignatureId::Ed25519;

    // Fig. 5.
    let total = args.events.len() * args.sizes.len();
    let mut fig5 = Vec::new();
    for (i, &event) in args.events.iter().enumerate() {
        for (j, &n) in args.sizes.iter().enumerate() {
            eprintln!("fig. 5: {event:?} at n = {n} ({} of {total})", i * args.sizes.len() + j + 1);
            let seed = args.seed + (i * 1000 + j) as u64;
            let membership = mean(&target.time_membership(event, n, args.runs, seed)?);
            let (mut total, mut key) = ([0.0; 2], [0.0; 2]);
            for (k, (name, policy)) in policies().into_iter().enumerate() {
                let samples = target.time(policy, scheme, event, n, args.runs, seed).with_context(|| name)?;
                total[k] = mean(&samples);
                key[k] = mean_key(&samples);
            }
            fig5.push(Fig5 { event, n, membership, total, key });
        }
    }

    if !args.json && !fig5.is_empty() {
        writeln!(
            out,
            "\nFig. 5: one group, mean of {} runs. total: ms from the event until the last member shows its new \
             secure view; key: the longest any member took from its daemon's view to the key (the key \
             management's part)",
            args.runs
        )?;
        let mut t = crate::table::new(
            [
                "event",
                "n",
                "membership",
                "layered total",
                "integrated total",
                "ratio",
                "layered key",
                "integrated key",
                "ratio",
            ],
            1,
        );
        for p in &fig5 {
            t.add_row(vec![
                format!("{:?}", p.event).to_lowercase(),
                p.n.to_string(),
                format!("{:.1}", p.membership),
                format!("{:.1}", p.total[0]),
                format!("{:.1}", p.total[1]),
                format!("{:.2}", p.total[0] / p.total[1]),
                format!("{:.1}", p.key[0]),
                format!("{:.1}", p.key[1]),
                format!("{:.2}", p.key[0] / p.key[1]),
            ]);
        }
        writeln!(out, "{t}")?;
    }

    // Fig. 6.
    let mut fig6 = Vec::new();
    for (k, &g) in groups.iter().enumerate() {
        let mut row = Vec::new();
        for (name, policy) in policies() {
            eprintln!("fig. 6: {g} groups of {} ({name}; {} of {})", args.group_size, k + 1, groups.len());
            let seed = args.seed + 1_000_000 + k as u64;
            match target.time_groups(policy, scheme, g, args.group_size, seed) {
                Ok(healed) => row.push(healed),
                Err(e) => {
                    // What was measured is not lost.
                    if !args.json {
                        print_fig6(&mut out, &fig6, args.group_size)?;
                    }
                    return Err(e.context(format!("{name}, {g} groups")));
                }
            }
        }
        fig6.push((g, row[0], row[1]));
    }

    if args.json {
        let key = |s: &Sample| s.key_ms.unwrap_or(f64::NAN);
        let fig5: Vec<_> = fig5
            .iter()
            .map(|p| {
                json!({"event": format!("{:?}", p.event).to_lowercase(), "n": p.n, "runs": args.runs,
                       "membership_ms": p.membership,
                       "layered_ms": p.total[0], "integrated_ms": p.total[1],
                       "layered_key_ms": p.key[0], "integrated_key_ms": p.key[1],
                       "layered_over_integrated": p.total[0] / p.total[1],
                       "layered_over_integrated_key": p.key[0] / p.key[1]})
            })
            .collect();
        let fig6: Vec<_> = fig6
            .iter()
            .map(|(g, l, i)| {
                json!({"groups": g, "group_size": args.group_size,
                       "layered_partition_ms": l.split.ms, "integrated_partition_ms": i.split.ms,
                       "layered_partition_key_ms": key(&l.split), "integrated_partition_key_ms": key(&i.split),
                       "layered_merge_ms": l.merge.ms, "integrated_merge_ms": i.merge.ms,
                       "layered_merge_key_ms": key(&l.merge), "integrated_merge_key_ms": key(&i.merge)})
            })
            .collect();
        writeln!(out, "{}", serde_json::to_string_pretty(&json!({"fig5": fig5, "fig6": fig6}))?)?;
        return Ok(());
    }
    print_fig6(&mut out, &fig6, args.group_size)
}

/// The Fig. 6 table of the rows so far (layered, integrated per number of groups).
fn print_fig6(out: &mut impl Write, fig6: &[(usize, Healed, Healed)], group_size: usize) -> Result<()> {
    let key = |s: &Sample| s.key_ms.unwrap_or(f64::NAN);
    if !fig6.is_empty() {
        writeln!(
            out,
            "\nFig. 6: groups of {} members, one network split and its heal: ms until every member of every group \
             shows its new secure view (total), and the longest any member took from its daemon's view to the key \
             (key)",
            group_size
        )?;
        let mut t = crate::table::new(
            ["groups", "event", "layered total", "integrated total", "ratio", "layered key", "integrated key", "ratio"],
            2,
        );
        for (g, l, i) in fig6 {
            for (event, l, i) in [("partition", &l.split, &i.split), ("merge", &l.merge, &i.merge)] {
                t.add_row(vec![
                    g.to_string(),
                    event.to_string(),
                    format!("{:.0}", l.ms),
                    format!("{:.0}", i.ms),
                    format!("{:.2}", l.ms / i.ms),
                    format!("{:.1}", key(l)),
                    format!("{:.1}", key(i)),
                    format!("{:.2}", key(l) / key(i)),
                ]);
            }
        }
        writeln!(out, "{t}")?;
    }
    Ok(())
}
