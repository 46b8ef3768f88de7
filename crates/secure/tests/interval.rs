//! SEAL's interval rekeying in the session core: real [`SessionCore`]s as
//! clients of a real daemon core, in virtual time. Keys outlive views: a
//! joiner waits for the next rekey (and reads nothing before it), a leaver's
//! last key stays in use until then, and every rekey is confirmed.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conclave_gcs::core::{Delivery, Op, Service};
use conclave_secure::core::{SessionCore, WallClock};
use conclave_secure::payload::tag;
use conclave_secure::trust::{Authority, Identity, Issuer};
use conclave_secure::{IntervalAlgorithm, MemberId, Policy, SecureEvent};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

mod vnet;
use vnet::Net;

const PERIOD: Duration = Duration::from_secs(10);

/// The data messages member `i` received, as text.
fn received(net: &Net, i: usize) -> Vec<String> {
    net.members[i]
        .log
        .iter()
        .filter_map(|e| match e {
            SecureEvent::Message { data, .. } => Some(String::from_utf8(data.to_vec()).unwrap()),
            _ => None,
        })
        .collect()
}

/// The secure views member `i` delivered: (fingerprint, members).
fn keys(net: &Net, i: usize) -> Vec<(String, Vec<String>)> {
    net.members[i]
        .log
        .iter()
        .filter_map(|e| match e {
            SecureEvent::View(v) => {
                Some((v.fingerprint.clone(), v.members.iter().map(|m| m.as_str().to_owned()).collect()))
            }
            _ => None,
        })
        .collect()
}

fn send(net: &mut Net, i: usize, text: &str) {
    let now = net.now();
    net.members[i].session.send(now, vnet::GROUP, text.as_bytes()).unwrap();
    net.drain(i);
    net.settle();
}

fn leave(net: &mut Net, i: usize) {
    let now = net.now();
    net.members[i].session.leave(now, vnet::GROUP).unwrap();
    net.drain(i);
    net.settle();
}

/// The leader's next tick (its rekey message goes out), then member `joiner`
/// joins at once, before the rekey's packets; everything then settles.
fn tick_then_join(net: &mut Net, joiner: usize, policy: Policy) {
    let before = keys(net, 0).len();
    let due = net.members[0].session.poll_timeout().unwrap();
    net.advance(due.saturating_duration_since(net.now()) - Duration::from_millis(1));
    assert_eq!(keys(net, 0).len(), before, "the tick came early");
    net.members[0].session.handle_timeout(due).unwrap();
    net.drain(0);
    let now = net.now();
    net.members[joiner].session.join(now, vnet::GROUP, policy).unwrap();
    net.drain(joiner);
    net.settle();
}

fn no_rejections(net: &Net) {
    for m in &net.members {
        let bad: Vec<&SecureEvent> = m
            .log
            .iter()
            .filter(|e| matches!(e, SecureEvent::Rejected { .. } | SecureEvent::KeyMismatch { .. }))
            .collect();
        assert!(bad.is_empty(), "{}: {bad:?}", m.name);
    }
}

