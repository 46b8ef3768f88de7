//! Received payloads: how a session takes apart the bytes the daemon hands
//! it, and [`parse_payload`], which runs those same steps without a session.
//!
//! Every payload this layer puts on a daemon group starts with a one-byte
//! [`tag`]; the layout of the rest depends on the tag (integers big-endian):
//!
//! | tag | kind | channel | rest |
//! |---|---|---|---|
//! | 1 | key agreement | both | `u8 protocol ‖ u8 group ‖ engine message` |
//! | 2 | data | multicast | `header ‖ u16 length ‖ signature ‖ ciphertext` ([`crate::data`]) |
//! | 3 | policy | unicast | `view ‖ u8 protocol ‖ u8 group ‖ signature` |
//! | 4 | certificate | multicast | `view ‖ u16 length ‖ certificate DER ‖ signature` |
//! | 5 | timeout | multicast | `view ‖ u16 length ‖ signature ‖ (u8 length ‖ name)*` |
//! | 6 | refusal | unicast | `view ‖ refusal` |
//! | 7 | key confirmation | unicast | `epoch ‖ 32-byte MAC ‖ signature` |
//! | 8 | three-step data | multicast | `data`, in clear to the daemon (three-step groups only) |
//! | 9 | Optimized EVS data | multicast | an envelope (`conclave_integrated::evs`) sealing `u8 length ‖ sender ‖ view ‖ u64 seq ‖ u16 length ‖ signature ‖ data` |
//! | 10 | key confirmation verdict | multicast | `epoch ‖ 32-byte MAC ‖ u16 length ‖ signature ‖ (u8 length ‖ name)*` |
//!
//! Confirmations and verdicts of groups the daemons key carry an empty
//! signature ([`crate::confirm`]).
//!
//! `view` is a view id in 16 bytes (daemon incarnation, counter: see
//! [`ViewId`]); `epoch` is 20 ([`Epoch`]: the view id and the run).
//!
//! A session first splits a payload at its tag (the framing step below);
//! malformed framing is reported as [`RejectReason::Malformed`]. It then
//! decodes the rest with the decoder of its kind — [`DataHeader::decode`]
//! and [`EpochKeys::open`], [`Refusal`]'s decoder, the certificate
//! message's split and the certificate's parse (the parsing half of
//! [`Authority::verify`](crate::trust::Authority::verify)), the timeout
//! notice's name list, the policy codes — and hands key agreement messages
//! to the engine, which starts with
//! [`Envelope::decode`](conclave_gka::message::Envelope::decode).
//!
//! [`parse_payload`] runs all of these pure parsing steps on any bytes, with
//! no daemon, session, group key or authority, so the decoders can be fuzzed
//! (`fuzz/fuzz_targets/secure_payload.rs`) and property-tested
//! (`tests/decoders.rs`). It calls the very functions a session calls; what
//! it leaves out needs live state: the checks against the current view,
//! epoch and members, the authority's chain and revocation check, and the
//! key agreement engines' body decoders (fuzzed by the `protocol_message`
//! target of `conclave-gka`).
//!
//! [`RejectReason::Malformed`]: crate::RejectReason::Malformed

use conclave_gcs::core::GroupMode;
use conclave_gka::codec::DecodeError;
use conclave_gka::key::EPOCH_LEN;
use conclave_gka::message::Envelope;
use conclave_gka::{Epoch, GroupId, ProtocolId, ViewId};
use rustls_pki_types::CertificateDer;

use crate::data::{DataError, DataHeader, EpochKeys};
use crate::trust::{MemberCert, Refusal};
use crate::Policy;

