//! Secure sessions against a real standalone daemon on a temporary Unix
//! socket, for each of the five protocols over ristretto255 with Ed25519
//! identities: members join one by one while sending (sends during a rekey
//! arrive under the new key), one leaves, and the group goes on. Checked:
//! every member decrypts everything sent in its views and nothing else, the
//! application never sees a message before its view's key, all members agree
//! on each key, a departed member's keys and a newcomer's keys open nothing
//! outside their epochs, and altered, wrong-epoch, replayed and misattributed
//! messages are rejected while the session continues. A last test checks that
//! a joiner with another policy is told so and the group goes on without it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use conclave_gcs_net::{Daemon, DaemonConfig};
use conclave_gka::suite::{generate_signer, SignatureId, Signer};
use conclave_gka::StaticDirectory;
use conclave_secure::{
    DataError, DataHeader, Epoch, EpochKeys, GroupId, MemberId, Policy, ProtocolId, RejectReason, SecureEvent, Session,
    ViewId,
};
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

mod common;
use common::{Member, GROUP};

/// What only these tests ask of a member (through the test hooks).
impl Member {
    async fn start(path: &std::path::Path, name: &str, signer: Arc<dyn Signer>, dir: Arc<StaticDirectory>) -> Self {
        Member::spawn(name, Session::connect_unix(path, name, signer, dir).await.unwrap())
    }
    /// Leaves, then joins at once, and answers what the join said.
    async fn leave_then_join(&self, policy: Policy) -> Result<(), String> {
        self.ask(move |s| {
            s.leave(GROUP).unwrap();
            s.join(GROUP, policy).map_err(|e| e.to_string())
        })
        .await
    }
    fn raw(&self, bytes: Vec<u8>) {
        self.run(move |s| s.send_raw_data(GROUP, &bytes).unwrap());
    }
    async fn keys(&self) -> EpochKeys {
        self.ask(|s| s.epoch_keys(GROUP)).await.expect("the member has a key")
    }
    async fn captured(&self) -> Vec<(MemberId, Bytes)> {
        self.ask(|s| s.captured(GROUP)).await
    }

    /// Waits for a secure view with exactly these members; returns its epoch.
    async fn until_view_of(&self, members: &[&Member]) -> Epoch {
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        self.until_view(&names).await.0
    }

    async fn until_rejected(&self, sender: &str, reason: RejectReason) {
        self.until(&format!("rejection {reason:?} of {sender}"), |log| {
            log.iter()
                .any(|e| {
                    matches!(e, SecureEvent::Rejected { sender: s, reason: r, .. } if s.as_str() == sender && *r == reason)
                })
                .then_some(())
        })
        .await
    }
}

struct World {
    daemon: Daemon,
    _dir: tempfile::TempDir,
    signers: BTreeMap<String, Arc<dyn Signer>>,
    directory: Arc<StaticDirectory>,
}

async fn world(names: &[&str], seed: u64) -> World {
    let dir = tempfile::tempdir().unwrap();
    let config = DaemonConfig { unix: Some(dir.path().join("conclave.sock")), tcp: None, ..DaemonConfig::default() };
    let daemon = Daemon::start(config).await.unwrap();
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut directory = StaticDirectory::new();
    let mut signers = BTreeMap::new();
    for n in names {
        let s = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
        directory.insert(MemberId::new(*n).unwrap(), s.verifier());
        signers.insert(n.to_string(), s);
    }
    World { daemon, _dir: dir, signers, directory: Arc::new(directory) }
}

impl World {
    async fn member(&self, name: &str) -> Member {
        let path = self.daemon.unix_path().unwrap();
        Member::start(path, name, self.signers[name].clone(), self.directory.clone()).await
    }
}

/// Waits until every text is delivered to its sender and then to every
/// member of the view it was delivered in (and to nobody else among `all`).
async fn settle(all: &[&Member], sent: &[(&Member, String)]) {
    for (from, text) in sent {
        let epoch = from.until_msg(text).await;
        let members = from.views()[&epoch].clone();
        for m in all {
            if members.contains(&m.id()) {
                assert_eq!(m.until_msg(text).await, epoch, "{} got {text:?} in another epoch", m.name);
            }
        }
    }
}

