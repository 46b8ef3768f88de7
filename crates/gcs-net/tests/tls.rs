//! TLS between clients and the daemon, with certificates made by rcgen in
//! the format `conclave keys` writes (PEM X.509, Ed25519 keys in PKCS#8 PEM,
//! a self-signed authority, member certificates whose subject CommonName is
//! the member name, CRLs in PEM signed by the authority): a round trip with
//! join and multicast, and the client authentication the daemon demands when
//! given an authority — no certificate, a certificate of another authority,
//! a revoked certificate and a Hello under another name are all refused —
//! also when the revocation comes while the member is connected (a reload),
//! and a CRL past its nextUpdate is refused.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

use conclave_gcs_net::{
    tls, Client, ClientAuth, ClientError, Daemon, DaemonConfig, DaemonError, ErrorCode, Event, Identity, Service,
    TlsClientOptions, TlsError, TlsListen, UncertifiedNames,
};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType, IsCa, KeyIdMethod, KeyPair,
    KeyUsagePurpose, RevocationReason, RevokedCertParams, SerialNumber,
};

/// Fails the test instead of hanging it.
async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), f).await.unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// A certificate authority and the files it writes into a directory.
struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
    dir: PathBuf,
    name: String,
}

impl Authority {
    fn new(dir: &Path, name: &str) -> Self {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, format!("{name} authority"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let cert = params.self_signed(&key).unwrap();
        let a = Authority { cert, key, dir: dir.to_owned(), name: name.to_owned() };
        std::fs::write(a.ca_path(), a.cert.pem()).unwrap();
        a
    }

    fn ca_path(&self) -> PathBuf {
        self.dir.join(format!("{}-ca.pem", self.name))
    }

    /// Issues a certificate for `cn` (with `sans` as subject alternative
    /// names), writes `<file>.crt` and `<file>.key`, and returns their paths.
    fn issue(&self, file: &str, cn: &str, sans: &[&str], serial: u64) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.serial_number = Some(SerialNumber::from(serial));
        let cert = params.signed_by(&key, &self.cert, &self.key).unwrap();
        let (crt, pem_key) = (self.dir.join(format!("{file}.crt")), self.dir.join(format!("{file}.key")));
        std::fs::write(&crt, cert.pem()).unwrap();
        std::fs::write(&pem_key, key.serialize_pem()).unwrap();
        (crt, pem_key)
    }

    /// Writes a CRL revoking `serials` and returns its path.
    fn revoke(&self, serials: &[u64]) -> PathBuf {
        self.revoke_until(serials, 2100)
    }

