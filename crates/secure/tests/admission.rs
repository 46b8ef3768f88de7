//! Certified admission on the sans-IO core, in virtual time (see `vnet`):
//! what outsiders can and cannot do to a certified group, measured exactly
//! instead of slept through.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conclave_gcs::core::Op;
use conclave_gcs::GroupName;
use conclave_secure::core::{SessionCore, WallClock};
use conclave_secure::trust::{Authority, Identity, Issuer};
use conclave_secure::{MemberId, Policy, SecureEvent, DEFAULT_CERT_TIMEOUT};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

mod vnet;
use vnet::{Net, GROUP};

const DAY: Duration = Duration::from_secs(86_400);

/// The wall clock certificates are checked against: fixed.
struct Fixed(SystemTime);

impl WallClock for Fixed {
    fn now(&self) -> SystemTime {
        self.0
    }
}

/// A certified member's session, issued by `issuer`.
fn certified(
    issuer: &Issuer,
    authority: &Arc<Authority>,
    name: &str,
    seed: u64,
) -> impl FnOnce(std::time::Instant) -> SessionCore {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let t = SystemTime::UNIX_EPOCH + 20_000 * DAY;
    let member = MemberId::new(name).unwrap();
    let issued = issuer.issue(&member, t - DAY, t + DAY, &mut rng).unwrap();
    let identity = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
    let authority = authority.clone();
    move |now| {
        let clock = Arc::new(Fixed(t));
        SessionCore::new_certified(member, identity, authority, clock, Box::new(rng), now)
    }
}

/// Two outsiders without certificates take turns joining and leaving, so
/// that some member of every view has presented nothing. Each such view is
/// held for exactly the certificate deadline, then runs without them: the
/// honest members get a key after every churn event, each at most the
/// deadline (1 s) plus the run after the view, however long the churn goes.
#[test]
fn outsiders_churning_cost_at_most_the_deadline_per_view() {
    let t = SystemTime::UNIX_EPOCH + 20_000 * DAY;
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let (issuer, _) = Issuer::create("conclave test authority", t - DAY, t + 365 * DAY, &mut rng).unwrap();
    let authority = Arc::new(Authority::from_pem(issuer.ca_pem(), None).unwrap());
    let mut net = Net::new(&[], 8);
    for (i, name) in ["alice", "bob"].into_iter().enumerate() {
        let m = net.add(name, certified(&issuer, &authority, name, 100 + i as u64));
        net.join(m, Policy::default());
    }
    let group = GroupName::new(GROUP).unwrap();
    let eves = [net.outsider("eve1"), net.outsider("eve2")];
    let before = net.members[0].log.len();
    net.submit(Op::Join {
        conn: eves[0],
        group: group.clone(),
        open: false,
        mode: conclave_gcs::core::GroupMode::Members,
    });
    net.settle();
    let turns = 6;
    for turn in 0..turns {
        net.advance(Duration::from_millis(1300));
        let (a, b) = (turn % 2, 1 - turn % 2);
        net.submit(Op::Join {
            conn: eves[b],
            group: group.clone(),
            open: false,
            mode: conclave_gcs::core::GroupMode::Members,
        });
        net.submit(Op::Leave { conn: eves[a], group: group.clone() });
        net.settle();
    }
    net.advance(Duration::from_millis(1300));
    let keys: Vec<Duration> = net.members[0].log[before..]
        .iter()
        .filter_map(|e| match e {
            SecureEvent::View(v) => Some(v.rekey_time),
            _ => None,
        })
        .collect();
    // One key per churn event (eve1's join, then each turn), none later
    // than the deadline and the run after it.
    assert_eq!(keys.len(), turns + 1, "{keys:?}");
    let bound = DEFAULT_CERT_TIMEOUT + Duration::from_millis(50);
    assert!(keys.iter().all(|t| *t >= DEFAULT_CERT_TIMEOUT && *t <= bound), "{keys:?}");
    for m in &net.members {
        let last = m.log.iter().rev().find_map(|e| match e {
            SecureEvent::View(v) => Some(v.members.clone()),
            _ => None,
        });
        assert_eq!(last.unwrap().iter().map(|m| m.as_str()).collect::<Vec<_>>(), ["alice", "bob"]);
    }
}

