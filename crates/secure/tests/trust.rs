//! Certified identities over a real standalone daemon: members certified by
//! one authority agree on keys; a member certified by another authority, a
//! revoked member, a member presenting someone else's certificate and a
//! member presenting none are refused at every honest member with the right
//! reason, are told so, never get a key, and the honest members go on. The
//! `trust` module's verification is checked directly too.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use conclave_gcs_net::{Daemon, DaemonConfig};
use conclave_gka::StaticDirectory;
use conclave_secure::trust::{Authority, Identity, Issuer, Revocation, TrustError};
use conclave_secure::{GroupId, MemberId, Policy, ProtocolId, Refusal, SecureEvent, Session};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

mod common;
use common::Member;

const DAY: Duration = Duration::from_secs(86_400);

struct Ca {
    issuer: Issuer,
    rng: ChaCha20Rng,
}

impl Ca {
    fn new(name: &str, seed: u64) -> Ca {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let now = SystemTime::now();
        let (issuer, _key) = Issuer::create(name, now - DAY, now + 365 * DAY, &mut rng).unwrap();
        Ca { issuer, rng }
    }

    /// (certificate PEM, key PEM, serial bytes) valid from `from` to `to`.
    fn issue_between(&mut self, name: &str, from: SystemTime, to: SystemTime) -> (String, String, Vec<u8>) {
        let i = self.issuer.issue(&MemberId::new(name).unwrap(), from, to, &mut self.rng).unwrap();
        let serial = conclave_secure::trust::cert_info(&i.cert_pem).unwrap().serial_bytes;
        (i.cert_pem, i.key_pem.to_string(), serial)
    }

    fn issue(&mut self, name: &str) -> (String, String, Vec<u8>) {
        let now = SystemTime::now();
        self.issue_between(name, now - DAY, now + DAY)
    }

    fn crl(&self, revoked: &[Vec<u8>]) -> String {
        let now = SystemTime::now();
        let revoked: Vec<Revocation> = revoked
            .iter()
            .map(|s| Revocation { serial: s.clone(), time: now, reason: Some(rcgen_reason_key_compromise()) })
            .collect();
        self.issuer.crl(2, &revoked, now, now + DAY).unwrap()
    }
}

fn rcgen_reason_key_compromise() -> rcgen::RevocationReason {
    rcgen::RevocationReason::KeyCompromise
}

async fn daemon() -> (Daemon, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = DaemonConfig { unix: Some(dir.path().join("conclave.sock")), tcp: None, ..DaemonConfig::default() };
    (Daemon::start(config).await.unwrap(), dir)
}

async fn certified(
    d: &Daemon,
    name: &str,
    (cert, key): (&str, &str),
    authority: &Arc<Authority>,
    timeout: Duration,
) -> Member {
    let client = conclave_gcs_net::Client::connect_unix(d.unix_path().unwrap(), name).await.unwrap();
    let identity = Identity::from_pem(cert, key).unwrap();
    let mut s = Session::connect_certified(client, MemberId::new(name).unwrap(), identity, authority.clone());
    s.set_certificate_timeout(timeout);
    Member::spawn(name, s)
}

