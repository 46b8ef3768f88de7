//! Data messages: the header, the per-epoch and per-sender keys, AEAD and
//! the sender's signature.
//!
//! A data message is `header ‖ lengths ‖ ciphertext ‖ AEAD tag ‖ signature
//! ‖ u16 signature length`. The header carries the group, the key epoch ([`Epoch`]: the view
//! the key was agreed in and the run in it), the daemon view the sender sent
//! it in, the sender and the sender's sequence number in that epoch; it is
//! authenticated as the AEAD's associated data. The view matters where a key
//! outlives views (interval rekeying): a receiver accepts a message only in
//! the view it was sent in, so a message of one view (or of another
//! component under the same key) cannot be delivered in another.
//!
//! **Bundles.** The ciphertext holds one or more application messages,
//! one after the other; `lengths` is `u32 count ‖ count × u32 length`, in
//! clear and authenticated with the header (what the daemon sees of each
//! message's size anyway, had it gone alone), so that a receiver hands each
//! message on as a slice of the one buffer it decrypted, with no copy. A
//! sender that has several messages waiting seals and signs them together
//! ([`crate::core`]: an idle sender's message goes at once; what it sends
//! while its own are on their way back goes out together when one comes
//! back), so the signature's fixed cost is paid once per bundle, not once
//! per message. Receivers deliver the
//! messages of a bundle one by one, in order; a bundle is accepted or
//! refused whole.
//!
//! **Sender authentication.** Every member holds the group key, so the AEAD
//! alone proves only that *a member* wrote the message: any insider could
//! derive another member's data key and write in its name. The signature,
//! by the sender's long-term identity key over a domain tag and the BLAKE3
//! digest of the header, the lengths and the ciphertext (MLS signs application messages
//! whole), proves which member it was. The digest is taken once by the
//! sender and once by each receiver: Ed25519 over the message itself would
//! run SHA-512 over it twice to sign and once more per receiver, and BLAKE3
//! is 5× faster than SHA-256 here at 64 KiB (docs/benchmarks.md). (Not the
//! AEAD tag alone: every member holds the key it is made with, and GHASH
//! under a known key gives other ciphertexts with the same tag.) Receivers
//! check the AEAD first (cheap: it turns away everyone outside the group)
//! and then the signature. Each sender encrypts under its own key, derived
//! with HKDF-SHA256 from the epoch's group key with an `info` that binds the
//! group, the epoch and the sender, so two senders never share a (key,
//! nonce) pair. The AEAD is AES-256-GCM (ring's, 7× faster than the
//! portable ChaCha20-Poly1305 at 64 KiB on these AES-NI machines); its
//! 96-bit nonce is the sequence number, which a sender never repeats within
//! an epoch. The derived keys are zeroized on drop; ring's expanded AES key
//! schedule, built per message on the stack, is not.
//!
//! Wire layout of the header (all integers big-endian):
//!
//! ```text
//! u8 group length | group | epoch (20 bytes: view incarnation u64,
//! view counter u64, run u32) | sent in (16 bytes: view incarnation u64,
//! view counter u64) | u8 sender length | sender | u64 seq
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;

use bytes::Bytes;
use conclave_gcs::{GroupName, MemberId};
use conclave_gka::key::EPOCH_LEN;
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::{Epoch, GroupKey, ViewId};
use hkdf::Hkdf;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The AEAD tag's length: what encryption adds to a message.
pub const TAG_LEN: usize = 16;

/// Why a data message could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DataError {
    /// The header is not well formed.
    #[error("malformed data message")]
    Malformed,
    /// The ciphertext or header was altered, or was made under another key.
    #[error("authentication failed")]
    AuthFailed,
    /// The sender's signature is missing or does not verify: the message
    /// was not written by the member the header names.
    #[error("the sender's signature does not verify")]
    BadSignature,
}

/// Longest signature a data message may carry (RSA-2048 is 256 bytes).
pub const MAX_SIGNATURE: usize = 1024;

const SIGNATURE_DOMAIN: &[u8] = b"conclave/secure/v2/data-signature-blake3";

/// Bytes a bundle adds to each message: its length.
pub const BUNDLE_ENTRY_OVERHEAD: usize = 4;