/// What every member's log must satisfy at the end.
fn check_logs(all: &[&Member]) {
    let mut fingerprints: BTreeMap<Epoch, BTreeSet<String>> = BTreeMap::new();
    let mut receivers: BTreeMap<Vec<u8>, BTreeSet<String>> = BTreeMap::new();
    let mut epoch_of: BTreeMap<Vec<u8>, Epoch> = BTreeMap::new();
    let mut views: BTreeMap<Epoch, Vec<MemberId>> = BTreeMap::new();
    for m in all {
        let mut current = None;
        let mut seen = BTreeSet::new();
        for e in m.events() {
            match e {
                SecureEvent::View(v) => {
                    assert!(v.members.contains(&m.id()));
                    if let Some(c) = current {
                        assert!(v.epoch > c, "{}: epochs go forward", m.name);
                    }
                    current = Some(v.epoch);
                    fingerprints.entry(v.epoch).or_default().insert(v.fingerprint.clone());
                    let prev = views.insert(v.epoch, v.members.to_vec());
                    if let Some(p) = prev {
                        assert_eq!(v.members, p, "members of epoch {} differ", v.epoch);
                    }
                }
                SecureEvent::Message { epoch, data, .. } => {
                    assert_eq!(Some(epoch), current, "{}: message outside its secure view", m.name);
                    let data = data.to_vec();
                    assert!(seen.insert(data.clone()), "{}: {:?} delivered twice", m.name, data);
                    receivers.entry(data.clone()).or_default().insert(m.name.clone());
                    assert_eq!(*epoch_of.entry(data).or_insert(epoch), epoch);
                }
                SecureEvent::Left { .. } => current = None,
                SecureEvent::Rejected { .. } => {}
                other => panic!("{}: unexpected event {other:?}", m.name),
            }
        }
    }
    for (epoch, fps) in &fingerprints {
        assert_eq!(fps.len(), 1, "members disagree on the key of epoch {epoch}");
    }
    for (data, got) in &receivers {
        let want: BTreeSet<String> = views[&epoch_of[data]].iter().map(|m| m.as_str().to_owned()).collect();
        assert_eq!(got, &want, "receivers of {:?}", String::from_utf8_lossy(data));
    }
}

/// Raw messages a member captured from `sender` in `epoch`.
fn raw_of(captured: &[(MemberId, Bytes)], sender: &str, epoch: Epoch) -> Vec<Bytes> {
    captured
        .iter()
        .filter(|(s, raw)| s.as_str() == sender && DataHeader::decode(raw).unwrap().0.epoch == epoch)
        .map(|(_, raw)| raw.clone())
        .collect()
}

