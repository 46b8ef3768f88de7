//! The five key agreement protocols of the TISSEC paper (§4).
//!
//! Each is a [`crate::engine::Protocol`] driven by the shared runner; see each
//! module for the protocol, its messages and how it recovers from cascaded
//! membership events.
//!
//! # Adding a protocol
//!
//! 1. A module here with a type implementing [`crate::engine::Protocol`]:
//!    `on_view` starts a run from the last secure state ([`crate::engine`]'s
//!    `Change` says who shares it), `on_message` validates a whole body
//!    before changing anything, and the final message of a run calls
//!    `Ctx::install` at every member on the same delivery. `reset` must
//!    forget everything: [`crate::Engine::rekey`] and `restart` rely on it to
//!    run a view again as a merge of singletons. Use `Ctx`'s metered
//!    `exp`/`exp_g` and `broadcast`/`unicast` only (the meter and the
//!    signatures live there), and the injected RNG through `Ctx::random`.
//! 2. A [`crate::ProtocolId`] variant with its name and wire code (and in
//!    `ProtocolId::ALL`), and an arm in `engine_in` (`lib.rs`).
//! 3. The module doc: rounds, messages, how it differs from Tables I and II,
//!    its cascade behaviour and its validation rules; unit tests of the table
//!    counts through `testnet`.
//! 4. Everything that iterates `ProtocolId::ALL` covers it at once: the
//!    property tests, the rekey and cross-lifetime tests below, the secure
//!    layer's end-to-end tests, `conclave sim`, `bench counts`. Places that
//!    name protocols one by one: the hash domains in `testing.rs`, the
//!    adversarial and independence tests, and the paper's tables in
//!    `conclave-bench` (`paper.rs`).

pub mod bd;
pub mod ckd;
pub mod gdh;
pub mod seal;
pub mod str;
#[cfg(test)]
pub(crate) mod testnet;
pub mod tgdh;

use conclave_gcs::view::MAX_MEMBER_NAME;
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

/// Reads a group element without its subgroup check (see
/// [`Group::decode_unchecked`]): only for elements that are multiplied and
/// raised to public exponents before the result is checked.
pub(crate) fn get_elem_unchecked<G: Group>(r: &mut Reader<'_>, g: &G) -> Result<G::Element, Error> {
    let b = r.bytes(g.element_len(), "group element")?;
    Ok(g.decode_unchecked(b)?)
}

/// Writes a member name.
pub(crate) fn put_member(w: &mut Writer, m: &MemberId) {
    w.short_bytes(m.as_str().as_bytes());
}

/// Reads a member name as text, without checking it as a name: for names
/// that are looked up among a view's members (a name that is not a
/// member's is refused there), with no allocation.
pub(crate) fn get_name<'a>(r: &mut Reader<'a>) -> Result<&'a str, Error> {
    let b = r.short_bytes(MAX_MEMBER_NAME, "member name")?;
    Ok(std::str::from_utf8(b).map_err(|_| DecodeError::Bad("member name"))?)
}

/// Reads a member name.
pub(crate) fn get_member(r: &mut Reader<'_>) -> Result<MemberId, Error> {
    let b = r.short_bytes(255, "member name")?;
    let s = std::str::from_utf8(b).map_err(|_| DecodeError::Bad("member name"))?;
    MemberId::from_name(s).map_err(|_| Error::Decode(DecodeError::Bad("member name")))
}

#[cfg(test)]
mod tests {
    use super::testnet::{id, Net};
    use crate::engine::Error;
    use crate::key::Epoch;
    use crate::ProtocolId;

    #[test]
    fn a_rekey_gives_every_protocol_a_new_key_in_the_same_view_and_refuses_the_old_runs_messages() {
        let names = ["a", "b", "c", "d", "e"];
        for p in ProtocolId::ALL {
            let mut net = Net::new(p, &names, 11);
            net.install(1, &names.map(|n| (n, None)));
            net.run();
            let first = net.agreed();
            // A message of run 0, kept by an insider to replay after the rekey.
            let old = net.forge("b", None, 1, vec![0; 8]);
            net.rekey();
            assert!(net.engine("a").in_progress(), "{p}: a rekey starts a run");
            net.run();
            let second = net.agreed();
            assert_ne!(first, second, "{p}: the rekey must give a new key");
            let sv = net.engine("c").secure_view().unwrap().clone();
            assert_eq!(sv.epoch, Epoch::new(sv.view_id, 1), "{p}: run 1 of the same view");
            assert_eq!(sv.members.to_vec(), names.map(id), "{p}");
            assert!(matches!(net.refuse("a", &old), Error::WrongRun { got: 0, current: 1 }), "{p}");
        }
    }

    #[test]
    fn messages_recorded_in_one_daemon_lifetime_are_refused_in_the_next() {
        // The same members, view counter and run in two daemon lifetimes:
        // only the incarnation differs, and it is enough.
        let names = ["a", "b", "c"];
        for p in ProtocolId::ALL {
            let mut first = Net::new(p, &names, 5);
            let recorded = first.install_in(1, 1, &names.map(|n| (n, None)));
            let mut second = Net::new(p, &names, 5);
            second.install_in(2, 1, &names.map(|n| (n, None)));
            for packet in recorded.iter().filter(|pk| pk.from.as_str() != "a") {
                let err = second.refuse("a", packet);
                assert!(matches!(err, Error::WrongView { .. }), "{p}: {err}");
            }
        }
    }
}
