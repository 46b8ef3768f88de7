//! Key confirmation on the sans-IO core: real
//! [`SessionCore`]s as clients of a real daemon [`Core`], in memory and in
//! virtual time (nothing sleeps; every run is the same).
//!
//! Key splits by an insider, for every protocol: the insider, mallory, is a member with a valid identity. Once, she
//! replaces one group element of one of her key agreement messages by
//! another valid element (the group's generator) and signs the result, so
//! that the message passes every check the engines make on their own: the
//! members then compute different keys. Key confirmation must catch it:
//! every honest member reports the run and members whose key differs from
//! its own (never itself), no key of that run reaches any application, and
//! the view is rekeyed to one key that every member confirms.

use std::collections::BTreeSet;

use conclave_gka::{GroupId, ProtocolId};
use std::sync::atomic::Ordering;

use conclave_secure::{confirmation_cost, Policy, RejectReason, SecureEvent};

mod vnet;
use vnet::{Forgery, Net, GROUP};

/// The compressed Ristretto255 generator: a valid element that differs from
/// every honest member's value.
const GENERATOR: [u8; 32] = curve25519_dalek::constants::RISTRETTO_BASEPOINT_COMPRESSED.0;

/// How the insider lies, per protocol: in which round, and where the element
/// she replaces sits in the body (`at` bytes from the start, or the last one).
struct Lie {
    round: u8,
    /// The body's first two bytes (a count) must say this, if set, so that
    /// the lie hits the run of the five-member view.
    count: Option<u16>,
    at: Option<usize>,
}

/// Mallory joins at `position` (0 = first) among five; `lie` says what she
/// tampers, once. Returns the honest members' mismatch reports.
fn split_and_heal(protocol: ProtocolId, position: usize, lie: Lie) {
    let honest = ["alice", "bob", "carol", "dave"];
    let mut names: Vec<&str> = honest.to_vec();
    names.insert(position, "mallory");
    let mut net = Net::new(&names, 17 + protocol.code() as u64);
    let policy = Policy::new(protocol, GroupId::Ristretto255);
    let mallory = position;
    // Mallory arms her lie as she joins.
    for i in 0..names.len() {
        let now = net.now();
        net.members[i].session.join(now, GROUP, policy).unwrap();
        if i == mallory {
            let Lie { round, count, at } = lie;
            let mut done = false;
            net.members[i]
                .session
                .tamper_key_agreement(GROUP, move |r, body| {
                    let counted = count.is_none_or(|c| body.len() >= 2 && body[..2] == c.to_be_bytes());
                    if done || r != round || !counted || body.len() < 32 {
                        return false;
                    }
                    let start = at.unwrap_or(body.len() - 32);
                    let Some(elem) = body.get_mut(start..start + 32) else { return false };
                    if elem == GENERATOR {
                        return false;
                    }
                    elem.copy_from_slice(&GENERATOR);
                    done = true;
                    true
                })
                .unwrap();
        }
        net.drain(i);
        net.settle();
    }
    let mut healed = BTreeSet::new();
    for (i, m) in net.members.iter().enumerate() {
        if i == mallory {
            continue;
        }
        let mismatch = m.log.iter().find_map(|e| match e {
            SecureEvent::KeyMismatch { epoch, unconfirmed, .. } => Some((*epoch, unconfirmed.clone())),
            _ => None,
        });
        let Some((epoch, unconfirmed)) = mismatch else {
            panic!("{protocol}: {} noticed nothing: {:?}", m.name, m.log);
        };
        assert!(!unconfirmed.is_empty() && !unconfirmed.contains(&m.name), "{protocol}: {}: {unconfirmed:?}", m.name);
        let leaked = m.log.iter().any(|e| matches!(e, SecureEvent::View(v) if v.epoch == epoch));
        assert!(!leaked, "{protocol}: {}: the unconfirmed key of {epoch} reached the application", m.name);
        let (last, fp, n) = net.last_view(i).expect("a secure view");
        assert_eq!(n, 5, "{protocol}: {} is not in the five-member view", m.name);
        assert_eq!(last.view, epoch.view, "{protocol}: {} was rekeyed in the same view", m.name);
        assert!(last.run > epoch.run, "{protocol}: {}: a later run", m.name);
        healed.insert(fp);
    }
    assert_eq!(healed.len(), 1, "{protocol}: the healed key differs: {healed:?}");
    // The healed group works, mallory included.
    let now = net.now();
    net.members[(mallory + 1) % 5].session.send(now, GROUP, b"after the split").unwrap();
    net.drain((mallory + 1) % 5);
    net.settle();
    for m in &net.members {
        let got =
            m.log.iter().any(|e| matches!(e, SecureEvent::Message { data, .. } if &data[..] == b"after the split"));
        assert!(got, "{protocol}: {} missed the message after the split", m.name);
    }
}

