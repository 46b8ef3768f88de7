//! Optimized EVS end to end on the sans-IO pieces: secure sessions over a
//! standalone keyed daemon (the daemon `Machine` of `conclave-integrated`),
//! with the test choosing the order in which the daemon sees what the
//! members send — so a message can be made to cross a view change, every
//! time.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use conclave_gcs::core::{ConnId, Core, DaemonId, Limits, Machine, Op, Output};
use conclave_gcs::MemberId;
use conclave_gka::suite::ed25519::Ed25519Signer;
use conclave_gka::suite::Signer;
use conclave_gka::StaticDirectory;
use conclave_integrated::{DaemonIdentities, KeyedDaemon};
use conclave_secure::{Policy, RejectReason, SecureEvent, SessionCore, Transmit};
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha20Rng;

const GROUP: &str = "room";
const NAMES: [&str; 4] = ["alice", "bob", "carol", "dave"];

fn signer(i: usize) -> Arc<dyn Signer> {
    Arc::new(Ed25519Signer::from_seed(&[i as u8 + 1; 32]))
}

/// One standalone keyed daemon and its members' sessions; the test hands
/// the daemon the members' requests, in the order it chooses.
struct Net {
    daemon: KeyedDaemon,
    sessions: BTreeMap<ConnId, SessionCore>,
    events: BTreeMap<ConnId, Vec<SecureEvent>>,
    /// Every multicast each member sent, in order.
    sent: BTreeMap<ConnId, Vec<Bytes>>,
    /// The daemon's clock, microseconds.
    clock: u64,
    now: Instant,
    directory: Arc<StaticDirectory>,
}

impl Net {
    fn new(tweak: impl FnOnce(KeyedDaemon) -> KeyedDaemon) -> Net {
        let me = DaemonId(0);
        let daemon_signer = Arc::new(Ed25519Signer::from_seed(&[99; 32]));
        let identities = DaemonIdentities::alone(me, daemon_signer);
        let daemon =
            KeyedDaemon::new(Core::new(me, Limits::default(), 7), identities, Box::new(ChaCha20Rng::seed_from_u64(1)));
        let mut directory = StaticDirectory::new();
        for (i, n) in NAMES.iter().enumerate() {
            directory.insert(MemberId::new(*n).unwrap(), signer(i).verifier());
        }
        Net {
            daemon: tweak(daemon),
            sessions: BTreeMap::new(),
            events: BTreeMap::new(),
            sent: BTreeMap::new(),
            clock: 1,
            now: Instant::now(),
            directory: Arc::new(directory),
        }
    }

    fn conn(i: usize) -> ConnId {
        ConnId { daemon: DaemonId(0), local: i as u64 }
    }

    /// Member `i` connects and joins under `policy`; its requests are
    /// handed to the daemon at once.
    fn join(&mut self, i: usize, policy: Policy) {
        let conn = Self::conn(i);
        let me = MemberId::new(NAMES[i]).unwrap();
        let rng = Box::new(ChaCha20Rng::seed_from_u64(10 + i as u64));
        let mut session = SessionCore::new(me.clone(), signer(i), self.directory.clone(), rng, self.now);
        session.join(self.now, GROUP, policy).unwrap();
        self.sessions.insert(conn, session);
        self.feed(Op::Connect { conn, name: me });
        let requests = self.take(conn);
        for op in requests {
            self.feed(op);
        }
    }

    /// What member `conn` asked of the daemon since the last call.
    fn take(&mut self, conn: ConnId) -> Vec<Op> {
        let session = self.sessions.get_mut(&conn).unwrap();
        let mut ops = Vec::new();
        while let Some(t) = session.poll_transmit() {
            if let Transmit::Multicast(_, payload) = &t {
                self.sent.entry(conn).or_default().push(payload.clone());
            }
            ops.push(t.into_op(conn));
        }
        ops
    }

