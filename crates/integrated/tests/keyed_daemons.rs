//! Keyed groups on simulated daemons: the daemons agree one key per
//! configuration, every view of a keyed group comes with its key (the same
//! at every daemon, a new one for every view), nobody else gets it, and a
//! change of the daemon group re-keys every keyed group with one agreement.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use conclave_gcs::core::{ConnId, Core, DaemonId, Delivery, GroupMode, Limits, Machine, Op, Output};
use conclave_gcs::daemon_sim::{DaemonSim, Delivered, NetConfig};
use conclave_gcs::{GroupName, MemberId, ViewId};
use conclave_gka::suite::ed25519::Ed25519Signer;
use conclave_gka::suite::Signer;
use conclave_integrated::{DaemonIdentities, KeyedDaemon};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

fn group(name: &str) -> GroupName {
    GroupName::new(name).unwrap()
}

/// `n` daemons, each a [`KeyedDaemon`] with a fixed identity; every daemon
/// trusts the others'.
fn keyed_sim(n: u16, seed: u64) -> DaemonSim {
    keyed_sim_with(n, seed, None)
}

/// As [`keyed_sim`], with a data-out limit on the daemons' key.
fn keyed_sim_with(n: u16, seed: u64, data_limit: Option<u64>) -> DaemonSim {
    keyed_sim_limits(n, seed, data_limit, None)
}

/// As [`keyed_sim`], with a data-out limit and a time-out on the daemons' key.
fn keyed_sim_limits(n: u16, seed: u64, data_limit: Option<u64>, lifetime: Option<u64>) -> DaemonSim {
    sim_with(n, seed, move |daemon| {
        let daemon = match data_limit {
            Some(bytes) => daemon.with_data_limit(bytes),
            None => daemon,
        };
        match lifetime {
            Some(micros) => daemon.with_key_lifetime(micros),
            None => daemon,
        }
    })
}

/// `n` daemons as [`keyed_sim`], each set up by `tweak`.
fn sim_with(n: u16, seed: u64, tweak: impl Fn(KeyedDaemon) -> KeyedDaemon + 'static) -> DaemonSim {
    common::keyed_sim(n, NetConfig::default(), seed, tweak)
}

fn join(sim: &mut DaemonSim, daemon: u16, name: &str, groups: &[(&str, bool)]) -> ConnId {
    let conn = sim.open(daemon).unwrap();
    sim.submit(Op::Connect { conn, name: MemberId::new(name).unwrap() });
    for &(g, keyed) in groups {
        let mode = if keyed { GroupMode::Keyed } else { GroupMode::Members };
        sim.submit(Op::Join { conn, group: group(g), open: false, mode });
    }
    conn
}

/// Per client: each view of each group with the key that came with it.
type Keys = BTreeMap<ConnId, Vec<(GroupName, ViewId, Option<[u8; 32]>)>>;

/// Checks that every key comes just before the view it keys, and returns
/// what each client got.
fn keys_by_client(log: &[Delivered]) -> Keys {
    let mut out = Keys::new();
    let mut pending: BTreeMap<ConnId, (GroupName, ViewId, [u8; 32])> = BTreeMap::new();
    for d in log {
        match &d.delivery {
            Delivery::GroupKey { group, view, key } => {
                assert!(
                    pending.insert(d.to, (group.clone(), *view, *key.expose_secret())).is_none(),
                    "two keys in a row"
                );
            }
            Delivery::View { group, view } => {
                let key = pending.remove(&d.to).map(|(g, v, k)| {
                    assert_eq!((&g, v), (group, view.id), "a key for another view came before this one");
                    k
                });
                out.entry(d.to).or_default().push((group.clone(), view.id, key));
            }
            other => assert!(!pending.contains_key(&d.to), "a key not followed by its view but by {other:?}"),
        }
    }
    assert!(pending.is_empty(), "keys without their views");
    out
}

