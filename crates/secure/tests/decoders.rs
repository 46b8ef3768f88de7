//! The secure layer's decoders on hostile input, through
//! [`parse_payload`] (the steps a session runs on every payload it receives):
//! arbitrary bytes, and valid payloads of every kind after truncation,
//! flipped bytes, changed length fields and inserted bytes, give a value or
//! an error, never a panic. Valid payloads decode to what was encoded, a data
//! header round-trips and no strict prefix of it decodes, and an altered
//! data message never opens. The `secure_payload` cargo-fuzz target in
//! `fuzz/` does the same with coverage guidance; this test runs in the normal
//! suite (about 2000 cases).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use conclave_gka::message::Envelope;
use conclave_gka::{Epoch, GroupId, IntervalAlgorithm, ProtocolId, ViewId};
use conclave_secure::data::DataError;
use conclave_secure::payload::{parse_payload, tag, ParsedPayload, PayloadError, PresentedCert};
use conclave_secure::trust::{Identity, Issuer};
use conclave_secure::{DataHeader, EpochKeys, GroupName, Interval, MemberId, Policy, Refusal};
use proptest::prelude::*;
use proptest::sample::Index;
use rand_core::SeedableRng;

/// A valid payload, what it decodes to, and where its length fields are
/// (offset, width in bytes).
#[derive(Clone, Debug)]
struct Valid {
    bytes: Vec<u8>,
    expected: ParsedPayload,
    lengths: Vec<(usize, usize)>,
}

const DAY: Duration = Duration::from_secs(86_400);

/// A member certificate (DER) for "alice" and its serial, made once.
fn alice_cert() -> &'static (Vec<u8>, String) {
    static CERT: OnceLock<(Vec<u8>, String)> = OnceLock::new();
    CERT.get_or_init(|| {
        let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(7);
        let now = SystemTime::now();
        let (issuer, _) = Issuer::create("authority", now - DAY, now + DAY, &mut rng).unwrap();
        let alice = MemberId::new("alice").unwrap();
        let issued = issuer.issue(&alice, now - DAY, now + DAY, &mut rng).unwrap();
        let der = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap().cert_der().to_vec();
        (der, issued.serial)
    })
}

/// Printable names without whitespace, with multi-byte characters, within
/// the byte limits (3-byte characters at most: 40 × 3 ≤ 128; 4-byte ones:
/// 60 × 4 ≤ 255).
fn group_name() -> impl Strategy<Value = GroupName> {
    "[a-zA-Z0-9_.é€-]{1,40}".prop_map(|s| GroupName::new(s).unwrap())
}

fn member_name() -> impl Strategy<Value = MemberId> {
    "[a-zA-Z0-9_.é€😀-]{1,60}".prop_map(|s| MemberId::new(s).unwrap())
}

fn header() -> impl Strategy<Value = DataHeader> {
    (group_name(), any::<(u64, u64, u32)>(), any::<(u64, u64)>(), member_name(), any::<u64>()).prop_map(
        |(group, e, v, sender, seq)| DataHeader {
            group,
            epoch: Epoch::new(ViewId::new(e.0, e.1), e.2),
            view: ViewId::new(v.0, v.1),
            sender,
            seq,
        },
    )
}

fn policy() -> impl Strategy<Value = Policy> {
    // Decoded from the wire, an interval policy's period is zero (it is not
    // sent), so that is what the strategy makes.
    let interval = prop::option::of(prop::sample::select(IntervalAlgorithm::ALL.to_vec()))
        .prop_map(|a| a.map(|algorithm| Interval { algorithm, period: Duration::ZERO, rekey_on_leave: false }));
    (
        prop::sample::select(ProtocolId::ALL.to_vec()),
        prop::sample::select(GroupId::ALL.to_vec()),
        any::<bool>(),
        interval,
    )
        .prop_map(|(protocol, group_id, sender_signatures, interval)| Policy {
            sender_signatures,
            interval,
            ..Policy::new(protocol, group_id)
        })
}

fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..max)
}