async fn scenario(protocol: ProtocolId) {
    let names = ["alice", "bob", "carol", "dave"];
    let w = world(&names, protocol.code() as u64).await;
    let policy = Policy::new(protocol, GroupId::Ristretto255);
    let (a, b, c, d) =
        (w.member("alice").await, w.member("bob").await, w.member("carol").await, w.member("dave").await);
    let (a, b, c, d) = (&a, &b, &c, &d);
    let all = [a, b, c, d];
    let mut sent: Vec<(&Member, String)> = Vec::new();
    macro_rules! say {
        ($m:expr, $text:expr) => {{
            let text: String = $text;
            $m.send(&text);
            sent.push(($m, text));
        }};
    }

    a.join(policy);
    let e1 = a.until_view_of(&[a]).await;
    say!(a, "alice 1".into());
    assert_eq!(a.until_msg("alice 1").await, e1);

    // Each join: the newcomer sends at once (it has no key: the message must
    // wait for the new secure view), and so do the others (during the rekey).
    b.join(policy);
    say!(b, "bob 1 (at join)".into());
    say!(a, "alice 2 (at bob's join)".into());
    let e2 = a.until_view_of(&[a, b]).await;
    assert_eq!(b.until_view_of(&[a, b]).await, e2);
    settle(&all, &sent).await;
    assert_eq!(a.until_msg("bob 1 (at join)").await, e2, "the newcomer's early send goes out under the new key");

    c.join(policy);
    say!(c, "carol 1 (at join)".into());
    say!(a, "alice 3 (at carol's join)".into());
    say!(b, "bob 2 (at carol's join)".into());
    let e3 = c.until_view_of(&[a, b, c]).await;
    settle(&all, &sent).await;
    assert_eq!(b.until_msg("carol 1 (at join)").await, e3);

    d.join(policy);
    say!(d, "dave 1 (at join)".into());
    say!(a, "alice 4 (at dave's join)".into());
    say!(b, "bob 3 (at dave's join)".into());
    say!(c, "carol 2 (at dave's join)".into());
    let e4 = d.until_view_of(&[a, b, c, d]).await;
    for m in all {
        assert_eq!(m.until_view_of(&[a, b, c, d]).await, e4);
    }
    settle(&all, &sent).await;
    assert_eq!(c.until_msg("dave 1 (at join)").await, e4);
    for m in all {
        say!(m, format!("{} in the full group", m.name));
    }
    settle(&all, &sent).await;

    // Keys that carol keeps when she leaves, and dave's first keys.
    let carol_keys = c.keys().await;
    let dave_keys = d.keys().await;
    assert_eq!(carol_keys.epoch(), e4);
    c.leave();
    c.until("Left", |log| log.iter().any(|e| matches!(e, SecureEvent::Left { .. })).then_some(())).await;
    let e5 = a.until_view_of(&[a, b, d]).await;
    for m in [b, d] {
        assert_eq!(m.until_view_of(&[a, b, d]).await, e5);
    }
    for m in [a, b, d] {
        say!(m, format!("{} after carol left", m.name));
    }
    settle(&all, &sent).await;
    assert!(c
        .events()
        .iter()
        .all(|e| !matches!(e, SecureEvent::Message { data, .. } if data.ends_with(b"after carol left"))));

    // Carol's saved keys do not open what was sent after she left; the
    // current keys do (so the check can fail).
    let captured = a.captured().await;
    let after = raw_of(&captured, "bob", e5);
    assert!(!after.is_empty());
    let alice_keys = a.keys().await;
    for raw in &after {
        assert_eq!(
            carol_keys.open(raw, None).map(|_| ()),
            Err(DataError::AuthFailed),
            "departed member read a message"
        );
        assert!(alice_keys.open(raw, None).is_ok());
    }
    // Dave's first keys do not open what was sent before he joined.
    // (Which epoch a message sent during a rekey lands in depends on timing;
    // the newcomers' first messages are certain.)
    for (sender, epoch) in [("alice", e1), ("bob", e2), ("carol", e3)] {
        assert!(!raw_of(&captured, sender, epoch).is_empty(), "{sender} sent in epoch {epoch}");
    }
    let before: Vec<&Bytes> =
        captured.iter().map(|(_, raw)| raw).filter(|raw| DataHeader::decode(raw).unwrap().0.epoch < e4).collect();
    assert!(before.len() >= 6);
    for raw in before {
        assert_eq!(dave_keys.open(raw, None).map(|_| ()), Err(DataError::AuthFailed), "newcomer read an old message");
    }

    // Attacks by members of the current view; the session goes on.
    let genuine = after[0].to_vec();
    let (header, _, ct) = DataHeader::decode(&genuine).unwrap();
    let reencode = |h: &DataHeader| {
        let mut v = Vec::new();
        h.encode(&mut v);
        v.extend_from_slice(ct);
        v
    };
    b.raw(genuine.clone()); // replay
    a.until_rejected("bob", RejectReason::Replay(header.seq)).await;
    // header ‖ ciphertext ‖ AEAD tag ‖ signature ‖ u16 signature length
    let n = genuine.len();
    let sig_at = n - 2 - u16::from_be_bytes([genuine[n - 2], genuine[n - 1]]) as usize;
    let mut tampered = genuine.clone();
    tampered[sig_at - 1] ^= 0x80; // the AEAD tag's last byte
    b.raw(tampered);
    d.until_rejected("bob", RejectReason::AuthFailed).await;
    let mut tampered = genuine.clone();
    tampered[sig_at - 17] ^= 1; // last ciphertext byte before the tag
    b.raw(tampered);
    a.until_rejected("bob", RejectReason::AuthFailed).await;
    let unknown = Epoch::new(ViewId::new(header.epoch.view.incarnation, 999_999), 0);
    b.raw(reencode(&DataHeader { epoch: unknown, ..header.clone() }));
    a.until_rejected("bob", RejectReason::UnknownEpoch(unknown)).await;
    let mut bad_signature = genuine.clone();
    bad_signature[sig_at] ^= 1; // the signature's first byte: the AEAD still holds
    b.raw(bad_signature);
    a.until_rejected("bob", RejectReason::BadSignature).await;
    d.raw(genuine.clone()); // dave passes off bob's message as his own
    a.until_rejected("dave", RejectReason::UnknownSender).await;
    b.raw(reencode(&DataHeader { sender: MemberId::new("carol").unwrap(), ..header.clone() }));
    d.until_rejected("bob", RejectReason::UnknownSender).await;
    b.raw(b"\x05not a header".to_vec());
    a.until_rejected("bob", RejectReason::Malformed).await;

    // A current member's message of an earlier epoch is dropped without a
    // word (it looks like one sent just before a view change); check_logs
    // below makes sure it is not delivered again.
    b.raw(raw_of(&captured, "bob", e2)[0].to_vec());

    say!(b, "bob after the attacks".into());
    say!(d, "dave after the attacks".into());
    settle(&all, &sent).await;
    check_logs(&all);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gdh_group_lifecycle() {
    scenario(ProtocolId::Gdh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ckd_group_lifecycle() {
    scenario(ProtocolId::Ckd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tgdh_group_lifecycle() {
    scenario(ProtocolId::Tgdh).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn str_group_lifecycle() {
    scenario(ProtocolId::Str).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bd_group_lifecycle() {
    scenario(ProtocolId::Bd).await;
}

/// The first member fixes the policy: a joiner with another protocol is told
/// so and taken out; the group rekeys without it and takes the next joiner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joiner_with_another_policy_is_told_and_removed() {
    let w = world(&["alice", "bob", "carol"], 99).await;
    let tgdh = Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255);
    let gdh = Policy::new(ProtocolId::Gdh, GroupId::Ristretto255);
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    a.join(tgdh);
    let first = a.until_view_of(&[&a]).await;
    b.join(gdh);
    let (ours, theirs) = b
        .until("PolicyMismatch", |log| {
            log.iter().find_map(|e| match e {
                SecureEvent::PolicyMismatch { ours, theirs, from, .. } if from.as_str() == "alice" => {
                    Some((*ours, *theirs))
                }
                _ => None,
            })
        })
        .await;
    assert_eq!((ours, theirs), (gdh, Some(tgdh)));
    b.until("Left", |log| log.iter().any(|e| matches!(e, SecureEvent::Left { .. })).then_some(())).await;
    c.join(tgdh);
    let e = c.until_view_of(&[&a, &c]).await;
    assert_eq!(a.until_view_of(&[&a, &c]).await, e);
    c.send("hello");
    assert_eq!(a.until_msg("hello").await, e);
    assert!(b.events().iter().all(|e| !matches!(e, SecureEvent::View(_))), "bob never got a secure view");
    assert!(
        a.views().iter().all(|(ep, m)| *ep == first || m.iter().all(|m| m.as_str() != "bob")),
        "alice never showed a view with bob"
    );
}

/// A member that leaves cannot join again until its leave is confirmed; the
/// refusal says so, and after `Left` the join goes through with a fresh key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejoining_waits_for_the_leave_to_finish() {
    let w = world(&["alice", "bob"], 7).await;
    let policy = Policy::new(ProtocolId::Tgdh, GroupId::Ristretto255);
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    a.join(policy);
    a.until_view_of(&[&a]).await;
    b.join(policy);
    let both = b.until_view_of(&[&a, &b]).await;
    let e = b.leave_then_join(policy).await.unwrap_err();
    assert!(e.contains("still leaving group room"), "{e}");
    b.until("Left", |log| log.iter().any(|e| matches!(e, SecureEvent::Left { .. })).then_some(())).await;
    b.join(policy);
    let after = |log: &[SecureEvent]| {
        log.iter().find_map(|e| match e {
            SecureEvent::View(v) if v.epoch > both && v.members.len() == 2 => Some(v.fingerprint.clone()),
            _ => None,
        })
    };
    let (fa, fb) =
        (a.until("the view after the rejoin", after).await, b.until("the view after the rejoin", after).await);
    assert_eq!(fa, fb, "alice and bob agree on the key after the rejoin");
}

/// Cascaded membership events: three members join at once while everybody
/// sends, then one leaves while another joins. Views that are superseded
/// before their key is agreed are never shown; no message is lost or shown
/// outside its secure view; everybody agrees on every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cascaded_views_never_show_a_view_without_its_key() {
    for protocol in ProtocolId::ALL {
        let names = ["alice", "bob", "carol", "dave", "erin"];
        let w = world(&names, 7 + protocol.code() as u64).await;
        let policy = Policy::new(protocol, GroupId::Ristretto255);
        let mut ms = Vec::new();
        for n in names {
            ms.push(w.member(n).await);
        }
        let [a, b, c, d, e] = [&ms[0], &ms[1], &ms[2], &ms[3], &ms[4]];
        let mut sent: Vec<(&Member, String)> = Vec::new();
        a.join(policy);
        a.until_view_of(&[a]).await;
        for m in [b, c, d] {
            m.join(policy);
        }
        for m in [a, b, c, d] {
            let text = format!("{} during the cascade", m.name);
            m.send(&text);
            sent.push((m, text));
        }
        let n_members = |n: usize| {
            move |log: &[SecureEvent]| {
                log.iter().rev().find_map(|e| match e {
                    SecureEvent::View(v) if v.members.len() == n => Some(v.epoch),
                    _ => None,
                })
            }
        };
        let full = a.until("a view of 4", n_members(4)).await;
        for m in [b, c, d] {
            assert_eq!(m.until("a view of 4", n_members(4)).await, full);
        }
        settle(&[a, b, c, d, e], &sent).await;
        b.leave();
        e.join(policy);
        for m in [a, c, d, e] {
            let text = format!("{} during leave and join", m.name);
            m.send(&text);
            sent.push((m, text));
        }
        // Members are listed in the order the daemon took the joins in.
        let want: BTreeSet<MemberId> = [a, c, d, e].iter().map(|m| m.id()).collect();
        let last = e
            .until("the final view", |log| {
                log.iter().rev().find_map(|ev| match ev {
                    SecureEvent::View(v) if v.members.iter().cloned().collect::<BTreeSet<_>>() == want => Some(v.epoch),
                    _ => None,
                })
            })
            .await;
        settle(&[a, b, c, d, e], &sent).await;
        for m in [a, c, d] {
            m.until("the final view", |log| {
                log.iter().any(|e| matches!(e, SecureEvent::View(v) if v.epoch == last)).then_some(())
            })
            .await;
        }
        check_logs(&[a, b, c, d, e]);
    }
}

/// An insider sends a tampered but validly signed BD round-2 value (another
/// valid element in place of its X): the honest members compute different
/// keys. Key confirmation catches it: every honest member reports the run
/// and who did not confirm its key, no key of that run reaches any
/// application, and the view is rekeyed to one key that everyone confirms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_split_by_a_tampered_bd_value_is_caught_and_healed() {
    let names = ["alice", "bob", "carol", "dave", "mallory"];
    let w = world(&names, 41).await;
    let policy = Policy::new(ProtocolId::Bd, GroupId::Ristretto255);
    // One at a time, so that the view lists them in this order.
    let mut ms: Vec<Member> = Vec::new();
    for n in &names[..4] {
        let m = w.member(n).await;
        m.join(policy);
        ms.push(m);
        common::all_see_each_other(&ms).await;
    }
    let mallory = w.member("mallory").await;
    mallory
        .ask(move |s| {
            s.join(GROUP, policy).unwrap();
            // Once: replace the round-2 value X by the round-1 value Z (a
            // valid element, so nothing but the keys tells it apart).
            let (mut z, mut done) = (Vec::new(), false);
            s.tamper_key_agreement(GROUP, move |round, body| match round {
                1 => {
                    z = body.clone();
                    false
                }
                2 if !done && body.len() == 1 + z.len() => {
                    body.truncate(1);
                    body.extend_from_slice(&z);
                    done = true;
                    true
                }
                _ => false,
            })
            .unwrap();
        })
        .await;
    let all: Vec<&str> = names.to_vec();
    let mut fingerprints = BTreeSet::new();
    for m in &ms {
        let (epoch, unconfirmed) = m
            .until("a key mismatch", |log| {
                log.iter().find_map(|e| match e {
                    SecureEvent::KeyMismatch { epoch, unconfirmed, .. } => Some((*epoch, unconfirmed.clone())),
                    _ => None,
                })
            })
            .await;
        assert_eq!(epoch.run, 0, "{}: the view's own run failed", m.name);
        assert!(!unconfirmed.is_empty() && !unconfirmed.contains(&m.id()), "{}: {unconfirmed:?}", m.name);
        let (healed, fp) = m.until_view(&all).await;
        assert_eq!((healed.view, healed.run), (epoch.view, 1), "{}: rekeyed in the same view", m.name);
        fingerprints.insert(fp);
        let leaked = m.events().into_iter().any(|e| matches!(e, SecureEvent::View(v) if v.epoch == epoch));
        assert!(!leaked, "{}: an unconfirmed key reached the application", m.name);
    }
    assert_eq!(fingerprints.len(), 1, "the healed key differs: {fingerprints:?}");
    ms[0].send("after the split");
    for m in ms.iter().chain([&mallory]) {
        m.until_msg("after the split").await;
    }
}

/// A policy notice talks a newcomer out of a group only if the member that
/// sends it signed it and is known: an outsider's notice — the old unsigned
/// three bytes, or one signed with a key nobody trusts — is ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_policy_notices_do_not_evict_a_newcomer() {
    let w = world(&["alice", "bob"], 43).await;
    let path = w.daemon.unix_path().unwrap().to_path_buf();
    let policy = Policy::default();
    let alice = w.member("alice").await;
    alice.join(policy);
    alice.until_view(&["alice"]).await;
    // An outsider in the group, older than the newcomer.
    let (tx, mut rx) = conclave_gcs_net::Client::connect_unix(&path, "mallory").await.unwrap().split();
    tx.join(GROUP).await.unwrap();
    let bob = w.member("bob").await;
    bob.join(policy);
    // Wait until mallory sees bob in the view, then send both notices.
    let view = loop {
        if let conclave_gcs_net::Event::View { view, .. } = rx.recv().await.unwrap() {
            if view.members.len() == 3 {
                break view.id;
            }
        }
    };
    let other = Policy::new(ProtocolId::Gdh, GroupId::Modp1024);
    let codes = [other.protocol.code(), other.group_id.code()];
    let unsigned = Bytes::copy_from_slice(&[3, codes[0], codes[1]]);
    tx.unicast(GROUP, "bob", unsigned).await.unwrap();
    let stranger = generate_signer(SignatureId::Ed25519, &mut ChaCha20Rng::seed_from_u64(99)).unwrap();
    let mut signed = vec![3];
    signed.extend_from_slice(&view.to_bytes());
    signed.extend_from_slice(&codes);
    signed.extend_from_slice(&stranger.sign(b"whatever it signs, nobody knows its key"));
    tx.unicast(GROUP, "bob", Bytes::from(signed)).await.unwrap();
    // Bob stays: mallory leaves, and alice and bob key the group together.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    tx.leave(GROUP).await.unwrap();
    bob.until_view(&["alice", "bob"]).await;
    let evicted =
        bob.events().into_iter().any(|e| matches!(e, SecureEvent::PolicyMismatch { .. } | SecureEvent::Left { .. }));
    assert!(!evicted, "bob was talked out of the group: {:#?}", bob.events());
}

/// SEAL's interval rekeying over a real daemon: the session shell's timer
/// gives the leader its ticks. Carol's join and bob's leave wait for the next
/// rekey, which keys alice and carol alike; carol reads what alice sends then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_rekeying_runs_on_the_leaders_timer() {
    let w = world(&["alice", "bob", "carol"], 12).await;
    let policy =
        Policy::interval(conclave_secure::IntervalAlgorithm::QueueBatch, std::time::Duration::from_millis(300));
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    a.join(policy);
    a.until_view_of(&[&a]).await;
    b.join(policy);
    let (ab, fp_ab) = b.until_view(&["alice", "bob"]).await;
    assert_eq!(a.until_view(&["alice", "bob"]).await, (ab, fp_ab.clone()));
    c.join(policy);
    b.leave();
    let (ac, fp_ac) = c.until_view(&["alice", "carol"]).await;
    assert_eq!(a.until_view(&["alice", "carol"]).await, (ac, fp_ac.clone()));
    assert_ne!(fp_ac, fp_ab);
    a.send("to carol");
    assert_eq!(c.until_msg("to carol").await, ac);
}