    /// Writes a CRL revoking `serials`, due for its next update at the start
    /// of `next_update` (a year), and returns its path.
    fn revoke_until(&self, serials: &[u64], next_update: i32) -> PathBuf {
        let crl = CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(next_update, 1, 1),
            crl_number: SerialNumber::from(1),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&s| RevokedCertParams {
                    serial_number: SerialNumber::from(s),
                    revocation_time: rcgen::date_time_ymd(2024, 1, 1),
                    reason_code: Some(RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.cert, &self.key)
        .unwrap();
        let path = self.dir.join(format!("{}-crl.pem", self.name));
        std::fs::write(&path, crl.pem().unwrap()).unwrap();
        path
    }
}

struct Setup {
    daemon: Daemon,
    dir: tempfile::TempDir,
    authority: Authority,
}

/// A daemon with a Unix socket and a TLS listener whose certificate the
/// authority issued for localhost and 127.0.0.1; with `client_auth`, it
/// demands client certificates of the same authority, revoking `revoked`.
async fn start(client_auth: bool, revoked: &[u64]) -> Setup {
    start_with(client_auth, revoked, |_| {}).await
}

/// [`start`], with the daemon's configuration tuned by `tune`.
async fn start_with(client_auth: bool, revoked: &[u64], tune: impl FnOnce(&mut DaemonConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new(dir.path(), "group");
    let (crt, key) = authority.issue("daemon", "conclave daemon", &["localhost", "127.0.0.1"], 1);
    let auth = client_auth.then(|| {
        let crls = if revoked.is_empty() { vec![] } else { vec![authority.revoke(revoked)] };
        ClientAuth::from_pem_files(&authority.ca_path(), &crls).unwrap()
    });
    let identity = Identity::from_pem_files(&crt, &key).unwrap();
    let mut config = DaemonConfig {
        unix: Some(dir.path().join("conclave.sock")),
        tls: Some(TlsListen { addr: "127.0.0.1:0".parse().unwrap(), identity, client_auth: auth }),
        ..DaemonConfig::default()
    };
    tune(&mut config);
    let daemon = Daemon::start(config).await.unwrap();
    Setup { daemon, dir, authority }
}

impl Setup {
    /// Client options trusting the group authority, showing the member
    /// certificate issued for `cn` if given.
    fn options(&self, member: Option<(&str, u64)>) -> TlsClientOptions {
        let files = member.map(|(cn, serial)| self.authority.issue(cn, cn, &[], serial));
        TlsClientOptions::from_pem_files(
            &self.authority.ca_path(),
            files.as_ref().map(|(c, k)| (c.as_path(), k.as_path())),
        )
        .unwrap()
    }

    async fn connect(&self, options: &TlsClientOptions, name: &str) -> Result<Client, ClientError> {
        within("TLS connect", Client::connect_tls(self.daemon.tls_addr().unwrap(), "localhost", options, name)).await
    }
}

/// Receives until a view of `group` with `n` members arrives.
async fn until_view(c: &mut Client, group: &str, n: usize) {
    within("view", async {
        loop {
            if let Event::View { group: g, view } = c.recv().await.unwrap() {
                if g.as_str() == group && view.members.len() == n {
                    return;
                }
            }
        }
    })
    .await
}

async fn until_message(c: &mut Client) -> (String, Vec<u8>) {
    within("message", async {
        loop {
            if let Event::Message { sender, payload, .. } = c.recv().await.unwrap() {
                return (sender.to_string(), payload.to_vec());
            }
        }
    })
    .await
}

/// Checks that a connection failed in the TLS handshake, for the reason
/// rustls names `why`.
fn refused(r: Result<Client, ClientError>, why: &str) {
    match r {
        Err(ClientError::Io(e)) => assert!(format!("{e:?}").contains(why), "expected {why}, got {e:?}"),
        other => panic!("expected a TLS failure ({why}), got {:?}", other.map(|_| ())),
    }
}

/// A TLS client and a Unix-socket client share a group: views and agreed
/// messages (up to 64 KiB, across TLS record boundaries) flow both ways.
async fn round_trip(s: &Setup, tls_client: Client) {
    let mut a = tls_client;
    let mut b = Client::connect_unix(s.daemon.unix_path().unwrap(), "bob").await.unwrap();
    a.join("g").await.unwrap();
    until_view(&mut a, "g", 1).await;
    b.join("g").await.unwrap();
    until_view(&mut a, "g", 2).await;
    until_view(&mut b, "g", 2).await;
    let big: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    a.multicast("g", Service::Agreed, big.clone()).await.unwrap();
    for c in [&mut a, &mut b] {
        let (sender, payload) = until_message(c).await;
        assert_eq!(sender, "alice");
        assert!(payload == big, "the 64 KiB message arrives intact ({} bytes)", payload.len());
    }
    b.multicast("g", Service::Agreed, &b"hi over unix"[..]).await.unwrap();
    for c in [&mut a, &mut b] {
        assert_eq!(until_message(c).await, ("bob".to_string(), b"hi over unix".to_vec()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_round_trip_without_client_certificates() {
    let s = start(false, &[]).await;
    let a = s.connect(&s.options(None), "alice").await.unwrap();
    round_trip(&s, a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_good_member_certificate_is_accepted_under_its_own_name() {
    let s = start(true, &[7]).await;
    let a = s.connect(&s.options(Some(("alice", 2))), "alice").await.unwrap();
    round_trip(&s, a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_a_certificate_is_refused_when_the_daemon_demands_one() {
    let s = start(true, &[]).await;
    let r = s.connect(&s.options(None), "alice").await;
    refused(r, "CertificateRequired");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_authority_is_refused() {
    let s = start(true, &[]).await;
    let other = Authority::new(s.dir.path(), "other");
    let (crt, key) = other.issue("mallory", "alice", &[], 2);
    // Mallory trusts the right daemon but her certificate is from elsewhere.
    let options = TlsClientOptions::new(
        &tls::load_certs(&s.authority.ca_path()).unwrap(),
        Some(Identity::from_pem_files(&crt, &key).unwrap()),
    )
    .unwrap();
    let r = s.connect(&options, "alice").await;
    refused(r, "UnknownCA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_certificate_is_refused_and_others_of_the_authority_are_not() {
    let s = start(true, &[5]).await;
    let r = s.connect(&s.options(Some(("carol", 5))), "carol").await;
    refused(r, "CertificateRevoked");
    s.connect(&s.options(Some(("dave", 6))), "dave").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_under_another_name_than_the_certified_one_is_a_fatal_error() {
    let s = start(true, &[]).await;
    let options = s.options(Some(("alice", 2)));
    match s.connect(&options, "bob").await {
        Err(ClientError::Refused { code, text }) => {
            assert_eq!(code, ErrorCode::IdentityMismatch);
            assert_eq!(text, "certificate is for alice, Hello says bob");
        }
        other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
    }
    // The certificate still works under its own name.
    s.connect(&options, "alice").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_certificate_of_an_unknown_authority_or_for_another_name_is_refused() {
    let s = start(false, &[]).await;
    let other = Authority::new(s.dir.path(), "other");
    let stranger = TlsClientOptions::from_pem_files(&other.ca_path(), None).unwrap();
    let r = s.connect(&stranger, "alice").await;
    refused(r, "UnknownIssuer");
    let r = within(
        "connect",
        Client::connect_tls(s.daemon.tls_addr().unwrap(), "conclave.example", &s.options(None), "alice"),
    )
    .await;
    refused(r, "NotValidForName");
    // By IP address, which the certificate also names, it works.
    let options = s.options(None);
    within("connect", Client::connect_tls(s.daemon.tls_addr().unwrap(), "127.0.0.1", &options, "alice")).await.unwrap();
}

/// Revokes `serials` in a fresh CRL and reloads the daemon's client
/// certificates from the files; returns who was cut off.
async fn reload_revoking(s: &Setup, serials: &[u64]) -> Result<Vec<String>, DaemonError> {
    let crl = s.authority.revoke(serials);
    let auth = ClientAuth::from_pem_files(&s.authority.ca_path(), &[crl]).unwrap();
    let cut = within("reload", s.daemon.reload_client_auth(Some(auth))).await?;
    Ok(cut.iter().map(|n| n.to_string()).collect())
}

/// A member revoked while connected is told so and cut off at the reload,
/// its group sees it leave, it cannot come back, and other members of the
/// authority (connected or new) are not disturbed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_revoked_while_connected_is_cut_off_at_the_reload_and_its_group_sees_it_leave() {
    let s = start(true, &[99]).await;
    let carol_options = s.options(Some(("carol", 5)));
    let mut alice = s.connect(&s.options(Some(("alice", 2))), "alice").await.unwrap();
    let mut carol = s.connect(&carol_options, "carol").await.unwrap();
    alice.join("g").await.unwrap();
    until_view(&mut alice, "g", 1).await;
    carol.join("g").await.unwrap();
    until_view(&mut alice, "g", 2).await;
    until_view(&mut carol, "g", 2).await;

    let started = std::time::Instant::now();
    assert_eq!(reload_revoking(&s, &[99, 5]).await.unwrap(), ["carol"]);
    let told = within("carol's error", async {
        loop {
            match carol.recv().await {
                Ok(Event::Error { code, text }) => return (code, text),
                Ok(_) => {}
                Err(e) => panic!("carol's connection ended without an error frame: {e}"),
            }
        }
    })
    .await;
    assert_eq!(told.0, ErrorCode::Revoked);
    assert_eq!(told.1, "the certificate of carol has been revoked: disconnected");
    let view = within("alice's view without carol", async {
        loop {
            if let Event::View { group, view } = alice.recv().await.unwrap() {
                if group.as_str() == "g" && view.members.len() == 1 {
                    return view;
                }
            }
        }
    })
    .await;
    assert_eq!(view.members[0].id.as_str(), "alice");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    // New handshakes use the new CRL at once.
    refused(s.connect(&carol_options, "carol").await, "CertificateRevoked");
    s.connect(&s.options(Some(("dave", 6))), "dave").await.unwrap();
    // Alice was never disturbed.
    alice.multicast("g", Service::Agreed, &b"still here"[..]).await.unwrap();
    assert_eq!(until_message(&mut alice).await, ("alice".to_string(), b"still here".to_vec()));
}

/// A reload with a CRL past its nextUpdate is refused and changes nothing;
/// such a CRL is refused at start too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crl_past_its_next_update_is_refused_at_start_and_at_reload() {
    let s = start(true, &[99]).await;
    let carol_options = s.options(Some(("carol", 5)));
    let mut carol = s.connect(&carol_options, "carol").await.unwrap();
    let stale = s.authority.revoke_until(&[5], 2021);
    let auth = ClientAuth::from_pem_files(&s.authority.ca_path(), &[stale]).unwrap();
    let e = auth.next_update().unwrap_err().to_string();
    assert!(e.contains("out of date") && e.contains("2021"), "{e}");
    let e = within("reload", s.daemon.reload_client_auth(Some(auth.clone()))).await.unwrap_err().to_string();
    assert!(e.contains("out of date"), "{e}");
    // The old trust stays: carol is still connected, and others still get in.
    carol.join("g").await.unwrap();
    until_view(&mut carol, "g", 1).await;
    s.connect(&s.options(Some(("dave", 6))), "dave").await.unwrap();

    let (crt, key) = s.authority.issue("daemon2", "conclave daemon", &["localhost"], 8);
    let config = DaemonConfig {
        tls: Some(TlsListen {
            addr: "127.0.0.1:0".parse().unwrap(),
            identity: Identity::from_pem_files(&crt, &key).unwrap(),
            client_auth: Some(auth),
        }),
        ..DaemonConfig::default()
    };
    let e = Daemon::start(config).await.map(|_| ()).unwrap_err().to_string();
    assert!(e.contains("out of date"), "{e}");
}

/// On a daemon that certifies names, a local process without a certificate
/// cannot squat a member's name: its Hello as bob is refused and the real
/// bob gets in over TLS. A name the configuration lists for the process's
/// user (exactly or by pattern) is accepted; plain TCP takes no name at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_client_cannot_take_a_name_a_certified_member_could_claim() {
    use std::os::unix::fs::MetadataExt;
    let uid = std::fs::metadata("/proc/self").unwrap().uid();
    let names = [(uid, vec!["alice".to_string(), "bot-*".to_string()])].into_iter().collect();
    let s = start_with(true, &[99], |c| {
        c.uncertified_names = UncertifiedNames::ByUid(names);
        c.tcp = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let unix = s.daemon.unix_path().unwrap();
    match Client::connect_unix(unix, "bob").await {
        Err(ClientError::Refused { code, text }) => {
            assert_eq!(code, ErrorCode::IdentityMismatch);
            assert!(text.contains(&format!("user {uid} may not take the name bob")), "{text}");
        }
        other => panic!("a local client took bob: {:?}", other.map(|_| ())),
    }
    let mut bob = s.connect(&s.options(Some(("bob", 3))), "bob").await.unwrap();
    let bot = Client::connect_unix(unix, "bot-7").await.unwrap();
    let _alice = Client::connect_unix(unix, "alice").await.unwrap();
    match Client::connect_tcp(s.daemon.tcp_addr().unwrap(), "bot-8").await {
        Err(ClientError::Refused { code, text }) => {
            assert_eq!(code, ErrorCode::IdentityMismatch);
            assert!(text.contains("connect over TLS with a certificate for bot-8"), "{text}");
        }
        other => panic!("a TCP client took a name: {:?}", other.map(|_| ())),
    }
    bob.join("g").await.unwrap();
    until_view(&mut bob, "g", 1).await;
    bot.join("g").await.unwrap();
    until_view(&mut bob, "g", 2).await;
}

#[tokio::test]
async fn unreadable_or_wrong_pem_files_and_bad_server_names_are_reported_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pem");
    let e = tls::load_certs(&missing).unwrap_err();
    assert!(matches!(e, TlsError::Pem { .. }) && e.to_string().contains("missing.pem"), "{e}");
    let a = Authority::new(dir.path(), "group");
    // A certificate file where a key is wanted, and where CRLs are.
    let e = tls::load_key(&a.ca_path()).unwrap_err();
    assert!(e.to_string().contains("private key") && e.to_string().contains("group-ca.pem"), "{e}");
    let e = ClientAuth::from_pem_files(&a.ca_path(), &[a.ca_path()]).unwrap_err();
    assert!(e.to_string().contains("revocation"), "{e}");
    // A listener that accepts the TCP connection, so the server name is what fails.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = TlsClientOptions::from_pem_files(&a.ca_path(), None).unwrap();
    let r = Client::connect_tls(listener.local_addr().unwrap(), "not a name!", &options, "alice").await;
    assert!(matches!(r, Err(ClientError::Tls(TlsError::ServerName(_)))), "{:?}", r.map(|_| ()));
}

#[test]
fn the_certified_name_is_the_subject_common_name() {
    let dir = tempfile::tempdir().unwrap();
    let a = Authority::new(dir.path(), "group");
    let (crt, _) = a.issue("alice", "alice", &[], 2);
    let cert = tls::load_certs(&crt).unwrap().remove(0);
    assert_eq!(tls::certified_name(&cert).unwrap().as_str(), "alice");
    let (crt, _) = a.issue("bad", "not a member name", &[], 3);
    let cert = tls::load_certs(&crt).unwrap().remove(0);
    assert!(tls::certified_name(&cert).is_err());
}

/// The check the daemon makes of a client's chain, as a function (the one
/// the certificate fuzz target runs): a valid member certificate gives its
/// name; a revoked one, one of another authority, one checked before it is
/// valid, and an empty chain are refused in words; a CRL past its nextUpdate
/// refuses everything.
#[test]
fn a_client_chain_is_verified_as_the_daemon_does() {
    let dir = tempfile::tempdir().unwrap();
    let a = Authority::new(dir.path(), "group");
    let other = Authority::new(dir.path(), "other");
    let cert = |a: &Authority, cn: &str, serial| tls::load_certs(&a.issue(cn, cn, &[], serial).0).unwrap();
    let auth = ClientAuth::from_pem_files(&a.ca_path(), &[a.revoke_until(&[3], 2090)]).unwrap();
    let at = |year: u64| std::time::SystemTime::UNIX_EPOCH + Duration::from_secs((year - 1970) * 365 * 86400);
    let now = std::time::SystemTime::now();
    assert_eq!(auth.verify_client_chain(&cert(&a, "alice", 2), now).unwrap().as_str(), "alice");
    for (chain, when, why) in [
        (cert(&a, "mallory", 3), now, "has been revoked"),
        (cert(&other, "eve", 2), now, "not issued by an authority the daemon trusts"),
        (cert(&a, "bob", 4), at(1971), "not accepted"),
        (vec![], now, "missing"),
        (cert(&a, "bob", 4), at(2095), "out of date"),
    ] {
        let e = auth.verify_client_chain(&chain, when).unwrap_err().to_string();
        assert!(e.contains(why), "{e}");
    }
}

/// The soft limit on open files of this process, from /proc/self/limits.
fn open_files_limit() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|n| n.parse().ok())
        .unwrap_or(1024)
}

/// Opens `n` TCP connections to `addr` that never send anything, from the
/// loopback addresses `127.0.0.<first>` onwards, `per_source` from each.
async fn idle_sockets(addr: std::net::SocketAddr, n: usize, first: u8, per_source: usize) -> Vec<TcpStream> {
    let mut idle = Vec::with_capacity(n);
    for i in 0..n {
        let socket = TcpSocket::new_v4().unwrap();
        let source = std::net::Ipv4Addr::new(127, 0, 0, first + (i / per_source) as u8);
        socket.bind((source, 0).into()).unwrap();
        idle.push(within("idle connect", socket.connect(addr)).await.unwrap());
    }
    idle
}

/// How many idle sockets a flood test may open, and the handshake cap that
/// this many fills: the default cap (1024) under the default flood of 1100
/// sockets if this process may open the files, else proportionally fewer.
fn flood_size() -> (usize, usize) {
    // Both ends of every socket are in this process, plus some to spare.
    let room = open_files_limit().saturating_sub(256) / 2;
    let default_cap = DaemonConfig::default().max_handshakes;
    if room >= 1100 {
        (1100, default_cap)
    } else {
        (room, room * 9 / 10)
    }
}

/// Idle TCP connections that never send a ClientHello fill the cap on
/// handshakes under way (from many addresses, each under the per-address
/// cap); a valid client still connects and says Hello within a second,
/// because a newcomer evicts the oldest pending handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_handshakes_does_not_keep_a_valid_client_out() {
    let (n, cap) = flood_size();
    let s = start_with(true, &[], |c| c.max_handshakes = cap).await;
    let options = s.options(Some(("alice", 2)));
    let addr = s.daemon.tls_addr().unwrap();
    // 50 per source address, under the per-address cap of 64.
    let idle = idle_sockets(addr, n, 2, 50).await;
    // Let the daemon accept them all: the cap is full of idle handshakes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let a = tokio::time::timeout(Duration::from_secs(1), Client::connect_tls(addr, "localhost", &options, "alice"))
        .await
        .expect("a valid client connects and says Hello within 1 s")
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(1));
    drop(idle);
    round_trip(&s, a).await;
}

/// One address cannot evict the pending handshakes of others: its flood only
/// evicts its own oldest ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_address_evicts_only_its_own_handshakes() {
    let (n, cap) = flood_size();
    let s = start_with(true, &[], |c| c.max_handshakes = cap).await;
    let addr = s.daemon.tls_addr().unwrap();
    // A slow client of another address, pending since before the flood.
    let mut victim = idle_sockets(addr, 1, 200, 1).await.remove(0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let flood = idle_sockets(addr, n - 1, 2, n).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_millis(300), victim.read(&mut byte)).await;
    assert!(read.is_err(), "the other address's handshake is still pending: {read:?}");
    // The flood's oldest were evicted (closed), long before the handshake timeout.
    let mut oldest = flood.into_iter().next().unwrap();
    let read = tokio::time::timeout(Duration::from_secs(1), oldest.read(&mut byte)).await.expect("evicted at once");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // And a valid client still gets in at once.
    let options = s.options(Some(("alice", 2)));
    tokio::time::timeout(Duration::from_secs(1), Client::connect_tls(addr, "localhost", &options, "alice"))
        .await
        .expect("a valid client connects within 1 s")
        .unwrap();
}

/// Over TLS, a connection over the per-address cap (2 here) is refused after
/// its handshake, in words and through TLS (TooManyConnections, instead of
/// Welcome); the Unix socket, another peer, is still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_connection_over_the_per_address_cap_is_refused_in_words() {
    let s = start_with(false, &[], |c| c.max_connections_per_peer = 2).await;
    let options = s.options(None);
    let _a = s.connect(&options, "a").await.unwrap();
    let _b = s.connect(&options, "b").await.unwrap();
    match s.connect(&options, "c").await {
        Err(ClientError::Refused { code, text }) if code == conclave_gcs::wire::TOO_MANY_CONNECTIONS => {
            assert!(text.contains("IP address 127.0.0.1") && text.contains("(2)"), "{text}")
        }
        other => panic!("expected a refusal for too many connections, got {:?}", other.map(|_| ())),
    }
    within("unix", Client::connect_unix(s.dir.path().join("conclave.sock"), "d")).await.unwrap();
}

/// Certified names in access rules and among the status operators: a
/// certificate for a name the rules list lets its holder create, join and
/// send; another member's certificate, and an uncertified TLS client, are
/// refused (AccessDenied); only the operator's certificate reads the status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_rules_and_status_operators_by_certified_name() {
    use conclave_gcs_net::client::status_tls;
    use conclave_gcs_net::{AccessPolicy, GroupRule, Who};
    let who = |l: &[&str]| l.iter().map(|s| s.parse::<Who>().unwrap()).collect::<Vec<_>>();
    let s = start_with(true, &[], |c| {
        c.access = Some(AccessPolicy {
            rules: vec![GroupRule::new("vault", who(&["alice"]), who(&["ops-*"]), who(&["alice"])).unwrap()],
        });
        c.operators = who(&["ops-*"]);
    })
    .await;
    let mut alice = s.connect(&s.options(Some(("alice", 10))), "alice").await.unwrap();
    let mut ops = s.connect(&s.options(Some(("ops-1", 11))), "ops-1").await.unwrap();
    let mut bob = s.connect(&s.options(Some(("bob", 12))), "bob").await.unwrap();
    let denied = |e: Event, says: &str| match e {
        Event::Error { code, text } => {
            assert_eq!(code, conclave_gcs::wire::ACCESS_DENIED);
            assert!(text.contains(says), "{text:?} does not say {says:?}");
        }
        other => panic!("expected AccessDenied, got {other:?}"),
    };
    ops.join("vault").await.unwrap();
    denied(within("refusal", ops.recv()).await.unwrap(), "may join group vault when it exists, but not create it");
    alice.join("vault").await.unwrap();
    until_view(&mut alice, "vault", 1).await;
    ops.join("vault").await.unwrap();
    until_view(&mut ops, "vault", 2).await;
    bob.join("vault").await.unwrap();
    denied(within("refusal", bob.recv()).await.unwrap(), "does not let certified name bob");
    ops.multicast("vault", Service::Agreed, &b"no"[..]).await.unwrap();
    denied(within("refusal", ops.recv()).await.unwrap(), "you may not send to group vault");
    alice.multicast("vault", Service::Agreed, &b"yes"[..]).await.unwrap();
    assert_eq!(until_message(&mut ops).await, ("alice".to_owned(), b"yes".to_vec()));

    let addr = s.daemon.tls_addr().unwrap();
    let st = within("status", status_tls(addr, "localhost", &s.options(Some(("ops-2", 13))))).await.unwrap();
    assert_eq!(st.groups[0].members.iter().map(|m| m.as_str()).collect::<Vec<_>>(), ["alice", "ops-1"]);
    assert!(
        st.connections.iter().any(|c| c.peer.starts_with("tls: 127.0.0.1:") && c.peer.ends_with("certificate for bob")),
        "{:?}",
        st.connections
    );
    match within("status", status_tls(addr, "localhost", &s.options(Some(("bob", 14))))).await {
        Err(ClientError::Refused { code, .. }) => assert_eq!(code, conclave_gcs::wire::ACCESS_DENIED),
        r => panic!("bob read the status: {r:?}"),
    }
}
