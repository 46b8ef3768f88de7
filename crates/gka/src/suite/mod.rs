//! Crypto suites: the prime-order group the protocols compute in and the
//! signature scheme that authenticates their messages, chosen per group.
//!
//! Protocol engines are generic over [`Group`]; signatures are trait objects
//! ([`Signer`], [`Verifier`]) because identities come from outside (files,
//! certificates) and every member of a group may verify with the same code
//! whatever engine type runs.
//!
//! # Turning group elements into exponents
//! TGDH and STR use a node's secret *element* as the exponent one level up,
//! CKD uses the pairwise Diffie-Hellman element as the exponent that hides the
//! group secret. Elements are not exponents, so [`Group::hash_to_scalar`] maps
//! them: SHA-512 over a domain tag (`conclave/gka/v1/` + protocol + purpose),
//! the group name and the canonical element encoding, reduced modulo the group
//! order (for a 512-bit digest and an order of at most 256 bits the bias is
//! below 2^-256). Distinct tags keep, e.g., TGDH node keys and CKD channel keys
//! unrelated even when built from equal elements.

pub mod ed25519;
pub(crate) mod memo;
pub mod modp;
pub mod ristretto;
pub mod rsa;
pub mod tally;

use std::fmt;
use std::sync::Arc;

use rand_core::CryptoRngCore;
use zeroize::Zeroize;

/// Errors from the crypto suite.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    /// Bytes that do not encode a valid element of the group (wrong length,
    /// not canonical, outside the prime-order subgroup, or the identity).
    #[error("invalid group element")]
    InvalidElement,
    /// A signature that does not verify.
    #[error("bad signature")]
    BadSignature,
    /// A key that cannot be parsed or is of the wrong kind.
    #[error("invalid key: {0}")]
    InvalidKey(String),
}

/// A prime-order group and its exponent field: what every protocol computes in.
///
/// All exponentiations go through these methods so the cost meter sees them;
/// secret exponents are [`Zeroize`] and never printed.
pub trait Group: Clone + Send + Sync + 'static {
    /// A group element (public, or a secret when it is a node key).
    type Element: Clone + PartialEq + Send + Sync + Zeroize + 'static;
    /// An exponent modulo the group order.
    type Scalar: Clone + Send + Sync + Zeroize + 'static;
    /// [`Group::encode`]'s output held by value (inline where the length is
    /// fixed at compile time), kept beside elements that are compared or
    /// sent often.
    type Encoding: AsRef<[u8]> + Clone + PartialEq + Send + Sync + 'static;

    /// Which group this is.
    fn id(&self) -> GroupId;
    /// A uniformly random non-zero exponent.
    fn random_scalar(&self, rng: &mut dyn CryptoRngCore) -> Self::Scalar;
    /// g^s, with the group's generator.
    fn exp_generator(&self, s: &Self::Scalar) -> Self::Element;
    /// base^s.
    fn exp(&self, base: &Self::Element, s: &Self::Scalar) -> Self::Element;
    /// base^e for a small non-negative integer e (BD step 3).
    fn exp_small(&self, base: &Self::Element, e: u64) -> Self::Element;
    /// a·b in the group.
    fn mul(&self, a: &Self::Element, b: &Self::Element) -> Self::Element;
    /// a/b in the group.
    fn div(&self, a: &Self::Element, b: &Self::Element) -> Self::Element;
    /// The group's identity element.
    fn identity(&self) -> Self::Element;
    /// a·b modulo the order.
    fn scalar_mul(&self, a: &Self::Scalar, b: &Self::Scalar) -> Self::Scalar;
    /// 1/a modulo the order (exponents are never zero).
    fn scalar_invert(&self, a: &Self::Scalar) -> Self::Scalar;
    /// The integer n as an exponent.
    fn scalar_from_u64(&self, n: u64) -> Self::Scalar;
    /// Hashes an element to an exponent under a domain tag (see the module doc).
    fn hash_to_scalar(&self, domain: &[u8], e: &Self::Element) -> Self::Scalar;
    /// Canonical, fixed-length encoding.
    fn encode(&self, e: &Self::Element) -> Vec<u8>;
    /// Decodes and validates an element received from the network: canonical,
    /// in the prime-order subgroup, not the identity.
    fn decode(&self, bytes: &[u8]) -> Result<Self::Element, CryptoError>;
    /// Decodes an element received from the network that is only
    /// multiplied and raised to *public* exponents before the result is
    /// checked with [`Group::in_subgroup`]: canonical and not the identity,
    /// as [`Group::decode`], without its prime-order subgroup check (an
    /// exponentiation in a MODP group; nothing in ristretto255, whose every
    /// element has prime order). Never raise such an element to a secret
    /// exponent: outside the subgroup it would give away the exponent
    /// modulo the cofactor's small factors (Lim–Lee).
    fn decode_unchecked(&self, bytes: &[u8]) -> Result<Self::Element, CryptoError>;
    /// Whether `e` lies in the prime-order subgroup (see
    /// [`Group::decode_unchecked`]).
    fn in_subgroup(&self, e: &Self::Element) -> bool;
    /// Whether the group has no elements outside its prime-order subgroup
    /// (ristretto255): [`Group::decode_unchecked`] is then
    /// [`Group::decode`], and [`Group::in_subgroup`] always holds.
    fn prime_order(&self) -> bool;
    /// [`Group::encode`], as an [`Group::Encoding`].
    fn encoding(&self, e: &Self::Element) -> Self::Encoding;
    /// Bytes [`Group::decode`] accepted, as an [`Group::Encoding`]; `None` if
    /// they are not [`Group::element_len`] long.
    fn encoding_of(&self, bytes: &[u8]) -> Option<Self::Encoding>;
    /// Length of [`Group::encode`]'s output.
    fn element_len(&self) -> usize;
    /// Canonical encoding of an exponent (for tests that model an attacker).
    fn encode_scalar(&self, s: &Self::Scalar) -> Vec<u8>;
    /// Decodes [`Group::encode_scalar`]'s output (for tests that model an attacker).
    fn decode_scalar(&self, bytes: &[u8]) -> Option<Self::Scalar>;
}