#[test]
fn joins_wait_for_the_leaders_tick_and_leaves_keep_the_key_until_then() {
    for (k, algorithm) in IntervalAlgorithm::ALL.into_iter().enumerate() {
        let mut net = Net::new(&["alice", "bob", "carol", "dave"], 40 + k as u64);
        let policy = Policy::interval(algorithm, PERIOD);

        // The first member is the leader with no key: it rekeys at once.
        net.join(0, policy);
        assert_eq!(keys(&net, 0).len(), 1, "{algorithm:?}: a new group gets its first key at once");

        // Bob joins: no key for him until the tick, and nothing to read.
        net.join(1, policy);
        send(&mut net, 0, "before bob's key");
        send(&mut net, 1, "bob, queued until his key");
        assert!(keys(&net, 1).is_empty(), "{algorithm:?}: bob got a key before the tick");
        assert_eq!(keys(&net, 0).len(), 1, "{algorithm:?}: the join rekeyed at once");
        assert_eq!(received(&net, 0), ["before bob's key"]);
        assert!(received(&net, 1).is_empty(), "{algorithm:?}: bob read the group before his key");

        // Carol and dave join; carol leaves again within the interval.
        net.join(2, policy);
        net.join(3, policy);
        leave(&mut net, 2);
        net.advance(PERIOD);
        let alice = keys(&net, 0);
        assert_eq!(alice.len(), 2, "{algorithm:?}: one rekey for the whole batch: {alice:?}");
        let (fp, members) = alice.last().unwrap().clone();
        assert_eq!(members, ["alice", "bob", "dave"], "{algorithm:?}: carol's join and leave cancelled");
        for i in [1, 3] {
            assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "{algorithm:?}: member {i}");
        }
        assert!(keys(&net, 2).is_empty(), "{algorithm:?}: carol left before any rekey");
        assert_eq!(received(&net, 0), ["before bob's key", "bob, queued until his key"]);
        assert_eq!(received(&net, 3), ["bob, queued until his key"], "{algorithm:?}: dave");

        // Dave leaves: the key stays in use (he knows it) until the next tick.
        leave(&mut net, 3);
        send(&mut net, 1, "under dave's last key");
        assert_eq!(keys(&net, 0).len(), 2, "{algorithm:?}: the leave rekeyed at once");
        let epochs: Vec<_> = net.members[0]
            .log
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Message { data, epoch, .. } if data == &b"under dave's last key"[..] => Some(*epoch),
                _ => None,
            })
            .collect();
        assert_eq!(epochs.len(), 1);
        net.advance(PERIOD);
        let (fp2, members2) = keys(&net, 0).last().unwrap().clone();
        assert_eq!(members2, ["alice", "bob"], "{algorithm:?}");
        assert_ne!(fp2, fp, "{algorithm:?}: the tick after the leave renews the key");
        assert_eq!(keys(&net, 1).last(), Some(&(fp2.clone(), members2.clone())));
        assert_eq!(keys(&net, 3).last().map(|k| &k.0), Some(&fp), "dave's last key is the one he left with");
        send(&mut net, 0, "after the rekey");
        assert_eq!(received(&net, 1).last().map(String::as_str), Some("after the rekey"));
        assert!(!received(&net, 3).iter().any(|m| m == "after the rekey"));

        // A tick with nothing to batch changes nothing.
        net.advance(PERIOD);
        assert_eq!(keys(&net, 0).len(), 3, "{algorithm:?}: an empty batch rekeyed");
        no_rejections(&net);
    }
}

/// The leader leaves: the next member in line leads, and the batch (with the
/// old leader's departure) is rekeyed at its first tick.
#[test]
fn the_next_member_leads_when_the_leader_leaves() {
    let mut net = Net::new(&["alice", "bob", "carol"], 7);
    let policy = Policy::interval(IntervalAlgorithm::QueueBatch, PERIOD);
    for i in 0..3 {
        net.join(i, policy);
    }
    net.advance(PERIOD);
    assert_eq!(keys(&net, 2).last().map(|k| k.1.len()), Some(3));
    leave(&mut net, 0);
    net.advance(PERIOD);
    let (fp, members) = keys(&net, 1).last().unwrap().clone();
    assert_eq!(members, ["bob", "carol"]);
    assert_eq!(keys(&net, 2).last(), Some(&(fp, members)));
    no_rejections(&net);
}

/// A join ordered in the middle of a rekey (after the leader's rekey
/// message, before the sponsors' packets) does not stop it (SEAL 3.6): the
/// rekey's members install and confirm its key in the new view, the
/// newcomer waits (it reads nothing of theirs), and the next tick keys the
/// whole group.
#[test]
fn a_view_during_a_rekey_carries_it_on_and_the_next_tick_keys_the_newcomer() {
    for algorithm in IntervalAlgorithm::ALL {
        let mut net = Net::new(&["alice", "bob", "carol", "dave"], 9);
        let policy = Policy::interval(algorithm, PERIOD);
        for i in 0..2 {
            net.join(i, policy);
        }
        net.advance(PERIOD);
        assert_eq!(keys(&net, 1).len(), 1);
        net.join(2, policy);
        assert_eq!(keys(&net, 0).len(), 2, "{algorithm:?}: before the tick");
        tick_then_join(&mut net, 3, policy);
        let (carried, members) = keys(&net, 0).last().unwrap().clone();
        assert_eq!(keys(&net, 0).len(), 3, "{algorithm:?}: the rekey went on");
        assert_eq!(members, ["alice", "bob", "carol"], "{algorithm:?}");
        assert_eq!(keys(&net, 2), [(carried.clone(), members.clone())], "{algorithm:?}");
        assert!(keys(&net, 3).is_empty());
        send(&mut net, 2, "carol is in");
        assert_eq!(received(&net, 0).last().map(String::as_str), Some("carol is in"));
        assert!(!received(&net, 3).iter().any(|t| t == "carol is in"), "{algorithm:?}: dave read it");
        net.advance(PERIOD);
        let (fp, members) = keys(&net, 0).last().unwrap().clone();
        assert_eq!(members, ["alice", "bob", "carol", "dave"], "{algorithm:?}");
        assert_eq!(keys(&net, 0).len(), 4, "{algorithm:?}");
        for i in 1..4 {
            assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "{algorithm:?}: member {i}");
        }
        send(&mut net, 3, "dave is in");
        assert_eq!(received(&net, 2).last().map(String::as_str), Some("dave is in"));
        no_rejections(&net);
    }
}

