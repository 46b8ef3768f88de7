//! RSA PKCS#1 v1.5 signatures with SHA-256 over OpenSSL, for reproducing the
//! paper (which signed with RSA; its Cliques library used OpenSSL too).
//!
//! Measured on this machine (`conclave bench crypto`),
//! OpenSSL signs/verifies in 129/7.0 µs at 1024 bits with e = 3, 119/11.0 µs
//! with e = 65537 and 405/11.9 µs at 2048 bits with e = 3. The pure-Rust `rsa`
//! crate is 4–5× slower and carries RUSTSEC-2023-0071 (Marvin timing leak);
//! ring and aws-lc-rs refuse 1024-bit keys. Supported: modulus 1024 or 2048
//! bits, public exponent 3 or 65537; anything else is
//! [`CryptoError::InvalidKey`]. 1024-bit RSA is insecure today (kept for
//! reproduction); e = 3 is safe with PKCS#1 v1.5 only because OpenSSL checks
//! the whole encoded block (no Bleichenbacher-2006 style lax parsing).
//!
//! # Key generation
//! Keys come from the injected RNG, so a seeded simulation gets the same
//! identities every run: each prime is searched upwards over odd numbers from
//! an RNG-drawn start with its top two bits set (so n has exactly the
//! requested size), sieved by the odd primes below 2^14 and by p ≢ 1 (mod e)
//! (that is gcd(e, p-1) = 1 for prime e), then tested with OpenSSL's
//! Miller–Rabin (64 rounds, `BN_is_prime_fasttest_ex`). As in FIPS 186-4
//! B.3.3, |p − q| must exceed 2^(bits/2 − 100) and d > 2^(bits/2);
//! d = e⁻¹ mod lcm(p−1, q−1). The key is assembled with
//! `RSA_set0_key`/`factors`/`crt_params` (`Rsa::from_private_components`).
//!
//! # Encodings
//! [`Verifier::public_bytes`] is the DER of the PKCS#1 `RSAPublicKey`
//! (RFC 8017 A.1.1: `SEQUENCE { n, e }`), not SubjectPublicKeyInfo;
//! [`RsaVerifier::from_der`] accepts exactly that, canonical DER only.
//! [`RsaSigner::to_pem`]/[`RsaSigner::from_pem`] use the PKCS#1
//! `RSA PRIVATE KEY` PEM form, unencrypted.

use std::fmt;
use std::sync::{Arc, OnceLock};

use openssl::bn::{BigNum, BigNumContext, BigNumContextRef};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private, Public};
use openssl::rsa::{Padding, Rsa, RsaRef};
use rand_core::CryptoRngCore;
use zeroize::Zeroizing;

use super::{CryptoError, SignatureId, Signer, Verifier};

/// Failures here are allocation failures or broken invariants of our own.
fn ok<T>(r: Result<T, ErrorStack>) -> T {
    r.expect("OpenSSL RSA operation failed")
}

fn key_err(e: impl fmt::Display) -> CryptoError {
    CryptoError::InvalidKey(e.to_string())
}

/// Checks a (bits, e) pair against what Conclave supports.
fn check_scheme(bits: u32, e: u32) -> Result<SignatureId, CryptoError> {
    if !matches!(bits, 1024 | 2048) {
        return Err(CryptoError::InvalidKey(format!("RSA modulus must be 1024 or 2048 bits, not {bits}")));
    }
    if !matches!(e, 3 | 65537) {
        return Err(CryptoError::InvalidKey(format!("RSA public exponent must be 3 or 65537, not {e}")));
    }
    Ok(SignatureId::Rsa { bits, e })
}

/// The scheme of an existing key, if supported.
fn scheme_of<T>(rsa: &RsaRef<T>) -> Result<SignatureId, CryptoError>
where
    T: openssl::pkey::HasPublic,
{
    let bits = rsa.n().num_bits() as u32;
    let e = rsa.e();
    let e = if e.num_bits() <= 32 && !e.is_negative() {
        let b = ok(e.to_vec_padded(4));
        u32::from_be_bytes(b.try_into().expect("4 bytes"))
    } else {
        0
    };
    check_scheme(bits, e)
}

