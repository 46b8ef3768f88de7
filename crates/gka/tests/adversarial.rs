//! Forged, tampered, replayed, cross-view and malformed messages are rejected
//! with an error and change nothing.
//!
//! "Change nothing" is checked the strong way: a run in which every member is
//! bombarded with bad messages at every step must end with exactly the keys
//! of the same seeded run without them.

use conclave_gcs::sim::Flush;
use conclave_gcs::MemberId;
use conclave_gka::harness::Harness;
use conclave_gka::message::Envelope;
use conclave_gka::suite::generate_signer;
use conclave_gka::{Error, GroupId, ProtocolId, SignatureId};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// Runs: form a group of 5, then the given event; returns every member's
/// final key fingerprint and the number of attacks rejected.
fn run(protocol: ProtocolId, seed: u64, event: usize, attack: bool) -> (Vec<String>, usize) {
    let mut h = Harness::new(protocol, GroupId::Ristretto255, SignatureId::Ed25519, seed, Flush::All);
    let ids = h.add_members(8).unwrap();
    h.sim().enable_trace();
    h.event(|s| s.join(&ids[..5], None)).unwrap();
    h.sim().join(&ids[5..7], None).unwrap();
    h.sim().run(1_000_000).unwrap();
    let old_view_msgs: Vec<Vec<u8>> = h.sim().trace().iter().map(|d| d.msg.bytes.to_vec()).collect();
    match event {
        0 => h.sim().join(&ids[7..8], Some(&ids[0])).unwrap(),
        1 => h.sim().leave(&[ids[2].clone()]).unwrap(),
        2 => h.sim().merge(&ids[0], &ids[5]).unwrap(),
        _ => h.sim().partition(vec![ids[..2].to_vec(), ids[2..5].to_vec()]).unwrap(),
    }
    let mut rng = ChaCha20Rng::seed_from_u64(seed ^ 0xa77ac);
    let outsider = generate_signer(SignatureId::Ed25519, &mut rng).unwrap();
    let mut rejected = 0;
    loop {
        if attack {
            rejected += bombard(&mut h, &old_view_msgs, outsider.as_ref(), &mut rng);
        }
        if !h.sim().step() {
            break;
        }
    }
    h.check_agreement().unwrap_or_else(|e| panic!("{protocol} seed {seed} event {event}: {e}"));
    assert!(h.errors().is_empty(), "{protocol} seed {seed}: {:?}", h.errors());
    if attack {
        // After the run every message of the run is a replay.
        let current: Vec<_> = h.sim().trace().iter().map(|d| (d.from.clone(), d.to.clone(), d.msg.bytes.to_vec())).collect();
        let views: Vec<Vec<MemberId>> = h.sim().views().iter().map(|v| v.ids().cloned().collect()).collect();
        for (from, to, bytes) in current {
            for v in &views {
                for m in v {
                    if to.as_ref().is_some_and(|t| t != m) || !v.contains(&from) {
                        continue;
                    }
                    let engine = &mut h.sim().node_mut(m).unwrap().engine;
                    match engine.on_message(&from, &bytes, &mut rng) {
                        Ok(out) => panic!("{protocol}: a replay to {m} was accepted ({} outputs)", out.len()),
                        Err(_) => rejected += 1,
                    }
                }
            }
        }
    }
    let keys = h
        .sim_ref()
        .views()
        .iter()
        .flat_map(|v| v.ids().cloned().collect::<Vec<_>>())
        .map(|m| h.sim_ref().node(&m).unwrap().engine.secure_view().unwrap().key.fingerprint())
        .collect();
    (keys, rejected)
}

