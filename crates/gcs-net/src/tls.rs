//! TLS between clients and the daemon (rustls with the *ring* provider).
//!
//! The daemon side is a TCP listener whose connections go through a TLS
//! handshake before they speak the wire protocol; with [`ClientAuth`] the
//! daemon also asks every client for a certificate issued by the group
//! authority (a CA) and not revoked by any of the authority's CRLs. A client
//! that shows such a certificate is bound to the member name it certifies
//! (the subject CommonName): its Hello must use exactly that name.
//!
//! The daemon's trust can change while it runs ([`crate::Daemon::reload_client_auth`]):
//! revoking a member must not wait for a restart. New handshakes use the new
//! trust at once; connections made under the old one are verified again and
//! those it no longer accepts are cut off. A CRL past its nextUpdate is
//! refused, both when it is loaded and, should it expire while the daemon
//! runs, in every handshake after that: revocation news that old is no news.
//!
//! Everything is loaded from PEM: certificate chains, PKCS#8 (or PKCS#1 /
//! SEC1) private keys and CRLs, as `conclave keys` writes them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant, SystemTime};

use conclave_gcs::MemberId;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{CertificateError, ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName, UnixTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{self, AbortHandle, JoinSet};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Errors setting up TLS.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or holds nothing of the kind wanted.
    #[error("cannot load {what} from {}: {source}", path.display())]
    Pem {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: pem::Error,
    },
    /// rustls refused the certificates or the key.
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    /// The private key is not the key of the certificate it comes with.
    #[error("the private key does not belong to the certificate")]
    KeyMismatch,
    /// The client verifier could not be built (no usable CA, bad CRL).
    #[error("client certificate verification: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The name to check the daemon's certificate against is not a DNS name
    /// or IP address.
    #[error("{0:?} is not a valid server name (a DNS name or an IP address)")]
    ServerName(String),
    /// A CRL cannot be read.
    #[error("a client certificate revocation list cannot be read: {0}")]
    BadCrl(String),
    /// A CRL is past its nextUpdate: the authority has issued (or owes) a
    /// newer one, and this one may miss revocations.
    #[error(
        "a client certificate revocation list is out of date: its next update was due {0}; \
         install a fresh CRL from the authority (`conclave keys revoke` writes a new authority.crl)"
    )]
    CrlExpired(String),
    /// A client certificate is refused, for the reason given in words.
    #[error("the client certificate {0}")]
    ClientCertificate(String),
}

/// A certificate chain (own certificate first) and its private key.
#[derive(Debug)]
pub struct Identity {
    /// The certificate chain, own certificate first.
    pub cert_chain: Vec<CertificateDer<'static>>,
    /// The private key of the first certificate.
    pub key: PrivateKeyDer<'static>,
}

impl Identity {
    /// Loads a certificate chain and a private key from PEM files.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        Ok(Self { cert_chain: load_certs(cert)?, key: load_key(key)? })
    }

    /// Loads a certificate chain from a PEM file, with the private key given
    /// as PEM text (`key_path` names it in errors): for a key the caller has
    /// read itself, say after opening it with a passphrase.
    pub fn from_cert_file_and_key_pem(cert: &Path, key_pem: &[u8], key_path: &Path) -> Result<Self, TlsError> {
        let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|source| TlsError::Pem {
            what: "a private key",
            path: key_path.to_owned(),
            source,
        })?;
        Ok(Self { cert_chain: load_certs(cert)?, key })
    }
}

impl Clone for Identity {
    fn clone(&self) -> Self {
        Self { cert_chain: self.cert_chain.clone(), key: self.key.clone_key() }
    }
}

/// Client certificates the daemon demands: issued by one of `roots` (the
/// group authority) and not revoked by any of `crls`.
#[derive(Clone, Debug)]
pub struct ClientAuth {
    /// The authority's certificate(s).
    pub roots: Vec<CertificateDer<'static>>,
    /// Revocation lists signed by the authority.
    pub crls: Vec<CertificateRevocationListDer<'static>>,
}

