//! Optimized EVS (paper §4.3.3): the daemons key every view of a group as
//! in Integrated VS, and re-encrypt, before delivery, any message sealed
//! under the key of a view other than the one it is delivered in — the
//! paper's *EVS-Fix-Messages* module.
//!
//! A member's message may be ordered after a view change it did not see yet
//! (extended virtual synchrony: a message is delivered in the view it is
//! ordered in, not always the one it was sent in). Under Integrated VS its
//! receivers cannot read it in the new view, so its sender sends it again;
//! under Optimized EVS the daemons fix it on the way: nothing is sent twice.
//!
//! # The envelope
//!
//! Members write, and daemons rewrite, an *envelope* (first byte [`TAG`]):
//!
//! ```text
//! TAG | key view (16) | writer | seq u64 | messages u32 | ciphertext and AEAD tag   (sealed)
//! TAG | delivered in (16) | 2 | reason u8 | key view (16) | seq u64 | messages u32 (notice)
//! writer: 0 | u8 length | member name     (written by a member)
//!         1 | u16 daemon                  (re-encrypted by a daemon)
//! ```
//!
//! `messages` is how many application messages the envelope carries (the
//! secure layer seals a bundle of them): a notice says how many are lost.
//!
//! The *key view* is the key id: the view whose key sealed the message. The
//! paper's key id is 32 random bits kept beside each key; here it is the
//! view id itself (16 bytes, already in clear in every data header), so a
//! daemon finds the key without a table of ids, and no two keys share one.
//! The cipher is AES-256-GCM (ring's: 7× faster than the portable
//! ChaCha20-Poly1305 at 64 KiB on these AES-NI machines, and the daemons
//! re-encrypt) under `HMAC-SHA256(view key, label ‖ group ‖ writer)`, so every writer has a key of its own and its count
//! `seq` is a nonce no other writer uses; the associated data binds the
//! group and the whole header. What the envelope seals (the secure layer's
//! signed message) is opaque here.
//!
//! # The daemons' key store
//!
//! A daemon keeps the keys of each Optimized EVS group's views, every view
//! of the group, not only those with members on it ([`EvsKeys::installed`]):
//! a joiner's first view may be delivered here right after views that had
//! no member here, and messages sealed in them. Keys expire, as the paper
//! has it, by *key-out* (more than a set number of keys per group: the
//! oldest goes) and by *time-out* (no message sealed under a key was
//! received for a set time; the current key never times out). A message
//! whose key is gone, or was never here (sealed on the other side of a
//! partition, say), is not dropped silently: its receivers get a *notice*
//! in its place, and the secure layer reports it.
//!
//! What this trusts: every daemon holds every key of every group, as in
//! Integrated VS; members authenticate each other with their signatures
//! inside the envelope, which the daemons cannot forge.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use conclave_gcs::core::{DaemonId, ViewKey};
use conclave_gcs::{GroupName, MemberId, ViewId};
use hmac::{Hmac, Mac};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use sha2::Sha256;
use zeroize::Zeroizing;

/// The first byte of an envelope: the secure layer's payload tag for
/// Optimized EVS data (`conclave_secure::payload::tag::EVS`).
pub const TAG: u8 = 9;

const WRITER_MEMBER: u8 = 0;
const WRITER_DAEMON: u8 = 1;
const NOTICE: u8 = 2;

/// The label of a writer's key derivation.
const WRITER_KEY_LABEL: &[u8] = b"conclave/integrated/v2/evs-writer-key-aes256gcm";
/// The label that starts an envelope's associated data.
const AAD_LABEL: &[u8] = b"conclave/integrated/v1/evs-envelope";

/// The AEAD tag's length.
pub const AEAD_TAG_LEN: usize = 16;

/// The longest header an envelope has (tag, key view, a member writer of
/// 255 bytes, seq, messages).
pub const MAX_HEADER: usize = 1 + 16 + 2 + 255 + 8 + 4;

