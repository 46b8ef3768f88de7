//! Data bundles (`conclave_secure::data`, "Bundles"): an idle sender's
//! message goes out at once; what a sender sends while its own are on their
//! way back waits and goes out together when one comes back; every member
//! reads each message once, in send order, across a view change too.

use conclave_gcs::core::{Delivery, Op};
use conclave_gka::{GroupId, ProtocolId};
use conclave_secure::payload::tag;
use conclave_secure::{Policy, SecureEvent};

mod vnet;
use vnet::{Net, GROUP};

/// The data messages member `i` multicasts now (its other transmits go to
/// the daemon as usual): how many.
fn data_sent(net: &mut Net, i: usize) -> usize {
    let conn = net.members[i].conn;
    let mut ops = Vec::new();
    while let Some(t) = net.members[i].session.poll_transmit() {
        ops.push(t.into_op(conn));
    }
    let data = ops
        .iter()
        .filter(|op| matches!(op, Op::Multicast { payload, .. } if payload.first() == Some(&tag::DATA)))
        .count();
    for op in ops {
        net.submit(op);
    }
    data
}

/// What member `i` read from `sender`, in order.
fn read_from(net: &Net, i: usize, sender: usize) -> Vec<Vec<u8>> {
    let from = &net.members[sender].name;
    net.members[i]
        .log
        .iter()
        .filter_map(|e| match e {
            SecureEvent::Message { sender, data, .. } if sender == from => Some(data.to_vec()),
            _ => None,
        })
        .collect()
}

fn formed(names: &[&str]) -> Net {
    let mut net = Net::new(names, 7);
    for i in 0..names.len() {
        net.join(i, Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255));
    }
    net
}

#[test]
fn messages_sent_while_bundles_travel_go_out_together_and_arrive_in_order() {
    let mut net = formed(&["a", "b", "c"]);
    let sent: Vec<Vec<u8>> = (0..50u32).map(|i| format!("message {i}").into_bytes()).collect();
    let now = net.now();
    let mut first = 0;
    for m in &sent {
        net.members[0].session.send(now, GROUP, m).unwrap();
        first += data_sent(&mut net, 0);
    }
    // The first at once; the rest wait for it to come back.
    assert_eq!(first, 1);
    // a reads its first message back: the 49 waiting go out in one bundle.
    let d = net.members[0].inbox.pop_front().unwrap();
    assert!(matches!(&d, Delivery::Message { payload, .. } if payload.first() == Some(&tag::DATA)));
    net.members[0].session.handle_delivery(now, d).unwrap();
    assert_eq!(data_sent(&mut net, 0), 1);
    net.settle();
    for i in 0..3 {
        assert_eq!(read_from(&net, i, 0), sent, "member {i}");
    }
}

#[test]
fn bundles_that_cross_a_view_change_are_sent_again_and_read_once() {
    let mut net = formed(&["a", "b", "c"]);
    let sent: Vec<Vec<u8>> = (0..40u32).map(|i| format!("message {i}").into_bytes()).collect();
    let now = net.now();
    for m in &sent {
        net.members[0].session.send(now, GROUP, m).unwrap();
        data_sent(&mut net, 0);
    }
    // c leaves behind a's first message: the bundle of the other 39, sent
    // when the first comes back, is ordered after the view change.
    let now = net.now();
    net.members[2].session.leave(now, GROUP).unwrap();
    net.drain(2);
    net.settle();
    for i in 0..2 {
        assert_eq!(read_from(&net, i, 0), sent, "member {i}");
    }
    assert_eq!(read_from(&net, 2, 0), sent[..1], "c read what was sent in its view, and nothing after");
}
