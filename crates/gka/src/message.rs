//! The signed envelope every protocol message travels in.
//!
//! ```text
//! "CGKA" | version u8 | protocol u8 | group-id u8 | group name (u8 len) |
//! view id (incarnation u64, counter u64) | run u32 | sender (u8 len) |
//! recipient (u8 len, 0 = broadcast) | round u8 | seq u32 | body (u32 len) |
//! signature (u16 len)
//! ```
//! The signature covers a domain tag and a BLAKE3 hash (in its key
//! derivation mode, under this format's own context) of every byte before
//! it, so a message is bound to its group, view (with the daemon
//! incarnation: nothing recorded in one daemon lifetime is accepted in
//! another), run within the view, protocol, round, sender and recipient:
//! receivers reject it in any other context. `seq` numbers a sender's
//! messages within a run; a receiver accepts each (sender, seq) once.
//!
//! Why a hash first: every member checks the signature of every broadcast,
//! and some are large (GDH's list of n partial keys, TGDH's announced tree:
//! tens of KiB at 512 members). Ed25519 hashes what it signs with SHA-512,
//! several times slower per byte than BLAKE3, so signing the digest makes
//! each check cost about the same whatever the message's size. BLAKE3 is
//! collision resistant at the 128-bit level, as Ed25519 is strong.

use conclave_gcs::{MemberId, ViewId};

use crate::codec::{DecodeError, Reader, Writer};
use crate::suite::GroupId;
use crate::ProtocolId;

const MAGIC: &[u8; 4] = b"CGKA";
/// Envelope format version.
pub const VERSION: u8 = 3;
/// Largest protocol body accepted (a GDH partial-key list for 1000+ members
/// in a 2048-bit group fits comfortably).
pub const MAX_BODY: usize = 8 << 20;
const MAX_SIG: usize = 1024;
const SIG_DOMAIN: &[u8] = b"conclave/gka/v3/message-signature";
/// BLAKE3's key derivation context for the digest the signature covers.
const DIGEST_CONTEXT: &str = "conclave gka v3 envelope digest";

/// A decoded envelope (signature not yet checked).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Envelope {
    /// Protocol.
    pub protocol: ProtocolId,
    /// Group the suite computes in.
    pub group_id: GroupId,
    /// Group name.
    pub group: String,
    /// View the message belongs to.
    pub view: ViewId,
    /// The run within the view (see [`crate::key::Epoch`]).
    pub run: u32,
    /// Sender.
    pub sender: MemberId,
    /// Unicast recipient, or `None` for a broadcast.
    pub recipient: Option<MemberId>,
    /// Protocol round / message kind.
    pub round: u8,
    /// Sender's message number within the view.
    pub seq: u32,
    /// Protocol-specific body.
    pub body: Vec<u8>,
    /// Signature over [`Envelope::signed_bytes`].
    pub signature: Vec<u8>,
}

impl Envelope {
    /// Every field before the body's length.
    fn head(&self) -> Writer {
        let mut w = Writer::new();
        w.raw(MAGIC).u8(VERSION).u8(self.protocol.code()).u8(self.group_id.code());
        w.short_bytes(self.group.as_bytes()).raw(&self.view.to_bytes()).u32(self.run);
        w.short_bytes(self.sender.as_str().as_bytes());
        w.short_bytes(self.recipient.as_ref().map(|r| r.as_str().as_bytes()).unwrap_or(b""));
        w.u8(self.round).u32(self.seq);
        w
    }

    /// The bytes the signature covers: the domain tag and the digest of
    /// every byte the wire encoding has before the signature (the body
    /// hashed where it lies, not copied).
    pub fn signed_bytes(&self) -> Vec<u8> {
        let mut h = blake3::Hasher::new_derive_key(DIGEST_CONTEXT);
        h.update(&self.head().buf);
        h.update(&(self.body.len() as u32).to_be_bytes());
        h.update(&self.body);
        let mut v = SIG_DOMAIN.to_vec();
        v.extend_from_slice(h.finalize().as_bytes());
        v
    }

    /// Wire encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = self.head();
        w.long_bytes(&self.body);
        w.u16(self.signature.len() as u16).raw(&self.signature);
        w.buf
    }

    /// Parses wire bytes; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader::new(bytes);
        if r.bytes(4, "magic")? != MAGIC {
            return Err(DecodeError::Bad("magic"));
        }
        if r.u8("version")? != VERSION {
            return Err(DecodeError::Bad("version"));
        }
        let protocol = ProtocolId::from_code(r.u8("protocol")?).ok_or(DecodeError::Bad("protocol"))?;
        let gcode = r.u8("group id")?;
        let group_id = GroupId::ALL.into_iter().find(|g| g.code() == gcode).ok_or(DecodeError::Bad("group id"))?;
        let group =
            std::str::from_utf8(r.short_bytes(255, "group name")?).map_err(|_| DecodeError::Bad("group name"))?;
        let view = ViewId::new(r.u64("view incarnation")?, r.u64("view id")?);
        let run = r.u32("run")?;
        let sender = member(r.short_bytes(255, "sender")?)?.ok_or(DecodeError::Bad("sender"))?;
        let recipient = member(r.short_bytes(255, "recipient")?)?;
        let round = r.u8("round")?;
        let seq = r.u32("seq")?;
        let body = r.long_bytes(MAX_BODY, "body")?.to_vec();
        let sig_len = r.u16("signature")? as usize;
        if sig_len > MAX_SIG {
            return Err(DecodeError::TooLong("signature", sig_len, MAX_SIG));
        }
        let signature = r.bytes(sig_len, "signature")?.to_vec();
        r.finish()?;
        Ok(Self {
            protocol,
            group_id,
            group: group.to_owned(),
            view,
            run,
            sender,
            recipient,
            round,
            seq,
            body,
            signature,
        })
    }
}

fn member(b: &[u8]) -> Result<Option<MemberId>, DecodeError> {
    if b.is_empty() {
        return Ok(None);
    }
    let s = std::str::from_utf8(b).map_err(|_| DecodeError::Bad("member name"))?;
    MemberId::new(s).map(Some).map_err(|_| DecodeError::Bad("member name"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_round_trips_and_rejects_every_truncation() {
        let e = Envelope {
            protocol: ProtocolId::Bd,
            group_id: GroupId::Ristretto255,
            group: "chat".into(),
            view: ViewId::new(7, 42),
            run: 1,
            sender: MemberId::new("alice").unwrap(),
            recipient: Some(MemberId::new("bob").unwrap()),
            round: 2,
            seq: 9,
            body: vec![1, 2, 3],
            signature: vec![7; 64],
        };
        let bytes = e.encode();
        assert_eq!(Envelope::decode(&bytes).unwrap(), e);
        for cut in 0..bytes.len() {
            assert!(Envelope::decode(&bytes[..cut]).is_err());
        }
        let mut long = bytes.clone();
        long.push(0);
        assert_eq!(Envelope::decode(&long), Err(DecodeError::Trailing(1)));
    }
}