/// Default key-out: the most keys a daemon keeps per group. A message
/// crosses at most this many views less one and is still re-encrypted; a
/// view change is one ordered operation, so a message on its way while
/// seven others are applied is far beyond a busy group's usual case.
pub const DEFAULT_KEY_OUT: usize = 8;
/// Default time-out (shell clock microseconds): a key no message was
/// received under for a minute is dropped. Messages are ordered within
/// milliseconds on a LAN; a minute covers a daemon group's reconfiguration
/// (Corosync's token timeout and consensus take seconds) many times over.
pub const DEFAULT_TIME_OUT: u64 = 60_000_000;

/// Who wrote an envelope.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The member who sent it, under its view's key.
    Member(MemberId),
    /// A daemon that re-encrypted it.
    Daemon(DaemonId),
}

/// Why a message was replaced by a notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeReason {
    /// The daemon does not hold the key it was sealed under (expired, or
    /// never here).
    KeyGone,
    /// It did not open under the key it names (altered, or not sealed by a
    /// holder of that key).
    Unreadable,
}

impl NoticeReason {
    fn code(self) -> u8 {
        match self {
            NoticeReason::KeyGone => 0,
            NoticeReason::Unreadable => 1,
        }
    }
}

/// An envelope, decoded (nothing opened).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// A sealed message.
    Sealed {
        /// The view whose key sealed it.
        key_view: ViewId,
        /// Who sealed it.
        writer: Writer,
        /// The writer's count under that key (the nonce).
        seq: u64,
        /// How many application messages it carries.
        messages: u32,
        /// Everything before the ciphertext, tag included (associated data).
        header: &'a [u8],
        /// Ciphertext and AEAD tag.
        ciphertext: &'a [u8],
    },
    /// A message its receivers' daemon could not re-encrypt.
    Notice {
        /// The view it was delivered in.
        delivered_in: ViewId,
        /// Why.
        reason: NoticeReason,
        /// The view whose key it named.
        key_view: ViewId,
        /// The count the message had under that key: with the sender the
        /// daemon names, and the key view, it says which message is lost.
        seq: u64,
        /// How many application messages it carried.
        messages: u32,
    },
}

