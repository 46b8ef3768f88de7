//! Client certificate verification as the daemon does it
//! (`ClientAuth::verify_client_chain`: the authority's CRLs parsed and
//! checked for expiry, the chain built and checked by webpki, revocation,
//! then the member name read from the subject): any bytes as a certificate
//! and as a CRL give a member name or an error, never a panic.
//!
//! The authority is fixed (an Ed25519 key from a constant seed, certificates
//! and a CRL made by rcgen with fixed dates and serials), and so is the time
//! of the check, so every input always takes the same path. To get past the
//! signature checks, an input may also be the *contents* of a certificate or
//! CRL (the to-be-signed part), which the target signs with the authority's
//! key: then webpki's checks of validity, usage, names and revocation see
//! arbitrary fields under a valid signature.
//!
//! Input: byte 0 chooses the certificate — 0: the rest's first part as DER;
//! 1: that part as a TBSCertificate signed by the authority; 2: a valid
//! member certificate (alice); 3: a revoked one (mallory). Byte 1 chooses the
//! CRLs — 0: none; 1: the authority's valid CRL (revoking mallory); 2: the
//! second part as DER; 3: the second part as a TBSCertList signed by the
//! authority. Bytes 2–3 are the first part's length (big-endian); the second
//! part is what follows it.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use conclave_gcs_net::ClientAuth;
use libfuzzer_sys::fuzz_target;
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, KeyIdMethod, KeyPair,
    KeyUsagePurpose, RevocationReason, RevokedCertParams, SerialNumber,
};
use ring::signature::Ed25519KeyPair;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivatePkcs8KeyDer};

/// The fixed authority and what it issued.
struct Fixed {
    /// Signs to-be-signed parts from the input.
    signer: Ed25519KeyPair,
    ca: CertificateDer<'static>,
    crl: CertificateRevocationListDer<'static>,
    alice: CertificateDer<'static>,
    mallory: CertificateDer<'static>,
}

/// The Ed25519 key of `seed`, for rcgen (PKCS#8 v1) and for ring.
fn key(seed: u8) -> (KeyPair, Ed25519KeyPair) {
    let mut pkcs8 =
        vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
    pkcs8.extend_from_slice(&[seed; 32]);
    let rcgen = KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8.clone()), &rcgen::PKCS_ED25519)
        .expect("a valid Ed25519 key");
    let ring = Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).expect("a valid Ed25519 seed");
    (rcgen, ring)
}

fn fixed() -> &'static Fixed {
    static FIXED: OnceLock<Fixed> = OnceLock::new();
    FIXED.get_or_init(|| {
        let (ca_key, signer) = key(1);
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, "fuzz authority");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        params.serial_number = Some(SerialNumber::from(1u64));
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2100, 1, 1);
        let ca = params.self_signed(&ca_key).unwrap();
        let issue = |cn: &str, seed: u8, serial: u64| {
            let (key, _) = key(seed);
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.serial_number = Some(SerialNumber::from(serial));
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2100, 1, 1);
            params.signed_by(&key, &ca, &ca_key).unwrap().der().clone()
        };
        let alice = issue("alice", 2, 2);
        let mallory = issue("mallory", 3, 3);
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2100, 1, 1),
            crl_number: SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: vec![RevokedCertParams {
                serial_number: SerialNumber::from(3u64),
                revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                reason_code: Some(RevocationReason::KeyCompromise),
                invalidity_date: None,
            }],
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&ca, &ca_key)
        .unwrap()
        .der()
        .clone();
        Fixed { signer, ca: ca.der().clone(), crl, alice, mallory }
    })
}

/// A DER element: `tag`, its length, `content`.
fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|&&b| b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
    out.extend_from_slice(content);
    out
}

/// `tbs` signed by the authority: SEQUENCE { tbs, Ed25519, BIT STRING signature },
/// the shape of both a certificate and a CRL.
fn signed(tbs: &[u8]) -> Vec<u8> {
    let signature = fixed().signer.sign(tbs);
    let mut bits = vec![0];
    bits.extend_from_slice(signature.as_ref());
    let mut body = tbs.to_vec();
    body.extend_from_slice(&[0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70]);
    body.extend_from_slice(&der(0x03, &bits));
    der(0x30, &body)
}

fuzz_target!(|data: &[u8]| {
    let fixed = fixed();
    let [cert_kind, crl_kind, hi, lo, rest @ ..] = data else { return };
    let split = usize::from(u16::from_be_bytes([*hi, *lo])).min(rest.len());
    let (first, second) = rest.split_at(split);
    let cert = match cert_kind % 4 {
        0 => CertificateDer::from(first.to_vec()),
        1 => CertificateDer::from(signed(first)),
        2 => fixed.alice.clone(),
        _ => fixed.mallory.clone(),
    };
    let crls = match crl_kind % 4 {
        0 => vec![],
        1 => vec![fixed.crl.clone()],
        2 => vec![CertificateRevocationListDer::from(second.to_vec())],
        _ => vec![CertificateRevocationListDer::from(signed(second))],
    };
    let auth = ClientAuth { roots: vec![fixed.ca.clone()], crls };
    // 2030-01-01: inside every fixed validity period.
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_893_456_000);
    let verdict = auth.verify_client_chain(&[cert], now);
    // The fixed certificates under the fixed CRL: what the daemon decides.
    if crl_kind % 4 == 1 {
        match cert_kind % 4 {
            2 => assert_eq!(verdict.expect("alice is a valid member").as_str(), "alice"),
            3 => assert!(verdict.expect_err("mallory is revoked").to_string().contains("revoked")),
            _ => {}
        }
    }
});