#[test]
fn every_view_of_a_keyed_group_comes_with_one_key_that_every_member_shares() {
    let mut sim = keyed_sim(3, 1);
    sim.run_idle();
    let a = join(&mut sim, 0, "a", &[("k", true), ("plain", false)]);
    let b = join(&mut sim, 1, "b", &[("k", true), ("plain", false)]);
    let c = join(&mut sim, 2, "c", &[("k", true)]);
    sim.run_idle();
    let got = keys_by_client(&sim.take_log());
    let mut by_view: BTreeMap<ViewId, BTreeSet<[u8; 32]>> = BTreeMap::new();
    for conn in [a, b, c] {
        for (g, view, key) in &got[&conn] {
            match g.as_str() {
                "k" => {
                    by_view.entry(*view).or_default().insert(key.expect("a keyed view comes with its key"));
                }
                _ => assert_eq!(*key, None, "a plain group's view came with a key"),
            }
        }
    }
    assert_eq!(by_view.len(), 3, "three joins, three views of k");
    assert!(by_view.values().all(|keys| keys.len() == 1), "members of one view got different keys: {by_view:?}");
    let distinct: BTreeSet<_> = by_view.values().flatten().collect();
    assert_eq!(distinct.len(), 3, "two views share a key");
    // The last view of k has every member, and all three hold its key.
    let last = got[&a].iter().rev().find(|(g, ..)| g.as_str() == "k").unwrap().1;
    for conn in [b, c] {
        assert!(got[&conn].iter().any(|(_, v, _)| *v == last));
    }
}

#[test]
fn a_keyed_join_on_a_plain_group_is_refused() {
    let mut sim = keyed_sim(2, 2);
    sim.run_idle();
    join(&mut sim, 0, "a", &[("g", false)]);
    let b = join(&mut sim, 1, "b", &[("g", true)]);
    sim.run_idle();
    let log = sim.take_log();
    assert!(log.iter().any(|d| d.to == b
        && matches!(&d.delivery, Delivery::Error { code, .. } if *code == conclave_gcs::core::ErrorCode::ModeMismatch)));
    assert!(!log.iter().any(|d| d.to == b && matches!(d.delivery, Delivery::View { .. })));
}

/// A partition and a merge touch every group. The daemons run one key
/// agreement per configuration, not one per group, and every keyed group's
/// next view comes with a fresh key: one per side in the partition, one for
/// everyone after the merge.
#[test]
fn a_change_of_the_daemon_group_rekeys_every_keyed_group_with_one_agreement() {
    const GROUPS: usize = 200;
    let mut sim = keyed_sim(3, 3);
    sim.run_idle();
    let names: Vec<String> = (0..GROUPS).map(|i| format!("k{i}")).collect();
    let keyed: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), true)).collect();
    let members: Vec<ConnId> = (0..3).map(|d| join(&mut sim, d, &format!("m{d}"), &keyed)).collect();
    sim.run_idle();
    let agreements = |sim: &DaemonSim| -> u64 { (0..3).map(|d| keyed_daemon(sim, d).agreements()).sum() };
    let before = agreements(&sim);
    let old_keys = keys_by_client(&sim.take_log());

    sim.reconfigure(&[&[0], &[1, 2]]).unwrap();
    sim.run_idle();
    assert_eq!(agreements(&sim), before + 3, "one agreement per daemon and configuration, whatever the groups");
    let split = keys_by_client(&sim.take_log());
    for &m in &members {
        let views: Vec<_> = split[&m].iter().filter(|(g, ..)| names.contains(&g.as_str().to_string())).collect();
        assert_eq!(views.len(), GROUPS, "every keyed group has a new view");
        assert!(views.iter().all(|(.., k)| k.is_some()));
    }
    // Members on the two sides hold different keys now; 1 and 2 share theirs.
    let key_of = |keys: &Keys, m: ConnId, g: &str| keys[&m].iter().rev().find(|(x, ..)| x.as_str() == g).unwrap().2;
    assert_ne!(key_of(&split, members[0], "k7"), key_of(&split, members[1], "k7"));
    assert_eq!(key_of(&split, members[1], "k7"), key_of(&split, members[2], "k7"));
    assert_ne!(key_of(&split, members[1], "k7"), key_of(&old_keys, members[1], "k7"));

    sim.reconfigure(&[&[0, 1, 2]]).unwrap();
    sim.run_idle();
    let merged = keys_by_client(&sim.take_log());
    let k: BTreeSet<_> = members.iter().map(|&m| key_of(&merged, m, "k7")).collect();
    assert_eq!(k.len(), 1, "after the merge everyone holds one key");
    assert!(members.iter().all(|&m| key_of(&merged, m, "k7") != key_of(&split, m, "k7")));
}

