//! RSA signatures (placeholder while the OpenSSL backend is written).

use std::sync::Arc;

use rand_core::CryptoRngCore;

use super::{CryptoError, SignatureId, Signer, Verifier};

/// An RSA signing key.
pub struct RsaSigner;

impl RsaSigner {
    /// Generates a key.
    pub fn generate(_bits: u32, _e: u32, _rng: &mut dyn CryptoRngCore) -> Result<Self, CryptoError> {
        Err(CryptoError::InvalidKey("RSA not available yet".into()))
    }
}

impl Signer for RsaSigner {
    fn scheme(&self) -> SignatureId {
        todo!()
    }
    fn sign(&self, _msg: &[u8]) -> Vec<u8> {
        todo!()
    }
    fn verifier(&self) -> Arc<dyn Verifier> {
        todo!()
    }
}
