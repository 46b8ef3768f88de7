//! Certified identities: a group authority (a self-signed X.509 CA with an
//! Ed25519 key) certifies each member's Ed25519 identity key, and revokes
//! certificates with a CRL it signs.
//!
//! * [`Authority`] is what a member trusts: the CA certificate and the
//!   current CRL. [`Authority::verify`] checks a presented member
//!   certificate (chain, validity, revocation, TLS client usage, common name
//!   = member name, Ed25519 key) with `rustls-webpki`, the verifier rustls
//!   itself uses, and answers with the member's [`Verifier`] or a typed
//!   [`Refusal`].
//! * [`Identity`] is what a member holds: its certificate and secret key.
//! * [`Issuer`] is the authority's side (`conclave keys`): it creates the CA,
//!   issues member certificates and signs CRLs, with `rcgen`. Every key it
//!   makes is drawn from the RNG passed in.
//!
//! Formats: PEM everywhere; certificates `CERTIFICATE`, secret keys PKCS#8
//! `PRIVATE KEY` (or, protected by a passphrase, encrypted PKCS#8
//! `ENCRYPTED PRIVATE KEY`: PKCS#5 PBES2 with scrypt and AES-256-CBC, see
//! [`protect_key`] and [`unprotect_key`]), CRLs `X509 CRL` with a CRL number that grows with every
//! revocation. Member certificates have subject CN = member name and the
//! clientAuth extended key usage, so a daemon can require them for TLS
//! client authentication.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use conclave_gcs::MemberId;
use conclave_gka::suite::ed25519::{Ed25519Signer, Ed25519Verifier};
use conclave_gka::suite::{Signer, Verifier};
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey};
use rand_core::CryptoRngCore;
use rustls_pki_types::{CertificateDer, PrivatePkcs8KeyDer, UnixTime};
use webpki::{CertRevocationList, EndEntityCert, KeyUsage, OwnedCertRevocationList, RevocationOptionsBuilder};
use x509_parser::certificate::X509Certificate;
use x509_parser::prelude::FromDer;
use x509_parser::revocation_list::CertificateRevocationList;
use zeroize::Zeroizing;

/// Why a member was refused a place in a secure group. Its `Display` reads
/// after the member's name ("mallory: its certificate ... was revoked").
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No certificate arrived before the group gave up waiting.
    #[error("presented no certificate in time")]
    NoCertificate,
    /// The certificate (or the message carrying it) cannot be parsed, or its
    /// key is not an Ed25519 key.
    #[error("presented a malformed certificate ({0})")]
    Malformed(String),
    /// The certificate was not issued by this group's authority.
    #[error("its certificate was not issued by this group's authority")]
    UnknownIssuer,
    /// The certificate's validity period is over.
    #[error("its certificate has expired")]
    Expired,
    /// The certificate's validity period has not begun.
    #[error("its certificate is not valid yet")]
    NotYetValid,
    /// The authority revoked the certificate.
    #[error("its certificate (serial {serial}) was revoked{}", reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Revoked {
        /// The certificate's serial number, hex.
        serial: String,
        /// The reason the CRL gives, if any.
        reason: Option<String>,
    },
    /// The certificate certifies another member name.
    #[error("its certificate is issued to {certified:?}, not to this member")]
    NameMismatch {
        /// The name the certificate holds.
        certified: String,
    },
    /// The member did not prove that it holds the certified key (the
    /// signature binding the certificate to the group and view is bad).
    #[error("it could not prove that it holds the key its certificate names")]
    BadProof,
    /// Any other reason the certificate path was refused.
    #[error("its certificate was refused: {0}")]
    Invalid(String),
}