fn key_agreement() -> impl Strategy<Value = Valid> {
    (policy(), member_name(), any::<(u64, u64, u32)>(), any::<u8>(), any::<u32>(), bytes(200), bytes(100)).prop_map(
        |(p, sender, view, round, seq, body, signature)| {
            let env = Envelope {
                protocol: p.protocol,
                group_id: p.group_id,
                group: "g".into(),
                view: ViewId::new(view.0, view.1),
                run: view.2,
                sender,
                recipient: None,
                round,
                seq,
                body,
                signature,
            };
            let (pc, gc) = p.codes();
            let mut bytes = vec![tag::KA, pc, gc];
            bytes.extend_from_slice(&env.encode());
            Valid {
                bytes,
                expected: ParsedPayload::KeyAgreement { policy: Some(p), envelope: Ok(env) },
                lengths: vec![],
            }
        },
    )
}

fn data() -> impl Strategy<Value = Valid> {
    (header(), prop::collection::vec(bytes(200), 1..4)).prop_map(|(h, messages)| {
        let keys = EpochKeys::fixed_public_for_tests(h.group.clone(), h.epoch);
        let mut bytes = vec![tag::DATA];
        bytes.extend_from_slice(&keys.seal(&h.sender, h.view, h.seq, &messages, Some(test_signer().as_ref())));
        let glen = h.group.as_str().len();
        // The group's and the sender's lengths, and the signature's (last).
        let lengths = vec![(1, 1), (1 + 1 + glen + 20 + 16, 1), (bytes.len() - 2, 2)];
        let opened = Ok(messages.into_iter().map(Into::into).collect());
        Valid { bytes, expected: ParsedPayload::Data { header: h, opened }, lengths }
    })
}

fn policy_notice() -> impl Strategy<Value = Valid> {
    (policy(), any::<(u64, u64)>(), prop::collection::vec(any::<u8>(), 1..80)).prop_map(|(p, v, sig)| {
        let view = ViewId::new(v.0, v.1);
        let bytes = [&[tag::POLICY][..], &view.to_bytes(), &<[u8; 2]>::from(p.codes()), &sig].concat();
        Valid { bytes, expected: ParsedPayload::Policy { view, policy: Some(p) }, lengths: vec![] }
    })
}

fn cert() -> impl Strategy<Value = Valid> {
    (any::<(u64, u64)>(), prop::collection::vec(any::<u8>(), 1..100)).prop_map(|(v, sig)| {
        let view = ViewId::new(v.0, v.1);
        let (der, serial) = alice_cert();
        let mut bytes = vec![tag::CERT];
        bytes.extend_from_slice(&view.to_bytes());
        bytes.extend_from_slice(&(der.len() as u16).to_be_bytes());
        bytes.extend_from_slice(der);
        bytes.extend_from_slice(&sig);
        let presented =
            PresentedCert { common_name: Some("alice".into()), serial: serial.clone(), signature_len: sig.len() };
        // The DER's own outer length field comes right after its first byte.
        let lengths = vec![(17, 2), (20, 1), (21, 1)];
        Valid { bytes, expected: ParsedPayload::Cert { view, certificate: Ok(presented) }, lengths }
    })
}

fn timeout() -> impl Strategy<Value = Valid> {
    (any::<(u64, u64)>(), prop::collection::vec(member_name(), 0..6), prop::collection::vec(any::<u8>(), 1..80))
        .prop_map(|(v, names, sig)| {
            let view = ViewId::new(v.0, v.1);
            let mut bytes = vec![tag::TIMEOUT];
            bytes.extend_from_slice(&view.to_bytes());
            let mut lengths = vec![(bytes.len(), 2)];
            bytes.extend_from_slice(&(sig.len() as u16).to_be_bytes());
            bytes.extend_from_slice(&sig);
            for n in &names {
                lengths.push((bytes.len(), 1));
                bytes.push(n.as_str().len() as u8);
                bytes.extend_from_slice(n.as_str().as_bytes());
            }
            let names = names.iter().map(|n| n.as_str().as_bytes().to_vec()).collect();
            Valid { bytes, expected: ParsedPayload::Timeout { view, signed: Some((names, sig.len())) }, lengths }
        })
}