/// Bytes a bundle adds besides its messages' lengths: their count.
const BUNDLE_COUNT_LEN: usize = 4;

/// Appends the lengths part of a bundle of `messages` (one or more), `u32
/// count ‖ count × u32 length`: the layout of data messages here and of
/// Optimized EVS envelopes' contents ([`crate::evs`]).
pub(crate) fn write_lengths<M: AsRef<[u8]>>(out: &mut Vec<u8>, messages: &[M]) {
    out.extend_from_slice(&u32::try_from(messages.len()).expect("a bundle fits the daemon's payload").to_be_bytes());
    for m in messages {
        let len = u32::try_from(m.as_ref().len()).expect("messages fit the daemon's payload");
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Reads a lengths part ([`write_lengths`]) from the front of `bytes`: the
/// lengths and the bytes the part took. `None` for no message, or a count
/// `bytes` cannot hold (refused before anything is allocated for it).
pub(crate) fn read_lengths(bytes: &[u8]) -> Option<(Vec<usize>, usize)> {
    let (count, mut rest) = bytes.split_first_chunk::<BUNDLE_COUNT_LEN>()?;
    let count = u32::from_be_bytes(*count) as usize;
    if count == 0 || count > rest.len() / BUNDLE_ENTRY_OVERHEAD {
        return None;
    }
    let mut lengths = Vec::with_capacity(count);
    for _ in 0..count {
        let (len, r) = rest.split_first_chunk::<BUNDLE_ENTRY_OVERHEAD>()?;
        lengths.push(u32::from_be_bytes(*len) as usize);
        rest = r;
    }
    Some((lengths, BUNDLE_COUNT_LEN + count * BUNDLE_ENTRY_OVERHEAD))
}

/// The cleartext header of a data message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataHeader {
    /// The group.
    pub group: GroupName,
    /// The key epoch (whose key encrypts the message).
    pub epoch: Epoch,
    /// The daemon view the sender sent it in.
    pub view: ViewId,
    /// The sender.
    pub sender: MemberId,
    /// The sender's sequence number in this epoch (also the nonce).
    pub seq: u64,
}

impl DataHeader {
    /// Appends the header's encoding to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let g = self.group.as_str().as_bytes();
        let s = self.sender.as_str().as_bytes();
        // Names are at most 128 and 255 bytes long (conclave_gcs rules).
        out.push(g.len() as u8);
        out.extend_from_slice(g);
        out.extend_from_slice(&self.epoch.to_bytes());
        out.extend_from_slice(&self.view.to_bytes());
        out.push(s.len() as u8);
        out.extend_from_slice(s);
        out.extend_from_slice(&self.seq.to_be_bytes());
    }

    /// Splits `bytes` into a header, the header's encoding and the rest.
    /// Never panics.
    pub fn decode(bytes: &[u8]) -> Result<(DataHeader, &[u8], &[u8]), DataError> {
        fn epoch_of(b: &[u8]) -> Epoch {
            let mut a = [0u8; EPOCH_LEN];
            a.copy_from_slice(b);
            Epoch::from_bytes(a)
        }
        fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], DataError> {
            if b.len() < n {
                return Err(DataError::Malformed);
            }
            let (h, t) = b.split_at(n);
            *b = t;
            Ok(h)
        }
        fn u64_of(b: &[u8]) -> u64 {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_be_bytes(a)
        }
        let mut rest = bytes;
        let glen = take(&mut rest, 1)?[0] as usize;
        let group = std::str::from_utf8(take(&mut rest, glen)?).map_err(|_| DataError::Malformed)?;
        let epoch = epoch_of(take(&mut rest, EPOCH_LEN)?);
        let view = ViewId::from_bytes(take(&mut rest, 16)?.try_into().expect("16 bytes taken"));
        let slen = take(&mut rest, 1)?[0] as usize;
        let sender = std::str::from_utf8(take(&mut rest, slen)?).map_err(|_| DataError::Malformed)?;
        let seq = u64_of(take(&mut rest, 8)?);
        let header = DataHeader {
            group: GroupName::new(group).map_err(|_| DataError::Malformed)?,
            epoch,
            view,
            sender: MemberId::new(sender).map_err(|_| DataError::Malformed)?,
            seq,
        };
        let hlen = bytes.len() - rest.len();
        Ok((header, &bytes[..hlen], rest))
    }
}

