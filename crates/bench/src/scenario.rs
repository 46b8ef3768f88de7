//! The scenario vocabulary the benchmarks share: the membership events they
//! run and where the members sit.
//!
//! * [`Event`] — the membership events of `bench counts` and of the TISSEC
//!   paper's Tables I and II ([`crate::paper`]).
//! * [`TimedEvent`] — the events of the §6.1.2 scenarios that `bench events`
//!   times, on the simulator ([`crate::events`]) and over real daemons
//!   ([`crate::live`]).
//! * [`Wan`], [`Placement`], [`one_way`] — the network: the sites of the
//!   §6.2.1 WAN with their round trips, which machine each member is on and
//!   which members a partition separates.
//!
//! It depends on no command module, so the commands depend on it and never
//! on each other for it.

use clap::ValueEnum;
use conclave_gcs::MemberId;
use serde::Serialize;

/// Membership events of `bench counts` (and of the TISSEC paper's Tables I
/// and II, [`crate::paper`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    /// One member joins a group of n.
    Join,
    /// One member (the middle one in view order) leaves a group of n.
    Leave,
    /// A keyed group of m merges with a keyed group of n.
    Merge,
    /// The p most recent members of a group of n are cut off (the n-p side is counted).
    Partition,
    /// The oldest member (CKD's controller) leaves a group of n.
    ControllerLeave,
}

/// Network profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Wan {
    /// One site.
    Lan,
    /// Three sites: JHU (11 machines), UCI, ICU (§6.2.1).
    Tissec2002,
}

/// Events of the §6.1.2 scenarios.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimedEvent {
    /// One member joins a group of n−1.
    Join,
    /// A random member of n leaves (STR: the middle member of the chain).
    Leave,
    /// A group of n splits into two halves.
    Partition,
    /// Two halves of n merge back.
    Merge,
    /// Fig. 13's first partition P1: the odd-numbered members (in join order:
    /// 1st, 3rd, …, so the oldest) split from the even-numbered ones, which
    /// cuts across every tree.
    PartitionP1,
    /// Fig. 13's second partition P2: the same split as P1, again, after the
    /// two sides of P1 merged back. TGDH and STR gain from the clustering
    /// of the merged tree (§6.1.5); the others pay about what P1 cost.
    PartitionP2,
}

impl TimedEvent {
    /// Whether the event splits or heals a group (a standalone daemon cannot).
    pub fn needs_a_network(self) -> bool {
        !matches!(self, TimedEvent::Join | TimedEvent::Leave)
    }
}

/// Machines of the simulator's testbed (the paper's 13).
pub(crate) const MACHINES: usize = 13;

/// The site of `machine` of the simulator's testbed.
pub(crate) fn site(machine: usize, wan: Wan) -> usize {
    Placement::sim(wan).site(machine)
}

/// Where a run's members sit: member i on machine i mod `machines`, the
/// machines on the sites of `wan`, and which members a partition puts on
/// its second side.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    /// Machines (the sim's 13, or a cluster's nodes).
    pub machines: usize,
    /// Network profile: on the WAN the last two machines are at the second
    /// and third sites, the rest at the first.
    pub wan: Wan,
    /// A partition's second side is the members on machines from this one
    /// on; `None`: the sim's halves (the first and last n/2 members).
    pub second_side_from: Option<usize>,
}

impl Placement {
    /// The simulator's testbed.
    pub fn sim(wan: Wan) -> Self {
        Placement { machines: MACHINES, wan, second_side_from: None }
    }

    /// The site of `machine`.
    pub fn site(&self, machine: usize) -> usize {
        match self.wan {
            Wan::Lan => 0,
            Wan::Tissec2002 => (machine + 3).saturating_sub(self.machines).min(2),
        }
    }

    /// The two sides of a partition of `ids`.
    pub fn sides(&self, ids: &[MemberId]) -> (Vec<MemberId>, Vec<MemberId>) {
        match self.second_side_from {
            None => (ids[..ids.len() / 2].to_vec(), ids[ids.len() / 2..].to_vec()),
            Some(from) => {
                let (second, first): (Vec<_>, Vec<_>) =
                    ids.iter().enumerate().partition(|(i, _)| i % self.machines >= from);
                (
                    first.into_iter().map(|(_, m)| m.clone()).collect(),
                    second.into_iter().map(|(_, m)| m.clone()).collect(),
                )
            }
        }
    }
}

/// Fig. 13's sides: the odd-numbered members (1st, 3rd, … in join order) and
/// the even-numbered ones.
pub(crate) fn odd_even(ids: &[MemberId]) -> (Vec<MemberId>, Vec<MemberId>) {
    let (odd, even): (Vec<_>, Vec<_>) = ids.iter().cloned().enumerate().partition(|(i, _)| i % 2 == 0);
    (odd.into_iter().map(|(_, m)| m).collect(), even.into_iter().map(|(_, m)| m).collect())
}

/// Names of the WAN's sites, by site number (§6.2.1); the cluster engine prints them.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) const SITES: [&str; 3] = ["JHU", "UCI", "ICU"];

/// One-way delay between two sites of the WAN, in ms (half the round trip).
pub(crate) fn one_way(a: usize, b: usize) -> f64 {
    const RTT: [[f64; 3]; 3] = [[0.0, 70.0, 300.0], [70.0, 0.0, 270.0], [300.0, 270.0, 0.0]];
    RTT[a][b] / 2.0
}