/// Payload tags: the first byte of every payload this layer puts on a daemon group.
pub mod tag {
    /// A key agreement message: `tag ‖ protocol code ‖ group code ‖ engine
    /// bytes`; the codes are the group's policy ([`crate::Policy::codes`]:
    /// the protocol code has [`super::UNSIGNED_DATA`] set if data messages
    /// are not signed).
    pub const KA: u8 = 1;
    /// A data message, a bundle of one or more application messages: `tag ‖
    /// header ‖ lengths ‖ ciphertext ‖ AEAD tag ‖ signature ‖ u16 signature
    /// length` (see
    /// [`crate::data`]; no signature and length 0 if the group's policy has
    /// sender signatures off).
    pub const DATA: u8 = 2;
    /// The oldest member telling a newcomer the group's policy differs from
    /// its own (unicast): `tag ‖ view ‖ protocol code ‖ group code ‖
    /// signature` by the sender's identity key (an unsigned notice from
    /// anyone could otherwise talk newcomers out of a group).
    pub const POLICY: u8 = 3;
    /// A member presenting its certificate in a view (agreed multicast):
    /// `tag ‖ view ‖ u16 length ‖ certificate DER ‖ Ed25519 signature`
    /// binding the certificate to the group, the view and the member.
    pub const CERT: u8 = 4;
    /// An accepted member giving up on members that presented no valid
    /// certificate (agreed multicast): `tag ‖ view ‖ u16 signature length ‖
    /// signature ‖ (u8 length ‖ name)*`, signed by the sender's identity key
    /// over the group, the view, its name and the names (an unsigned notice
    /// could be forged on any one member's link and refuse a member there
    /// alone).
    pub const TIMEOUT: u8 = 5;
    /// The oldest accepted member telling a refused member why (unicast):
    /// `tag ‖ view ‖ refusal`.
    pub const REFUSED: u8 = 6;
    /// A member proving it holds the key of an epoch, to the collector
    /// (unicast): `tag ‖ epoch ‖ MAC ‖ signature` (see [`crate::confirm`]).
    pub const CONFIRM: u8 = 7;
    /// A three-step group's data message (agreed multicast): `tag ‖ data`,
    /// in clear between a member and its daemon (TLS or the local socket),
    /// sealed between the daemons. Refused in every other group.
    pub const PLAIN: u8 = 8;
    /// An Optimized EVS group's data message (agreed multicast): an
    /// envelope of `conclave_integrated::evs`, which starts with this tag
    /// (the daemons re-encrypt it; see [`crate::evs`]).
    pub const EVS: u8 = conclave_integrated::evs::TAG;
    /// The collector's verdict on an epoch's confirmations (agreed
    /// multicast): `tag ‖ epoch ‖ MAC ‖ u16 signature length ‖ signature ‖
    /// (u8 length ‖ name)*`, the members whose MACs did not match (see
    /// [`crate::confirm`]).
    pub const VERDICT: u8 = 10;
    // The last three carry the view they were made for: one sent just after
    // a view change can be delivered in the next view, where it is stale and
    // dropped (its sender sends a fresh one for the new view).
}

/// Why a payload's framing (or a data message's header) is malformed. A
/// session rejects such a payload with [`RejectReason::Malformed`](crate::RejectReason::Malformed).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// No bytes at all.
    #[error("empty payload")]
    Empty,
    /// The first byte is no known [`tag`].
    #[error("unknown payload tag {0}")]
    UnknownTag(u8),
    /// Too short (or, for a policy notice, not exactly 3 bytes) for its tag.
    #[error("payload of tag {tag} has a wrong length ({len} bytes)")]
    Length {
        /// The tag.
        tag: u8,
        /// The payload's length, tag included.
        len: usize,
    },
    /// A data message whose header does not decode.
    #[error("malformed data message header")]
    DataHeader,
    /// An Optimized EVS envelope that does not decode.
    #[error("malformed Optimized EVS envelope")]
    Envelope,
}

/// The three trust messages, which carry the view they were made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TrustKind {
    Cert,
    Timeout,
    Refused,
}