/// A compromised link delivers to alice alone, in the view that carol's
/// join makes, a certificate message under carol's name that is not hers
/// (bob's real one, re-attributed; then a tampered copy). Such a message
/// proves nothing about who sent it, so it must not refuse carol at alice
/// while bob accepts her: every member ends with carol in one group, under
/// one key, and alice reports no refusal.
#[test]
fn a_certificate_message_forged_on_one_link_refuses_nobody() {
    let (mut net, carol, view) = carol_joins(9, 200);
    let group = GroupName::new(GROUP).unwrap();
    let bobs = net.members[1].session.cert_message(GROUP, view).unwrap();
    let mut tampered = net.members[carol].session.cert_message(GROUP, view).unwrap();
    let last = tampered.len() - 1;
    tampered[last] ^= 1;
    for forged in [bobs, tampered] {
        net.members[0].inbox.push_back(conclave_gcs::core::Delivery::Message {
            group: group.clone(),
            sender: MemberId::new("carol").unwrap(),
            service: conclave_gcs::core::Service::Agreed,
            view,
            payload: forged.into(),
        });
    }
    carol_is_in_one_group_and_alice_refused_nobody(net);
}

/// A session for `name` presenting `issued` (perhaps another's), trusting
/// `authority`, at the fixed time `t`.
fn presenting(
    name: &str,
    issued: &conclave_secure::trust::Issued,
    authority: &Arc<Authority>,
    t: SystemTime,
    seed: u64,
) -> impl FnOnce(std::time::Instant) -> SessionCore {
    let identity = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
    let (member, authority) = (MemberId::new(name).unwrap(), authority.clone());
    move |now| {
        let rng = Box::new(ChaCha20Rng::seed_from_u64(seed));
        SessionCore::new_certified(member, identity, authority, Arc::new(Fixed(t)), rng, now)
    }
}

