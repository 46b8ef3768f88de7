//! The group policy's switch for sender signatures on data messages, on the
//! sans-IO core (see `vnet`): what turning them off saves, what it costs,
//! and that members who disagree on it never share a group.

use conclave_gcs::core::{Delivery, Service};
use conclave_gcs::{GroupName, MemberId};
use conclave_gka::{GroupId, ProtocolId};
use conclave_secure::payload::tag;
use conclave_secure::{Policy, RejectReason, SecureEvent};

mod vnet;
use vnet::{Net, GROUP};

fn policy(sender_signatures: bool) -> Policy {
    Policy { sender_signatures, ..Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255) }
}

/// Alice's message as bob got it, raw, and what a forger holding the group's
/// data keys makes bob deliver as alice's.
fn run(sender_signatures: bool) -> (usize, Vec<SecureEvent>) {
    let mut net = Net::new(&["alice", "bob", "mallory"], 31);
    for i in 0..3 {
        net.join(i, policy(sender_signatures));
    }
    let now = net.now();
    net.members[0].session.send(now, GROUP, b"hello from alice").unwrap();
    net.drain(0);
    net.settle();
    let got = |e: &SecureEvent, text: &[u8]| matches!(e, SecureEvent::Message { sender, data, .. } if sender.as_str() == "alice" && &data[..] == text);
    assert!(net.members[1].log.iter().any(|e| got(e, b"hello from alice")), "bob got alice's message");
    let captured = net.members[1].session.captured(GROUP);
    let size = captured.iter().find(|(s, _)| s.as_str() == "alice").map(|(_, b)| b.len()).expect("captured");
    // Mallory, an insider, writes in alice's name with the epoch's data keys
    // and no signature, and a compromised link delivers it as alice's.
    let keys = net.members[2].session.epoch_keys(GROUP).expect("mallory's keys");
    let alice = MemberId::new("alice").unwrap();
    let view = net.core.view(&GroupName::new(GROUP).unwrap()).expect("a view").id;
    let mut payload = vec![tag::DATA];
    payload.extend_from_slice(&keys.seal(&alice, view, 1000, &[b"forged by mallory"], None));
    let group = GroupName::new(GROUP).unwrap();
    let forged = Delivery::Message { group, sender: alice, service: Service::Agreed, view, payload: payload.into() };
    let before = net.members[1].log.len();
    net.members[1].inbox.push_back(forged);
    net.settle();
    let after = net.members[1].log[before..].to_vec();
    assert!(!after.iter().any(|e| got(e, b"hello from alice")));
    (size, after)
}

/// With signatures (the default) the forgery is refused; without, every
/// message is a signature shorter, and the forgery is delivered as alice's:
/// exactly what the policy's documentation warns of.
#[test]
fn without_sender_signatures_messages_are_shorter_and_insiders_can_write_in_others_names() {
    let (signed, refused) = run(true);
    assert!(matches!(&refused[..], [SecureEvent::Rejected { reason: RejectReason::BadSignature, .. }]), "{refused:?}");
    let (unsigned, delivered) = run(false);
    assert_eq!(signed - unsigned, 64, "an Ed25519 signature");
    assert!(
        matches!(&delivered[..], [SecureEvent::Message { sender, data, .. }] if sender.as_str() == "alice" && &data[..] == b"forged by mallory"),
        "{delivered:?}"
    );
}

/// The switch is part of the policy: a joiner that asks for the other
/// setting is told so by the group's oldest member and leaves.
#[test]
fn members_that_disagree_on_sender_signatures_never_share_a_group() {
    for first in [true, false] {
        let mut net = Net::new(&["alice", "bob"], 37);
        net.join(0, policy(first));
        net.join(1, policy(!first));
        let mismatch = net.members[1].log.iter().find_map(|e| match e {
            SecureEvent::PolicyMismatch { ours, theirs, from, .. } => Some((*ours, *theirs, from.clone())),
            _ => None,
        });
        let (ours, theirs, from) = mismatch.expect("bob is told");
        assert_eq!((ours, theirs, from.as_str()), (policy(!first), Some(policy(first)), "alice"));
        assert!(net.members[1].log.iter().any(|e| matches!(e, SecureEvent::Left { .. })));
        let shared = net.members[1].log.iter().any(|e| matches!(e, SecureEvent::View(v) if v.members.len() == 2));
        assert!(!shared, "bob never holds a key with alice");
    }
}

/// The sender-signatures bit travels outside the signed envelope, but every
/// envelope signs its policy: a link that flips the bit in an older member's
/// key agreement messages does not pass them off as another policy's, so a
/// newcomer is not talked out of the group (found by `conclave sim`, ckd seed
/// 6717: before, bob left).
#[test]
fn a_flipped_policy_bit_does_not_talk_a_newcomer_out_of_the_group() {
    for first in [true, false] {
        let mut net = Net::new(&["alice", "bob"], 43);
        net.join(0, policy(first));
        net.flip_policy_bit_for = Some(1);
        net.join(1, policy(first));
        let bob = &net.members[1];
        assert!(
            !bob.log.iter().any(|e| matches!(e, SecureEvent::PolicyMismatch { .. } | SecureEvent::Left { .. })),
            "{:?}",
            bob.log
        );
        // Nothing of alice's key agreement reaches bob's engine intact, so
        // the view waits; what matters is that bob is still a member.
        assert!(net.core.view(&GroupName::new(GROUP).unwrap()).unwrap().contains(&bob.name));
    }
}