impl Refusal {
    /// Wire encoding (for the notice a refused member gets): a code, then
    /// the fields as length-prefixed UTF-8.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        let (code, fields): (u8, Vec<&str>) = match self {
            Refusal::NoCertificate => (1, vec![]),
            Refusal::Malformed(s) => (2, vec![s]),
            Refusal::UnknownIssuer => (3, vec![]),
            Refusal::Expired => (4, vec![]),
            Refusal::NotYetValid => (5, vec![]),
            Refusal::Revoked { serial, reason } => (6, vec![serial, reason.as_deref().unwrap_or("")]),
            Refusal::NameMismatch { certified } => (7, vec![certified]),
            Refusal::BadProof => (8, vec![]),
            Refusal::Invalid(s) => (9, vec![s]),
        };
        out.push(code);
        for f in fields {
            // At most 255 bytes, cut at a character boundary so that it still decodes.
            let mut n = f.len().min(u8::MAX as usize);
            while !f.is_char_boundary(n) {
                n -= 1;
            }
            out.push(n as u8);
            out.extend_from_slice(&f.as_bytes()[..n]);
        }
    }

    /// Decodes [`Refusal::encode`]'s output; `None` if malformed.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Refusal> {
        let (&code, mut rest) = bytes.split_first()?;
        let mut field = || -> Option<String> {
            let (&n, r) = rest.split_first()?;
            let s = r.get(..n as usize)?;
            rest = &r[n as usize..];
            String::from_utf8(s.to_vec()).ok()
        };
        let r = match code {
            1 => Refusal::NoCertificate,
            2 => Refusal::Malformed(field()?),
            3 => Refusal::UnknownIssuer,
            4 => Refusal::Expired,
            5 => Refusal::NotYetValid,
            6 => {
                let serial = field()?;
                let reason = field()?;
                Refusal::Revoked { serial, reason: (!reason.is_empty()).then_some(reason) }
            }
            7 => Refusal::NameMismatch { certified: field()? },
            8 => Refusal::BadProof,
            9 => Refusal::Invalid(field()?),
            _ => return None,
        };
        rest.is_empty().then_some(r)
    }
}

/// Errors loading or making trust material.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    /// Not PEM, or a PEM block of another kind.
    #[error("expected a PEM {0}")]
    Pem(&'static str),
    /// A certificate or CRL that does not parse.
    #[error("malformed {what}: {detail}")]
    Malformed {
        /// What was being parsed.
        what: &'static str,
        /// The parser's complaint.
        detail: String,
    },
    /// The authority certificate is not a self-signed CA certificate.
    #[error("the authority certificate is not a self-signed CA certificate")]
    NotAnAuthority,
    /// The CRL is not issued and signed by the authority.
    #[error("the CRL is not signed by this authority")]
    CrlNotFromAuthority,
    /// A secret key that cannot be read, or is not Ed25519.
    #[error("bad secret key: {0}")]
    Key(String),
    /// The secret key does not match the certificate's public key.
    #[error("the secret key does not belong to the certificate")]
    KeyMismatch,
    /// The certificate has no usable common name.
    #[error("the certificate has no common name")]
    NoCommonName,
    /// The secret key is protected by a passphrase and none was given.
    #[error("the secret key is protected by a passphrase, and none was given")]
    PassphraseNeeded,
    /// The passphrase does not open the protected secret key.
    #[error("wrong passphrase: it does not open the protected secret key")]
    WrongPassphrase,
    /// rcgen refused to make a certificate or CRL.
    #[error("cannot make the certificate: {0}")]
    Make(#[from] rcgen::Error),
}

fn pem_block(pem: &str, label: &'static str) -> Result<Vec<u8>, TrustError> {
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|_| TrustError::Pem(label))?;
    if block.label != label {
        return Err(TrustError::Pem(label));
    }
    Ok(block.contents)
}

