//! Data messages: the header, the per-epoch and per-sender keys, AEAD and
//! the sender's signature.
//!
//! A data message is `header ‖ u16 signature length ‖ signature ‖ ciphertext`.
//! The header carries the group, the key epoch ([`Epoch`]: the view the key
//! was agreed in and the run in it), the daemon view the sender sent it in,
//! the sender and the sender's sequence number in that epoch; it is
//! authenticated as the AEAD's associated data. The view matters where a key
//! outlives views (interval rekeying): a receiver accepts a message only in
//! the view it was sent in, so a message of one view (or of another
//! component under the same key) cannot be delivered in another.
//!
//! **Sender authentication.** Every member holds the group key, so the AEAD
//! alone proves only that *a member* wrote the message: any insider could
//! derive another member's data key and write in its name. The signature,
//! by the sender's long-term identity key over a domain tag and the SHA-256
//! of the header and the ciphertext (MLS signs application messages whole),
//! proves which member it was. The digest is taken once by the sender and
//! once by each receiver; Ed25519 over the message itself would run SHA-512
//! over it twice to sign and once more per receiver, which at 16 KiB cost
//! more than the signature's fixed work. (Not the AEAD tag alone: every
//! member holds the key it is made with, and Poly1305 under a known key
//! gives other ciphertexts with the same tag.) Receivers check the AEAD first (cheap: it turns away everyone
//! outside the group) and then the signature. Each sender encrypts under its own key, derived with
//! HKDF-SHA256 from the epoch's group key with an `info` that binds the group,
//! the epoch and the sender, so two senders never share a (key, nonce) pair.
//! The 96-bit ChaCha20-Poly1305 nonce is the sequence number, which a sender
//! never repeats within an epoch.
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

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};
use conclave_gcs::{GroupName, MemberId};
use conclave_gka::key::EPOCH_LEN;
use conclave_gka::suite::{Signer, Verifier};
use conclave_gka::{Epoch, GroupKey, ViewId};
use hkdf::Hkdf;
use sha2::{Digest, Sha256};
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

const SIGNATURE_DOMAIN: &[u8] = b"conclave/secure/v1/data-signature-sha256";

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
    signature: &'a [u8],
    ciphertext: &'a [u8],
}

impl<'a> Parts<'a> {
    fn split(bytes: &'a [u8]) -> Result<Self, DataError> {
        let (header, aad, rest) = DataHeader::decode(bytes)?;
        let (len, rest) = rest.split_first_chunk::<2>().ok_or(DataError::Malformed)?;
        let len = u16::from_be_bytes(*len) as usize;
        if len > MAX_SIGNATURE {
            return Err(DataError::Malformed);
        }
        let (signature, ciphertext) = rest.split_at_checked(len).ok_or(DataError::Malformed)?;
        Ok(Self { header, aad, signature, ciphertext })
    }
}