/// The key of group `g` in the last view each of `members` got of it.
fn last_keys(keys: &Keys, members: &[ConnId], g: &str) -> Vec<Option<[u8; 32]>> {
    members.iter().map(|m| keys[m].iter().rev().find(|(x, ..)| x.as_str() == g).unwrap().2).collect()
}

/// Each daemon numbers the changes of the daemon group it is told of, as
/// Corosync's members do: after a cascade that took daemons 1 and 2 through
/// one configuration more than daemon 0, they number the heal differently.
/// Their credentials for it must still count (judged by the backbone's
/// number, each refused the others' and no keyed view came again: the
/// cluster's Fig. 6 stall).
#[test]
fn daemons_that_number_the_same_change_differently_agree_their_key() {
    let mut sim = keyed_sim(3, 5);
    sim.run_idle();
    let members: Vec<ConnId> = (0..3).map(|d| join(&mut sim, d, &format!("m{d}"), &[("k", true)])).collect();
    sim.run_idle();
    sim.take_log();
    sim.reconfigure(&[&[0], &[1, 2]]).unwrap();
    sim.run_idle();
    sim.reconfigure(&[&[0], &[1], &[2]]).unwrap();
    sim.run_idle();
    sim.take_log();
    sim.reconfigure(&[&[0, 1, 2]]).unwrap();
    sim.run_idle();
    let healed = keys_by_client(&sim.take_log());
    let keys = last_keys(&healed, &members, "k");
    assert!(keys.iter().all(Option::is_some), "every member's view after the heal is keyed: {keys:?}");
    assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), 1, "one key");
    assert!((0..3).all(|d| keyed_daemon(&sim, d).keyed_daemons() == Some(vec![DaemonId(0), DaemonId(1), DaemonId(2)])));
}

/// A daemon that restarted counts the changes of the daemon group from one
/// again, far behind the others: when it merges back, its groups are keyed.
#[test]
fn a_restarted_daemon_merges_back_into_the_daemons_key() {
    let mut sim = keyed_sim(3, 6);
    sim.run_idle();
    for round in 0..3 {
        sim.reconfigure(&[&[0, 1], &[2]]).unwrap();
        sim.run_idle();
        sim.reconfigure(&[&[0, 1, 2]]).unwrap();
        sim.run_idle();
        assert!(keyed_daemon(&sim, 0).keyed_daemons().is_some(), "round {round}");
    }
    sim.crash(2).unwrap();
    sim.run_idle();
    sim.restart(2).unwrap();
    sim.run_idle();
    sim.reconfigure(&[&[0, 1, 2]]).unwrap();
    sim.run_idle();
    let members: Vec<ConnId> = (0..3).map(|d| join(&mut sim, d, &format!("m{d}"), &[("k", true)])).collect();
    sim.run_idle();
    let keys = keys_by_client(&sim.take_log());
    let keys = last_keys(&keys, &members, "k");
    assert!(keys.iter().all(Option::is_some), "every member's view is keyed: {keys:?}");
    assert_eq!(keys.iter().collect::<BTreeSet<_>>().len(), 1, "one key");
}