/// Four intruders join a certified group of three, in virtual time: mallory
/// (certified by another authority, which her session trusts), trudy
/// (certified, then revoked), eve (presenting alice's certificate, with her
/// stolen key) and zed (no certificate at all). Every honest member refuses
/// each with the right reason; alice, the oldest, tells each why (mallory,
/// who cannot verify alice, stands aside by herself); no intruder ever gets a
/// key or a message; the honest members agree on their key and talk. Runs
/// for every protocol.
fn intruders_are_refused(protocol: conclave_secure::ProtocolId) {
    use conclave_secure::trust::Revocation;
    use conclave_secure::Refusal;
    let t = SystemTime::UNIX_EPOCH + 20_000 * DAY;
    let mut rng = ChaCha20Rng::seed_from_u64(11);
    let (issuer, _) = Issuer::create("conclave test authority", t - DAY, t + 365 * DAY, &mut rng).unwrap();
    let (other, _) = Issuer::create("another authority", t - DAY, t + 365 * DAY, &mut rng).unwrap();
    let issue = |i: &Issuer, name: &str, rng: &mut ChaCha20Rng| {
        i.issue(&MemberId::new(name).unwrap(), t - DAY, t + DAY, rng).unwrap()
    };
    let honest = ["alice", "bob", "carol"];
    let certs: Vec<_> = honest.iter().map(|n| issue(&issuer, n, &mut rng)).collect();
    let trudy = issue(&issuer, "trudy", &mut rng);
    let serial = conclave_secure::trust::cert_info(&trudy.cert_pem).unwrap().serial_bytes;
    let revoked =
        Revocation { serial: serial.clone(), time: t - DAY / 2, reason: Some(rcgen::RevocationReason::KeyCompromise) };
    let crl = issuer.crl(2, &[revoked], t - DAY / 2, t + DAY).unwrap();
    let authority = Arc::new(Authority::from_pem(issuer.ca_pem(), Some(&crl)).unwrap());
    let policy = Policy::new(protocol, conclave_secure::GroupId::Ristretto255);
    let mut net = Net::new(&[], 11);
    for (i, (n, c)) in honest.iter().zip(&certs).enumerate() {
        let m = net.add(n, presenting(n, c, &authority, t, 300 + i as u64));
        net.join(m, policy);
        net.advance(DEFAULT_CERT_TIMEOUT);
    }
    let secured = net.members[0].log.len();
    let mallory_cert = issue(&other, "mallory", &mut rng);
    let other_authority = Arc::new(Authority::from_pem(other.ca_pem(), None).unwrap());
    let intruders = [
        net.add("mallory", presenting("mallory", &mallory_cert, &other_authority, t, 310)),
        net.add("trudy", presenting("trudy", &trudy, &authority, t, 311)),
        net.add("eve", presenting("eve", &certs[0], &authority, t, 312)),
        net.add("zed", |now| {
            let mut rng = ChaCha20Rng::seed_from_u64(313);
            let signer = conclave_gka::suite::generate_signer(conclave_gka::suite::SignatureId::Ed25519, &mut rng);
            let (zed, directory) = (MemberId::new("zed").unwrap(), Arc::new(conclave_gka::StaticDirectory::new()));
            SessionCore::new(zed, signer.unwrap(), directory, Box::new(rng), now)
        }),
    ];
    for &m in &intruders {
        net.join(m, policy);
    }
    net.advance(DEFAULT_CERT_TIMEOUT * 3);
    let serial: String = serial.iter().map(|b| format!("{b:02x}")).collect();
    let expected = [
        Refusal::UnknownIssuer,
        Refusal::Revoked { serial, reason: Some("key compromise".into()) },
        Refusal::NameMismatch { certified: "alice".into() },
        Refusal::NoCertificate,
    ];
    for (h, name) in honest.iter().enumerate() {
        for (&i, why) in intruders.iter().zip(&expected) {
            let who = &net.members[i].name;
            let refused = net.members[h]
                .log
                .iter()
                .any(|e| matches!(e, SecureEvent::Refused { member, reason, .. } if member == who && reason == why));
            assert!(refused, "{protocol}: {name} did not refuse {who} for {why}: {:?}", net.members[h].log);
        }
    }
    for (&i, why) in intruders.iter().zip(&expected) {
        let m = &net.members[i];
        let told = m
            .log
            .iter()
            .any(|e| matches!(e, SecureEvent::Excluded { by, reason, .. } if by.as_str() == "alice" && reason == why));
        assert!(told, "{protocol}: {} was not told {why} by alice: {:?}", m.name, m.log);
        let got = m.log.iter().any(|e| matches!(e, SecureEvent::View(_) | SecureEvent::Message { .. }));
        assert!(!got, "{protocol}: {} got a key or a message: {:?}", m.name, m.log);
    }
    let last: Vec<_> = (0..honest.len()).map(|h| net.last_view(h).unwrap()).collect();
    assert!(last.iter().all(|v| v.2 == 3 && v.1 == last[0].1 && v.0 == last[0].0), "{protocol}: {last:?}");
    assert!(net.members[0].log.len() > secured, "a rekey after the intruders came");
    let now = net.now();
    net.members[2].session.send(now, GROUP, b"only for the certified").unwrap();
    net.drain(2);
    net.settle();
    for (h, name) in honest.iter().enumerate() {
        let got = net.members[h]
            .log
            .iter()
            .any(|e| matches!(e, SecureEvent::Message { data, .. } if &data[..] == b"only for the certified"));
        assert!(got, "{protocol}: {name} did not get the message");
    }
    for &i in &intruders {
        let m = &net.members[i];
        assert!(!m.log.iter().any(|e| matches!(e, SecureEvent::Message { .. })), "{protocol}: {} read it", m.name);
    }
}

#[test]
fn intruders_are_refused_gdh() {
    intruders_are_refused(conclave_secure::ProtocolId::Gdh);
}

#[test]
fn intruders_are_refused_ckd() {
    intruders_are_refused(conclave_secure::ProtocolId::Ckd);
}

#[test]
fn intruders_are_refused_tgdh() {
    intruders_are_refused(conclave_secure::ProtocolId::Tgdh);
}

#[test]
fn intruders_are_refused_str() {
    intruders_are_refused(conclave_secure::ProtocolId::Str);
}

#[test]
fn intruders_are_refused_bd() {
    intruders_are_refused(conclave_secure::ProtocolId::Bd);
}