const DAY: Duration = Duration::from_secs(86_400);

struct Fixed(SystemTime);

impl WallClock for Fixed {
    fn now(&self) -> SystemTime {
        self.0
    }
}

/// Members with certificates of one authority, connected, none joined yet.
fn certified(names: &[&str], seed: u64) -> Net {
    let t = SystemTime::UNIX_EPOCH + 20_000 * DAY;
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let (issuer, _) = Issuer::create("conclave test authority", t - DAY, t + 365 * DAY, &mut rng).unwrap();
    let authority = Arc::new(Authority::from_pem(issuer.ca_pem(), None).unwrap());
    let mut net = Net::new(&[], seed);
    for (i, name) in names.iter().enumerate() {
        let member = MemberId::new(*name).unwrap();
        let issued = issuer.issue(&member, t - DAY, t + DAY, &mut rng).unwrap();
        let identity = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
        let (authority, rng) = (authority.clone(), ChaCha20Rng::seed_from_u64(200 + i as u64));
        net.add(name, move |now| {
            SessionCore::new_certified(member, identity, authority, Arc::new(Fixed(t)), Box::new(rng), now)
        });
    }
    net
}

/// Certified members: admission decides who the engine admits in each view,
/// as with per-view rekeying, and an outsider without a certificate is
/// refused and never gets the key, while the key in use outlives its view.
#[test]
fn certified_members_rekey_at_the_interval_and_outsiders_get_nothing() {
    let mut net = certified(&["alice", "bob", "carol"], 11);
    let policy = Policy::interval(IntervalAlgorithm::QueueBatch, PERIOD);
    for m in 0..3 {
        net.join(m, policy);
        net.advance(Duration::from_millis(10));
    }
    assert_eq!(keys(&net, 0).len(), 1, "alice's own key, at once");
    assert!(keys(&net, 2).is_empty(), "carol before the tick");
    let group = conclave_gcs::GroupName::new(vnet::GROUP).unwrap();
    let eve = net.outsider("eve");
    net.submit(conclave_gcs::core::Op::Join {
        conn: eve,
        group,
        open: false,
        mode: conclave_gcs::core::GroupMode::Members,
    });
    net.settle();
    net.advance(PERIOD);
    let (fp, members) = keys(&net, 0).last().unwrap().clone();
    assert_eq!(members, ["alice", "bob", "carol"]);
    for i in 1..3 {
        assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "member {i}");
    }
    let refused =
        net.members[0].log.iter().any(|e| matches!(e, SecureEvent::Refused { member, .. } if member.as_str() == "eve"));
    assert!(refused, "eve was not refused");
    send(&mut net, 2, "certified only");
    assert_eq!(received(&net, 0).last().map(String::as_str), Some("certified only"));
}

/// Certified: a join mid-rekey is a view whose run waits for every member's
/// certificate, which members begin at different points of the stream, so
/// the rekey does not go on across it (what one member processed there
/// another may not have): it is abandoned, and the next tick keys everyone.
#[test]
fn certified_a_join_during_a_rekey_abandons_it_and_the_next_tick_keys_everyone() {
    let mut net = certified(&["alice", "bob", "carol", "dave"], 12);
    let policy = Policy::interval(IntervalAlgorithm::Batch, PERIOD);
    for i in 0..2 {
        net.join(i, policy);
        net.advance(Duration::from_millis(10));
    }
    net.advance(PERIOD);
    assert_eq!(keys(&net, 1).len(), 1);
    net.join(2, policy);
    net.advance(Duration::from_millis(10));
    assert_eq!(keys(&net, 0).len(), 2, "before the tick");
    tick_then_join(&mut net, 3, policy);
    assert_eq!(keys(&net, 0).len(), 2, "the rekey went on across a view admitted afresh");
    assert!(keys(&net, 2).is_empty() && keys(&net, 3).is_empty());
    net.advance(PERIOD);
    let (fp, members) = keys(&net, 0).last().unwrap().clone();
    assert_eq!(members, ["alice", "bob", "carol", "dave"]);
    assert_eq!(keys(&net, 0).len(), 3, "one key for both joins");
    for i in 1..4 {
        assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "member {i}");
    }
    no_rejections(&net);
}

