//! Every protocol's body decoders, reached past the signature check: the
//! input picks a protocol, how far a join run has progressed, a round, a
//! unicast flag and the body, which is signed by a real member and delivered.
//! Engines must answer with a value or an error, never a panic.
#![no_main]

use conclave_gcs::sim::Flush;
use conclave_gka::harness::Harness;
use conclave_gka::{GroupId, ProtocolId, SignatureId};
use libfuzzer_sys::fuzz_target;
use rand_core::SeedableRng;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let protocol = ProtocolId::ALL[data[0] as usize % ProtocolId::ALL.len()];
    let steps = (data[1] % 16) as usize;
    let round = data[2] % 8;
    let unicast = data[3] & 1 == 1;
    let body = &data[4..];
    let mut h = Harness::new(protocol, GroupId::Ristretto255, SignatureId::Ed25519, 1, Flush::All);
    let ids = h.add_members(5).expect("identities");
    h.event(|s| s.join(&ids[..4], None)).expect("form");
    h.sim().join(&ids[4..5], Some(&ids[0])).expect("join");
    h.sim().run_steps(steps);
    for (i, target) in ids.iter().enumerate() {
        let from = &ids[(i + 1) % ids.len()];
        let bytes = h.sign_as(from, unicast.then_some(target), round, body).expect("in view");
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(0);
        let _ = h.sim().node_mut(target).expect("member").engine.on_message(from, &bytes, &mut rng);
    }
});