/// Hits every member of every view with bad messages; each must be rejected.
fn bombard(h: &mut Harness, old: &[Vec<u8>], outsider: &dyn conclave_gka::suite::Signer, rng: &mut ChaCha20Rng) -> usize {
    let live: Vec<(MemberId, Option<MemberId>, Vec<u8>)> = h
        .sim()
        .trace()
        .iter()
        .rev()
        .take(4)
        .map(|d| (d.from.clone(), d.to.clone(), d.msg.bytes.to_vec()))
        .collect();
    let members: Vec<MemberId> = h.sim().views().iter().flat_map(|v| v.ids().cloned().collect::<Vec<_>>()).collect();
    let mut rejected = 0;
    for m in &members {
        let mut attacks: Vec<(MemberId, Vec<u8>, &str)> = Vec::new();
        for (from, _, bytes) in &live {
            // Tampered: one bit flipped anywhere.
            let mut t = bytes.clone();
            let i = (rng.next_u64() % t.len() as u64) as usize;
            t[i] ^= 1 << (rng.next_u64() % 8);
            attacks.push((from.clone(), t, "tampered"));
            // Truncated.
            let cut = (rng.next_u64() % bytes.len() as u64) as usize;
            attacks.push((from.clone(), bytes[..cut].to_vec(), "truncated"));
            // Forged: re-signed by an outsider with a member's name.
            let mut env = Envelope::decode(bytes).unwrap();
            env.recipient = None;
            if !env.body.is_empty() {
                let j = (rng.next_u64() % env.body.len() as u64) as usize;
                env.body[j] ^= 0x40;
            }
            env.signature = outsider.sign(&env.signed_bytes());
            attacks.push((from.clone(), env.encode(), "forged"));
            // Re-addressed: a member's signed message claimed as someone else's.
            if let Some(other) = members.iter().find(|o| *o != from) {
                attacks.push((other.clone(), bytes.clone(), "wrong sender"));
            }
        }
        // A message from an earlier view (or, for an untouched group, a replay).
        if !old.is_empty() {
            let b = old[(rng.next_u64() % old.len() as u64) as usize].clone();
            let from = Envelope::decode(&b).unwrap().sender;
            attacks.push((from, b, "old view"));
        }
        // Garbage.
        let mut g = vec![0u8; (rng.next_u64() % 200) as usize];
        rng.fill_bytes(&mut g);
        attacks.push((members[0].clone(), g, "garbage"));
        for (from, bytes, what) in attacks {
            let engine = &mut h.sim().node_mut(m).unwrap().engine;
            let mut scratch = ChaCha20Rng::seed_from_u64(0);
            match engine.on_message(&from, &bytes, &mut scratch) {
                Err(e) => {
                    rejected += 1;
                    if what == "old view" {
                        assert!(
                            matches!(e, Error::WrongView { .. } | Error::Replay(..) | Error::NotForMe),
                            "earlier message gave {e}"
                        );
                    }
                }
                Ok(out) => panic!("{what} message to {m} was accepted ({} outputs)", out.len()),
            }
        }
    }
    rejected
}

fn check_protocol(protocol: ProtocolId) {
    for seed in 0..6u64 {
        for event in 0..4 {
            let (clean, _) = run(protocol, seed, event, false);
            let (attacked, rejected) = run(protocol, seed, event, true);
            assert!(rejected > 0);
            assert_eq!(clean, attacked, "{protocol} seed {seed} event {event}: attacks changed the outcome");
        }
    }
}

#[test]
fn bd_rejects_bad_messages_and_is_unchanged_by_them() {
    check_protocol(ProtocolId::Bd);
}

#[test]
fn gdh_rejects_bad_messages_and_is_unchanged_by_them() {
    check_protocol(ProtocolId::Gdh);
}

#[test]
fn ckd_rejects_bad_messages_and_is_unchanged_by_them() {
    check_protocol(ProtocolId::Ckd);
}

#[test]
fn tgdh_rejects_bad_messages_and_is_unchanged_by_them() {
    check_protocol(ProtocolId::Tgdh);
}

#[test]
fn str_rejects_bad_messages_and_is_unchanged_by_them() {
    check_protocol(ProtocolId::Str);
}
