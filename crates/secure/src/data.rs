//! Data messages: the header, the per-epoch and per-sender keys, AEAD and
//! the sender's signature.
//!
//! A data message is `header ‖ ciphertext ‖ signature ‖ u16 signature
//! length`. The header carries the group, the key epoch ([`Epoch`]: the view
//! the key was agreed in and the run in it), the daemon view the sender sent
//! it in, the sender and the sender's sequence number in that epoch; it is
//! authenticated as the AEAD's associated data. The view matters where a key
//! outlives views (interval rekeying): a receiver accepts a message only in
//! the view it was sent in, so a message of one view (or of another
//! component under the same key) cannot be delivered in another.
//!
//! **Bundles.** The ciphertext holds one or more application messages, each
//! `u32 length ‖ bytes`: a sender that has several messages waiting seals
//! and signs them together ([`crate::core`] sends a bundle when fewer than a
//! few of its own are on their way back), so the signature's fixed cost is
//! paid once per bundle, not once per message. Receivers deliver the
//! messages of a bundle one by one, in order; a bundle is accepted or
//! refused whole.
//!
//! **Sender authentication.** Every member holds the group key, so the AEAD
//! alone proves only that *a member* wrote the message: any insider could
//! derive another member's data key and write in its name. The signature,
//! by the sender's long-term identity key over a domain tag and the BLAKE3
//! digest of the header and the ciphertext (MLS signs application messages
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
    /// The header's encoding (the AEAD's associated data).
    aad: &'a [u8],
    /// Ciphertext and AEAD tag.
    ciphertext: &'a [u8],
    signature: &'a [u8],
}

impl<'a> Parts<'a> {
    fn split(bytes: &'a [u8]) -> Result<Self, DataError> {
        let (header, aad, rest) = DataHeader::decode(bytes)?;
        let (rest, len) = rest.split_last_chunk::<2>().ok_or(DataError::Malformed)?;
        let len = u16::from_be_bytes(*len) as usize;
        if len > MAX_SIGNATURE || rest.len() < len + TAG_LEN {
            return Err(DataError::Malformed);
        }
        let (ciphertext, signature) = rest.split_at(rest.len() - len);
        Ok(Self { header, aad, ciphertext, signature })
    }
}

/// What the sender signs: a domain tag and the BLAKE3 digest of the header
/// and the ciphertext. The header is self-delimiting (every field has its
/// length or a fixed one), so header ‖ ciphertext parses one way.
fn signed_bytes(aad: &[u8], ciphertext: &[u8]) -> [u8; SIGNATURE_DOMAIN.len() + 32] {
    let digest = blake3::Hasher::new().update(aad).update(ciphertext).finalize();
    let mut v = [0u8; SIGNATURE_DOMAIN.len() + 32];
    v[..SIGNATURE_DOMAIN.len()].copy_from_slice(SIGNATURE_DOMAIN);
    v[SIGNATURE_DOMAIN.len()..].copy_from_slice(digest.as_bytes());
    v
}

