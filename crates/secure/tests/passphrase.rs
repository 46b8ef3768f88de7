//! Secret keys protected by a passphrase (encrypted PKCS#8): an authority
//! whose key is protected issues only with the right passphrase; a member
//! identity whose key is protected loads only with it; the protected PEM is
//! an `ENCRYPTED PRIVATE KEY` block that does not hold the plain key; keys
//! without a passphrase load as before, with or without one given.

use std::time::{Duration, SystemTime};

use conclave_secure::trust::{self, Authority, Identity, Issuer, TrustError};
use conclave_secure::MemberId;
use rand_chacha::ChaCha20Rng;
use rand_core::SeedableRng;

const DAY: Duration = Duration::from_secs(86_400);

/// The base64 body of a PEM block, on one line.
fn body(pem: &str) -> String {
    pem.lines().filter(|l| !l.starts_with("-----")).collect()
}

#[test]
fn a_protected_authority_issues_only_with_its_passphrase() {
    let mut rng = ChaCha20Rng::seed_from_u64(7);
    let now = SystemTime::now();
    let (issuer, key_pem) = Issuer::create("authority", now - DAY, now + DAY, &mut rng).unwrap();
    let protected = trust::protect_key(&key_pem, b"correct horse", &mut rng).unwrap();
    assert!(protected.starts_with("-----BEGIN ENCRYPTED PRIVATE KEY-----\n"), "{}", protected.lines().next().unwrap());
    assert!(trust::key_is_protected(&protected));
    assert!(!trust::key_is_protected(&key_pem));
    assert!(!protected.contains(&body(&key_pem)), "the protected file holds the plain key");
    let ca = issuer.ca_pem();

    assert!(matches!(Issuer::load(ca, &protected), Err(TrustError::PassphraseNeeded)));
    assert!(matches!(Issuer::load_protected(ca, &protected, None), Err(TrustError::PassphraseNeeded)));
    assert!(matches!(Issuer::load_protected(ca, &protected, Some(b"wrong horse")), Err(TrustError::WrongPassphrase)));
    let loaded = Issuer::load_protected(ca, &protected, Some(b"correct horse")).unwrap();
    let alice = MemberId::new("alice").unwrap();
    let issued = loaded.issue(&alice, now - DAY, now + DAY, &mut rng).unwrap();
    let authority = Authority::from_pem(ca, None).unwrap();
    let id = Identity::from_pem(&issued.cert_pem, &issued.key_pem).unwrap();
    assert!(authority.verify(id.cert_der(), &alice, now).is_ok(), "issued by the unlocked authority");

    // Without a passphrase, as today, with or without one given.
    Issuer::load(ca, &key_pem).unwrap();
    Issuer::load_protected(ca, &key_pem, Some(b"anything")).unwrap();
}

#[test]
fn a_protected_member_identity_loads_only_with_its_passphrase() {
    let mut rng = ChaCha20Rng::seed_from_u64(8);
    let now = SystemTime::now();
    let (issuer, _) = Issuer::create("authority", now - DAY, now + DAY, &mut rng).unwrap();
    let issued = issuer.issue(&MemberId::new("bob").unwrap(), now - DAY, now + DAY, &mut rng).unwrap();
    let protected = trust::protect_key(&issued.key_pem, "pässphrase".as_bytes(), &mut rng).unwrap();
    assert!(!protected.contains(&body(&issued.key_pem)));

    let cert = &issued.cert_pem;
    let err = Identity::from_pem(cert, &protected).unwrap_err();
    assert!(matches!(err, TrustError::PassphraseNeeded), "{err}");
    assert!(err.to_string().contains("protected by a passphrase"), "{err}");
    let err = Identity::from_pem_protected(cert, &protected, Some(b"passphrase")).unwrap_err();
    assert!(matches!(err, TrustError::WrongPassphrase), "{err}");
    assert!(err.to_string().contains("wrong passphrase"), "{err}");
    let id = Identity::from_pem_protected(cert, &protected, Some("pässphrase".as_bytes())).unwrap();
    let plain = Identity::from_pem(cert, &issued.key_pem).unwrap();
    assert_eq!(id.name(), "bob");
    assert_eq!(id.signer().verifier().public_bytes(), plain.signer().verifier().public_bytes());

    // Opening gives back the very key; an unprotected key passes through.
    assert_eq!(*trust::unprotect_key(&protected, Some("pässphrase".as_bytes())).unwrap(), *issued.key_pem);
    assert_eq!(*trust::unprotect_key(&issued.key_pem, None).unwrap(), *issued.key_pem);
    // An empty passphrase protects nothing, and a protected key cannot be protected again.
    assert!(trust::protect_key(&issued.key_pem, b"", &mut rng).is_err());
    assert!(trust::protect_key(&protected, b"again", &mut rng).is_err());
}