/// The daemons' key agreement follows the configurations: after a
/// partition, the daemons that stay together agree as a TGDH leave (one
/// broadcast, by the sponsor), and after the heal as a TGDH merge (each
/// part's sponsor announces its tree), where agreeing from scratch makes
/// every daemon announce its own and takes a round per level of the tree.
/// Every key is new all the same.
#[test]
fn the_daemons_agree_a_partition_as_a_leave_and_a_heal_as_a_merge() {
    const AGREEMENT: u8 = 1; // `conclave_integrated`'s kind of a key agreement message
    let mut sim = keyed_sim(5, 11);
    sim.run_idle();
    let members: Vec<ConnId> = (0..5).map(|d| join(&mut sim, d, &format!("m{d}"), &[("k", true)])).collect();
    sim.run_idle();
    let messages = |sim: &DaemonSim| {
        sim.ordered_ops()
            .filter(|(_, op)| matches!(op, Op::DaemonKa { payload, .. } if payload.first() == Some(&AGREEMENT)))
            .count()
    };
    let key_of = |keys: &Keys, m: ConnId| keys[&m].iter().rev().find(|(g, ..)| g.as_str() == "k").unwrap().2;
    let joined = keys_by_client(&sim.take_log());

    let before = messages(&sim);
    sim.reconfigure(&[&[0, 1, 2, 3], &[4]]).unwrap();
    sim.run_idle();
    assert_eq!(messages(&sim) - before, 1, "the four that stay together: one sponsor's broadcast");
    let split = keys_by_client(&sim.take_log());
    assert!(members.iter().all(|&m| key_of(&split, m) != key_of(&joined, m)), "new keys on both sides");
    assert_eq!(members[..4].iter().map(|&m| key_of(&split, m)).collect::<BTreeSet<_>>().len(), 1);

    let before = messages(&sim);
    sim.reconfigure(&[&[0, 1, 2, 3, 4]]).unwrap();
    sim.run_idle();
    // The lone daemon's leaf goes beside the four's root, whose new key both
    // announcements give: nothing more to broadcast.
    assert_eq!(messages(&sim) - before, 2, "each part's tree announced by its sponsor");
    let merged = keys_by_client(&sim.take_log());
    assert_eq!(members.iter().map(|&m| key_of(&merged, m)).collect::<BTreeSet<_>>().len(), 1);
    assert!(members.iter().all(|&m| key_of(&merged, m) != key_of(&split, m)), "a new key after the merge");
}

/// A daemon that holds another key of the daemons than the others: the
/// confirmations it sends carry a MAC of another key, signed by it, and
/// those it receives from the others carry, as it sees them, MACs of a key
/// not its own, signed by them (a split of the daemons' key agreement,
/// which only a fault makes: the test re-signs with the daemons' keys).
struct OtherKey {
    inner: KeyedDaemon,
}

impl OtherKey {
    /// `conclave_integrated`'s kind of a key confirmation of the daemons:
    /// `kind ‖ epoch (20 bytes) ‖ MAC (32) ‖ signature` (docs/wire.md).
    const CONFIRM: u8 = 5;

    /// `payload`, if a confirmation, with another MAC signed by `from`.
    fn other_key(from: DaemonId, payload: &mut bytes::Bytes) {
        if payload.first() != Some(&Self::CONFIRM) {
            return;
        }
        let epoch = payload[1..21].to_vec();
        let mac = [0x5a ^ from.0 as u8; 32];
        let mut signed = b"conclave/integrated/v1/daemon-confirm-signed".to_vec();
        signed.extend_from_slice(&epoch);
        signed.extend_from_slice(&mac);
        signed.extend_from_slice(&from.0.to_be_bytes());
        let mut altered = vec![Self::CONFIRM];
        altered.extend_from_slice(&epoch);
        altered.extend_from_slice(&mac);
        altered.extend_from_slice(&common::daemon_signer(from.0).sign(&signed));
        *payload = altered.into();
    }

    fn alter(out: &mut [Output]) {
        for o in out {
            if let Output::Submit(Op::DaemonKa { from, payload }) = o {
                Self::other_key(*from, payload);
            }
        }
    }
}