/// A member that joins with another policy (here, rekeying on every view)
/// hears the group's policy and is taken out of the group; the interval
/// algorithm is part of the policy, the period is not.
#[test]
fn a_member_with_another_policy_is_taken_out() {
    let mut net = Net::new(&["alice", "bob", "carol"], 8);
    net.join(0, Policy::interval(IntervalAlgorithm::Batch, PERIOD));
    net.join(1, Policy::interval(IntervalAlgorithm::Batch, 3 * PERIOD));
    net.join(2, Policy::interval(IntervalAlgorithm::Rebuild, PERIOD));
    net.advance(PERIOD);
    let mismatch = net.members[2].log.iter().any(|e| matches!(e, SecureEvent::PolicyMismatch { .. }));
    assert!(mismatch, "carol's Rebuild was not noticed: {:?}", net.members[2].log);
    let (_, members) = keys(&net, 1).last().unwrap().clone();
    assert_eq!(members, ["alice", "bob"], "bob's period is his own business");
}

#[test]
fn policies_parse_from_their_names() {
    let p: Policy = "queue-batch:15s".parse().unwrap();
    assert_eq!(p, Policy::interval(IntervalAlgorithm::QueueBatch, Duration::from_secs(15)));
    assert_eq!(p.to_string(), "tgdh-interval:queue-batch:15s");
    let p: Policy = "tgdh-interval:batch:500ms".parse().unwrap();
    assert_eq!(p.interval.map(|i| i.period), Some(Duration::from_millis(500)));
    assert_eq!("tgdh-interval:rebuild:2m".parse::<Policy>().unwrap().interval.unwrap().period.as_secs(), 120);
    assert_eq!("str".parse::<Policy>().unwrap().interval, None);
    for bad in ["queue-batch", "queue-batch:0s", "queue-batch:15h", "tree:15s", "tgdh-interval:batch:x", ""] {
        let err = bad.parse::<Policy>().unwrap_err().to_string();
        assert!(err.contains("queue-batch"), "{bad}: {err}");
    }
}

/// The key outlives views, so a data message must not: a compromised link
/// that holds back alice's message in one view and delivers it to bob in the
/// next (as it could carry one from another component under the same key)
/// gets it dropped, although its epoch and key are still bob's.
#[test]
fn a_data_message_is_accepted_only_in_the_view_it_was_sent_in() {
    let mut net = Net::new(&["alice", "bob", "carol"], 13);
    let policy = Policy::interval(IntervalAlgorithm::Batch, PERIOD);
    net.join(0, policy);
    net.join(1, policy);
    net.advance(PERIOD);
    assert_eq!(keys(&net, 1).last().map(|k| k.1.len()), Some(2));
    // Alice's message, taken off the wire before the daemon orders it.
    let now = net.now();
    net.members[0].session.send(now, vnet::GROUP, b"held back").unwrap();
    let Some(Op::Multicast { payload, .. }) =
        net.members[0].session.poll_transmit().map(|t| t.into_op(net.members[0].conn))
    else {
        panic!("alice's message")
    };
    net.join(2, policy); // a new view; the key stays
    let group = conclave_gcs::GroupName::new(vnet::GROUP).unwrap();
    let view = net.core.view(&group).unwrap().id;
    let alice = MemberId::new("alice").unwrap();
    let d = Delivery::Message { group, sender: alice, service: Service::Agreed, view, payload };
    let now = net.now();
    net.members[1].session.handle_delivery(now, d).unwrap();
    net.drain(1);
    // Dropped as an honest message that crossed a view change would be (its
    // sender sends those again in the new view); never read.
    assert!(received(&net, 1).is_empty(), "bob read a message of another view");
}

