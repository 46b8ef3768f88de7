//! Gdh: under construction.

use std::marker::PhantomData;

use conclave_gcs::MemberId;

use crate::engine::{Change, Ctx, Error, Protocol};
use crate::suite::Group;
use crate::ProtocolId;

/// One member's Gdh state.
pub struct Gdh<G: Group>(PhantomData<G>);

impl<G: Group> Protocol<G> for Gdh<G> {
    const ID: ProtocolId = ProtocolId::Gdh;
    fn new() -> Self {
        Self(PhantomData)
    }
    fn reset(&mut self) {}
    fn on_view(&mut self, _cx: &mut Ctx<'_, G>, _change: &Change) -> Result<(), Error> {
        Err(Error::Unexpected("not implemented yet"))
    }
    fn on_message(&mut self, _cx: &mut Ctx<'_, G>, _from: &MemberId, _round: u8, _body: &[u8]) -> Result<(), Error> {
        Err(Error::Unexpected("not implemented yet"))
    }
    fn secrets(&self) -> (Vec<G::Scalar>, Vec<G::Element>) {
        (Vec::new(), Vec::new())
    }
    fn public_elements(_g: &G, _round: u8, _body: &[u8]) -> Result<Vec<G::Element>, Error> {
        Ok(Vec::new())
    }
}