impl ClientAuth {
    /// Loads the authority's certificate and any number of CRLs from PEM files.
    pub fn from_pem_files(ca: &Path, crls: &[PathBuf]) -> Result<Self, TlsError> {
        let mut all = Vec::new();
        for path in crls {
            all.extend(load_all::<CertificateRevocationListDer<'static>>(path, "certificate revocation lists")?);
        }
        Ok(Self { roots: load_certs(ca)?, crls: all })
    }

    /// When the first of the CRLs is due to be replaced (the earliest
    /// nextUpdate), if any says. Refuses a CRL that cannot be read or whose
    /// nextUpdate has passed.
    pub fn next_update(&self) -> Result<Option<SystemTime>, TlsError> {
        self.next_update_at(SystemTime::now())
    }

    /// [`ClientAuth::next_update`] as of `now`.
    fn next_update_at(&self, now: SystemTime) -> Result<Option<SystemTime>, TlsError> {
        let mut earliest: Option<SystemTime> = None;
        for der in &self.crls {
            let (_, crl) = x509_parser::parse_x509_crl(der.as_ref()).map_err(|e| TlsError::BadCrl(e.to_string()))?;
            let Some(next) = crl.next_update() else { continue };
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(next.timestamp().max(0) as u64);
            if at <= now {
                return Err(TlsError::CrlExpired(next.to_string()));
            }
            earliest = Some(earliest.map_or(at, |e| e.min(at)));
        }
        Ok(earliest)
    }

    /// Checks a client's certificate chain (own certificate first), as of
    /// `now`, the way the daemon checks the chain a TLS client shows: the
    /// same verifier (issued by the roots, not revoked by the CRLs, none of
    /// them past its nextUpdate, valid at `now`), then the member name it
    /// certifies, which it returns. (The handshake also makes the client
    /// prove that it holds the certificate's key; that is not checked here.)
    pub fn verify_client_chain(&self, chain: &[CertificateDer<'_>], now: SystemTime) -> Result<MemberId, TlsError> {
        let verifier = self.verifier_at(provider(), now)?;
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return Err(TlsError::ClientCertificate("is missing: the chain is empty".into()));
        };
        let at = UnixTime::since_unix_epoch(now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default());
        verifier
            .verify_client_cert(end_entity, intermediates, at)
            .map_err(|e| TlsError::ClientCertificate(refused_because(e)))?;
        certified_name(end_entity).map_err(|e| TlsError::ClientCertificate(format!("certifies no member name: {e}")))
    }

    /// The verifier of client certificates: issued by the roots, not revoked,
    /// and refused outright once a CRL is past its nextUpdate.
    fn verifier(&self, provider: Arc<CryptoProvider>) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        self.verifier_at(provider, SystemTime::now())
    }

    /// [`ClientAuth::verifier`], with CRLs checked as of `now`.
    fn verifier_at(
        &self,
        provider: Arc<CryptoProvider>,
        now: SystemTime,
    ) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
        self.next_update_at(now)?;
        Ok(WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(&self.roots)?), provider)
            .with_crls(self.crls.clone())
            .enforce_revocation_expiration()
            .build()?)
    }
}

/// Where and how the daemon listens for TLS clients.
#[derive(Clone, Debug)]
pub struct TlsListen {
    /// TCP address to listen on (port 0 picks a free port).
    pub addr: SocketAddr,
    /// The daemon's certificate chain and key.
    pub identity: Identity,
    /// The client certificates the daemon demands, if any.
    pub client_auth: Option<ClientAuth>,
}

/// The provider every configuration uses, whatever other crates in the
/// build enable.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load_all<T: PemObject>(path: &Path, what: &'static str) -> Result<Vec<T>, TlsError> {
    let fail = |source| TlsError::Pem { what, path: path.to_owned(), source };
    let items = T::pem_file_iter(path).map_err(fail)?.collect::<Result<Vec<T>, _>>().map_err(fail)?;
    if items.is_empty() {
        return Err(fail(pem::Error::NoItemsFound));
    }
    Ok(items)
}

/// Loads every certificate of a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    load_all(path, "certificates")
}

/// Loads the first private key of a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|source| TlsError::Pem {
        what: "a private key",
        path: path.to_owned(),
        source,
    })
}

