// Derives the 512-bit MODP group (512-bit p, 160-bit q) that
// `conclave_gka::suite::modp` embeds for `GroupId::Modp512`, and prints it.
//
//     cargo run -p conclave-gka --example gen_modp512
//
// The procedure is documented in `docs/modp512.md`; the unit tests of
// `suite::modp` include this file and check that the embedded constants are
// exactly what `derive_modp512` returns. Keep it free of inner attributes and
// `//!` comments so that `include!` works.
//
// The group is far too small for real use: it exists only to reproduce the
// measurements of the original paper, which used 512-bit moduli.

use openssl::bn::{BigNum, BigNumContext};
use sha2::{Digest, Sha256, Sha512};

/// Seed for q: the first 20 bytes (160 bits) of SHA-256 of this string.
pub const MODP512_Q_SEED: &[u8] = b"conclave modp512 q";
/// Seed for the search start of p: SHA-512 (512 bits) of this string.
pub const MODP512_P_SEED: &[u8] = b"conclave modp512 p";
/// Miller-Rabin rounds for every primality test (error below 2^-128).
pub const MODP512_MR_ROUNDS: i32 = 64;

/// The derived group and how the search ended.
pub struct Modp512Derivation {
    /// The 512-bit prime modulus.
    pub p: BigNum,
    /// The 160-bit prime order of the subgroup.
    pub q: BigNum,
    /// The generator of the order-q subgroup.
    pub g: BigNum,
    /// The cofactor: p = k·q + 1.
    pub k: BigNum,
    /// The base that gave g = h^((p-1)/q) mod p.
    pub h: u32,
}

/// Runs the documented derivation (a few milliseconds).
pub fn derive_modp512() -> Modp512Derivation {
    let mut ctx = BigNumContext::new().unwrap();

    // Step 1: q is the first prime >= the 160-bit seed with its top and
    // bottom bits set, searching upwards over odd numbers.
    let digest = Sha256::digest(MODP512_Q_SEED);
    let mut q = BigNum::from_slice(&digest[..20]).unwrap();
    q.set_bit(159).unwrap();
    q.set_bit(0).unwrap();
    while !q.is_prime_fasttest(MODP512_MR_ROUNDS, &mut ctx, true).unwrap() {
        q.add_word(2).unwrap();
    }
    assert_eq!(q.num_bits(), 160, "q left 160 bits");

    // Step 2: p = k·q + 1 for the first even k >= ceil(start / q), where start
    // is the 512-bit seed with its top bit set; k steps by 2 (p stays odd).
    let digest = Sha512::digest(MODP512_P_SEED);
    let mut start = BigNum::from_slice(&digest).unwrap();
    start.set_bit(511).unwrap();
    let mut k = BigNum::new().unwrap();
    let mut rem = BigNum::new().unwrap();
    k.div_rem(&mut rem, &start, &q, &mut ctx).unwrap();
    if rem.num_bits() != 0 {
        k.add_word(1).unwrap();
    }
    if k.is_bit_set(0) {
        k.add_word(1).unwrap();
    }
    let mut p = BigNum::new().unwrap();
    loop {
        p.checked_mul(&k, &q, &mut ctx).unwrap();
        p.add_word(1).unwrap();
        assert_eq!(p.num_bits(), 512, "p left 512 bits");
        if p.is_prime_fasttest(MODP512_MR_ROUNDS, &mut ctx, true).unwrap() {
            break;
        }
        k.add_word(2).unwrap();
    }

    // Step 3: g = h^((p-1)/q) mod p = h^k mod p for the first h = 2, 3, ...
    // with g != 1; g then has order exactly q because q is prime.
    let mut g = BigNum::new().unwrap();
    let mut h = 2u32;
    loop {
        let base = BigNum::from_u32(h).unwrap();
        g.mod_exp(&base, &k, &p, &mut ctx).unwrap();
        if g.num_bits() != 1 {
            break;
        }
        h += 1;
    }

    Modp512Derivation { p, q, g, k, h }
}

#[allow(dead_code)]
fn main() {
    let d = derive_modp512();
    println!("p = {}", d.p.to_hex_str().unwrap());
    println!("q = {}", d.q.to_hex_str().unwrap());
    println!("g = {}", d.g.to_hex_str().unwrap());
    println!("k = (p-1)/q = {}", d.k.to_hex_str().unwrap());
    println!("h = {}", d.h);
}