/// Splits a bundle's plaintext into its messages: one or more
/// `u32 length ‖ bytes`, nothing after the last.
fn unbundle(mut plaintext: &[u8]) -> Result<Vec<Vec<u8>>, DataError> {
    let mut out = Vec::new();
    while !plaintext.is_empty() {
        let (len, rest) = plaintext.split_first_chunk::<4>().ok_or(DataError::Malformed)?;
        let len = u32::from_be_bytes(*len) as usize;
        let (m, rest) = rest.split_at_checked(len).ok_or(DataError::Malformed)?;
        out.push(m.to_vec());
        plaintext = rest;
    }
    if out.is_empty() {
        return Err(DataError::Malformed);
    }
    Ok(out)
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

    /// Bytes [`EpochKeys::seal`] adds to `messages` for a sender named
    /// `sender` in a group named `group`, signing with at most
    /// `signature` bytes: what a bundle's size is checked against.
    pub fn overhead(group: &GroupName, sender: &MemberId, signature: usize, messages: usize) -> usize {
        // u8 lengths, epoch, view, seq; tag; signature and its length.
        1 + group.as_str().len()
            + EPOCH_LEN
            + 16
            + 1
            + sender.as_str().len()
            + 8
            + TAG_LEN
            + signature
            + 2
            + messages * BUNDLE_ENTRY_OVERHEAD
    }

    /// Encrypts `messages` (one or more) as bundle `seq` of `sender`, sent in
    /// daemon view `view`, and signs it with `signer` (the sender's identity
    /// key), if any: `header ‖ ciphertext ‖ signature ‖ u16 signature length`.
    pub fn seal<M: AsRef<[u8]>>(
        &self,
        sender: &MemberId,
        view: ViewId,
        seq: u64,
        messages: &[M],
        signer: Option<&dyn Signer>,
    ) -> Vec<u8> {
        assert!(!messages.is_empty(), "a bundle has at least one message");
        let header = DataHeader { group: self.group.clone(), epoch: self.epoch, view, sender: sender.clone(), seq };
        let body: usize = messages.iter().map(|m| BUNDLE_ENTRY_OVERHEAD + m.as_ref().len()).sum();
        let mut out = Vec::with_capacity(64 + body + TAG_LEN + 2 + 256);
        header.encode(&mut out);
        let hlen = out.len();
        for m in messages {
            let m = m.as_ref();
            out.extend_from_slice(&u32::try_from(m.len()).expect("messages fit the daemon's payload").to_be_bytes());
            out.extend_from_slice(m);
        }
        let (aad, plaintext) = out.split_at_mut(hlen);
        let tag = self
            .cipher(&self.group, self.epoch, sender)
            .seal_in_place_separate_tag(Self::nonce(seq), Aad::from(&*aad), plaintext)
            .expect("AES-256-GCM encrypts any message the daemon accepts");
        out.extend_from_slice(tag.as_ref());
        let sig = signer.map(|s| s.sign(&signed_bytes(&out[..hlen], &out[hlen..]))).unwrap_or_default();
        out.extend_from_slice(&sig);
        out.extend_from_slice(&u16::try_from(sig.len()).expect("signatures fit MAX_SIGNATURE").to_be_bytes());
        out
    }

    /// Authenticates and decrypts a data message, then checks its sender's
    /// signature with `sender_key` (the key of the member the header names;
    /// `None` skips the check: for one's own messages, which the caller
    /// recognises otherwise, and for parsing), and splits the bundle into
    /// its messages. Does not check that the header names this epoch, sender
    /// or group: the caller decides which keys to use; keys of any other
    /// epoch or group fail with [`DataError::AuthFailed`].
    pub fn open(
        &self,
        bytes: &[u8],
        sender_key: Option<&dyn Verifier>,
    ) -> Result<(DataHeader, Vec<Vec<u8>>), DataError> {
        let Parts { header, aad, ciphertext, signature } = Parts::split(bytes)?;
        let mut buf = ciphertext.to_vec();
        let plaintext = self
            .cipher(&header.group, header.epoch, &header.sender)
            .open_in_place(Self::nonce(header.seq), Aad::from(aad), &mut buf)
            .map_err(|_| DataError::AuthFailed)?;
        if let Some(key) = sender_key {
            key.verify(&signed_bytes(aad, ciphertext), signature).map_err(|_| DataError::BadSignature)?;
        }
        let messages = unbundle(plaintext)?;
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
        assert_eq!((h.epoch, h.seq, h.sender.as_str(), pt[0].as_slice()), (epoch(7), 3, "alice", &b"hello"[..]));
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
    fn a_bundle_opens_into_its_messages_in_order_and_a_malformed_one_is_refused() {
        let k = keys(3, 4);
        let alice = MemberId::new("alice").unwrap();
        let a = signer(5);
        let msgs: [&[u8]; 4] = [b"one", b"", b"three", &[9u8; 70_000]];
        let m = k.seal(&alice, ViewId::new(0xfeed, 1), 0, &msgs, Some(a.as_ref()));
        let (_, got) = k.open(&m, Some(a.verifier().as_ref())).unwrap();
        assert_eq!(got, msgs.map(|m| m.to_vec()));
        // The sender's own bytes, well sealed and signed but not a bundle
        // (a length past the end, an empty plaintext): refused whole.
        for plaintext in [&[0u8, 0, 0, 9, 1][..], &[]] {
            let header = DataHeader {
                group: k.group.clone(),
                epoch: k.epoch,
                view: ViewId::new(1, 1),
                sender: alice.clone(),
                seq: 1,
            };
            let mut out = Vec::new();
            header.encode(&mut out);
            let hlen = out.len();
            out.extend_from_slice(plaintext);
            let (aad, body) = out.split_at_mut(hlen);
            let tag = k
                .cipher(&k.group, k.epoch, &alice)
                .seal_in_place_separate_tag(EpochKeys::nonce(1), Aad::from(&*aad), body)
                .unwrap();
            out.extend_from_slice(tag.as_ref());
            let sig = a.sign(&signed_bytes(&out[..hlen], &out[hlen..]));
            out.extend_from_slice(&sig);
            out.extend_from_slice(&(sig.len() as u16).to_be_bytes());
            assert_eq!(k.open(&out, Some(a.verifier().as_ref())), Err(DataError::Malformed));
        }
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
        assert_eq!(fresh.open(&sealed, None).unwrap().1, [b"hello"]);
        assert_eq!(k.open(&sealed, None).unwrap().1, [b"hello"]);
        assert_eq!(k.open(&sealed, None).unwrap().1, [b"hello"]);
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
