//! MODP prime-order subgroups (placeholder while the OpenSSL backend is written).

use rand_core::CryptoRngCore;

use super::{CryptoError, Group, GroupId};

/// A MODP group.
#[derive(Clone, Debug)]
pub struct Modp {
    id: GroupId,
}

impl Modp {
    /// The group `id` (one of the MODP ids).
    pub fn new(id: GroupId) -> Self {
        Self { id }
    }
}

impl Group for Modp {
    type Element = Vec<u8>;
    type Scalar = Vec<u8>;
    fn id(&self) -> GroupId {
        self.id
    }
    fn random_scalar(&self, _rng: &mut dyn CryptoRngCore) -> Vec<u8> {
        todo!()
    }
    fn exp_generator(&self, _s: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn exp(&self, _b: &Vec<u8>, _s: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn exp_small(&self, _b: &Vec<u8>, _e: u64) -> Vec<u8> {
        todo!()
    }
    fn mul(&self, _a: &Vec<u8>, _b: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn div(&self, _a: &Vec<u8>, _b: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn identity(&self) -> Vec<u8> {
        todo!()
    }
    fn scalar_mul(&self, _a: &Vec<u8>, _b: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn scalar_invert(&self, _a: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn scalar_from_u64(&self, _n: u64) -> Vec<u8> {
        todo!()
    }
    fn hash_to_scalar(&self, _d: &[u8], _e: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn encode(&self, _e: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn decode(&self, _b: &[u8]) -> Result<Vec<u8>, CryptoError> {
        todo!()
    }
    fn element_len(&self) -> usize {
        todo!()
    }
    fn encode_scalar(&self, _s: &Vec<u8>) -> Vec<u8> {
        todo!()
    }
    fn decode_scalar(&self, _b: &[u8]) -> Option<Vec<u8>> {
        todo!()
    }
}
