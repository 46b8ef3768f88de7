//! A group wrapper that remembers the elements it decoded, keyed by their bytes.
//!
//! Tree protocols broadcast whole trees: a TGDH or STR announcement carries
//! every blinded key, and each receiver decodes and validates all of them,
//! although after a join or leave almost all are the ones it already holds.
//! In a group of n that is O(n) point decompressions (or, for MODP groups,
//! subgroup checks, each an exponentiation) per member and message, where
//! O(log n) are new. Remembering decodings turns the repeats into lookups.
//!
//! Decoding is a deterministic function of the bytes (the same element, or
//! the same rejection), so a remembered result changes no outcome: only
//! successful decodings are kept, and bytes not seen before are decoded and
//! validated for real. Elements are public values (blinded keys, partial
//! keys), never secrets. Engines meter exponentiations, not decodings, so the
//! cost meter is unchanged. The map is bounded (once full it starts afresh)
//! and hashed with foldhash, seeded at random, which is cheaper than
//! ordering keys by comparison on every lookup; only lookups are made, so the
//! seed changes no outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rand_core::CryptoRngCore;

use super::{CryptoError, Group, GroupId};

/// Elements an engine remembers: enough for the full trees of a group of
/// 2048 members, about 1 MB with ristretto255.
pub(crate) const ENGINE_CAPACITY: usize = 4096;

/// Decoded elements by their encodings.
type Decoded<E> = HashMap<Vec<u8>, E, foldhash::fast::RandomState>;

/// `G`, remembering up to `capacity` decoded elements. Clones share the memory.
#[derive(Clone)]
pub(crate) struct Memo<G: Group> {
    inner: G,
    capacity: usize,
    decoded: Arc<Mutex<Decoded<G::Element>>>,
}

impl<G: Group> Memo<G> {
    /// `inner`, remembering at most `capacity` elements at a time.
    pub(crate) fn new(inner: G, capacity: usize) -> Self {
        Self { inner, capacity, decoded: Arc::default() }
    }
}

impl<G: Group> Group for Memo<G> {
    type Element = G::Element;
    type Scalar = G::Scalar;
    type Encoding = G::Encoding;

    fn id(&self) -> GroupId {
        self.inner.id()
    }
    fn random_scalar(&self, rng: &mut dyn CryptoRngCore) -> G::Scalar {
        self.inner.random_scalar(rng)
    }
    fn exp_generator(&self, s: &G::Scalar) -> G::Element {
        self.inner.exp_generator(s)
    }
    fn exp(&self, base: &G::Element, s: &G::Scalar) -> G::Element {
        self.inner.exp(base, s)
    }
    fn exp_small(&self, base: &G::Element, e: u64) -> G::Element {
        self.inner.exp_small(base, e)
    }
    fn mul(&self, a: &G::Element, b: &G::Element) -> G::Element {
        self.inner.mul(a, b)
    }
    fn div(&self, a: &G::Element, b: &G::Element) -> G::Element {
        self.inner.div(a, b)
    }
    fn identity(&self) -> G::Element {
        self.inner.identity()
    }
    fn scalar_mul(&self, a: &G::Scalar, b: &G::Scalar) -> G::Scalar {
        self.inner.scalar_mul(a, b)
    }
    fn scalar_invert(&self, a: &G::Scalar) -> G::Scalar {
        self.inner.scalar_invert(a)
    }
    fn scalar_from_u64(&self, n: u64) -> G::Scalar {
        self.inner.scalar_from_u64(n)
    }
    fn hash_to_scalar(&self, domain: &[u8], e: &G::Element) -> G::Scalar {
        self.inner.hash_to_scalar(domain, e)
    }
    fn encode(&self, e: &G::Element) -> Vec<u8> {
        self.inner.encode(e)
    }
    fn decode(&self, bytes: &[u8]) -> Result<G::Element, CryptoError> {
        let mut decoded = self.decoded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = decoded.get(bytes) {
            return Ok(e.clone());
        }
        let e = self.inner.decode(bytes)?;
        if decoded.len() >= self.capacity {
            decoded.clear();
        }
        decoded.insert(bytes.to_vec(), e.clone());
        Ok(e)
    }
    fn decode_unchecked(&self, bytes: &[u8]) -> Result<G::Element, CryptoError> {
        if self.inner.prime_order() {
            // The same decoding: remembered.
            return self.decode(bytes);
        }
        // The memory holds only checked elements, and what is decoded
        // unchecked (blinded keys, BD's round-2 values) is never decoded
        // checked: a look-up would not find it.
        self.inner.decode_unchecked(bytes)
    }
    fn in_subgroup(&self, e: &G::Element) -> bool {
        self.inner.in_subgroup(e)
    }
    fn prime_order(&self) -> bool {
        self.inner.prime_order()
    }
    fn encoding(&self, e: &G::Element) -> G::Encoding {
        self.inner.encoding(e)
    }
    fn encoding_of(&self, bytes: &[u8]) -> Option<G::Encoding> {
        self.inner.encoding_of(bytes)
    }
    fn element_len(&self) -> usize {
        self.inner.element_len()
    }
    fn encode_scalar(&self, s: &G::Scalar) -> Vec<u8> {
        self.inner.encode_scalar(s)
    }
    fn decode_scalar(&self, bytes: &[u8]) -> Option<G::Scalar> {
        self.inner.decode_scalar(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::ristretto::Ristretto255;
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    #[test]
    fn remembers_valid_elements_rejects_invalid_ones_every_time_and_stays_bounded() {
        let g = Memo::new(Ristretto255, 2);
        let mut rng = ChaCha20Rng::seed_from_u64(7);
        let elems: Vec<_> = (0..3).map(|_| g.exp_generator(&g.random_scalar(&mut rng))).collect();
        for e in &elems {
            let bytes = g.encode(e);
            for _ in 0..2 {
                assert_eq!(g.encode(&g.decode(&bytes).unwrap()), bytes);
            }
            assert!(g.decoded.lock().unwrap().len() <= 2, "the memory is bounded");
        }
        // Not a canonical encoding: rejected on each try, never remembered.
        let bad = [0xffu8; 32];
        for _ in 0..2 {
            assert!(g.decode(&bad).is_err());
        }
        assert!(!g.decoded.lock().unwrap().contains_key(&bad[..]));
    }
}
