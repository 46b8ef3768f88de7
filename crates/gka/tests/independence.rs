//! Key independence: a member that left cannot compute any later group
//! secret, and a newcomer cannot compute any earlier one.
//!
//! The departed member's knowledge is modelled as everything its engine held
//! (contributions, node and channel keys, old group secrets) plus every group
//! element sent after it left (it can eavesdrop). That knowledge is closed
//! under exponentiation and under the protocol's element-to-exponent hash,
//! level by level up to the key tree's height for these small groups, and the
//! new group secret must not be in the closure. A control checks that the same
//! closure does reach the new secret from a current member's knowledge, so
//! the check is able to fail.

use conclave_gcs::sim::Flush;
use conclave_gcs::MemberId;
use conclave_gka::engine::Leak;
use conclave_gka::harness::Harness;
use conclave_gka::testing::domains;
use conclave_gka::{GroupId, ProtocolId, SignatureId};

const DEPTH: usize = 2;
const BUDGET: usize = 200_000;

struct Knowledge {
    scalars: Vec<Vec<u8>>,
    elements: Vec<Vec<u8>>,
}

impl Knowledge {
    fn of(leak: &Leak) -> Self {
        let mut elements = leak.elements.clone();
        elements.extend(leak.group_secret.clone());
        Self { scalars: leak.scalars.clone(), elements }
    }
}

fn secret_of(h: &mut Harness, m: &MemberId) -> Vec<u8> {
    h.sim().node(m).unwrap().engine.leak().group_secret.expect("installed")
}

/// Group elements in every message traced from index `from` on.
fn publics_since(h: &mut Harness, from: usize) -> Vec<Vec<u8>> {
    let msgs: Vec<Vec<u8>> = h.sim().trace()[from..].iter().map(|d| d.msg.bytes.to_vec()).collect();
    let any = h.sim().nodes().next().unwrap().0.clone();
    let engine = &h.sim().node(&any).unwrap().engine;
    msgs.iter().flat_map(|b| engine.public_elements(b).unwrap()).collect()
}

fn reach(h: &mut Harness, protocol: ProtocolId, k: &Knowledge, publics: &[Vec<u8>], target: &[u8]) -> bool {
    let any = h.sim().nodes().next().unwrap().0.clone();
    let attacker = h.sim().node(&any).unwrap().engine.attacker();
    attacker
        .can_reach(&k.scalars, &k.elements, publics, target, &domains(protocol), DEPTH, BUDGET)
        .unwrap_or_else(|| panic!("{protocol}: closure exceeded its budget; use a smaller case"))
}

fn check(protocol: ProtocolId, n: usize, seed: u64) {
    let mut h = Harness::new(protocol, GroupId::Ristretto255, SignatureId::Ed25519, seed, Flush::All);
    let ids = h.add_members(n + 1).unwrap();
    h.sim().enable_trace();
    h.event(|s| s.join(&ids[..n], None)).unwrap();
    let leaver = ids[(seed as usize) % n].clone();
    let old_secret = secret_of(&mut h, &leaver);
    let gone = Knowledge::of(&h.sim().node(&leaver).unwrap().engine.leak());
    let mark = h.sim().trace().len();
    h.event(|s| s.leave(std::slice::from_ref(&leaver))).unwrap();
    h.check_agreement().unwrap();
    let stay: Vec<MemberId> = ids[..n].iter().filter(|m| **m != leaver).cloned().collect();
    let new_secret = secret_of(&mut h, &stay[0]);
    assert_ne!(old_secret, new_secret);
    let publics = publics_since(&mut h, mark);
    assert!(
        !reach(&mut h, protocol, &gone, &publics, &new_secret),
        "{protocol} n={n} seed {seed}: the departed member can compute the new group secret"
    );
    // Control: the closure does reach the secret from a member's knowledge.
    if matches!(protocol, ProtocolId::Gdh | ProtocolId::Ckd | ProtocolId::Tgdh) {
        let can = stay.iter().any(|m| {
            let k = Knowledge { scalars: h.sim().node(m).unwrap().engine.leak().scalars, elements: Vec::new() };
            reach(&mut h, protocol, &k, &publics, &new_secret)
        });
        assert!(can, "{protocol} n={n} seed {seed}: control failed: no member's knowledge reaches the key");
    }
    // A newcomer cannot compute the key of the view before it joined.
    let joiner = ids[n].clone();
    let mark = h.sim().trace().len();
    h.event(|s| s.join(std::slice::from_ref(&joiner), Some(&stay[0]))).unwrap();
    h.check_agreement().unwrap();
    let newcomer = Knowledge::of(&h.sim().node(&joiner).unwrap().engine.leak());
    let publics = publics_since(&mut h, mark);
    assert!(
        !reach(&mut h, protocol, &newcomer, &publics, &new_secret),
        "{protocol} n={n} seed {seed}: a newcomer can compute the previous group secret"
    );
}

fn run(protocol: ProtocolId) {
    for seed in 0..6 {
        check(protocol, 3 + (seed as usize % 2), seed);
    }
}

#[test]
fn bd_departed_and_new_members_learn_nothing() {
    run(ProtocolId::Bd);
}

#[test]
fn ckd_departed_and_new_members_learn_nothing() {
    run(ProtocolId::Ckd);
}

#[test]
fn gdh_departed_and_new_members_learn_nothing() {
    run(ProtocolId::Gdh);
}

#[test]
fn tgdh_departed_and_new_members_learn_nothing() {
    run(ProtocolId::Tgdh);
}

#[test]
fn str_departed_and_new_members_learn_nothing() {
    run(ProtocolId::Str);
}