/// The root of [`EpochKeys::fixed_public`]: public, and never a group key's.
const FIXED_PUBLIC_ROOT: &[u8; 32] = b"conclave/secure/v1/public-root!!";

/// The data keys of one group and epoch: the root from which every sender's
/// key is derived, and the senders' keys derived so far. Zeroized on drop;
/// never printed.
pub struct EpochKeys {
    group: GroupName,
    epoch: Epoch,
    root: Zeroizing<[u8; 32]>,
    /// Senders' keys of this group and epoch already derived (HKDF once per
    /// sender, not per message); at most [`SENDER_KEYS`], then it starts
    /// afresh. A message that claims another group or epoch gets its key
    /// derived each time (it is refused anyway).
    derived: Mutex<HashMap<MemberId, Zeroizing<[u8; 32]>>>,
}

/// The most senders' keys an [`EpochKeys`] remembers: bounded, whatever
/// names and epochs the messages it is handed claim.
const SENDER_KEYS: usize = 1024;

impl Clone for EpochKeys {
    fn clone(&self) -> Self {
        Self { group: self.group.clone(), epoch: self.epoch, root: self.root.clone(), derived: Mutex::default() }
    }
}

/// A data message split into its parts (nothing checked yet).
struct Parts<'a> {
    header: DataHeader,
    /// The header's and the lengths' encoding (the AEAD's associated data).
    aad: &'a [u8],
    /// The messages' lengths, each within the ciphertext, summing to it.
    lengths: Vec<usize>,
    /// Ciphertext and AEAD tag.
    ciphertext: &'a [u8],
    signature: &'a [u8],
}

impl<'a> Parts<'a> {
    fn split(bytes: &'a [u8]) -> Result<Self, DataError> {
        let (header, head, rest) = DataHeader::decode(bytes)?;
        let (lengths, part) = read_lengths(rest).ok_or(DataError::Malformed)?;
        let total = lengths.iter().try_fold(0usize, |t, &n| t.checked_add(n)).ok_or(DataError::Malformed)?;
        let aad = &bytes[..head.len() + part];
        let (rest, len) = rest[part..].split_last_chunk::<2>().ok_or(DataError::Malformed)?;
        let len = u16::from_be_bytes(*len) as usize;
        if len > MAX_SIGNATURE || total.checked_add(TAG_LEN).and_then(|t| t.checked_add(len)) != Some(rest.len()) {
            return Err(DataError::Malformed);
        }
        let (ciphertext, signature) = rest.split_at(rest.len() - len);
        Ok(Self { header, aad, lengths, ciphertext, signature })
    }
}

/// What the sender signs: a domain tag and the BLAKE3 digest of the header,
/// the lengths and the ciphertext. Header and lengths are self-delimiting
/// (every field has its length or a fixed one), so they parse one way.
fn signed_bytes(aad: &[u8], ciphertext: &[u8]) -> [u8; SIGNATURE_DOMAIN.len() + 32] {
    let digest = blake3::Hasher::new().update(aad).update(ciphertext).finalize();
    let mut v = [0u8; SIGNATURE_DOMAIN.len() + 32];
    v[..SIGNATURE_DOMAIN.len()].copy_from_slice(SIGNATURE_DOMAIN);
    v[SIGNATURE_DOMAIN.len()..].copy_from_slice(digest.as_bytes());
    v
}

impl fmt::Debug for EpochKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EpochKeys({} epoch {})", self.group, self.epoch)
    }
}

impl EpochKeys {
    /// The data keys of `group` in `epoch`, from the group key agreed for it.
    pub fn new(group: GroupName, epoch: Epoch, key: &GroupKey) -> Self {
        Self { group, epoch, root: Zeroizing::new(*key.expose_secret()), derived: Mutex::default() }
    }

