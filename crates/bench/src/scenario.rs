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
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
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
    /// A group of n splits into two sides of about n/2 members along a
    /// partition between the servers (§6.1.5: "a network partition between
    /// the servers"): the members of one machine stay on one side.
    Partition,
    /// The two sides of `partition` merge back.
    Merge,
    /// The earlier scenario, kept for comparison: the first n/2 members (in
    /// join order) split from the last n/2, whatever machines they are on.
    PartitionHalves,
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

/// Where a run's members sit: on the simulator's testbed round-robin over the
/// machines in an order drawn from the run's seed (so the joiner, and every
/// member, is on a random machine, as many members per machine as
/// round-robin gives); on a cluster member i on node i mod `machines`. The
/// machines are on the sites of `wan`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    /// Machines (the sim's 13, or a cluster's nodes).
    pub machines: usize,
    /// Network profile: on the WAN the last two machines are at the second
    /// and third sites, the rest at the first.
    pub wan: Wan,
    /// A partition's second side is the members on machines from this one
    /// on; `None`: the simulator's testbed (see [`Placement::sides`]).
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

    /// Whether this is the simulator's testbed (not a cluster's nodes).
    pub fn is_sim(&self) -> bool {
        self.second_side_from.is_none()
    }

    /// The machine of each of `n` members (by join order), for the run of `seed`.
    pub fn machine_of(&self, n: usize, seed: u64) -> Vec<usize> {
        if !self.is_sim() {
            return (0..n).map(|i| i % self.machines).collect();
        }
        // Round-robin over a seeded shuffle of the members.
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed_0016);
        let mut order: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
        }
        let mut machine_of = vec![0; n];
        for (slot, &member) in order.iter().enumerate() {
            machine_of[member] = slot % self.machines;
        }
        machine_of
    }

    /// The two sides of a partition of `ids` (on machines `machine_of`): a
    /// cluster's nodes before and from `second_side_from`; on the simulator a
    /// partition between servers, the machines below k against the rest,
    /// k chosen so that the first side is as close to n/2 members as the
    /// machines allow.
    pub fn sides(&self, ids: &[MemberId], machine_of: &[usize]) -> (Vec<MemberId>, Vec<MemberId>) {
        let from = self.second_side_from.unwrap_or_else(|| {
            let half = ids.len() as f64 / 2.0;
            (1..self.machines)
                .min_by(|&a, &b| {
                    let off = |k: usize| (machine_of.iter().filter(|&&m| m < k).count() as f64 - half).abs();
                    off(a).total_cmp(&off(b))
                })
                .unwrap_or(1)
        });
        let (second, first): (Vec<_>, Vec<_>) = ids.iter().zip(machine_of).partition(|(_, &m)| m >= from);
        (first.into_iter().map(|(m, _)| m.clone()).collect(), second.into_iter().map(|(m, _)| m.clone()).collect())
    }
}

/// The earlier partition scenario: the first n/2 members (join order) and the rest.
pub(crate) fn halves(ids: &[MemberId]) -> (Vec<MemberId>, Vec<MemberId>) {
    (ids[..ids.len() / 2].to_vec(), ids[ids.len() / 2..].to_vec())
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
    // §6.2.1: "JHU - UCI 70, UCI - ICU 300 and ICU - JHU 270" (ping round trips, ms).
    const RTT: [[f64; 3]; 3] = [[0.0, 70.0, 270.0], [70.0, 0.0, 300.0], [270.0, 300.0, 0.0]];
    RTT[a][b] / 2.0
}
