//! Optimized EVS on simulated daemons: a message sealed under an earlier
//! view's key is re-encrypted by each receiver's daemon — also by a daemon
//! that had no member in that view — and one sealed on the other side of a
//! partition becomes a notice where its key never was.

mod common;

use std::collections::BTreeMap;

use bytes::Bytes;
use conclave_gcs::core::{ConnId, DaemonId, Delivery, GroupMode, Op, Service, ViewKey};
use conclave_gcs::daemon_sim::{DaemonSim, NetConfig};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_integrated::evs::{self, Envelope, NoticeReason, Writer};

fn sim(n: u16, seed: u64) -> DaemonSim {
    common::keyed_sim(n, NetConfig::default(), seed, |daemon| daemon)
}

fn group() -> GroupName {
    GroupName::new("e").unwrap()
}

fn join(sim: &mut DaemonSim, daemon: u16, name: &str) -> ConnId {
    let conn = sim.open(daemon).unwrap();
    sim.submit(Op::Connect { conn, name: MemberId::new(name).unwrap() });
    sim.submit(Op::Join { conn, group: group(), open: false, mode: GroupMode::OptimizedEvs });
    conn
}

/// Runs until idle; each client's view keys, and the messages it got (with
/// the view each was delivered in).
#[derive(Default)]
struct Got {
    keys: BTreeMap<(ConnId, ViewId), ViewKey>,
    /// Each client's keyed views, in the order they came.
    views: BTreeMap<ConnId, Vec<ViewId>>,
    messages: BTreeMap<ConnId, Vec<(ViewId, Bytes)>>,
}

fn run(sim: &mut DaemonSim, got: &mut Got) {
    sim.run_idle();
    for d in sim.take_log() {
        match d.delivery {
            Delivery::GroupKey { view, key, .. } => {
                got.keys.insert((d.to, view), key);
                got.views.entry(d.to).or_default().push(view);
            }
            Delivery::Message { view, payload, .. } => got.messages.entry(d.to).or_default().push((view, payload)),
            _ => {}
        }
    }
}

fn latest_view(got: &Got, conn: ConnId) -> ViewId {
    *got.views[&conn].last().unwrap()
}

#[test]
fn a_daemon_re_encrypts_under_a_key_of_a_view_it_had_no_member_in() {
    let mut sim = sim(2, 3);
    sim.run_idle();
    let mut got = Got::default();
    let alice = join(&mut sim, 0, "alice");
    run(&mut sim, &mut got);
    let first = latest_view(&got, alice);
    let first_key = got.keys[&(alice, first)].clone();
    // Carol joins at the other daemon, which had no member in `first`.
    let carol = join(&mut sim, 1, "carol");
    run(&mut sim, &mut got);
    let second = latest_view(&got, carol);
    assert_ne!(first, second);
    // Alice's message sealed under `first`'s key, ordered after the join.
    let me = Writer::Member(MemberId::new("alice").unwrap());
    let sealed = evs::seal(&first_key, &group(), first, &me, 0, 1, b"from the first view");
    sim.submit(Op::Multicast { conn: alice, group: group(), service: Service::Agreed, payload: sealed.into() });
    run(&mut sim, &mut got);
    for (conn, daemon) in [(alice, 0), (carol, 1)] {
        let [(view, payload)] = got.messages[&conn].as_slice() else { panic!("one message each") };
        assert_eq!(*view, second);
        let env = Envelope::decode(payload).unwrap();
        assert!(
            matches!(&env, Envelope::Sealed { key_view, writer: Writer::Daemon(DaemonId(d)), .. } if *key_view == second && *d == daemon),
            "{env:?}"
        );
        let key = &got.keys[&(conn, second)];
        assert_eq!(evs::open(key, &group(), &env).unwrap().as_slice(), b"from the first view");
    }
}

#[test]
fn a_message_sealed_on_the_other_side_of_a_partition_becomes_a_notice_there() {
    let mut sim = sim(2, 4);
    sim.run_idle();
    sim.reconfigure(&[&[0], &[1]]).unwrap();
    sim.run_idle();
    let mut got = Got::default();
    let alice = join(&mut sim, 0, "alice");
    let carol = join(&mut sim, 1, "carol");
    run(&mut sim, &mut got);
    let alone = latest_view(&got, alice);
    let alone_key = got.keys[&(alice, alone)].clone();
    sim.reconfigure(&[&[0, 1]]).unwrap();
    run(&mut sim, &mut got);
    let merged = latest_view(&got, alice);
    assert_eq!(merged, latest_view(&got, carol), "one view after the merge");
    let me = Writer::Member(MemberId::new("alice").unwrap());
    let sealed = evs::seal(&alone_key, &group(), alone, &me, 0, 1, b"before the merge");
    sim.submit(Op::Multicast { conn: alice, group: group(), service: Service::Agreed, payload: sealed.into() });
    run(&mut sim, &mut got);
    // Alice's daemon holds her side's key: re-encrypted.
    let (view, payload) = got.messages[&alice].last().unwrap();
    let env = Envelope::decode(payload).unwrap();
    assert_eq!(evs::open(&got.keys[&(alice, *view)], &group(), &env).unwrap().as_slice(), b"before the merge");
    // Carol's never had it: a notice, not silence.
    let (view, payload) = got.messages[&carol].last().unwrap();
    assert_eq!(
        Envelope::decode(payload).unwrap(),
        Envelope::Notice { delivered_in: *view, reason: NoticeReason::KeyGone, key_view: alone, seq: 0, messages: 1 }
    );
}