impl Machine for OtherKey {
    fn handle(&mut self, mut op: Op, now: u64, out: &mut Vec<Output>) {
        let me = self.inner.core().me();
        if let Op::DaemonKa { from, payload } = &mut op {
            if *from != me {
                Self::other_key(*from, payload);
            }
        }
        let at = out.len();
        self.inner.handle(op, now, out);
        Self::alter(&mut out[at..]);
    }

    fn poll_timeout(&self) -> Option<u64> {
        self.inner.poll_timeout()
    }

    fn handle_timeout(&mut self, now: u64, out: &mut Vec<Output>) {
        let at = out.len();
        self.inner.handle_timeout(now, out);
        Self::alter(&mut out[at..]);
    }

    fn submit(&mut self, op: Op, now: u64, out: &mut Vec<Output>) {
        let at = out.len();
        self.inner.submit(op, now, out);
        Self::alter(&mut out[at..]);
    }

    fn routes_submissions(&self) -> bool {
        self.inner.routes_submissions()
    }

    fn handle_joins(&mut self, ops: Vec<Op>, now: u64, out: &mut Vec<Output>) {
        let at = out.len();
        self.inner.handle_joins(ops, now, out);
        Self::alter(&mut out[at..]);
    }

    fn core(&self) -> &Core {
        self.inner.core()
    }
}

/// The daemons confirm their key among themselves before it keys any view
/// (the members of keyed groups confirm nothing): a daemon whose
/// confirmation shows another key, signed by it, is found by every daemon
/// at the same point of the stream; they agree again from scratch once,
/// and when it shows another key again, no keyed group gets a view until
/// the daemon group changes. Without that daemon the others key their
/// groups again, one key for all. A plain group is not held meanwhile.
#[test]
fn daemons_with_different_keys_key_no_view_until_the_daemon_group_changes() {
    const CONFIRM: u8 = 5;
    let mut sim = common::keyed_sim_machines(3, NetConfig::default(), 5, |id, daemon| {
        if id == DaemonId(2) {
            Box::new(OtherKey { inner: daemon })
        } else {
            Box::new(daemon)
        }
    });
    sim.run_idle();
    let confirmations = |sim: &DaemonSim| {
        sim.ordered_ops()
            .filter(|(_, op)| matches!(op, Op::DaemonKa { payload, .. } if payload.first() == Some(&CONFIRM)))
            .count()
    };
    assert_eq!(confirmations(&sim), 6, "three daemons confirm, find the split, agree again and confirm again");
    assert_eq!(keyed_daemon(&sim, 0).keyed_daemons(), None, "no key of the daemons keys views");
    let members: Vec<ConnId> =
        (0..3).map(|d| join(&mut sim, d, &format!("m{d}"), &[("k", true), ("plain", false)])).collect();
    sim.run_idle();
    let log = sim.take_log();
    let views_of = |log: &[Delivered], g: &str| {
        log.iter().filter(|d| matches!(&d.delivery, Delivery::View { group, .. } if group.as_str() == g)).count()
    };
    assert_eq!(views_of(&log, "k"), 0, "keyed views wait");
    assert!(!log.iter().any(|d| matches!(d.delivery, Delivery::GroupKey { .. })), "no key is given");
    assert!(views_of(&log, "plain") > 0, "a plain group is not held");

    sim.reconfigure(&[&[0, 1], &[2]]).unwrap();
    sim.run_idle();
    let keys = keys_by_client(&sim.take_log());
    let key_of = |m: ConnId| keys[&m].iter().rev().find(|(g, ..)| g.as_str() == "k").and_then(|(.., k)| *k);
    assert_eq!(keyed_daemon(&sim, 0).keyed_daemons(), Some(vec![DaemonId(0), DaemonId(1)]));
    assert!(
        key_of(members[0]).is_some() && key_of(members[0]) == key_of(members[1]),
        "0 and 1 key their members alike"
    );
}