/// Integrated VS on a real daemon: the members run no key agreement; every
/// view's key comes from the daemon with the view, the members confirm it,
/// a leave gives the others a new one, and data flows as in layered groups.
/// A member asking for the layered policy cannot join the keyed group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keyed_by_its_daemon_gets_a_key_with_every_view() {
    let w = world(&["alice", "bob", "carol"], 13).await;
    let policy = Policy::integrated();
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    a.join(policy);
    let (_, fp_a) = a.until_view(&["alice"]).await;
    b.join(policy);
    let (ab, fp_ab) = b.until_view(&["alice", "bob"]).await;
    assert_eq!(a.until_view(&["alice", "bob"]).await, (ab, fp_ab.clone()));
    assert_ne!(fp_a, fp_ab);
    a.send("keyed hello");
    assert_eq!(b.until_msg("keyed hello").await, ab);
    c.join(Policy::default());
    c.until("the daemon's refusal of a layered join", |log| {
        log.iter()
            .any(|e| matches!(e, SecureEvent::DaemonError { code: conclave_gcs::core::ErrorCode::ModeMismatch, .. }))
            .then_some(())
    })
    .await;
    b.leave();
    let (alone, fp_alone) = a.until_view(&["alice"]).await;
    assert_ne!(alone, ab);
    assert_ne!(fp_alone, fp_ab, "the leaver's key is not the one left in use");
}