/// Odd primes below 2^14, for sieving prime candidates.
fn small_primes() -> &'static [u32] {
    static PRIMES: OnceLock<Vec<u32>> = OnceLock::new();
    PRIMES.get_or_init(|| {
        const LIMIT: usize = 1 << 14;
        let mut composite = vec![false; LIMIT];
        let mut out = Vec::new();
        for i in 2..LIMIT {
            if !composite[i] {
                if i > 2 {
                    out.push(i as u32);
                }
                for j in (i * i..LIMIT).step_by(i) {
                    composite[j] = true;
                }
            }
        }
        out
    })
}

/// How far a search runs from one random start before drawing a new one.
/// Primes of 512 or 1024 bits are about 355–710 apart on average, so this is
/// hit with negligible probability.
const MAX_DELTA: u32 = 1 << 20;

/// A random `bits`-bit prime p with its top two bits set and p ≢ 1 (mod e).
fn random_prime(bits: usize, e: u32, rng: &mut dyn CryptoRngCore, ctx: &mut BigNumContextRef) -> BigNum {
    let primes = small_primes();
    let len = bits / 8;
    let mut buf = Zeroizing::new(vec![0u8; len]);
    let mut residues = Zeroizing::new(vec![0u32; primes.len()]);
    loop {
        rng.fill_bytes(&mut buf);
        buf[0] |= 0xc0;
        buf[len - 1] |= 1;
        let mut start = ok(BigNum::from_slice(&buf));
        for (r, &sp) in residues.iter_mut().zip(primes) {
            *r = ok(start.mod_word(sp)) as u32;
        }
        let re = ok(start.mod_word(e)) as u32;
        let mut delta = 0u32;
        while delta < MAX_DELTA {
            // `is_multiple_of` needs Rust 1.87; the workspace supports 1.80.
            #[allow(clippy::manual_is_multiple_of)]
            let sieved = residues.iter().zip(primes).all(|(&r, &sp)| (r + delta) % sp != 0);
            if sieved && (re + delta) % e != 1 {
                let mut cand = ok(start.to_owned());
                ok(cand.add_word(delta));
                if cand.num_bits() as usize == bits && ok(cand.is_prime_fasttest(64, ctx, false)) {
                    start.clear();
                    cand.set_const_time();
                    return cand;
                }
                cand.clear();
            }
            delta += 2;
        }
        start.clear();
    }
}

/// Clears a set of secret temporaries.
fn clear_all(bns: &mut [&mut BigNum]) {
    for b in bns {
        b.clear();
    }
}

/// Assembles the private key from its primes, or `None` if d is too small.
fn assemble(p: BigNum, q: BigNum, e: u32, ctx: &mut BigNumContextRef) -> Option<Rsa<Private>> {
    let half = p.num_bits();
    let one = ok(BigNum::from_u32(1));
    let e_bn = ok(BigNum::from_u32(e));
    let mut n = ok(BigNum::new());
    ok(n.checked_mul(&p, &q, ctx));
    let mut pm1 = ok(BigNum::new());
    ok(pm1.checked_sub(&p, &one));
    let mut qm1 = ok(BigNum::new());
    ok(qm1.checked_sub(&q, &one));
    pm1.set_const_time();
    qm1.set_const_time();
    // λ(n) = lcm(p-1, q-1) = (p-1)(q-1) / gcd(p-1, q-1).
    let mut g = ok(BigNum::new());
    ok(g.gcd(&pm1, &qm1, ctx));
    let mut phi = ok(BigNum::new());
    ok(phi.checked_mul(&pm1, &qm1, ctx));
    let mut lambda = ok(BigNum::new());
    ok(lambda.checked_div(&phi, &g, ctx));
    lambda.set_const_time();
    // gcd(e, λ) = 1 because p, q ≢ 1 (mod e) and e is prime.
    let mut d = ok(BigNum::new());
    ok(d.mod_inverse(&e_bn, &lambda, ctx));
    d.set_const_time();
    let mut dmp1 = ok(BigNum::new());
    ok(dmp1.nnmod(&d, &pm1, ctx));
    let mut dmq1 = ok(BigNum::new());
    ok(dmq1.nnmod(&d, &qm1, ctx));
    let mut iqmp = ok(BigNum::new());
    ok(iqmp.mod_inverse(&q, &p, ctx));
    clear_all(&mut [&mut pm1, &mut qm1, &mut g, &mut phi, &mut lambda]);
    if d.num_bits() <= half {
        clear_all(&mut [&mut d, &mut dmp1, &mut dmq1, &mut iqmp]);
        return None;
    }
    Some(ok(Rsa::from_private_components(n, e_bn, d, p, q, dmp1, dmq1, iqmp)))
}