fn keyed_daemon(sim: &DaemonSim, d: u16) -> &KeyedDaemon {
    sim.machine(d).and_then(|m| (m as &dyn std::any::Any).downcast_ref::<KeyedDaemon>()).expect("a keyed daemon")
}

/// Data-out: once keyed groups have sent the limit's worth of payload under
/// one key of the daemons, the daemons agree a new one at the same point of
/// the stream, and every keyed group gets a new view with the same members
/// and a key that is not the last one. A plain group is not touched.
#[test]
fn the_daemons_renew_their_key_after_the_data_limit_and_every_keyed_group_gets_a_new_view() {
    use conclave_gcs::core::Service;
    let mut sim = keyed_sim_with(3, 4, Some(1000));
    sim.run_idle();
    let a = join(&mut sim, 0, "a", &[("k1", true), ("k2", true), ("plain", false)]);
    let b = join(&mut sim, 1, "b", &[("k1", true), ("k2", true), ("plain", false)]);
    sim.run_idle();
    let before = keys_by_client(&sim.take_log());
    let agreed = |sim: &DaemonSim| -> Vec<u64> { (0..3).map(|d| keyed_daemon(sim, d).agreements()).collect() };
    let start = agreed(&sim);
    let send = |sim: &mut DaemonSim, g: &str, n: usize| {
        let payload = bytes::Bytes::from(vec![0u8; n]);
        sim.submit(Op::Multicast { conn: a, group: group(g), service: Service::Agreed, payload });
    };
    // 900 bytes to the plain group count for nothing; 900 to k1 stay under.
    send(&mut sim, "plain", 900);
    send(&mut sim, "k1", 900);
    sim.run_idle();
    assert_eq!(agreed(&sim), start);
    assert!(keys_by_client(&sim.take_log()).is_empty(), "a new view before the limit");
    send(&mut sim, "k2", 200);
    sim.run_idle();
    assert_eq!(agreed(&sim), start.iter().map(|n| n + 1).collect::<Vec<_>>(), "one renewal at every daemon");
    let after = keys_by_client(&sim.take_log());
    for m in [a, b] {
        let views: Vec<_> = after[&m].iter().map(|(g, ..)| g.as_str()).collect();
        assert_eq!(views, ["k1", "k2"], "a new view of each keyed group, and of no other");
        for (g, view, key) in &after[&m] {
            let old = before[&m].iter().rev().find(|(x, ..)| x == g).unwrap();
            assert_ne!(*view, old.1);
            assert_ne!(*key, old.2);
            assert!(key.is_some());
        }
    }
    let refreshed = sim.core(0).unwrap().view(&group("k1")).unwrap();
    assert_eq!(refreshed.cause, conclave_gcs::Cause::Refresh);
    assert_eq!(refreshed.members.len(), 2);
    assert_eq!(after[&a][0].2, after[&b][0].2, "both members hold the new key");
}