fn parse_cert(der: &[u8]) -> Result<X509Certificate<'_>, String> {
    match X509Certificate::from_der(der) {
        Ok(([], c)) => Ok(c),
        Ok(_) => Err("trailing bytes after the certificate".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn common_name(c: &X509Certificate<'_>) -> Option<String> {
    c.subject().iter_common_name().next()?.as_str().ok().map(str::to_owned)
}

/// The raw Ed25519 key of a certificate, or why there is none.
fn ed25519_key(c: &X509Certificate<'_>) -> Result<Ed25519Verifier, String> {
    let spki = c.public_key();
    if spki.algorithm.algorithm != x509_parser::oid_registry::OID_SIG_ED25519 {
        return Err("not an Ed25519 key".into());
    }
    Ed25519Verifier::from_bytes(&spki.subject_public_key.data).map_err(|e| e.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn reason_text(r: webpki::RevocationReason) -> &'static str {
    use webpki::RevocationReason as R;
    match r {
        R::Unspecified => "unspecified",
        R::KeyCompromise => "key compromise",
        R::CaCompromise => "authority compromise",
        R::AffiliationChanged => "affiliation changed",
        R::Superseded => "superseded",
        R::CessationOfOperation => "cessation of operation",
        R::CertificateHold => "certificate hold",
        R::RemoveFromCrl => "removed from CRL",
        R::PrivilegeWithdrawn => "privilege withdrawn",
        R::AaCompromise => "attribute authority compromise",
    }
}

/// A presented member certificate, parsed but not yet checked against any
/// authority: the parsing half of [`Authority::verify`], which
/// [`crate::payload::parse_payload`] runs alone.
pub(crate) struct MemberCert<'a> {
    parsed: X509Certificate<'a>,
    verifier: Ed25519Verifier,
    ee: EndEntityCert<'a>,
}

impl<'a> MemberCert<'a> {
    /// Parses the certificate (x509-parser, then webpki) and reads its
    /// Ed25519 key; [`Refusal::Malformed`] if any of it fails.
    pub(crate) fn parse(der: &'a CertificateDer<'a>) -> Result<MemberCert<'a>, Refusal> {
        let parsed = parse_cert(der).map_err(Refusal::Malformed)?;
        let verifier = ed25519_key(&parsed).map_err(Refusal::Malformed)?;
        let ee = EndEntityCert::try_from(der).map_err(|e| Refusal::Malformed(format!("{e:?}")))?;
        Ok(MemberCert { parsed, verifier, ee })
    }

    /// The subject's common name, if it has one.
    pub(crate) fn common_name(&self) -> Option<String> {
        common_name(&self.parsed)
    }

    /// The serial number, hex.
    pub(crate) fn serial(&self) -> String {
        hex(self.parsed.raw_serial())
    }
}

/// A member certificate that passed [`Authority::verify`].
#[derive(Clone)]
pub struct Certified {
    /// The member name the certificate holds (equal to the member checked).
    pub name: String,
    /// The certificate's serial number, hex.
    pub serial: String,
    /// The certified identity key.
    pub verifier: Arc<dyn Verifier>,
}

impl std::fmt::Debug for Certified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certified").field("name", &self.name).field("serial", &self.serial).finish()
    }
}

/// What a member trusts: the group authority's certificate and its current
/// CRL (if it has one, every member certificate must be covered by it).
pub struct Authority {
    ca: CertificateDer<'static>,
    crl: Option<CertRevocationList<'static>>,
    crl_number: Option<String>,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authority").field("crl_number", &self.crl_number).finish()
    }
}

impl Authority {
    /// Loads the authority certificate and (optionally) its CRL. Checks that
    /// the certificate is a self-signed CA and that the CRL is issued and
    /// signed by it.
    pub fn from_pem(ca_pem: &str, crl_pem: Option<&str>) -> Result<Authority, TrustError> {
        let ca_der = pem_block(ca_pem, "CERTIFICATE")?;
        let ca =
            parse_cert(&ca_der).map_err(|detail| TrustError::Malformed { what: "authority certificate", detail })?;
        if !ca.is_ca() || ca.verify_signature(None).is_err() {
            return Err(TrustError::NotAnAuthority);
        }
        let (crl, crl_number) = match crl_pem {
            None => (None, None),
            Some(pem) => {
                let der = pem_block(pem, "X509 CRL")?;
                let parsed = match CertificateRevocationList::from_der(&der) {
                    Ok(([], c)) => c,
                    Ok(_) => {
                        return Err(TrustError::Malformed { what: "CRL", detail: "trailing bytes".into() });
                    }
                    Err(e) => return Err(TrustError::Malformed { what: "CRL", detail: e.to_string() }),
                };
                if parsed.issuer().as_raw() != ca.subject().as_raw()
                    || parsed.verify_signature(ca.public_key()).is_err()
                {
                    return Err(TrustError::CrlNotFromAuthority);
                }
                let number = parsed.crl_number().map(|n| n.to_string());
                let owned = OwnedCertRevocationList::from_der(&der)
                    .map_err(|e| TrustError::Malformed { what: "CRL", detail: format!("{e:?}") })?;
                (Some(CertRevocationList::from(owned)), number)
            }
        };
        Ok(Authority { ca: CertificateDer::from(ca_der), crl, crl_number })
    }