/// An RSA signing key (PKCS#1 v1.5, SHA-256). OpenSSL frees its key material
/// with `BN_clear_free`; `Debug` shows only the scheme.
pub struct RsaSigner {
    key: PKey<Private>,
    scheme: SignatureId,
    verifier: Arc<RsaVerifier>,
}

impl fmt::Debug for RsaSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RsaSigner({})", self.scheme.name())
    }
}

impl RsaSigner {
    /// Generates a `bits`-bit key with public exponent `e` from the injected
    /// RNG (see the module doc). `bits` must be 1024 or 2048 and `e` 3 or
    /// 65537. Takes milliseconds at 1024 bits and tens to hundreds of
    /// milliseconds at 2048.
    pub fn generate(bits: u32, e: u32, rng: &mut dyn CryptoRngCore) -> Result<Self, CryptoError> {
        check_scheme(bits, e)?;
        let half = bits as usize / 2;
        let mut ctx = ok(BigNumContext::new());
        loop {
            let p = random_prime(half, e, rng, &mut ctx);
            let q = random_prime(half, e, rng, &mut ctx);
            let mut diff = ok(BigNum::new());
            ok(diff.checked_sub(&p, &q));
            let far_apart = diff.num_bits() as usize > half - 100;
            diff.clear();
            if !far_apart {
                continue;
            }
            // Conventionally p > q (iqmp = q⁻¹ mod p).
            let (p, q) = if p > q { (p, q) } else { (q, p) };
            if let Some(rsa) = assemble(p, q, e, &mut ctx) {
                return Self::from_rsa(rsa);
            }
        }
    }

    /// Wraps an OpenSSL key of a supported size and exponent.
    fn from_rsa(rsa: Rsa<Private>) -> Result<Self, CryptoError> {
        let scheme = scheme_of(&rsa)?;
        let public = ok(Rsa::from_public_components(ok(rsa.n().to_owned()), ok(rsa.e().to_owned())));
        let verifier = Arc::new(RsaVerifier::from_rsa(public)?);
        let key = ok(PKey::from_rsa(rsa));
        Ok(Self { key, scheme, verifier })
    }

    /// Parses an unencrypted PKCS#1 `RSA PRIVATE KEY` PEM block, checking
    /// the key's consistency (OpenSSL `RSA_check_key`) and that its size
    /// and exponent are supported.
    pub fn from_pem(pem: &[u8]) -> Result<Self, CryptoError> {
        let rsa = Rsa::private_key_from_pem(pem).map_err(key_err)?;
        scheme_of(&rsa)?;
        if !rsa.check_key().map_err(key_err)? {
            return Err(CryptoError::InvalidKey("inconsistent RSA private key".into()));
        }
        Self::from_rsa(rsa)
    }

    /// The key as an unencrypted PKCS#1 `RSA PRIVATE KEY` PEM block.
    pub fn to_pem(&self) -> Zeroizing<Vec<u8>> {
        Zeroizing::new(ok(ok(self.key.rsa()).private_key_to_pem()))
    }

    /// The public half.
    pub fn rsa_verifier(&self) -> &RsaVerifier {
        &self.verifier
    }
}

impl Signer for RsaSigner {
    fn scheme(&self) -> SignatureId {
        self.scheme
    }

    fn sign(&self, msg: &[u8]) -> Vec<u8> {
        super::tally::signature();
        let mut s = ok(openssl::sign::Signer::new(MessageDigest::sha256(), &self.key));
        ok(s.set_rsa_padding(Padding::PKCS1));
        ok(s.sign_oneshot_to_vec(msg))
    }

    fn verifier(&self) -> Arc<dyn Verifier> {
        self.verifier.clone()
    }
}

/// An RSA public key (PKCS#1 v1.5, SHA-256).
pub struct RsaVerifier {
    key: PKey<Public>,
    scheme: SignatureId,
    der: Vec<u8>,
    sig_len: usize,
}