/// The groups Conclave offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupId {
    /// ristretto255 (RFC 9496): the default.
    Ristretto255,
    /// 512-bit p, 160-bit q. Insecure; for reproducing the paper only.
    Modp512,
    /// RFC 5114 §2.1: 1024-bit p, 160-bit q. Insecure; for reproduction only.
    Modp1024,
    /// RFC 5114 §2.3: 2048-bit p, 256-bit q.
    Modp2048,
}

impl GroupId {
    /// Every group, default first.
    pub const ALL: [GroupId; 4] = [Self::Ristretto255, Self::Modp512, Self::Modp1024, Self::Modp2048];

    /// Short name used on the command line and in messages.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ristretto255 => "ristretto255",
            Self::Modp512 => "modp512",
            Self::Modp1024 => "modp1024",
            Self::Modp2048 => "modp2048",
        }
    }

    /// Parses [`GroupId::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == s)
    }

    /// Whether the group is too small for real use (kept for reproduction).
    pub fn insecure(self) -> bool {
        matches!(self, Self::Modp512 | Self::Modp1024)
    }

    /// Wire code.
    pub fn code(self) -> u8 {
        match self {
            Self::Ristretto255 => 1,
            Self::Modp512 => 2,
            Self::Modp1024 => 3,
            Self::Modp2048 => 4,
        }
    }
}

/// Signature schemes Conclave offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SignatureId {
    /// Ed25519 (RFC 8032): the default.
    Ed25519,
    /// RSA PKCS#1 v1.5 with SHA-256, modulus bits and public exponent.
    Rsa {
        /// Modulus size: 1024 or 2048.
        bits: u32,
        /// Public exponent: 3 or 65537.
        e: u32,
    },
}

impl SignatureId {
    /// Every scheme, default first.
    pub const ALL: [SignatureId; 5] = [
        Self::Ed25519,
        Self::Rsa { bits: 1024, e: 3 },
        Self::Rsa { bits: 1024, e: 65537 },
        Self::Rsa { bits: 2048, e: 3 },
        Self::Rsa { bits: 2048, e: 65537 },
    ];

    /// Short name used on the command line.
    pub fn name(self) -> String {
        match self {
            Self::Ed25519 => "ed25519".into(),
            Self::Rsa { bits, e } => format!("rsa{bits}e{e}"),
        }
    }

    /// Parses [`SignatureId::name`].
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|g| g.name() == s)
    }
}

/// Signs protocol messages with a member's long-term identity key.
pub trait Signer: Send + Sync {
    /// The scheme.
    fn scheme(&self) -> SignatureId;
    /// Signs `msg`.
    fn sign(&self, msg: &[u8]) -> Vec<u8>;
    /// The matching public key.
    fn verifier(&self) -> Arc<dyn Verifier>;
}

/// Verifies a member's signatures.
pub trait Verifier: Send + Sync {
    /// The scheme.
    fn scheme(&self) -> SignatureId;
    /// Checks `sig` over `msg`.
    fn verify(&self, msg: &[u8], sig: &[u8]) -> Result<(), CryptoError>;
    /// The public key's canonical encoding.
    fn public_bytes(&self) -> Vec<u8>;
    /// The key as an Ed25519 key, for [`verify_batch`].
    fn as_ed25519(&self) -> Option<&ed25519::Ed25519Verifier> {
        None
    }
}

/// Checks many signatures at once: `(key, message, signature)` each. When
/// every key is Ed25519 they are checked together (ed25519-dalek's batch
/// verification: deterministic, about half the cost per signature for a
/// few dozen); otherwise one by one. `Ok` only if every signature is valid;
/// which one failed is for the caller to find out, one by one.
///
/// A batch accepts what `Verifier::verify` accepts, and may also accept a
/// signature whose R has a small-order component, which strict single
/// verification refuses: nobody without the signing key can make either.
pub fn verify_batch(items: &[(&dyn Verifier, &[u8], &[u8])]) -> Result<(), CryptoError> {
    if items.len() < 2 || items.iter().any(|(k, _, _)| k.as_ed25519().is_none()) {
        return items.iter().try_for_each(|(k, msg, sig)| k.verify(msg, sig));
    }
    tally::batch_verifications(items.len());
    ed25519::verify_batch(items)
}

impl fmt::Debug for dyn Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Signer({})", self.scheme().name())
    }
}

/// Generates a fresh identity key for a scheme.
pub fn generate_signer(scheme: SignatureId, rng: &mut dyn CryptoRngCore) -> Result<Arc<dyn Signer>, CryptoError> {
    match scheme {
        SignatureId::Ed25519 => Ok(Arc::new(ed25519::Ed25519Signer::generate(rng))),
        SignatureId::Rsa { bits, e } => Ok(Arc::new(rsa::RsaSigner::generate(bits, e, rng)?)),
    }
}