    /// The CRL number of the loaded CRL, decimal.
    pub fn crl_number(&self) -> Option<&str> {
        self.crl_number.as_deref()
    }

    /// Checks `cert_der`, presented by `member`, at time `now`.
    pub fn verify(&self, cert_der: &[u8], member: &MemberId, now: SystemTime) -> Result<Certified, Refusal> {
        let der = CertificateDer::from(cert_der);
        let MemberCert { parsed, verifier, ee } = MemberCert::parse(&der)?;
        let serial = hex(parsed.raw_serial());
        let anchors = [webpki::anchor_from_trusted_cert(&self.ca).map_err(|e| Refusal::Invalid(format!("{e:?}")))?];
        let crls: Vec<&CertRevocationList<'_>> = self.crl.iter().collect();
        let revocation = match RevocationOptionsBuilder::new(&crls) {
            Ok(b) => Some(b.build()),
            Err(_) => None, // no CRL loaded: nothing is revoked
        };
        let since = now.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        let res = ee.verify_for_usage(
            &[webpki::ring::ED25519],
            &anchors,
            &[],
            UnixTime::since_unix_epoch(since),
            KeyUsage::client_auth(),
            revocation,
            None,
        );
        if let Err(e) = res.map(|_| ()) {
            return Err(match e {
                webpki::Error::UnknownIssuer => Refusal::UnknownIssuer,
                webpki::Error::CertExpired { .. } => Refusal::Expired,
                webpki::Error::CertNotValidYet { .. } => Refusal::NotYetValid,
                webpki::Error::CertRevoked => {
                    let entry = self.crl.as_ref().and_then(|c| c.find_serial(parsed.raw_serial()).ok().flatten());
                    let reason = entry.and_then(|e| e.reason_code).map(|r| reason_text(r).to_owned());
                    Refusal::Revoked { serial, reason }
                }
                other => Refusal::Invalid(format!("{other:?}")),
            });
        }
        let name = common_name(&parsed).ok_or_else(|| Refusal::Malformed("no common name".into()))?;
        if name != member.as_str() {
            return Err(Refusal::NameMismatch { certified: name });
        }
        Ok(Certified { name, serial, verifier: Arc::new(verifier) })
    }
}

/// A member's own certificate and secret key.
pub struct Identity {
    name: String,
    cert_der: Vec<u8>,
    signer: Arc<dyn Signer>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Identity {
    /// Loads a member certificate and its PKCS#8 Ed25519 secret key; checks
    /// that they belong together. A key protected by a passphrase is
    /// refused ([`TrustError::PassphraseNeeded`]): see [`Identity::from_pem_protected`].
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Identity, TrustError> {
        Self::from_pem_protected(cert_pem, key_pem, None)
    }

    /// As [`Identity::from_pem`], opening a secret key protected by a
    /// passphrase with `passphrase` ([`unprotect_key`]); an unprotected key
    /// loads whatever `passphrase` is.
    pub fn from_pem_protected(
        cert_pem: &str,
        key_pem: &str,
        passphrase: Option<&[u8]>,
    ) -> Result<Identity, TrustError> {
        let cert_der = pem_block(cert_pem, "CERTIFICATE")?;
        if cert_der.len() > usize::from(u16::MAX) {
            // A certificate message carries its length in 16 bits.
            let detail = format!("{} bytes; at most {} can be presented", cert_der.len(), u16::MAX);
            return Err(TrustError::Malformed { what: "certificate", detail });
        }
        let key_pem = unprotect_key(key_pem, passphrase)?;
        let signing =
            ed25519_dalek::SigningKey::from_pkcs8_pem(&key_pem).map_err(|e| TrustError::Key(e.to_string()))?;
        let signer = Ed25519Signer::from_seed(&Zeroizing::new(signing.to_bytes()));
        let (name, key) = {
            let c = parse_cert(&cert_der).map_err(|detail| TrustError::Malformed { what: "certificate", detail })?;
            let key = ed25519_key(&c).map_err(|detail| TrustError::Malformed { what: "certificate", detail })?;
            (common_name(&c).ok_or(TrustError::NoCommonName)?, key)
        };
        if key.public_bytes() != signer.verifier().public_bytes() {
            return Err(TrustError::KeyMismatch);
        }
        Ok(Identity { name, cert_der, signer: Arc::new(signer) })
    }

    /// The member name the certificate holds.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The certificate, DER.
    pub fn cert_der(&self) -> &[u8] {
        &self.cert_der
    }

    /// The signer of the certified key.
    pub fn signer(&self) -> Arc<dyn Signer> {
        self.signer.clone()
    }
}

/// A fresh Ed25519 key from `rng`, as an rcgen key pair and its PKCS#8 PEM.
fn new_key(rng: &mut dyn CryptoRngCore) -> Result<(rcgen::KeyPair, Zeroizing<String>), TrustError> {
    let mut seed = Zeroizing::new([0u8; 32]);
    rng.fill_bytes(seed.as_mut());
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    let der = key.to_pkcs8_der().map_err(|e| TrustError::Key(e.to_string()))?;
    let pair =
        rcgen::KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(der.as_bytes()), &rcgen::PKCS_ED25519)?;
    let pem = Zeroizing::new(pair.serialize_pem());
    Ok((pair, pem))
}