async fn three_members_agree(protocol: ProtocolId) {
    let (d, _dir) = daemon().await;
    let mut ca = Ca::new("conclave test authority", 1);
    let authority = Arc::new(Authority::from_pem(ca.issuer.ca_pem(), Some(&ca.crl(&[]))).unwrap());
    let policy = Policy::new(protocol, GroupId::Ristretto255);
    let mut ms = Vec::new();
    for n in ["alice", "bob", "carol"] {
        let (c, k, _) = ca.issue(n);
        let m = certified(&d, n, (&c, &k), &authority, Duration::from_secs(10)).await;
        m.join(policy);
        ms.push(m);
        let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
        for m in &ms {
            m.until_view(&names).await;
        }
    }
    let mut fps = Vec::new();
    for m in &ms {
        fps.push(m.until_view(&["alice", "bob", "carol"]).await);
    }
    assert!(fps.iter().all(|f| f == &fps[0]), "members disagree on the key: {fps:?}");
    ms[1].send("certified hello");
    for m in &ms {
        m.until_msg("certified hello").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_certified_members_agree() {
    for protocol in ProtocolId::ALL {
        three_members_agree(protocol).await;
    }
}

/// Four would-be members join a certified group of three at once; each is
/// refused for its own reason, is told so, and never gets a key.
async fn intruders_are_refused(protocol: ProtocolId) {
    let (d, _dir) = daemon().await;
    let mut ca = Ca::new("conclave test authority", 2);
    let mut other_ca = Ca::new("another authority", 3);
    let honest = ["alice", "bob", "carol"];
    let mut certs = Vec::new();
    for n in honest {
        certs.push(ca.issue(n));
    }
    let trudy = ca.issue("trudy");
    let authority =
        Arc::new(Authority::from_pem(ca.issuer.ca_pem(), Some(&ca.crl(std::slice::from_ref(&trudy.2)))).unwrap());
    let policy = Policy::new(protocol, GroupId::Ristretto255);
    let mut ms = Vec::new();
    for (n, (c, k, _)) in honest.iter().zip(&certs) {
        // Long enough for a loaded machine; zed, with no certificate, is refused after it.
        let m = certified(&d, n, (c, k), &authority, Duration::from_secs(3)).await;
        m.join(policy);
        ms.push(m);
        let names: Vec<&str> = ms.iter().map(|m| m.name.as_str()).collect();
        ms[0].until_view(&names).await;
    }
    let (before, _) = ms[0].until_view(&honest).await;

    // mallory: certified by another authority (which her session trusts).
    let (mc, mk, _) = other_ca.issue("mallory");
    let other_authority = Arc::new(Authority::from_pem(other_ca.issuer.ca_pem(), None).unwrap());
    let mallory = certified(&d, "mallory", (&mc, &mk), &other_authority, Duration::from_secs(1)).await;
    // trudy: certified, then revoked.
    let trudy_m = certified(&d, "trudy", (&trudy.0, &trudy.1), &authority, Duration::from_secs(1)).await;
    // eve: presents alice's certificate (with alice's key, stolen).
    let eve = certified(&d, "eve", (&certs[0].0, &certs[0].1), &authority, Duration::from_secs(1)).await;
    // zed: no certificate at all (a plain session trusting nobody).
    let zed_client = conclave_gcs_net::Client::connect_unix(d.unix_path().unwrap(), "zed").await.unwrap();
    let zed_signer = conclave_gka::suite::generate_signer(
        conclave_gka::suite::SignatureId::Ed25519,
        &mut ChaCha20Rng::seed_from_u64(4),
    )
    .unwrap();
    let zed = Member::spawn(
        "zed",
        Session::connect(zed_client, MemberId::new("zed").unwrap(), zed_signer, Arc::new(StaticDirectory::new())),
    );
    let intruders = [&mallory, &trudy_m, &eve, &zed];
    for m in intruders {
        m.join(policy);
    }
    let trudy_serial: String = trudy.2.iter().map(|b| format!("{b:02x}")).collect();
    let expected = [
        ("mallory", Refusal::UnknownIssuer),
        ("trudy", Refusal::Revoked { serial: trudy_serial, reason: Some("key compromise".into()) }),
        ("eve", Refusal::NameMismatch { certified: "alice".into() }),
        ("zed", Refusal::NoCertificate),
    ];
    for m in &ms {
        for (who, why) in &expected {
            m.until(&format!("refusal of {who}"), |log| {
                log.iter()
                    .any(|e| {
                        matches!(e, SecureEvent::Refused { member, reason, .. }
                            if member.as_str() == *who && reason == why)
                    })
                    .then_some(())
            })
            .await;
        }
    }
    // Every intruder is told by alice (the oldest member that accepts it);
    // mallory, whose authority does not know alice's issuer, stands aside.
    for (m, (_, why)) in intruders.iter().zip(&expected) {
        m.until("exclusion", |log| {
            log.iter()
                .any(|e| matches!(e, SecureEvent::Excluded { by, reason, .. } if by.as_str() == "alice" && reason == why))
                .then_some(())
        })
        .await;
    }
    // The honest members rekey among themselves (once or more: the refusals
    // need not all come in one view) and agree on the key of each epoch.
    let mut last = before;
    for m in &ms {
        last = last.max(m.until_view_after(&honest, before).await.0);
    }
    let mut fps = Vec::new();
    for m in &ms {
        fps.push(m.until_view_from(&honest, last).await);
    }
    assert!(fps.iter().all(|f| f == &fps[0]), "honest members disagree: {fps:?}");
    ms[2].send("only for the certified");
    for m in &ms {
        m.until_msg("only for the certified").await;
    }
    // Let any late key agreement finish, then check nobody let an intruder in.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for m in intruders {
        assert!(
            m.events().iter().all(|e| !matches!(e, SecureEvent::View(_) | SecureEvent::Message { .. })),
            "{} got a key or a message: {:#?}",
            m.name,
            m.events()
        );
    }
    for m in &ms {
        for e in m.events() {
            if let SecureEvent::View(v) = e {
                assert!(v.members.iter().all(|x| honest.contains(&x.as_str())), "{}: view with an intruder", m.name);
            }
        }
    }
}

// Once, through the tokio shell on a real daemon (it waits out zed's
// certificate timeout on the wall clock); every protocol runs the same
// scenario in virtual time in `tests/admission.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn intruders_are_refused_over_a_real_daemon() {
    intruders_are_refused(ProtocolId::Tgdh).await;
}