fn root_store(roots: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in roots {
        store.add(cert.clone())?;
    }
    Ok(store)
}

/// What the daemon's TLS side trusts now: the acceptor new handshakes go
/// through and the verifier of client certificates. Each replacement gets the
/// next generation, so a connection whose handshake ran under an older one is
/// known and verified again ([`Trust::recheck`]).
pub(crate) struct Trust {
    acceptor: TlsAcceptor,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    generation: u64,
}

/// The trust the TLS listener and the daemon share; replaced whole on reload.
pub(crate) type SharedTrust = Arc<RwLock<Trust>>;

impl Trust {
    /// The daemon's TLS configuration: its identity and, if given, the client
    /// certificates it demands.
    pub(crate) fn new(identity: &Identity, client_auth: Option<&ClientAuth>) -> Result<Self, TlsError> {
        let provider = provider();
        let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
        let verifier = client_auth.map(|auth| auth.verifier(provider)).transpose()?;
        let builder = match &verifier {
            Some(v) => builder.with_client_cert_verifier(v.clone()),
            None => builder.with_no_client_auth(),
        };
        let identity = identity.clone();
        let config = builder.with_single_cert(identity.cert_chain, identity.key).map_err(identity_error)?;
        Ok(Self { acceptor: TlsAcceptor::from(Arc::new(config)), verifier, generation: 0 })
    }

    /// Takes `next`'s place as the next generation.
    pub(crate) fn replace(&mut self, mut next: Trust) {
        next.generation = self.generation + 1;
        *self = next;
    }

    /// Checks a certificate accepted under an earlier trust against this one;
    /// says in words why it is refused now.
    pub(crate) fn recheck(&self, c: &Certified) -> Result<(), String> {
        let (Some(verifier), false) = (&self.verifier, c.generation == self.generation) else { return Ok(()) };
        let Some((end_entity, intermediates)) = c.chain.split_first() else { return Ok(()) };
        verifier
            .verify_client_cert(end_entity, intermediates, UnixTime::now())
            .map(|_| ())
            .map_err(|e| format!("the certificate of {} {}", c.name, refused_because(e)))
    }
}

/// Why the verifier refused a client certificate, in words that follow "the
/// certificate".
fn refused_because(e: rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(CertificateError::Revoked) => "has been revoked".into(),
        rustls::Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. }) => {
            "has expired".into()
        }
        rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
            "is not issued by an authority the daemon trusts".into()
        }
        e => format!("is not accepted ({e})"),
    }
}

/// A client that showed a certificate: the member name it certifies, the
/// chain it showed, and the generation of the trust that accepted it.
#[derive(Clone, Debug)]
pub(crate) struct Certified {
    pub(crate) name: MemberId,
    chain: Vec<CertificateDer<'static>>,
    generation: u64,
}

/// rustls's refusal of an identity, with a mismatched key said in words.
fn identity_error(e: rustls::Error) -> TlsError {
    match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => TlsError::KeyMismatch,
        e => TlsError::Rustls(e),
    }
}

/// How a client connects over TLS: the authorities it trusts for the
/// daemon's certificate and, for daemons that demand one, its own identity.
#[derive(Clone, Debug)]
pub struct TlsClientOptions {
    config: Arc<ClientConfig>,
}

impl TlsClientOptions {
    /// Trusts `roots` for the daemon's certificate; shows `identity` if the
    /// daemon asks for a client certificate.
    pub fn new(roots: &[CertificateDer<'static>], identity: Option<Identity>) -> Result<Self, TlsError> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?
            .with_root_certificates(root_store(roots)?);
        let config = match identity {
            Some(id) => builder.with_client_auth_cert(id.cert_chain, id.key).map_err(identity_error)?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self { config: Arc::new(config) })
    }

    /// Loads the trusted CA certificate(s) and, optionally, a certificate
    /// chain and key (`(cert, key)`) from PEM files.
    pub fn from_pem_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        let identity = identity.map(|(cert, key)| Identity::from_pem_files(cert, key)).transpose()?;
        Self::new(&load_certs(ca)?, identity)
    }