fn refusal() -> impl Strategy<Value = Valid> {
    let text = || "[a-zA-Z0-9 é€]{0,50}";
    let reason = prop_oneof![
        Just((vec![1u8], Refusal::NoCertificate)),
        Just((vec![8u8], Refusal::BadProof)),
        text().prop_map(|s| {
            let mut v = vec![7, s.len() as u8];
            v.extend_from_slice(s.as_bytes());
            (v, Refusal::NameMismatch { certified: s })
        }),
        ("[0-9a-f]{2,40}", text()).prop_map(|(serial, why)| {
            let mut v = vec![6, serial.len() as u8];
            v.extend_from_slice(serial.as_bytes());
            v.push(why.len() as u8);
            v.extend_from_slice(why.as_bytes());
            (v, Refusal::Revoked { serial, reason: (!why.is_empty()).then_some(why) })
        }),
    ];
    (any::<(u64, u64)>(), reason).prop_map(|(v, (encoded, reason))| {
        let view = ViewId::new(v.0, v.1);
        let mut bytes = vec![tag::REFUSED];
        bytes.extend_from_slice(&view.to_bytes());
        bytes.extend_from_slice(&encoded);
        let lengths = if encoded.len() > 1 { vec![(18, 1)] } else { vec![] };
        Valid { bytes, expected: ParsedPayload::Refused { view, reason: Some(reason) }, lengths }
    })
}

fn confirmation() -> impl Strategy<Value = Valid> {
    (any::<(u64, u64, u32)>(), any::<[u8; 32]>(), prop::collection::vec(any::<u8>(), 0..80)).prop_map(
        |(e, mac, sig)| {
            let epoch = Epoch::new(ViewId::new(e.0, e.1), e.2);
            let bytes = [&[tag::CONFIRM][..], &epoch.to_bytes(), &mac, &sig].concat();
            Valid { bytes, expected: ParsedPayload::Confirm { epoch, signature_len: sig.len() }, lengths: vec![] }
        },
    )
}

fn verdict() -> impl Strategy<Value = Valid> {
    (
        any::<(u64, u64, u32)>(),
        any::<(u64, u64)>(),
        any::<[u8; 32]>(),
        prop::collection::vec(any::<u8>(), 0..80),
        prop::collection::vec(member_name(), 0..4),
    )
        .prop_map(|(e, v, mac, sig, names)| {
            let epoch = Epoch::new(ViewId::new(e.0, e.1), e.2);
            let view = ViewId::new(v.0, v.1);
            let mut bytes = [
                &[tag::VERDICT][..],
                &epoch.to_bytes(),
                &view.to_bytes(),
                &mac,
                &(sig.len() as u16).to_be_bytes(),
                &sig,
            ]
            .concat();
            let mut lengths = vec![(69, 2)];
            for n in &names {
                lengths.push((bytes.len(), 1));
                bytes.push(n.as_str().len() as u8);
                bytes.extend_from_slice(n.as_str().as_bytes());
            }
            let unmatched = names.iter().map(|n| n.as_str().as_bytes().to_vec()).collect();
            Valid {
                bytes,
                expected: ParsedPayload::Verdict { epoch, view, unmatched, signature_len: sig.len() },
                lengths,
            }
        })
}

/// A signer for sealing test data messages (parsing does not check it).
fn test_signer() -> std::sync::Arc<dyn conclave_gka::suite::Signer> {
    use rand_core::SeedableRng;
    conclave_gka::suite::generate_signer(
        conclave_gka::suite::SignatureId::Ed25519,
        &mut rand_chacha::ChaCha20Rng::seed_from_u64(1),
    )
    .unwrap()
}

fn valid() -> impl Strategy<Value = Valid> {
    prop_oneof![key_agreement(), data(), policy_notice(), cert(), timeout(), refusal(), confirmation(), verdict()]
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(Index),
    Flip(Index, u8),
    /// Adds `delta` to one of the payload's length fields.
    Length(Index, i16),
    Insert(Index, Vec<u8>),
    Append(Vec<u8>),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 1u8..).prop_map(|(i, m)| Mutation::Flip(i, m)),
        (any::<Index>(), prop_oneof![-3i16..=3, any::<i16>()]).prop_map(|(i, d)| Mutation::Length(i, d)),
        (any::<Index>(), prop::collection::vec(any::<u8>(), 1..8)).prop_map(|(i, b)| Mutation::Insert(i, b)),
        prop::collection::vec(any::<u8>(), 1..8).prop_map(Mutation::Append),
    ]
}