/// PEM label of a secret key protected by a passphrase.
pub const PROTECTED_KEY_LABEL: &str = "ENCRYPTED PRIVATE KEY";

/// Whether `key_pem` is a secret key protected by a passphrase (an
/// `ENCRYPTED PRIVATE KEY` PEM block).
pub fn key_is_protected(key_pem: &str) -> bool {
    key_pem.trim_start().starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----")
}

/// Protects the PKCS#8 secret key `key_pem` (`PRIVATE KEY`) with
/// `passphrase`: encrypted PKCS#8 (PKCS#5 PBES2: scrypt with its recommended
/// cost, log2 N = 17, r = 8, p = 1, and AES-256-CBC; salt and IV from `rng`),
/// as an `ENCRYPTED PRIVATE KEY` PEM.
pub fn protect_key(
    key_pem: &str,
    passphrase: &[u8],
    rng: &mut dyn CryptoRngCore,
) -> Result<Zeroizing<String>, TrustError> {
    use pkcs8::der::pem::LineEnding;
    if passphrase.is_empty() {
        return Err(TrustError::Key("an empty passphrase protects nothing".into()));
    }
    let (label, doc) = pkcs8::SecretDocument::from_pem(key_pem).map_err(|e| TrustError::Key(e.to_string()))?;
    if label != "PRIVATE KEY" {
        return Err(TrustError::Pem("PRIVATE KEY"));
    }
    let info = pkcs8::PrivateKeyInfo::try_from(doc.as_bytes()).map_err(|e| TrustError::Key(e.to_string()))?;
    let encrypted = info.encrypt(&mut *rng, passphrase).map_err(|e| TrustError::Key(e.to_string()))?;
    encrypted.to_pem(PROTECTED_KEY_LABEL, LineEnding::LF).map_err(|e| TrustError::Key(e.to_string()))
}

/// The plain PKCS#8 `PRIVATE KEY` PEM of `key_pem`: returned as it is if
/// it is not protected; opened with `passphrase` if it is
/// ([`TrustError::PassphraseNeeded`] without one,
/// [`TrustError::WrongPassphrase`] if it does not open it).
pub fn unprotect_key(key_pem: &str, passphrase: Option<&[u8]>) -> Result<Zeroizing<String>, TrustError> {
    use pkcs8::der::pem::LineEnding;
    if !key_is_protected(key_pem) {
        return Ok(Zeroizing::new(key_pem.to_owned()));
    }
    let passphrase = passphrase.ok_or(TrustError::PassphraseNeeded)?;
    let (_, doc) = pkcs8::SecretDocument::from_pem(key_pem).map_err(|e| TrustError::Key(e.to_string()))?;
    let info = pkcs8::EncryptedPrivateKeyInfo::try_from(doc.as_bytes()).map_err(|e| TrustError::Key(e.to_string()))?;
    // A wrong passphrase fails the CBC padding, or (rarely) leaves bytes that
    // are not a PKCS#8 key: either way, it is the passphrase.
    let plain = info.decrypt(passphrase).map_err(|_| TrustError::WrongPassphrase)?;
    pkcs8::PrivateKeyInfo::try_from(plain.as_bytes()).map_err(|_| TrustError::WrongPassphrase)?;
    plain.to_pem("PRIVATE KEY", LineEnding::LF).map_err(|e| TrustError::Key(e.to_string()))
}