    /// The daemon orders `op`; its deliveries go to the sessions.
    fn feed(&mut self, op: Op) {
        let mut out = Vec::new();
        self.daemon.handle(op, self.clock, &mut out);
        for o in out {
            match o {
                Output::Deliver { to, delivery } => {
                    for c in to {
                        let Some(session) = self.sessions.get_mut(&c) else { continue };
                        session.handle_delivery(self.now, delivery.clone()).unwrap();
                        while let Some(ev) = session.poll_event() {
                            self.events.entry(c).or_default().push(ev);
                        }
                    }
                }
                // A daemon alone orders its own submissions.
                Output::Submit(op) => self.feed(op),
            }
        }
    }

    /// Hands the daemon everything the members asked, until nobody asks anything.
    fn settle(&mut self) {
        loop {
            let conns: Vec<ConnId> = self.sessions.keys().copied().collect();
            let ops: Vec<Op> = conns.into_iter().flat_map(|c| self.take(c)).collect();
            if ops.is_empty() {
                return;
            }
            for op in ops {
                self.feed(op);
            }
        }
    }

    fn send(&mut self, i: usize, text: &str) {
        self.sessions.get_mut(&Self::conn(i)).unwrap().send(self.now, GROUP, text.as_bytes()).unwrap();
    }

    /// The messages member `i` read, as text.
    fn read(&self, i: usize) -> Vec<String> {
        let evs = self.events.get(&Self::conn(i)).map(Vec::as_slice).unwrap_or(&[]);
        evs.iter()
            .filter_map(|e| match e {
                SecureEvent::Message { data, .. } => Some(String::from_utf8(data.to_vec()).unwrap()),
                _ => None,
            })
            .collect()
    }

    fn rejected(&self, i: usize) -> Vec<RejectReason> {
        let evs = self.events.get(&Self::conn(i)).map(Vec::as_slice).unwrap_or(&[]);
        evs.iter()
            .filter_map(|e| match e {
                SecureEvent::Rejected { reason, .. } => Some(reason.clone()),
                _ => None,
            })
            .collect()
    }

    fn secure_views(&self, i: usize) -> usize {
        let evs = self.events.get(&Self::conn(i)).map(Vec::as_slice).unwrap_or(&[]);
        evs.iter().filter(|e| matches!(e, SecureEvent::View(_))).count()
    }

    /// Data messages member `i` multicast (key confirmations left out).
    fn data_sent(&self, i: usize) -> usize {
        let sent = self.sent.get(&Self::conn(i)).map(Vec::as_slice).unwrap_or(&[]);
        sent.iter().filter(|p| matches!(p.first(), Some(2 | 9))).count()
    }
}

/// Alice and Bob in a group of `policy`; Alice's message reaches the daemon
/// only after Carol's join has been ordered.
fn crossing(policy: Policy, tweak: impl FnOnce(KeyedDaemon) -> KeyedDaemon) -> Net {
    let mut net = Net::new(tweak);
    net.join(0, policy);
    net.join(1, policy);
    net.settle();
    assert!(net.secure_views(0) >= 1 && net.secure_views(1) == 1, "alice and bob are keyed");
    net.send(0, "crossing");
    let held = net.take(Net::conn(0));
    assert_eq!(held.len(), 1, "one multicast");
    net.join(2, policy);
    for op in held {
        net.feed(op);
    }
    net.settle();
    net
}

#[test]
fn a_message_that_crosses_a_view_change_is_re_encrypted_and_sent_once() {
    let net = crossing(Policy::optimized_evs(), |d| d);
    for i in 0..3 {
        assert_eq!(net.read(i), ["crossing"], "member {i}");
        assert!(net.rejected(i).is_empty(), "member {i}: {:?}", net.rejected(i));
    }
    assert_eq!(net.data_sent(0), 1, "sent once");
    assert_eq!(net.daemon.evs_stats().reencrypted, 1);
    for i in 0..3 {
        assert_eq!(net.sessions[&Net::conn(i)].reencrypted(GROUP), 1, "member {i} read it re-encrypted");
    }

    // Integrated VS, the same script: nobody reads it in the view it was
    // delivered in, and its sender sends it again.
    let net = crossing(Policy::integrated(), |d| d);
    assert_eq!(net.read(1), ["crossing"]);
    assert_eq!(net.data_sent(0), 2, "sent twice");
}