/// A collector's verdict counts only in the view it was sent in. A key's
/// confirmation outlives views here; a copy of the verdict sent in the view
/// before, put into a member's link in the next (a compromised link's
/// replay, labelled with the current view), decides nothing there, and the
/// collector sends its verdict again in the new view, on which all decide.
#[test]
fn a_verdict_replayed_into_the_next_view_decides_nothing() {
    let mut net = Net::new(&["alice", "bob", "carol", "dave"], 14);
    let policy = Policy::interval(IntervalAlgorithm::Batch, PERIOD);
    net.join(0, policy);
    net.join(1, policy);
    net.advance(PERIOD);
    net.join(2, policy);
    assert_eq!(keys(&net, 1).len(), 1);
    // The tick: carol's rekey, confirmed, the collector's verdict held back.
    let is_verdict = |op: &Op| matches!(op, Op::Multicast { payload, .. } if payload.first() == Some(&tag::VERDICT));
    let due = net.members[0].session.poll_timeout().unwrap();
    net.advance(due.saturating_duration_since(net.now()) - Duration::from_millis(1));
    net.members[0].session.handle_timeout(due).unwrap();
    let mut held = net.drain_holding(0, &is_verdict);
    held.extend(net.settle_holding(&is_verdict));
    let [Op::Multicast { payload: first, .. }] = &held[..] else { panic!("one verdict held: {held:?}") };
    let first = first.clone();
    assert_eq!(keys(&net, 1).len(), 1, "bob decided without the verdict");
    // Dave joins: a new view, the confirmation goes on; the collector's
    // verdict in it is held back too.
    let now = net.now();
    net.members[3].session.join(now, vnet::GROUP, policy).unwrap();
    net.drain(3);
    let again = net.settle_holding(&is_verdict);
    assert_eq!(again.len(), 1, "the collector sends its verdict again in the new view");
    let group = conclave_gcs::GroupName::new(vnet::GROUP).unwrap();
    let view = net.core.view(&group).unwrap().id;
    let alice = MemberId::new("alice").unwrap();
    let d = Delivery::Message { group, sender: alice, service: Service::Agreed, view, payload: first };
    let now = net.now();
    net.members[1].session.handle_delivery(now, d).unwrap();
    net.drain(1);
    assert_eq!(keys(&net, 1).len(), 1, "bob decided on a verdict of the view before");
    for op in again {
        net.submit(op);
    }
    net.settle();
    let (fp, members) = keys(&net, 0).last().unwrap().clone();
    assert_eq!(members, ["alice", "bob", "carol"]);
    for i in 1..3 {
        assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "member {i}");
    }
    no_rejections(&net);
}

/// With `rekey_on_leave`, a leave is rekeyed at once (the leaver's key is
/// never used after it), while a join still waits for the tick.
#[test]
fn rekey_on_leave_rekeys_a_leave_at_once_and_batches_joins() {
    let mut net = Net::new(&["alice", "bob", "carol", "dave"], 14);
    let policy: Policy = "batch:10s:rekey-on-leave".parse().unwrap();
    assert_eq!(policy.to_string(), "tgdh-interval:batch:10s:rekey-on-leave");
    for i in 0..3 {
        net.join(i, policy);
    }
    net.advance(PERIOD);
    let (fp, members) = keys(&net, 0).last().unwrap().clone();
    assert_eq!(members, ["alice", "bob", "carol"]);
    net.join(3, policy);
    assert_eq!(keys(&net, 0).last().unwrap().0, fp, "a join waits for the tick");
    leave(&mut net, 2);
    let (fp2, members2) = keys(&net, 0).last().unwrap().clone();
    assert_ne!(fp2, fp, "the leave was not rekeyed at once");
    assert_eq!(members2, ["alice", "bob", "dave"], "dave's join rode along");
    assert_eq!(keys(&net, 3).last(), Some(&(fp2.clone(), members2.clone())));
    send(&mut net, 1, "after carol");
    assert!(!received(&net, 2).iter().any(|m| m == "after carol"));
    no_rejections(&net);
}

/// A key confirmation (a unicast to the collector).
fn is_confirmation(op: &Op) -> bool {
    matches!(op, Op::Unicast { payload, .. } if payload.first() == Some(&tag::CONFIRM))
}