/// A random positive 16-byte serial number.
fn new_serial(rng: &mut dyn CryptoRngCore) -> rcgen::SerialNumber {
    let mut s = [0u8; 16];
    rng.fill_bytes(&mut s);
    s[0] = (s[0] & 0x7f) | 0x40; // positive, and no leading zero byte to trim
    rcgen::SerialNumber::from_slice(&s)
}

/// A certificate revocation, as [`Issuer::crl`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revocation {
    /// Serial number of the revoked certificate (big-endian bytes).
    pub serial: Vec<u8>,
    /// When it was revoked.
    pub time: SystemTime,
    /// Why, if said.
    pub reason: Option<rcgen::RevocationReason>,
}

/// A newly issued member identity.
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The secret key, PKCS#8 PEM.
    pub key_pem: Zeroizing<String>,
    /// The serial number, hex.
    pub serial: String,
}

/// The authority's side: the CA certificate and key, to issue member
/// certificates and sign CRLs.
pub struct Issuer {
    ca: rcgen::Certificate,
    key: rcgen::KeyPair,
    ca_pem: String,
}

impl Issuer {
    /// Creates a new authority called `name` (the CA's common name), valid
    /// from `not_before` to `not_after`, with a key from `rng`. Returns the
    /// issuer and the CA's secret key PEM (for the caller to store).
    pub fn create(
        name: &str,
        not_before: SystemTime,
        not_after: SystemTime,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<(Issuer, Zeroizing<String>), TrustError> {
        let (key, key_pem) = new_key(rng)?;
        let mut params = rcgen::CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::CrlSign];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.serial_number = Some(new_serial(rng));
        let ca = params.self_signed(&key)?;
        let ca_pem = ca.pem();
        Ok((Issuer { ca, key, ca_pem }, key_pem))
    }

    /// Loads an authority from its certificate and (unprotected) secret key.
    pub fn load(ca_pem: &str, key_pem: &str) -> Result<Issuer, TrustError> {
        Self::load_protected(ca_pem, key_pem, None)
    }