/// The daemon gives a keyed group's key to every member of the view, trusted
/// or not. A member does not use a key that someone it does not trust holds
/// too: while an untrusted client is in the view, no secure view is
/// delivered and nothing is sent; once it leaves, the group is keyed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_view_with_an_untrusted_member_is_not_used() {
    let w = world(&["alice", "bob"], 14).await;
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    a.join(Policy::integrated());
    a.until_view(&["alice"]).await;
    b.join(Policy::integrated());
    let (ab, _) = a.until_view(&["alice", "bob"]).await;
    b.until_view(&["alice", "bob"]).await;
    // Mallory is in nobody's directory; the daemon keys her view all the same.
    let path = w.daemon.unix_path().unwrap();
    let mallory_key = generate_signer(SignatureId::Ed25519, &mut ChaCha20Rng::seed_from_u64(99)).unwrap();
    let m = Member::start(path, "mallory", mallory_key, w.directory.clone()).await;
    m.join(Policy::integrated());
    // Let the daemon's view with mallory reach everyone (it carries no event
    // to wait for: that is the point), then send.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    a.send("not while mallory listens");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for member in [&a, &b] {
        let views = member.views();
        assert!(
            views.values().all(|v| !v.iter().any(|x| x.as_str() == "mallory")),
            "{} used mallory's key",
            member.name
        );
        assert_eq!(views.keys().max(), Some(&ab), "{} installed a key after mallory came", member.name);
    }
    m.leave();
    let (after, _) = b.until_view_after(&["alice", "bob"], ab).await;
    assert_eq!(b.until_msg("not while mallory listens").await, after, "the send waited for a key mallory lacks");
}