#[test]
fn a_message_whose_key_expired_is_reported_not_dropped() {
    // Key-out: one key per group, so the key of Alice's view is gone when
    // her message comes after Carol's join.
    let net = crossing(Policy::optimized_evs(), |d| d.with_evs_expiry(1, 60_000_000));
    for i in 0..3 {
        assert!(net.read(i).is_empty(), "member {i}");
        assert!(
            matches!(net.rejected(i).as_slice(), [RejectReason::KeyGone { .. }]),
            "member {i}: {:?}",
            net.rejected(i)
        );
    }
    assert_eq!(net.daemon.evs_stats().key_gone, 1);

    // Time-out: the key is dropped once no message came under it for a
    // second of the daemon's clock.
    let mut net = Net::new(|d| d.with_evs_expiry(8, 1_000_000));
    net.join(0, Policy::optimized_evs());
    net.join(1, Policy::optimized_evs());
    net.settle();
    net.send(0, "late");
    let held = net.take(Net::conn(0));
    net.join(2, Policy::optimized_evs());
    net.settle();
    net.clock += 2_500_000;
    net.join(3, Policy::optimized_evs()); // any input: the daemon sweeps its keys after it
    for op in held {
        net.feed(op);
    }
    net.settle();
    assert!(net.read(1).is_empty());
    assert!(matches!(net.rejected(1).as_slice(), [RejectReason::KeyGone { .. }]), "{:?}", net.rejected(1));
    assert!(net.daemon.evs_stats().timed_out >= 1);
}

#[test]
fn replays_forgeries_and_other_modes_are_refused() {
    let mut net = Net::new(|d| d);
    for i in 0..3 {
        net.join(i, Policy::optimized_evs());
    }
    net.settle();
    net.send(0, "once");
    net.settle();
    let envelope = net.sent[&Net::conn(0)].iter().rfind(|p| p.first() == Some(&9)).unwrap().clone();
    // Alice's envelope again, in her name: a replay.
    net.sessions.get_mut(&Net::conn(0)).unwrap().send_raw(GROUP, &envelope).unwrap();
    net.settle();
    assert!(matches!(net.rejected(1).as_slice(), [RejectReason::Replay(0)]), "{:?}", net.rejected(1));
    // Bob sends it in his name: the sender inside is Alice.
    net.sessions.get_mut(&Net::conn(1)).unwrap().send_raw(GROUP, &envelope).unwrap();
    net.settle();
    assert_eq!(net.rejected(2).last(), Some(&RejectReason::UnknownSender));
    // Altered on the way.
    let mut altered = envelope.to_vec();
    *altered.last_mut().unwrap() ^= 1;
    net.sessions.get_mut(&Net::conn(0)).unwrap().send_raw(GROUP, &altered).unwrap();
    net.settle();
    assert_eq!(net.rejected(2).last(), Some(&RejectReason::AuthFailed));
    // A layered data message (tag 2) is of another mode.
    net.sessions.get_mut(&Net::conn(0)).unwrap().send_raw(GROUP, &[2, 0, 0]).unwrap();
    net.settle();
    assert_eq!(net.rejected(2).last(), Some(&RejectReason::WrongMode));
    assert_eq!(net.read(2), ["once"]);

    // An envelope in an Integrated VS group is of another mode.
    let mut net = Net::new(|d| d);
    net.join(0, Policy::integrated());
    net.join(1, Policy::integrated());
    net.settle();
    net.sessions.get_mut(&Net::conn(0)).unwrap().send_raw(GROUP, &envelope).unwrap();
    net.settle();
    assert_eq!(net.rejected(1), [RejectReason::WrongMode]);
}