/// BD: mallory, last, sends her round-1 value Z again as her round-2 value X.
/// Every honest member computes another key.
#[test]
fn a_tampered_bd_round_2_value_is_caught_and_healed() {
    split_and_heal(ProtocolId::Bd, 4, Lie { round: 2, count: None, at: None });
}

/// GDH: mallory joins last and so controls the run; in her list of partial
/// keys (round 4, `count ‖ (name ‖ element)*`) she replaces alice's.
#[test]
fn a_tampered_gdh_partial_key_is_caught_and_healed() {
    let at = 2 + 1 + "alice".len();
    split_and_heal(ProtocolId::Gdh, 4, Lie { round: 4, count: Some(5), at: Some(at) });
}

/// CKD: mallory joins first and so is the controller; in the key message of
/// the five-member view (round 3) she replaces the last member's token.
#[test]
fn a_tampered_ckd_key_message_is_caught_and_healed() {
    split_and_heal(ProtocolId::Ckd, 0, Lie { round: 3, count: Some(4), at: None });
}

/// TGDH: mallory joins last; her tree announcement (round 1) carries another
/// blinded key than her leaf's, so the others compute a root she does not.
#[test]
fn a_tampered_tgdh_blinded_key_is_caught_and_healed() {
    split_and_heal(ProtocolId::Tgdh, 4, Lie { round: 1, count: None, at: None });
}

/// STR: mallory joins last; her chain (round 2) carries another blinded key
/// than hers.
#[test]
fn a_tampered_str_blinded_key_is_caught_and_healed() {
    split_and_heal(ProtocolId::Str, 4, Lie { round: 2, count: None, at: None });
}

/// A forged confirmation in bob's name, ahead of his real one, either made
/// without the key (a MAC that does not match) or copying his real MAC under
/// a broken signature, changes nothing: every member accepts bob's real MAC
/// (or its copy: only a key holder can compute it) and never needs to check
/// a confirmation signature, and nobody sees a mismatch or an extra run.
/// (When no MAC of a sender matches, the signatures are checked and forged
/// ones rejected: the split tests above and `settling_…` in `core.rs`.)
#[test]
fn a_forged_confirmation_changes_nothing() {
    for forgery in [Forgery::Mac, Forgery::Signature] {
        for protocol in ProtocolId::ALL {
            let names = ["alice", "bob", "carol", "dave"];
            let mut net = Net::new(&names, 23);
            let policy = Policy::new(protocol, GroupId::Ristretto255);
            for i in 0..3 {
                net.join(i, policy);
            }
            net.forge_confirmations_of = Some((1, forgery));
            net.join(3, policy);
            assert!(net.confirmations_sent.iter().any(|(i, _)| *i == 1), "bob confirmed");
            let mut fingerprints = BTreeSet::new();
            for (i, m) in net.members.iter().enumerate() {
                let (epoch, fp, n) = net.last_view(i).expect("a secure view");
                assert_eq!((n, epoch.run), (4, 0), "{forgery:?} {protocol}: {} holds {epoch} of {n}", m.name);
                fingerprints.insert(fp);
                let noticed =
                    m.log.iter().any(|e| matches!(e, SecureEvent::KeyMismatch { .. } | SecureEvent::Rejected { .. }));
                assert!(!noticed, "{forgery:?} {protocol}: {}: {:?}", m.name, m.log);
                assert_eq!(m.confirm_checks.load(Ordering::Relaxed), 0, "{forgery:?} {protocol}: {}", m.name);
            }
            assert_eq!(fingerprints.len(), 1, "{forgery:?} {protocol}: {fingerprints:?}");
        }
    }
}