/// Keys outlive views, and so do their confirmations: a rekey installed in
/// one view may be confirmed in the next. When that view is a join, every
/// verdict is decided afresh (certified mode), and the agreed order may put
/// the confirmations before the certificates: they count all the same (a
/// MAC that matches needs no identity key), so nobody is left waiting for
/// confirmations already delivered, and a replay of one afterwards (a
/// compromised link's) changes nothing.
#[test]
fn a_rekey_is_confirmed_in_the_next_view_before_its_certificates() {
    for (k, algorithm) in IntervalAlgorithm::ALL.into_iter().enumerate() {
        let mut net = certified(&["alice", "bob", "carol"], 30 + k as u64);
        let policy = Policy::interval(algorithm, PERIOD);
        net.join(0, policy);
        net.advance(Duration::from_millis(10));
        net.join(1, policy);
        assert_eq!(keys(&net, 0).len(), 1, "{algorithm:?}: alice's own key");
        assert!(keys(&net, 1).is_empty(), "{algorithm:?}: bob before the tick");

        // The leader's tick rekeys alice and bob; their confirmations are
        // held back until carol's join is ordered.
        let due = net.members[0].session.poll_timeout().unwrap();
        net.advance(due.saturating_duration_since(net.now()) - Duration::from_millis(1));
        assert!(keys(&net, 1).is_empty(), "{algorithm:?}: the tick came early");
        net.members[0].session.handle_timeout(due).unwrap();
        let mut held = net.drain_holding(0, &is_confirmation);
        held.extend(net.settle_holding(&is_confirmation));
        // Alice collects: only bob sends his confirmation, to her.
        assert_eq!(held.len(), 1, "{algorithm:?}: bob installed the key and confirms it");
        for m in &net.members[..2] {
            assert!(m.session.confirming_epoch(vnet::GROUP).is_some(), "{algorithm:?}: {} installed the key", m.name);
        }
        let now = net.now();
        net.members[2].session.join(now, vnet::GROUP, policy).unwrap();
        net.drain(2);
        let bobs = held.iter().find_map(|op| match op {
            Op::Unicast { conn, payload, .. } if *conn == net.members[1].conn => Some(payload.clone()),
            _ => None,
        });
        for op in held {
            net.submit(op);
        }
        net.settle();

        let (fp, members) = keys(&net, 0).last().unwrap().clone();
        assert_eq!(members, ["alice", "bob"], "{algorithm:?}: alice never confirmed the rekey");
        assert_eq!(keys(&net, 1).last(), Some(&(fp, members)), "{algorithm:?}: bob never confirmed the rekey");

        // Bob's confirmation again, on alice's link: nothing happens.
        let group = conclave_gcs::GroupName::new(vnet::GROUP).unwrap();
        let view = net.core.view(&group).unwrap().id;
        let (sender, payload) = (MemberId::new("bob").unwrap(), bobs.unwrap());
        let d = Delivery::Unicast { group, sender, view, payload };
        let now = net.now();
        net.members[0].session.handle_delivery(now, d).unwrap();
        assert_eq!(net.members[0].session.poll_transmit(), None, "{algorithm:?}: a replay made alice send");
        assert_eq!(net.members[0].session.poll_event(), None, "{algorithm:?}: a replay changed what alice sees");

        // Carol gets the key at the next tick, as ever.
        net.advance(PERIOD);
        let (fp, members) = keys(&net, 0).last().unwrap().clone();
        assert_eq!(members, ["alice", "bob", "carol"], "{algorithm:?}");
        for i in 1..3 {
            assert_eq!(keys(&net, i).last(), Some(&(fp.clone(), members.clone())), "{algorithm:?}: member {i}");
        }
        no_rejections(&net);
    }
}

/// The Waiting events member `i` delivered, as lists of names.
fn waiting_events(net: &Net, i: usize) -> Vec<Vec<String>> {
    net.members[i]
        .log
        .iter()
        .filter_map(|e| match e {
            SecureEvent::Waiting { members, .. } => Some(members.iter().map(|m| m.as_str().to_owned()).collect()),
            _ => None,
        })
        .collect()
}

