//! Optimized EVS data: what a member seals in a
//! `conclave_integrated::evs` envelope, and how receivers tell a replay.
//!
//! The daemons may re-encrypt a message under a later view's key (that is
//! the point of Optimized EVS), so the envelope's writer and count do not
//! say who sent it or which message it is. What does is inside, under the
//! AEAD: the sender, the view whose key it first sealed the message under
//! (its *origin*), the sender's count in that view, and the sender's
//! signature over all of them and the data (group bound too):
//!
//! ```text
//! u8 length | sender | origin view (16) | u64 seq | u16 length | signature | data
//! ```
//!
//! `data` is a bundle of one or more messages, `u32 count ‖ count × u32
//! length ‖ the messages one after the other`: as in layered groups
//! (`crate::data`, "Bundles"), what a sender sends while its envelopes
//! travel goes out together when one comes back, under one signature. `seq` counts
//! envelopes, so a daemon's notice (`KeyGone`) or a `CutShort` report names
//! a bundle: all its messages are lost together.
//!
//! A daemon cannot forge a member's message (it holds no member's signing
//! key), only drop or delay it, as any daemon can.
//!
//! **Replays.** The stream keeps each sender's messages in order (FIFO per
//! sender, whatever views they cross), so the receiver accepts from each
//! sender only origins it has not seen the sender move on from, and within
//! one origin only counts above the last. [`Seen`] remembers the last
//! [`SEEN_ORIGINS`] origins each sender moved on from: an insider (who
//! holds the current key) could replay a message of an older origin than
//! that; honest members never send one.

use std::collections::VecDeque;

use conclave_gcs::{GroupName, MemberId, ViewId};
use zeroize::Zeroizing;

const SIGNATURE_DOMAIN: &[u8] = b"conclave/secure/v2/evs-signature-blake3";

/// The origins per sender a receiver remembers as closed (see the module docs).
pub const SEEN_ORIGINS: usize = 64;

/// A member's message inside an envelope, decoded.
pub(crate) struct Inner<'a> {
    pub sender: MemberId,
    pub origin: ViewId,
    pub seq: u64,
    pub signature: &'a [u8],
    pub data: &'a [u8],
}

/// What the sender signs: the group, itself, the origin view and count,
/// and the BLAKE3 digest of the data (hashed once, not by Ed25519's SHA-512
/// twice to sign and once per receiver: see `crate::data`).
pub(crate) fn signed(group: &GroupName, sender: &MemberId, origin: ViewId, seq: u64, data: &[u8]) -> Vec<u8> {
    let mut t = Vec::with_capacity(SIGNATURE_DOMAIN.len() + 3 + group.as_str().len() + 256 + 24 + 32);
    t.extend_from_slice(SIGNATURE_DOMAIN);
    t.push(group.as_str().len() as u8);
    t.extend_from_slice(group.as_str().as_bytes());
    t.push(sender.as_str().len() as u8);
    t.extend_from_slice(sender.as_str().as_bytes());
    t.extend_from_slice(&origin.to_bytes());
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(blake3::hash(data).as_bytes());
    t
}

/// `messages` (one or more) as one bundle: the lengths part of a data
/// message's bundle ([`crate::data`]), then the messages.
pub(crate) fn bundle<M: AsRef<[u8]>>(messages: &[M]) -> Vec<u8> {
    let body: usize = messages.iter().map(|m| crate::data::BUNDLE_ENTRY_OVERHEAD + m.as_ref().len()).sum();
    let mut out = Vec::with_capacity(4 + body);
    crate::data::write_lengths(&mut out, messages);
    for m in messages {
        out.extend_from_slice(m.as_ref());
    }
    out
}

/// Where each message of a bundle lies in `data`; `None` if `data` is not a
/// bundle of one or more messages with nothing after the last.
pub(crate) fn unbundle(data: &[u8]) -> Option<Vec<std::ops::Range<usize>>> {
    let (lengths, mut at) = crate::data::read_lengths(data)?;
    let mut ranges = Vec::with_capacity(lengths.len());
    for len in lengths {
        let end = at.checked_add(len)?;
        ranges.push(at..end);
        at = end;
    }
    (at == data.len()).then_some(ranges)
}