/// Why an envelope could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvsError {
    /// Not a well-formed envelope.
    #[error("malformed envelope")]
    Malformed,
    /// Did not open under the key it names.
    #[error("envelope did not authenticate")]
    AuthFailed,
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], EvsError> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or(EvsError::Malformed)?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, EvsError> {
        Ok(self.take(1)?[0])
    }
    fn view(&mut self) -> Result<ViewId, EvsError> {
        Ok(ViewId::from_bytes(self.take(16)?.try_into().expect("16 bytes")))
    }
    fn u32(&mut self) -> Result<u32, EvsError> {
        Ok(u32::from_be_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
}

impl<'a> Envelope<'a> {
    /// Decodes `bytes` (tag included); never panics.
    pub fn decode(bytes: &'a [u8]) -> Result<Self, EvsError> {
        let mut r = Reader { bytes, at: 0 };
        if r.u8()? != TAG {
            return Err(EvsError::Malformed);
        }
        let view = r.view()?;
        match r.u8()? {
            NOTICE => {
                let reason = match r.u8()? {
                    0 => NoticeReason::KeyGone,
                    1 => NoticeReason::Unreadable,
                    _ => return Err(EvsError::Malformed),
                };
                let key_view = r.view()?;
                let seq = u64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
                let messages = r.u32()?;
                if r.at != bytes.len() {
                    return Err(EvsError::Malformed);
                }
                Ok(Envelope::Notice { delivered_in: view, reason, key_view, seq, messages })
            }
            kind => {
                let writer = match kind {
                    WRITER_MEMBER => {
                        let len = r.u8()?;
                        let name = std::str::from_utf8(r.take(len.into())?).map_err(|_| EvsError::Malformed)?;
                        Writer::Member(MemberId::new(name).map_err(|_| EvsError::Malformed)?)
                    }
                    WRITER_DAEMON => {
                        let d = r.take(2)?;
                        Writer::Daemon(DaemonId(u16::from_be_bytes([d[0], d[1]])))
                    }
                    _ => return Err(EvsError::Malformed),
                };
                let seq = u64::from_be_bytes(r.take(8)?.try_into().expect("8 bytes"));
                let messages = r.u32()?;
                let (header, ciphertext) = bytes.split_at(r.at);
                if ciphertext.len() < AEAD_TAG_LEN {
                    return Err(EvsError::Malformed);
                }
                Ok(Envelope::Sealed { key_view: view, writer, seq, messages, header, ciphertext })
            }
        }
    }
}

fn writer_bytes(writer: &Writer, out: &mut Vec<u8>) {
    match writer {
        Writer::Member(m) => {
            out.push(WRITER_MEMBER);
            out.push(u8::try_from(m.as_str().len()).expect("member names are at most 255 bytes"));
            out.extend_from_slice(m.as_str().as_bytes());
        }
        Writer::Daemon(d) => {
            out.push(WRITER_DAEMON);
            out.extend_from_slice(&d.0.to_be_bytes());
        }
    }
}

/// The AEAD of `writer` under `key` in `group`.
fn writer_aead(key: &ViewKey, group: &GroupName, writer: &Writer) -> LessSafeKey {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key.expose_secret()).expect("HMAC takes any key");
    mac.update(WRITER_KEY_LABEL);
    mac.update(&(group.as_str().len() as u16).to_be_bytes());
    mac.update(group.as_str().as_bytes());
    let mut w = Vec::new();
    writer_bytes(writer, &mut w);
    mac.update(&w);
    let k = Zeroizing::new(<[u8; 32]>::from(mac.finalize().into_bytes()));
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &*k).expect("32 bytes is an AES-256 key"))
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn aad(group: &GroupName, header: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(AAD_LABEL.len() + 2 + group.as_str().len() + header.len());
    a.extend_from_slice(AAD_LABEL);
    a.extend_from_slice(&(group.as_str().len() as u16).to_be_bytes());
    a.extend_from_slice(group.as_str().as_bytes());
    a.extend_from_slice(header);
    a
}

/// Seals `inner`, which carries `messages` application messages, for
/// `group` under `key`, the key of view `key_view`, as `writer`'s message
/// number `seq` (which `writer` must never use twice under this key). The
/// result starts with [`TAG`].
pub fn seal(
    key: &ViewKey,
    group: &GroupName,
    key_view: ViewId,
    writer: &Writer,
    seq: u64,
    messages: u32,
    inner: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(MAX_HEADER + inner.len() + AEAD_TAG_LEN);
    out.push(TAG);
    out.extend_from_slice(&key_view.to_bytes());
    writer_bytes(writer, &mut out);
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&messages.to_be_bytes());
    let aad = aad(group, &out);
    let start = out.len();
    out.extend_from_slice(inner);
    let tag = writer_aead(key, group, writer)
        .seal_in_place_separate_tag(nonce(seq), Aad::from(&aad), &mut out[start..])
        .expect("AES-256-GCM encrypts any length we send");
    out.extend_from_slice(tag.as_ref());
    out
}

/// Opens a sealed envelope of `group` with `key`, which must be its key
/// view's key.
pub fn open(key: &ViewKey, group: &GroupName, envelope: &Envelope<'_>) -> Result<Zeroizing<Vec<u8>>, EvsError> {
    let Envelope::Sealed { writer, seq, header, ciphertext, .. } = envelope else {
        return Err(EvsError::Malformed);
    };
    let aad = aad(group, header);
    let mut buf = Zeroizing::new(ciphertext.to_vec());
    let len = writer_aead(key, group, writer)
        .open_in_place(nonce(*seq), Aad::from(&aad), &mut buf)
        .map_err(|_| EvsError::AuthFailed)?
        .len();
    buf.truncate(len);
    Ok(buf)
}