/// A payload split at its tag: the framing step, common to the session and
/// [`parse_payload`]. Bodies are decoded by their kind's decoder.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Frame<'a> {
    /// The sender's policy codes (protocol, group) and the engine's bytes.
    KeyAgreement { policy: (u8, u8), body: &'a [u8] },
    /// `header ‖ ciphertext`.
    Data(&'a [u8]),
    /// The group's policy codes (protocol, group), told in `view`, signed.
    Policy { view: ViewId, policy: (u8, u8), signature: &'a [u8] },
    /// A trust message made for `view`.
    Trust { kind: TrustKind, view: ViewId, body: &'a [u8] },
    /// A key confirmation for `epoch`.
    Confirm { epoch: Epoch, mac: &'a [u8; 32], signature: &'a [u8] },
    /// The collector's verdict on `epoch`, sent in `view` (and accepted in
    /// that view only: with interval rekeying a confirmation outlives
    /// views, and a verdict must not be replayed into another): the names
    /// part lists the members whose MACs did not match.
    Verdict { epoch: Epoch, view: ViewId, mac: &'a [u8; 32], signature: &'a [u8], names: &'a [u8] },
    /// A three-step group's data, in clear.
    Plain(&'a [u8]),
    /// An Optimized EVS group's data: the whole payload, tag included (the
    /// envelope's own format).
    Evs(&'a [u8]),
}

impl<'a> Frame<'a> {
    /// Splits `bytes` at its tag. Does not look at the channel it came on.
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Frame<'a>, PayloadError> {
        let (&t, rest) = bytes.split_first().ok_or(PayloadError::Empty)?;
        let short = PayloadError::Length { tag: t, len: bytes.len() };
        match t {
            tag::KA => match rest {
                [p, g, body @ ..] => Ok(Frame::KeyAgreement { policy: (*p, *g), body }),
                _ => Err(short),
            },
            tag::DATA => Ok(Frame::Data(rest)),
            tag::PLAIN => Ok(Frame::Plain(rest)),
            tag::EVS => Ok(Frame::Evs(bytes)),
            tag::POLICY => {
                let (view, rest) = rest.split_first_chunk::<16>().ok_or(short.clone())?;
                match rest {
                    [p, g, signature @ ..] if !signature.is_empty() => {
                        Ok(Frame::Policy { view: ViewId::from_bytes(*view), policy: (*p, *g), signature })
                    }
                    _ => Err(short),
                }
            }
            tag::CONFIRM => {
                let (epoch, rest) = rest.split_first_chunk::<EPOCH_LEN>().ok_or(short.clone())?;
                // Unsigned (an empty signature) in groups the daemons key.
                let (mac, signature) = rest.split_first_chunk::<32>().ok_or(short.clone())?;
                Ok(Frame::Confirm { epoch: Epoch::from_bytes(*epoch), mac, signature })
            }
            tag::VERDICT => {
                let (epoch, rest) = rest.split_first_chunk::<EPOCH_LEN>().ok_or(short.clone())?;
                let (view, rest) = rest.split_first_chunk::<16>().ok_or(short.clone())?;
                let (mac, rest) = rest.split_first_chunk::<32>().ok_or(short.clone())?;
                // `u16 length ‖ signature ‖ names`; unsigned (length 0) in
                // groups the daemons key.
                let (len, rest) = rest.split_first_chunk::<2>().ok_or(short.clone())?;
                let (signature, names) =
                    rest.split_at_checked(u16::from_be_bytes(*len) as usize).ok_or(short.clone())?;
                if verdict_names(names).is_none() {
                    return Err(short);
                }
                Ok(Frame::Verdict {
                    epoch: Epoch::from_bytes(*epoch),
                    view: ViewId::from_bytes(*view),
                    mac,
                    signature,
                    names,
                })
            }
            tag::CERT | tag::TIMEOUT | tag::REFUSED => {
                let kind = match t {
                    tag::CERT => TrustKind::Cert,
                    tag::TIMEOUT => TrustKind::Timeout,
                    _ => TrustKind::Refused,
                };
                let (view, body) = rest.split_first_chunk::<16>().ok_or(short)?;
                Ok(Frame::Trust { kind, view: ViewId::from_bytes(*view), body })
            }
            _ => Err(PayloadError::UnknownTag(t)),
        }
    }
}

impl Frame<'_> {
    /// The payload's bytes: the inverse of [`Frame::parse`], beside it so
    /// that the two cannot drift apart (a unit test checks the round trip).
    pub(crate) fn encode(&self) -> Vec<u8> {
        match *self {
            Frame::KeyAgreement { policy: (p, g), body } => [&[tag::KA, p, g][..], body].concat(),
            Frame::Data(raw) => [&[tag::DATA][..], raw].concat(),
            Frame::Plain(data) => [&[tag::PLAIN][..], data].concat(),
            Frame::Evs(envelope) => envelope.to_vec(),
            Frame::Policy { view, policy: (p, g), signature } => {
                [&[tag::POLICY][..], &view.to_bytes(), &[p, g], signature].concat()
            }
            Frame::Trust { kind, view, body } => {
                let t = match kind {
                    TrustKind::Cert => tag::CERT,
                    TrustKind::Timeout => tag::TIMEOUT,
                    TrustKind::Refused => tag::REFUSED,
                };
                [&[t][..], &view.to_bytes(), body].concat()
            }
            Frame::Confirm { epoch, mac, signature } => {
                [&[tag::CONFIRM][..], &epoch.to_bytes(), mac, signature].concat()
            }
            Frame::Verdict { epoch, view, mac, signature, names } => {
                [&[tag::VERDICT][..], &epoch.to_bytes(), &view.to_bytes(), mac, &timeout_body(names, signature)]
                    .concat()
            }
        }
    }
}

/// The bit of a policy's protocol code that says data messages are not
/// signed by their senders ([`Policy::sender_signatures`] off).
pub const UNSIGNED_DATA: u8 = 0x80;

/// The value of a policy's interval bits (4–6) that says the daemons key
/// the group (Integrated VS, [`Policy::mode`]).
pub const KEYED: u8 = 7;

/// The value of a policy's interval bits (4–6) that says the group is
/// three-step ([`Policy::mode`]).
pub const THREE_STEP: u8 = 6;

/// The value of a policy's interval bits (4–6) that says the group is
/// Optimized EVS ([`Policy::mode`]).
pub const OPTIMIZED_EVS: u8 = 5;

/// The policy named by a pair of codes, if both are known.
/// An interval policy's period and `rekey_on_leave` are not on the wire
/// (each leader's own): one decoded from codes has a zero period and no
/// `rekey_on_leave`.
pub(crate) fn decode_policy((p, g): (u8, u8)) -> Option<Policy> {
    let mut policy = Policy::new(ProtocolId::from_code(p & 0x0f)?, GroupId::ALL.into_iter().find(|x| x.code() == g)?);
    policy.sender_signatures = p & UNSIGNED_DATA == 0;
    policy.mode = match (p >> 4) & 0x07 {
        KEYED => GroupMode::Keyed,
        THREE_STEP => GroupMode::ThreeStep,
        OPTIMIZED_EVS => GroupMode::OptimizedEvs,
        _ => GroupMode::Members,
    };
    policy.interval = match (p >> 4) & 0x07 {
        0 | KEYED | THREE_STEP | OPTIMIZED_EVS => None,
        a => Some(crate::Interval {
            algorithm: conclave_gka::IntervalAlgorithm::from_code(a)?,
            period: std::time::Duration::ZERO,
            rekey_on_leave: false,
        }),
    };
    Some(policy)
}

/// Splits a certificate message's body into the certificate (DER) and the
/// signature that proves its holder presents it; the refusal a member
/// earns by presenting anything else.
pub(crate) fn split_cert(body: &[u8]) -> Result<(&[u8], &[u8]), Refusal> {
    let parts = || {
        let (len, rest) = body.split_first_chunk::<2>()?;
        let (der, sig) = rest.split_at_checked(u16::from_be_bytes(*len) as usize)?;
        (!sig.is_empty()).then_some((der, sig))
    };
    parts().ok_or_else(|| Refusal::Malformed("not a certificate message".into()))
}

/// A certificate message's body: the inverse of [`split_cert`].
pub(crate) fn cert_body(der: &[u8], signature: &[u8]) -> Vec<u8> {
    let len = u16::try_from(der.len()).expect("a certificate is shorter than 64 KiB (checked when it was loaded)");
    [&len.to_be_bytes()[..], der, signature].concat()
}

/// The names part of a timeout notice listing `members`: the inverse of
/// [`timeout_names`].
pub(crate) fn timeout_names_part<'a>(members: impl IntoIterator<Item = &'a conclave_gcs::MemberId>) -> Vec<u8> {
    let mut names = Vec::new();
    for m in members {
        // Member names are at most 255 bytes (the naming rules).
        names.push(m.as_str().len() as u8);
        names.extend_from_slice(m.as_str().as_bytes());
    }
    names
}

/// A timeout notice's body: the signature over `names`, then `names` (the
/// inverse of [`split_timeout`]).
pub(crate) fn timeout_body(names: &[u8], signature: &[u8]) -> Vec<u8> {
    let len = u16::try_from(signature.len()).expect("a signature is shorter than 64 KiB");
    [&len.to_be_bytes()[..], signature, names].concat()
}

/// Splits a timeout notice's body into its names part and its signature;
/// `None` if the signature's framing is malformed or it is empty.
pub(crate) fn split_timeout(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = body.split_first_chunk::<2>()?;
    let (signature, names) = rest.split_at_checked(u16::from_be_bytes(*len) as usize)?;
    (!signature.is_empty()).then_some((names, signature))
}

/// The member names of a timeout notice's body: `(u8 length ‖ name)*`. A
/// name cut short ends the list; the names before it still count.
pub(crate) fn timeout_names(body: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = body;
    std::iter::from_fn(move || {
        let (&n, r) = rest.split_first()?;
        let (name, r) = r.split_at_checked(n as usize)?;
        rest = r;
        Some(name)
    })
}

/// The member names of a verdict's names part, `(u8 length ‖ name)*`;
/// `None` if a name is cut short (a verdict is exact: its MAC covers the part).
pub(crate) fn verdict_names(part: &[u8]) -> Option<Vec<&[u8]>> {
    // The timeout notice's reader stops at a name cut short: the names it
    // read, each with its length byte, must be the whole part.
    let names: Vec<&[u8]> = timeout_names(part).collect();
    (names.iter().map(|n| 1 + n.len()).sum::<usize>() == part.len()).then_some(names)
}

/// A payload taken apart by [`parse_payload`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParsedPayload {
    /// A key agreement message ([`tag::KA`]).
    KeyAgreement {
        /// The sender's policy, `None` if its codes are unknown.
        policy: Option<Policy>,
        /// The engine message's envelope (signature not checked).
        envelope: Result<Envelope, DecodeError>,
    },
    /// A data message ([`tag::DATA`]) with a well-formed header.
    Data {
        /// The header.
        header: DataHeader,
        /// The message opened with keys of a fixed, public root (never a
        /// group's): in practice always [`DataError::AuthFailed`], unless the
        /// message was sealed with those very keys (a test hook).
        opened: Result<Vec<bytes::Bytes>, DataError>,
    },
    /// A policy notice ([`tag::POLICY`]).
    Policy {
        /// The view it was made for.
        view: ViewId,
        /// The group's policy, `None` if its codes are unknown.
        policy: Option<Policy>,
    },
    /// A key confirmation ([`tag::CONFIRM`]).
    Confirm {
        /// The epoch whose key it confirms.
        epoch: Epoch,
        /// The length of its signature (0: unsigned, in a group the daemons key).
        signature_len: usize,
    },
    /// A collector's verdict ([`tag::VERDICT`]).
    Verdict {
        /// The epoch whose confirmations it decides.
        epoch: Epoch,
        /// The view its collector sent it in.
        view: ViewId,
        /// The names it lists as not matching (raw bytes).
        unmatched: Vec<Vec<u8>>,
        /// The length of its signature.
        signature_len: usize,
    },
    /// A three-step group's data ([`tag::PLAIN`]).
    Plain {
        /// Its length.
        len: usize,
    },
    /// An Optimized EVS group's data ([`tag::EVS`]), not opened.
    Evs {
        /// The view whose key sealed it, or (a daemon's notice) the view
        /// whose key the daemon no longer held.
        key_view: ViewId,
        /// Whether it is a daemon's notice in place of a message.
        notice: bool,
    },
    /// A certificate message ([`tag::CERT`]).
    Cert {
        /// The view it was made for.
        view: ViewId,
        /// What the certificate says, or the refusal a session gives a
        /// member that presents this message whatever its authority.
        certificate: Result<PresentedCert, Refusal>,
    },
    /// A timeout notice ([`tag::TIMEOUT`]).
    Timeout {
        /// The view it was made for.
        view: ViewId,
        /// The names it lists (raw bytes, as a session compares them with
        /// its view's member names), and the length of its signature; `None`
        /// if the signature's framing is malformed (a session ignores it).
        signed: Option<(Vec<Vec<u8>>, usize)>,
    },
    /// A refusal notice ([`tag::REFUSED`]).
    Refused {
        /// The view it was made for.
        view: ViewId,
        /// The reason, `None` if it does not decode (a session ignores the notice then).
        reason: Option<Refusal>,
    },
}

/// A presented certificate, parsed but not checked against any authority.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PresentedCert {
    /// The subject's common name (the member it certifies), if it has one.
    pub common_name: Option<String>,
    /// The serial number, hex.
    pub serial: String,
    /// The length of the signature that follows the certificate.
    pub signature_len: usize,
}

/// Runs every pure parsing step a session applies to a received payload —
/// the same functions, in the same order — with no session, daemon, key or
/// authority. For fuzzing and tests. It never panics, and it returns an
/// error exactly when a session, whatever its state, would reject the
/// payload as malformed. It does not look at the channel (a session also
/// rejects a payload that comes by unicast when it should come by multicast,
/// or the other way round); see the [module doc](self) for the other steps
/// it leaves out.
pub fn parse_payload(bytes: &[u8]) -> Result<ParsedPayload, PayloadError> {
    Ok(match Frame::parse(bytes)? {
        Frame::KeyAgreement { policy, body } => {
            ParsedPayload::KeyAgreement { policy: decode_policy(policy), envelope: Envelope::decode(body) }
        }
        Frame::Data(raw) => {
            let (header, _, _) = DataHeader::decode(raw).map_err(|_| PayloadError::DataHeader)?;
            let keys = EpochKeys::fixed_public(header.group.clone(), header.epoch);
            let opened = keys.open(raw, None).map(|(_, messages)| messages);
            ParsedPayload::Data { header, opened }
        }
        Frame::Policy { view, policy, .. } => ParsedPayload::Policy { view, policy: decode_policy(policy) },
        Frame::Confirm { epoch, signature, .. } => ParsedPayload::Confirm { epoch, signature_len: signature.len() },
        Frame::Verdict { epoch, view, signature, names, .. } => ParsedPayload::Verdict {
            epoch,
            view,
            unmatched: verdict_names(names).unwrap_or_default().into_iter().map(<[u8]>::to_vec).collect(),
            signature_len: signature.len(),
        },
        Frame::Plain(data) => ParsedPayload::Plain { len: data.len() },
        Frame::Evs(bytes) => match conclave_integrated::evs::Envelope::decode(bytes) {
            Ok(conclave_integrated::evs::Envelope::Sealed { key_view, .. }) => {
                ParsedPayload::Evs { key_view, notice: false }
            }
            Ok(conclave_integrated::evs::Envelope::Notice { key_view, .. }) => {
                ParsedPayload::Evs { key_view, notice: true }
            }
            Err(_) => return Err(PayloadError::Envelope),
        },
        Frame::Trust { kind: TrustKind::Cert, view, body } => {
            let certificate = split_cert(body).and_then(|(der, sig)| {
                let der = CertificateDer::from(der);
                let cert = MemberCert::parse(&der)?;
                Ok(PresentedCert { common_name: cert.common_name(), serial: cert.serial(), signature_len: sig.len() })
            });
            ParsedPayload::Cert { view, certificate }
        }
        Frame::Trust { kind: TrustKind::Timeout, view, body } => {
            let signed = split_timeout(body)
                .map(|(names, signature)| (timeout_names(names).map(<[u8]>::to_vec).collect(), signature.len()));
            ParsedPayload::Timeout { view, signed }
        }
        Frame::Trust { kind: TrustKind::Refused, view, body } => {
            ParsedPayload::Refused { view, reason: Refusal::decode(body) }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_lengths() {
        assert_eq!(Frame::parse(&[]).unwrap_err(), PayloadError::Empty);
        assert_eq!(Frame::parse(&[0]).unwrap_err(), PayloadError::UnknownTag(0));
        assert_eq!(Frame::parse(&[11, 1]).unwrap_err(), PayloadError::UnknownTag(11));
        assert!(matches!(Frame::parse(&[tag::PLAIN, 1]), Ok(Frame::Plain([1]))));
        assert!(Frame::parse(&[tag::KA, 1]).is_err());
        assert!(matches!(Frame::parse(&[tag::KA, 1, 2]), Ok(Frame::KeyAgreement { policy: (1, 2), body: [] })));
        assert!(matches!(Frame::parse(&[tag::DATA]), Ok(Frame::Data([]))));
        let view = [[0u8; 8], 0x102u64.to_be_bytes()].concat();
        let policy = |rest: &[u8]| [&[tag::POLICY][..], &view, rest].concat();
        assert!(Frame::parse(&policy(&[1])).is_err());
        assert!(Frame::parse(&policy(&[1, 2])).is_err(), "unsigned");
        assert!(matches!(
            Frame::parse(&policy(&[1, 2, 3])),
            Ok(Frame::Policy { policy: (1, 2), signature: [3], view: ViewId { incarnation: 0, seq: 0x102 } })
        ));
        for t in [tag::CERT, tag::TIMEOUT, tag::REFUSED] {
            let mut p = vec![t];
            p.extend_from_slice(&view[..15]);
            assert!(Frame::parse(&p).is_err());
            p.push(view[15]);
            assert!(matches!(Frame::parse(&p), Ok(Frame::Trust { view: ViewId { seq: 0x102, .. }, body: [], .. })));
        }
        let confirm = [&[tag::CONFIRM][..], &[0; EPOCH_LEN], &[7; 32]].concat();
        assert!(matches!(Frame::parse(&confirm), Ok(Frame::Confirm { signature: [], .. })), "unsigned");
        assert!(Frame::parse(&confirm[..40]).is_err());
        assert!(matches!(Frame::parse(&[&confirm[..], &[1]].concat()), Ok(Frame::Confirm { mac: [7, ..], .. })));
        let verdict = |rest: &[u8]| [&[tag::VERDICT][..], &[0; EPOCH_LEN], &[0; 16], &[7; 32], rest].concat();
        assert!(matches!(Frame::parse(&verdict(&[0, 0])), Ok(Frame::Verdict { signature: [], names: [], .. })));
        assert!(Frame::parse(&verdict(&[0])).is_err(), "length cut short");
        assert!(Frame::parse(&verdict(&[0, 2, 5])).is_err(), "signature cut short");
        assert!(Frame::parse(&verdict(&[0, 1, 5, 2, b'a'])).is_err(), "name cut short");
        assert!(matches!(
            Frame::parse(&verdict(&[0, 1, 5])),
            Ok(Frame::Verdict { mac: [7, ..], signature: [5], names: [], .. })
        ));
        assert!(matches!(
            Frame::parse(&verdict(&[0, 1, 5, 1, b'a', 0])),
            Ok(Frame::Verdict { signature: [5], names: [1, b'a', 0], .. })
        ));
    }

    /// Every frame kind re-encodes to the bytes it was parsed from, and the
    /// bodies' encoders invert their decoders.
    #[test]
    fn encoders_invert_the_decoders() {
        let view = [[0u8; 8], 0x102u64.to_be_bytes()].concat();
        let payloads = [
            vec![tag::KA, 1, 2, 3, 4],
            vec![tag::DATA, 9, 9],
            [&[tag::POLICY][..], &view, &[1, 2, 3]].concat(),
            [&[tag::CERT][..], &view, &[0, 1, 7, 8]].concat(),
            [&[tag::TIMEOUT][..], &view, &[0, 1, 9, 1, b'a']].concat(),
            [&[tag::REFUSED][..], &view, &[0]].concat(),
            [&[tag::CONFIRM][..], &[3; EPOCH_LEN], &[7; 32], &[1, 2]].concat(),
            [&[tag::VERDICT][..], &[3; EPOCH_LEN], &view, &[7; 32], &[0, 2, 1, 2, 1, b'a']].concat(),
            vec![tag::PLAIN, 5, 6],
        ];
        for p in payloads {
            assert_eq!(Frame::parse(&p).unwrap().encode(), p);
        }
        assert_eq!(split_cert(&cert_body(&[9, 9], &[5])), Ok((&[9u8, 9][..], &[5u8][..])));
        let names = [conclave_gcs::MemberId::new("a").unwrap(), conclave_gcs::MemberId::new("bc").unwrap()];
        let part = timeout_names_part(&names);
        assert_eq!(timeout_names(&part).collect::<Vec<_>>(), [&b"a"[..], b"bc"]);
        assert_eq!(split_timeout(&timeout_body(&part, &[7, 7])), Some((&part[..], &[7u8, 7][..])));
        assert_eq!(split_timeout(&timeout_body(&part, &[])), None, "unsigned");
        assert_eq!(split_timeout(&[0, 5, 1]), None, "signature cut short");
    }

    #[test]
    fn cert_split_and_timeout_names() {
        assert_eq!(split_cert(&[0, 2, 9, 9, 5]), Ok((&[9u8, 9][..], &[5u8][..])));
        assert!(split_cert(&[0, 2, 9, 9]).is_err(), "no signature");
        assert!(split_cert(&[0, 3, 9, 9]).is_err(), "certificate cut short");
        assert!(split_cert(&[0xff, 0xff]).is_err());
        assert!(split_cert(&[0]).is_err());
        let names: Vec<&[u8]> = timeout_names(&[1, b'a', 2, b'b', b'c', 5, b'd']).collect();
        assert_eq!(names, [&b"a"[..], b"bc"]);
        assert_eq!(timeout_names(&[]).count(), 0);
        assert_eq!(timeout_names(&[0, 0]).count(), 2);
    }
}
