//! The five key agreement protocols of the TISSEC paper (§4).
//!
//! Each is a [`crate::engine::Protocol`] driven by the shared runner; see each
//! module for the protocol, its messages and how it recovers from cascaded
//! membership events.

pub mod bd;
pub mod ckd;
pub mod gdh;
pub mod str;
#[cfg(test)]
pub(crate) mod testnet;
pub mod tgdh;

use conclave_gcs::MemberId;

use crate::codec::{DecodeError, Reader, Writer};
use crate::engine::Error;
use crate::suite::Group;

/// Most members a message may list (bounded so decoding cannot blow up).
pub(crate) const MAX_MEMBERS: usize = 4096;

/// Writes a canonical element encoding.
pub(crate) fn put_elem<G: Group>(w: &mut Writer, g: &G, e: &G::Element) {
    w.raw(&g.encode(e));
}

/// Reads and validates an element.
pub(crate) fn get_elem<G: Group>(r: &mut Reader<'_>, g: &G) -> Result<G::Element, Error> {
    let b = r.bytes(g.element_len(), "group element")?;
    Ok(g.decode(b)?)
}

/// Writes a member name.
pub(crate) fn put_member(w: &mut Writer, m: &MemberId) {
    w.short_bytes(m.as_str().as_bytes());
}

/// Reads a member name.
pub(crate) fn get_member(r: &mut Reader<'_>) -> Result<MemberId, Error> {
    let b = r.short_bytes(255, "member name")?;
    let s = std::str::from_utf8(b).map_err(|_| DecodeError::Bad("member name"))?;
    MemberId::new(s).map_err(|_| Error::Decode(DecodeError::Bad("member name")))
}
