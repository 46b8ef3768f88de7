//! TLS between clients and the daemon (rustls with the *ring* provider).
//!
//! The daemon side is a TCP listener whose connections go through a TLS
//! handshake before they speak the wire protocol; with [`ClientAuth`] the
//! daemon also asks every client for a certificate issued by the group
//! authority (a CA) and not revoked by any of the authority's CRLs. A client
//! that shows such a certificate is bound to the member name it certifies
//! (the subject CommonName): its Hello must use exactly that name.
//!
//! Everything is loaded from PEM: certificate chains, PKCS#8 (or PKCS#1 /
//! SEC1) private keys and CRLs, as `conclave keys` writes them.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave_gcs::MemberId;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, ServerName};
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
}

/// Where and how the daemon listens for TLS clients.
#[derive(Clone, Debug)]
pub struct TlsListen {
    /// TCP address to listen on (port 0 picks a free port).
    pub addr: SocketAddr,
    /// The server side of TLS, from [`server_config`].
    pub config: Arc<ServerConfig>,
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

/// The daemon's TLS configuration: its identity and, if given, the client
/// certificates it demands.
pub fn server_config(identity: Identity, client_auth: Option<ClientAuth>) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let builder = match client_auth {
        Some(auth) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(root_store(&auth.roots)?), provider)
                .with_crls(auth.crls)
                .build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(builder.with_single_cert(identity.cert_chain, identity.key).map_err(identity_error)?))
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
    acceptor: TlsAcceptor,
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

/// A connection whose handshake succeeded, and the member name its client
/// certificate certifies, if it showed one.
pub(crate) type Handshaken = (tokio_rustls::server::TlsStream<TcpStream>, Option<MemberId>);

impl TlsListener {
    /// Binds the listener.
    pub(crate) async fn bind(listen: &TlsListen, limits: HandshakeLimits) -> io::Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(listen.addr).await?,
            acceptor: TlsAcceptor::from(listen.config.clone()),
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
        let acceptor = self.acceptor.clone();
        let timeout = self.limits.timeout;
        let abort = self.handshakes.spawn(async move {
            let handshake = tokio::time::timeout(timeout, acceptor.accept(stream))
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, format!("{peer}: TLS handshake timed out")))?
                .map_err(|e| io::Error::new(e.kind(), format!("{peer}: TLS handshake failed: {e}")))?;
            let certified = match handshake.get_ref().1.peer_certificates() {
                Some([cert, ..]) => Some(certified_name(cert).map_err(|e| {
                    io::Error::new(io::ErrorKind::InvalidData, format!("{peer}: client certificate: {e}"))
                })?),
                _ => None,
            };
            Ok((handshake, certified))
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