    /// Loads an authority from its certificate and secret key, opening a
    /// key protected by a passphrase with `passphrase` ([`unprotect_key`]).
    pub fn load_protected(ca_pem: &str, key_pem: &str, passphrase: Option<&[u8]>) -> Result<Issuer, TrustError> {
        Authority::from_pem(ca_pem, None)?;
        let key_pem = unprotect_key(key_pem, passphrase)?;
        let key = rcgen::KeyPair::from_pkcs8_pem_and_sign_algo(&key_pem, &rcgen::PKCS_ED25519)
            .map_err(|e| TrustError::Key(e.to_string()))?;
        let stored = pem_block(ca_pem, "CERTIFICATE")?;
        let stored_key = parse_cert(&stored)
            .and_then(|c| ed25519_key(&c))
            .map_err(|detail| TrustError::Malformed { what: "authority certificate", detail })?;
        if stored_key.public_bytes() != key.public_key_raw() {
            return Err(TrustError::KeyMismatch);
        }
        // rcgen issues with an issuer `Certificate`; re-signing the parsed
        // parameters gives one with the same name and key, which is all it uses.
        let ca = rcgen::CertificateParams::from_ca_cert_pem(ca_pem)?.self_signed(&key)?;
        let ca_pem = ca_pem.to_owned();
        Ok(Issuer { ca, key, ca_pem })
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Issues a member certificate for `member` (subject CN), valid from
    /// `not_before` to `not_after`, usable as a TLS client certificate, with
    /// a fresh key from `rng`.
    pub fn issue(
        &self,
        member: &MemberId,
        not_before: SystemTime,
        not_after: SystemTime,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Issued, TrustError> {
        let params = rcgen::CertificateParams::default();
        let usage = rcgen::ExtendedKeyUsagePurpose::ClientAuth;
        self.sign_leaf(params, member.as_str(), usage, not_before, not_after, rng)
    }

    /// Issues a daemon's TLS server certificate for `hosts` (DNS names or IP
    /// addresses, put in the subject alternative names; the first is also the
    /// common name), valid from `not_before` to `not_after`, with a fresh key
    /// from `rng`. Clients that trust the authority then trust the daemon.
    pub fn issue_daemon(
        &self,
        hosts: &[String],
        not_before: SystemTime,
        not_after: SystemTime,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Issued, TrustError> {
        let Some(first) = hosts.first() else {
            return Err(TrustError::Malformed { what: "daemon certificate", detail: "no host name given".into() });
        };
        let params = rcgen::CertificateParams::new(hosts.to_vec())?;
        let usage = rcgen::ExtendedKeyUsagePurpose::ServerAuth;
        self.sign_leaf(params, first, usage, not_before, not_after, rng)
    }

    /// Completes `params` as an end-entity certificate named `common_name`
    /// for `usage`, with a fresh key and serial from `rng`, and signs it.
    fn sign_leaf(
        &self,
        mut params: rcgen::CertificateParams,
        common_name: &str,
        usage: rcgen::ExtendedKeyUsagePurpose,
        not_before: SystemTime,
        not_after: SystemTime,
        rng: &mut dyn CryptoRngCore,
    ) -> Result<Issued, TrustError> {
        let (key, key_pem) = new_key(rng)?;
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(rcgen::DnType::CommonName, common_name);
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        params.not_before = not_before.into();
        params.not_after = not_after.into();
        params.use_authority_key_identifier_extension = true;
        let serial = new_serial(rng);
        let serial_hex = hex(serial.as_ref());
        params.serial_number = Some(serial);
        let cert = params.signed_by(&key, &self.ca, &self.key)?;
        Ok(Issued { cert_pem: cert.pem(), key_pem, serial: serial_hex })
    }

    /// Signs a CRL numbered `number` listing `revoked`, issued at `now` and
    /// due for renewal at `next_update`.
    pub fn crl(
        &self,
        number: u64,
        revoked: &[Revocation],
        now: SystemTime,
        next_update: SystemTime,
    ) -> Result<String, TrustError> {
        let params = rcgen::CertificateRevocationListParams {
            this_update: now.into(),
            next_update: next_update.into(),
            crl_number: rcgen::SerialNumber::from(number),
            issuing_distribution_point: None,
            revoked_certs: revoked
                .iter()
                .map(|r| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from_slice(&r.serial),
                    revocation_time: r.time.into(),
                    reason_code: r.reason,
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.ca, &self.key)?.pem()?)
    }
}

/// The revocations and number of an existing CRL (to extend it).
pub fn read_crl(crl_pem: &str) -> Result<(u64, Vec<Revocation>), TrustError> {
    let der = pem_block(crl_pem, "X509 CRL")?;
    let crl = match CertificateRevocationList::from_der(&der) {
        Ok((_, c)) => c,
        Err(e) => return Err(TrustError::Malformed { what: "CRL", detail: e.to_string() }),
    };
    let number = crl.crl_number().and_then(|n| u64::try_from(n.clone()).ok()).unwrap_or(0);
    let revoked = crl
        .iter_revoked_certificates()
        .map(|r| Revocation {
            serial: r.raw_serial().to_vec(),
            time: UNIX_EPOCH + Duration::from_secs(r.revocation_date.timestamp().max(0) as u64),
            reason: r.reason_code().and_then(|(_, code)| rcgen_reason(code.0)),
        })
        .collect();
    Ok((number, revoked))
}

fn rcgen_reason(code: u8) -> Option<rcgen::RevocationReason> {
    use rcgen::RevocationReason as R;
    Some(match code {
        0 => R::Unspecified,
        1 => R::KeyCompromise,
        2 => R::CaCompromise,
        3 => R::AffiliationChanged,
        4 => R::Superseded,
        5 => R::CessationOfOperation,
        6 => R::CertificateHold,
        8 => R::RemoveFromCrl,
        9 => R::PrivilegeWithdrawn,
        10 => R::AaCompromise,
        _ => return None,
    })
}

/// What a member certificate says (for listings).
#[derive(Clone, Debug)]
pub struct CertInfo {
    /// Subject common name.
    pub name: String,
    /// Serial number, hex.
    pub serial: String,
    /// Big-endian serial bytes.
    pub serial_bytes: Vec<u8>,
    /// Start of validity.
    pub not_before: SystemTime,
    /// End of validity.
    pub not_after: SystemTime,
}

/// Reads a certificate's name, serial and validity.
pub fn cert_info(cert_pem: &str) -> Result<CertInfo, TrustError> {
    let der = pem_block(cert_pem, "CERTIFICATE")?;
    let c = parse_cert(&der).map_err(|detail| TrustError::Malformed { what: "certificate", detail })?;
    let at = |t: i64| UNIX_EPOCH + Duration::from_secs(t.max(0) as u64);
    Ok(CertInfo {
        name: common_name(&c).ok_or(TrustError::NoCommonName)?,
        serial: hex(c.raw_serial()),
        serial_bytes: c.raw_serial().to_vec(),
        not_before: at(c.validity().not_before.timestamp()),
        not_after: at(c.validity().not_after.timestamp()),
    })
}

/// A cluster daemon's identity in the integrated architecture's key
/// agreement among the daemons: its certificate of the group authority
/// (member name `daemon-N`, as `conclave keys issue daemon-N` issues it) and
/// the authority it checks the other daemons' certificates against. The
/// daemons present their certificates over the ordered stream, and a daemon
/// admits daemon `N` only with a valid, unrevoked certificate for
/// `daemon-N`.
pub struct CertifiedDaemon {
    identity: Identity,
    authority: Authority,
}

impl std::fmt::Debug for CertifiedDaemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertifiedDaemon").field("name", &self.identity.name).finish_non_exhaustive()
    }
}

impl CertifiedDaemon {
    /// Daemon `daemon` with `identity`, trusting `authority`. Refuses an
    /// identity that is not `daemon`'s, or that the authority refuses now.
    pub fn new(
        daemon: conclave_gcs::core::DaemonId,
        identity: Identity,
        authority: Authority,
    ) -> Result<Self, TrustError> {
        let member = conclave_integrated::daemon_member(daemon);
        authority.verify(&identity.cert_der, &member, SystemTime::now()).map_err(|refusal| TrustError::Malformed {
            what: "daemon certificate",
            detail: format!("for {member}: {refusal}"),
        })?;
        Ok(Self { identity, authority })
    }
}

impl conclave_integrated::DaemonTrust for CertifiedDaemon {
    fn signer(&self) -> Arc<dyn Signer> {
        self.identity.signer()
    }

