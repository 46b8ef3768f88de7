//! Members that take their deliveries in batches
//! (`SessionCore::handle_deliveries`: a view superseded in the batch starts
//! no run, and a member whose next view is already here sends nothing for
//! the earlier one) agree on one key with each other, for every protocol,
//! whatever the batches: many members joining at once, then a leave.

use conclave_gka::{GroupId, ProtocolId};
use conclave_secure::Policy;

mod vnet;
use vnet::{Net, GROUP};

const NAMES: [&str; 8] = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7"];

/// Every member of `members` shows a last secure view of `size` members, all with one key.
fn agreed(net: &Net, members: impl IntoIterator<Item = usize>, size: usize) {
    let mut keys = Vec::new();
    for i in members {
        let (_, fingerprint, n) = net.last_view(i).unwrap_or_else(|| panic!("member {i} has no secure view"));
        assert_eq!(n, size, "member {i}'s last secure view");
        keys.push(fingerprint);
    }
    assert!(keys.windows(2).all(|w| w[0] == w[1]), "members hold different keys: {keys:?}");
}

/// Returns the messages (key agreement and confirmation) sent while the group formed.
fn join_at_once_then_leave(protocol: ProtocolId, seed: u64, batched: bool) -> usize {
    let settle = |net: &mut Net, max: usize, seed: u64| {
        if batched {
            net.settle_batched(max, seed)
        } else {
            net.settle()
        }
    };
    let mut net = Net::new(&NAMES, seed);
    let policy = Policy::new(protocol, GroupId::Ristretto255);
    // Every member asks to join before anything is delivered: n views in a row.
    for i in 0..NAMES.len() {
        let now = net.now();
        net.members[i].session.join(now, GROUP, policy).unwrap();
        net.drain(i);
    }
    settle(&mut net, 6, seed);
    agreed(&net, 0..NAMES.len(), NAMES.len());
    let sent = net.messages_sent;
    let now = net.now();
    net.members[3].session.leave(now, GROUP).unwrap();
    net.drain(3);
    settle(&mut net, 4, seed ^ 0x5eed);
    agreed(&net, (0..NAMES.len()).filter(|&i| i != 3), NAMES.len() - 1);
    sent
}

#[test]
fn batched_members_agree_for_every_protocol() {
    for protocol in [ProtocolId::Gdh, ProtocolId::Ckd, ProtocolId::Tgdh, ProtocolId::Str, ProtocolId::Bd] {
        for seed in 1..=4 {
            join_at_once_then_leave(protocol, seed, true);
        }
    }
}

#[test]
fn batched_members_skip_the_runs_of_superseded_views() {
    // Taken one by one, the members key views that the next one
    // supersedes; in batches they send less for them.
    let (mut one_by_one, mut batched) = (0, 0);
    for seed in 1..=4 {
        one_by_one += join_at_once_then_leave(ProtocolId::Tgdh, seed, false);
        batched += join_at_once_then_leave(ProtocolId::Tgdh, seed, true);
    }
    assert!(batched < one_by_one, "{batched} messages in batches, {one_by_one} one by one");
}