/// What the sender signs: a domain tag, the header and the ciphertext.
fn signed_bytes(aad: &[u8], ciphertext: &[u8]) -> Vec<u8> {
    // The header is self-delimiting (every field has its length or a fixed
    // one), so header ‖ ciphertext parses one way.
    let digest = Sha256::new().chain_update(aad).chain_update(ciphertext).finalize();
    let mut v = Vec::with_capacity(SIGNATURE_DOMAIN.len() + digest.len());
    v.extend_from_slice(SIGNATURE_DOMAIN);
    v.extend_from_slice(&digest);
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

    /// The AEAD of `sender` for the epoch named in a header. Deriving with the
    /// header's epoch (not `self.epoch`) means keys of one epoch never open a
    /// message that claims another.
    fn cipher(&self, group: &GroupName, epoch: Epoch, sender: &MemberId) -> ChaCha20Poly1305 {
        if (group, epoch) != (&self.group, self.epoch) {
            return ChaCha20Poly1305::new(Key::from_slice(self.derive(group, epoch, sender).as_ref()));
        }
        let mut derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = derived.get(sender) {
            return ChaCha20Poly1305::new(Key::from_slice(k.as_ref()));
        }
        if derived.len() >= SENDER_KEYS {
            derived.clear();
        }
        let k = self.derive(group, epoch, sender);
        let cipher = ChaCha20Poly1305::new(Key::from_slice(k.as_ref()));
        derived.insert(sender.clone(), k);
        cipher
    }

    /// HKDF-SHA256 of the root for `sender` in `group` and `epoch`.
    fn derive(&self, group: &GroupName, epoch: Epoch, sender: &MemberId) -> Zeroizing<[u8; 32]> {
        let hk = Hkdf::<Sha256>::new(Some(b"conclave/secure/v1/data-key"), self.root.as_ref());
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
        *Nonce::from_slice(&n)
    }

    /// Encrypts `plaintext` as message `seq` of `sender`, sent in daemon
    /// view `view`, and signs it with `signer` (the sender's identity key),
    /// if any: `header ‖ u16 signature length ‖ signature ‖ ciphertext`.
    pub fn seal(
        &self,
        sender: &MemberId,
        view: ViewId,
        seq: u64,
        plaintext: &[u8],
        signer: Option<&dyn Signer>,
    ) -> Vec<u8> {
        let header = DataHeader { group: self.group.clone(), epoch: self.epoch, view, sender: sender.clone(), seq };
        let mut aad = Vec::with_capacity(64);
        header.encode(&mut aad);
        let ct = self
            .cipher(&self.group, self.epoch, sender)
            .encrypt(&Self::nonce(seq), Payload { msg: plaintext, aad: &aad })
            .expect("ChaCha20-Poly1305 encrypts any message the daemon accepts");
        let sig = signer.map(|s| s.sign(&signed_bytes(&aad, &ct))).unwrap_or_default();
        let mut out = aad;
        out.reserve(2 + sig.len() + ct.len());
        out.extend_from_slice(&u16::try_from(sig.len()).expect("signatures fit MAX_SIGNATURE").to_be_bytes());
        out.extend_from_slice(&sig);
        out.extend_from_slice(&ct);
        out
    }

    /// Authenticates and decrypts a data message, then checks its sender's
    /// signature with `sender_key` (the key of the member the header names;
    /// `None` skips the check: for one's own messages, which the caller
    /// recognises otherwise, and for parsing). Does not check that the
    /// header names this epoch, sender or group: the caller decides which
    /// keys to use; keys of any other epoch or group fail with
    /// [`DataError::AuthFailed`].
    pub fn open(&self, bytes: &[u8], sender_key: Option<&dyn Verifier>) -> Result<(DataHeader, Vec<u8>), DataError> {
        let Parts { header, aad, signature, ciphertext } = Parts::split(bytes)?;
        let pt = self
            .cipher(&header.group, header.epoch, &header.sender)
            .decrypt(&Self::nonce(header.seq), Payload { msg: ciphertext, aad })
            .map_err(|_| DataError::AuthFailed)?;
        if let Some(key) = sender_key {
            key.verify(&signed_bytes(aad, ciphertext), signature).map_err(|_| DataError::BadSignature)?;
        }
        Ok((header, pt))
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
        let m = k.seal(&alice, ViewId::new(0xfeed, 1), 3, b"hello", Some(a.as_ref()));
        let (h, pt) = k.open(&m, Some(a.verifier().as_ref())).unwrap();
        assert_eq!((h.epoch, h.seq, h.sender.as_str(), pt.as_slice()), (epoch(7), 3, "alice", &b"hello"[..]));
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
        let forged = k.seal(&alice, ViewId::new(0xfeed, 1), 4, b"from alice, honest", Some(b.as_ref()));
        assert!(k.open(&forged, None).is_ok(), "the group key alone cannot tell members apart");
        assert_eq!(k.open(&forged, Some(a.verifier().as_ref())), Err(DataError::BadSignature));
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
        let sealed = k.seal(&a, ViewId::from_bytes([0; 16]), 3, b"hello", None);
        for i in 0..SENDER_KEYS + 10 {
            k.cipher(&g, e, &MemberId::new(format!("m{i}")).unwrap());
            assert!(k.derived.lock().unwrap().len() <= SENDER_KEYS);
        }
        let fresh = keys(1, 7);
        assert_eq!(fresh.open(&sealed, None).unwrap().1, b"hello");
        assert_eq!(k.open(&sealed, None).unwrap().1, b"hello");
        assert_eq!(k.open(&sealed, None).unwrap().1, b"hello");
    }

    #[test]
    fn senders_get_distinct_keys_and_debug_shows_no_secret() {
        let k = keys(1, 9);
        let s = signer(3);
        let a = k.seal(&MemberId::new("a").unwrap(), ViewId::new(0xfeed, 1), 0, b"same", Some(s.as_ref()));
        let b = k.seal(&MemberId::new("b").unwrap(), ViewId::new(0xfeed, 1), 0, b"same", Some(s.as_ref()));
        assert_ne!(a[a.len() - 20..], b[b.len() - 20..]);
        let shown = format!("{k:?}");
        assert!(!shown.contains("9, 9") && !shown.contains("0909"), "{shown}");
    }
}