impl fmt::Debug for RsaVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RsaVerifier({})", self.scheme.name())
    }
}

impl RsaVerifier {
    fn from_rsa(rsa: Rsa<Public>) -> Result<Self, CryptoError> {
        let scheme = scheme_of(&rsa)?;
        let der = ok(rsa.public_key_to_der_pkcs1());
        let sig_len = rsa.size() as usize;
        let key = ok(PKey::from_rsa(rsa));
        Ok(Self { key, scheme, der, sig_len })
    }

    /// Parses the DER of a PKCS#1 `RSAPublicKey` (as [`Verifier::public_bytes`]
    /// produces): canonical DER only, supported size and exponent only.
    pub fn from_der(der: &[u8]) -> Result<Self, CryptoError> {
        let rsa = Rsa::public_key_from_der_pkcs1(der).map_err(key_err)?;
        let v = Self::from_rsa(rsa)?;
        if v.der != der {
            return Err(CryptoError::InvalidKey("RSA public key is not canonical PKCS#1 DER".into()));
        }
        Ok(v)
    }

    /// The modulus, big-endian (for tests and diagnostics).
    pub fn modulus(&self) -> Vec<u8> {
        ok(ok(self.key.rsa()).n().to_vec_padded(self.sig_len as i32))
    }
}

impl Verifier for RsaVerifier {
    fn scheme(&self) -> SignatureId {
        self.scheme
    }

    fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError> {
        if sig.len() != self.sig_len {
            return Err(CryptoError::BadSignature);
        }
        super::tally::verifications(1);
        let mut v = ok(openssl::sign::Verifier::new(MessageDigest::sha256(), &self.key));
        ok(v.set_rsa_padding(Padding::PKCS1));
        match v.verify_oneshot(sig, msg) {
            Ok(true) => Ok(()),
            _ => Err(CryptoError::BadSignature),
        }
    }

