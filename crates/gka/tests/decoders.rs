//! Every protocol's message decoder, fed arbitrary bodies that carry a valid
//! signature (so they get past the envelope checks), returns an error or
//! accepts — never panics — and a rejected body leaves the group able to
//! finish its run. The cargo-fuzz targets in `fuzz/` do the same with
//! coverage guidance; this test runs in the normal suite.

use conclave_gcs::sim::Flush;
use conclave_gka::harness::Harness;
use conclave_gka::{GroupId, ProtocolId, SignatureId};
use proptest::prelude::*;

fn feed(protocol: ProtocolId, inputs: &[(u8, bool, Vec<u8>)], steps: usize) {
    let mut h = Harness::new(protocol, GroupId::Ristretto255, SignatureId::Ed25519, 5, Flush::All);
    let ids = h.add_members(5).unwrap();
    h.event(|s| s.join(&ids[..4], None)).unwrap();
    h.sim().join(&ids[4..5], Some(&ids[0])).unwrap();
    h.sim().run_steps(steps);
    for (round, unicast, body) in inputs {
        for (i, target) in ids.iter().enumerate() {
            let from = &ids[(i + 1) % ids.len()];
            let to = unicast.then_some(target);
            let bytes = h.sign_as(from, to, *round, body).unwrap();
            let mut rng = <rand_chacha::ChaCha20Rng as rand_core::SeedableRng>::seed_from_u64(1);
            let _ = h.sim().node_mut(target).unwrap().engine.on_message(from, &bytes, &mut rng);
        }
    }
}

fn strategy() -> impl Strategy<Value = Vec<(u8, bool, Vec<u8>)>> {
    prop::collection::vec((0u8..8, any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)), 1..6)
}

macro_rules! decoder_tests {
    ($($name:ident: $proto:expr;)*) => {
        $(
            proptest! {
                #![proptest_config(ProptestConfig::with_cases(120))]
                #[test]
                fn $name(inputs in strategy(), steps in 0usize..12) {
                    feed($proto, &inputs, steps);
                }
            }
        )*
    };
}

decoder_tests! {
    bd_never_panics_on_signed_garbage: ProtocolId::Bd;
    ckd_never_panics_on_signed_garbage: ProtocolId::Ckd;
    gdh_never_panics_on_signed_garbage: ProtocolId::Gdh;
    tgdh_never_panics_on_signed_garbage: ProtocolId::Tgdh;
    str_never_panics_on_signed_garbage: ProtocolId::Str;
}