#[test]
fn an_altered_message_under_an_old_key_is_reported_by_the_daemon() {
    let mut net = Net::new(|d| d);
    net.join(0, Policy::optimized_evs());
    net.join(1, Policy::optimized_evs());
    net.settle();
    net.send(0, "crossing");
    let mut held = net.take(Net::conn(0));
    let Some(Op::Multicast { payload, .. }) = held.first_mut() else { panic!("a multicast") };
    let mut bytes = payload.to_vec();
    *bytes.last_mut().unwrap() ^= 1;
    *payload = bytes.into();
    net.join(2, Policy::optimized_evs());
    for op in held {
        net.feed(op);
    }
    net.settle();
    assert_eq!(net.rejected(1), [RejectReason::AuthFailed]);
    assert_eq!(net.daemon.evs_stats().unreadable, 1);
}

#[test]
fn data_of_a_view_cut_short_by_the_next_one_is_still_read() {
    let mut net = Net::new(|d| d);
    net.join(0, Policy::optimized_evs());
    net.join(1, Policy::optimized_evs());
    net.settle();
    net.send(0, "cut short");
    let held = net.take(Net::conn(0));
    // Carol's join, then Dave's, both ordered after Alice's message left
    // her view: it is delivered in a later view, re-encrypted.
    net.join(2, Policy::optimized_evs());
    for op in held {
        net.feed(op);
    }
    net.join(3, Policy::optimized_evs());
    net.settle();
    for i in 0..3 {
        assert_eq!(net.read(i), ["cut short"], "member {i}");
        assert!(net.rejected(i).is_empty(), "member {i}: {:?}", net.rejected(i));
    }
    assert_eq!(net.data_sent(0), 1);
}

#[test]
fn a_bundle_that_loses_its_key_is_reported_with_how_many_messages_it_carried() {
    // Key-out: one key per group, so nothing sealed in Alice and Bob's view
    // survives Carol's join.
    let mut net = Net::new(|d| d.with_evs_expiry(1, 60_000_000));
    net.join(0, Policy::optimized_evs());
    net.join(1, Policy::optimized_evs());
    net.settle();
    // The first goes out at once; the next nine wait for it to come back.
    for i in 0..10 {
        net.send(0, &format!("m{i}"));
    }
    let first = net.take(Net::conn(0));
    assert_eq!(first.len(), 1, "an idle sender's message goes at once, the rest wait");
    for op in first {
        net.feed(op);
    }
    let bundle = net.take(Net::conn(0));
    assert_eq!(bundle.len(), 1, "the nine waiting go out together once the first came back");
    net.join(2, Policy::optimized_evs());
    for op in bundle {
        net.feed(op);
    }
    net.settle();
    assert_eq!(net.read(1), ["m0"]);
    let lost: Vec<u32> = net
        .rejected(1)
        .into_iter()
        .map(|r| match r {
            RejectReason::KeyGone { messages, .. } => messages,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(lost, [9], "every message is accounted for");
    assert_eq!(net.data_sent(0), 2);
}

/// In the groups the daemons key, the members confirm nothing: the daemons
/// confirmed among themselves the key every view's key is derived from (see
/// `conclave_integrated`), so each member shows its secure view as soon as
/// the view and its key are there, and sends no confirmation or verdict.
#[test]
fn keyed_groups_show_each_view_with_its_key_and_send_no_confirmations() {
    use conclave_secure::payload::tag;

    for policy in [Policy::integrated(), Policy::optimized_evs()] {
        let mut net = Net::new(|d| d);
        net.join(0, policy);
        net.join(1, policy);
        net.join(2, policy);
        net.settle();
        for i in 0..3 {
            assert!(net.secure_views(i) >= 1, "{policy:?}: member {i} is keyed");
            let confirmations = net
                .sent
                .get(&Net::conn(i))
                .into_iter()
                .flatten()
                .filter(|p| matches!(p.first(), Some(&tag::CONFIRM | &tag::VERDICT)));
            assert_eq!(confirmations.count(), 0, "{policy:?}: member {i} sent a confirmation or a verdict");
        }
        net.send(1, "keyed");
        net.settle();
        assert_eq!(net.read(0), ["keyed"], "{policy:?}");
        assert_eq!(net.read(2), ["keyed"], "{policy:?}");
    }
}
