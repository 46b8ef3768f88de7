//! Data-out renewal on simulated daemons, with clients that behave as
//! secure sessions do after a view: each confirms the view's key, and once
//! every member has, sends again what it sent for an earlier view and did
//! not get back in it (a member accepts a message only in the view it was
//! made for). A renewal's new view makes all of that traffic again, so
//! renewals must leave room for it to get through (`conclave sim` seed
//! 10533 was refreshed some 39,000 times).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, GroupMode, Limits, Machine, Op, Service};
use conclave_gcs::daemon_sim::{DaemonSim, Micros, NetConfig, Reaction};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_gka::suite::ed25519::Ed25519Signer;
use conclave_gka::suite::Signer;
use conclave_integrated::{DaemonIdentities, KeyedDaemon};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

/// Sizes like the secure session's: a key confirmation, a data message.
const CONFIRM: usize = 117;
const DATA: usize = 139;
const CONFIRM_TAG: u8 = 7;
const DATA_TAG: u8 = 2;

fn group() -> GroupName {
    GroupName::new("k").unwrap()
}

fn keyed_sim(net: NetConfig, seed: u64, limit: u64) -> DaemonSim {
    common::keyed_sim(3, net, seed, move |daemon| daemon.with_data_limit(limit).with_sealed_backbone())
}

/// A frame made for `view`: tag, view, message number, padding to `len`.
fn frame(tag: u8, view: ViewId, n: u32, len: usize) -> bytes::Bytes {
    let mut p = vec![tag];
    p.extend_from_slice(&view.to_bytes());
    p.extend_from_slice(&n.to_be_bytes());
    p.resize(len, 0);
    p.into()
}

fn parse(p: &[u8]) -> (u8, ViewId, u32) {
    (p[0], ViewId::from_bytes(p[1..17].try_into().unwrap()), u32::from_be_bytes(p[17..21].try_into().unwrap()))
}

/// One member, as a secure session of a keyed group behaves.
#[derive(Default)]
struct Member {
    name: String,
    view: Option<(ViewId, usize)>,
    confirmed: BTreeSet<MemberId>,
    secure: bool,
    /// Messages not yet delivered back in the view they were made for.
    backlog: BTreeSet<u32>,
}

impl Member {
    fn react(&mut self, conn: ConnId, d: &Delivery) -> Vec<Op> {
        let multicast = |payload| Op::Multicast { conn, group: group(), service: Service::Agreed, payload };
        match d {
            Delivery::View { view, .. } => {
                self.view = Some((view.id, view.members.len()));
                self.confirmed.clear();
                self.secure = false;
                vec![multicast(frame(CONFIRM_TAG, view.id, 0, CONFIRM))]
            }
            Delivery::Message { sender, payload, .. } => {
                let Some((view, size)) = self.view else { return Vec::new() };
                let (tag, made_for, n) = parse(payload);
                if made_for != view {
                    return Vec::new(); // made for another view: dropped
                }
                if tag == DATA_TAG && sender.as_str() == self.name {
                    self.backlog.remove(&n);
                }
                if tag != CONFIRM_TAG || !self.confirmed.insert(sender.clone()) || self.confirmed.len() < size {
                    return Vec::new();
                }
                // Every member confirmed: what waits goes out for this view.
                self.secure = true;
                self.backlog.iter().map(|&n| multicast(frame(DATA_TAG, view, n, DATA))).collect()
            }
            _ => Vec::new(),
        }
    }
}

/// Three members on three daemons; `m0` has `backlog` messages to send.
/// Runs for `secs` of virtual time; the daemons' key agreements and the
/// messages still not delivered at the end.
fn run(net: NetConfig, seed: u64, limit: u64, backlog: u32, secs: u64) -> (u64, usize, bool) {
    let mut sim = keyed_sim(net, seed, limit);
    sim.run_idle();
    let mut members: BTreeMap<ConnId, Member> = BTreeMap::new();
    for d in 0..3 {
        let conn = sim.open(d).unwrap();
        let name = format!("m{d}");
        sim.submit(Op::Connect { conn, name: MemberId::new(&name).unwrap() });
        sim.submit(Op::Join { conn, group: group(), open: false, mode: GroupMode::Keyed });
        let backlog = if d == 0 { (0..backlog).collect() } else { BTreeSet::new() };
        members.insert(conn, Member { name, backlog, ..Member::default() });
    }
    let until: Micros = secs * 1_000_000;
    sim.run_until(until, &mut |_, conn, d| {
        let ops = members.get_mut(&conn).map(|m| m.react(conn, d)).unwrap_or_default();
        Reaction { cpu: 20 * ops.len() as Micros, ops }
    });
    let agreements: Vec<u64> = (0..3)
        .map(|d| {
            let m = sim.machine(d).unwrap();
            (m as &dyn std::any::Any).downcast_ref::<KeyedDaemon>().unwrap().agreements()
        })
        .collect();
    let left = members.values().map(|m| m.backlog.len()).sum();
    (agreements[0], left, sim.is_idle())
}