/// Daemon 2 is not one daemons 0 and 1 trust (it trusts them, and claims a
/// place). They agree a key between the two of them; daemon 2 never gets a
/// key, so its client never gets a group key, while the others' clients get
/// the same key for the same view.
#[test]
fn a_daemon_the_others_do_not_trust_is_kept_out_of_the_daemons_key() {
    let signer = |d: u16| -> Arc<dyn Signer> { Arc::new(Ed25519Signer::from_seed(&[d as u8 + 1; 32])) };
    let all: Vec<_> = (0..3).map(|d| (DaemonId(d), signer(d).verifier())).collect();
    let make = move |id: DaemonId, incarnation: u64| -> Box<dyn Machine> {
        let trusted = if id.0 == 2 { all.clone() } else { all[..2].to_vec() };
        let identities = DaemonIdentities::new(signer(id.0), trusted);
        let rng = Box::new(ChaCha20Rng::seed_from_u64(incarnation));
        Box::new(KeyedDaemon::new(Core::new(id, Limits::default(), incarnation), identities, rng))
    };
    let mut sim = DaemonSim::with_machines(3, NetConfig::default(), 5, Box::new(make)).unwrap();
    sim.run_idle();
    let a = join(&mut sim, 0, "a", &[("k", true)]);
    let b = join(&mut sim, 1, "b", &[("k", true)]);
    let c = join(&mut sim, 2, "c", &[("k", true)]);
    sim.run_idle();
    for d in 0..2 {
        assert_eq!(keyed_daemon(&sim, d).keyed_daemons(), Some(vec![DaemonId(0), DaemonId(1)]));
    }
    assert_eq!(keyed_daemon(&sim, 2).server_epoch(), None, "the untrusted daemon has no key");
    let log = sim.take_log();
    assert!(!log.iter().any(|d| d.to == c && matches!(d.delivery, Delivery::GroupKey { .. })));
    let got = keys_by_client(&log);
    let last = |m: ConnId| got[&m].last().unwrap().clone();
    assert_eq!(last(a).1, last(b).1, "a and b end in the same view");
    assert!(last(a).2.is_some());
    assert_eq!(last(a).2, last(b).2);
}

/// Time-out: a key of the daemons lives one second of (virtual) time. Each
/// second every keyed group gets a new view with the same members and a new
/// key, the same at every daemon, with one agreement per daemon and
/// renewal however many daemons asked for it; a plain group is not touched.
#[test]
fn the_daemons_renew_their_key_when_it_times_out_and_every_keyed_group_gets_a_new_view() {
    const SECOND: u64 = 1_000_000;
    let mut sim = keyed_sim_limits(3, 6, None, Some(SECOND));
    sim.run_until(SECOND / 10, &mut |_, _, _| Default::default());
    let a = join(&mut sim, 0, "a", &[("k", true), ("plain", false)]);
    let b = join(&mut sim, 1, "b", &[("k", true), ("plain", false)]);
    let c = join(&mut sim, 2, "c", &[("k", true)]);
    sim.run_until(SECOND / 2, &mut |_, _, _| Default::default());
    let before = keys_by_client(&sim.take_log());
    let agreed = |sim: &DaemonSim| -> Vec<u64> { (0..3).map(|d| keyed_daemon(sim, d).agreements()).collect() };
    let start = agreed(&sim);
    sim.run_until(SECOND / 2 + 3 * SECOND + SECOND / 10, &mut |_, _, _| Default::default());
    assert_eq!(agreed(&sim), start.iter().map(|n| n + 3).collect::<Vec<_>>(), "three renewals in three seconds");
    let after = keys_by_client(&sim.take_log());
    for m in [a, b, c] {
        let views: Vec<_> = after[&m].iter().map(|(g, ..)| g.as_str()).collect();
        assert_eq!(views, ["k", "k", "k"], "a new view of the keyed group per renewal, and of no other");
        let keys: BTreeSet<_> = after[&m].iter().map(|(.., k)| k.expect("keyed")).collect();
        assert_eq!(keys.len(), 3);
        let old = before[&m].iter().rev().find(|(g, ..)| g.as_str() == "k").unwrap().2.unwrap();
        assert!(!keys.contains(&old));
    }
    assert_eq!(after[&a], after[&b], "a and b went through the same views with the same keys");
    assert_eq!(after[&a], after[&c]);
    assert_eq!(sim.core(0).unwrap().view(&group("k")).unwrap().cause, conclave_gcs::Cause::Refresh);
}

/// Daemons with the sealed backbone (Three-Step client–server).
fn sealed_sim(n: u16, seed: u64) -> DaemonSim {
    sim_with(n, seed, KeyedDaemon::with_sealed_backbone)
}

/// The messages `to` got in `g`, in order.
fn payloads(log: &[Delivered], to: ConnId, g: &str) -> Vec<Vec<u8>> {
    log.iter()
        .filter(|d| d.to == to)
        .filter_map(|d| match &d.delivery {
            Delivery::Message { group, payload, .. } if group.as_str() == g => Some(payload.to_vec()),
            _ => None,
        })
        .collect()
}