    /// Keys of `group` in `epoch` from a fixed root that everybody knows:
    /// they protect nothing. [`crate::payload::parse_payload`] opens data
    /// messages with them, so the decryption path is reached without a
    /// group key.
    pub(crate) fn fixed_public(group: GroupName, epoch: Epoch) -> Self {
        Self { group, epoch, root: Zeroizing::new(*FIXED_PUBLIC_ROOT), derived: Mutex::default() }
    }

    /// Test hook: the keys [`crate::payload::parse_payload`] opens data
    /// messages with (a fixed, public root), to seal messages it can open.
    /// They protect nothing.
    #[cfg(feature = "test-hooks")]
    pub fn fixed_public_for_tests(group: GroupName, epoch: Epoch) -> Self {
        Self::fixed_public(group, epoch)
    }

    /// The epoch.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The group.
    pub fn group(&self) -> &GroupName {
        &self.group
    }

    /// The data key of `sender` for the epoch named in a header. Deriving
    /// with the header's epoch (not `self.epoch`) means keys of one epoch
    /// never open a message that claims another.
    fn cipher(&self, group: &GroupName, epoch: Epoch, sender: &MemberId) -> LessSafeKey {
        let aead =
            |k: &[u8; 32]| LessSafeKey::new(UnboundKey::new(&AES_256_GCM, k).expect("32 bytes is an AES-256 key"));
        if (group, epoch) != (&self.group, self.epoch) {
            return aead(&self.derive(group, epoch, sender));
        }
        let mut derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = derived.get(sender) {
            return aead(k);
        }
        if derived.len() >= SENDER_KEYS {
            derived.clear();
        }
        let k = self.derive(group, epoch, sender);
        let cipher = aead(&k);
        derived.insert(sender.clone(), k);
        cipher
    }

    /// HKDF-SHA256 of the root for `sender` in `group` and `epoch`.
    fn derive(&self, group: &GroupName, epoch: Epoch, sender: &MemberId) -> Zeroizing<[u8; 32]> {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/secure/v2/data-key-aes256gcm"), self.root.as_ref());
        let g = group.as_str().as_bytes();
        let s = sender.as_str().as_bytes();
        let mut info = Vec::with_capacity(2 + g.len() + EPOCH_LEN + 1 + s.len());
        info.push(g.len() as u8);
        info.extend_from_slice(g);
        info.extend_from_slice(&epoch.to_bytes());
        info.push(s.len() as u8);
        info.extend_from_slice(s);
        let mut k = Zeroizing::new([0u8; 32]);
        hk.expand(&info, k.as_mut()).expect("32 bytes is a valid HKDF-SHA256 output length");
        k
    }