/// A notice: the envelope of `messages` messages delivered in view
/// `delivered_in`, sealed under `key_view`'s key as its writer's number
/// `seq`, could not be re-encrypted, for `reason`.
pub fn notice(delivered_in: ViewId, reason: NoticeReason, key_view: ViewId, seq: u64, messages: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(47);
    out.push(TAG);
    out.extend_from_slice(&delivered_in.to_bytes());
    out.push(NOTICE);
    out.push(reason.code());
    out.extend_from_slice(&key_view.to_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&messages.to_be_bytes());
    out
}

/// What a daemon's EVS fixing did, since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EvsStats {
    /// Messages re-encrypted under the key of the view they were delivered in.
    pub reencrypted: u64,
    /// Messages replaced by a notice because their key was gone.
    pub key_gone: u64,
    /// Messages replaced by a notice because they did not open.
    pub unreadable: u64,
    /// Keys dropped by key-out.
    pub keyed_out: u64,
    /// Keys dropped by time-out.
    pub timed_out: u64,
}

struct StoredKey {
    view: ViewId,
    key: ViewKey,
    /// When a message sealed under it last came, or it stopped being the
    /// group's newest (shell clock microseconds).
    last_used: u64,
    /// This daemon's count of re-encryptions under it.
    daemon_seq: u64,
}

/// A daemon's keys of Optimized EVS groups' views, with their expiry (see
/// the [module docs](self)).
pub struct EvsKeys {
    me: DaemonId,
    groups: BTreeMap<GroupName, VecDeque<StoredKey>>,
    key_out: usize,
    time_out: u64,
    stats: EvsStats,
}

impl EvsKeys {
    /// The store of daemon `me`: at most `key_out` keys per group (at least
    /// 1, the newest), and a key dropped after `time_out` microseconds
    /// without a message sealed under it.
    pub fn new(me: DaemonId, key_out: usize, time_out: u64) -> Self {
        Self { me, groups: BTreeMap::new(), key_out: key_out.max(1), time_out, stats: EvsStats::default() }
    }

    /// What it did so far.
    pub fn stats(&self) -> EvsStats {
        self.stats
    }