/// `confirmation_cost`, which `bench counts` prints, is what the session
/// does: after each join, the confirmations multicast, their bytes, and the
/// signatures each member checked.
#[test]
fn the_confirmation_cost_is_what_the_session_does() {
    let names = ["alice", "bob", "carol", "dave", "erin"];
    let mut net = Net::new(&names, 29);
    for n in 1..=names.len() {
        net.confirmations_sent.clear();
        let before: Vec<u64> = net.members.iter().map(|m| m.confirm_checks.load(Ordering::Relaxed)).collect();
        net.join(n - 1, Policy::default());
        let cost = confirmation_cost(n, 64);
        let sent = &net.confirmations_sent;
        assert_eq!(sent.len() as u64, cost.broadcasts, "n = {n}: {sent:?}");
        assert_eq!(sent.iter().map(|(_, len)| *len as u64).sum::<u64>(), cost.bytes, "n = {n}");
        let senders: BTreeSet<usize> = sent.iter().map(|(i, _)| *i).collect();
        assert_eq!(senders.len() as u64, cost.sigs_total, "n = {n}: one each");
        let checks: Vec<u64> =
            net.members[..n].iter().zip(&before).map(|(m, b)| m.confirm_checks.load(Ordering::Relaxed) - b).collect();
        assert!(checks.iter().all(|&c| c == cost.verifs_serial), "n = {n}: {checks:?}");
        assert_eq!(checks.iter().sum::<u64>(), cost.verifs_total, "n = {n}");
    }
}

/// An insider can also sign a message whose element is not a valid group
/// element: the engines refuse it, so the run cannot end. Every honest
/// member is told who sent it (before, it was dropped without a word), and
/// the next view (here: mallory leaves) gives the others a key. (Excluding
/// the sender from the view's run at once, on a proof every member can
/// check, is still to do.)
#[test]
fn an_insiders_invalid_element_is_reported_and_the_next_view_recovers() {
    for protocol in [ProtocolId::Tgdh, ProtocolId::Bd] {
        let names = ["alice", "bob", "carol", "mallory"];
        let mut net = Net::new(&names, 41);
        let policy = Policy::new(protocol, GroupId::Ristretto255);
        for i in 0..3 {
            net.join(i, policy);
        }
        let (before, _, _) = net.last_view(0).expect("a view of three");
        let now = net.now();
        net.members[3].session.join(now, GROUP, policy).unwrap();
        net.members[3]
            .session
            .tamper_key_agreement(GROUP, |_, body| {
                let n = body.len();
                body[n - 32..].fill(0xff); // not the encoding of any element
                true
            })
            .unwrap();
        net.drain(3);
        net.settle();
        for m in &net.members[..3] {
            let told = m.log.iter().any(|e| {
                matches!(e, SecureEvent::Rejected { sender, reason: RejectReason::KeyAgreement(_), .. } if sender.as_str() == "mallory")
            });
            assert!(told, "{protocol}: {} was not told: {:?}", m.name, m.log);
        }
        let now = net.now();
        net.members[3].session.leave(now, GROUP).unwrap();
        net.drain(3);
        net.settle();
        let mut fingerprints = BTreeSet::new();
        for (i, m) in net.members[..3].iter().enumerate() {
            let (epoch, fp, n) = net.last_view(i).expect("a view");
            assert_eq!(n, 3, "{protocol}: {} holds a key of the three", m.name);
            assert!(epoch.view.seq > before.view.seq + 1, "{protocol}: {} holds the key of {epoch}", m.name);
            fingerprints.insert(fp);
        }
        assert_eq!(fingerprints.len(), 1);
    }
}