    /// Loads the trusted CA certificate(s) from a PEM file and shows
    /// `identity` (for a key the caller opened itself, say with a passphrase).
    pub fn with_identity(ca: &Path, identity: Identity) -> Result<Self, TlsError> {
        Self::new(&load_certs(ca)?, Some(identity))
    }

    /// Connects a TCP stream and runs the TLS handshake, checking the
    /// daemon's certificate against `server_name`.
    pub(crate) async fn connect(
        &self,
        stream: TcpStream,
        server_name: &str,
    ) -> Result<tokio_rustls::client::TlsStream<TcpStream>, crate::ClientError> {
        let name =
            ServerName::try_from(server_name.to_owned()).map_err(|_| TlsError::ServerName(server_name.to_owned()))?;
        Ok(TlsConnector::from(self.config.clone()).connect(name, stream).await?)
    }
}

/// Bounds on TLS handshakes under way, so that idle or slow sockets cannot
/// keep valid clients out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HandshakeLimits {
    /// Time a new connection has to complete its handshake.
    pub(crate) timeout: Duration,
    /// Handshakes under way at once; a new connection beyond that evicts the
    /// oldest pending handshake.
    pub(crate) max: usize,
    /// Handshakes under way at once from one peer IP address; a new connection
    /// beyond that evicts the oldest pending handshake of the same address.
    pub(crate) per_ip: usize,
}

/// The daemon's TLS listener: accepts TCP connections and runs their
/// handshakes concurrently, each bounded by a timeout, so one slow client
/// never holds up the next. Pending handshakes are bounded in all and per
/// peer address; a newcomer over a bound evicts the oldest pending handshake
/// (of its own address, or of all) instead of being refused, so a flood of
/// idle sockets delays valid clients by at most one accept, never starves them.
pub(crate) struct TlsListener {
    tcp: TcpListener,
    trust: SharedTrust,
    limits: HandshakeLimits,
    handshakes: JoinSet<io::Result<Handshaken>>,
    /// Pending handshakes by arrival number (oldest first): peer address and
    /// the handle that evicts it.
    pending: BTreeMap<u64, (IpAddr, AbortHandle)>,
    /// The arrival number of each pending handshake's task.
    arrival: HashMap<task::Id, u64>,
    /// Pending handshakes per peer address.
    per_ip: HashMap<IpAddr, usize>,
    next: u64,
    /// Evictions not yet reported, and when they last were: a flood is
    /// reported every [`EVICTION_REPORT`], not once per connection.
    evicted: u64,
    reported: Option<Instant>,
}

/// How often evictions are reported while they go on.
const EVICTION_REPORT: Duration = Duration::from_secs(10);

/// A connection whose handshake succeeded, its client certificate, if it
/// showed one, and its peer's address.
pub(crate) type Handshaken = (tokio_rustls::server::TlsStream<TcpStream>, Option<Certified>, SocketAddr);