    fn public_bytes(&self) -> Vec<u8> {
        self.der.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;
    use sha2::{Digest, Sha256};

    fn rng(seed: u64) -> rand_chacha::ChaCha20Rng {
        rand_chacha::ChaCha20Rng::seed_from_u64(seed)
    }

    fn key(bits: u32, e: u32, seed: u64) -> RsaSigner {
        RsaSigner::generate(bits, e, &mut rng(seed)).unwrap()
    }

    /// Checks everything about a fresh key and its signatures.
    fn check_key(s: &RsaSigner, bits: u32, e: u32) {
        assert_eq!(s.scheme(), SignatureId::Rsa { bits, e });
        let rsa = s.key.rsa().unwrap();
        assert!(rsa.check_key().unwrap());
        assert_eq!(rsa.n().num_bits() as u32, bits);
        assert_eq!(rsa.e(), &*BigNum::from_u32(e).unwrap());
        let (p, q) = (rsa.p().unwrap(), rsa.q().unwrap());
        assert_eq!((p.num_bits() as u32, q.num_bits() as u32), (bits / 2, bits / 2));
        assert!(p.is_bit_set(bits as i32 / 2 - 2) && q.is_bit_set(bits as i32 / 2 - 2), "top two bits set");
        assert!(p > q);

        let v = s.verifier();
        assert_eq!(v.scheme(), s.scheme());
        let msg = b"conclave rsa test message";
        let sig = s.sign(msg);
        assert_eq!(sig.len() as u32, bits / 8);
        assert_eq!(v.verify(msg, &sig), Ok(()));
        // PKCS#1 v1.5 is deterministic.
        assert_eq!(s.sign(msg), sig);
        for i in [0, sig.len() / 2, sig.len() - 1] {
            let mut bad = sig.clone();
            bad[i] ^= 0x10;
            assert_eq!(v.verify(msg, &bad), Err(CryptoError::BadSignature), "flipped byte {i}");
        }
        assert_eq!(v.verify(b"conclave rsa test messagf", &sig), Err(CryptoError::BadSignature));
        assert_eq!(v.verify(msg, &sig[1..]), Err(CryptoError::BadSignature));
        assert_eq!(v.verify(msg, &[sig.clone(), vec![0]].concat()), Err(CryptoError::BadSignature));
        assert_eq!(v.verify(msg, &[]), Err(CryptoError::BadSignature));
        assert_eq!(v.verify(msg, &vec![0; sig.len()]), Err(CryptoError::BadSignature));

        // The public key round-trips through its encoding.
        let v2 = RsaVerifier::from_der(&v.public_bytes()).unwrap();
        assert_eq!(v2.public_bytes(), v.public_bytes());
        assert_eq!(v2.scheme(), s.scheme());
        assert_eq!(v2.verify(msg, &sig), Ok(()));

        // Known answer independent of OpenSSL's padding code: sig^e mod n is
        // the EMSA-PKCS1-v1_5 encoding (RFC 8017 §9.2) of SHA-256(msg).
        let mut ctx = BigNumContext::new().unwrap();
        let mut m = BigNum::new().unwrap();
        m.mod_exp(&BigNum::from_slice(&sig).unwrap(), rsa.e(), rsa.n(), &mut ctx).unwrap();
        let k = bits as usize / 8;
        let digest_info: Vec<u8> =
            [&hex::decode("3031300d060960864801650304020105000420").unwrap()[..], &Sha256::digest(msg)].concat();
        let mut em = vec![0x00, 0x01];
        em.resize(k - digest_info.len() - 1, 0xff);
        em.push(0x00);
        em.extend_from_slice(&digest_info);
        assert_eq!(m.to_vec_padded(k as i32).unwrap(), em);
    }

    #[test]
    fn rsa1024_e3_round_trip() {
        check_key(&key(1024, 3, 1), 1024, 3);
    }

    #[test]
    fn rsa1024_e65537_round_trip() {
        check_key(&key(1024, 65537, 2), 1024, 65537);
    }

    /// The only 2048-bit key generation in the tests.
    #[test]
    fn rsa2048_round_trip_and_pem() {
        let s = key(2048, 3, 3);
        check_key(&s, 2048, 3);
        let pem = s.to_pem();
        assert!(pem.starts_with(b"-----BEGIN RSA PRIVATE KEY-----"));
        let s2 = RsaSigner::from_pem(&pem).unwrap();
        assert_eq!(s2.verifier().public_bytes(), s.verifier().public_bytes());
        assert_eq!(s2.sign(b"m"), s.sign(b"m"));
    }

    #[test]
    fn wrong_key_fails() {
        let (a, b) = (key(1024, 65537, 4), key(1024, 65537, 5));
        assert_ne!(a.verifier().public_bytes(), b.verifier().public_bytes());
        let sig = a.sign(b"hello");
        assert_eq!(b.verifier().verify(b"hello", &sig), Err(CryptoError::BadSignature));
        // Same modulus, other exponent: a different key too.
        let c = key(1024, 3, 4);
        assert_eq!(c.verifier().verify(b"hello", &sig), Err(CryptoError::BadSignature));
    }

    #[test]
    fn seeded_generation_is_deterministic() {
        let a = key(1024, 65537, 42);
        let b = key(1024, 65537, 42);
        assert_eq!(a.verifier().public_bytes(), b.verifier().public_bytes());
        assert_eq!(a.to_pem(), b.to_pem());
        assert_ne!(key(1024, 65537, 43).verifier().public_bytes(), a.verifier().public_bytes());
        // Pins the generation procedure: seeded identities of recorded runs
        // change if it does.
        let fp = hex::encode(Sha256::digest(a.verifier().public_bytes()));
        assert_eq!(fp, PINNED_1024_65537_SEED_42);
    }

    const PINNED_1024_65537_SEED_42: &str = "1b7c04c5123cabbc29dd5ecf109a6b1d3fe990cefcf81fb5cb56010ddf2f470f";

    #[test]
    fn unsupported_parameters_are_rejected() {
        for (bits, e) in
            [(512, 65537), (1536, 65537), (3072, 65537), (4096, 3), (1024, 5), (2048, 17), (1024, 1), (1024, 0)]
        {
            assert!(matches!(RsaSigner::generate(bits, e, &mut rng(0)), Err(CryptoError::InvalidKey(_))), "{bits}/{e}");
        }
        // Keys of unsupported shape made elsewhere are refused on import.
        let odd_size = Rsa::generate(1536).unwrap();
        let odd_e = Rsa::generate_with_e(1024, &BigNum::from_u32(17).unwrap()).unwrap();
        for (what, rsa) in [("1536 bits", odd_size), ("e = 17", odd_e)] {
            let der = rsa.public_key_to_der_pkcs1().unwrap();
            assert!(matches!(RsaVerifier::from_der(&der), Err(CryptoError::InvalidKey(_))), "{what}");
            let pem = rsa.private_key_to_pem().unwrap();
            assert!(matches!(RsaSigner::from_pem(&pem), Err(CryptoError::InvalidKey(_))), "{what}");
        }
    }

    #[test]
    fn malformed_public_keys_are_rejected() {
        let s = key(1024, 3, 6);
        let der = s.verifier().public_bytes();
        let spki = s.key.rsa().unwrap().public_key_to_der().unwrap();
        assert_ne!(spki, der);
        for (what, bad) in [
            ("empty", vec![]),
            ("truncated", der[..der.len() - 1].to_vec()),
            ("trailing byte", [der.clone(), vec![0]].concat()),
            ("SubjectPublicKeyInfo", spki),
            ("garbage", vec![0x30, 0x03, 0x02, 0x01, 0x05]),
        ] {
            assert!(matches!(RsaVerifier::from_der(&bad), Err(CryptoError::InvalidKey(_))), "{what}");
        }
        assert!(matches!(RsaSigner::from_pem(b"not a key"), Err(CryptoError::InvalidKey(_))));
    }

    #[test]
    fn generate_signer_dispatches_and_debug_is_opaque() {
        let s = super::super::generate_signer(SignatureId::Rsa { bits: 1024, e: 3 }, &mut rng(8)).unwrap();
        assert_eq!(s.scheme(), SignatureId::Rsa { bits: 1024, e: 3 });
        assert_eq!(format!("{s:?}"), "Signer(rsa1024e3)");
        let sig = s.sign(b"x");
        assert_eq!(s.verifier().verify(b"x", &sig), Ok(()));
        let k = key(1024, 3, 8);
        assert_eq!(format!("{k:?}"), "RsaSigner(rsa1024e3)");
        assert_eq!(format!("{:?}", k.rsa_verifier()), "RsaVerifier(rsa1024e3)");
        assert_eq!(k.verifier().public_bytes(), s.verifier().public_bytes());
    }

    #[test]
    fn small_prime_table() {
        let p = small_primes();
        assert_eq!(&p[..5], &[3, 5, 7, 11, 13]);
        assert_eq!(*p.last().unwrap(), 16381);
        assert_eq!(p.len(), 1899);
    }

    /// Prints key generation, signing and verification costs (per-thread CPU time):
    /// `cargo nextest run -p conclave-gka rsa::tests::timing --run-ignored only --no-capture`.
    #[test]
    #[ignore = "timing; prints, asserts nothing"]
    fn timing() {
        // This thread's CPU time in ns (Linux): other processes share the machine.
        let now = || -> u64 {
            let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("Linux schedstat");
            s.split_whitespace().next().unwrap().parse().unwrap()
        };
        let ms_since = |t: u64, n: u32| (now() - t) as f64 / 1e6 / f64::from(n);
        for scheme in SignatureId::ALL {
            let SignatureId::Rsa { bits, e } = scheme else { continue };
            let mut r = rng(100);
            let t = now();
            let n_keys = if bits == 1024 { 10 } else { 3 };
            let keys: Vec<_> = (0..n_keys).map(|_| RsaSigner::generate(bits, e, &mut r).unwrap()).collect();
            let keygen = ms_since(t, n_keys);
            let s = &keys[0];
            let v = s.verifier();
            let msg = [7u8; 200];
            let sig = s.sign(&msg);
            let n = if bits == 1024 { 2000 } else { 300 };
            let t = now();
            for _ in 0..n {
                std::hint::black_box(s.sign(&msg));
            }
            let sign = ms_since(t, n) * 1e3;
            let t = now();
            for _ in 0..n * 10 {
                v.verify(&msg, &sig).unwrap();
            }
            let verify = ms_since(t, n * 10) * 1e3;
            println!("{:>12}: keygen {keygen:7.1} ms, sign {sign:6.1} µs, verify {verify:5.1} µs", scheme.name());
        }
    }
}
