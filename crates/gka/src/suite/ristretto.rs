//! ristretto255 (RFC 9496) over curve25519-dalek: the default group.
//!
//! Chosen by measurement (`conclave bench crypto` on the project's 2-core build machine): a
//! variable-base scalar multiplication costs about 32 µs here, against 58 µs
//! for a 1024-bit MODP exponentiation with a 160-bit exponent in OpenSSL, at a
//! far higher security level; the crate is constant-time and widely reviewed.
//! Fixed-base exponentiations use the precomputed basepoint table.

use curve25519_dalek::constants::RISTRETTO_BASEPOINT_TABLE;
use curve25519_dalek::ristretto::{CompressedRistretto, RistrettoPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::Identity;
use rand_core::CryptoRngCore;
use sha2::{Digest, Sha512};

use super::{CryptoError, Group, GroupId};

/// The ristretto255 group.
#[derive(Clone, Copy, Debug, Default)]
pub struct Ristretto255;

impl Group for Ristretto255 {
    type Element = RistrettoPoint;
    type Encoding = [u8; 32];
    type Scalar = Scalar;

    fn id(&self) -> GroupId {
        GroupId::Ristretto255
    }

    fn random_scalar(&self, rng: &mut dyn CryptoRngCore) -> Scalar {
        loop {
            let mut wide = [0u8; 64];
            rng.fill_bytes(&mut wide);
            let s = Scalar::from_bytes_mod_order_wide(&wide);
            zeroize::Zeroize::zeroize(&mut wide);
            if s != Scalar::ZERO {
                return s;
            }
        }
    }

    fn exp_generator(&self, s: &Scalar) -> RistrettoPoint {
        super::tally::generator_exponentiation();
        RISTRETTO_BASEPOINT_TABLE * s
    }

    fn exp(&self, base: &RistrettoPoint, s: &Scalar) -> RistrettoPoint {
        super::tally::exponentiation();
        base * s
    }

    fn exp_small(&self, base: &RistrettoPoint, e: u64) -> RistrettoPoint {
        // Double-and-add over the few bits of a small public exponent: a
        // handful of additions instead of a full 253-bit multiplication.
        let mut acc = RistrettoPoint::identity();
        for bit in (0..64 - e.leading_zeros()).rev() {
            acc = acc + acc;
            if (e >> bit) & 1 == 1 {
                acc += base;
            }
        }
        acc
    }

    fn mul(&self, a: &RistrettoPoint, b: &RistrettoPoint) -> RistrettoPoint {
        a + b
    }

    fn div(&self, a: &RistrettoPoint, b: &RistrettoPoint) -> RistrettoPoint {
        a - b
    }

    fn identity(&self) -> RistrettoPoint {
        RistrettoPoint::identity()
    }

    fn scalar_mul(&self, a: &Scalar, b: &Scalar) -> Scalar {
        a * b
    }

    fn scalar_invert(&self, a: &Scalar) -> Scalar {
        a.invert()
    }

    fn scalar_from_u64(&self, n: u64) -> Scalar {
        Scalar::from(n)
    }

    fn hash_to_scalar(&self, domain: &[u8], e: &RistrettoPoint) -> Scalar {
        let mut h = Sha512::new();
        h.update(b"conclave/gka/v1/");
        h.update((domain.len() as u16).to_be_bytes());
        h.update(domain);
        h.update(self.id().name().as_bytes());
        h.update(e.compress().as_bytes());
        Scalar::from_hash(h)
    }

    fn encode(&self, e: &RistrettoPoint) -> Vec<u8> {
        e.compress().as_bytes().to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<RistrettoPoint, CryptoError> {
        let c = CompressedRistretto::from_slice(bytes).map_err(|_| CryptoError::InvalidElement)?;
        let p = c.decompress().ok_or(CryptoError::InvalidElement)?;
        if p == RistrettoPoint::identity() {
            return Err(CryptoError::InvalidElement);
        }
        Ok(p)
    }

    fn decode_unchecked(&self, bytes: &[u8]) -> Result<RistrettoPoint, CryptoError> {
        self.decode(bytes)
    }

    fn in_subgroup(&self, _e: &RistrettoPoint) -> bool {
        // ristretto255 is a group of prime order: there is no other subgroup.
        true
    }

    fn prime_order(&self) -> bool {
        true
    }

    fn encoding(&self, e: &RistrettoPoint) -> [u8; 32] {
        e.compress().to_bytes()
    }

    fn encoding_of(&self, bytes: &[u8]) -> Option<[u8; 32]> {
        bytes.try_into().ok()
    }

    fn element_len(&self) -> usize {
        32
    }

    fn encode_scalar(&self, s: &Scalar) -> Vec<u8> {
        s.to_bytes().to_vec()
    }

    fn decode_scalar(&self, bytes: &[u8]) -> Option<Scalar> {
        Option::from(Scalar::from_canonical_bytes(bytes.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    }

    /// RFC 9496 Appendix A.1: encodings of the first multiples of the generator.
    #[test]
    fn rfc9496_multiples_of_the_generator() {
        let expected = [
            "0000000000000000000000000000000000000000000000000000000000000000",
            "e2f2ae0a6abc4e71a884a961c500515f58e30b6aa582dd8db6a65945e08d2d76",
            "6a493210f7499cd17fecb510ae0cea23a110e8d5b901f8acadd3095c73a3b919",
            "94741f5d5d52755ece4f23f044ee27d5d1ea1e2bd196b462166b16152a9d0259",
            "da80862773358b466ffadfe0b3293ab3d9fd53c5ea6c955358f568322daf6a57",
            "e882b131016b52c1d3337080187cf768423efccbb517bb495ab812c4160ff44e",
        ];
        let g = Ristretto255;
        for (i, hexstr) in expected.iter().enumerate() {
            let p = if i == 0 { g.identity() } else { g.exp_generator(&g.scalar_from_u64(i as u64)) };
            assert_eq!(g.encode(&p), unhex(hexstr), "{i}·B");
        }
    }

    /// RFC 9496 Appendix A.2: some of the invalid encodings must be rejected.
    #[test]
    fn rfc9496_bad_encodings_are_rejected() {
        let bad = [
            // Non-canonical field encodings.
            "00ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
            "ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            // Negative field elements.
            "0100000000000000000000000000000000000000000000000000000000000000",
            "01ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
            // Non-square x^2.
            "26948d35ca62e643e26a83177332e6b6afeb9d08e4268b650f1f5bbd8d81d371",
            // Negative xy value.
            "3eb858e78f5a7254d8c9731174a94f76755fd3941c0ac93735c07ba14579630e",
        ];
        let g = Ristretto255;
        for b in bad {
            assert_eq!(g.decode(&unhex(b)), Err(CryptoError::InvalidElement), "{b}");
        }
        // The identity is valid ristretto but never a valid protocol value.
        assert_eq!(g.decode(&[0u8; 32]), Err(CryptoError::InvalidElement));
        assert_eq!(g.decode(&[1u8; 31]), Err(CryptoError::InvalidElement));
    }

    #[test]
    fn exponent_algebra_holds() {
        use rand_core::SeedableRng;
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let g = Ristretto255;
        let a = g.random_scalar(&mut rng);
        let b = g.random_scalar(&mut rng);
        let ga = g.exp_generator(&a);
        let gab = g.exp(&ga, &b);
        assert_eq!(gab, g.exp_generator(&g.scalar_mul(&a, &b)));
        assert_eq!(g.exp(&gab, &g.scalar_invert(&b)), ga);
        assert_eq!(g.div(&g.mul(&ga, &gab), &gab), ga);
        assert_eq!(g.exp_small(&ga, 3), g.mul(&g.mul(&ga, &ga), &ga));
        assert_ne!(g.hash_to_scalar(b"x", &ga), g.hash_to_scalar(b"y", &ga));
        assert_eq!(g.decode(&g.encode(&gab)).unwrap(), gab);
    }
}