impl TlsListener {
    /// Binds the listener; its handshakes go through whatever `trust` holds
    /// when they begin.
    pub(crate) async fn bind(addr: SocketAddr, trust: SharedTrust, limits: HandshakeLimits) -> io::Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(addr).await?,
            trust,
            limits,
            handshakes: JoinSet::new(),
            pending: BTreeMap::new(),
            arrival: HashMap::new(),
            per_ip: HashMap::new(),
            next: 0,
            evicted: 0,
            reported: None,
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// Forgets pending handshake `id`, returning its handle unless it was
    /// forgotten already (evicted).
    fn forget(&mut self, id: u64) -> Option<AbortHandle> {
        let (ip, abort) = self.pending.remove(&id)?;
        self.arrival.remove(&abort.id());
        if let Some(n) = self.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                self.per_ip.remove(&ip);
            }
        }
        Some(abort)
    }

    /// Evicts the oldest pending handshake, of peer address `ip` if given.
    fn evict_oldest(&mut self, ip: Option<IpAddr>) {
        let oldest = self.pending.iter().find(|(_, (from, _))| ip.is_none_or(|ip| *from == ip)).map(|(&id, _)| id);
        if let Some(abort) = oldest.and_then(|id| self.forget(id)) {
            abort.abort();
            self.evicted += 1;
            if self.reported.is_none_or(|at| at.elapsed() >= EVICTION_REPORT) {
                tracing::warn!(
                    "too many TLS handshakes under way (at most {} in all, {} per address): {} pending handshakes \
                     evicted, oldest first",
                    self.limits.max,
                    self.limits.per_ip,
                    self.evicted
                );
                self.evicted = 0;
                self.reported = Some(Instant::now());
            }
        }
    }

    /// Starts the handshake of a newly accepted connection, evicting the
    /// oldest pending ones as the limits demand.
    fn start_handshake(&mut self, stream: TcpStream, peer: SocketAddr) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::info!(%peer, "connection dropped: {e}");
            return;
        }
        let ip = peer.ip();
        if self.per_ip.get(&ip).copied().unwrap_or(0) >= self.limits.per_ip {
            tracing::debug!(%peer, "too many TLS handshakes under way from {ip}: its oldest is evicted");
            self.evict_oldest(Some(ip));
        }
        if self.pending.len() >= self.limits.max {
            tracing::debug!(%peer, "too many TLS handshakes under way: the oldest is evicted");
            self.evict_oldest(None);
        }
        let id = self.next;
        self.next += 1;
        let (acceptor, generation) = {
            let trust = self.trust.read().expect("TLS trust");
            (trust.acceptor.clone(), trust.generation)
        };
        let timeout = self.limits.timeout;
        let abort = self.handshakes.spawn(async move {
            let handshake = tokio::time::timeout(timeout, acceptor.accept(stream))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("{peer}: TLS handshake timed out")))?
                .map_err(|e| io::Error::new(e.kind(), format!("{peer}: TLS handshake failed: {e}")))?;
            let certified = match handshake.get_ref().1.peer_certificates() {
                Some(chain @ [cert, ..]) => Some(Certified {
                    name: certified_name(cert).map_err(|e| {
                        io::Error::new(io::ErrorKind::InvalidData, format!("{peer}: client certificate: {e}"))
                    })?,
                    chain: chain.iter().map(|c| c.clone().into_owned()).collect(),
                    generation,
                }),
                _ => None,
            };
            Ok((handshake, certified, peer))
        });
        self.arrival.insert(abort.id(), id);
        self.pending.insert(id, (ip, abort));
        *self.per_ip.entry(ip).or_default() += 1;
    }

    /// The next connection whose handshake succeeded. Failed handshakes are
    /// logged and skipped; only a failure to accept is returned.
    pub(crate) async fn next(&mut self) -> io::Result<Handshaken> {
        loop {
            tokio::select! {
                accepted = self.tcp.accept() => {
                    let (stream, peer) = accepted?;
                    self.start_handshake(stream, peer);
                }
                Some(done) = self.handshakes.join_next_with_id() => {
                    let task = match &done {
                        Ok((task, _)) => *task,
                        Err(e) => e.id(),
                    };
                    // An evicted handshake (aborted, or finished all the same) is dropped.
                    let Some(id) = self.arrival.get(&task).copied() else { continue };
                    self.forget(id);
                    match done {
                        Ok((_, Ok(conn))) => return Ok(conn),
                        Ok((_, Err(e))) => tracing::info!("{e}"),
                        Err(e) => tracing::warn!("TLS handshake task failed: {e}"),
                    }
                }
            }
        }
    }
}

/// The member name a (verified) member certificate certifies: its subject
/// CommonName, which must be a valid member name.
pub fn certified_name(cert: &CertificateDer<'_>) -> Result<MemberId, String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| format!("not X.509: {e}"))?;
    let mut names = parsed.subject().iter_common_name();
    let cn = names.next().ok_or("the subject has no CommonName")?;
    if names.next().is_some() {
        return Err("the subject has more than one CommonName".into());
    }
    let cn = cn.as_str().map_err(|e| format!("the subject CommonName is not a string: {e}"))?;
    MemberId::new(cn).map_err(|e| format!("the subject CommonName {cn:?} is not a member name: {e}"))
}