/// The verdict that decides a run is this run's, from its collector (the
/// first member), with a MAC that matches: an earlier run's verdict
/// replayed, the run's verdict under another member's name, or with its MAC
/// forged, changes nothing (the forgery is reported); a copy whose
/// signature is broken but whose MAC matches is the collector's verdict as
/// it was sent (only a key holder can compute the MAC) and decides the run,
/// once, like the real one.
#[test]
fn a_verdict_replayed_forged_or_from_another_member_confirms_nothing() {
    use conclave_gcs::core::{Delivery, Op, Service};
    use conclave_gcs::{GroupName, MemberId};
    use conclave_gka::key::EPOCH_LEN;
    use conclave_secure::payload::tag;

    let is_verdict = |op: &Op| matches!(op, Op::Multicast { payload, .. } if payload.first() == Some(&tag::VERDICT));
    for protocol in ProtocolId::ALL {
        let names = ["alice", "bob", "carol", "dave"];
        let mut net = Net::new(&names, 31);
        let policy = Policy::new(protocol, GroupId::Ristretto255);
        for i in 0..3 {
            net.join(i, policy);
        }
        let (collector, old_verdict) = net.verdicts_sent.last().cloned().expect("the three members' verdict");
        assert_eq!(collector, 0, "{protocol}: alice collects");
        // Dave joins; the new run's verdict is held back.
        let now = net.now();
        net.members[3].session.join(now, GROUP, policy).unwrap();
        let mut held = net.drain_holding(3, &is_verdict);
        held.extend(net.settle_holding(&is_verdict));
        let [Op::Multicast { payload: verdict, .. }] = &held[..] else { panic!("{protocol}: one verdict: {held:?}") };
        let verdict = verdict.to_vec();
        let epoch = net.members[1].session.confirming_epoch(GROUP).expect("bob confirms the new run");
        let group = GroupName::new(GROUP).unwrap();
        let view = net.core.view(&group).unwrap().id;
        let inject = |net: &mut Net, sender: &str, payload: Vec<u8>| {
            let sender = MemberId::new(sender).unwrap();
            let d = Delivery::Message {
                group: group.clone(),
                sender,
                service: Service::Agreed,
                view,
                payload: payload.into(),
            };
            let now = net.now();
            let bob = &mut net.members[1].session;
            bob.handle_delivery(now, d).unwrap();
            assert_eq!(bob.poll_transmit(), None, "{protocol}: bob sent something");
            let events: Vec<SecureEvent> = std::iter::from_fn(|| bob.poll_event()).collect();
            net.members[1].log.extend(events.iter().cloned());
            events
        };
        assert!(inject(&mut net, "alice", old_verdict.to_vec()).is_empty(), "{protocol}: the last run's verdict");
        assert!(inject(&mut net, "carol", verdict.clone()).is_empty(), "{protocol}: the verdict in carol's name");
        // The verdict as if sent in another view: not this view's to decide.
        let mut elsewhere = verdict.clone();
        elsewhere[1 + EPOCH_LEN + 15] ^= 1;
        assert!(inject(&mut net, "alice", elsewhere).is_empty(), "{protocol}: a verdict of another view");
        assert_eq!(net.members[1].session.confirming_epoch(GROUP), Some(epoch), "{protocol}: still confirming");
        // tag ‖ epoch ‖ view (16) ‖ MAC (32) ‖ u16 length ‖ signature ‖ names
        let mut forged = verdict.clone();
        forged[1 + EPOCH_LEN + 16] ^= 1;
        let events = inject(&mut net, "alice", forged.clone());
        assert!(
            matches!(&events[..], [SecureEvent::Rejected { reason: RejectReason::BadSignature, sender, .. }] if sender.as_str() == "alice"),
            "{protocol}: a forged MAC: {events:?}"
        );
        assert_eq!(net.members[1].session.confirming_epoch(GROUP), Some(epoch), "{protocol}: still confirming");
        // Unsigned, as in a group the daemons key: in this one it is a
        // forgery all the same.
        let at = 1 + EPOCH_LEN + 16 + 32;
        let sig_len = u16::from_be_bytes([verdict[at], verdict[at + 1]]) as usize;
        let unsigned = [&forged[..at], &[0, 0], &verdict[at + 2 + sig_len..]].concat();
        let events = inject(&mut net, "alice", unsigned);
        assert!(
            matches!(&events[..], [SecureEvent::Rejected { reason: RejectReason::BadSignature, sender, .. }] if sender.as_str() == "alice"),
            "{protocol}: an unsigned verdict with another MAC: {events:?}"
        );
        assert_eq!(net.members[1].session.confirming_epoch(GROUP), Some(epoch), "{protocol}: still confirming");
        let mut copy = verdict.clone();
        let at = 1 + EPOCH_LEN + 16 + 32 + 2;
        copy[at] ^= 1;
        let events = inject(&mut net, "alice", copy);
        assert!(
            matches!(&events[..], [SecureEvent::View(v)] if v.epoch == epoch),
            "{protocol}: the collector's MAC under a broken signature: {events:?}"
        );
        for op in held {
            net.submit(op);
        }
        net.settle();
        let mut fingerprints = BTreeSet::new();
        for (i, m) in net.members.iter().enumerate() {
            let (e, fp, n) = net.last_view(i).expect("a secure view");
            assert_eq!((e, n), (epoch, 4), "{protocol}: {}", m.name);
            fingerprints.insert(fp);
            let views = m.log.iter().filter(|e| matches!(e, SecureEvent::View(v) if v.epoch == epoch)).count();
            assert_eq!(views, 1, "{protocol}: {} confirmed the run once", m.name);
            assert!(!m.log.iter().any(|e| matches!(e, SecureEvent::KeyMismatch { .. })), "{protocol}: {}", m.name);
        }
        assert_eq!(fingerprints.len(), 1, "{protocol}: {fingerprints:?}");
    }
}