/// A compromised link delivers to alice alone, in the view that carol's
/// join makes and before carol's certificate, a timeout notice under bob's
/// name that names carol: once unsigned (as notices were), once with a
/// signature that is not bob's. Either would refuse carol at alice alone
/// while bob accepts her. Neither may change anything: every member ends
/// with carol, under one key, and alice reports no refusal.
#[test]
fn a_timeout_notice_forged_on_one_link_refuses_nobody() {
    use conclave_secure::payload::tag;
    let (mut net, _carol, view) = carol_joins(10, 400);
    // Deliver one by one until carol's certificate waits in alice's inbox
    // (alice has accepted bob by then: his went out before carol's), and put
    // the forgeries right before it.
    let carols_cert = |d: &conclave_gcs::core::Delivery| {
        matches!(d, conclave_gcs::core::Delivery::Message { sender, payload, .. }
            if sender.as_str() == "carol" && payload.first() == Some(&tag::CERT))
    };
    let at = loop {
        if let Some(at) = net.members[0].inbox.iter().position(carols_cert) {
            break at;
        }
        for i in 0..3 {
            if let Some(d) = net.members[i].inbox.pop_front() {
                let now = net.now();
                net.members[i].session.handle_delivery(now, d).unwrap();
                net.drain(i);
            }
        }
    };
    let names = [&[5u8][..], b"carol"].concat();
    let unsigned = [&[tag::TIMEOUT][..], &view.to_bytes(), &names].concat();
    let badly_signed = [&[tag::TIMEOUT][..], &view.to_bytes(), &[0, 64], &[7; 64], &names].concat();
    for forged in [badly_signed, unsigned] {
        let d = conclave_gcs::core::Delivery::Message {
            group: GroupName::new(GROUP).unwrap(),
            sender: MemberId::new("bob").unwrap(),
            service: conclave_gcs::core::Service::Agreed,
            view,
            payload: forged.into(),
        };
        net.members[0].inbox.insert(at, d);
    }
    carol_is_in_one_group_and_alice_refused_nobody(net);
}

/// Certified alice and bob in a group, and certified carol's join ordered:
/// its view waits in every inbox, unhandled. Returns the net, carol's index
/// and the view's id. `seed` drives the net and the authority, `first` the
/// members' keys.
fn carol_joins(seed: u64, first: u64) -> (Net, usize, conclave_gcs::ViewId) {
    let t = SystemTime::UNIX_EPOCH + 20_000 * DAY;
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let (issuer, _) = Issuer::create("conclave test authority", t - DAY, t + 365 * DAY, &mut rng).unwrap();
    let authority = Arc::new(Authority::from_pem(issuer.ca_pem(), None).unwrap());
    let mut net = Net::new(&[], seed);
    for (i, name) in ["alice", "bob"].into_iter().enumerate() {
        let m = net.add(name, certified(&issuer, &authority, name, first + i as u64));
        net.join(m, Policy::default());
    }
    let carol = net.add("carol", certified(&issuer, &authority, "carol", first + 2));
    let now = net.now();
    net.members[carol].session.join(now, GROUP, Policy::default()).unwrap();
    net.drain(carol);
    let view = net.members[0]
        .inbox
        .iter()
        .find_map(|d| match d {
            conclave_gcs::core::Delivery::View { view, .. } => Some(view.id),
            _ => None,
        })
        .expect("the view of carol's join is queued for alice");
    (net, carol, view)
}

/// Delivers everything and waits out the certificate deadline twice: every
/// member must end with carol in its last secure view, all under one key,
/// and alice must have refused nobody.
fn carol_is_in_one_group_and_alice_refused_nobody(mut net: Net) {
    net.settle();
    net.advance(DEFAULT_CERT_TIMEOUT * 2);
    let last: Vec<_> = (0..3).map(|i| net.last_view(i).expect("a secure view")).collect();
    assert!(last.iter().all(|v| v.2 == 3), "everyone's last secure view has carol: {last:?}");
    assert!(last.iter().all(|v| v.1 == last[0].1 && v.0 == last[0].0), "one key: {last:?}");
    assert!(
        !net.members[0].log.iter().any(|e| matches!(e, SecureEvent::Refused { .. })),
        "alice refused somebody: {:?}",
        net.members[0].log
    );
}