    fn credential(&self) -> Vec<u8> {
        self.identity.cert_der.clone()
    }

    fn verify(&self, daemon: conclave_gcs::core::DaemonId, credential: &[u8]) -> Result<Arc<dyn Verifier>, String> {
        let member = conclave_integrated::daemon_member(daemon);
        self.authority
            .verify(credential, &member, SystemTime::now())
            .map(|c| c.verifier)
            .map_err(|refusal| format!("{member}'s certificate: {refusal}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_codec_round_trips_and_rejects_garbage() {
        let all = [
            Refusal::NoCertificate,
            Refusal::Malformed("x".into()),
            Refusal::UnknownIssuer,
            Refusal::Expired,
            Refusal::NotYetValid,
            Refusal::Revoked { serial: "ab".into(), reason: Some("key compromise".into()) },
            Refusal::Revoked { serial: "ab".into(), reason: None },
            Refusal::NameMismatch { certified: "alice".into() },
            Refusal::BadProof,
            Refusal::Invalid("y".into()),
        ];
        for r in all {
            let mut v = Vec::new();
            r.encode(&mut v);
            assert_eq!(Refusal::decode(&v), Some(r.clone()));
            for cut in 0..v.len() {
                let _ = Refusal::decode(&v[..cut]);
            }
            v.push(0);
            assert_eq!(Refusal::decode(&v), None, "trailing byte accepted for {r:?}");
        }
        assert_eq!(Refusal::decode(&[]), None);
        assert_eq!(Refusal::decode(&[77]), None);
    }

    #[test]
    fn long_refusal_fields_are_cut_at_a_character_boundary() {
        // 128 two-byte characters: 256 bytes, and the 255-byte limit falls
        // inside the last one.
        let certified = "é".repeat(128);
        let mut v = Vec::new();
        Refusal::NameMismatch { certified: certified.clone() }.encode(&mut v);
        let Some(Refusal::NameMismatch { certified: got }) = Refusal::decode(&v) else { panic!("{v:?}") };
        assert_eq!(got.len(), 254);
        assert!(certified.starts_with(&got));
    }
}