/// Three-Step on a real daemon: no key agreement and no group key. Every
/// daemon view is the secure view at once (its fingerprint says there is no
/// key), data goes in clear to the daemon over the local socket and reaches
/// every member, and a joiner that asks for another mode is refused by the
/// daemon. A three-step group takes no encrypted data message either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_step_group_carries_data_with_no_group_key() {
    let w = world(&["alice", "bob", "carol", "dave"], 15).await;
    let policy = Policy::three_step();
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    let d = w.member("dave").await;
    a.join(policy);
    a.send("sent before any view");
    let (alone, fp) = a.until_view(&["alice"]).await;
    assert_eq!(fp, conclave_secure::THREE_STEP_FINGERPRINT);
    assert_eq!(a.until_msg("sent before any view").await, alone, "no key to wait for");
    b.join(policy);
    let (ab, _) = b.until_view(&["alice", "bob"]).await;
    assert_eq!(a.until_view(&["alice", "bob"]).await.0, ab);
    a.send("in clear to the daemon");
    assert_eq!(b.until_msg("in clear to the daemon").await, ab);
    for (joiner, other) in [(&c, Policy::integrated()), (&d, Policy::default())] {
        joiner.join(other);
        joiner
            .until("the daemon's refusal of another mode", |log| {
                log.iter()
                    .any(|e| {
                        matches!(e, SecureEvent::DaemonError { code: conclave_gcs::core::ErrorCode::ModeMismatch, .. })
                    })
                    .then_some(())
            })
            .await;
    }
    // An encrypted data message (whatever it holds) is not this group's.
    b.run(|s| s.send_raw(GROUP, &[2, 0, 1, 2, 3]).unwrap());
    a.until_rejected("bob", RejectReason::WrongMode).await;
}