/// Three-Step's sealed backbone: nothing a client sends — its name, a
/// group's name, a payload — crosses between the daemons in clear (read off
/// a capture of everything the backbone ordered), and every member still
/// gets every message. The same run without it shows them all, so the
/// capture can see them.
#[test]
fn with_a_sealed_backbone_no_client_operation_crosses_between_the_daemons_in_clear() {
    use conclave_gcs::core::Service;
    let run = |mut sim: DaemonSim| -> (Vec<Vec<u8>>, Vec<&'static str>) {
        sim.run_idle();
        let a = join(&mut sim, 0, "alice-in-clear", &[("group-in-clear", false)]);
        let b = join(&mut sim, 1, "bob", &[("group-in-clear", false)]);
        sim.run_idle();
        for i in 0..5 {
            let payload = bytes::Bytes::from(format!("payload-in-clear-{i}"));
            sim.submit(Op::Multicast { conn: a, group: group("group-in-clear"), service: Service::Agreed, payload });
        }
        sim.run_idle();
        let got = payloads(&sim.take_log(), b, "group-in-clear");
        let wire: Vec<u8> =
            sim.ordered_ops().flat_map(|(_, op)| conclave_gcs::backbone::op_bytes(op).to_vec()).collect();
        let seen = ["alice-in-clear", "group-in-clear", "payload-in-clear"]
            .into_iter()
            .filter(|needle| wire.windows(needle.len()).any(|w| w == needle.as_bytes()))
            .collect();
        (got, seen)
    };
    let sent: Vec<Vec<u8>> = (0..5).map(|i| format!("payload-in-clear-{i}").into_bytes()).collect();
    let (got, seen) = run(sealed_sim(3, 7));
    assert_eq!(got, sent, "a member on another daemon gets every message, in order");
    assert!(seen.is_empty(), "in clear between the daemons: {seen:?}");
    let (got, seen) = run(keyed_sim(3, 7));
    assert_eq!(got, sent);
    assert_eq!(seen.len(), 3, "the capture sees a plain backbone's traffic");
}

/// Operations sealed under a key that is gone when they are ordered (they
/// were on their way when the daemon group changed) are void at every
/// daemon, and their daemon sends them again under the next key, before
/// anything newer: a member on another daemon gets every message once, in
/// the order sent, across the change.
#[test]
fn operations_sealed_before_a_change_of_the_daemon_group_are_sent_again_in_order() {
    use conclave_gcs::core::Service;
    const MS: u64 = 1_000;
    let mut sim = sealed_sim(3, 8);
    sim.run_idle();
    let a = join(&mut sim, 0, "a", &[("g", false)]);
    let b = join(&mut sim, 1, "b", &[("g", false)]);
    sim.run_idle();
    sim.take_log();
    let mut sent = Vec::new();
    for i in 0..200u32 {
        if i == 20 {
            // Daemon 2 goes its own way: 0 and 1 form a new configuration
            // (and agree a new key) while a's multicasts are on their way.
            sim.reconfigure(&[&[0, 1], &[2]]).unwrap();
        }
        let payload = bytes::Bytes::from(i.to_be_bytes().to_vec());
        sent.push(payload.to_vec());
        sim.submit(Op::Multicast { conn: a, group: group("g"), service: Service::Agreed, payload });
        let now = sim.now();
        sim.run_until(now + 20 * MS, &mut |_, _, _| Default::default());
    }
    sim.run_idle();
    assert!(keyed_daemon(&sim, 0).sealed_resent() > 0, "no operation was void: the change came at no useful point");
    let log = sim.take_log();
    assert_eq!(payloads(&log, b, "g"), sent, "b got every message once, in order");
    assert_eq!(payloads(&log, a, "g"), sent, "and so did a");
    assert_eq!(keyed_daemon(&sim, 0).waiting_for_key(), 0);
}