fn der(pem: &str) -> Vec<u8> {
    x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap().1.contents
}

#[test]
fn verification_refuses_what_it_must() {
    let now = SystemTime::now();
    let mut ca = Ca::new("conclave test authority", 5);
    let mut other = Ca::new("another authority", 6);
    let alice = MemberId::new("alice").unwrap();
    let authority = Authority::from_pem(ca.issuer.ca_pem(), Some(&ca.crl(&[]))).unwrap();

    let (good, good_key, _) = ca.issue("alice");
    let ok = authority.verify(&der(&good), &alice, now).unwrap();
    assert_eq!(ok.name, "alice");
    let id = Identity::from_pem(&good, &good_key).unwrap();
    assert_eq!(ok.verifier.public_bytes(), id.signer().verifier().public_bytes());

    let (expired, _, _) = ca.issue_between("alice", now - 3 * DAY, now - DAY);
    assert_eq!(authority.verify(&der(&expired), &alice, now).unwrap_err(), Refusal::Expired);
    let (early, _, _) = ca.issue_between("alice", now + DAY, now + 3 * DAY);
    assert_eq!(authority.verify(&der(&early), &alice, now).unwrap_err(), Refusal::NotYetValid);
    let (foreign, foreign_key, _) = other.issue("alice");
    assert_eq!(authority.verify(&der(&foreign), &alice, now).unwrap_err(), Refusal::UnknownIssuer);
    assert_eq!(
        authority.verify(&der(&good), &MemberId::new("bob").unwrap(), now).unwrap_err(),
        Refusal::NameMismatch { certified: "alice".into() }
    );
    assert!(matches!(authority.verify(b"\x30\x03\x02\x01\x00", &alice, now), Err(Refusal::Malformed(_))));

    // Revocation takes effect with the CRL that lists the serial.
    let (revoked, _, serial) = ca.issue("alice");
    assert!(authority.verify(&der(&revoked), &alice, now).is_ok());
    let with_crl = Authority::from_pem(ca.issuer.ca_pem(), Some(&ca.crl(std::slice::from_ref(&serial)))).unwrap();
    let hex: String = serial.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        with_crl.verify(&der(&revoked), &alice, now).unwrap_err(),
        Refusal::Revoked { serial: hex, reason: Some("key compromise".into()) }
    );
    assert!(with_crl.verify(&der(&good), &alice, now).is_ok(), "only the listed serial is revoked");

    // A CRL signed by another authority, a member certificate as the
    // authority, and a key that does not match its certificate are errors.
    assert!(matches!(
        Authority::from_pem(ca.issuer.ca_pem(), Some(&other.crl(&[]))),
        Err(TrustError::CrlNotFromAuthority)
    ));
    assert!(matches!(Authority::from_pem(&good, None), Err(TrustError::NotAnAuthority)));
    assert!(matches!(Identity::from_pem(&good, &foreign_key), Err(TrustError::KeyMismatch)));
    assert!(matches!(Authority::from_pem("not pem", None), Err(TrustError::Pem(_))));
}