    fn nonce(seq: u64) -> Nonce {
        let mut n = [0u8; 12];
        n[4..].copy_from_slice(&seq.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    /// Encrypts `messages` (one or more) as bundle `seq` of `sender`, sent in
    /// daemon view `view`, and signs it with `signer` (the sender's identity
    /// key), if any: `header ‖ lengths ‖ ciphertext ‖ AEAD tag ‖ signature ‖
    /// u16 signature length`.
    pub fn seal<M: AsRef<[u8]>>(
        &self,
        sender: &MemberId,
        view: ViewId,
        seq: u64,
        messages: &[M],
        signer: Option<&dyn Signer>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        self.seal_into(&mut out, sender, view, seq, messages, signer);
        out
    }

    /// [`EpochKeys::seal`], appended to `out` (which may hold a frame's tag:
    /// the message is written once, where it goes).
    pub fn seal_into<M: AsRef<[u8]>>(
        &self,
        out: &mut Vec<u8>,
        sender: &MemberId,
        view: ViewId,
        seq: u64,
        messages: &[M],
        signer: Option<&dyn Signer>,
    ) {
        assert!(!messages.is_empty(), "a bundle has at least one message");
        let header = DataHeader { group: self.group.clone(), epoch: self.epoch, view, sender: sender.clone(), seq };
        let body: usize = messages.iter().map(|m| BUNDLE_ENTRY_OVERHEAD + m.as_ref().len()).sum();
        out.reserve(64 + BUNDLE_COUNT_LEN + body + TAG_LEN + 2 + 256);
        let start = out.len();
        header.encode(out);
        write_lengths(out, messages);
        let aad_end = out.len();
        for m in messages {
            out.extend_from_slice(m.as_ref());
        }
        let (aad, plaintext) = out[start..].split_at_mut(aad_end - start);
        let tag = self
            .cipher(&self.group, self.epoch, sender)
            .seal_in_place_separate_tag(Self::nonce(seq), Aad::from(&*aad), plaintext)
            .expect("AES-256-GCM encrypts any message the daemon accepts");
        out.extend_from_slice(tag.as_ref());
        let sig = signer.map(|s| s.sign(&signed_bytes(&out[start..aad_end], &out[aad_end..]))).unwrap_or_default();
        out.extend_from_slice(&sig);
        out.extend_from_slice(&u16::try_from(sig.len()).expect("signatures fit MAX_SIGNATURE").to_be_bytes());
    }

    /// Authenticates and decrypts a data message, then checks its sender's
    /// signature with `sender_key` (the key of the member the header names;
    /// `None` skips the check: for one's own messages, which the caller
    /// recognises otherwise, and for parsing), and splits the bundle into
    /// its messages (slices of one buffer). Does not check that the header
    /// names this epoch, sender or group: the caller decides which keys to
    /// use; keys of any other epoch or group fail with
    /// [`DataError::AuthFailed`].
    pub fn open(&self, bytes: &[u8], sender_key: Option<&dyn Verifier>) -> Result<(DataHeader, Vec<Bytes>), DataError> {
        let Parts { header, aad, lengths, ciphertext, signature } = Parts::split(bytes)?;
        let mut buf = ciphertext.to_vec();
        let len = self
            .cipher(&header.group, header.epoch, &header.sender)
            .open_in_place(Self::nonce(header.seq), Aad::from(aad), &mut buf)
            .map_err(|_| DataError::AuthFailed)?
            .len();
        if let Some(key) = sender_key {
            key.verify(&signed_bytes(aad, ciphertext), signature).map_err(|_| DataError::BadSignature)?;
        }
        buf.truncate(len);
        let buf = Bytes::from(buf);
        let mut at = 0;
        let messages = lengths
            .into_iter()
            .map(|n| {
                at += n;
                buf.slice(at - n..at)
            })
            .collect();
        Ok((header, messages))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use conclave_gka::suite::{generate_signer, SignatureId};
    use rand_chacha::ChaCha20Rng;
    use rand_core::SeedableRng;

    fn epoch(seq: u64) -> Epoch {
        Epoch::new(ViewId::new(0xfeed, seq), 0)
    }

    fn keys(seq: u64, secret: u8) -> EpochKeys {
        EpochKeys {
            group: GroupName::new("g").unwrap(),
            epoch: epoch(seq),
            root: Zeroizing::new([secret; 32]),
            derived: Mutex::default(),
        }
    }

    fn signer(seed: u64) -> std::sync::Arc<dyn Signer> {
        generate_signer(SignatureId::Ed25519, &mut ChaCha20Rng::seed_from_u64(seed)).unwrap()
    }

    #[test]
    fn round_trip_and_every_alteration_fails() {
        let k = keys(7, 1);
        let alice = MemberId::new("alice").unwrap();
        let (a, b) = (signer(1), signer(2));
        let m = k.seal(&alice, ViewId::new(0xfeed, 1), 3, &[b"hello"], Some(a.as_ref()));
        let (h, pt) = k.open(&m, Some(a.verifier().as_ref())).unwrap();
        assert_eq!((h.epoch, h.seq, h.sender.as_str(), &pt[0][..]), (epoch(7), 3, "alice", &b"hello"[..]));
        assert_eq!(pt.len(), 1);
        for i in 0..m.len() {
            let mut t = m.clone();
            t[i] ^= 1;
            assert!(k.open(&t, Some(a.verifier().as_ref())).is_err(), "flipping byte {i} went unnoticed");
        }
        assert_eq!(keys(7, 2).open(&m, None), Err(DataError::AuthFailed));
        assert_eq!(keys(8, 1).open(&m, None).map(|_| ()), Ok(()), "open derives from the header's epoch");
        assert_eq!(k.open(&m[..5], None), Err(DataError::Malformed));
        // Another member, holding the same group key, writes in alice's name:
        // the AEAD accepts it, alice's key refuses it.
        let forged = k.seal(&alice, ViewId::new(0xfeed, 1), 4, &[b"from alice, honest"], Some(b.as_ref()));
        assert!(k.open(&forged, None).is_ok(), "the group key alone cannot tell members apart");
        assert_eq!(k.open(&forged, Some(a.verifier().as_ref())), Err(DataError::BadSignature));
    }

    #[test]
    fn a_bundle_opens_into_its_messages_in_order_and_bad_lengths_are_refused() {
        let k = keys(3, 4);
        let alice = MemberId::new("alice").unwrap();
        let a = signer(5);
        let msgs: [&[u8]; 4] = [b"one", b"", b"three", &[9u8; 70_000]];
        let m = k.seal(&alice, ViewId::new(0xfeed, 1), 0, &msgs, Some(a.as_ref()));
        let (_, got) = k.open(&m, Some(a.verifier().as_ref())).unwrap();
        assert_eq!(got, msgs);
        // Lengths that do not add up to the ciphertext, a count of none, a
        // count past the end: refused before any key is used.
        let hlen = DataHeader::decode(&m).unwrap().1.len();
        let mut longer = m.clone();
        longer[hlen + 4 + 3] += 1; // the first length, 3 -> 4
        let mut none = m.clone();
        none[hlen..hlen + 4].copy_from_slice(&0u32.to_be_bytes());
        let mut huge = m.clone();
        huge[hlen..hlen + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        for bad in [longer, none, huge] {
            assert_eq!(keys(9, 9).open(&bad, None), Err(DataError::Malformed));
        }
        // Lengths that add up but split the messages differently: the AEAD
        // (the lengths are its associated data) refuses them.
        let mut moved = m.clone();
        moved[hlen + 4 + 3] += 1; // "one" -> 4 bytes ...
        moved[hlen + 8 + 3] = 0; // ... "" stays empty ...
        moved[hlen + 12 + 3] -= 1; // ... "three" -> 4 bytes
        assert_eq!(k.open(&moved, None), Err(DataError::AuthFailed));
    }

    #[test]
    fn senders_keys_are_derived_once_and_remembered_within_a_bound() {
        let k = keys(1, 7);
        let (a, b) = (MemberId::new("a").unwrap(), MemberId::new("b").unwrap());
        let (g, e) = (k.group.clone(), k.epoch);
        assert_eq!(k.derive(&g, e, &a), k.derive(&g, e, &a));
        assert_ne!(k.derive(&g, e, &a), k.derive(&g, e, &b));
        // The remembered key opens what the derived one sealed, and the
        // store never holds more than its bound, whatever names it is handed.
        let sealed = k.seal(&a, ViewId::from_bytes([0; 16]), 3, &[b"hello"], None);
        for i in 0..SENDER_KEYS + 10 {
            k.cipher(&g, e, &MemberId::new(format!("m{i}")).unwrap());
            assert!(k.derived.lock().unwrap().len() <= SENDER_KEYS);
        }
        let fresh = keys(1, 7);
        assert_eq!(fresh.open(&sealed, None).unwrap().1, [&b"hello"[..]]);
        assert_eq!(k.open(&sealed, None).unwrap().1, [&b"hello"[..]]);
        assert_eq!(k.open(&sealed, None).unwrap().1, [&b"hello"[..]]);
    }

    #[test]
    fn senders_get_distinct_keys_and_debug_shows_no_secret() {
        let k = keys(1, 9);
        let s = signer(3);
        let a = k.seal(&MemberId::new("a").unwrap(), ViewId::new(0xfeed, 1), 0, &[b"same"], Some(s.as_ref()));
        let b = k.seal(&MemberId::new("b").unwrap(), ViewId::new(0xfeed, 1), 0, &[b"same"], Some(s.as_ref()));
        assert_ne!(a[a.len() - 20..], b[b.len() - 20..]);
        let shown = format!("{k:?}");
        assert!(!shown.contains("9, 9") && !shown.contains("0909"), "{shown}");
    }
}