/// Applies `m`; `None` if it does not apply (no length field to change).
fn mutate(v: &Valid, m: &Mutation) -> Option<Vec<u8>> {
    let mut b = v.bytes.clone();
    match m {
        Mutation::Truncate(i) => b.truncate(i.index(b.len())),
        Mutation::Flip(i, mask) => {
            let i = i.index(b.len());
            b[i] ^= mask;
        }
        Mutation::Length(i, delta) => {
            if v.lengths.is_empty() {
                return None;
            }
            let (at, width) = v.lengths[i.index(v.lengths.len())];
            if width == 1 {
                b[at] = b[at].wrapping_add(*delta as u8);
            } else {
                let n = u16::from_be_bytes([b[at], b[at + 1]]).wrapping_add(*delta as u16);
                b[at..at + 2].copy_from_slice(&n.to_be_bytes());
            }
        }
        Mutation::Insert(i, extra) => {
            let i = i.index(b.len() + 1);
            b.splice(i..i, extra.iter().copied());
        }
        Mutation::Append(extra) => b.extend_from_slice(extra),
    }
    Some(b)
}

/// What must hold of any parse: a decoded data header is exactly the bytes
/// after the tag (the encoding is canonical).
fn check_parse(bytes: &[u8]) -> Result<ParsedPayload, PayloadError> {
    let parsed = parse_payload(bytes);
    if let Ok(ParsedPayload::Data { header, .. }) = &parsed {
        let mut enc = Vec::new();
        header.encode(&mut enc);
        assert!(bytes[1..].starts_with(&enc), "the header does not re-encode to its bytes");
    }
    parsed
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn arbitrary_bytes_never_panic(b in bytes(600)) {
        let _ = check_parse(&b);
    }

    #[test]
    fn arbitrary_bodies_behind_every_tag_never_panic(t in 0u8..12, body in bytes(400)) {
        let mut b = vec![t];
        b.extend_from_slice(&body);
        let _ = check_parse(&b);
    }

    #[test]
    fn valid_payloads_decode_and_mutated_ones_never_panic(v in valid(), m in mutation()) {
        prop_assert_eq!(check_parse(&v.bytes), Ok(v.expected.clone()));
        let Some(b) = mutate(&v, &m) else { return Ok(()) };
        let parsed = check_parse(&b);
        if b != v.bytes {
            // An altered data message never opens: the AEAD covers header and
            // ciphertext, and the sender's signature (which parsing does not
            // check, having no key) covers the rest.
            if let Ok(ParsedPayload::Data { header, opened }) = &parsed {
                if opened.is_ok() {
                    let keys = EpochKeys::fixed_public_for_tests(header.group.clone(), header.epoch);
                    let verifier = test_signer().verifier();
                    let checked = keys.open(&b[1..], Some(verifier.as_ref()));
                    prop_assert_eq!(checked.map(|_| ()), Err(DataError::BadSignature), "an altered data message opened: {:?}", m);
                }
            }
            // The envelope, the refusal and the DER have no slack: cutting
            // into them is always noticed.
            if let (Mutation::Truncate(_), ParsedPayload::KeyAgreement { .. }) = (&m, &v.expected) {
                let cut = matches!(parsed, Err(_) | Ok(ParsedPayload::KeyAgreement { envelope: Err(_), .. }));
                prop_assert!(cut, "a cut envelope decoded: {:?}", parsed);
            }
            if let (Mutation::Truncate(_), ParsedPayload::Refused { .. }) = (&m, &v.expected) {
                let cut = matches!(parsed, Err(_) | Ok(ParsedPayload::Refused { reason: None, .. }));
                prop_assert!(cut, "a cut refusal decoded: {:?}", parsed);
            }
            if let (Mutation::Truncate(_), ParsedPayload::Cert { .. }) = (&m, &v.expected) {
                if b.len() <= 11 + alice_cert().0.len() {
                    let cut = matches!(parsed, Err(_) | Ok(ParsedPayload::Cert { certificate: Err(_), .. }));
                    prop_assert!(cut, "a cut certificate parsed: {:?}", parsed);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn data_headers_round_trip_and_truncations_fail(h in header(), rest in bytes(40), cut in any::<Index>()) {
        let mut enc = Vec::new();
        h.encode(&mut enc);
        let mut b = enc.clone();
        b.extend_from_slice(&rest);
        let (got, aad, tail) = DataHeader::decode(&b).unwrap();
        prop_assert_eq!(&got, &h);
        prop_assert_eq!(aad, &enc[..]);
        prop_assert_eq!(tail, &rest[..]);
        let cut = cut.index(enc.len());
        prop_assert_eq!(DataHeader::decode(&enc[..cut]).map(|_| ()), Err(DataError::Malformed));
        let mut payload = vec![tag::DATA];
        payload.extend_from_slice(&enc[..cut]);
        prop_assert_eq!(parse_payload(&payload), Err(PayloadError::DataHeader));
    }
}

#[test]
fn longest_names_round_trip_and_every_prefix_fails() {
    let h = DataHeader {
        group: GroupName::new("g".repeat(128)).unwrap(),
        epoch: Epoch::new(ViewId::new(u64::MAX, u64::MAX), u32::MAX),
        view: ViewId::new(u64::MAX, u64::MAX),
        sender: MemberId::new("€".repeat(85)).unwrap(),
        seq: u64::MAX,
    };
    let mut enc = Vec::new();
    h.encode(&mut enc);
    assert_eq!(enc.len(), 1 + 128 + 20 + 16 + 1 + 255 + 8);
    assert_eq!(DataHeader::decode(&enc).unwrap().0, h);
    for cut in 0..enc.len() {
        assert_eq!(DataHeader::decode(&enc[..cut]).map(|_| ()), Err(DataError::Malformed), "prefix of {cut} bytes");
    }
}

#[test]
fn malformed_framing_and_bodies() {
    assert_eq!(parse_payload(&[]), Err(PayloadError::Empty));
    assert_eq!(parse_payload(&[0]), Err(PayloadError::UnknownTag(0)));
    assert_eq!(parse_payload(&[tag::KA, 1]), Err(PayloadError::Length { tag: tag::KA, len: 2 }));
    assert_eq!(parse_payload(&[tag::POLICY, 1, 2, 3]), Err(PayloadError::Length { tag: tag::POLICY, len: 4 }));
    let unsigned = [&[tag::POLICY][..], &[0; 16], &[1, 2]].concat();
    assert_eq!(parse_payload(&unsigned), Err(PayloadError::Length { tag: tag::POLICY, len: 19 }));
    let unknown = [&[tag::POLICY][..], &[0; 16], &[0xee, 0xee, 7]].concat();
    assert_eq!(parse_payload(&unknown), Ok(ParsedPayload::Policy { view: ViewId::new(0, 0), policy: None }));
    assert_eq!(parse_payload(&[tag::CERT; 16]), Err(PayloadError::Length { tag: tag::CERT, len: 16 }));
    // A data header naming an empty group, or a group name with a space.
    assert_eq!(parse_payload(&[tag::DATA, 0]), Err(PayloadError::DataHeader));
    let mut b = vec![tag::DATA, 3, b'a', b' ', b'b'];
    b.extend_from_slice(&[0; 20 + 16]); // epoch, and the view it was sent in
    b.extend_from_slice(&[1, b'x']);
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0]); // one message, empty
    b.extend_from_slice(&[7; 16]); // its ciphertext: the AEAD tag alone
    b.extend_from_slice(&[9, 0, 1]); // a one-byte signature, its length last
    assert_eq!(parse_payload(&b), Err(PayloadError::DataHeader));
    b[3] = b'_';
    assert!(matches!(parse_payload(&b), Ok(ParsedPayload::Data { opened: Err(DataError::AuthFailed), .. })));
    // A certificate message whose certificate is not one, and one without a signature.
    let mut c = [&[tag::CERT][..], &ViewId::new(0, 1).to_bytes(), &[0, 2, 0x30, 0x00, 0x99]].concat();
    assert!(matches!(
        parse_payload(&c),
        Ok(ParsedPayload::Cert { view: ViewId { seq: 1, .. }, certificate: Err(Refusal::Malformed(_)) })
    ));
    c.pop();
    assert!(matches!(parse_payload(&c), Ok(ParsedPayload::Cert { certificate: Err(Refusal::Malformed(_)), .. })));
    // A refusal with a trailing byte, and one of an unknown code.
    let v0 = ViewId::new(0, 0);
    let r = [&[tag::REFUSED][..], &[0; 16], &[1]].concat();
    assert_eq!(parse_payload(&r), Ok(ParsedPayload::Refused { view: v0, reason: Some(Refusal::NoCertificate) }));
    assert_eq!(parse_payload(&[&r[..], &[0][..]].concat()), Ok(ParsedPayload::Refused { view: v0, reason: None }));
    assert_eq!(parse_payload(&[&r[..17], &[99][..]].concat()), Ok(ParsedPayload::Refused { view: v0, reason: None }));
}