/// With a limit of 2 KiB, 13 to 20 data messages of one member and a view's
/// three confirmations pass it: every renewal's new view made the member
/// send them again, and before the fix the dead copies of the view before,
/// which the stream orders after the new view, counted under the new key
/// and renewed it again before the live copies were through, without end
/// (latency 80 µs, client latency 10 µs, 15 messages: some 3,900 key
/// agreements in 2 s). Now the member's messages get through and the
/// daemons go quiet, on networks where the daemons are slower or faster
/// than the members (whose reactions here take 20 µs per message sent, so
/// on the fast network a member's dead copies reach its daemon after it
/// holds the new key and are let through by the allowance).
///
/// Not covered, and not solved: a member whose dead copies exceed the
/// allowance (30 messages here) while it is slower than the daemons' key
/// agreement is still refreshed again and again (see
/// `KeyedDaemon::with_data_limit`).
#[test]
fn a_renewal_leaves_room_for_what_its_new_views_make_members_send_again() {
    for (latency, client_latency) in [(80, 10), (1_000, 10), (1_000, 300), (80, 100), (300, 400)] {
        let net = NetConfig { latency, jitter: 0, client_latency, ..NetConfig::default() };
        for (seed, backlog) in [(0, 13), (1, 15), (2, 17), (3, 20)] {
            let (agreements, left, idle) = run(net.clone(), seed, 2048, backlog, 2);
            let at =
                format!("latency {latency} µs, client latency {client_latency} µs, seed {seed}, {backlog} messages");
            assert_eq!(left, 0, "{at}: {left} messages never delivered ({agreements} key agreements)");
            assert!(idle, "{at}: still busy after 2 s ({agreements} key agreements)");
            assert!(agreements < 20, "{at}: {agreements} key agreements");
        }
    }
}

/// A daemon alone renews by data-out too, through its own stream: its
/// first key counts at once, each next one from its own word that it holds
/// it. A connection's allowance under a renewed key is what it counted
/// under the one before, so a steady sender renews the key every twice the
/// limit (the bound `KeyedDaemon::with_data_limit` states).
#[test]
fn a_daemon_alone_renews_by_data_out_and_a_steady_sender_every_twice_the_limit() {
    let signer: Arc<dyn Signer> = Arc::new(Ed25519Signer::from_seed(&[1; 32]));
    let make = move |id: DaemonId, incarnation: u64| -> Box<dyn Machine> {
        let identities = DaemonIdentities::alone(id, signer.clone());
        let rng = Box::new(ChaCha20Rng::seed_from_u64(incarnation));
        let daemon = KeyedDaemon::new(Core::new(id, Limits::default(), incarnation), identities, rng);
        Box::new(daemon.with_data_limit(1000))
    };
    let mut sim = DaemonSim::with_machines(1, NetConfig::default(), 7, Box::new(make)).unwrap();
    sim.run_idle();
    let conn = sim.open(0).unwrap();
    sim.submit(Op::Connect { conn, name: MemberId::new("a").unwrap() });
    sim.submit(Op::Join { conn, group: group(), open: false, mode: GroupMode::Keyed });
    sim.run_idle();
    let agreements = |sim: &DaemonSim| {
        let m = sim.machine(0).unwrap();
        (m as &dyn std::any::Any).downcast_ref::<KeyedDaemon>().unwrap().agreements()
    };
    let start = agreements(&sim);
    let send = |sim: &mut DaemonSim, n: usize| {
        let payload = bytes::Bytes::from(vec![0u8; n]);
        sim.submit(Op::Multicast { conn, group: group(), service: Service::Agreed, payload });
        sim.run_idle();
        agreements(sim) - start
    };
    assert_eq!(send(&mut sim, 999), 0);
    assert_eq!(send(&mut sim, 1), 1, "the limit renews the first key");
    // 1000 counted under the first key: the next 1000 are the allowance.
    assert_eq!(send(&mut sim, 1000), 1);
    assert_eq!(send(&mut sim, 999), 1);
    assert_eq!(send(&mut sim, 1), 2, "the second key renews after its allowance and the limit");
}