/// Encodes a message for sealing.
pub(crate) fn encode(sender: &MemberId, origin: ViewId, seq: u64, signature: &[u8], data: &[u8]) -> Zeroizing<Vec<u8>> {
    let mut out = Vec::with_capacity(1 + sender.as_str().len() + 16 + 8 + 2 + signature.len() + data.len());
    out.push(u8::try_from(sender.as_str().len()).expect("member names are at most 255 bytes"));
    out.extend_from_slice(sender.as_str().as_bytes());
    out.extend_from_slice(&origin.to_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&u16::try_from(signature.len()).expect("signatures are short").to_be_bytes());
    out.extend_from_slice(signature);
    out.extend_from_slice(data);
    Zeroizing::new(out)
}

/// Decodes an opened envelope's contents; `None` if malformed.
pub(crate) fn decode(bytes: &[u8]) -> Option<Inner<'_>> {
    let (&n, rest) = bytes.split_first()?;
    let (name, rest) = rest.split_at_checked(n.into())?;
    let sender = MemberId::new(std::str::from_utf8(name).ok()?).ok()?;
    let (origin, rest) = rest.split_first_chunk::<16>()?;
    let (seq, rest) = rest.split_first_chunk::<8>()?;
    let (len, rest) = rest.split_first_chunk::<2>()?;
    let (signature, data) = rest.split_at_checked(u16::from_be_bytes(*len).into())?;
    Some(Inner { sender, origin: ViewId::from_bytes(*origin), seq: u64::from_be_bytes(*seq), signature, data })
}

/// One sender's messages seen so far (see the module docs).
#[derive(Default)]
pub(crate) struct Seen {
    /// The origin of the last message accepted, and its count.
    last: Option<(ViewId, u64)>,
    /// Origins the sender moved on from, oldest first.
    closed: VecDeque<ViewId>,
}

impl Seen {
    /// Accepts message `seq` of `origin` if it is new; records it.
    pub(crate) fn accept(&mut self, origin: ViewId, seq: u64) -> bool {
        match self.last {
            Some((o, s)) if o == origin && seq <= s => return false,
            Some((o, _)) if o == origin => {}
            _ if self.closed.contains(&origin) => return false,
            Some((o, _)) => {
                if self.closed.len() == SEEN_ORIGINS {
                    self.closed.pop_front();
                }
                self.closed.push_back(o);
            }
            None => {}
        }
        self.last = Some((origin, seq));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inner_round_trip_and_truncation() {
        let alice = MemberId::new("alice").unwrap();
        let bytes = encode(&alice, ViewId::new(1, 2), 7, b"sig", b"data");
        let inner = decode(&bytes).unwrap();
        assert_eq!(
            (inner.sender, inner.origin, inner.seq, inner.signature, inner.data),
            (alice, ViewId::new(1, 2), 7, &b"sig"[..], &b"data"[..])
        );
        for len in 0..bytes.len() - 4 {
            assert!(decode(&bytes[..len]).is_none(), "{len} bytes decode");
        }
    }

    #[test]
    fn bundles_split_into_their_messages_and_nothing_else() {
        let msgs: [&[u8]; 3] = [b"one", b"", b"three"];
        let b = bundle(&msgs);
        let ranges = unbundle(&b).unwrap();
        assert_eq!(ranges.into_iter().map(|r| &b[r]).collect::<Vec<_>>(), msgs);
        for len in 0..b.len() {
            assert!(unbundle(&b[..len]).is_none(), "{len} bytes split");
        }
        assert!(unbundle(&[b.as_slice(), b"x"].concat()).is_none(), "a byte after the last message");
        assert!(unbundle(&[0, 0, 0, 0]).is_none(), "no message");
        assert!(unbundle(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]).is_none(), "a count past the end");
    }

    #[test]
    fn a_sender_is_accepted_in_order_and_never_twice() {
        let (v1, v2) = (ViewId::new(1, 1), ViewId::new(1, 2));
        let mut seen = Seen::default();
        assert!(seen.accept(v1, 0) && seen.accept(v1, 1));
        assert!(!seen.accept(v1, 1) && !seen.accept(v1, 0));
        assert!(seen.accept(v2, 0));
        assert!(!seen.accept(v1, 2), "the sender moved on from v1");
        assert!(seen.accept(v2, 1));
    }
}