    /// Keys held, over all groups.
    pub fn len(&self) -> usize {
        self.groups.values().map(VecDeque::len).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// View `view` of `group` was installed, with key `key`: it is the
    /// group's newest. Key-out drops the oldest beyond the limit.
    pub fn installed(&mut self, group: &GroupName, view: ViewId, key: ViewKey, now: u64) {
        let keys = self.groups.entry(group.clone()).or_default();
        if let Some(newest) = keys.back_mut() {
            newest.last_used = now;
        }
        keys.push_back(StoredKey { view, key, last_used: now, daemon_seq: 0 });
        while keys.len() > self.key_out {
            keys.pop_front();
            self.stats.keyed_out += 1;
        }
    }

    /// Drops keys no message came under for the time-out (never a group's
    /// newest), and every key of groups that no longer `exist`.
    pub fn expire(&mut self, now: u64, exists: impl Fn(&GroupName) -> bool) {
        let time_out = self.time_out;
        let mut timed_out = 0;
        self.groups.retain(|group, keys| {
            if !exists(group) {
                return false;
            }
            let newest = keys.len() - 1;
            let mut i = 0;
            keys.retain(|k| {
                i += 1;
                let keep = i - 1 == newest || now.saturating_sub(k.last_used) <= time_out;
                timed_out += u64::from(!keep);
                keep
            });
            true
        });
        self.stats.timed_out += timed_out;
    }

    /// The payload of a message of `group` delivered in view `delivered_in`,
    /// fixed for delivery: as it is unless it is an envelope sealed under
    /// another view's key; then re-encrypted under `delivered_in`'s key, or
    /// a notice if that cannot be done. Anything that is not a well-formed
    /// envelope passes as it is (its receivers judge it).
    pub fn fix(&mut self, group: &GroupName, delivered_in: ViewId, payload: Bytes, now: u64) -> Bytes {
        if payload.first() != Some(&TAG) {
            return payload;
        }
        let Ok(envelope @ Envelope::Sealed { key_view, seq, messages, .. }) = Envelope::decode(&payload) else {
            return payload;
        };
        if key_view == delivered_in {
            return payload;
        }
        let me = self.me;
        let found = self.groups.get_mut(group).and_then(|keys| {
            let from = keys.iter().position(|k| k.view == key_view)?;
            let to = keys.iter().position(|k| k.view == delivered_in)?;
            Some((keys, from, to))
        });
        let Some((keys, from, to)) = found else {
            self.stats.key_gone += 1;
            return notice(delivered_in, NoticeReason::KeyGone, key_view, seq, messages).into();
        };
        let Ok(inner) = open(&keys[from].key, group, &envelope) else {
            self.stats.unreadable += 1;
            return notice(delivered_in, NoticeReason::Unreadable, key_view, seq, messages).into();
        };
        keys[from].last_used = now;
        let to = &mut keys[to];
        let seq = to.daemon_seq;
        to.daemon_seq += 1;
        self.stats.reencrypted += 1;
        seal(&to.key, group, delivered_in, &Writer::Daemon(me), seq, messages, &inner).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> GroupName {
        GroupName::new("room").unwrap()
    }
    fn key(b: u8) -> ViewKey {
        ViewKey::new([b; 32])
    }
    fn view(n: u64) -> ViewId {
        ViewId::new(7, n)
    }
    fn alice() -> Writer {
        Writer::Member(MemberId::new("alice").unwrap())
    }

    #[test]
    fn an_envelope_opens_under_its_key_and_no_other() {
        let sealed = seal(&key(1), &group(), view(1), &alice(), 3, 1, b"hello");
        let env = Envelope::decode(&sealed).unwrap();
        assert!(
            matches!(&env, Envelope::Sealed { key_view, seq: 3, writer, .. } if *key_view == view(1) && *writer == alice())
        );
        assert_eq!(open(&key(1), &group(), &env).unwrap().as_slice(), b"hello");
        assert_eq!(open(&key(2), &group(), &env), Err(EvsError::AuthFailed));
        assert_eq!(open(&key(1), &GroupName::new("other").unwrap(), &env), Err(EvsError::AuthFailed));
        // Every header byte is bound: flip each in turn.
        for i in 1..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            if let Ok(env) = Envelope::decode(&bad) {
                assert!(open(&key(1), &group(), &env).is_err(), "byte {i} flipped still opens");
            }
        }
    }

    #[test]
    fn decode_refuses_what_is_not_an_envelope() {
        assert_eq!(Envelope::decode(&[]), Err(EvsError::Malformed));
        assert_eq!(Envelope::decode(&[TAG]), Err(EvsError::Malformed));
        let sealed = seal(&key(1), &group(), view(1), &alice(), 0, 1, b"");
        for len in 0..sealed.len() {
            assert!(Envelope::decode(&sealed[..len]).is_err(), "a prefix of {len} bytes decodes");
        }
        let n = notice(view(2), NoticeReason::KeyGone, view(1), 7, 3);
        assert_eq!(
            Envelope::decode(&n),
            Ok(Envelope::Notice {
                delivered_in: view(2),
                reason: NoticeReason::KeyGone,
                key_view: view(1),
                seq: 7,
                messages: 3
            })
        );
        assert!(Envelope::decode(&[&n[..], &[0]].concat()).is_err());
        for len in 0..n.len() {
            assert!(Envelope::decode(&n[..len]).is_err(), "a notice's prefix of {len} bytes decodes");
        }
    }

    #[test]
    fn a_message_under_an_earlier_views_key_is_re_encrypted_under_the_delivery_views() {
        let mut store = EvsKeys::new(DaemonId(4), 8, 1_000);
        store.installed(&group(), view(1), key(1), 0);
        store.installed(&group(), view(2), key(2), 10);
        let sealed = Bytes::from(seal(&key(1), &group(), view(1), &alice(), 0, 1, b"crossed"));
        let fixed = store.fix(&group(), view(2), sealed.clone(), 20);
        let env = Envelope::decode(&fixed).unwrap();
        assert!(
            matches!(&env, Envelope::Sealed { key_view, writer: Writer::Daemon(DaemonId(4)), seq: 0, .. } if *key_view == view(2))
        );
        assert_eq!(open(&key(2), &group(), &env).unwrap().as_slice(), b"crossed");
        // The daemon counts its own nonces.
        let again = store.fix(&group(), view(2), sealed, 20);
        assert!(matches!(Envelope::decode(&again).unwrap(), Envelope::Sealed { seq: 1, .. }));
        // Under the delivery view's own key: untouched.
        let current = Bytes::from(seal(&key(2), &group(), view(2), &alice(), 0, 1, b"now"));
        assert_eq!(store.fix(&group(), view(2), current.clone(), 20), current);
        assert_eq!(store.stats().reencrypted, 2);
    }

    #[test]
    fn a_message_whose_key_is_gone_becomes_a_notice() {
        // Key-out: 2 keys per group.
        let mut store = EvsKeys::new(DaemonId(0), 2, 1_000);
        for n in 1..=3 {
            store.installed(&group(), view(n), key(n as u8), 0);
        }
        assert_eq!(store.stats().keyed_out, 1);
        let old = Bytes::from(seal(&key(1), &group(), view(1), &alice(), 5, 1, b"late"));
        let fixed = store.fix(&group(), view(3), old, 0);
        assert_eq!(
            Envelope::decode(&fixed),
            Ok(Envelope::Notice {
                delivered_in: view(3),
                reason: NoticeReason::KeyGone,
                key_view: view(1),
                seq: 5,
                messages: 1
            })
        );
        // Time-out: view 2's key was superseded at 0; at 1_001 it is gone,
        // and the newest never goes.
        store.expire(1_000, |_| true);
        assert_eq!(store.len(), 2);
        store.expire(1_001, |_| true);
        assert_eq!((store.len(), store.stats().timed_out), (1, 1));
        let two = Bytes::from(seal(&key(2), &group(), view(2), &alice(), 0, 1, b"late"));
        assert!(matches!(Envelope::decode(&store.fix(&group(), view(3), two, 0)), Ok(Envelope::Notice { .. })));
        // A key in use does not time out.
        let mut store = EvsKeys::new(DaemonId(0), 8, 1_000);
        store.installed(&group(), view(1), key(1), 0);
        store.installed(&group(), view(2), key(2), 0);
        let one = Bytes::from(seal(&key(1), &group(), view(1), &alice(), 0, 1, b"x"));
        store.fix(&group(), view(2), one.clone(), 900);
        store.expire(1_800, |_| true);
        assert!(matches!(Envelope::decode(&store.fix(&group(), view(2), one, 1_800)), Ok(Envelope::Sealed { .. })));
        // A group that is gone takes its keys along.
        store.expire(1_800, |_| false);
        assert!(store.is_empty());
    }

    #[test]
    fn a_forgery_under_an_old_key_id_is_reported_not_re_encrypted() {
        let mut store = EvsKeys::new(DaemonId(0), 8, 1_000);
        store.installed(&group(), view(1), key(1), 0);
        store.installed(&group(), view(2), key(2), 0);
        // Sealed under a key that is not view 1's, naming view 1.
        let forged = Bytes::from(seal(&key(9), &group(), view(1), &alice(), 0, 1, b"forged"));
        let fixed = store.fix(&group(), view(2), forged, 0);
        assert!(matches!(Envelope::decode(&fixed), Ok(Envelope::Notice { reason: NoticeReason::Unreadable, .. })));
        assert_eq!(store.stats().unreadable, 1);
    }
}
