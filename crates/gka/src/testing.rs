//! Test hooks (feature `test-hooks`): model what a departed member can compute.
//!
//! [`AttackerGroup::can_reach`] closes a member's secrets under exponentiation
//! with every public value it could see and under the protocols' hashes from
//! elements to exponents, level by level, and reports whether a target secret
//! turns up. Never enabled in products.

use crate::suite::Group;

/// The hash domain a protocol uses to turn elements into exponents, if any.
pub fn domains(protocol: crate::ProtocolId) -> Vec<&'static [u8]> {
    use crate::ProtocolId::*;
    match protocol {
        Tgdh => vec![crate::domains::TGDH_NODE],
        Str => vec![crate::domains::STR_NODE],
        Ckd => vec![crate::domains::CKD_CHANNEL],
        Gdh | Bd => Vec::new(),
    }
}

/// Group operations on encodings, for the key-independence tests.
pub trait AttackerGroup {
    // The inputs are the attacker model's parts, spelled out for the tests.
    #[allow(clippy::too_many_arguments)]
    /// Whether `target` is among the values reachable from the secret
    /// `scalars` and `elements` and the `publics` within `depth` levels of
    /// exponentiation, hashing every element reached to an exponent under
    /// each of `domains` as the protocols do. Returns `None` when the closure grows past `budget`
    /// exponentiations (the test should then use a smaller case).
    fn can_reach(
        &self,
        scalars: &[Vec<u8>],
        elements: &[Vec<u8>],
        publics: &[Vec<u8>],
        target: &[u8],
        domains: &[&[u8]],
        depth: usize,
        budget: usize,
    ) -> Option<bool>;
}

/// [`AttackerGroup`] for any [`Group`].
pub struct Attacker<G: Group>(pub G);

impl<G: Group> AttackerGroup for Attacker<G> {
    #[allow(clippy::too_many_arguments)]
    fn can_reach(
        &self,
        scalars: &[Vec<u8>],
        elements: &[Vec<u8>],
        publics: &[Vec<u8>],
        target: &[u8],
        domains: &[&[u8]],
        depth: usize,
        budget: usize,
    ) -> Option<bool> {
        let g = &self.0;
        let mut known: std::collections::BTreeSet<Vec<u8>> = std::collections::BTreeSet::new();
        let mut elems: Vec<G::Element> = Vec::new();
        let add = |e: G::Element, elems: &mut Vec<G::Element>, known: &mut std::collections::BTreeSet<Vec<u8>>| {
            if known.insert(g.encode(&e)) {
                elems.push(e);
            }
        };
        for b in publics.iter().chain(elements) {
            if let Ok(e) = g.decode(b) {
                add(e, &mut elems, &mut known);
            }
        }
        add(g.exp_generator(&g.scalar_from_u64(1)), &mut elems, &mut known);
        let mut exps: Vec<G::Scalar> = scalars.iter().filter_map(|b| g.decode_scalar(b)).collect();
        let inverses: Vec<G::Scalar> = exps.iter().map(|s| g.scalar_invert(s)).collect();
        exps.extend(inverses);
        for b in elements {
            if let Ok(e) = g.decode(b) {
                for d in domains {
                    exps.push(g.hash_to_scalar(d, &e));
                }
            }
        }
        if known.contains(target) {
            return Some(true);
        }
        let mut done_pairs = 0usize;
        let mut old_e = 0usize;
        let mut old_s = 0usize;
        for _ in 0..depth {
            let (ne, ns) = (elems.len(), exps.len());
            let mut fresh = Vec::new();
            for (i, e) in elems.iter().enumerate() {
                for (j, s) in exps.iter().enumerate() {
                    if i < old_e && j < old_s {
                        continue; // already tried at an earlier level
                    }
                    done_pairs += 1;
                    if done_pairs > budget {
                        return None;
                    }
                    fresh.push(g.exp(e, s));
                }
            }
            old_e = ne;
            old_s = ns;
            for e in fresh {
                let enc = g.encode(&e);
                if enc == target {
                    return Some(true);
                }
                if known.insert(enc) {
                    for d in domains {
                        exps.push(g.hash_to_scalar(d, &e));
                    }
                    elems.push(e);
                }
            }
        }
        Some(false)
    }
}