/// A layered group takes no data in clear: three-step data sent into it is
/// rejected at every member, never delivered as a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_in_clear_is_rejected_in_a_layered_group() {
    let w = world(&["alice", "bob"], 16).await;
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    a.join(Policy::default());
    a.until_view(&["alice"]).await;
    b.join(Policy::default());
    b.until_view(&["alice", "bob"]).await;
    a.until_view(&["alice", "bob"]).await;
    b.run(|s| s.send_raw(GROUP, b"\x08not encrypted").unwrap());
    a.until_rejected("bob", RejectReason::WrongMode).await;
    a.send("after");
    b.until_msg("after").await;
    assert!(!a
        .events()
        .iter()
        .any(|e| matches!(e, SecureEvent::Message { data, .. } if data == &b"not encrypted"[..])));
}

/// Optimized EVS on a real daemon: keyed by the daemon like Integrated VS;
/// a burst sent while another member joins arrives at every member once and
/// in order, whatever view each message is delivered in (the daemon
/// re-encrypts those that cross the join), and a member asking for another
/// mode is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_optimized_evs_group_delivers_a_burst_across_a_join_once_and_in_order() {
    let w = world(&["alice", "bob", "carol", "dave"], 17).await;
    let policy = Policy::optimized_evs();
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    let d = w.member("dave").await;
    a.join(policy);
    a.until_view(&["alice"]).await;
    b.join(policy);
    b.until_view(&["alice", "bob"]).await;
    a.until_view(&["alice", "bob"]).await;
    let texts: Vec<String> = (0..100).map(|i| format!("burst {i}")).collect();
    let burst = texts.clone();
    a.run(move |s| {
        for t in &burst {
            s.send(GROUP, t.as_bytes()).unwrap();
        }
    });
    c.join(policy);
    c.until_view(&["alice", "bob", "carol"]).await;
    b.until_msg("burst 99").await;
    let read = |m: &Member| -> Vec<String> {
        m.events()
            .iter()
            .filter_map(|e| match e {
                SecureEvent::Message { data, .. } => Some(String::from_utf8(data.to_vec()).unwrap()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(read(&b), texts, "every message once, in order");
    assert!(!b.events().iter().any(|e| matches!(e, SecureEvent::Rejected { .. })), "{:?}", b.events());
    d.join(Policy::integrated());
    d.until("the daemon's refusal of another mode", |log| {
        log.iter()
            .any(|e| matches!(e, SecureEvent::DaemonError { code: conclave_gcs::core::ErrorCode::ModeMismatch, .. }))
            .then_some(())
    })
    .await;
}

/// An open three-step group (`three-step:open`): a client that is not a
/// member sends to it in clear to its daemon, and the members get it from
/// that client; to a closed three-step group the daemon refuses the same.
/// No other mode can be open: a non-member would have no key to send under.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_members_send_to_an_open_three_step_group_and_not_to_a_closed_one() {
    let w = world(&["alice", "bob", "carol"], 18).await;
    let a = w.member("alice").await;
    let b = w.member("bob").await;
    let c = w.member("carol").await;
    let open: Policy = "three-step:open".parse().unwrap();
    assert_eq!(open.to_string(), "three-step:open");
    a.join(open);
    a.until_view(&["alice"]).await;
    b.join(open);
    b.until_view(&["alice", "bob"]).await;
    c.run(|s| s.send_open(GROUP, b"from outside").unwrap());
    for m in [&a, &b] {
        m.until("carol's message", |log| {
            log.iter()
                .any(|e| {
                    matches!(e, SecureEvent::Message { sender, data, .. }
                        if sender.as_str() == "carol" && data == &b"from outside"[..])
                })
                .then_some(())
        })
        .await;
    }
    // A closed three-step group: the daemon says no.
    let closed = "closed-room";
    a.run(move |s| s.join(closed, Policy::three_step()).unwrap());
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    c.run(move |s| s.send_open(closed, b"knock").unwrap());
    c.until("the daemon's refusal", |log| {
        log.iter()
            .any(|e| matches!(e, SecureEvent::DaemonError { code: conclave_gcs::core::ErrorCode::NotMember, .. }))
            .then_some(())
    })
    .await;
    // Open is for three-step groups only.
    let refused = c.ask(|s| s.join("other", Policy { open: true, ..Policy::optimized_evs() })).await;
    assert!(matches!(refused, Err(conclave_secure::SessionError::Unsupported(_))), "{refused:?}");
}