#[test]
fn members_waiting_for_the_next_rekey_are_reported_and_the_rekey_is_metered() {
    let names = |v: Vec<MemberId>| v.into_iter().map(|m| m.as_str().to_owned()).collect::<Vec<_>>();
    let mut net = Net::new(&["alice", "bob", "carol"], 91);
    let policy = Policy::interval(IntervalAlgorithm::QueueBatch, PERIOD);
    net.join(0, policy);
    assert!(net.members[0].session.waiting_members(vnet::GROUP).is_empty());
    net.join(1, policy);
    net.join(2, policy);
    // Alice holds the key: bob and carol wait. Bob holds none: he names himself.
    assert_eq!(names(net.members[0].session.waiting_members(vnet::GROUP)), ["bob", "carol"]);
    // Alice first waited for her own first key (at once: she leads), then
    // nobody, then bob, then bob and carol.
    let expected: [&[&str]; 4] = [&["alice"], &[], &["bob"], &["bob", "carol"]];
    assert_eq!(waiting_events(&net, 0), expected.map(|l| l.iter().map(|s| s.to_string()).collect::<Vec<_>>()));
    assert_eq!(names(net.members[1].session.waiting_members(vnet::GROUP)), ["bob"]);
    let before = net.members[0].session.meter(vnet::GROUP).unwrap();
    net.advance(PERIOD);
    for i in 0..3 {
        assert!(net.members[i].session.waiting_members(vnet::GROUP).is_empty(), "member {i}");
        assert_eq!(waiting_events(&net, i).last(), Some(&Vec::new()), "member {i}: told that nobody waits");
    }
    // The leader's meter counts the rekey it led; every member's, its exponentiations.
    let after = net.members[0].session.meter(vnet::GROUP).unwrap();
    let (s0, s1) = (before.interval.unwrap(), after.interval.unwrap());
    assert_eq!(s1.rekeys_led, s0.rekeys_led + 1);
    assert!(after.costs.exps > before.costs.exps);
    for i in 1..3 {
        assert!(net.members[i].session.meter(vnet::GROUP).unwrap().costs.exps > 0, "member {i}");
    }
    // SEAL's rekeying time: from the rekey message, not from the join (a
    // whole period earlier).
    for i in 1..3 {
        let SecureEvent::View(v) = net.members[i].log.iter().rfind(|e| matches!(e, SecureEvent::View(_))).unwrap()
        else {
            unreachable!()
        };
        assert!(v.rekey_time < PERIOD / 2, "member {i}: {:?}", v.rekey_time);
    }
    // A group rekeyed on every view has no one waiting and no meter of intervals.
    let mut net = Net::new(&["alice", "bob"], 92);
    net.join(0, Policy::default());
    net.join(1, Policy::default());
    assert!(net.members[0].session.waiting_members(vnet::GROUP).is_empty());
    assert!(waiting_events(&net, 0).is_empty());
    let m = net.members[0].session.meter(vnet::GROUP).unwrap();
    assert!(m.interval.is_none() && m.costs.exps > 0);
}

/// Keys outlive views, so a confirmation can outlive its collector: when a
/// view takes the collector before its verdict, every member sends its
/// confirmation again, to the next collector (the first of the key's members
/// still there), whose verdict confirms the key for those who stayed.
#[test]
fn a_collector_gone_before_its_verdict_hands_the_confirmation_to_the_next() {
    for (k, algorithm) in IntervalAlgorithm::ALL.into_iter().enumerate() {
        let mut net = Net::new(&["alice", "bob", "carol"], 60 + k as u64);
        let policy = Policy::interval(algorithm, PERIOD);
        for i in 0..3 {
            net.join(i, policy);
        }
        // The tick rekeys the three; the confirmations to alice, the
        // collector, are held back on a slow link until she has left.
        let due = net.members[0].session.poll_timeout().unwrap();
        net.advance(due.saturating_duration_since(net.now()) - Duration::from_millis(1));
        net.members[0].session.handle_timeout(due).unwrap();
        let mut held = net.drain_holding(0, &is_confirmation);
        held.extend(net.settle_holding(&is_confirmation));
        assert_eq!(held.len(), 2, "{algorithm:?}: bob and carol confirm to alice");
        let epoch = net.members[1].session.confirming_epoch(vnet::GROUP).expect("bob installed the rekey");
        assert_eq!(net.members[2].session.confirming_epoch(vnet::GROUP), Some(epoch), "{algorithm:?}");
        leave(&mut net, 0);
        for op in held {
            net.submit(op); // to alice, who left: the daemon refuses them
        }
        net.settle();
        for i in 1..3 {
            let (fp, members) = keys(&net, i).last().unwrap().clone();
            assert_eq!(
                members,
                ["alice", "bob", "carol"],
                "{algorithm:?}: {} confirmed the rekey",
                net.members[i].name
            );
            assert_eq!(keys(&net, 1).last().unwrap().0, fp, "{algorithm:?}");
            assert_eq!(net.members[i].session.confirming_epoch(vnet::GROUP), None, "{algorithm:?}");
        }
        no_rejections(&net);
    }
}