/// A certified insider pipelines, right behind its own join, its certificate
/// and a "no certificate in time" notice naming the honest members, so that
/// the notice can be ordered before their certificates. The refusals it
/// causes are provisional: each honest certificate, arriving later, readmits
/// its member with a rekey, and all three end in one secure view with one
/// key. (On a real daemon the honest certificates can still win the race;
/// the attack is repeated until it has taken effect, at most 10 times.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_timeout_notice_refuses_nobody_for_good() {
    let (d, _dir) = daemon().await;
    let mut ca = Ca::new("conclave test authority", 7);
    let authority = Arc::new(Authority::from_pem(ca.issuer.ca_pem(), Some(&ca.crl(&[]))).unwrap());
    let policy = Policy::default();
    let names = ["alice", "bob", "mallory"];
    // One at a time, so that the view lists them in this order.
    let mut ms: Vec<Member> = Vec::new();
    for n in names {
        let (c, k, _) = ca.issue(n);
        let m = certified(&d, n, (&c, &k), &authority, Duration::from_secs(10)).await;
        m.join(policy);
        ms.push(m);
        common::all_see_each_other(&ms).await;
    }
    let mallory = &ms[2];
    let mut took_effect = false;
    for attempt in 0..10 {
        let (epoch, _) = mallory.until_view(&names).await;
        let lefts = mallory.events().iter().filter(|e| matches!(e, SecureEvent::Left { .. })).count();
        mallory.leave();
        mallory
            .until("left", |log| {
                (log.iter().filter(|e| matches!(e, SecureEvent::Left { .. })).count() > lefts).then_some(())
            })
            .await;
        for m in &ms[..2] {
            m.until_view_after(&["alice", "bob"], epoch).await;
        }
        let seen = ms[0].events().len();
        // The leave was view seq + 1; the rejoin will be seq + 2.
        let rejoin = conclave_secure::ViewId::new(epoch.view.incarnation, epoch.view.seq + 2);
        mallory
            .ask(move |s| {
                s.join(common::GROUP, policy).unwrap();
                let cert = s.cert_message(common::GROUP, rejoin).unwrap();
                s.send_raw(common::GROUP, &cert).unwrap();
                let honest = [MemberId::new("alice").unwrap(), MemberId::new("bob").unwrap()];
                let notice = s.timeout_message(common::GROUP, rejoin, &honest).unwrap();
                s.send_raw(common::GROUP, &notice).unwrap();
            })
            .await;
        // Everyone ends in the rejoin view with one key, whatever the race.
        let mut fps = Vec::new();
        for m in &ms {
            let (e, fp) = m.until_view_after(&names, epoch).await;
            assert_eq!(e.view, rejoin, "{}: attempt {attempt}", m.name);
            fps.push(fp);
        }
        assert!(fps.iter().all(|f| f == &fps[0]), "members disagree on the key: {fps:?}");
        let refused_bob = ms[0].events()[seen..].iter().any(|e| {
            matches!(e, SecureEvent::Refused { member, reason: Refusal::NoCertificate, .. } if member.as_str() == "bob")
        });
        if refused_bob {
            took_effect = true;
            break;
        }
    }
    assert!(took_effect, "the pipelined notice never came before the honest certificates");
    ms[0].send("nobody refused for good");
    for m in &ms {
        m.until_msg("nobody refused for good").await;
    }
}
